// The xsimd engine: FlashAttention-style f32 attention written against xsimd
// 8.1 (Debian's libxsimd-dev), a peer of src/highway/attention_hwy.cc with
// the same algorithm, tiling (src/tiling.h) and numerical behaviour. This file
// is compiled once per architecture: each attention_xsimd_<arch>.cc includes
// it with that architecture's compiler flags and instantiates
// Attention<Arch, ...> once (xsimd's model: functors templated on Arch).
// Everything here is in an anonymous namespace, so the copies compiled with
// different flags never meet at link time (out-of-line copies of tiling.h's
// inline functions can, in unoptimized builds: see engines.cc on link order).
//
// Layout trick (as in the Highway engine): query rows live in vector lanes. A
// task owns a tile of R = 2 * lanes rows of one (batch, kv head): the query
// rows of every query head that shares that kv head (GQA), so the group reads
// each K/V row once. Q is packed transposed and pre-scaled (qt[t][r]); a
// score is st[j][r] = sum_t qt[t][r] * k[j][t], a broadcast of k[j][t] times
// a vector of rows, and out is accumulated transposed as
// ot[c][r] += p[j][r] * v[j][c]. K and V are read in their natural layout,
// every softmax step is lane-wise, masks are per-lane key limits, and keys go
// in blocks of kBlockKeys with one online-softmax rescale per block. Blocks
// past every row's limit are never computed; blocks before every row's limit
// skip the mask. A (batch, kv head) with at most kRowPathMaxRows rows
// (decoding) takes the row path instead, keys in lanes, its keys split into
// tasks of kSplitKeys (flash-decoding) merged in split order (tiling.h).
//
// exp is ExpNonPositive below (max error 1.03 ulp on [-87, 0], 0 below -87);
// tanh (additive scores) is xsimd::tanh (from Boost.SIMD: a polynomial for
// |x| < 5/8, 1 - 2 / (1 + exp(2|x|)) beyond), where Highway uses its own
// hn::Tanh; both stay far inside the weights bound (tests/cross_engine_test).
#ifndef QKV_SRC_XSIMD_ATTENTION_XSIMD_INL_H_
#define QKV_SRC_XSIMD_ATTENTION_XSIMD_INL_H_

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "engine.h"
#include "tiling.h"
#include <xsimd/xsimd.hpp>

namespace qkv {
namespace xsimd_engine {
namespace {

// In-register square transposes (src/transpose_x86.h) for the architecture
// this file is compiled for: 16 x 16 with AVX-512, 8 x 8 with AVX2.
#undef QKV_TRANSPOSE_BITS
#if defined(__AVX512F__)
#define QKV_TRANSPOSE_BITS 512
#include "transpose_x86.h"
#elif defined(__AVX2__)
#define QKV_TRANSPOSE_BITS 256
#include "transpose_x86.h"
#endif

// Accumulators are named variables (macro-unrolled), not arrays, so they are
// sure to stay in registers. Lanes u >= U of an unroll are compiled away.
#define QKV_XS_UNROLL8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

// A: the xsimd architecture. kUnroll: keys (scores) or value columns
// (output) per register tile, 8 on targets with 32 vector registers
// (AVX-512, AArch64 NEON), 4 on the 16-register ones. kGather: the target
// has a hardware gather (AVX2, AVX-512); elsewhere a full tile is transposed
// with scalar code, which is what xsimd's generic gather does anyway.
template <class A, int kUnroll, bool kGather>
struct Attention {
  using VF = xsimd::batch<float, A>;
  using VI = xsimd::batch<int32_t, A>;
  // Q packing and the output's unpacking use whole N x N in-register
  // transposes where this file has one for A's width.
#if QKV_TRANSPOSE_BITS == 512
  static constexpr bool kTranspose = std::is_same<A, xsimd::avx512f>::value;
#elif QKV_TRANSPOSE_BITS == 256
  static constexpr bool kTranspose =
      std::is_same<A, xsimd::fma3<xsimd::avx2>>::value;
#else
  static constexpr bool kTranspose = false;
#endif
  static constexpr size_t N = VF::size;

  static size_t TileRows() { return 2 * N; }

  static VF Load(const float* p) { return VF::load_aligned(p); }
  static VF LoadU(const float* p) { return VF::load_unaligned(p); }
  static void Store(const VF& v, float* p) { v.store_aligned(p); }
  static void StoreU(const VF& v, float* p) { v.store_unaligned(p); }
  static VF Zero() { return VF(0.0f); }

  // x * y + z, fused where the target has FMA. xsimd 8.1 has no avx512f
  // kernel for fma (its generic one multiplies, then adds), so AVX-512 calls
  // the intrinsic; elsewhere xsimd::fma is fused (fma3<avx2>, NEON VFPv4) or
  // a multiply then an add (sse4_2, like Highway's SSE4 target).
  static VF MulAdd(const VF& x, const VF& y, const VF& z) {
#if defined(__AVX512F__)
    if constexpr (std::is_same<A, xsimd::avx512f>::value) {
      return VF(_mm512_fmadd_ps(x, y, z));
    }
#endif
#if defined(__FMA__) && (defined(__x86_64__) || defined(__i386__))
    // sse4_2 vectors inside an FMA-capable object: the tiny path's 4-lane
    // vectors in the AVX2 and AVX-512 engines (the sse4.2 engine itself is
    // compiled without FMA and multiplies, then adds).
    if constexpr (std::is_same<A, xsimd::sse4_2>::value) {
      return VF(_mm_fmadd_ps(x, y, z));
    }
#endif
    return xsimd::fma(x, y, z);
  }

