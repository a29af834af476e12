// Bad input: every case of the list returns its pinned status and
// writes nothing to out, weights or lse; validation comes before the
// workspace check; struct_size prefixes and extensions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "qkv/qkv.h"
#include "test_util.h"

extern "C" const char* qkv_test_status_string_of_int(int status);

namespace qkv_test {
namespace {

// Stores an arbitrary int in desc.score without forming an out-of-range
// enum value in C++ (the field is an int-sized C enum).
static_assert(sizeof(qkv_score) == sizeof(int), "C enums are int-sized");
void SetRawScore(qkv_attention_desc* d, int value) {
  std::memcpy(&d->score, &value, sizeof value);
}

// The same for desc.kv_dtype.
static_assert(sizeof(qkv_dtype) == sizeof(int32_t), "C enums are int-sized");
void SetRawDtype(qkv_attention_desc* d, int32_t value) {
  std::memcpy(&d->kv_dtype, &value, sizeof value);
}

constexpr int64_t kBatch = 2, kQHeads = 4, kKvHeads = 2, kQLen = 5, kKvLen = 7,
                  kHeadDim = 8, kValueDim = 6;
constexpr size_t kNumQ = kBatch * kQHeads * kQLen * kHeadDim;     // 320
constexpr size_t kNumK = kBatch * kKvHeads * kKvLen * kHeadDim;   // 224
constexpr size_t kNumV = kBatch * kKvHeads * kKvLen * kValueDim;  // 168
constexpr size_t kNumOut = kBatch * kQHeads * kQLen * kValueDim;  // 240
constexpr size_t kNumW = kBatch * kQHeads * kQLen * kKvLen;       // 280
constexpr size_t kNumLse = kBatch * kQHeads * kQLen;              // 40
constexpr size_t kPad = 512;  // > every count, so out can move anywhere
constexpr size_t kBigWorkspace = size_t{1} << 22;

// One call's arguments, all living in one arena
//   [pad | q | pad | k | pad | v | pad | out | pad | weights | pad | lse | pad]
// so that "nothing written" is a memcmp of the whole arena, wherever a test
// points out.
struct Call {
  std::vector<float> arena;
  qkv_attention_desc desc;
  const qkv_attention_desc* desc_ptr = &desc;
  const float *q, *k, *v;
  float *out, *weights, *lse;
  std::vector<int32_t> lens;
  std::vector<float> bias, w_q, w_k, w_v;
  std::vector<float> slopes, sinks;  // [kQHeads], valid
  std::vector<int32_t> starts;       // [kBatch], valid kv_start
  std::vector<float> scales;         // 2 x [kBatch][kKvHeads][kKvLen], I8
  std::vector<unsigned char> big_desc;  // for struct_size > sizeof

