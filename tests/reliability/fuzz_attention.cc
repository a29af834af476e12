// libFuzzer target for the C ABI: qkv_attention_desc built from the input
// bytes (every field, hostile sizes, strides, masks, valid lengths, bias,
// NaN/Inf scale and inputs, odd struct_size values, tiny or missing
// workspaces, backend names real and garbage, caller thread pools that run
// tasks in odd orders, and the 0.2 fields: q/k/v/out strides with gaps and
// hostile values, window, kv_start, ALiBi slopes, softcap, q_pos, sinks,
// kv_dtype), called with exact-size heap buffers so that AddressSanitizer
// sees any read or write past them. Elements of q, k and v that the strides
// do not address hold a NaN, and out's must keep their bits.
//
// Checked on every input:
//  - the status is one of the four pinned values, and it is the status the
//    contract predicts wherever the contract pins it (an independent model
//    of the bad-input table below, written from the README, not the code);
//  - a call that fails writes nothing to out, weights or lse (sentinel-filled
//    and compared bit for bit), never calls the caller's pool, and the
//    workspace query agrees (0 for an invalid descriptor);
//  - no input buffer changes;
//  - a call that succeeds wrote every output element (and none of out's
//    gaps), called the pool at most once, is bitwise identical to the same
//    call without a pool, and, when every input is finite and no score can
//    overflow, has finite out and weights in [0, 1] and agrees with the
//    reference engine
//    (desc.backend = "reference") within the Core bound: 5e-5 * max|v| on
//    out and 2e-5 on weights (widened only by the propagated f32 rounding of
//    the scores when scale * |q| * |k| is large; see ScoreErrorBound).
//  - after a successful call, the backward pass on the same descriptor and
//    buffers (CheckBackward): pinned statuses, refused calls (NULL lse or
//    d_out, a short workspace) write nothing, an accepted one writes every
//    addressed gradient element and no gap, is bitwise identical without the
//    pool, and is finite from moderate finite inputs.
// Descriptors whose buffers would exceed kCapFloats (1 MiB) or whose work
// exceeds kCapWork are still called, with tiny buffers and no workspace, when
// the library must refuse them before reading the data.
//
// Input format (bytes read in order; missing bytes read as 0): see RunOne().
// tests/reliability/make_corpus.py writes seeds in this format. The 0.2
// fields come in a block after the seed (items 16-24 below), so inputs
// written before 0.2 decode as before, with the 0.2 features off.
//
// Set QKV_FUZZ_VERBOSE=1 to print each decoded case (for the replay), and
// QKV_FUZZ_SKIP_BACKENDS=name,name to skip calls forced onto those backends
// (to fuzz on past a known, reported bug; never in CTest).
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "qkv/qkv.h"

namespace {

constexpr size_t kCapFloats = size_t{1} << 18;     // 1 MiB over all buffers
constexpr double kCapWork = 3e6;                   // multiply-adds per call
constexpr size_t kMaxStruct = 8192;                // descriptor bytes we give
constexpr size_t kCapWorkspace = size_t{1} << 24;  // larger: none is given
constexpr uint32_t kSentinelBits = 0x7FBADBADu;    // a signalling NaN

bool Verbose() {
  static const bool v = getenv("QKV_FUZZ_VERBOSE") != nullptr;
  return v;
}

bool Skipped(const char* backend) {
  static const char* const skip = getenv("QKV_FUZZ_SKIP_BACKENDS");
  if (skip == nullptr || backend == nullptr || backend[0] == '\0') {
    return false;
  }
  const size_t n = strlen(backend);
  for (const char* at = strstr(skip, backend); at != nullptr;
       at = strstr(at + 1, backend)) {
    const bool starts = at == skip || at[-1] == ',';
    const bool ends = at[n] == '\0' || at[n] == ',';
    if (starts && ends) return true;
  }
  return false;
}

[[noreturn]] void Fail(const char* what, long long a = 0, long long b = 0) {
  fprintf(stderr, "qkv fuzz: CHECK FAILED: %s (%lld, %lld)\n", what, a, b);
  abort();
}
#define CHECK(cond, ...)                        \
  do {                                          \
    if (!(cond)) Fail(#cond " : " __VA_ARGS__); \
  } while (0)

// ---------------------------------------------------------------- input
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  uint8_t U8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }
  uint32_t U32() { return U16() | (static_cast<uint32_t>(U16()) << 16); }
  uint64_t U64() { return U32() | (static_cast<uint64_t>(U32()) << 32); }
  float F32() {
    const uint32_t u = U32();
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
  }

 private:
  const uint8_t* p_;
  size_t n_;
};

// Deterministic data from the input's seed (so a short input can describe a
// large buffer).
struct Rng {
  uint64_t s;
  uint64_t Next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  float Uniform(float lo, float hi) {
    const float u = static_cast<float>(Next() >> 40) / 16777216.0f;
    return lo + (hi - lo) * u;
  }
};

// ---------------------------------------------------------------- model
// Field end offsets of the descriptor, from the public header.
struct Field {
  size_t offset, size;
};
#define QKV_F(name)                                  \
  Field {                                            \
    offsetof(qkv_attention_desc, name),              \
        sizeof(((qkv_attention_desc*)nullptr)->name) \
  }
const Field kFields[] = {
    QKV_F(struct_size),
    QKV_F(batch),
    QKV_F(q_heads),
    QKV_F(kv_heads),
    QKV_F(q_len),
    QKV_F(kv_len),
    QKV_F(head_dim),
    QKV_F(value_dim),
    QKV_F(score),
    QKV_F(scale),
    QKV_F(mask),
    QKV_F(valid_lens),
    QKV_F(valid_lens_per_query),
    QKV_F(bias),
    QKV_F(bias_batch_stride),
    QKV_F(bias_head_stride),
    QKV_F(additive_hidden),
    QKV_F(additive_w_q),
    QKV_F(additive_w_k),
    QKV_F(additive_w_v),
    QKV_F(parallel_for),
    QKV_F(parallel_ctx),
    QKV_F(num_workers),
    QKV_F(backend),
    // 0.2
    QKV_F(kv_dtype),
    QKV_F(k_scales),
    QKV_F(v_scales),
    QKV_F(q_strides),
    QKV_F(k_strides),
    QKV_F(v_strides),
    QKV_F(out_strides),
    QKV_F(k_scale_strides),
    QKV_F(v_scale_strides),
    QKV_F(window_left),
    QKV_F(window_right),
    QKV_F(alibi_slopes),
    QKV_F(softcap),
    QKV_F(q_pos),
    QKV_F(sinks),
    QKV_F(kv_start),
};
#undef QKV_F
// Fields up to `backend` (0.1): the struct_size table of the input format
// lists their ends first, so that its indices keep their meaning.
constexpr size_t kFieldsBefore02 = 24;
static_assert(sizeof(kFields) / sizeof(kFields[0]) > kFieldsBefore02,
              "field table");

// What a library reading `size` bytes of `bytes` sees (README: fields wholly
// inside struct_size are read, the rest default: scale to 1/sqrt(head_dim),
// everything else to zero/NULL). *newer: bytes past our struct are non-zero.
qkv_attention_desc Effective(const unsigned char* bytes, size_t size,
                             bool* newer) {
  qkv_attention_desc e;
  memset(&e, 0, sizeof e);
  e.score = QKV_SCORE_DOT;
  bool scale_read = false;
  for (const Field& f : kFields) {
    if (f.offset + f.size <= size) {
      memcpy(reinterpret_cast<unsigned char*>(&e) + f.offset, bytes + f.offset,
             f.size);
      if (f.offset == offsetof(qkv_attention_desc, scale)) scale_read = true;
    }
  }
  if (!scale_read) {
    e.scale =
        e.head_dim > 0 ? 1.0f / sqrtf(static_cast<float>(e.head_dim)) : 0.0f;
  }
  *newer = false;
  for (size_t i = sizeof(qkv_attention_desc); i < size; ++i) {
    if (bytes[i] != 0) *newer = true;
  }
  e.struct_size = sizeof e;
  return e;
}

