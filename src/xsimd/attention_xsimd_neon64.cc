// The xsimd engine for AArch64 Advanced SIMD (32 vector registers).
// Compiled with AArch64 baseline (src/xsimd/sources.cmake); the kernels are in
// attention_xsimd-inl.h, instantiated here once for xsimd::neon64.
#include "xsimd/attention_xsimd-inl.h"

QKV_XSIMD_DEFINE_ENGINE(XsimdNeon64Engine, "xsimd:neon64", xsimd::neon64, 8, false)
