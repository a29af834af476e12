// The Highway engine: the FlashAttention pipeline (src/pipeline/flash-inl.h)
// over Highway's vector operations (ops_hwy-inl.h), compiled once per SIMD
// target by foreach_target and picked at run time. Its backward pass is
// compiled by backward_hwy.cc, in parallel.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "highway/attention_hwy.cc"
#include "engine.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "pipeline/operands.h"
#include "pipeline/tasks.h"
#include "pipeline/prefetch.h"
#include "pipeline/workspace.h"
#include "pipeline/rows.h"

#undef QKV_SIMD_NAMESPACE
#define QKV_SIMD_NAMESPACE HWY_NAMESPACE
#include "highway/ops_hwy-inl.h"
#include "pipeline/flash-inl.h"

// The target's name as a string literal (this file is compiled once per
// target, so the macro is redefined each time).
#undef QKV_HWY_TARGET_NAME
#if HWY_TARGET == HWY_AVX3_DL
#define QKV_HWY_TARGET_NAME "AVX3_DL"
#elif HWY_TARGET == HWY_AVX3
#define QKV_HWY_TARGET_NAME "AVX3"
#elif HWY_TARGET == HWY_AVX2
#define QKV_HWY_TARGET_NAME "AVX2"
#elif HWY_TARGET == HWY_SSE4
#define QKV_HWY_TARGET_NAME "SSE4"
#elif HWY_TARGET == HWY_SSSE3
#define QKV_HWY_TARGET_NAME "SSSE3"
#elif HWY_TARGET == HWY_SVE2
#define QKV_HWY_TARGET_NAME "SVE2"
#elif HWY_TARGET == HWY_SVE
#define QKV_HWY_TARGET_NAME "SVE"
#elif HWY_TARGET == HWY_NEON
#define QKV_HWY_TARGET_NAME "NEON"
#elif HWY_TARGET == HWY_WASM
#define QKV_HWY_TARGET_NAME "WASM"
#elif HWY_TARGET == HWY_EMU128
#define QKV_HWY_TARGET_NAME "EMU128"
#elif HWY_TARGET == HWY_SCALAR
#define QKV_HWY_TARGET_NAME "SCALAR"
#else
#define QKV_HWY_TARGET_NAME "OTHER"
#endif

HWY_BEFORE_NAMESPACE();
namespace qkv {
namespace HWY_NAMESPACE {

// The engine of this target; "highway:<TARGET>".
const Engine* GetEngine() {
  static constexpr Engine kEngine =
      Flash<Ops>::MakeEngine("highway:" QKV_HWY_TARGET_NAME);
  return &kEngine;
}

const PipelineBlocks* GetBlocks() { return &Flash<Ops>::kBlocks; }

const BackwardEngine* GetBackward();  // backward_hwy.cc

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace qkv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qkv {

namespace {

struct Candidate {
  int64_t target;
  const Engine* (*get)();
  const PipelineBlocks* (*blocks)();
  const BackwardEngine* (*backward)();
};

// Best first. HWY_CHOOSE_* is nullptr for targets this build did not
// compile.
#define QKV_HWY_CANDIDATE(T) \
  {                                                                       \
    HWY_##T, HWY_CHOOSE_##T(GetEngine), HWY_CHOOSE_##T(GetBlocks),        \
        HWY_CHOOSE_##T(GetBackward)                                       \
  }
const Candidate kCandidates[] = {
    QKV_HWY_CANDIDATE(AVX3_DL),
    QKV_HWY_CANDIDATE(AVX3),
    QKV_HWY_CANDIDATE(AVX2),
    QKV_HWY_CANDIDATE(SSE4),
    QKV_HWY_CANDIDATE(SSSE3),
    QKV_HWY_CANDIDATE(SVE2),
    QKV_HWY_CANDIDATE(SVE),
    QKV_HWY_CANDIDATE(NEON),
    QKV_HWY_CANDIDATE(WASM),
#if HWY_TARGETS & HWY_EMU128
    {HWY_EMU128, &N_EMU128::GetEngine, &N_EMU128::GetBlocks,
     &N_EMU128::GetBackward},
#endif
#if HWY_TARGETS & HWY_SCALAR
    {HWY_SCALAR, &N_SCALAR::GetEngine, &N_SCALAR::GetBlocks,
     &N_SCALAR::GetBackward},
#endif
};
#undef QKV_HWY_CANDIDATE

}  // namespace

const PipelineBlocks* HighwayBlocks(const Engine* engine) {
  for (const Candidate& c : kCandidates) {
    if (c.get != nullptr && c.get() == engine) return c.blocks();
  }
  return nullptr;
}

const BackwardEngine* HighwayBackward(const Engine* engine) {
  for (const Candidate& c : kCandidates) {
    if (c.get != nullptr && c.get() == engine) return c.backward();
  }
  return nullptr;
}

#if !defined(HWY_COMPILE_ONLY_STATIC)
// The targets this CPU and OS run (cpu_targets.cc, compiled for the baseline
// only): qkv's own detection, so that nothing of libhwy is linked.
int64_t HighwayCpuTargets();
#endif

size_t HighwayEngines(const Engine** out, size_t max) {
  // The static target is the baseline the compiler was told this CPU has,
  // so it runs wherever this code runs. It is added to what is detected
  // because detection does not cover every platform: 32-bit Arm, where this
  // file is compiled for NEON, reports only the emulated targets.
  // Header-only builds (WASM) compile the static target alone.
#if defined(HWY_COMPILE_ONLY_STATIC)
  const int64_t supported = HWY_STATIC_TARGET;
#else
  const int64_t supported = HighwayCpuTargets() | HWY_STATIC_TARGET;
#endif
  size_t n = 0;
  for (const Candidate& c : kCandidates) {
    if (c.get != nullptr && (supported & c.target) != 0 && n < max) {
      out[n++] = c.get();
    }
  }
  return n;
}

}  // namespace qkv
#endif  // HWY_ONCE
