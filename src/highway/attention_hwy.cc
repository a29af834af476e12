// The Highway engine: FlashAttention-style f32 attention, compiled once per
// SIMD target by foreach_target and picked at run time.
//
// Layout trick: query rows live in vector lanes. A task owns a tile of
// R = 2 * Lanes rows of one (batch, kv head): the query rows of every query
// head that shares that kv head (GQA), so the group reads each K/V row once.
// Q is packed transposed and pre-scaled (qt[t][r]); a score is
// st[j][r] = sum_t qt[t][r] * k[j][t], a broadcast of k[j][t] times a vector
// of rows, and out is accumulated transposed as ot[c][r] += p[j][r] * v[j][c].
// K and V are read in their natural layout with no packing, every softmax
// step (running max, rescale, exp, sum) is lane-wise with no horizontal
// reduction, and masks are per-lane key limits. Keys are processed in blocks
// of kBlockKeys with one online-softmax rescale per block; blocks past every
// row's causal/valid-length limit are never computed and blocks before every
// row's limit skip the mask.
//
// exp is ExpNonPositive below (max error 1.03 ulp on [-87, 0] with FMA, 0
// below -87): its argument here is always <= 0 or -inf.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "highway/attention_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <math.h>
#include <string.h>

#include "engine.h"
#include "tiling.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

// The target's name as a string literal (this file is compiled once per
// target, so the macro is redefined each time).
#undef QKV_HWY_TARGET_NAME
#if HWY_TARGET == HWY_AVX3_DL
#define QKV_HWY_TARGET_NAME "AVX3_DL"
#elif HWY_TARGET == HWY_AVX3
#define QKV_HWY_TARGET_NAME "AVX3"
#elif HWY_TARGET == HWY_AVX2
#define QKV_HWY_TARGET_NAME "AVX2"
#elif HWY_TARGET == HWY_SSE4
#define QKV_HWY_TARGET_NAME "SSE4"
#elif HWY_TARGET == HWY_SSSE3
#define QKV_HWY_TARGET_NAME "SSSE3"
#elif HWY_TARGET == HWY_SVE2
#define QKV_HWY_TARGET_NAME "SVE2"
#elif HWY_TARGET == HWY_SVE
#define QKV_HWY_TARGET_NAME "SVE"
#elif HWY_TARGET == HWY_NEON
#define QKV_HWY_TARGET_NAME "NEON"
#elif HWY_TARGET == HWY_WASM
#define QKV_HWY_TARGET_NAME "WASM"
#elif HWY_TARGET == HWY_EMU128
#define QKV_HWY_TARGET_NAME "EMU128"
#elif HWY_TARGET == HWY_SCALAR
#define QKV_HWY_TARGET_NAME "SCALAR"
#else
#define QKV_HWY_TARGET_NAME "OTHER"
#endif

