// qkv_attention_f32 against the double-precision oracle, on every backend the
// library lists for this CPU (test names end in the backend, e.g.
// ".../causal_b1_h1k1_q65_kv17_d16v16_highway_AVX2").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "oracle.h"
#include "qkv/qkv.h"
#include "test_util.h"

namespace qkv_test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kOutTol = 5e-5;      // times max|v|
constexpr double kWeightsTol = 2e-5;  // absolute
constexpr double kLseTol = 1e-5;      // times max(1, |lse|)

// ---------------------------------------------------------------------------
// Comparison with the oracle.

void ExpectMatchesOracle(const qkv_attention_desc& d, const OracleOutput& e,
                         const Outputs& got, float max_abs_v) {
  const double out_tol = kOutTol * std::max<double>(max_abs_v, 1e-30);
  const int64_t rows = d.batch * d.q_heads * d.q_len;
  int reported = 0, bad = 0;
  auto where = [&](int64_t row) {
    std::string s = "b=" + std::to_string(row / (d.q_heads * d.q_len)) +
                    " h=" + std::to_string((row / d.q_len) % d.q_heads) +
                    " i=" + std::to_string(row % d.q_len);
    return s;
  };
  auto report = [&](const std::string& what) {
    ++bad;
    if (reported < 8) {
      ++reported;
      ADD_FAILURE() << what;
    }
  };
  for (int64_t row = 0; row < rows; ++row) {
    const double exact_lse = e.lse[static_cast<size_t>(row)];
    const bool masked_row = std::isinf(exact_lse);
    if (!got.lse.empty()) {
      const float g = got.lse[static_cast<size_t>(row)];
      const bool ok = masked_row
                          ? (std::isinf(g) && g < 0)
                          : std::fabs(g - exact_lse) <=
                                kLseTol * std::max(1.0, std::fabs(exact_lse));
      if (!ok) {
        report("lse at " + where(row) + ": got " + std::to_string(g) +
               ", exact " + std::to_string(exact_lse));
      }
    }
    for (int64_t c = 0; c < d.value_dim; ++c) {
      const size_t idx = static_cast<size_t>(row * d.value_dim + c);
      const float g = got.out[idx];
      const double x = e.out[idx];
      const bool ok = masked_row ? g == 0.0f : std::fabs(g - x) <= out_tol;
      if (!ok) {
        report("out at " + where(row) + " c=" + std::to_string(c) + ": got " +
               std::to_string(g) + ", exact " + std::to_string(x) +
               (masked_row ? " (row sees no key)" : "") + ", tolerance " +
               std::to_string(out_tol));
      }
    }
    if (!got.weights.empty()) {
      for (int64_t j = 0; j < d.kv_len; ++j) {
        const size_t idx = static_cast<size_t>(row * d.kv_len + j);
        const float g = got.weights[idx];
        const bool visible = e.visible[idx] != 0;
        const bool ok =
            visible ? std::fabs(g - e.weights[idx]) <= kWeightsTol : g == 0.0f;
        if (!ok) {
          report("weights at " + where(row) + " j=" + std::to_string(j) +
                 ": got " + std::to_string(g) + ", exact " +
                 std::to_string(e.weights[idx]) +
                 (visible ? "" : " (key is masked)"));
        }
      }
    }
  }
  EXPECT_EQ(bad, 0) << bad << " mismatches in total";
}

// ---------------------------------------------------------------------------
// Cases.

enum class Lens {
  kNone,
  kPerBatch,
  kPerQuery,
  kAllZero,
  kAllZeroPerQuery,
  kEdgesPerQuery,  // lengths at vector and block edges: 0, 1, 7, 8, 9, ...
};
enum class Bias {
  kNone,
  kFull,            // distinct per batch and head
  kHeadBroadcast,   // head stride 0
  kBatchBroadcast,  // batch stride 0
  kBothBroadcast,   // both strides 0
  kPadded,          // strides larger than the dense ones
};

struct Case {
  std::string prefix;
  int64_t batch = 1, q_heads = 1, kv_heads = 1, q_len = 1, kv_len = 1,
          head_dim = 1, value_dim = 1;
  qkv_score score = QKV_SCORE_DOT;
  bool causal = false;
  Lens lens = Lens::kNone;
  Bias bias = Bias::kNone;
  bool bias_neg_inf = false;       // about a quarter of the entries -inf
  bool bias_neg_inf_rows = false;  // every third row entirely -inf
  float bias_mag = 1.0f;
  float q_mag = 1.0f, k_mag = 1.0f, v_mag = 1.0f;
  bool has_scale = false;
  float scale = 0.0f;
  int64_t hidden = 16;

  Case& Causal() {
    causal = true;
    return *this;
  }
  Case& WithLens(Lens l) {
    lens = l;
    return *this;
  }
  Case& WithBias(Bias b, bool neg_inf = false, bool neg_inf_rows = false) {
    bias = b;
    bias_neg_inf = neg_inf;
    bias_neg_inf_rows = neg_inf_rows;
    return *this;
  }
  Case& Score(qkv_score s, int64_t h = 16) {
    score = s;
    hidden = h;
    return *this;
  }
  Case& Scale(float s) {
    has_scale = true;
    scale = s;
    return *this;
  }
  Case& Magnitudes(float q, float k, float v) {
    q_mag = q;
    k_mag = k;
    v_mag = v;
    return *this;
  }

  std::string Name() const {
    return prefix + "_b" + std::to_string(batch) + "_h" +
           std::to_string(q_heads) + "k" + std::to_string(kv_heads) + "_q" +
           std::to_string(q_len) + "_kv" + std::to_string(kv_len) + "_d" +
           std::to_string(head_dim) + "v" + std::to_string(value_dim);
  }
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.Name(); }

Case Shape(const std::string& prefix, int64_t batch, int64_t q_heads,
           int64_t kv_heads, int64_t q_len, int64_t kv_len, int64_t head_dim,
           int64_t value_dim) {
  Case c;
  c.prefix = prefix;
  c.batch = batch;
  c.q_heads = q_heads;
  c.kv_heads = kv_heads;
  c.q_len = q_len;
  c.kv_len = kv_len;
  c.head_dim = head_dim;
  c.value_dim = value_dim;
  return c;
}

