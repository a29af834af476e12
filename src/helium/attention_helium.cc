// The Helium engine: f32 attention with Arm's M-profile Vector Extension
// (MVE, "Helium": 8 x 128-bit Q registers, 4 f32 lanes) for Cortex-M55/M85.
//
// The same plan as the reference engine (tasks of 16 query rows of one
// head, an exact two-pass softmax per row, the same workspace: kv_len
// floats of scores per worker, score j at float j, so
// QKV_REFERENCE_WORKSPACE_SIZE holds), with the inner loops in vectors,
// written so that GCC walks K and V with post-incremented loads and keeps
// the accumulators in Q registers (the count of executed instructions is
// what tests/mcu/icount.cc measures). A row visits only its keys [lo, hi)
// (src/semantics.h's RowKeys); q, k, v and out are addressed through the
// Problem's strides, so rows of K and V are k_st and v_st floats apart.
//  - scores: 4 keys at a time. One q vector is loaded per 4 dimensions and
//    multiplied into 4 accumulators (one per key), reading K in its natural
//    layout; the 4 accumulators are reduced to one vector of 4 scores through
//    an interleaving VLD4 (MVE has no float across-vector add), so scores
//    are written 4 at a time and the row's maximum kept in a vector.
//    Dimensions that are not a multiple of 4 use tail-predicated (zeroing)
//    loads.
//  - softcap and ALiBi (off: one test per row, the loops above unchanged):
//    a pass over the row's scores after them (Epilogue), softcap through
//    libm's tanhf as in the reference, then the bias, then ALiBi's distance
//    term 4 keys at a time.
//  - softmax: exp on 4 lanes (below), sum and smallest value in vectors;
//    the head's sink enters through FinishRow (src/semantics.h).
//  - output: 16 columns at a time held in 4 accumulators while the keys
//    stream by (VFMA by the scalar p_j), scaled by FinishRow's scale and
//    written once; predicated 4-column passes for the rest. A row with a
//    zero weight (a hidden or underflowed key) goes key by key instead, so
//    that such a key never touches out (0 * inf would be NaN), as in the
//    reference.
//  - additive scores use the reference engine's task (tanh is scalar libm).
//
// exp: x = n ln2 + r, n = round(x log2 e), |r| <= ln2/2 with ln2 split in
// two parts; exp(r) by its Taylor polynomial to degree 7 (truncation
// < 6e-9 relative), 2^n put into the exponent. Max error 2 ulp on [-87, 0];
// x below about -87.9 (terms under 1e-38 of the row's largest) gives 0, as
// does -inf. A NaN x gives 0 too, but makes the row's sum NaN (ExpRow), so
// that the row is zeros as with the reference's expf.
#include <arm_mve.h>
#include <math.h>

#include "engine.h"
#include "semantics.h"

