// Every engine against every other: on 50 random shapes (masks, GQA, score
// kinds, weights and lse), each pair of backends this CPU runs agrees within
// twice the accuracy bound (1e-4 * max|v| on out, 4e-5 on weights), and each
// backend is bitwise deterministic on its own: two runs, and 1, 2 and 3
// workers of a real thread pool, give the same bits as the serial call.
// The engines are independent implementations (reference, Highway, xsimd),
// so this keeps each of them honest beyond what the oracle tests cover.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "qkv/qkv.h"
#include "support/thread_pool.h"
#include "test_util.h"

namespace qkv_test {
namespace {

constexpr int kNumCases = 50;
constexpr float kOutTol = 1e-4f;     // times max|v|: 2 x the 5e-5 bound
constexpr float kWeightTol = 4e-5f;  // 2 x the 2e-5 bound

struct CrossCase {
  Problem problem;
  bool weights, lse;
  std::string summary;
};

int64_t Pick(std::mt19937* rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(*rng);
}
bool Coin(std::mt19937* rng, double p) {
  return std::bernoulli_distribution(p)(*rng);
}

// Case `index`: shapes from the decoding row path (<= 4 rows per kv head) to
// several tiles, lengths across block (64) and vector-width edges.
CrossCase MakeCase(int index) {
  std::mt19937 rng(SeedFromName("cross_engine/" + std::to_string(index)));
  const int64_t batch = Pick(&rng, 1, 2);
  const int64_t kv_heads = Pick(&rng, 1, 3);
  int64_t group = Pick(&rng, 1, 4);
  int64_t q_len = Coin(&rng, 0.25) ? Pick(&rng, 1, 2) : Pick(&rng, 1, 70);
  int64_t kv_len = Coin(&rng, 0.2) ? Pick(&rng, 1, 17) : Pick(&rng, 1, 200);
  if (index % 8 == 5) {  // long decode: the row path's key splits (512 keys)
    group = Pick(&rng, 1, 2);
    q_len = Pick(&rng, 1, 2);
    kv_len = Pick(&rng, 513, 1600);
  }
  const int64_t head_dim = Pick(&rng, 1, 72);
  const int64_t value_dim = Pick(&rng, 1, 72);
  const float mag = Coin(&rng, 0.3) ? 4.0f : 1.0f;

  CrossCase c;
  c.problem = MakeProblem(batch, group * kv_heads, kv_heads, q_len, kv_len,
                          head_dim, value_dim,
                          SeedFromName("cross_engine_data/" +
                                       std::to_string(index)),
                          mag, mag, 1.0f + static_cast<float>(index % 3));
  Problem& p = c.problem;
  qkv_attention_desc& d = p.desc;

  const int kind = static_cast<int>(Pick(&rng, 0, 2));
  d.score = static_cast<qkv_score>(kind);
  if (kind == QKV_SCORE_GAUSSIAN) d.scale = 0.5f / std::sqrt(float(head_dim));
  if (Coin(&rng, 0.08)) d.scale = 0.0f;  // uniform weights
  if (kind == QKV_SCORE_ADDITIVE) {
    d.additive_hidden = Pick(&rng, 1, 24);
    const size_t wq = static_cast<size_t>(d.additive_hidden * head_dim);
    p.w_q.resize(wq);
    p.w_k.resize(wq);
    p.w_v.resize(static_cast<size_t>(d.additive_hidden));
    const float s = 1.0f / std::sqrt(float(head_dim));
    FillUniform(&p.w_q, &rng, -s, s);
    FillUniform(&p.w_k, &rng, -s, s);
    FillUniform(&p.w_v, &rng, -1.0f, 1.0f);
  }

  if (Coin(&rng, 0.4)) d.mask |= QKV_MASK_CAUSAL;
  if (Coin(&rng, 0.35)) {
    d.mask |= QKV_MASK_VALID_LENS;
    d.valid_lens_per_query = Coin(&rng, 0.5) ? 1 : 0;
    p.valid_lens.resize(
        static_cast<size_t>(d.valid_lens_per_query ? batch * q_len : batch));
    for (int32_t& vl : p.valid_lens) {
      vl = static_cast<int32_t>(Coin(&rng, 0.1) ? 0 : Pick(&rng, 0, kv_len));
    }
  }
  if (Coin(&rng, 0.35)) {
    d.mask |= QKV_MASK_BIAS;
    const int64_t row = q_len * kv_len;
    d.bias_head_stride = Coin(&rng, 0.5) ? row : 0;
    d.bias_batch_stride = Coin(&rng, 0.5) ? d.q_heads * row : 0;
    p.bias.resize(static_cast<size_t>(batch * d.q_heads * row));
    FillUniform(&p.bias, &rng, -2.0f, 2.0f);
    for (float& b : p.bias) {
      if (Coin(&rng, 0.1)) b = -INFINITY;
    }
  }
  c.weights = Coin(&rng, 0.6);
  c.lse = Coin(&rng, 0.6);
  c.summary = "B=" + std::to_string(batch) + " Hq=" + std::to_string(d.q_heads) +
              " Hkv=" + std::to_string(kv_heads) + " Lq=" + std::to_string(q_len) +
              " Lk=" + std::to_string(kv_len) + " D=" + std::to_string(head_dim) +
              " Dv=" + std::to_string(value_dim) + " score=" +
              std::to_string(kind) + " mask=" + std::to_string(d.mask) +
              (c.weights ? " +weights" : "") + (c.lse ? " +lse" : "");
  return c;
}

Outputs RunCase(const CrossCase& c, const std::string& backend,
                ThreadPool* pool) {
  Problem p = c.problem;
  p.backend = backend;
  qkv_attention_desc d = p.Bound();
  if (pool != nullptr) {
    d.parallel_for = &ThreadPool::ParallelFor;
    d.parallel_ctx = pool;
    d.num_workers = pool->num_workers();
  }
  RunOptions opt;
  opt.weights = c.weights;
  opt.lse = c.lse;
  opt.check_short_workspace = false;
  return RunAttention(d, p.q.data(), p.k.data(), p.v.data(), opt);
}

// Largest |a - b|, with equal infinities (and equal NaNs) counting as 0 and
// any other non-finite mismatch as +inf.
float MaxDiff(const std::vector<float>& a, const std::vector<float>& b,
              size_t* where) {
  float worst = 0.0f;
  *where = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    float diff;
    if (std::isnan(a[i]) || std::isnan(b[i])) {
      diff = std::isnan(a[i]) && std::isnan(b[i]) ? 0.0f : INFINITY;
    } else if (std::isinf(a[i]) || std::isinf(b[i])) {
      diff = a[i] == b[i] ? 0.0f : INFINITY;
    } else {
      diff = std::fabs(a[i] - b[i]);
    }
    if (diff > worst) {
      worst = diff;
      *where = i;
    }
  }
  return worst;
}

class CrossEngineTest : public ::testing::TestWithParam<int> {};

TEST_P(CrossEngineTest, PairsAgreeAndEachIsDeterministic) {
  const CrossCase c = MakeCase(GetParam());
  SCOPED_TRACE(c.summary);
  const std::vector<std::string> backends = BackendNames();
  ASSERT_GE(backends.size(), 1u);

  std::vector<Outputs> results;
  for (const std::string& name : backends) {
    SCOPED_TRACE(name);
    Outputs first = RunCase(c, name, nullptr);
    ASSERT_EQ(first.status, QKV_OK);
    const Outputs again = RunCase(c, name, nullptr);
    EXPECT_TRUE(BitwiseEqual(first.out, again.out)) << "out differs between runs";
    EXPECT_TRUE(BitwiseEqual(first.weights, again.weights)) << "weights differ";
    EXPECT_TRUE(BitwiseEqual(first.lse, again.lse)) << "lse differs";
    for (size_t workers = 1; workers <= 3; ++workers) {
      ThreadPool pool(workers);
      const Outputs par = RunCase(c, name, &pool);
      ASSERT_EQ(par.status, QKV_OK);
      EXPECT_TRUE(BitwiseEqual(first.out, par.out))
          << "out with " << workers << " workers differs from serial";
      EXPECT_TRUE(BitwiseEqual(first.weights, par.weights))
          << "weights with " << workers << " workers differ from serial";
      EXPECT_TRUE(BitwiseEqual(first.lse, par.lse))
          << "lse with " << workers << " workers differs from serial";
    }
    results.push_back(std::move(first));
  }

  const float out_tol = kOutTol * std::max(c.problem.MaxAbsV(), 1e-30f);
  for (size_t a = 0; a < backends.size(); ++a) {
    for (size_t b = a + 1; b < backends.size(); ++b) {
      SCOPED_TRACE(backends[a] + " vs " + backends[b]);
      size_t at;
      const float d_out = MaxDiff(results[a].out, results[b].out, &at);
      EXPECT_LE(d_out, out_tol) << "out[" << at << "]: " << results[a].out[at]
                                << " vs " << results[b].out[at];
      if (c.weights) {
        const float d_w = MaxDiff(results[a].weights, results[b].weights, &at);
        EXPECT_LE(d_w, kWeightTol)
            << "weights[" << at << "]: " << results[a].weights[at] << " vs "
            << results[b].weights[at];
      }
      if (c.lse) {
        for (size_t i = 0; i < results[a].lse.size(); ++i) {
          const float x = results[a].lse[i], y = results[b].lse[i];
          if (std::isinf(x) || std::isinf(y)) {
            EXPECT_EQ(x, y) << "lse[" << i << "]";
          } else {
            // lse carries the score's magnitude: relative to it.
            EXPECT_LE(std::fabs(x - y), kOutTol * (1.0f + std::fabs(x)))
                << "lse[" << i << "]: " << x << " vs " << y;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Random, CrossEngineTest,
                         ::testing::Range(0, kNumCases));

}  // namespace
}  // namespace qkv_test
