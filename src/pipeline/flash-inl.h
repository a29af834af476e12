// The FlashAttention pipeline of the SIMD engines, written once: Flash<O>
// for a vector-operations layer O (src/highway/ops_hwy-inl.h,
// src/xsimd/ops_xsimd-inl.h). Each engine compiles it once per SIMD target,
// inside that target's namespace (QKV_SIMD_NAMESPACE: Highway's
// HWY_NAMESPACE, or the xsimd architecture's), so nothing here is ever
// shared between objects built for different instruction sets.
//
// Stages, for a block of keys [j0, j0 + nb):
//   K/V source   the (batch, kv head)'s key and value rows (Operands; dense
//                f32 read in place, additive scores read projections).
//   scores       st[j][r] for the rows in lanes (tile path: R = RV * N
//                query rows of one kv head's GQA group, queries packed
//                transposed, keys broadcast) or keys in lanes (row path:
//                decoding, at most kRowPathMaxRows rows, and GQA-8 decoding
//                on AVX-512 and AVX2; tiny path: kv_len <= N). The score kind's
//                accumulation and finishing factor live here (ScoreTerm,
//                the factor applied as scores leave their registers).
//   epilogue     per block, only when needed: bias, then the rows' key
//                intervals [lo, hi) (src/semantics.h) as a mask. Blocks
//                outside every row's interval are skipped at both ends.
//   softmax      online: a running max m and sum l per row, one rescale of
//                the output per block.
//   output       o = o * alpha + p V, transposed in the tile path.
//   finisher     FinishRow: out = o / l, lse = m + log(l), weights
//                normalized from the raw scores, for every path.
//
// exp is ExpNonPositive (max error 1.03 ulp on [-87, 0] with FMA, 0 below
// -87): its argument here is always <= 0 or -inf.
//
// The includer has included engine.h, tiling.h and the ops layer, and
// defined QKV_SIMD_NAMESPACE. Per-target include guard (Highway's
// convention): foreach_target includes this once per target.
#if defined(QKV_PIPELINE_FLASH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_PIPELINE_FLASH_INL_H_
#undef QKV_PIPELINE_FLASH_INL_H_
#else
#define QKV_PIPELINE_FLASH_INL_H_
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "engine.h"
#include "pipeline/paths.h"
#include "semantics.h"
#include "tiling.h"

#ifndef QKV_SIMD_NAMESPACE
#error "define QKV_SIMD_NAMESPACE (the per-target namespace) first"
#endif

#ifdef HWY_BEFORE_NAMESPACE
HWY_BEFORE_NAMESPACE();
#endif
namespace qkv {
namespace QKV_SIMD_NAMESPACE {

// Accumulators are named variables, not arrays (SVE vectors are sizeless
// and cannot be array elements); lanes u >= U of an unroll are compiled
// away.
#undef QKV_UNROLL8
#define QKV_UNROLL8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

// The per-block steps are inlined into the tile loop whatever the
// compiler's estimate: they pass vectors (running max, sum, rescale) by
// pointer, which must stay in registers.
#undef QKV_FLASH_INLINE
#define QKV_FLASH_INLINE inline __attribute__((always_inline))
// GCC's register allocation of a loop as one region: by regions it spilled
// vectors of RowScores8's loop, which then reloaded them as memory operands
// (as it reloads a vector used twice, which O::InRegister stops).
#undef QKV_ONE_REGION
#if defined(__GNUC__) && !defined(__clang__)
#define QKV_ONE_REGION __attribute__((optimize("ira-region=one")))
#else
#define QKV_ONE_REGION
#endif

template <class O>
struct Flash {
  using Ops = O;
  using V = typename O::V;

  // exp(x) for the arguments softmax has here: x <= 0, or -inf. Results
  // below FLT_MIN (x < -87) are flushed to 0: those terms are under 1e-38 of
  // the row's largest weight, far below the accuracy bound, and flushing
  // keeps every intermediate normal (x86 takes a microcode assist on
  // subnormals). Method: x = n ln2 + r with n = round(x / ln2) in [-126, 0],
  // rounded by adding 1.5 * 2^23 (n lands in the low mantissa bits, which
  // also give the exponent of 2^n), |r| <= ln2/2 with ln2 in two parts (r
  // exact to ~1e-10), then exp(r) by a degree-6 polynomial fitted for least
  // maximum relative error on [-ln2/2, ln2/2] (2e-9). Max error 1.03 ulp on
  // [-87, 0] (the fit and that error: bench/exp_fit.py;
  // tests/softmax_ulp_test.cc holds every engine's softmax in ulps). 16
  // operations per vector, 11 of them on the FMA pipes.
  static QKV_FLASH_INLINE V ExpNonPositive(V x) {
    const V lowest = O::Set(-87.0f);
    V r, t;
    const V q = ExpReduced(O::Max(x, lowest), &r, &t);
    const V poly = O::MulAdd(q, r, O::Set(1.0f));
    return O::IfThenZeroElse(O::Lt(x, lowest),
                             O::Mul(poly, O::Pow2FromRounded(t)));
  }

  // The reduction and polynomial of ExpNonPositive for xc in [-87, 0]:
  // exp(xc) = 2^n (1 + r q(r)); returns q(r), sets *r and *t (n in the low
  // mantissa bits, for Pow2FromRounded).
  static QKV_FLASH_INLINE V ExpReduced(V xc, V* r_out, V* t_out) {
    const V round = O::Set(12582912.0f);  // 1.5 * 2^23
    const V t = O::MulAdd(xc, O::Set(1.44269504088896341f), round);
    const V nf = O::Sub(t, round);
    V r = O::MulAdd(nf, O::Set(-0.693145751953125f), xc);
    r = O::MulAdd(nf, O::Set(-1.428606765330187045e-6f), r);
    V q = O::Set(0.0013843622291460633f);
    q = O::MulAdd(q, r, O::Set(0.0083741797134280205f));
    q = O::MulAdd(q, r, O::Set(0.041668005287647247f));
    q = O::MulAdd(q, r, O::Set(0.16666430234909058f));
    q = O::MulAdd(q, r, O::Set(0.49999994039535522f));
    q = O::MulAdd(q, r, O::Set(1.0f));
    *r_out = r;
    *t_out = t;
    return q;
  }

  // One term of a score's sum: q . k (DOT), |q - k|^2 (GAUSSIAN), or
  // w_v tanh(q + k) (ADDITIVE, on projections).
  template <int kKind>
  static QKV_FLASH_INLINE V ScoreTerm(V q, V k, V w, V acc) {
    if (kKind == kAdditive) return O::MulAdd(w, O::Tanh(O::Add(q, k)), acc);
    if (kKind == kGaussian) {
      const V e = O::Sub(q, k);
      return O::MulAdd(e, e, acc);
    }
    return O::MulAdd(q, k, acc);
  }

  template <int kKind>
  static float ScoreTermScalar(float q, float k, float w) {
    if (kKind == kAdditive) return w * tanhf(q + k);
    if (kKind == kGaussian) return (q - k) * (q - k);
    return q * k;
  }

  // ---------------------------------------------------------- tile path

