// The building blocks of the SIMD pipeline (src/pipeline/flash-inl.h), each
// alone, on every SIMD engine and target this CPU runs, at vector and tile
// edges (N - 1, N, N + 1, kBlockKeys +- 1), against scalar definitions
// written here: the exp, the in-register transposes, the block epilogue
// (bias and key intervals) and the row finisher. Linked against the static
// library: these are internal interfaces (qkv::PipelineBlocks).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine.h"
#include "semantics.h"
#include "pipeline/rows.h"
#include "pipeline/workspace.h"

namespace qkv_test {
namespace {

// The SIMD backends this CPU runs, by name.
std::vector<std::string> SimdEngines() {
  std::vector<std::string> out;
  for (size_t i = 0; i < qkv::EngineCount(); ++i) {
    if (qkv::BlocksOf(qkv::EngineAt(i)) != nullptr) {
      out.push_back(qkv::EngineAt(i)->name);
    }
  }
  return out;
}

std::string Name(const testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}

class Blocks : public testing::TestWithParam<std::string> {
 protected:
  const qkv::PipelineBlocks& b() const {
    return *qkv::BlocksOf(qkv::FindEngine(GetParam().c_str()));
  }
  size_t N() const { return b().lanes(); }
};

// n floats, 64-byte aligned like the pipeline's workspace (tile loads are
// aligned).
class Aligned {
 public:
  explicit Aligned(size_t n) : buf_(n + 16) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(buf_.data());
    data_ = buf_.data() + ((64 - at % 64) % 64) / sizeof(float);
  }
  float* data() { return data_; }
  float& operator[](size_t i) { return data_[i]; }