bool Mul(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
bool Mul4(int64_t a, int64_t b, int64_t c, int64_t d, int64_t* out) {
  int64_t x, y;
  return Mul(a, b, &x) && Mul(x, c, &y) && Mul(y, d, out);
}
// n floats are addressable: 4n fits int64 and size_t.
bool Addressable(int64_t n) {
  int64_t bytes;
  return n >= 0 && Mul(n, 4, &bytes);
}

// Element counts of a descriptor whose sizes are valid: batch, q_len and
// kv_len >= 0, the others > 0 (dense counts; the strides come later).
struct Counts {
  bool ok = false;  // every count fits
  int64_t q, k, v, out, weights, rows, bias, valid_lens, w_qk, w_v;
};

Counts CountsOf(const qkv_attention_desc& e) {
  Counts c;
  const int64_t positive[] = {e.q_heads, e.kv_heads, e.head_dim,
                              e.value_dim};
  for (int64_t s : positive) {
    if (s <= 0) return c;
  }
  // 0.2: batch, q_len and kv_len may be 0 (an empty call).
  if (e.batch < 0 || e.q_len < 0 || e.kv_len < 0) return c;
  if (!Mul4(e.batch, e.q_heads, e.q_len, e.head_dim, &c.q) ||
      !Mul4(e.batch, e.kv_heads, e.kv_len, e.head_dim, &c.k) ||
      !Mul4(e.batch, e.kv_heads, e.kv_len, e.value_dim, &c.v) ||
      !Mul4(e.batch, e.q_heads, e.q_len, e.value_dim, &c.out) ||
      !Mul4(e.batch, e.q_heads, e.q_len, e.kv_len, &c.weights) ||
      !Mul4(e.batch, e.q_heads, e.q_len, 1, &c.rows)) {
    return c;
  }
  const int64_t all[] = {c.q, c.k, c.v, c.out, c.weights, c.rows};
  for (int64_t n : all) {
    if (!Addressable(n)) return c;
  }
  c.valid_lens = e.valid_lens_per_query ? e.batch * e.q_len : e.batch;
  c.bias = -1;  // unknown until the strides are checked
  if (e.bias_batch_stride >= 0 && e.bias_head_stride >= 0) {
    int64_t lb, lh, blk;
    if (Mul(e.batch > 0 ? e.batch - 1 : 0, e.bias_batch_stride, &lb) &&
        Mul(e.q_heads - 1, e.bias_head_stride, &lh) &&
        Mul(e.q_len, e.kv_len, &blk) && lb <= INT64_MAX - lh &&
        lb + lh <= INT64_MAX - blk && Addressable(lb + lh + blk)) {
      c.bias = lb + lh + blk;
    }
  }
  c.w_qk = -1;
  c.w_v = e.additive_hidden;
  int64_t w;
  if (e.additive_hidden > 0 && Mul(e.additive_hidden, e.head_dim, &w) &&
      Addressable(w)) {
    c.w_qk = w;
  }
  c.ok = true;
  return c;
}

// One tensor's layout under the contract (include/qkv/qkv.h, qkv_strides):
// element (b, h, t, c) at b * sb + h * sh + t * st + c; all three strides 0
// is dense. Invalid: a negative stride; for an input, a non-zero stride
// below dim; for out, strides that do not nest (sorted over the dimensions
// of size > 1, each at least the extent of the ones inside it); offsets
// that are not addressable.
struct TensorLayout {
  bool ok = false;
  int64_t sb = 0, sh = 0, st = 0;
  int64_t end = 0;  // one past the last element reached; 0 when empty
};

TensorLayout LayoutOf(const qkv_strides& given, int64_t n0, int64_t n1,
                      int64_t n2, int64_t dim, bool output) {
  TensorLayout t;
  const bool empty = n0 == 0 || n1 == 0 || n2 == 0;
  if (given.batch == 0 && given.head == 0 && given.token == 0) {
    // Dense; the caller checked that the dense count is addressable, which
    // bounds the strides unless the tensor is empty (then they are unused).
    t.st = dim;
    if (!empty) {
      t.sh = n2 * dim;
      t.sb = n1 * t.sh;
      t.end = n0 * t.sb;
    }
    t.ok = true;
    return t;
  }
  const int64_t s[3] = {given.batch, given.head, given.token};
  const int64_t n[3] = {n0, n1, n2};
  for (int i = 0; i < 3; ++i) {
    if (s[i] < 0) return t;
    if (!output && s[i] != 0 && s[i] < dim) return t;
  }
  t.sb = s[0];
  t.sh = s[1];
  t.st = s[2];
  if (empty) {
    t.ok = true;
    return t;
  }
  if (output) {
    int order[3] = {0, 1, 2};
    std::sort(order, order + 3, [&](int a, int b) { return s[a] < s[b]; });
    int64_t extent = dim, span;
    for (int i : order) {
      if (n[i] <= 1) continue;
      if (s[i] < extent) return t;
      if (!Mul(n[i] - 1, s[i], &span) || extent > INT64_MAX - span) return t;
      extent += span;
    }
  }
  int64_t last = dim, term;
  for (int i = 0; i < 3; ++i) {
    if (!Mul(n[i] - 1, s[i], &term) || last > INT64_MAX - term) return t;
    last += term;
  }
  if (!Addressable(last)) return t;
  t.end = last;
  t.ok = true;
  return t;
}

struct Layouts {
  TensorLayout q, k, v, out;
};

Layouts LayoutsOf(const qkv_attention_desc& e) {
  Layouts l;
  l.q = LayoutOf(e.q_strides, e.batch, e.q_heads, e.q_len, e.head_dim, false);
  l.k = LayoutOf(e.k_strides, e.batch, e.kv_heads, e.kv_len, e.head_dim,
                 false);
  l.v = LayoutOf(e.v_strides, e.batch, e.kv_heads, e.kv_len, e.value_dim,
                 false);
  l.out = LayoutOf(e.out_strides, e.batch, e.q_heads, e.q_len, e.value_dim,
                   true);
  return l;
}

// Largest q_heads / batch for which the fuzzer passes the per-head and
// per-batch arrays of 0.2 (the library reads all of them while validating).
constexpr int64_t kMaxVariantArray = 4096;

// The contract's verdict on a call, from the bad-input table.
enum Verdict {
  kInvalid,       // must be QKV_ERR_INVALID_ARGUMENT
  kUnsupported,   // must be QKV_ERR_UNSUPPORTED
  kValid,         // OK, or WORKSPACE_TOO_SMALL if the workspace is short
  kNamedBackend,  // as kValid, but a forced backend may also say UNSUPPORTED
  kUnknown,       // some error or OK: the model does not decide
};

struct Call {
  const qkv_attention_desc* desc;  // NULL allowed
  const float *q, *k, *v;
  float *out, *weights, *lse;
  void* workspace;
  size_t workspace_size;
};

// Contract verdict for the descriptor alone (not the data pointers).
// `struct_size` is the raw value the caller set.
Verdict DescVerdict(size_t struct_size, const qkv_attention_desc& e, bool newer,
                    bool* hostile_workers) {
  *hostile_workers = false;
  if (struct_size < sizeof(size_t) || struct_size > 4096) return kInvalid;
  // The sizes have no defaults (0 is a valid batch, q_len or kv_len now, so
  // a prefix without them must be refused as such).
  if (struct_size < offsetof(qkv_attention_desc, value_dim) +
                        sizeof(e.value_dim)) {
    return kInvalid;
  }
  const Counts c = CountsOf(e);
  if (!c.ok) return kInvalid;  // a size <= 0 or a count that overflows
  if (e.q_heads % e.kv_heads != 0) return kInvalid;
  int32_t score;
  memcpy(&score, &e.score, sizeof score);
  if (score < 0 || score > 2) return kInvalid;
  if ((e.mask & ~31u) != 0) return kInvalid;  // 8, 16: window, kv_start
  if (!isfinite(e.scale)) return kInvalid;
  if (e.mask & QKV_MASK_VALID_LENS) {
    if (e.valid_lens == nullptr) return kInvalid;
    for (int64_t i = 0; i < c.valid_lens; ++i) {
      if (e.valid_lens[i] < 0 || e.valid_lens[i] > e.kv_len) return kInvalid;
    }
  }
  if (e.mask & QKV_MASK_BIAS) {
    if (e.bias == nullptr || e.bias_batch_stride < 0 ||
        e.bias_head_stride < 0 || c.bias < 0) {
      return kInvalid;
    }
  }
  bool additive_extent_unknown = false;
  if (score == QKV_SCORE_ADDITIVE) {
    if (e.additive_hidden <= 0 || e.additive_w_q == nullptr ||
        e.additive_w_k == nullptr || e.additive_w_v == nullptr || c.w_qk < 0) {
      return kInvalid;
    }
    // The library also refuses projections whose element counts do not fit;
    // the model only decides where they obviously do.
    int64_t a, b;
    if (!Mul(e.additive_hidden, e.kv_len + 1, &a) || !Addressable(a) ||
        !Mul(c.rows, e.additive_hidden, &b) || !Addressable(b) ||
        !Mul(c.k / e.head_dim, e.additive_hidden, &b) || !Addressable(b)) {
      return kInvalid;
    }
    if (a > (int64_t{1} << 40) || b > (int64_t{1} << 40)) {
      additive_extent_unknown = true;
    }
  }
  if (e.parallel_for != nullptr && e.num_workers == 0) return kInvalid;
  // 0.2. qkv_attention_f32 reads f32 only: any other kv_dtype, valid or
  // not, is INVALID there (qkv_attention would say UNSUPPORTED for 1-3).
  int32_t dtype;
  memcpy(&dtype, &e.kv_dtype, sizeof dtype);
  if (dtype != QKV_DTYPE_F32) return kInvalid;
  const Layouts l = LayoutsOf(e);
  if (!l.q.ok || !l.k.ok || !l.v.ok || !l.out.ok) return kInvalid;
  if (!(e.softcap >= 0.0f) || !isfinite(e.softcap)) return kInvalid;
  if (e.alibi_slopes != nullptr) {
    for (int64_t h = 0; h < e.q_heads; ++h) {
      if (!isfinite(e.alibi_slopes[h])) return kInvalid;
    }
  }
  if (e.sinks != nullptr) {
    for (int64_t h = 0; h < e.q_heads; ++h) {
      if (isnan(e.sinks[h]) || e.sinks[h] == INFINITY) return kInvalid;
    }
  }
  if (e.mask & QKV_MASK_KV_START) {
    if (e.kv_start == nullptr) return kInvalid;
    for (int64_t b = 0; b < e.batch; ++b) {
      if (e.kv_start[b] < 0 || e.kv_start[b] > e.kv_len) return kInvalid;
    }
  }
  // Workspace per worker times num_workers may not be addressable: INVALID.
  // With a reasonable pool it always is.
  if (e.parallel_for != nullptr && e.num_workers > 4096) {
    *hostile_workers = true;
  }
  if (additive_extent_unknown) return kUnknown;
  if (newer) return kUnsupported;
  if (e.q_len > INT32_MAX || e.kv_len > INT32_MAX) return kUnsupported;
  if (e.backend != nullptr && e.backend[0] != '\0') {
    bool known = false;
    for (size_t i = 0; i < qkv_backend_count(); ++i) {
      if (strcmp(qkv_backend_name(i), e.backend) == 0) known = true;
    }
    return known ? kNamedBackend : kUnsupported;
  }
  return kValid;
}

// ---------------------------------------------------------------- buffers
// A heap buffer of exactly n elements (ASan sees any access past it).
template <class T>
struct Buf {
  std::vector<T> v;
  explicit Buf(size_t n = 0) : v(n) {}
  T* ptr() { return v.empty() ? nullptr : v.data(); }
};

void FillSentinel(std::vector<float>* x) {
  for (float& f : *x) memcpy(&f, &kSentinelBits, sizeof f);
}
bool AllSentinel(const std::vector<float>& x) {
  for (const float& f : x) {
    if (memcmp(&f, &kSentinelBits, sizeof f) != 0) return false;
  }
  return true;
}
bool AnySentinel(const std::vector<float>& x) {
  for (const float& f : x) {
    if (memcmp(&f, &kSentinelBits, sizeof f) == 0) return true;
  }
  return false;
}

uint64_t Hash(const void* p, size_t bytes,
              uint64_t h = 1469598103934665603ull) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

// The caller's pool: runs every task on the calling thread, in the order and
// with the worker numbering the input chose.
struct Pool {
  size_t workers;
  int order;  // 1: forward, 2: backward, 3: evens then odds
  int calls = 0;
};

void PoolParallelFor(void* ctx, size_t num_tasks, qkv_task_fn fn, void* arg) {
  Pool* pool = static_cast<Pool*>(ctx);
  ++pool->calls;
  const size_t half = (num_tasks + 1) / 2;
  for (size_t i = 0; i < num_tasks; ++i) {
    size_t task = i;
    if (pool->order == 2) task = num_tasks - 1 - i;
    if (pool->order == 3) task = i < half ? 2 * i : 2 * (i - half) + 1;
    const size_t worker = pool->order == 2
                              ? pool->workers - 1 - i % pool->workers
                              : i % pool->workers;
    fn(arg, task, worker);
  }
}

const int64_t kHostileSizes[16] = {
    0,
    -1,
    INT64_MIN,
    INT64_MAX,
    int64_t{1} << 31,
    INT32_MAX,
    int64_t{1} << 32,
    int64_t{1} << 62,
    3037000500LL,  // just above sqrt(INT64_MAX)
    -(int64_t{1} << 40),
    int64_t{1} << 20,
    int64_t{1} << 16,
    65537,
    int64_t{1} << 40,
    0,  // raw (read from the input)
    0,  // raw
};

int64_t Size(Input* in, int64_t limit) {
  const uint8_t b = in->U8();
  if (b < 0xF0) return 1 + b % limit;
  const int idx = b - 0xF0;
  if (idx >= 14) return static_cast<int64_t>(in->U64());
  return kHostileSizes[idx];
}

// Scores' worst-case f32 rounding error (absolute), per implementation: the
// Core bound assumes it is negligible; when it is not, both engines are
// still right, just differently rounded, so the tolerance widens by it.
struct Magnitudes {
  double q = 0, k = 0, v = 0, bias = 0, w = 0, w_v_sum = 0;
  bool finite = true;
};

// `addressed`: NULL, or which elements count (the rest are layout gaps).
void Scan(const float* x, size_t n, double* max_abs, bool* finite,
          bool allow_neg_inf = false, const uint8_t* addressed = nullptr) {
  for (size_t i = 0; i < n; ++i) {
    if (addressed != nullptr && addressed[i] == 0) continue;
    if (isfinite(x[i])) {
      *max_abs = std::max(*max_abs, static_cast<double>(fabsf(x[i])));
    } else if (!(allow_neg_inf && x[i] == -INFINITY)) {
      *finite = false;
    }
  }
}

// Bound on |score| (without bias) and on its f32 rounding error.
void ScoreBounds(const qkv_attention_desc& e, const Magnitudes& m,
                 double* bound, double* error) {
  const double eps = FLT_EPSILON;
  const double d = static_cast<double>(e.head_dim);
  const double s = fabs(static_cast<double>(e.scale));
  if (e.score == QKV_SCORE_DOT) {
    *bound = s * d * m.q * m.k;
    *error = (d + 3) * eps * *bound;
  } else if (e.score == QKV_SCORE_GAUSSIAN) {
    *bound = s * d * (m.q + m.k) * (m.q + m.k);
    *error = (d + 4) * eps * *bound;
  } else {
    const double h = static_cast<double>(e.additive_hidden);
    const double proj = d * m.w * (m.q + m.k);  // |W_q q + W_k k|
    *bound = m.w_v_sum;
    // Projection rounding moves tanh by at most as much (tanh' <= 1); tanh
    // itself is a few ulp; the w_v sum adds h roundings.
    *error = m.w_v_sum * ((d + 3) * eps * proj + 8 * eps) +
             (h + 2) * eps * m.w_v_sum;
  }
}

void PrintDesc(const char* what, const qkv_attention_desc& e, size_t ss) {
  int32_t score;
  memcpy(&score, &e.score, sizeof score);
  fprintf(stderr,
          "%s: struct_size=%zu B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld "
          "D=%lld Dv=%lld score=%d scale=%g mask=%u valid_lens=%p "
          "per_query=%d bias=%p strides=%lld,%lld hidden=%lld "
          "w=%p,%p,%p pool=%p workers=%zu backend=%s\n",
          what, ss, (long long)e.batch, (long long)e.q_heads,
          (long long)e.kv_heads, (long long)e.q_len, (long long)e.kv_len,
          (long long)e.head_dim, (long long)e.value_dim, score, e.scale, e.mask,
          (const void*)e.valid_lens, e.valid_lens_per_query,
          (const void*)e.bias, (long long)e.bias_batch_stride,
          (long long)e.bias_head_stride, (long long)e.additive_hidden,
          (const void*)e.additive_w_q, (const void*)e.additive_w_k,
          (const void*)e.additive_w_v, (void*)e.parallel_for, e.num_workers,
          e.backend ? e.backend : "(null)");
  int32_t dtype;
  memcpy(&dtype, &e.kv_dtype, sizeof dtype);
  const qkv_strides* s[4] = {&e.q_strides, &e.k_strides, &e.v_strides,
                             &e.out_strides};
  const char* names[4] = {"q", "k", "v", "out"};
  fprintf(stderr, "  0.2: kv_dtype=%d", dtype);
  for (int t = 0; t < 4; ++t) {
    fprintf(stderr, " %s_strides=%lld,%lld,%lld", names[t],
            (long long)s[t]->batch, (long long)s[t]->head,
            (long long)s[t]->token);
  }
  fprintf(stderr,
          " window=%lld,%lld alibi=%p softcap=%g q_pos=%p sinks=%p "
          "kv_start=%p\n",
          (long long)e.window_left, (long long)e.window_right,
          (const void*)e.alibi_slopes, e.softcap, (const void*)e.q_pos,
          (const void*)e.sinks, (const void*)e.kv_start);
}

// Runs `d` (full-size, valid) with fresh exact outputs and workspace.
struct Outputs {
  qkv_status status;
  std::vector<float> out, weights, lse;
};
Outputs RunFresh(const qkv_attention_desc& d, const float* q, const float* k,
                 const float* v, size_t n_out, size_t n_weights, size_t n_lse) {
  Outputs r;
  r.out.resize(n_out);
  r.weights.resize(n_weights);
  r.lse.resize(n_lse);
  FillSentinel(&r.out);
  FillSentinel(&r.weights);
  FillSentinel(&r.lse);
  const size_t ws_size = qkv_attention_workspace_size(&d);
  std::vector<unsigned char> ws(ws_size);
  r.status = qkv_attention_f32(
      &d, q, k, v, r.out.data(), n_weights ? r.weights.data() : nullptr,
      n_lse ? r.lse.data() : nullptr, ws_size ? ws.data() : nullptr, ws_size);
  return r;
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

// ---------------------------------------------------------------- backward
// The backward pass after a successful forward call, on the same descriptor
// as the caller gave it (struct_size, pool) and the same buffers, with the
// forward's out and lse and a d_out whose gaps hold the sentinel NaN.
// Checked: the status (INVALID_ARGUMENT only when a gradient laid out like
// its operand would alias, and then OK without gradients; else UNSUPPORTED
// for the ADDITIVE score, OK for the others); a refused call (that, NULL lse,
// NULL d_out, a workspace one byte short) writes no gradient and never runs
// the pool; an accepted one writes every addressed gradient element and no
// gap, changes no input, runs the pool at most once, and gives the bits of
// the same call without the pool; finite gradients when `finite` (finite
// inputs whose scores cannot overflow).
struct Operand {
  const float* data;
  size_t n;                           // floats of the operand's buffer
  const std::vector<uint8_t>* addr;   // addressed elements; empty: all
};

struct Gradient {
  std::vector<float> v;
  float* ptr(bool want) { return want && !v.empty() ? v.data() : nullptr; }
};

void CheckGradient(const Gradient& g, const Operand& o, const char* name) {
  for (size_t i = 0; i < g.v.size(); ++i) {
    const bool sentinel = memcmp(&g.v[i], &kSentinelBits, 4) == 0;
    if (o.addr->empty() || (*o.addr)[i] != 0) {
      if (sentinel) {
        fprintf(stderr, "%s[%zu]\n", name, i);
        Fail("a gradient element was not written");
      }
    } else if (!sentinel) {
      fprintf(stderr, "%s[%zu]\n", name, i);
      Fail("a gradient element outside the strides was written");
    }
  }
}

void CheckBackward(const qkv_attention_desc* desc,
                   const qkv_attention_desc& full, const Operand& q,
                   const Operand& k, const Operand& v, const Operand& out,
                   const std::vector<float>& lse, Rng* rng, Pool* pool,
                   bool finite) {
  if (Verbose()) fprintf(stderr, "  backward\n");
  const size_t ws_size = qkv_attention_backward_workspace_size(desc);
  if (ws_size > kCapWorkspace) return;
  std::vector<unsigned char> ws(ws_size + 1);
  void* ws_ptr = ws_size ? ws.data() : nullptr;
  std::vector<float> d_out(out.n);
  for (size_t i = 0; i < d_out.size(); ++i) {
    if (out.addr->empty() || (*out.addr)[i] != 0) {
      d_out[i] = rng->Uniform(-1.0f, 1.0f);
    } else {
      memcpy(&d_out[i], &kSentinelBits, sizeof(float));
    }
  }
  const float* out_ptr = out.n ? out.data : nullptr;
  const float* lse_ptr = lse.empty() ? nullptr : lse.data();
  const float* d_out_ptr = d_out.empty() ? nullptr : d_out.data();
  const uint64_t in_hash = Hash(d_out.data(), d_out.size() * 4,
                                Hash(lse.data(), lse.size() * 4));
  Gradient dq, dk, dv;
  auto fresh = [&]() {
    dq.v.assign(q.n, 0.0f), dk.v.assign(k.n, 0.0f), dv.v.assign(v.n, 0.0f);
    FillSentinel(&dq.v), FillSentinel(&dk.v), FillSentinel(&dv.v);
  };
  // One call with fresh sentinel-filled gradients (those asked for).
  auto call = [&](const qkv_attention_desc* dsc, const float* l,
                  const float* g, bool wq, bool wk, bool wv, void* w,
                  size_t w_size) {
    fresh();
    return qkv_attention_backward_f32(dsc, q.data, k.data, v.data, out_ptr, l,
                                      g, dq.ptr(wq), dk.ptr(wk), dv.ptr(wv), w,
                                      w_size);
  };
  auto nothing_written = [&](const char* what, qkv_status st) {
    if (Verbose()) fprintf(stderr, "  backward refused (%s): %d\n", what, st);
    CHECK(AllSentinel(dq.v) && AllSentinel(dk.v) && AllSentinel(dv.v),
          "a refused backward call wrote a gradient", st);
    CHECK(pool->calls == 0, "a refused backward call ran the pool", st);
  };
  // Bad input first: nothing written.
  pool->calls = 0;
  qkv_status st =
      call(desc, nullptr, d_out_ptr, true, true, true, ws_ptr, ws_size);
  if (full.score == QKV_SCORE_ADDITIVE) {
    CHECK(st == QKV_ERR_INVALID_ARGUMENT || st == QKV_ERR_UNSUPPORTED,
          "backward, ADDITIVE, NULL lse: want INVALID or UNSUPPORTED", st);
  } else if (!lse.empty()) {  // rows exist
    CHECK(st == QKV_ERR_INVALID_ARGUMENT, "backward, NULL lse: want INVALID",
          st);
  }
  if (st != QKV_OK) nothing_written("NULL lse", st);
  st = call(desc, lse_ptr, nullptr, true, true, true, ws_ptr, ws_size);
  if (full.score != QKV_SCORE_ADDITIVE && !lse.empty()) {
    CHECK(st == QKV_ERR_INVALID_ARGUMENT, "backward, NULL d_out: want INVALID",
          st);
  }
  if (st != QKV_OK) nothing_written("NULL d_out", st);

  // The call itself: every gradient, or a subset the input chooses.
  const unsigned which = 7u & static_cast<unsigned>(rng->Next() >> 20);
  const bool want_q = (which & 1) != 0 || which == 0;
  const bool want_k = (which & 2) != 0 || which == 0;
  const bool want_v = (which & 4) != 0 || which == 0;
  st = call(desc, lse_ptr, d_out_ptr, want_q, want_k, want_v, ws_ptr,
            ws_size);
  if (Verbose()) fprintf(stderr, "  backward status=%d\n", st);
  const bool additive = full.score == QKV_SCORE_ADDITIVE;
  if (st == QKV_ERR_INVALID_ARGUMENT) {
    // Only an aliasing gradient layout (reported before UNSUPPORTED): without
    // gradients the call is valid, or unsupported (ADDITIVE).
    nothing_written("INVALID", st);
    const qkv_status none = qkv_attention_backward_f32(
        desc, q.data, k.data, v.data, out_ptr, lse_ptr, d_out_ptr, nullptr,
        nullptr, nullptr, ws_ptr, ws_size);
    CHECK(none == (additive ? QKV_ERR_UNSUPPORTED : QKV_OK),
          "backward without gradients: want OK (UNSUPPORTED for ADDITIVE)",
          none);
    return;
  }
  if (additive) {
    CHECK(st == QKV_ERR_UNSUPPORTED, "backward, ADDITIVE: want UNSUPPORTED",
          st);
    nothing_written("ADDITIVE", st);
    return;
  }
  CHECK(st == QKV_OK, "backward refused a valid call", st);
  CHECK(pool->calls <= 1, "backward ran parallel_for more than once",
        pool->calls);
  CHECK(Hash(d_out.data(), d_out.size() * 4,
             Hash(lse.data(), lse.size() * 4)) == in_hash,
        "backward changed lse or d_out");
  Gradient got_q = dq, got_k = dk, got_v = dv;
  if (want_q) CheckGradient(dq, q, "d_q");
  if (want_k) CheckGradient(dk, k, "d_k");
  if (want_v) CheckGradient(dv, v, "d_v");
  if (!want_q) CHECK(AllSentinel(dq.v), "d_q written though not asked for");
  if (!want_k) CHECK(AllSentinel(dk.v), "d_k written though not asked for");
  if (!want_v) CHECK(AllSentinel(dv.v), "d_v written though not asked for");

  // A workspace one byte short: refused, nothing written.
  if (ws_size > 0) {
    pool->calls = 0;
    st = call(desc, lse_ptr, d_out_ptr, want_q, want_k, want_v, ws_ptr,
              ws_size - 1);
    CHECK(st == QKV_ERR_WORKSPACE_TOO_SMALL,
          "backward, short workspace: want WORKSPACE_TOO_SMALL", st);
    nothing_written("short workspace", st);
  }

  // Without the pool: the same bits.
  const size_t serial_ws = qkv_attention_backward_workspace_size(&full);
  std::vector<unsigned char> ws2(serial_ws + 1);
  st = call(&full, lse_ptr, d_out_ptr, want_q, want_k, want_v,
            serial_ws ? ws2.data() : nullptr, serial_ws);
  CHECK(st == QKV_OK, "backward without the pool failed", st);
  CHECK(BitwiseEqual(dq.v, got_q.v) && BitwiseEqual(dk.v, got_k.v) &&
            BitwiseEqual(dv.v, got_v.v),
        "the gradients depend on the pool/schedule");
  if (!finite) return;
  const Gradient* grads[3] = {&got_q, &got_k, &got_v};
  for (int t = 0; t < 3; ++t) {
    const Gradient& g = *grads[t];
    for (size_t i = 0; i < g.v.size(); ++i) {
      if (memcmp(&g.v[i], &kSentinelBits, 4) == 0) continue;  // gap, skipped
      if (!isfinite(g.v[i])) {
        fprintf(stderr, "gradient %d element %zu = %g\n", t, i, g.v[i]);
        Fail("non-finite gradient from finite inputs");
      }
    }
  }
}

// ---------------------------------------------------------------- one input
void RunOne(const uint8_t* data, size_t size) {
  Input in(data, size);
  // Always-true API facts, checked cheaply on every input.
  const size_t backends = qkv_backend_count();
  CHECK(backends >= 1, "no backend");
  CHECK(qkv_backend_name(backends) == nullptr, "name past the end");
  CHECK(qkv_backend() != nullptr, "qkv_backend NULL");

  // 1. flags
  const uint8_t flags = in.U8();
  const bool want_weights = flags & 1;
  const bool want_lse = flags & 2;
  const int ws_mode = (flags >> 2) & 3;    // exact, short, none, larger+odd
  const int pool_mode = (flags >> 4) & 3;  // none, forward, backward, evens
  const bool null_mode = flags & 0x40;
  const bool struct_mode = flags & 0x80;
  CHECK(qkv_status_string(static_cast<qkv_status>(flags - 128)) != nullptr,
        "status string NULL");

  // 2. sizes
  qkv_attention_desc d;
  qkv_attention_desc_init(&d, 1, 1, 1, 1, 1, 1, 1);
  d.batch = Size(&in, 3);
  d.q_heads = Size(&in, 6);
  {
    const uint8_t b = in.U8();
    if (b < 0xF0 && d.q_heads >= 1 && d.q_heads <= 6) {
      int64_t divisors[6];
      int n = 0;
      for (int64_t x = 1; x <= d.q_heads; ++x) {
        if (d.q_heads % x == 0) divisors[n++] = x;
      }
      d.kv_heads = divisors[b % n];
    } else if (b < 0xF0) {
      d.kv_heads = 1 + b % 4;
    } else {
      const int idx = b - 0xF0;
      d.kv_heads =
          idx >= 14 ? static_cast<int64_t>(in.U64()) : kHostileSizes[idx];
    }
  }
  d.q_len = Size(&in, 40);
  d.kv_len = Size(&in, 160);
  d.head_dim = Size(&in, 40);
  d.value_dim = Size(&in, 40);
  d.scale = d.head_dim > 0 ? 1.0f / sqrtf(static_cast<float>(d.head_dim)) : 0;

  // 3. score
  {
    const uint8_t b = in.U8();
    int32_t score = b % 3;
    if (b >= 0xF0) {
      const int32_t bad[] = {3, -1, INT32_MAX, INT32_MIN, 0x100, 4, 7, 1000};
      score = b >= 0xF8 ? static_cast<int32_t>(in.U32()) : bad[b - 0xF0];
    }
    memcpy(&d.score, &score, sizeof score);
  }
  // 4. scale
  {
    const uint8_t b = in.U8();
    switch (b % 16) {
      case 0:
        break;  // default 1/sqrt(head_dim)
      case 1:
        d.scale = 0.0f;
        break;
      case 2:
        d.scale = NAN;
        break;
      case 3:
        d.scale = INFINITY;
        break;
      case 4:
        d.scale = -INFINITY;
        break;
      case 5:
        d.scale = in.F32();
        break;
      case 6:
        d.scale = 1e4f;
        break;
      case 7:
        d.scale = -1.0f;
        break;
      case 8:
        d.scale = 0.5f;
        break;
      case 9:
        d.scale = 1e-30f;
        break;
      case 10:
        d.scale = FLT_MAX;
        break;
      case 11: {
        const uint32_t snan = 0x7F800001u;
        memcpy(&d.scale, &snan, sizeof snan);
        break;
      }
      case 12:
        d.scale = 1e-40f;
        break;  // subnormal
      default:
        d.scale *= 1.0f + static_cast<float>(b >> 4) / 4.0f;
        break;
    }
  }
  // 5. mask
  {
    const uint8_t b = in.U8();
    d.mask = b & 7u;
    if (b >= 0xF0) {
      const uint32_t bad[] = {8, 0x80000000u, 0xFFFFFFFFu, 0x10, 0x9, 0xF};
      d.mask = b >= 0xF6 ? in.U32() : bad[b - 0xF0];
    }
  }
  // 6. valid lengths
  const uint8_t vl_byte = in.U8();
  d.valid_lens_per_query = vl_byte & 1;
  const int vl_mode = (vl_byte >> 1) & 3;  // random, zeros, full, one bad
  const bool vl_null = vl_byte & 8;
  // 7. bias
  const uint8_t bias_byte = in.U8();
  const bool bias_null = bias_byte & 0x10;
  const int bias_values = bias_byte >> 5;
  auto stride = [&](int mode, int64_t dense) -> int64_t {
    switch (mode) {
      case 0:
        return 0;
      case 1:
        return dense;
      case 2:
        return in.U8();
      default: {
        const uint8_t b = in.U8();
        const int64_t bad[] = {-1,
                               INT64_MAX,
                               int64_t{1} << 62,
                               INT64_MIN,
                               int64_t{1} << 33,
                               dense == INT64_MIN ? INT64_MIN : -dense};
        return b % 7 == 6 ? static_cast<int64_t>(in.U64()) : bad[b % 7];
      }
    }
  };
  {
    int64_t dense_head = 0, dense_batch = 0;
    if (!Mul(d.q_len, d.kv_len, &dense_head)) dense_head = 1;
    if (!Mul(dense_head, d.q_heads, &dense_batch)) dense_batch = 1;
    d.bias_batch_stride = stride(bias_byte & 3, dense_batch);
    d.bias_head_stride = stride((bias_byte >> 2) & 3, dense_head);
  }
  // 8. additive
  {
    const uint8_t b = in.U8();
    d.additive_hidden = 1 + b % 24;
    if (b >= 0xF0) {
      const int64_t bad[] = {0,
                             -1,
                             INT64_MAX,
                             int64_t{1} << 40,
                             int64_t{1} << 31,
                             INT64_MIN,
                             int64_t{1} << 20,
                             0};
      d.additive_hidden = bad[b - 0xF0 < 8 ? b - 0xF0 : 7];
    }
  }
  const uint8_t w_byte = in.U8();
  // 9. data magnitudes
  const uint8_t data_byte = in.U8();
  const float kMags[8] = {1.0f, 0.01f,  10.0f, 100.0f,
                          1e4f, 1e-20f, 1e20f, 3e38f};
  const float qk_mag = kMags[data_byte & 7];
  const float v_mag = kMags[(data_byte >> 3) & 7];
  const bool small_ints = data_byte & 0x40;
  const float w_mag = kMags[(w_byte >> 3) & 7];
  // 10. special values sprinkled in
  struct Special {
    int buffer;
    uint32_t index;
    int kind;
  };
  std::vector<Special> specials(in.U8() % 16);
  for (Special& s : specials) {
    s.buffer = in.U8() % 7;
    s.index = in.U32();
    s.kind = in.U8() % 10;
  }
  // 11. pool
  Pool pool = {1, pool_mode};
  {
    const uint8_t b = in.U8();
    size_t workers = b % 9;
    if (b >= 0xF0) {
      // (SIZE_MAX >> 8 is 2^56 - 1 on 64-bit and 2^24 - 1 on 32-bit targets,
      // where a shift by 40 would not compile.)
      const size_t bad[] = {SIZE_MAX,        SIZE_MAX >> 8, 1000, 4096,
                            size_t{1} << 20, SIZE_MAX / 2,  65,   0};
      workers = bad[(b - 0xF0) % 8];
    }
    if (pool_mode != 0) {
      d.parallel_for = &PoolParallelFor;
      d.parallel_ctx = &pool;
      d.num_workers = workers;
      pool.workers = workers == 0 ? 1 : workers;
    } else {
      d.num_workers = workers;  // ignored without parallel_for
    }
  }
  // 12. backend
  std::vector<char> garbage;
  {
    const uint8_t b = in.U8();
    if (b == 0) {
      d.backend = nullptr;
    } else if (b == 1) {
      d.backend = "";
    } else if (b < 0xF0) {
      d.backend = qkv_backend_name((b - 2) % backends);
    } else {
      garbage.resize(in.U8() % 24 + 1);
      for (size_t i = 0; i + 1 < garbage.size(); ++i) {
        garbage[i] = static_cast<char>(in.U8());
      }
      garbage.back() = '\0';
      d.backend = garbage.data();
    }
  }
  // 13. struct_size
  size_t struct_size = sizeof(qkv_attention_desc);
  bool extra_nonzero = false;
  if (struct_mode) {
    // The 0.1 fields' ends, the sizes past our struct, then (added in 0.2,
    // at the end so that older inputs keep their meaning) the 0.2 fields'.
    std::vector<size_t> sizes = {0, 1, 4, 7, 8};
    for (size_t i = 0; i < kFieldsBefore02; ++i) {
      sizes.push_back(kFields[i].offset + kFields[i].size);
      sizes.push_back(kFields[i].offset + kFields[i].size - 1);
    }
    const size_t n_fixed = sizes.size();
    sizes.insert(sizes.end(), {sizeof d + 1, sizeof d + 8, sizeof d + 8, 4096,
                               4096, 4097, kMaxStruct});
    for (size_t i = kFieldsBefore02; i < sizeof kFields / sizeof kFields[0];
         ++i) {
      sizes.push_back(kFields[i].offset + kFields[i].size);
      sizes.push_back(kFields[i].offset + kFields[i].size - 1);
    }
    const uint8_t b = in.U8();
    const size_t idx = b % sizes.size();
    struct_size = sizes[idx];
    // The second of each pair past our struct carries a non-zero byte.
    extra_nonzero = idx == n_fixed + 2 || idx == n_fixed + 4;
  }
  // 14. NULL pointers
  uint8_t null_byte = 0;
  if (null_mode) null_byte = in.U8();
  // 15. seed
  Rng rng{in.U64() | 1};

  // 16-24. The 0.2 fields. 16: flags, bit0 window, bit1 kv_start, bit2
  // ALiBi, bit3 softcap, bit4 sinks, bit5 q_pos, bit6 strides, bit7
  // kv_dtype; then one item per set flag, in this order:
  //   17 window     two bytes, left and right: < 0xF0 is b % 80 - 10 (a
  //                 negative side is unbounded), else a hostile value
  //   18 kv_start   bits0-1 values (random in [0, kv_len], 0, kv_len,
  //                 random), bit2 one bad value (bits3-4: -1, kv_len + 1,
  //                 INT32_MIN, INT32_MAX), bit5 NULL
  //   19 alibi      bits0-2 magnitude, bit3 negative, bit4 one special
  //                 (bits5-6: NaN, +Inf, -Inf, 1e38)
  //   20 softcap    b % 16 picks 0, 1, 5, 30, 1e-3, 1e4, 1e30, 1e-40, FLT_MIN,
  //                 -1, NaN, +Inf, -Inf, -0, 50, or a raw float (4 bytes)
  //   21 sinks      b % 8: random [-5, 5], +50/-50/-inf/0.75 by head, all
  //                 -inf, random [-1e4, 1e4], one NaN, one +Inf, +-1e30, 0
  //   22 q_pos      b % 8: kv_len - q_len, random in [-kv_len - q_len,
  //                 2 kv_len], 0, -q_len - 3, INT32_MIN, INT32_MAX - q_len
  //                 + 1, INT32_MAX, random int32
  //   23 strides    two bits per tensor (q, k, v, out): dense, token-major,
  //                 padded (gaps), hostile; then for each hostile tensor a
  //                 byte: b % 8 picks batch -1, token dim - 1, batch 0, head
  //                 0, token 0, batch INT64_MAX / 2, token INT64_MIN, or three
  //                 raw int64 (24 bytes follow)
  //   24 kv_dtype   b % 8: F32, F16, BF16, I8, 4, -1, INT32_MAX, INT32_MIN
  const uint8_t v_flags = in.U8();
  if (v_flags & 1) {
    auto side = [&](uint8_t b) -> int64_t {
      if (b < 0xF0) return static_cast<int64_t>(b % 80) - 10;
      const int64_t hostile[] = {INT64_MIN, INT64_MAX, int64_t{1} << 40,
                                 (int64_t{1} << 40) - 1, -1, 0,
                                 int64_t{1} << 31};
      const int idx = (b - 0xF0) % 8;
      return idx == 7 ? static_cast<int64_t>(in.U64()) : hostile[idx];
    };
    d.mask |= QKV_MASK_WINDOW;
    d.window_left = side(in.U8());
    d.window_right = side(in.U8());
  }
  const uint8_t kv_start_byte = (v_flags & 2) ? in.U8() : 0;
  if (v_flags & 2) d.mask |= QKV_MASK_KV_START;
  const uint8_t alibi_byte = (v_flags & 4) ? in.U8() : 0;
  if (v_flags & 8) {
    const uint8_t b = in.U8();
    const float caps[15] = {0.0f,  1.0f,    5.0f,  30.0f,     1e-3f,
                            1e4f,  1e30f,   1e-40f, FLT_MIN,  -1.0f,
                            NAN,   INFINITY, -INFINITY, -0.0f, 50.0f};
    d.softcap = b % 16 == 15 ? in.F32() : caps[b % 16];
  }
  const uint8_t sinks_byte = (v_flags & 16) ? in.U8() : 0;
  const uint8_t q_pos_byte = (v_flags & 32) ? in.U8() : 0;
  const uint8_t stride_byte = (v_flags & 64) ? in.U8() : 0;
  uint8_t hostile_stride[4] = {0, 0, 0, 0};
  int64_t raw_stride[4][3] = {};
  for (int t = 0; t < 4; ++t) {
    if (((stride_byte >> (2 * t)) & 3) != 3) continue;
    hostile_stride[t] = in.U8();
    if (hostile_stride[t] % 8 == 7) {
      for (int i = 0; i < 3; ++i) {
        raw_stride[t][i] = static_cast<int64_t>(in.U64());
      }
    }
  }
  if (v_flags & 128) {
    const int32_t dtypes[8] = {QKV_DTYPE_F32, QKV_DTYPE_F16, QKV_DTYPE_BF16,
                               QKV_DTYPE_I8,  4,             -1,
                               INT32_MAX,     INT32_MIN};
    const int32_t dt = dtypes[in.U8() % 8];
    memcpy(&d.kv_dtype, &dt, sizeof dt);
  }
  // Strides from the sizes (the raw ones: a prefix that cuts the sizes is
  // refused before any stride is read).
  auto make_strides = [&](int t, int64_t n1, int64_t n2, int64_t dim) {
    const int mode = (stride_byte >> (2 * t)) & 3;
    qkv_strides z = {0, 0, 0};
    if (mode == 0 || n1 <= 0 || n2 < 0 || dim <= 0) return z;
    const int64_t m2 = n2 > 0 ? n2 : 1;
    if (mode == 1) {  // token-major
      int64_t a, b2;
      if (!Mul(n1, dim, &a) || !Mul(m2, a, &b2)) return z;
      return qkv_strides{b2, dim, a};
    }
    // The dense strides, with gaps after each row, head and batch (mode 2).
    const int64_t ga = mode == 2 ? static_cast<int64_t>(rng.Next() % 4) : 0;
    const int64_t gh = mode == 2 ? static_cast<int64_t>(rng.Next() % 7) : 0;
    const int64_t gb = mode == 2 ? static_cast<int64_t>(rng.Next() % 9) : 0;
    if (dim > INT64_MAX - 4) return z;
    const int64_t st = dim + ga;
    int64_t sh, sb;
    if (!Mul(m2, st, &sh) || sh > INT64_MAX - gh || !Mul(n1, sh + gh, &sb) ||
        sb > INT64_MAX - gb) {
      return z;
    }
    sh += gh;
    sb += gb;
    if (mode == 2) return qkv_strides{sb, sh, st};
    qkv_strides h = {sb, sh, st};  // hostile, from the dense strides
    switch (hostile_stride[t] % 8) {
      case 0:
        h.batch = -1;
        break;
      case 1:
        h.token = dim - 1;
        break;
      case 2:
        h.batch = 0;
        break;
      case 3:
        h.head = 0;
        break;
      case 4:
        h.token = 0;
        break;
      case 5:
        h.batch = INT64_MAX / 2;
        break;
      case 6:
        h.token = INT64_MIN;
        break;
      default:
        h = qkv_strides{raw_stride[t][0], raw_stride[t][1], raw_stride[t][2]};
        break;
    }
    return h;
  };
  d.q_strides = make_strides(0, d.q_heads, d.q_len, d.head_dim);
  d.k_strides = make_strides(1, d.kv_heads, d.kv_len, d.head_dim);
  d.v_strides = make_strides(2, d.kv_heads, d.kv_len, d.value_dim);
  d.out_strides = make_strides(3, d.q_heads, d.q_len, d.value_dim);
  // Per-head and per-batch arrays: exactly [q_heads] or [batch] (the
  // library reads all of them while validating), when that is small.
  const bool heads_ok = d.q_heads > 0 && d.q_heads <= kMaxVariantArray;
  const bool batch_ok = d.batch > 0 && d.batch <= kMaxVariantArray;
  Buf<float> slopes, sinks;
  Buf<int32_t> kv_start, q_pos;
  const int64_t kv32 = std::min<int64_t>(std::max<int64_t>(d.kv_len, 0),
                                         INT32_MAX - 1);
  const int64_t q32 = std::min<int64_t>(std::max<int64_t>(d.q_len, 0),
                                        INT32_MAX - 1);
  if ((v_flags & 2) && batch_ok && !(kv_start_byte & 32)) {
    kv_start.v.resize(static_cast<size_t>(d.batch));
    for (int32_t& x : kv_start.v) {
      switch (kv_start_byte & 3) {
        case 1:
          x = 0;
          break;
        case 2:
          x = static_cast<int32_t>(kv32);
          break;
        default:
          x = static_cast<int32_t>(rng.Next() %
                                   static_cast<uint64_t>(kv32 + 1));
          break;
      }
    }
    if (kv_start_byte & 4) {
      const int32_t bad[4] = {-1, static_cast<int32_t>(kv32 + 1), INT32_MIN,
                              INT32_MAX};
      kv_start.v[rng.Next() % kv_start.v.size()] =
          bad[(kv_start_byte >> 3) & 3];
    }
  }
  if ((v_flags & 4) && heads_ok) {
    const float mags[8] = {0.0f, 1.0f / 256, 0.125f, 0.5f,
                           1.0f, 8.0f,       100.0f, 1e-30f};
    const float mag = mags[alibi_byte & 7] * ((alibi_byte & 8) ? -1.0f : 1.0f);
    slopes.v.resize(static_cast<size_t>(d.q_heads));
    for (size_t h = 0; h < slopes.v.size(); ++h) {
      slopes.v[h] = ldexpf(mag, -static_cast<int>(h % 4));
    }
    if (alibi_byte & 16) {
      const float special[4] = {NAN, INFINITY, -INFINITY, 1e38f};
      slopes.v[rng.Next() % slopes.v.size()] = special[(alibi_byte >> 5) & 3];
    }
  }
  if ((v_flags & 16) && heads_ok) {
    sinks.v.resize(static_cast<size_t>(d.q_heads));
    const float mixed[4] = {50.0f, -50.0f, -INFINITY, 0.75f};
    for (size_t h = 0; h < sinks.v.size(); ++h) {
      float& x = sinks.v[h];
      switch (sinks_byte % 8) {
        case 1:
          x = mixed[h % 4];
          break;
        case 2:
          x = -INFINITY;
          break;
        case 3:
          x = rng.Uniform(-1e4f, 1e4f);
          break;
        case 6:
          x = h % 2 ? -1e30f : 1e30f;
          break;
        case 7:
          x = 0.0f;
          break;
        default:
          x = rng.Uniform(-5.0f, 5.0f);
          break;
      }
    }
    if (sinks_byte % 8 == 4) sinks.v[rng.Next() % sinks.v.size()] = NAN;
    if (sinks_byte % 8 == 5) sinks.v[rng.Next() % sinks.v.size()] = INFINITY;
  }
  if ((v_flags & 32) && batch_ok) {
    q_pos.v.resize(static_cast<size_t>(d.batch));
    for (int32_t& x : q_pos.v) {
      int64_t p = 0;
      switch (q_pos_byte % 8) {
        case 0:
          p = kv32 - q32;
          break;
        case 1:
          p = -kv32 - q32 +
              static_cast<int64_t>(rng.Next() %
                                   static_cast<uint64_t>(3 * kv32 + q32 + 1));
          break;
        case 2:
          p = 0;
          break;
        case 3:
          p = -q32 - 3;
          break;
        case 4:
          p = INT32_MIN;
          break;
        case 5:
          p = int64_t{INT32_MAX} - q32 + 1;
          break;
        case 6:
          p = INT32_MAX;
          break;
        default:
          p = static_cast<int32_t>(static_cast<uint32_t>(rng.Next()));
          break;
      }
      x = static_cast<int32_t>(
          std::min<int64_t>(std::max<int64_t>(p, INT32_MIN), INT32_MAX));
    }
  }
  d.kv_start = kv_start.ptr();
  d.alibi_slopes = slopes.ptr();
  d.sinks = sinks.ptr();
  d.q_pos = q_pos.ptr();

  // ---- the descriptor's memory: exactly struct_size bytes (at least the
  // size_t the library must read first).
  const size_t desc_bytes = std::max(struct_size, sizeof(size_t));
  CHECK(desc_bytes <= kMaxStruct, "descriptor buffer");
  std::vector<unsigned char> desc_buf(desc_bytes, 0);
  d.struct_size = struct_size;

  // Sizes as the library will see them (fields outside the prefix default).
  auto effective = [&](bool* newer) {
    memcpy(desc_buf.data(), &d, std::min(desc_bytes, sizeof d));
    if (extra_nonzero && desc_bytes > sizeof d) desc_buf[desc_bytes - 1] = 1;
    return Effective(desc_buf.data(), struct_size, newer);
  };
  bool newer = false;
  qkv_attention_desc e = effective(&newer);
  const Counts c = CountsOf(e);
  int32_t e_score;
  memcpy(&e_score, &e.score, sizeof e_score);
  const bool e_additive = e_score == QKV_SCORE_ADDITIVE;
  const bool e_bias = (e.mask & QKV_MASK_BIAS) != 0;

  // The layouts (q, k, v, out) as the library sees them; their extents
  // size the buffers (the dense counts when the strides are invalid).
  const Layouts lay = c.ok ? LayoutsOf(e) : Layouts();
  auto extent = [&](const TensorLayout& t, int64_t dense) {
    return t.ok ? t.end : dense;
  };
  const int64_t n_q = c.ok ? extent(lay.q, c.q) : 0;
  const int64_t n_k = c.ok ? extent(lay.k, c.k) : 0;
  const int64_t n_v = c.ok ? extent(lay.v, c.v) : 0;
  const int64_t n_out = c.ok ? extent(lay.out, c.out) : 0;

  // Does the call fit the caps? Then every buffer is exact and real.
  bool fits = c.ok;
  double floats = 0, work = 0;
  if (fits) {
    floats = static_cast<double>(n_q) + n_k + n_v + n_out +
             (want_weights ? c.weights : 0) + (want_lse ? c.rows : 0);
    if (e_bias) floats += c.bias >= 0 ? static_cast<double>(c.bias) : 1e300;
    if (e_additive) {
      floats += c.w_qk >= 0 ? 2.0 * c.w_qk + e.additive_hidden : 1e300;
    }
    const double hidden =
        e_additive ? static_cast<double>(e.additive_hidden) : 0;
    work = static_cast<double>(c.rows) * e.kv_len *
               (static_cast<double>(e.head_dim) + e.value_dim + hidden) +
           (e_additive ? (static_cast<double>(c.k) + c.q) * hidden : 0);
    fits = floats <= kCapFloats && work <= kCapWork;
  }

  // Valid lengths: exact buffer whenever the count is small (the library
  // reads them while validating).
  Buf<int32_t> valid_lens;
  if ((e.mask & QKV_MASK_VALID_LENS) && c.ok && !vl_null &&
      c.valid_lens <= (int64_t{1} << 16)) {
    valid_lens.v.resize(static_cast<size_t>(c.valid_lens));
    for (int32_t& x : valid_lens.v) {
      const int64_t kv = e.kv_len;
      x = vl_mode == 1 ? 0
          : vl_mode == 2
              ? static_cast<int32_t>(std::min<int64_t>(kv, INT32_MAX))
              : static_cast<int32_t>(
                    rng.Next() % static_cast<uint64_t>(
                                     std::min<int64_t>(kv, INT32_MAX - 1) + 1));
    }
    if (vl_mode == 3 && !valid_lens.v.empty()) {
      const int32_t bad[] = {
          -1, INT32_MIN, INT32_MAX,
          static_cast<int32_t>(std::min<int64_t>(e.kv_len + 1, INT32_MAX))};
      valid_lens.v[rng.Next() % valid_lens.v.size()] = bad[rng.Next() % 4];
    }
  }
  d.valid_lens = valid_lens.ptr();

  // Data buffers: exact when the call fits, tiny otherwise (the model below
  // then only runs calls the library must refuse before reading data).
  const size_t kTiny = 16;
  auto count = [&](int64_t n) { return fits ? static_cast<size_t>(n) : kTiny; };
  Buf<float> q(count(n_q)), k(count(n_k)), v(count(n_v));
  Buf<float> out(count(n_out));
  Buf<float> weights(want_weights ? count(c.ok ? c.weights : 0) : 0);
  Buf<float> lse(want_lse ? count(c.ok ? c.rows : 0) : 0);
  Buf<float> bias(e_bias && !bias_null
                      ? count(c.ok ? std::max<int64_t>(c.bias, 1) : 0)
                      : 0);
  Buf<float> w_q, w_k, w_v;
  if (e_additive && c.ok) {
    w_q.v.resize(count(std::max<int64_t>(c.w_qk, 1)));
    w_k.v.resize(count(std::max<int64_t>(c.w_qk, 1)));
    w_v.v.resize(count(std::max<int64_t>(e.additive_hidden, 1)));
  }
  auto fill = [&](std::vector<float>* x, float mag) {
    for (float& f : *x) {
      f = small_ints ? static_cast<float>(static_cast<int>(rng.Next() % 7) - 3)
                     : rng.Uniform(-mag, mag);
    }
  };
  fill(&q.v, qk_mag);
  fill(&k.v, qk_mag);
  fill(&v.v, v_mag);
  fill(&w_q.v, w_mag);
  fill(&w_k.v, w_mag);
  fill(&w_v.v, w_mag);
  for (size_t i = 0; i < bias.v.size(); ++i) {
    float& b = bias.v[i];
    const uint64_t r = rng.Next();
    switch (bias_values) {
      case 0:
        b = rng.Uniform(-2, 2);
        break;
      case 1:
        b = r % 4 == 0 ? -INFINITY : rng.Uniform(-2, 2);
        break;
      case 2:
        b = (i / std::max<int64_t>(e.kv_len, 1)) % 3 == 0 ? -INFINITY
                                                          : rng.Uniform(-1, 1);
        break;
      case 3:
        b = r % 20 == 0 ? (r % 40 == 0 ? NAN : INFINITY) : rng.Uniform(-1, 1);
        break;
      case 4:
        b = rng.Uniform(-1e4f, 1e4f);
        break;
      case 5:
        b = -INFINITY;
        break;
      case 6:
        b = rng.Uniform(-100, 100);
        break;
      default:
        b = static_cast<float>(r % 3);
        break;
    }
  }
  {
    std::vector<float>* bufs[7] = {&q.v,   &k.v,   &v.v,  &bias.v,
                                   &w_q.v, &w_k.v, &w_v.v};
    const float kinds[10] = {NAN,   INFINITY, -INFINITY, 1e4f,  -1e4f,
                             1e30f, -FLT_MAX, 1e-40f,    -0.0f, 3e38f};
    for (const Special& s : specials) {
      std::vector<float>* b = bufs[s.buffer];
      if (!b->empty()) (*b)[s.index % b->size()] = kinds[s.kind];
    }
  }
  // Which elements the strides address; the others (layout gaps) hold the
  // NaN sentinel in q, k and v, so that reading one shows in the results.
  auto mark = [&](const TensorLayout& t, int64_t n1, int64_t n2, int64_t dim,
                  size_t size) {
    std::vector<uint8_t> m;
    if (!fits || !t.ok) return m;
    m.assign(size, 0);
    // An empty tensor addresses nothing, whatever its other sizes (a batch
    // of 2^40 with q_len 0 fits in no memory at all): no loop over them.
    if (e.batch == 0 || n1 == 0 || n2 == 0 || dim == 0) return m;
    // Nor over more rows than a call within the work cap can have (kv_heads
    // 3e9 over one shared row, with q_heads 2, fits in 4 bytes): such a
    // descriptor is invalid, and its call must fail before reading.
    if (static_cast<double>(e.batch) * n1 * n2 > kCapWork) return m;
    for (int64_t b = 0; b < e.batch; ++b) {
      for (int64_t h = 0; h < n1; ++h) {
        for (int64_t i = 0; i < n2; ++i) {
          const int64_t at = b * t.sb + h * t.sh + i * t.st;
          memset(m.data() + at, 1, static_cast<size_t>(dim));
        }
      }
    }
    return m;
  };
  const std::vector<uint8_t> q_addr =
      mark(lay.q, e.q_heads, e.q_len, e.head_dim, q.v.size());
  const std::vector<uint8_t> k_addr =
      mark(lay.k, e.kv_heads, e.kv_len, e.head_dim, k.v.size());
  const std::vector<uint8_t> v_addr =
      mark(lay.v, e.kv_heads, e.kv_len, e.value_dim, v.v.size());
  const std::vector<uint8_t> out_addr =
      mark(lay.out, e.q_heads, e.q_len, e.value_dim, out.v.size());
  auto gaps_to_sentinel = [&](std::vector<float>* x,
                              const std::vector<uint8_t>& m) {
    for (size_t i = 0; i < m.size(); ++i) {
      if (m[i] == 0) memcpy(&(*x)[i], &kSentinelBits, sizeof(float));
    }
  };
  gaps_to_sentinel(&q.v, q_addr);
  gaps_to_sentinel(&k.v, k_addr);
  gaps_to_sentinel(&v.v, v_addr);
  d.bias = bias.ptr();  // NULL when bias_null or no bias mask
  if (e_additive) {
    d.additive_w_q = (w_byte & 0x80) && (w_byte & 1) ? nullptr : w_q.ptr();
    d.additive_w_k = (w_byte & 0x80) && (w_byte & 2) ? nullptr : w_k.ptr();
    d.additive_w_v = (w_byte & 0x80) && (w_byte & 4) ? nullptr : w_v.ptr();
  }
  FillSentinel(&out.v);
  FillSentinel(&weights.v);
  FillSentinel(&lse.v);

  e = effective(&newer);  // now with the pointers
  bool hostile_workers = false;
  Verdict verdict = DescVerdict(struct_size, e, newer, &hostile_workers);
  const Verdict desc_verdict = verdict;
  if (Skipped(e.backend)) return;

  const float* q_ptr = (null_byte & 2) ? nullptr : q.ptr();
  const float* k_ptr = (null_byte & 4) ? nullptr : k.ptr();
  const float* v_ptr = (null_byte & 8) ? nullptr : v.ptr();
  float* out_ptr = (null_byte & 16) ? nullptr : out.ptr();
  const unsigned char* desc_ptr = (null_byte & 1) ? nullptr : desc_buf.data();
  const auto* desc = reinterpret_cast<const qkv_attention_desc*>(desc_ptr);
  // batch or q_len 0: nothing to do, no pointer read (0.2). kv_len 0: k
  // and v are not read. (Empty tensors have NULL buffers here anyway.)
  const bool empty_call = c.ok && (e.batch == 0 || e.q_len == 0);
  const bool no_keys = c.ok && e.kv_len == 0;
  if (desc == nullptr ||
      (!empty_call &&
       (q_ptr == nullptr || out_ptr == nullptr ||
        (!no_keys && (k_ptr == nullptr || v_ptr == nullptr))))) {
    verdict = kInvalid;
  }

  // Tiny buffers have overlapping declared extents: the library may refuse
  // them as overlapping (INVALID) before it gets to UNSUPPORTED.
  bool or_invalid = hostile_workers || (!fits && verdict == kUnsupported);
  if (!fits && verdict != kInvalid && verdict != kUnsupported) {
    // Too big to give real buffers: only a call the library must refuse
    // before reading data is made. With no workspace, a descriptor that
    // needs one is refused (TOO_SMALL, or INVALID: the tiny buffers' declared
    // extents overlap).
    const size_t need = desc ? qkv_attention_workspace_size(desc) : 0;
    if (need == 0) return;
    verdict = kUnknown;
  }

  // Workspace.
  size_t ws_query = desc ? qkv_attention_workspace_size(desc) : 0;
  // The query answers for qkv_attention, which serves F16, BF16 and I8
  // caches that qkv_attention_f32 refuses: a refusal for the type alone
  // says nothing about the size.
  int32_t desc_dtype = QKV_DTYPE_F32;
  if (desc != nullptr) memcpy(&desc_dtype, &e.kv_dtype, sizeof desc_dtype);
  const bool other_type = desc_dtype >= QKV_DTYPE_F16 &&
                          desc_dtype <= QKV_DTYPE_I8;
  if ((desc_verdict == kInvalid || desc_verdict == kUnsupported) &&
      !other_type) {
    CHECK(ws_query == 0, "workspace size of a refused descriptor", ws_query);
  }
  size_t ws_size = 0, ws_offset = 0;
  switch (fits && ws_query <= kCapWorkspace ? ws_mode : 2) {
    case 0:
      ws_size = ws_query;
      break;
    case 1:
      ws_size = ws_query > 0 ? ws_query - 1 : 0;
      break;
    case 2:
      ws_size = 0;
      break;
    default:
      ws_size = ws_query + 1 + rng.Next() % 64;
      ws_offset = 1 + rng.Next() % 63;
      break;
  }
  // An exact allocation: the workspace ends where the buffer ends.
  std::vector<unsigned char> ws_buf(ws_size + ws_offset);
  void* ws_ptr = ws_size ? ws_buf.data() + ws_offset : nullptr;
  if (null_byte & 32) {  // NULL workspace with a non-zero size
    ws_ptr = nullptr;
    if (ws_size == 0) ws_size = 64;
    // README: NULL workspace with a size is INVALID; an empty call reads no
    // pointer at all.
    if (!empty_call || desc == nullptr) verdict = kInvalid;
  }

  auto inputs_hash = [&] {
    uint64_t h = Hash(q.v.data(), q.v.size() * 4);
    h = Hash(k.v.data(), k.v.size() * 4, h);
    h = Hash(v.v.data(), v.v.size() * 4, h);
    h = Hash(bias.v.data(), bias.v.size() * 4, h);
    h = Hash(valid_lens.v.data(), valid_lens.v.size() * 4, h);
    h = Hash(w_q.v.data(), w_q.v.size() * 4, h);
    h = Hash(w_k.v.data(), w_k.v.size() * 4, h);
    h = Hash(w_v.v.data(), w_v.v.size() * 4, h);
    h = Hash(slopes.v.data(), slopes.v.size() * 4, h);
    h = Hash(sinks.v.data(), sinks.v.size() * 4, h);
    h = Hash(q_pos.v.data(), q_pos.v.size() * 4, h);
    return Hash(kv_start.v.data(), kv_start.v.size() * 4, h);
  };
  const uint64_t in_hash = inputs_hash();
  const uint64_t desc_hash = Hash(desc_buf.data(), desc_buf.size());

  if (Verbose()) {
    PrintDesc("raw", d, struct_size);
    fprintf(stderr,
            "  fits=%d verdict=%d newer=%d ws_query=%zu ws_size=%zu "
            "weights=%d lse=%d null=%#x\n",
            fits, verdict, newer, ws_query, ws_size, want_weights, want_lse,
            null_byte);
  }

  const qkv_status st =
      qkv_attention_f32(desc, q_ptr, k_ptr, v_ptr, out_ptr, weights.ptr(),
                        lse.ptr(), ws_ptr, ws_size);
  if (Verbose()) fprintf(stderr, "  status=%d\n", st);

  // ---- checks
  CHECK(st == QKV_OK || st == QKV_ERR_INVALID_ARGUMENT ||
            st == QKV_ERR_WORKSPACE_TOO_SMALL || st == QKV_ERR_UNSUPPORTED,
        "unknown status", st);
  CHECK(Hash(desc_buf.data(), desc_buf.size()) == desc_hash,
        "the descriptor was modified");
  CHECK(inputs_hash() == in_hash, "an input buffer was modified");
  switch (verdict) {
    case kInvalid:
      CHECK(st == QKV_ERR_INVALID_ARGUMENT, "want INVALID_ARGUMENT", st);
      break;
    case kUnsupported:
      if (or_invalid) {
        CHECK(st == QKV_ERR_UNSUPPORTED || st == QKV_ERR_INVALID_ARGUMENT,
              "want UNSUPPORTED (or INVALID: hostile num_workers or overlap)",
              st);
      } else {
        CHECK(st == QKV_ERR_UNSUPPORTED, "want UNSUPPORTED", st);
      }
      break;
    case kValid:
    case kNamedBackend:
      if (hostile_workers) {
        CHECK(st != QKV_OK || ws_size >= ws_query, "OK with a short workspace");
        break;
      }
      if (st == QKV_ERR_UNSUPPORTED) {
        CHECK(verdict == kNamedBackend, "default backend said UNSUPPORTED");
        CHECK(ws_query == 0, "workspace size of an unsupported request");
      } else if (ws_size >= ws_query) {
        CHECK(st == QKV_OK, "valid call with enough workspace failed", st,
              static_cast<long long>(ws_query));
      } else {
        CHECK(st == QKV_ERR_WORKSPACE_TOO_SMALL, "want WORKSPACE_TOO_SMALL", st,
              static_cast<long long>(ws_query));
      }
      break;
    case kUnknown:
      if (!fits) CHECK(st != QKV_OK, "OK on a call without real buffers");
      break;
  }

  if (st != QKV_OK) {
    CHECK(AllSentinel(out.v), "a failing call wrote out", st);
    CHECK(AllSentinel(weights.v), "a failing call wrote weights", st);
    CHECK(AllSentinel(lse.v), "a failing call wrote lse", st);
    CHECK(pool.calls == 0, "a failing call ran the pool", st);
    return;
  }

  // ---- a successful call
  CHECK(fits, "OK without real buffers");
  CHECK(pool.calls <= 1, "parallel_for called more than once", pool.calls);
  // Every addressed out element written, every gap between them untouched.
  for (size_t i = 0; i < out.v.size(); ++i) {
    const bool sentinel = memcmp(&out.v[i], &kSentinelBits, 4) == 0;
    if (out_addr.empty() || out_addr[i] != 0) {
      CHECK(!sentinel, "an out element was not written",
            static_cast<long long>(i));
    } else {
      CHECK(sentinel, "an out element outside the strides was written",
            static_cast<long long>(i));
    }
  }
  CHECK(!AnySentinel(weights.v), "a weights element was not written");
  CHECK(!AnySentinel(lse.v), "an lse element was not written");

  // Same call without the pool (full-size descriptor): bitwise identical.
  qkv_attention_desc full = e;
  full.struct_size = sizeof full;
  full.parallel_for = nullptr;
  full.parallel_ctx = nullptr;
  full.num_workers = 0;
  const Outputs serial = RunFresh(full, q.ptr(), k.ptr(), v.ptr(), out.v.size(),
                                  weights.v.size(), lse.v.size());
  CHECK(serial.status == QKV_OK, "the same call without a pool failed",
        serial.status);
  CHECK(BitwiseEqual(serial.out, out.v), "out depends on the pool/schedule");
  CHECK(BitwiseEqual(serial.weights, weights.v),
        "weights depend on the pool/schedule");
  CHECK(BitwiseEqual(serial.lse, lse.v), "lse depends on the pool/schedule");

  // Finite inputs whose scores cannot overflow: finite, sane outputs that
  // agree with the reference engine.
  Magnitudes m;
  auto addr = [](const std::vector<uint8_t>& a) {
    return a.empty() ? nullptr : a.data();
  };
  Scan(q.v.data(), q.v.size(), &m.q, &m.finite, false, addr(q_addr));
  Scan(k.v.data(), k.v.size(), &m.k, &m.finite, false, addr(k_addr));
  Scan(v.v.data(), v.v.size(), &m.v, &m.finite, false, addr(v_addr));
  if (e_bias) Scan(bias.v.data(), bias.v.size(), &m.bias, &m.finite, true);
  if (e_additive) {
    Scan(w_q.v.data(), w_q.v.size(), &m.w, &m.finite);
    Scan(w_k.v.data(), w_k.v.size(), &m.w, &m.finite);
    bool fin = true;
    double unused = 0;
    Scan(w_v.v.data(), w_v.v.size(), &unused, &fin);
    m.finite = m.finite && fin;
    for (float x : w_v.v) m.w_v_sum += fabs(static_cast<double>(x));
  }
  if (!m.finite) return;
  double score_bound = 0, score_error = 0;
  ScoreBounds(e, m, &score_bound, &score_error);
  // 0.2 terms. softcap: tanh contracts the error, adds a few ulp of the cap
  // and bounds the score. ALiBi: up to max|slope| * the largest distance
  // |p - j|, rounded. A sink shifts the max the exponents are taken from.
  if (e.softcap > 0.0f) {
    score_bound = std::min(score_bound, static_cast<double>(e.softcap));
    score_error += 8 * FLT_EPSILON * e.softcap;
  }
  if (e.alibi_slopes != nullptr) {
    double slope = 0, dist = 0;
    for (int64_t h = 0; h < e.q_heads; ++h) {
      slope = std::max(slope, fabs(static_cast<double>(e.alibi_slopes[h])));
    }
    for (int64_t b = 0; b < e.batch; ++b) {
      const double p0 = e.q_pos != nullptr
                            ? static_cast<double>(e.q_pos[b])
                            : static_cast<double>(e.kv_len - e.q_len);
      const double p1 = p0 + static_cast<double>(e.q_len - 1);
      const double last = static_cast<double>(e.kv_len - 1);
      dist = std::max({dist, fabs(p0), fabs(p1), fabs(p0 - last),
                       fabs(p1 - last)});
    }
    score_bound += slope * dist;
    score_error += 4 * FLT_EPSILON * slope * dist;
  }
  if (e.sinks != nullptr) {
    for (int64_t h = 0; h < e.q_heads; ++h) {
      if (isfinite(e.sinks[h])) {
        score_error += 4 * FLT_EPSILON * fabs(static_cast<double>(e.sinks[h]));
      }
    }
  }
  // Overflow-free: |score + bias| and the differences of two of them stay
  // far below FLT_MAX, and so does sum_j p_j v_j <= kv_len * max|v|.
  const double proj = e_additive ? e.head_dim * m.w * (m.q + m.k) : 0;
  const bool no_overflow = score_bound <= 1e37 && m.bias <= 1e37 &&
                           m.v * e.kv_len <= 1e37 && proj <= 1e30 &&
                           (m.q + m.k) * (m.q + m.k) <= 1e37;
  // The backward pass on this call (its lse: the serial call's when the
  // caller asked for none).
  if (!hostile_workers) {
    std::vector<float> lse_all = serial.lse;
    if (lse_all.empty() && c.rows > 0) {
      lse_all = RunFresh(full, q.ptr(), k.ptr(), v.ptr(), out.v.size(), 0,
                         static_cast<size_t>(c.rows))
                    .lse;
    }
    const Operand oq = {q.ptr(), q.v.size(), &q_addr};
    const Operand ok = {k.ptr(), k.v.size(), &k_addr};
    const Operand ov = {v.ptr(), v.v.size(), &v_addr};
    const Operand oo = {out.ptr(), out.v.size(), &out_addr};
    // Finite gradients are promised where no product of the chain rule can
    // overflow: moderate scores, operands and scale.
    const bool moderate = no_overflow && m.finite && score_bound <= 1e4 &&
                          m.q <= 1e4 && m.k <= 1e4 && m.v <= 1e4 &&
                          fabs(static_cast<double>(e.scale)) <= 1e4;
    CheckBackward(desc, full, oq, ok, ov, oo, lse_all, &rng, &pool, moderate);
  }
  if (!no_overflow) return;
  const int64_t lk = e.kv_len, dv = e.value_dim;
  for (size_t i = 0; i < out.v.size(); ++i) {
    if (!out_addr.empty() && out_addr[i] == 0) continue;
    CHECK(isfinite(out.v[i]), "non-finite out from finite inputs",
          static_cast<long long>(i));
  }
  // Row r = (b, h, i) of out, through its strides.
  auto out_row = [&](const std::vector<float>& o, size_t r) {
    const int64_t rr = static_cast<int64_t>(r);
    const int64_t i = rr % e.q_len, h = (rr / e.q_len) % e.q_heads,
                  b = rr / (e.q_len * e.q_heads);
    return o.data() + b * lay.out.sb + h * lay.out.sh + i * lay.out.st;
  };
  for (size_t i = 0; i < weights.v.size(); ++i) {
    CHECK(weights.v[i] >= 0.0f && weights.v[i] <= 1.0f,
          "weight outside [0, 1] from finite inputs",
          static_cast<long long>(i));
  }
  for (size_t i = 0; i < lse.v.size(); ++i) {
    CHECK(isfinite(lse.v[i]) || lse.v[i] == -INFINITY,
          "lse NaN or +inf from finite inputs", static_cast<long long>(i));
  }
  // A row with lse = -inf saw no key: zero out and weights.
  for (size_t r = 0; r < lse.v.size(); ++r) {
    if (lse.v[r] != -INFINITY) continue;
    for (int64_t c2 = 0; c2 < dv; ++c2) {
      CHECK(out_row(out.v, r)[c2] == 0.0f, "masked row with non-zero out");
    }
    for (int64_t j = 0; j < lk && !weights.v.empty(); ++j) {
      CHECK(weights.v[r * lk + j] == 0.0f, "masked row with non-zero weight");
    }
  }

  // Agreement with the reference engine.
  const double e_total = score_error + FLT_EPSILON * (score_bound + m.bias);
  if (e_total > 1e-2) return;  // scores too ill-conditioned to compare
  qkv_attention_desc ref = full;
  ref.backend = "reference";
  const Outputs r = RunFresh(ref, q.ptr(), k.ptr(), v.ptr(), out.v.size(),
                             weights.v.size(), lse.v.size());
  CHECK(r.status == QKV_OK, "the reference engine refused a valid call",
        r.status);
  // Each engine is within the Core bound of the exact result; scores may
  // additionally differ by 2 * e_total, which moves each weight by at most
  // 2 * (that) and out by max|v| times the sum of weight changes.
  const double ds = 2 * e_total;
  const double w_tol = 2e-5 + 2 * ds;
  const double out_tol = (5e-5 + 4 * ds) * m.v + 1e-37;
  for (size_t i = 0; i < out.v.size(); ++i) {
    if (!out_addr.empty() && out_addr[i] == 0) {
      CHECK(memcmp(&r.out[i], &kSentinelBits, 4) == 0,
            "the reference engine wrote outside out's strides",
            static_cast<long long>(i));
      continue;
    }
    if (!(fabs(static_cast<double>(out.v[i]) - r.out[i]) <= out_tol)) {
      if (Verbose()) PrintDesc("effective", e, struct_size);
      fprintf(stderr, "out[%zu] = %.9g, reference %.9g, tolerance %.3g\n", i,
              out.v[i], r.out[i], out_tol);
      Fail("out disagrees with the reference engine");
    }
  }
  for (size_t i = 0; i < weights.v.size(); ++i) {
    if (!(fabs(static_cast<double>(weights.v[i]) - r.weights[i]) <= w_tol)) {
      fprintf(stderr, "weights[%zu] = %.9g, reference %.9g, tolerance %.3g\n",
              i, weights.v[i], r.weights[i], w_tol);
      Fail("weights disagree with the reference engine");
    }
  }
  for (size_t i = 0; i < lse.v.size(); ++i) {
    const double a = lse.v[i], b = r.lse[i];
    const bool ok = (a == -INFINITY || b == -INFINITY)
                        ? a == b
                        : fabs(a - b) <= 1e-4 * (1 + fabs(b)) + ds;
    if (!ok) {
      fprintf(stderr, "lse[%zu] = %.9g, reference %.9g\n", i, a, b);
      Fail("lse disagrees with the reference engine");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  RunOne(data, size);
  return 0;
}
