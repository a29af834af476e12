// Shared helpers for the qkv GoogleTest suites: backend enumeration, inputs
// with a fixed-seed RNG, guarded output buffers, a misaligned workspace, and
// one call of qkv_attention_f32 with every "nothing outside the buffers is
// touched" check folded in.
#ifndef QKV_TESTS_TEST_UTIL_H_
#define QKV_TESTS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "qkv/qkv.h"

namespace qkv_test {

// Every backend the library lists for this CPU, best first.
inline std::vector<std::string> BackendNames() {
  std::vector<std::string> names;
  const size_t n = qkv_backend_count();
  for (size_t i = 0; i < n; ++i) {
    const char* name = qkv_backend_name(i);
    names.push_back(name != nullptr ? name : "(null)");
  }
  return names;
}

// "highway:AVX3_DL" -> "highway_AVX3_DL" (gtest names allow [A-Za-z0-9_]).
inline std::string SanitizeForTestName(const std::string& s) {
  std::string r = s;
  for (char& c : r) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_';
    if (!ok) c = '_';
  }
  return r;
}

// The name suffix of a test parameterized by a backend name, for
// INSTANTIATE_TEST_SUITE_P (so filters such as '*SVE*' pick a backend).
inline std::string BackendTestName(
    const ::testing::TestParamInfo<std::string>& info) {
  return SanitizeForTestName(info.param);
}

// A stable 32-bit seed from a name (FNV-1a), so each case has its own inputs
// on every platform.
inline uint32_t SeedFromName(const std::string& s) {
  uint32_t h = 2166136261u;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 16777619u;
  }
  return h;
}

inline void FillUniform(std::vector<float>* x, std::mt19937* rng, float lo,
                        float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  for (float& e : *x) e = dist(*rng);
}

inline float Bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Output buffer with canary floats on both sides. The body starts filled with
// a NaN sentinel, so an element the library forgets to write shows up.
class GuardedBuffer {
 public:
  static constexpr size_t kGuard = 16;
  static constexpr uint32_t kCanaryBits = 0xDEADBEEFu;
  static constexpr uint32_t kSentinelBits = 0x7FBADBADu;  // a NaN

  explicit GuardedBuffer(size_t n) : n_(n), storage_(n + 2 * kGuard) {
    for (size_t i = 0; i < storage_.size(); ++i) {
      const bool guard = i < kGuard || i >= kGuard + n_;
      const uint32_t bits = guard ? kCanaryBits : kSentinelBits;
      std::memcpy(&storage_[i], &bits, sizeof bits);
    }
  }
  float* data() { return storage_.data() + kGuard; }
  size_t size() const { return n_; }
  bool GuardsIntact() const {
    for (size_t i = 0; i < storage_.size(); ++i) {
      if (i >= kGuard && i < kGuard + n_) continue;
      uint32_t bits;
      std::memcpy(&bits, &storage_[i], sizeof bits);
      if (bits != kCanaryBits) return false;
    }
    return true;
  }
  bool BodyUntouched() const {
    for (size_t i = kGuard; i < kGuard + n_; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &storage_[i], sizeof bits);
      if (bits != kSentinelBits) return false;
    }
    return true;
  }
  std::vector<float> Body() const {
    return std::vector<float>(storage_.begin() + kGuard,
                              storage_.begin() + kGuard + n_);
  }

 private:
  size_t n_;
  std::vector<float> storage_;
};

// Exactly `size` usable bytes at an odd address (malloc + 1), with canary
// bytes right after, so the library must align inside it and stay inside it.
class MisalignedWorkspace {
 public:
  static constexpr size_t kTail = 64;
  static constexpr unsigned char kCanary = 0xA5;

  explicit MisalignedWorkspace(size_t size) : size_(size) {
    raw_ = static_cast<unsigned char*>(std::malloc(size + 1 + kTail));
    std::memset(raw_, kCanary, size + 1 + kTail);
  }
  ~MisalignedWorkspace() { std::free(raw_); }
  MisalignedWorkspace(const MisalignedWorkspace&) = delete;
  MisalignedWorkspace& operator=(const MisalignedWorkspace&) = delete;

  void* data() { return raw_ + 1; }
  size_t size() const { return size_; }
  bool GuardsIntact() const {
    if (raw_[0] != kCanary) return false;
    for (size_t i = 0; i < kTail; ++i) {
      if (raw_[1 + size_ + i] != kCanary) return false;
    }
    return true;
  }

 private:
  size_t size_;
  unsigned char* raw_;
};

inline size_t NumOut(const qkv_attention_desc& d) {
  return static_cast<size_t>(d.batch * d.q_heads * d.q_len * d.value_dim);
}
inline size_t NumWeights(const qkv_attention_desc& d) {
  return static_cast<size_t>(d.batch * d.q_heads * d.q_len * d.kv_len);
}
inline size_t NumLse(const qkv_attention_desc& d) {
  return static_cast<size_t>(d.batch * d.q_heads * d.q_len);
}

// A descriptor and the inputs it points to.
struct Problem {
  qkv_attention_desc desc;
  std::vector<float> q, k, v, bias, w_q, w_k, w_v;
  std::vector<int32_t> valid_lens;
  std::string backend;  // empty: desc.backend = NULL

