// The pipeline (Flash<O>, src/pipeline/flash-inl.h): row kernels, scores: query
// rows against rows of keys (head_dim in lanes) read as f32, f16, bf16 or int8.
// Included by flash-inl.h inside its per-target namespace, after the struct.

// One query row against nb keys: st[j] = finish * sum_t f(q[t], k_j[t]),
// keys four at a time for independent FMA chains, d in lanes. Also
// projects for kAdditive (q a key or query, k the rows of W). Keys are
// rows of E (F32Rows but on the fused path).
template <class O>
template <int kKind, class E>
inline float Flash<O>::RowTail(const float* q, const typename E::T* kr,
                               const float* w_v, int64_t t0, int64_t d) {
  float s = 0.0f;
  for (int64_t t = t0; t < d; ++t) {
    const float w = kKind == kAdditive ? w_v[t] : 0.0f;
    s += ScoreTermScalar<kKind>(q[t], E::At(kr, t), w);
  }
  return s;
}

// A row score: the vector part's lanes, the scalar tail, the factor.
template <class O>
template <int kKind, class E>
inline float Flash<O>::Finished(V acc, const float* q, const typename E::T* kr,
                                const float* w_v, int64_t d_full, int64_t d,
                                float finish) {
  return (O::ReduceSum(acc) + RowTail<kKind, E>(q, kr, w_v, d_full, d)) *
         finish;
}

