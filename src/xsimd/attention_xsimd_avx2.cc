// The xsimd engine for AVX2 with FMA3 (Haswell and later).
// Compiled with -mavx2 -mfma (src/xsimd/sources.cmake); the kernels are in
// attention_xsimd-inl.h, instantiated here once for xsimd::fma3<xsimd::avx2>.
#include "xsimd/attention_xsimd-inl.h"

QKV_XSIMD_DEFINE_ENGINE(XsimdAvx2Engine, "xsimd:avx2", xsimd::fma3<xsimd::avx2>, 4, true)
