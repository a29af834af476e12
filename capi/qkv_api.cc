// The C ABI boundary: descriptor normalization (struct_size), argument
// validation, status codes, version, engine choice, workspace carving and the
// hand-off to the caller's thread pool. Kernels behind it never validate.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine.h"
#include "qkv/qkv.h"

namespace qkv {
namespace {

// A struct_size beyond this is not a descriptor but a bug: refuse it rather
// than read that much of the caller's memory.
constexpr size_t kMaxStructSize = 4096;

#define QKV_FIELD_END(field)                  \
  (offsetof(qkv_attention_desc, field) +      \
   sizeof(static_cast<qkv_attention_desc*>(nullptr)->field))

// The last field: a struct_size past its end (sizeof, with the padding) is a
// newer caller's descriptor.
static_assert(QKV_FIELD_END(backend) <= sizeof(qkv_attention_desc),
              "backend must be the descriptor's last field");

// One code path reads every struct_size (smaller builds): the field checks
// cost a compare each. Elsewhere the common case, struct_size == sizeof, has
// its own copy of PlanFrom with the checks folded away.
#if defined(__OPTIMIZE_SIZE__)
constexpr bool kOwnSizePath = false;
#else
constexpr bool kOwnSizePath = true;
#endif

float DefaultScale(int64_t head_dim) {
  return head_dim > 0 ? 1.0f / sqrtf(static_cast<float>(head_dim)) : 0.0f;
}

// a * b, or -1 when either is negative or the product overflows int64: a
// failed step carries through a chain of products. Optimizing for size it
// stays out of line (inlined, each is dozens of instructions on a 32-bit
// core), and with the sentinel no product is stored through a pointer.
#if defined(__OPTIMIZE_SIZE__) && defined(__GNUC__)
__attribute__((noinline))
#endif
int64_t Mul(int64_t a, int64_t b) {
  if ((a | b) < 0) return -1;
  uint64_t r;
#if defined(__GNUC__) || defined(__clang__)
  // no division on the hot path
  if (__builtin_mul_overflow(static_cast<uint64_t>(a),
                             static_cast<uint64_t>(b), &r)) {
    return -1;
  }
#else
  if (a != 0 && b > INT64_MAX / a) return -1;
  r = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
#endif
  return r > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(r);
}

// Element count n of floats is addressable: n >= 0 (no failed product), and
// n * 4 bytes fits int64 and size_t.
bool Addressable(int64_t n) {
  constexpr uint64_t kMax =
      (static_cast<uint64_t>(SIZE_MAX) < static_cast<uint64_t>(INT64_MAX)
           ? static_cast<uint64_t>(SIZE_MAX)
           : static_cast<uint64_t>(INT64_MAX)) / 4;
  return n >= 0 && static_cast<uint64_t>(n) <= kMax;
}

// a * b * c * e floats are representable and addressable.
bool Count4(int64_t a, int64_t b, int64_t c, int64_t e) {
  return Addressable(Mul(Mul(Mul(a, b), c), e));
}

struct Range {
  uintptr_t begin, end;
};

// Empty (NULL or no elements) is {0, 0}, which overlaps nothing.
Range RangeOf(const void* p, int64_t elements, size_t element_size) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(p);
  if (p == nullptr || elements == 0) return {0, 0};
  return {b, b + static_cast<uintptr_t>(elements) * element_size};
}

// 1 or 0, bitwise rather than short-circuit (compares without branches
// cost less than mispredicted ones on tiny calls). Ranges come from RangeOf
// (an empty one is {0, 0}, and a non-empty one never begins at 0), so two
// compares decide.
unsigned Overlap(Range a, Range b) {
  return static_cast<unsigned>(a.begin < b.end) &
         static_cast<unsigned>(b.begin < a.end);
}

// Everything a call needs that depends on the descriptor only.
struct Plan {
  Problem problem;
  const Engine* engine;
  size_t workers;
  size_t shared;      // bytes for prepare's results, shared by all tasks
  size_t per_worker;  // bytes of each worker's slice
  size_t workspace;   // total bytes, with alignment slack
  qkv_parallel_for_fn parallel_for;
  void* parallel_ctx;
  const char* backend;  // desc.backend, while the engine is being chosen
};

// Validates the caller's descriptor `d` of struct_size `size` (not the data
// pointers) into `plan`. A field is read only when it lies wholly inside
// `size`; the others are at their defaults: scale 1/sqrt(head_dim), every
// other field 0 or NULL. The descriptor is read where the caller keeps it,
// through a pointer (a reference would let the compiler read past a shorter
// descriptor). kFull: size == sizeof, every field is there.
template <bool kFull>
qkv_status PlanFrom(const qkv_attention_desc* d, size_t size, Plan* plan) {
#define QKV_HAS(field) (kFull || QKV_FIELD_END(field) <= size)
#define QKV_READ(field) (QKV_HAS(field) ? d->field : 0)
  // The sizes have no default: a descriptor without them is invalid.
  if (!QKV_HAS(value_dim)) return QKV_ERR_INVALID_ARGUMENT;
  const int64_t batch = d->batch, q_heads = d->q_heads,
                kv_heads = d->kv_heads, q_len = d->q_len, kv_len = d->kv_len,
                head_dim = d->head_dim, value_dim = d->value_dim;
  if (batch <= 0 || q_heads <= 0 || kv_heads <= 0 || q_len <= 0 ||
      kv_len <= 0 || head_dim <= 0 || value_dim <= 0) {
    return QKV_ERR_INVALID_ARGUMENT;
  }
  // (A 64-bit division is tens of cycles, a good part of a tiny call: the
  // common MHA and MQA shapes skip it.)
  const int64_t group = kv_heads == q_heads ? 1
                        : kv_heads == 1     ? q_heads
                                            : q_heads / kv_heads;
  if (group * kv_heads != q_heads) return QKV_ERR_INVALID_ARGUMENT;
  // An out-of-range enum value is undefined behaviour to read as the enum in
  // C++, and that is exactly what a C caller may pass: read its bytes.
  int32_t score = QKV_SCORE_DOT;
  static_assert(sizeof(score) == sizeof(d->score), "qkv_score is 32 bits");
  if (QKV_HAS(score)) memcpy(&score, &d->score, sizeof(score));
  if (score != QKV_SCORE_DOT && score != QKV_SCORE_GAUSSIAN &&
      score != QKV_SCORE_ADDITIVE) {
    return QKV_ERR_INVALID_ARGUMENT;
  }
  const uint32_t known_masks =
      QKV_MASK_CAUSAL | QKV_MASK_VALID_LENS | QKV_MASK_BIAS;
  const uint32_t mask = QKV_READ(mask);
  if ((mask & ~known_masks) != 0) return QKV_ERR_INVALID_ARGUMENT;
  const float scale = QKV_HAS(scale) ? d->scale : DefaultScale(head_dim);
  if (!isfinite(scale)) return QKV_ERR_INVALID_ARGUMENT;

  // Every element count and byte count must be representable: q, k, v, out
  // and weights (the rows, lse, divide each).
  if (!Count4(batch, q_heads, q_len, head_dim) ||
      !Count4(batch, kv_heads, kv_len, head_dim) ||
      !Count4(batch, kv_heads, kv_len, value_dim) ||
      !Count4(batch, q_heads, q_len, value_dim) ||
      !Count4(batch, q_heads, q_len, kv_len)) {
    return QKV_ERR_INVALID_ARGUMENT;
  }
  // Rows of k and of out (lse): no overflow, the counts above are larger.
  const int64_t kv_rows = batch * kv_heads * kv_len;
  const int64_t n_rows = batch * q_heads * q_len;

  Problem& p = plan->problem;
  memset(&p, 0, sizeof(p));
  p.batch = batch;
  p.q_heads = q_heads;
  p.kv_heads = kv_heads;
  p.q_len = q_len;
  p.kv_len = kv_len;
  p.head_dim = head_dim;
  p.value_dim = value_dim;
  p.group = group;
  p.score = static_cast<qkv_score>(score);
  p.scale = scale;
  p.causal = (mask & QKV_MASK_CAUSAL) != 0;

  if (mask & QKV_MASK_VALID_LENS) {
    const int32_t* valid_lens = QKV_READ(valid_lens);
    const bool per_query = QKV_READ(valid_lens_per_query) != 0;
    if (valid_lens == nullptr) return QKV_ERR_INVALID_ARGUMENT;
    const int64_t n = per_query ? batch * q_len : batch;  // fits: n_rows does
    for (int64_t i = 0; i < n; ++i) {
      if (valid_lens[i] < 0 || valid_lens[i] > kv_len) {
        return QKV_ERR_INVALID_ARGUMENT;
      }
    }
    p.valid_lens = valid_lens;
    p.valid_lens_per_query = per_query;
  }
  if (mask & QKV_MASK_BIAS) {
    const float* bias = QKV_READ(bias);
    const int64_t batch_stride = QKV_READ(bias_batch_stride);
    const int64_t head_stride = QKV_READ(bias_head_stride);
    if (bias == nullptr || batch_stride < 0 || head_stride < 0) {
      return QKV_ERR_INVALID_ARGUMENT;
    }
    // The last element read: (B-1)*sb + (H-1)*sh + Lq*Lk - 1.
    const int64_t last_b = Mul(batch - 1, batch_stride);
    const int64_t last_h = Mul(q_heads - 1, head_stride);
    const int64_t row_block = q_len * kv_len;  // fits: weights' count does
    if (last_b < 0 || last_h < 0 || last_b > INT64_MAX - last_h ||
        last_b + last_h > INT64_MAX - row_block ||
        !Addressable(last_b + last_h + row_block)) {
      return QKV_ERR_INVALID_ARGUMENT;
    }
    p.bias = bias;
    p.bias_batch_stride = batch_stride;
    p.bias_head_stride = head_stride;
  }
  if (score == QKV_SCORE_ADDITIVE) {
    const int64_t hidden = QKV_READ(additive_hidden);
    const float* w_q = QKV_READ(additive_w_q);
    const float* w_k = QKV_READ(additive_w_k);
    const float* w_v = QKV_READ(additive_w_v);
    if (hidden <= 0 || w_q == nullptr || w_k == nullptr || w_v == nullptr ||
        !Addressable(Mul(hidden, head_dim)) ||
        !Addressable(Mul(hidden, kv_len + 1)) ||
        !Addressable(Mul(kv_rows, hidden)) ||
        !Addressable(Mul(n_rows, hidden))) {
      return QKV_ERR_INVALID_ARGUMENT;
    }
    p.additive_hidden = hidden;
    p.w_q = w_q;
    p.w_k = w_k;
    p.w_v = w_v;
  }
  const qkv_parallel_for_fn parallel_for = QKV_READ(parallel_for);
  const size_t num_workers = QKV_READ(num_workers);
  if (parallel_for != nullptr && num_workers == 0) {
    return QKV_ERR_INVALID_ARGUMENT;
  }

  plan->parallel_for = parallel_for;
  plan->parallel_ctx = QKV_READ(parallel_ctx);
  plan->workers = parallel_for != nullptr ? num_workers : 1;
  plan->engine = nullptr;
  // Valid, but maybe not servable here. A longer descriptor with non-zero
  // bytes past ours sets fields this library does not know.
  if (!kFull) {
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(d);
    for (size_t i = sizeof(qkv_attention_desc); i < size; ++i) {
      if (bytes[i] != 0) return QKV_ERR_UNSUPPORTED;
    }
  }
  if (q_len > INT32_MAX || kv_len > INT32_MAX) return QKV_ERR_UNSUPPORTED;
  // MakePlan picks the engine for the backend, once this frame is gone.
  plan->backend = QKV_READ(backend);
  return QKV_OK;
#undef QKV_READ
#undef QKV_HAS
}

// Picks the engine for plan->backend and sizes the workspace.
__attribute__((noinline)) qkv_status ChooseEngine(Plan* plan) {
  const Problem& p = plan->problem;
  const char* backend = plan->backend;
  const Engine* engine = nullptr;
  if (backend != nullptr && backend[0] != '\0') {
    engine = FindEngine(backend);
    if (engine == nullptr || !engine->supports(p)) return QKV_ERR_UNSUPPORTED;
  } else {
    engine = DefaultEngineFor(p);
    if (engine == nullptr) return QKV_ERR_UNSUPPORTED;
  }
  plan->engine = engine;
  plan->shared = engine->shared_workspace(p);
  plan->per_worker = engine->workspace_per_worker(p);
  plan->workspace = 0;
  if (plan->shared != 0 || plan->per_worker != 0) {
    const size_t room = SIZE_MAX - kWorkspaceAlign - plan->shared;
    if (plan->shared > SIZE_MAX / 2 ||
        (plan->per_worker != 0 &&
         plan->per_worker > (plan->workers == 1 ? room : room / plan->workers))) {
      return QKV_ERR_INVALID_ARGUMENT;  // the workspace is not addressable
    }
    plan->workspace = plan->shared + plan->per_worker * plan->workers +
                      kWorkspaceAlign - 1;
  }
  return QKV_OK;
}

// Validates the caller's descriptor and picks the engine. A descriptor of
// any struct_size is read where it is, not copied.
qkv_status MakePlan(const qkv_attention_desc* in, Plan* plan) {
  if (in == nullptr) return QKV_ERR_INVALID_ARGUMENT;
  const size_t size = in->struct_size;
  if (size < sizeof(size_t) || size > kMaxStructSize) {
    return QKV_ERR_INVALID_ARGUMENT;
  }
  const qkv_status st = kOwnSizePath && size == sizeof(qkv_attention_desc)
                            ? PlanFrom<true>(in, size, plan)
                            : PlanFrom<false>(in, size, plan);
  return st == QKV_OK ? ChooseEngine(plan) : st;
}

// The data pointers of a call with valid sizes `p`: q, k, v and out are
// non-NULL; outputs overlap no input, no other output and not the workspace;
// a non-empty workspace is non-NULL. Out of line, so that its ranges are not
// on the stack while the tasks run.
__attribute__((noinline)) bool BuffersValid(const Problem& p,
                                            const void* workspace,
                                            size_t workspace_size) {
  const float *q = p.q, *k = p.k, *v = p.v;
  const float *out = p.out, *weights = p.weights, *lse = p.lse;
  if (q == nullptr || k == nullptr || v == nullptr || out == nullptr) {
    return false;
  }
  const int64_t rows = p.batch * p.q_heads * p.q_len;
  const int64_t kv_rows = p.batch * p.kv_heads * p.kv_len;
  const Range r_out = RangeOf(out, rows * p.value_dim, 4);
  const Range r_w = RangeOf(weights, rows * p.kv_len, 4);
  const Range r_lse = RangeOf(lse, rows, 4);
  const Range outputs[] = {r_out, r_w, r_lse};
  const Range inputs[] = {RangeOf(q, rows * p.head_dim, 4),
                          RangeOf(k, kv_rows * p.head_dim, 4),
                          RangeOf(v, kv_rows * p.value_dim, 4)};
  if (workspace == nullptr && workspace_size != 0) return false;
  const uintptr_t ws = reinterpret_cast<uintptr_t>(workspace);
  const Range r_ws =
      workspace_size == 0 ? Range{0, 0} : Range{ws, ws + workspace_size};
  unsigned overlap = 0;
  for (size_t i = 0; i < 3; ++i) overlap |= Overlap(r_ws, inputs[i]);
  for (size_t i = 0; i < 3; ++i) {
    // Absent outputs (weights, lse) overlap nothing: skipping them is a
    // branch a caller's steady pattern of calls predicts.
    if (outputs[i].end == 0) continue;
    for (size_t j = 0; j < 3; ++j) overlap |= Overlap(outputs[i], inputs[j]);
    for (size_t j = i + 1; j < 3; ++j) {
      overlap |= Overlap(outputs[i], outputs[j]);
    }
    overlap |= Overlap(r_ws, outputs[i]);
  }
  return overlap == 0;
}

struct CallContext {
  const Problem* problem;
  const Engine* engine;
  const unsigned char* shared;
  unsigned char* workers_base;
  size_t per_worker;
  size_t workers;
};

void RunOneTask(void* arg, size_t task, size_t worker) {
  const CallContext* c = static_cast<const CallContext*>(arg);
  // A pool that breaks its contract must not make us write out of bounds.
  if (worker >= c->workers) return;
  c->engine->run_task(*c->problem, task, c->shared,
                      c->workers_base + worker * c->per_worker);
}

// Hands the tasks to the caller's pool (out of line: the context is on the
// stack only on this path).
__attribute__((noinline)) void RunPooled(const Plan& plan, size_t tasks,
                                         const unsigned char* shared,
                                         unsigned char* workers_base) {
  CallContext ctx = {&plan.problem, plan.engine,     shared,
                     workers_base,  plan.per_worker, plan.workers};
  plan.parallel_for(plan.parallel_ctx, tasks, &RunOneTask, &ctx);
}

}  // namespace
}  // namespace qkv

