// The pipeline's vector operations (src/pipeline/flash-inl.h) in Highway:
// HwyOps<D> for a descriptor D, the target's full vector (ScalableTag) or a
// capped one (the tiny path's narrower vectors). Compiled once per Highway
// target: included by attention_hwy.cc inside foreach_target's passes, with
// a per-target include guard (Highway's -inl.h convention).
#if defined(QKV_HIGHWAY_OPS_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_HIGHWAY_OPS_HWY_INL_H_
#undef QKV_HIGHWAY_OPS_HWY_INL_H_
#else
#define QKV_HIGHWAY_OPS_HWY_INL_H_
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <type_traits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

// In-register transposes of square blocks (src/transpose_x86.h) where
// shuffles beat gathers: 16 x 16 on AVX-512, 8 x 8 on AVX2. Elsewhere the
// tiles use gathers (and no array of vectors is ever made: SVE vectors are
// sizeless and cannot be array elements).
#undef QKV_HWY_TRANSPOSE_LANES
#undef QKV_TRANSPOSE_BITS
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define QKV_TRANSPOSE_BITS (HWY_TARGET <= HWY_AVX3 ? 512 : 256)
#define QKV_HWY_TRANSPOSE_LANES (QKV_TRANSPOSE_BITS / 32)
#else
#define QKV_HWY_TRANSPOSE_LANES 0
#endif

HWY_BEFORE_NAMESPACE();
namespace qkv {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

#if QKV_HWY_TRANSPOSE_LANES
#include "transpose_x86.h"
#endif

template <class D>
struct HwyOps {
  using V = hn::Vec<D>;
  using M = hn::Mask<D>;

  // Register tiles: 8 for targets with 32 vector registers (AVX-512, NEON,
  // SVE), 4 for the 16-register ones; Flash<O>::TileUnroll derives the
  // tile's steps from it.
#if HWY_ARCH_ARM || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  static constexpr int kUnroll = 8;
#else
  static constexpr int kUnroll = 4;
#endif
  // Full tiles of Q are packed, and the transposed output unpacked, by
  // gathers (hardware on AVX2/AVX-512/SVE, emulated elsewhere).
  static constexpr bool kGatherTiles = true;
  static constexpr bool kFullWidth =
      std::is_same<D, hn::ScalableTag<float>>::value;
  // N x N in-register transposes for whole blocks, 0 where there are none.
  static constexpr size_t kTransposeLanes =
      kFullWidth ? QKV_HWY_TRANSPOSE_LANES : 0;

  static HWY_INLINE size_t Lanes() { return hn::Lanes(D()); }
  static HWY_INLINE V Zero() { return hn::Zero(D()); }
  static HWY_INLINE V Set(float x) { return hn::Set(D(), x); }
  static HWY_INLINE V Load(const float* p) { return hn::Load(D(), p); }
  static HWY_INLINE V LoadU(const float* p) { return hn::LoadU(D(), p); }
  // v kept in a register: GCC folds a load used twice into both uses as
  // memory operands, loading it twice (RowScores8).
  static HWY_INLINE V InRegister(V v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4 && defined(__GNUC__)
    asm("" : "+v"(v.raw));
#endif
    return v;
  }
  static HWY_INLINE void Store(V v, float* p) { hn::Store(v, D(), p); }
  static HWY_INLINE void StoreU(V v, float* p) { hn::StoreU(v, D(), p); }
  static HWY_INLINE V Add(V a, V b) { return hn::Add(a, b); }
  static HWY_INLINE V Sub(V a, V b) { return hn::Sub(a, b); }
  static HWY_INLINE V Mul(V a, V b) { return hn::Mul(a, b); }
  static HWY_INLINE V Div(V a, V b) { return hn::Div(a, b); }
  static HWY_INLINE V MulAdd(V a, V b, V c) { return hn::MulAdd(a, b, c); }
  static HWY_INLINE V Max(V a, V b) { return hn::Max(a, b); }
  static HWY_INLINE M Lt(V a, V b) { return hn::Lt(a, b); }
  static HWY_INLINE M Gt(V a, V b) { return hn::Gt(a, b); }
  static HWY_INLINE M Eq(V a, V b) { return hn::Eq(a, b); }
  static HWY_INLINE V IfThenElse(M m, V a, V b) {
    return hn::IfThenElse(m, a, b);
  }
  static HWY_INLINE V IfThenElseZero(M m, V a) {
    return hn::IfThenElseZero(m, a);
  }
  static HWY_INLINE V IfThenZeroElse(M m, V a) {
    return hn::IfThenZeroElse(m, a);
  }
  static HWY_INLINE float First(V v) { return hn::GetLane(v); }
  static HWY_INLINE float ReduceMax(V v) {
    return hn::GetLane(hn::MaxOfLanes(D(), v));
  }
  static HWY_INLINE float ReduceSum(V v) {
    return hn::GetLane(hn::SumOfLanes(D(), v));
  }

