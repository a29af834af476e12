// The backward pass's kernels (Backward<O, Exp>, src/pipeline/backward-inl.h):
// register tiles of 4 rows by kVecs vectors for its matrix products (rows
// by columns, weighted sums of rows and of differences), and the copies
// that pad its operands to whole tiles. Included by backward-inl.h;
// per-target include guard (Highway's convention).
#if defined(QKV_PIPELINE_BACKWARD_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_PIPELINE_BACKWARD_KERNELS_INL_H_
#undef QKV_PIPELINE_BACKWARD_KERNELS_INL_H_
#else
#define QKV_PIPELINE_BACKWARD_KERNELS_INL_H_
#endif

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

#ifndef QKV_SIMD_NAMESPACE
#error "define QKV_SIMD_NAMESPACE (the per-target namespace) first"
#endif

#ifdef HWY_BEFORE_NAMESPACE
HWY_BEFORE_NAMESPACE();
#endif
namespace qkv {
namespace QKV_SIMD_NAMESPACE {

#undef QKV_BACKWARD_INLINE
#define QKV_BACKWARD_INLINE inline __attribute__((always_inline))

template <class O>
struct BackwardKernels {
  using V = typename O::V;

  static constexpr int64_t kTile = 4;  // rows of a register tile

  static int64_t Lanes() { return static_cast<int64_t>(O::Lanes()); }
  // Vectors per row of a register tile: 4 where there are 32 vector
  // registers (16 accumulators), else 2 (8).
  static constexpr int kVecs = O::kUnroll >= 8 ? 4 : 2;
  // Columns of a register tile, and n rounded up to them.
  static int64_t Width() { return kVecs * Lanes(); }
  static int64_t Pad(int64_t n) { return (n + Width() - 1) / Width() * Width(); }

  // A register tile's rows are kVecs named accumulators each (not arrays:
  // SVE vectors are sizeless); those past kVecs are compiled away.

  // acc += term(a, b) per vector: a * b, or (a - b)^2 (kGauss).
  template <bool kGauss>
  static QKV_BACKWARD_INLINE void Term(float a, V b0, V b1, V b2, V b3,
                                       V* c0, V* c1, V* c2, V* c3) {
    const V x = O::Set(a);
    if (kGauss) {
      const V e0 = O::Sub(x, b0);
      const V e1 = O::Sub(x, b1);
      *c0 = O::MulAdd(e0, e0, *c0);
      *c1 = O::MulAdd(e1, e1, *c1);
      if (kVecs > 2) {
        const V e2 = O::Sub(x, b2);
        const V e3 = O::Sub(x, b3);
        *c2 = O::MulAdd(e2, e2, *c2);
        *c3 = O::MulAdd(e3, e3, *c3);
      }
    } else {
      *c0 = O::MulAdd(x, b0, *c0);
      *c1 = O::MulAdd(x, b1, *c1);
      if (kVecs > 2) {
        *c2 = O::MulAdd(x, b2, *c2);
        *c3 = O::MulAdd(x, b3, *c3);
      }
    }
  }

  static QKV_BACKWARD_INLINE void LoadRow(const float* p, V* b0, V* b1, V* b2,
                                          V* b3) {
    const int64_t nl = Lanes();
    *b0 = O::LoadU(p);
    *b1 = O::LoadU(p + nl);
    if (kVecs > 2) {
      *b2 = O::LoadU(p + 2 * nl);
      *b3 = O::LoadU(p + 3 * nl);
    }
  }

  static QKV_BACKWARD_INLINE void StoreRow(V c0, V c1, V c2, V c3, float* p) {
    const int64_t nl = Lanes();
    O::StoreU(c0, p);
    O::StoreU(c1, p + nl);
    if (kVecs > 2) {
      O::StoreU(c2, p + 2 * nl);
      O::StoreU(c3, p + 3 * nl);
    }
  }