namespace qkv {
namespace {

constexpr int64_t kRowsPerTask = 16;  // as the reference: same tasks
constexpr size_t kTaskRows = kRowsPerTask;

int64_t RowBlocks(const Problem& p) {
  return (p.q_len + kRowsPerTask - 1) / kRowsPerTask;
}

bool Supports(const Problem&) { return true; }

size_t NumTasks(const Problem& p) {
  if (p.score == QKV_SCORE_ADDITIVE) return ReferenceEngine()->num_tasks(p);
  return static_cast<size_t>(p.batch * p.q_heads * RowBlocks(p));
}

size_t NoSharedWorkspace(const Problem&) { return 0; }

size_t WorkspacePerWorker(const Problem& p) {
  // The reference engine's: kv_len scores (+ projections for ADDITIVE).
  return ReferenceEngine()->workspace_per_worker(p);
}

// exp(x) for x <= 0 (or NaN; see ExpRow). Constants are scalars (VFMA and
// VFMAS by a general register) so that the loop keeps its Q registers.
inline float32x4_t ExpNonPositive(float32x4_t x) {
  // Below -88, n = -127 and the scale's bits are 0: the result is +0, as
  // for -inf (and NaN, which ExpRow accounts for separately).
  const float32x4_t xc = vmaxnmq_f32(x, vdupq_n_f32(-88.0f));
  const int32x4_t n = vcvtnq_s32_f32(vmulq_n_f32(xc, 1.44269504088896341f));
  const float32x4_t nf = vcvtq_f32_s32(n);
  float32x4_t r = vfmaq_n_f32(xc, nf, -0.693145751953125f);
  r = vfmaq_n_f32(r, nf, -1.428606765330187045e-6f);
  // Horner: poly = poly * r + c.
  float32x4_t poly = vfmasq_n_f32(vdupq_n_f32(1.0f / 5040.0f), r, 1.0f / 720.0f);
  poly = vfmasq_n_f32(poly, r, 1.0f / 120.0f);
  poly = vfmasq_n_f32(poly, r, 1.0f / 24.0f);
  poly = vfmasq_n_f32(poly, r, 1.0f / 6.0f);
  poly = vfmasq_n_f32(poly, r, 0.5f);
  poly = vfmasq_n_f32(poly, r, 1.0f);
  poly = vfmasq_n_f32(poly, r, 1.0f);
  const float32x4_t scale =
      vreinterpretq_f32_s32(vshlq_n_s32(vaddq_n_s32(n, 127), 23));
  return vmulq_f32(poly, scale);
}

// Sum of the 4 lanes.
inline float AddLanes(float32x4_t v) {
  return (vgetq_lane_f32(v, 0) + vgetq_lane_f32(v, 1)) +
         (vgetq_lane_f32(v, 2) + vgetq_lane_f32(v, 3));
}

// One step of the scores of keys k0..k3 against q over 4 dimensions: DOT
// accumulates q * k_u, GAUSSIAN (q - k_u)^2.
template <bool kGaussian>
inline float32x4_t Term(float32x4_t acc, float32x4_t qv, float32x4_t kv) {
  if (kGaussian) {
    const float32x4_t e = vsubq_f32(qv, kv);
    return vfmaq_f32(acc, e, e);
  }
  return vfmaq_f32(acc, qv, kv);
}

// Scores of keys k0..k3 (d floats each) against q, as one vector: DOT
// gives q . k_u, GAUSSIAN |q - k_u|^2. The pointers walk the rows with
// post-incremented loads (one VLDRW per 4 floats, no address arithmetic);
// dimensions past a multiple of 4 use zeroing tail-predicated loads.
template <bool kGaussian>
__attribute__((always_inline)) inline float32x4_t Scores4(const float* q, const float* k0, const float* k1,
                           const float* k2, const float* k3, int32_t d) {
  float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
  for (int32_t t = d >> 2; t > 0; --t) {
    const float32x4_t qv = vld1q_f32(q);
    a0 = Term<kGaussian>(a0, qv, vld1q_f32(k0));
    a1 = Term<kGaussian>(a1, qv, vld1q_f32(k1));
    a2 = Term<kGaussian>(a2, qv, vld1q_f32(k2));
    a3 = Term<kGaussian>(a3, qv, vld1q_f32(k3));
    q += 4, k0 += 4, k1 += 4, k2 += 4, k3 += 4;
  }
  if ((d & 3) != 0) {  // the missing lanes load 0 and add 0
    const mve_pred16_t t = vctp32q(static_cast<uint32_t>(d & 3));
    const float32x4_t qv = vldrwq_z_f32(q, t);
    a0 = Term<kGaussian>(a0, qv, vldrwq_z_f32(k0, t));
    a1 = Term<kGaussian>(a1, qv, vldrwq_z_f32(k1, t));
    a2 = Term<kGaussian>(a2, qv, vldrwq_z_f32(k2, t));
    a3 = Term<kGaussian>(a3, qv, vldrwq_z_f32(k3, t));
  }
  // Transpose through memory: VLD4 de-interleaves [a0 a1 a2 a3] so that
  // lane u of every result vector comes from a_u (MVE has no float
  // across-vector add).
  float buf[16];
  vst1q_f32(buf, a0);
  vst1q_f32(buf + 4, a1);
  vst1q_f32(buf + 8, a2);
  vst1q_f32(buf + 12, a3);
  const float32x4x4_t tr = vld4q_f32(buf);
  return vaddq_f32(vaddq_f32(tr.val[0], tr.val[1]),
                   vaddq_f32(tr.val[2], tr.val[3]));
}

// Scale, bias and store the scores of keys j..j+3 (all 4, or the lanes
// under `keep` for the last group), folding them into the running maximum.
template <bool kFull>
inline float32x4_t Finish4(float32x4_t s, float factor, const float* bias,
                           mve_pred16_t keep, float* scores,
                           float32x4_t max) {
  s = vmulq_n_f32(s, factor);
  if (bias != nullptr) {
    // -inf hides the key whatever its score (even NaN from a bad key).
    const float32x4_t neg_inf = vdupq_n_f32(-INFINITY);
    const float32x4_t b = kFull ? vld1q_f32(bias) : vldrwq_z_f32(bias, keep);
    s = vpselq_f32(neg_inf, vaddq_f32(s, b), vcmpeqq_f32(b, neg_inf));
  }
  // VMAXNM ignores NaN, as the reference's `s > max` does.
  if (kFull) {
    vst1q_f32(scores, s);
    return vmaxnmq_f32(max, s);
  }
  vstrwq_p_f32(scores, s, keep);
  return vmaxnmq_m_f32(max, max, s, keep);
}

// Scores of the first n keys of k (d floats each, rows ks floats apart)
// against q into scores[0..n); returns their maximum (-inf when there is
// none or every score is -inf or NaN).
template <bool kGaussian>
__attribute__((noinline)) float ScoreRow(const float* q, const float* k,
                                         int32_t n, int32_t d, size_t ks,
                                         float factor, const float* bias,
                                         float* scores) {
  float32x4_t max = vdupq_n_f32(-INFINITY);
  int32_t j = n;
  for (; j >= 4; j -= 4) {
    const float* k1 = k + ks;
    const float* k2 = k1 + ks;
    const float* k3 = k2 + ks;
    const float32x4_t s = Scores4<kGaussian>(q, k, k1, k2, k3, d);
    max = Finish4<true>(s, factor, bias, 0, scores, max);
    k = k3 + ks, scores += 4;
    if (bias != nullptr) bias += 4;
  }
  if (j > 0) {
    // Missing keys repeat the first one (never past the caller's K); their
    // lanes are neither stored nor part of the maximum.
    const float* k1 = j > 1 ? k + ks : k;
    const float* k2 = j > 2 ? k + 2 * ks : k;
    const float32x4_t s = Scores4<kGaussian>(q, k, k1, k2, k, d);
    max = Finish4<false>(s, factor, bias, vctp32q(static_cast<uint32_t>(j)),
                         scores, max);
  }
  return vmaxnmvq_f32(-INFINITY, max);
}

// The score epilogue's softcap and ALiBi (src/semantics.h) on the scores
// of keys lo..lo+n of a row at position pos, in scores[0..n): softcap
// (libm's tanhf, as the reference), then the bias (given here only with
// softcap: otherwise ScoreRow added it), then -slope * |pos - j| with the
// head's slope (0: none). Returns the new maximum, as ScoreRow. Called
// only when softcap or ALiBi is on, so the plain rows never pay for it.
__attribute__((noinline)) float Epilogue(const Problem& p, float slope,
                                         int64_t pos, int64_t lo,
                                         const float* bias, int32_t n,
                                         float* scores) {
  const float cap = p.softcap;
  if (cap > 0.0f) {
    for (int32_t j = 0; j < n; ++j) scores[j] = Softcap(scores[j], cap);
  }
  if (bias != nullptr) {
    for (int32_t j = 0; j < n; ++j) scores[j] = WithBias(scores[j], bias[j]);
  }
  float32x4_t max = vdupq_n_f32(-INFINITY);
  // Distances pos - j fit int32 lanes (and their magnitudes too) when both
  // ends of the row do, which is all but positions near +-2^31; those go
  // key by key in int64.
  const int64_t first = pos - lo, last = pos - (lo + n - 1);
  const bool lanes = first < INT32_MAX && first > -INT32_MAX &&
                     last < INT32_MAX && last > -INT32_MAX;
  if (slope != 0.0f && !lanes) {
    for (int32_t j = 0; j < n; ++j) {
      scores[j] = WithAlibi(scores[j], slope, pos, lo + j);
    }
    slope = 0.0f;
  }
  // pos - j per lane, counting down by 4 per group; vabs and the
  // conversion give the same float as WithAlibi's int64 distance.
  int32x4_t dist = vsubq_s32(vdupq_n_s32(static_cast<int32_t>(first)),
                             vreinterpretq_s32_u32(vidupq_n_u32(0, 1)));
  for (int32_t j = 0; j < n; j += 4) {
    const mve_pred16_t t = vctp32q(static_cast<uint32_t>(n - j));
    float32x4_t s = vldrwq_z_f32(scores + j, t);
    if (slope != 0.0f) {
      s = vfmsq_f32(s, vdupq_n_f32(slope), vcvtq_f32_s32(vabsq_s32(dist)));
      vstrwq_p_f32(scores + j, s, t);
      dist = vsubq_n_s32(dist, 4);
    }
    max = vmaxnmq_m_f32(max, max, s, t);
  }
  return vmaxnmvq_f32(-INFINITY, max);
}

// scores[0..n) = exp(scores[j] - max); returns their sum (NaN when a score
// is NaN, as the reference's expf-and-add gives) and sets *has_zero when one
// of them is 0 (a hidden or underflowed key).
__attribute__((noinline)) float ExpRow(float* scores, int32_t n, float max,
                                       bool* has_zero) {
  float32x4_t sum = vdupq_n_f32(0.0f);
  float32x4_t least = vdupq_n_f32(1.0f);
  // x = s - max is in [-inf, 0] or NaN; the sum of the x is NaN iff one is.
  float32x4_t nan = vdupq_n_f32(0.0f);
  int32_t j = n;
  for (; j >= 4; j -= 4) {
    const float32x4_t x = vsubq_n_f32(vld1q_f32(scores), max);
    const float32x4_t e = ExpNonPositive(x);
    vst1q_f32(scores, e);
    sum = vaddq_f32(sum, e);
    least = vminnmq_f32(least, e);
    nan = vaddq_f32(nan, x);
    scores += 4;
  }
  if (j > 0) {
    const mve_pred16_t t = vctp32q(static_cast<uint32_t>(j));
    // The missing lanes (zeroing load) are neither stored nor added.
    const float32x4_t x = vsubq_n_f32(vldrwq_z_f32(scores, t), max);
    const float32x4_t e = ExpNonPositive(x);
    vstrwq_p_f32(scores, e, t);
    sum = vaddq_m_f32(sum, sum, e, t);
    least = vminnmq_m_f32(least, least, e, t);
    nan = vaddq_m_f32(nan, nan, x, t);
  }
  *has_zero = vminnmvq_f32(1.0f, least) == 0.0f;
  const float total = AddLanes(sum);
  return AddLanes(nan) == AddLanes(nan) ? total : AddLanes(nan);
}

// out[c..c+16) = scale * sum_j p_j v_j[c..c+16) over n keys, 16 columns
// held in 4 accumulators while the keys stream by (v_j = v + j * vs).
inline void Weighted16(const float* p, const float* v, int32_t n, size_t vs,
                       float scale, float* out) {
  float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
  for (int32_t j = n; j > 0; --j) {
    const float pj = *p++;
    a0 = vfmaq_n_f32(a0, vld1q_f32(v), pj);
    a1 = vfmaq_n_f32(a1, vld1q_f32(v + 4), pj);
    a2 = vfmaq_n_f32(a2, vld1q_f32(v + 8), pj);
    a3 = vfmaq_n_f32(a3, vld1q_f32(v + 12), pj);
    v += vs;
  }
  vst1q_f32(out, vmulq_n_f32(a0, scale));
  vst1q_f32(out + 4, vmulq_n_f32(a1, scale));
  vst1q_f32(out + 8, vmulq_n_f32(a2, scale));
  vst1q_f32(out + 12, vmulq_n_f32(a3, scale));
}

// The same for columns c..c+4 under predicate t (zeroing loads, so no read
// past the last value row).
inline void Weighted4(const float* p, const float* v, int32_t n, size_t vs,
                      float scale, float* out, mve_pred16_t t) {
  float32x4_t a = vdupq_n_f32(0.0f);
  for (int32_t j = n; j > 0; --j) {
    a = vfmaq_n_f32(a, vldrwq_z_f32(v, t), *p++);
    v += vs;
  }
  vstrwq_p_f32(out, vmulq_n_f32(a, scale), t);
}

// out[0..dv) += pj v[0..dv).
inline void Accumulate1(float* out, const float* v, float pj, int32_t dv) {
  for (int32_t c = 0; c < dv; c += 4) {
    const mve_pred16_t t = vctp32q(static_cast<uint32_t>(dv - c));
    const float32x4_t o = vldrwq_z_f32(out + c, t);
    vstrwq_p_f32(out + c, vfmaq_n_f32(o, vldrwq_z_f32(v + c, t), pj), t);
  }
}

// out = scale * sum_j p_j v_j over the n keys (v_j = v + j * vs). Without
// a zero weight, columns are produced 16 at a time in registers and written
// once; otherwise a hidden key (p_j == 0) must never touch out (0 * inf
// would be NaN), as in the reference, and rows are accumulated key by key.
__attribute__((noinline)) void WeightedRow(const float* p, const float* v,
                                           int32_t n, int32_t dv, size_t vs,
                                           float scale, bool has_zero,
                                           float* out) {
  if (!has_zero) {
    int32_t c = 0;
    for (; c + 16 <= dv; c += 16) Weighted16(p, v + c, n, vs, scale, out + c);
    for (; c < dv; c += 4) {
      Weighted4(p, v + c, n, vs, scale, out + c,
                vctp32q(static_cast<uint32_t>(dv - c)));
    }
    return;
  }
  for (int32_t c = 0; c < dv; c += 4) {
    vstrwq_p_f32(out + c, vdupq_n_f32(0.0f),
                 vctp32q(static_cast<uint32_t>(dv - c)));
  }
  for (int32_t j = 0; j < n; ++j) {
    if (p[j] != 0.0f) Accumulate1(out, v + j * vs, p[j], dv);
  }
  for (int32_t c = 0; c < dv; c += 4) {
    const mve_pred16_t t = vctp32q(static_cast<uint32_t>(dv - c));
    vstrwq_p_f32(out + c, vmulq_n_f32(vldrwq_z_f32(out + c, t), scale), t);
  }
}

// The outputs of row `row` besides out: weights (scores holds the exps of
// keys [lo, lo + n), scaled by f.scale, or nothing when no key was seen)
// and lse, when asked for.
__attribute__((noinline)) void RowExtras(const Problem& p, size_t row,
                                         const float* scores, int32_t lo,
                                         int32_t n, const RowFinish& f) {
  if (p.weights != nullptr) {
    const size_t lk = static_cast<size_t>(p.kv_len);
    float* w = p.weights + row * lk;
    for (size_t j = 0; j < lk; ++j) w[j] = 0.0f;
    w += lo, scores += lo;
    for (int32_t j = 0; j < n; j += 4) {
      const mve_pred16_t t = vctp32q(static_cast<uint32_t>(n - j));
      vstrwq_p_f32(w + j, vmulq_n_f32(vldrwq_z_f32(scores + j, t), f.scale), t);
    }
  }
  if (p.lse != nullptr) p.lse[row] = RowLse(f);
}

// What the rows of one task (one query head of one batch) share: where its
// row 0 lives and how far apart its rows are, so that a row costs a few
// multiply-adds to find. Index arithmetic is in size_t and int32_t: on a
// 32-bit MCU every offset of a validated Problem fits size_t, and kv_len
// fits int32.
struct Head {
  const float* q;     // QueryRow(p, b, h, 0), rows q_st apart
  float* out;         // OutRow(p, b, h, 0), rows out_st apart
  const float* k;     // KeysOf(p, b, kv head), rows ks apart
  const float* v;     // ValuesOf(p, b, kv head), rows vs apart
  const float* bias;  // BiasRow(p, b, h, 0) (rows kv_len apart), or NULL
  size_t q_st, out_st, ks, vs;
  size_t row0;  // dense index of row 0 (weights, lse)
  int64_t b;
  float factor, slope, sink;  // ScoreFactor, AlibiSlope, RowSink
};

// Query row i of head `hd` of p.
__attribute__((noinline)) void Row(const Problem& p, const Head& hd, size_t i,
                                   float* scores) {
  const int32_t d = static_cast<int32_t>(p.head_dim);
  const int32_t dv = static_cast<int32_t>(p.value_dim);
  const size_t lk = static_cast<size_t>(p.kv_len);
  const KeyInterval keys = RowKeys(p, hd.b, static_cast<int64_t>(i));
  const int32_t lo = static_cast<int32_t>(keys.lo);
  const int32_t n = static_cast<int32_t>(keys.hi - keys.lo);
  // The row's query and output, and its keys, values, bias and scores from
  // key lo on.
  const float* q = hd.q + i * hd.q_st;
  float* out = hd.out + i * hd.out_st;
  const float* k = hd.k + static_cast<size_t>(lo) * hd.ks;
  const float* v = hd.v + static_cast<size_t>(lo) * hd.vs;
  float* s = scores + lo;
  const float* bias = hd.bias != nullptr ? hd.bias + i * lk + lo : nullptr;
  // With softcap the bias comes after it, in Epilogue.
  const bool capped = p.softcap > 0.0f;
  const float* score_bias = capped ? nullptr : bias;
  float max_score =
      p.score == QKV_SCORE_GAUSSIAN
          ? ScoreRow<true>(q, k, n, d, hd.ks, hd.factor, score_bias, s)
          : ScoreRow<false>(q, k, n, d, hd.ks, hd.factor, score_bias, s);
  if (capped || hd.slope != 0.0f) {
    const int64_t pos = QueryPos(p, hd.b, static_cast<int64_t>(i));
    max_score = Epilogue(p, hd.slope, pos, lo, capped ? bias : nullptr, n, s);
  }
  float sum = 0.0f;
  bool has_zero = false;
  if (max_score != -INFINITY) sum = ExpRow(s, n, max_score, &has_zero);
  // sum >= 1 whenever a key is visible (the max contributes exp(0)); NaN
  // scores make it NaN, and the row is then zeros as in the reference.
  const RowFinish f = FinishRow(max_score, sum, hd.sink);
  const bool any = sum > 0.0f;
  if (any) {
    WeightedRow(s, v, n, dv, hd.vs, f.scale, has_zero, out);
  } else {
    for (int32_t c = 0; c < dv; c += 4) {
      vstrwq_p_f32(out + c, vdupq_n_f32(0.0f),
                   vctp32q(static_cast<uint32_t>(dv - c)));
    }
  }
  if (p.weights != nullptr || p.lse != nullptr) {
    RowExtras(p, hd.row0 + i, scores, lo, any ? n : 0, f);
  }
}

// The rows of one task (16 query rows of one head, as the reference).
__attribute__((noinline)) void RunRows(const Problem& p, size_t task,
                                       unsigned char* workspace) {
  const size_t q_len = static_cast<size_t>(p.q_len);
  const size_t blocks = (q_len + kTaskRows - 1) / kTaskRows;
  const size_t bh = task / blocks;
  const int64_t h = static_cast<int64_t>(bh % static_cast<size_t>(p.q_heads));
  const int64_t kvh = h / p.group;
  Head hd;
  hd.b = static_cast<int64_t>(bh / static_cast<size_t>(p.q_heads));
  hd.q = QueryRow(p, hd.b, h, 0);
  hd.out = OutRow(p, hd.b, h, 0);
  hd.k = KeysOf(p, hd.b, kvh);
  hd.v = ValuesOf(p, hd.b, kvh);
  hd.bias = BiasRow(p, hd.b, h, 0);
  hd.q_st = static_cast<size_t>(p.q_st);
  hd.out_st = static_cast<size_t>(p.out_st);
  hd.ks = static_cast<size_t>(p.k_st);
  hd.vs = static_cast<size_t>(p.v_st);
  hd.row0 = bh * q_len;
  hd.factor = ScoreFactor(p);
  hd.slope = AlibiSlope(p, h);
  hd.sink = RowSink(p, h);
  const size_t i0 = (task % blocks) * kTaskRows;
  const size_t i1 = i0 + kTaskRows < q_len ? i0 + kTaskRows : q_len;
  for (size_t i = i0; i < i1; ++i) {
    Row(p, hd, i, reinterpret_cast<float*>(workspace));
  }
}

// Additive scores go to the reference engine's task; both are tail calls, so
// this frame is gone before either runs.
void RunTask(const Problem& p, size_t task, const unsigned char* shared,
             unsigned char* workspace) {
  if (p.score == QKV_SCORE_ADDITIVE) {
    return kReferenceEngine.run_task(p, task, shared, workspace);
  }
  return RunRows(p, task, workspace);
}

}  // namespace

extern const Engine kHeliumEngine = {"helium",           &Supports,
                                     &NumTasks,          &NoSharedWorkspace,
                                     &WorkspacePerWorker, nullptr,
                                     &RunTask};

const Engine* HeliumEngine() { return &kHeliumEngine; }

}  // namespace qkv
