// qkv_quantize_rows against independent roundings: F16 by the nearest of
// all 63488 finite binary16 values decoded in double (ties: the even
// encoding), BF16 by the nearer of the two bfloat16 values around x, I8 by
// its definition in double with the property checks a cache relies on; bad
// inputs write nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "qkv/qkv.h"

namespace {

double F16ToDouble(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  if (e == 0) return sign * std::ldexp(m, -24);
  if (e == 31) return m ? NAN : sign * INFINITY;
  return sign * std::ldexp(1024 + m, e - 25);
}

// The binary16 nearest to x (ties to the even encoding), from a sorted
// table of the non-negative finite values; beyond the largest, infinity
// from halfway to the next power of two on.
uint16_t OracleF16(float x) {
  static const std::vector<std::pair<double, uint16_t>> table = [] {
    std::vector<std::pair<double, uint16_t>> t;
    for (uint32_t h = 0; h < 0x7C00; ++h) {
      t.push_back({F16ToDouble(static_cast<uint16_t>(h)),
                   static_cast<uint16_t>(h)});
    }
    return t;
  }();
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (std::isnan(x)) return 0x7E00;  // any NaN: the caller checks the class
  if (a >= 65520.0) return sign | 0x7C00;
  auto it = std::lower_bound(
      table.begin(), table.end(), a,
      [](const std::pair<double, uint16_t>& p, double v) { return p.first < v; });
  if (it == table.begin()) return sign | it->second;
  const auto below = it - 1;
  if (it == table.end()) return sign | below->second;
  const double up = it->first - a, down = a - below->first;
  if (up < down) return sign | it->second;
  if (down < up) return sign | below->second;
  return sign | ((it->second & 1) ? below->second : it->second);
}

uint16_t OracleBf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  if (std::isinf(x)) return static_cast<uint16_t>(b >> 16);
  const uint32_t lo = b & 0xFFFF0000u;  // toward zero
  const uint32_t hi = lo + 0x10000u;    // away from zero (may be inf)
  float flo, fhi;
  std::memcpy(&flo, &lo, 4);
  std::memcpy(&fhi, &hi, 4);
  const double a = std::fabs(static_cast<double>(x));
  const double down = a - std::fabs(static_cast<double>(flo));
  // Beyond the largest finite bfloat16 the upper neighbour is infinity,
  // which rounding treats as 2^128.
  const double up = (std::isinf(fhi) ? std::ldexp(1.0, 128)
                                     : std::fabs(static_cast<double>(fhi))) -
                    a;
  if (down < up) return static_cast<uint16_t>(lo >> 16);
  if (up < down) return static_cast<uint16_t>(hi >> 16);
  return static_cast<uint16_t>(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

std::vector<float> Values(std::mt19937* rng) {
  std::vector<float> v;
  // Every binade binary16 has and the ones around it, with random
  // mantissas, exact f16 values, exact halfway points and their neighbours.
  std::uniform_real_distribution<float> u(1.0f, 2.0f);
  for (int e = -30; e <= 17; ++e) {
    for (int i = 0; i < 40; ++i) {
      const float x = std::ldexp(u(*rng), e);
      v.push_back(x);
      v.push_back(-x);
    }
  }
  for (uint32_t h = 0; h < 0x7C00; h += 7) {
    const double a = F16ToDouble(static_cast<uint16_t>(h));
    const double b = F16ToDouble(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((a + b) / 2);  // exact in f32
    v.push_back(static_cast<float>(a));
    v.push_back(mid);
    v.push_back(std::nextafter(mid, 0.0f));
    v.push_back(std::nextafter(mid, 1e9f));
    v.push_back(-mid);
  }
  for (float x : {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f,
                  1e30f, FLT_MAX, -FLT_MAX, FLT_MIN, 1e-45f, -1e-45f,
                  5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f, 6.1035156e-5f,
                  6.1035152e-5f, INFINITY, -INFINITY, 3.3961775e38f,
                  3.3961778e38f, 1.0039062f, 1.0117188f, 1.0078125f}) {
    v.push_back(x);
  }
  return v;
}

TEST(QuantizeRows, F16IsTheNearestEvenBinary16) {
  std::mt19937 rng(3);
  const std::vector<float> x = Values(&rng);
  std::vector<uint16_t> y(x.size(), 0xABCD);
  ASSERT_EQ(qkv_quantize_rows(QKV_DTYPE_F16, 1, static_cast<int64_t>(x.size()),
                              x.data(), 0, y.data(), 0, nullptr),
            QKV_OK);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(y[i], OracleF16(x[i])) << "x = " << x[i] << " (" << i << ")";
  }
  const float nans[] = {NAN, -NAN};
  uint16_t h[2];
  ASSERT_EQ(qkv_quantize_rows(QKV_DTYPE_F16, 1, 2, nans, 0, h, 0, nullptr),
            QKV_OK);
  for (uint16_t v : h) EXPECT_TRUE(std::isnan(F16ToDouble(v))) << v;
  EXPECT_NE(h[0] & 0x8000, h[1] & 0x8000);
}

TEST(QuantizeRows, Bf16IsTheNearestEvenBfloat16) {
  std::mt19937 rng(4);
  std::vector<float> x = Values(&rng);
  std::uniform_real_distribution<float> u(1.0f, 2.0f);
  for (int e = -140; e <= 127; e += 3) {
    x.push_back(std::ldexp(u(rng), e));
    x.push_back(-std::ldexp(u(rng), e));
  }
  std::vector<uint16_t> y(x.size());
  ASSERT_EQ(qkv_quantize_rows(QKV_DTYPE_BF16, 1, static_cast<int64_t>(x.size()),
                              x.data(), 0, y.data(), 0, nullptr),
            QKV_OK);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(y[i], OracleBf16(x[i])) << "x = " << x[i] << " (" << i << ")";
  }
  const float nan = NAN;
  uint16_t h = 0;
  ASSERT_EQ(qkv_quantize_rows(QKV_DTYPE_BF16, 1, 1, &nan, 0, &h, 0, nullptr),
            QKV_OK);
  EXPECT_EQ(h & 0x7F80, 0x7F80);
  EXPECT_NE(h & 0x7F, 0);
}

// I8, strided both ways (gaps untouched): per row, scale = max|x| / 127,
// q = nearest even of x / scale; the row's largest |x| maps to +-127, every
// element within half a step, zero rows get scale 0, and a row with one
// outlier keeps it.
TEST(QuantizeRows, I8RowsWithScales) {
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const int64_t rows = 7, n = 37, ss = 41, ds = 40;
  std::vector<float> x(static_cast<size_t>((rows - 1) * ss + n));
  for (float& v : x) v = g(rng);
  for (int64_t c = 0; c < n; ++c) x[static_cast<size_t>(2 * ss + c)] = 0.0f;
  x[static_cast<size_t>(3 * ss + 5)] = 1000.0f;                  // outlier
  for (int64_t c = 0; c < n; ++c) x[static_cast<size_t>(4 * ss + c)] *= 1e-30f;
  // Row 5: max 127, scale 1, so the ties are visible: 2.5 -> 2, -3.5 -> -4.
  const float row5[4] = {127.0f, 2.5f, -3.5f, 0.5f};
  for (int c = 0; c < 4; ++c) x[static_cast<size_t>(5 * ss + c)] = row5[c];
  for (int64_t c = 4; c < n; ++c) x[static_cast<size_t>(5 * ss + c)] = 1.0f;
  std::vector<int8_t> y(static_cast<size_t>(rows * ds), 99);
  std::vector<float> scales(rows + 1, -1.0f);
  ASSERT_EQ(qkv_quantize_rows(QKV_DTYPE_I8, rows, n, x.data(), ss, y.data(), ds,
                              scales.data()),
            QKV_OK);
  EXPECT_EQ(scales[rows], -1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * ss;
    float max_abs = 0;
    for (int64_t c = 0; c < n; ++c) max_abs = std::max(max_abs, std::fabs(xr[c]));
    const float scale = max_abs / 127.0f;
    ASSERT_EQ(scales[static_cast<size_t>(r)], scale) << "row " << r;
    bool hit_127 = false;
    for (int64_t c = 0; c < n; ++c) {
      const int8_t q = y[static_cast<size_t>(r * ds + c)];
      int want = 0;
      if (scale > 0) {
        const double t = static_cast<double>(static_cast<float>(xr[c] / scale));
        want = static_cast<int>(std::nearbyint(t));
        want = std::min(127, std::max(-127, want));
        EXPECT_LE(std::fabs(xr[c] - static_cast<double>(scale) * q),
                  0.5 * scale * (1 + 1e-5))
            << r << "," << c;
      }
      ASSERT_EQ(q, want) << "row " << r << " col " << c << " x " << xr[c];
      hit_127 = hit_127 || q == 127 || q == -127;
    }
    EXPECT_EQ(hit_127, max_abs > 0) << "row " << r;
    for (int64_t c = n; c < ds && r + 1 < rows; ++c) {
      EXPECT_EQ(y[static_cast<size_t>(r * ds + c)], 99) << "gap written";
    }
  }
  EXPECT_EQ(scales[2], 0.0f);
  EXPECT_EQ(scales[5], 1.0f);
  EXPECT_EQ(y[static_cast<size_t>(5 * ds + 1)], 2);
  EXPECT_EQ(y[static_cast<size_t>(5 * ds + 2)], -4);
  EXPECT_EQ(y[static_cast<size_t>(5 * ds + 3)], 0);
  EXPECT_EQ(y[static_cast<size_t>(3 * ds + 5)], 127);
}

TEST(QuantizeRows, F32IsACopyAndEmptyShapesWriteNothing) {
  const float x[6] = {1.5f, -0.0f, NAN, INFINITY, 3e38f, 1e-45f};
  float y[8];
  std::fill(y, y + 8, 7.0f);
  ASSERT_EQ(qkv_quantize_rows(QKV_DTYPE_F32, 2, 3, x, 3, y, 4, nullptr), QKV_OK);
  EXPECT_EQ(std::memcmp(y, x, 12), 0);
  EXPECT_EQ(std::memcmp(y + 4, x + 3, 12), 0);
  EXPECT_EQ(y[3], 7.0f);
  EXPECT_EQ(y[7], 7.0f);
  EXPECT_EQ(qkv_quantize_rows(QKV_DTYPE_F16, 0, 5, nullptr, 0, nullptr, 0,
                              nullptr),
            QKV_OK);
  float s[2] = {5.0f, 5.0f};
  EXPECT_EQ(qkv_quantize_rows(QKV_DTYPE_I8, 2, 0, nullptr, 0, nullptr, 0, s),
            QKV_OK);
  EXPECT_EQ(s[0], 0.0f);
  EXPECT_EQ(s[1], 0.0f);
}

// Every refusal returns QKV_ERR_INVALID_ARGUMENT and leaves dst and scales
// as they were.
TEST(QuantizeRows, BadInputsAreRefusedAndWriteNothing) {
  std::vector<float> x(64, 1.0f);
  x[10] = 2.0f;
  std::vector<int8_t> y(64, 5);
  std::vector<float> s(4, 9.0f);
  struct Case {
    const char* what;
    int dtype;
    int64_t rows, n;
    const float* src;
    int64_t ss;
    void* dst;
    int64_t ds;
    float* scales;
  };
  std::vector<float> non_finite(x);
  non_finite[33] = NAN;
  std::vector<float> inf_row(x);
  inf_row[3] = -INFINITY;
  const Case cases[] = {
      {"dtype 4", 4, 2, 8, x.data(), 0, y.data(), 0, s.data()},
      {"dtype -1", -1, 2, 8, x.data(), 0, y.data(), 0, s.data()},
      {"rows < 0", QKV_DTYPE_I8, -1, 8, x.data(), 0, y.data(), 0, s.data()},
      {"n < 0", QKV_DTYPE_I8, 2, -8, x.data(), 0, y.data(), 0, s.data()},
      {"src stride < 0", QKV_DTYPE_I8, 2, 8, x.data(), -8, y.data(), 0, s.data()},
      {"dst stride < 0", QKV_DTYPE_I8, 2, 8, x.data(), 0, y.data(), -8, s.data()},
      {"src stride < n", QKV_DTYPE_I8, 2, 8, x.data(), 7, y.data(), 0, s.data()},
      {"dst stride < n", QKV_DTYPE_I8, 2, 8, x.data(), 0, y.data(), 7, s.data()},
      {"src NULL", QKV_DTYPE_I8, 2, 8, nullptr, 0, y.data(), 0, s.data()},
      {"dst NULL", QKV_DTYPE_I8, 2, 8, x.data(), 0, nullptr, 0, s.data()},
      {"scales NULL", QKV_DTYPE_I8, 2, 8, x.data(), 0, y.data(), 0, nullptr},
      {"scales NULL, n 0", QKV_DTYPE_I8, 2, 0, x.data(), 0, y.data(), 0, nullptr},
      {"NaN in a later row", QKV_DTYPE_I8, 5, 8, non_finite.data(), 8, y.data(),
       8, s.data()},
      {"-inf in the first row", QKV_DTYPE_I8, 2, 8, inf_row.data(), 0, y.data(),
       0, s.data()},
      {"huge rows", QKV_DTYPE_F16, INT64_MAX / 2, 8, x.data(), 0, y.data(), 0,
       nullptr},
      {"huge n", QKV_DTYPE_F16, 2, INT64_MAX, x.data(), 0, y.data(), 0, nullptr},
      {"huge stride", QKV_DTYPE_F16, 2, 8, x.data(), INT64_MAX / 2, y.data(), 0,
       nullptr},
      {"dst overlaps src", QKV_DTYPE_BF16, 2, 8, x.data(), 0, x.data() + 4, 0,
       nullptr},
      {"scales overlap src", QKV_DTYPE_I8, 2, 8, x.data(), 0, y.data(), 0,
       x.data() + 15},
      {"scales overlap dst", QKV_DTYPE_I8, 2, 8, x.data(), 0, y.data(), 0,
       reinterpret_cast<float*>(y.data() + 12)},
  };
  for (const Case& c : cases) {
    const std::vector<float> x0(x);
    const std::vector<int8_t> y0(y);
    const std::vector<float> s0(s);
    qkv_dtype t;
    std::memcpy(&t, &c.dtype, sizeof t);
    EXPECT_EQ(qkv_quantize_rows(t, c.rows, c.n, c.src, c.ss, c.dst, c.ds,
                                c.scales),
              QKV_ERR_INVALID_ARGUMENT)
        << c.what;
    EXPECT_EQ(x, x0) << c.what;
    EXPECT_EQ(y, y0) << c.what;
    EXPECT_EQ(s, s0) << c.what;
  }
}

}  // namespace
