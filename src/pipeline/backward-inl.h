// The backward pass of attention, written once: Backward<O, Exp> for a
// vector-operations layer O (the SIMD engines' HwyOps / XsimdOps, or
// ScalarOps for the reference engine) and an exp for arguments <= 0.
//
// FlashAttention-2's backward, with the loops arranged so that no two tasks
// write the same element: a task owns one (batch, kv head), walks its keys
// in blocks of Bk, and for each block visits the rows of every query head
// of the GQA group in blocks (64 keys and 32 rows on the SIMD engines):
//
//   s   = epilogue(factor * a(q, k))      recomputed, as the forward did
//   P   = exp(s - lse)                    the forward's weights (lse given)
//   dP  = dO . v                          per (row, key)
//   G   = P (dP - D) * softcap'           D = dO . out, per row
//   dV += P^T dO,  dK += G^T Q,  dQ += G K      (GAUSSIAN: G (k - q), ...)
//
// dK and dV of a key block are complete when its rows are done and are
// written once; dQ accumulates over the key blocks in the worker's
// workspace, in key order, and is written at the end. The matrix products
// are register tiles of 4 rows by 4 vectors (2 with 16 registers); the operands they stream
// (K^T, V^T, Q and dO rows) are copied into the workspace padded with zeros
// to whole tiles, so no tile ever reads past a row or needs a tail.
//
// The includer has included engine.h and defined QKV_SIMD_NAMESPACE (and,
// for the SIMD engines, the ops layer). Per-target include guard
// (Highway's convention).
#if defined(QKV_PIPELINE_BACKWARD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_PIPELINE_BACKWARD_INL_H_
#undef QKV_PIPELINE_BACKWARD_INL_H_
#else
#define QKV_PIPELINE_BACKWARD_INL_H_
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "engine.h"
#include "pipeline/backward_kernels-inl.h"
#include "semantics.h"

#ifndef QKV_SIMD_NAMESPACE
#error "define QKV_SIMD_NAMESPACE (the per-target namespace) first"
#endif

#ifdef HWY_BEFORE_NAMESPACE
HWY_BEFORE_NAMESPACE();
#endif
namespace qkv {
namespace QKV_SIMD_NAMESPACE {

// kRowBlock query rows and (at least) kKeyBlock keys per step: 32 and 64
// for the SIMD engines; the portable engine's smaller blocks keep a
// microcontroller's workspace small.
template <class O, class Exp, int64_t kRowBlock = 32, int64_t kKeyBlock = 64>
struct Backward : BackwardKernels<O> {
  using K = BackwardKernels<O>;
  using V = typename K::V;
  using K::kTile;
  using K::Lanes;
  using K::Pad;
  using K::WeightedRows;
  using K::WeightedDifferences;
  using K::CopyPadded;
  using K::TransposeInto;
  using K::Dot;

  static int64_t PadFloats(int64_t n) { return (n + 15) / 16 * 16; }  // 64 B

  // The worker's workspace, in floats from its start (each part 64-byte
  // aligned).
  struct Layout {
    int64_t rows, dp, dvp, bk;
    int64_t dq, dvec, lse, lo, hi, kb, kt, vt, dkb, dvb, qb, dob, s, dpm, tt;
    int64_t total;
  };

  static Layout LayoutOf(const Problem& p) {
    Layout l;
    l.rows = p.group * p.q_len;
    l.dp = Pad(p.head_dim);
    l.dvp = Pad(p.value_dim);
    l.bk = Pad(kKeyBlock);
    int64_t at = 0;
    auto take = [&at](int64_t n) {
      const int64_t where = at;
      at += PadFloats(n);
      return where;
    };
    // dQ's rows padded to whole register tiles (the last row block's).
    l.dq = take((l.rows + kTile - 1) / kTile * kTile * l.dp);
    l.dvec = take(l.rows);
    l.lse = take(l.rows);
    l.lo = take(p.q_len);  // int32
    l.hi = take(p.q_len);  // int32
    l.kb = take(l.bk * l.dp);
    l.kt = take(p.head_dim * l.bk);
    l.vt = take(p.value_dim * l.bk);
    l.dkb = take(l.bk * l.dp);
    l.dvb = take(l.bk * l.dvp);
    l.qb = take(kRowBlock * l.dp);
    l.dob = take(kRowBlock * l.dvp);
    l.s = take(kRowBlock * l.bk);
    l.dpm = take(kRowBlock * l.bk);
    l.tt = take(kRowBlock * l.bk);
    l.total = at;
    return l;
  }