// Random shapes and masks from a fixed seed, at most ~8M multiply-adds each
// so the scalar reference and the oracle stay quick.
void AddRandomCases(std::vector<Case>* cs) {
  static const int64_t kLens[] = {1,  2,   3,   4,   5,   7,   8,   9,
                                  15, 16,  17,  31,  32,  33,  63,  64,
                                  65, 127, 128, 129, 191, 192, 193, 300};
  static const int64_t kDims[] = {1,  2,  3,  4,  5,  7,  8,  9,  15,  16,
                                  17, 31, 32, 33, 63, 64, 65, 80, 128, 256};
  static const int64_t kGroups[] = {1, 1, 2, 3, 4, 8};
  std::mt19937 rng(20240601u);
  auto pick = [&](const int64_t* xs, size_t n) {
    return xs[std::uniform_int_distribution<size_t>(0, n - 1)(rng)];
  };
  int made = 0;
  while (made < 48) {
    Case c;
    c.batch = std::uniform_int_distribution<int64_t>(1, 3)(rng);
    c.kv_heads = std::uniform_int_distribution<int64_t>(1, 3)(rng);
    c.q_heads = c.kv_heads * pick(kGroups, 6);
    c.q_len = pick(kLens, 24);
    c.kv_len = pick(kLens, 24);
    c.head_dim = pick(kDims, 20);
    c.value_dim = rng() % 3 == 0 ? c.head_dim : pick(kDims, 20);
    const uint32_t score = rng() % 10;
    c.score = score < 6   ? QKV_SCORE_DOT
              : score < 8 ? QKV_SCORE_GAUSSIAN
                          : QKV_SCORE_ADDITIVE;
    c.hidden = pick(kDims, 12);
    c.causal = rng() % 2 == 0;
    const uint32_t lens = rng() % 6;
    c.lens = lens < 2    ? Lens::kNone
             : lens == 2 ? Lens::kPerBatch
             : lens == 3 ? Lens::kPerQuery
             : lens == 4 ? Lens::kEdgesPerQuery
                         : Lens::kNone;
    const uint32_t bias = rng() % 8;
    c.bias = bias < 3 ? Bias::kNone : static_cast<Bias>(bias - 2);
    c.bias_neg_inf = rng() % 2 == 0;
    c.bias_neg_inf_rows = rng() % 4 == 0;
    if (rng() % 4 == 0) c.Magnitudes(2, 2, 30);
    int64_t work =
        c.batch * c.q_heads * c.q_len * c.kv_len * (c.head_dim + c.value_dim);
    if (c.score == QKV_SCORE_ADDITIVE) {  // tanh terms and the projections
      work += c.batch * c.q_heads * c.q_len * c.hidden *
              (4 * c.kv_len + c.head_dim);
      work += c.batch * c.kv_heads * c.kv_len * c.hidden * c.head_dim;
    }
    if (work > 8000000) continue;
    char prefix[32];
    std::snprintf(prefix, sizeof prefix, "random%02d", made);
    c.prefix = prefix;
    cs->push_back(c);
    ++made;
  }
}

