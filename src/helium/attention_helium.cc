// The Helium engine: f32 attention with Arm's M-profile Vector Extension
// (MVE, "Helium": 8 x 128-bit Q registers, 4 f32 lanes) for Cortex-M55/M85.
//
// The same plan as the reference engine (tasks of 16 query rows of one
// head, an exact two-pass softmax per row, the same workspace: kv_len
// floats of scores per worker, so QKV_REFERENCE_WORKSPACE_SIZE holds), with
// the inner loops in vectors:
//  - scores: 4 keys at a time. One q vector is loaded per 4 dimensions and
//    multiplied into 4 accumulators (one per key), reading K in its natural
//    layout; the 4 accumulators are reduced to one vector of 4 scores through
//    an interleaving VLD4 (MVE has no float across-vector add), so scores
//    are written 4 at a time. Dimensions that are not a multiple of 4 use
//    tail-predicated (zeroing) loads.
//  - softmax: max with VMAXNMV, exp on 4 lanes (below), sum in a vector.
//  - output: 4 keys per pass over the output row, out += p_j v_j as
//    VFMA-by-scalar, tails predicated; a hidden key (p_j == 0) never touches
//    out, as in the reference.
//  - additive scores use the reference engine's code (tanh is scalar libm).
//
// exp: x = n ln2 + r, n = round(x log2 e), |r| <= ln2/2 with ln2 split in
// two parts; exp(r) by its Taylor polynomial to degree 7 (truncation
// < 6e-9 relative), 2^n put into the exponent. Max error 2 ulp on [-87, 0];
// x < -87 (terms under 1e-38 of the row's largest) gives 0, as does -inf;
// NaN stays NaN.
#include <arm_mve.h>
#include <math.h>

#include "engine.h"

namespace qkv {
namespace {

constexpr int64_t kRowsPerTask = 16;  // as the reference: same tasks

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

inline mve_pred16_t Tail(int64_t n) {
  return vctp32q(static_cast<uint32_t>(n < 4 ? n : 4));
}

inline float32x4_t ExpNonPositive(float32x4_t x) {
  const float32x4_t lowest = vdupq_n_f32(-87.0f);
  const mve_pred16_t tiny = vcmpltq_f32(x, lowest);
  const float32x4_t xc = vmaxnmq_f32(x, lowest);
  const int32x4_t n = vcvtnq_s32_f32(vmulq_n_f32(xc, 1.44269504088896341f));
  const float32x4_t nf = vcvtq_f32_s32(n);
  float32x4_t r = vfmaq_n_f32(xc, nf, -0.693145751953125f);
  r = vfmaq_n_f32(r, nf, -1.428606765330187045e-6f);
  float32x4_t poly = vdupq_n_f32(1.0f / 5040.0f);
  poly = vfmaq_f32(vdupq_n_f32(1.0f / 720.0f), poly, r);
  poly = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), poly, r);
  poly = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), poly, r);
  poly = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), poly, r);
  poly = vfmaq_f32(vdupq_n_f32(0.5f), poly, r);
  poly = vfmaq_f32(vdupq_n_f32(1.0f), poly, r);
  poly = vfmaq_f32(vdupq_n_f32(1.0f), poly, r);
  const float32x4_t scale =
      vreinterpretq_f32_s32(vshlq_n_s32(vaddq_n_s32(n, 127), 23));
  const float32x4_t e =
      vpselq_f32(vdupq_n_f32(0.0f), vmulq_f32(poly, scale), tiny);
  return vpselq_f32(x, e, vcmpneq_f32(x, x));  // NaN stays NaN
}

// Sum of the 4 lanes.
inline float AddLanes(float32x4_t v) {
  return (vgetq_lane_f32(v, 0) + vgetq_lane_f32(v, 1)) +
         (vgetq_lane_f32(v, 2) + vgetq_lane_f32(v, 3));
}

// Scores of keys k0..k3 (rows of length d) against q, as one vector:
// DOT gives q . k_u, GAUSSIAN gives |q - k_u|^2.
template <bool kGaussian>
inline void Step4(float32x4_t qv, float32x4_t x0, float32x4_t x1,
                  float32x4_t x2, float32x4_t x3, float32x4_t* a0,
                  float32x4_t* a1, float32x4_t* a2, float32x4_t* a3) {
  if (kGaussian) {
    const float32x4_t e0 = vsubq_f32(qv, x0), e1 = vsubq_f32(qv, x1);
    const float32x4_t e2 = vsubq_f32(qv, x2), e3 = vsubq_f32(qv, x3);
    *a0 = vfmaq_f32(*a0, e0, e0);
    *a1 = vfmaq_f32(*a1, e1, e1);
    *a2 = vfmaq_f32(*a2, e2, e2);
    *a3 = vfmaq_f32(*a3, e3, e3);
  } else {
    *a0 = vfmaq_f32(*a0, qv, x0);
    *a1 = vfmaq_f32(*a1, qv, x1);
    *a2 = vfmaq_f32(*a2, qv, x2);
    *a3 = vfmaq_f32(*a3, qv, x3);
  }
}

