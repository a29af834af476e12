// The xsimd engine for AVX-512 (F, CD, DQ, BW, VL; Skylake-X and later) with FMA.
// Compiled with -mavx512f -mavx512cd -mavx512dq -mavx512bw -mavx512vl -mfma (src/xsimd/sources.cmake); the kernels are in
// attention_xsimd-inl.h, instantiated here once for xsimd::avx512f.
// GCC 12's own AVX-512 intrinsics (_mm512_undefined_ps in
// _mm512_roundscale_round_ps, _mm512_cvttps_epi32, ...) trip a false
// -Wmaybe-uninitialized when inlined deep into xsimd::tanh, and a false
// -Wuninitialized in _mm512_unpacklo_ps and friends when inlined into the
// transposes at -O1 (the tsan build) (GCC bug 105593, fixed in GCC 13). The
// pragmas stay on for the whole file because GCC reports the warnings after
// inlining, at the end of the translation unit.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "xsimd/attention_xsimd-inl.h"

QKV_XSIMD_DEFINE_ENGINE(XsimdAvx512fEngine, "xsimd:avx512f", xsimd::avx512f, 8, true)