  static size_t WorkspacePerWorker(const Problem& p) {
    return AlignUp(static_cast<size_t>(LayoutOf(p).total) * sizeof(float));
  }

  // Rows' key intervals (per i) into row_lo/row_hi and their union into
  // [*union_lo, *union_hi), lse and D = dO . out per row; dq zeroed.
  static void SetUpRows(const Problem& p, const Gradients& g, int64_t b,
                        int64_t kvh, const Layout& l, int32_t* row_lo,
                        int32_t* row_hi, float* lse, float* dvec, float* dq,
                        int64_t* union_lo, int64_t* union_hi) {
    const int64_t lq = p.q_len, rows = l.rows;
    *union_lo = p.kv_len;
    *union_hi = 0;
    for (int64_t i = 0; i < lq; ++i) {
      const KeyInterval keys = RowKeys(p, b, i);
      row_lo[i] = static_cast<int32_t>(keys.lo);
      row_hi[i] = static_cast<int32_t>(keys.hi);
      if (keys.lo < keys.hi) {
        if (keys.lo < *union_lo) *union_lo = keys.lo;
        if (keys.hi > *union_hi) *union_hi = keys.hi;
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t h = kvh * p.group + r / lq, i = r % lq;
      lse[r] = p.lse[(b * p.q_heads + h) * lq + i];
      const int64_t off = b * p.out_sb + h * p.out_sh + i * p.out_st;
      dvec[r] = Dot(g.d_out + off, p.out + off, p.value_dim);
    }
    if (g.d_q != nullptr) {
      const int64_t padded = (rows + kTile - 1) / kTile * kTile;
      for (int64_t t = 0; t < padded * l.dp; ++t) dq[t] = 0.0f;
    }
  }

  // Block [j0, j0 + nb)'s keys padded (rows and columns) into kb, K^T into
  // kt and V^T into vt; its d_k and d_v accumulators zeroed.
  static void LoadBlock(const Problem& p, const KvSource& keys,
                        const KvSource& values, int64_t j0, int64_t nb,
                        const Layout& l, float* kb, float* kt, float* vt,
                        float* dkb, float* dvb) {
    const int64_t d = p.head_dim, dv = p.value_dim, bk = l.bk, dp = l.dp;
    for (int64_t j = 0; j < bk; ++j) {
      float* dst = kb + j * dp;
      if (j < nb) {
        CopyPadded(F32RowAt(keys, j0 + j), d, dp, dst);
      } else {
        for (int64_t c = 0; c < dp; ++c) dst[c] = 0.0f;
      }
    }
    TransposeInto(kb, dp, bk, bk, d, kt);
    TransposeInto(F32RowAt(values, j0), p.v_st, nb, bk, dv, vt);
    for (int64_t t = 0; t < bk * dp; ++t) dkb[t] = 0.0f;
    for (int64_t t = 0; t < bk * l.dvp; ++t) dvb[t] = 0.0f;
  }

  // The block's d_k and d_v rows, written once (zeros for keys no row
  // sees: !any).
  static void StoreBlockGrads(const Problem& p, const Gradients& g, int64_t b,
                              int64_t kvh, int64_t j0, int64_t nb, bool any,
                              float grad_factor, const Layout& l,
                              const float* dkb, const float* dvb) {
    if (g.d_k != nullptr) {
      for (int64_t j = 0; j < nb; ++j) {
        float* dst = g.d_k + b * p.k_sb + kvh * p.k_sh + (j0 + j) * p.k_st;
        const float* src = dkb + j * l.dp;
        for (int64_t c = 0; c < p.head_dim; ++c) {
          dst[c] = any ? src[c] * grad_factor : 0.0f;
        }
      }
    }
    if (g.d_v != nullptr) {
      for (int64_t j = 0; j < nb; ++j) {
        float* dst = g.d_v + b * p.v_sb + kvh * p.v_sh + (j0 + j) * p.v_st;
        const float* src = dvb + j * l.dvp;
        for (int64_t c = 0; c < p.value_dim; ++c) dst[c] = any ? src[c] : 0.0f;
      }
    }
  }

  static void RunTask(const Problem& p, const Gradients& g, size_t task,
                      unsigned char* workspace) {
    const int64_t b = static_cast<int64_t>(task) / p.kv_heads;
    const int64_t kvh = static_cast<int64_t>(task) % p.kv_heads;
    const Layout l = LayoutOf(p);
    float* ws = reinterpret_cast<float*>(workspace);
    float* dq = ws + l.dq;
    float* dvec = ws + l.dvec;
    float* lse = ws + l.lse;
    int32_t* row_lo = reinterpret_cast<int32_t*>(ws + l.lo);
    int32_t* row_hi = reinterpret_cast<int32_t*>(ws + l.hi);
    float* kb = ws + l.kb;
    float* kt = ws + l.kt;
    float* vt = ws + l.vt;
    float* dkb = ws + l.dkb;
    float* dvb = ws + l.dvb;
    float* qb = ws + l.qb;
    float* dob = ws + l.dob;
    float* sm = ws + l.s;
    float* dpm = ws + l.dpm;
    float* tt = ws + l.tt;

    const int64_t d = p.head_dim, lq = p.q_len;
    const int64_t lk = p.kv_len, rows = l.rows, bk = l.bk, dp = l.dp;
    const bool gauss = p.score == QKV_SCORE_GAUSSIAN;
    const float factor = ScoreFactor(p);
    // d s / d(raw sum) per unit of G: the factor (DOT), twice it (GAUSSIAN,
    // d |q - k|^2 / dq = 2 (q - k)).
    const float grad_factor = gauss ? 2.0f * factor : factor;
    const bool epilogue = p.softcap > 0.0f || p.bias != nullptr ||
                          p.alibi_slopes != nullptr;

    // Rows: r = g * q_len + i for query head kvh * group + g.
    int64_t union_lo, union_hi;
    SetUpRows(p, g, b, kvh, l, row_lo, row_hi, lse, dvec, dq, &union_lo,
              &union_hi);
    const KvSource keys = KeySource(p, b, kvh);
    const KvSource values = ValueSource(p, b, kvh);

    for (int64_t j0 = 0; j0 < lk; j0 += bk) {
      const int64_t nb = lk - j0 < bk ? lk - j0 : bk;
      bool any = j0 < union_hi && j0 + nb > union_lo;
      if (any) {
        LoadBlock(p, keys, values, j0, nb, l, kb, kt, vt, dkb, dvb);
        any = false;
        for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
          const int64_t nr = rows - r0 < kRowBlock ? rows - r0 : kRowBlock;
          if (!RowBlock(p, g, b, kvh, r0, nr, j0, nb, l, row_lo, row_hi, lse,
                        dvec, gauss, factor, epilogue, kb, kt, vt, qb, dob,
                        sm, dpm, tt, dkb, dvb, dq)) {
            continue;
          }
          any = true;
        }
      }
      StoreBlockGrads(p, g, b, kvh, j0, nb, any, grad_factor, l, dkb, dvb);
    }
    if (g.d_q != nullptr) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t h = kvh * p.group + r / lq, i = r % lq;
        float* dst = g.d_q + b * p.q_sb + h * p.q_sh + i * p.q_st;
        const float* src = dq + r * dp;
        for (int64_t c = 0; c < d; ++c) dst[c] = src[c] * grad_factor;
      }
    }
  }