std::vector<Case> AllCases() {
  std::vector<Case> cs;
  // Sizes around vector widths (4, 8, 16 floats) and tile sizes, head_dim
  // and value_dim mostly different, q_len and kv_len marching through the
  // edges.
  const int64_t dense[][4] = {
      {1, 1, 1, 1},       {2, 3, 2, 3},        {3, 7, 3, 5},
      {7, 8, 4, 4},       {8, 9, 5, 7},        {9, 15, 7, 9},
      {15, 16, 8, 8},     {16, 17, 9, 15},     {17, 31, 15, 16},
      {31, 32, 16, 17},   {32, 33, 17, 31},    {33, 63, 31, 32},
      {63, 64, 32, 33},   {64, 65, 33, 63},    {65, 127, 63, 64},
      {127, 128, 64, 65}, {128, 129, 65, 80},  {129, 300, 80, 128},
      {9, 129, 256, 256}, {300, 65, 128, 128}, {17, 33, 1, 256},
      {33, 17, 256, 1},   {300, 300, 64, 64},  {2, 1, 16, 16},
      {1, 2, 16, 16},     {16, 16, 16, 16},    {32, 32, 32, 32},
      {64, 64, 128, 128}, {128, 128, 64, 64},  {1, 300, 128, 64},
      {3, 2, 65, 3},      {8, 127, 2, 31},
  };
  for (const auto& s : dense) {
    cs.push_back(Shape("dense", 1, 1, 1, s[0], s[1], s[2], s[3]));
  }
  // Batch > 1 and GQA ratios 1, 2, 3, 4, 8.
  cs.push_back(Shape("gqa", 3, 2, 2, 17, 33, 16, 16));
  cs.push_back(Shape("gqa", 2, 4, 2, 9, 65, 32, 17));
  cs.push_back(Shape("gqa", 2, 6, 2, 16, 16, 8, 9));
  cs.push_back(Shape("gqa", 1, 12, 4, 3, 40, 24, 24));
  cs.push_back(Shape("gqa", 2, 8, 2, 7, 31, 64, 64));
  cs.push_back(Shape("gqa", 1, 8, 1, 5, 129, 33, 33));
  cs.push_back(Shape("gqa", 2, 8, 1, 1, 300, 64, 64));
  // Decoding at GQA 8 (16-lane targets score the 8 rows together, two keys
  // at a time): an odd last key, keys shorter than a vector, a one-vector
  // head_dim with a value_dim of one and a half vectors, lengths per batch.
  cs.push_back(Shape("gqa8_decode", 2, 16, 2, 1, 301, 32, 32));
  cs.push_back(Shape("gqa8_decode", 1, 8, 1, 1, 3, 16, 16));
  cs.push_back(Shape("gqa8_decode_lens", 3, 8, 1, 1, 200, 16, 24)
                   .WithLens(Lens::kPerBatch));
  cs.push_back(
      Shape("gqa8_decode_scale_big", 1, 8, 1, 1, 77, 16, 16).Scale(3.0f));
  cs.push_back(Shape("gqa", 4, 1, 1, 8, 8, 8, 8));
  cs.push_back(Shape("gqa", 2, 3, 1, 65, 64, 16, 16));
  // Causal, bottom-right: q_len < kv_len, ==, and > (rows that see nothing).
  cs.push_back(Shape("causal", 1, 1, 1, 33, 33, 32, 32).Causal());
  cs.push_back(Shape("causal", 1, 1, 1, 64, 64, 64, 64).Causal());
  cs.push_back(Shape("causal", 1, 1, 1, 129, 129, 17, 16).Causal());
  cs.push_back(Shape("causal", 1, 1, 1, 7, 65, 16, 16).Causal());
  cs.push_back(Shape("causal", 1, 2, 1, 1, 300, 64, 64).Causal());
  cs.push_back(Shape("causal", 1, 1, 1, 65, 17, 16, 16).Causal());
  cs.push_back(Shape("causal", 1, 1, 1, 300, 1, 8, 8).Causal());
  cs.push_back(Shape("causal", 2, 4, 2, 40, 31, 32, 33).Causal());
  cs.push_back(Shape("causal", 1, 8, 1, 17, 130, 64, 64).Causal());
  cs.push_back(Shape("causal", 2, 6, 2, 9, 9, 7, 5).Causal());
  // Valid lengths alone, with causal, and all zero.
  cs.push_back(
      Shape("lens_batch", 4, 2, 1, 9, 33, 16, 16).WithLens(Lens::kPerBatch));
  cs.push_back(
      Shape("lens_batch", 5, 1, 1, 16, 129, 32, 32).WithLens(Lens::kPerBatch));
  cs.push_back(
      Shape("lens_query", 3, 2, 2, 17, 65, 16, 8).WithLens(Lens::kPerQuery));
  cs.push_back(
      Shape("lens_query", 2, 4, 1, 33, 33, 64, 64).WithLens(Lens::kPerQuery));
  cs.push_back(Shape("causal_lens_batch", 4, 2, 2, 17, 33, 16, 16)
                   .Causal()
                   .WithLens(Lens::kPerBatch));
  cs.push_back(Shape("causal_lens_query", 2, 2, 1, 33, 17, 8, 8)
                   .Causal()
                   .WithLens(Lens::kPerQuery));
  cs.push_back(Shape("causal_lens_query", 2, 1, 1, 16, 64, 32, 16)
                   .Causal()
                   .WithLens(Lens::kPerQuery));
  cs.push_back(
      Shape("lens_zero_batch", 2, 2, 1, 5, 9, 8, 8).WithLens(Lens::kAllZero));
  cs.push_back(Shape("lens_zero_query", 2, 2, 2, 7, 33, 16, 16)
                   .WithLens(Lens::kAllZeroPerQuery));
  // The tiny row path (at most 4 rows per kv head, kv_len <= lanes): 8 keys
  // (AVX-512 runs these on 256-bit vectors), 9 and 16 (full vectors), with
  // every mask, GQA and the seeds' 4 x 4 toy shape.
  cs.push_back(Shape("tiny", 2, 4, 2, 2, 8, 2, 3)
                   .Causal()
                   .WithLens(Lens::kPerQuery));
  cs.push_back(
      Shape("tiny", 1, 2, 1, 2, 9, 5, 4).WithBias(Bias::kFull, true));
  cs.push_back(Shape("tiny", 3, 1, 1, 4, 4, 2, 2).Causal());
  cs.push_back(
      Shape("tiny", 2, 2, 2, 1, 16, 7, 1).WithLens(Lens::kPerBatch));
  cs.push_back(
      Shape("tiny", 1, 1, 1, 3, 5, 3, 3).WithBias(Bias::kFull, false, true));
  // Few keys of wide heads: the row path (the tiny path serves toy widths
  // only), at the lanes' boundaries, f32 widths just past the tiny limit.
  cs.push_back(Shape("few_keys_wide", 1, 8, 8, 1, 16, 128, 128));
  cs.push_back(Shape("few_keys_wide", 2, 8, 2, 1, 4, 64, 64).Causal());
  cs.push_back(Shape("few_keys_wide", 1, 4, 4, 1, 8, 17, 15)
                   .WithLens(Lens::kPerBatch));
  cs.push_back(Shape("few_keys_wide", 1, 2, 1, 2, 9, 16, 16)
                   .WithBias(Bias::kFull, true));
  // Long keys: K and V of a head over 1 MiB (past L2), many key blocks,
  // several tiles and a partial last one, with causal, per-query lengths and
  // bias.
  cs.push_back(Shape("long_kv", 1, 2, 1, 70, 1100, 128, 128)
                   .Causal()
                   .WithLens(Lens::kPerQuery));
  cs.push_back(
      Shape("long_kv", 2, 1, 1, 33, 1030, 64, 200).WithBias(Bias::kFull, true));
  // K and V of the call at 8 MiB and more: the tiles and the row path
  // prefetch them in software (src/pipeline/prefetch.h, PrefetchesKv). Narrow heads
  // keep the oracle cheap; value_dim differs from head_dim; masks.
  cs.push_back(Shape("streamed_kv", 1, 1, 1, 5, 131072, 8, 12));
  cs.push_back(Shape("streamed_kv", 1, 2, 1, 3, 65536, 16, 16)
                   .Causal()
                   .WithLens(Lens::kPerQuery));
  cs.push_back(Shape("streamed_kv", 2, 2, 1, 1, 131072, 8, 12)
                   .WithLens(Lens::kPerBatch));  // row path, key splits
  // Decoding one row per kv head with value rows wider than one pass of
  // accumulators (on AMD CPUs taken 8 keys at a time while the next keys
  // stream in), -inf bias entries (probabilities of 0), short last blocks.
  cs.push_back(Shape("streamed_kv", 1, 2, 2, 1, 8200, 128, 256)
                   .WithBias(Bias::kFull, true));
  cs.push_back(Shape("streamed_kv", 2, 3, 3, 1, 9000, 64, 200)
                   .WithLens(Lens::kPerBatch));
  // The first row's scores read a block's keys from memory one key after
  // the other (RowScores, KeyMajorScores): head_dim past whole vectors,
  // every score kind, a last step of fewer than 4 keys.
  cs.push_back(Shape("streamed_kv", 1, 2, 2, 1, 9003, 100, 36)
                   .WithLens(Lens::kPerBatch));
  cs.push_back(Shape("streamed_kv", 1, 2, 2, 1, 9005, 100, 36)
                   .Score(QKV_SCORE_GAUSSIAN));
  cs.push_back(Shape("streamed_kv", 1, 1, 1, 1, 45001, 16, 24)
                   .Score(QKV_SCORE_ADDITIVE, 24));
  // Two rows in phases of key blocks on AMD (RunRowPhases): GQA-2 decoding
  // with per-batch lengths, and two causal queries of one head (each row
  // its own last key).
  cs.push_back(Shape("streamed_kv", 2, 2, 1, 1, 10001, 64, 72)
                   .WithLens(Lens::kPerBatch));
  cs.push_back(Shape("streamed_kv", 1, 2, 2, 2, 17000, 64, 40).Causal());
  // Joint rows (GQA 4 and 8 decoding) streaming their keys (RowScoresRows
  // one key after the other on x86; RowScores8).
  cs.push_back(Shape("streamed_kv", 1, 4, 1, 1, 20003, 100, 36));
  cs.push_back(Shape("streamed_kv", 1, 8, 1, 1, 12002, 128, 64));
  // Bias: strides, broadcasting, -inf entries and rows, combinations.
  cs.push_back(
      Shape("bias_full", 2, 3, 3, 9, 17, 16, 16).WithBias(Bias::kFull));
  cs.push_back(Shape("bias_head0", 2, 4, 2, 9, 33, 16, 16)
                   .WithBias(Bias::kHeadBroadcast));
  cs.push_back(Shape("bias_batch0", 3, 2, 1, 8, 20, 8, 8)
                   .WithBias(Bias::kBatchBroadcast));
  cs.push_back(Shape("bias_both0", 2, 2, 2, 16, 16, 32, 32)
                   .WithBias(Bias::kBothBroadcast));
  cs.push_back(
      Shape("bias_padded", 2, 3, 1, 7, 13, 8, 8).WithBias(Bias::kPadded));
  cs.push_back(Shape("bias_neginf", 2, 2, 1, 16, 33, 16, 16)
                   .WithBias(Bias::kFull, true));
  cs.push_back(Shape("bias_neginf_rows", 2, 2, 2, 9, 17, 8, 8)
                   .WithBias(Bias::kFull, false, true));
  cs.push_back(Shape("bias_neginf_both0", 1, 2, 2, 33, 65, 16, 16)
                   .WithBias(Bias::kBothBroadcast, true, true));
  {
    Case c = Shape("bias_large", 1, 2, 1, 16, 64, 16, 16)
                 .WithBias(Bias::kHeadBroadcast);
    c.bias_mag = 20.0f;
    cs.push_back(c);
  }
  cs.push_back(Shape("causal_bias", 1, 2, 2, 17, 33, 16, 16)
                   .Causal()
                   .WithBias(Bias::kFull, true));
  cs.push_back(Shape("lens_bias", 2, 2, 2, 9, 33, 8, 8)
                   .WithLens(Lens::kPerBatch)
                   .WithBias(Bias::kBatchBroadcast, true));
  cs.push_back(Shape("causal_lens_bias", 2, 4, 2, 17, 40, 32, 16)
                   .Causal()
                   .WithLens(Lens::kPerQuery)
                   .WithBias(Bias::kHeadBroadcast, true, true));
  cs.push_back(Shape("causal_lens_bias", 1, 2, 1, 70, 64, 16, 16)
                   .Causal()
                   .WithLens(Lens::kPerBatch)
                   .WithBias(Bias::kPadded, true));
  // Scale: 0 (average pooling), negative, large.
  cs.push_back(Shape("scale0", 1, 2, 1, 9, 33, 16, 16).Scale(0.0f));
  cs.push_back(Shape("scale0_causal_lens", 2, 2, 1, 9, 33, 16, 16)
                   .Scale(0.0f)
                   .Causal()
                   .WithLens(Lens::kPerQuery));
  cs.push_back(Shape("scale_neg", 1, 1, 1, 16, 16, 8, 8).Scale(-0.7f));
  cs.push_back(Shape("scale_big", 1, 1, 1, 16, 40, 8, 8).Scale(3.0f));
  // Larger magnitudes: values up to 30, logits of a few tens.
  cs.push_back(Shape("bigv", 1, 2, 2, 33, 65, 32, 32).Magnitudes(4, 4, 30));
  cs.push_back(
      Shape("bigqk", 2, 2, 1, 17, 100, 16, 24).Magnitudes(3, 3, 30).Causal());
  // Valid lengths at vector and key-block edges, per query.
  cs.push_back(Shape("lens_edges", 1, 2, 1, 27, 200, 16, 16)
                   .WithLens(Lens::kEdgesPerQuery));
  cs.push_back(Shape("lens_edges_causal_bias", 2, 4, 2, 30, 193, 32, 20)
                   .Causal()
                   .WithLens(Lens::kEdgesPerQuery)
                   .WithBias(Bias::kHeadBroadcast, true));
  cs.push_back(Shape("lens_edges_decode", 3, 4, 2, 2, 193, 64, 64)
                   .WithLens(Lens::kEdgesPerQuery));
  // Decoding: a handful of query rows per kv head (q_len 1..4 times a small
  // GQA group), long kv, every mask.
  cs.push_back(Shape("decode", 2, 4, 1, 1, 300, 64, 64));
  cs.push_back(Shape("decode", 1, 2, 1, 2, 129, 128, 128).Causal());
  cs.push_back(Shape("decode", 2, 3, 3, 3, 65, 33, 17)
                   .Causal()
                   .WithLens(Lens::kPerQuery));
  cs.push_back(Shape("decode", 2, 2, 2, 4, 200, 16, 24)
                   .WithLens(Lens::kPerBatch)
                   .WithBias(Bias::kFull, true, true));
  cs.push_back(Shape("decode", 1, 1, 1, 1, 1000, 256, 256));
  cs.push_back(Shape("decode", 2, 8, 2, 1, 257, 80, 80)
                   .Causal()
                   .WithBias(Bias::kPadded, true));
  cs.push_back(Shape("decode_gaussian", 2, 4, 2, 1, 130, 64, 64)
                   .Score(QKV_SCORE_GAUSSIAN)
                   .WithLens(Lens::kPerQuery)
                   .WithBias(Bias::kBothBroadcast, true));
  cs.push_back(Shape("decode_bigv", 1, 4, 1, 1, 100, 32, 32)
                   .Magnitudes(4, 4, 30)
                   .Causal());
  // GAUSSIAN.
  cs.push_back(Shape("gaussian", 1, 1, 1, 16, 16, 8, 8)
                   .Score(QKV_SCORE_GAUSSIAN)
                   .Scale(0.5f));
  cs.push_back(
      Shape("gaussian", 2, 4, 2, 17, 33, 32, 16).Score(QKV_SCORE_GAUSSIAN));
  cs.push_back(Shape("gaussian_causal", 1, 1, 1, 65, 129, 64, 64)
                   .Score(QKV_SCORE_GAUSSIAN)
                   .Causal());
  cs.push_back(Shape("gaussian_lens_bias", 2, 2, 1, 9, 31, 3, 5)
                   .Score(QKV_SCORE_GAUSSIAN)
                   .WithLens(Lens::kPerQuery)
                   .WithBias(Bias::kFull, true));
  cs.push_back(
      Shape("gaussian", 1, 1, 1, 1, 300, 128, 128).Score(QKV_SCORE_GAUSSIAN));
  cs.push_back(Shape("gaussian_lens_zero", 2, 1, 1, 4, 9, 8, 8)
                   .Score(QKV_SCORE_GAUSSIAN)
                   .WithLens(Lens::kAllZero));
  // ADDITIVE (hidden 1, 7, 8, 16, 33, 64).
  cs.push_back(
      Shape("additive_h1", 1, 1, 1, 8, 8, 4, 4).Score(QKV_SCORE_ADDITIVE, 1));
  cs.push_back(
      Shape("additive_h7", 1, 1, 1, 16, 17, 8, 8).Score(QKV_SCORE_ADDITIVE, 7));
  cs.push_back(Shape("additive_h16", 2, 4, 2, 9, 33, 16, 16)
                   .Score(QKV_SCORE_ADDITIVE, 16));
  cs.push_back(Shape("additive_h33_causal", 1, 2, 1, 33, 65, 32, 17)
                   .Score(QKV_SCORE_ADDITIVE, 33)
                   .Causal());
  cs.push_back(Shape("additive_h8_lens_bias", 2, 2, 2, 7, 15, 5, 9)
                   .Score(QKV_SCORE_ADDITIVE, 8)
                   .WithLens(Lens::kPerBatch)
                   .WithBias(Bias::kFull, true));
  cs.push_back(Shape("additive_h64", 1, 1, 1, 1, 129, 64, 64)
                   .Score(QKV_SCORE_ADDITIVE, 64));
  AddRandomCases(&cs);
  return cs;
}

