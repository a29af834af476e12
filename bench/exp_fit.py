#!/usr/bin/python3
"""Where the SIMD engines' exp constants come from, and how exact they are.

Fits the degree-6 polynomial for exp(r) on [-ln2/2, ln2/2] used by
ExpNonPositive (src/highway/attention_hwy.cc, src/xsimd/attention_xsimd-inl.h)
for least maximum relative error (Lawson's iteratively reweighted least
squares on Chebyshev nodes, with the constant term held at 1), prints the
coefficients as floats, then replays the engines' float32 arithmetic (FMA as
one rounding) at 4 million points of [-87, 0] against double exp and prints
the largest error in ulps, beside the degree-7 Taylor series used before.

    /usr/bin/python3 bench/exp_fit.py      (Debian's python3-numpy)
"""
import numpy as np

F32 = np.float32
HALF_LN2 = np.log(2.0) / 2.0 + 1e-4  # a little margin for the rounding of n


def fit(degree, iterations=30):
    x = np.cos(np.linspace(0.0, np.pi, 4000)) * HALF_LN2
    f = np.exp(x)
    # p(x) = 1 + sum_k c_k x^k; relative error (p - f) / f.
    a = np.stack([x ** k for k in range(1, degree + 1)], 1) / f[:, None]
    b = (f - 1.0) / f
    w = np.ones_like(x)
    for _ in range(iterations):
        sw = np.sqrt(w)
        c, *_ = np.linalg.lstsq(a * sw[:, None], b * sw, rcond=None)
        err = np.abs(a @ c - b)
        w = w * err
        w /= w.sum()
    return [1.0] + list(c), err.max()


def fma(a, b, c):
    # The product of two floats is exact in double; one rounding to float.
    return (a.astype(np.float64) * b.astype(np.float64) + c).astype(F32)


def exp_non_positive(x, coeffs):
    """ExpNonPositive's operations, in order, in float32."""
    full = lambda v: np.full_like(x, F32(v))
    xc = np.maximum(x, F32(-87.0))
    rnd = F32(12582912.0)  # 1.5 * 2^23
    t = fma(xc, full(1.44269504088896341), full(rnd))
    nf = (t - rnd).astype(F32)
    r = fma(nf, full(-0.693145751953125), xc)
    r = fma(nf, full(-1.428606765330187045e-6), r)
    p = full(coeffs[-1])
    for c in coeffs[-2::-1]:
        p = fma(p, r, full(c))
    scale = (2.0 ** nf.astype(np.int64)).astype(F32)
    return np.where(x < -87.0, F32(0.0), (p * scale).astype(F32))


def main():
    coeffs, rel = fit(6)
    coeffs32 = [F32(c) for c in coeffs]
    print("degree-6 fit, max relative error %.2e before float rounding" % rel)
    for k, c in enumerate(coeffs32):
        print("  c%d = %.17gf" % (k, float(c)))
    rng = np.random.default_rng(1)
    x = -rng.uniform(0.0, 87.0, 4_000_000).astype(F32)
    x = np.concatenate([x, -np.linspace(0.0, 2.0, 200_001).astype(F32)])
    exact = np.exp(x.astype(np.float64))
    ulp = np.spacing(exact.astype(F32)).astype(np.float64)
    taylor7 = [1.0, 1.0, 0.5, 1 / 6, 1 / 24, 1 / 120, 1 / 720, 1 / 5040]
    for name, c in (("degree-6 fit (now)", coeffs32),
                    ("degree-7 Taylor (before)", [F32(v) for v in taylor7])):
        got = exp_non_positive(x, c).astype(np.float64)
        e = np.abs(got - exact) / ulp
        print("%-26s max %.2f ulp, mean %.3f ulp on [-87, 0] (%d points)"
              % (name, e.max(), e.mean(), x.size))


if __name__ == "__main__":
    main()
