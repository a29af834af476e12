// The attention family of the seeds, on every backend: the limit cases
// (one-hot weights are a database lookup, scale 0 is average pooling, the
// identity heatmap), weights as a probability distribution, the Gaussian
// score where q is nearly k, and the d2l exercise: with a(q, k) = q.k and
// k_i = v_i, d out / d q is the covariance of the keys under the weights.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "oracle.h"
#include "test_util.h"

namespace qkv_test {
namespace {

class FamilyTest : public ::testing::TestWithParam<std::string> {
 protected:
  const char* backend() const { return GetParam().c_str(); }
};

// Keys are well separated points; a query equal to key i with a sharp score
// gives weight exactly 1 on key i and exactly 0 elsewhere, so out is v_i to
// the bit: attention is a database lookup.
TEST_P(FamilyTest, SharpScoresAreAnExactLookup) {
  const int64_t n = 37, d = 8, dv = 19;
  for (qkv_score score : {QKV_SCORE_DOT, QKV_SCORE_GAUSSIAN}) {
    Problem p = MakeProblem(1, 1, 1, n, n, d, dv, 11);
    // Key j: a distinct sign pattern scaled to unit-ish norm.
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t t = 0; t < d; ++t) {
        p.k[j * d + t] = ((j + 1) >> (t % 6)) & 1 ? 1.0f : -1.0f;
        if (t == d - 1) p.k[j * d + t] = static_cast<float>(j) / n;
      }
    }
    // Query i is key (n - 1 - i): the lookup goes somewhere non-trivial.
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t t = 0; t < d; ++t) p.q[i * d + t] = p.k[(n - 1 - i) * d + t];
    }
    p.desc.score = score;
    p.desc.scale = 1e4f;  // the runner-up scores at least 1e4 lower: exp -> 0
    p.backend = backend();
    const Outputs r = RunAttention(p);
    ASSERT_EQ(r.status, QKV_OK);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t hit = n - 1 - i;
      for (int64_t j = 0; j < n; ++j) {
        ASSERT_EQ(r.weights[i * n + j], j == hit ? 1.0f : 0.0f)
            << "score " << score << " query " << i << " key " << j;
      }
      for (int64_t c = 0; c < dv; ++c) {
        ASSERT_EQ(r.out[i * dv + c], p.v[hit * dv + c]) << "query " << i;
      }
    }
  }
}

// The seeds' identity heatmap: each query matches its own key.
TEST_P(FamilyTest, IdentityAttentionGivesTheIdentityHeatmap) {
  const int64_t n = 10;
  Problem p = MakeProblem(1, 1, 1, n, n, n, n, 3);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t t = 0; t < n; ++t) {
      p.q[i * n + t] = p.k[i * n + t] = p.v[i * n + t] = i == t ? 1.0f : 0.0f;
    }
  }
  p.desc.scale = 200.0f;
  p.backend = backend();
  const Outputs r = RunAttention(p);
  ASSERT_EQ(r.status, QKV_OK);
  for (int64_t i = 0; i < n * n; ++i) {
    EXPECT_EQ(r.weights[i], i % (n + 1) == 0 ? 1.0f : 0.0f) << i;
    EXPECT_EQ(r.out[i], i % (n + 1) == 0 ? 1.0f : 0.0f) << i;
  }
}

// scale 0: every visible key gets weight 1/n and out is the mean of the
// visible values (average pooling), for DOT and GAUSSIAN and with masks.
TEST_P(FamilyTest, ScaleZeroIsAveragePooling) {
  const int64_t lq = 5, lk = 23, d = 7, dv = 9;
  for (qkv_score score : {QKV_SCORE_DOT, QKV_SCORE_GAUSSIAN}) {
    Problem p = MakeProblem(2, 2, 1, lq, lk, d, dv, 5, 3.0f, 3.0f, 2.0f);
    p.desc.score = score;
    p.desc.scale = 0.0f;
    p.desc.mask = QKV_MASK_VALID_LENS | QKV_MASK_CAUSAL;
    p.valid_lens = {lk, 13};
    p.backend = backend();
    const Outputs r = RunAttention(p);
    ASSERT_EQ(r.status, QKV_OK);
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t i = 0; i < lq; ++i) {
          int64_t visible = i + lk - lq + 1;
          if (p.valid_lens[b] < visible) visible = p.valid_lens[b];
          const int64_t row = (b * 2 + h) * lq + i;
          for (int64_t j = 0; j < lk; ++j) {
            const float want = j < visible ? 1.0f / visible : 0.0f;
            EXPECT_FLOAT_EQ(r.weights[row * lk + j], want) << row << "," << j;
          }
          for (int64_t c = 0; c < dv; ++c) {
            double mean = 0.0;
            for (int64_t j = 0; j < visible; ++j) {
              mean += p.v[(b * lk + j) * dv + c];
            }
            mean /= visible;
            EXPECT_NEAR(r.out[row * dv + c], mean, 5e-5 * 2.0) << row;
          }
        }
      }
    }
  }
}

