// The C ABI boundary: descriptor normalization (struct_size), argument
// validation, status codes, version, engine choice, workspace carving and the
// hand-off to the caller's thread pool. Kernels behind it never validate.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine.h"
#include "qkv/qkv.h"
#include "semantics.h"
#include "why.h"

namespace qkv {
namespace {

// F16, BF16 and I8 K/V caches: built unless the build turns them off
// (QKV_LOW_PRECISION_KV=0, microcontrollers by default), which leaves their
// checks out too and refuses those types as unsupported.
#if !defined(QKV_LOW_PRECISION_KV) || QKV_LOW_PRECISION_KV
constexpr bool kKvTypes = true;
#else
constexpr bool kKvTypes = false;
#endif

// A struct_size beyond this is not a descriptor but a bug: refuse it rather
// than read that much of the caller's memory.
constexpr size_t kMaxStructSize = 4096;

#define QKV_FIELD_END(field)                  \
  (offsetof(qkv_attention_desc, field) +      \
   sizeof(static_cast<qkv_attention_desc*>(nullptr)->field))

// The last field: a struct_size past its end (sizeof, with the padding) is a
// newer caller's descriptor.
static_assert(QKV_FIELD_END(kv_start) <= sizeof(qkv_attention_desc),
              "kv_start must be the descriptor's last field");

// The 0.2 descriptor: through kv_start, padded to the alignment of its
// widest members (int64_t, pointers, size_t as this target aligns them in a
// struct). What the exported qkv_attention_desc_init writes, forever.
struct Desc02Align {
  size_t s;
  int64_t i;
  const void* p;
};
constexpr size_t kDescSize02 =
    (QKV_FIELD_END(kv_start) + alignof(Desc02Align) - 1) /
    alignof(Desc02Align) * alignof(Desc02Align);
static_assert(sizeof(void*) != 8 || kDescSize02 == 408,
              "the 0.2 descriptor is 408 bytes on 64-bit targets");
static_assert(sizeof(void*) != 4 ||
                  kDescSize02 == (alignof(Desc02Align) == 8 ? 336 : 328),
              "the 0.2 descriptor is 336 bytes on 32-bit targets that align "
              "int64_t to 8 (ARM, RISC-V), 328 on i386");
static_assert(kDescSize02 <= sizeof(qkv_attention_desc),
              "the descriptor only grows");

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

// Records why a call is refused, for qkv_attention_explain. Validation is
// compiled twice: with kExplain (explain's copy, which records) and without
// (the calls' copy, where every refusal is a bare status and no name or
// sentence is linked: firmware that never explains carries none of it).
// Returns the status.
#if defined(__GNUC__)
__attribute__((noinline, cold))
#endif
qkv_status Refuse(Why* why, qkv_status st, Reason reason,
                  const char* name = nullptr, int64_t a = 0, int64_t b = 0,
                  int64_t c = 0, const char* name2 = nullptr) {
  if (why != nullptr) {
    why->reason = reason;
    why->name = name;
    why->name2 = name2;
    why->a = a;
    why->b = b;
    why->c = c;
  }
  return st;
}

#if defined(__GNUC__)
__attribute__((noinline, cold))
#endif
qkv_status RefuseF(Why* why, Reason reason, const char* name, int64_t a,
                   double f) {
  if (why != nullptr) {
    why->reason = reason;
    why->name = name;
    why->a = a;
    why->f = f;
  }
  return QKV_ERR_INVALID_ARGUMENT;
}

#define QKV_INVALID(...)                                              \
  (kExplain ? Refuse(why, QKV_ERR_INVALID_ARGUMENT, __VA_ARGS__)      \
            : QKV_ERR_INVALID_ARGUMENT)
#define QKV_REFUSE(st, ...) (kExplain ? Refuse(why, st, __VA_ARGS__) : (st))
#define QKV_INVALID_F(...) \
  (kExplain ? RefuseF(why, __VA_ARGS__) : QKV_ERR_INVALID_ARGUMENT)

// size_t as int64 for a message, saturated (size_t may be 32 bits).
int64_t SizeArg(size_t n) {
  const uint64_t wide = n;
  return wide > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX
                                                 : static_cast<int64_t>(wide);
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
  int32_t kv_dtype;
  bool empty;    // batch or q_len 0: nothing to do
  bool no_keys;  // kv_len 0: every row sees no key
  // Offsets (in elements) one past the last element each tensor's strides
  // reach, for the overlap checks.
  int64_t q_end, k_end, v_end, out_end;
  int64_t ksc_end, vsc_end;  // the I8 scales (0 for the other types)
};

// One tensor's strides: `given` as the caller wrote them (all zero: dense
// for sizes n0 x n1 x n2 x dim). Validates and stores the strides to use
// and one past the last element they reach (0 when the tensor is empty).
struct StrideCheck {
  const char* batch;  // field names, for the message
  const char* head;
  const char* token;
  const char* dim_name;
};

#if defined(__OPTIMIZE_SIZE__)
#define QKV_OUT_OF_LINE
#else
#define QKV_OUT_OF_LINE __attribute__((noinline))
#endif
// Dense strides of an n0 x n1 x n2 x dim tensor, and one past its last
// element. The caller has checked that the count fits when the tensor has
// elements; an empty batch (n0 = 0) may come with any other sizes, and then
// the strides are never used: 0.
inline void DenseStrides(int64_t n0, int64_t n1, int64_t n2, int64_t dim,
                         int64_t* sb, int64_t* sh, int64_t* st, int64_t* end) {
  if (n0 == 0) {
    *sb = *sh = *st = *end = 0;
    return;
  }
  *st = dim;
  *sh = n2 * dim;
  *sb = n1 * *sh;
  *end = n0 * *sb;
}

template <bool kExplain>
QKV_OUT_OF_LINE qkv_status CheckStrides(const qkv_strides& given, int64_t n0, int64_t n1,
                        int64_t n2, int64_t dim, const StrideCheck* names,
                        bool output, int64_t* sb, int64_t* sh, int64_t* st,
                        int64_t* end, Why* why) {
  const bool empty = n0 == 0 || n1 == 0 || n2 == 0;
  if (given.batch == 0 && given.head == 0 && given.token == 0) {
    DenseStrides(n0, n1, n2, dim, sb, sh, st, end);
    return QKV_OK;
  }
  const int64_t s[3] = {given.batch, given.head, given.token};
  const int64_t n[3] = {n0, n1, n2};
  // The field names, for explain's copy only (NULL in the calls' copy, so
  // that no name is linked into it).
  const char* name[3] = {kExplain ? names->batch : nullptr,
                         kExplain ? names->head : nullptr,
                         kExplain ? names->token : nullptr};
  const char* batch_name = name[0];
  for (int i = 0; i < 3; ++i) {
    if (s[i] < 0) return QKV_INVALID(kWhyNegativeStride, name[i], s[i]);
    if (!output && s[i] != 0 && s[i] < dim) {
      return QKV_INVALID(kWhyStrideTooSmall, name[i], s[i], dim, 0,
                         kExplain ? names->dim_name : nullptr);
    }
  }
  if (output && !empty) {
    // Nesting: sorted by stride, each dimension of size > 1 starts past the
    // extent of the ones inside it, so no two elements share memory.
    int order[3] = {0, 1, 2};
    for (int i = 1; i < 3; ++i) {
      for (int j = i; j > 0 && s[order[j]] < s[order[j - 1]]; --j) {
        const int t = order[j];
        order[j] = order[j - 1];
        order[j - 1] = t;
      }
    }
    int64_t extent = dim;
    for (int i = 0; i < 3; ++i) {
      const int d = order[i];
      if (n[d] <= 1) continue;
      if (s[d] < extent) {
        return QKV_INVALID(kWhyOutAlias, name[d], s[d], extent);
      }
      const int64_t span = Mul(n[d] - 1, s[d]);
      if (span < 0 || span > INT64_MAX - extent) {
        return QKV_INVALID(kWhyStrideExtent, batch_name);
      }
      extent += span;
    }
  }
  *sb = s[0];
  *sh = s[1];
  *st = s[2];
  if (empty) {
    *end = 0;
    return QKV_OK;
  }
  // One past the last element: (n0-1) sb + (n1-1) sh + (n2-1) st + dim.
  int64_t last = dim;
  for (int i = 0; i < 3; ++i) {
    const int64_t term = Mul(n[i] - 1, s[i]);
    if (term < 0 || term > INT64_MAX - last) {
      return QKV_INVALID(kWhyStrideExtent, batch_name);
    }
    last += term;
  }
  if (!Addressable(last)) return QKV_INVALID(kWhyStrideExtent, batch_name);
  *end = last;
  return QKV_OK;
}

// Dense strides (all zero, the common case) inline when optimizing for
// speed, the rest out of line; optimizing for size, one CheckStrides does
// all.
template <bool kExplain>
inline __attribute__((always_inline)) qkv_status Strides(const qkv_strides& given, int64_t n0, int64_t n1,
                          int64_t n2, int64_t dim, const StrideCheck* names,
                          bool output, int64_t* sb, int64_t* sh, int64_t* st,
                          int64_t* end, Why* why) {
#if !defined(__OPTIMIZE_SIZE__)
  if ((given.batch | given.head | given.token) == 0) {
    DenseStrides(n0, n1, n2, dim, sb, sh, st, end);
    return QKV_OK;
  }
#endif
  return CheckStrides<kExplain>(given, n0, n1, n2, dim, names, output, sb, sh,
                                st, end, why);
}

const StrideCheck kQStrides = {"q_strides.batch", "q_strides.head",
                               "q_strides.token", "head_dim"};
const StrideCheck kKStrides = {"k_strides.batch", "k_strides.head",
                               "k_strides.token", "head_dim"};
const StrideCheck kVStrides = {"v_strides.batch", "v_strides.head",
                               "v_strides.token", "value_dim"};
const StrideCheck kKScaleStrides = {"k_scale_strides.batch",
                                    "k_scale_strides.head",
                                    "k_scale_strides.token", "1"};
const StrideCheck kVScaleStrides = {"v_scale_strides.batch",
                                    "v_scale_strides.head",
                                    "v_scale_strides.token", "1"};
const StrideCheck kOutStrides = {"out_strides.batch", "out_strides.head",
                                 "out_strides.token", "value_dim"};

// A window side of 2^40 or more reaches past every key from every position
// (positions are int32 plus q_len): unbounded, like a negative side, and
// small enough that position arithmetic cannot overflow.
int64_t WindowSide(int64_t side) {
  return side >= (int64_t{1} << 40) ? -1 : side;
}

// PlanFrom's steps, in the order of its checks (the first invalid field is
// the one reported). Each reads a field only when it lies wholly inside
// `size` (QKV_HAS); the others are at their defaults. The descriptor is
// read where the caller keeps it, through a pointer (a reference would let
// the compiler read past a shorter descriptor). Always inlined: as one
// function, the -Os firmware is the size it was.
#define QKV_HAS(field) (kFull || QKV_FIELD_END(field) <= size)
#define QKV_READ(field) (QKV_HAS(field) ? d->field : 0)
#define QKV_PLAN_STEP \
  template <bool kFull, bool kExplain> inline __attribute__((always_inline)) qkv_status

// Every field of p that a descriptor may leave unset, at its default.
// Optimizing for speed they are stored one by one (a memset of the whole
// Problem was a sixth of a tiny call's boundary); for size one memset is
// smaller.
inline __attribute__((always_inline)) void SetDefaults(Problem* p) {
#if defined(__OPTIMIZE_SIZE__)
  memset(p, 0, sizeof(*p));
#endif
  p->valid_lens = nullptr;
  p->valid_lens_per_query = false;
  p->bias = nullptr;
  p->bias_batch_stride = p->bias_head_stride = 0;
  p->additive_hidden = 0;
  p->w_q = p->w_k = p->w_v = nullptr;
  p->window = false;
  p->window_left = p->window_right = -1;
  p->alibi_slopes = nullptr;
  p->sinks = nullptr;
  p->kv_start = nullptr;
}

// The sizes (no defaults: a descriptor without them is invalid) and the
// GQA group, into p.
QKV_PLAN_STEP PlanSizes(const qkv_attention_desc* d, size_t size, Problem* p,
                        Why* why) {
  if (!QKV_HAS(value_dim)) {
    return QKV_INVALID(kWhyStructTooShort, nullptr,
                       static_cast<int64_t>(size),
                       static_cast<int64_t>(QKV_FIELD_END(value_dim)));
  }
  const int64_t batch = d->batch, q_heads = d->q_heads,
                kv_heads = d->kv_heads, q_len = d->q_len, kv_len = d->kv_len,
                head_dim = d->head_dim, value_dim = d->value_dim;
  if ((batch | q_len | kv_len) < 0 || q_heads <= 0 || kv_heads <= 0 ||
      head_dim <= 0 || value_dim <= 0) {
    if (batch < 0) return QKV_INVALID(kWhyNegativeSize, "batch", batch);
    if (q_heads <= 0) return QKV_INVALID(kWhyNotPositive, "q_heads", q_heads);
    if (kv_heads <= 0) {
      return QKV_INVALID(kWhyNotPositive, "kv_heads", kv_heads);
    }
    if (q_len < 0) return QKV_INVALID(kWhyNegativeSize, "q_len", q_len);
    if (kv_len < 0) return QKV_INVALID(kWhyNegativeSize, "kv_len", kv_len);
    if (head_dim <= 0) {
      return QKV_INVALID(kWhyNotPositive, "head_dim", head_dim);
    }
    return QKV_INVALID(kWhyNotPositive, "value_dim", value_dim);
  }
  // (A 64-bit division is tens of cycles, a good part of a tiny call: the
  // common MHA and MQA shapes skip it.)
  const int64_t group = kv_heads == q_heads ? 1
                        : kv_heads == 1     ? q_heads
                                            : q_heads / kv_heads;
  if (group * kv_heads != q_heads) {
    return QKV_INVALID(kWhyGroup, nullptr, q_heads, kv_heads);
  }
  p->batch = batch;
  p->q_heads = q_heads;
  p->kv_heads = kv_heads;
  p->q_len = q_len;
  p->kv_len = kv_len;
  p->head_dim = head_dim;
  p->value_dim = value_dim;
  p->group = group;
  return QKV_OK;
}

// The score kind, the masks, the scale; then whether every element count
// and byte count is representable: q, k, v, out and weights (the rows,
// lse, divide each).
QKV_PLAN_STEP PlanScore(const qkv_attention_desc* d, size_t size, Problem* p,
                        uint32_t* mask_out, Why* why) {
  // An out-of-range enum value is undefined behaviour to read as the enum in
  // C++, and that is exactly what a C caller may pass: read its bytes.
  int32_t score = QKV_SCORE_DOT;
  static_assert(sizeof(score) == sizeof(d->score), "qkv_score is 32 bits");
  if (QKV_HAS(score)) memcpy(&score, &d->score, sizeof(score));
  if (score != QKV_SCORE_DOT && score != QKV_SCORE_GAUSSIAN &&
      score != QKV_SCORE_ADDITIVE) {
    return QKV_INVALID(kWhyScore, nullptr, score);
  }
  const uint32_t known_masks = QKV_MASK_CAUSAL | QKV_MASK_VALID_LENS |
                               QKV_MASK_BIAS | QKV_MASK_WINDOW |
                               QKV_MASK_KV_START;
  const uint32_t mask = QKV_READ(mask);
  if ((mask & ~known_masks) != 0) return QKV_INVALID(kWhyMask, nullptr, mask);
  const float scale = QKV_HAS(scale) ? d->scale : DefaultScale(p->head_dim);
  if (!isfinite(scale)) return QKV_INVALID_F(kWhyScale, "scale", 0, scale);
  const int64_t b = p->batch, hq = p->q_heads, hk = p->kv_heads;
  const int64_t lq = p->q_len, lk = p->kv_len;
  if (!Count4(b, hq, lq, p->head_dim) || !Count4(b, hk, lk, p->head_dim) ||
      !Count4(b, hk, lk, p->value_dim) || !Count4(b, hq, lq, p->value_dim) ||
      !Count4(b, hq, lq, lk)) {
    return QKV_INVALID(kWhyTooLarge);
  }
  p->score = static_cast<qkv_score>(score);
  p->scale = scale;
  p->causal = (mask & QKV_MASK_CAUSAL) != 0;
  *mask_out = mask;
  return QKV_OK;
}

// QKV_MASK_VALID_LENS and QKV_MASK_BIAS: their arrays and strides.
QKV_PLAN_STEP PlanMasks(const qkv_attention_desc* d, size_t size, Problem* p,
                        uint32_t mask, Why* why) {
  const int64_t batch = p->batch, q_len = p->q_len, kv_len = p->kv_len;
  if (mask & QKV_MASK_VALID_LENS) {
    const int32_t* valid_lens = QKV_READ(valid_lens);
    const bool per_query = QKV_READ(valid_lens_per_query) != 0;
    if (valid_lens == nullptr) {
      return QKV_INVALID(kWhyNullArray, "valid_lens", 0, QKV_MASK_VALID_LENS);
    }
    const int64_t n = per_query ? batch * q_len : batch;  // fits: n_rows does
    for (int64_t i = 0; i < n; ++i) {
      if (valid_lens[i] < 0 || valid_lens[i] > kv_len) {
        return QKV_INVALID(kWhyIndexRange, "valid_lens", i, valid_lens[i],
                           kv_len);
      }
    }
    p->valid_lens = valid_lens;
    p->valid_lens_per_query = per_query;
  }
  if (!(mask & QKV_MASK_BIAS)) return QKV_OK;
  const float* bias = QKV_READ(bias);
  const int64_t batch_stride = QKV_READ(bias_batch_stride);
  const int64_t head_stride = QKV_READ(bias_head_stride);
  if (bias == nullptr) {
    return QKV_INVALID(kWhyNullArray, "bias", 0, QKV_MASK_BIAS);
  }
  if (batch_stride < 0) {
    return QKV_INVALID(kWhyBiasStride, "bias_batch_stride", batch_stride);
  }
  if (head_stride < 0) {
    return QKV_INVALID(kWhyBiasStride, "bias_head_stride", head_stride);
  }
  // The last element read: (B-1)*sb + (H-1)*sh + Lq*Lk - 1.
  const int64_t last_b = Mul(batch > 0 ? batch - 1 : 0, batch_stride);
  const int64_t last_h = Mul(p->q_heads - 1, head_stride);
  // (Checked: with batch 0 the weights' count is 0 whatever q_len * kv_len
  // is.)
  const int64_t row_block = Mul(q_len, kv_len);
  if (row_block < 0 || last_b < 0 || last_h < 0 ||
      last_b > INT64_MAX - last_h ||
      last_b + last_h > INT64_MAX - row_block ||
      !Addressable(last_b + last_h + row_block)) {
    return QKV_INVALID(kWhyTooLarge, "bias");
  }
  p->bias = bias;
  p->bias_batch_stride = batch_stride;
  p->bias_head_stride = head_stride;
  return QKV_OK;
}

// Additive scores: the hidden width and the three projections.
QKV_PLAN_STEP PlanAdditive(const qkv_attention_desc* d, size_t size,
                           Problem* p, Why* why) {
  if (p->score != QKV_SCORE_ADDITIVE) return QKV_OK;
  const int64_t hidden = QKV_READ(additive_hidden);
  const float* w_q = QKV_READ(additive_w_q);
  const float* w_k = QKV_READ(additive_w_k);
  const float* w_v = QKV_READ(additive_w_v);
  if (hidden <= 0) return QKV_INVALID(kWhyAdditiveHidden, nullptr, hidden);
  if (w_q == nullptr) return QKV_INVALID(kWhyNullArray, "additive_w_q");
  if (w_k == nullptr) return QKV_INVALID(kWhyNullArray, "additive_w_k");
  if (w_v == nullptr) return QKV_INVALID(kWhyNullArray, "additive_w_v");
  // Rows of k and of out (lse): no overflow, the counts are checked.
  const int64_t kv_rows = p->batch * p->kv_heads * p->kv_len;
  const int64_t n_rows = p->batch * p->q_heads * p->q_len;
  if (!Addressable(Mul(hidden, p->head_dim)) || p->kv_len == INT64_MAX ||
      !Addressable(Mul(hidden, p->kv_len + 1)) ||
      !Addressable(Mul(kv_rows, hidden)) ||
      !Addressable(Mul(n_rows, hidden))) {
    return QKV_INVALID(kWhyTooLarge, "additive_hidden");
  }
  p->additive_hidden = hidden;
  p->w_q = w_q;
  p->w_k = w_k;
  p->w_v = w_v;
  return QKV_OK;
}

// 0.2: the element type of K and V, the strides of q, k, v and out, and
// an I8 cache's scales.
QKV_PLAN_STEP PlanLayouts(const qkv_attention_desc* d, size_t size,
                          Plan* plan, Why* why) {
  Problem& p = plan->problem;
  const int64_t batch = p.batch, q_heads = p.q_heads, kv_heads = p.kv_heads;
  const int64_t q_len = p.q_len, kv_len = p.kv_len;
  const int64_t head_dim = p.head_dim, value_dim = p.value_dim;
  int32_t dtype = QKV_DTYPE_F32;
  static_assert(sizeof(dtype) == sizeof(d->kv_dtype), "qkv_dtype is 32 bits");
  if (QKV_HAS(kv_dtype)) memcpy(&dtype, &d->kv_dtype, sizeof(dtype));
  if (dtype < QKV_DTYPE_F32 || dtype > QKV_DTYPE_I8) {
    return QKV_INVALID(kWhyDtype, nullptr, dtype);
  }
  plan->kv_dtype = dtype;
  const qkv_strides zero = {0, 0, 0};
  qkv_status st;
  st = Strides<kExplain>(QKV_HAS(q_strides) ? d->q_strides : zero, batch, q_heads,
                    q_len, head_dim, kExplain ? &kQStrides : nullptr, false, &p.q_sb, &p.q_sh,
                    &p.q_st, &plan->q_end, why);
  if (st != QKV_OK) return st;
  st = Strides<kExplain>(QKV_HAS(k_strides) ? d->k_strides : zero, batch, kv_heads,
                    kv_len, head_dim, kExplain ? &kKStrides : nullptr, false, &p.k_sb, &p.k_sh,
                    &p.k_st, &plan->k_end, why);
  if (st != QKV_OK) return st;
  st = Strides<kExplain>(QKV_HAS(v_strides) ? d->v_strides : zero, batch, kv_heads,
                    kv_len, value_dim, kExplain ? &kVStrides : nullptr, false, &p.v_sb, &p.v_sh,
                    &p.v_st, &plan->v_end, why);
  if (st != QKV_OK) return st;
  st = Strides<kExplain>(QKV_HAS(out_strides) ? d->out_strides : zero, batch,
                    q_heads, q_len, value_dim, kExplain ? &kOutStrides : nullptr, true, &p.out_sb,
                    &p.out_sh, &p.out_st, &plan->out_end, why);
  if (st != QKV_OK) return st;
  p.kv_dtype = static_cast<qkv_dtype>(dtype);
  if (kKvTypes) {  // (without the types nothing reads them)
    p.k_scales = p.v_scales = nullptr;
    p.ksc_sb = p.ksc_sh = p.ksc_st = p.vsc_sb = p.vsc_sh = p.vsc_st = 0;
    plan->ksc_end = plan->vsc_end = 0;
  }
  if (!kKvTypes || dtype != QKV_DTYPE_I8) return QKV_OK;
  // One scale per (batch, kv head, key) row of K and of V; their values
  // are data, like K's and V's, and not checked.
  p.k_scales = QKV_READ(k_scales);
  p.v_scales = QKV_READ(v_scales);
  st = Strides<kExplain>(QKV_HAS(k_scale_strides) ? d->k_scale_strides : zero,
                         batch, kv_heads, kv_len, 1,
                         kExplain ? &kKScaleStrides : nullptr, false,
                         &p.ksc_sb, &p.ksc_sh, &p.ksc_st, &plan->ksc_end, why);
  if (st != QKV_OK) return st;
  return Strides<kExplain>(QKV_HAS(v_scale_strides) ? d->v_scale_strides : zero,
                           batch, kv_heads, kv_len, 1,
                           kExplain ? &kVScaleStrides : nullptr, false,
                           &p.vsc_sb, &p.vsc_sh, &p.vsc_st, &plan->vsc_end, why);
}

// The variants: window, ALiBi slopes, softcap, query positions, sinks,
// per-batch first keys.
QKV_PLAN_STEP PlanVariants(const qkv_attention_desc* d, size_t size,
                           Problem* p, uint32_t mask, Why* why) {
  if (mask & QKV_MASK_WINDOW) {
    p->window = true;
    p->window_left = WindowSide(QKV_READ(window_left));
    p->window_right = WindowSide(QKV_READ(window_right));
  }
  const float* slopes = QKV_READ(alibi_slopes);
  if (slopes != nullptr) {
    for (int64_t h = 0; h < p->q_heads; ++h) {
      if (!isfinite(slopes[h])) {
        return QKV_INVALID_F(kWhyNotFinite, "alibi_slopes", h, slopes[h]);
      }
    }
    p->alibi_slopes = slopes;
  }
  const float softcap = QKV_HAS(softcap) ? d->softcap : 0.0f;
  if (!(softcap >= 0.0f) || !isfinite(softcap)) {
    return QKV_INVALID_F(kWhySoftcap, "softcap", 0, softcap);
  }
  p->softcap = softcap;
  p->q_pos = QKV_READ(q_pos);
  const float* sinks = QKV_READ(sinks);
  if (sinks != nullptr) {
    for (int64_t h = 0; h < p->q_heads; ++h) {
      if (isnan(sinks[h]) || sinks[h] == INFINITY) {
        return QKV_INVALID_F(kWhySink, "sinks", h, sinks[h]);
      }
    }
    p->sinks = sinks;
  }
  if (!(mask & QKV_MASK_KV_START)) return QKV_OK;
  const int32_t* kv_start = QKV_READ(kv_start);
  if (kv_start == nullptr) {
    return QKV_INVALID(kWhyNullArray, "kv_start", 0, QKV_MASK_KV_START);
  }
  for (int64_t b = 0; b < p->batch; ++b) {
    if (kv_start[b] < 0 || kv_start[b] > p->kv_len) {
      return QKV_INVALID(kWhyIndexRange, "kv_start", b, kv_start[b], p->kv_len);
    }
  }
  p->kv_start = kv_start;
  return QKV_OK;
}

// Valid, but maybe not servable here: a longer descriptor with non-zero
// bytes past ours sets fields this library does not know; lengths past
// int32; K/V types a build without them does not serve.
QKV_PLAN_STEP PlanServable(const qkv_attention_desc* d, size_t size,
                           const Plan* plan, Why* why) {
  if (!kFull) {
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(d);
    for (size_t i = sizeof(qkv_attention_desc); i < size; ++i) {
      if (bytes[i] != 0) {
        return QKV_REFUSE(QKV_ERR_UNSUPPORTED, kWhyUnknownBytes, nullptr,
                      static_cast<int64_t>(size),
                      static_cast<int64_t>(sizeof(qkv_attention_desc)));
      }
    }
  }
  const int64_t q_len = plan->problem.q_len, kv_len = plan->problem.kv_len;
  if (q_len > INT32_MAX) {
    return QKV_REFUSE(QKV_ERR_UNSUPPORTED, kWhyLength32, "q_len", q_len);
  }
  if (kv_len > INT32_MAX) {
    return QKV_REFUSE(QKV_ERR_UNSUPPORTED, kWhyLength32, "kv_len", kv_len);
  }
  if (!kKvTypes && plan->kv_dtype != QKV_DTYPE_F32) {
    return QKV_REFUSE(QKV_ERR_UNSUPPORTED, kWhyDtypeUnserved, nullptr,
                      plan->kv_dtype);
  }
  return QKV_OK;
}

// Validates the caller's descriptor `d` of struct_size `size` (not the data
// pointers) into `plan`: the steps above, in order. A field is read only
// when it lies wholly inside `size`; the others are at their defaults:
// scale 1/sqrt(head_dim), every other field 0 or NULL. kFull: size ==
// sizeof, every field is there. `why`: NULL, or where to say why the
// descriptor is refused.
template <bool kFull, bool kExplain>
qkv_status PlanFrom(const qkv_attention_desc* d, size_t size, Plan* plan,
                    Why* why) {
  Problem& p = plan->problem;
  SetDefaults(&p);
  uint32_t mask = 0;
  qkv_status st = PlanSizes<kFull, kExplain>(d, size, &p, why);
  if (st == QKV_OK) st = PlanScore<kFull, kExplain>(d, size, &p, &mask, why);
  if (st == QKV_OK) st = PlanMasks<kFull, kExplain>(d, size, &p, mask, why);
  if (st == QKV_OK) st = PlanAdditive<kFull, kExplain>(d, size, &p, why);
  if (st != QKV_OK) return st;
  const qkv_parallel_for_fn parallel_for = QKV_READ(parallel_for);
  const size_t num_workers = QKV_READ(num_workers);
  if (parallel_for != nullptr && num_workers == 0) {
    return QKV_INVALID(kWhyWorkers);
  }
  st = PlanLayouts<kFull, kExplain>(d, size, plan, why);
  if (st == QKV_OK) st = PlanVariants<kFull, kExplain>(d, size, &p, mask, why);
  if (st != QKV_OK) return st;
  plan->parallel_for = parallel_for;
  plan->parallel_ctx = QKV_READ(parallel_ctx);
  plan->workers = parallel_for != nullptr ? num_workers : 1;
  p.workers = static_cast<int64_t>(plan->workers);
  plan->engine = nullptr;
  plan->empty = p.batch == 0 || p.q_len == 0;
  plan->no_keys = p.kv_len == 0;
  st = PlanServable<kFull, kExplain>(d, size, plan, why);
  if (st != QKV_OK) return st;
  // MakePlan picks the engine for the backend, once this frame is gone.
  plan->backend = QKV_READ(backend);
  return QKV_OK;
}
#undef QKV_PLAN_STEP
#undef QKV_READ
#undef QKV_HAS

// Picks the engine for plan->backend and sizes the workspace.
template <bool kExplain>
__attribute__((noinline)) qkv_status ChooseEngine(Plan* plan, Why* why) {
  const Problem& p = plan->problem;
  const char* backend = plan->backend;
  const Engine* engine = nullptr;
  const bool trivial = plan->empty || plan->no_keys;  // no engine runs
  if (backend != nullptr && backend[0] != '\0') {
    engine = FindEngine(backend);
    if (engine == nullptr || (!trivial && !engine->supports(p))) {
      if (kExplain) why->text = backend;
      return QKV_REFUSE(QKV_ERR_UNSUPPORTED, kWhyBackend);
    }
  } else {
    engine = trivial ? EngineAt(0) : DefaultEngineFor(p);
    if (engine == nullptr) return QKV_REFUSE(QKV_ERR_UNSUPPORTED, kWhyNoEngine);
  }
  plan->engine = engine;
  plan->workspace = 0;
  if (trivial) {
    plan->shared = plan->per_worker = 0;
    return QKV_OK;
  }
  plan->shared = engine->shared_workspace(p);
  plan->per_worker = engine->workspace_per_worker(p);
  if (plan->shared != 0 || plan->per_worker != 0) {
    const size_t room = SIZE_MAX - kWorkspaceAlign - plan->shared;
    if (plan->shared > SIZE_MAX / 2 ||
        (plan->per_worker != 0 &&
         plan->per_worker > (plan->workers == 1 ? room : room / plan->workers))) {
      return QKV_INVALID(kWhyTooLarge, "workspace");
    }
    plan->workspace = plan->shared + plan->per_worker * plan->workers +
                      kWorkspaceAlign - 1;
  }
  return QKV_OK;
}

// Validates the caller's descriptor and picks the engine. A descriptor of
// any struct_size is read where it is, not copied.
template <bool kExplain>
qkv_status MakePlan(const qkv_attention_desc* in, Plan* plan, Why* why) {
  if (in == nullptr) return QKV_INVALID(kWhyDescNull);
  const size_t size = in->struct_size;
  if (size < sizeof(size_t) || size > kMaxStructSize) {
    return QKV_INVALID(kWhyStructSize, nullptr, static_cast<int64_t>(size));
  }
  const qkv_status st = kOwnSizePath && size == sizeof(qkv_attention_desc)
                            ? PlanFrom<true, kExplain>(in, size, plan, why)
                            : PlanFrom<false, kExplain>(in, size, plan, why);
  return st == QKV_OK ? ChooseEngine<kExplain>(plan, why) : st;
}

// The data pointers of a call with valid sizes `p`: a tensor with elements
// has a non-NULL pointer (q, k, v and out; weights and lse may be NULL);
// outputs overlap no input, no other output and not the workspace; a
// non-empty workspace is non-NULL. Out of line, so that its ranges are not
// on the stack while the tasks run.
template <bool kExplain>
__attribute__((noinline)) bool BuffersValid(const Plan& plan,
                                            const void* workspace,
                                            size_t workspace_size, Why* why) {
  const Problem& p = plan.problem;
  if (plan.empty) return true;  // nothing is read or written
  const float* q = p.q;
  const void *k = p.k, *v = p.v;
  const float *out = p.out, *weights = p.weights, *lse = p.lse;
  if (q == nullptr || out == nullptr ||
      (!plan.no_keys && (k == nullptr || v == nullptr))) {
    if (kExplain) {
      Refuse(why, QKV_ERR_INVALID_ARGUMENT, kWhyNullBuffer,
             q == nullptr     ? "q"
             : out == nullptr ? "out"
             : k == nullptr   ? "k"
                              : "v");
    }
    return false;
  }
  if (kKvTypes && !plan.no_keys && p.kv_dtype == QKV_DTYPE_I8 &&
      (p.k_scales == nullptr || p.v_scales == nullptr)) {
    if (kExplain) {
      Refuse(why, QKV_ERR_INVALID_ARGUMENT, kWhyNullArray,
             p.k_scales == nullptr ? "k_scales" : "v_scales", 0,
             kWhyFlagI8);
    }
    return false;
  }
  const int64_t rows = p.batch * p.q_heads * p.q_len;
  const int64_t e = kKvTypes ? KvElementBytes(p.kv_dtype) : 4;
  const Range r_out = RangeOf(out, plan.out_end, 4);
  const Range r_w = RangeOf(weights, rows * p.kv_len, 4);
  const Range r_lse = RangeOf(lse, rows, 4);
  const Range outputs[] = {r_out, r_w, r_lse};
  Range inputs[] = {RangeOf(q, plan.q_end, 4), RangeOf(k, plan.k_end, e),
                    RangeOf(v, plan.v_end, e), Range{0, 0}, Range{0, 0}};
  if (kKvTypes) {  // the I8 scales (empty for the other types)
    inputs[3] = RangeOf(p.k_scales, plan.ksc_end, 4);
    inputs[4] = RangeOf(p.v_scales, plan.vsc_end, 4);
  }
  constexpr size_t kInputs = kKvTypes ? 5 : 3;
  if (workspace == nullptr && workspace_size != 0) {
    if (kExplain) {
      Refuse(why, QKV_ERR_INVALID_ARGUMENT, kWhyWorkspaceNull, nullptr,
             SizeArg(workspace_size));
    }
    return false;
  }
  const uintptr_t ws = reinterpret_cast<uintptr_t>(workspace);
  const Range r_ws =
      workspace_size == 0 ? Range{0, 0} : Range{ws, ws + workspace_size};
  unsigned overlap = 0;
  for (size_t i = 0; i < kInputs; ++i) overlap |= Overlap(r_ws, inputs[i]);
  for (size_t i = 0; i < 3; ++i) {
    // Absent outputs (weights, lse) overlap nothing: skipping them is a
    // branch a caller's steady pattern of calls predicts.
    if (outputs[i].end == 0) continue;
    for (size_t j = 0; j < kInputs; ++j) {
      overlap |= Overlap(outputs[i], inputs[j]);
    }
    for (size_t j = i + 1; j < 3; ++j) {
      overlap |= Overlap(outputs[i], outputs[j]);
    }
    overlap |= Overlap(r_ws, outputs[i]);
  }
  if (overlap == 0) return true;
  if (kExplain) {  // find the first pair, for the message
    const char* out_names[] = {"out", "weights", "lse"};
    const char* in_names[] = {"q", "k", "v", "k_scales", "v_scales"};
    for (size_t i = 0; i < 3 && why->reason == kWhyNone; ++i) {
      if (outputs[i].end == 0) continue;
      for (size_t j = 0; j < kInputs && why->reason == kWhyNone; ++j) {
        if (Overlap(outputs[i], inputs[j])) {
          Refuse(why, QKV_ERR_INVALID_ARGUMENT, kWhyOverlap, out_names[i], 0,
                 0, 0, in_names[j]);
        }
      }
      for (size_t j = i + 1; j < 3 && why->reason == kWhyNone; ++j) {
        if (Overlap(outputs[i], outputs[j])) {
          Refuse(why, QKV_ERR_INVALID_ARGUMENT, kWhyOverlap, out_names[i], 0,
                 0, 0, out_names[j]);
        }
      }
      if (why->reason == kWhyNone && Overlap(r_ws, outputs[i])) {
        Refuse(why, QKV_ERR_INVALID_ARGUMENT, kWhyOverlap, out_names[i], 0, 0,
               0, "workspace");
      }
    }
    for (size_t j = 0; j < kInputs && why->reason == kWhyNone; ++j) {
      if (Overlap(r_ws, inputs[j])) {
        Refuse(why, QKV_ERR_INVALID_ARGUMENT, kWhyOverlap, "workspace", 0, 0,
               0, in_names[j]);
      }
    }
  }
  return false;
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

// kv_len 0: every row sees no key: out 0, lse -inf or the head's sink.
__attribute__((noinline)) void NoKeys(const Problem& p) {
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.q_heads; ++h) {
      const float sink = RowSink(p, h);
      for (int64_t i = 0; i < p.q_len; ++i) {
        float* out = OutRow(p, b, h, i);
        for (int64_t c = 0; c < p.value_dim; ++c) out[c] = 0.0f;
        if (p.lse != nullptr) {
          p.lse[(b * p.q_heads + h) * p.q_len + i] = sink;
        }
      }
    }
  }
}

// Validates a whole call; on QKV_OK `plan` is ready to run. `f32_entry`:
// called as qkv_attention_f32, which reads f32 K and V only.
template <bool kExplain>
qkv_status Prepare(const qkv_attention_desc* desc, const float* q,
                   const void* k, const void* v, float* out, float* weights,
                   float* lse, void* workspace, size_t workspace_size,
                   bool f32_entry, Plan* plan, Why* why) {
  qkv_status st = MakePlan<kExplain>(desc, plan, why);
  if (st == QKV_ERR_INVALID_ARGUMENT) return st;
  if (f32_entry && plan->kv_dtype != QKV_DTYPE_F32) {
    return QKV_INVALID(kWhyDtypeF32Entry, nullptr, plan->kv_dtype);
  }
  // Past here the sizes in plan.problem are valid even when st says the
  // request is unsupported: every invalid argument is reported first.
  Problem& p = plan->problem;
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.weights = weights;
  p.lse = lse;
  if (!BuffersValid<kExplain>(*plan, workspace, workspace_size, why)) {
    return QKV_ERR_INVALID_ARGUMENT;
  }
  if (st != QKV_OK) return st;
  if (workspace_size < plan->workspace) {
    return QKV_REFUSE(QKV_ERR_WORKSPACE_TOO_SMALL, kWhyWorkspaceSmall,
                      nullptr, SizeArg(workspace_size),
                      SizeArg(plan->workspace));
  }
  return QKV_OK;
}

qkv_status Run(const qkv_attention_desc* desc, const float* q, const void* k,
               const void* v, float* out, float* weights, float* lse,
               void* workspace, size_t workspace_size, bool f32_entry) {
  Plan plan;
  const qkv_status st =
      Prepare<false>(desc, q, k, v, out, weights, lse, workspace,
                     workspace_size, f32_entry, &plan, nullptr);
  if (st != QKV_OK) return st;
  const Problem& p = plan.problem;
  if (plan.empty) return QKV_OK;
  if (plan.no_keys) {
    NoKeys(p);
    return QKV_OK;
  }
  unsigned char* base = nullptr;
  if (plan.workspace != 0) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(workspace);
    const uintptr_t aligned =
        (at + kWorkspaceAlign - 1) & ~(uintptr_t{kWorkspaceAlign} - 1);
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
    RunPooled(plan, tasks, base, workers_base);
  }
  return QKV_OK;
}


