// The reference engine: plain, portable C++ with no SIMD and no library
// beyond <math.h> and memcpy, so it builds freestanding for
// microcontrollers. It is also the fallback on every CPU and serves all
// three score kinds.
//
// Per query row: scores into the workspace, an exact two-pass softmax (max,
// then exp and sum), then out = sum_j p_j v_j / sum_j p_j. Accumulation is
// f32; the error is a few ulp per term (expf is libm's, <= 1 ulp in glibc and
// newlib).
//
// F16, BF16 and I8 keys and values are dequantized element by element as
// they are read (src/semantics.h's KvElement: F16 and BF16 exactly, I8 as
// scale * q in one f32 rounding), and the arithmetic after that is the f32
// path's, so those results are the f32 results over the dequantized K and V.
// The row loops are one template over how rows are read: F32 through float
// pointers (the code it always was), the other types through a row that
// switches on the type once per row, not per element.
#include <math.h>
#include <string.h>

#include "engine.h"
#include "semantics.h"

namespace qkv {
namespace {

// F16, BF16 and I8 K/V: compiled unless the build says
// QKV_LOW_PRECISION_KV=0 (CMakeLists.txt: microcontrollers by default),
// where the boundary refuses them and an f32-only firmware keeps its size.
#if !defined(QKV_LOW_PRECISION_KV) || QKV_LOW_PRECISION_KV
constexpr bool kLowPrecisionKv = true;
#else
constexpr bool kLowPrecisionKv = false;
#endif

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

bool Supports(const Problem& p) {
  return kLowPrecisionKv || p.kv_dtype == QKV_DTYPE_F32;
}

size_t NumTasks(const Problem& p) {
  return static_cast<size_t>(p.batch * p.q_heads * RowBlocks(p));
}

// Every element type reads K and V in place: no row buffer, so the size is
// QKV_REFERENCE_WORKSPACE_SIZE's whatever kv_dtype is.
size_t WorkspacePerWorker(const Problem& p) {
  size_t floats = static_cast<size_t>(p.kv_len);  // scores of one row
  if (p.score == QKV_SCORE_ADDITIVE) {
    // W_k k_j for every key, then W_q q_i for one row.
    floats += static_cast<size_t>((p.kv_len + 1) * p.additive_hidden);
  }
  return AlignUp(floats * sizeof(float));
}

// ------------------------------------------------ rows of K and V
// The three things the task does with a row x of K or V, for F32 rows
// (const float*) and for the other types (KvRow): a . x, |a - x|^2 and
// out += w x.
float Dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t t = 0; t < n; ++t) s += a[t] * b[t];
  return s;
}

float Distance(const float* a, const float* b, int64_t n) {
  float dist = 0.0f;
  for (int64_t t = 0; t < n; ++t) {
    const float diff = a[t] - b[t];
    dist += diff * diff;
  }
  return dist;
}

void AddScaled(float* out, float w, const float* x, int64_t n) {
  for (int64_t c = 0; c < n; ++c) out[c] += w * x[c];
}

// F32 rows of one (batch, kv head): row j at base + j * st.
struct F32Rows {
  const float* base;
  int64_t st;

  static F32Rows Keys(const Problem& p, int64_t b, int64_t kvh) {
    return F32Rows{KeysOf(p, b, kvh), p.k_st};
  }
  static F32Rows Values(const Problem& p, int64_t b, int64_t kvh) {
    return F32Rows{ValuesOf(p, b, kvh), p.v_st};
  }
  const float* Row(int64_t j) const { return base + j * st; }
};

// One row of an F16, BF16 or I8 K or V, and its I8 scale.
struct KvRow {
  const unsigned char* data;
  qkv_dtype dtype;
  float scale;  // I8 only
};

// Element c of a row of type T, dequantized as KvElement does.
template <qkv_dtype T>
inline float Element(const KvRow& r, int64_t c) {
  if (T == QKV_DTYPE_I8) {
    return r.scale *
           static_cast<float>(reinterpret_cast<const int8_t*>(r.data)[c]);
  }
  uint16_t h;
  memcpy(&h, r.data + 2 * c, 2);
  return T == QKV_DTYPE_F16 ? F16ToF32(h) : BF16ToF32(h);
}

template <qkv_dtype T>
float DotAs(const float* a, const KvRow& r, int64_t n) {
  float s = 0.0f;
  for (int64_t t = 0; t < n; ++t) s += a[t] * Element<T>(r, t);
  return s;
}

template <qkv_dtype T>
float DistanceAs(const float* a, const KvRow& r, int64_t n) {
  float dist = 0.0f;
  for (int64_t t = 0; t < n; ++t) {
    const float diff = a[t] - Element<T>(r, t);
    dist += diff * diff;
  }
  return dist;
}

