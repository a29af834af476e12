// The xsimd engine for SSE4.2 (no FMA: xsimd::fma is a multiply then an add, as in Highway's SSE4 target).
// Compiled with -msse4.2 (src/xsimd/sources.cmake); the kernels are in
// attention_xsimd-inl.h, instantiated here once for xsimd::sse4_2.
#include "xsimd/attention_xsimd-inl.h"

QKV_XSIMD_DEFINE_ENGINE(XsimdSse42Engine, "xsimd:sse4.2", xsimd::sse4_2, 4, false)
