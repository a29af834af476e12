// The reference engine: plain, portable C++ with no SIMD and no C++ library
// beyond <math.h>, so it builds freestanding for microcontrollers. It is also
// the fallback on every CPU and serves all three score kinds.
//
// Per query row: scores into the workspace, an exact two-pass softmax (max,
// then exp and sum), then out = sum_j p_j v_j / sum_j p_j. Accumulation is
// f32; the error is a few ulp per term (expf is libm's, <= 1 ulp in glibc and
// newlib).
#include <math.h>

#include "engine.h"
#include "semantics.h"

namespace qkv {
namespace {

// Query rows per task for DOT and GAUSSIAN. ADDITIVE takes a whole head per
// task so that the keys are projected once per (batch, head).
constexpr int64_t kRowsPerTask = 16;

int64_t RowsPerTask(const Problem& p) {
  return p.score == QKV_SCORE_ADDITIVE ? p.q_len : kRowsPerTask;
}

int64_t RowBlocks(const Problem& p) {
  const int64_t r = RowsPerTask(p);
  return (p.q_len + r - 1) / r;
}

bool Supports(const Problem&) { return true; }

size_t NumTasks(const Problem& p) {
  return static_cast<size_t>(p.batch * p.q_heads * RowBlocks(p));
}

size_t WorkspacePerWorker(const Problem& p) {
  size_t floats = static_cast<size_t>(p.kv_len);  // scores of one row
  if (p.score == QKV_SCORE_ADDITIVE) {
    // W_k k_j for every key, then W_q q_i for one row.
    floats += static_cast<size_t>((p.kv_len + 1) * p.additive_hidden);
  }
  return AlignUp(floats * sizeof(float));
}

float Dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t t = 0; t < n; ++t) s += a[t] * b[t];
  return s;
}

// y[h] = sum_t W[h][t] x[t] for h < hidden.
void Project(const float* w, const float* x, int64_t hidden, int64_t dim,
             float* y) {
  for (int64_t h = 0; h < hidden; ++h) y[h] = Dot(w + h * dim, x, dim);
}

size_t NoSharedWorkspace(const Problem&) { return 0; }

void RunTask(const Problem& p, size_t task, const unsigned char*,
             unsigned char* workspace) {
  const int64_t blocks = RowBlocks(p);
  const int64_t bh = static_cast<int64_t>(task) / blocks;
  const int64_t b = bh / p.q_heads;
  const int64_t h = bh % p.q_heads;
  const int64_t kvh = h / p.group;
  const int64_t rows = RowsPerTask(p);
  const int64_t i0 = (static_cast<int64_t>(task) % blocks) * rows;
  const int64_t i1 = i0 + rows < p.q_len ? i0 + rows : p.q_len;

  const int64_t d = p.head_dim, dv = p.value_dim, lk = p.kv_len;
  const float* k = KeysOf(p, b, kvh);
  const float* v = ValuesOf(p, b, kvh);
  const int64_t ks = p.k_st, vs = p.v_st;
  float* scores = reinterpret_cast<float*>(workspace);
  float* key_proj = scores + lk;                       // ADDITIVE only
  float* query_proj = key_proj + lk * p.additive_hidden;  // ADDITIVE only
  const int64_t hidden = p.additive_hidden;
  const float slope = AlibiSlope(p, h);
  const float sink = RowSink(p, h);

  if (p.score == QKV_SCORE_ADDITIVE) {
    for (int64_t j = 0; j < lk; ++j) {
      Project(p.w_k, k + j * ks, hidden, d, key_proj + j * hidden);
    }
  }

  for (int64_t i = i0; i < i1; ++i) {
    const int64_t row = (b * p.q_heads + h) * p.q_len + i;
    const float* q = QueryRow(p, b, h, i);
    float* out = OutRow(p, b, h, i);
    float* weights = p.weights ? p.weights + row * lk : nullptr;
    const KeyInterval keys = RowKeys(p, b, i);
    const int64_t pos = QueryPos(p, b, i);
    const float* bias = BiasRow(p, b, h, i);

    if (p.score == QKV_SCORE_ADDITIVE) Project(p.w_q, q, hidden, d, query_proj);
    float max_score = -INFINITY;
    for (int64_t j = keys.lo; j < keys.hi; ++j) {
      const float* kj = k + j * ks;
      float s;  // the kind's sum times its factor (src/semantics.h)
      if (p.score == QKV_SCORE_DOT) {
        s = ScoreFactor(p) * Dot(q, kj, d);
      } else if (p.score == QKV_SCORE_GAUSSIAN) {
        float dist = 0.0f;
        for (int64_t t = 0; t < d; ++t) {
          const float diff = q[t] - kj[t];
          dist += diff * diff;
        }
        s = ScoreFactor(p) * dist;
      } else {
        const float* kp = key_proj + j * hidden;
        s = 0.0f;
        for (int64_t u = 0; u < hidden; ++u) {
          s += p.w_v[u] * tanhf(query_proj[u] + kp[u]);
        }
      }
      // The epilogue, in semantics.h's order.
      if (p.softcap > 0.0f) s = Softcap(s, p.softcap);
      if (bias != nullptr) s = WithBias(s, bias[j]);
      if (slope != 0.0f) s = WithAlibi(s, slope, pos, j);
      scores[j] = s;
      if (s > max_score) max_score = s;
    }

    float sum = 0.0f;
    if (max_score != -INFINITY) {
      for (int64_t j = keys.lo; j < keys.hi; ++j) {
        scores[j] = expf(scores[j] - max_score);
        sum += scores[j];
      }
    }
    // sum >= 1 whenever a key is visible (the max contributes exp(0)).
    const RowFinish f = FinishRow(max_score, sum, sink);
    const bool any = sum > 0.0f;

    for (int64_t c = 0; c < dv; ++c) out[c] = 0.0f;
    if (any) {
      for (int64_t j = keys.lo; j < keys.hi; ++j) {
        const float pj = scores[j];
        if (pj == 0.0f) continue;  // a hidden key never touches out
        const float* vj = v + j * vs;
        for (int64_t c = 0; c < dv; ++c) out[c] += pj * vj[c];
      }
      for (int64_t c = 0; c < dv; ++c) out[c] *= f.scale;
    }
    if (weights != nullptr) {
      for (int64_t j = 0; j < lk; ++j) {
        const bool shown = any && j >= keys.lo && j < keys.hi;
        weights[j] = shown ? scores[j] * f.scale : 0.0f;
      }
    }
    if (p.lse != nullptr) p.lse[row] = RowLse(f);
  }
}

}  // namespace

extern const Engine kReferenceEngine = {"reference",         &Supports,
                                        &NumTasks,           &NoSharedWorkspace,
                                        &WorkspacePerWorker, nullptr,
                                        &RunTask};

const Engine* ReferenceEngine() { return &kReferenceEngine; }

}  // namespace qkv
