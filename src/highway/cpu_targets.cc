// HighwayCpuTargets: the Highway targets (HWY_AVX2, HWY_SVE, ...) this CPU
// and OS can run, in place of libhwy's hwy::SupportedTargets(), so that
// libqkv needs nothing of libhwy at run time (Highway's headers only).
//
// The conditions are Highway 1.0.3's own (hwy/targets.cc, DetectTargets and
// SupportedTargets), i.e. every instruction-set extension its per-target
// code may be compiled with (hwy/ops/set_macros-inl.h, HWY_TARGET_STR_*):
//   SSSE3    SSE, SSE2, SSE3, SSSE3
//   SSE4     + SSE4.1, SSE4.2, PCLMULQDQ, AES
//   AVX2     + AVX, AVX2, LZCNT, BMI, BMI2, FMA, F16C; the OS saves YMM
//   AVX3     + AVX512F, AVX512VL, AVX512DQ, AVX512BW; the OS saves opmask/ZMM
//   AVX3_DL  + VNNI, VPCLMULQDQ, VBMI, VBMI2, VAES, VPOPCNTDQ, BITALG
//   NEON     (AArch64) AES (Highway compiles it with +crypto)
//   SVE      HWCAP_SVE; SVE_256: and a 256-bit vector length
//   SVE2     HWCAP2_SVE2 and HWCAP2_SVEAES (+sve2-aes); SVE2_128: 128 bits
// One difference, on the safe side: AVX2 and AVX3 also require OSXSAVE
// (Highway keeps them when the OS does not enable XSAVE at all). The OS's
// vector state comes from XGETBV, not only from CPUID.
//
// 32-bit Arm, WebAssembly and the rest: nothing beyond the emulated targets;
// the caller adds HWY_STATIC_TARGET, the baseline the compiler was given.
//
// This file is compiled with the baseline flags only (no per-target
// pragmas: it includes detect_targets.h, not foreach_target.h), so the
// detection itself runs on every CPU.
#include <stdint.h>

#include "hwy/detect_targets.h"

#if HWY_ARCH_X86 && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define QKV_HWY_DETECT_X86 1
#elif HWY_ARCH_ARM_A64 && defined(__linux__)
#include <sys/auxv.h>
#include <sys/prctl.h>
#define QKV_HWY_DETECT_A64 1
// Linux's AT_HWCAP/AT_HWCAP2 bits on AArch64 (asm/hwcap.h), should an old
// libc not define them.
#ifndef AT_HWCAP2
#define AT_HWCAP2 26
#endif
#ifndef HWCAP_AES
#define HWCAP_AES (1UL << 3)
#endif
#ifndef HWCAP_SVE
#define HWCAP_SVE (1UL << 22)
#endif
#ifndef HWCAP2_SVE2
#define HWCAP2_SVE2 (1UL << 1)
#endif
#ifndef HWCAP2_SVEAES
#define HWCAP2_SVEAES (1UL << 2)
#endif
#endif

namespace qkv {

namespace {

#if QKV_HWY_DETECT_X86
inline bool Bit(uint32_t reg, int index) { return ((reg >> index) & 1U) != 0; }

// XCR0, the vector state the OS saves (only valid with OSXSAVE).
uint32_t ReadXcr0() {
  uint32_t lo, hi;
  __asm__ __volatile__(".byte 0x0f, 0x01, 0xd0"  // xgetbv, without -mxsave
                       : "=a"(lo), "=d"(hi)
                       : "c"(0));
  (void)hi;
  return lo;
}

int64_t DetectX86() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  // (GCC's __get_cpuid_max returns unsigned, clang's int.)
  const unsigned max_level = static_cast<unsigned>(__get_cpuid_max(0, nullptr));
  if (max_level < 1) return 0;
  __cpuid_count(1, 0, a, b, c, d);
  const bool sse = Bit(d, 25), sse2 = Bit(d, 26);
  const bool sse3 = Bit(c, 0), pclmul = Bit(c, 1), ssse3 = Bit(c, 9),
             fma = Bit(c, 12), sse41 = Bit(c, 19), sse42 = Bit(c, 20),
             aes = Bit(c, 25), osxsave = Bit(c, 27), avx = Bit(c, 28),
             f16c = Bit(c, 29);

  bool lzcnt = false;
  if (static_cast<unsigned>(__get_cpuid_max(0x80000000U, nullptr)) >=
      0x80000001U) {
    __cpuid_count(0x80000001U, 0, a, b, c, d);
    lzcnt = Bit(c, 5);
  }