  // st[j][*] for keys j < U of the block starting at k, RV row vectors
  // (R = RV * N lanes), times the kind's finishing factor where it has one
  // (GAUSSIAN: -scale, kDotScaled: scale).
  template <int RV, int U, int kKind>
  __attribute__((noinline)) static void ScoreKeys(
      const float* __restrict qt, const float* __restrict k, int64_t d,
      int64_t ks, float finish_scale, const float* __restrict w_v,
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

  // Keys (scores) or value columns (output) per step of a register tile
  // of RV row vectors: RV * U accumulators. Two FMA ports with 4 cycles of
  // latency need at least 8 chains in flight, and exactly 8 leave no slack
  // for the loads between them. Targets with 32 vector registers
  // (O::kUnroll 8: AVX-512, NEON, SVE) take 8 keys (16 accumulators at RV
  // 2); the 16-register ones take 8 at RV 1 and 6 at RV 2 (12 accumulators,
  // 2 rows of q and a broadcast: 15 registers). The guarded output also
  // holds RV masks, so it takes 4 at RV 2 there.
  template <int RV>
  static constexpr int TileUnroll() {
    return O::kUnroll >= 8 || RV == 1 ? 8 : 6;
  }
  template <int RV, bool kGuard>
  static constexpr int OutputUnroll() {
    return kGuard && O::kUnroll < 8 && RV > 1 ? 4 : TileUnroll<RV>();
  }

  // The score tile over nb keys: steps of TileUnroll keys, the rest in
  // steps of 4, 2 and 1 (fewer chains, but no key alone unless it is the
  // last odd one).
  template <int RV, int kKind>
  static QKV_FLASH_INLINE void ScoresOf(const float* __restrict qt,
                                        size_t R, const float* __restrict k,
                                        int64_t d, int64_t ks, int64_t nb,
                                        float finish,
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

  // ------------------------------------------------ K/V block source
  // Rows [j0, j0 + nb) of a low-precision K or V dequantized into dst, n
  // floats each, dense: F16 and BF16 widened exactly, I8 times its row's
  // scale (one f32 rounding), as semantics.h's KvElement.
  template <int kType>
  static void DequantizeRowsOf(const KvSource& s, int64_t j0, int64_t nb,
                               int64_t n, float* __restrict dst) {
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

  static void DequantizeRows(const KvSource& s, int64_t j0, int64_t nb,
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
  static const float* KeyBlock(const Operands& op, int64_t j0, int64_t nb,
                               float* kblk) {
    if (!op.convert_k) return op.k + j0 * op.k_st;
    DequantizeRows(op.ksrc, j0, nb, op.dim, kblk);
    return kblk;
  }

  // Value rows [j0, j0 + nb) (op.v_st apart), in place or into vblk.
  static const float* ValueBlock(const Operands& op, int64_t dv, int64_t j0,
                                 int64_t nb, float* vblk) {
    if (!op.convert_v) return op.v + j0 * op.v_st;
    DequantizeRows(op.vsrc, j0, nb, dv, vblk);
    return vblk;
  }

  // The score kind, chosen once per block.
  template <int RV>
  static QKV_FLASH_INLINE void Scores(const Operands& op, const float* w_v,
                     const float* __restrict qt, size_t R,
                     const float* __restrict k, int64_t nb,
                     float* __restrict st, PrefetchStream* pf) {
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

  // softcap * tanh(s / softcap), vector-wise (semantics.h's Softcap), as
  // s times 1 / softcap: InvCap keeps that finite for a subnormal softcap
  // (1 / 1e-40 is inf in f32, and 0 * inf a NaN), where the tanh is +-1 or
  // 0 either way.
  static float InvCap(float cap) {
    const float inv = 1.0f / cap;
    return inv < 3.4e38f ? inv : 3.4e38f;
  }

  // tanh(x) = sign(x) (1 - e) / (1 + e) with e = exp(-2 |x|), by
  // ExpNonPositive's reduction and polynomial, which also give 1 - e
  // without cancellation: with e = 2^n p(r), p(r) = 1 + r q(r),
  //   e - 1 = 2^n r q(r) + (2^n - 1)
  // (2^n - 1 exact; n = 0 for |x| < 0.17, where it is r q(r) alone). So the
  // error is relative, a few ulp at every |x| (tests/blocks_test.cc), and a
  // capped score keeps f32 accuracy whatever the cap (a cap of 1e4 is the
  // identity on ordinary scores, which an absolute error times 1e4 would
  // not be). One exp and one division (the divider runs beside the FMA
  // pipes the loop fills; a reciprocal estimate with Newton steps on them
  // measured slower): a third of the library tanh's work. tanh(+-inf) =
  // +-1; NaN stays NaN.
  static QKV_FLASH_INLINE V SoftcapTanh(V x) {
    const V zero = O::Zero(), one = O::Set(1.0f);
    // -2|x| >= -87 (below, tanh is 1 in f32 anyway).
    V r, t;
    const V q = ExpReduced(
        O::Max(O::Mul(Abs(x), O::Set(-2.0f)), O::Set(-87.0f)), &r, &t);
    const V rq = O::Mul(r, q);
    const V scale = O::Pow2FromRounded(t);  // 2^n
    const V e = O::MulAdd(scale, rq, scale);  // 2^n p(r)
    const V em1 = O::MulAdd(scale, rq, O::Sub(scale, one));  // e - 1
    const V th = O::Div(O::Sub(zero, em1), O::Add(one, e));
    const V signed_th = O::IfThenElse(O::Lt(x, zero), O::Sub(zero, th), th);
    return O::IfThenElse(O::Eq(x, x), signed_th, x);
  }

  static QKV_FLASH_INLINE V Softcapped(V s, V cap, V inv_cap) {
    return O::Mul(cap, SoftcapTanh(O::Mul(s, inv_cap)));
  }

  // |x|.
  static QKV_FLASH_INLINE V Abs(V x) { return O::Max(x, O::Sub(O::Zero(), x)); }

  // What a block's epilogue has to do beyond the masks.
  struct EpilogueTerms {
    float softcap;  // 0: off
    bool bias;      // some row has a bias row
    bool alibi;     // ALiBi slopes are set
  };

  // The block's epilogue, in semantics.h's order and only where needed:
  // softcap, each row's bias, ALiBi, then the rows' key intervals (keys
  // outside [lo, hi) become -inf). `masks`: some row's interval cuts this
  // block (RowsSpan::Masks).
  template <int RV>
  static QKV_FLASH_INLINE void Epilogue(const Tile& tile, int64_t rows,
                                        size_t R, int64_t j0, int64_t nb,
                                        const EpilogueTerms& terms,
                                        bool masks, float* st) {
    const size_t N = O::Lanes();
    if (terms.softcap > 0.0f) {
      const V cap = O::Set(terms.softcap);
      const V inv_cap = O::Set(InvCap(terms.softcap));
      for (int64_t j = 0; j < nb; ++j) {
        float* s = st + j * R;
        O::Store(Softcapped(O::Load(s), cap, inv_cap), s);
        if (RV > 1) O::Store(Softcapped(O::Load(s + N), cap, inv_cap), s + N);
      }
    }
    if (terms.bias) {
      for (int64_t r = 0; r < rows; ++r) {
        if (tile.bias[r] != nullptr) AddBias(tile.bias[r], j0, nb, R, st + r);
      }
    }
    if (terms.alibi) {  // s -= slope * |pos - j|, pos - j0 per lane
      RelativePositions(tile, R, j0);
      const V pos0 = O::Load(tile.rel_pos), ns0 = O::Load(tile.neg_slope);
      const V pos1 = RV > 1 ? O::Load(tile.rel_pos + N) : pos0;
      const V ns1 = RV > 1 ? O::Load(tile.neg_slope + N) : ns0;
      for (int64_t j = 0; j < nb; ++j) {
        const V key = O::Set(static_cast<float>(j));
        float* s = st + j * R;
        O::Store(O::MulAdd(ns0, Abs(O::Sub(pos0, key)), O::Load(s)), s);
        if (RV > 1) {
          O::Store(O::MulAdd(ns1, Abs(O::Sub(pos1, key)), O::Load(s + N)),
                   s + N);
        }
      }
    }
    if (!masks) return;
    RelativeIntervals(tile, R, j0);
    const V neg_inf = O::Set(-INFINITY);
    const V lo0 = O::Load(tile.rel_lo), hi0 = O::Load(tile.rel_hi);
    const V lo1 = RV > 1 ? O::Load(tile.rel_lo + N) : lo0;
    const V hi1 = RV > 1 ? O::Load(tile.rel_hi + N) : hi0;
    for (int64_t j = 0; j < nb; ++j) {
      const V key = O::Set(static_cast<float>(j));
      float* s = st + j * R;
      V s0 = O::IfThenElse(O::Lt(key, hi0), O::Load(s), neg_inf);
      O::Store(O::IfThenElse(O::Lt(key, lo0), neg_inf, s0), s);
      if (RV > 1) {
        V s1 = O::IfThenElse(O::Lt(key, hi1), O::Load(s + N), neg_inf);
        O::Store(O::IfThenElse(O::Lt(key, lo1), neg_inf, s1), s + N);
      }
    }
  }

  // The same epilogue for one row's scores st[0, nb) of keys [j0, j0 + nb)
  // (row path: the keys are inside the row's interval, no mask).
  static void RowEpilogue(const Problem& p, const Tile& tile, int64_t r,
                          int64_t j0, int64_t nb, float* st) {
    const int64_t N = static_cast<int64_t>(O::Lanes());
    const int64_t padded = (nb + N - 1) / N * N;  // st has the room
    if (p.softcap > 0.0f) {
      const V cap = O::Set(p.softcap), inv_cap = O::Set(InvCap(p.softcap));
      for (int64_t j = 0; j < padded; j += N) {
        O::Store(Softcapped(O::Load(st + j), cap, inv_cap), st + j);
      }
    }
    if (tile.bias[r] != nullptr) AddBias(tile.bias[r], j0, nb, 1, st);
    if (p.alibi_slopes != nullptr) {
      const V ns = O::Set(tile.neg_slope[r]);
      const V pos = O::Set(static_cast<float>(tile.pos[r] - j0));
      const V lane = O::Load(kLaneIndex);
      for (int64_t j = 0; j < padded; j += N) {
        const V key = O::Add(lane, O::Set(static_cast<float>(j)));
        O::Store(O::MulAdd(ns, Abs(O::Sub(pos, key)), O::Load(st + j)),
                 st + j);
      }
    }
  }

  // ot[c][*] = ot[c][*] * alpha + sum_{j < nb} pt[j][*] * v[j][c] for the U
  // value columns starting at c = 0 of v and ot.
  // kGuard: lanes whose probability is 0 (a hidden key) leave the output
  // untouched, so a NaN or Inf in a value row that a query cannot see never
  // reaches it (0 * NaN is NaN). Used only in blocks that hide some keys.
  template <int RV, int U, bool kGuard>
  __attribute__((noinline)) static void OutputColumns(
      const float* __restrict pt, const float* __restrict v, int64_t vs,
      int64_t nb, V alpha0, V alpha1, float* __restrict ot) {
    const size_t N = O::Lanes(), R = RV * N;  // constant where N is
    const V zero = O::Zero();
#define QKV_DECL(u)                                                  \
  V o##u##0 = O::Zero(), o##u##1 = O::Zero();                        \
  if (u < U) {                                                       \
    o##u##0 = O::Mul(O::Load(ot + u * R), alpha0);                   \
    if (RV > 1) o##u##1 = O::Mul(O::Load(ot + u * R + N), alpha1);   \
  }
    QKV_UNROLL8(QKV_DECL)
#undef QKV_DECL
    for (int64_t j = 0; j < nb; ++j) {
      const float* __restrict vj = v + j * vs;
      const V p0 = O::Load(pt + j * R);
      const V p1 = RV > 1 ? O::Load(pt + j * R + N) : p0;
      const auto read0 = O::Gt(p0, zero);
      const auto read1 = O::Gt(p1, zero);
#define QKV_STEP(u)                                                          \
  if (u < U) {                                                               \
    const V b = O::Set(vj[u]);                                               \
    if (kGuard) {                                                            \
      o##u##0 = O::IfThenElse(read0, O::MulAdd(p0, b, o##u##0), o##u##0);    \
      if (RV > 1) {                                                          \
        o##u##1 = O::IfThenElse(read1, O::MulAdd(p1, b, o##u##1), o##u##1);  \
      }                                                                      \
    } else {                                                                 \
      o##u##0 = O::MulAdd(p0, b, o##u##0);                                   \
      if (RV > 1) o##u##1 = O::MulAdd(p1, b, o##u##1);                       \
    }                                                                        \
  }
      QKV_UNROLL8(QKV_STEP)
#undef QKV_STEP
    }
#define QKV_STORE(u)                                   \
  if (u < U) {                                         \
    O::Store(o##u##0, ot + u * R);                     \
    if (RV > 1) O::Store(o##u##1, ot + u * R + N);     \
  }
    QKV_UNROLL8(QKV_STORE)
#undef QKV_STORE
  }

  template <int RV, bool kGuard>
  static QKV_FLASH_INLINE void AccumulateOutput(const float* __restrict pt, size_t R,
                               const float* __restrict v, int64_t dv,
                               int64_t vs, int64_t nb, V alpha0, V alpha1,
                               float* __restrict ot, PrefetchStream* pf) {
    if (vs > dv && nb > kStridedValueKeys) {
      const V one = O::Set(1.0f);
      for (int64_t j = 0; j < nb; j += kStridedValueKeys) {
        const int64_t n = nb - j < kStridedValueKeys ? nb - j : kStridedValueKeys;
        AccumulateColumns<RV, kGuard>(pt + j * R, R, v + j * vs, dv, vs, n,
                                      j == 0 ? alpha0 : one,
                                      j == 0 ? alpha1 : one, ot, pf);
      }
      return;
    }
    AccumulateColumns<RV, kGuard>(pt, R, v, dv, vs, nb, alpha0, alpha1, ot,
                                  pf);
  }

  template <int RV, bool kGuard>
  static QKV_FLASH_INLINE void AccumulateColumns(const float* __restrict pt, size_t R,
                               const float* __restrict v, int64_t dv,
                               int64_t vs, int64_t nb, V alpha0, V alpha1,
                               float* __restrict ot, PrefetchStream* pf) {
    constexpr int U = OutputUnroll<RV, kGuard>();
    int64_t c = 0;
    for (; c + U <= dv; c += U) {
      pf->Step();
      OutputColumns<RV, U, kGuard>(pt, v + c, vs, nb, alpha0, alpha1,
                                   ot + c * R);
    }
    if (U > 4 && c + 4 <= dv) {
      OutputColumns<RV, 4, kGuard>(pt, v + c, vs, nb, alpha0, alpha1,
                                   ot + c * R);
      c += 4;
    }
    if (c + 2 <= dv) {
      OutputColumns<RV, 2, kGuard>(pt, v + c, vs, nb, alpha0, alpha1,
                                   ot + c * R);
      c += 2;
    }
    for (; c < dv; ++c) {
      OutputColumns<RV, 1, kGuard>(pt, v + c, vs, nb, alpha0, alpha1,
                                   ot + c * R);
    }
  }

  // Online softmax over one block of nb scores per lane, for the RV row
  // vectors of a tile: updates each running max m and sum l, turns st into
  // probabilities relative to the new max and sets alpha to the factor
  // exp(m_old - m_new) by which earlier sums and outputs scale. The row
  // vectors are done together and the max and sum run in two chains each
  // (one dependent chain per vector made this step latency-bound).
  template <int RV>
  static QKV_FLASH_INLINE void SoftmaxBlock(float* __restrict st, size_t R, int64_t nb,
                                  V* m0, V* l0, V* alpha0, V* m1, V* l1,
                                  V* alpha1) {
    const size_t N = O::Lanes();
    const V neg_inf = O::Set(-INFINITY);
    V max0a = neg_inf, max0b = neg_inf, max1a = neg_inf, max1b = neg_inf;
    int64_t j = 0;
    for (; j + 2 <= nb; j += 2) {
      max0a = O::Max(max0a, O::Load(st + j * R));
      max0b = O::Max(max0b, O::Load(st + (j + 1) * R));
      if (RV > 1) {
        max1a = O::Max(max1a, O::Load(st + j * R + N));
        max1b = O::Max(max1b, O::Load(st + (j + 1) * R + N));
      }
    }
    if (j < nb) {
      max0a = O::Max(max0a, O::Load(st + j * R));
      if (RV > 1) max1a = O::Max(max1a, O::Load(st + j * R + N));
    }
    // A lane that has seen no visible key keeps max -inf; exponentiate its
    // (-inf) scores against 0 so they give 0, not NaN.
    const V new0 = O::Max(*m0, O::Max(max0a, max0b));
    const V use0 = O::IfThenZeroElse(O::Eq(new0, neg_inf), new0);
    *alpha0 = ExpNonPositive(O::Sub(*m0, use0));
    *m0 = new0;
    V use1 = use0;
    if (RV > 1) {
      const V new1 = O::Max(*m1, O::Max(max1a, max1b));
      use1 = O::IfThenZeroElse(O::Eq(new1, neg_inf), new1);
      *alpha1 = ExpNonPositive(O::Sub(*m1, use1));
      *m1 = new1;
    }
    V sum0a = O::Zero(), sum0b = O::Zero();
    V sum1a = O::Zero(), sum1b = O::Zero();
    j = 0;
    for (; j + 2 <= nb; j += 2) {
      float* s = st + j * R;
      const V p0a = ExpNonPositive(O::Sub(O::Load(s), use0));
      const V p0b = ExpNonPositive(O::Sub(O::Load(s + R), use0));
      O::Store(p0a, s);
      O::Store(p0b, s + R);
      sum0a = O::Add(sum0a, p0a);
      sum0b = O::Add(sum0b, p0b);
      if (RV > 1) {
        const V p1a = ExpNonPositive(O::Sub(O::Load(s + N), use1));
        const V p1b = ExpNonPositive(O::Sub(O::Load(s + R + N), use1));
        O::Store(p1a, s + N);
        O::Store(p1b, s + R + N);
        sum1a = O::Add(sum1a, p1a);
        sum1b = O::Add(sum1b, p1b);
      }
    }
    if (j < nb) {
      float* s = st + j * R;
      const V p0 = ExpNonPositive(O::Sub(O::Load(s), use0));
      O::Store(p0, s);
      sum0a = O::Add(sum0a, p0);
      if (RV > 1) {
        const V p1 = ExpNonPositive(O::Sub(O::Load(s + N), use1));
        O::Store(p1, s + N);
        sum1a = O::Add(sum1a, p1);
      }
    }
    *l0 = O::MulAdd(*l0, *alpha0, O::Add(sum0a, sum0b));
    if (RV > 1) *l1 = O::MulAdd(*l1, *alpha1, O::Add(sum1a, sum1b));
  }

  // qt[t][r] = q_row(r)[t] * q_scale. A full tile: whole N x N blocks by
  // in-register transposes where the ops have them, the other columns by
  // strided gathers when the rows are equally spaced (dense q: the group's
  // heads are adjacent), else by scalar code; partial tiles (and targets
  // without gathers) by scalar code.
  template <int RV>
  static QKV_FLASH_INLINE void PackQueries(const Operands& op, int64_t rows, size_t R,
                          const Tile& tile) {
    const int64_t d = op.dim;
    if (!O::kGatherTiles || rows != static_cast<int64_t>(R)) {
      PackQueriesScalar(op, rows, R, tile);
      return;
    }
    if constexpr (O::kGatherTiles) {
      const size_t N = O::Lanes();
      const V scale = O::Set(op.q_scale);
      int64_t t = 0;
      if constexpr (O::kTransposeLanes != 0) {
        constexpr size_t kN = O::kTransposeLanes;
        V blk[kN];
        for (; t + static_cast<int64_t>(kN) <= d; t += kN) {
          for (size_t h = 0; h < static_cast<size_t>(RV); ++h) {
            for (size_t i = 0; i < kN; ++i) {
              blk[i] = O::LoadU(tile.q[h * kN + i] + t);
            }
            O::Transpose(blk);
            for (size_t i = 0; i < kN; ++i) {
              O::Store(O::Mul(blk[i], scale), tile.qt + (t + i) * R + h * kN);
            }
          }
        }
      }
      if (t == d) return;
      // Equally spaced rows (in floats, within int32): gathers.
      const int64_t step = tile.q[1] - tile.q[0];
      bool even = step > 0 && step * static_cast<int64_t>(N) < (int64_t{1} << 30);
      for (size_t r = 2; even && r < R; ++r) {
        even = tile.q[r] - tile.q[r - 1] == step;
      }
      if (!even) {
        for (size_t r = 0; r < R; ++r) {
          for (int64_t u = t; u < d; ++u) {
            tile.qt[u * R + r] = tile.q[r][u] * op.q_scale;
          }
        }
        return;
      }
      const int32_t stride = static_cast<int32_t>(step);
      for (; t < d; ++t) {
        O::Store(O::Mul(O::GatherStrided(tile.q[0] + t, stride), scale),
                 tile.qt + t * R);
        if (RV > 1) {
          O::Store(O::Mul(O::GatherStrided(tile.q[N] + t, stride), scale),
                   tile.qt + t * R + N);
        }
      }
    }
  }

  // ------------------------------------------------------- row finisher

  // w[j] = exp(w[j] - m) * inv_l for j < n, in place (raw scores to
  // weights).
  static void NormalizeWeights(float* __restrict w, int64_t n, float m,
                               float inv_l, float* __restrict tail) {
    const int64_t N = static_cast<int64_t>(O::Lanes());
    const V vm = O::Set(m), vs = O::Set(inv_l);
    int64_t j = 0;
    for (; j + N <= n; j += N) {
      O::StoreU(O::Mul(ExpNonPositive(O::Sub(O::LoadU(w + j), vm)), vs),
                w + j);
    }
    if (j < n) {  // never touch memory past the row: go through a scratch
      const size_t rest = static_cast<size_t>(n - j);
      for (int64_t u = 0; u < N; ++u) tail[u] = -INFINITY;
      memcpy(tail, w + j, rest * sizeof(float));
      O::Store(O::Mul(ExpNonPositive(O::Sub(O::Load(tail), vm)), vs), tail);
      memcpy(w + j, tail, rest * sizeof(float));
    }
  }

  // What a path leaves for the finisher of one row.
  struct RowState {
    int64_t row;         // flat row index into weights and lse
    float* out;          // the row's output
    float m, l;          // running max and sum (l = 0: no visible key)
    float sink;          // the head's sink, or -inf
    const float* o;      // unnormalized output: column c at o[c * stride],
    size_t o_stride;     //   columns [c_begin, dv) still to write; NULL:
    int64_t c_begin;     //   the path wrote out itself if the row saw a key
    int64_t w_lo, w_hi;  // weights[w_lo, w_hi) hold raw scores
  };

  // Row r's indices, running max and sum, and sink, from a tile.
  static RowState RowStateOf(const Tile& tile, int64_t r) {
    RowState s;
    s.row = tile.row[r];
    s.out = tile.out[r];
    s.m = tile.m[r];
    s.l = tile.sum[r];
    s.sink = tile.sink[r];
    return s;
  }

  // Writes the row's out, lse and weights (the latter two when asked), by
  // semantics.h's FinishRow: a row that saw no key gets zeros, and -inf or
  // its sink.
  static void FinishRow(const Problem& p, const RowState& s, float* tail) {
    const RowFinish f = qkv::FinishRow(s.m, s.l, s.sink);
    const int64_t dv = p.value_dim, lk = p.kv_len;
    float* out = s.out;
    if (!(s.l > 0.0f)) {
      for (int64_t c = 0; c < dv; ++c) out[c] = 0.0f;
    } else if (s.o != nullptr) {
      const int64_t N = static_cast<int64_t>(O::Lanes());
      const V scale = O::Set(f.scale);
      int64_t c = s.c_begin;
      if (s.o_stride == 1) {
        for (; c + N <= dv; c += N) {
          O::StoreU(O::Mul(O::LoadU(s.o + c), scale), out + c);
        }
      } else if constexpr (O::kGatherTiles) {
        const int32_t stride = static_cast<int32_t>(s.o_stride);
        for (; c + N <= dv; c += N) {
          O::StoreU(O::Mul(O::GatherStrided(s.o + c * s.o_stride, stride),
                           scale),
                    out + c);
        }
      }
      for (; c < dv; ++c) out[c] = s.o[c * s.o_stride] * f.scale;
    }
    if (p.lse != nullptr) p.lse[s.row] = RowLse(f);
    if (p.weights != nullptr) {
      float* w = p.weights + s.row * lk;
      for (int64_t j = 0; j < s.w_lo; ++j) w[j] = 0.0f;
      if (s.l > 0.0f) {
        NormalizeWeights(w + s.w_lo, s.w_hi - s.w_lo, f.m, f.inv_l, tail);
      } else {
        for (int64_t j = s.w_lo; j < s.w_hi; ++j) w[j] = 0.0f;
      }
      for (int64_t j = s.w_hi; j < lk; ++j) w[j] = 0.0f;
    }
  }

  // The tile's rows: whole N x N blocks of (columns, rows) of the
  // transposed output by in-register transposes where the ops have them,
  // then the finisher for the rest of each row.
  template <int RV>
  static void FinishTile(const Problem& p, const Tile& tile, int64_t rows,
                         size_t R, const RowsSpan& span) {
    const int64_t dv = p.value_dim;
    int64_t c_done = 0;
    if constexpr (O::kTransposeLanes != 0) {
      constexpr size_t kN = O::kTransposeLanes;
      for (int64_t r = 0; r < rows; ++r) {
        tile.inv_l[r] = qkv::FinishRow(tile.m[r], tile.sum[r], tile.sink[r])
                            .scale;
      }
      V blk[kN];
      for (; c_done + static_cast<int64_t>(kN) <= dv; c_done += kN) {
        for (size_t h = 0; h < static_cast<size_t>(RV); ++h) {
          if (static_cast<int64_t>(h * kN) >= rows) break;
          for (size_t i = 0; i < kN; ++i) {
            blk[i] = O::Load(tile.ot + (c_done + i) * R + h * kN);
          }
          O::Transpose(blk);
          for (size_t i = 0; i < kN; ++i) {
            const int64_t r = static_cast<int64_t>(h * kN + i);
            if (r >= rows) break;
            O::StoreU(O::Mul(blk[i], O::Set(tile.inv_l[r])),
                      tile.out[r] + c_done);
          }
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      RowState s = RowStateOf(tile, r);
      s.o = tile.ot + r;
      s.o_stride = R;
      s.c_begin = c_done;
      s.w_lo = span.begin;
      s.w_hi = span.end;
      FinishRow(p, s, tile.tail);
    }
  }

  // The key block of a tile that starts at j0 (up to kBlockKeys keys, not
  // past span.end): scores, epilogue, online softmax (running max and sum
  // in *m0, *l0 and, for RV 2, *m1, *l1), the output update, and with
  // `prefetch` the prefetches that go with the block. Low-precision rows
  // are dequantized into the tile's kblk and vblk, or given already
  // dequantized (kb, vb: rows from j0 on, as many as the block has or more).
  template <int RV>
  static QKV_FLASH_INLINE void TileBlock(const Problem& p, const Operands& op,
                                         const Tile& tile, int64_t rows,
                                         size_t R, const RowsSpan& span,
                                         const EpilogueTerms& terms,
                                         int64_t j0, bool prefetch, V* m0,
                                         V* l0, V* m1, V* l1,
                                         const float* kb = nullptr,
                                         const float* vb = nullptr) {
    const int64_t dv = p.value_dim, lk = p.kv_len;
    const int64_t nb = BlockKeys(j0, span.end);
    BlockPrefetch pf(prefetch, op, dv, j0, nb, span.end,
                     nb / TileUnroll<RV>(), dv / OutputUnroll<RV, false>(),
                     PrefetchTo::kL2);
    float* st = tile.st;
    Scores<RV>(op, p.w_v, tile.qt, R,
               kb != nullptr ? kb : KeyBlock(op, j0, nb, tile.kblk), nb, st,
               &pf.v);
    const bool masks = span.Masks(j0, nb);
    Epilogue<RV>(tile, rows, R, j0, nb, terms, masks, st);
    if (p.weights != nullptr) {  // raw masked scores; normalized at the end
      for (int64_t r = 0; r < rows; ++r) {
        float* w = p.weights + tile.row[r] * lk + j0;
        for (int64_t j = 0; j < nb; ++j) w[j] = st[j * R + r];
      }
    }
    V alpha0, alpha1 = O::Zero();
    SoftmaxBlock<RV>(st, R, nb, m0, l0, &alpha0, m1, l1, &alpha1);
    if (RV == 1) alpha1 = alpha0;
    const float* v = vb != nullptr ? vb : ValueBlock(op, dv, j0, nb, tile.vblk);
    const int64_t vs = op.v_st;
    // Keys that every row of the tile sees, [a, b) of the block, need no
    // guard (a bias can hide any key: all guarded). In a causal diagonal
    // block that leaves the guard to the keys past the first row's end. The
    // block's output is the same sequence of operations in one call or in
    // three (the later ones rescale by 1, exactly), so the bits are too.
    int64_t a = 0, b = nb;
    if (terms.bias) {
      b = 0;
    } else if (masks) {
      a = span.full_begin - j0;
      b = span.full_end - j0;
      a = a < 0 ? 0 : (a > nb ? nb : a);
      b = b < a ? a : (b > nb ? nb : b);
    }
    const V one = O::Set(1.0f);
    if (a > 0) {
      AccumulateOutput<RV, true>(st, R, v, dv, vs, a, alpha0, alpha1, tile.ot,
                                 &pf.k);
    }
    if (b > a) {
      AccumulateOutput<RV, false>(st + a * R, R, v + a * vs, dv, vs, b - a,
                                  a > 0 ? one : alpha0, a > 0 ? one : alpha1,
                                  tile.ot, &pf.k);
    }
    if (nb > b) {
      AccumulateOutput<RV, true>(st + b * R, R, v + b * vs, dv, vs, nb - b,
                                 b > 0 ? one : alpha0, b > 0 ? one : alpha1,
                                 tile.ot, &pf.k);
    }
  }

  static EpilogueTerms TermsOf(const Problem& p) {
    EpilogueTerms terms;
    terms.softcap = p.softcap;
    terms.bias = p.bias != nullptr;
    terms.alibi = p.alibi_slopes != nullptr;
    return terms;
  }

  template <int RV>
  static void RunTile(const Problem& p, const Operands& op,
                      const TileTask& task, const unsigned char* shared,
                      const Tile& tile) {
    const size_t N = O::Lanes();
    const size_t R = RV * N;
    const int64_t rows = task.rows;
    const RowsSpan span =
        SetUpTileRows(p, op, task.b, task.kvh, task.r0, rows, R, tile);
    PackQueries<RV>(op, rows, R, tile);
    // A flash-decoding split walks its own keys of the rows' span.
    RowsSpan keys = span;
    keys.begin = span.begin > task.key_begin ? span.begin : task.key_begin;
    keys.end = span.end < task.key_end ? span.end : task.key_end;

    const V neg_inf = O::Set(-INFINITY);
    V m0 = neg_inf, m1 = neg_inf;
    V l0 = O::Zero(), l1 = O::Zero();
    const bool prefetch = PrefetchesKv(p);
    const EpilogueTerms terms = TermsOf(p);
    for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kBlockKeys) {
      TileBlock<RV>(p, op, tile, rows, R, keys, terms, j0, prefetch, &m0, &l0,
                    &m1, &l1);
    }
    StoreRunning<RV>(tile, m0, l0, m1, l1);
    if (KeySplits(p) > 1 &&
        !MergeSplits(p, task, shared, tile, tile.ot, 1,
                     static_cast<int64_t>(R))) {
      return;
    }
    FinishTile<RV>(p, tile, rows, R, span);
  }

  // A tile's running max and sum into tile.m and tile.sum.
  template <int RV>
  static QKV_FLASH_INLINE void StoreRunning(const Tile& tile, V m0, V l0,
                                            V m1, V l1) {
    const size_t N = O::Lanes();
    O::Store(m0, tile.m);
    O::Store(l0, tile.sum);
    if (RV > 1) {
      O::Store(m1, tile.m + N);
      O::Store(l1, tile.sum + N);
    }
  }

  // A tile of a group: one key block, the running max and sum kept in
  // tile.m and tile.sum between blocks; kb, vb as TileBlock's.
  template <int RV>
  static void GroupTileBlock(const Problem& p, const Operands& op,
                             const Tile& tile, int64_t rows, size_t R,
                             const RowsSpan& span, const EpilogueTerms& terms,
                             int64_t j0, bool prefetch, const float* kb,
                             const float* vb) {
    const size_t N = O::Lanes();
    V m0 = O::Load(tile.m), l0 = O::Load(tile.sum);
    V m1 = m0, l1 = l0;
    if (RV > 1) {
      m1 = O::Load(tile.m + N);
      l1 = O::Load(tile.sum + N);
    }
    TileBlock<RV>(p, op, tile, rows, R, span, terms, j0, prefetch, &m0, &l0,
                  &m1, &l1, kb, vb);
    StoreRunning<RV>(tile, m0, l0, m1, l1);
  }

  // Up to kGroupTiles tiles of one kv head (GroupsTiles: strided or
  // low-precision K/V), key block by key block: the k-th block of every
  // tile, then the next. Each tile runs exactly the blocks, in the order,
  // that RunTile would (its own span, from its own first key), so the
  // results are RunTile's bits; only the interleaving differs, and with it
  // how often a block of strided K/V rows comes from beyond L2 and how
  // often a low-precision block is dequantized: once per group (the tiles
  // whose block starts at the same key) instead of once per tile.
  static void RunTileGroup(const Problem& p, const Operands& op,
                           const TileTask& task, unsigned char* workspace) {
    const size_t N = O::Lanes(), R = 2 * N;
    const size_t tile_bytes = LayoutTile(p, N, nullptr, nullptr);
    Tile tiles[kGroupTiles];
    RowsSpan spans[kGroupTiles];
    int64_t rows[kGroupTiles];
    int64_t count = 0, blocks = 0;
    for (int64_t r0 = 0; r0 < task.rows && count < kGroupTiles;
         r0 += static_cast<int64_t>(R), ++count) {
      Tile& tile = tiles[count];
      LayoutTile(p, N, workspace + static_cast<size_t>(count) * tile_bytes,
                 &tile);
      const int64_t left = task.rows - r0;
      rows[count] = left < static_cast<int64_t>(R) ? left
                                                   : static_cast<int64_t>(R);
      spans[count] = SetUpTileRows(p, op, task.b, task.kvh, task.r0 + r0,
                                   rows[count], R, tile);
      if (rows[count] <= static_cast<int64_t>(N)) {
        PackQueries<1>(op, rows[count], N, tile);
      } else {
        PackQueries<2>(op, rows[count], R, tile);
      }
      for (size_t i = 0; i < R; ++i) {
        tile.m[i] = -INFINITY;
        tile.sum[i] = 0.0f;
      }
      const int64_t n =
          (spans[count].end - spans[count].begin + kBlockKeys - 1) /
          kBlockKeys;
      blocks = n > blocks ? n : blocks;
    }
    const bool prefetch = PrefetchesKv(p);
    const EpilogueTerms terms = TermsOf(p);
    const bool convert = op.convert_k || op.convert_v;
    for (int64_t k = 0; k < blocks; ++k) {
      bool prefetched = false;  // the first tile still running prefetches
      // The dequantized rows [at, at + have) of the round, in kb and vb.
      int64_t at = -1, have = 0;
      const float *kb = nullptr, *vb = nullptr;
      for (int64_t g = 0; g < count; ++g) {
        const int64_t j0 = spans[g].begin + k * kBlockKeys;
        if (j0 >= spans[g].end) continue;
        if (convert && (j0 != at || BlockKeys(j0, spans[g].end) > have)) {
          // Enough rows for every tile of the round that starts at j0.
          at = j0;
          have = 0;
          for (int64_t h = g; h < count; ++h) {
            if (spans[h].begin + k * kBlockKeys != j0) continue;
            const int64_t nb = BlockKeys(j0, spans[h].end);
            have = nb > have ? nb : have;
          }
          kb = KeyBlock(op, j0, have, tiles[g].kblk);
          vb = ValueBlock(op, p.value_dim, j0, have, tiles[g].vblk);
        }
        if (rows[g] <= static_cast<int64_t>(N)) {
          GroupTileBlock<1>(p, op, tiles[g], rows[g], N, spans[g], terms, j0,
                            prefetch && !prefetched, kb, vb);
        } else {
          GroupTileBlock<2>(p, op, tiles[g], rows[g], R, spans[g], terms, j0,
                            prefetch && !prefetched, kb, vb);
        }
        prefetched = true;
      }
    }
    for (int64_t g = 0; g < count; ++g) {
      if (rows[g] <= static_cast<int64_t>(N)) {
        FinishTile<1>(p, tiles[g], rows[g], N, spans[g]);
      } else {
        FinishTile<2>(p, tiles[g], rows[g], R, spans[g]);
      }
    }
  }

  // ---------------------------------------------------------- row path

  // Row readers: the keys and values of the row path as rows of T, vector
  // loads widened to f32 and scalar decoding for the tails. F32Rows for the
  // f32 rows in place or dequantized by the block source; a single
  // decoding row (the memory-bound case) reads F16, BF16 and I8 rows
  // converting in registers instead of dequantizing each block into the
  // workspace and reading it back (the fused path). I8 rows are read
  // unscaled; the row's scale multiplies its finished score (keys) or its
  // probability (values).
  struct F32Rows {
    using T = float;
    static QKV_FLASH_INLINE V Load(const T* p) { return O::LoadU(p); }
    static float At(const T* p, int64_t c) { return p[c]; }
  };
  struct F16Rows {
    using T = uint16_t;
    static QKV_FLASH_INLINE V Load(const T* p) { return O::LoadF16(p); }
    static float At(const T* p, int64_t c) { return F16ToF32(p[c]); }
  };
  struct BF16Rows {
    using T = uint16_t;
    static QKV_FLASH_INLINE V Load(const T* p) { return O::LoadBF16(p); }
    static float At(const T* p, int64_t c) { return BF16ToF32(p[c]); }
  };
  struct I8Rows {
    using T = int8_t;
    static QKV_FLASH_INLINE V Load(const T* p) { return O::LoadI8(p); }
    static float At(const T* p, int64_t c) { return static_cast<float>(p[c]); }
  };

  // One query row against nb keys: st[j] = finish * sum_t f(q[t], k_j[t]),
  // keys four at a time for independent FMA chains, d in lanes. Also
  // projects for kAdditive (q a key or query, k the rows of W). Keys are
  // rows of E (F32Rows but on the fused path).
  template <int kKind, class E = F32Rows>
  static float RowTail(const float* q, const typename E::T* kr,
                       const float* w_v, int64_t t0, int64_t d) {
    float s = 0.0f;
    for (int64_t t = t0; t < d; ++t) {
      const float w = kKind == kAdditive ? w_v[t] : 0.0f;
      s += ScoreTermScalar<kKind>(q[t], E::At(kr, t), w);
    }
    return s;
  }

  // A row score: the vector part's lanes, the scalar tail, the factor.
  template <int kKind, class E>
  static inline float Finished(V acc, const float* q, const typename E::T* kr,
                               const float* w_v, int64_t d_full, int64_t d,
                               float finish) {
    return (O::ReduceSum(acc) + RowTail<kKind, E>(q, kr, w_v, d_full, d)) *
           finish;
  }

  // Keys per score step of R rows on the row path (R x U accumulators):
  // 4, or 2 for 3 and 4 rows on 16-register targets. (One row, RowScores,
  // takes 4 keys: 8 measured 1.23-1.30x slower on S1 decoding from DRAM,
  // the prefetch steps then leaving two at a time.)
  template <int R>
  static constexpr int RowUnroll() {
    return O::kUnroll >= 8 || R <= 2 ? 4 : 2;
  }

#undef QKV_ROWS4
#define QKV_ROWS4(X, u) X(0, u) X(1, u) X(2, u) X(3, u)
#undef QKV_ROWS4_KEYS8
#define QKV_ROWS4_KEYS8(X)                                           \
  QKV_ROWS4(X, 0) QKV_ROWS4(X, 1) QKV_ROWS4(X, 2) QKV_ROWS4(X, 3) \
  QKV_ROWS4(X, 4) QKV_ROWS4(X, 5) QKV_ROWS4(X, 6) QKV_ROWS4(X, 7)

  // Scores of R rows (queries q + r * d) for U keys (k + u * ks) into
  // st[r * s_stride + u], each key's vectors loaded once for all rows. Per
  // (row, key) one chain of ScoreTerm over the vectors of d, the lanes'
  // sum, the scalar tail, the factor: the same operations whatever R and U.
  template <int R, int U, int kKind, class E>
  static QKV_FLASH_INLINE void RowKeysStep(const float* __restrict q,
                                       const typename E::T* __restrict k,
                                       int64_t d, int64_t d_full, int64_t ks,
                                       float finish, const float* w_v,
                                       float* __restrict st,
                                       int64_t s_stride) {
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
    // bits): a row's 4 keys, or one key's 4 rows (GQA-4 decoding from
    // cache on Zen 4, 0.92-0.94x the time on AVX-512 and xsimd:avx2).
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
  // GQA-4 decoding from DRAM on Zen 4, 0.96-0.99x the time on AVX-512 and
  // AVX2; from cache, or on 4-lane targets, 0.99-1.09x, so not there.
  template <int R, int kKind, class E>
  __attribute__((noinline)) static void RowScoresRows(
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
  // lane sums come out of one O::SumLanes (lane i of the result:
  // accumulator i's sum, as ((l0 + l1) + (l2 + l3)) + ..., the order a
  // transpose and a tree of adds give, in 30 (14) shuffles instead of 64
  // (24): GQA-8 decoding from L3 on Zen 4, 0.94-0.96x the time) instead of
  // a reduction each. A last odd key takes the rows in two halves of 4
  // (RowKeysStep). Each query vector is loaded once for both keys (10 loads per 16 multiply-adds;
  // GCC's code loaded it for each key, 18, and spilled the key vectors
  // when told not to: O::InRegister and QKV_ONE_REGION; with AnyZero,
  // GQA-8 decoding from L3 on Zen 4 0.81-0.89x the time: bench/README.md).
  // st[r * s_stride + j] = finish * (q_r . k_j). pf's V stream steps once
  // every 4 keys (its K stream goes with the output, which takes longer
  // than the scores at 8 rows: JointOutput).
  __attribute__((noinline)) QKV_ONE_REGION static void RowScores8(
      const float* __restrict q, const float* __restrict k, int64_t d,
      int64_t ks, int64_t nb, float finish, float* __restrict st,
      int64_t s_stride, BlockPrefetch* pf) {
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
  // code generation elsewhere, highway:SSE4 f16 decoding 1.42x.)
  template <int kKind, class E>
  static QKV_FLASH_INLINE V KeyScoreTerms(const float* __restrict q,
                                          const typename E::T* __restrict k,
                                          const float* __restrict w_v,
                                          int64_t d_full) {
    const int64_t N = static_cast<int64_t>(O::Lanes());
    V a = O::Zero();
    for (int64_t t = 0; t < d_full; t += N) {
      const V wv = kKind == kAdditive ? O::LoadU(w_v + t) : O::Zero();
      a = ScoreTerm<kKind>(O::LoadU(q + t), E::Load(k + t), wv, a);
    }
    return a;
  }

  // Where RowScores streams its keys from memory (pf given: the first row
  // of a block on the row path) it reads a step's 4 keys one after the
  // other (each key's terms before the next's: per accumulator the same
  // operations as interleaved, the same bits), not the 4 rows side by side
  // vector by vector: the hardware prefetchers follow one stream read in
  // order, not 4 rows read together (S1 decoding from DRAM on Zen 4: f32
  // 0.93-0.98x the time on every x86 target; bf16 and f16 0.95-0.97x on
  // AVX-512, 0.98-1.06x on narrower targets, which keep the old order, as
  // int8 does, bound by its conversions: 1.03-1.19x). From cache (the
  // other rows) the interleaved order loads each query vector once for 4
  // keys (GQA-8 from DRAM on AVX2, rows one at a time: 1.10x the time all
  // rows key by key). x86 only: on AArch64 the key-by-key loops took 1.15-
  // 1.34x the instructions per (query, key) of S1 decoding
  // (bench/arm_icount.sh), and no ARM machine here measured a gain.
  template <class E>
  static constexpr bool KeyMajorScores() {
#if defined(__x86_64__) || defined(__i386__)
    return std::is_same<E, F32Rows>::value ||
           (O::kTransposeLanes == 16 && !std::is_same<E, I8Rows>::value);
#else
    return false;
#endif
  }

  template <int kKind, class E = F32Rows>
  __attribute__((noinline)) static void RowScores(
      const float* __restrict q, const typename E::T* __restrict k, int64_t d,
      int64_t ks, int64_t nb, float finish, const float* __restrict w_v,
      float* __restrict st, BlockPrefetch* pf = nullptr) {
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
      // reductions in a third of the shuffles; S1 decoding from L2 on Zen
      // 4, 0.92-0.95x the time on AVX-512; from DRAM unchanged).
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

  // Online softmax of one row's block: st[0, nb) becomes probabilities
  // relative to the new running max; returns the rescale factor of the old
  // sum and output. st has room for nb rounded up to whole vectors.
  static float RowSoftmaxBlock(float* __restrict st, int64_t nb, float* m,
                               float* l) {
    const int64_t N = static_cast<int64_t>(O::Lanes());
    const int64_t padded = (nb + N - 1) / N * N;
    for (int64_t j = nb; j < padded; ++j) st[j] = -INFINITY;
    V vmax = O::Set(-INFINITY);
    for (int64_t j = 0; j < padded; j += N) {
      vmax = O::Max(vmax, O::Load(st + j));
    }
    const float block_max = O::ReduceMax(vmax);
    const float m_new = *m > block_max ? *m : block_max;
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    const V vm = O::Set(m_use);
    const float alpha = O::First(ExpNonPositive(O::Set(*m - m_use)));
    V vsum = O::Zero();
    for (int64_t j = 0; j < padded; j += N) {
      const V e = ExpNonPositive(O::Sub(O::Load(st + j), vm));
      O::Store(e, st + j);
      vsum = O::Add(vsum, e);
    }
    *m = m_new;
    *l = *l * alpha + O::ReduceSum(vsum);
    return alpha;
  }

  // Whether some p[r * s_stride + j] (r < rows, j < nb) is 0, by vector
  // compares (a scalar scan took 7% of GQA-8 decoding).
  static bool AnyZero(const float* __restrict p, int64_t s_stride,
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

  // Value vectors per output step of R rows (R x U accumulators, R
  // broadcasts and a value vector in registers).
  template <int R>
  static constexpr int RowOutputUnroll() {
    return O::kUnroll >= 8 ? (R <= 2 ? 8 : 4) : (R <= 2 ? 4 : 2);
  }

  // o_r[c] = o_r[c] * alpha[r] + sum_j pr_r[j] v_j[c] for R rows (pr_r at
  // pr + r * s_stride, o_r at o + r * o_stride) and U vectors of columns,
  // each value vector loaded once for all rows. A row whose probability is
  // 0 (a hidden key) skips the key, as RowOutputColumnsOf: per row the same
  // operations. pk (or NULL) steps once every 8 keys.
  template <int R, int U, bool kGuard, bool kStep>
  __attribute__((noinline)) static void RowOutputRowsColumns(
      const float* __restrict pr, int64_t s_stride,
      const float* __restrict v, int64_t vs, int64_t nb,
      const float* __restrict alpha, float* __restrict o, int64_t o_stride,
      PrefetchStream* pk) {
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
  template <int R>
  static void RowOutputRows(const float* __restrict pr, int64_t s_stride,
                            const float* __restrict v, int64_t dv, int64_t vs,
                            int64_t nb, const float* __restrict alpha,
                            float* __restrict o, PrefetchStream* pk = nullptr) {
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
  template <class E>
  static void RowOutputWidth(const float* __restrict pr,
                             const typename E::T* __restrict v, int64_t dv,
                             int64_t vs, int64_t nb, float alpha,
                             float* __restrict o, PrefetchStream* pk) {
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

  // RowOutputWidth; with pk (the next block's keys streaming in, a step a
  // key) and more columns than one pass of accumulators holds, kValueKeys
  // keys at a time through every column, so that a value row is used up
  // before the prefetches can evict it from L1 (each later group rescales
  // by 1: exact, the same bits).
  static constexpr int64_t kValueKeys = 8;
  template <class E>
  static void RowOutputOf(const float* __restrict pr,
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

  static void RowOutput(const float* __restrict pr, const float* __restrict v,
                        int64_t dv, int64_t vs, int64_t nb, float alpha,
                        float* __restrict o, PrefetchStream* pk = nullptr) {
    RowOutputOf<F32Rows>(pr, v, dv, vs, nb, alpha, o, pk);
  }

  // Dot scores of one row with keys [j0, j0 + nb) of src (kDot: finish 1,
  // the scale is in q; kDotScaled: finish = scale).
  template <class E>
  static void RowDotScoresOf(const float* q, const KvSource& src, int64_t j0,
                             int64_t d, int64_t nb, float finish, float* st,
                             BlockPrefetch* pf) {
    using T = typename E::T;
    const int64_t ks = src.row_bytes / static_cast<int64_t>(sizeof(T));
    RowScores<kDot, E>(q, reinterpret_cast<const T*>(src.base) + j0 * ks, d,
                       ks, nb, finish, nullptr, st, pf);
    if (src.dtype == QKV_DTYPE_I8) {
      const float* sc = src.scales + j0 * src.scale_st;
      for (int64_t j = 0; j < nb; ++j) st[j] *= sc[j * src.scale_st];
    }
  }

  static void RowDotScoresLowPrecision(const float* q, const KvSource& src,
                                       int64_t j0, int64_t d, int64_t nb,
                                       float finish, float* st,
                                       BlockPrefetch* pf) {
    switch (src.dtype) {
      case QKV_DTYPE_F16:
        return RowDotScoresOf<F16Rows>(q, src, j0, d, nb, finish, st, pf);
      case QKV_DTYPE_BF16:
        return RowDotScoresOf<BF16Rows>(q, src, j0, d, nb, finish, st, pf);
      default:
        return RowDotScoresOf<I8Rows>(q, src, j0, d, nb, finish, st, pf);
    }
  }

  // o[c] = o[c] * alpha + sum_j pr[j] v_j[c] for U vectors of columns of
  // value rows of E (F32Rows: the f32 row path's; the fused path's types);
  // kStep: pk steps once a key.
  template <class E, int U, bool kStep = false>
  __attribute__((noinline)) static void RowOutputColumnsOf(
      const float* __restrict pr, const typename E::T* __restrict v,
      int64_t vs, int64_t nb, float alpha, float* __restrict o,
      PrefetchStream* pk = nullptr) {
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

  template <class E>
  static void RowOutputFrom(float* __restrict pr, const KvSource& src,
                            int64_t j0, int64_t dv, int64_t nb, float alpha,
                            float* __restrict o, PrefetchStream* pk) {
    using T = typename E::T;
    const int64_t vs = src.row_bytes / static_cast<int64_t>(sizeof(T));
    const T* v = reinterpret_cast<const T*>(src.base) + j0 * vs;
    if (src.dtype == QKV_DTYPE_I8) {  // the rows' scales into the weights
      const float* sc = src.scales + j0 * src.scale_st;
      for (int64_t j = 0; j < nb; ++j) pr[j] *= sc[j * src.scale_st];
    }
    RowOutputOf<E>(pr, v, dv, vs, nb, alpha, o, pk);
  }

  static void RowOutputLowPrecision(float* pr, const KvSource& src,
                                    int64_t j0, int64_t dv, int64_t nb,
                                    float alpha, float* o,
                                    PrefetchStream* pk) {
    switch (src.dtype) {
      case QKV_DTYPE_F16:
        return RowOutputFrom<F16Rows>(pr, src, j0, dv, nb, alpha, o, pk);
      case QKV_DTYPE_BF16:
        return RowOutputFrom<BF16Rows>(pr, src, j0, dv, nb, alpha, o, pk);
      default:
        return RowOutputFrom<I8Rows>(pr, src, j0, dv, nb, alpha, o, pk);
    }
  }

  // Scores of one row for keys [j, j + nb), the kind chosen once.
  static void RowScoresFor(const Problem& p, const Operands& op,
                           const float* q, const float* k, int64_t nb,
                           float* st, BlockPrefetch* pf) {
    const int64_t d = op.dim, ks = op.k_st;
    if (op.kind == kAdditive) {
      RowScores<kAdditive>(q, k, d, ks, nb, 1.0f, p.w_v, st, pf);
    } else if (op.kind == kGaussian) {
      RowScores<kGaussian>(q, k, d, ks, nb, op.finish, p.w_v, st, pf);
    } else {  // op.finish: 1 when the scale is folded into the queries
      RowScores<kDot>(q, k, d, ks, nb, op.finish, p.w_v, st, pf);
    }
  }

  // Row r's scores st[0, nb) of keys [lo, lo + nb) of a block to
  // probabilities: the epilogue, the raw scores into weights (when asked),
  // the online softmax. Returns the rescale factor of the row's output.
  static QKV_FLASH_INLINE float RowProbabilities(const Problem& p,
                                                 const Tile& tile, int64_t r,
                                                 int64_t lo, int64_t nb,
                                                 float* st) {
    if (p.softcap > 0.0f || p.alibi_slopes != nullptr) {
      RowEpilogue(p, tile, r, lo, nb, st);
    } else if (tile.bias[r] != nullptr) {
      AddBias(tile.bias[r], lo, nb, 1, st);
    }
    if (p.weights != nullptr) {
      memcpy(p.weights + tile.row[r] * p.kv_len + lo, st, nb * sizeof(float));
    }
    return RowSoftmaxBlock(st, nb, &tile.m[r], &tile.sum[r]);
  }

  // The finisher for the row path's rows of one kv head, after merging
  // the flash-decoding splits (false: another split merges them).
  static void FinishRows(const Problem& p, const TileTask& task,
                         const unsigned char* shared, const Tile& tile) {
    const int64_t dv = p.value_dim;
    if (KeySplits(p) > 1 &&
        !MergeSplits(p, task, shared, tile, tile.o_rows, dv, 1)) {
      return;
    }
    for (int64_t r = 0; r < task.rows; ++r) {
      RowState s = RowStateOf(tile, r);
      s.o = tile.o_rows + r * dv;
      s.o_stride = 1;
      s.c_begin = 0;
      s.w_lo = tile.lo[r];
      s.w_hi = tile.hi[r];
      FinishRow(p, s, tile.tail);
    }
  }

  // 8 rows of dot scores take RowScores8: an x86 target with its
  // full-width transpose (16 or 8 lanes), f32 keys, d whole vectors.
  static bool ScoresRows8(const Operands& op) {
    return O::kTransposeLanes != 0 && O::Lanes() == O::kTransposeLanes &&
           !op.convert_k && op.dim % static_cast<int64_t>(O::Lanes()) == 0;
  }

  // Rows scored and accumulated together (RowScoresRows or RowScores8,
  // RowOutputRows): 2, 4 or 8 rows (a decoding step at GQA 2, 4 or 8) that
  // see the same keys, dot scores. Other groups take their rows one at a
  // time.
  static bool JointRows(const Operands& op, const Tile& tile, int64_t rows) {
    if ((rows != 2 && rows != 4 && (rows != 8 || !ScoresRows8(op))) ||
        (op.kind != kDot && op.kind != kDotScaled)) {
      return false;
    }
    for (int64_t r = 1; r < rows; ++r) {
      if (tile.lo[r] != tile.lo[0] || tile.hi[r] != tile.hi[0]) return false;
    }
    return true;
  }

  // Joint rows' scores of nb f32 key rows k (k_st apart) into st (a row
  // every s_stride floats).
  static void JointScoresOnly(const Operands& op, const Tile& tile,
                              int64_t rows, const float* k, int64_t nb,
                              float* st, int64_t s_stride, BlockPrefetch* pf) {
    if (rows == 2) {
      RowScoresRows<2, kDot, F32Rows>(tile.q_rows, k, op.dim, op.k_st, nb,
                                      op.finish, nullptr, st, s_stride, pf);
    } else if (rows == 4) {
      RowScoresRows<4, kDot, F32Rows>(tile.q_rows, k, op.dim, op.k_st, nb,
                                      op.finish, nullptr, st, s_stride, pf);
    } else {
      RowScores8(tile.q_rows, k, op.dim, op.k_st, nb, op.finish, st, s_stride,
                 pf);
    }
  }

  // Joint rows' scores for keys [lo, lo + nb) of f32 rows k (k_st apart)
  // into tile.s_row (a row every s_stride floats), then their
  // probabilities; alpha[r] the rescale factors.
  static void JointScores(const Problem& p, const Operands& op,
                          const Tile& tile, int64_t rows, const float* k,
                          int64_t lo, int64_t nb, int64_t s_stride,
                          BlockPrefetch* pf, float* alpha) {
    JointScoresOnly(op, tile, rows, k, nb, tile.s_row, s_stride, pf);
    for (int64_t r = 0; r < rows; ++r) {
      alpha[r] =
          RowProbabilities(p, tile, r, lo, nb, tile.s_row + r * s_stride);
    }
  }

  // Joint rows' output from f32 value rows v (v_st apart), probabilities
  // at pr (a row every s_stride floats); pk (or NULL) steps as the output
  // goes (4 and 8 rows from DRAM: the next block's keys, RunRows).
  static void JointOutput(const Problem& p, const Operands& op,
                          const Tile& tile, int64_t rows, const float* pr,
                          const float* v, int64_t nb, int64_t s_stride,
                          const float* alpha, PrefetchStream* pk = nullptr) {
    if (rows == 2) {
      RowOutputRows<2>(pr, s_stride, v, p.value_dim, op.v_st, nb, alpha,
                       tile.o_rows);
    } else {
      for (int64_t r = 0; r < rows; r += 4) {
        RowOutputRows<4>(pr + r * s_stride, s_stride, v, p.value_dim, op.v_st,
                         nb, alpha + r, tile.o_rows + r * p.value_dim, pk);
      }
    }
  }

  // How often 4 or 8 joint rows step the next block's key prefetch over
  // a block of nb keys: every 4 keys of RowScoresRows<4> (4 rows), then
  // every 8 keys of each column pass of RowOutputRowsColumns (JointOutput:
  // dv / (U * lanes) passes per 4 rows). Spread over all of them, not
  // issued in the first passes (on 8-lane targets 8 passes per 4 rows:
  // the 512 lines of a 64-key block of d 128 went out in the first eighth
  // of the output): GQA-4 decoding from DRAM (16k keys) 0.90-0.92x the
  // time on highway:AVX2 and xsimd:avx2, GQA-8 (128 MiB of K and V)
  // 0.86-0.90x; 16-lane targets step as before (2 passes: the same count).
  static int64_t JointKeySteps(int64_t rows, int64_t nb, int64_t dv) {
    const int64_t pass =
        RowOutputUnroll<4>() * static_cast<int64_t>(O::Lanes());
    const int64_t out = (nb + 7) / 8 * (dv / pass) * (rows / 4);
    const int64_t scores = rows == 4 ? (nb + 3) / 4 : 0;
    return out + scores > 0 ? out + scores : nb / 2;
  }

  // Row r's keys [*lo, *hi) of the block [j0, j1), up to `end` (a split's
  // last key): empty when *hi <= *lo.
  static QKV_FLASH_INLINE void RowKeysOfBlock(const Tile& tile, int64_t r,
                                              int64_t j0, int64_t j1,
                                              int64_t end, int64_t* lo,
                                              int64_t* hi) {
    *lo = tile.lo[r] > j0 ? tile.lo[r] : j0;
    const int64_t h = j1 < tile.hi[r] ? j1 : tile.hi[r];
    *hi = h < end ? h : end;
  }

  // Key blocks per phase of RunRowPhases: up to kRowStateRows (the score
  // rows of the tile's row state hold a block each), as many as keep a
  // phase's values within kPhaseValueBytes (they wait in L2 for the output).
  static constexpr int64_t kPhaseValueBytes = int64_t{256} << 10;
  static int64_t PhaseBlocks(int64_t dv) {
    const int64_t n = kPhaseValueBytes / (kBlockKeys * dv * 4);
    return n > kRowStateRows ? kRowStateRows : n < 1 ? 1 : n;
  }

  // One or two rows (S1, GQA-2 decoding) streaming f32 K and V from memory
  // where keys are prefetched late (AMD: RunRows' keys_late), on x86 (the
  // check is in RunTask): in phases of PhaseBlocks() key blocks (fewer for
  // two rows: a score row per row and block), the scores of every block of
  // the phase (the first row's keys read in order, left to the hardware
  // prefetchers on every target; the phase's values prefetched into L2 as
  // they go), then each row's probabilities block by block, then each
  // block's output. Per row, a block's operations are RunRows' in the same
  // order (raw scores do not depend on the running max; probabilities and
  // outputs follow block by block): the same bits. Long phases of one
  // stream suit the memory (from DRAM on Zen 4, against RunRows' blocks
  // one at a time: S1 decoding 0.89-0.98x the time on every x86 target,
  // GQA-2 with 16k keys 0.93-0.96x; S1 in phases of 2 blocks 0.92-0.99x, 4
  // blocks 0.95-0.98x; K and V interleaved 8 keys at a time, the scores of
  // the next block beside the output of this one, 1.04-1.52x, and
  // 1.18-1.83x with the next block's values prefetched as well). Not for
  // binary16 and bfloat16 caches (in phases 1.04-1.19x, with or without
  // the next phase's keys prefetched during the values) nor int8
  // (0.91-1.01x from build to build and backend to backend: no clear
  // gain). Compiled for AArch64, where it is never taken, its mere
  // presence raised the instructions per pair of S1 decoding on
  // xsimd:neon64 by 0.6% (bench/arm_icount.sh): x86 only.
  static bool RowInPhases(const Problem& p, const Operands& op,
                          const TileTask& task) {
    return task.rows <= 2 && !op.convert_k && !op.convert_v &&
           PrefetchesKv(p) && KeysPrefetchedLate();
  }

  __attribute__((noinline)) static void RunRowPhases(
      const Problem& p, const Operands& op, const TileTask& task,
      const unsigned char* shared, const Tile& tile) {
    const int64_t rows = task.rows;
    const RowsSpan span = SetUpRowPath(p, op, task.b, task.kvh, rows, tile);
    const int64_t start =
        span.begin > task.key_begin ? span.begin : task.key_begin;
    const int64_t stop = span.end < task.key_end ? span.end : task.key_end;
    const int64_t d = op.dim, dv = p.value_dim, ks = op.k_st, vs = op.v_st;
    const int64_t s_floats = static_cast<int64_t>(RowScoreFloats(O::Lanes()));
    int64_t phase = PhaseBlocks(dv);
    if (phase * rows > kRowStateRows) phase = kRowStateRows / rows;
    // Row r's keys [*lo, *hi) of the block at j (nb keys); false: none.
    auto keys_of = [&](int64_t r, int64_t j, int64_t nb, int64_t* lo,
                       int64_t* hi) {
      RowKeysOfBlock(tile, r, j, j + nb, stop, lo, hi);
      return *hi > *lo;
    };
    for (int64_t j0 = start; j0 < stop; j0 += phase * kBlockKeys) {
      int64_t jb[kRowStateRows], nb[kRowStateRows];
      float alpha[kRowStateRows];
      int64_t n = 0;
      for (int64_t j = j0; n < phase && j < stop; j += kBlockKeys, ++n) {
        jb[n] = j;
        nb[n] = BlockKeys(j, stop);
      }
      const int64_t keys = jb[n - 1] + nb[n - 1] - j0;
      // The phase's values, a step every 4 keys of the first row's scores.
      BlockPrefetch pf(true, op, dv, j0, keys, stop, keys / 4, 0,
                       PrefetchTo::kL2);
      int64_t lo, hi;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t r = 0; r < rows; ++r) {
          if (!keys_of(r, jb[i], nb[i], &lo, &hi)) continue;
          RowScoresFor(p, op, tile.q_rows + r * d, op.k + lo * ks, hi - lo,
                       tile.s_row + (r * phase + i) * s_floats,
                       r == 0 ? &pf : nullptr);
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < n; ++i) {
          if (!keys_of(r, jb[i], nb[i], &lo, &hi)) continue;
          alpha[r * phase + i] =
              RowProbabilities(p, tile, r, lo, hi - lo,
                               tile.s_row + (r * phase + i) * s_floats);
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t r = 0; r < rows; ++r) {
          if (!keys_of(r, jb[i], nb[i], &lo, &hi)) continue;
          RowOutputWidth<F32Rows>(tile.s_row + (r * phase + i) * s_floats,
                                  op.v + lo * vs, dv, vs, hi - lo,
                                  alpha[r * phase + i], tile.o_rows + r * dv,
                                  nullptr);
        }
      }
    }
    FinishRows(p, task, shared, tile);
  }

  // One decoding row of an int8 cache from DRAM, pipelined: the scores of
  // each key block are interleaved, kPipeKeys keys at a time, with the
  // output of the block before (whose probabilities are ready), so that
  // its K and V rows stream in side by side instead of in turns; the
  // scores' prefetches bring this block's values and the next block's keys
  // into L2. Per block the operations are RunRows' in the same order (a
  // block's softmax follows the previous block's output; the output's
  // later pieces rescale by 1, which is exact): the same bits. S1 int8
  // decoding from DRAM on Zen 5 (QKV_AB_COLD=1): 0.91-0.96x the time on
  // the AVX-512 and AVX2 backends, SSE4 1.00-1.02x; from cache 0.95-1.01x;
  // the suite's read share 0.74-0.80 -> 0.80-0.85 of the paired read. 8,
  // 12, 24 and 32 keys a piece measured 1.02-1.05x the time of 16; the
  // next block's values and the keys after it prefetched 1.03x, no value
  // prefetch 0.89-1.10x, no key prefetch 1.6-2.4x, none 1.07x
  // (bench/README.md). Not for binary16 and bfloat16 caches (1.23x and
  // 1.29x: they already read at the limit). Where keys are prefetched late
  // (AMD: the machines measured) and on 8- and 16-lane targets.
  static constexpr int64_t kPipeKeys = 16;
  // The software prefetches run for a task's first kPipeWarmKeys keys
  // only: by then the hardware prefetchers follow the K and V streams,
  // which a task of several splits (SplitsPerTask) reads on for thousands
  // of keys, and the prefetch instructions only cost time (from cache
  // 1.2x; S1 int8 from DRAM on Zen 5, tasks of a whole kv head: highway:AVX3
  // and xsimd:avx512f 0.84-0.92x the time, AVX2 0.93-0.94x in one harness
  // and 1.04-1.06x in another, suite's read share 0.80 -> 0.88-0.90; tasks
  // of one split keep every prefetch, and none at all there measured
  // 1.02x, shorter warm-ups 1.08x). (The "none 1.07x" above: one-split
  // tasks.)
  static constexpr int64_t kPipeWarmKeys = kSplitKeys;
  // (int8 K and V, dot scores: op.convert_k, op.convert_v, kDot or
  // kDotScaled.)
  static bool PipelinesInt8(const Problem& p) {
    return p.kv_dtype == QKV_DTYPE_I8 && p.score == QKV_SCORE_DOT &&
           PrefetchesKv(p) && KeysPrefetchedLate() && O::Lanes() >= 8;
  }
  static bool RowPipelined(const Problem& p, const TileTask& task) {
    return task.rows == 1 && PipelinesInt8(p);
  }

  // A problem whose every task RowPipelined takes, split into key splits
  // whose tasks follow the cache (head-major): such a task may take several
  // consecutive splits of its kv head (SplitsPerTask), the pipeline running
  // on across their boundaries, each split finished as its own task would
  // be (the same partials, merged the same way: the same bits).
  static bool DecodesPipelined(const Problem& p) {
    return PipelinesInt8(p) && UsesRowPath(p) && p.group * p.q_len == 1 &&
           !InterleavesHeads(p) && !UsesTinyPath(p, O::Lanes()) &&
           KeySplits(p) > 1 && SplitsHeadMajor(p);
  }

  // Consecutive splits per task: as many as leave at least 4 tasks a
  // worker (one worker: a kv head's splits in one task). Each split's first
  // and last blocks then overlap their neighbours' instead of reading K
  // alone and V alone (S1 int8 decoding from DRAM on Zen 5, one worker:
  // 0.95-0.98x the time on the AVX-512 and AVX2 backends; heads not split
  // at all measured 0.92-0.93x, f32 and f16 0.96-0.98x, for reasons not
  // found: the splits' partials and merge take under 1% of the samples).
  static int64_t SplitsPerTask(const Problem& p) {
#if defined(__x86_64__) || defined(__i386__)
    if (!DecodesPipelined(p)) return 1;
    const int64_t n = KeySplits(p);
    const int64_t heads = static_cast<int64_t>(NumTileTasks(p, TaskRows(p)));
    const int64_t want = 4 * (p.workers > 1 ? p.workers : 1);
    int64_t g = n;
    while (g > 1 && heads * ((n + g - 1) / g) < want) g = (g + 1) / 2;
    return g;
#else
    (void)p;
    return 1;
#endif
  }

  // Task `task`: SplitTaskAt's, or SplitsPerTask() splits of one kv head.
  static TileTask TaskAt(const Problem& p, size_t task) {
    const int64_t g = SplitsPerTask(p);
    if (g == 1) return SplitTaskAt(p, task, TaskRows(p));
    const int64_t n = KeySplits(p), per_head = (n + g - 1) / g;
    const int64_t t = static_cast<int64_t>(task);
    TileTask r = TileTaskAt(p, static_cast<size_t>(t / per_head), TaskRows(p));
    const int64_t first = (t % per_head) * g;
    SetSplits(p, first, n - first < g ? n - first : g, &r);
    return r;
  }

  __attribute__((noinline)) static void RunRowPipelined(
      const Problem& p, const Operands& op, const TileTask& task,
      const unsigned char* shared, const Tile& tile) {
    const int64_t d = op.dim, dv = p.value_dim;
    const RowsSpan span = SetUpRowPath(p, op, task.b, task.kvh, 1, tile);
    const int64_t s_floats = static_cast<int64_t>(RowScoreFloats(O::Lanes()));
    float* const buf[2] = {tile.s_row, tile.s_row + s_floats};
    float* const o = tile.o_rows;
    // The pending block: its keys [p_lo, p_lo + p_nb), its probabilities
    // in buf[cur], its rescale factor p_alpha.
    int cur = 0;
    int64_t p_lo = 0, p_nb = 0;
    float p_alpha = 1.0f;
    auto output = [&](int64_t b, int64_t n) {
      RowOutputLowPrecision(buf[cur] + b, op.vsrc, p_lo + b, dv, n,
                            b == 0 ? p_alpha : 1.0f, o, nullptr);
    };
    // Split s of the task as a task of its own.
    auto split_task = [&](int64_t s) {
      TileTask t = task;
      SetSplits(p, s, 1, &t);
      return t;
    };
    // Finishes the splits before `to` (their outputs complete), each
    // leaving the row's state as a task's SetUpRowPath does.
    int64_t next = task.split;
    const int64_t s_end = task.split + task.splits;
    auto finish_to = [&](int64_t to) {
      for (; next < to; ++next) {
        FinishRows(p, split_task(next), shared, tile);
        tile.m[0] = -INFINITY;
        tile.sum[0] = 0.0f;
        for (int64_t c = 0; c < dv; ++c) o[c] = 0.0f;
      }
    };
    int64_t j_first = -1;  // the task's first block
    for (int64_t s = task.split; s < s_end; ++s) {
      const TileTask sp = split_task(s);
      const int64_t start =
          span.begin > sp.key_begin ? span.begin : sp.key_begin;
      const int64_t stop = span.end < sp.key_end ? span.end : sp.key_end;
      for (int64_t j0 = start; j0 < stop; j0 += kBlockKeys) {
        const int64_t nb_all = BlockKeys(j0, stop);
        int64_t lo, hi;
        RowKeysOfBlock(tile, 0, j0, j0 + nb_all, sp.key_end, &lo, &hi);
        const int64_t nb = hi - lo;
        if (nb <= 0) continue;
        // As RunRows, the next block's keys up to the row's last visible
        // key, past the split's end; in the task's first kPipeWarmKeys.
        if (j_first < 0) j_first = j0;
        BlockPrefetch pf(j0 - j_first < kPipeWarmKeys, op, dv, j0, nb_all,
                         span.end, nb_all / 4, nb_all / 4, PrefetchTo::kL2);
        float* const st = buf[cur ^ 1];
        for (int64_t a = 0, b = 0; a < nb || b < p_nb;) {
          if (a < nb) {
            const int64_t n = nb - a < kPipeKeys ? nb - a : kPipeKeys;
            RowDotScoresLowPrecision(tile.q_rows, op.ksrc, lo + a, d, n,
                                     op.finish, st + a, &pf);
            a += n;
          }
          if (b < p_nb) {
            const int64_t n = p_nb - b < kPipeKeys ? p_nb - b : kPipeKeys;
            output(b, n);
            b += n;
          }
        }
        finish_to(s);  // the pending block was the last of an earlier split
        p_alpha = RowProbabilities(p, tile, 0, lo, nb, st);
        p_lo = lo;
        p_nb = nb;
        cur ^= 1;
      }
    }
    if (p_nb > 0) output(0, p_nb);
    finish_to(s_end);
  }

  // All rows (at most kRowPathMaxRows, or the 8 of kPathRows8) of one
  // (batch, kv head), keys
  // [task.key_begin, task.key_end) of them (one flash-decoding split). Keys
  // are walked in blocks; each block of K and V is read from memory once and
  // reused from L1 by the group's other rows, each of which takes the part
  // of the block inside its own key interval.
  static void RunRows(const Problem& p, const Operands& op,
                      const TileTask& task, const unsigned char* shared,
                      const Tile& tile) {
    const int64_t b = task.b, kvh = task.kvh, rows = task.rows;
    const int64_t d = op.dim, dv = p.value_dim;
    const RowsSpan span = SetUpRowPath(p, op, b, kvh, rows, tile);
    const int64_t start =
        span.begin > task.key_begin ? span.begin : task.key_begin;
    const int64_t stop = span.end < task.key_end ? span.end : task.key_end;
    const int64_t ks = op.k_st, vs = op.v_st;
    float* st = tile.s_row;
    const bool prefetch = PrefetchesKv(p);
    const bool fused_v = op.convert_v && rows == 1;
    const bool fused_k =
        fused_v && op.convert_k && (op.kind == kDot || op.kind == kDotScaled);
    // From cache joint rows are 1.5x faster. From DRAM (PrefetchesKv) 4 or
    // 8 joint rows prefetch the next block's keys while their output
    // accumulates, which takes longer than their scores (4 rows: also while
    // scoring, RowScoresRows stepping both streams) (GQA-4 decoding,
    // 128 MiB of K and V, Emerald Rapids: 0.84-0.93x the time of one row at
    // a time; joint rows prefetching only in the scores measured 1.04-1.06x
    // slower on Zen 4); 2 rows go one at a time (joint: 0.99-1.02x).
    const bool joint = (!prefetch || rows >= 4) && JointRows(op, tile, rows);
    TracePath(joint ? kPathRowsJoint : kPathRows);
    // Where the next block's keys are prefetched when rows go one at a time:
    // during the first row's scores, beside this block's values (Intel), or
    // during its values (keys_late: AMD; S1 decoding from DRAM on Zen 4,
    // f32 0.80-0.92x the time, f16 and bf16 0.77-0.97x; on Emerald Rapids
    // 1.01-1.05x). KeysPrefetchedLate() says which (src/engine.h). Not
    // where converting the block is the bound, int8 on 8- and 4-lane
    // targets and binary16 without F16C (4-lane x86 targets): there the
    // extra steps cost 1.01-1.09x on Zen 4 (int8 on Zen 5, every call from
    // DRAM: AVX-512 0.84-0.90x the time, AVX2 0.99-1.00x, SSE4 1.01x).
    const bool keys_late =
        prefetch && !joint && KeysPrefetchedLate() &&
        (op.ksrc.dtype != QKV_DTYPE_I8 || O::Lanes() >= 16) &&
        !(op.ksrc.dtype == QKV_DTYPE_F16 && O::Lanes() < 8);
    // With keys_late, f32 keys on 16-lane targets are left to the hardware
    // prefetchers, which follow the first row's scores reading them in
    // order (KeyMajorScores): S1 on Zen 4, 0.92-0.96x the time. The value
    // pass still goes 8 keys at a time (pk steps a stream with nothing to
    // do). Not on 8- and 4-lane targets (1.00x, and 1.13x on SSE4), nor
    // for binary16 and bfloat16 keys (1.15-1.20x); joint rows without
    // their key prefetches measured 1.1-1.4x (GQA-4 and GQA-8).
    const bool hardware_keys =
        keys_late && op.ksrc.dtype == QKV_DTYPE_F32 && O::Lanes() >= 16;
    const int64_t s_floats = static_cast<int64_t>(RowScoreFloats(O::Lanes()));
    // The next block's keys are prefetched past the end of a split, up to
    // the rows' last visible key: with head-major splits (SplitsHeadMajor)
    // they are the next task's first block, which would otherwise start
    // cold (S1 decoding on Zen 5, one worker: f16 and bf16 0.89-0.93x the
    // time, int8 0.97x, GQA-8 0.90-0.95x; two workers, which take adjacent
    // splits, unchanged). x86 only: on AArch64 the extra prefetches raised
    // the instructions per pair of S1 decoding by up to 3%
    // (bench/arm_icount.sh), and no ARM machine here measures memory.
#if defined(__x86_64__) || defined(__i386__)
    const int64_t key_stop = span.end;
#else
    const int64_t key_stop = stop;
#endif
    for (int64_t j0 = start; j0 < stop; j0 += kBlockKeys) {
      // The first row's scores prefetch this block's V (and the next K).
      const int64_t nb_all = BlockKeys(j0, stop);
      // With keys_late (one row at a time) the next block's keys stream in
      // during the first row's values instead (pk, a key's share a key).
      BlockPrefetch pf(prefetch, op, dv, j0, nb_all, key_stop, nb_all / 4,
                       joint && rows >= 4 ? JointKeySteps(rows, nb_all, dv)
                       : keys_late        ? 0
                                          : nb_all / 4,
                       PrefetchTo::kL2);
      BlockPrefetch late(keys_late && !hardware_keys, op, dv, j0, nb_all,
                         key_stop, 0, nb_all, PrefetchTo::kL2);
      PrefetchStream* const pk = keys_late ? &late.k : nullptr;
      // For the scores that read the block's keys first (the first row's,
      // or the joint rows'), streaming them from memory and stepping the
      // prefetches; NULL from cache.
      BlockPrefetch* const lead = prefetch ? &pf : nullptr;
      // The block's keys and values, read once for all rows (low-precision
      // ones dequantized here): row j at k + (j - j0) * ks. Values are
      // converted after the first row's scores, which prefetch them.
      // A single row reads low-precision dot-score keys and values fused
      // (fused_k, fused_v); several rows share one dequantized block.
      const float* k =
          fused_k ? nullptr : KeyBlock(op, j0, nb_all, tile.kblk);
      const float* v = nullptr;
      if (joint) {  // every row sees the same keys
        int64_t lo, hi;
        RowKeysOfBlock(tile, 0, j0, j0 + nb_all, task.key_end, &lo, &hi);
        if (hi <= lo) continue;
        float alpha[kRowStateRows];
        JointScores(p, op, tile, rows, k + (lo - j0) * ks, lo, hi - lo,
                    s_floats, lead, alpha);
        v = ValueBlock(op, dv, j0, nb_all, tile.vblk);
        JointOutput(p, op, tile, rows, tile.s_row, v + (lo - j0) * vs,
                    hi - lo, s_floats, alpha,
                    prefetch && rows >= 4 ? &pf.k : nullptr);
        continue;
      }
      for (int64_t r = 0; r < rows; ++r) {
        int64_t lo, hi;
        RowKeysOfBlock(tile, r, j0, j0 + nb_all, task.key_end, &lo, &hi);
        const int64_t nb = hi - lo;
        if (nb <= 0) continue;
        if (fused_k) {
          RowDotScoresLowPrecision(tile.q_rows + r * d, op.ksrc, lo, d, nb,
                                   op.finish, st, r == 0 ? lead : nullptr);
        } else {
          RowScoresFor(p, op, tile.q_rows + r * d, k + (lo - j0) * ks, nb, st,
                       r == 0 ? lead : nullptr);
        }
        const float alpha = RowProbabilities(p, tile, r, lo, nb, st);
        if (fused_v) {
          RowOutputLowPrecision(st, op.vsrc, lo, dv, nb, alpha,
                                tile.o_rows + r * dv, r == 0 ? pk : nullptr);
          continue;
        }
        if (v == nullptr) v = ValueBlock(op, dv, j0, nb_all, tile.vblk);
        RowOutput(st, v + (lo - j0) * vs, dv, vs, nb, alpha,
                  tile.o_rows + r * dv, r == 0 ? pk : nullptr);
      }
    }
    FinishRows(p, task, shared, tile);
  }

  // The row path over up to kHeadGroupMax kv heads of a token-major cache
  // (InterleavesHeads): each key block is scored kInterleaveKeys (or
  // kInterleaveKeysPrefetched) keys at a time for every head of the group
  // in turn, then turned into probabilities head by head, then its values
  // are read the same way. A head's scores, softmax and output are
  // RunRows' on the same blocks (the output's later pieces rescale by 1,
  // which is exact): the same bits.
  static void RunRowsHeads(const Problem& p, const TileTask& task,
                           const unsigned char* shared,
                           unsigned char* workspace) {
    const int64_t heads = task.heads, rows = task.rows;
    const int64_t d = ScoreDim(p), dv = p.value_dim;
    const size_t tile_bytes = LayoutRowTile(p, O::Lanes(), nullptr, nullptr);
    const int64_t s_floats = static_cast<int64_t>(RowScoreFloats(O::Lanes()));
    Operands ops[kHeadGroupMax];
    Tile tiles[kHeadGroupMax];
    float alphas[kHeadGroupMax * kRowPathMaxRows];
    RowsSpan span = EmptySpan(p);
    for (int64_t g = 0; g < heads; ++g) {
      ops[g] = OperandsFor(p, shared, task.b, task.kvh + g);
      LayoutRowTile(p, O::Lanes(), workspace + g * tile_bytes, &tiles[g]);
      // Every head of a batch has the same key intervals (RowKeys): the
      // same span, so the same blocks as RunRows.
      span = SetUpRowPath(p, ops[g], task.b, task.kvh + g, rows, tiles[g]);
    }
    const bool fused = p.kv_dtype != QKV_DTYPE_F32;  // one row, dot scores
    // Every head's rows see the same keys or none does (RowKeys).
    const bool joint = !fused && JointRows(ops[0], tiles[0], rows);
    static constexpr float kOnes[kRowPathMaxRows] = {1.0f, 1.0f, 1.0f, 1.0f};
    // Software prefetch where the hardware prefetchers alone fall short:
    // joint rows (GQA-4 token-major decoding on Zen 4, 0.77-0.87x the time
    // on every x86 target) and rows off 64-byte lines (S1 token-major 16
    // bytes past a line, as from malloc, 0.92-0.98x), 4 keys a piece then.
    // S1 from aligned rows keeps 8 keys and no prefetch (the prefetch:
    // 1.02-1.06x), and so do the low-precision caches' single rows
    // (binary16 off 64-byte lines: 1.12x). x86 only: no ARM machine here
    // measures memory.
#if defined(__x86_64__) || defined(__i386__)
    bool on_lines = true;
    auto lines = [](const KvSource& src) {
      return reinterpret_cast<uintptr_t>(src.base) % 64 == 0 &&
             src.row_bytes % 64 == 0;
    };
    for (int64_t g = 0; g < heads; ++g) {
      on_lines = on_lines && lines(ops[g].ksrc) && lines(ops[g].vsrc);
    }
    const bool lead = !fused && (joint || !on_lines);
#else
    const bool lead = false;
#endif
#if defined(__x86_64__) || defined(__i386__)
    const bool wide = !fused && O::Lanes() >= 16;
#else
    const bool wide = false;  // measured on x86 only
#endif
    const int64_t step = lead   ? kInterleaveKeysPrefetched
                         : wide ? kInterleaveKeysWide
                                : kInterleaveKeys;
    const int64_t start =
        span.begin > task.key_begin ? span.begin : task.key_begin;
    const int64_t stop = span.end < task.key_end ? span.end : task.key_end;
    // Row r's keys in block [j0, j1): [lo, hi), scores at s_row + r * s_floats.
    auto keys_of = [&](const Tile& tile, int64_t r, int64_t j0, int64_t j1,
                       int64_t* lo, int64_t* hi) {
      RowKeysOfBlock(tile, r, j0, j1, task.key_end, lo, hi);
    };
    // Its keys [a, e) in the step [s0, s1); false when there are none.
    auto piece = [&](const Tile& tile, int64_t r, int64_t j0, int64_t j1,
                     int64_t s0, int64_t s1, int64_t* lo, int64_t* a,
                     int64_t* e) {
      int64_t hi;
      keys_of(tile, r, j0, j1, lo, &hi);
      *a = *lo > s0 ? *lo : s0;
      *e = hi < s1 ? hi : s1;
      return *e > *a;
    };
    // f(op, tile, r, lo, a, e) for keys [a, e) of row r (-1: the joint
    // rows) in steps of `step` keys of block [j0, j1), every head of the
    // group in turn, step by step (with `lead`, the K or V rows of the
    // piece kPieceLead pieces on prefetched first); lo: the row's first key
    // of the block (its scores at s_row + r * s_floats + (a - lo)).
    auto each_piece = [&](int64_t j0, int64_t j1, bool values, auto&& f) {
      for (int64_t s0 = j0; s0 < j1; s0 += step) {
        const int64_t s1 = s0 + step < j1 ? s0 + step : j1;
        for (int64_t g = 0; g < heads; ++g) {
          // A plain loop, not a PrefetchStream: one built and stepped per
          // piece and head took 1.09-1.57x the time of these walks
          // (S1_token_major_u, S1_gqa4_token_m, every x86 backend).
          if (lead) {  // the piece kPieceLead pieces on, into L2
            const int64_t ga = g + kPieceLead;
            const int64_t sa = s0 + (ga / heads) * step;
            if (sa < j1) {
              const Operands& oa = ops[ga % heads];
              const KvSource& src = values ? oa.vsrc : oa.ksrc;
              const int64_t bytes =
                  (values ? dv : d) * KvElementBytes(src.dtype);
              const int64_t ea = sa + step < j1 ? sa + step : j1;
              for (int64_t t = sa; t < ea; ++t) {
                const unsigned char* row = src.base + t * src.row_bytes;
                for (int64_t c = 0; c < bytes; c += 64) {
                  __builtin_prefetch(row + c, 0, kL2Locality);
                }
              }
            }
          }
          int64_t lo, a, e;
          if (joint) {  // the rows see the same keys
            if (piece(tiles[g], 0, j0, j1, s0, s1, &lo, &a, &e)) {
              f(ops[g], tiles[g], g, int64_t{-1}, lo, a, e);
            }
            continue;
          }
          for (int64_t r = 0; r < rows; ++r) {
            if (piece(tiles[g], r, j0, j1, s0, s1, &lo, &a, &e)) {
              f(ops[g], tiles[g], g, r, lo, a, e);
            }
          }
        }
      }
    };
    for (int64_t j0 = start; j0 < stop; j0 += kBlockKeys) {
      const int64_t j1 = j0 + kBlockKeys < stop ? j0 + kBlockKeys : stop;
      each_piece(j0, j1, false, [&](const Operands& op, const Tile& tile,
                                    int64_t, int64_t r, int64_t lo, int64_t a,
                                    int64_t e) {
        if (r < 0) {
          JointScoresOnly(op, tile, rows, op.k + a * op.k_st, e - a,
                          tile.s_row + (a - lo), s_floats, nullptr);
          return;
        }
        float* st = tile.s_row + r * s_floats + (a - lo);
        if (fused) {
          RowDotScoresLowPrecision(tile.q_rows + r * d, op.ksrc, a, d, e - a,
                                   op.finish, st, nullptr);
        } else {
          RowScoresFor(p, op, tile.q_rows + r * d, op.k + a * op.k_st, e - a,
                       st, nullptr);
        }
      });
      for (int64_t g = 0; g < heads; ++g) {
        const Tile& tile = tiles[g];
        for (int64_t r = 0; r < rows; ++r) {
          int64_t lo, hi;
          keys_of(tile, r, j0, j1, &lo, &hi);
          if (hi <= lo) continue;
          alphas[g * kRowPathMaxRows + r] = RowProbabilities(
              p, tile, r, lo, hi - lo, tile.s_row + r * s_floats);
        }
      }
      each_piece(j0, j1, true, [&](const Operands& op, const Tile& tile,
                                   int64_t g, int64_t r, int64_t lo,
                                   int64_t a, int64_t e) {
        // The output's first piece of a block rescales by alpha, the
        // others by 1 (exact).
        const float* alpha_g = alphas + g * kRowPathMaxRows;
        if (r < 0) {
          JointOutput(p, op, tile, rows, tile.s_row + (a - lo),
                      op.v + a * op.v_st, e - a, s_floats,
                      a == lo ? alpha_g : kOnes);
          return;
        }
        const float alpha = a == lo ? alpha_g[r] : 1.0f;
        float* pr = tile.s_row + r * s_floats + (a - lo);
        if (fused) {
          RowOutputLowPrecision(pr, op.vsrc, a, dv, e - a, alpha,
                                tile.o_rows + r * dv, nullptr);
        } else {
          RowOutput(pr, op.v + a * op.v_st, dv, op.v_st, e - a, alpha,
                    tile.o_rows + r * dv);
        }
      });
    }
    for (int64_t g = 0; g < heads; ++g) {
      TileTask one = task;
      one.kvh = task.kvh + g;
      one.heads = 1;
      FinishRows(p, one, shared, tiles[g]);
    }
  }

  // --------------------------------------------------------- tiny path

  // dst[u] = base[u * stride] for lanes u < count, 0 for the others.
  static void TransposeRows(const float* base, int64_t stride, int32_t count,
                            float* dst) {
    const int64_t N = static_cast<int64_t>(O::Lanes());
    if (stride * N < (int64_t{1} << 30)) {
      O::StoreRows(base, static_cast<int32_t>(stride), count, dst);
      return;
    }
    for (int64_t u = 0; u < N; ++u) dst[u] = u < count ? base[u * stride] : 0.0f;
  }

  // Row path for tiny problems, kv_len <= lanes (toy shapes, short caches):
  // K and V are transposed once into the workspace and each row's scores,
  // softmax and output are a handful of whole-vector operations with keys in
  // lanes. Tiny calls are dominated by fixed costs, so this path sets up only
  // what it uses (no Tile, no divisions). RunTiny may run it with narrower
  // ops than the engine's, whose lanes still hold kv_len keys: it lays out
  // the workspace for its own lanes, less than the engine asked for.
  static void RunRowsTiny(const Problem& p, const Operands& op,
                          const TileTask& task, unsigned char* workspace) {
    const int64_t N = static_cast<int64_t>(O::Lanes());
    TinyTile tile;
    LayoutTiny(p, O::Lanes(), workspace, &tile);
    const int64_t b = task.b, kvh = task.kvh;
    const int64_t d = op.dim, dv = p.value_dim, lk = p.kv_len;
    // Keys and values transposed; lanes of keys j >= lk are 0, never
    // garbage: they are masked below, and a 0 keeps every lane's arithmetic
    // finite.
    const int32_t count = static_cast<int32_t>(lk);
    const float* k = op.k;
    const float* v = op.v;
    if (op.convert_k) {  // low precision: dequantized first (a few rows)
      for (int64_t j = 0; j < lk; ++j) {
        DequantizeRow(op.ksrc, j, d, tile.kblk + j * d);
      }
      k = tile.kblk;
    }
    if (op.convert_v) {
      for (int64_t j = 0; j < lk; ++j) {
        DequantizeRow(op.vsrc, j, dv, tile.vblk + j * dv);
      }
      v = tile.vblk;
    }
    for (int64_t t = 0; t < d; ++t) {
      TransposeRows(k + t, op.k_st, count, tile.kt + t * N);
    }
    for (int64_t c = 0; c < dv; ++c) {
      TransposeRows(v + c, op.v_st, count, tile.vt + c * N);
    }
    const float softcap = p.softcap;
    const V key = O::Load(kLaneIndex);
    const bool extras = p.lse != nullptr || p.weights != nullptr;
    // Without a per-row mask every row sees the same keys: one mask.
    const bool shared = RowsShareKeys(p);
    const KeyInterval common = RowKeys(p, 0, 0);
    const auto common_hi = O::Lt(key, O::Set(static_cast<float>(common.hi)));
    const V zero = O::Zero();
    const V neg_inf = O::Set(-INFINITY);
    RowWalker at(p, kvh);
    // Per head: its first query and output row, ALiBi slope and sink.
    int64_t head = -1;
    const float* q_head = nullptr;
    float* out_head = nullptr;
    float neg_slope = 0.0f, sink = -INFINITY;
    for (int64_t r = 0; r < task.rows; ++r) {
      if (at.h != head) {
        head = at.h;
        q_head = QueryOf(op, b, head, 0);
        out_head = OutRow(p, b, head, 0);
        neg_slope = -AlibiSlope(p, head);
        sink = RowSink(p, head);
      }
      const int64_t row = at.Row(p, b);
      const KeyInterval keys = shared ? common : RowKeys(p, b, at.i);
      const float* bias_row = BiasRow(p, b, at.h, at.i);
      const float* q = q_head + at.i * op.q_st;
      float* out = out_head + at.i * p.out_st;
      const int64_t pos = neg_slope != 0.0f ? QueryPos(p, b, at.i) : 0;
      at.Next(p);
      V s = zero;
      if (op.kind == kAdditive) {
        for (int64_t t = 0; t < d; ++t) {
          s = ScoreTerm<kAdditive>(O::Set(q[t]), O::Load(tile.kt + t * N),
                                   O::Set(p.w_v[t]), s);
        }
      } else if (op.kind == kGaussian) {
        for (int64_t t = 0; t < d; ++t) {
          s = ScoreTerm<kGaussian>(O::Set(q[t]), O::Load(tile.kt + t * N),
                                   zero, s);
        }
        s = O::Mul(s, O::Set(op.finish));
      } else {
        for (int64_t t = 0; t < d; ++t) {
          s = O::MulAdd(O::Set(q[t] * op.q_scale), O::Load(tile.kt + t * N),
                        s);
        }
        if (op.kind == kDotScaled) s = O::Mul(s, O::Set(op.finish));
      }
      float* tail = tile.tail;
      if (softcap > 0.0f) {
        s = Softcapped(s, O::Set(softcap), O::Set(InvCap(softcap)));
      }
      if (bias_row != nullptr) {
        for (int64_t j = 0; j < N; ++j) tail[j] = j < lk ? bias_row[j] : 0.0f;
        const V bias = O::Load(tail);
        s = O::IfThenElse(O::Eq(bias, neg_inf), neg_inf, O::Add(s, bias));
      }
      if (neg_slope != 0.0f) {
        const V dist = Abs(O::Sub(O::Set(static_cast<float>(pos)), key));
        s = O::MulAdd(O::Set(neg_slope), dist, s);
      }
      const auto below_hi =
          shared ? common_hi : O::Lt(key, O::Set(static_cast<float>(keys.hi)));
      s = O::IfThenElse(below_hi, s, neg_inf);
      if (keys.lo > 0) {
        s = O::IfThenElse(O::Lt(key, O::Set(static_cast<float>(keys.lo))),
                          neg_inf, s);
      }
      const float m = O::ReduceMax(s);
      const V e = ExpNonPositive(O::Sub(s, O::Set(m)));
      float l = O::ReduceSum(e);
      // No visible key: the max is -inf, or on targets whose max of an all
      // -inf vector is -FLT_MAX (Highway's EMU128) every term is exp(-inf).
      if (m == -INFINITY) l = 0.0f;
      const auto read = O::Gt(e, zero);  // hidden keys' values are not read
      const bool seen = l > 0.0f;
      if (seen) {
        const float scale = qkv::FinishRow(m, l, sink).scale;
        for (int64_t c = 0; c < dv; ++c) {
          out[c] = O::ReduceSum(O::IfThenElseZero(
                       read, O::Mul(e, O::Load(tile.vt + c * N)))) *
                   scale;
        }
      }
      if (p.weights != nullptr) {  // the raw masked scores
        O::Store(s, tail);
        memcpy(p.weights + row * lk, tail, lk * sizeof(float));
      }
      // Tiny calls are a few ns per row: the finisher only when it has
      // something left to do.
      if (seen && !extras) continue;
      RowState st;
      st.row = row;
      st.out = out;
      st.m = m;
      st.l = l;
      st.sink = sink;
      st.o = nullptr;  // written above
      st.o_stride = 1;
      st.c_begin = 0;
      st.w_lo = 0;
      st.w_hi = lk;
      FinishRow(p, st, tail);
    }
  }

  // The tiny path with the narrowest vectors that hold kv_len keys.
  static void RunTiny(const Problem& p, const Operands& op,
                      const TileTask& task, unsigned char* workspace) {
    using O4 = typename O::Narrow4;
    using O8 = typename O::Narrow8;
    if constexpr (!std::is_same<O4, O>::value) {
      if (p.kv_len <= 4) {
        return Flash<O4>::RunRowsTiny(p, op, task, workspace);
      }
    }
    if constexpr (!std::is_same<O8, O>::value) {
      if (p.kv_len <= 8) {
        return Flash<O8>::RunRowsTiny(p, op, task, workspace);
      }
    }
    RunRowsTiny(p, op, task, workspace);
  }

  // ------------------------------------------------------ engine entries

  static bool Supports(const Problem&) { return true; }

  // Zeroes the flash-decoding split counters; additive scores: projects
  // every key (W_k k) and query (W_q q) once per call.
  static void Prepare(const Problem& p, unsigned char* shared) {
    ResetSplitCounters(p, shared);
    if (p.score != QKV_SCORE_ADDITIVE) return;
    const int64_t d = p.head_dim, hidden = p.additive_hidden;
    float* keys = reinterpret_cast<float*>(shared);
    float* queries = reinterpret_cast<float*>(shared + ProjectedKeysBytes(p));
    float* key_row = reinterpret_cast<float*>(
        shared + ProjectedKeysBytes(p) + ProjectedQueriesBytes(p));
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t kvh = 0; kvh < p.kv_heads; ++kvh) {
        if (p.kv_dtype == QKV_DTYPE_F32) {
          const float* k = KeysOf(p, b, kvh);
          for (int64_t j = 0; j < p.kv_len; ++j) {
            RowScores<kDot>(k + j * p.k_st, p.w_k, d, d, hidden, 1.0f,
                            nullptr, keys);
            keys += hidden;
          }
          continue;
        }
        // Low precision: each key row dequantized, then projected.
        const KvSource src = KeySource(p, b, kvh);
        for (int64_t j = 0; j < p.kv_len; ++j) {
          DequantizeRows(src, j, 1, d, key_row);
          RowScores<kDot>(key_row, p.w_k, d, d, hidden, 1.0f, nullptr, keys);
          keys += hidden;
        }
      }
      for (int64_t h = 0; h < p.q_heads; ++h) {
        for (int64_t i = 0; i < p.q_len; ++i) {
          RowScores<kDot>(QueryRow(p, b, h, i), p.w_q, d, d, hidden, 1.0f,
                          nullptr, queries);
          queries += hidden;
        }
      }
    }
  }

  static size_t TileRows() { return 2 * O::Lanes(); }

  // Rows per task: a tile, or a group of them (GroupsTiles).
  static size_t TaskRows(const Problem& p) {
    return GroupsTiles(p) ? static_cast<size_t>(kGroupTiles) * TileRows()
                          : TileRows();
  }

  static size_t NumTasks(const Problem& p) {
    const int64_t g = SplitsPerTask(p);
    if (g > 1) {
      return NumTileTasks(p, TaskRows(p)) *
             static_cast<size_t>((KeySplits(p) + g - 1) / g);
    }
    return SplitTasks(p, TaskRows(p));
  }

  static size_t WorkspacePerWorker(const Problem& p) {
    if (UsesTinyPath(p, O::Lanes())) {
      return LayoutTiny(p, O::Lanes(), nullptr, nullptr);
    }
    if (InterleavesHeads(p)) {
      return static_cast<size_t>(HeadGroup(p)) *
             LayoutRowTile(p, O::Lanes(), nullptr, nullptr);
    }
    const size_t tile = LayoutTile(p, O::Lanes(), nullptr, nullptr);
    return GroupsTiles(p) ? static_cast<size_t>(kGroupTiles) * tile : tile;
  }

  // The path a task takes (pipeline/paths.h): RunTask's one choice. The
  // rules are those of the functions named; their measurements are at those
  // functions and in bench/README.md.
  static PathBit TaskPath(const Problem& p, const Operands& op,
                          const TileTask& t) {
    if (InterleavesHeads(p)) return kPathRowsHeads;
    if (UsesTinyPath(p, O::Lanes())) return kPathTiny;
    if (t.row_path) {
#if defined(__x86_64__) || defined(__i386__)
      if (RowInPhases(p, op, t)) return kPathRowPhases;
      if (RowPipelined(p, t)) return kPathRowPipelined;
#endif
      return kPathRows;
    }
    if (GroupsTiles(p)) return kPathTileGroup;
    if (t.rows > static_cast<int64_t>(O::Lanes())) return kPathTile2;
    // A tile of one row vector: see RunNarrowTile.
    if (p.q_len == 1 && p.group == kRowStateRows && t.r0 == 0 &&
        (op.kind == kDot || op.kind == kDotScaled) && ScoresRows8(op)) {
      return kPathRows8;
    }
    using O8 = typename O::Narrow8;
    if (!std::is_same<O8, O>::value &&
        t.rows <= static_cast<int64_t>(O8::Lanes())) {
      return kPathTileNarrow;
    }
    return kPathTile1;
  }

  static void RunTask(const Problem& p, size_t task,
                      const unsigned char* shared, unsigned char* workspace) {
    const TileTask t = TaskAt(p, task);
    const Operands op = OperandsFor(p, shared, t.b, t.kvh);
    const PathBit path = TaskPath(p, op, t);
    if (path != kPathRows) TracePath(path);  // RunRows says which rows
    switch (path) {
      case kPathRowsHeads:
        RunRowsHeads(p, t, shared, workspace);
        return;
      case kPathTiny:
        RunTiny(p, op, t, workspace);
        return;
      case kPathTileGroup:
        RunTileGroup(p, op, t, workspace);
        return;
      case kPathTileNarrow:
        RunNarrowTile(p, op, t, shared, workspace);
        return;
      default:
        break;
    }
    Tile tile;
    LayoutTile(p, O::Lanes(), workspace, &tile);
    switch (path) {
#if defined(__x86_64__) || defined(__i386__)
      case kPathRowPhases:
        RunRowPhases(p, op, t, shared, tile);
        return;
      case kPathRowPipelined:
        RunRowPipelined(p, op, t, shared, tile);
        return;
#endif
      case kPathRows:
      case kPathRows8:
        RunRows(p, op, t, shared, tile);
        return;
      case kPathTile1:
        RunTile<1>(p, op, t, shared, tile);
        return;
      default:
        RunTile<2>(p, op, t, shared, tile);
        return;
    }
  }

  // A tile of one row vector (TaskPath). A decoding step at GQA 8 (8 rows that
  // see the same keys, dot scores, f32 keys, head_dim whole vectors) on an x86
  // target with full-width transposes takes the row path instead (RunRows:
  // head_dim in lanes, the 8 rows scored together by RowScores8): GQA-8
  // decoding 0.86-0.96x the time of the 8-lane tile below on AVX-512, from L2
  // and from DRAM (Emerald Rapids), 0.95x from DRAM on highway:AVX2 (Zen 4;
  // bench/README.md). Other tiles of at most 8 rows (a short prompt, other
  // score kinds) on a 16-lane target take 8-lane vectors (the tiny path's
  // Narrow8, the same target's AVX2-width code): a 512-bit vector half empty
  // costs a full one, and on Zen 4, whose AVX-512 units are 256 bits wide,
  // twice the 256-bit one (GQA-8 decoding from L2 measured 1.4x slower on
  // highway:AVX3 than on highway:AVX2). Each lane does the same operations at
  // either width, so the bits are the same. The narrower tile's layout is
  // smaller than the full one the workspace was sized for.
  static void RunNarrowTile(const Problem& p, const Operands& op,
                            const TileTask& t, const unsigned char* shared,
                            unsigned char* workspace) {
    using O8 = typename O::Narrow8;
    if constexpr (!std::is_same<O8, O>::value) {
      Tile narrow;
      LayoutTile(p, O8::Lanes(), workspace, &narrow);
      Flash<O8>::template RunTile<1>(p, op, t, shared, narrow);
    } else {
      (void)p, (void)op, (void)t, (void)shared, (void)workspace;
    }
  }

  // --------------------------------------- building blocks, for tests

  static void BlockExp(const float* x, float* y, size_t n) {
    const size_t N = O::Lanes();
    alignas(64) float tail[kMaxLanes];
    size_t i = 0;
    for (; i + N <= n; i += N) {
      O::StoreU(ExpNonPositive(O::LoadU(x + i)), y + i);
    }
    if (i < n) {
      for (size_t u = 0; u < N; ++u) tail[u] = i + u < n ? x[i + u] : 0.0f;
      O::Store(ExpNonPositive(O::Load(tail)), tail);
      for (size_t u = 0; i + u < n; ++u) y[i + u] = tail[u];
    }
  }

  static void BlockTanh(const float* x, float* y, size_t n) {
    const size_t N = O::Lanes();
    alignas(64) float tail[kMaxLanes];
    size_t i = 0;
    for (; i + N <= n; i += N) O::StoreU(SoftcapTanh(O::LoadU(x + i)), y + i);
    if (i < n) {
      for (size_t u = 0; u < N; ++u) tail[u] = i + u < n ? x[i + u] : 0.0f;
      O::Store(SoftcapTanh(O::Load(tail)), tail);
      for (size_t u = 0; i + u < n; ++u) y[i + u] = tail[u];
    }
  }

  static void BlockTranspose(float* m) {
    if constexpr (O::kTransposeLanes != 0) {
      constexpr size_t kN = O::kTransposeLanes;
      V blk[kN];
      for (size_t i = 0; i < kN; ++i) blk[i] = O::LoadU(m + i * kN);
      O::Transpose(blk);
      for (size_t i = 0; i < kN; ++i) O::StoreU(blk[i], m + i * kN);
    } else {
      (void)m;
    }
  }

  static void BlockSumLanes(const float* m, float* sums) {
    if constexpr (O::kTransposeLanes != 0) {
      constexpr size_t kN = O::kTransposeLanes;
      V blk[kN];
      for (size_t i = 0; i < kN; ++i) blk[i] = O::LoadU(m + i * kN);
      O::StoreU(O::SumLanes(blk), sums);
    } else {
      (void)m, (void)sums;
    }
  }

  static void BlockSumLanes4(const float* m, float* sums, float* reduced) {
    const size_t N = O::Lanes();
    const V a = O::LoadU(m), b = O::LoadU(m + N), c = O::LoadU(m + 2 * N),
            d = O::LoadU(m + 3 * N);
    O::SumLanes4(a, b, c, d, sums);
    reduced[0] = O::ReduceSum(a);
    reduced[1] = O::ReduceSum(b);
    reduced[2] = O::ReduceSum(c);
    reduced[3] = O::ReduceSum(d);
  }

  static void BlockEpilogue(const int32_t* lo, const int32_t* hi,
                            const float* const* bias, int64_t rows, int rv,
                            int64_t kv_len, int64_t j0, int64_t nb,
                            float* st) {
    alignas(64) int32_t lo_buf[2 * kMaxLanes], hi_buf[2 * kMaxLanes];
    alignas(64) float rel_lo[2 * kMaxLanes] = {}, rel_hi[2 * kMaxLanes] = {};
    const float* bias_buf[2 * kMaxLanes];
    const size_t R = static_cast<size_t>(rv) * O::Lanes();
    RowsSpan span;
    span.begin = kv_len;
    span.end = 0;
    span.full_begin = 0;
    span.full_end = kv_len;
    bool any_bias = false;
    for (size_t r = 0; r < R; ++r) {
      const bool real = static_cast<int64_t>(r) < rows;
      lo_buf[r] = real ? lo[r] : 0;
      hi_buf[r] = real ? hi[r] : 0;
      bias_buf[r] = real ? bias[r] : nullptr;
      any_bias = any_bias || bias_buf[r] != nullptr;
      if (real) span.Add(KeyInterval{lo[r], hi[r]});
    }
    Tile tile = {};
    tile.lo = lo_buf;
    tile.hi = hi_buf;
    tile.rel_lo = rel_lo;
    tile.rel_hi = rel_hi;
    tile.bias = bias_buf;
    const bool masks = span.Masks(j0, nb);
    EpilogueTerms terms;
    terms.softcap = 0.0f;
    terms.bias = any_bias;
    terms.alibi = false;
    if (rv == 1) {
      Epilogue<1>(tile, rows, R, j0, nb, terms, masks, st);
    } else {
      Epilogue<2>(tile, rows, R, j0, nb, terms, masks, st);
    }
  }

  static void BlockFinishRow(const Problem& p, int64_t row, float m, float l,
                             const float* o, size_t stride, int64_t c_begin,
                             int64_t w_lo, int64_t w_hi) {
    alignas(64) float tail[kMaxLanes];
    RowState s;
    s.row = row;
    s.out = p.out + row * p.value_dim;  // the tests' dense layout
    s.m = m;
    s.l = l;
    s.sink = -INFINITY;
    s.o = o;
    s.o_stride = stride;
    s.c_begin = c_begin;
    s.w_lo = w_lo;
    s.w_hi = w_hi;
    FinishRow(p, s, tail);
  }

  static size_t LanesOf() { return O::Lanes(); }

  // Scratch for a vector of any target (SVE up to 2048 bits).
  static constexpr size_t kMaxLanes = 64;

  static constexpr PipelineBlocks kBlocks = {
      &LanesOf,       O::kTransposeLanes, &BlockExp,      &BlockTranspose,
      &BlockEpilogue, &BlockFinishRow,    &BlockTanh,     &BlockSumLanes,
      &BlockSumLanes4};

  static constexpr Engine MakeEngine(const char* name) {
    return Engine{name,           &Supports,           &NumTasks,
                  &SharedWorkspace, &WorkspacePerWorker, &Prepare,
                  &RunTask};
  }
};

#undef QKV_UNROLL8
#undef QKV_FLASH_INLINE

}  // namespace QKV_SIMD_NAMESPACE
}  // namespace qkv
#ifdef HWY_AFTER_NAMESPACE
HWY_AFTER_NAMESPACE();
#endif

#endif  // per-target include guard
