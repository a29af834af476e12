// qkv_quantize_rows: f32 rows into a K/V cache of another element type.
//
// F16 and BF16 round to nearest, ties to even, by integer arithmetic on the
// bits (no F16C or other instruction set assumed: this runs on every target,
// microcontrollers included, and fills a cache once per token, not per
// attention call). I8 keeps one scale per row, max|x| / 127, and rounds
// x / scale to nearest (rintf: ties to even in the default rounding mode).
// Everything is validated before the first write, so a refused call leaves
// dst and scales as they were.
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "qkv/qkv.h"

namespace qkv {
namespace {

uint32_t BitsOf(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}

// IEEE binary16 nearest to x, ties to even: overflow (|x| >= 65520) gives
// +-inf, results below 2^-14 are subnormal, NaN stays a quiet NaN with its
// sign and the top of its payload.
uint16_t ToF16(float x) {
  const uint32_t b = BitsOf(x);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  const uint32_t a = b & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) {  // inf or NaN
    if (a == 0x7F800000u) return sign | 0x7C00u;
    return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  }
  if (a >= 0x477FF000u) return sign | 0x7C00u;  // 65520 and up: inf
  if (a >= 0x38800000u) {                       // normal: 2^-14 and up
    // Rebias the exponent (127 -> 15), then round the 13 dropped bits; a
    // carry out of the mantissa moves to the next binade, as it should.
    const uint32_t r = a - 0x38000000u;
    return static_cast<uint16_t>(sign |
                                 ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
  }
  if (a <= 0x33000000u) return sign;  // <= 2^-25: rounds to 0 (the tie too)
  // Subnormal result m * 2^-24: m = round(mantissa >> shift).
  const uint32_t e = a >> 23;  // 102 ... 112
  const uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14 ... 24
  uint32_t m = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (m & 1u))) ++m;  // 1024: 2^-14, normal
  return static_cast<uint16_t>(sign | m);
}

// bfloat16 (the top half of an f32) nearest to x, ties to even; NaN stays a
// quiet NaN.
uint16_t ToBf16(float x) {
  const uint32_t b = BitsOf(x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((b >> 16) | 0x0040u);
  }
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

size_t ElementBytes(qkv_dtype t) {
  return t == QKV_DTYPE_F32 ? 4 : (t == QKV_DTYPE_I8 ? 1 : 2);
}

// [begin, end) byte ranges overlap.
bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const uintptr_t a0 = reinterpret_cast<uintptr_t>(a);
  const uintptr_t b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

}  // namespace
}  // namespace qkv

extern "C" QKV_API qkv_status qkv_quantize_rows(
    qkv_dtype dtype, int64_t rows, int64_t n, const float* src,
    int64_t src_row_stride, void* dst, int64_t dst_row_stride,
    float* scales) {
  using qkv::ElementBytes;
  int32_t type;
  memcpy(&type, &dtype, sizeof type);  // any int, not only the enum's values
  if (type < QKV_DTYPE_F32 || type > QKV_DTYPE_I8) {
    return QKV_ERR_INVALID_ARGUMENT;
  }
  if (rows < 0 || n < 0 || src_row_stride < 0 || dst_row_stride < 0) {
    return QKV_ERR_INVALID_ARGUMENT;
  }
  if ((src_row_stride != 0 && src_row_stride < n) ||
      (dst_row_stride != 0 && dst_row_stride < n)) {
    return QKV_ERR_INVALID_ARGUMENT;
  }
  if (rows == 0) return QKV_OK;
  const bool i8 = dtype == QKV_DTYPE_I8;
  if (i8 && scales == nullptr) return QKV_ERR_INVALID_ARGUMENT;
  if (i8 && static_cast<uint64_t>(rows) > PTRDIFF_MAX / sizeof(float)) {
    return QKV_ERR_INVALID_ARGUMENT;
  }
  const size_t scale_bytes = i8 ? static_cast<size_t>(rows) * sizeof(float) : 0;
  if (n == 0) {  // empty rows: nothing read; an empty row's scale is 0
    for (int64_t r = 0; i8 && r < rows; ++r) scales[r] = 0.0f;
    return QKV_OK;
  }
  if (src == nullptr || dst == nullptr) return QKV_ERR_INVALID_ARGUMENT;
  const int64_t ss = src_row_stride != 0 ? src_row_stride : n;
  const int64_t ds = dst_row_stride != 0 ? dst_row_stride : n;
  // Elements spanned, (rows - 1) * stride + n, addressable in bytes.
  const size_t eb = ElementBytes(dtype);
  const uint64_t limit = static_cast<uint64_t>(PTRDIFF_MAX) / 4;
  if (static_cast<uint64_t>(n) > limit ||
      static_cast<uint64_t>(rows - 1) > (limit - static_cast<uint64_t>(n)) /
                                            static_cast<uint64_t>(ss) ||
      static_cast<uint64_t>(rows - 1) > (limit - static_cast<uint64_t>(n)) /
                                            static_cast<uint64_t>(ds)) {
    return QKV_ERR_INVALID_ARGUMENT;
  }
  const size_t src_bytes =
      (static_cast<size_t>(rows - 1) * static_cast<size_t>(ss) +
       static_cast<size_t>(n)) * sizeof(float);
  const size_t dst_bytes =
      (static_cast<size_t>(rows - 1) * static_cast<size_t>(ds) +
       static_cast<size_t>(n)) * eb;
  if (qkv::Overlap(src, src_bytes, dst, dst_bytes) ||
      (i8 && (qkv::Overlap(scales, scale_bytes, src, src_bytes) ||
              qkv::Overlap(scales, scale_bytes, dst, dst_bytes)))) {
    return QKV_ERR_INVALID_ARGUMENT;
  }
  if (i8) {  // a scale needs finite rows: checked before anything is written
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = src + r * ss;
      for (int64_t c = 0; c < n; ++c) {
        if (!(fabsf(x[c]) <= 3.4028235e38f)) return QKV_ERR_INVALID_ARGUMENT;
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = src + r * ss;
    switch (dtype) {
      case QKV_DTYPE_F16: {
        uint16_t* y = static_cast<uint16_t*>(dst) + r * ds;
        for (int64_t c = 0; c < n; ++c) y[c] = qkv::ToF16(x[c]);
        break;
      }
      case QKV_DTYPE_BF16: {
        uint16_t* y = static_cast<uint16_t*>(dst) + r * ds;
        for (int64_t c = 0; c < n; ++c) y[c] = qkv::ToBf16(x[c]);
        break;
      }
      case QKV_DTYPE_I8: {
        int8_t* y = static_cast<int8_t*>(dst) + r * ds;
        float max_abs = 0.0f;
        for (int64_t c = 0; c < n; ++c) {
          const float a = fabsf(x[c]);
          max_abs = a > max_abs ? a : max_abs;
        }
        const float scale = max_abs / 127.0f;
        scales[r] = scale;
        for (int64_t c = 0; c < n; ++c) {
          // scale 0 (a zero row, or one whose max / 127 underflows): 0.
          float q = scale > 0.0f ? rintf(x[c] / scale) : 0.0f;
          q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
          y[c] = static_cast<int8_t>(q);
        }
        break;
      }
      default: {  // F32: a copy
        memcpy(static_cast<float*>(dst) + r * ds, x,
               static_cast<size_t>(n) * sizeof(float));
        break;
      }
    }
  }
  return QKV_OK;
}
