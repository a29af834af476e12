// The pipeline's vector operations (src/pipeline/flash-inl.h) in xsimd 8.1
// (Debian's libxsimd-dev): XsimdOps<A> for an xsimd architecture A. Each
// attention_xsimd_<arch>.cc includes this with its architecture's compiler
// flags, inside its own namespace (QKV_SIMD_NAMESPACE), so copies compiled
// with different flags never share a linkage name.
#ifndef QKV_SRC_XSIMD_OPS_XSIMD_INL_H_
#define QKV_SRC_XSIMD_OPS_XSIMD_INL_H_

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#ifndef QKV_SIMD_NAMESPACE
#error "define QKV_SIMD_NAMESPACE (the per-architecture namespace) first"
#endif
#ifndef QKV_XSIMD_LIBRARY_NAMESPACE
#error "define QKV_XSIMD_LIBRARY_NAMESPACE (xsimd's own, renamed) first"
#endif

// xsimd's own inline code, renamed per architecture: the AVX-512 object
// also uses xsimd's AVX2 and SSE4.2 types (the tiny path's narrower
// vectors), and without the renaming their out-of-line copies, compiled with
// AVX-512 flags, would share linkage names with the AVX2 and SSE4.2
// objects' copies (in unoptimized builds, where they are not inlined).
// Every name xsimd:: in this object, xsimd's and ours, is the renamed one.
#define xsimd QKV_XSIMD_LIBRARY_NAMESPACE
#include <xsimd/xsimd.hpp>

// In-register square transposes (src/transpose_x86.h) for the architecture
// this file is compiled for: 16 x 16 with AVX-512, 8 x 8 with AVX2.
#undef QKV_TRANSPOSE_BITS
#if defined(__AVX512F__)
#define QKV_TRANSPOSE_BITS 512
#elif defined(__AVX2__)
#define QKV_TRANSPOSE_BITS 256
#endif

namespace qkv {
namespace QKV_SIMD_NAMESPACE {

#ifdef QKV_TRANSPOSE_BITS
#include "transpose_x86.h"
#endif

template <class A>
struct XsimdOps {
  using V = xsimd::batch<float, A>;
  using VI = xsimd::batch<int32_t, A>;
  using M = xsimd::batch_bool<float, A>;

  static constexpr bool kAvx512 = std::is_same<A, xsimd::avx512f>::value;
  static constexpr bool kAvx2 =
      std::is_same<A, xsimd::fma3<xsimd::avx2>>::value;
  // Register tiles: 8 with 32 vector registers (AVX-512, AArch64 NEON), 4
  // with 16; Flash<O>::TileUnroll derives the tile's steps from it.
  static constexpr int kUnroll =
      kAvx512 || std::is_same<A, xsimd::neon64>::value ? 8 : 4;
  // Full tiles of Q are packed, and the transposed output unpacked, by
  // hardware gathers (AVX2, AVX-512); elsewhere by scalar code, which is
  // what xsimd's generic gather does anyway.
  static constexpr bool kGatherTiles = kAvx512 || kAvx2;
  // N x N in-register transposes where this file has them for A's width.
#if QKV_TRANSPOSE_BITS == 512
  static constexpr size_t kTransposeLanes = kAvx512 ? 16 : 0;
#elif QKV_TRANSPOSE_BITS == 256
  static constexpr size_t kTransposeLanes = kAvx2 ? 8 : 0;
#else
  static constexpr size_t kTransposeLanes = 0;
#endif

  static constexpr size_t Lanes() { return V::size; }
  static V Zero() { return V(0.0f); }
  static V Set(float x) { return V(x); }
  static V Load(const float* p) { return V::load_aligned(p); }
  static V LoadU(const float* p) { return V::load_unaligned(p); }
  // v kept in a register: GCC folds a load used twice into both uses as
  // memory operands, loading it twice (RowScores8).
  static V InRegister(V v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    asm("" : "+v"(v.data));
#endif
    return v;
  }
  static void Store(const V& v, float* p) { v.store_aligned(p); }
  static void StoreU(const V& v, float* p) { v.store_unaligned(p); }
  static V Add(const V& a, const V& b) { return a + b; }
  static V Sub(const V& a, const V& b) { return a - b; }
  static V Mul(const V& a, const V& b) { return a * b; }
  static V Div(const V& a, const V& b) { return a / b; }
  static V Max(const V& a, const V& b) { return xsimd::max(a, b); }
  static M Lt(const V& a, const V& b) { return a < b; }
  static M Gt(const V& a, const V& b) { return a > b; }
  static M Eq(const V& a, const V& b) { return a == b; }
  static V IfThenElse(const M& m, const V& a, const V& b) {
    return xsimd::select(m, a, b);
  }
  static V IfThenElseZero(const M& m, const V& a) {
    return xsimd::select(m, a, Zero());
  }
  static V IfThenZeroElse(const M& m, const V& a) {
    return xsimd::select(m, Zero(), a);
  }