  // Row r of rows [r0, r0 + nr) (r >= nr: padding) against keys
  // [j0, j0 + nb): its probabilities P into sm's row and G = P (dP - D)
  // (times the epilogue's derivative) into dpm's; zeros outside the row's
  // interval.
  static void RowGradients(const Problem& p, int64_t b, int64_t kvh,
                           int64_t r0, int64_t r, int64_t nr, int64_t j0,
                           int64_t nb, const Layout& l, const int32_t* row_lo,
                           const int32_t* row_hi, const float* lse,
                           const float* dvec, float factor, bool epilogue,
                           float* sm, float* dpm, float* tt) {
    const int64_t lq = p.q_len, bk = l.bk;
    const int64_t nl = Lanes();
    float* srow = sm + r * bk;
    float* grow = dpm + r * bk;
    int64_t lo = 0, hi = 0;
    if (r < nr && lse[r0 + r] != -INFINITY) {
      const int64_t i = (r0 + r) % lq;
      lo = row_lo[i] > j0 ? row_lo[i] - j0 : 0;
      hi = row_hi[i] - j0 < nb ? row_hi[i] - j0 : nb;
    }
    if (lo >= hi) {
      for (int64_t j = 0; j < bk; ++j) srow[j] = grow[j] = 0.0f;
      return;
    }
    const float row_lse = lse[r0 + r];
    const V vlse = O::Set(row_lse);
    const V vd = O::Set(dvec[r0 + r]);
    if (epilogue) {
      // The epilogue in src/semantics.h's order, per key; tt holds the
      // softcap's derivative 1 - tanh^2.
      const int64_t h = kvh * p.group + (r0 + r) / lq, i = (r0 + r) % lq;
      const float* bias = BiasRow(p, b, h, i);
      const float slope = AlibiSlope(p, h);
      const int64_t pos = QueryPos(p, b, i);
      float* trow = tt + r * bk;
      for (int64_t j = lo; j < hi; ++j) {
        float s = srow[j] * factor;
        float deriv = 1.0f;
        if (p.softcap > 0.0f) {
          const float t = tanhf(s / p.softcap);
          s = p.softcap * t;
          deriv = 1.0f - t * t;
        }
        if (bias != nullptr) s = WithBias(s, bias[j0 + j]);
        if (slope != 0.0f) s = WithAlibi(s, slope, pos, j0 + j);
        srow[j] = s - row_lse;
        trow[j] = deriv;
      }
      for (int64_t j = 0; j < bk; j += nl) {
        const V pv = Exp::Apply(O::LoadU(srow + j));
        const V gv = O::Mul(O::Mul(pv, O::Sub(O::LoadU(grow + j), vd)),
                            O::LoadU(trow + j));
        O::StoreU(pv, srow + j);
        O::StoreU(gv, grow + j);
      }
    } else {
      const V vf = O::Set(factor);
      for (int64_t j = 0; j < bk; j += nl) {
        const V pv =
            Exp::Apply(O::Sub(O::Mul(O::LoadU(srow + j), vf), vlse));
        const V gv = O::Mul(pv, O::Sub(O::LoadU(grow + j), vd));
        O::StoreU(pv, srow + j);
        O::StoreU(gv, grow + j);
      }
    }
    // Keys outside the row's interval (and past the block) see nothing.
    for (int64_t j = 0; j < lo; ++j) srow[j] = grow[j] = 0.0f;
    for (int64_t j = hi; j < bk; ++j) srow[j] = grow[j] = 0.0f;
  }

