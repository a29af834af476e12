// The xsimd engine for ARMv7 NEON (16 quad registers).
// Compiled with -mfpu=neon-vfpv4 (src/xsimd/sources.cmake); the kernels are in
// attention_xsimd-inl.h, instantiated here once for xsimd::neon.
#include "xsimd/attention_xsimd-inl.h"

QKV_XSIMD_DEFINE_ENGINE(XsimdNeonEngine, "xsimd:neon", xsimd::neon, 4, false)