// Weights are a probability distribution over the visible keys, for every
// score kind, with masks and GQA.
TEST_P(FamilyTest, WeightsAreNonNegativeAndSumToOne) {
  const int64_t lq = 9, lk = 70, d = 12, dv = 5, hidden = 6;
  for (qkv_score score :
       {QKV_SCORE_DOT, QKV_SCORE_GAUSSIAN, QKV_SCORE_ADDITIVE}) {
    Problem p = MakeProblem(2, 4, 2, lq, lk, d, dv, 21 + score, 2.0f, 2.0f);
    p.desc.score = score;
    p.desc.mask = QKV_MASK_CAUSAL | QKV_MASK_VALID_LENS;
    p.valid_lens = {lk, 40};
    if (score == QKV_SCORE_ADDITIVE) {
      std::mt19937 rng(99);
      p.w_q.resize(hidden * d);
      p.w_k.resize(hidden * d);
      p.w_v.resize(hidden);
      FillUniform(&p.w_q, &rng, -1.0f, 1.0f);
      FillUniform(&p.w_k, &rng, -1.0f, 1.0f);
      FillUniform(&p.w_v, &rng, -2.0f, 2.0f);
      p.desc.additive_hidden = hidden;
    }
    p.backend = backend();
    const Outputs r = RunAttention(p);
    ASSERT_EQ(r.status, QKV_OK) << "score " << score;
    for (int64_t row = 0; row < 2 * 4 * lq; ++row) {
      double sum = 0.0;
      for (int64_t j = 0; j < lk; ++j) {
        const float w = r.weights[row * lk + j];
        ASSERT_GE(w, 0.0f);
        ASSERT_LE(w, 1.0f);
        sum += w;
      }
      EXPECT_NEAR(sum, 1.0, 1e-5) << "score " << score << " row " << row;
    }
  }
}

// Gaussian scores of queries very close to far-from-origin keys: the
// expansion |q|^2 + |k|^2 - 2 q.k would lose every digit here (|q|^2 ~ 8e4,
// |q - k|^2 ~ 1e-3); qkv must still meet the accuracy bound.
TEST_P(FamilyTest, GaussianNearlyEqualQueryAndKey) {
  const int64_t lq = 6, lk = 33, d = 8, dv = 4;
  Problem p = MakeProblem(1, 1, 1, lq, lk, d, dv, 8);
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> tiny(-0.01f, 0.01f);
  for (int64_t t = 0; t < d; ++t) {
    const float centre = 100.0f + 3.0f * t;
    for (int64_t j = 0; j < lk; ++j) p.k[j * d + t] = centre + tiny(rng);
    for (int64_t i = 0; i < lq; ++i) p.q[i * d + t] = centre + tiny(rng);
  }
  p.desc.score = QKV_SCORE_GAUSSIAN;
  p.desc.scale = 3000.0f;  // scores spread over about -0.1 .. -10
  p.backend = backend();
  const Outputs r = RunAttention(p);
  ASSERT_EQ(r.status, QKV_OK);
  const qkv_attention_desc bound = p.Bound();
  const OracleOutput want =
      OracleAttention(bound, p.q.data(), p.k.data(), p.v.data());
  double spread = 0.0;
  for (int64_t i = 0; i < lq * lk; ++i) {
    EXPECT_NEAR(r.weights[i], want.weights[i], 2e-5) << i;
    spread = std::fmax(spread, want.weights[i]);
  }
  EXPECT_LT(spread, 0.9) << "the case must not degenerate to a lookup";
  EXPECT_GT(spread, 2.0 / lk) << "nor to uniform weights";
  for (int64_t i = 0; i < lq * dv; ++i) {
    EXPECT_NEAR(r.out[i], want.out[i], 5e-5 * p.MaxAbsV()) << i;
  }
}

// The d2l exercise. With s_i = q . k_i (scale 1) and v_i = k_i,
// out(q) = sum_i alpha_i(q) k_i and d out / d q = sum_i alpha_i k_i k_i^T -
// out out^T: the covariance of the keys under the attention distribution.
// Central finite differences through the C ABI against the covariance built
// from the double oracle's weights.
TEST_P(FamilyTest, JacobianIsTheCovarianceOfTheKeys) {
  const int64_t n = 12, d = 5;
  Problem p = MakeProblem(1, 1, 1, 1, n, d, d, 17, 1.0f, 1.0f);
  p.v = p.k;
  p.desc.scale = 1.0f;
  p.backend = backend();
  const qkv_attention_desc bound = p.Bound();
  const OracleOutput at = OracleAttention(bound, p.q.data(), p.k.data(),
                                          p.v.data());
  std::vector<double> mean(d, 0.0), cov(d * d, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t a = 0; a < d; ++a) mean[a] += at.weights[i] * p.k[i * d + a];
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t a = 0; a < d; ++a) {
      for (int64_t c = 0; c < d; ++c) {
        cov[a * d + c] += at.weights[i] * (p.k[i * d + a] - mean[a]) *
                          (p.k[i * d + c] - mean[c]);
      }
    }
  }
  const float h = 1e-2f;
  for (int64_t c = 0; c < d; ++c) {  // column c: d out / d q_c
    Problem plus = p, minus = p;
    plus.q[c] += h;
    minus.q[c] -= h;
    const Outputs rp = RunAttention(plus);
    const Outputs rm = RunAttention(minus);
    ASSERT_EQ(rp.status, QKV_OK);
    ASSERT_EQ(rm.status, QKV_OK);
    const double step = static_cast<double>(plus.q[c]) - minus.q[c];
    for (int64_t a = 0; a < d; ++a) {
      const double fd = (static_cast<double>(rp.out[a]) - rm.out[a]) / step;
      // Truncation O(h^2) plus f32 rounding of out over 2h.
      EXPECT_NEAR(fd, cov[a * d + c], 2e-4) << "d out_" << a << " / d q_" << c;
    }
  }
}

