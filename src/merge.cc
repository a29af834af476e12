// qkv_attention_merge_f32: the exact combination of two partial attention
// results over disjoint key sets, from their lse.
//
// With m = max(lse_a, lse_b) and e = exp(-|lse_a - lse_b|) (the smaller
// side's weight relative to the larger one's, which is 1):
//   lse = m + log1p(e)
//   out = w_a * out_a + w_b * out_b,  w_x = (lse_x == m ? 1 : e) / (1 + e)
// Every quantity is a symmetric function of the two sides, and the output
// is one product per side and one sum, each rounded on its own: merging a
// into b gives the bits of merging b into a. This file is compiled with
// -ffp-contract=off (CMakeLists.txt): a fused multiply-add would round one
// side's product and not the other's. The column loop is plain C++ that the
// compiler vectorizes for the library's baseline ISA (SSE2, NEON, MVE); it
// streams memory, and one row's two libm calls are amortized over
// value_dim columns.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "qkv/qkv.h"

namespace qkv {
namespace {

// b := w_a * a + w_b * b over n columns. a may be b (a result merged with
// itself); the compiler checks for other overlaps before its vector loop.
void Combine(int64_t n, float w_a, const float* a, float w_b, float* b) {
  for (int64_t c = 0; c < n; ++c) b[c] = w_a * a[c] + w_b * b[c];
}

}  // namespace
}  // namespace qkv

extern "C" QKV_API qkv_status qkv_attention_merge_f32(
    int64_t rows, int64_t value_dim, const float* out_a, const float* lse_a,
    float* out_b, float* lse_b) {
  if (rows < 0 || value_dim < 1) return QKV_ERR_INVALID_ARGUMENT;
  if (rows == 0) return QKV_OK;
  if (!out_a || !lse_a || !out_b || !lse_b) return QKV_ERR_INVALID_ARGUMENT;
  // rows * value_dim floats must be addressable.
  if (static_cast<uint64_t>(rows) >
      static_cast<uint64_t>(PTRDIFF_MAX) / sizeof(float) /
          static_cast<uint64_t>(value_dim)) {
    return QKV_ERR_INVALID_ARGUMENT;
  }
  const size_t n = static_cast<size_t>(value_dim);
  for (int64_t r = 0; r < rows; ++r) {
    const float la = lse_a[r];
    const float lb = lse_b[r];
    const float* a = out_a + static_cast<size_t>(r) * n;
    float* b = out_b + static_cast<size_t>(r) * n;
    if (la == -INFINITY) {
      if (lb == -INFINITY) memset(b, 0, n * sizeof(float));  // no key at all
      continue;  // else b alone saw keys: its bits stay
    }
    if (lb == -INFINITY) {  // a alone saw keys: its bits
      if (a != b) memcpy(b, a, n * sizeof(float));
      lse_b[r] = la;
      continue;
    }
    // Both finite (or NaN, which propagates through every line below).
    const float m = la > lb ? la : lb;
    const float d = la > lb ? la - lb : lb - la;  // |la - lb|: the same bits either way
    const float e = expf(-d);
    const float inv = 1.0f / (1.0f + e);
    const float w_a = (la >= lb ? 1.0f : e) * inv;
    const float w_b = (lb >= la ? 1.0f : e) * inv;
    qkv::Combine(value_dim, w_a, a, w_b, b);
    lse_b[r] = m + log1pf(e);
  }
  return QKV_OK;
}
