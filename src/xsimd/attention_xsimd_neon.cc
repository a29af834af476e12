// The xsimd engine for 32-bit ARM NEON (VFPv4): the FlashAttention
// pipeline (src/pipeline/flash-inl.h) over xsimd::neon (ops_xsimd-inl.h),
// compiled with that architecture's flags (src/xsimd/sources.cmake) inside
// its own namespace, so that nothing here shares a linkage name with code
// built for another instruction set.
#define QKV_SIMD_NAMESPACE xsimd_neon
#define QKV_XSIMD_LIBRARY_NAMESPACE xsimd_neon_library
#include "engine.h"
#include "pipeline/backward-inl.h"
#include "pipeline/flash-inl.h"
#include "xsimd/ops_xsimd-inl.h"

namespace qkv {

namespace {
using Kernel = xsimd_neon::Flash<xsimd_neon::XsimdOps<xsimd::neon>>;
}  // namespace

const Engine* XsimdNeonEngine() {
  static constexpr Engine kEngine = Kernel::MakeEngine("xsimd:neon");
  return &kEngine;
}

const PipelineBlocks* XsimdNeonBlocks() { return &Kernel::kBlocks; }

namespace {
struct KernelExp {
  static Kernel::V Apply(Kernel::V x) { return Kernel::ExpNonPositive(x); }
};
}  // namespace

const BackwardEngine* XsimdNeonBackward() {
  return &xsimd_neon::Backward<Kernel::Ops, KernelExp>::kEngine;
}

}  // namespace qkv