// Decoding over long caches: the SIMD engines split the keys of a (batch,
// kv head) with few query rows into chunks of 512 that run as separate
// tasks and merge their partial softmax states (flash-decoding). Masks that
// end inside, at and before a chunk boundary, and a chunk that sees no key.
TEST_P(FamilyTest, LongDecodeMatchesTheOracle) {
  const int64_t lk = 1537, d = 40, dv = 24;
  struct Case {
    int64_t q_len, q_heads, kv_heads;
    uint32_t mask;
  };
  for (const Case& c : {Case{1, 2, 2, QKV_MASK_NONE},
                        Case{1, 4, 1, QKV_MASK_VALID_LENS},
                        Case{2, 2, 1, QKV_MASK_CAUSAL | QKV_MASK_VALID_LENS},
                        Case{3, 1, 1, QKV_MASK_BIAS | QKV_MASK_CAUSAL}}) {
    Problem p = MakeProblem(2, c.q_heads, c.kv_heads, c.q_len, lk, d, dv,
                            31 + c.mask, 1.0f, 1.0f, 3.0f);
    p.desc.mask = c.mask;
    if (c.mask & QKV_MASK_VALID_LENS) p.valid_lens = {512, 1025};
    if (c.mask & QKV_MASK_BIAS) {
      std::mt19937 rng(5);
      p.bias.resize(static_cast<size_t>(c.q_len * lk));
      FillUniform(&p.bias, &rng, -2.0f, 2.0f);
      for (int64_t j = 600; j < 1100; ++j) p.bias[j] = -INFINITY;  // row 0
      p.desc.bias_batch_stride = 0;
      p.desc.bias_head_stride = 0;
    }
    p.backend = backend();
    const Outputs r = RunAttention(p);
    ASSERT_EQ(r.status, QKV_OK);
    const qkv_attention_desc bound = p.Bound();
    const OracleOutput want =
        OracleAttention(bound, p.q.data(), p.k.data(), p.v.data());
    for (size_t i = 0; i < r.out.size(); ++i) {
      ASSERT_NEAR(r.out[i], want.out[i], 5e-5 * p.MaxAbsV()) << "mask " << c.mask;
    }
    for (size_t i = 0; i < r.weights.size(); ++i) {
      ASSERT_NEAR(r.weights[i], want.weights[i], 2e-5) << "mask " << c.mask;
    }
    for (size_t i = 0; i < r.lse.size(); ++i) {
      ASSERT_NEAR(r.lse[i], want.lse[i], 1e-5 * std::fmax(1.0, std::fabs(want.lse[i])));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, FamilyTest,
                         ::testing::ValuesIn(BackendNames()), BackendTestName);

}  // namespace
}  // namespace qkv_test

namespace qkv_test {
namespace {

// QKV_BACKEND, read once per process, makes the named backend the default
// (ctest runs this a second time with QKV_BACKEND=reference).
TEST(ProcessBackend, EnvironmentChoosesTheDefault) {
  const char* wanted = std::getenv("QKV_BACKEND");
  ASSERT_NE(qkv_backend(), nullptr);
  EXPECT_STREQ(qkv_backend(), qkv_backend_name(0));
  if (wanted == nullptr) GTEST_SKIP() << "QKV_BACKEND not set";
  EXPECT_STREQ(qkv_backend(), wanted);
  // A call without desc.backend runs on it: same bits as forcing it.
  Problem p = MakeProblem(1, 2, 1, 9, 40, 16, 8, 77);
  p.desc.score = QKV_SCORE_ADDITIVE;  // even where another engine is preferred
  std::mt19937 rng(1);
  p.w_q.resize(8 * 16);
  p.w_k.resize(8 * 16);
  p.w_v.resize(8);
  FillUniform(&p.w_q, &rng, -1.0f, 1.0f);
  FillUniform(&p.w_k, &rng, -1.0f, 1.0f);
  FillUniform(&p.w_v, &rng, -1.0f, 1.0f);
  p.desc.additive_hidden = 8;
  const Outputs by_default = RunAttention(p);
  p.backend = wanted;
  const Outputs forced = RunAttention(p);
  ASSERT_EQ(by_default.status, QKV_OK);
  EXPECT_TRUE(BitwiseEqual(by_default.out, forced.out));
}

}  // namespace
}  // namespace qkv_test
