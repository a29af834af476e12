// XsimdEngines: the xsimd engines this build compiled (one per architecture,
// see sources.cmake) whose instruction set this CPU supports, best first.
//
// The CPU check is ours, not xsimd::available_architectures() or
// xsimd::dispatch: in xsimd 8.1 those keep the result in a function-local
// static, which needs the C++ runtime's guard functions (__cxa_guard_*), and
// libqkv.a must not reference the C++ runtime. The check runs once, when the
// engine list is made (src/dispatch.cc).
//
// This file is compiled with the baseline flags; the per-architecture files
// keep their code in per-architecture namespaces (and shared headers'
// helpers have internal linkage), so no object built for one instruction set
// defines a symbol another can bind to.
#include "engine.h"

#if QKV_XSIMD_AVX2
#include <cpuid.h>
#endif
#if QKV_XSIMD_NEON && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#ifndef HWCAP_NEON
#define HWCAP_NEON (1 << 12)  // 32-bit ARM Linux's AT_HWCAP bit for NEON
#endif
#endif

namespace qkv {

#if QKV_XSIMD_AVX512F
const Engine* XsimdAvx512fEngine();
const PipelineBlocks* XsimdAvx512fBlocks();
const BackwardEngine* XsimdAvx512fBackward();
#endif
#if QKV_XSIMD_AVX2
const Engine* XsimdAvx2Engine();
const PipelineBlocks* XsimdAvx2Blocks();
const BackwardEngine* XsimdAvx2Backward();
#endif
#if QKV_XSIMD_SSE4_2
const Engine* XsimdSse42Engine();
const PipelineBlocks* XsimdSse42Blocks();
const BackwardEngine* XsimdSse42Backward();
#endif
#if QKV_XSIMD_NEON64
const Engine* XsimdNeon64Engine();
const PipelineBlocks* XsimdNeon64Blocks();
const BackwardEngine* XsimdNeon64Backward();
#endif
#if QKV_XSIMD_NEON
const Engine* XsimdNeonEngine();
const PipelineBlocks* XsimdNeonBlocks();
const BackwardEngine* XsimdNeonBackward();
#endif

const PipelineBlocks* XsimdBlocks(const Engine* engine) {
#if QKV_XSIMD_AVX512F
  if (engine == XsimdAvx512fEngine()) return XsimdAvx512fBlocks();
#endif
#if QKV_XSIMD_AVX2
  if (engine == XsimdAvx2Engine()) return XsimdAvx2Blocks();
#endif
#if QKV_XSIMD_SSE4_2
  if (engine == XsimdSse42Engine()) return XsimdSse42Blocks();
#endif
#if QKV_XSIMD_NEON64
  if (engine == XsimdNeon64Engine()) return XsimdNeon64Blocks();
#endif
#if QKV_XSIMD_NEON
  if (engine == XsimdNeonEngine()) return XsimdNeonBlocks();
#endif
  (void)engine;
  return nullptr;
}

const BackwardEngine* XsimdBackward(const Engine* engine) {
#if QKV_XSIMD_AVX512F
  if (engine == XsimdAvx512fEngine()) return XsimdAvx512fBackward();
#endif
#if QKV_XSIMD_AVX2
  if (engine == XsimdAvx2Engine()) return XsimdAvx2Backward();
#endif
#if QKV_XSIMD_SSE4_2
  if (engine == XsimdSse42Engine()) return XsimdSse42Backward();
#endif
#if QKV_XSIMD_NEON64
  if (engine == XsimdNeon64Engine()) return XsimdNeon64Backward();
#endif
#if QKV_XSIMD_NEON
  if (engine == XsimdNeonEngine()) return XsimdNeonBackward();
#endif
  (void)engine;
  return nullptr;
}

size_t XsimdEngines(const Engine** out, size_t max) {
  size_t n = 0;
  auto add = [&](const Engine* e) {
    if (n < max) out[n++] = e;
  };
#if QKV_XSIMD_AVX512F || QKV_XSIMD_AVX2 || QKV_XSIMD_SSE4_2
  // libgcc's cpu model also checks that the OS saves the AVX and AVX-512
  // register state (XGETBV), not only the CPUID bits.
  __builtin_cpu_init();
#endif
#if QKV_XSIMD_AVX512F
  // The file is compiled for the Skylake-X set; FMA comes with every AVX-512
  // CPU but is checked anyway.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma")) {
    add(XsimdAvx512fEngine());
  }
#endif
#if QKV_XSIMD_AVX2
  // F16C (binary16 loads) comes with every AVX2 CPU, as Highway's AVX2
  // target assumes; checked anyway, with CPUID (leaf 1, ECX): clang 14's
  // __builtin_cpu_supports has no "f16c".
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c =
      __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      f16c) {
    add(XsimdAvx2Engine());
  }
#endif
#if QKV_XSIMD_SSE4_2
  if (__builtin_cpu_supports("sse4.2")) add(XsimdSse42Engine());
#endif
#if QKV_XSIMD_NEON64
  add(XsimdNeon64Engine());  // Advanced SIMD is part of every AArch64 CPU
#endif
#if QKV_XSIMD_NEON
#if defined(__linux__)
  if ((getauxval(AT_HWCAP) & HWCAP_NEON) != 0) add(XsimdNeonEngine());
#else
  // No portable way to ask: the build targets a NEON CPU (-mfpu=neon).
  add(XsimdNeonEngine());
#endif
#endif
  return n;
}

}  // namespace qkv
