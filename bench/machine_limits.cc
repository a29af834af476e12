// The machine-limit loops, compiled once per SIMD target with Highway's
// foreach_target (like the library's engine) so each target's peak can be
// measured on its own, whatever the best target of the CPU is.
#include "machine_limits.h"

#ifdef QKV_BENCH_HAVE_HWY

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "machine_limits.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"

#undef QKV_BENCH_TARGET_NAME
#if HWY_TARGET == HWY_AVX3_DL
#define QKV_BENCH_TARGET_NAME "AVX3_DL"
#elif HWY_TARGET == HWY_AVX3
#define QKV_BENCH_TARGET_NAME "AVX3"
#elif HWY_TARGET == HWY_AVX2
#define QKV_BENCH_TARGET_NAME "AVX2"
#elif HWY_TARGET == HWY_SSE4
#define QKV_BENCH_TARGET_NAME "SSE4"
#elif HWY_TARGET == HWY_SSSE3
#define QKV_BENCH_TARGET_NAME "SSSE3"
#elif HWY_TARGET == HWY_SVE2
#define QKV_BENCH_TARGET_NAME "SVE2"
#elif HWY_TARGET == HWY_SVE
#define QKV_BENCH_TARGET_NAME "SVE"
#elif HWY_TARGET == HWY_NEON
#define QKV_BENCH_TARGET_NAME "NEON"
#elif HWY_TARGET == HWY_WASM
#define QKV_BENCH_TARGET_NAME "WASM"
#elif HWY_TARGET == HWY_EMU128
#define QKV_BENCH_TARGET_NAME "EMU128"
#elif HWY_TARGET == HWY_SCALAR
#define QKV_BENCH_TARGET_NAME "SCALAR"
#else
#define QKV_BENCH_TARGET_NAME "OTHER"
#endif

HWY_BEFORE_NAMESPACE();
namespace qkv_bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Enough independent chains to cover the latency of the multiply-add (4
// cycles for an FMA, about 7 for SSE4's multiply then add) times the ports
// (2), and few enough to stay in registers with the two constants: AVX-512
// has 32 vector registers, the others 16.
#if HWY_TARGET <= HWY_AVX3
#define QKV_BENCH_CHAINS(X) \
  X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) \
  X(14) X(15)
constexpr size_t kChains = 16;
#else
#define QKV_BENCH_CHAINS(X) \
  X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
constexpr size_t kChains = 12;
#endif

// The chains are named variables rather than an array, so that each stays
// in a register of its own (see the SCALAR barrier below).
float FmaChains(int64_t steps, float m, float a) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const V vm = hn::Set(d, m);
  const V va = hn::Set(d, a);
#define QKV_BENCH_INIT(i) V acc##i = hn::Set(d, static_cast<float>(i) * 0.01f);
  QKV_BENCH_CHAINS(QKV_BENCH_INIT)
#undef QKV_BENCH_INIT
#if HWY_TARGET == HWY_SCALAR && (defined(__GNUC__) || defined(__clang__))
  // An empty asm that "changes" each chain: otherwise the compiler's SLP
  // vectorizer packs four scalar chains into one SSE vector, and the
  // "scalar" peak would be SSE's.
#define QKV_BENCH_BARRIER(i) __asm__("" : "+x"(acc##i.raw));
#else
#define QKV_BENCH_BARRIER(i)
#endif
  for (int64_t s = 0; s < steps; ++s) {
    // acc = acc * m + a converges to a / (1 - m): no overflow, no denormals.
#define QKV_BENCH_STEP(i) acc##i = hn::MulAdd(acc##i, vm, va);
    QKV_BENCH_CHAINS(QKV_BENCH_STEP)
    QKV_BENCH_CHAINS(QKV_BENCH_BARRIER)
#undef QKV_BENCH_STEP
  }
#undef QKV_BENCH_BARRIER
  V sum = hn::Zero(d);
#define QKV_BENCH_SUM(i) sum = hn::Add(sum, acc##i);
  QKV_BENCH_CHAINS(QKV_BENCH_SUM)
#undef QKV_BENCH_SUM
  return hn::GetLane(hn::SumOfLanes(d, sum));
}
#undef QKV_BENCH_CHAINS