// Scores of keys k0..k3 (rows of length d) against q, as one vector:
// DOT gives q . k_u, GAUSSIAN gives |q - k_u|^2. Loop counters are 32-bit
// (a row fits: on a 32-bit MCU every element count fits size_t).
template <bool kGaussian>
inline float32x4_t Scores4(const float* q, const float* k0, const float* k1,
                           const float* k2, const float* k3, int32_t d) {
  float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
  int32_t t = 0;
  for (; t + 4 <= d; t += 4) {
    Step4<kGaussian>(vld1q_f32(q + t), vld1q_f32(k0 + t), vld1q_f32(k1 + t),
                     vld1q_f32(k2 + t), vld1q_f32(k3 + t), &a0, &a1, &a2,
                     &a3);
  }
  if (t < d) {  // zeroing loads: the missing lanes add 0
    const mve_pred16_t p = vctp32q(static_cast<uint32_t>(d - t));
    Step4<kGaussian>(vldrwq_z_f32(q + t, p), vldrwq_z_f32(k0 + t, p),
                     vldrwq_z_f32(k1 + t, p), vldrwq_z_f32(k2 + t, p),
                     vldrwq_z_f32(k3 + t, p), &a0, &a1, &a2, &a3);
  }
  // Transpose through memory: VLD4 de-interleaves [a0 a1 a2 a3] so that
  // lane u of every result vector comes from a_u.
  float buf[16];
  vst1q_f32(buf, a0);
  vst1q_f32(buf + 4, a1);
  vst1q_f32(buf + 8, a2);
  vst1q_f32(buf + 12, a3);
  const float32x4x4_t tr = vld4q_f32(buf);
  return vaddq_f32(vaddq_f32(tr.val[0], tr.val[1]),
                   vaddq_f32(tr.val[2], tr.val[3]));
}

template <bool kGaussian>
void ScoreRow(const Problem& p, const float* q, const float* k,
              int64_t visible, const float* bias, float* scores) {
  const int64_t d = p.head_dim;
  const float factor = kGaussian ? -p.scale : p.scale;
  const float32x4_t neg_inf = vdupq_n_f32(-INFINITY);
  for (int64_t j = 0; j < visible; j += 4) {
    const int64_t n = visible - j < 4 ? visible - j : 4;
    // Missing keys of the last group repeat key j (never past the caller's
    // K); their lanes are not stored.
    const float* k0 = k + j * d;
    const float* k1 = n > 1 ? k0 + d : k0;
    const float* k2 = n > 2 ? k0 + 2 * d : k0;
    const float* k3 = n > 3 ? k0 + 3 * d : k0;
    float32x4_t s = vmulq_n_f32(
        Scores4<kGaussian>(q, k0, k1, k2, k3, static_cast<int32_t>(d)),
        factor);
    const mve_pred16_t tail = Tail(n);
    if (bias != nullptr) {
      // -inf hides the key whatever its score (even NaN from a bad key).
      const float32x4_t b = vldrwq_z_f32(bias + j, tail);
      s = vpselq_f32(neg_inf, vaddq_f32(s, b), vcmpeqq_f32(b, neg_inf));
    }
    vstrwq_p_f32(scores + j, s, tail);
  }
}

// out[0..dv) += sum_u p_u v_u for the keys given (all p_u != 0).
inline void Accumulate4(float* out, const float* v0, const float* v1,
                        const float* v2, const float* v3, float p0, float p1,
                        float p2, float p3, int32_t dv) {
  int32_t c = 0;
  for (; c + 4 <= dv; c += 4) {
    float32x4_t o = vld1q_f32(out + c);
    o = vfmaq_n_f32(o, vld1q_f32(v0 + c), p0);
    o = vfmaq_n_f32(o, vld1q_f32(v1 + c), p1);
    o = vfmaq_n_f32(o, vld1q_f32(v2 + c), p2);
    o = vfmaq_n_f32(o, vld1q_f32(v3 + c), p3);
    vst1q_f32(out + c, o);
  }
  if (c < dv) {
    const mve_pred16_t t = vctp32q(static_cast<uint32_t>(dv - c));
    float32x4_t o = vldrwq_z_f32(out + c, t);
    o = vfmaq_n_f32(o, vldrwq_z_f32(v0 + c, t), p0);
    o = vfmaq_n_f32(o, vldrwq_z_f32(v1 + c, t), p1);
    o = vfmaq_n_f32(o, vldrwq_z_f32(v2 + c, t), p2);
    o = vfmaq_n_f32(o, vldrwq_z_f32(v3 + c, t), p3);
    vstrwq_p_f32(out + c, o, t);
  }
}

inline void Accumulate1(float* out, const float* v, float pj, int64_t dv) {
  for (int64_t c = 0; c < dv; c += 4) {
    const mve_pred16_t t = Tail(dv - c);
    const float32x4_t o = vldrwq_z_f32(out + c, t);
    vstrwq_p_f32(out + c, vfmaq_n_f32(o, vldrwq_z_f32(v + c, t), pj), t);
  }
}