// ------------------------------------------------------------ backward

// The backward pass's engine for a forward engine: its SIMD target's, or
// the portable one (reference, Helium).
const BackwardEngine* BackwardOf(const Engine* engine) {
  const BackwardEngine* bw = nullptr;
#if QKV_HAVE_HIGHWAY
  bw = HighwayBackward(engine);
#endif
#if QKV_HAVE_XSIMD
  if (bw == nullptr) bw = XsimdBackward(engine);
#endif
  (void)engine;
  return bw != nullptr ? bw : ReferenceBackward();
}

struct BackwardCall {
  Plan plan;
  Gradients grads;
  const BackwardEngine* engine;
  size_t workspace;  // bytes, with alignment slack
};

// Sizes the backward pass's workspace for a valid plan.
template <bool kExplain>
qkv_status PlanBackward(BackwardCall* call, Why* why) {
  Plan& plan = call->plan;
  const Problem& p = plan.problem;
  call->engine = BackwardOf(plan.engine);
  call->workspace = 0;
  if (plan.empty || plan.no_keys) return QKV_OK;
  const size_t per_worker = call->engine->workspace_per_worker(p);
  if (per_worker != 0) {
    const size_t room = SIZE_MAX - kWorkspaceAlign;
    if (per_worker > (plan.workers == 1 ? room : room / plan.workers)) {
      return QKV_INVALID(kWhyTooLarge, "workspace");
    }
    call->workspace = per_worker * plan.workers + kWorkspaceAlign - 1;
  }
  plan.per_worker = per_worker;
  return QKV_OK;
}

