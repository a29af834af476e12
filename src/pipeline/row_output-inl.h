// The pipeline (Flash<O>, src/pipeline/flash-inl.h): row kernels, softmax and
// output: a row's online softmax and o = o * alpha + p V over rows of values.
// Included by flash-inl.h inside its per-target namespace, after the struct.

// Online softmax of one row's block: st[0, nb) becomes probabilities
// relative to the new running max; returns the rescale factor of the old
// sum and output. st has room for nb rounded up to whole vectors; the last
// vector's lanes past nb are -inf in registers (their probabilities, 0,
// are stored). (Stored as -inf first, they made the vector load that
// followed wait for a scalar store: bench/README.md, "The row softmax's
// last vector".)
template <class O>
inline float Flash<O>::RowSoftmaxBlock(float* __restrict st, int64_t nb,
                                       float* m, float* l) {
  const int64_t N = static_cast<int64_t>(O::Lanes());
  const int64_t full = nb - nb % N;  // keys in whole vectors
  const V neg_inf = O::Set(-INFINITY);
  V vmax = neg_inf;
  for (int64_t j = 0; j < full; j += N) {
    vmax = O::Max(vmax, O::Load(st + j));
  }
  V last = neg_inf;
  if (full < nb) {
    const auto valid = O::Lt(O::Load(kLaneIndex),
                             O::Set(static_cast<float>(nb - full)));
    last = O::IfThenElse(valid, O::Load(st + full), neg_inf);
    vmax = O::Max(vmax, last);
  }
  const float block_max = O::ReduceMax(vmax);
  const float m_new = *m > block_max ? *m : block_max;
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;
  const V vm = O::Set(m_use);
  const float alpha = O::First(ExpNonPositive(O::Set(*m - m_use)));
  V vsum = O::Zero();
  for (int64_t j = 0; j < full; j += N) {
    const V e = ExpNonPositive(O::Sub(O::Load(st + j), vm));
    O::Store(e, st + j);
    vsum = O::Add(vsum, e);
  }
  if (full < nb) {
    const V e = ExpNonPositive(O::Sub(last, vm));
    O::Store(e, st + full);
    vsum = O::Add(vsum, e);
  }
  *m = m_new;
  *l = *l * alpha + O::ReduceSum(vsum);
  return alpha;
}

// Whether some p[r * s_stride + j] (r < rows, j < nb) is 0, by vector
// compares (a scalar scan took a measurable share of GQA-8 decoding:
// bench/README.md, "GQA-8 scores with each query vector loaded once; the
// zero scan in vectors").
template <class O>
inline bool Flash<O>::AnyZero(const float* __restrict p, int64_t s_stride,
                              int64_t rows, int64_t nb) {
  const int64_t N = static_cast<int64_t>(O::Lanes());
  const V zero = O::Zero(), one = O::Set(1.0f);
  V hits = O::Zero();
  bool tail = false;
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict pr = p + r * s_stride;
    int64_t j = 0;
    for (; j + N <= nb; j += N) {
      hits = O::Max(hits, O::IfThenElseZero(O::Eq(O::LoadU(pr + j), zero),
                                            one));
    }
    for (; j < nb; ++j) tail |= pr[j] == 0.0f;
  }
  return tail || O::ReduceMax(hits) > 0.0f;
}