  // x * y + z, fused where the target has FMA. xsimd 8.1 has no avx512f
  // kernel for fma (its generic one multiplies, then adds), so AVX-512 calls
  // the intrinsic; elsewhere xsimd::fma is fused (fma3<avx2>, NEON VFPv4) or
  // a multiply then an add (sse4_2, like Highway's SSE4 target).
  static V MulAdd(const V& x, const V& y, const V& z) {
#if defined(__AVX512F__)
    if constexpr (kAvx512) return V(_mm512_fmadd_ps(x, y, z));
#endif
#if defined(__FMA__) && (defined(__x86_64__) || defined(__i386__))
    // sse4_2 vectors inside an FMA-capable object: the tiny path's 4-lane
    // vectors in the AVX2 and AVX-512 engines (the sse4.2 engine itself is
    // compiled without FMA and multiplies, then adds).
    if constexpr (std::is_same<A, xsimd::sse4_2>::value) {
      return V(_mm_fmadd_ps(x, y, z));
    }
#endif
    return xsimd::fma(x, y, z);
  }

  static float First(const V& v) { return v.get(0); }
  // xsimd 8.1 has no max reduction: finished in scalar code.
  static float ReduceMax(const V& v) {
    alignas(64) float lanes[V::size];
    v.store_aligned(lanes);
    float m = lanes[0];
    for (size_t i = 1; i < V::size; ++i) m = lanes[i] > m ? lanes[i] : m;
    return m;
  }
  static float ReduceSum(const V& v) { return xsimd::hadd(v); }

  // 2^n from t = n + 1.5 * 2^23 (n in the low mantissa bits, two's
  // complement): shifted into the exponent field with the bias added.
  static V Pow2FromRounded(const V& t) {
    return xsimd::bitwise_cast<V>((xsimd::bitwise_cast<VI>(t) << 23) +
                                  VI(127 << 23));
  }

  // xsimd::tanh (from Boost.SIMD: a polynomial for |x| < 5/8,
  // 1 - 2 / (1 + exp(2|x|)) beyond).
  static V Tanh(const V& x) { return xsimd::tanh(x); }