  static QKV_BACKWARD_INLINE void AddRow(V c0, V c1, V c2, V c3, float* p) {
    const int64_t nl = Lanes();
    O::StoreU(O::Add(O::LoadU(p), c0), p);
    O::StoreU(O::Add(O::LoadU(p + nl), c1), p + nl);
    if (kVecs > 2) {
      O::StoreU(O::Add(O::LoadU(p + 2 * nl), c2), p + 2 * nl);
      O::StoreU(O::Add(O::LoadU(p + 3 * nl), c3), p + 3 * nl);
    }
  }

  // c[r][j] = sum_{t < n} term(a[r][t], bt[t][j]) for r < rows (a multiple
  // of kTile) and j < cols (a multiple of Width()); term is a * b (DOT) or
  // (a - b)^2 (GAUSSIAN).
  template <bool kGauss>
  static void RowsByColumns(const float* a, int64_t lda, int64_t n,
                            const float* bt, int64_t ldb, int64_t rows,
                            int64_t cols, float* c, int64_t ldc) {
    for (int64_t r = 0; r < rows; r += kTile) {
      const float* a0 = a + r * lda;
      const float* a1 = a0 + lda;
      const float* a2 = a1 + lda;
      const float* a3 = a2 + lda;
      for (int64_t j = 0; j < cols; j += Width()) {
        V z = O::Zero();
        V c00 = z, c01 = z, c02 = z, c03 = z, c10 = z, c11 = z, c12 = z,
          c13 = z;
        V c20 = z, c21 = z, c22 = z, c23 = z, c30 = z, c31 = z, c32 = z,
          c33 = z;
        const float* b = bt + j;
        for (int64_t t = 0; t < n; ++t, b += ldb) {
          V b0 = z, b1 = z, b2 = z, b3 = z;
          LoadRow(b, &b0, &b1, &b2, &b3);
          Term<kGauss>(a0[t], b0, b1, b2, b3, &c00, &c01, &c02, &c03);
          Term<kGauss>(a1[t], b0, b1, b2, b3, &c10, &c11, &c12, &c13);
          Term<kGauss>(a2[t], b0, b1, b2, b3, &c20, &c21, &c22, &c23);
          Term<kGauss>(a3[t], b0, b1, b2, b3, &c30, &c31, &c32, &c33);
        }
        float* o = c + r * ldc + j;
        StoreRow(c00, c01, c02, c03, o);
        StoreRow(c10, c11, c12, c13, o + ldc);
        StoreRow(c20, c21, c22, c23, o + 2 * ldc);
        StoreRow(c30, c31, c32, c33, o + 3 * ldc);
      }
    }
  }

  // out[x][c] += sum_{y < ny} w[x * wx + y * wy] * m[y][c], for x < nx (a
  // multiple of kTile) and c < cols (a multiple of Width()).
  static void WeightedRows(const float* w, int64_t wx, int64_t wy,
                           const float* m, int64_t ldm, int64_t ny,
                           int64_t nx, int64_t cols, float* out,
                           int64_t ldo) {
    for (int64_t x = 0; x < nx; x += kTile) {
      const float* w0 = w + x * wx;
      const float* w1 = w0 + wx;
      const float* w2 = w1 + wx;
      const float* w3 = w2 + wx;
      for (int64_t c = 0; c < cols; c += Width()) {
        V z = O::Zero();
        V c00 = z, c01 = z, c02 = z, c03 = z, c10 = z, c11 = z, c12 = z,
          c13 = z;
        V c20 = z, c21 = z, c22 = z, c23 = z, c30 = z, c31 = z, c32 = z,
          c33 = z;
        const float* mr = m + c;
        for (int64_t y = 0; y < ny; ++y, mr += ldm) {
          V m0 = z, m1 = z, m2 = z, m3 = z;
          LoadRow(mr, &m0, &m1, &m2, &m3);
          const int64_t at = y * wy;
          Term<false>(w0[at], m0, m1, m2, m3, &c00, &c01, &c02, &c03);
          Term<false>(w1[at], m0, m1, m2, m3, &c10, &c11, &c12, &c13);
          Term<false>(w2[at], m0, m1, m2, m3, &c20, &c21, &c22, &c23);
          Term<false>(w3[at], m0, m1, m2, m3, &c30, &c31, &c32, &c33);
        }
        float* o = out + x * ldo + c;
        AddRow(c00, c01, c02, c03, o);
        AddRow(c10, c11, c12, c13, o + ldo);
        AddRow(c20, c21, c22, c23, o + 2 * ldo);
        AddRow(c30, c31, c32, c33, o + 3 * ldo);
      }
    }
  }