// Validates the descriptor for the backward pass: the forward's checks,
// then what the backward pass serves. QKV_ERR_UNSUPPORTED from the
// forward's checks is kept for after the buffers' checks (every invalid
// argument is reported first), as Prepare does.
template <bool kExplain>
qkv_status MakeBackwardPlan(const qkv_attention_desc* desc,
                            BackwardCall* call, Why* why) {
  qkv_status st = MakePlan<kExplain>(desc, &call->plan, why);
  if (st != QKV_OK) return st;
  const Problem& p = call->plan.problem;
  if (p.score != QKV_SCORE_DOT && p.score != QKV_SCORE_GAUSSIAN) {
    return QKV_REFUSE(QKV_ERR_UNSUPPORTED, kWhyBackwardScore, nullptr,
                      p.score);
  }
  if (call->plan.kv_dtype != QKV_DTYPE_F32) {
    return QKV_REFUSE(QKV_ERR_UNSUPPORTED, kWhyBackwardDtype, nullptr,
                      call->plan.kv_dtype);
  }
  return PlanBackward<kExplain>(call, why);
}

// A gradient laid out like its operand must not make two elements share
// memory: the operand's strides must nest as an output's do.
template <bool kExplain>
bool GradientLayoutValid(int64_t sb, int64_t sh, int64_t st, int64_t n0,
                         int64_t n1, int64_t n2, int64_t dim,
                         const StrideCheck* names, Why* why) {
  qkv_strides given = {sb, sh, st};
  int64_t b, h, t, end;
  return CheckStrides<kExplain>(given, n0, n1, n2, dim,
                                kExplain ? names : nullptr, true, &b, &h, &t,
                                &end, why) == QKV_OK;
}