 private:
  std::vector<float> buf_;
  float* data_;
};

double Ulps(double got, double exact) {
  int e = 0;
  std::frexp(std::fabs(exact), &e);
  const double ulp =
      std::fmax(std::ldexp(1.0, e - 1 - 23), std::ldexp(1.0, -149));
  return std::fabs(got - exact) / ulp;
}

// exp on [-87, 0] within 1.2 ulp (1.03 with FMA, 1.11 without), exactly 1
// at 0, exactly 0 below -87 and at -inf, for every length around the vector
// width (the tail goes through a scratch, never past the array).
TEST_P(Blocks, ExpWithinUlpsAndFlushesBelowRange) {
  std::vector<float> x;
  for (int i = 0; i < 4000; ++i) {
    const double u = (i + 0.5) / 4000.0;
    x.push_back(static_cast<float>(-87.0 * u * u));
  }
  for (float e : {0.0f, -0.0f, -1e-30f, -0.3465736f, -86.999f, -87.0f}) {
    x.push_back(e);
  }
  std::vector<float> y(x.size());
  b().exp(x.data(), y.data(), x.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    worst = std::fmax(worst, Ulps(y[i], std::exp(static_cast<double>(x[i]))));
  }
  EXPECT_LE(worst, 1.2) << GetParam();
  const float zero_in[] = {0.0f};
  float one = 0;
  b().exp(zero_in, &one, 1);
  EXPECT_EQ(one, 1.0f);
  for (size_t n : {size_t{1}, N() - 1, N(), N() + 1, 2 * N() + 3}) {
    if (n == 0) continue;
    std::vector<float> in(n), out(n + 1, 7.0f);
    for (size_t i = 0; i < n; ++i) {
      in[i] = i % 3 == 0 ? -INFINITY : (i % 3 == 1 ? -87.5f : -1e4f);
    }
    b().exp(in.data(), out.data(), n);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(out[i], 0.0f) << "n " << n;
    EXPECT_EQ(out[n], 7.0f) << "wrote past n = " << n;
  }
}

// The softcap's tanh: within a few ulp of tanh everywhere (relative: dense
// near 0, where 1 - exp(-2|x|) would cancel, down to tiny |x|, where tanh x
// is x (results below FLT_MIN may be flushed, as ARMv7 NEON does), and out
// to where it is 1; a softcap of 1e4 multiplies the error), odd,
// exactly +-1 at +-inf and far out, exactly 0 at 0, NaN for NaN, for every
// length around the vector width (the tail never writes past n).
TEST_P(Blocks, SoftcapTanhWithinUlps) {
  std::vector<float> x;
  for (int i = 0; i < 6000; ++i) {
    const double u = (i + 0.5) / 6000.0;
    x.push_back(static_cast<float>(12.0 * u * u * u));
    x.push_back(-x.back());
    x.push_back(static_cast<float>(std::pow(10.0, -7.0 + 7.0 * u)));
    x.push_back(-x.back());
  }
  for (float e : {1e-30f, 1e-8f, 1e-4f, 0.17328f, 0.17329f, 0.3f, 0.5493061f,
                  9.0f, 44.0f, 87.0f, 1e4f, 3e38f, 1e-38f, 1e-45f}) {
    x.push_back(e);
    x.push_back(-e);
  }
  std::vector<float> y(x.size());
  b().tanh(x.data(), y.data(), x.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double exact = std::tanh(static_cast<double>(x[i]));
    if (std::fabs(exact) < FLT_MIN) {  // subnormal: ARMv7 NEON flushes to 0
      EXPECT_LT(std::fabs(y[i]), FLT_MIN) << "x = " << x[i];
      continue;
    }
    worst = std::fmax(worst, Ulps(y[i], exact));
    if (i % 2 == 1) {
      EXPECT_EQ(y[i], -y[i - 1]) << "odd at " << x[i - 1];
    }
  }
  // Measured: 2.65 on x86; 2.85 (Highway) and 3.46 (xsimd) on ARMv7 NEON,
  // which divides by a reciprocal estimate and Newton steps.
  EXPECT_LE(worst, 4.0) << GetParam();
  const float special[] = {INFINITY, -INFINITY, 0.0f, NAN, 1e4f, -1e4f};
  for (size_t n : {size_t{1}, N() - 1, N(), N() + 1, 2 * N() + 3}) {
    if (n == 0) continue;
    std::vector<float> in(n), out(n + 1, 7.0f);
    for (size_t i = 0; i < n; ++i) in[i] = special[i % 6];
    b().tanh(in.data(), out.data(), n);
    for (size_t i = 0; i < n; ++i) {
      if (i % 6 == 3) {
        EXPECT_TRUE(std::isnan(out[i])) << "n " << n;
      } else {
        const float want = i % 6 == 2 ? 0.0f : (i % 2 == 0 ? 1.0f : -1.0f);
        EXPECT_EQ(out[i], want) << "n " << n << " x " << in[i];
      }
    }
    EXPECT_EQ(out[n], 7.0f) << "wrote past n = " << n;
  }
}

TEST_P(Blocks, TransposeIsATranspose) {
  const size_t n = b().transpose_lanes;
  if (n == 0) GTEST_SKIP() << "no in-register transpose on this target";
  EXPECT_EQ(n, N());
  std::vector<float> m(n * n);
  for (size_t i = 0; i < n * n; ++i) m[i] = static_cast<float>(i);
  b().transpose(m.data());
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      ASSERT_EQ(m[i * n + j], static_cast<float>(j * n + i)) << i << "," << j;
    }
  }
}

// m's elements: magnitudes from 2^-20 to 2^20 with both signs, so that a
// sum in another order or of another lane gives other bits.
void FillWideMagnitudes(std::mt19937* rng, std::vector<float>* m) {
  for (float& x : *m) {
    const int e = static_cast<int>((*rng)() % 41) - 20;
    const float sign = (*rng)() % 2 ? -1.0f : 1.0f;
    x = sign *
        std::ldexp(1.0f + static_cast<float>((*rng)() % 1000) / 999.0f, e);
  }
}

// The 8-row decoding scores' lane sums (RowScores8), bit for bit the order
// a transpose and a tree of adds of adjacent lanes give: ((l0 + l1) +
// (l2 + l3)) + ((l4 + l5) + (l6 + l7)); with 16 lanes the same for lanes
// 8..15, then the two halves. Magnitudes from 2^-20 to 2^20 with both signs, so that any
// other order or lane gives other bits.
TEST_P(Blocks, SumLanesAddsAdjacentLanesPairwise) {
  const int n = static_cast<int>(b().transpose_lanes);
  if (n == 0) GTEST_SKIP() << "no in-register transpose";
  std::mt19937 rng(11);
  std::vector<float> m(static_cast<size_t>(n) * n);
  for (int round = 0; round < 50; ++round) {
    FillWideMagnitudes(&rng, &m);
    float sums[16];
    b().sum_lanes(m.data(), sums);
    for (int i = 0; i < n; ++i) {
      const float* l = m.data() + n * i;
      float half[2];
      for (int h = 0; h < n / 8; ++h) {
        const float* a = l + 8 * h;
        half[h] = ((a[0] + a[1]) + (a[2] + a[3])) +
                  ((a[4] + a[5]) + (a[6] + a[7]));
      }
      const float want = n == 16 ? half[0] + half[1] : half[0];
      ASSERT_EQ(std::memcmp(&sums[i], &want, sizeof want), 0)
          << "row " << i << ": " << sums[i] << " != " << want;
    }
  }
}