  Call() : arena(kPad * 7 + kNumQ + kNumK + kNumV + kNumOut + kNumW + kNumLse) {
    std::mt19937 rng(42);
    FillUniform(&arena, &rng, -1.0f, 1.0f);
    float* p = arena.data() + kPad;
    q = p;
    p += kNumQ + kPad;
    k = p;
    p += kNumK + kPad;
    v = p;
    p += kNumV + kPad;
    out = p;
    p += kNumOut + kPad;
    weights = p;
    p += kNumW + kPad;
    lse = p;
    ResetOutputs();
    qkv_attention_desc_init(&desc, kBatch, kQHeads, kKvHeads, kQLen, kKvLen,
                            kHeadDim, kValueDim);
    lens.assign(kBatch * kQLen, 3);
    bias.assign(kQHeads * kQLen * kKvLen * kBatch, 0.5f);
    w_q.assign(16 * kHeadDim, 0.1f);
    w_k.assign(16 * kHeadDim, -0.1f);
    w_v.assign(16, 1.0f);
    slopes.assign(kQHeads, 0.25f);
    sinks = {1.0f, -std::numeric_limits<float>::infinity(), -3.0f, 50.0f};
    starts = {0, 3};
    scales.assign(2 * kBatch * kKvHeads * kKvLen, 0.01f);
  }
  // k and v read as I8 with valid scales.
  void UseI8() {
    desc.kv_dtype = QKV_DTYPE_I8;
    desc.k_scales = scales.data();
    desc.v_scales = scales.data() + kBatch * kKvHeads * kKvLen;
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  float* Q() { return const_cast<float*>(q); }
  float* K() { return const_cast<float*>(k); }
  float* V() { return const_cast<float*>(v); }

  void ResetOutputs() {
    const float s = Bits(GuardedBuffer::kSentinelBits);
    std::fill(out, out + kNumOut, s);
    std::fill(weights, weights + kNumW, s);
    std::fill(lse, lse + kNumLse, s);
  }
  qkv_status Invoke(void* ws, size_t ws_size) {
    return qkv_attention_f32(desc_ptr, q, k, v, out, weights, lse, ws, ws_size);
  }
  qkv_status InvokeGeneral(void* ws, size_t ws_size) {
    return qkv_attention(desc_ptr, q, k, v, out, weights, lse, ws, ws_size);
  }
  qkv_status Explain(void* ws, size_t ws_size, char* message, size_t size) {
    return qkv_attention_explain(desc_ptr, q, k, v, out, weights, lse, ws,
                                 ws_size, message, size);
  }
};

void FailIfCalled(void*, size_t, qkv_task_fn, void*) {
  ADD_FAILURE() << "parallel_for was called for a call that must fail";
}

struct BadCase {
  const char* name;
  qkv_status expected;  // from qkv_attention_f32
  // The descriptor alone is invalid: qkv_attention_workspace_size says 0.
  bool desc_only;
  void (*mutate)(Call*);
  // A substring qkv_attention_explain's sentence must contain (the field it
  // names), or NULL: any sentence.
  const char* field = nullptr;
  // What qkv_attention (and so qkv_attention_explain) returns, when it is
  // not `expected`: -1 means the same.
  int general = -1;
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

template <int64_t qkv_attention_desc::*kField, int64_t kValue>
void SetField(Call* c) {
  c->desc.*kField = kValue;
}

constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
using D = qkv_attention_desc;

// Each size field at 0, -1 and INT64_MIN; batch, q_len and kv_len may be 0
// (an empty call: EmptyShapesAreValid), so only -1 and INT64_MIN.
// clang-format off
#define QKV_SIZE_CASES(field)                                                  \
  BadCase{#field "_0", kInvalid, true, &SetField<&D::field, 0>, #field},       \
  QKV_NEGATIVE_SIZE_CASES(field)
#define QKV_NEGATIVE_SIZE_CASES(field)                                         \
  BadCase{#field "_neg1", kInvalid, true, &SetField<&D::field, -1>, #field},   \
  BadCase{#field "_min", kInvalid, true, &SetField<&D::field, kMin64>, #field}
// clang-format on

std::vector<BadCase> BadCases() {
  const qkv_status kInvalid = QKV_ERR_INVALID_ARGUMENT;
  return {
      {"null_desc", kInvalid, true, [](Call* c) { c->desc_ptr = nullptr; }},
      {"null_q", kInvalid, false, [](Call* c) { c->q = nullptr; }},
      {"null_k", kInvalid, false, [](Call* c) { c->k = nullptr; }},
      {"null_v", kInvalid, false, [](Call* c) { c->v = nullptr; }},
      {"null_out", kInvalid, false, [](Call* c) { c->out = nullptr; }},
      {"struct_size_0", kInvalid, true,
       [](Call* c) { c->desc.struct_size = 0; }},
      {"struct_size_1", kInvalid, true,
       [](Call* c) { c->desc.struct_size = 1; }},
      // A prefix that cuts the sizes: they have no default, which is invalid.
      {"struct_size_without_sizes", kInvalid, true,
       [](Call* c) { c->desc.struct_size = offsetof(D, q_heads); }},
      QKV_NEGATIVE_SIZE_CASES(batch),
      QKV_SIZE_CASES(q_heads),
      QKV_SIZE_CASES(kv_heads),
      QKV_NEGATIVE_SIZE_CASES(q_len),
      QKV_NEGATIVE_SIZE_CASES(kv_len),
      QKV_SIZE_CASES(head_dim),
      QKV_SIZE_CASES(value_dim),
      {"q_heads_not_multiple", kInvalid, true,
       [](Call* c) { c->desc.kv_heads = 3; }},
      {"kv_heads_above_q_heads", kInvalid, true,
       [](Call* c) { c->desc.kv_heads = 8; }},
      {"score_3", kInvalid, true, [](Call* c) { SetRawScore(&c->desc, 3); }},
      {"score_7", kInvalid, true, [](Call* c) { SetRawScore(&c->desc, 7); }},
      {"score_neg1", kInvalid, true,
       [](Call* c) { SetRawScore(&c->desc, -1); }},
      // (8 and 16 are QKV_MASK_WINDOW and QKV_MASK_KV_START since 0.2.)
      {"mask_bit_32", kInvalid, true, [](Call* c) { c->desc.mask = 32; }},
      {"mask_bit_64_with_causal_window", kInvalid, true,
       [](Call* c) {
         c->desc.mask = QKV_MASK_CAUSAL | QKV_MASK_WINDOW | 64;
       }},
      {"mask_bit_31", kInvalid, true, [](Call* c) { c->desc.mask = 1u << 31; }},
      {"mask_all_bits", kInvalid, true,
       [](Call* c) {
         c->desc.mask = 0xFFFFFFFFu;
         c->desc.valid_lens = c->lens.data();
         c->desc.bias = c->bias.data();
       }},
      {"scale_nan", kInvalid, true,
       [](Call* c) {
         c->desc.scale = std::numeric_limits<float>::quiet_NaN();
       }},
      {"scale_pos_inf", kInvalid, true,
       [](Call* c) { c->desc.scale = std::numeric_limits<float>::infinity(); }},
      {"scale_neg_inf", kInvalid, true,
       [](Call* c) {
         c->desc.scale = -std::numeric_limits<float>::infinity();
       }},
      {"overflow_batch_q_len", kInvalid, true,
       [](Call* c) {
         c->desc.batch = int64_t{1} << 40;
         c->desc.q_len = int64_t{1} << 40;
       }},
      {"overflow_head_dim", kInvalid, true,
       [](Call* c) { c->desc.head_dim = kMax64; }},
      {"overflow_kv_len", kInvalid, true,
       [](Call* c) { c->desc.kv_len = int64_t{1} << 62; }},
      // out has just over 2^62 elements (v fits in 2^63 bytes).
      {"overflow_value_dim", kInvalid, true,
       [](Call* c) { c->desc.value_dim = (int64_t{1} << 62) / 40 + 1; }},
      // Only out overflows: 2^65 elements (q, k, v, weights are fine).
      {"overflow_out_only", kInvalid, true,
       [](Call* c) {
         c->desc.q_len = int64_t{1} << 40;
         c->desc.value_dim = int64_t{1} << 22;
       }},
      // Only out's bytes overflow: exactly 2^62 elements, 2^64 bytes.
      {"overflow_out_bytes_only", kInvalid, true,
       [](Call* c) {
         c->desc.q_len = int64_t{1} << 40;
         c->desc.value_dim = int64_t{1} << 19;
       }},
      // Only weights overflows: 2^62 * 8 elements.
      {"overflow_weights_only", kInvalid, true,
       [](Call* c) {
         c->desc.q_len = int64_t{1} << 30;
         c->desc.kv_len = int64_t{1} << 32;
         c->desc.head_dim = c->desc.value_dim = 1;
       }},
      {"overflow_all_sizes", kInvalid, true,
       [](Call* c) {
         c->desc.batch = c->desc.q_heads = c->desc.kv_heads = kMax64;
         c->desc.q_len = c->desc.kv_len = kMax64;
         c->desc.head_dim = c->desc.value_dim = kMax64;
       }},
      {"overflow_additive_hidden", kInvalid, true,
       [](Call* c) {
         c->desc.score = QKV_SCORE_ADDITIVE;
         c->desc.additive_hidden = int64_t{1} << 61;  // W_q: 2^64 elements
         c->desc.additive_w_q = c->w_q.data();
         c->desc.additive_w_k = c->w_k.data();
         c->desc.additive_w_v = c->w_v.data();
       }},
      {"overflow_bias_extent", kInvalid, true,
       [](Call* c) {
         c->desc.mask = QKV_MASK_BIAS;
         c->desc.bias = c->bias.data();
         c->desc.bias_head_stride = kMax64 / 2;  // 3 heads * stride overflows
       }},
      {"lens_batch_neg1", kInvalid, false,
       [](Call* c) {
         c->desc.mask = QKV_MASK_VALID_LENS;
         c->lens[1] = -1;
         c->desc.valid_lens = c->lens.data();
       }},
      {"lens_batch_kv_len_plus1", kInvalid, false,
       [](Call* c) {
         c->desc.mask = QKV_MASK_VALID_LENS;
         c->lens[0] = kKvLen + 1;
         c->desc.valid_lens = c->lens.data();
       }},
      {"lens_batch_int32_min", kInvalid, false,
       [](Call* c) {
         c->desc.mask = QKV_MASK_VALID_LENS | QKV_MASK_CAUSAL;
         c->lens[1] = std::numeric_limits<int32_t>::min();
         c->desc.valid_lens = c->lens.data();
       }},
      {"lens_query_neg1", kInvalid, false,
       [](Call* c) {
         c->desc.mask = QKV_MASK_VALID_LENS;
         c->desc.valid_lens_per_query = 1;
         c->lens[kBatch * kQLen - 1] = -1;  // the very last one
         c->desc.valid_lens = c->lens.data();
       }},
      {"lens_query_kv_len_plus1", kInvalid, false,
       [](Call* c) {
         c->desc.mask = QKV_MASK_VALID_LENS;
         c->desc.valid_lens_per_query = 1;
         c->lens[kQLen + 2] = kKvLen + 1;  // batch 1, query 2
         c->desc.valid_lens = c->lens.data();
       }},
      {"lens_query_int32_max", kInvalid, false,
       [](Call* c) {
         c->desc.mask = QKV_MASK_VALID_LENS;
         c->desc.valid_lens_per_query = 1;
         c->lens[3] = std::numeric_limits<int32_t>::max();
         c->desc.valid_lens = c->lens.data();
       }},
      {"lens_mask_without_lens", kInvalid, false,
       [](Call* c) { c->desc.mask = QKV_MASK_VALID_LENS; }},
      {"bias_mask_without_bias", kInvalid, false,
       [](Call* c) { c->desc.mask = QKV_MASK_BIAS | QKV_MASK_CAUSAL; }},
      {"bias_batch_stride_neg", kInvalid, true,
       [](Call* c) {
         c->desc.mask = QKV_MASK_BIAS;
         c->desc.bias = c->bias.data() + kQLen * kKvLen;
         c->desc.bias_batch_stride = -1;
       }},
      {"bias_head_stride_neg", kInvalid, true,
       [](Call* c) {
         c->desc.mask = QKV_MASK_BIAS;
         c->desc.bias = c->bias.data() + 4 * kQLen * kKvLen;
         c->desc.bias_batch_stride = kQLen * kKvLen;
         c->desc.bias_head_stride = -kQLen * kKvLen;
       }},
      {"bias_head_stride_neg1", kInvalid, true,
       [](Call* c) {
         c->desc.mask = QKV_MASK_BIAS;
         c->desc.bias = c->bias.data() + 4 * kQLen * kKvLen;
         c->desc.bias_head_stride = -1;
       }},
      {"bias_batch_stride_min", kInvalid, true,
       [](Call* c) {
         c->desc.mask = QKV_MASK_BIAS;
         c->desc.bias = c->bias.data();
         c->desc.bias_batch_stride = kMin64;
       }},
      {"additive_null_w_q", kInvalid, false,
       [](Call* c) {
         c->desc.score = QKV_SCORE_ADDITIVE;
         c->desc.additive_hidden = 16;
         c->desc.additive_w_k = c->w_k.data();
         c->desc.additive_w_v = c->w_v.data();
       }},
      {"additive_null_w_k", kInvalid, false,
       [](Call* c) {
         c->desc.score = QKV_SCORE_ADDITIVE;
         c->desc.additive_hidden = 16;
         c->desc.additive_w_q = c->w_q.data();
         c->desc.additive_w_v = c->w_v.data();
       }},
      {"additive_null_w_v", kInvalid, false,
       [](Call* c) {
         c->desc.score = QKV_SCORE_ADDITIVE;
         c->desc.additive_hidden = 16;
         c->desc.additive_w_q = c->w_q.data();
         c->desc.additive_w_k = c->w_k.data();
       }},
      {"additive_hidden_0", kInvalid, true,
       [](Call* c) {
         c->desc.score = QKV_SCORE_ADDITIVE;
         c->desc.additive_hidden = 0;
         c->desc.additive_w_q = c->w_q.data();
         c->desc.additive_w_k = c->w_k.data();
         c->desc.additive_w_v = c->w_v.data();
       }},
      {"additive_hidden_neg", kInvalid, true,
       [](Call* c) {
         c->desc.score = QKV_SCORE_ADDITIVE;
         c->desc.additive_hidden = -16;
         c->desc.additive_w_q = c->w_q.data();
         c->desc.additive_w_k = c->w_k.data();
         c->desc.additive_w_v = c->w_v.data();
       }},
      {"parallel_for_with_0_workers", kInvalid, true,
       [](Call* c) {
         c->desc.parallel_for = &FailIfCalled;
         c->desc.num_workers = 0;
       }},
      // out against each other buffer: equal, partial overlaps at either end,
      // one containing the other.
      {"out_is_q", kInvalid, false, [](Call* c) { c->out = c->Q(); }},
      {"out_starts_in_q_tail", kInvalid, false,
       [](Call* c) { c->out = c->Q() + kNumQ - 1; }},
      {"out_ends_in_q_head", kInvalid, false,
       [](Call* c) { c->out = c->Q() - kNumOut + 1; }},
      {"out_inside_q", kInvalid, false, [](Call* c) { c->out = c->Q() + 40; }},
      {"out_starts_in_k", kInvalid, false,
       [](Call* c) { c->out = c->K() + 5; }},
      {"out_contains_k", kInvalid, false, [](Call* c) { c->out = c->K() - 8; }},
      {"out_ends_in_k_head", kInvalid, false,
       [](Call* c) { c->out = c->K() - kNumOut + 1; }},
      {"out_starts_in_v_tail", kInvalid, false,
       [](Call* c) { c->out = c->V() + kNumV - 1; }},
      {"out_ends_in_v_head", kInvalid, false,
       [](Call* c) { c->out = c->V() - kNumOut + 1; }},
      {"out_contains_v", kInvalid, false,
       [](Call* c) { c->out = c->V() - 30; }},
      {"out_is_weights", kInvalid, false, [](Call* c) { c->out = c->weights; }},
      {"out_inside_weights", kInvalid, false,
       [](Call* c) { c->out = c->weights + 20; }},
      {"out_ends_in_weights_head", kInvalid, false,
       [](Call* c) { c->out = c->weights - kNumOut + 1; }},
      {"out_starts_in_weights_tail", kInvalid, false,
       [](Call* c) { c->out = c->weights + kNumW - 1; }},
      {"out_is_lse", kInvalid, false, [](Call* c) { c->out = c->lse; }},
      {"out_contains_lse", kInvalid, false,
       [](Call* c) { c->out = c->lse - 100; }},
      {"out_ends_in_lse_head", kInvalid, false,
       [](Call* c) { c->out = c->lse - kNumOut + 1; }},
      {"out_starts_in_lse_tail", kInvalid, false,
       [](Call* c) { c->out = c->lse + kNumLse - 1; }},
      {"backend_nope", QKV_ERR_UNSUPPORTED, false,
       [](Call* c) { c->desc.backend = "nope"; }},
      {"backend_highway_nope", QKV_ERR_UNSUPPORTED, false,
       [](Call* c) { c->desc.backend = "highway:NOPE"; }},
      {"backend_reference_suffix", QKV_ERR_UNSUPPORTED, false,
       [](Call* c) { c->desc.backend = "reference2"; }},
      // A newer caller whose extra fields this library does not know about
      // and that are not zero.
      {"struct_size_larger_nonzero_tail", QKV_ERR_UNSUPPORTED, false,
       [](Call* c) {
         c->big_desc.assign(sizeof(D) + 64, 0);
         c->desc.struct_size = c->big_desc.size();
         std::memcpy(c->big_desc.data(), &c->desc, sizeof(D));
         c->big_desc[sizeof(D) + 63] = 1;
         c->desc_ptr = reinterpret_cast<const D*>(c->big_desc.data());
       }},
      {"struct_size_larger_nonzero_first_tail_byte", QKV_ERR_UNSUPPORTED, false,
       [](Call* c) {
         c->big_desc.assign(sizeof(D) + 8, 0);
         c->desc.struct_size = c->big_desc.size();
         std::memcpy(c->big_desc.data(), &c->desc, sizeof(D));
         c->big_desc[sizeof(D)] = 0x80;
         c->desc_ptr = reinterpret_cast<const D*>(c->big_desc.data());
       }},
      // ---- 0.2: strides (dense: q {160, 40, 8}, k {112, 56, 8},
      // v {84, 42, 6}, out {120, 30, 6}).
      {"q_strides_batch_neg", kInvalid, true,
       [](Call* c) { c->desc.q_strides = {-160, 40, 8}; }, "q_strides.batch"},
      {"q_strides_head_neg1", kInvalid, true,
       [](Call* c) { c->desc.q_strides = {160, -1, 8}; }, "q_strides.head"},
      {"k_strides_token_neg", kInvalid, true,
       [](Call* c) { c->desc.k_strides = {112, 56, -8}; }, "k_strides.token"},
      {"v_strides_batch_min", kInvalid, true,
       [](Call* c) { c->desc.v_strides = {kMin64, 42, 6}; }, "v_strides.batch"},
      {"out_strides_token_neg", kInvalid, true,
       [](Call* c) { c->desc.out_strides = {120, 30, -6}; },
       "out_strides.token"},
      {"k_strides_token_below_head_dim", kInvalid, true,
       [](Call* c) { c->desc.k_strides = {112, 56, 7}; }, "k_strides.token"},
      {"k_strides_head_below_head_dim", kInvalid, true,
       [](Call* c) { c->desc.k_strides = {112, 3, 8}; }, "k_strides.head"},
      {"q_strides_token_1", kInvalid, true,
       [](Call* c) { c->desc.q_strides = {160, 40, 1}; }, "q_strides.token"},
      {"q_strides_batch_below_head_dim", kInvalid, true,
       [](Call* c) { c->desc.q_strides = {5, 40, 8}; }, "q_strides.batch"},
      // v is bounded by value_dim (6), not head_dim (8).
      {"v_strides_token_below_value_dim", kInvalid, true,
       [](Call* c) { c->desc.v_strides = {84, 42, 5}; }, "v_strides.token"},
      {"out_strides_token_0", kInvalid, true,
       [](Call* c) { c->desc.out_strides = {120, 30, 0}; },
       "out_strides.token"},
      {"out_strides_rows_overlap", kInvalid, true,
       [](Call* c) { c->desc.out_strides = {120, 30, 5}; },
       "out_strides.token"},
      {"out_strides_batch_0", kInvalid, true,
       [](Call* c) { c->desc.out_strides = {0, 30, 6}; }, "out_strides.batch"},
      // Token rows take 30 floats; heads 12 apart overlap them.
      {"out_strides_heads_overlap", kInvalid, true,
       [](Call* c) { c->desc.out_strides = {240, 12, 6}; }, "out_strides.head"},
      {"out_strides_extent_overflow", kInvalid, true,
       [](Call* c) { c->desc.out_strides = {kMax64 / 2, 30, 6}; },
       "out_strides"},
      {"k_strides_extent_overflow", kInvalid, true,
       [](Call* c) { c->desc.k_strides = {kMax64 / 2, 56, 8}; }, "k_strides"},
      {"k_strides_all_huge", kInvalid, true,
       [](Call* c) { c->desc.k_strides = {kMax64, kMax64, kMax64}; },
       "k_strides"},
      // Outputs compared as the ranges their strides span: out reaches into
      // weights (kPad = 512 floats after out's dense 240).
      {"out_strides_span_weights", kInvalid, false,
       [](Call* c) { c->desc.out_strides = {700, 30, 6}; }, "weights"},
      {"q_strides_span_out", kInvalid, false,
       [](Call* c) { c->desc.q_strides = {2300, 40, 8}; }},
      // ---- 0.2: variants
      {"softcap_neg", kInvalid, true, [](Call* c) { c->desc.softcap = -1.0f; },
       "softcap"},
      {"softcap_nan", kInvalid, true,
       [](Call* c) {
         c->desc.softcap = std::numeric_limits<float>::quiet_NaN();
       },
       "softcap"},
      {"softcap_inf", kInvalid, true,
       [](Call* c) {
         c->desc.softcap = std::numeric_limits<float>::infinity();
       },
       "softcap"},
      {"softcap_neg_inf", kInvalid, true,
       [](Call* c) {
         c->desc.softcap = -std::numeric_limits<float>::infinity();
       },
       "softcap"},
      {"alibi_slope_nan", kInvalid, true,
       [](Call* c) {
         c->slopes[3] = std::numeric_limits<float>::quiet_NaN();
         c->desc.alibi_slopes = c->slopes.data();
       },
       "alibi_slopes"},
      {"alibi_slope_inf", kInvalid, true,
       [](Call* c) {
         c->slopes[0] = std::numeric_limits<float>::infinity();
         c->desc.alibi_slopes = c->slopes.data();
       },
       "alibi_slopes"},
      {"alibi_slope_neg_inf", kInvalid, true,
       [](Call* c) {
         c->slopes[2] = -std::numeric_limits<float>::infinity();
         c->desc.alibi_slopes = c->slopes.data();
       },
       "alibi_slopes"},
      {"sink_nan", kInvalid, true,
       [](Call* c) {
         c->sinks[2] = std::numeric_limits<float>::quiet_NaN();
         c->desc.sinks = c->sinks.data();
       },
       "sinks"},
      {"sink_pos_inf", kInvalid, true,
       [](Call* c) {
         c->sinks[0] = std::numeric_limits<float>::infinity();
         c->desc.sinks = c->sinks.data();
       },
       "sinks"},
      {"sink_last_head_pos_inf", kInvalid, true,
       [](Call* c) {
         c->sinks[kQHeads - 1] = std::numeric_limits<float>::infinity();
         c->desc.sinks = c->sinks.data();
       },
       "sinks"},
      {"kv_start_neg1", kInvalid, true,
       [](Call* c) {
         c->desc.mask = QKV_MASK_KV_START;
         c->starts[1] = -1;
         c->desc.kv_start = c->starts.data();
       },
       "kv_start"},
      {"kv_start_kv_len_plus1", kInvalid, true,
       [](Call* c) {
         c->desc.mask = QKV_MASK_KV_START | QKV_MASK_CAUSAL;
         c->starts[0] = kKvLen + 1;
         c->desc.kv_start = c->starts.data();
       },
       "kv_start"},
      {"kv_start_int32_min", kInvalid, true,
       [](Call* c) {
         c->desc.mask = QKV_MASK_KV_START | QKV_MASK_WINDOW;
         c->starts[1] = std::numeric_limits<int32_t>::min();
         c->desc.kv_start = c->starts.data();
       },
       "kv_start"},
      {"kv_start_mask_without_kv_start", kInvalid, true,
       [](Call* c) { c->desc.mask = QKV_MASK_KV_START; }, "kv_start"},
      {"kv_dtype_4", kInvalid, true, [](Call* c) { SetRawDtype(&c->desc, 4); },
       "kv_dtype"},
      {"kv_dtype_neg1", kInvalid, true,
       [](Call* c) { SetRawDtype(&c->desc, -1); }, "kv_dtype"},
      {"kv_dtype_int_max", kInvalid, true,
       [](Call* c) {
         SetRawDtype(&c->desc, std::numeric_limits<int32_t>::max());
       },
       "kv_dtype"},
      // qkv_attention_f32 reads f32 only: INVALID there, whatever else;
      // qkv_attention checks what the type needs.
      {"kv_dtype_i8_without_scales", kInvalid, false,
       [](Call* c) { c->desc.kv_dtype = QKV_DTYPE_I8; }, "k_scales"},
      {"kv_dtype_i8_without_v_scales", kInvalid, false,
       [](Call* c) {
         c->UseI8();
         c->desc.v_scales = nullptr;
       },
       "v_scales"},
      {"k_scale_strides_negative", kInvalid, true,
       [](Call* c) {
         c->UseI8();
         c->desc.k_scale_strides = {14, 7, -1};
       },
       "k_scale_strides.token"},
      {"v_scale_strides_extent_overflow", kInvalid, true,
       [](Call* c) {
         c->UseI8();
         c->desc.v_scale_strides = {kMax64 / 2, 7, 1};
       },
       "v_scale_strides"},
      // Outputs may not overlap the scales (inputs).
      {"k_scales_overlap_out", kInvalid, false,
       [](Call* c) {
         c->UseI8();
         c->desc.k_scales = c->out + 3;
       },
       "k_scales"},
      {"v_scales_overlap_lse", kInvalid, false,
       [](Call* c) {
         c->UseI8();
         c->desc.v_scales = c->lse;
       },
       "v_scales"},
      // A bad stride with a low-precision type (strides in its elements).
      {"kv_dtype_f16_with_bad_stride", kInvalid, true,
       [](Call* c) {
         c->desc.kv_dtype = QKV_DTYPE_F16;
         c->desc.k_strides = {112, 56, 7};
       },
       "k_strides.token"},
  };
}

#undef QKV_SIZE_CASES
#undef QKV_NEGATIVE_SIZE_CASES

class BadInputTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadInputTest, ReturnsPinnedStatusAndWritesNothing) {
  const BadCase& bc = GetParam();
  Call c;
  MisalignedWorkspace ws(kBigWorkspace);
  // The unmodified call is fine, so the status below is the mutation's doing.
  ASSERT_LE(qkv_attention_workspace_size(&c.desc), kBigWorkspace);
  ASSERT_EQ(c.Invoke(ws.data(), ws.size()), QKV_OK);
  c.ResetOutputs();

  bc.mutate(&c);
  const std::vector<float> before = c.arena;
  auto untouched = [&] {
    return std::memcmp(before.data(), c.arena.data(),
                       before.size() * sizeof(float)) == 0;
  };
  EXPECT_EQ(c.Invoke(ws.data(), ws.size()), bc.expected)
      << "with a " << ws.size() << "-byte workspace";
  EXPECT_TRUE(untouched()) << "a rejected call wrote to memory";
  // Validation comes before the workspace check.
  EXPECT_EQ(c.Invoke(nullptr, 0), bc.expected) << "with no workspace";
  EXPECT_TRUE(untouched()) << "a rejected call wrote to memory";
  if (bc.desc_only) {
    EXPECT_EQ(qkv_attention_workspace_size(c.desc_ptr), 0u)
        << "the workspace query must answer 0 for an invalid descriptor";
  }
  // The general entry, and the explanation of the same arguments.
  const qkv_status general =
      bc.general < 0 ? bc.expected : static_cast<qkv_status>(bc.general);
  EXPECT_EQ(c.InvokeGeneral(ws.data(), ws.size()), general)
      << "qkv_attention with a " << ws.size() << "-byte workspace";
  EXPECT_TRUE(untouched()) << "a rejected qkv_attention call wrote to memory";
  char message[512];
  std::memset(message, 0x5A, sizeof message);
  EXPECT_EQ(c.Explain(ws.data(), ws.size(), message, sizeof message), general);
  EXPECT_TRUE(untouched()) << "qkv_attention_explain wrote to memory";
  ASSERT_NE(std::memchr(message, '\0', sizeof message), nullptr)
      << "the message is not NUL-terminated";
  const std::string text(message);
  EXPECT_FALSE(text.empty());
  EXPECT_NE(text, "ok");
  if (bc.field != nullptr) {
    EXPECT_NE(text.find(bc.field), std::string::npos)
        << "the explanation \"" << text << "\" does not name " << bc.field;
  }
  EXPECT_TRUE(ws.GuardsIntact());
}

INSTANTIATE_TEST_SUITE_P(AllCases, BadInputTest,
                         ::testing::ValuesIn(BadCases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(BadInputListTest, NamesAreUnique) {
  std::set<std::string> names;
  for (const BadCase& c : BadCases()) {
    EXPECT_TRUE(names.insert(c.name).second) << c.name;
  }
}

// Neighbours are not overlaps: out ending exactly where q begins, or
// starting right after lse ends, is fine.
TEST(ValidationTest, AdjacentBuffersAreAccepted) {
  MisalignedWorkspace ws(kBigWorkspace);
  for (int where = 0; where < 4; ++where) {
    SCOPED_TRACE("placement " + std::to_string(where));
    Call c;
    if (where == 0) c.out = c.Q() - kNumOut;
    if (where == 1) c.out = c.Q() + kNumQ;
    if (where == 2) c.out = c.weights - kNumOut;
    if (where == 3) c.out = c.lse + kNumLse;
    EXPECT_EQ(c.Invoke(ws.data(), ws.size()), QKV_OK);
  }
}

// Fields of features that are off are not looked at.
TEST(ValidationTest, FieldsOfInactiveFeaturesAreIgnored) {
  MisalignedWorkspace ws(kBigWorkspace);
  Call c;
  c.lens.assign(c.lens.size(), -5);
  c.desc.valid_lens = c.lens.data();  // VALID_LENS off
  c.desc.valid_lens_per_query = 1;
  c.desc.additive_hidden = -3;  // score is DOT
  EXPECT_EQ(c.Invoke(ws.data(), ws.size()), QKV_OK);
  // weights and lse are optional.
  c.weights = nullptr;
  c.lse = nullptr;
  EXPECT_EQ(c.Invoke(ws.data(), ws.size()), QKV_OK);
}

// batch, q_len and kv_len may be 0 (0.2). batch or q_len 0: nothing to do,
// nothing read or written. kv_len 0: every row gets out 0 and lse -inf.
TEST(ValidationTest, EmptyShapesAreValid) {
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which == 0 ? "batch 0" : "q_len 0");
    Call c;
    (which == 0 ? c.desc.batch : c.desc.q_len) = 0;
    c.desc.mask = QKV_MASK_CAUSAL | QKV_MASK_WINDOW;
    c.desc.sinks = c.sinks.data();
    EXPECT_EQ(qkv_attention_workspace_size(&c.desc), 0u);
    const std::vector<float> before = c.arena;
    EXPECT_EQ(c.Invoke(nullptr, 0), QKV_OK);
    EXPECT_EQ(c.InvokeGeneral(nullptr, 0), QKV_OK);
    char message[64];
    EXPECT_EQ(c.Explain(nullptr, 0, message, sizeof message), QKV_OK);
    EXPECT_STREQ(message, "ok");
    EXPECT_TRUE(std::memcmp(before.data(), c.arena.data(),
                            before.size() * sizeof(float)) == 0)
        << "an empty call wrote to memory";
  }
  Call c;
  c.desc.kv_len = 0;
  EXPECT_EQ(qkv_attention_workspace_size(&c.desc), 0u);
  const std::vector<float> before = c.arena;
  ASSERT_EQ(c.Invoke(nullptr, 0), QKV_OK);
  for (size_t i = 0; i < kNumOut; ++i) ASSERT_EQ(c.out[i], 0.0f) << i;
  for (size_t i = 0; i < kNumLse; ++i) {
    ASSERT_EQ(c.lse[i], -std::numeric_limits<float>::infinity()) << i;
  }
  // Nothing else: the weights (no element per row) and the pads.
  for (size_t i = 0; i < c.arena.size(); ++i) {
    const float* at = c.arena.data() + i;
    if ((at >= c.out && at < c.out + kNumOut) ||
        (at >= c.lse && at < c.lse + kNumLse)) {
      continue;
    }
    ASSERT_EQ(std::memcmp(at, &before[i], sizeof(float)), 0)
        << "kv_len 0 wrote outside out and lse, at arena element " << i;
  }
  // Still invalid with kv_len 0: no out.
  c.out = nullptr;
  EXPECT_EQ(c.Invoke(nullptr, 0), QKV_ERR_INVALID_ARGUMENT);
}

// An empty call whose other sizes are huge: the element counts are 0, so
// the call is valid, and nothing (strides, extents) may overflow on the way
// (found by the fuzzer: the dense strides of q were multiplied out in int64,
// undefined behaviour that UBSan reports).
TEST(ValidationTest, EmptyCallsWithHugeOtherSizes) {
  struct Shape {
    int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim, value_dim;
  };
  const Shape shapes[] = {
      {0, 360287970240036863, 1, 2, 1, 39, 1},
      {0, int64_t{1} << 40, int64_t{1} << 40, int64_t{1} << 30, 3,
       int64_t{1} << 20, 1},
      {3, int64_t{1} << 61, 1, 0, 5, 4, 4},
  };
  for (const Shape& s : shapes) {
    qkv_attention_desc d;
    qkv_attention_desc_init(&d, s.batch, s.q_heads, s.kv_heads, s.q_len,
                            s.kv_len, s.head_dim, s.value_dim);
    SCOPED_TRACE("batch " + std::to_string(s.batch) + " q_heads " +
                 std::to_string(s.q_heads) + " q_len " +
                 std::to_string(s.q_len));
    EXPECT_EQ(qkv_attention_workspace_size(&d), 0u);
    EXPECT_EQ(qkv_attention_f32(&d, nullptr, nullptr, nullptr, nullptr,
                                nullptr, nullptr, nullptr, 0),
              QKV_OK);
    char message[128];
    EXPECT_EQ(qkv_attention_explain(&d, nullptr, nullptr, nullptr, nullptr,
                                    nullptr, nullptr, nullptr, 0, message,
                                    sizeof message),
              QKV_OK);
  }
  // With a bias: its [q_len][kv_len] block (2^62 * 65537 elements) is not
  // addressable, which is refused without overflowing on the way (found by
  // the fuzzer: q_len * kv_len was taken to fit because the weights' count
  // does, which is 0 here).
  qkv_attention_desc d;
  qkv_attention_desc_init(&d, 0, 2, 1, int64_t{1} << 62, 65537, 2, 2);
  const float bias[1] = {0.0f};
  d.mask = QKV_MASK_BIAS;
  d.bias = bias;
  EXPECT_EQ(qkv_attention_workspace_size(&d), 0u);
  EXPECT_EQ(qkv_attention_f32(&d, nullptr, nullptr, nullptr, nullptr, nullptr,
                              nullptr, nullptr, 0),
            QKV_ERR_INVALID_ARGUMENT);
}

// The limits of the stride rules, on the accepted side: a stride equal to
// head_dim (value_dim for v), batch stride 0 on inputs, out's rows
// interleaved by head (token-major), out ending exactly where weights
// begins; one element further overlaps.
TEST(ValidationTest, StridesAtTheirLimitsAreAccepted) {
  MisalignedWorkspace ws(kBigWorkspace);
  struct Accepted {
    const char* name;
    qkv_strides q, k, v, out;
  };
  const qkv_strides dense = {0, 0, 0};
  const Accepted cases[] = {
      {"explicit_dense", {160, 40, 8}, {112, 56, 8}, {84, 42, 6}, {120, 30, 6}},
      {"v_token_stride_is_value_dim", dense, dense, {84, 6, 12}, dense},
      {"broadcast_inputs", {0, 40, 8}, {0, 56, 8}, {0, 42, 6}, dense},
      {"k_head_stride_0", dense, {112, 0, 8}, {84, 0, 6}, dense},
      {"out_token_major", dense, dense, dense, {120, 6, 24}},
      {"out_up_to_weights", dense, dense, dense, {632, 30, 6}},
      {"out_reversed_order", dense, dense, dense, {6, 60, 12}},
  };
  for (const Accepted& a : cases) {
    SCOPED_TRACE(a.name);
    Call c;
    c.desc.q_strides = a.q;
    c.desc.k_strides = a.k;
    c.desc.v_strides = a.v;
    c.desc.out_strides = a.out;
    EXPECT_EQ(c.Invoke(ws.data(), ws.size()), QKV_OK);
    char message[128];
    EXPECT_EQ(c.Explain(ws.data(), ws.size(), message, sizeof message), QKV_OK);
    EXPECT_STREQ(message, "ok");
  }
  // weights begins kNumOut + kPad = 752 floats after out: with a batch
  // stride of 633 out's last element is weights[0].
  Call c;
  c.desc.out_strides = {633, 30, 6};
  EXPECT_EQ(c.Invoke(ws.data(), ws.size()), QKV_ERR_INVALID_ARGUMENT);
}

// Fields of 0.2 features that are off are not looked at: kv_start without
// its mask, the window sides without QKV_MASK_WINDOW, the scales of a
// quantized cache for f32.
TEST(ValidationTest, InactiveVariantFieldsAreIgnored) {
  MisalignedWorkspace ws(kBigWorkspace);
  Call c;
  c.starts = {-5, 100};
  c.desc.kv_start = c.starts.data();  // QKV_MASK_KV_START off
  c.desc.window_left = std::numeric_limits<int64_t>::min();
  c.desc.window_right = -7;
  float bogus[1] = {std::numeric_limits<float>::quiet_NaN()};
  c.desc.k_scales = bogus;
  c.desc.v_scales = bogus;
  c.desc.k_scale_strides = {-1, -1, -1};
  c.desc.v_scale_strides = {kMin64, 0, 3};
  EXPECT_EQ(c.Invoke(ws.data(), ws.size()), QKV_OK);
  EXPECT_EQ(c.InvokeGeneral(ws.data(), ws.size()), QKV_OK);
  // Allowed values: a -inf sink, slopes of 0, softcap 0 (off), any q_pos.
  c.sinks.assign(kQHeads, -std::numeric_limits<float>::infinity());
  c.slopes.assign(kQHeads, 0.0f);
  c.desc.sinks = c.sinks.data();
  c.desc.alibi_slopes = c.slopes.data();
  c.desc.softcap = 0.0f;
  c.starts = {std::numeric_limits<int32_t>::min(),
              std::numeric_limits<int32_t>::max()};
  c.desc.q_pos = c.starts.data();
  c.desc.mask = QKV_MASK_WINDOW;  // huge sides: unbounded
  c.desc.window_left = std::numeric_limits<int64_t>::max();
  c.desc.window_right = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(c.Invoke(ws.data(), ws.size()), QKV_OK);
}

// qkv_attention_explain: the message buffer is used exactly as documented.
TEST(ExplainTest, MessageBufferEdges) {
  MisalignedWorkspace ws(kBigWorkspace);
  Call good;
  char buf[64];
  std::memset(buf, 0x5A, sizeof buf);
  EXPECT_EQ(good.Explain(ws.data(), ws.size(), buf, sizeof buf), QKV_OK);
  EXPECT_STREQ(buf, "ok");
  // NULL message, or size 0: nothing written, the same status.
  EXPECT_EQ(good.Explain(ws.data(), ws.size(), nullptr, 0), QKV_OK);
  EXPECT_EQ(good.Explain(ws.data(), ws.size(), nullptr, 64), QKV_OK);
  std::memset(buf, 0x5A, sizeof buf);
  EXPECT_EQ(good.Explain(ws.data(), ws.size(), buf, 0), QKV_OK);
  EXPECT_EQ(buf[0], 0x5A);
  // Size 1: just the NUL. Size 2: "o".
  EXPECT_EQ(good.Explain(ws.data(), ws.size(), buf, 1), QKV_OK);
  EXPECT_EQ(buf[0], '\0');
  EXPECT_EQ(buf[1], 0x5A);
  EXPECT_EQ(good.Explain(ws.data(), ws.size(), buf, 2), QKV_OK);
  EXPECT_STREQ(buf, "o");
  EXPECT_EQ(buf[2], 0x5A);

  Call bad;
  bad.desc.softcap = -2.0f;
  std::memset(buf, 0x5A, sizeof buf);
  EXPECT_EQ(bad.Explain(ws.data(), ws.size(), nullptr, 0),
            QKV_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(bad.Explain(ws.data(), ws.size(), nullptr, 100),
            QKV_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(bad.Explain(ws.data(), ws.size(), buf, 0),
            QKV_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(buf[0], 0x5A);
  EXPECT_EQ(bad.Explain(ws.data(), ws.size(), buf, 1),
            QKV_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(buf[0], '\0');
  EXPECT_EQ(buf[1], 0x5A);
  // Cut short to fit: 9 characters and the NUL, nothing after.
  EXPECT_EQ(bad.Explain(ws.data(), ws.size(), buf, 10),
            QKV_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::strlen(buf), 9u);
  EXPECT_EQ(buf[10], 0x5A);
  char full[256];
  EXPECT_EQ(bad.Explain(ws.data(), ws.size(), full, sizeof full),
            QKV_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(full).substr(0, 9), std::string(buf));
  EXPECT_NE(std::string(full).find("softcap"), std::string::npos) << full;
  EXPECT_NE(std::string(full).find("-2"), std::string::npos)
      << "the sentence names the value: " << full;

  // NULL descriptor.
  EXPECT_EQ(qkv_attention_explain(nullptr, nullptr, nullptr, nullptr, nullptr,
                                  nullptr, nullptr, nullptr, 0, full,
                                  sizeof full),
            QKV_ERR_INVALID_ARGUMENT);
  EXPECT_GT(std::strlen(full), 0u);
}

// The header's example sentence names the field, its value and the bound.
TEST(ExplainTest, StrideSentenceNamesFieldValueAndBound) {
  MisalignedWorkspace ws(kBigWorkspace);
  Call c;
  c.desc.k_strides = {112, 56, 7};
  char buf[256];
  ASSERT_EQ(c.Explain(ws.data(), ws.size(), buf, sizeof buf),
            QKV_ERR_INVALID_ARGUMENT);
  const std::string text(buf);
  EXPECT_NE(text.find("k_strides.token"), std::string::npos) << text;
  EXPECT_NE(text.find('7'), std::string::npos) << text;
  EXPECT_NE(text.find("head_dim"), std::string::npos) << text;
  EXPECT_NE(text.find('8'), std::string::npos) << text;
}

// Explain answers for qkv_attention: a workspace one byte short is
// WORKSPACE_TOO_SMALL, and an unserved element type UNSUPPORTED; it writes
// no output and leaves the workspace alone.
TEST(ExplainTest, SameStatusAsTheCall) {
  Problem p = MakeProblem(2, 8, 2, 65, 300, 64, 64, 17u);
  p.desc.mask = QKV_MASK_CAUSAL | QKV_MASK_WINDOW;
  p.desc.window_left = 100;
  const qkv_attention_desc good = p.Bound();
  const size_t need = qkv_attention_workspace_size(&good);
  GuardedBuffer out(NumOut(good)), weights(NumWeights(good)), lse(NumLse(good));
  char buf[256];
  if (need > 0) {
    MisalignedWorkspace short_ws(need - 1);
    EXPECT_EQ(qkv_attention_explain(&good, p.q.data(), p.k.data(), p.v.data(),
                                    out.data(), weights.data(), lse.data(),
                                    short_ws.data(), short_ws.size(), buf,
                                    sizeof buf),
              QKV_ERR_WORKSPACE_TOO_SMALL);
    EXPECT_NE(std::string(buf).find("workspace"), std::string::npos) << buf;
    EXPECT_TRUE(short_ws.GuardsIntact());
  }
  MisalignedWorkspace ws(need);
  std::vector<unsigned char> ws_before(
      static_cast<unsigned char*>(ws.data()),
      static_cast<unsigned char*>(ws.data()) + need);
  EXPECT_EQ(qkv_attention_explain(&good, p.q.data(), p.k.data(), p.v.data(),
                                  out.data(), weights.data(), lse.data(),
                                  ws.data(), ws.size(), buf, sizeof buf),
            QKV_OK);
  EXPECT_STREQ(buf, "ok");
  EXPECT_TRUE(std::equal(ws_before.begin(), ws_before.end(),
                         static_cast<unsigned char*>(ws.data())))
      << "explain wrote to the workspace";
  EXPECT_TRUE(out.BodyUntouched() && weights.BodyUntouched() &&
              lse.BodyUntouched())
      << "explain wrote an output";
  // A valid F16 call: qkv_attention serves it, qkv_attention_f32 (f32
  // only) refuses it, naming kv_dtype.
  // (Its workspace holds a block of dequantized keys and values too.)
  qkv_attention_desc half = good;
  half.kv_dtype = QKV_DTYPE_F16;
  MisalignedWorkspace half_ws(qkv_attention_workspace_size(&half));
  EXPECT_EQ(qkv_attention_explain(&half, p.q.data(), p.k.data(), p.v.data(),
                                  out.data(), weights.data(), lse.data(),
                                  half_ws.data(), half_ws.size(), buf,
                                  sizeof buf),
            QKV_OK);
  EXPECT_EQ(qkv_attention_f32(&half, p.q.data(), p.k.data(), p.v.data(),
                              out.data(), weights.data(), lse.data(),
                              half_ws.data(), half_ws.size()),
            QKV_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(out.BodyUntouched() && weights.BodyUntouched() &&
              lse.BodyUntouched());
}

// Shapes with a real workspace need: an invalid descriptor with no
// workspace is INVALID_ARGUMENT (validation first); the valid one with a
// workspace one byte short is WORKSPACE_TOO_SMALL and writes nothing.
TEST(ValidationTest, WorkspaceCheckComesAfterValidation) {
  Problem p = MakeProblem(2, 8, 2, 65, 300, 64, 64, 17u);
  p.desc.mask = QKV_MASK_CAUSAL;
  const qkv_attention_desc good = p.Bound();
  const size_t need = qkv_attention_workspace_size(&good);
  if (need == 0) GTEST_SKIP() << "the default backend needs no workspace";
  GuardedBuffer out(NumOut(good)), weights(NumWeights(good)), lse(NumLse(good));

  qkv_attention_desc bad = good;
  bad.scale = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(
      qkv_attention_f32(&bad, p.q.data(), p.k.data(), p.v.data(), out.data(),
                        weights.data(), lse.data(), nullptr, 0),
      QKV_ERR_INVALID_ARGUMENT);
  bad = good;
  bad.kv_heads = 3;
  MisalignedWorkspace tiny(need - 1);
  EXPECT_EQ(
      qkv_attention_f32(&bad, p.q.data(), p.k.data(), p.v.data(), out.data(),
                        weights.data(), lse.data(), tiny.data(), tiny.size()),
      QKV_ERR_INVALID_ARGUMENT);

  MisalignedWorkspace short_ws(need - 1);
  EXPECT_EQ(qkv_attention_f32(&good, p.q.data(), p.k.data(), p.v.data(),
                              out.data(), weights.data(), lse.data(),
                              short_ws.data(), short_ws.size()),
            QKV_ERR_WORKSPACE_TOO_SMALL);
  EXPECT_EQ(
      qkv_attention_f32(&good, p.q.data(), p.k.data(), p.v.data(), out.data(),
                        weights.data(), lse.data(), nullptr, 0),
      QKV_ERR_WORKSPACE_TOO_SMALL);
  EXPECT_TRUE(out.BodyUntouched());
  EXPECT_TRUE(weights.BodyUntouched());
  EXPECT_TRUE(lse.BodyUntouched());
  EXPECT_TRUE(short_ws.GuardsIntact());

  MisalignedWorkspace exact(need);
  EXPECT_EQ(
      qkv_attention_f32(&good, p.q.data(), p.k.data(), p.v.data(), out.data(),
                        weights.data(), lse.data(), exact.data(), exact.size()),
      QKV_OK);
  EXPECT_TRUE(exact.GuardsIntact());
  EXPECT_TRUE(out.GuardsIntact() && weights.GuardsIntact() &&
              lse.GuardsIntact());
}

TEST(ValidationTest, StatusStrings) {
  std::set<std::string> texts;
  for (int s = 0; s <= 3; ++s) {
    const char* t = qkv_status_string(static_cast<qkv_status>(s));
    ASSERT_NE(t, nullptr) << s;
    EXPECT_GT(std::strlen(t), 0u) << s;
    EXPECT_TRUE(texts.insert(t).second)
        << "status " << s << ": \"" << t << "\" is not distinct";
  }
  for (int s : {4, -1, 1000, std::numeric_limits<int>::min(),
                std::numeric_limits<int>::max()}) {
    EXPECT_NE(qkv_test_status_string_of_int(s), nullptr) << s;
  }
}

TEST(ValidationTest, NullDescriptorQueriesAreHarmless) {
  EXPECT_EQ(qkv_attention_workspace_size(nullptr), 0u);
  qkv_attention_desc_init(nullptr, 1, 1, 1, 1, 1, 1, 1);  // must not crash
}

// ---------------------------------------------------------------------------
// struct_size prefixes (older callers) and extensions (newer callers).

class StructSizeTest : public ::testing::Test {
 protected:
  StructSizeTest() : p_(MakeProblem(2, 4, 2, 9, 33, 16, 12, 23u)) {
    p_.desc.scale = 0.3f;
  }
  Outputs RunFull() {
    const qkv_attention_desc d = p_.Bound();
    return RunAttention(d, p_.q.data(), p_.k.data(), p_.v.data());
  }
  Outputs Run(const qkv_attention_desc& d) {
    return RunAttention(d, p_.q.data(), p_.k.data(), p_.v.data());
  }
  static void ExpectSame(const Outputs& a, const Outputs& b) {
    ASSERT_EQ(a.status, QKV_OK);
    ASSERT_EQ(b.status, QKV_OK);
    EXPECT_TRUE(BitwiseEqual(a.out, b.out));
    EXPECT_TRUE(BitwiseEqual(a.weights, b.weights));
    EXPECT_TRUE(BitwiseEqual(a.lse, b.lse));
  }
  Problem p_;
};

// A caller compiled before `backend` existed: the field is not read (here it
// holds a name that would be refused), the default backend is used.
TEST_F(StructSizeTest, PrefixWithoutBackendUsesDefault) {
  const Outputs full = RunFull();
  qkv_attention_desc d = p_.Bound();
  d.struct_size = offsetof(qkv_attention_desc, backend);
  d.backend = "nope";
  ExpectSame(full, Run(d));
}

// A prefix ending before `mask`: score and scale are read, everything later
// takes its default (no mask, serial, default backend), whatever it holds.
TEST_F(StructSizeTest, PrefixEndingBeforeMaskDefaultsTheRest) {
  const Outputs full = RunFull();
  qkv_attention_desc d = p_.Bound();
  d.struct_size = offsetof(qkv_attention_desc, mask);
  d.mask = 0x80000008u | QKV_MASK_CAUSAL | QKV_MASK_VALID_LENS;
  d.valid_lens = nullptr;
  d.valid_lens_per_query = 7;
  d.bias_batch_stride = d.bias_head_stride = -1;
  d.additive_hidden = -1;
  d.parallel_for = &FailIfCalled;
  d.num_workers = 0;
  d.backend = "nope";
  ExpectSame(full, Run(d));
}

// A prefix ending before `parallel_for`: the masks are read, the threading
// fields are not.
TEST_F(StructSizeTest, PrefixEndingBeforeParallelForRunsSerially) {
  p_.desc.mask = QKV_MASK_CAUSAL | QKV_MASK_VALID_LENS;
  p_.valid_lens = {20, 33};
  const Outputs full = RunFull();
  qkv_attention_desc d = p_.Bound();
  d.struct_size = offsetof(qkv_attention_desc, parallel_for);
  d.parallel_for = &FailIfCalled;
  d.num_workers = 0;
  d.backend = "nope";
  ExpectSame(full, Run(d));
}

// A newer caller with a larger struct whose extra bytes are all zero.
TEST_F(StructSizeTest, LargerStructWithZeroTailWorks) {
  const Outputs full = RunFull();
  for (size_t extra : {size_t{1}, size_t{8}, size_t{64}}) {
    SCOPED_TRACE("extra bytes " + std::to_string(extra));
    std::vector<unsigned char> buf(sizeof(qkv_attention_desc) + extra, 0);
    qkv_attention_desc d = p_.Bound();
    d.struct_size = buf.size();
    std::memcpy(buf.data(), &d, sizeof d);
    const auto* big = reinterpret_cast<const qkv_attention_desc*>(buf.data());
    ExpectSame(full, Run(*big));
  }
}

// A 0.1 caller (struct_size up to `backend`): the 0.2 fields are not read,
// whatever they hold (here values that would be refused).
TEST_F(StructSizeTest, PrefixWithout02FieldsIgnoresThem) {
  p_.desc.mask = QKV_MASK_CAUSAL;
  const Outputs full = RunFull();
  const float nans[4] = {NAN, NAN, NAN, NAN};
  const int32_t starts[2] = {-1, -1};
  qkv_attention_desc d = p_.Bound();
  d.struct_size = offsetof(qkv_attention_desc, kv_dtype);
  SetRawDtype(&d, 77);
  d.q_strides = d.k_strides = d.v_strides = {-1, -1, -1};
  d.out_strides = {0, 0, 1};
  d.softcap = -1.0f;
  d.alibi_slopes = nans;
  d.sinks = nans;
  d.q_pos = starts;
  d.kv_start = starts;
  ExpectSame(full, Run(d));
}

// A prefix ending before `softcap`: strides and ALiBi are read; softcap,
// q_pos, sinks and kv_start take their defaults.
TEST_F(StructSizeTest, PrefixEndingBeforeSoftcapDefaultsTheRest) {
  p_.desc.mask = QKV_MASK_CAUSAL;
  const std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  p_.desc.alibi_slopes = slopes.data();
  const Outputs full = RunFull();
  const float nans[4] = {NAN, NAN, NAN, NAN};
  const int32_t pos[2] = {-100, 1000};
  qkv_attention_desc d = p_.Bound();
  d.struct_size = offsetof(qkv_attention_desc, softcap);
  d.softcap = NAN;
  d.sinks = nans;
  d.q_pos = pos;
  d.kv_start = nullptr;
  ExpectSame(full, Run(d));
  // And the full descriptor does read q_pos: the results change.
  qkv_attention_desc read = p_.Bound();
  read.q_pos = pos;
  const Outputs moved = Run(read);
  ASSERT_EQ(moved.status, QKV_OK);
  EXPECT_FALSE(BitwiseEqual(moved.out, full.out));
}

// ---------------------------------------------------------------------------
// The backward pass (qkv_attention_backward_f32): bad input returns its
// status and writes nothing to d_q, d_k, d_v (or anywhere else);
// validation comes before the workspace check; the workspace query answers
// 0 for a descriptor the backward pass cannot run.

// A backward call: the forward call's arguments (q, k, v, and out and lse
// as a valid forward call wrote them), then in a second arena
//   [pad | d_out | pad | d_q | pad | d_k | pad | d_v | pad]
// so that "nothing written" is a memcmp of the two arenas.
struct BackCall {
  Call fwd;
  std::vector<float> grads;
  const float* d_out;
  float *d_q, *d_k, *d_v;

  BackCall() : grads(kPad * 5 + kNumOut + kNumQ + kNumK + kNumV) {
    MisalignedWorkspace ws(kBigWorkspace);
    EXPECT_EQ(fwd.Invoke(ws.data(), ws.size()), QKV_OK);
    std::mt19937 rng(7);
    FillUniform(&grads, &rng, -1.0f, 1.0f);
    float* p = grads.data() + kPad;
    d_out = p;
    p += kNumOut + kPad;
    d_q = p;
    p += kNumQ + kPad;
    d_k = p;
    p += kNumK + kPad;
    d_v = p;
    ResetGrads();
  }
  BackCall(const BackCall&) = delete;
  BackCall& operator=(const BackCall&) = delete;

  float* DOut() { return const_cast<float*>(d_out); }
  float* Out() { return fwd.out; }
  void ResetGrads() {
    const float s = Bits(GuardedBuffer::kSentinelBits);
    std::fill(d_q, d_q + kNumQ, s);
    std::fill(d_k, d_k + kNumK, s);
    std::fill(d_v, d_v + kNumV, s);
  }
  qkv_status Invoke(void* ws, size_t ws_size) {
    return qkv_attention_backward_f32(fwd.desc_ptr, fwd.q, fwd.k, fwd.v,
                                      fwd.out, fwd.lse, d_out, d_q, d_k, d_v,
                                      ws, ws_size);
  }
  qkv_status Explain(void* ws, size_t ws_size, char* message, size_t size) {
    return qkv_attention_backward_explain(fwd.desc_ptr, fwd.q, fwd.k, fwd.v,
                                          fwd.out, fwd.lse, d_out, d_q, d_k,
                                          d_v, ws, ws_size, message, size);
  }
};

// Runs a refused backward call twice (a big workspace, then none) and
// checks its status, that neither arena changed, and the workspace query.
void ExpectBackwardRefused(BackCall* c, qkv_status expected, bool desc_only) {
  MisalignedWorkspace ws(kBigWorkspace);
  const std::vector<float> fwd_before = c->fwd.arena, grads_before = c->grads;
  auto untouched = [&] {
    return BitwiseEqual(fwd_before, c->fwd.arena) &&
           BitwiseEqual(grads_before, c->grads);
  };
  EXPECT_EQ(c->Invoke(ws.data(), ws.size()), expected)
      << "with a " << ws.size() << "-byte workspace";
  EXPECT_TRUE(untouched()) << "a rejected backward call wrote to memory";
  EXPECT_EQ(c->Invoke(nullptr, 0), expected) << "with no workspace";
  EXPECT_TRUE(untouched()) << "a rejected backward call wrote to memory";
  if (desc_only) {
    EXPECT_EQ(qkv_attention_backward_workspace_size(c->fwd.desc_ptr), 0u)
        << "the backward workspace query must answer 0 for this descriptor";
  }
  // The explanation: the same status, a sentence, nothing written.
  char message[512];
  std::memset(message, 0x5A, sizeof message);
  EXPECT_EQ(c->Explain(ws.data(), ws.size(), message, sizeof message),
            expected);
  EXPECT_TRUE(untouched()) << "qkv_attention_backward_explain wrote";
  ASSERT_NE(std::memchr(message, '\0', sizeof message), nullptr)
      << "the message is not NUL-terminated";
  EXPECT_FALSE(std::string(message).empty());
  EXPECT_NE(std::string(message), "ok");
  EXPECT_TRUE(ws.GuardsIntact());
}

// The forward's bad-input list, where it applies to the backward pass: the
// same status (the backward pass is refused for anything the forward call
// refuses). Left out: out placed over another buffer (out is an input of
// the backward pass, and inputs may overlap), the additive score and the
// K/V element types (which the backward pass refuses as unsupported
// first; see BackwardBadCases).
std::vector<BadCase> BackwardApplicableBadCases() {
  const char* const kSkipPrefixes[] = {"out_is_",
                                       "out_starts_",
                                       "out_ends_",
                                       "out_inside_",
                                       "out_contains_",
                                       "out_strides_span_weights",
                                       "q_strides_span_out",
                                       "additive_",
                                       "overflow_additive_hidden",
                                       "kv_dtype_i8",
                                       "kv_dtype_f16",
                                       "k_scale",
                                       "v_scale",
                                       "k_scales",
                                       "v_scales"};
  std::vector<BadCase> r;
  for (const BadCase& c : BadCases()) {
    bool skip = false;
    for (const char* prefix : kSkipPrefixes) {
      skip = skip || std::string(c.name).rfind(prefix, 0) == 0;
    }
    if (!skip) r.push_back(c);
  }
  return r;
}

class BackwardBadInputTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BackwardBadInputTest, SameStatusAsTheForwardAndWritesNothing) {
  const BadCase& bc = GetParam();
  BackCall c;
  MisalignedWorkspace ws(kBigWorkspace);
  // The unmodified call is fine, so the status below is the mutation's doing.
  ASSERT_LE(qkv_attention_backward_workspace_size(&c.fwd.desc), kBigWorkspace);
  ASSERT_EQ(c.Invoke(ws.data(), ws.size()), QKV_OK);
  c.ResetGrads();
  bc.mutate(&c.fwd);
  ExpectBackwardRefused(&c, bc.expected, bc.desc_only);
}

INSTANTIATE_TEST_SUITE_P(ForwardCases, BackwardBadInputTest,
                         ::testing::ValuesIn(BackwardApplicableBadCases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           return std::string(info.param.name);
                         });

struct BackBadCase {
  const char* name;
  qkv_status expected;
  // The descriptor alone is refused: the backward workspace query says 0.
  bool desc_only;
  void (*mutate)(BackCall*);
};

void PrintTo(const BackBadCase& c, std::ostream* os) { *os << c.name; }

// Dense strides: q {160, 40, 8}, k {112, 56, 8}, v {84, 42, 6},
// out {120, 30, 6}.
std::vector<BackBadCase> BackwardBadCases() {
  const qkv_status kInvalid = QKV_ERR_INVALID_ARGUMENT;
  const qkv_status kUnsupported = QKV_ERR_UNSUPPORTED;
  return {
      // The forward's results and d_out are required.
      {"null_out", kInvalid, false, [](BackCall* c) { c->fwd.out = nullptr; }},
      {"null_lse", kInvalid, false, [](BackCall* c) { c->fwd.lse = nullptr; }},
      {"null_d_out", kInvalid, false, [](BackCall* c) { c->d_out = nullptr; }},
      {"null_out_lse_d_out_no_grads", kInvalid, false,
       [](BackCall* c) {
         c->fwd.out = nullptr;
         c->fwd.lse = nullptr;
         c->d_out = nullptr;
         c->d_q = c->d_k = c->d_v = nullptr;
       }},
      {"null_q", kInvalid, false, [](BackCall* c) { c->fwd.q = nullptr; }},
      {"null_k", kInvalid, false, [](BackCall* c) { c->fwd.k = nullptr; }},
      {"null_v_no_d_v", kInvalid, false,
       [](BackCall* c) {
         c->fwd.v = nullptr;
         c->d_v = nullptr;
       }},
      // Score kinds and element types the backward pass does not serve.
      {"score_additive", kUnsupported, true,
       [](BackCall* c) {
         c->fwd.desc.score = QKV_SCORE_ADDITIVE;
         c->fwd.desc.additive_hidden = 16;
         c->fwd.desc.additive_w_q = c->fwd.w_q.data();
         c->fwd.desc.additive_w_k = c->fwd.w_k.data();
         c->fwd.desc.additive_w_v = c->fwd.w_v.data();
       }},
      {"kv_dtype_f16", kUnsupported, true,
       [](BackCall* c) { c->fwd.desc.kv_dtype = QKV_DTYPE_F16; }},
      {"kv_dtype_bf16", kUnsupported, true,
       [](BackCall* c) { c->fwd.desc.kv_dtype = QKV_DTYPE_BF16; }},
      {"kv_dtype_i8_with_scales", kUnsupported, true,
       [](BackCall* c) { c->fwd.UseI8(); }},
      // Gradients over inputs: equal, partial overlaps, one inside another.
      {"d_q_is_q", kInvalid, false, [](BackCall* c) { c->d_q = c->fwd.Q(); }},
      {"d_q_starts_in_q_tail", kInvalid, false,
       [](BackCall* c) { c->d_q = c->fwd.Q() + kNumQ - 1; }},
      {"d_k_ends_in_k_head", kInvalid, false,
       [](BackCall* c) { c->d_k = c->fwd.K() - kNumK + 1; }},
      {"d_v_inside_v", kInvalid, false,
       [](BackCall* c) { c->d_v = c->fwd.V() + 1; }},
      {"d_k_contains_v", kInvalid, false,
       [](BackCall* c) { c->d_k = c->fwd.V() - 10; }},
      {"d_q_over_out", kInvalid, false,
       [](BackCall* c) { c->d_q = c->Out() + 10; }},
      {"d_v_over_lse", kInvalid, false,
       [](BackCall* c) { c->d_v = c->fwd.lse - 5; }},
      {"d_q_over_d_out", kInvalid, false,
       [](BackCall* c) { c->d_q = c->DOut() + kNumOut - 1; }},
      {"d_k_ends_in_lse_head", kInvalid, false,
       [](BackCall* c) { c->d_k = c->fwd.lse - kNumK + 1; }},
      // Gradients over each other.
      {"d_k_is_d_v", kInvalid, false, [](BackCall* c) { c->d_k = c->d_v; }},
      {"d_k_overlaps_d_v", kInvalid, false,
       [](BackCall* c) { c->d_k = c->d_v - kNumK + 1; }},
      {"d_q_overlaps_d_k", kInvalid, false,
       [](BackCall* c) { c->d_q = c->d_k + kNumK - 1; }},
      {"d_v_inside_d_q", kInvalid, false,
       [](BackCall* c) { c->d_v = c->d_q + 3; }},
      // Layouts that make two gradient elements share memory: an operand
      // broadcast over the batch (batch 2) or the heads, rows aliasing.
      {"d_k_with_k_batch_broadcast", kInvalid, false,
       [](BackCall* c) {
         c->fwd.desc.k_strides = {0, 56, 8};
       }},
      {"d_v_with_v_batch_broadcast", kInvalid, false,
       [](BackCall* c) {
         c->fwd.desc.v_strides = {0, 42, 6};
       }},
      {"d_q_with_q_batch_broadcast", kInvalid, false,
       [](BackCall* c) {
         c->fwd.desc.q_strides = {0, 40, 8};
       }},
      {"d_k_with_k_head_stride_0", kInvalid, false,
       [](BackCall* c) {
         c->fwd.desc.k_strides = {112, 0, 8};
       }},
      {"d_v_with_v_heads_aliasing_tokens", kInvalid, false,
       [](BackCall* c) {
         c->fwd.desc.v_strides = {84, 6, 6};
       }},
      {"d_q_with_q_tokens_aliasing_heads", kInvalid, false,
       [](BackCall* c) {
         c->fwd.desc.q_strides = {160, 8, 8};
       }},
  };
}

class BackwardOnlyBadInputTest : public ::testing::TestWithParam<BackBadCase> {
};

TEST_P(BackwardOnlyBadInputTest, ReturnsStatusAndWritesNothing) {
  const BackBadCase& bc = GetParam();
  BackCall c;
  MisalignedWorkspace ws(kBigWorkspace);
  ASSERT_EQ(c.Invoke(ws.data(), ws.size()), QKV_OK);
  c.ResetGrads();
  bc.mutate(&c);
  ExpectBackwardRefused(&c, bc.expected, bc.desc_only);
}

INSTANTIATE_TEST_SUITE_P(BackwardCases, BackwardOnlyBadInputTest,
                         ::testing::ValuesIn(BackwardBadCases()),
                         [](const ::testing::TestParamInfo<BackBadCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(BackwardBadInputListTest, NamesAreUnique) {
  std::set<std::string> names;
  for (const BackBadCase& c : BackwardBadCases()) {
    EXPECT_TRUE(names.insert(c.name).second) << c.name;
  }
}

// The layouts refused above with a gradient are fine without it: an
// operand broadcast over the batch with its gradient NULL.
TEST(BackwardValidationTest, BroadcastOperandWithoutItsGradientIsAccepted) {
  MisalignedWorkspace ws(kBigWorkspace);
  {
    BackCall c;
    c.fwd.desc.k_strides = {0, 56, 8};
    c.fwd.desc.v_strides = {0, 42, 6};
    c.d_k = c.d_v = nullptr;
    EXPECT_EQ(c.Invoke(ws.data(), ws.size()), QKV_OK);
  }
  {
    BackCall c;
    c.fwd.desc.q_strides = {0, 40, 8};
    c.d_q = nullptr;
    EXPECT_EQ(c.Invoke(ws.data(), ws.size()), QKV_OK);
  }
  {
    // No gradient at all: nothing to write, accepted.
    BackCall c;
    c.d_q = c.d_k = c.d_v = nullptr;
    const std::vector<float> before = c.grads;
    EXPECT_EQ(c.Invoke(ws.data(), ws.size()), QKV_OK);
    EXPECT_TRUE(BitwiseEqual(before, c.grads));
    char message[64];
    EXPECT_EQ(c.Explain(ws.data(), ws.size(), message, sizeof message), QKV_OK);
    EXPECT_STREQ(message, "ok");
  }
}

// Neighbours are not overlaps: a gradient ending where an input begins or
// starting right after another gradient.
TEST(BackwardValidationTest, AdjacentBuffersAreAccepted) {
  MisalignedWorkspace ws(kBigWorkspace);
  for (int where = 0; where < 4; ++where) {
    SCOPED_TRACE("placement " + std::to_string(where));
    BackCall c;
    if (where == 0) c.d_q = c.fwd.Q() - kNumQ;
    if (where == 1) c.d_k = c.fwd.lse + kNumLse;
    if (where == 2) c.d_v = c.d_k + kNumK;
    if (where == 3) c.d_q = c.DOut() + kNumOut;
    EXPECT_EQ(c.Invoke(ws.data(), ws.size()), QKV_OK);
  }
}

// A gradient inside the workspace is refused (on every backend that needs
// a workspace here), and so is a short workspace, on every backend: nothing
// written; validation comes first.
TEST(BackwardValidationTest, WorkspaceShortOrOverlappedIsRefused) {
  for (const std::string& backend : BackendNames()) {
    SCOPED_TRACE("backend " + backend);
    BackCall c;
    c.fwd.desc.backend = backend.c_str();
    c.fwd.desc.mask = QKV_MASK_CAUSAL;
    const size_t need = qkv_attention_backward_workspace_size(&c.fwd.desc);
    if (need == 0) continue;  // this backend needs none for this shape
    const std::vector<float> fwd_before = c.fwd.arena, before = c.grads;
    auto untouched = [&] {
      return BitwiseEqual(fwd_before, c.fwd.arena) &&
             BitwiseEqual(before, c.grads);
    };
    MisalignedWorkspace short_ws(need - 1);
    EXPECT_EQ(c.Invoke(short_ws.data(), short_ws.size()),
              QKV_ERR_WORKSPACE_TOO_SMALL);
    EXPECT_EQ(c.Invoke(nullptr, 0), QKV_ERR_WORKSPACE_TOO_SMALL);
    char message[256];
    EXPECT_EQ(
        c.Explain(short_ws.data(), short_ws.size(), message, sizeof message),
        QKV_ERR_WORKSPACE_TOO_SMALL);
    EXPECT_TRUE(untouched()) << "a call refused for its workspace wrote";
    EXPECT_TRUE(short_ws.GuardsIntact());
    // An invalid call with a short workspace: the invalid argument first.
    c.fwd.desc.kv_heads = 3;
    EXPECT_EQ(c.Invoke(short_ws.data(), short_ws.size()),
              QKV_ERR_INVALID_ARGUMENT);
    c.fwd.desc.kv_heads = kKvHeads;
    // d_v inside the workspace.
    std::vector<float> shared((need + 3) / 4 + kNumV + 64);
    float* d_v = c.d_v;
    c.d_v = shared.data() + 16;
    EXPECT_EQ(c.Invoke(shared.data(), need), QKV_ERR_INVALID_ARGUMENT);
    c.d_v = d_v;
    EXPECT_TRUE(untouched());
    MisalignedWorkspace exact(need);
    EXPECT_EQ(c.Invoke(exact.data(), exact.size()), QKV_OK);
    EXPECT_TRUE(exact.GuardsIntact());
  }
}

// The backward workspace query: 0 for NULL and for descriptors the
// forward refuses; the same answer with a shorter struct_size whose tail
// holds defaults.
TEST(BackwardValidationTest, WorkspaceQueryOfInvalidDescriptorsIsZero) {
  EXPECT_EQ(qkv_attention_backward_workspace_size(nullptr), 0u);
  qkv_attention_desc d;
  qkv_attention_desc_init(&d, 2, 4, 3, 5, 7, 8, 6);  // 4 % 3 != 0
  EXPECT_EQ(qkv_attention_backward_workspace_size(&d), 0u);
  qkv_attention_desc_init(&d, 2, 4, 2, 5, 7, 8, 6);
  d.scale = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(qkv_attention_backward_workspace_size(&d), 0u);
  qkv_attention_desc_init(&d, 2, 4, 2, 5, 7, 8, 6);
  d.softcap = -1.0f;
  EXPECT_EQ(qkv_attention_backward_workspace_size(&d), 0u);
  qkv_attention_desc_init(&d, 2, 4, 2, 5, 7, 0, 6);
  EXPECT_EQ(qkv_attention_backward_workspace_size(&d), 0u);
  qkv_attention_desc_init(&d, 2, 4, 2, 5, 7, 8, 6);
  d.backend = "nope";
  EXPECT_EQ(qkv_attention_backward_workspace_size(&d), 0u);
}

// Older callers: a struct_size that ends before the 0.2 fields (or before
// `backend`) leaves them at their defaults, whatever they hold; the
// gradients keep their bits.
TEST(BackwardValidationTest, StructSizePrefixesDefaultTheRest) {
  MisalignedWorkspace ws(kBigWorkspace);
  BackCall c;
  c.fwd.desc.mask = QKV_MASK_CAUSAL;
  ASSERT_EQ(c.Invoke(ws.data(), ws.size()), QKV_OK);
  const std::vector<float> full = c.grads;
  const float nans[kQHeads] = {NAN, NAN, NAN, NAN};
  const int32_t starts[kBatch] = {-1, -1};
  {
    SCOPED_TRACE("0.1 caller");
    c.ResetGrads();
    qkv_attention_desc& d = c.fwd.desc;
    d.struct_size = offsetof(qkv_attention_desc, kv_dtype);
    SetRawDtype(&d, 77);
    d.q_strides = d.k_strides = d.v_strides = {-1, -1, -1};
    d.out_strides = {0, 0, 1};
    d.softcap = -1.0f;
    d.alibi_slopes = nans;
    d.sinks = nans;
    d.q_pos = starts;
    d.kv_start = starts;
    EXPECT_EQ(c.Invoke(ws.data(), ws.size()), QKV_OK);
    EXPECT_TRUE(BitwiseEqual(full, c.grads));
  }
  {
    SCOPED_TRACE("before backend");
    c.ResetGrads();
    c.fwd.desc.struct_size = offsetof(qkv_attention_desc, backend);
    c.fwd.desc.backend = "nope";
    EXPECT_EQ(c.Invoke(ws.data(), ws.size()), QKV_OK);
    EXPECT_TRUE(BitwiseEqual(full, c.grads));
  }
}

}  // namespace
}  // namespace qkv_test