  // 2^n from t = n + 1.5 * 2^23 (n in the low mantissa bits, two's
  // complement): shifted into the exponent field with the bias added.
  static HWY_INLINE V Pow2FromRounded(V t) {
    const hn::RebindToSigned<D> di;
    return hn::BitCast(D(), hn::Add(hn::ShiftLeft<23>(hn::BitCast(di, t)),
                                    hn::Set(di, 127 << 23)));
  }

  // tanh for additive scores (Highway's contrib Tanh). Highway 1.0.3's
  // EMU128 target converts NaN to int32 with a plain cast inside Tanh
  // (undefined behaviour); there NaN lanes go through as 0 and come out as
  // the NaN they were.
  static HWY_INLINE V Tanh(V x) {
#if HWY_TARGET == HWY_EMU128
    const M nan = hn::Ne(x, x);
    return hn::IfThenElse(nan, x, hn::Tanh(D(), hn::IfThenZeroElse(nan, x)));
#else
    return hn::Tanh(D(), x);
#endif
  }

  // Lanes() elements of a low-precision K/V row widened to f32, exactly
  // (the K/V block source, src/pipeline/flash-inl.h); reads exactly
  // Lanes() elements.
  // binary16: the conversion instruction where the target has one (F16C on
  // AVX2 and AVX-512, AArch64 NEON and SVE), else integer operations, as in
  // semantics.h's F16ToF32 (Highway 1.0.3's emulated PromoteTo turns inf and
  // NaN into finite values).
  static HWY_INLINE V LoadF16(const uint16_t* p) {
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)) || \
    HWY_ARCH_ARM_A64
    const hn::Rebind<hwy::float16_t, D> dh;
    return hn::PromoteTo(D(),
                         hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#else
    const hn::Rebind<uint16_t, D> d16;
    const hn::RebindToUnsigned<D> du;
    const hn::RebindToSigned<D> di;
    const auto h = hn::PromoteTo(du, hn::LoadU(d16, p));
    const auto exp = hn::And(h, hn::Set(du, 0x7c00u));
    const auto mag = hn::ShiftLeft<13>(hn::And(h, hn::Set(du, 0x7fffu)));
    const auto normal = hn::Add(mag, hn::Set(du, 112u << 23));
    const auto special = hn::Or(mag, hn::Set(du, 0x7f800000u));
    const auto sub = hn::BitCast(
        du, hn::Mul(hn::ConvertTo(D(), hn::BitCast(di, hn::And(h, hn::Set(du, 0x3ffu)))),
                    hn::Set(D(), 5.9604644775390625e-8f)));  // 2^-24
    const auto bits = hn::IfThenElse(
        hn::Eq(exp, hn::Zero(du)), sub,
        hn::IfThenElse(hn::Eq(exp, hn::Set(du, 0x7c00u)), special, normal));
    const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
    return hn::BitCast(D(), hn::Or(bits, sign));
#endif
  }
  // bfloat16: the f32's upper half.
  static HWY_INLINE V LoadBF16(const uint16_t* p) {
    const hn::Rebind<uint16_t, D> d16;
    const hn::RebindToUnsigned<D> du;
    return hn::BitCast(D(), hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p))));
  }
  // int8: the integer's value (the caller applies the row's scale).
  static HWY_INLINE V LoadI8(const int8_t* p) {
    const hn::Rebind<int8_t, D> d8;
    const hn::RebindToSigned<D> di;
    return hn::ConvertTo(D(), hn::PromoteTo(di, hn::LoadU(d8, p)));
  }

  // Lane i = base[i * stride].
  static HWY_INLINE V GatherStrided(const float* base, int32_t stride) {
    const hn::RebindToSigned<D> di;
    return hn::GatherIndex(D(), base,
                           hn::Mul(hn::Iota(di, 0), hn::Set(di, stride)));
  }

  // dst[i] = base[i * stride] for i < count, 0 for the other lanes (dst
  // aligned, one vector); nothing past row count - 1 is read
  // (1 <= count <= Lanes()).
  static HWY_INLINE void StoreRows(const float* base, int32_t stride,
                                   int32_t count, float* dst) {
    const hn::RebindToSigned<D> di;
    const auto i = hn::Iota(di, 0);
    const auto idx = hn::Mul(hn::Min(i, hn::Set(di, count - 1)),
                             hn::Set(di, stride));
    const auto real = hn::RebindMask(D(), hn::Lt(i, hn::Set(di, count)));
    hn::Store(hn::IfThenElseZero(real, hn::GatherIndex(D(), base, idx)), D(),
              dst);
  }

  // Lane i: the sum of v[i]'s lanes, for kTransposeLanes vectors (16 of
  // 16 lanes, 8 of 8), in the order Transpose and a tree of pairwise adds
  // of adjacent lanes give: the same bits, fewer shuffles.
  static HWY_INLINE V SumLanes(const V* v) {
#if QKV_HWY_TRANSPOSE_LANES
    if constexpr (kTransposeLanes != 0) {
      decltype(v[0].raw) raw[kTransposeLanes];
      for (size_t i = 0; i < kTransposeLanes; ++i) raw[i] = v[i].raw;
      V r;
      r.raw = SumRegisters(raw);
      return r;
    }
#endif
    return v[0];  // never called without kTransposeLanes
  }

  // out[0..3]: the lane sums of a, b, c, d, the same bits as ReduceSum of
  // each (Highway's SumOfLanes order), in about a third of the shuffles.
  static HWY_INLINE void SumLanes4(V a, V b, V c, V d, float* out) {
#if QKV_HWY_TRANSPOSE_LANES
    if constexpr (kTransposeLanes != 0) {
      _mm_storeu_ps(out, SumRegisters4<false>(a.raw, b.raw, c.raw, d.raw));
      return;
    }
#endif
    out[0] = ReduceSum(a);
    out[1] = ReduceSum(b);
    out[2] = ReduceSum(c);
    out[3] = ReduceSum(d);
  }

  // v[i] = row i in, column i out, for a kTransposeLanes-square block.
  static HWY_INLINE void Transpose(V* v) {
#if QKV_HWY_TRANSPOSE_LANES
    if constexpr (kTransposeLanes != 0) {
      decltype(v[0].raw) raw[kTransposeLanes];
      for (size_t i = 0; i < kTransposeLanes; ++i) raw[i] = v[i].raw;
      TransposeRegisters(raw);
      for (size_t i = 0; i < kTransposeLanes; ++i) v[i].raw = raw[i];
    }
#else
    (void)v;
#endif
  }

  // The tiny path's narrower vectors: shorter reductions and gathers than
  // full-width ones when few keys fill the lanes (x86 only: 4 lanes for up
  // to 4 keys, 8 for up to 8 on AVX-512). The same type where there are
  // none.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  using Narrow4 = HwyOps<hn::CappedTag<float, 4>>;
#else
  using Narrow4 = HwyOps<D>;
#endif
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  using Narrow8 = HwyOps<hn::CappedTag<float, 8>>;
#else
  using Narrow8 = HwyOps<D>;
#endif
};

using Ops = HwyOps<hn::ScalableTag<float>>;

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace qkv
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
