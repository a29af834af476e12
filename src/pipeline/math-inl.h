// The pipeline (Flash<O>, src/pipeline/flash-inl.h): vector math: softmax's exp
// (ExpNonPositive) and the softcap's tanh. Included by flash-inl.h inside its
// per-target namespace, after the struct.

// exp(x) for the arguments softmax has here: x <= 0, or -inf. Results
// below FLT_MIN (x < -87) are flushed to 0: those terms are under 1e-38 of
// the row's largest weight, far below the accuracy bound, and flushing
// keeps every intermediate normal (x86 takes a microcode assist on
// subnormals). Method: x = n ln2 + r with n = round(x / ln2) in [-126, 0],
// rounded by adding 1.5 * 2^23 (n lands in the low mantissa bits, which
// also give the exponent of 2^n), |r| <= ln2/2 with ln2 in two parts (r
// exact to ~1e-10), then exp(r) by a degree-6 polynomial fitted for least
// maximum relative error on [-ln2/2, ln2/2] (2e-9). Max error 1.03 ulp on
// [-87, 0] (the fit and that error: bench/exp_fit.py;
// tests/softmax_ulp_test.cc holds every engine's softmax in ulps). 16
// operations per vector, 11 of them on the FMA pipes.
template <class O>
QKV_FLASH_INLINE typename Flash<O>::V Flash<O>::ExpNonPositive(V x) {
  const V lowest = O::Set(-87.0f);
  V r, t;
  const V q = ExpReduced(O::Max(x, lowest), &r, &t);
  const V poly = O::MulAdd(q, r, O::Set(1.0f));
  return O::IfThenZeroElse(O::Lt(x, lowest),
                           O::Mul(poly, O::Pow2FromRounded(t)));
}

// The reduction and polynomial of ExpNonPositive for xc in [-87, 0]:
// exp(xc) = 2^n (1 + r q(r)); returns q(r), sets *r and *t (n in the low
// mantissa bits, for Pow2FromRounded).
template <class O>
QKV_FLASH_INLINE typename Flash<O>::V Flash<O>::ExpReduced(V xc, V* r_out,
                                                           V* t_out) {
  const V round = O::Set(12582912.0f);  // 1.5 * 2^23
  const V t = O::MulAdd(xc, O::Set(1.44269504088896341f), round);
  const V nf = O::Sub(t, round);
  V r = O::MulAdd(nf, O::Set(-0.693145751953125f), xc);
  r = O::MulAdd(nf, O::Set(-1.428606765330187045e-6f), r);
  V q = O::Set(0.0013843622291460633f);
  q = O::MulAdd(q, r, O::Set(0.0083741797134280205f));
  q = O::MulAdd(q, r, O::Set(0.041668005287647247f));
  q = O::MulAdd(q, r, O::Set(0.16666430234909058f));
  q = O::MulAdd(q, r, O::Set(0.49999994039535522f));
  q = O::MulAdd(q, r, O::Set(1.0f));
  *r_out = r;
  *t_out = t;
  return q;
}

// softcap * tanh(s / softcap), vector-wise (semantics.h's Softcap), as
// s times 1 / softcap: InvCap keeps that finite for a subnormal softcap
// (1 / 1e-40 is inf in f32, and 0 * inf a NaN), where the tanh is +-1 or
// 0 either way.
template <class O>
inline float Flash<O>::InvCap(float cap) {
  const float inv = 1.0f / cap;
  return inv < 3.4e38f ? inv : 3.4e38f;
}

// tanh(x) = sign(x) (1 - e) / (1 + e) with e = exp(-2 |x|), by
// ExpNonPositive's reduction and polynomial, which also give 1 - e
// without cancellation: with e = 2^n p(r), p(r) = 1 + r q(r),
//   e - 1 = 2^n r q(r) + (2^n - 1)
// (2^n - 1 exact; n = 0 for |x| < 0.17, where it is r q(r) alone). So the
// error is relative, a few ulp at every |x| (tests/blocks_test.cc), and a
// capped score keeps f32 accuracy whatever the cap (a cap of 1e4 is the
// identity on ordinary scores, which an absolute error times 1e4 would
// not be). One exp and one division (the divider runs beside the FMA
// pipes the loop fills; a reciprocal estimate with Newton steps on them
// measured slower): a third of the library tanh's work. tanh(+-inf) =
// +-1; NaN stays NaN.
template <class O>
QKV_FLASH_INLINE typename Flash<O>::V Flash<O>::SoftcapTanh(V x) {
  const V zero = O::Zero(), one = O::Set(1.0f);
  // -2|x| >= -87 (below, tanh is 1 in f32 anyway).
  V r, t;
  const V q = ExpReduced(
      O::Max(O::Mul(Abs(x), O::Set(-2.0f)), O::Set(-87.0f)), &r, &t);
  const V rq = O::Mul(r, q);
  const V scale = O::Pow2FromRounded(t);  // 2^n
  const V e = O::MulAdd(scale, rq, scale);  // 2^n p(r)
  const V em1 = O::MulAdd(scale, rq, O::Sub(scale, one));  // e - 1
  const V th = O::Div(O::Sub(zero, em1), O::Add(one, e));
  const V signed_th = O::IfThenElse(O::Lt(x, zero), O::Sub(zero, th), th);
  return O::IfThenElse(O::Eq(x, x), signed_th, x);
}

template <class O>
QKV_FLASH_INLINE typename Flash<O>::V Flash<O>::Softcapped(V s, V cap,
                                                           V inv_cap) {
  return O::Mul(cap, SoftcapTanh(O::Mul(s, inv_cap)));
}

// |x|.
template <class O>
QKV_FLASH_INLINE typename Flash<O>::V Flash<O>::Abs(V x) { return O::Max(x, O::Sub(O::Zero(), x)); }
