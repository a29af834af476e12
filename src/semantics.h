// What a query row sees and how its scores and results are finished: the
// definitions every engine shares (reference, Helium and the SIMD pipeline,
// src/pipeline/flash-inl.h), so that a new mask or score variant is defined
// once here and the engines differ only in how they compute it.
//
//   score  s_j = epilogue(a(q, k_j))  (the score kind's factor, then bias;
//                                      a -inf bias hides the key)
//   keys   row (b, h, i) sees keys j in [lo, hi) (RowKeys), the bias may
//          hide more inside that interval
//   finish m = max_j s_j, l = sum_j exp(s_j - m):
//          out = sum_j exp(s_j - m) v_j / l, lse = m + log(l); a row with no
//          visible key (l = 0) gets out 0, weights 0 and lse -inf.
//
// ISA safety: this header is compiled into objects built for different
// instruction sets (the per-target SIMD engines). Everything here has
// internal linkage (an unnamed namespace), so no copy compiled with, say,
// AVX-512 flags can be the one the linker picks for code that runs on an
// AVX2 machine. tests/check_single_definition.sh checks libqkv.a for that.
#ifndef QKV_SRC_SEMANTICS_H_
#define QKV_SRC_SEMANTICS_H_

#include <math.h>
#include <stdint.h>

#include "engine.h"

namespace qkv {
namespace {  // NOLINT(build/namespaces): internal linkage, see above

// The keys a row may see before bias: [lo, hi), 0 <= lo <= hi <= kv_len.
struct KeyInterval {
  int64_t lo, hi;
};

// Row i of batch b (any query head: the masks do not depend on it). Causal
// is aligned to the end of the keys (query i has position
// i + kv_len - q_len); valid lengths cut the suffix from position valid_len.
inline KeyInterval RowKeys(const Problem& p, int64_t b, int64_t i) {
  int64_t hi = p.kv_len;
  if (p.causal) {
    const int64_t c = i + p.kv_len - p.q_len + 1;
    hi = c < hi ? c : hi;
  }
  if (p.valid_lens != nullptr) {
    const int64_t vl =
        p.valid_lens[p.valid_lens_per_query ? b * p.q_len + i : b];
    hi = vl < hi ? vl : hi;
  }
  KeyInterval k;
  k.lo = 0;
  k.hi = hi < 0 ? 0 : hi;
  return k;
}

// True when every row of every batch sees the same keys (RowKeys does not
// depend on the row): then RowKeys(p, 0, 0) serves them all. Keep in step
// with RowKeys when a mask is added.
inline bool RowsShareKeys(const Problem& p) {
  return !p.causal && p.valid_lens == nullptr;
}

// Bias row for (batch b, query head h, query i), or NULL without a bias.
inline const float* BiasRow(const Problem& p, int64_t b, int64_t h, int64_t i) {
  if (p.bias == nullptr) return nullptr;
  return p.bias + b * p.bias_batch_stride + h * p.bias_head_stride +
         i * p.kv_len;
}

// The factor the score kind applies to its raw sum: scale for DOT, -scale
// for GAUSSIAN (s = -scale * |q - k|^2), 1 for ADDITIVE.
inline float ScoreFactor(const Problem& p) {
  if (p.score == QKV_SCORE_GAUSSIAN) return -p.scale;
  if (p.score == QKV_SCORE_ADDITIVE) return 1.0f;
  return p.scale;
}

// A score plus its bias: a -inf bias hides the key whatever the score (even
// NaN from a key with NaN in it).
inline float WithBias(float s, float bias) {
  return bias == -INFINITY ? -INFINITY : s + bias;
}

// How a row's results follow from its running max m and sum l.
struct RowFinish {
  bool seen;    // some key was visible (l > 0)
  float inv_l;  // 1 / l, or 0
};

inline RowFinish FinishRow(float l) {
  RowFinish f;
  f.seen = l > 0.0f;
  f.inv_l = f.seen ? 1.0f / l : 0.0f;
  return f;
}

// The row's log-sum-exp: m + log(l), or -inf when it saw no key. Computed
// only when the caller asked for lse (a logf per row).
inline float RowLse(float m, float l) {
  return l > 0.0f ? m + logf(l) : -INFINITY;
}

}  // namespace
}  // namespace qkv

#endif  // QKV_SRC_SEMANTICS_H_