  // Rows [r0, r0 + nr) against keys [j0, j0 + nb): false when no row sees
  // a key of the block (nothing done).
  static bool RowBlock(const Problem& p, const Gradients& g, int64_t b,
                       int64_t kvh, int64_t r0, int64_t nr, int64_t j0,
                       int64_t nb, const Layout& l, const int32_t* row_lo,
                       const int32_t* row_hi, const float* lse,
                       const float* dvec, bool gauss, float factor,
                       bool epilogue, const float* kb, const float* kt,
                       const float* vt, float* qb, float* dob, float* sm,
                       float* dpm, float* tt, float* dkb, float* dvb,
                       float* dq) {
    const int64_t lq = p.q_len, bk = l.bk, dp = l.dp, dvp = l.dvp;
    const int64_t d = p.head_dim, dv = p.value_dim;
    bool seen = false;
    for (int64_t r = 0; r < nr && !seen; ++r) {
      const int64_t i = (r0 + r) % lq;
      seen = row_lo[i] < j0 + nb && row_hi[i] > j0 && row_lo[i] < row_hi[i] &&
             lse[r0 + r] != -INFINITY;
    }
    if (!seen) return false;
    const int64_t nr4 = (nr + kTile - 1) / kTile * kTile;
    const int64_t nb4 = (nb + kTile - 1) / kTile * kTile;
    for (int64_t r = 0; r < nr4; ++r) {
      if (r < nr) {
        const int64_t h = kvh * p.group + (r0 + r) / lq, i = (r0 + r) % lq;
        CopyPadded(QueryRow(p, b, h, i), d, dp, qb + r * dp);
        CopyPadded(g.d_out + b * p.out_sb + h * p.out_sh + i * p.out_st, dv,
                   dvp, dob + r * dvp);
      } else {
        for (int64_t c = 0; c < dp; ++c) qb[r * dp + c] = 0.0f;
        for (int64_t c = 0; c < dvp; ++c) dob[r * dvp + c] = 0.0f;
      }
    }
    if (gauss) {
      K::template RowsByColumns<true>(qb, dp, d, kt, bk, nr4, bk, sm, bk);
    } else {
      K::template RowsByColumns<false>(qb, dp, d, kt, bk, nr4, bk, sm, bk);
    }
    K::template RowsByColumns<false>(dob, dvp, dv, vt, bk, nr4, bk, dpm, bk);

    // P into sm, G into dpm.
    for (int64_t r = 0; r < nr4; ++r) {
      RowGradients(p, b, kvh, r0, r, nr, j0, nb, l, row_lo, row_hi, lse, dvec,
                   factor, epilogue, sm, dpm, tt);
    }

    if (g.d_v != nullptr) {  // dV[j] += sum_r P[r][j] dO[r]
      WeightedRows(sm, 1, bk, dob, dvp, nr, nb4, dvp, dvb, dvp);
    }
    if (g.d_k != nullptr) {  // dK[j] += sum_r G[r][j] Q[r] (or G (k - q))
      if (gauss) {
        WeightedDifferences(dpm, 1, bk, qb, dp, nr, kb, dp, nb, dp, dkb, dp);
      } else {
        WeightedRows(dpm, 1, bk, qb, dp, nr, nb4, dp, dkb, dp);
      }
    }
    if (g.d_q != nullptr) {  // dQ[r] += sum_j G[r][j] K[j] (or G (q - k))
      float* out = dq + r0 * dp;
      if (gauss) {
        WeightedDifferences(dpm, bk, 1, kb, dp, nb, qb, dp, nr, dp, out, dp);
      } else {
        WeightedRows(dpm, bk, 1, kb, dp, nb, nr4, dp, out, dp);
      }
    }
    return true;
  }

  static constexpr BackwardEngine kEngine = {&WorkspacePerWorker, &RunTask};
};

template <class O, class Exp, int64_t kRowBlock, int64_t kKeyBlock>
constexpr BackwardEngine Backward<O, Exp, kRowBlock, kKeyBlock>::kEngine;

}  // namespace QKV_SIMD_NAMESPACE
}  // namespace qkv
#ifdef HWY_AFTER_NAMESPACE
HWY_AFTER_NAMESPACE();
#endif

#endif  // per-target include guard
