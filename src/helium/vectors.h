// The Helium engine's vector primitives (src/helium/attention_helium.cc
// includes this inside its anonymous namespace, before the loops): exp
// on 4 lanes, a vector's lane sum, and how 4 elements of a K or V row
// of each element type become 4 f32 lanes.
//
// F16, BF16 and I8 keys and values (kv_dtype) go through the same loops,
// which load 4 elements into 4 f32 lanes: F16 by a widening 16-bit load
// and VCVTB (exact, subnormals included: conversions from half precision
// do not flush, whatever FPSCR.FZ16 says),
// BF16 by the same load and a shift left by 16, I8 by a widening
// sign-extending byte load and VCVT. An I8 row's scale enters once per
// row where the arithmetic allows: DOT scores are multiplied by their 4
// keys' scales (one gather) after the sum, the weights p_j by their value
// rows' scales in one pass before the weighted sum (after the weights
// output took them); GAUSSIAN keys are scaled as they are loaded
// (|q - s k|^2 does not factor). So I8 results differ from the f32 ones
// over the dequantized values by f32 rounding only. These types are
// compiled out with QKV_LOW_PRECISION_KV=0 (the default on
// microcontrollers: CMakeLists.txt).
//
// exp: x = n ln2 + r, n = round(x log2 e), |r| <= ln2/2 with ln2 split in
// two parts; exp(r) by its Taylor polynomial to degree 7 (truncation
// < 6e-9 relative), 2^n put into the exponent. Max error 2 ulp on [-87, 0];
// x below about -87.9 (terms under 1e-38 of the row's largest) gives 0, as
// does -inf. A NaN x gives 0 too, but makes the row's sum NaN (ExpRow), so
// that the row is zeros as with the reference's expf.
//
// Not a header of its own: it needs <arm_mve.h> and the includer's
// namespace.
#ifndef QKV_HELIUM_VECTORS_H_
#define QKV_HELIUM_VECTORS_H_

// exp(x) for x <= 0 (or NaN; see ExpRow). Constants are scalars (VFMA and
// VFMAS by a general register) so that the loop keeps its Q registers.
inline float32x4_t ExpNonPositive(float32x4_t x) {
  // Below -88, n = -127 and the scale's bits are 0: the result is +0, as
  // for -inf (and NaN, which ExpRow accounts for separately).
  const float32x4_t xc = vmaxnmq_f32(x, vdupq_n_f32(-88.0f));
  const int32x4_t n = vcvtnq_s32_f32(vmulq_n_f32(xc, 1.44269504088896341f));
  const float32x4_t nf = vcvtq_f32_s32(n);
  float32x4_t r = vfmaq_n_f32(xc, nf, -0.693145751953125f);
  r = vfmaq_n_f32(r, nf, -1.428606765330187045e-6f);
  // Horner: poly = poly * r + c.
  float32x4_t poly = vfmasq_n_f32(vdupq_n_f32(1.0f / 5040.0f), r, 1.0f / 720.0f);
  poly = vfmasq_n_f32(poly, r, 1.0f / 120.0f);
  poly = vfmasq_n_f32(poly, r, 1.0f / 24.0f);
  poly = vfmasq_n_f32(poly, r, 1.0f / 6.0f);
  poly = vfmasq_n_f32(poly, r, 0.5f);
  poly = vfmasq_n_f32(poly, r, 1.0f);
  poly = vfmasq_n_f32(poly, r, 1.0f);
  const float32x4_t scale =
      vreinterpretq_f32_s32(vshlq_n_s32(vaddq_n_s32(n, 127), 23));
  return vmulq_f32(poly, scale);
}

// Sum of the 4 lanes.
inline float AddLanes(float32x4_t v) {
  return (vgetq_lane_f32(v, 0) + vgetq_lane_f32(v, 1)) +
         (vgetq_lane_f32(v, 2) + vgetq_lane_f32(v, 3));
}

// How 4 elements of a K or V row of each type become 4 f32 lanes (Load),
// or the first lanes under a predicate with zeros in the others (LoadZ):
// T is the stored element, kScaled says whether rows carry an I8 scale
// (which the callers apply, see the top of this file).
struct F32Kv {
  using T = float;
  static constexpr bool kScaled = false;
  static float32x4_t Load(const float* x) { return vld1q_f32(x); }
  static float32x4_t LoadZ(const float* x, mve_pred16_t t) {
    return vldrwq_z_f32(x, t);
  }
};

// VCVTB.F32.F16: the binary16 in the low half of each 32-bit lane of x, as
// f32. Written as its encoding: GNU as 2.40 encodes this instruction's Q
// registers as twice their numbers (q2 as q4, q5 as an undefined
// instruction: vcvtbq_f32_f16 faults under QEMU), so the assembler picks
// the encoding for the registers GCC chose (.ifc on the operand's name).
inline float32x4_t F16BottomToF32(uint32x4_t x) {
  float32x4_t r;
  __asm__(
      ".irp d,0,1,2,3,4,5,6,7\n"
      ".ifc %q0,q\\d\n"
      ".irp m,0,1,2,3,4,5,6,7\n"
      ".ifc %q1,q\\m\n"
      ".inst.w 0xfe3f0e01 | (\\d << 13) | (\\m << 1)\n"
      ".endif\n"
      ".endr\n"
      ".endif\n"
      ".endr"
      : "=w"(r)
      : "w"(x));
  return r;
}

// IEEE binary16: each element zero-extended into the low half of a 32-bit
// lane, which VCVTB converts.
struct F16Kv {
  using T = uint16_t;
  static constexpr bool kScaled = false;
  static float32x4_t Load(const uint16_t* x) {
    return F16BottomToF32(vldrhq_u32(x));
  }
  static float32x4_t LoadZ(const uint16_t* x, mve_pred16_t t) {
    return F16BottomToF32(vldrhq_z_u32(x, t));
  }
};

// bfloat16: the upper half of an f32's bits.
struct BF16Kv {
  using T = uint16_t;
  static constexpr bool kScaled = false;
  static float32x4_t Load(const uint16_t* x) {
    return vreinterpretq_f32_u32(vshlq_n_u32(vldrhq_u32(x), 16));
  }
  static float32x4_t LoadZ(const uint16_t* x, mve_pred16_t t) {
    return vreinterpretq_f32_u32(vshlq_n_u32(vldrhq_z_u32(x, t), 16));
  }
};

// I8: the integers, unscaled.
struct I8Kv {
  using T = int8_t;
  static constexpr bool kScaled = true;
  static float32x4_t Load(const int8_t* x) {
    return vcvtq_f32_s32(vldrbq_s32(x));
  }
  static float32x4_t LoadZ(const int8_t* x, mve_pred16_t t) {
    return vcvtq_f32_s32(vldrbq_z_s32(x, t));
  }
};

#endif  // QKV_HELIUM_VECTORS_H_