HWY_BEFORE_NAMESPACE();
namespace qkv {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;

size_t Lanes() { return hn::Lanes(DF()); }
size_t TileRows() { return 2 * Lanes(); }

// exp(x) for the arguments softmax has here: x <= 0, or -inf. Results below
// FLT_MIN (x < -87) are flushed to 0: those terms are under 1e-38 of the
// row's largest weight, far below the accuracy bound, and flushing keeps
// every intermediate normal (x86 takes a microcode assist on subnormals).
// Method: x = n ln2 + r with n = round(x / ln2) in [-126, 0], rounded by
// adding 1.5 * 2^23 (n lands in the low mantissa bits, which also give the
// exponent of 2^n), |r| <= ln2/2 with ln2 in two parts (r exact to ~1e-10),
// then exp(r) by a degree-6 polynomial fitted for least maximum relative
// error on [-ln2/2, ln2/2] (2e-9). Max error 1.03 ulp on [-87, 0] (the fit
// and that error: bench/exp_fit.py; tests/softmax_ulp_test.cc holds every
// engine's softmax in ulps). 16 operations per vector, 11 of them on the FMA
// pipes: softmax costs a sixth of a tile's time.
template <class V>
HWY_INLINE V ExpNonPositive(V x) {
  const hn::DFromV<V> df;
  const hn::RebindToSigned<decltype(df)> di;
  const V lowest = hn::Set(df, -87.0f);
  const V round = hn::Set(df, 12582912.0f);  // 1.5 * 2^23
  const V xc = hn::Max(x, lowest);
  const V t = hn::MulAdd(xc, hn::Set(df, 1.44269504088896341f), round);
  const V nf = hn::Sub(t, round);
  V r = hn::MulAdd(nf, hn::Set(df, -0.693145751953125f), xc);
  r = hn::MulAdd(nf, hn::Set(df, -1.428606765330187045e-6f), r);
  V poly = hn::Set(df, 0.0013843622291460633f);
  poly = hn::MulAdd(poly, r, hn::Set(df, 0.0083741797134280205f));
  poly = hn::MulAdd(poly, r, hn::Set(df, 0.041668005287647247f));
  poly = hn::MulAdd(poly, r, hn::Set(df, 0.16666430234909058f));
  poly = hn::MulAdd(poly, r, hn::Set(df, 0.49999994039535522f));
  poly = hn::MulAdd(poly, r, hn::Set(df, 1.0f));
  poly = hn::MulAdd(poly, r, hn::Set(df, 1.0f));
  // The low bits of t hold n (two's complement); shifted to the exponent
  // field they give n, and the bias makes 2^n.
  const V scale = hn::BitCast(
      df, hn::Add(hn::ShiftLeft<23>(hn::BitCast(di, t)),
                  hn::Set(di, 127 << 23)));
  return hn::IfThenZeroElse(hn::Lt(x, lowest), hn::Mul(poly, scale));
}
// tanh for additive scores. Highway 1.0.3's EMU128 target converts NaN to
// int32 with a plain cast inside Tanh (undefined behaviour); there NaN lanes
// go through as 0 and come out as the NaN they were.
template <class V>
HWY_INLINE V TanhOf(V x) {
  const hn::DFromV<V> df;
#if HWY_TARGET == HWY_EMU128
  const auto nan = hn::Ne(x, x);
  return hn::IfThenElse(nan, x, hn::Tanh(df, hn::IfThenZeroElse(nan, x)));
#else
  return hn::Tanh(df, x);
#endif
}

// In-register transpose of a square block of N x N floats (v[i] row i in,
// column i out; src/transpose_x86.h) where shuffles beat gathers: 16 x 16 on
// AVX-512 and 8 x 8 on AVX2. Elsewhere QKV_HWY_TRANSPOSE is 0 and the tiles
// use gathers (and no array of vectors is ever declared: SVE vectors are
// sizeless and cannot be array elements).
#undef QKV_HWY_TRANSPOSE
#undef QKV_TRANSPOSE_BITS
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define QKV_HWY_TRANSPOSE 1
#define QKV_TRANSPOSE_BITS (HWY_TARGET <= HWY_AVX3 ? 512 : 256)
#include "transpose_x86.h"
HWY_INLINE void TransposeSquare(VF* v) {
  constexpr int kN = QKV_TRANSPOSE_BITS / 32;
  decltype(v[0].raw) raw[kN];
  for (int i = 0; i < kN; ++i) raw[i] = v[i].raw;
  TransposeRegisters(raw);
  for (int i = 0; i < kN; ++i) v[i].raw = raw[i];
}
#else
#define QKV_HWY_TRANSPOSE 0
#endif

// Register tiles: kUnroll keys (scores) or value columns (output) times RV
// row vectors. Targets with 32 vector registers (AVX-512, NEON, SVE) keep 16
// accumulators in flight, enough to hide FMA latency on two FMA ports; the
// 16-register x86 targets keep 8.
#if HWY_ARCH_ARM || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr int kUnroll = 8;
#else
constexpr int kUnroll = 4;
#endif

// Accumulators are named variables, not arrays: SVE vectors are sizeless and
// cannot live in arrays. Lanes u >= U of an unroll are compiled away.
#define QKV_UNROLL8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

// st[j][*] for keys j < U of the block starting at k. RV row vectors
// (R = RV * N lanes); Gaussian scores are finished by the factor -scale,
// kDotScaled ones by scale.
template <int RV, int U, int kKind>
HWY_NOINLINE void ScoreKeys(const float* HWY_RESTRICT qt, size_t R,
                            const float* HWY_RESTRICT k, int64_t d,
                            float finish_scale, const float* HWY_RESTRICT w_v,
                            float* HWY_RESTRICT st) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF finish = hn::Set(df, finish_scale);
  constexpr bool kGauss = kKind == kGaussian;
  constexpr bool kFinish = kGauss || kKind == kDotScaled;
  (void)w_v;
#define QKV_DECL(u)                                   \
  const float* HWY_RESTRICT k##u = k + (u < U ? u : 0) * d; \
  VF a##u##0 = hn::Zero(df), a##u##1 = hn::Zero(df);
  QKV_UNROLL8(QKV_DECL)
#undef QKV_DECL
  for (int64_t t = 0; t < d; ++t) {
    const VF q0 = hn::Load(df, qt + t * R);
    const VF q1 = RV > 1 ? hn::Load(df, qt + t * R + N) : q0;
    const VF w = kKind == kAdditive ? hn::Set(df, w_v[t]) : q0;
#define QKV_STEP(u)                                      \
  if (u < U) {                                           \
    const VF b = hn::Set(df, k##u[t]);                   \
    if (kKind == kAdditive) {                            \
      a##u##0 = hn::MulAdd(w, TanhOf(hn::Add(q0, b)), a##u##0); \
      if (RV > 1) {                                      \
        a##u##1 = hn::MulAdd(w, TanhOf(hn::Add(q1, b)), a##u##1); \
      }                                                  \
    } else if (kGauss) {                                 \
      const VF e0 = hn::Sub(q0, b);                      \
      a##u##0 = hn::MulAdd(e0, e0, a##u##0);             \
      if (RV > 1) {                                      \
        const VF e1 = hn::Sub(q1, b);                    \
        a##u##1 = hn::MulAdd(e1, e1, a##u##1);           \
      }                                                  \
    } else {                                             \
      a##u##0 = hn::MulAdd(q0, b, a##u##0);              \
      if (RV > 1) a##u##1 = hn::MulAdd(q1, b, a##u##1);  \
    }                                                    \
  }
    QKV_UNROLL8(QKV_STEP)
#undef QKV_STEP
  }
#define QKV_STORE(u)                                                 \
  if (u < U) {                                                       \
    VF s0 = a##u##0, s1 = a##u##1;                                   \
    if (kFinish) {                                                   \
      s0 = hn::Mul(s0, finish);                                      \
      s1 = hn::Mul(s1, finish);                                      \
    }                                                                \
    hn::Store(s0, df, st + u * R);                                   \
    if (RV > 1) hn::Store(s1, df, st + u * R + N);                   \
  }
  QKV_UNROLL8(QKV_STORE)
#undef QKV_STORE
}

template <int RV, int kKind>
HWY_INLINE void Scores(const float* HWY_RESTRICT qt, size_t R,
                       const float* HWY_RESTRICT k, int64_t d, int64_t nb,
                       float finish_scale, const float* HWY_RESTRICT w_v,
                       float* HWY_RESTRICT st, PrefetchStream* pf) {
  int64_t j = 0;
  for (; j + kUnroll <= nb; j += kUnroll) {
    pf->Step();
    ScoreKeys<RV, kUnroll, kKind>(qt, R, k + j * d, d, finish_scale, w_v,
                                  st + j * R);
  }
  for (; j < nb; ++j) {
    ScoreKeys<RV, 1, kKind>(qt, R, k + j * d, d, finish_scale, w_v,
                            st + j * R);
  }
}

// ot[c][*] = ot[c][*] * alpha + sum_{j < nb} pt[j][*] * v[j][c] for the U
// value columns starting at c = 0 of v and ot.
// kGuard: lanes whose probability is 0 (a hidden key) leave the output
// untouched, so a NaN or Inf in a value row that a query cannot see never
// reaches it (0 * NaN is NaN). Used only in blocks that hide some keys.
template <int RV, int U, bool kGuard>
HWY_NOINLINE void OutputColumns(const float* HWY_RESTRICT pt, size_t R,
                                const float* HWY_RESTRICT v, int64_t dv,
                                int64_t nb, VF alpha0, VF alpha1,
                                float* HWY_RESTRICT ot) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF zero = hn::Zero(df);
#define QKV_DECL(u)                                                        \
  VF o##u##0 = hn::Zero(df), o##u##1 = hn::Zero(df);                       \
  if (u < U) {                                                             \
    o##u##0 = hn::Mul(hn::Load(df, ot + u * R), alpha0);                   \
    if (RV > 1) o##u##1 = hn::Mul(hn::Load(df, ot + u * R + N), alpha1);   \
  }
  QKV_UNROLL8(QKV_DECL)
#undef QKV_DECL
  for (int64_t j = 0; j < nb; ++j) {
    const float* HWY_RESTRICT vj = v + j * dv;
    const VF p0 = hn::Load(df, pt + j * R);
    const VF p1 = RV > 1 ? hn::Load(df, pt + j * R + N) : p0;
    const auto read0 = hn::Gt(p0, zero);
    const auto read1 = hn::Gt(p1, zero);
#define QKV_STEP(u)                                                       \
  if (u < U) {                                                            \
    const VF b = hn::Set(df, vj[u]);                                      \
    if (kGuard) {                                                         \
      o##u##0 = hn::IfThenElse(read0, hn::MulAdd(p0, b, o##u##0), o##u##0); \
      if (RV > 1) {                                                       \
        o##u##1 =                                                         \
            hn::IfThenElse(read1, hn::MulAdd(p1, b, o##u##1), o##u##1);   \
      }                                                                   \
    } else {                                                              \
      o##u##0 = hn::MulAdd(p0, b, o##u##0);                               \
      if (RV > 1) o##u##1 = hn::MulAdd(p1, b, o##u##1);                   \
    }                                                                     \
  }
    QKV_UNROLL8(QKV_STEP)
#undef QKV_STEP
  }
#define QKV_STORE(u)                                  \
  if (u < U) {                                        \
    hn::Store(o##u##0, df, ot + u * R);               \
    if (RV > 1) hn::Store(o##u##1, df, ot + u * R + N); \
  }
  QKV_UNROLL8(QKV_STORE)
#undef QKV_STORE
}

template <int RV, bool kGuard>
HWY_INLINE void AccumulateOutput(const float* HWY_RESTRICT pt, size_t R,
                                 const float* HWY_RESTRICT v, int64_t dv,
                                 int64_t nb, VF alpha0, VF alpha1,
                                 float* HWY_RESTRICT ot, PrefetchStream* pf) {
  int64_t c = 0;
  for (; c + kUnroll <= dv; c += kUnroll) {
    pf->Step();
    OutputColumns<RV, kUnroll, kGuard>(pt, R, v + c, dv, nb, alpha0, alpha1,
                                       ot + c * R);
  }
  for (; c < dv; ++c) {
    OutputColumns<RV, 1, kGuard>(pt, R, v + c, dv, nb, alpha0, alpha1,
                                 ot + c * R);
  }
}

// Online softmax over one block of nb scores per lane, for the RV row
// vectors of a tile: updates each running max m and sum l, turns st into
// probabilities relative to the new max and returns in alpha the factor
// exp(m_old - m_new) by which earlier sums and outputs scale. The row
// vectors are done together and the max and sum run in two chains each:
// with one dependent chain per vector this step was latency-bound.
template <int RV>
HWY_INLINE void SoftmaxBlock(float* HWY_RESTRICT st, size_t R, int64_t nb,
                             VF* m0, VF* l0, VF* alpha0, VF* m1, VF* l1,
                             VF* alpha1) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF neg_inf = hn::Set(df, -INFINITY);
  VF max0a = neg_inf, max0b = neg_inf, max1a = neg_inf, max1b = neg_inf;
  int64_t j = 0;
  for (; j + 2 <= nb; j += 2) {
    max0a = hn::Max(max0a, hn::Load(df, st + j * R));
    max0b = hn::Max(max0b, hn::Load(df, st + (j + 1) * R));
    if (RV > 1) {
      max1a = hn::Max(max1a, hn::Load(df, st + j * R + N));
      max1b = hn::Max(max1b, hn::Load(df, st + (j + 1) * R + N));
    }
  }
  if (j < nb) {
    max0a = hn::Max(max0a, hn::Load(df, st + j * R));
    if (RV > 1) max1a = hn::Max(max1a, hn::Load(df, st + j * R + N));
  }
  // A lane that has seen no visible key keeps max -inf; exponentiate its
  // (-inf) scores against 0 so they give 0, not NaN.
  const VF new0 = hn::Max(*m0, hn::Max(max0a, max0b));
  const VF use0 = hn::IfThenZeroElse(hn::Eq(new0, neg_inf), new0);
  *alpha0 = ExpNonPositive(hn::Sub(*m0, use0));
  *m0 = new0;
  VF use1 = use0;
  if (RV > 1) {
    const VF new1 = hn::Max(*m1, hn::Max(max1a, max1b));
    use1 = hn::IfThenZeroElse(hn::Eq(new1, neg_inf), new1);
    *alpha1 = ExpNonPositive(hn::Sub(*m1, use1));
    *m1 = new1;
  }
  VF sum0a = hn::Zero(df), sum0b = hn::Zero(df);
  VF sum1a = hn::Zero(df), sum1b = hn::Zero(df);
  j = 0;
  for (; j + 2 <= nb; j += 2) {
    float* s = st + j * R;
    const VF p0a = ExpNonPositive(hn::Sub(hn::Load(df, s), use0));
    const VF p0b = ExpNonPositive(hn::Sub(hn::Load(df, s + R), use0));
    hn::Store(p0a, df, s);
    hn::Store(p0b, df, s + R);
    sum0a = hn::Add(sum0a, p0a);
    sum0b = hn::Add(sum0b, p0b);
    if (RV > 1) {
      const VF p1a = ExpNonPositive(hn::Sub(hn::Load(df, s + N), use1));
      const VF p1b = ExpNonPositive(hn::Sub(hn::Load(df, s + R + N), use1));
      hn::Store(p1a, df, s + N);
      hn::Store(p1b, df, s + R + N);
      sum1a = hn::Add(sum1a, p1a);
      sum1b = hn::Add(sum1b, p1b);
    }
  }
  if (j < nb) {
    float* s = st + j * R;
    const VF p0 = ExpNonPositive(hn::Sub(hn::Load(df, s), use0));
    hn::Store(p0, df, s);
    sum0a = hn::Add(sum0a, p0);
    if (RV > 1) {
      const VF p1 = ExpNonPositive(hn::Sub(hn::Load(df, s + N), use1));
      hn::Store(p1, df, s + N);
      sum1a = hn::Add(sum1a, p1);
    }
  }
  *l0 = hn::MulAdd(*l0, *alpha0, hn::Add(sum0a, sum0b));
  if (RV > 1) *l1 = hn::MulAdd(*l1, *alpha1, hn::Add(sum1a, sum1b));
}

// w[j] = exp(w[j] - m) * inv_l for j < n, in place.
void NormalizeWeights(float* HWY_RESTRICT w, int64_t n, float m, float inv_l,
                      float* HWY_RESTRICT tail) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const VF vm = hn::Set(df, m), vs = hn::Set(df, inv_l);
  int64_t j = 0;
  for (; j + N <= n; j += N) {
    const VF x = hn::LoadU(df, w + j);
    hn::StoreU(hn::Mul(ExpNonPositive(hn::Sub(x, vm)), vs), df, w + j);
  }
  if (j < n) {  // never touch memory past the row: go through a scratch
    const size_t rest = static_cast<size_t>(n - j);
    for (int64_t u = 0; u < N; ++u) tail[u] = -INFINITY;
    memcpy(tail, w + j, rest * sizeof(float));
    const VF x = hn::Load(df, tail);
    hn::Store(hn::Mul(ExpNonPositive(hn::Sub(x, vm)), vs), df, tail);
    memcpy(w + j, tail, rest * sizeof(float));
  }
}

template <int RV>
void RunTile(const Problem& p, const Operands& op, int64_t b, int64_t kvh,
             int64_t r0, int64_t rows, const Tile& tile) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df);
  const size_t R = RV * N;
  const int64_t d = op.dim, dv = p.value_dim, lk = p.kv_len;