  // GAUSSIAN's form of WeightedRows: out[x][c] += sum_y w[x * wx + y * wy]
  // * (own[x][c] - m[y][c]), one vector per step (rarely hot).
  static void WeightedDifferences(const float* w, int64_t wx, int64_t wy,
                                  const float* m, int64_t ldm, int64_t ny,
                                  const float* own, int64_t ldown, int64_t nx,
                                  int64_t cols, float* out, int64_t ldo) {
    const int64_t nl = Lanes();
    for (int64_t x = 0; x < nx; ++x) {
      const float* wr = w + x * wx;
      for (int64_t c = 0; c < cols; c += nl) {
        const V xv = O::LoadU(own + x * ldown + c);
        V acc = O::Zero();
        const float* mr = m + c;
        for (int64_t y = 0; y < ny; ++y, mr += ldm) {
          acc = O::MulAdd(O::Set(wr[y * wy]), O::Sub(xv, O::LoadU(mr)), acc);
        }
        O::StoreU(O::Add(O::LoadU(out + x * ldo + c), acc), out + x * ldo + c);
      }
    }
  }

  // dst[0, n) = src[0, n), then zeros up to padded (rows of Q, dO, K).
  static void CopyPadded(const float* src, int64_t n, int64_t padded,
                         float* dst) {
    const int64_t nl = Lanes();
    int64_t c = 0;
    for (; c + nl <= n; c += nl) O::StoreU(O::LoadU(src + c), dst + c);
    for (; c < n; ++c) dst[c] = src[c];
    for (; c < padded; ++c) dst[c] = 0.0f;
  }

  // dst[c * n + j] = src[j * lds + c] for c < cols and j < n, 0 for rows
  // j >= valid (src rows past it are never read): K^T and V^T of a key
  // block. Whole square blocks by in-register transposes where the ops have
  // them (n is a multiple of their width: a key block), the other columns
  // one by one.
  static void TransposeInto(const float* src, int64_t lds, int64_t valid,
                            int64_t n, int64_t cols, float* dst) {
    int64_t c0 = 0;
    if constexpr (O::kTransposeLanes != 0) {
      constexpr int64_t kN = static_cast<int64_t>(O::kTransposeLanes);
      V blk[kN];
      for (; n % kN == 0 && c0 + kN <= cols; c0 += kN) {
        for (int64_t j0 = 0; j0 < n; j0 += kN) {
          for (int64_t i = 0; i < kN; ++i) {
            blk[i] = j0 + i < valid ? O::LoadU(src + (j0 + i) * lds + c0)
                                    : O::Zero();
          }
          O::Transpose(blk);
          for (int64_t i = 0; i < kN; ++i) {
            O::StoreU(blk[i], dst + (c0 + i) * n + j0);
          }
        }
      }
    }
    for (int64_t c = c0; c < cols; ++c) {
      for (int64_t j = 0; j < n; ++j) {
        dst[c * n + j] = j < valid ? src[j * lds + c] : 0.0f;
      }
    }
  }

  static float Dot(const float* a, const float* b, int64_t n) {
    const int64_t nl = Lanes();
    V acc = O::Zero();
    int64_t c = 0;
    for (; c + nl <= n; c += nl) {
      acc = O::MulAdd(O::LoadU(a + c), O::LoadU(b + c), acc);
    }
    float lanes[64];  // up to 2048-bit vectors
    O::StoreU(acc, lanes);
    float s = 0.0f;
    for (int64_t l = 0; l < nl; ++l) s += lanes[l];
    for (; c < n; ++c) s += a[c] * b[c];
    return s;
  }
};

}  // namespace QKV_SIMD_NAMESPACE
}  // namespace qkv
#ifdef HWY_AFTER_NAMESPACE
HWY_AFTER_NAMESPACE();
#endif

#endif  // per-target include guard
