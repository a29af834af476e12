// The xsimd engine for AVX-512 (the Skylake-X set): the FlashAttention
// pipeline (src/pipeline/flash-inl.h) over xsimd::avx512f (ops_xsimd-inl.h),
// compiled with that architecture's flags (src/xsimd/sources.cmake) inside
// its own namespace, so that nothing here shares a linkage name with code
// built for another instruction set.
// GCC 12 warns falsely of uninitialized values in _mm512_unpack*_ps inlined
// into the transposes at -O1 (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#define QKV_SIMD_NAMESPACE xsimd_avx512f
#define QKV_XSIMD_LIBRARY_NAMESPACE xsimd_avx512f_library
#include "engine.h"
#include "pipeline/backward-inl.h"
#include "pipeline/flash-inl.h"
#include "xsimd/ops_xsimd-inl.h"

namespace qkv {

namespace {
using Kernel = xsimd_avx512f::Flash<xsimd_avx512f::XsimdOps<xsimd::avx512f>>;
}  // namespace

const Engine* XsimdAvx512fEngine() {
  static constexpr Engine kEngine = Kernel::MakeEngine("xsimd:avx512f");
  return &kEngine;
}

const PipelineBlocks* XsimdAvx512fBlocks() { return &Kernel::kBlocks; }

namespace {
struct KernelExp {
  static Kernel::V Apply(Kernel::V x) { return Kernel::ExpNonPositive(x); }
};
}  // namespace

const BackwardEngine* XsimdAvx512fBackward() {
  return &xsimd_avx512f::Backward<Kernel::Ops, KernelExp>::kEngine;
}

}  // namespace qkv