// Validates a whole backward call; on QKV_OK `call` is ready to run.
template <bool kExplain>
qkv_status PrepareBackward(const qkv_attention_desc* desc, const float* q,
                           const float* k, const float* v, const float* out,
                           const float* lse, const float* d_out, float* d_q,
                           float* d_k, float* d_v, void* workspace,
                           size_t workspace_size, BackwardCall* call,
                           Why* why) {
  qkv_status st = MakeBackwardPlan<kExplain>(desc, call, why);
  if (st == QKV_ERR_INVALID_ARGUMENT) return st;
  Plan& plan = call->plan;
  Problem& p = plan.problem;
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = const_cast<float*>(out);  // read only: the forward's result
  p.weights = nullptr;
  p.lse = const_cast<float*>(lse);
  call->grads.d_out = d_out;
  call->grads.d_q = d_q;
  call->grads.d_k = d_k;
  call->grads.d_v = d_v;
  const bool rows = !plan.empty;              // there are query rows
  const bool keys = !plan.no_keys && p.batch > 0;  // there are key rows
  // Required buffers.
  const char* missing = nullptr;
  if (rows && q == nullptr) missing = "q";
  else if (rows && out == nullptr) missing = "out";
  else if (rows && lse == nullptr) missing = "lse";
  else if (rows && d_out == nullptr) missing = "d_out";
  else if (rows && keys && k == nullptr) missing = "k";
  else if (rows && keys && v == nullptr) missing = "v";
  if (missing != nullptr) {
    return QKV_INVALID(kWhyNullBuffer, missing);
  }
  // Gradient layouts.
  if (rows && d_q != nullptr &&
      !GradientLayoutValid<kExplain>(p.q_sb, p.q_sh, p.q_st, p.batch,
                                     p.q_heads, p.q_len, p.head_dim,
                                     &kQStrides, why)) {
    return QKV_ERR_INVALID_ARGUMENT;
  }
  if (keys && d_k != nullptr &&
      !GradientLayoutValid<kExplain>(p.k_sb, p.k_sh, p.k_st, p.batch,
                                     p.kv_heads, p.kv_len, p.head_dim,
                                     &kKStrides, why)) {
    return QKV_ERR_INVALID_ARGUMENT;
  }
  if (keys && d_v != nullptr &&
      !GradientLayoutValid<kExplain>(p.v_sb, p.v_sh, p.v_st, p.batch,
                                     p.kv_heads, p.kv_len, p.value_dim,
                                     &kVStrides, why)) {
    return QKV_ERR_INVALID_ARGUMENT;
  }
  if (workspace == nullptr && workspace_size != 0) {
    return QKV_INVALID(kWhyWorkspaceNull, nullptr, SizeArg(workspace_size));
  }
  // Overlaps: gradients against the inputs, each other and the workspace;
  // the workspace against the inputs.
  const int64_t nrows = rows ? p.batch * p.q_heads * p.q_len : 0;
  const int64_t q_end = rows ? plan.q_end : 0;
  const int64_t out_end = rows ? plan.out_end : 0;
  const int64_t k_end = keys ? plan.k_end : 0;
  const int64_t v_end = keys ? plan.v_end : 0;
  const Range inputs[] = {RangeOf(q, q_end, 4),   RangeOf(k, k_end, 4),
                          RangeOf(v, v_end, 4),   RangeOf(out, out_end, 4),
                          RangeOf(lse, nrows, 4), RangeOf(d_out, out_end, 4)};
  const char* in_names[] = {"q", "k", "v", "out", "lse", "d_out"};
  const uintptr_t ws = reinterpret_cast<uintptr_t>(workspace);
  const Range r_ws =
      workspace_size == 0 ? Range{0, 0} : Range{ws, ws + workspace_size};
  const Range outputs[] = {RangeOf(d_q, q_end, 4), RangeOf(d_k, k_end, 4),
                           RangeOf(d_v, v_end, 4), r_ws};
  const char* out_names[] = {"d_q", "d_k", "d_v", "workspace"};
  for (size_t i = 0; i < 4; ++i) {
    if (outputs[i].end == 0) continue;
    for (size_t j = 0; j < 6; ++j) {
      if (Overlap(outputs[i], inputs[j])) {
        return QKV_INVALID(kWhyOverlap, out_names[i], 0, 0, 0, in_names[j]);
      }
    }
    for (size_t j = i + 1; j < 4; ++j) {
      if (Overlap(outputs[i], outputs[j])) {
        return QKV_INVALID(kWhyOverlap, out_names[i], 0, 0, 0, out_names[j]);
      }
    }
  }
  if (st != QKV_OK) return st;
  if (workspace_size < call->workspace) {
    return QKV_REFUSE(QKV_ERR_WORKSPACE_TOO_SMALL, kWhyWorkspaceSmall,
                      nullptr, SizeArg(workspace_size),
                      SizeArg(call->workspace));
  }
  return QKV_OK;
}