// o_r[c] = o_r[c] * alpha[r] + sum_j pr_r[j] v_j[c] for R rows (pr_r at
// pr + r * s_stride, o_r at o + r * o_stride) and U vectors of columns,
// each value vector loaded once for all rows. A row whose probability is
// 0 (a hidden key) skips the key, as RowOutputColumnsOf: per row the same
// operations. pk (or NULL) steps once every 8 keys.
template <class O>
template <int R, int U, bool kGuard, bool kStep>
__attribute__((noinline)) void Flash<O>::RowOutputRowsColumns(
    const float* __restrict pr, int64_t s_stride, const float* __restrict v,
    int64_t vs, int64_t nb, const float* __restrict alpha, float* __restrict o,
    int64_t o_stride, PrefetchStream* pk) {
  const size_t N = O::Lanes();
#define QKV_DECL(r, u)                                              \
  V o##r##_##u = O::Zero();                                         \
  if (r < R && u < U) {                                             \
    o##r##_##u =                                                    \
        O::Mul(O::LoadU(o + r * o_stride + u * N), O::Set(alpha[r])); \
  }
  QKV_ROWS4_KEYS8(QKV_DECL)
#undef QKV_DECL
  const float* __restrict p0 = pr;
  const float* __restrict p1 = pr + (R > 1 ? s_stride : 0);
  const float* __restrict p2 = pr + (R > 2 ? 2 * s_stride : 0);
  const float* __restrict p3 = pr + (R > 3 ? 3 * s_stride : 0);
  for (int64_t j = 0; j < nb; ++j) {
    // (pk != nullptr: a clone GCC 12 makes for a caller's null pk warned)
    if (kStep && j % 8 == 0 && pk != nullptr) pk->Step();
    const float* __restrict vj = v + j * vs;
    const float x0 = p0[j], x1 = p1[j], x2 = p2[j], x3 = p3[j];
    const V b0 = O::Set(x0), b1 = O::Set(x1), b2 = O::Set(x2),
            b3 = O::Set(x3);
    // kGuard: some probability of the block is 0 (underflow, or a bias
    // of -inf for one row), and that row skips the key.
#define QKV_FMA(r, u)                                  \
  if (r < R && (!kGuard || x##r != 0.0f)) {            \
    o##r##_##u = O::MulAdd(b##r, c, o##r##_##u);       \
  }
#define QKV_COL(u)                    \
  if (u < U) {                        \
    const V c = O::LoadU(vj + u * N); \
    QKV_ROWS4(QKV_FMA, u)             \
  }
    QKV_UNROLL8(QKV_COL)
#undef QKV_COL
#undef QKV_FMA
  }
#define QKV_STORE(r, u) \
  if (r < R && u < U) O::StoreU(o##r##_##u, o + r * o_stride + u * N);
  QKV_ROWS4_KEYS8(QKV_STORE)
#undef QKV_STORE
}

// RowOutput for R rows at once (pr_r at pr + r * s_stride, o_r at
// o + r * dv, alpha[r]); pk (or NULL) steps once every 8 keys of each
// column pass.
template <class O>
template <int R>
inline void Flash<O>::RowOutputRows(const float* __restrict pr,
                                    int64_t s_stride, const float* __restrict v,
                                    int64_t dv, int64_t vs, int64_t nb,
                                    const float* __restrict alpha,
                                    float* __restrict o, PrefetchStream* pk) {
  const int64_t N = static_cast<int64_t>(O::Lanes());
  constexpr int U = RowOutputUnroll<R>();
  const bool zero = AnyZero(pr, s_stride, R, nb);  // some row skips a key
  int64_t c = 0;
  for (; c + U * N <= dv; c += U * N) {
    if (pk != nullptr && zero) {
      RowOutputRowsColumns<R, U, true, true>(pr, s_stride, v + c, vs, nb,
                                             alpha, o + c, dv, pk);
    } else if (pk != nullptr) {
      RowOutputRowsColumns<R, U, false, true>(pr, s_stride, v + c, vs, nb,
                                              alpha, o + c, dv, pk);
    } else if (zero) {
      RowOutputRowsColumns<R, U, true, false>(pr, s_stride, v + c, vs, nb,
                                              alpha, o + c, dv, pk);
    } else {
      RowOutputRowsColumns<R, U, false, false>(pr, s_stride, v + c, vs, nb,
                                               alpha, o + c, dv, pk);
    }
  }
  for (; c + N <= dv; c += N) {
    RowOutputRowsColumns<R, 1, true, false>(pr, s_stride, v + c, vs, nb,
                                            alpha, o + c, dv, pk);
  }
  for (; c < dv; ++c) {
    for (int r = 0; r < R; ++r) {
      const float* p = pr + r * s_stride;
      float acc = o[r * dv + c] * alpha[r];
      for (int64_t j = 0; j < nb; ++j) {
        if (p[j] != 0.0f) acc += p[j] * v[j * vs + c];
      }
      o[r * dv + c] = acc;
    }
  }
}

// o[c] = o[c] * alpha + sum_j pr[j] v_j[c], c < dv, for nb value rows
// of E; pk (or NULL) steps once a key.
template <class O>
template <class E>
inline void Flash<O>::RowOutputWidth(const float* __restrict pr,
                                     const typename E::T* __restrict v,
                                     int64_t dv, int64_t vs, int64_t nb,
                                     float alpha, float* __restrict o,
                                     PrefetchStream* pk) {
  const int64_t N = static_cast<int64_t>(O::Lanes());
  int64_t c = 0;
  for (; c + 8 * N <= dv; c += 8 * N) {
    if (c == 0 && pk != nullptr) {
      RowOutputColumnsOf<E, 8, true>(pr, v + c, vs, nb, alpha, o + c, pk);
    } else {
      RowOutputColumnsOf<E, 8>(pr, v + c, vs, nb, alpha, o + c);
    }
  }
  for (; c + N <= dv; c += N) {
    if (c == 0 && pk != nullptr) {
      RowOutputColumnsOf<E, 1, true>(pr, v + c, vs, nb, alpha, o + c, pk);
    } else {
      RowOutputColumnsOf<E, 1>(pr, v + c, vs, nb, alpha, o + c);
    }
  }
  for (; c < dv; ++c) {
    float acc = o[c] * alpha;
    for (int64_t j = 0; j < nb; ++j) {
      if (pr[j] != 0.0f) acc += pr[j] * E::At(v + j * vs, c);
    }
    o[c] = acc;
  }
}

template <class O>
template <class E>
inline void Flash<O>::RowOutputOf(const float* __restrict pr,
                                  const typename E::T* __restrict v, int64_t dv,
                                  int64_t vs, int64_t nb, float alpha,
                                  float* __restrict o, PrefetchStream* pk) {
  const int64_t N = static_cast<int64_t>(O::Lanes());
  if (pk == nullptr || dv <= 8 * N) {
    return RowOutputWidth<E>(pr, v, dv, vs, nb, alpha, o, pk);
  }
  for (int64_t j = 0; j < nb; j += kValueKeys) {
    const int64_t n = nb - j < kValueKeys ? nb - j : kValueKeys;
    RowOutputWidth<E>(pr + j, v + j * vs, dv, vs, n, j == 0 ? alpha : 1.0f,
                      o, pk);
  }
}

template <class O>
inline void Flash<O>::RowOutput(const float* __restrict pr,
                                const float* __restrict v, int64_t dv,
                                int64_t vs, int64_t nb, float alpha,
                                float* __restrict o, PrefetchStream* pk) {
  RowOutputOf<F32Rows>(pr, v, dv, vs, nb, alpha, o, pk);
}

// o[c] = o[c] * alpha + sum_j pr[j] v_j[c] for U vectors of columns of
// value rows of E (F32Rows: the f32 row path's; the fused path's types);
// kStep: pk steps once a key.
template <class O>
template <class E, int U, bool kStep>
__attribute__((noinline)) void Flash<O>::RowOutputColumnsOf(
    const float* __restrict pr, const typename E::T* __restrict v, int64_t vs,
    int64_t nb, float alpha, float* __restrict o, PrefetchStream* pk) {
  const size_t N = O::Lanes();
  const V va = O::Set(alpha);
#define QKV_DECL(u) \
  V o##u = O::Zero(); \
  if (u < U) o##u = O::Mul(O::LoadU(o + u * N), va);
  QKV_UNROLL8(QKV_DECL)
#undef QKV_DECL
  for (int64_t j = 0; j < nb; ++j) {
    if (kStep) pk->Step();
    if (pr[j] == 0.0f) continue;  // a hidden key's value is never read
    const V b = O::Set(pr[j]);
    const typename E::T* __restrict vj = v + j * vs;
#define QKV_STEP(u) \
  if (u < U) o##u = O::MulAdd(b, E::Load(vj + u * N), o##u);
    QKV_UNROLL8(QKV_STEP)
#undef QKV_STEP
  }
#define QKV_STORE(u) \
  if (u < U) O::StoreU(o##u, o + u * N);
  QKV_UNROLL8(QKV_STORE)
#undef QKV_STORE
}

template <class O>
template <class E>
inline void Flash<O>::RowOutputFrom(float* __restrict pr, const KvSource& src,
                                    int64_t j0, int64_t dv, int64_t nb,
                                    float alpha, float* __restrict o,
                                    PrefetchStream* pk) {
  using T = typename E::T;
  const int64_t vs = src.row_bytes / static_cast<int64_t>(sizeof(T));
  const T* v = reinterpret_cast<const T*>(KvRowAt(src, j0));
  if (E::kScaled) {  // the rows' scales into the weights
    const float* sc = KvScalesAt(src, j0);
    for (int64_t j = 0; j < nb; ++j) pr[j] *= sc[j * src.scale_st];
  }
  RowOutputOf<E>(pr, v, dv, vs, nb, alpha, o, pk);
}

template <class O>
inline void Flash<O>::RowOutputLowPrecision(float* pr, const KvSource& src,
                                            int64_t j0, int64_t dv, int64_t nb,
                                            float alpha, float* o,
                                            PrefetchStream* pk) {
  OnKvType<O>(src.dtype, [&](auto e) {
    RowOutputFrom<decltype(e)>(pr, src, j0, dv, nb, alpha, o, pk);
  });
}