// Inputs for a case: q, k, v uniform in [-mag, mag]; valid lengths mixing
// 0, kv_len and random values; bias uniform in [-bias_mag, bias_mag] with
// the requested -inf pattern.
Problem BuildProblem(const Case& c) {
  std::mt19937 rng(SeedFromName(c.Name()));
  Problem p =
      MakeProblem(c.batch, c.q_heads, c.kv_heads, c.q_len, c.kv_len, c.head_dim,
                  c.value_dim, rng(), c.q_mag, c.k_mag, c.v_mag);
  qkv_attention_desc& d = p.desc;
  d.score = c.score;
  if (c.has_scale) d.scale = c.scale;
  if (c.causal) d.mask |= QKV_MASK_CAUSAL;

  if (c.lens != Lens::kNone) {
    d.mask |= QKV_MASK_VALID_LENS;
    const bool per_query = c.lens == Lens::kPerQuery ||
                           c.lens == Lens::kAllZeroPerQuery ||
                           c.lens == Lens::kEdgesPerQuery;
    static const int32_t kEdges[] = {0,  1,  2,  3,   4,   5,   7,   8,   9,
                                     15, 16, 17, 31,  32,  33,  63,  64,  65,
                                     95, 96, 97, 127, 128, 129, 191, 192, 193};
    const size_t num_edges = sizeof(kEdges) / sizeof(kEdges[0]);
    const bool zero =
        c.lens == Lens::kAllZero || c.lens == Lens::kAllZeroPerQuery;
    d.valid_lens_per_query = per_query ? 1 : 0;
    const int64_t n = per_query ? c.batch * c.q_len : c.batch;
    std::uniform_int_distribution<int32_t> any_len(
        0, static_cast<int32_t>(c.kv_len));
    std::uniform_int_distribution<int32_t> some_len(
        1, static_cast<int32_t>(c.kv_len));
    for (int64_t idx = 0; idx < n; ++idx) {
      int32_t len;
      switch (idx % 5) {
        case 1:
          len = static_cast<int32_t>(c.kv_len);
          break;
        case 3:
          len = per_query || c.batch > 2 ? 0 : some_len(rng);
          break;
        case 0:
          len = some_len(rng);
          break;
        default:
          len = any_len(rng);
          break;
      }
      if (c.lens == Lens::kEdgesPerQuery) {
        // Walk the edge list from a per-batch offset; clip to kv_len.
        len = std::min<int32_t>(
            kEdges[static_cast<size_t>(idx * 5 + idx / c.q_len) % num_edges],
            static_cast<int32_t>(c.kv_len));
      }
      p.valid_lens.push_back(zero ? 0 : len);
    }
  }

  if (c.bias != Bias::kNone) {
    d.mask |= QKV_MASK_BIAS;
    const int64_t plane = c.q_len * c.kv_len;
    switch (c.bias) {
      case Bias::kFull:
        d.bias_head_stride = plane;
        d.bias_batch_stride = c.q_heads * plane;
        break;
      case Bias::kHeadBroadcast:
        d.bias_head_stride = 0;
        d.bias_batch_stride = plane;
        break;
      case Bias::kBatchBroadcast:
        d.bias_head_stride = plane;
        d.bias_batch_stride = 0;
        break;
      case Bias::kBothBroadcast:
        d.bias_head_stride = 0;
        d.bias_batch_stride = 0;
        break;
      case Bias::kPadded:
        d.bias_head_stride = plane + 3;
        d.bias_batch_stride = c.q_heads * (plane + 3) + 5;
        break;
      case Bias::kNone:
        break;
    }
    const int64_t extent = (c.batch - 1) * d.bias_batch_stride +
                           (c.q_heads - 1) * d.bias_head_stride + plane;
    p.bias.resize(static_cast<size_t>(extent));
    FillUniform(&p.bias, &rng, -c.bias_mag, c.bias_mag);
    std::bernoulli_distribution quarter(0.25);
    for (size_t idx = 0; idx < p.bias.size(); ++idx) {
      const int64_t row = static_cast<int64_t>(idx) / c.kv_len;
      if (c.bias_neg_inf && quarter(rng)) p.bias[idx] = -kInf;
      if (c.bias_neg_inf_rows && row % 3 == 1) p.bias[idx] = -kInf;
    }
  }

  if (c.score == QKV_SCORE_ADDITIVE) {
    d.additive_hidden = c.hidden;
    const float wscale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    p.w_q.resize(static_cast<size_t>(c.hidden * c.head_dim));
    p.w_k.resize(static_cast<size_t>(c.hidden * c.head_dim));
    p.w_v.resize(static_cast<size_t>(c.hidden));
    FillUniform(&p.w_q, &rng, -2 * wscale, 2 * wscale);
    FillUniform(&p.w_k, &rng, -2 * wscale, 2 * wscale);
    FillUniform(&p.w_v, &rng, -1.0f, 1.0f);
  }
  return p;
}