  // exp(x) for the arguments softmax has here: x <= 0, or -inf. Results
  // below FLT_MIN (x < -87) are flushed to 0: those terms are under 1e-38 of
  // the row's largest weight, far below the accuracy bound, and flushing
  // keeps every intermediate normal (x86 takes a microcode assist on
  // subnormals). Method: x = n ln2 + r with n = round(x / ln2) in [-126, 0],
  // rounded by adding 1.5 * 2^23 (n lands in the low mantissa bits, which
  // also give the exponent of 2^n), |r| <= ln2/2 with ln2 in two parts (r
  // exact to ~1e-10), then exp(r) by a degree-6 polynomial fitted for least
  // maximum relative error on [-ln2/2, ln2/2] (2e-9; bench/exp_fit.py). Max
  // error 1.03 ulp on [-87, 0] with FMA. Same constants and operation order
  // as the Highway engine's.
  static VF ExpNonPositive(const VF& x) {
    const VF lowest(-87.0f);
    const VF round(12582912.0f);  // 1.5 * 2^23
    const VF xc = xsimd::max(x, lowest);
    const VF t = MulAdd(xc, VF(1.44269504088896341f), round);
    const VF nf = t - round;
    VF r = MulAdd(nf, VF(-0.693145751953125f), xc);
    r = MulAdd(nf, VF(-1.428606765330187045e-6f), r);
    VF poly(0.0013843622291460633f);
    poly = MulAdd(poly, r, VF(0.0083741797134280205f));
    poly = MulAdd(poly, r, VF(0.041668005287647247f));
    poly = MulAdd(poly, r, VF(0.16666430234909058f));
    poly = MulAdd(poly, r, VF(0.49999994039535522f));
    poly = MulAdd(poly, r, VF(1.0f));
    poly = MulAdd(poly, r, VF(1.0f));
    // The low bits of t hold n (two's complement); shifted to the exponent
    // field they give n, and the bias makes 2^n.
    const VF scale = xsimd::bitwise_cast<VF>(
        (xsimd::bitwise_cast<VI>(t) << 23) + VI(127 << 23));
    return xsimd::select(x < lowest, Zero(), poly * scale);
  }

  // ------------------------------------------------------------ tile path

