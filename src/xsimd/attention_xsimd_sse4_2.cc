// The xsimd engine for SSE4.2: the FlashAttention
// pipeline (src/pipeline/flash-inl.h) over xsimd::sse4_2 (ops_xsimd-inl.h),
// compiled with that architecture's flags (src/xsimd/sources.cmake) inside
// its own namespace, so that nothing here shares a linkage name with code
// built for another instruction set.
#define QKV_SIMD_NAMESPACE xsimd_sse4_2
#define QKV_XSIMD_LIBRARY_NAMESPACE xsimd_sse4_2_library
#include "engine.h"
#include "pipeline/backward-inl.h"
#include "pipeline/flash-inl.h"
#include "xsimd/ops_xsimd-inl.h"

namespace qkv {

namespace {
using Kernel = xsimd_sse4_2::Flash<xsimd_sse4_2::XsimdOps<xsimd::sse4_2>>;
}  // namespace

const Engine* XsimdSse42Engine() {
  static constexpr Engine kEngine = Kernel::MakeEngine("xsimd:sse4.2");
  return &kEngine;
}

const PipelineBlocks* XsimdSse42Blocks() { return &Kernel::kBlocks; }

namespace {
struct KernelExp {
  static Kernel::V Apply(Kernel::V x) { return Kernel::ExpNonPositive(x); }
};
}  // namespace

const BackwardEngine* XsimdSse42Backward() {
  return &xsimd_sse4_2::Backward<Kernel::Ops, KernelExp>::kEngine;
}

}  // namespace qkv