// Handles QKV_ERR_UNSUPPORTED: only GAUSSIAN/ADDITIVE on a non-reference
// backend may be unsupported. Returns true when the test should stop.
bool UnsupportedIsAllowed(const std::string& backend, qkv_score score) {
  return backend != "reference" && score != QKV_SCORE_DOT;
}

// ---------------------------------------------------------------------------
// The oracle comparison, over every backend x case.

class AttentionOracleTest
    : public ::testing::TestWithParam<std::tuple<std::string, Case>> {};

TEST_P(AttentionOracleTest, MatchesOracle) {
  const std::string& backend = std::get<0>(GetParam());
  const Case& c = std::get<1>(GetParam());
  Problem p = BuildProblem(c);
  p.backend = backend;
  const qkv_attention_desc d = p.Bound();

  const Problem pristine = p;
  const Outputs full = RunAttention(p);
  // The inputs are const: not even scratch use is allowed.
  EXPECT_TRUE(
      BitwiseEqual(p.q, pristine.q) && BitwiseEqual(p.k, pristine.k) &&
      BitwiseEqual(p.v, pristine.v) && BitwiseEqual(p.bias, pristine.bias) &&
      BitwiseEqual(p.w_q, pristine.w_q) && BitwiseEqual(p.w_k, pristine.w_k) &&
      BitwiseEqual(p.w_v, pristine.w_v) && p.valid_lens == pristine.valid_lens)
      << "an input buffer was modified";
  if (full.status == QKV_ERR_UNSUPPORTED) {
    if (UnsupportedIsAllowed(backend, c.score)) {
      GTEST_SKIP() << backend << " returns QKV_ERR_UNSUPPORTED for score "
                   << c.score;
    }
    FAIL() << backend << " must support score " << c.score;
  }
  ASSERT_EQ(full.status, QKV_OK) << qkv_status_string(full.status);

  const OracleOutput exact =
      OracleAttention(d, p.q.data(), p.k.data(), p.v.data());
  ExpectMatchesOracle(d, exact, full, p.MaxAbsV());

  // The optional outputs must not change out, bit for bit.
  for (int variant = 0; variant < 3; ++variant) {
    RunOptions opt;
    opt.weights = variant == 1;
    opt.lse = variant == 2;
    opt.check_short_workspace = false;
    const Outputs o = RunAttention(p, opt);
    ASSERT_EQ(o.status, QKV_OK);
    EXPECT_TRUE(BitwiseEqual(o.out, full.out))
        << "out differs with weights " << (opt.weights ? "on" : "NULL")
        << " and lse " << (opt.lse ? "on" : "NULL");
    if (opt.weights) {
      ExpectMatchesOracle(d, exact, o, p.MaxAbsV());
    }
    if (opt.lse) {
      ExpectMatchesOracle(d, exact, o, p.MaxAbsV());
    }
  }
}