  // Rows of the tile: flat index r0 + r over (query head in group, query).
  // They are consecutive rows of q and out (the group's heads are adjacent),
  // so a full tile is transposed into qt with gathers.
  const bool gather_q = rows == static_cast<int64_t>(R) &&
                        static_cast<int64_t>(R) * d < (int64_t{1} << 30);
  if (gather_q) {
    const float* q = op.q + ((b * p.q_heads + kvh * p.group) * p.q_len + r0) * d;
    const auto idx = hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(d)));
    const VF scale = hn::Set(df, op.q_scale);
    int64_t t = 0;
#if QKV_HWY_TRANSPOSE
    {  // whole N x N blocks of (rows, t)
      VF blk[16];
      for (; t + static_cast<int64_t>(N) <= d; t += N) {
        for (size_t h = 0; h < static_cast<size_t>(RV); ++h) {
          for (size_t i = 0; i < N; ++i) {
            blk[i] = hn::LoadU(df, q + (h * N + i) * d + t);
          }
          TransposeSquare(blk);
          for (size_t i = 0; i < N; ++i) {
            hn::Store(hn::Mul(blk[i], scale), df, tile.qt + (t + i) * R + h * N);
          }
        }
      }
    }
#endif
    for (; t < d; ++t) {
      hn::Store(hn::Mul(hn::GatherIndex(df, q + t, idx), scale), df,
                tile.qt + t * R);
      if (RV > 1) {
        hn::Store(hn::Mul(hn::GatherIndex(df, q + N * d + t, idx), scale), df,
                  tile.qt + t * R + N);
      }
    }
  }
  int64_t min_limit, max_limit;
  SetUpTileRows(p, b, kvh, r0, rows, R, tile, &min_limit, &max_limit);
  if (!gather_q) PackQueriesScalar(op, rows, R, tile);
  for (int64_t c = 0; c < dv; ++c) {
    for (size_t r = 0; r < R; ++r) tile.ot[c * R + r] = 0.0f;
  }

  const float* k = op.k;
  const float* v = p.v + (b * p.kv_heads + kvh) * lk * dv;
  const VF neg_inf = hn::Set(df, -INFINITY);
  VF m0 = neg_inf, m1 = neg_inf;
  VF l0 = hn::Zero(df), l1 = hn::Zero(df);
  const auto limit0 = hn::Load(di, tile.limit);
  const auto limit1 = RV > 1 ? hn::Load(di, tile.limit + N) : limit0;
  const bool prefetch = PrefetchesKv(p);

  for (int64_t j0 = 0; j0 < max_limit; j0 += kBlockKeys) {
    const int64_t nb = j0 + kBlockKeys < max_limit ? kBlockKeys : max_limit - j0;
    float* st = tile.st;
    BlockPrefetch pf(prefetch, k, d, v, dv, j0, nb, max_limit, nb / kUnroll,
                     dv / kUnroll);
    if (op.kind == kAdditive) {
      Scores<RV, kAdditive>(tile.qt, R, k + j0 * d, d, nb, 1.0f, p.w_v, st,
                            &pf.v);
    } else if (op.kind == kGaussian) {
      Scores<RV, kGaussian>(tile.qt, R, k + j0 * d, d, nb, op.finish, p.w_v,
                            st, &pf.v);
    } else if (op.kind == kDotScaled) {
      Scores<RV, kDotScaled>(tile.qt, R, k + j0 * d, d, nb, op.finish, p.w_v,
                             st, &pf.v);
    } else {
      Scores<RV, kDot>(tile.qt, R, k + j0 * d, d, nb, 1.0f, p.w_v, st, &pf.v);
    }
    if (p.bias != nullptr) {
      for (int64_t r = 0; r < rows; ++r) AddBias(tile.bias[r], j0, nb, R, st + r);
    }
    const bool hides = j0 + nb > min_limit;
    if (hides) {  // some row's limit falls inside this block
      for (int64_t j = 0; j < nb; ++j) {
        const auto key = hn::Set(di, static_cast<int32_t>(j0 + j));
        float* s = st + j * R;
        hn::Store(hn::IfThenElse(hn::RebindMask(df, hn::Lt(key, limit0)),
                                 hn::Load(df, s), neg_inf),
                  df, s);
        if (RV > 1) {
          hn::Store(hn::IfThenElse(hn::RebindMask(df, hn::Lt(key, limit1)),
                                   hn::Load(df, s + N), neg_inf),
                    df, s + N);
        }
      }
    }
    if (p.weights != nullptr) {  // raw masked scores; normalized at the end
      for (int64_t r = 0; r < rows; ++r) {
        float* w = p.weights + tile.row[r] * lk + j0;
        for (int64_t j = 0; j < nb; ++j) w[j] = st[j * R + r];
      }
    }
    VF alpha0, alpha1 = hn::Zero(df);
    SoftmaxBlock<RV>(st, R, nb, &m0, &l0, &alpha0, &m1, &l1, &alpha1);
    if (RV == 1) alpha1 = alpha0;
    if (hides || p.bias != nullptr) {
      AccumulateOutput<RV, true>(st, R, v + j0 * dv, dv, nb, alpha0, alpha1,
                                 tile.ot, &pf.k);
    } else {
      AccumulateOutput<RV, false>(st, R, v + j0 * dv, dv, nb, alpha0, alpha1,
                                  tile.ot, &pf.k);
    }
  }

  // Finish: out = ot / l, lse = m + log(l); rows that saw no key get zeros.
  hn::Store(m0, df, tile.m);
  hn::Store(l0, df, tile.sum);
  if (RV > 1) {
    hn::Store(m1, df, tile.m + N);
    hn::Store(l1, df, tile.sum + N);
  }
  for (int64_t r = 0; r < rows; ++r) {
    tile.inv_l[r] = tile.sum[r] > 0.0f ? 1.0f / tile.sum[r] : 0.0f;
  }
  // out[r][c] = ot[c][r] / l. Whole N x N blocks of (columns, rows) by
  // in-register transposes where there are some, the rest by gathers.
  int64_t c_done = 0;
