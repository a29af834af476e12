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
// Problem's strides, so rows of K and V are k_st and v_st elements apart.
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
//  - F16, BF16 and I8 keys and values (kv_dtype) go through the same loops,
//    their elements loaded into f32 lanes (src/helium/vectors.h says how).
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

// F16, BF16 and I8 K/V: compiled unless the build says
// QKV_LOW_PRECISION_KV=0, where the boundary refuses them and an f32-only
// firmware keeps its size.
#if !defined(QKV_LOW_PRECISION_KV) || QKV_LOW_PRECISION_KV
constexpr bool kLowPrecisionKv = true;
#else
constexpr bool kLowPrecisionKv = false;
#endif

bool Supports(const Problem& p) {
  return kLowPrecisionKv || p.kv_dtype == QKV_DTYPE_F32;
}

size_t NumTasks(const Problem& p) {
  if (p.score == QKV_SCORE_ADDITIVE) return ReferenceEngine()->num_tasks(p);
  return static_cast<size_t>(p.batch * p.q_heads * RowBlocks(p));
}

size_t NoSharedWorkspace(const Problem&) { return 0; }

size_t WorkspacePerWorker(const Problem& p) {
  // The reference engine's: kv_len scores (+ projections for ADDITIVE).
  return ReferenceEngine()->workspace_per_worker(p);
}

#include "helium/vectors.h"

