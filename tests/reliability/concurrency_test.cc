// Concurrency: many threads calling qkv at once, each with its own outputs
// and workspace and all sharing the same read-only inputs (q, k, v, bias,
// valid lengths, additive weights), get bit-for-bit what one thread gets, on
// every backend and score kind, with and without a thread pool per caller.
// The `tsan` preset runs this under ThreadSanitizer, which also checks the
// library's once-only engine list when first use is concurrent.
//
// No test here touches the library before its body runs (no parameter
// generator calls qkv), so under CTest, which runs each test in its own
// process, ConcurrentFirstUse really is the first use.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "qkv/qkv.h"
#include "support/thread_pool.h"
#include "test_util.h"

namespace qkv_test {
namespace {

constexpr int kThreads = 8;

// Releases every waiting thread at once, so calls really overlap.
class StartLine {
 public:
  explicit StartLine(int n) : waiting_(n) {}
  void ArriveAndWait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (--waiting_ == 0) {
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [this] { return waiting_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_;
};

struct Result {
  qkv_status status = QKV_ERR_INVALID_ARGUMENT;
  std::vector<float> out, weights, lse;
  bool operator==(const Result& o) const {
    return status == o.status && BitwiseEqual(out, o.out) &&
           BitwiseEqual(weights, o.weights) && BitwiseEqual(lse, o.lse);
  }
};

// One call with private outputs and workspace; no gtest macros (runs on many
// threads).
Result Call(const qkv_attention_desc& d, const Problem& p) {
  Result r;
  r.out.assign(NumOut(d), -1.0f);
  r.weights.assign(NumWeights(d), -1.0f);
  r.lse.assign(NumLse(d), -1.0f);
  const size_t ws_size = qkv_attention_workspace_size(&d);
  std::unique_ptr<unsigned char[]> ws(new unsigned char[ws_size + 1]);
  r.status = qkv_attention_f32(&d, p.q.data(), p.k.data(), p.v.data(),
                               r.out.data(), r.weights.data(), r.lse.data(),
                               ws_size ? ws.get() + 1 : nullptr, ws_size);
  return r;
}

struct Case {
  std::string name;
  Problem problem;
};

// Every backend (and the default) x score kind x {tile shape with GQA,
// causal, per-query valid lengths and a -inf bias; decode shape with
// per-batch valid lengths}.
std::vector<Case> AllCases() {
  std::vector<std::string> backends = {""};
  for (const std::string& b : BackendNames()) backends.push_back(b);
  std::vector<Case> cases;
  for (const std::string& backend : backends) {
    for (int score = 0; score < 3; ++score) {
      for (int shape = 0; shape < 2; ++shape) {
        const std::string name = (backend.empty() ? "default" : backend) +
                                 "/score" + std::to_string(score) +
                                 (shape == 0 ? "/tile" : "/decode");
        const uint32_t seed = SeedFromName(name);
        Problem p = shape == 0 ? MakeProblem(2, 4, 2, 33, 130, 32, 24, seed)
                               : MakeProblem(3, 4, 2, 1, 300, 64, 40, seed);
        qkv_attention_desc& d = p.desc;
        std::mt19937 rng(seed);
        d.score = static_cast<qkv_score>(score);
        if (score == QKV_SCORE_GAUSSIAN) d.scale = 0.05f;
        if (score == QKV_SCORE_ADDITIVE) {
          d.additive_hidden = 6;
          p.w_q.resize(static_cast<size_t>(6 * d.head_dim));
          p.w_k.resize(static_cast<size_t>(6 * d.head_dim));
          p.w_v.resize(6);
          FillUniform(&p.w_q, &rng, -0.3f, 0.3f);
          FillUniform(&p.w_k, &rng, -0.3f, 0.3f);
          FillUniform(&p.w_v, &rng, -1.0f, 1.0f);
        }
        if (shape == 0) {
          d.mask = QKV_MASK_CAUSAL | QKV_MASK_VALID_LENS | QKV_MASK_BIAS;
          d.valid_lens_per_query = 1;
          for (int64_t r = 0; r < d.batch * d.q_len; ++r) {
            p.valid_lens.push_back(static_cast<int32_t>((r * 37 + 11) % 131));
          }
          d.bias_batch_stride = d.q_heads * d.q_len * d.kv_len;
          d.bias_head_stride = d.q_len * d.kv_len;
          p.bias.resize(static_cast<size_t>(d.batch * d.bias_batch_stride));
          FillUniform(&p.bias, &rng, -2.0f, 2.0f);
          for (size_t i = 0; i < p.bias.size(); i += 5) p.bias[i] = -INFINITY;
        } else {
          d.mask = QKV_MASK_VALID_LENS;
          p.valid_lens = {300, 17, 0};
        }
        p.backend = backend;
        cases.push_back({name, std::move(p)});
      }
    }
  }
  return cases;
}

// The first calls into the library come from eight threads at once: every
// thread sees the same backend list and gets the same result.
TEST(ReliabilityConcurrency, ConcurrentFirstUse) {
  Problem p = MakeProblem(1, 2, 1, 9, 70, 16, 16, 7);
  std::vector<std::string> first(kThreads);
  std::vector<size_t> counts(kThreads);
  std::vector<Result> results(kThreads);
  StartLine start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.ArriveAndWait();
      const qkv_attention_desc d = p.Bound();
      if (t % 2 == 0) {
        const char* b = qkv_backend();
        first[t] = b ? b : "(null)";
        counts[t] = qkv_backend_count();
        results[t] = Call(d, p);
      } else {
        results[t] = Call(d, p);
        counts[t] = qkv_backend_count();
        const char* b = qkv_backend_name(0);
        first[t] = b ? b : "(null)";
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(first[t], first[0]) << "thread " << t;
    EXPECT_EQ(counts[t], counts[0]) << "thread " << t;
    EXPECT_EQ(results[t].status, QKV_OK) << "thread " << t;
    EXPECT_TRUE(results[t] == results[0]) << "thread " << t;
  }
  EXPECT_STREQ(first[0].c_str(), qkv_backend());
}

// Eight threads, each running every case twice in its own order, half of
// them through a private two-worker pool: bitwise the single-thread result.
TEST(ReliabilityConcurrency, EightThreadsMatchOneThread) {
  const std::vector<Case> cases = AllCases();
  std::vector<Result> expected;
  for (const Case& c : cases) {
    expected.push_back(Call(c.problem.Bound(), c.problem));
    ASSERT_EQ(expected.back().status, QKV_OK)
        << c.name << ": " << qkv_status_string(expected.back().status);
  }
  // mismatches[t][c]: calls of thread t on case c that differed.
  std::vector<std::vector<int>> mismatches(kThreads,
                                           std::vector<int>(cases.size(), 0));
  std::atomic<int> calls{0};
  StartLine start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<ThreadPool> pool;
      if (t % 2 == 1) pool.reset(new ThreadPool(2));
      start.ArriveAndWait();
      const size_t n = cases.size();
      for (size_t step = 0; step < 2 * n; ++step) {
        const size_t c = (static_cast<size_t>(t) * 7 + step) % n;
        qkv_attention_desc d = cases[c].problem.Bound();
        if (pool) pool->Attach(&d);
        const Result got = Call(d, cases[c].problem);
        if (!(got == expected[c])) ++mismatches[t][c];
        calls.fetch_add(1);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(calls.load(), kThreads * 2 * static_cast<int>(cases.size()));
  for (int t = 0; t < kThreads; ++t) {
    for (size_t c = 0; c < cases.size(); ++c) {
      EXPECT_EQ(mismatches[t][c], 0)
          << "thread " << t << (t % 2 ? " (pool)" : "") << ", case "
          << cases[c].name;
    }
  }
}

}  // namespace
}  // namespace qkv_test