#if QKV_HWY_TRANSPOSE
  {
    VF blk[16];
    for (; c_done + static_cast<int64_t>(N) <= dv; c_done += N) {
      for (size_t h = 0; h < static_cast<size_t>(RV); ++h) {
        if (static_cast<int64_t>(h * N) >= rows) break;
        for (size_t i = 0; i < N; ++i) {
          blk[i] = hn::Load(df, tile.ot + (c_done + i) * R + h * N);
        }
        TransposeSquare(blk);
        for (size_t i = 0; i < N; ++i) {
          const int64_t r = static_cast<int64_t>(h * N + i);
          if (r >= rows) break;
          hn::StoreU(hn::Mul(blk[i], hn::Set(df, tile.inv_l[r])), df,
                     p.out + tile.row[r] * dv + c_done);
        }
      }
    }
  }
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const float l = tile.sum[r];
    const bool seen = l > 0.0f;
    const float inv_l = tile.inv_l[r];
    float* out = p.out + tile.row[r] * dv;
    const auto col_idx =
        hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(R)));
    const VF v_inv_l = hn::Set(df, inv_l);
    int64_t c = c_done;
    if (!seen) {
      for (c = 0; c < dv; ++c) out[c] = 0.0f;
    }
    for (; c + static_cast<int64_t>(N) <= dv; c += N) {
      hn::StoreU(
          hn::Mul(hn::GatherIndex(df, tile.ot + c * R + r, col_idx), v_inv_l),
          df, out + c);
    }
    for (; c < dv; ++c) out[c] = tile.ot[c * R + r] * inv_l;
    if (p.lse != nullptr) {
      p.lse[tile.row[r]] = seen ? tile.m[r] + logf(l) : -INFINITY;
    }
    if (p.weights != nullptr) {
      float* w = p.weights + tile.row[r] * lk;
      if (seen) {
        NormalizeWeights(w, max_limit, tile.m[r], inv_l, tile.tail);
      } else {
        for (int64_t j = 0; j < max_limit; ++j) w[j] = 0.0f;
      }
      for (int64_t j = max_limit; j < lk; ++j) w[j] = 0.0f;
    }
  }
}