void RunTask(const Problem& p, size_t task, const unsigned char* shared,
             unsigned char* workspace) {
  if (p.score == QKV_SCORE_ADDITIVE) {
    ReferenceEngine()->run_task(p, task, shared, workspace);
    return;
  }
  const int64_t blocks = RowBlocks(p);
  const int64_t bh = static_cast<int64_t>(task) / blocks;
  const int64_t b = bh / p.q_heads;
  const int64_t h = bh % p.q_heads;
  const int64_t kvh = h / p.group;
  const int64_t i0 = (static_cast<int64_t>(task) % blocks) * kRowsPerTask;
  const int64_t i1 = i0 + kRowsPerTask < p.q_len ? i0 + kRowsPerTask : p.q_len;
  const int64_t d = p.head_dim, dv = p.value_dim, lk = p.kv_len;
  const float* k = p.k + (b * p.kv_heads + kvh) * lk * d;
  const float* v = p.v + (b * p.kv_heads + kvh) * lk * dv;
  float* scores = reinterpret_cast<float*>(workspace);
  const bool gaussian = p.score == QKV_SCORE_GAUSSIAN;

  for (int64_t i = i0; i < i1; ++i) {
    const int64_t row = (b * p.q_heads + h) * p.q_len + i;
    const float* q = p.q + row * d;
    float* out = p.out + row * dv;
    const int64_t visible = VisibleKeys(p, b, i);
    const float* bias = BiasRow(p, b, h, i);
    if (gaussian) {
      ScoreRow<true>(p, q, k, visible, bias, scores);
    } else {
      ScoreRow<false>(p, q, k, visible, bias, scores);
    }

    // Max (NaN scores are ignored, as the reference's `s > max` does).
    float max_score = -INFINITY;
    for (int64_t j = 0; j < visible; j += 4) {
      const mve_pred16_t t = Tail(visible - j);
      max_score = vmaxnmvq_p_f32(max_score, vldrwq_z_f32(scores + j, t), t);
    }
    float sum = 0.0f;
    if (max_score != -INFINITY) {
      float32x4_t acc = vdupq_n_f32(0.0f);
      const int32_t n = static_cast<int32_t>(visible);
      for (int32_t j = 0; j < n; j += 4) {
        const mve_pred16_t t = vctp32q(static_cast<uint32_t>(n - j));
        const float32x4_t e = ExpNonPositive(
            vsubq_n_f32(vldrwq_z_f32(scores + j, t), max_score));
        vstrwq_p_f32(scores + j, e, t);
        acc = vaddq_m_f32(acc, acc, e, t);
      }
      sum = AddLanes(acc);
    }
    const float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;

    for (int64_t c = 0; c < dv; c += 4) {
      vstrwq_p_f32(out + c, vdupq_n_f32(0.0f), Tail(dv - c));
    }
    if (sum > 0.0f) {
      int64_t j = 0;
      for (; j + 4 <= visible; j += 4) {
        const float p0 = scores[j], p1 = scores[j + 1];
        const float p2 = scores[j + 2], p3 = scores[j + 3];
        const float* vj = v + j * dv;
        if (p0 != 0.0f && p1 != 0.0f && p2 != 0.0f && p3 != 0.0f) {
          Accumulate4(out, vj, vj + dv, vj + 2 * dv, vj + 3 * dv, p0, p1, p2,
                      p3, static_cast<int32_t>(dv));
        } else {  // a hidden key never touches out (0 * inf would be NaN)
          for (int64_t u = 0; u < 4; ++u) {
            if (scores[j + u] != 0.0f) {
              Accumulate1(out, vj + u * dv, scores[j + u], dv);
            }
          }
        }
      }
      for (; j < visible; ++j) {
        if (scores[j] != 0.0f) Accumulate1(out, v + j * dv, scores[j], dv);
      }
      for (int64_t c = 0; c < dv; c += 4) {
        const mve_pred16_t t = Tail(dv - c);
        vstrwq_p_f32(out + c, vmulq_n_f32(vldrwq_z_f32(out + c, t), inv_sum),
                     t);
      }
    }
    if (p.weights != nullptr) {
      float* w = p.weights + row * lk;
      const int64_t shown = sum > 0.0f ? visible : 0;
      for (int64_t j = 0; j < shown; j += 4) {
        const mve_pred16_t t = Tail(shown - j);
        vstrwq_p_f32(w + j, vmulq_n_f32(vldrwq_z_f32(scores + j, t), inv_sum),
                     t);
      }
      for (int64_t j = shown; j < lk; ++j) w[j] = 0.0f;
    }
    if (p.lse != nullptr) {
      p.lse[row] = sum > 0.0f ? max_score + logf(sum) : -INFINITY;
    }
  }
}

constexpr Engine kHelium = {"helium",           &Supports,
                            &NumTasks,          &NoSharedWorkspace,
                            &WorkspacePerWorker, nullptr,
                            &RunTask};

}  // namespace

const Engine* HeliumEngine() { return &kHelium; }

}  // namespace qkv
