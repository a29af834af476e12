// The Highway engine's backward pass (src/pipeline/backward-inl.h) over
// Highway's vector operations, compiled once per SIMD target by
// foreach_target, with the forward's exp. Its own translation unit, beside
// attention_hwy.cc (whose engines it is looked up by), so that the two
// compile in parallel.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "highway/backward_hwy.cc"
#include "engine.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tiling.h"

#undef QKV_SIMD_NAMESPACE
#define QKV_SIMD_NAMESPACE HWY_NAMESPACE
#include "highway/ops_hwy-inl.h"
#include "pipeline/flash-inl.h"
#include "pipeline/backward-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv {
namespace HWY_NAMESPACE {

const Engine* GetEngine();  // attention_hwy.cc: the forward of this target

// The backward pass of this target, with the forward's exp.
struct FlashExp {
  static HWY_INLINE Ops::V Apply(Ops::V x) {
    return Flash<Ops>::ExpNonPositive(x);
  }
};

const BackwardEngine* GetBackward() {
  return &Backward<Ops, FlashExp>::kEngine;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace qkv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qkv {

namespace {

struct BackwardCandidate {
  const Engine* (*get)();
  const BackwardEngine* (*backward)();
};

// HWY_CHOOSE_* is nullptr for targets this build did not compile.
#define QKV_HWY_BACKWARD(T) \
  { HWY_CHOOSE_##T(GetEngine), HWY_CHOOSE_##T(GetBackward) }
const BackwardCandidate kBackwardCandidates[] = {
    QKV_HWY_BACKWARD(AVX3_DL), QKV_HWY_BACKWARD(AVX3),
    QKV_HWY_BACKWARD(AVX2),    QKV_HWY_BACKWARD(SSE4),
    QKV_HWY_BACKWARD(SSSE3),   QKV_HWY_BACKWARD(SVE2),
    QKV_HWY_BACKWARD(SVE),     QKV_HWY_BACKWARD(NEON),
    QKV_HWY_BACKWARD(WASM),
#if HWY_TARGETS & HWY_EMU128
    {&N_EMU128::GetEngine, &N_EMU128::GetBackward},
#endif
#if HWY_TARGETS & HWY_SCALAR
    {&N_SCALAR::GetEngine, &N_SCALAR::GetBackward},
#endif
};
#undef QKV_HWY_BACKWARD

}  // namespace

const BackwardEngine* HighwayBackward(const Engine* engine) {
  for (const BackwardCandidate& c : kBackwardCandidates) {
    if (c.get != nullptr && c.get() == engine) return c.backward();
  }
  return nullptr;
}

}  // namespace qkv
#endif  // HWY_ONCE