// ---------------------------------------------------------------- row path
// One query row against nb keys: st[j] = finish * sum_t f(q[t], k_j[t]),
// keys processed four at a time for independent FMA chains, d in lanes.
// Also projects for kAdditive (q a key or query, k the rows of W).
template <int kKind>
HWY_NOINLINE void RowScores(const float* HWY_RESTRICT q,
                            const float* HWY_RESTRICT k, int64_t d,
                            int64_t nb, float finish,
                            const float* HWY_RESTRICT w_v,
                            float* HWY_RESTRICT st,
                            BlockPrefetch* pf = nullptr) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t d_full = d - d % N;
  auto step = [](VF qv, VF kv, VF wv, VF acc) HWY_ATTR {
    if (kKind == kAdditive) {
      return hn::MulAdd(wv, TanhOf(hn::Add(qv, kv)), acc);
    }
    if (kKind == kGaussian) {
      const VF e = hn::Sub(qv, kv);
      return hn::MulAdd(e, e, acc);
    }
    return hn::MulAdd(qv, kv, acc);
  };
  auto tail = [&](const float* kr) {
    float s = 0.0f;
    for (int64_t t = d_full; t < d; ++t) {
      if (kKind == kAdditive) {
        s += w_v[t] * tanhf(q[t] + kr[t]);
      } else if (kKind == kGaussian) {
        const float e = q[t] - kr[t];
        s += e * e;
      } else {
        s += q[t] * kr[t];
      }
    }
    return s;
  };
  auto weight = [&](int64_t t) HWY_ATTR {
    return kKind == kAdditive ? hn::LoadU(df, w_v + t) : hn::Zero(df);
  };
  int64_t j = 0;
  if (d_full == 0) {  // vectors shorter than one SIMD vector: plain loops
    for (; j < nb; ++j) st[j] = tail(k + j * d) * finish;
    return;
  }
  for (; j + 4 <= nb; j += 4) {
    if (pf != nullptr) {
      pf->v.Step();
      pf->k.Step();
    }
    const float* k0 = k + j * d;
    const float* k1 = k0 + d;
    const float* k2 = k1 + d;
    const float* k3 = k2 + d;
    VF a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df),
       a3 = hn::Zero(df);
    for (int64_t t = 0; t < d_full; t += N) {
      const VF qv = hn::LoadU(df, q + t);
      const VF wv = weight(t);
      a0 = step(qv, hn::LoadU(df, k0 + t), wv, a0);
      a1 = step(qv, hn::LoadU(df, k1 + t), wv, a1);
      a2 = step(qv, hn::LoadU(df, k2 + t), wv, a2);
      a3 = step(qv, hn::LoadU(df, k3 + t), wv, a3);
    }
    st[j + 0] = (hn::GetLane(hn::SumOfLanes(df, a0)) + tail(k0)) * finish;
    st[j + 1] = (hn::GetLane(hn::SumOfLanes(df, a1)) + tail(k1)) * finish;
    st[j + 2] = (hn::GetLane(hn::SumOfLanes(df, a2)) + tail(k2)) * finish;
    st[j + 3] = (hn::GetLane(hn::SumOfLanes(df, a3)) + tail(k3)) * finish;
  }
  for (; j < nb; ++j) {
    const float* k0 = k + j * d;
    VF a0 = hn::Zero(df);
    for (int64_t t = 0; t < d_full; t += N) {
      a0 = step(hn::LoadU(df, q + t), hn::LoadU(df, k0 + t), weight(t), a0);
    }
    st[j] = (hn::GetLane(hn::SumOfLanes(df, a0)) + tail(k0)) * finish;
  }
}