struct BackwardContext {
  const BackwardCall* call;
  unsigned char* workers_base;
};

void RunOneBackwardTask(void* arg, size_t task, size_t worker) {
  const BackwardContext* c = static_cast<const BackwardContext*>(arg);
  const Plan& plan = c->call->plan;
  if (worker >= plan.workers) return;  // a pool that breaks its contract
  c->call->engine->run_task(plan.problem, c->call->grads, task,
                            c->workers_base + worker * plan.per_worker);
}

// No queries (q_len 0) or no keys (kv_len 0): the gradients that exist are
// zeros.
void ZeroGradients(const BackwardCall& call) {
  const Problem& p = call.plan.problem;
  const Gradients& g = call.grads;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.q_heads && g.d_q != nullptr; ++h) {
      for (int64_t i = 0; i < p.q_len; ++i) {
        float* row = g.d_q + b * p.q_sb + h * p.q_sh + i * p.q_st;
        for (int64_t c = 0; c < p.head_dim; ++c) row[c] = 0.0f;
      }
    }
    for (int64_t h = 0; h < p.kv_heads; ++h) {
      for (int64_t j = 0; j < p.kv_len; ++j) {
        if (g.d_k != nullptr) {
          float* row = g.d_k + b * p.k_sb + h * p.k_sh + j * p.k_st;
          for (int64_t c = 0; c < p.head_dim; ++c) row[c] = 0.0f;
        }
        if (g.d_v != nullptr) {
          float* row = g.d_v + b * p.v_sb + h * p.v_sh + j * p.v_st;
          for (int64_t c = 0; c < p.value_dim; ++c) row[c] = 0.0f;
        }
      }
    }
  }
}