  bool bmi = false, avx2 = false, bmi2 = false, avx512f = false,
       avx512dq = false, avx512bw = false, avx512vl = false, vbmi = false,
       vbmi2 = false, vaes = false, vpclmulqdq = false, vnni = false,
       bitalg = false, vpopcntdq = false;
  if (max_level >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    bmi = Bit(b, 3);
    avx2 = Bit(b, 5);
    bmi2 = Bit(b, 8);
    avx512f = Bit(b, 16);
    avx512dq = Bit(b, 17);
    avx512bw = Bit(b, 30);
    avx512vl = Bit(b, 31);
    vbmi = Bit(c, 1);
    vbmi2 = Bit(c, 6);
    vaes = Bit(c, 9);
    vpclmulqdq = Bit(c, 10);
    vnni = Bit(c, 11);
    bitalg = Bit(c, 12);
    vpopcntdq = Bit(c, 14);
  }

  // The register state the OS saves and restores: XMM (bit 1), YMM (2),
  // opmask and the upper and high ZMM registers (5, 6, 7).
  bool os_xmm = true, os_ymm = false, os_zmm = false;
  if (osxsave) {
    const uint32_t xcr0 = ReadXcr0();
    os_xmm = Bit(xcr0, 1);
    os_ymm = os_xmm && Bit(xcr0, 2);
    os_zmm = os_ymm && Bit(xcr0, 5) && Bit(xcr0, 6) && Bit(xcr0, 7);
  }

  const bool has_ssse3 = sse && sse2 && sse3 && ssse3 && os_xmm;
  const bool has_sse4 = has_ssse3 && sse41 && sse42 && pclmul && aes;
  const bool has_avx2 = has_sse4 && os_ymm && avx && avx2 && lzcnt &&
#if !defined(HWY_DISABLE_BMI2_FMA)
                        bmi && bmi2 && fma &&
#endif
#if !defined(HWY_DISABLE_F16C)
                        f16c &&
#endif
                        true;
  const bool has_avx3 =
      has_avx2 && os_zmm && avx512f && avx512vl && avx512dq && avx512bw;
  const bool has_avx3_dl = has_avx3 && vnni && vpclmulqdq && vbmi && vbmi2 &&
                           vaes && vpopcntdq && bitalg;
  (void)bmi, (void)bmi2, (void)fma, (void)f16c;

  int64_t bits = 0;
  if (has_ssse3) bits |= HWY_SSSE3;
  if (has_sse4) bits |= HWY_SSE4;
  if (has_avx2) bits |= HWY_AVX2;
  if (has_avx3) bits |= HWY_AVX3;
  if (has_avx3_dl) bits |= HWY_AVX3_DL;
  return bits;
}
#endif  // QKV_HWY_DETECT_X86

#if QKV_HWY_DETECT_A64
int64_t DetectA64() {
  const unsigned long hw = getauxval(AT_HWCAP);    // NOLINT(runtime/int)
  const unsigned long hw2 = getauxval(AT_HWCAP2);  // NOLINT(runtime/int)
  int64_t bits = 0;
  // Advanced SIMD is part of every AArch64 CPU; AES is not.
  if ((hw & HWCAP_AES) != 0) bits |= HWY_NEON;
  if ((hw & HWCAP_SVE) != 0) bits |= HWY_SVE;
  if ((hw2 & HWCAP2_SVE2) != 0 && (hw2 & HWCAP2_SVEAES) != 0) {
    bits |= HWY_SVE2;
  }
  // The targets for one vector length: Highway asks its SVE code (svcntb);
  // the kernel tells the same without an SVE instruction here.
#if defined(PR_SVE_GET_VL) && defined(PR_SVE_VL_LEN_MASK)
  if ((bits & (HWY_SVE | HWY_SVE2)) != 0) {
    const int vl = prctl(PR_SVE_GET_VL, 0, 0, 0, 0);
    const int vec_bytes = vl < 0 ? 0 : (vl & PR_SVE_VL_LEN_MASK);
    if ((bits & HWY_SVE) != 0 && vec_bytes == 32) bits |= HWY_SVE_256;
    if ((bits & HWY_SVE2) != 0 && vec_bytes == 16) bits |= HWY_SVE2_128;
  }
#endif
  return bits;
}
#endif  // QKV_HWY_DETECT_A64

}  // namespace

int64_t HighwayCpuTargets() {
  // The emulated targets are plain C++ compiled for the baseline.
  int64_t bits = HWY_SCALAR | HWY_EMU128;
#if QKV_HWY_DETECT_X86
  bits |= DetectX86();
#elif QKV_HWY_DETECT_A64
  bits |= DetectA64();
#endif
  return bits;
}

}  // namespace qkv