// Online softmax of one row's block: st[0, nb) becomes probabilities
// relative to the new running max; returns the rescale factor of the old
// sum and output. st has room for nb rounded up to whole vectors.
float RowSoftmaxBlock(float* HWY_RESTRICT st, int64_t nb, float* m,
                      float* l) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t padded = (nb + N - 1) / N * N;
  for (int64_t j = nb; j < padded; ++j) st[j] = -INFINITY;
  VF vmax = hn::Set(df, -INFINITY);
  for (int64_t j = 0; j < padded; j += N) {
    vmax = hn::Max(vmax, hn::Load(df, st + j));
  }
  const float block_max = hn::GetLane(hn::MaxOfLanes(df, vmax));
  const float m_new = *m > block_max ? *m : block_max;
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;
  const VF vm = hn::Set(df, m_use);
  const float alpha = hn::GetLane(ExpNonPositive(hn::Set(df, *m - m_use)));
  VF vsum = hn::Zero(df);
  for (int64_t j = 0; j < padded; j += N) {
    const VF e = ExpNonPositive(hn::Sub(hn::Load(df, st + j), vm));
    hn::Store(e, df, st + j);
    vsum = hn::Add(vsum, e);
  }
  *m = m_new;
  *l = *l * alpha + hn::GetLane(hn::SumOfLanes(df, vsum));
  return alpha;
}

// o[c] = o[c] * alpha + sum_{j < nb} p[j] v_j[c] for U vectors of columns.
template <int U>
HWY_NOINLINE void RowOutputColumns(const float* HWY_RESTRICT pr,
                                   const float* HWY_RESTRICT v, int64_t dv,
                                   int64_t nb, float alpha,
                                   float* HWY_RESTRICT o) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF va = hn::Set(df, alpha);
#define QKV_DECL(u)                        \
  VF o##u = hn::Zero(df);                  \
  if (u < U) o##u = hn::Mul(hn::LoadU(df, o + u * N), va);
  QKV_UNROLL8(QKV_DECL)
#undef QKV_DECL
  for (int64_t j = 0; j < nb; ++j) {
    if (pr[j] == 0.0f) continue;  // a hidden key's value is never read
    const VF b = hn::Set(df, pr[j]);
    const float* HWY_RESTRICT vj = v + j * dv;
#define QKV_STEP(u) \
  if (u < U) o##u = hn::MulAdd(b, hn::LoadU(df, vj + u * N), o##u);
    QKV_UNROLL8(QKV_STEP)
#undef QKV_STEP
  }
#define QKV_STORE(u) \
  if (u < U) hn::StoreU(o##u, df, o + u * N);
  QKV_UNROLL8(QKV_STORE)
#undef QKV_STORE
}

void RowOutput(const float* HWY_RESTRICT pr, const float* HWY_RESTRICT v,
               int64_t dv, int64_t nb, float alpha, float* HWY_RESTRICT o) {
  const int64_t N = static_cast<int64_t>(Lanes());
  int64_t c = 0;
  for (; c + 8 * N <= dv; c += 8 * N) {
    RowOutputColumns<8>(pr, v + c, dv, nb, alpha, o + c);
  }
  for (; c + N <= dv; c += N) {
    RowOutputColumns<1>(pr, v + c, dv, nb, alpha, o + c);
  }
  for (; c < dv; ++c) {
    float acc = o[c] * alpha;
    for (int64_t j = 0; j < nb; ++j) {
      if (pr[j] != 0.0f) acc += pr[j] * v[j * dv + c];
    }
    o[c] = acc;
  }
}