  // st[j][*] for keys j < U of the block starting at k. RV row vectors
  // (R = RV * N lanes); Gaussian scores are finished by the factor -scale,
  // kDotScaled ones by scale.
  template <int RV, int U, int kKind>
  __attribute__((noinline)) static void ScoreKeys(
      const float* __restrict qt, size_t R, const float* __restrict k,
      int64_t d, float finish_scale, const float* __restrict w_v,
      float* __restrict st) {
    const VF finish(finish_scale);
    constexpr bool kGauss = kKind == kGaussian;
    constexpr bool kFinish = kGauss || kKind == kDotScaled;
    (void)w_v;
#define QKV_DECL(u)                                         \
  const float* __restrict k##u = k + (u < U ? u : 0) * d;   \
  VF a##u##0 = Zero(), a##u##1 = Zero();
    QKV_XS_UNROLL8(QKV_DECL)
#undef QKV_DECL
    for (int64_t t = 0; t < d; ++t) {
      const VF q0 = Load(qt + t * R);
      const VF q1 = RV > 1 ? Load(qt + t * R + N) : q0;
      const VF w = kKind == kAdditive ? VF(w_v[t]) : q0;
#define QKV_STEP(u)                                                        \
  if (u < U) {                                                             \
    const VF b(k##u[t]);                                                   \
    if (kKind == kAdditive) {                                              \
      a##u##0 = MulAdd(w, xsimd::tanh(q0 + b), a##u##0);               \
      if (RV > 1) a##u##1 = MulAdd(w, xsimd::tanh(q1 + b), a##u##1);   \
    } else if (kGauss) {                                                   \
      const VF e0 = q0 - b;                                                \
      a##u##0 = MulAdd(e0, e0, a##u##0);                               \
      if (RV > 1) {                                                        \
        const VF e1 = q1 - b;                                              \
        a##u##1 = MulAdd(e1, e1, a##u##1);                             \
      }                                                                    \
    } else {                                                               \
      a##u##0 = MulAdd(q0, b, a##u##0);                                \
      if (RV > 1) a##u##1 = MulAdd(q1, b, a##u##1);                    \
    }                                                                      \
  }
      QKV_XS_UNROLL8(QKV_STEP)
#undef QKV_STEP
    }
#define QKV_STORE(u)                    \
  if (u < U) {                          \
    VF s0 = a##u##0, s1 = a##u##1;      \
    if (kFinish) {                      \
      s0 = s0 * finish;                 \
      s1 = s1 * finish;                 \
    }                                   \
    Store(s0, st + u * R);              \
    if (RV > 1) Store(s1, st + u * R + N); \
  }
    QKV_XS_UNROLL8(QKV_STORE)
#undef QKV_STORE
  }

  template <int RV, int kKind>
  static void Scores(const float* __restrict qt, size_t R,
                     const float* __restrict k, int64_t d, int64_t nb,
                     float finish_scale, const float* __restrict w_v,
                     float* __restrict st, PrefetchStream* pf) {
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
  __attribute__((noinline)) static void OutputColumns(
      const float* __restrict pt, size_t R, const float* __restrict v,
      int64_t dv, int64_t nb, VF alpha0, VF alpha1, float* __restrict ot) {
    const VF zero = Zero();
#define QKV_DECL(u)                                            \
  VF o##u##0 = Zero(), o##u##1 = Zero();                       \
  if (u < U) {                                                 \
    o##u##0 = Load(ot + u * R) * alpha0;                       \
    if (RV > 1) o##u##1 = Load(ot + u * R + N) * alpha1;       \
  }
    QKV_XS_UNROLL8(QKV_DECL)
#undef QKV_DECL
    for (int64_t j = 0; j < nb; ++j) {
      const float* __restrict vj = v + j * dv;
      const VF p0 = Load(pt + j * R);
      const VF p1 = RV > 1 ? Load(pt + j * R + N) : p0;
      const auto read0 = p0 > zero;
      const auto read1 = p1 > zero;
#define QKV_STEP(u)                                                         \
  if (u < U) {                                                              \
    const VF b(vj[u]);                                                      \
    if (kGuard) {                                                           \
      o##u##0 = xsimd::select(read0, MulAdd(p0, b, o##u##0), o##u##0);  \
      if (RV > 1) {                                                         \
        o##u##1 =                                                           \
            xsimd::select(read1, MulAdd(p1, b, o##u##1), o##u##1);      \
      }                                                                     \
    } else {                                                                \
      o##u##0 = MulAdd(p0, b, o##u##0);                                 \
      if (RV > 1) o##u##1 = MulAdd(p1, b, o##u##1);                     \
    }                                                                       \
  }
      QKV_XS_UNROLL8(QKV_STEP)
#undef QKV_STEP
    }
#define QKV_STORE(u)                         \
  if (u < U) {                               \
    Store(o##u##0, ot + u * R);              \
    if (RV > 1) Store(o##u##1, ot + u * R + N); \
  }
    QKV_XS_UNROLL8(QKV_STORE)
#undef QKV_STORE
  }

  template <int RV, bool kGuard>
  static void AccumulateOutput(const float* __restrict pt, size_t R,
                               const float* __restrict v, int64_t dv,
                               int64_t nb, VF alpha0, VF alpha1,
                               float* __restrict ot, PrefetchStream* pf) {
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
  // probabilities relative to the new max and sets alpha to the factor
  // exp(m_old - m_new) by which earlier sums and outputs scale. The row
  // vectors are done together and the max and sum run in two chains each
  // (one dependent chain per vector made this step latency-bound).
  template <int RV>
  static void SoftmaxBlock(float* __restrict st, size_t R, int64_t nb,
                           VF* m0, VF* l0, VF* alpha0, VF* m1, VF* l1,
                           VF* alpha1) {
    const VF neg_inf(-INFINITY);
    VF max0a = neg_inf, max0b = neg_inf, max1a = neg_inf, max1b = neg_inf;
    int64_t j = 0;
    for (; j + 2 <= nb; j += 2) {
      max0a = xsimd::max(max0a, Load(st + j * R));
      max0b = xsimd::max(max0b, Load(st + (j + 1) * R));
      if (RV > 1) {
        max1a = xsimd::max(max1a, Load(st + j * R + N));
        max1b = xsimd::max(max1b, Load(st + (j + 1) * R + N));
      }
    }
    if (j < nb) {
      max0a = xsimd::max(max0a, Load(st + j * R));
      if (RV > 1) max1a = xsimd::max(max1a, Load(st + j * R + N));
    }
    // A lane that has seen no visible key keeps max -inf; exponentiate its
    // (-inf) scores against 0 so they give 0, not NaN.
    const VF new0 = xsimd::max(*m0, xsimd::max(max0a, max0b));
    const VF use0 = xsimd::select(new0 == neg_inf, Zero(), new0);
    *alpha0 = ExpNonPositive(*m0 - use0);
    *m0 = new0;
    VF use1 = use0;
    if (RV > 1) {
      const VF new1 = xsimd::max(*m1, xsimd::max(max1a, max1b));
      use1 = xsimd::select(new1 == neg_inf, Zero(), new1);
      *alpha1 = ExpNonPositive(*m1 - use1);
      *m1 = new1;
    }
    VF sum0a = Zero(), sum0b = Zero(), sum1a = Zero(), sum1b = Zero();
    j = 0;
    for (; j + 2 <= nb; j += 2) {
      float* s = st + j * R;
      const VF p0a = ExpNonPositive(Load(s) - use0);
      const VF p0b = ExpNonPositive(Load(s + R) - use0);
      Store(p0a, s);
      Store(p0b, s + R);
      sum0a = sum0a + p0a;
      sum0b = sum0b + p0b;
      if (RV > 1) {
        const VF p1a = ExpNonPositive(Load(s + N) - use1);
        const VF p1b = ExpNonPositive(Load(s + R + N) - use1);
        Store(p1a, s + N);
        Store(p1b, s + R + N);
        sum1a = sum1a + p1a;
        sum1b = sum1b + p1b;
      }
    }
    if (j < nb) {
      float* s = st + j * R;
      const VF p0 = ExpNonPositive(Load(s) - use0);
      Store(p0, s);
      sum0a = sum0a + p0;
      if (RV > 1) {
        const VF p1 = ExpNonPositive(Load(s + N) - use1);
        Store(p1, s + N);
        sum1a = sum1a + p1;
      }
    }
    *l0 = MulAdd(*l0, *alpha0, sum0a + sum0b);
    if (RV > 1) *l1 = MulAdd(*l1, *alpha1, sum1a + sum1b);
  }

  // w[j] = exp(w[j] - m) * inv_l for j < n, in place.
  static void NormalizeWeights(float* __restrict w, int64_t n, float m,
                               float inv_l, float* __restrict tail) {
    const int64_t lanes = static_cast<int64_t>(N);
    const VF vm(m), vs(inv_l);
    int64_t j = 0;
    for (; j + lanes <= n; j += lanes) {
      StoreU(ExpNonPositive(LoadU(w + j) - vm) * vs, w + j);
    }
    if (j < n) {  // never touch memory past the row: go through a scratch
      const size_t rest = static_cast<size_t>(n - j);
      for (int64_t u = 0; u < lanes; ++u) tail[u] = -INFINITY;
      memcpy(tail, w + j, rest * sizeof(float));
      Store(ExpNonPositive(Load(tail) - vm) * vs, tail);
      memcpy(w + j, tail, rest * sizeof(float));
    }
  }

  // v[i] = row i in, column i out, for an N x N block (kTranspose only).
  static void TransposeBlock(VF* v) {
    if constexpr (kTranspose) {
      typename VF::register_type raw[N];
      for (size_t i = 0; i < N; ++i) raw[i] = v[i];
      TransposeRegisters(raw);
      for (size_t i = 0; i < N; ++i) v[i] = VF(raw[i]);
    }
  }

  // qt[t][*] for a full tile: its rows are consecutive rows of q (the
  // group's heads are adjacent), so column t of the tile is a strided
  // gather; whole N x N blocks go through in-register transposes instead
  // where there are some.
  template <int RV>
  static void GatherQueries(const Operands& op, const float* q, size_t R,
                            const Tile& tile) {
    const int64_t d = op.dim;
    alignas(64) int32_t offsets[N];
    for (size_t u = 0; u < N; ++u) offsets[u] = static_cast<int32_t>(u * d);
    const VI idx = VI::load_aligned(offsets);
    const VF scale(op.q_scale);
    int64_t t = 0;
    if constexpr (kTranspose) {
      VF blk[N];
      for (; t + static_cast<int64_t>(N) <= d; t += N) {
        for (size_t h = 0; h < static_cast<size_t>(RV); ++h) {
          for (size_t i = 0; i < N; ++i) {
            blk[i] = LoadU(q + (h * N + i) * d + t);
          }
          TransposeBlock(blk);
          for (size_t i = 0; i < N; ++i) {
            Store(blk[i] * scale, tile.qt + (t + i) * R + h * N);
          }
        }
      }
    }
    for (; t < d; ++t) {
      Store(VF::gather(q + t, idx) * scale, tile.qt + t * R);
      if (RV > 1) {
        Store(VF::gather(q + N * d + t, idx) * scale, tile.qt + t * R + N);
      }
    }
  }

  template <int RV>
  static void RunTile(const Problem& p, const Operands& op, int64_t b,
                      int64_t kvh, int64_t r0, int64_t rows,
                      const Tile& tile) {
    const size_t R = RV * N;
    const int64_t d = op.dim, dv = p.value_dim, lk = p.kv_len;

    int64_t min_limit, max_limit;
    SetUpTileRows(p, b, kvh, r0, rows, R, tile, &min_limit, &max_limit);
    if (kGather && rows == static_cast<int64_t>(R) &&
        static_cast<int64_t>(R) * d < (int64_t{1} << 30)) {
      GatherQueries<RV>(op, op.q + tile.row[0] * d, R, tile);
    } else {
      PackQueriesScalar(op, rows, R, tile);
    }

    const float* k = op.k;
    const float* v = p.v + (b * p.kv_heads + kvh) * lk * dv;
    const VF neg_inf(-INFINITY);
    VF m0 = neg_inf, m1 = neg_inf;
    VF l0 = Zero(), l1 = Zero();
    const VI limit0 = VI::load_aligned(tile.limit);
    const VI limit1 = RV > 1 ? VI::load_aligned(tile.limit + N) : limit0;
    const bool prefetch = PrefetchesKv(p);

    for (int64_t j0 = 0; j0 < max_limit; j0 += kBlockKeys) {
      const int64_t nb =
          j0 + kBlockKeys < max_limit ? kBlockKeys : max_limit - j0;
      float* st = tile.st;
      BlockPrefetch pf(prefetch, k, d, v, dv, j0, nb, max_limit, nb / kUnroll,
                       dv / kUnroll);
      if (op.kind == kAdditive) {
        Scores<RV, kAdditive>(tile.qt, R, k + j0 * d, d, nb, 1.0f, p.w_v, st,
                              &pf.v);
      } else if (op.kind == kGaussian) {
        Scores<RV, kGaussian>(tile.qt, R, k + j0 * d, d, nb, op.finish,
                              p.w_v, st, &pf.v);
      } else if (op.kind == kDotScaled) {
        Scores<RV, kDotScaled>(tile.qt, R, k + j0 * d, d, nb, op.finish,
                               p.w_v, st, &pf.v);
      } else {
        Scores<RV, kDot>(tile.qt, R, k + j0 * d, d, nb, 1.0f, p.w_v, st,
                         &pf.v);
      }
      if (p.bias != nullptr) {
        for (int64_t r = 0; r < rows; ++r) {
          AddBias(tile.bias[r], j0, nb, R, st + r);
        }
      }
      const bool hides = j0 + nb > min_limit;
      if (hides) {  // some row's limit falls inside this block
        // Limits relative to the block, clamped to [0, kBlockKeys]: small
        // integers, exact in float, so key j < limit is a float compare.
        const VI lo(0), hi(static_cast<int32_t>(kBlockKeys));
        const VI base(static_cast<int32_t>(j0));
        const VF rel0 =
            xsimd::to_float(xsimd::min(xsimd::max(limit0 - base, lo), hi));
        const VF rel1 =
            xsimd::to_float(xsimd::min(xsimd::max(limit1 - base, lo), hi));
        for (int64_t j = 0; j < nb; ++j) {
          const VF key(static_cast<float>(j));
          float* s = st + j * R;
          Store(xsimd::select(key < rel0, Load(s), neg_inf), s);
          if (RV > 1) Store(xsimd::select(key < rel1, Load(s + N), neg_inf), s + N);
        }
      }
      if (p.weights != nullptr) {  // raw masked scores; normalized at the end
        for (int64_t r = 0; r < rows; ++r) {
          float* w = p.weights + tile.row[r] * lk + j0;
          for (int64_t j = 0; j < nb; ++j) w[j] = st[j * R + r];
        }
      }
      VF alpha0, alpha1 = Zero();
      SoftmaxBlock<RV>(st, R, nb, &m0, &l0, &alpha0, &m1, &l1, &alpha1);
      if (RV == 1) alpha1 = alpha0;
      if (hides || p.bias != nullptr) {
        AccumulateOutput<RV, true>(st, R, v + j0 * dv, dv, nb, alpha0, alpha1,
                                   tile.ot, &pf.k);
      } else {
        AccumulateOutput<RV, false>(st, R, v + j0 * dv, dv, nb, alpha0,
                                    alpha1, tile.ot, &pf.k);
      }
    }

    // Finish: out = ot / l, lse = m + log(l); rows that saw no key get zeros.
    Store(m0, tile.m);
    Store(l0, tile.sum);
    if (RV > 1) {
      Store(m1, tile.m + N);
      Store(l1, tile.sum + N);
    }
    for (int64_t r = 0; r < rows; ++r) {
      tile.inv_l[r] = tile.sum[r] > 0.0f ? 1.0f / tile.sum[r] : 0.0f;
    }
    // out[r][c] = ot[c][r] / l: whole N x N blocks of (columns, rows) by
    // in-register transposes where there are some (a row that saw no key
    // gets ot * 0 there and is zeroed whole below), the rest by gathers or
    // scalar code.
    int64_t c_done = 0;
    if constexpr (kTranspose) {
      VF blk[N];
      for (; c_done + static_cast<int64_t>(N) <= dv; c_done += N) {
        for (size_t h = 0; h < static_cast<size_t>(RV); ++h) {
          if (static_cast<int64_t>(h * N) >= rows) break;
          for (size_t i = 0; i < N; ++i) {
            blk[i] = Load(tile.ot + (c_done + i) * R + h * N);
          }
          TransposeBlock(blk);
          for (size_t i = 0; i < N; ++i) {
            const int64_t r = static_cast<int64_t>(h * N + i);
            if (r >= rows) break;
            StoreU(blk[i] * VF(tile.inv_l[r]),
                   p.out + tile.row[r] * dv + c_done);
          }
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float l = tile.sum[r];
      const bool seen = l > 0.0f;
      const float inv_l = tile.inv_l[r];
      float* out = p.out + tile.row[r] * dv;
      if (seen) {
        int64_t c = c_done;
        if (kGather) {  // out[r][c] = ot[c][r] / l: a vector of columns
          alignas(64) int32_t offsets[N];
          for (size_t u = 0; u < N; ++u) {
            offsets[u] = static_cast<int32_t>(u * R);
          }
          const VI idx = VI::load_aligned(offsets);
          const VF v_inv_l(inv_l);
          for (; c + static_cast<int64_t>(N) <= dv; c += N) {
            StoreU(VF::gather(tile.ot + c * R + r, idx) * v_inv_l, out + c);
          }
        }
        for (; c < dv; ++c) out[c] = tile.ot[c * R + r] * inv_l;
      } else {
        for (int64_t c = 0; c < dv; ++c) out[c] = 0.0f;
      }
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

  // ------------------------------------------------------------- row path

  // One query row against nb keys: st[j] = finish * sum_t f(q[t], k_j[t]),
  // keys processed four at a time for independent FMA chains, d in lanes.
  // Also projects for kAdditive (q a key or query, k the rows of W).
  template <int kKind>
  static VF RowStep(const VF& qv, const VF& kv, const VF& wv, const VF& acc) {
    if (kKind == kAdditive) return MulAdd(wv, xsimd::tanh(qv + kv), acc);
    if (kKind == kGaussian) {
      const VF e = qv - kv;
      return MulAdd(e, e, acc);
    }
    return MulAdd(qv, kv, acc);
  }

  template <int kKind>
  static float RowTail(const float* q, const float* kr, const float* w_v,
                       int64_t t0, int64_t d) {
    float s = 0.0f;
    for (int64_t t = t0; t < d; ++t) {
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
  }

  template <int kKind>
  __attribute__((noinline)) static void RowScores(
      const float* __restrict q, const float* __restrict k, int64_t d,
      int64_t nb, float finish, const float* __restrict w_v,
      float* __restrict st, BlockPrefetch* pf = nullptr) {
    const int64_t lanes = static_cast<int64_t>(N);
    const int64_t d_full = d - d % lanes;
    auto weight = [&](int64_t t) {
      return kKind == kAdditive ? LoadU(w_v + t) : Zero();
    };
    int64_t j = 0;
    if (d_full == 0) {  // vectors shorter than one SIMD vector: plain loops
      for (; j < nb; ++j) st[j] = RowTail<kKind>(q, k + j * d, w_v, 0, d) * finish;
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
      VF a0 = Zero(), a1 = Zero(), a2 = Zero(), a3 = Zero();
      for (int64_t t = 0; t < d_full; t += lanes) {
        const VF qv = LoadU(q + t);
        const VF wv = weight(t);
        a0 = RowStep<kKind>(qv, LoadU(k0 + t), wv, a0);
        a1 = RowStep<kKind>(qv, LoadU(k1 + t), wv, a1);
        a2 = RowStep<kKind>(qv, LoadU(k2 + t), wv, a2);
        a3 = RowStep<kKind>(qv, LoadU(k3 + t), wv, a3);
      }
      st[j + 0] = (xsimd::hadd(a0) + RowTail<kKind>(q, k0, w_v, d_full, d)) * finish;
      st[j + 1] = (xsimd::hadd(a1) + RowTail<kKind>(q, k1, w_v, d_full, d)) * finish;
      st[j + 2] = (xsimd::hadd(a2) + RowTail<kKind>(q, k2, w_v, d_full, d)) * finish;
      st[j + 3] = (xsimd::hadd(a3) + RowTail<kKind>(q, k3, w_v, d_full, d)) * finish;
    }
    for (; j < nb; ++j) {
      const float* k0 = k + j * d;
      VF a0 = Zero();
      for (int64_t t = 0; t < d_full; t += lanes) {
        a0 = RowStep<kKind>(LoadU(q + t), LoadU(k0 + t), weight(t), a0);
      }
      st[j] = (xsimd::hadd(a0) + RowTail<kKind>(q, k0, w_v, d_full, d)) * finish;
    }
  }

  // Online softmax of one row's block: st[0, nb) becomes probabilities
  // relative to the new running max; returns the rescale factor of the old
  // sum and output. st has room for nb rounded up to whole vectors.
  static float RowSoftmaxBlock(float* __restrict st, int64_t nb, float* m,
                               float* l, float* __restrict tail) {
    const int64_t lanes = static_cast<int64_t>(N);
    const int64_t padded = (nb + lanes - 1) / lanes * lanes;
    for (int64_t j = nb; j < padded; ++j) st[j] = -INFINITY;
    VF vmax(-INFINITY);
    for (int64_t j = 0; j < padded; j += lanes) {
      vmax = xsimd::max(vmax, Load(st + j));
    }
    // xsimd 8.1 has no max reduction: finish it in scalar code.
    Store(vmax, tail);
    float block_max = tail[0];
    for (int64_t u = 1; u < lanes; ++u) {
      block_max = tail[u] > block_max ? tail[u] : block_max;
    }
    const float m_new = *m > block_max ? *m : block_max;
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    const VF vm(m_use);
    const float alpha = ExpNonPositive(VF(*m - m_use)).get(0);
    VF vsum = Zero();
    for (int64_t j = 0; j < padded; j += lanes) {
      const VF e = ExpNonPositive(Load(st + j) - vm);
      Store(e, st + j);
      vsum = vsum + e;
    }
    *m = m_new;
    *l = *l * alpha + xsimd::hadd(vsum);
    return alpha;
  }

  // o[c] = o[c] * alpha + sum_{j < nb} p[j] v_j[c] for U vectors of columns.
  template <int U>
  __attribute__((noinline)) static void RowOutputColumns(
      const float* __restrict pr, const float* __restrict v, int64_t dv,
      int64_t nb, float alpha, float* __restrict o) {
    const VF va(alpha);
#define QKV_DECL(u) \
  VF o##u = Zero(); \
  if (u < U) o##u = LoadU(o + u * N) * va;
    QKV_XS_UNROLL8(QKV_DECL)
#undef QKV_DECL
    for (int64_t j = 0; j < nb; ++j) {
      if (pr[j] == 0.0f) continue;  // a hidden key's value is never read
      const VF b(pr[j]);
      const float* __restrict vj = v + j * dv;
#define QKV_STEP(u) \
  if (u < U) o##u = MulAdd(b, LoadU(vj + u * N), o##u);
      QKV_XS_UNROLL8(QKV_STEP)
#undef QKV_STEP
    }
#define QKV_STORE(u) \
  if (u < U) StoreU(o##u, o + u * N);
    QKV_XS_UNROLL8(QKV_STORE)
#undef QKV_STORE
  }

  static void RowOutput(const float* __restrict pr, const float* __restrict v,
                        int64_t dv, int64_t nb, float alpha,
                        float* __restrict o) {
    const int64_t lanes = static_cast<int64_t>(N);
    int64_t c = 0;
    for (; c + 8 * lanes <= dv; c += 8 * lanes) {
      RowOutputColumns<8>(pr, v + c, dv, nb, alpha, o + c);
    }
    for (; c + lanes <= dv; c += lanes) {
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

  // Flash-decoding: stores this split's (max, sum, output) per row; the
  // split that completes the set merges all of them, in split order, into
  // tile.m, tile.sum and tile.o_rows and returns true. Others return false.

  // All rows (at most kRowPathMaxRows) of one (batch, kv head), keys
  // [task.key_begin, task.key_end) of them (one flash-decoding split). Keys
  // are walked in blocks; each block of K and V is read from memory once and
  // reused from L1 by the group's other rows.
  static void RunRows(const Problem& p, const Operands& op,
                      const TileTask& task, const unsigned char* shared,
                      const Tile& tile) {
    const int64_t b = task.b, kvh = task.kvh, rows = task.rows;
    const int64_t d = op.dim, dv = p.value_dim, lk = p.kv_len;
    const int64_t max_limit = SetUpRowPath(p, op, b, kvh, rows, tile);
    const int64_t stop = max_limit < task.key_end ? max_limit : task.key_end;
    const float* k = op.k;
    const float* v = p.v + (b * p.kv_heads + kvh) * lk * dv;
    float* st = tile.s_row;
    const bool prefetch = PrefetchesKv(p);
    for (int64_t j0 = task.key_begin; j0 < stop; j0 += kBlockKeys) {
      // The first row's scores prefetch this block's V and the next K.
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
        const float alpha =
            RowSoftmaxBlock(st, nb, &tile.m[r], &tile.sum[r], tile.tail);
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

  // ------------------------------------------------------------ tiny path

  // Row path for tiny problems, kv_len <= N (toy shapes, short caches), as
  // in the Highway engine: K and V are transposed once into the workspace and
  // each row's scores, softmax and output are a handful of whole-vector
  // operations with keys in lanes. Same results contract as RunRows. RunTiny
  // below may run it on a narrower architecture's Attention, whose vectors
  // still hold kv_len keys: it lays out the workspace for its own lanes,
  // which takes less than the engine's WorkspacePerWorker asked for.
  static void RunRowsTiny(const Problem& p, const Operands& op,
                          const TileTask& task, unsigned char* workspace) {
    constexpr int64_t M = static_cast<int64_t>(N);  // lanes, as a signed count
    alignas(64) static constexpr float kKeyIndex[16] = {
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    static_assert(M <= 16, "kKeyIndex covers 16 lanes");
    TinyTile tile;
    LayoutTiny(p, N, workspace, &tile);
    const int64_t b = task.b, kvh = task.kvh;
    const int64_t d = op.dim, dv = p.value_dim, lk = p.kv_len;
    const float* v = p.v + (b * p.kv_heads + kvh) * lk * dv;
    // Transposed by scalar copies (at most 16 keys); lanes of keys j >= lk
    // are 0, never garbage: they are masked below, and a 0 keeps every
    // lane's arithmetic finite.
    for (int64_t t = 0; t < d; ++t) {
      for (int64_t j = 0; j < M; ++j) {
        tile.kt[t * M + j] = j < lk ? op.k[j * d + t] : 0.0f;
      }
    }
    for (int64_t c = 0; c < dv; ++c) {
      for (int64_t j = 0; j < M; ++j) {
        tile.vt[c * M + j] = j < lk ? v[j * dv + c] : 0.0f;
      }
    }
    const VF key = Load(kKeyIndex);
    const VF zero(0.0f);
    const VF neg_inf(-INFINITY);
    RowWalker at(p, kvh);
    for (int64_t r = 0; r < task.rows; ++r) {
      const int64_t row = at.Row(p, b);
      const int64_t limit = VisibleKeys(p, b, at.i);
      const float* bias_row = BiasRow(p, b, at.h, at.i);
      at.Next(p);
      const float* q = op.q + row * d;
      VF s = zero;
      if (op.kind == kAdditive) {
        for (int64_t t = 0; t < d; ++t) {
          const VF x = VF(q[t]) + Load(tile.kt + t * M);
          s = MulAdd(VF(p.w_v[t]), xsimd::tanh(x), s);
        }
      } else if (op.kind == kGaussian) {
        for (int64_t t = 0; t < d; ++t) {
          const VF e = VF(q[t]) - Load(tile.kt + t * M);
          s = MulAdd(e, e, s);
        }
        s = s * VF(op.finish);
      } else {
        for (int64_t t = 0; t < d; ++t) {
          s = MulAdd(VF(q[t] * op.q_scale), Load(tile.kt + t * M), s);
        }
        if (op.kind == kDotScaled) s = s * VF(op.finish);
      }
      if (bias_row != nullptr) {
        for (int64_t j = 0; j < M; ++j) {
          tile.tail[j] = j < lk ? bias_row[j] : 0.0f;
        }
        const VF bias = Load(tile.tail);
        s = xsimd::select(bias == neg_inf, neg_inf, s + bias);
      }
      s = xsimd::select(key < VF(static_cast<float>(limit)), s, neg_inf);
      // xsimd 8.1 has no max reduction: finish it in scalar code.
      Store(s, tile.tail);
      float m = tile.tail[0];
      for (int64_t j = 1; j < M; ++j) m = tile.tail[j] > m ? tile.tail[j] : m;
      float* out = p.out + row * dv;
      float* w = p.weights != nullptr ? p.weights + row * lk : nullptr;
      const VF e = ExpNonPositive(s - VF(m));
      const float l = xsimd::hadd(e);
      if (m == -INFINITY || l == 0.0f) {  // no visible key
        for (int64_t c = 0; c < dv; ++c) out[c] = 0.0f;
        if (w != nullptr) {
          for (int64_t j = 0; j < lk; ++j) w[j] = 0.0f;
        }
        if (p.lse != nullptr) p.lse[row] = -INFINITY;
        continue;
      }
      const float inv_l = 1.0f / l;
      const auto read = e > zero;  // hidden keys' values are not read
      for (int64_t c = 0; c < dv; ++c) {
        const VF terms =
            xsimd::select(read, e * Load(tile.vt + c * M), zero);
        out[c] = xsimd::hadd(terms) * inv_l;
      }
      if (w != nullptr) {
        Store(e * VF(inv_l), tile.tail);
        for (int64_t j = 0; j < lk; ++j) w[j] = tile.tail[j];
      }
      if (p.lse != nullptr) p.lse[row] = m + logf(l);
    }
  }

  // The tiny path with the narrowest vectors that hold kv_len keys (on x86,
  // 4 lanes for up to 4 keys, 8 for up to 8): their reductions and selects
  // are cheaper, and nothing else there is wide.
  static void RunTiny(const Problem& p, const Operands& op,
                      const TileTask& task, unsigned char* workspace) {
#if XSIMD_WITH_SSE4_2
    if constexpr (N > 4) {
      if (p.kv_len <= 4) {
        Attention<xsimd::sse4_2, 4, false>::RunRowsTiny(p, op, task,
                                                        workspace);
        return;
      }
    }
#endif
#if XSIMD_WITH_FMA3_AVX2
    if constexpr (N > 8) {
      if (p.kv_len <= 8) {
        Attention<xsimd::fma3<xsimd::avx2>, 4, true>::RunRowsTiny(p, op, task,
                                                                  workspace);
        return;
      }
    }
#endif
    RunRowsTiny(p, op, task, workspace);
  }

  // ------------------------------------------------------- Engine entries

  static bool Supports(const Problem&) { return true; }

  static size_t Shared(const Problem& p) { return SharedWorkspace(p); }

  // Zeroes the flash-decoding split counters; additive scores: projects
  // every key (W_k k) and query (W_q q) once per call.
  static void Prepare(const Problem& p, unsigned char* shared) {
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

  static size_t NumTasks(const Problem& p) {
    return SplitTasks(p, TileRows());
  }

  static size_t WorkspacePerWorker(const Problem& p) {
    return UsesTinyPath(p, N) ? LayoutTiny(p, N, nullptr, nullptr)
                              : LayoutTile(p, N, nullptr, nullptr);
  }

  static void RunTask(const Problem& p, size_t task,
                      const unsigned char* shared, unsigned char* workspace) {
    const TileTask t = SplitTaskAt(p, task, TileRows());
    const Operands op = OperandsFor(p, shared, t.b, t.kvh);
    if (UsesTinyPath(p, N)) {
      RunTiny(p, op, t, workspace);
      return;
    }
    Tile tile;
    LayoutTile(p, N, workspace, &tile);
    if (t.row_path) {
      RunRows(p, op, t, shared, tile);
    } else if (t.rows <= static_cast<int64_t>(N)) {
      RunTile<1>(p, op, t.b, t.kvh, t.r0, t.rows, tile);
    } else {
      RunTile<2>(p, op, t.b, t.kvh, t.r0, t.rows, tile);
    }
  }
};

#undef QKV_XS_UNROLL8

}  // namespace
}  // namespace xsimd_engine
}  // namespace qkv

// Defines `const qkv::Engine* FN()` returning the engine of architecture
// ARCH named NAME; used once by each attention_xsimd_<arch>.cc. A constant
// (no guard variable, no dynamic initialization).
#define QKV_XSIMD_DEFINE_ENGINE(FN, NAME, ARCH, UNROLL, GATHER)            \
  namespace qkv {                                                          \
  template struct xsimd_engine::Attention<ARCH, UNROLL, GATHER>;           \
  const Engine* FN() {                                                     \
    using K = xsimd_engine::Attention<ARCH, UNROLL, GATHER>;               \
    static constexpr Engine kEngine = {NAME,           &K::Supports,       \
                                       &K::NumTasks,   &K::Shared,         \
                                       &K::WorkspacePerWorker,             \
                                       &K::Prepare,    &K::RunTask};       \
    return &kEngine;                                                       \
  }                                                                        \
  }  // namespace qkv

#endif  // QKV_SRC_XSIMD_ATTENTION_XSIMD_INL_H_
