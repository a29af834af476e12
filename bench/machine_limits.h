// The machine's limits, measured by the benchmark binary in the same run as
// the attention figures: the FMA (multiply-add) peak of each SIMD target and
// the streaming-read bandwidth.
#ifndef QKV_BENCH_MACHINE_LIMITS_H_
#define QKV_BENCH_MACHINE_LIMITS_H_

#include <cstddef>
#include <cstdint>

namespace qkv_bench {

// One SIMD target's multiply-add loop: `chains` independent accumulators,
// acc = acc * m + a, each a vector of `lanes` floats. On targets with FMA this
// is one FMA per step and chain; SSE4 and SCALAR have no FMA, so there it is a
// multiply and an add (as in the library's kernels for those targets: this is
// the peak of the code they can emit).
struct PeakTarget {
  const char* name;  // Highway's name for it: "AVX3", "AVX2", "SSE4", "SCALAR"
  size_t lanes;      // floats per vector
  size_t chains;     // independent accumulators
  // Runs `steps` steps; returns a checksum so nothing is optimized away.
  float (*run)(int64_t steps, float m, float a);
  double FlopsPerStep() const { return 2.0 * double(lanes) * double(chains); }
};

// The targets this binary was built with that run on this CPU, best first;
// 0 when built without Highway.
size_t PeakTargets(PeakTarget* out, size_t max);

// Sum of p[0, n), with the best SIMD target (several accumulators: bound by
// memory, not by the add latency).
float StreamSum(const float* p, size_t n);

// Highway's name of the best target the CPU runs ("scalar" without Highway).
const char* BestTargetName();

}  // namespace qkv_bench

#endif  // QKV_BENCH_MACHINE_LIMITS_H_