template <qkv_dtype T>
void AddScaledAs(float* out, float w, const KvRow& r, int64_t n) {
  for (int64_t c = 0; c < n; ++c) out[c] += w * Element<T>(r, c);
}

float Dot(const float* a, const KvRow& r, int64_t n) {
  if (r.dtype == QKV_DTYPE_F16) return DotAs<QKV_DTYPE_F16>(a, r, n);
  if (r.dtype == QKV_DTYPE_BF16) return DotAs<QKV_DTYPE_BF16>(a, r, n);
  return DotAs<QKV_DTYPE_I8>(a, r, n);
}

float Distance(const float* a, const KvRow& r, int64_t n) {
  if (r.dtype == QKV_DTYPE_F16) return DistanceAs<QKV_DTYPE_F16>(a, r, n);
  if (r.dtype == QKV_DTYPE_BF16) return DistanceAs<QKV_DTYPE_BF16>(a, r, n);
  return DistanceAs<QKV_DTYPE_I8>(a, r, n);
}

void AddScaled(float* out, float w, const KvRow& r, int64_t n) {
  if (r.dtype == QKV_DTYPE_F16) return AddScaledAs<QKV_DTYPE_F16>(out, w, r, n);
  if (r.dtype == QKV_DTYPE_BF16) {
    return AddScaledAs<QKV_DTYPE_BF16>(out, w, r, n);
  }
  return AddScaledAs<QKV_DTYPE_I8>(out, w, r, n);
}

// F16, BF16 or I8 rows of one (batch, kv head) (src/semantics.h).
struct KvRows {
  KvSource src;

  static KvRows Keys(const Problem& p, int64_t b, int64_t kvh) {
    return KvRows{KeySource(p, b, kvh)};
  }
  static KvRows Values(const Problem& p, int64_t b, int64_t kvh) {
    return KvRows{ValueSource(p, b, kvh)};
  }
  KvRow Row(int64_t j) const {
    return KvRow{KvRowAt(src, j), src.dtype, RowScale(src, j)};
  }
};

// y[h] = sum_t W[h][t] x[t] for h < hidden.
template <class Vec>
void Project(const float* w, const Vec& x, int64_t hidden, int64_t dim,
             float* y) {
  for (int64_t h = 0; h < hidden; ++h) y[h] = Dot(w + h * dim, x, dim);
}

size_t NoSharedWorkspace(const Problem&) { return 0; }

// The task, with K and V read through Rows (F32Rows or KvRows).
template <class Rows>
void RunRows(const Problem& p, size_t task, unsigned char* workspace) {
  const int64_t blocks = RowBlocks(p);
  const int64_t bh = static_cast<int64_t>(task) / blocks;
  const int64_t b = bh / p.q_heads;
  const int64_t h = bh % p.q_heads;
  const int64_t kvh = h / p.group;
  const int64_t rows = RowsPerTask(p);
  const int64_t i0 = (static_cast<int64_t>(task) % blocks) * rows;
  const int64_t i1 = i0 + rows < p.q_len ? i0 + rows : p.q_len;

  const int64_t d = p.head_dim, dv = p.value_dim, lk = p.kv_len;
  const Rows k = Rows::Keys(p, b, kvh);
  const Rows v = Rows::Values(p, b, kvh);
  float* scores = reinterpret_cast<float*>(workspace);
  float* key_proj = scores + lk;                       // ADDITIVE only
  float* query_proj = key_proj + lk * p.additive_hidden;  // ADDITIVE only
  const int64_t hidden = p.additive_hidden;
  const float slope = AlibiSlope(p, h);
  const float sink = RowSink(p, h);

  if (p.score == QKV_SCORE_ADDITIVE) {
    for (int64_t j = 0; j < lk; ++j) {
      Project(p.w_k, k.Row(j), hidden, d, key_proj + j * hidden);
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
      const auto kj = k.Row(j);
      float s;  // the kind's sum times its factor (src/semantics.h)
      if (p.score == QKV_SCORE_DOT) {
        s = ScoreFactor(p) * Dot(q, kj, d);
      } else if (p.score == QKV_SCORE_GAUSSIAN) {
        const float dist = Distance(q, kj, d);
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
        const auto vj = v.Row(j);
        AddScaled(out, pj, vj, dv);
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

void RunTask(const Problem& p, size_t task, const unsigned char*,
             unsigned char* workspace) {
  if (kLowPrecisionKv && p.kv_dtype != QKV_DTYPE_F32) {
    return RunRows<KvRows>(p, task, workspace);
  }
  return RunRows<F32Rows>(p, task, workspace);
}

}  // namespace

extern const Engine kReferenceEngine = {"reference",         &Supports,
                                        &NumTasks,           &NoSharedWorkspace,
                                        &WorkspacePerWorker, nullptr,
                                        &RunTask};

const Engine* ReferenceEngine() { return &kReferenceEngine; }

}  // namespace qkv
