// The pipeline (Flash<O>, src/pipeline/flash-inl.h): tile kernels, scores: a
// tile's query rows in lanes against keys broadcast one at a time, for every
// score kind. Included by flash-inl.h inside its per-target namespace, after
// the struct.

// One term of a score's sum: q . k (DOT), |q - k|^2 (GAUSSIAN), or
// w_v tanh(q + k) (ADDITIVE, on projections).
template <class O>
template <int kKind>
QKV_FLASH_INLINE typename Flash<O>::V Flash<O>::ScoreTerm(V q, V k, V w,
                                                          V acc) {
  if (kKind == kAdditive) return O::MulAdd(w, O::Tanh(O::Add(q, k)), acc);
  if (kKind == kGaussian) {
    const V e = O::Sub(q, k);
    return O::MulAdd(e, e, acc);
  }
  return O::MulAdd(q, k, acc);
}

template <class O>
template <int kKind>
inline float Flash<O>::ScoreTermScalar(float q, float k, float w) {
  if (kKind == kAdditive) return w * tanhf(q + k);
  if (kKind == kGaussian) return (q - k) * (q - k);
  return q * k;
}

// st[j][*] for keys j < U of the block starting at k, RV row vectors
// (R = RV * N lanes), times the kind's finishing factor where it has one
// (GAUSSIAN: -scale, kDotScaled: scale).
template <class O>
template <int RV, int U, int kKind>
__attribute__((noinline)) void Flash<O>::ScoreKeys(const float* __restrict qt,
                                                   const float* __restrict k,
                                                   int64_t d, int64_t ks,
                                                   float finish_scale,
                                                   const float* __restrict w_v,
                                                   float* __restrict st) {
  // The tile's row stride, a constant wherever the vector width is.
  const size_t N = O::Lanes(), R = RV * N;
  const V finish = O::Set(finish_scale);
  constexpr bool kFinish = kKind == kGaussian || kKind == kDotScaled;
  (void)w_v;
#define QKV_DECL(u)                                          \
  const float* __restrict k##u = k + (u < U ? u : 0) * ks;   \
  V a##u##0 = O::Zero(), a##u##1 = O::Zero();
  QKV_UNROLL8(QKV_DECL)
#undef QKV_DECL
  for (int64_t t = 0; t < d; ++t) {
    const V q0 = O::Load(qt + t * R);
    const V q1 = RV > 1 ? O::Load(qt + t * R + N) : q0;
    const V w = kKind == kAdditive ? O::Set(w_v[t]) : q0;
#define QKV_STEP(u)                                               \
  if (u < U) {                                                    \
    const V b = O::Set(k##u[t]);                                  \
    a##u##0 = ScoreTerm<kKind>(q0, b, w, a##u##0);                \
    if (RV > 1) a##u##1 = ScoreTerm<kKind>(q1, b, w, a##u##1);    \
  }
    QKV_UNROLL8(QKV_STEP)
#undef QKV_STEP
  }
#define QKV_STORE(u)                                       \
  if (u < U) {                                             \
    V s0 = a##u##0, s1 = a##u##1;                          \
    if (kFinish) {                                         \
      s0 = O::Mul(s0, finish);                             \
      s1 = O::Mul(s1, finish);                             \
    }                                                      \
    O::Store(s0, st + u * R);                              \
    if (RV > 1) O::Store(s1, st + u * R + N);              \
  }
  QKV_UNROLL8(QKV_STORE)
#undef QKV_STORE
}

// The score tile over nb keys: steps of TileUnroll keys, the rest in
// steps of 4, 2 and 1 (fewer chains, but no key alone unless it is the
// last odd one).
template <class O>
template <int RV, int kKind>
QKV_FLASH_INLINE void Flash<O>::ScoresOf(const float* __restrict qt, size_t R,
                                         const float* __restrict k, int64_t d,
                                         int64_t ks, int64_t nb, float finish,
                                         const float* __restrict w_v,
                                         float* __restrict st,
                                         PrefetchStream* pf) {
  constexpr int U = TileUnroll<RV>();
  int64_t j = 0;
  for (; j + U <= nb; j += U) {
    pf->Step();
    ScoreKeys<RV, U, kKind>(qt, k + j * ks, d, ks, finish, w_v,
                            st + j * R);
  }
  if (U > 4 && j + 4 <= nb) {
    ScoreKeys<RV, 4, kKind>(qt, k + j * ks, d, ks, finish, w_v,
                            st + j * R);
    j += 4;
  }
  if (j + 2 <= nb) {
    ScoreKeys<RV, 2, kKind>(qt, k + j * ks, d, ks, finish, w_v,
                            st + j * R);
    j += 2;
  }
  for (; j < nb; ++j) {
    ScoreKeys<RV, 1, kKind>(qt, k + j * ks, d, ks, finish, w_v,
                            st + j * R);
  }
}

// The score kind, chosen once per block.
template <class O>
template <int RV>
QKV_FLASH_INLINE void Flash<O>::Scores(const Operands& op, const float* w_v,
                                       const float* __restrict qt, size_t R,
                                       const float* __restrict k, int64_t nb,
                                       float* __restrict st,
                                       PrefetchStream* pf) {
  const int64_t d = op.dim, ks = op.k_st;
  switch (op.kind) {
    case kAdditive:
      return ScoresOf<RV, kAdditive>(qt, R, k, d, ks, nb, 1.0f, w_v, st,
                                     pf);
    case kGaussian:
      return ScoresOf<RV, kGaussian>(qt, R, k, d, ks, nb, op.finish, w_v,
                                     st, pf);
    case kDotScaled:
      return ScoresOf<RV, kDotScaled>(qt, R, k, d, ks, nb, op.finish, w_v,
                                      st, pf);
    default:
      return ScoresOf<RV, kDot>(qt, R, k, d, ks, nb, 1.0f, w_v, st, pf);
  }
}