std::string ParamName(
    const ::testing::TestParamInfo<std::tuple<std::string, Case>>& info) {
  return std::get<1>(info.param).Name() + "_" +
         SanitizeForTestName(std::get<0>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Backends, AttentionOracleTest,
                         ::testing::Combine(::testing::ValuesIn(BackendNames()),
                                            ::testing::ValuesIn(AllCases())),
                         ParamName);

// ---------------------------------------------------------------------------
// Targeted properties, per backend.

class AttentionBackendTest : public ::testing::TestWithParam<std::string> {};

// Logits around +-1e4 and beyond (a naive exp overflows or underflows to
// inf/inf or 0/0): gaps of >= 2000 between the best key and the rest make the
// exact weights one-hot, so the library must return exactly 1 and 0, and out
// exactly the selected v row.
TEST_P(AttentionBackendTest, HugeLogitsGiveExactOneHot) {
  const int64_t q_len = 9, kv_len = 33, head_dim = 8, value_dim = 17;
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    Problem p = MakeProblem(2, 2, 1, q_len, kv_len, head_dim, value_dim,
                            1234u + static_cast<uint32_t>(variant), 1, 1, 5);
    p.backend = GetParam();
    qkv_attention_desc& d = p.desc;
    d.scale = 1.0f;
    // k[j][a] = 100 + 20 * rank(j, a): a distinct rank per key and dim.
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t j = 0; j < kv_len; ++j) {
        for (int64_t a = 0; a < head_dim; ++a) {
          const int64_t rank = (j * 7 + a * 5 + b * 3) % kv_len;
          p.k[static_cast<size_t>((b * kv_len + j) * head_dim + a)] =
              static_cast<float>(100 + 20 * rank);
        }
      }
    }
    // Head 0: q = +100 e_a (scores 1e4 .. 7.4e4); head 1: q = -100 e_a
    // (scores -1e4 .. -7.4e4).
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t i = 0; i < q_len; ++i) {
          float* qr = p.q.data() + ((b * 2 + h) * q_len + i) * head_dim;
          for (int64_t a = 0; a < head_dim; ++a) qr[a] = 0.0f;
          qr[(i + h) % head_dim] = h == 0 ? 100.0f : -100.0f;
        }
      }
    }
    if (variant == 1) d.mask |= QKV_MASK_CAUSAL;
    if (variant == 2) {
      d.mask |= QKV_MASK_VALID_LENS;
      d.valid_lens_per_query = 1;
      for (int64_t r = 0; r < 2 * q_len; ++r) {
        p.valid_lens.push_back(static_cast<int32_t>(1 + (r * 11) % kv_len));
      }
    }
    if (variant == 3) {
      // The bias alone decides: scale 0, bias of 1e4 - 3000 * rank.
      d.scale = 0.0f;
      d.mask |= QKV_MASK_BIAS;
      d.bias_batch_stride = 2 * q_len * kv_len;
      d.bias_head_stride = q_len * kv_len;
      p.bias.resize(static_cast<size_t>(2 * 2 * q_len * kv_len));
      for (size_t idx = 0; idx < p.bias.size(); ++idx) {
        const int64_t rank = static_cast<int64_t>((idx * 13) % kv_len);
        p.bias[idx] = static_cast<float>(1e4 - 3000.0 * rank);
      }
    }
    const qkv_attention_desc bound = p.Bound();
    const Outputs got = RunAttention(p);
    ASSERT_EQ(got.status, QKV_OK) << qkv_status_string(got.status);
    const OracleOutput e =
        OracleAttention(bound, p.q.data(), p.k.data(), p.v.data());
    int bad = 0;
    for (size_t idx = 0; idx < e.weights.size(); ++idx) {
      ASSERT_TRUE(e.weights[idx] == 0.0 || e.weights[idx] == 1.0);
      if (got.weights[idx] != static_cast<float>(e.weights[idx]) && bad++ < 8) {
        ADD_FAILURE() << "weights[" << idx << "] = " << got.weights[idx]
                      << ", exact " << e.weights[idx];
      }
    }
    for (size_t idx = 0; idx < e.out.size(); ++idx) {
      if (got.out[idx] != static_cast<float>(e.out[idx]) && bad++ < 8) {
        ADD_FAILURE() << "out[" << idx << "] = " << got.out[idx]
                      << ", exact (the selected v) " << e.out[idx];
      }
    }
    for (size_t idx = 0; idx < e.lse.size(); ++idx) {
      const float g = got.lse[idx];
      const bool ok =
          std::isinf(e.lse[idx])
              ? (std::isinf(g) && g < 0)
              : std::fabs(g - e.lse[idx]) <= kLseTol * std::fabs(e.lse[idx]);
      if (!ok && bad++ < 8) {
        ADD_FAILURE() << "lse[" << idx << "] = " << g << ", exact "
                      << e.lse[idx];
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

// scale 0: every visible key gets 1/n, out is the plain mean of the visible
// v rows. Checked without the oracle.
TEST_P(AttentionBackendTest, ScaleZeroIsAveragePooling) {
  const int64_t batch = 2, q_heads = 4, kv_heads = 2, q_len = 13, kv_len = 37;
  const int64_t head_dim = 16, value_dim = 9;
  Problem p = MakeProblem(batch, q_heads, kv_heads, q_len, kv_len, head_dim,
                          value_dim, 99u, 3, 3, 1);
  p.backend = GetParam();
  p.desc.scale = 0.0f;
  p.desc.mask = QKV_MASK_CAUSAL | QKV_MASK_VALID_LENS;
  p.valid_lens = {30, 37};
  const Outputs got = RunAttention(p);
  ASSERT_EQ(got.status, QKV_OK) << qkv_status_string(got.status);
  const double out_tol = kOutTol * p.MaxAbsV();
  const int64_t group = q_heads / kv_heads;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < q_heads; ++h) {
      for (int64_t i = 0; i < q_len; ++i) {
        const int64_t row = (b * q_heads + h) * q_len + i;
        const int64_t n = std::min<int64_t>(
            i + kv_len - q_len + 1, p.valid_lens[static_cast<size_t>(b)]);
        ASSERT_GT(n, 0);
        const float* v_head =
            p.v.data() + (b * kv_heads + h / group) * kv_len * value_dim;
        for (int64_t c = 0; c < value_dim; ++c) {
          double mean = 0.0;
          for (int64_t j = 0; j < n; ++j) mean += v_head[j * value_dim + c];
          mean /= static_cast<double>(n);
          EXPECT_NEAR(got.out[static_cast<size_t>(row * value_dim + c)], mean,
                      out_tol)
              << "b=" << b << " h=" << h << " i=" << i << " c=" << c;
        }
        for (int64_t j = 0; j < kv_len; ++j) {
          const float w = got.weights[static_cast<size_t>(row * kv_len + j)];
          if (j < n) {
            EXPECT_NEAR(w, 1.0 / static_cast<double>(n), kWeightsTol);
          } else {
            EXPECT_EQ(w, 0.0f);
          }
        }
        const double lse = std::log(static_cast<double>(n));
        EXPECT_NEAR(got.lse[static_cast<size_t>(row)], lse,
                    kLseTol * std::max(1.0, lse));
      }
    }
  }
}

