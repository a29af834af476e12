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
};

void FailIfCalled(void*, size_t, qkv_task_fn, void*) {
  ADD_FAILURE() << "parallel_for was called for a call that must fail";
}

struct BadCase {
  const char* name;
  qkv_status expected;
  // The descriptor alone is invalid: qkv_attention_workspace_size says 0.
  bool desc_only;
  void (*mutate)(Call*);
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

template <int64_t qkv_attention_desc::*kField, int64_t kValue>
void SetField(Call* c) {
  c->desc.*kField = kValue;
}

constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
using D = qkv_attention_desc;

// Each size field at 0, -1 and INT64_MIN.
// clang-format off
#define QKV_SIZE_CASES(field)                                            \
  BadCase{#field "_0", kInvalid, true, &SetField<&D::field, 0>},         \
  BadCase{#field "_neg1", kInvalid, true, &SetField<&D::field, -1>},     \
  BadCase{#field "_min", kInvalid, true, &SetField<&D::field, kMin64>}
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
      // A prefix that cuts the sizes: they default to 0, which is invalid.
      {"struct_size_without_sizes", kInvalid, true,
       [](Call* c) { c->desc.struct_size = offsetof(D, q_heads); }},
      QKV_SIZE_CASES(batch),
      QKV_SIZE_CASES(q_heads),
      QKV_SIZE_CASES(kv_heads),
      QKV_SIZE_CASES(q_len),
      QKV_SIZE_CASES(kv_len),
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
      {"mask_bit_8", kInvalid, true, [](Call* c) { c->desc.mask = 8; }},
      {"mask_bit_16_with_causal", kInvalid, true,
       [](Call* c) { c->desc.mask = QKV_MASK_CAUSAL | 16; }},
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
  };
}

#undef QKV_SIZE_CASES

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

}  // namespace
}  // namespace qkv_test