extern "C" {

QKV_API uint32_t qkv_version(void) {
  return (QKV_VERSION_MAJOR << 16) | (QKV_VERSION_MINOR << 8) |
         QKV_VERSION_PATCH;
}

QKV_API const char* qkv_backend(void) { return qkv::EngineAt(0)->name; }

QKV_API size_t qkv_backend_count(void) { return qkv::EngineCount(); }

QKV_API const char* qkv_backend_name(size_t index) {
  const qkv::Engine* e = qkv::EngineAt(index);
  return e != nullptr ? e->name : nullptr;
}

QKV_API const char* qkv_status_string(qkv_status status) {
  int32_t value;  // read as an integer: C callers may pass any value
  static_assert(sizeof(value) == sizeof(status), "qkv_status is 32 bits");
  memcpy(&value, &status, sizeof(value));
  switch (value) {
    case QKV_OK:
      return "ok";
    case QKV_ERR_INVALID_ARGUMENT:
      return "invalid argument: a size, flag, pointer, length or stride "
             "breaks the qkv_attention_desc contract";
    case QKV_ERR_WORKSPACE_TOO_SMALL:
      return "workspace too small: pass at least "
             "qkv_attention_workspace_size(desc) bytes";
    case QKV_ERR_UNSUPPORTED:
      return "unsupported: a valid request this build or CPU cannot serve "
             "(backend, score kind or descriptor field)";
  }
  return "unknown qkv_status value";
}

QKV_API void qkv_attention_desc_init(qkv_attention_desc* desc, int64_t batch,
                                     int64_t q_heads, int64_t kv_heads,
                                     int64_t q_len, int64_t kv_len,
                                     int64_t head_dim, int64_t value_dim) {
  if (desc == nullptr) return;
  memset(desc, 0, sizeof(*desc));
  desc->struct_size = sizeof(*desc);
  desc->batch = batch;
  desc->q_heads = q_heads;
  desc->kv_heads = kv_heads;
  desc->q_len = q_len;
  desc->kv_len = kv_len;
  desc->head_dim = head_dim;
  desc->value_dim = value_dim;
  desc->score = QKV_SCORE_DOT;
  desc->scale = qkv::DefaultScale(head_dim);
  desc->mask = QKV_MASK_NONE;
}

QKV_API size_t qkv_attention_workspace_size(const qkv_attention_desc* desc) {
  qkv::Plan plan;
  return qkv::MakePlan(desc, &plan) == QKV_OK ? plan.workspace : 0;
}

QKV_API qkv_status qkv_attention_f32(const qkv_attention_desc* desc,
                                     const float* q, const float* k,
                                     const float* v, float* out,
                                     float* weights, float* lse,
                                     void* workspace, size_t workspace_size) {
  qkv::Plan plan;
  qkv_status st = qkv::MakePlan(desc, &plan);
  if (st == QKV_ERR_INVALID_ARGUMENT) return st;
  // Past here the sizes in plan.problem are valid even when st says the
  // request is unsupported: every invalid argument is reported first.
  qkv::Problem& p = plan.problem;
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.weights = weights;
  p.lse = lse;
  if (!qkv::BuffersValid(p, workspace, workspace_size)) {
    return QKV_ERR_INVALID_ARGUMENT;
  }
  if (st != QKV_OK) return st;
  if (workspace_size < plan.workspace) return QKV_ERR_WORKSPACE_TOO_SMALL;
  unsigned char* base = nullptr;
  if (plan.workspace != 0) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(workspace);
    const uintptr_t aligned =
        (at + qkv::kWorkspaceAlign - 1) & ~(uintptr_t{qkv::kWorkspaceAlign} - 1);
    base = static_cast<unsigned char*>(workspace) + (aligned - at);
  }
  unsigned char* workers_base = base ? base + plan.shared : nullptr;
  if (plan.engine->prepare != nullptr) plan.engine->prepare(p, base);
  const size_t tasks = plan.engine->num_tasks(p);
  // One task is run inline: waking a pool costs more than a small call.
  if (plan.parallel_for == nullptr || tasks <= 1) {
    for (size_t t = 0; t < tasks; ++t) {
      plan.engine->run_task(p, t, base, workers_base);
    }
  } else {
    qkv::RunPooled(plan, tasks, base, workers_base);
  }
  return QKV_OK;
}

}  // extern "C"