  // Lanes() elements of a low-precision K/V row widened to f32, exactly
  // (the K/V block source, src/pipeline/flash-inl.h); reads exactly
  // Lanes() elements. xsimd 8.1 has no widening loads (its converting
  // load_as goes through a scalar loop): they are the architecture's
  // intrinsics here, the rest xsimd integer operations.
  static VI WidenU16(const uint16_t* p) {
#if defined(__AVX512F__)
    if constexpr (kAvx512) {
      return VI(_mm512_cvtepu16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
    }
#endif
#if defined(__AVX2__)
    if constexpr (std::is_same<A, xsimd::fma3<xsimd::avx2>>::value ||
                  std::is_same<A, xsimd::avx2>::value) {
      return VI(_mm256_cvtepu16_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    }
#endif
#if defined(__SSE4_1__)
    if constexpr (std::is_same<A, xsimd::sse4_2>::value) {
      return VI(_mm_cvtepu16_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    }
#endif
#if defined(__ARM_NEON) || defined(__ARM_NEON__)
    if constexpr (V::size == 4) {
      return VI(vreinterpretq_s32_u32(vmovl_u16(vld1_u16(p))));
    }
#endif
    alignas(64) int32_t lanes[V::size];
    for (size_t i = 0; i < V::size; ++i) lanes[i] = p[i];
    return VI::load_aligned(lanes);
  }

  static VI WidenI8(const int8_t* p) {
#if defined(__AVX512F__)
    if constexpr (kAvx512) {
      return VI(_mm512_cvtepi8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    }
#endif
#if defined(__AVX2__)
    if constexpr (std::is_same<A, xsimd::fma3<xsimd::avx2>>::value ||
                  std::is_same<A, xsimd::avx2>::value) {
      return VI(_mm256_cvtepi8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    }
#endif
#if defined(__SSE4_1__)
    if constexpr (std::is_same<A, xsimd::sse4_2>::value) {
      int32_t w;
      memcpy(&w, p, 4);
      return VI(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(w)));
    }
#endif
#if defined(__ARM_NEON) || defined(__ARM_NEON__)
    if constexpr (V::size == 4) {
      int32_t w;
      memcpy(&w, p, 4);  // 4 bytes, not vld1_s8's 8
      const int16x8_t h = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(w)));
      return VI(vmovl_s16(vget_low_s16(h)));
    }
#endif
    alignas(64) int32_t lanes[V::size];
    for (size_t i = 0; i < V::size; ++i) lanes[i] = p[i];
    return VI::load_aligned(lanes);
  }

  // binary16: the F16C conversion instruction on AVX-512F and AVX2 (S1
  // decoding with the integer operations measured far slower on AVX2:
  // bench/README.md, "Low-precision K/V caches"), elsewhere integer
  // operations as in semantics.h's F16ToF32 (no subnormal f32 arithmetic,
  // which ARMv7 NEON flushes).
  static V LoadF16(const uint16_t* p) {
#if defined(__AVX512F__)
    if constexpr (kAvx512) {
      return V(_mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
    }
#endif
#if defined(__F16C__) && defined(__AVX2__)
    if constexpr (kAvx2) {
      return V(_mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    }
#endif
    const VI h = WidenU16(p);
    const VI exp = h & VI(0x7c00);
    const VI mag = (h & VI(0x7fff)) << 13;
    const VI normal = mag + VI(112 << 23);
    const VI special = mag | VI(0x7f800000);
    const VI sub = xsimd::bitwise_cast<VI>(
        xsimd::to_float(h & VI(0x3ff)) * V(5.9604644775390625e-8f));
    const VI bits = xsimd::select(
        exp == VI(0), sub, xsimd::select(exp == VI(0x7c00), special, normal));
    return xsimd::bitwise_cast<V>(bits | ((h & VI(0x8000)) << 16));
  }
  // bfloat16: the f32's upper half.
  static V LoadBF16(const uint16_t* p) {
    return xsimd::bitwise_cast<V>(WidenU16(p) << 16);
  }
  // int8: the integer's value (the caller applies the row's scale).
  static V LoadI8(const int8_t* p) { return xsimd::to_float(WidenI8(p)); }

  // Lane i = base[i * stride] (kGatherTiles only).
  static V GatherStrided(const float* base, int32_t stride) {
    alignas(64) int32_t offsets[V::size];
    for (size_t u = 0; u < V::size; ++u) {
      offsets[u] = static_cast<int32_t>(u) * stride;
    }
    return V::gather(base, VI::load_aligned(offsets));
  }

  // dst[i] = base[i * stride] for i < count, 0 for the other lanes (one
  // vector), by scalar copies (the tiny path: at most 16 rows).
  static void StoreRows(const float* base, int32_t stride, int32_t count,
                        float* dst) {
    for (int32_t u = 0; u < static_cast<int32_t>(V::size); ++u) {
      dst[u] = u < count ? base[u * stride] : 0.0f;
    }
  }

  // v[i] = row i in, column i out, for a kTransposeLanes-square block.
  // Always inlined, as Highway's: out of line, the block goes through
  // memory (xsimd:avx2 S3 measured slower when GCC stopped inlining it
  // after an unrelated change: bench/README.md, "Keys prefetched during
  // the values on AMD").
  static inline __attribute__((always_inline)) void Transpose(V* v) {
#ifdef QKV_TRANSPOSE_BITS
    if constexpr (kTransposeLanes != 0) {
      typename V::register_type raw[kTransposeLanes];
      for (size_t i = 0; i < kTransposeLanes; ++i) raw[i] = v[i];
      TransposeRegisters(raw);
      for (size_t i = 0; i < kTransposeLanes; ++i) v[i] = V(raw[i]);
    }
#else
    (void)v;
#endif
  }

  // Lane i: the sum of v[i]'s lanes, for kTransposeLanes vectors (16 of
  // 16 lanes, 8 of 8), in the order Transpose and a tree of pairwise adds
  // of adjacent lanes give: the same bits, fewer shuffles.
  static inline __attribute__((always_inline)) V SumLanes(const V* v) {
#if QKV_TRANSPOSE_BITS
    if constexpr (kTransposeLanes != 0) {
      typename V::register_type raw[kTransposeLanes];
      for (size_t i = 0; i < kTransposeLanes; ++i) raw[i] = v[i];
      return V(SumRegisters(raw));
    }
#endif
    return v[0];  // never called without kTransposeLanes
  }

  // out[0..3]: the lane sums of a, b, c, d, the same bits as ReduceSum of
  // each (xsimd's hadd order), in about a third of the shuffles.
  static inline __attribute__((always_inline)) void SumLanes4(
      const V& a, const V& b, const V& c, const V& d, float* out) {
#if QKV_TRANSPOSE_BITS
    if constexpr (kTransposeLanes != 0) {
      _mm_storeu_ps(out, SumRegisters4<true>(a, b, c, d));
      return;
    }
#endif
    out[0] = ReduceSum(a);
    out[1] = ReduceSum(b);
    out[2] = ReduceSum(c);
    out[3] = ReduceSum(d);
  }

  // The tiny path's narrower vectors (x86: 4 lanes for up to 4 keys, 8 for
  // up to 8): cheaper reductions and selects than full-width ones. The same
  // type where there are none.
#if XSIMD_WITH_SSE4_2
  using Narrow4 = typename std::conditional<(V::size > 4),
                                            XsimdOps<xsimd::sse4_2>,
                                            XsimdOps<A>>::type;
#else
  using Narrow4 = XsimdOps<A>;
#endif
#if XSIMD_WITH_FMA3_AVX2
  using Narrow8 =
      typename std::conditional<(V::size > 8),
                                XsimdOps<xsimd::fma3<xsimd::avx2>>,
                                XsimdOps<A>>::type;
#else
  using Narrow8 = XsimdOps<A>;
#endif
};

}  // namespace QKV_SIMD_NAMESPACE
}  // namespace qkv

#endif  // QKV_SRC_XSIMD_OPS_XSIMD_INL_H_