// Row path for tiny problems, kv_len <= lanes (toy shapes, short caches):
// K and V are transposed once into the workspace and each row's scores,
// softmax and output are a handful of whole-vector operations with keys in
// lanes. Same results contract as RunRows. Tiny calls are dominated by fixed
// costs, so this path sets up only what it uses (no Tile, no divisions).
// D: the target's full vector, or a shorter one (at least kv_len lanes).
template <class D>
void RunRowsTiny(D df, const Problem& p, const Operands& op,
                 const TileTask& task, unsigned char* workspace) {
  using V = hn::Vec<D>;
  const hn::RebindToSigned<D> di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  TinyTile tile;
  LayoutTiny(p, Lanes(), workspace, &tile);
  const int64_t b = task.b, kvh = task.kvh;
  const int64_t d = op.dim, dv = p.value_dim, lk = p.kv_len;
  const float* v = p.v + (b * p.kv_heads + kvh) * lk * dv;
  const V zero = hn::Zero(df);
  // Transposes by gathers: lane j reads key j's row (indices clamped to the
  // last key, so nothing past K or V is read), and lanes of keys j >= lk are
  // 0: they are masked below, and a 0 (never garbage) keeps every lane's
  // arithmetic finite.
  const auto key = hn::Iota(di, 0);
  const auto last = hn::Set(di, static_cast<int32_t>(lk - 1));
  const auto real = hn::RebindMask(df, hn::Lt(key, hn::Set(di, static_cast<int32_t>(lk))));
  const auto clamped = hn::Min(key, last);
  const auto k_idx = hn::Mul(clamped, hn::Set(di, static_cast<int32_t>(d)));
  const auto v_idx = hn::Mul(clamped, hn::Set(di, static_cast<int32_t>(dv)));
  for (int64_t t = 0; t < d; ++t) {
    hn::Store(hn::IfThenElseZero(real, hn::GatherIndex(df, op.k + t, k_idx)),
              df, tile.kt + t * N);
  }
  for (int64_t c = 0; c < dv; ++c) {
    hn::Store(hn::IfThenElseZero(real, hn::GatherIndex(df, v + c, v_idx)), df,
              tile.vt + c * N);
  }
  const V neg_inf = hn::Set(df, -INFINITY);
  RowWalker at(p, kvh);
  for (int64_t r = 0; r < task.rows; ++r) {
    const int64_t row = at.Row(p, b);
    const int64_t limit = VisibleKeys(p, b, at.i);
    const float* bias_row = BiasRow(p, b, at.h, at.i);
    at.Next(p);
    const float* q = op.q + row * d;
    V s = zero;
    if (op.kind == kAdditive) {
      for (int64_t t = 0; t < d; ++t) {
        const V x = hn::Add(hn::Set(df, q[t]), hn::Load(df, tile.kt + t * N));
        s = hn::MulAdd(hn::Set(df, p.w_v[t]), TanhOf(x), s);
      }
    } else if (op.kind == kGaussian) {
      for (int64_t t = 0; t < d; ++t) {
        const V e = hn::Sub(hn::Set(df, q[t]), hn::Load(df, tile.kt + t * N));
        s = hn::MulAdd(e, e, s);
      }
      s = hn::Mul(s, hn::Set(df, op.finish));
    } else {
      for (int64_t t = 0; t < d; ++t) {
        s = hn::MulAdd(hn::Set(df, q[t] * op.q_scale),
                       hn::Load(df, tile.kt + t * N), s);
      }
      if (op.kind == kDotScaled) s = hn::Mul(s, hn::Set(df, op.finish));
    }
    if (bias_row != nullptr) {
      hn::Store(zero, df, tile.tail);
      for (int64_t j = 0; j < lk; ++j) tile.tail[j] = bias_row[j];
      const V bias = hn::Load(df, tile.tail);
      s = hn::IfThenElse(hn::Eq(bias, neg_inf), neg_inf, hn::Add(s, bias));
    }
    const auto visible = hn::RebindMask(
        df, hn::Lt(key, hn::Set(di, static_cast<int32_t>(limit))));
    s = hn::IfThenElse(visible, s, neg_inf);
    const float m = hn::GetLane(hn::MaxOfLanes(df, s));
    float* out = p.out + row * dv;
    float* w = p.weights != nullptr ? p.weights + row * lk : nullptr;
    const V e = ExpNonPositive(hn::Sub(s, hn::Set(df, m)));
    const float l = hn::GetLane(hn::SumOfLanes(df, e));
    // No visible key: the max is -inf, or on targets whose max of an all -inf
    // vector is -FLT_MAX (EMU128) every term is exp(-inf) = 0.
    if (m == -INFINITY || l == 0.0f) {
      for (int64_t c = 0; c < dv; ++c) out[c] = 0.0f;
      if (w != nullptr) {
        for (int64_t j = 0; j < lk; ++j) w[j] = 0.0f;
      }
      if (p.lse != nullptr) p.lse[row] = -INFINITY;
      continue;
    }
    const float inv_l = 1.0f / l;
    const auto read = hn::Gt(e, zero);  // hidden keys' values are not read
    for (int64_t c = 0; c < dv; ++c) {
      const V terms =
          hn::IfThenElseZero(read, hn::Mul(e, hn::Load(df, tile.vt + c * N)));
      out[c] = hn::GetLane(hn::SumOfLanes(df, terms)) * inv_l;
    }
    if (w != nullptr) {
      hn::Store(hn::Mul(e, hn::Set(df, inv_l)), df, tile.tail);
      for (int64_t j = 0; j < lk; ++j) w[j] = tile.tail[j];
    }
    if (p.lse != nullptr) p.lse[row] = m + logf(l);
  }
}

// All rows (at most kRowPathMaxRows) of one (batch, kv head). Keys are
// walked in blocks; each block of K and V is read from memory once and
// reused from L1 by the group's other rows.
void RunRows(const Problem& p, const Operands& op, const TileTask& task,
             const unsigned char* shared, const Tile& tile) {
  const int64_t b = task.b, kvh = task.kvh, rows = task.rows;
  const int64_t d = op.dim, dv = p.value_dim, lk = p.kv_len;
  const int64_t max_limit = SetUpRowPath(p, op, b, kvh, rows, tile);
  const int64_t stop = max_limit < task.key_end ? max_limit : task.key_end;
  const float* k = op.k;
  const float* v = p.v + (b * p.kv_heads + kvh) * lk * dv;
  float* st = tile.s_row;
  const bool prefetch = PrefetchesKv(p);
  for (int64_t j0 = task.key_begin; j0 < stop; j0 += kBlockKeys) {
    // The first row's scores prefetch this block's V and the next one's K.
    const int64_t nb_all = j0 + kBlockKeys < stop ? kBlockKeys : stop - j0;
    BlockPrefetch pf(prefetch, k, d, v, dv, j0, nb_all, stop, nb_all / 4,
                     nb_all / 4);
    for (int64_t r = 0; r < rows; ++r) {
      // Masks hide a suffix: the row simply stops at its limit.
      int64_t end = j0 + kBlockKeys < tile.limit[r] ? j0 + kBlockKeys
                                                    : tile.limit[r];
      end = end < task.key_end ? end : task.key_end;
      const int64_t nb = end - j0;
      if (nb <= 0) continue;
      const float* qr = tile.q_rows + r * d;
      if (op.kind == kAdditive) {
        RowScores<kAdditive>(qr, k + j0 * d, d, nb, 1.0f, p.w_v, st,
                             r == 0 ? &pf : nullptr);
      } else if (op.kind == kGaussian) {
        RowScores<kGaussian>(qr, k + j0 * d, d, nb, op.finish, p.w_v, st,
                             r == 0 ? &pf : nullptr);
      } else {
        // op.finish: 1 when the scale is folded into the queries.
        RowScores<kDot>(qr, k + j0 * d, d, nb, op.finish, p.w_v, st,
                        r == 0 ? &pf : nullptr);
      }
      if (tile.bias[r] != nullptr) AddBias(tile.bias[r], j0, nb, 1, st);
      if (p.weights != nullptr) {
        memcpy(p.weights + tile.row[r] * lk + j0, st, nb * sizeof(float));
      }
      const float alpha = RowSoftmaxBlock(st, nb, &tile.m[r], &tile.sum[r]);
      RowOutput(st, v + j0 * dv, dv, nb, alpha, tile.o_rows + r * dv);
    }
  }
  if (KeySplits(p) > 1 && !MergeSplits(p, task, shared, tile)) return;
  for (int64_t r = 0; r < rows; ++r) {
    const float l = tile.sum[r];
    const bool seen = l > 0.0f;
    const float inv_l = seen ? 1.0f / l : 0.0f;
    float* out = p.out + tile.row[r] * dv;
    for (int64_t c = 0; c < dv; ++c) {
      out[c] = seen ? tile.o_rows[r * dv + c] * inv_l : 0.0f;
    }
    if (p.lse != nullptr) {
      p.lse[tile.row[r]] = seen ? tile.m[r] + logf(l) : -INFINITY;
    }
    if (p.weights != nullptr) {
      float* w = p.weights + tile.row[r] * lk;
      const int64_t limit = tile.limit[r];
      if (seen) {
        NormalizeWeights(w, limit, tile.m[r], inv_l, tile.tail);
      } else {
        for (int64_t j = 0; j < limit; ++j) w[j] = 0.0f;
      }
      for (int64_t j = limit; j < lk; ++j) w[j] = 0.0f;
    }
  }
}

