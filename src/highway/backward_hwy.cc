// The Highway engine's backward pass (src/pipeline/backward-inl.h) over
// Highway's vector operations, compiled once per SIMD target by
// foreach_target, with the forward's exp. Its own translation unit, so that
// it compiles in parallel with attention_hwy.cc, whose table of targets
// holds each target's GetBackward.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "highway/backward_hwy.cc"
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
#include "pipeline/backward-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv {
namespace HWY_NAMESPACE {

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