qkv_status RunBackward(const qkv_attention_desc* desc, const float* q,
                       const float* k, const float* v, const float* out,
                       const float* lse, const float* d_out, float* d_q,
                       float* d_k, float* d_v, void* workspace,
                       size_t workspace_size) {
  BackwardCall call;
  const qkv_status st = PrepareBackward<false>(
      desc, q, k, v, out, lse, d_out, d_q, d_k, d_v, workspace,
      workspace_size, &call, nullptr);
  if (st != QKV_OK) return st;
  const Plan& plan = call.plan;
  if (plan.empty || plan.no_keys) {
    ZeroGradients(call);
    return QKV_OK;
  }
  unsigned char* base = nullptr;
  if (call.workspace != 0) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(workspace);
    const uintptr_t aligned =
        (at + kWorkspaceAlign - 1) & ~(uintptr_t{kWorkspaceAlign} - 1);
    base = static_cast<unsigned char*>(workspace) + (aligned - at);
  }
  const Problem& p = plan.problem;
  const size_t tasks = static_cast<size_t>(p.batch * p.kv_heads);
  if (plan.parallel_for == nullptr || tasks <= 1) {
    for (size_t t = 0; t < tasks; ++t) {
      call.engine->run_task(p, call.grads, t, base);
    }
  } else {
    BackwardContext ctx = {&call, base};
    plan.parallel_for(plan.parallel_ctx, tasks, &RunOneBackwardTask, &ctx);
  }
  return QKV_OK;
}