bool Supports(const Problem&) { return true; }

// Additive scores: project every key (W_k k) and query (W_q q) once per call.
void Prepare(const Problem& p, unsigned char* shared) {
  ResetSplitCounters(p, shared);
  if (p.score != QKV_SCORE_ADDITIVE) return;
  const int64_t d = p.head_dim, hidden = p.additive_hidden;
  float* keys = reinterpret_cast<float*>(shared);
  float* queries = reinterpret_cast<float*>(shared + ProjectedKeysBytes(p));
  const int64_t key_rows = p.batch * p.kv_heads * p.kv_len;
  for (int64_t j = 0; j < key_rows; ++j) {
    RowScores<kDot>(p.k + j * d, p.w_k, d, hidden, 1.0f, nullptr,
                    keys + j * hidden);
  }
  const int64_t query_rows = p.batch * p.q_heads * p.q_len;
  for (int64_t i = 0; i < query_rows; ++i) {
    RowScores<kDot>(p.q + i * d, p.w_q, d, hidden, 1.0f, nullptr,
                    queries + i * hidden);
  }
}

size_t NumTasks(const Problem& p) { return SplitTasks(p, TileRows()); }

size_t WorkspacePerWorker(const Problem& p) {
  return UsesTinyPath(p, Lanes()) ? LayoutTiny(p, Lanes(), nullptr, nullptr)
                                  : LayoutTile(p, Lanes(), nullptr, nullptr);
}

void RunTask(const Problem& p, size_t task, const unsigned char* shared,
             unsigned char* workspace) {
  const TileTask t = SplitTaskAt(p, task, TileRows());
  const Operands op = OperandsFor(p, shared, t.b, t.kvh);
  if (UsesTinyPath(p, Lanes())) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    // Few keys: shorter vectors (128-bit for up to 4, 256-bit for up to 8
    // on AVX-512). Their reductions and gathers are less work than full
    // width ones, and nothing else here is wide.
    if (p.kv_len <= 4) {
      RunRowsTiny(hn::CappedTag<float, 4>(), p, op, t, workspace);
      return;
    }
#if HWY_TARGET <= HWY_AVX3
    if (p.kv_len <= 8) {
      RunRowsTiny(hn::CappedTag<float, 8>(), p, op, t, workspace);
      return;
    }
#endif
#endif
    RunRowsTiny(DF(), p, op, t, workspace);
    return;
  }
  Tile tile;
  LayoutTile(p, Lanes(), workspace, &tile);
  if (t.row_path) {
    RunRows(p, op, t, shared, tile);
  } else if (t.rows <= static_cast<int64_t>(Lanes())) {
    RunTile<1>(p, op, t.b, t.kvh, t.r0, t.rows, tile);
  } else {
    RunTile<2>(p, op, t.b, t.kvh, t.r0, t.rows, tile);
  }
}

}  // namespace

// The engine of this target; "highway:<TARGET>".
const Engine* GetEngine() {
  static constexpr Engine kEngine = {
      "highway:" QKV_HWY_TARGET_NAME,
      &Supports,
      &NumTasks,
      &SharedWorkspace,
      &WorkspacePerWorker,
      &Prepare,
      &RunTask};
  return &kEngine;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace qkv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qkv {

size_t HighwayEngines(const Engine** out, size_t max) {
  using GetFn = const Engine* (*)();
  struct Candidate {
    int64_t target;
    GetFn get;
  };
  // Best first. HWY_CHOOSE_* is nullptr for targets this build did not
  // compile.
  static const Candidate kCandidates[] = {
      {HWY_AVX3_DL, HWY_CHOOSE_AVX3_DL(GetEngine)},
      {HWY_AVX3, HWY_CHOOSE_AVX3(GetEngine)},
      {HWY_AVX2, HWY_CHOOSE_AVX2(GetEngine)},
      {HWY_SSE4, HWY_CHOOSE_SSE4(GetEngine)},
      {HWY_SSSE3, HWY_CHOOSE_SSSE3(GetEngine)},
      {HWY_SVE2, HWY_CHOOSE_SVE2(GetEngine)},
      {HWY_SVE, HWY_CHOOSE_SVE(GetEngine)},
      {HWY_NEON, HWY_CHOOSE_NEON(GetEngine)},
      {HWY_WASM, HWY_CHOOSE_WASM(GetEngine)},
#if HWY_TARGETS & HWY_EMU128
      {HWY_EMU128, &N_EMU128::GetEngine},
#endif
#if HWY_TARGETS & HWY_SCALAR
      {HWY_SCALAR, &N_SCALAR::GetEngine},
#endif
  };
  // The static target is the baseline the compiler was told this CPU has,
  // so it runs wherever this code runs. It is added to what the library
  // detects because libhwy may not know it: Debian's armhf libhwy is built
  // without NEON and reports only the scalar targets, while this file is
  // compiled for NEON. Header-only builds (WASM) have no libhwy at all.
#if defined(HWY_COMPILE_ONLY_STATIC)
  const int64_t supported = HWY_STATIC_TARGET;
#else
  const int64_t supported =
      static_cast<int64_t>(hwy::SupportedTargets()) | HWY_STATIC_TARGET;
#endif
  size_t n = 0;
  for (const Candidate& c : kCandidates) {
    if (c.get != nullptr && (supported & c.target) != 0 && n < max) {
      out[n++] = c.get();
    }
  }
  return n;
}

}  // namespace qkv
#endif  // HWY_ONCE
