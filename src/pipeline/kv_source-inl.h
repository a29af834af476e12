// The pipeline (Flash<O>, src/pipeline/flash-inl.h): the K/V block source: key
// and value rows of any element type as blocks of f32 rows. Included by flash-
// inl.h after the struct; per-target include guard.
#if defined(QKV_PIPELINE_KV_SOURCE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_PIPELINE_KV_SOURCE_INL_H_
#undef QKV_PIPELINE_KV_SOURCE_INL_H_
#else
#define QKV_PIPELINE_KV_SOURCE_INL_H_
#endif

#ifdef HWY_BEFORE_NAMESPACE
HWY_BEFORE_NAMESPACE();
#endif
namespace qkv {
namespace QKV_SIMD_NAMESPACE {

// Rows [j0, j0 + nb) of a low-precision K or V dequantized into dst, n
// floats each, dense: F16 and BF16 widened exactly, I8 times its row's
// scale (one f32 rounding), as semantics.h's KvElement.
template <class O>
template <int kType>
inline void Flash<O>::DequantizeRowsOf(const KvSource& s, int64_t j0,
                                       int64_t nb, int64_t n,
                                       float* __restrict dst) {
  const int64_t N = static_cast<int64_t>(O::Lanes());
  for (int64_t j = 0; j < nb; ++j) {
    const unsigned char* row = s.base + (j0 + j) * s.row_bytes;
    float* __restrict d = dst + j * n;
    int64_t c = 0;
    if (kType == QKV_DTYPE_F16) {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(row);
      for (; c + N <= n; c += N) O::StoreU(O::LoadF16(h + c), d + c);
    } else if (kType == QKV_DTYPE_BF16) {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(row);
      for (; c + N <= n; c += N) O::StoreU(O::LoadBF16(h + c), d + c);
    } else {
      const int8_t* q = reinterpret_cast<const int8_t*>(row);
      const V scale = O::Set(s.scales[(j0 + j) * s.scale_st]);
      for (; c + N <= n; c += N) {
        O::StoreU(O::Mul(O::LoadI8(q + c), scale), d + c);
      }
    }
    for (; c < n; ++c) d[c] = KvElement(s, j0 + j, c);
  }
}

template <class O>
inline void Flash<O>::DequantizeRows(const KvSource& s, int64_t j0, int64_t nb,
                                     int64_t n, float* __restrict dst) {
  switch (s.dtype) {
    case QKV_DTYPE_F16:
      return DequantizeRowsOf<QKV_DTYPE_F16>(s, j0, nb, n, dst);
    case QKV_DTYPE_BF16:
      return DequantizeRowsOf<QKV_DTYPE_BF16>(s, j0, nb, n, dst);
    default:
      return DequantizeRowsOf<QKV_DTYPE_I8>(s, j0, nb, n, dst);
  }
}

// Key rows [j0, j0 + nb) as the score kernels read them (op.k_st apart):
// in place, or dequantized into kblk.
template <class O>
inline const float* Flash<O>::KeyBlock(const Operands& op, int64_t j0,
                                       int64_t nb, float* kblk) {
  if (!op.convert_k) return op.k + j0 * op.k_st;
  DequantizeRows(op.ksrc, j0, nb, op.dim, kblk);
  return kblk;
}

// Value rows [j0, j0 + nb) (op.v_st apart), in place or into vblk.
template <class O>
inline const float* Flash<O>::ValueBlock(const Operands& op, int64_t dv,
                                         int64_t j0, int64_t nb, float* vblk) {
  if (!op.convert_v) return op.v + j0 * op.v_st;
  DequantizeRows(op.vsrc, j0, nb, dv, vblk);
  return vblk;
}

}  // namespace QKV_SIMD_NAMESPACE
}  // namespace qkv
#ifdef HWY_AFTER_NAMESPACE
HWY_AFTER_NAMESPACE();
#endif

#endif  // per-target include guard