// Four streams at once, as attention reads its K and V rows (and a block's
// rows several keys at a time): one stream per loop leaves the prefetchers
// of the others idle and reads 10-20% less than the memory gives one core
// (measured on Zen 3), which would flatter a kernel measured against it.
float StreamSumImpl(const float* HWY_RESTRICT p, size_t n) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d);
  const size_t quarter = n / 4 / (2 * N) * (2 * N);
  const float* HWY_RESTRICT p1 = p + quarter;
  const float* HWY_RESTRICT p2 = p + 2 * quarter;
  const float* HWY_RESTRICT p3 = p + 3 * quarter;
  V s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  for (size_t i = 0; i < quarter; i += 2 * N) {
    s0 = hn::Add(s0, hn::Add(hn::LoadU(d, p + i), hn::LoadU(d, p + i + N)));
    s1 = hn::Add(s1, hn::Add(hn::LoadU(d, p1 + i), hn::LoadU(d, p1 + i + N)));
    s2 = hn::Add(s2, hn::Add(hn::LoadU(d, p2 + i), hn::LoadU(d, p2 + i + N)));
    s3 = hn::Add(s3, hn::Add(hn::LoadU(d, p3 + i), hn::LoadU(d, p3 + i + N)));
  }
  float tail = 0.0f;
  for (size_t i = 4 * quarter; i < n; ++i) tail += p[i];
  const V s = hn::Add(hn::Add(s0, s1), hn::Add(s2, s3));
  return hn::GetLane(hn::SumOfLanes(d, s)) + tail;
}

PeakTarget GetPeakTarget() {
  const hn::ScalableTag<float> d;
  return PeakTarget{QKV_BENCH_TARGET_NAME, hn::Lanes(d), kChains, &FmaChains};
}

const char* TargetName() { return QKV_BENCH_TARGET_NAME; }

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace qkv_bench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qkv_bench {

HWY_EXPORT(StreamSumImpl);
HWY_EXPORT(TargetName);

size_t PeakTargets(PeakTarget* out, size_t max) {
  using GetFn = PeakTarget (*)();
  struct Candidate {
    int64_t target;
    GetFn get;
  };
  // Best first, as the library lists its Highway engines.
  static const Candidate kCandidates[] = {
      {HWY_AVX3_DL, HWY_CHOOSE_AVX3_DL(GetPeakTarget)},
      {HWY_AVX3, HWY_CHOOSE_AVX3(GetPeakTarget)},
      {HWY_AVX2, HWY_CHOOSE_AVX2(GetPeakTarget)},
      {HWY_SSE4, HWY_CHOOSE_SSE4(GetPeakTarget)},
      {HWY_SSSE3, HWY_CHOOSE_SSSE3(GetPeakTarget)},
      {HWY_SVE2, HWY_CHOOSE_SVE2(GetPeakTarget)},
      {HWY_SVE, HWY_CHOOSE_SVE(GetPeakTarget)},
      {HWY_NEON, HWY_CHOOSE_NEON(GetPeakTarget)},
      {HWY_WASM, HWY_CHOOSE_WASM(GetPeakTarget)},
#if HWY_TARGETS & HWY_EMU128
      {HWY_EMU128, &N_EMU128::GetPeakTarget},
#endif
#if HWY_TARGETS & HWY_SCALAR
      {HWY_SCALAR, &N_SCALAR::GetPeakTarget},
#endif
  };
  const int64_t supported = hwy::SupportedTargets();
  size_t n = 0;
  for (const Candidate& c : kCandidates) {
    if (c.get != nullptr && (supported & c.target) != 0 && n < max) {
      out[n++] = c.get();
    }
  }
  return n;
}

float StreamSum(const float* p, size_t n) {
  return HWY_DYNAMIC_DISPATCH(StreamSumImpl)(p, n);
}

const char* BestTargetName() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace qkv_bench
#endif  // HWY_ONCE

#else  // !QKV_BENCH_HAVE_HWY

namespace qkv_bench {

size_t PeakTargets(PeakTarget*, size_t) { return 0; }

float StreamSum(const float* p, size_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t j = 0; j < 8; ++j) s[j] += p[i + j];
  }
  float total = 0.0f;
  for (; i < n; ++i) total += p[i];
  for (float x : s) total += x;
  return total;
}

const char* BestTargetName() { return "scalar"; }

}  // namespace qkv_bench

#endif  // QKV_BENCH_HAVE_HWY
