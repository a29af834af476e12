// The xsimd engine for AArch64 Advanced SIMD: the FlashAttention
// pipeline (src/pipeline/flash-inl.h) over xsimd::neon64 (ops_xsimd-inl.h),
// compiled with that architecture's flags (src/xsimd/sources.cmake) inside
// its own namespace, so that nothing here shares a linkage name with code
// built for another instruction set.
#define QKV_SIMD_NAMESPACE xsimd_neon64
#define QKV_XSIMD_LIBRARY_NAMESPACE xsimd_neon64_library
#include "engine.h"
#include "pipeline/backward-inl.h"
#include "pipeline/flash-inl.h"
#include "xsimd/ops_xsimd-inl.h"

namespace qkv {

namespace {
using Kernel = xsimd_neon64::Flash<xsimd_neon64::XsimdOps<xsimd::neon64>>;
}  // namespace

const Engine* XsimdNeon64Engine() {
  static constexpr Engine kEngine = Kernel::MakeEngine("xsimd:neon64");
  return &kEngine;
}

const PipelineBlocks* XsimdNeon64Blocks() { return &Kernel::kBlocks; }

namespace {
struct KernelExp {
  static Kernel::V Apply(Kernel::V x) { return Kernel::ExpNonPositive(x); }
};
}  // namespace

const BackwardEngine* XsimdNeon64Backward() {
  return &xsimd_neon64::Backward<Kernel::Ops, KernelExp>::kEngine;
}

}  // namespace qkv