#undef QKV_INVALID
#undef QKV_INVALID_F
#undef QKV_REFUSE

// Fills the first `size` bytes of `desc`: this library's defaults for the
// fields that fit, zeros for the rest (a newer header's fields).
void InitSized(qkv_attention_desc* desc, size_t size, int64_t batch,
               int64_t q_heads, int64_t kv_heads, int64_t q_len, int64_t kv_len,
               int64_t head_dim, int64_t value_dim) {
  if (desc == nullptr || size < sizeof(size_t)) return;
  qkv_attention_desc d;
  memset(&d, 0, sizeof(d));
  d.batch = batch;
  d.q_heads = q_heads;
  d.kv_heads = kv_heads;
  d.q_len = q_len;
  d.kv_len = kv_len;
  d.head_dim = head_dim;
  d.value_dim = value_dim;
  d.score = QKV_SCORE_DOT;
  d.scale = qkv::DefaultScale(head_dim);
  d.mask = QKV_MASK_NONE;
  d.kv_dtype = QKV_DTYPE_F32;
  d.struct_size = size;
  const size_t known = size < sizeof(d) ? size : sizeof(d);
  memcpy(desc, &d, known);
  if (size > known) memset(reinterpret_cast<char*>(desc) + known, 0, size - known);
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
             "(backend, score kind, element type or descriptor field)";
  }
  return "unknown qkv_status value";
}