// 4 dimensions of a key as f32 lanes: I8 keys times their row's scale c
// only for GAUSSIAN (DOT scores take the scale after the sum, ScoreRow).
template <bool kGaussian, class Kv>
inline float32x4_t KeyLanes(float32x4_t x, float c) {
  return kGaussian && Kv::kScaled ? vmulq_n_f32(x, c) : x;
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

// Scores of keys k0..k3 (d elements each) against q, as one vector: DOT
// gives q . k_u, GAUSSIAN |q - k_u|^2 (I8: unscaled for DOT, keys times
// their scales c0..c3 for GAUSSIAN). The pointers walk the rows with
// post-incremented loads (one VLDRW per 4 floats, no address arithmetic);
// dimensions past a multiple of 4 use zeroing tail-predicated loads.
template <bool kGaussian, class Kv>
__attribute__((always_inline)) inline float32x4_t Scores4(
    const float* q, const typename Kv::T* k0, const typename Kv::T* k1,
    const typename Kv::T* k2, const typename Kv::T* k3, int32_t d, float c0,
    float c1, float c2, float c3) {
  float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
  for (int32_t t = d >> 2; t > 0; --t) {
    const float32x4_t qv = vld1q_f32(q);
    a0 = Term<kGaussian>(a0, qv, KeyLanes<kGaussian, Kv>(Kv::Load(k0), c0));
    a1 = Term<kGaussian>(a1, qv, KeyLanes<kGaussian, Kv>(Kv::Load(k1), c1));
    a2 = Term<kGaussian>(a2, qv, KeyLanes<kGaussian, Kv>(Kv::Load(k2), c2));
    a3 = Term<kGaussian>(a3, qv, KeyLanes<kGaussian, Kv>(Kv::Load(k3), c3));
    q += 4, k0 += 4, k1 += 4, k2 += 4, k3 += 4;
  }
  if ((d & 3) != 0) {  // the missing lanes load 0 and add 0
    const mve_pred16_t t = vctp32q(static_cast<uint32_t>(d & 3));
    const float32x4_t qv = vldrwq_z_f32(q, t);
    a0 = Term<kGaussian>(a0, qv, KeyLanes<kGaussian, Kv>(Kv::LoadZ(k0, t), c0));
    a1 = Term<kGaussian>(a1, qv, KeyLanes<kGaussian, Kv>(Kv::LoadZ(k1, t), c1));
    a2 = Term<kGaussian>(a2, qv, KeyLanes<kGaussian, Kv>(Kv::LoadZ(k2, t), c2));
    a3 = Term<kGaussian>(a3, qv, KeyLanes<kGaussian, Kv>(Kv::LoadZ(k3, t), c3));
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

// Scores of the first n keys of k (d elements each, rows ks elements
// apart) against q into scores[0..n); returns their maximum (-inf when
// there is none or every score is -inf or NaN). I8 keys: key j's scale at
// sc[j * sst] (unread for the other types).
template <bool kGaussian, class Kv>
__attribute__((always_inline)) inline float ScoreRowOf(
    const float* q, const typename Kv::T* k, int32_t n, int32_t d, size_t ks,
    float factor, const float* bias, float* scores, const float* sc,
    size_t sst) {
  using T = typename Kv::T;
  // I8 DOT: the scales of the 4 keys, gathered sst floats apart.
  constexpr bool kScaleScores = Kv::kScaled && !kGaussian;
  constexpr bool kScaleKeys = Kv::kScaled && kGaussian;
  uint32x4_t sc_at = vdupq_n_u32(0);
  if (kScaleScores) {
    sc_at = vmulq_n_u32(vidupq_n_u32(0, 1), static_cast<uint32_t>(sst));
  }
  float32x4_t max = vdupq_n_f32(-INFINITY);
  int32_t j = n;
  for (; j >= 4; j -= 4) {
    const T* k1 = k + ks;
    const T* k2 = k1 + ks;
    const T* k3 = k2 + ks;
    float c0 = 1.0f, c1 = 1.0f, c2 = 1.0f, c3 = 1.0f;
    if (kScaleKeys) {
      c0 = sc[0], c1 = sc[sst], c2 = sc[2 * sst], c3 = sc[3 * sst];
    }
    float32x4_t s = Scores4<kGaussian, Kv>(q, k, k1, k2, k3, d, c0, c1, c2, c3);
    if (kScaleScores) {
      s = vmulq_f32(s, vldrwq_gather_shifted_offset_f32(sc, sc_at));
    }
    max = Finish4<true>(s, factor, bias, 0, scores, max);
    k = k3 + ks, scores += 4;
    if (Kv::kScaled) sc += 4 * sst;
    if (bias != nullptr) bias += 4;
  }
  if (j > 0) {
    // Missing keys repeat the first one (never past the caller's K); their
    // lanes are neither stored nor part of the maximum.
    const T* k1 = j > 1 ? k + ks : k;
    const T* k2 = j > 2 ? k + 2 * ks : k;
    float c0 = 1.0f, c1 = 1.0f, c2 = 1.0f;
    if (kScaleKeys) {
      c0 = sc[0], c1 = j > 1 ? sc[sst] : c0, c2 = j > 2 ? sc[2 * sst] : c0;
    }
    float32x4_t s = Scores4<kGaussian, Kv>(q, k, k1, k2, k, d, c0, c1, c2, c0);
    const mve_pred16_t keep = vctp32q(static_cast<uint32_t>(j));
    if (kScaleScores) {
      s = vmulq_f32(s, vldrwq_gather_shifted_offset_z_f32(sc, sc_at, keep));
    }
    max = Finish4<false>(s, factor, bias, keep, scores, max);
  }
  return vmaxnmvq_f32(-INFINITY, max);
}

// ScoreRowOf out of line: without scales (F32, F16, BF16; the F32 call is
// as it always was) and with them (I8).
template <bool kGaussian, class Kv>
__attribute__((noinline)) float ScoreRow(const float* q,
                                         const typename Kv::T* k, int32_t n,
                                         int32_t d, size_t ks, float factor,
                                         const float* bias, float* scores) {
  return ScoreRowOf<kGaussian, Kv>(q, k, n, d, ks, factor, bias, scores,
                                   nullptr, 0);
}

template <bool kGaussian>
__attribute__((noinline)) float ScoreRowI8(const float* q, const int8_t* k,
                                           int32_t n, int32_t d, size_t ks,
                                           float factor, const float* bias,
                                           float* scores, const float* sc,
                                           size_t sst) {
  return ScoreRowOf<kGaussian, I8Kv>(q, k, n, d, ks, factor, bias, scores, sc,
                                     sst);
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
template <class Kv>
inline void Weighted16(const float* p, const typename Kv::T* v, int32_t n,
                       size_t vs, float scale, float* out) {
  float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
  for (int32_t j = n; j > 0; --j) {
    const float pj = *p++;
    a0 = vfmaq_n_f32(a0, Kv::Load(v), pj);
    a1 = vfmaq_n_f32(a1, Kv::Load(v + 4), pj);
    a2 = vfmaq_n_f32(a2, Kv::Load(v + 8), pj);
    a3 = vfmaq_n_f32(a3, Kv::Load(v + 12), pj);
    v += vs;
  }
  vst1q_f32(out, vmulq_n_f32(a0, scale));
  vst1q_f32(out + 4, vmulq_n_f32(a1, scale));
  vst1q_f32(out + 8, vmulq_n_f32(a2, scale));
  vst1q_f32(out + 12, vmulq_n_f32(a3, scale));
}

// The same for columns c..c+4 under predicate t (zeroing loads, so no read
// past the last value row).
template <class Kv>
inline void Weighted4(const float* p, const typename Kv::T* v, int32_t n,
                      size_t vs, float scale, float* out, mve_pred16_t t) {
  float32x4_t a = vdupq_n_f32(0.0f);
  for (int32_t j = n; j > 0; --j) {
    a = vfmaq_n_f32(a, Kv::LoadZ(v, t), *p++);
    v += vs;
  }
  vstrwq_p_f32(out, vmulq_n_f32(a, scale), t);
}

// out[0..dv) += pj v[0..dv).
template <class Kv>
inline void Accumulate1(float* out, const typename Kv::T* v, float pj,
                        int32_t dv) {
  for (int32_t c = 0; c < dv; c += 4) {
    const mve_pred16_t t = vctp32q(static_cast<uint32_t>(dv - c));
    const float32x4_t o = vldrwq_z_f32(out + c, t);
    vstrwq_p_f32(out + c, vfmaq_n_f32(o, Kv::LoadZ(v + c, t), pj), t);
  }
}

// out = scale * sum_j p_j v_j over the n keys (v_j = v + j * vs; I8: the
// p_j already times v_j's scale, ScaleByRows). Without a zero weight,
// columns are produced 16 at a time in registers and written once;
// otherwise a hidden key (p_j == 0) must never touch out (0 * inf would be
// NaN), as in the reference, and rows are accumulated key by key.
template <class Kv>
__attribute__((noinline)) void WeightedRow(const float* p,
                                           const typename Kv::T* v, int32_t n,
                                           int32_t dv, size_t vs, float scale,
                                           bool has_zero, float* out) {
  if (!has_zero) {
    int32_t c = 0;
    for (; c + 16 <= dv; c += 16) {
      Weighted16<Kv>(p, v + c, n, vs, scale, out + c);
    }
    for (; c < dv; c += 4) {
      Weighted4<Kv>(p, v + c, n, vs, scale, out + c,
                    vctp32q(static_cast<uint32_t>(dv - c)));
    }
    return;
  }
  for (int32_t c = 0; c < dv; c += 4) {
    vstrwq_p_f32(out + c, vdupq_n_f32(0.0f),
                 vctp32q(static_cast<uint32_t>(dv - c)));
  }
  for (int32_t j = 0; j < n; ++j) {
    if (p[j] != 0.0f) Accumulate1<Kv>(out, v + j * vs, p[j], dv);
  }
  for (int32_t c = 0; c < dv; c += 4) {
    const mve_pred16_t t = vctp32q(static_cast<uint32_t>(dv - c));
    vstrwq_p_f32(out + c, vmulq_n_f32(vldrwq_z_f32(out + c, t), scale), t);
  }
}

// p[j] *= sc[j * sst] for j < n: the weights of an I8 row times their
// value rows' scales, once per row rather than once per 16 columns. A zero
// weight (a hidden key) stays 0 whatever the scale, so that WeightedRow
// still skips it.
__attribute__((noinline)) void ScaleByRows(float* p, int32_t n, const float* sc,
                                           size_t sst) {
  const uint32x4_t at =
      vmulq_n_u32(vidupq_n_u32(0, 1), static_cast<uint32_t>(sst));
  for (int32_t j = 0; j < n; j += 4, p += 4, sc += 4 * sst) {
    const mve_pred16_t t = vctp32q(static_cast<uint32_t>(n - j));
    const float32x4_t s = sst == 1
                              ? vldrwq_z_f32(sc, t)
                              : vldrwq_gather_shifted_offset_z_f32(sc, at, t);
    const float32x4_t w = vldrwq_z_f32(p, t);
    vstrwq_p_f32(p, vmulq_m_f32(w, w, s, vcmpneq_m_n_f32(w, 0.0f, t)), t);
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
  const void* k;      // row 0 of K for (b, kv head), rows ks elements apart
  const void* v;      // row 0 of V for (b, kv head), rows vs elements apart
  const float* bias;  // BiasRow(p, b, h, 0) (rows kv_len apart), or NULL
  size_t q_st, out_st, ks, vs;
  // I8: the scales of K's and V's row 0, rows ksc_st and vsc_st apart
  // (set for the other types too, not for F32).
  const float *ksc, *vsc;
  size_t ksc_st, vsc_st;
  size_t row0;  // dense index of row 0 (weights, lse)
  int64_t b;
  float factor, slope, sink;  // ScoreFactor, AlibiSlope, RowSink
};

// Query row i of head `hd` of p, K and V of element type Kv.
template <class Kv>
__attribute__((noinline)) void Row(const Problem& p, const Head& hd, size_t i,
                                   float* scores) {
  using T = typename Kv::T;
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
  const T* k = static_cast<const T*>(hd.k) + static_cast<size_t>(lo) * hd.ks;
  const T* v = static_cast<const T*>(hd.v) + static_cast<size_t>(lo) * hd.vs;
  float* s = scores + lo;
  const float* bias = hd.bias != nullptr ? hd.bias + i * lk + lo : nullptr;
  // With softcap the bias comes after it, in Epilogue.
  const bool capped = p.softcap > 0.0f;
  const float* score_bias = capped ? nullptr : bias;
  float max_score;
  if constexpr (Kv::kScaled) {
    const float* sc = hd.ksc + static_cast<size_t>(lo) * hd.ksc_st;
    max_score = p.score == QKV_SCORE_GAUSSIAN
                    ? ScoreRowI8<true>(q, k, n, d, hd.ks, hd.factor, score_bias,
                                       s, sc, hd.ksc_st)
                    : ScoreRowI8<false>(q, k, n, d, hd.ks, hd.factor,
                                        score_bias, s, sc, hd.ksc_st);
  } else {
    max_score =
        p.score == QKV_SCORE_GAUSSIAN
            ? ScoreRow<true, Kv>(q, k, n, d, hd.ks, hd.factor, score_bias, s)
            : ScoreRow<false, Kv>(q, k, n, d, hd.ks, hd.factor, score_bias, s);
  }
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
    if constexpr (Kv::kScaled) {
      // The weights are the exps before the value rows' scales join them.
      if (p.weights != nullptr || p.lse != nullptr) {
        RowExtras(p, hd.row0 + i, scores, lo, n, f);
      }
      ScaleByRows(s, n, hd.vsc + static_cast<size_t>(lo) * hd.vsc_st,
                  hd.vsc_st);
    }
    WeightedRow<Kv>(s, v, n, dv, hd.vs, f.scale, has_zero, out);
  } else {
    for (int32_t c = 0; c < dv; c += 4) {
      vstrwq_p_f32(out + c, vdupq_n_f32(0.0f),
                   vctp32q(static_cast<uint32_t>(dv - c)));
    }
  }
  if ((p.weights != nullptr || p.lse != nullptr) && !(Kv::kScaled && any)) {
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
  if (kLowPrecisionKv && p.kv_dtype != QKV_DTYPE_F32) {
    const KvSource keys = KeySource(p, hd.b, kvh);
    const KvSource values = ValueSource(p, hd.b, kvh);
    hd.k = keys.base;
    hd.v = values.base;
    hd.ksc = keys.scales;
    hd.vsc = values.scales;
    hd.ksc_st = static_cast<size_t>(keys.scale_st);
    hd.vsc_st = static_cast<size_t>(values.scale_st);
  } else {
    hd.k = KeysOf(p, hd.b, kvh);
    hd.v = ValuesOf(p, hd.b, kvh);
  }
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
  float* scores = reinterpret_cast<float*>(workspace);
  if (kLowPrecisionKv && p.kv_dtype != QKV_DTYPE_F32) {
    for (size_t i = i0; i < i1; ++i) {
      if (p.kv_dtype == QKV_DTYPE_F16) {
        Row<F16Kv>(p, hd, i, scores);
      } else if (p.kv_dtype == QKV_DTYPE_BF16) {
        Row<BF16Kv>(p, hd, i, scores);
      } else {
        Row<I8Kv>(p, hd, i, scores);
      }
    }
    return;
  }
  for (size_t i = i0; i < i1; ++i) Row<F32Kv>(p, hd, i, scores);
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