// Rows that see no key, made each way the spec lists, with large finite
// values everywhere else: out and weights exactly 0, lse exactly -inf.
TEST_P(AttentionBackendTest, FullyMaskedRowsAreZeroAndMinusInf) {
  const int64_t batch = 2, q_heads = 2, kv_heads = 1, q_len = 12, kv_len = 20;
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    Problem p = MakeProblem(batch, q_heads, kv_heads, q_len, kv_len, 16, 16,
                            7u + static_cast<uint32_t>(variant), 2, 2, 30);
    p.backend = GetParam();
    qkv_attention_desc& d = p.desc;
    std::vector<bool> row_masked(static_cast<size_t>(batch * q_heads * q_len));
    if (variant == 0) {  // valid length 0 per batch
      d.mask = QKV_MASK_VALID_LENS;
      p.valid_lens = {0, 0};
      for (size_t r = 0; r < row_masked.size(); ++r) row_masked[r] = true;
    } else if (variant == 1) {  // valid length 0 for some queries
      d.mask = QKV_MASK_VALID_LENS;
      d.valid_lens_per_query = 1;
      for (int64_t r = 0; r < batch * q_len; ++r) {
        p.valid_lens.push_back(r % 2 == 0 ? 0
                                          : static_cast<int32_t>(r % 7 + 1));
      }
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t h = 0; h < q_heads; ++h) {
          for (int64_t i = 0; i < q_len; ++i) {
            row_masked[static_cast<size_t>((b * q_heads + h) * q_len + i)] =
                p.valid_lens[static_cast<size_t>(b * q_len + i)] == 0;
          }
        }
      }
    } else if (variant == 2) {  // bias of -inf on whole rows
      d.mask = QKV_MASK_BIAS;
      d.bias_head_stride = q_len * kv_len;
      p.bias.assign(static_cast<size_t>(q_heads * q_len * kv_len), 1.5f);
      for (int64_t h = 0; h < q_heads; ++h) {
        for (int64_t i = 0; i < q_len; ++i) {
          if ((i + h) % 3 != 0) continue;
          for (int64_t j = 0; j < kv_len; ++j) {
            p.bias[static_cast<size_t>((h * q_len + i) * kv_len + j)] = -kInf;
          }
          for (int64_t b = 0; b < batch; ++b) {
            row_masked[static_cast<size_t>((b * q_heads + h) * q_len + i)] =
                true;
          }
        }
      }
    } else {  // causal with kv_len < q_len, plus a valid length cutting more
      p = MakeProblem(batch, q_heads, kv_heads, q_len, 5, 16, 16, 8u, 2, 2, 30);
      p.backend = GetParam();
      p.desc.mask = QKV_MASK_CAUSAL | QKV_MASK_VALID_LENS;
      p.valid_lens = {5, 2};
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t h = 0; h < q_heads; ++h) {
          for (int64_t i = 0; i < q_len; ++i) {
            // Sees key 0 iff 0 <= i + 5 - 12 (the valid length is >= 1).
            row_masked[static_cast<size_t>((b * q_heads + h) * q_len + i)] =
                i < 7;
          }
        }
      }
    }
    const qkv_attention_desc bound = p.Bound();
    const Outputs got = RunAttention(p);
    ASSERT_EQ(got.status, QKV_OK) << qkv_status_string(got.status);
    for (size_t r = 0; r < row_masked.size(); ++r) {
      const float lse = got.lse[r];
      EXPECT_FALSE(std::isnan(lse)) << "row " << r;
      if (row_masked[r]) {
        EXPECT_TRUE(std::isinf(lse) && lse < 0)
            << "row " << r << " lse " << lse;
      } else {
        EXPECT_TRUE(std::isfinite(lse)) << "row " << r << " lse " << lse;
      }
      for (int64_t c = 0; c < bound.value_dim; ++c) {
        const float o = got.out[r * static_cast<size_t>(bound.value_dim) +
                                static_cast<size_t>(c)];
        EXPECT_FALSE(std::isnan(o));
        if (row_masked[r]) {
          EXPECT_EQ(o, 0.0f) << "row " << r << " c " << c;
        }
      }
      for (int64_t j = 0; j < bound.kv_len; ++j) {
        const float w = got.weights[r * static_cast<size_t>(bound.kv_len) +
                                    static_cast<size_t>(j)];
        EXPECT_FALSE(std::isnan(w));
        if (row_masked[r]) {
          EXPECT_EQ(w, 0.0f) << "row " << r << " j " << j;
        }
      }
    }
    const OracleOutput e =
        OracleAttention(bound, p.q.data(), p.k.data(), p.v.data());
    ExpectMatchesOracle(bound, e, got, p.MaxAbsV());
  }
}