QKV_API void qkv_attention_desc_init_sized(qkv_attention_desc* desc,
                                           size_t struct_size, int64_t batch,
                                           int64_t q_heads, int64_t kv_heads,
                                           int64_t q_len, int64_t kv_len,
                                           int64_t head_dim,
                                           int64_t value_dim) {
  qkv::InitSized(desc, struct_size, batch, q_heads, kv_heads, q_len, kv_len,
                 head_dim, value_dim);
}

// What binaries built against 0.2's header call: the 0.2 struct, forever.
// (This header's spelling of the name is a macro for its inline wrapper.)
#undef qkv_attention_desc_init
QKV_API void qkv_attention_desc_init(qkv_attention_desc* desc, int64_t batch,
                                     int64_t q_heads, int64_t kv_heads,
                                     int64_t q_len, int64_t kv_len,
                                     int64_t head_dim, int64_t value_dim) {
  qkv::InitSized(desc, qkv::kDescSize02, batch, q_heads, kv_heads, q_len,
                 kv_len, head_dim, value_dim);
}

QKV_API size_t qkv_attention_workspace_size(const qkv_attention_desc* desc) {
  qkv::Plan plan;
  return qkv::MakePlan<false>(desc, &plan, nullptr) == QKV_OK ? plan.workspace
                                                              : 0;
}

QKV_API qkv_status qkv_attention_f32(const qkv_attention_desc* desc,
                                     const float* q, const float* k,
                                     const float* v, float* out,
                                     float* weights, float* lse,
                                     void* workspace, size_t workspace_size) {
  return qkv::Run(desc, q, k, v, out, weights, lse, workspace, workspace_size,
                  true);
}

QKV_API qkv_status qkv_attention(const qkv_attention_desc* desc,
                                 const float* q, const void* k, const void* v,
                                 float* out, float* weights, float* lse,
                                 void* workspace, size_t workspace_size) {
  return qkv::Run(desc, q, k, v, out, weights, lse, workspace, workspace_size,
                  false);
}

QKV_API qkv_status qkv_attention_explain(const qkv_attention_desc* desc,
                                         const float* q, const void* k,
                                         const void* v, const float* out,
                                         const float* weights,
                                         const float* lse,
                                         const void* workspace,
                                         size_t workspace_size, char* message,
                                         size_t message_size) {
  qkv::Plan plan;
  qkv::Why why;
  memset(&why, 0, sizeof(why));
  const qkv_status st = qkv::Prepare<true>(
      desc, q, k, v, const_cast<float*>(out), const_cast<float*>(weights),
      const_cast<float*>(lse), const_cast<void*>(workspace), workspace_size,
      false, &plan, &why);
  qkv::Describe(why, st, message, message_size);
  return st;
}

QKV_API size_t qkv_attention_backward_workspace_size(
    const qkv_attention_desc* desc) {
  qkv::BackwardCall call;
  return qkv::MakeBackwardPlan<false>(desc, &call, nullptr) == QKV_OK
             ? call.workspace
             : 0;
}

QKV_API qkv_status qkv_attention_backward_f32(
    const qkv_attention_desc* desc, const float* q, const float* k,
    const float* v, const float* out, const float* lse, const float* d_out,
    float* d_q, float* d_k, float* d_v, void* workspace,
    size_t workspace_size) {
  return qkv::RunBackward(desc, q, k, v, out, lse, d_out, d_q, d_k, d_v,
                          workspace, workspace_size);
}

QKV_API qkv_status qkv_attention_backward_explain(
    const qkv_attention_desc* desc, const float* q, const float* k,
    const float* v, const float* out, const float* lse, const float* d_out,
    const float* d_q, const float* d_k, const float* d_v,
    const void* workspace, size_t workspace_size, char* message,
    size_t message_size) {
  qkv::BackwardCall call;
  qkv::Why why;
  memset(&why, 0, sizeof(why));
  const qkv_status st = qkv::PrepareBackward<true>(
      desc, q, k, v, out, lse, d_out, const_cast<float*>(d_q),
      const_cast<float*>(d_k), const_cast<float*>(d_v),
      const_cast<void*>(workspace), workspace_size, &call, &why);
  qkv::Describe(why, st, message, message_size);
  return st;
}

}  // extern "C"