// The row path's 4 lane sums at once (O::SumLanes4: RowScores' 4 keys, a
// key's 4 rows), bit for bit each row's own reduction (O::ReduceSum) on
// every engine and target, and that reduction a sum of the right row.
// Magnitudes from 2^-20 to 2^20 with both signs, so that another order or
// another lane gives other bits.
TEST_P(Blocks, SumLanes4MatchesEachRowsReduction) {
  const size_t n = N();
  std::mt19937 rng(13);
  std::vector<float> m(4 * n);
  for (int round = 0; round < 200; ++round) {
    FillWideMagnitudes(&rng, &m);
    float sums[4], reduced[4];
    b().sum_lanes4(m.data(), sums, reduced);
    for (size_t i = 0; i < 4; ++i) {
      ASSERT_EQ(std::memcmp(&sums[i], &reduced[i], sizeof(float)), 0)
          << "row " << i << ": " << sums[i] << " != " << reduced[i];
      double want = 0.0, mag = 0.0;
      for (size_t l = 0; l < n; ++l) {
        want += m[i * n + l];
        mag += std::fabs(m[i * n + l]);
      }
      ASSERT_NEAR(sums[i], want, 1e-6 * mag) << "row " << i;
    }
  }
}

// The epilogue against its definition: score + bias (a -inf bias hides even
// a NaN score), then -inf outside [lo, hi). Intervals that cut the block
// anywhere, cover it, miss it, are empty; rows = R, R - 1, 1 (padding
// lanes); nb = 1, N, kBlockKeys - 1, kBlockKeys.
TEST_P(Blocks, EpilogueMatchesDefinition) {
  std::mt19937 rng(7);
  const int64_t kv_len = 300;
  std::vector<float> bias_rows(64 * kv_len);
  for (size_t i = 0; i < bias_rows.size(); ++i) {
    const uint32_t r = rng() % 10;
    bias_rows[i] = r == 0 ? -INFINITY : static_cast<float>(rng() % 100) / 7.0f;
  }
  int cases = 0;
  for (int rv : {1, 2}) {
    const size_t R = static_cast<size_t>(rv) * N();
    for (int64_t rows :
         {static_cast<int64_t>(R), static_cast<int64_t>(R) - 1, int64_t{1}}) {
      if (rows < 1) continue;
      for (int64_t nb : {int64_t{1}, static_cast<int64_t>(N()),
                         qkv::kBlockKeys - 1, qkv::kBlockKeys}) {
        for (int64_t j0 : {int64_t{0}, int64_t{64}, int64_t{128}}) {
          for (int variant = 0; variant < 6; ++variant) {
            std::vector<int32_t> lo(rows), hi(rows);
            std::vector<const float*> bias(rows, nullptr);
            for (int64_t r = 0; r < rows; ++r) {
              switch (variant) {
                case 0:  // every row sees the whole block: no mask
                  lo[r] = 0;
                  hi[r] = static_cast<int32_t>(kv_len);
                  break;
                case 1:  // causal-like suffixes cut inside the block
                  lo[r] = 0;
                  hi[r] = static_cast<int32_t>(j0 + r % (nb + 1));
                  break;
                case 2:  // window-like prefixes hidden
                  lo[r] = static_cast<int32_t>(j0 + (r * 3) % (nb + 1));
                  hi[r] = static_cast<int32_t>(kv_len);
                  break;
                case 3:  // width-1 intervals, some outside the block
                  lo[r] = static_cast<int32_t>(j0 - 1 + r % (nb + 2));
                  hi[r] = lo[r] + 1;
                  break;
                case 4:  // empty rows among full ones
                  lo[r] = r % 2 ? 5 : 0;
                  hi[r] = r % 2 ? 5 : static_cast<int32_t>(kv_len);
                  break;
                default:  // random intervals and biases
                  lo[r] = static_cast<int32_t>(rng() % kv_len);
                  hi[r] = static_cast<int32_t>(lo[r] +
                                               rng() % (kv_len - lo[r] + 1));
                  if (rng() % 2) bias[r] = bias_rows.data() + (r % 64) * kv_len;
                  break;
              }
              if (lo[r] < 0) lo[r] = 0;
            }
            const size_t size = static_cast<size_t>(nb) * R;
            Aligned st(size);
            std::vector<float> want(size);
            for (size_t i = 0; i < size; ++i) {
              st[i] = i % 11 == 0 ? NAN : static_cast<float>(i % 17) - 8.0f;
              want[i] = st[i];
            }
            for (int64_t j = 0; j < nb; ++j) {
              for (int64_t r = 0; r < rows; ++r) {
                float& s = want[j * R + r];
                const int64_t key = j0 + j;
                if (bias[r] != nullptr) s = qkv::WithBias(s, bias[r][key]);
                if (key < lo[r] || key >= hi[r]) s = -INFINITY;
              }
            }
            b().epilogue(lo.data(), hi.data(), bias.data(), rows, rv, kv_len,
                         j0, nb, st.data());
            for (int64_t j = 0; j < nb; ++j) {
              for (int64_t r = 0; r < rows; ++r) {
                const float g = st[j * R + r], w = want[j * R + r];
                ASSERT_TRUE(g == w || (std::isnan(g) && std::isnan(w)))
                    << "rv " << rv << " rows " << rows << " nb " << nb << " j0 "
                    << j0 << " variant " << variant << " key " << j0 + j
                    << " row " << r << ": " << g << " want " << w;
              }
            }
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 100);
}

// The row finisher against its definition (src/semantics.h): out = o / l,
// lse = m + log(l), weights = exp(raw - m) / l inside [w_lo, w_hi) and 0
// outside; a row that saw nothing gets zeros and -inf. Output widths around
// the vector width, contiguous (row path) and strided (tile path) sources,
// and nothing written outside the row.
TEST_P(Blocks, RowFinisherMatchesDefinition) {
  const size_t n = N();
  for (int64_t dv :
       {int64_t{1}, static_cast<int64_t>(n) - 1, static_cast<int64_t>(n),
        static_cast<int64_t>(n) + 1, 2 * static_cast<int64_t>(n) + 3}) {
    if (dv < 1) continue;
    for (size_t stride : {size_t{1}, 2 * n}) {
      for (int64_t c_begin :
           {int64_t{0}, dv > static_cast<int64_t>(n) ? static_cast<int64_t>(n)
                                                     : int64_t{0}}) {
        for (bool seen : {true, false}) {
          const int64_t lk = 70, rows = 3, row = 1;
          const int64_t w_lo = 3, w_hi = 67;
          qkv::Problem p = {};
          p.batch = 1;
          p.q_heads = p.kv_heads = 1;
          p.q_len = rows;
          p.kv_len = lk;
          p.value_dim = dv;
          std::vector<float> out(rows * dv, 5.0f), lse(rows, 5.0f),
              weights(rows * lk, 5.0f);
          p.out = out.data();
          p.lse = lse.data();
          p.weights = weights.data();
          std::vector<float> o(static_cast<size_t>(dv) * stride, NAN);
          for (int64_t c = 0; c < dv; ++c) {
            o[c * stride] = static_cast<float>(c) - 2.5f;
          }
          float m = 1.5f, l = seen ? 3.25f : 0.0f;
          for (int64_t j = 0; j < lk; ++j) {
            weights[row * lk + j] = j % 5 == 0 ? -INFINITY : 1.5f - j * 0.01f;
          }
          if (!seen) m = -INFINITY;
          b().finish_row(p, row, m, l, o.data(), stride, c_begin, w_lo, w_hi);
          for (int64_t c = 0; c < dv; ++c) {
            const float got = out[row * dv + c];
            if (!seen) {
              EXPECT_EQ(got, 0.0f);
            } else if (c < c_begin) {
              EXPECT_EQ(got, 5.0f) << "column before c_begin written";
            } else {
              EXPECT_FLOAT_EQ(got, o[c * stride] / l) << "dv " << dv;
            }
          }
          EXPECT_FLOAT_EQ(lse[row], seen ? m + std::log(l) : -INFINITY);
          for (int64_t j = 0; j < lk; ++j) {
            const float got = weights[row * lk + j];
            float want = 0.0f;
            if (seen && j >= w_lo && j < w_hi && j % 5 != 0) {
              want = static_cast<float>(
                  std::exp(static_cast<double>(1.5f - j * 0.01f) - m) / l);
            }
            EXPECT_NEAR(got, want, 2e-7) << "weight " << j;
          }
          for (int64_t r : {int64_t{0}, int64_t{2}}) {  // other rows untouched
            EXPECT_EQ(lse[r], 5.0f);
            for (int64_t c = 0; c < dv; ++c) EXPECT_EQ(out[r * dv + c], 5.0f);
            for (int64_t j = 0; j < lk; ++j) {
              EXPECT_EQ(weights[r * lk + j], 5.0f);
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Simd, Blocks, testing::ValuesIn(SimdEngines()), Name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Blocks);

// Key intervals and the block-skipping summary (scalar, shared by every
// engine).
TEST(RowKeys, CausalAndValidLengthsCutTheSuffix) {
  qkv::Problem p = {};
  p.q_len = 4;
  p.kv_len = 10;
  p.causal = true;
  const int32_t valid[] = {7, 2};
  p.valid_lens = valid;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < 4; ++i) {
      const qkv::KeyInterval k = qkv::RowKeys(p, b, i);
      EXPECT_EQ(k.lo, 0);
      EXPECT_EQ(k.hi, std::min<int64_t>(i + 7, valid[b]));
    }
  }
}

// The tiny path serves toy widths only: a decoding step over a few keys of
// a wide head takes the row path (bench/README.md, "Path boundaries: the
// tiny path's widths").
TEST(TinyPath, OnlyToyWidthsWithFewKeys) {
  qkv::Problem p = {};
  p.batch = 1;
  p.q_heads = p.kv_heads = 32;
  p.group = 1;
  p.q_len = 1;
  p.score = QKV_SCORE_DOT;
  p.kv_dtype = QKV_DTYPE_F32;
  struct Case {
    int64_t d, kv_len;
    qkv_dtype dtype;
    size_t lanes;
    bool tiny;
  };
  const Case cases[] = {
      {2, 4, QKV_DTYPE_F32, 16, true},     {16, 8, QKV_DTYPE_F32, 16, true},
      {16, 9, QKV_DTYPE_F32, 16, false},   {17, 4, QKV_DTYPE_F32, 16, false},
      {128, 16, QKV_DTYPE_F32, 16, false}, {128, 1, QKV_DTYPE_F32, 16, false},
      {8, 16, QKV_DTYPE_F16, 16, true},    {9, 4, QKV_DTYPE_F16, 16, false},
      {128, 16, QKV_DTYPE_F16, 16, false}, {4, 9, QKV_DTYPE_F32, 8, false},
      {4, 17, QKV_DTYPE_F32, 16, false},
  };
  for (const Case& c : cases) {
    p.head_dim = p.value_dim = c.d;
    p.kv_len = c.kv_len;
    p.kv_dtype = c.dtype;
    EXPECT_EQ(qkv::UsesTinyPath(p, c.lanes), c.tiny)
        << "d " << c.d << ", kv_len " << c.kv_len << ", dtype " << c.dtype
        << ", lanes " << c.lanes;
  }
  p.head_dim = p.value_dim = 2;
  p.kv_len = 4;
  p.group = 8;  // 8 rows per kv head: the tile path
  EXPECT_FALSE(qkv::UsesTinyPath(p, 16));
}

TEST(RowsSpan, MasksOnlyBlocksThatCutARow) {
  qkv::Problem p = {};
  p.kv_len = 256;
  qkv::RowsSpan s = qkv::EmptySpan(p);
  s.Add(qkv::KeyInterval{10, 200});
  s.Add(qkv::KeyInterval{64, 150});
  EXPECT_EQ(s.begin, 10);
  EXPECT_EQ(s.end, 200);
  EXPECT_TRUE(s.Masks(0, 64));    // row 0 starts at 10, row 1 at 64
  EXPECT_FALSE(s.Masks(64, 64));  // both see [64, 128)
  EXPECT_TRUE(s.Masks(128, 64));  // row 1 ends at 150
  s.Add(qkv::KeyInterval{5, 5});  // a row that sees nothing masks every block
  EXPECT_TRUE(s.Masks(64, 64));
}

}  // namespace
}  // namespace qkv_test