// A key hidden by a -inf bias gets weight exactly 0 and does not move out,
// however large its v and its score would be.
TEST_P(AttentionBackendTest, NegInfBiasHidesKeyCompletely) {
  const int64_t q_len = 5, kv_len = 24, head_dim = 8, value_dim = 8;
  Problem p = MakeProblem(1, 1, 1, q_len, kv_len, head_dim, value_dim, 5u);
  p.backend = GetParam();
  p.desc.mask = QKV_MASK_BIAS;
  p.bias.assign(static_cast<size_t>(q_len * kv_len), 0.0f);
  // Key 10 would dominate (score 80) and carries huge values; the bias hides
  // it from every row.
  for (int64_t c = 0; c < head_dim; ++c) {
    p.k[static_cast<size_t>(10 * head_dim + c)] = 10.0f;
    for (int64_t i = 0; i < q_len; ++i)
      p.q[static_cast<size_t>(i * head_dim + c)] = 1.0f;
  }
  for (int64_t c = 0; c < value_dim; ++c) {
    p.v[static_cast<size_t>(10 * value_dim + c)] = 1e6f;
  }
  for (int64_t i = 0; i < q_len; ++i)
    p.bias[static_cast<size_t>(i * kv_len + 10)] = -kInf;
  const Outputs got = RunAttention(p);
  ASSERT_EQ(got.status, QKV_OK);
  for (int64_t i = 0; i < q_len; ++i) {
    EXPECT_EQ(got.weights[static_cast<size_t>(i * kv_len + 10)], 0.0f);
    for (int64_t c = 0; c < value_dim; ++c) {
      EXPECT_LE(std::fabs(got.out[static_cast<size_t>(i * value_dim + c)]),
                1.0f)
          << "the hidden key leaked into out";
    }
  }
}

// The reference backend serves every score kind; DOT is served everywhere.
TEST_P(AttentionBackendTest, SupportedScores) {
  for (qkv_score score :
       {QKV_SCORE_DOT, QKV_SCORE_GAUSSIAN, QKV_SCORE_ADDITIVE}) {
    Problem p = MakeProblem(1, 2, 1, 3, 5, 4, 4, 3u);
    p.backend = GetParam();
    p.desc.score = score;
    p.desc.additive_hidden = 3;
    p.w_q.assign(12, 0.25f);
    p.w_k.assign(12, -0.5f);
    p.w_v.assign(3, 1.0f);
    const Outputs got = RunAttention(p);
    if (UnsupportedIsAllowed(GetParam(), score)) {
      EXPECT_TRUE(got.status == QKV_OK || got.status == QKV_ERR_UNSUPPORTED)
          << got.status;
    } else {
      EXPECT_EQ(got.status, QKV_OK) << "score " << score;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, AttentionBackendTest,
                         ::testing::ValuesIn(BackendNames()),
                         BackendTestName);

// The default backend (desc.backend NULL or "") is backend 0, bit for bit.
TEST(AttentionDefaultBackendTest, NullAndEmptyNameAreBackendZero) {
  Problem p = MakeProblem(2, 4, 2, 17, 33, 32, 24, 11u);
  p.desc.mask = QKV_MASK_CAUSAL;
  const Outputs by_null = RunAttention(p);
  ASSERT_EQ(by_null.status, QKV_OK);
  p.backend = qkv_backend_name(0);
  const Outputs by_name = RunAttention(p);
  ASSERT_EQ(by_name.status, QKV_OK);
  qkv_attention_desc d = p.Bound();
  d.backend = "";
  const Outputs by_empty = RunAttention(d, p.q.data(), p.k.data(), p.v.data());
  ASSERT_EQ(by_empty.status, QKV_OK);
  EXPECT_TRUE(BitwiseEqual(by_null.out, by_name.out));
  EXPECT_TRUE(BitwiseEqual(by_null.weights, by_name.weights));
  EXPECT_TRUE(BitwiseEqual(by_null.lse, by_name.lse));
  EXPECT_TRUE(BitwiseEqual(by_null.out, by_empty.out));
}

// Sanity of the case list itself: unique names.
TEST(AttentionCaseListTest, NamesAreUnique) {
  std::set<std::string> names;
  for (const Case& c : AllCases()) {
    EXPECT_TRUE(names.insert(c.Name()).second) << c.Name();
  }
}

}  // namespace
}  // namespace qkv_test
