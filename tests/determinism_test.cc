// Output is bitwise identical for every num_workers and every schedule, and
// with parallel_for NULL: a real std::thread pool of 1..8 workers and a
// "shuffled" pool that runs the tasks in a random order with random worker
// indices, on every backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "qkv/qkv.h"
#include "support/thread_pool.h"
#include "test_util.h"

namespace qkv_test {
namespace {

struct DetCase {
  std::string name;
  int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim, value_dim;
  qkv_score score;
  bool causal;
  bool lens_and_bias;
};

void PrintTo(const DetCase& c, std::ostream* os) { *os << c.name; }

std::vector<DetCase> DetCases() {
  return {
      {"causal_gqa4", 2, 8, 2, 65, 129, 64, 64, QKV_SCORE_DOT, true, false},
      {"decode_kv1000", 1, 8, 1, 1, 1000, 128, 128, QKV_SCORE_DOT, false,
       false},
      {"decode_causal_kv1000", 2, 2, 2, 1, 1000, 64, 80, QKV_SCORE_DOT, true,
       true},
      {"decode_gqa16_kv1300", 1, 16, 1, 1, 1300, 64, 64, QKV_SCORE_DOT, true,
       true},
      {"decode_gqa4_q3_kv1100", 2, 8, 2, 3, 1100, 32, 48, QKV_SCORE_DOT, true,
       true},
      {"gaussian_decode_gqa6", 1, 6, 1, 1, 700, 16, 16, QKV_SCORE_GAUSSIAN,
       false, false},
      {"long_causal_masks", 2, 4, 2, 33, 1000, 64, 32, QKV_SCORE_DOT, true,
       true},
      {"square300", 1, 2, 1, 300, 300, 32, 32, QKV_SCORE_DOT, false, false},
      {"odd_sizes", 3, 3, 1, 17, 77, 33, 15, QKV_SCORE_DOT, true, true},
      {"gaussian", 2, 4, 4, 40, 200, 16, 16, QKV_SCORE_GAUSSIAN, true, false},
      {"additive", 1, 2, 1, 17, 120, 16, 16, QKV_SCORE_ADDITIVE, false, true},
  };
}

Problem BuildDetProblem(const DetCase& c, const std::string& backend) {
  const uint32_t seed = SeedFromName(c.name);
  Problem p = MakeProblem(c.batch, c.q_heads, c.kv_heads, c.q_len, c.kv_len,
                          c.head_dim, c.value_dim, seed);
  p.backend = backend;
  qkv_attention_desc& d = p.desc;
  d.score = c.score;
  if (c.causal) d.mask |= QKV_MASK_CAUSAL;
  std::mt19937 rng(seed + 1);
  if (c.lens_and_bias) {
    d.mask |= QKV_MASK_VALID_LENS | QKV_MASK_BIAS;
    d.valid_lens_per_query = 1;
    std::uniform_int_distribution<int32_t> len(0,
                                               static_cast<int32_t>(c.kv_len));
    for (int64_t r = 0; r < c.batch * c.q_len; ++r) {
      p.valid_lens.push_back(r % 4 == 1 ? static_cast<int32_t>(c.kv_len)
                                        : len(rng));
    }
    d.bias_head_stride = 0;
    d.bias_batch_stride = c.q_len * c.kv_len;
    p.bias.resize(static_cast<size_t>(c.batch * c.q_len * c.kv_len));
    FillUniform(&p.bias, &rng, -2.0f, 2.0f);
    for (size_t i = 0; i < p.bias.size(); i += 7) {
      p.bias[i] = -std::numeric_limits<float>::infinity();
    }
  }
  if (c.score == QKV_SCORE_ADDITIVE) {
    d.additive_hidden = 16;
    p.w_q.resize(static_cast<size_t>(16 * c.head_dim));
    p.w_k.resize(static_cast<size_t>(16 * c.head_dim));
    p.w_v.resize(16);
    FillUniform(&p.w_q, &rng, -0.5f, 0.5f);
    FillUniform(&p.w_k, &rng, -0.5f, 0.5f);
    FillUniform(&p.w_v, &rng, -1.0f, 1.0f);
  }
  return p;
}

void ExpectSameBits(const Outputs& base, const Outputs& got,
                    const std::string& what) {
  ASSERT_EQ(got.status, QKV_OK)
      << what << ": " << qkv_status_string(got.status);
  const std::pair<const char*, std::pair<const std::vector<float>*,
                                         const std::vector<float>*>>
      bufs[] = {{"out", {&base.out, &got.out}},
                {"weights", {&base.weights, &got.weights}},
                {"lse", {&base.lse, &got.lse}}};
  for (const auto& b : bufs) {
    const std::vector<float>& x = *b.second.first;
    const std::vector<float>& y = *b.second.second;
    ASSERT_EQ(x.size(), y.size());
    if (BitwiseEqual(x, y)) continue;
    size_t first = 0;
    while (first < x.size() &&
           std::memcmp(&x[first], &y[first], sizeof(float)) == 0) {
      ++first;
    }
    ADD_FAILURE() << what << ": " << b.first << " differs from the "
                  << "parallel_for NULL run, first at index " << first << " ("
                  << y[first] << " vs " << x[first] << ")";
  }
}

class DeterminismTest
    : public ::testing::TestWithParam<std::tuple<std::string, DetCase>> {};

TEST_P(DeterminismTest, BitwiseIdenticalForEveryPoolAndSchedule) {
  const std::string& backend = std::get<0>(GetParam());
  const DetCase& c = std::get<1>(GetParam());
  const Problem p = BuildDetProblem(c, backend);
  const qkv_attention_desc serial = p.Bound();

  const Outputs base = RunAttention(serial, p.q.data(), p.k.data(), p.v.data());
  if (base.status == QKV_ERR_UNSUPPORTED && backend != "reference" &&
      c.score != QKV_SCORE_DOT) {
    GTEST_SKIP() << backend << " returns QKV_ERR_UNSUPPORTED for score "
                 << c.score;
  }
  ASSERT_EQ(base.status, QKV_OK) << qkv_status_string(base.status);

  for (size_t workers = 1; workers <= 8; ++workers) {
    ThreadPool pool(workers);
    CountingPool counting{&pool};
    const qkv_attention_desc d = OnPool(serial, &counting, workers);
    for (int rep = 0; rep < 2; ++rep) {
      // Run 0 also checks the 1-byte-short workspace (it grows with the
      // workers); run 1 is a single call, so it counts parallel_for calls.
      RunOptions opt;
      opt.check_short_workspace = rep == 0;
      counting.calls = 0;
      const Outputs got =
          RunAttention(d, p.q.data(), p.k.data(), p.v.data(), opt);
      if (rep == 1) {
        EXPECT_LE(counting.calls, 1)
            << "parallel_for called more than once per call";
      }
      ExpectSameBits(base, got,
                     "ThreadPool(" + std::to_string(workers) + ") run " +
                         std::to_string(rep));
    }
  }

  for (size_t workers :
       {size_t{1}, size_t{2}, size_t{3}, size_t{8}, size_t{64}}) {
    for (uint32_t seed : {1u, 2u}) {
      ShuffledPool shuffled{std::mt19937(seed * 7919u + workers), workers};
      qkv_attention_desc d = serial;
      d.parallel_for = &ShuffledPool::ParallelFor;
      d.parallel_ctx = &shuffled;
      d.num_workers = workers;
      RunOptions opt;
      opt.check_short_workspace = false;
      const Outputs got =
          RunAttention(d, p.q.data(), p.k.data(), p.v.data(), opt);
      EXPECT_LE(shuffled.calls, 1)
          << "parallel_for called more than once per call";
      ExpectSameBits(base, got,
                     "shuffled pool of " + std::to_string(workers) +
                         " workers, seed " + std::to_string(seed));
    }
  }
}

std::string DetParamName(
    const ::testing::TestParamInfo<std::tuple<std::string, DetCase>>& info) {
  return std::get<1>(info.param).name + "_" +
         SanitizeForTestName(std::get<0>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Backends, DeterminismTest,
                         ::testing::Combine(::testing::ValuesIn(BackendNames()),
                                            ::testing::ValuesIn(DetCases())),
                         DetParamName);

// Decoding an int8 cache from memory (K and V past 8 MiB, one row per kv
// head): where the engine pipelines it (src/pipeline/flash-inl.h,
// SplitsPerTask), a task takes several key splits of a kv head, fewer the
// more workers there are. Every pool size and schedule gives the bits of
// the serial call, windows, causal rows, sinks, weights and lse included.
TEST(DeterminismInt8Test, StreamedDecodeIdenticalForEveryPool) {
  const int64_t batch = 2, heads = 3, kv_len = 9000, d = 128, dv = 96;
  Problem p = MakeProblem(batch, heads, heads, 1, kv_len, d, dv, 4242u);
  const int64_t rows = batch * heads * kv_len;
  std::vector<int8_t> k8(static_cast<size_t>(rows * d));
  std::vector<int8_t> v8(static_cast<size_t>(rows * dv));
  std::vector<float> ks(static_cast<size_t>(rows)), vs(ks.size());
  ASSERT_EQ(qkv_quantize_rows(QKV_DTYPE_I8, rows, d, p.k.data(), d,
                              k8.data(), d, ks.data()),
            QKV_OK);
  ASSERT_EQ(qkv_quantize_rows(QKV_DTYPE_I8, rows, dv, p.v.data(), dv,
                              v8.data(), dv, vs.data()),
            QKV_OK);
  const std::vector<int32_t> q_pos = {8999, 5000};
  std::vector<float> sinks = {-1.0f, 0.5f, 2.0f};
  qkv_attention_desc serial = p.desc;
  serial.kv_dtype = QKV_DTYPE_I8;
  serial.k_scales = ks.data();
  serial.v_scales = vs.data();
  serial.mask |= QKV_MASK_CAUSAL | QKV_MASK_WINDOW;
  serial.window_left = 6000;
  serial.window_right = -1;
  serial.q_pos = q_pos.data();
  serial.sinks = sinks.data();
  for (const std::string& backend : BackendNames()) {
    SCOPED_TRACE(backend);
    serial.backend = backend.c_str();
    auto run = [&](const qkv_attention_desc& desc) {
      Outputs r;
      r.out.assign(static_cast<size_t>(NumOut(desc)), 0.0f);
      r.weights.assign(static_cast<size_t>(NumWeights(desc)), 0.0f);
      r.lse.assign(static_cast<size_t>(NumLse(desc)), 0.0f);
      std::vector<unsigned char> ws(qkv_attention_workspace_size(&desc));
      r.status = qkv_attention(&desc, p.q.data(), k8.data(), v8.data(),
                               r.out.data(), r.weights.data(), r.lse.data(),
                               ws.data(), ws.size());
      return r;
    };
    const Outputs base = run(serial);
    ASSERT_EQ(base.status, QKV_OK) << qkv_status_string(base.status);
    for (size_t workers : {size_t{1}, size_t{2}, size_t{3}, size_t{8}}) {
      ThreadPool pool(workers);
      CountingPool counting{&pool};
      ExpectSameBits(base, run(OnPool(serial, &counting, workers)),
                     "ThreadPool(" + std::to_string(workers) + ")");
      ShuffledPool shuffled{std::mt19937(17u + workers), workers};
      ExpectSameBits(base, run(OnPool(serial, &shuffled, workers)),
                     "shuffled pool of " + std::to_string(workers));
    }
  }
}

// Reentrancy: concurrent calls from several threads (each with its own
// workspace, sharing nothing else) give the same bits as calls made one at a
// time; no static scratch inside the library.
class ReentrancyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReentrancyTest, ConcurrentCallsMatchSerialCalls) {
  const std::vector<DetCase> cases = {
      {"r_causal", 1, 4, 2, 33, 150, 32, 32, QKV_SCORE_DOT, true, false},
      {"r_decode", 2, 2, 1, 1, 300, 64, 48, QKV_SCORE_DOT, false, true},
      {"r_masks", 2, 3, 3, 17, 70, 16, 24, QKV_SCORE_DOT, true, true},
      {"r_gauss", 1, 2, 2, 20, 90, 8, 8, QKV_SCORE_GAUSSIAN, false, false},
  };
  std::vector<Problem> problems;
  std::vector<Outputs> expected;
  for (const DetCase& c : cases) {
    problems.push_back(BuildDetProblem(c, GetParam()));
    expected.push_back(RunAttention(problems.back()));
  }
  std::vector<int> mismatches(cases.size(), 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < cases.size(); ++t) {
    threads.emplace_back([&, t] {
      RunOptions opt;
      opt.check_short_workspace = false;
      for (int rep = 0; rep < 12; ++rep) {
        const Outputs got = RunAttention(problems[t], opt);
        if (got.status != expected[t].status ||
            !BitwiseEqual(got.out, expected[t].out) ||
            !BitwiseEqual(got.weights, expected[t].weights) ||
            !BitwiseEqual(got.lse, expected[t].lse)) {
          ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (size_t t = 0; t < cases.size(); ++t) {
    EXPECT_EQ(mismatches[t], 0) << cases[t].name;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ReentrancyTest,
                         ::testing::ValuesIn(BackendNames()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return SanitizeForTestName(i.param);
                         });

}  // namespace
}  // namespace qkv_test