// Scores of R rows (queries q + r * d) for U keys (k + u * ks) into
// st[r * s_stride + u], each key's vectors loaded once for all rows. Per
// (row, key) one chain of ScoreTerm over the vectors of d, the lanes'
// sum, the scalar tail, the factor: the same operations whatever R and U.
template <class O>
template <int R, int U, int kKind, class E>
QKV_FLASH_INLINE void Flash<O>::RowKeysStep(
    const float* __restrict q, const typename E::T* __restrict k, int64_t d,
    int64_t d_full, int64_t ks, float finish, const float* w_v,
    float* __restrict st, int64_t s_stride) {
  using T = typename E::T;
  const int64_t N = static_cast<int64_t>(O::Lanes());
#define QKV_DECL(r, u) V a##r##_##u = O::Zero();
  QKV_ROWS4_KEYS8(QKV_DECL)
#undef QKV_DECL
#define QKV_DECL(u) const T* __restrict kp##u = k + (u < U ? u : 0) * ks;
  QKV_UNROLL8(QKV_DECL)
#undef QKV_DECL
  for (int64_t t = 0; t < d_full; t += N) {
    const V q0 = O::LoadU(q + t);
    const V q1 = R > 1 ? O::LoadU(q + d + t) : q0;
    const V q2 = R > 2 ? O::LoadU(q + 2 * d + t) : q0;
    const V q3 = R > 3 ? O::LoadU(q + 3 * d + t) : q0;
    const V w = kKind == kAdditive ? O::LoadU(w_v + t) : O::Zero();
#define QKV_TERM(r, u) \
  if (r < R) a##r##_##u = ScoreTerm<kKind>(q##r, b, w, a##r##_##u);
#define QKV_KEY(u)                                \
  if (u < U) {                                    \
    const V b = E::Load(kp##u + t);               \
    QKV_ROWS4(QKV_TERM, u)                        \
  }
    QKV_UNROLL8(QKV_KEY)
#undef QKV_KEY
#undef QKV_TERM
  }
  // The lane sums 4 at a time where the engine has SumLanes4 (the same
  // bits): a row's 4 keys, or one key's 4 rows (measured faster for GQA-4
  // decoding from cache on Zen 4, on AVX-512 and xsimd:avx2:
  // bench/README.md, "The row path's lane sums 4 at a time").
  constexpr bool kByKeys = O::kTransposeLanes != 0 && U == 4;
  constexpr bool kByRows = O::kTransposeLanes != 0 && U == 1 && R == 4;
  if constexpr (kByKeys) {
#define QKV_SUMS(r)                                                        \
  if (r < R) {                                                             \
    alignas(16) float sums[4];                                             \
    O::SumLanes4(a##r##_0, a##r##_1, a##r##_2, a##r##_3, sums);            \
    st[r * s_stride + 0] =                                                 \
        (sums[0] + RowTail<kKind, E>(q + r * d, kp0, w_v, d_full, d)) *    \
        finish;                                                            \
    st[r * s_stride + 1] =                                                 \
        (sums[1] + RowTail<kKind, E>(q + r * d, kp1, w_v, d_full, d)) *    \
        finish;                                                            \
    st[r * s_stride + 2] =                                                 \
        (sums[2] + RowTail<kKind, E>(q + r * d, kp2, w_v, d_full, d)) *    \
        finish;                                                            \
    st[r * s_stride + 3] =                                                 \
        (sums[3] + RowTail<kKind, E>(q + r * d, kp3, w_v, d_full, d)) *    \
        finish;                                                            \
  }
    QKV_SUMS(0) QKV_SUMS(1) QKV_SUMS(2) QKV_SUMS(3)
#undef QKV_SUMS
  } else if constexpr (kByRows) {
    alignas(16) float sums[4];
    O::SumLanes4(a0_0, a1_0, a2_0, a3_0, sums);
    for (int r = 0; r < 4; ++r) {
      st[r * s_stride] =
          (sums[r] + RowTail<kKind, E>(q + r * d, kp0, w_v, d_full, d)) *
          finish;
    }
  } else {
#define QKV_STORE(r, u)                                                  \
  if (r < R && u < U) {                                                  \
    st[r * s_stride + u] = Finished<kKind, E>(a##r##_##u, q + r * d,     \
                                              kp##u, w_v, d_full, d,     \
                                              finish);                   \
  }
    QKV_ROWS4_KEYS8(QKV_STORE)
#undef QKV_STORE
  }
}

// R rows (queries q + r * d, scores at st + r * s_stride) against nb
// keys: st[r * s_stride + j] = finish * sum_t f(q_r[t], k_j[t]), d in
// lanes. Also projects for kAdditive (q a key or query, k the rows of
// W). Keys are rows of E (F32Rows but on the fused path). The prefetch
// steps once every 4 keys. Given pf (keys streamed from memory), x86
// targets take a step's keys one after the other, as RowScores does
// (KeyMajorScores; per (row, key) the same operations: the same bits):
// measured faster for GQA-4 decoding from DRAM on Zen 4, on AVX-512 and
// AVX2; from cache, or on 4-lane targets, no faster or slower, so not there
// (bench/README.md, "Keys read in order for the hardware prefetchers").
template <class O>
template <int R, int kKind, class E>
__attribute__((noinline)) void Flash<O>::RowScoresRows(
    const float* __restrict q, const typename E::T* __restrict k, int64_t d,
    int64_t ks, int64_t nb, float finish, const float* __restrict w_v,
    float* __restrict st, int64_t s_stride, BlockPrefetch* pf) {
  const int64_t N = static_cast<int64_t>(O::Lanes());
  const int64_t d_full = d - d % N;
  if (d_full == 0) {  // vectors shorter than one SIMD vector: plain loops
    for (int r = 0; r < R; ++r) {
      for (int64_t j = 0; j < nb; ++j) {
        st[r * s_stride + j] =
            RowTail<kKind, E>(q + r * d, k + j * ks, w_v, 0, d) * finish;
      }
    }
    return;
  }
  constexpr int U = RowUnroll<R>();
  int64_t j = 0;
  for (; j + U <= nb; j += U) {
    if (pf != nullptr && (U >= 4 || j % 4 == 0)) {
      pf->v.Step();
      pf->k.Step();
    }
    if (O::kTransposeLanes >= 8 && pf != nullptr) {  // keys from memory
      for (int u = 0; u < U; ++u) {
        RowKeysStep<R, 1, kKind, E>(q, k + (j + u) * ks, d, d_full, ks,
                                    finish, w_v, st + j + u, s_stride);
      }
      continue;
    }
    RowKeysStep<R, U, kKind, E>(q, k + j * ks, d, d_full, ks, finish, w_v,
                            st + j, s_stride);
  }
  if (U > 4 && j + 4 <= nb) {
    RowKeysStep<R, 4, kKind, E>(q, k + j * ks, d, d_full, ks, finish, w_v,
                            st + j, s_stride);
    j += 4;
  }
  if (U > 2 && j + 2 <= nb) {
    RowKeysStep<R, 2, kKind, E>(q, k + j * ks, d, d_full, ks, finish, w_v,
                            st + j, s_stride);
    j += 2;
  }
  for (; j < nb; ++j) {
    RowKeysStep<R, 1, kKind, E>(q, k + j * ks, d, d_full, ks, finish, w_v,
                            st + j, s_stride);
  }
}

// Dot scores of 8 rows (queries q + r * d) for nb f32 keys, for x86
// targets with a full-width in-register transpose (AVX-512: 16 x 16;
// AVX2: 8 x 8, the rows in two passes of 4 over the same 2 keys) and d
// whole vectors: 2 keys at a time, one accumulator per (row, key), each
// key vector loaded once for a pass's rows; the 16 (8) accumulators'
// lane sums come out of one O::SumLanes instead of a reduction each
// (lane i of the result: accumulator i's sum, as ((l0 + l1) + (l2 + l3)) +
// ..., the order a transpose and a tree of adds give, in 30 (14) shuffles
// instead of 64 (24), measured faster for GQA-8 decoding from L3 on Zen 4;
// bench/README.md, "One row in phases of key blocks; RowScores8's lane sums").
// A last odd key takes the rows in two halves of 4 (RowKeysStep). Each
// query vector is loaded once for both keys (10 loads per 16 multiply-adds;
// GCC's code loaded it for each key, 18, and spilled the key vectors when
// told not to: O::InRegister and QKV_ONE_REGION; with AnyZero, measured
// faster for GQA-8 decoding from L3 on Zen 4: bench/README.md, "GQA-8
// scores with each query vector loaded once; the zero scan in vectors").
// st[r * s_stride + j] = finish * (q_r . k_j). pf's V stream steps once
// every 4 keys (its K stream goes with the output, which takes longer
// than the scores at 8 rows: JointOutput).
template <class O>
__attribute__((noinline)) QKV_ONE_REGION void Flash<O>::RowScores8(
    const float* __restrict q, const float* __restrict k, int64_t d, int64_t ks,
    int64_t nb, float finish, float* __restrict st, int64_t s_stride,
    BlockPrefetch* pf) {
  if constexpr (O::kTransposeLanes != 0) {
    constexpr size_t kN = O::kTransposeLanes;  // accumulators per sum
    constexpr int64_t U = 2;
    constexpr int64_t kRows = static_cast<int64_t>(kN) / U;  // per pass
    const V vfinish = O::Set(finish);
    alignas(64) float sums[kN];
    int64_t j = 0;
    for (; j + U <= nb; j += U) {
      if (pf != nullptr && j % 4 == 0) pf->v.Step();
      const float* __restrict kj = k + j * ks;
      for (int64_t r0 = 0; r0 < 8; r0 += kRows) {
        const float* __restrict qr = q + r0 * d;
        V acc[kN];
#pragma GCC unroll 16
        for (size_t i = 0; i < kN; ++i) acc[i] = O::Zero();
        for (int64_t t = 0; t < d; t += static_cast<int64_t>(kN)) {
          const V k0 = O::InRegister(O::LoadU(kj + t));
          const V k1 = O::InRegister(O::LoadU(kj + ks + t));
#pragma GCC unroll 8
          for (int64_t r = 0; r < kRows; ++r) {
            const V qv = O::InRegister(O::LoadU(qr + r * d + t));
            acc[r * U] = O::MulAdd(qv, k0, acc[r * U]);
            acc[r * U + 1] = O::MulAdd(qv, k1, acc[r * U + 1]);
          }
        }
        O::Store(O::Mul(O::SumLanes(acc), vfinish), sums);
#pragma GCC unroll 8
        for (int64_t r = 0; r < kRows; ++r) {
#pragma GCC unroll 2
          for (int64_t u = 0; u < U; ++u) {
            st[(r0 + r) * s_stride + j + u] = sums[r * U + u];
          }
        }
      }
    }
    const int64_t d_full = d - d % static_cast<int64_t>(O::Lanes());
    for (; j < nb; ++j) {
      RowKeysStep<4, 1, kDot, F32Rows>(q, k + j * ks, d, d_full, ks, finish,
                                       nullptr, st + j, s_stride);
      RowKeysStep<4, 1, kDot, F32Rows>(q + 4 * d, k + j * ks, d, d_full, ks,
                                       finish, nullptr,
                                       st + 4 * s_stride + j, s_stride);
    }
  } else {
    (void)q, (void)k, (void)d, (void)ks, (void)nb, (void)finish, (void)st;
    (void)s_stride, (void)pf;
  }
}

// The vector terms of one key's score: q . k (or its kind's terms) over
// the first d_full elements, in one accumulator. (RowScores' last keys
// spell the same loop out: written through this function they changed
// code generation elsewhere and slowed highway:SSE4 f16 decoding;
// bench/README.md, "The plan's rules and the figures behind them".)
template <class O>
template <int kKind, class E>
QKV_FLASH_INLINE typename Flash<O>::V Flash<O>::KeyScoreTerms(
    const float* __restrict q, const typename E::T* __restrict k,
    const float* __restrict w_v, int64_t d_full) {
  const int64_t N = static_cast<int64_t>(O::Lanes());
  V a = O::Zero();
  for (int64_t t = 0; t < d_full; t += N) {
    const V wv = kKind == kAdditive ? O::LoadU(w_v + t) : O::Zero();
    a = ScoreTerm<kKind>(O::LoadU(q + t), E::Load(k + t), wv, a);
  }
  return a;
}

template <class O>
template <int kKind, class E>
__attribute__((noinline)) void Flash<O>::RowScores(
    const float* __restrict q, const typename E::T* __restrict k, int64_t d,
    int64_t ks, int64_t nb, float finish, const float* __restrict w_v,
    float* __restrict st, BlockPrefetch* pf) {
  using T = typename E::T;
  const int64_t N = static_cast<int64_t>(O::Lanes());
  const int64_t d_full = d - d % N;
  int64_t j = 0;
  if (d_full == 0) {  // vectors shorter than one SIMD vector: plain loops
    for (; j < nb; ++j) {
      st[j] = RowTail<kKind, E>(q, k + j * ks, w_v, 0, d) * finish;
    }
    return;
  }
  for (; j + 4 <= nb; j += 4) {
    if (pf != nullptr) {
      pf->v.Step();
      pf->k.Step();
    }
    const T* k0 = k + j * ks;
    const T* k1 = k0 + ks;
    const T* k2 = k1 + ks;
    const T* k3 = k2 + ks;
    V a0 = O::Zero(), a1 = O::Zero(), a2 = O::Zero(), a3 = O::Zero();
    if (KeyMajorScores<E>() && pf != nullptr) {
      a0 = KeyScoreTerms<kKind, E>(q, k0, w_v, d_full);
      a1 = KeyScoreTerms<kKind, E>(q, k1, w_v, d_full);
      a2 = KeyScoreTerms<kKind, E>(q, k2, w_v, d_full);
      a3 = KeyScoreTerms<kKind, E>(q, k3, w_v, d_full);
    } else {
      for (int64_t t = 0; t < d_full; t += N) {
        const V qv = O::LoadU(q + t);
        const V wv = kKind == kAdditive ? O::LoadU(w_v + t) : O::Zero();
        a0 = ScoreTerm<kKind>(qv, E::Load(k0 + t), wv, a0);
        a1 = ScoreTerm<kKind>(qv, E::Load(k1 + t), wv, a1);
        a2 = ScoreTerm<kKind>(qv, E::Load(k2 + t), wv, a2);
        a3 = ScoreTerm<kKind>(qv, E::Load(k3 + t), wv, a3);
      }
    }
    // The 4 lane sums at once (O::SumLanes4, the same bits as 4
    // reductions in a third of the shuffles; measured faster for S1
    // decoding from L2 on Zen 4 on AVX-512, unchanged from DRAM:
    // bench/README.md, "The row path's lane sums 4 at a time").
    if constexpr (O::kTransposeLanes != 0) {
      alignas(16) float sums[4];
      O::SumLanes4(a0, a1, a2, a3, sums);
      st[j + 0] = (sums[0] + RowTail<kKind, E>(q, k0, w_v, d_full, d)) *
                  finish;
      st[j + 1] = (sums[1] + RowTail<kKind, E>(q, k1, w_v, d_full, d)) *
                  finish;
      st[j + 2] = (sums[2] + RowTail<kKind, E>(q, k2, w_v, d_full, d)) *
                  finish;
      st[j + 3] = (sums[3] + RowTail<kKind, E>(q, k3, w_v, d_full, d)) *
                  finish;
    } else {
      st[j + 0] = Finished<kKind, E>(a0, q, k0, w_v, d_full, d, finish);
      st[j + 1] = Finished<kKind, E>(a1, q, k1, w_v, d_full, d, finish);
      st[j + 2] = Finished<kKind, E>(a2, q, k2, w_v, d_full, d, finish);
      st[j + 3] = Finished<kKind, E>(a3, q, k3, w_v, d_full, d, finish);
    }
  }
  for (; j < nb; ++j) {
    const T* k0 = k + j * ks;
    V a0 = O::Zero();
    for (int64_t t = 0; t < d_full; t += N) {
      const V wv = kKind == kAdditive ? O::LoadU(w_v + t) : O::Zero();
      a0 = ScoreTerm<kKind>(O::LoadU(q + t), E::Load(k0 + t), wv, a0);
    }
    st[j] = Finished<kKind, E>(a0, q, k0, w_v, d_full, d, finish);
  }
}

// Dot scores of one row with keys [j0, j0 + nb) of src (kDot: finish 1,
// the scale is in q; kDotScaled: finish = scale).
template <class O>
template <class E>
inline void Flash<O>::RowDotScoresOf(const float* q, const KvSource& src,
                                     int64_t j0, int64_t d, int64_t nb,
                                     float finish, float* st,
                                     BlockPrefetch* pf) {
  using T = typename E::T;
  const int64_t ks = src.row_bytes / static_cast<int64_t>(sizeof(T));
  RowScores<kDot, E>(q, reinterpret_cast<const T*>(KvRowAt(src, j0)), d,
                     ks, nb, finish, nullptr, st, pf);
  if (E::kScaled) {
    const float* sc = KvScalesAt(src, j0);
    for (int64_t j = 0; j < nb; ++j) st[j] *= sc[j * src.scale_st];
  }
}

template <class O>
inline void Flash<O>::RowDotScoresLowPrecision(const float* q,
                                               const KvSource& src, int64_t j0,
                                               int64_t d, int64_t nb,
                                               float finish, float* st,
                                               BlockPrefetch* pf) {
  OnKvType<O>(src.dtype, [&](auto e) {
    RowDotScoresOf<decltype(e)>(q, src, j0, d, nb, finish, st, pf);
  });
}