  // `desc` with its pointers set into this problem's vectors.
  qkv_attention_desc Bound() const {
    qkv_attention_desc d = desc;
    if (!valid_lens.empty()) d.valid_lens = valid_lens.data();
    if (!bias.empty()) d.bias = bias.data();
    if (!w_q.empty()) d.additive_w_q = w_q.data();
    if (!w_k.empty()) d.additive_w_k = w_k.data();
    if (!w_v.empty()) d.additive_w_v = w_v.data();
    d.backend = backend.empty() ? nullptr : backend.c_str();
    return d;
  }
  float MaxAbsV() const {
    float m = 0.0f;
    for (float x : v) m = std::fmax(m, std::fabs(x));
    return m;
  }
};

// Dense q, k, v in [-mag, mag] from a fixed seed.
inline Problem MakeProblem(int64_t batch, int64_t q_heads, int64_t kv_heads,
                           int64_t q_len, int64_t kv_len, int64_t head_dim,
                           int64_t value_dim, uint32_t seed, float q_mag = 1.0f,
                           float k_mag = 1.0f, float v_mag = 1.0f) {
  Problem p;
  qkv_attention_desc_init(&p.desc, batch, q_heads, kv_heads, q_len, kv_len,
                          head_dim, value_dim);
  std::mt19937 rng(seed);
  p.q.resize(static_cast<size_t>(batch * q_heads * q_len * head_dim));
  p.k.resize(static_cast<size_t>(batch * kv_heads * kv_len * head_dim));
  p.v.resize(static_cast<size_t>(batch * kv_heads * kv_len * value_dim));
  FillUniform(&p.q, &rng, -q_mag, q_mag);
  FillUniform(&p.k, &rng, -k_mag, k_mag);
  FillUniform(&p.v, &rng, -v_mag, v_mag);
  return p;
}

struct RunOptions {
  bool weights = true;
  bool lse = true;
  // Also check that a workspace one byte short is refused untouched.
  bool check_short_workspace = true;
};

struct Outputs {
  qkv_status status = QKV_ERR_INVALID_ARGUMENT;
  std::vector<float> out, weights, lse;  // empty when not requested
};

// One qkv_attention_f32 call with exactly qkv_attention_workspace_size bytes
// of misaligned workspace. Records a failure if anything outside the output
// bodies or the workspace is written, or if a failing call wrote anything.
inline Outputs RunAttention(const qkv_attention_desc& d, const float* q,
                            const float* k, const float* v,
                            const RunOptions& opt = RunOptions()) {
  Outputs r;
  GuardedBuffer out(NumOut(d));
  GuardedBuffer weights(opt.weights ? NumWeights(d) : 0);
  GuardedBuffer lse(opt.lse ? NumLse(d) : 0);
  float* w_ptr = opt.weights ? weights.data() : nullptr;
  float* lse_ptr = opt.lse ? lse.data() : nullptr;

  const size_t ws_size = qkv_attention_workspace_size(&d);
  if (opt.check_short_workspace && ws_size > 0) {
    MisalignedWorkspace short_ws(ws_size - 1);
    const qkv_status st =
        qkv_attention_f32(&d, q, k, v, out.data(), w_ptr, lse_ptr,
                          short_ws.data(), short_ws.size());
    // An unsupported request may say so before looking at the workspace.
    if (st != QKV_ERR_UNSUPPORTED) {
      EXPECT_EQ(st, QKV_ERR_WORKSPACE_TOO_SMALL)
          << "workspace of " << ws_size - 1 << " bytes, query said " << ws_size;
    }
    EXPECT_TRUE(out.BodyUntouched() && weights.BodyUntouched() &&
                lse.BodyUntouched())
        << "a call refused for its workspace wrote to an output";
    EXPECT_TRUE(short_ws.GuardsIntact()) << "wrote outside the workspace";
  }

  MisalignedWorkspace ws(ws_size);
  r.status = qkv_attention_f32(&d, q, k, v, out.data(), w_ptr, lse_ptr,
                               ws_size > 0 ? ws.data() : nullptr, ws_size);
  EXPECT_TRUE(ws.GuardsIntact())
      << "wrote outside the " << ws_size << "-byte workspace";
  EXPECT_TRUE(out.GuardsIntact()) << "wrote outside out";
  EXPECT_TRUE(weights.GuardsIntact()) << "wrote outside weights";
  EXPECT_TRUE(lse.GuardsIntact()) << "wrote outside lse";
  if (r.status != QKV_OK) {
    EXPECT_TRUE(out.BodyUntouched() && weights.BodyUntouched() &&
                lse.BodyUntouched())
        << "status " << r.status << " but an output was written";
  }
  r.out = out.Body();
  if (opt.weights) r.weights = weights.Body();
  if (opt.lse) r.lse = lse.Body();
  return r;
}

inline Outputs RunAttention(const Problem& p,
                            const RunOptions& opt = RunOptions()) {
  const qkv_attention_desc d = p.Bound();
  return RunAttention(d, p.q.data(), p.k.data(), p.v.data(), opt);
}

inline bool BitwiseEqual(const std::vector<float>& a,
                         const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() ||
          std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace qkv_test

#endif  // QKV_TESTS_TEST_UTIL_H_
