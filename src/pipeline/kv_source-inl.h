// The pipeline (Flash<O>, src/pipeline/flash-inl.h): the K/V block source: key
// and value rows of any element type as blocks of f32 rows. Included by
// flash-inl.h inside its per-target namespace, after the struct.

// Rows [j0, j0 + nb) of a low-precision K or V dequantized into dst, n
// floats each, dense: F16 and BF16 widened exactly, I8 times its row's
// scale (one f32 rounding), as semantics.h's KvElement.
template <class O>
template <class E>
inline void Flash<O>::DequantizeRowsOf(const KvSource& s, int64_t j0,
                                       int64_t nb, int64_t n,
                                       float* __restrict dst) {
  using T = typename E::T;
  const int64_t N = static_cast<int64_t>(O::Lanes());
  for (int64_t j = 0; j < nb; ++j) {
    const T* row = reinterpret_cast<const T*>(KvRowAt(s, j0 + j));
    float* __restrict d = dst + j * n;
    int64_t c = 0;
    if (E::kScaled) {
      const V scale = O::Set(KvScalesAt(s, j0 + j)[0]);
      for (; c + N <= n; c += N) {
        O::StoreU(O::Mul(E::Load(row + c), scale), d + c);
      }
    } else {
      for (; c + N <= n; c += N) O::StoreU(E::Load(row + c), d + c);
    }
    for (; c < n; ++c) d[c] = KvElement(s, j0 + j, c);
  }
}

template <class O>
inline void Flash<O>::DequantizeRows(const KvSource& s, int64_t j0, int64_t nb,
                                     int64_t n, float* __restrict dst) {
  OnKvType<O>(s.dtype, [&](auto e) {
    DequantizeRowsOf<decltype(e)>(s, j0, nb, n, dst);
  });
}

// f32 key (value) rows in place from row j on, op.k_st (op.v_st) floats
// apart: KvRowAt's address.
template <class O>
inline const float* Flash<O>::KeysInPlace(const Operands& op, int64_t j) {
  return F32RowAt(op.ksrc, j);
}

template <class O>
inline const float* Flash<O>::ValuesInPlace(const Operands& op, int64_t j) {
  return F32RowAt(op.vsrc, j);
}

// Key rows [j0, j0 + nb) as the score kernels read them (op.k_st apart):
// in place, or dequantized into kblk.
template <class O>
inline const float* Flash<O>::KeyBlock(const Operands& op, int64_t j0,
                                       int64_t nb, float* kblk) {
  if (!op.convert_k) return KeysInPlace(op, j0);
  DequantizeRows(op.ksrc, j0, nb, op.dim, kblk);
  return kblk;
}

// Value rows [j0, j0 + nb) (op.v_st apart), in place or into vblk.
template <class O>
inline const float* Flash<O>::ValueBlock(const Operands& op, int64_t dv,
                                         int64_t j0, int64_t nb, float* vblk) {
  if (!op.convert_v) return ValuesInPlace(op, j0);
  DequantizeRows(op.vsrc, j0, nb, dv, vblk);
  return vblk;
}
