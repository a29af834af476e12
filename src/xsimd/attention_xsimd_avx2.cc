// The xsimd engine for AVX2 with FMA3 (Haswell and later): the FlashAttention
// pipeline (src/pipeline/flash-inl.h) over xsimd::fma3<avx2> (ops_xsimd-inl.h),
// compiled with that architecture's flags (src/xsimd/sources.cmake) inside
// its own namespace, so that nothing here shares a linkage name with code
// built for another instruction set.
#define QKV_SIMD_NAMESPACE xsimd_avx2
#define QKV_XSIMD_LIBRARY_NAMESPACE xsimd_avx2_library
#include "engine.h"
#include "pipeline/backward-inl.h"
#include "pipeline/flash-inl.h"
#include "xsimd/ops_xsimd-inl.h"

namespace qkv {

namespace {
using Kernel =
    xsimd_avx2::Flash<xsimd_avx2::XsimdOps<xsimd::fma3<xsimd::avx2>>>;
}  // namespace

const Engine* XsimdAvx2Engine() {
  static constexpr Engine kEngine = Kernel::MakeEngine("xsimd:avx2");
  return &kEngine;
}

const PipelineBlocks* XsimdAvx2Blocks() { return &Kernel::kBlocks; }

namespace {
struct KernelExp {
  static Kernel::V Apply(Kernel::V x) { return Kernel::ExpNonPositive(x); }
};
}  // namespace

const BackwardEngine* XsimdAvx2Backward() {
  return &xsimd_avx2::Backward<Kernel::Ops, KernelExp>::kEngine;
}

}  // namespace qkv
