// The NaN/Inf policy, on every backend and score kind:
//  (a) NaN or Inf in q, k or v never crashes (and is not an argument error);
//  (b) it never leaks into rows that do not read it: a query row reads only
//      its own q, and reads k and v of key j only when j is visible to it
//      (within its causal and valid-length limits and not hidden by a
//      -INFINITY bias); every other row is bitwise identical to a clean run;
//  (c) a row that sees no key gives zeros in out and weights and -INFINITY
//      in lse, whatever sits in q, k and v;
//  (d) logits around 1e4 whose best key leads by more than ~104 give exactly
//      one-hot weights (1 and 0), out equal to the chosen v row, and a finite
//      lse;
//  (e) a scale whose product with a query element overflows, while the
//      scores do not, gives the scores' softmax (the scale is applied after
//      the dot product when |scale| > 1).
// Shapes take every Highway path: "tile" (GQA, 38 rows per kv head, three
// key blocks of 64), "decode" (4 rows per kv head: the row path) and "tiny"
// (3 keys, fewer than the lanes of any vector target: keys in lanes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "qkv/qkv.h"
#include "test_util.h"

namespace qkv_test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Shape {
  const char* name;
  int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim, value_dim;
};

const Shape kTile = {"tile", 2, 4, 2, 19, 130, 10, 9};
const Shape kDecode = {"decode", 2, 2, 1, 2, 130, 10, 9};
// kv_len below the vector width: Highway's keys-in-lanes path.
const Shape kTiny = {"tiny", 3, 2, 1, 2, 3, 5, 3};
// Decoding steps at GQA 4 and 8 with whole vectors of head_dim and
// value_dim up to 16 lanes: joint rows' scores and output (RowScores8 on
// AVX-512 and AVX2; RowOutputRows' unguarded columns unless a probability
// is 0).
const Shape kDecodeGqa4 = {"decode_gqa4", 2, 4, 1, 1, 130, 16, 64};
const Shape kDecodeGqa8 = {"decode_gqa8", 2, 8, 1, 1, 130, 16, 64};

struct MaskConfig {
  const char* name;
  bool causal;
  int valid;  // 0: none, 1: per batch, 2: per query
  bool bias;
};

const MaskConfig kMasks[] = {
    {"none", false, 0, false},
    {"causal", true, 0, false},
    {"valid_lens", false, 1, false},
    {"valid_lens_per_query", false, 2, false},
    {"bias_neg_inf", false, 0, true},
    {"causal+valid_lens_per_query+bias", true, 2, true},
};

using Param = std::tuple<std::string, int>;  // backend, score

std::string ScoreName(int score) {
  return score == QKV_SCORE_DOT        ? "dot"
         : score == QKV_SCORE_GAUSSIAN ? "gaussian"
                                       : "additive";
}

// Sets the score kind (and its weights) on p.
void SetScore(Problem* p, int score, std::mt19937* rng) {
  qkv_attention_desc& d = p->desc;
  d.score = static_cast<qkv_score>(score);
  if (score == QKV_SCORE_GAUSSIAN) d.scale = 0.5f;
  if (score == QKV_SCORE_ADDITIVE) {
    const int64_t hidden = 3;
    d.additive_hidden = hidden;
    p->w_q.resize(static_cast<size_t>(hidden * d.head_dim));
    p->w_k.resize(static_cast<size_t>(hidden * d.head_dim));
    p->w_v.resize(static_cast<size_t>(hidden));
    FillUniform(&p->w_q, rng, -0.5f, 0.5f);
    FillUniform(&p->w_k, rng, -0.5f, 0.5f);
    FillUniform(&p->w_v, rng, -1.0f, 1.0f);
  }
}

// Applies a mask configuration: valid lengths that include 0 and kv_len, a
// bias with about a quarter of its entries -INFINITY.
void SetMask(Problem* p, const MaskConfig& m, std::mt19937* rng) {
  qkv_attention_desc& d = p->desc;
  const int64_t lk = d.kv_len;
  if (m.causal) d.mask |= QKV_MASK_CAUSAL;
  if (m.valid != 0) {
    d.mask |= QKV_MASK_VALID_LENS;
    p->valid_lens.clear();
    if (m.valid == 1) {
      for (int64_t b = 0; b < d.batch; ++b) {
        const int64_t len = b == 0 ? 100 : b == 1 ? 37 : 0;
        p->valid_lens.push_back(static_cast<int32_t>(len < lk ? len : lk - 1));
      }
    } else {
      d.valid_lens_per_query = 1;
      for (int64_t b = 0; b < d.batch; ++b) {
        for (int64_t i = 0; i < d.q_len; ++i) {
          p->valid_lens.push_back(
              static_cast<int32_t>((37 + 29 * i + 61 * b) % (lk + 1)));
        }
      }
    }
  }
  if (m.bias) {
    d.mask |= QKV_MASK_BIAS;
    d.bias_head_stride = d.q_len * lk;
    d.bias_batch_stride = d.q_heads * d.q_len * lk;
    p->bias.resize(static_cast<size_t>(d.batch * d.q_heads * d.q_len * lk));
    FillUniform(&p->bias, rng, -1.0f, 1.0f);
    std::uniform_int_distribution<int> quarter(0, 3);
    for (float& x : p->bias) {
      if (quarter(*rng) == 0) x = -kInf;
    }
  }
}

Problem MakeCase(const Shape& s, const MaskConfig& m, int score,
                 const std::string& backend, uint32_t seed) {
  Problem p = MakeProblem(s.batch, s.q_heads, s.kv_heads, s.q_len, s.kv_len,
                          s.head_dim, s.value_dim, seed);
  std::mt19937 rng(seed ^ 0x9e3779b9u);
  SetScore(&p, score, &rng);
  SetMask(&p, m, &rng);
  p.backend = backend;
  return p;
}

// Whether query row (b, h, i) may look at key j: every active mask lets it
// through. A row reads k and v of key j of its kv head only if so.
bool Visible(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  const qkv_attention_desc& d = p.desc;
  if ((d.mask & QKV_MASK_CAUSAL) && j > i + d.kv_len - d.q_len) return false;
  if (d.mask & QKV_MASK_VALID_LENS) {
    const int32_t len = d.valid_lens_per_query
                            ? p.valid_lens[static_cast<size_t>(b * d.q_len + i)]
                            : p.valid_lens[static_cast<size_t>(b)];
    if (j >= len) return false;
  }
  if (d.mask & QKV_MASK_BIAS) {
    const size_t at = static_cast<size_t>(
        b * d.bias_batch_stride + h * d.bias_head_stride + i * d.kv_len + j);
    if (p.bias[at] == -kInf) return false;
  }
  return true;
}

std::string FloatBits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  std::ostringstream os;
  os << x << " (0x" << std::hex << u << ")";
  return os.str();
}

// Compares row r of two outputs bitwise; describes the first difference.
bool RowEqual(const qkv_attention_desc& d, const Outputs& a, const Outputs& b,
              int64_t r, std::string* why) {
  const size_t dv = static_cast<size_t>(d.value_dim);
  const size_t lk = static_cast<size_t>(d.kv_len);
  const size_t row = static_cast<size_t>(r);
  for (size_t c = 0; c < dv; ++c) {
    const size_t at = row * dv + c;
    if (std::memcmp(&a.out[at], &b.out[at], sizeof(float)) != 0) {
      *why = "out[" + std::to_string(c) + "] clean " + FloatBits(a.out[at]) +
             ", poisoned " + FloatBits(b.out[at]);
      return false;
    }
  }
  for (size_t j = 0; j < lk; ++j) {
    const size_t at = row * lk + j;
    if (std::memcmp(&a.weights[at], &b.weights[at], sizeof(float)) != 0) {
      *why = "weights[" + std::to_string(j) + "] clean " +
             FloatBits(a.weights[at]) + ", poisoned " +
             FloatBits(b.weights[at]);
      return false;
    }
  }
  if (std::memcmp(&a.lse[row], &b.lse[row], sizeof(float)) != 0) {
    *why = "lse clean " + FloatBits(a.lse[row]) + ", poisoned " +
           FloatBits(b.lse[row]);
    return false;
  }
  return true;
}

RunOptions FastRun() {
  RunOptions o;
  o.check_short_workspace = false;
  return o;
}

class NonFiniteTest : public ::testing::TestWithParam<Param> {
 public:
  const std::string& backend() const { return std::get<0>(GetParam()); }
  int score() const { return std::get<1>(GetParam()); }

  // Collects leak reports; fails once at the end with the first few.
  void Leak(const std::string& what) {
    if (leaks_.size() < 12) leaks_.push_back(what);
    ++num_leaks_;
  }
  void ReportLeaks(const char* policy) {
    if (num_leaks_ == 0) return;
    std::string msg =
        std::to_string(num_leaks_) + " violation(s) of: " + policy + "\n";
    for (const std::string& l : leaks_) msg += "  " + l + "\n";
    ADD_FAILURE() << msg;
  }

  std::vector<std::string> leaks_;
  int num_leaks_ = 0;
};

const float kPoisons[] = {kNaN, kInf, -kInf};

const char* PoisonName(float x) {
  return std::isnan(x) ? "NaN" : x > 0 ? "+Inf" : "-Inf";
}

// (b) for k or v: poison one element of key j of one (batch, kv head); rows
// that cannot see key j (other batches, other kv heads, beyond their limit,
// hidden by bias) must not change by a single bit.
void PoisonKeysOrValues(NonFiniteTest* t, bool values) {
  const std::string& backend = std::get<0>(t->GetParam());
  const int score = std::get<1>(t->GetParam());
  for (const Shape& s : {kTile, kDecode, kTiny, kDecodeGqa4, kDecodeGqa8}) {
    // Keys at block edges and at the masks' limits; every key when few.
    std::vector<int64_t> positions = {0, 37, 40, 64, 99, 100, 120, 129};
    if (s.kv_len < 8) {
      positions.clear();
      for (int64_t j = 0; j < s.kv_len; ++j) positions.push_back(j);
    }
    for (const MaskConfig& m : kMasks) {
      Problem p = MakeCase(s, m, score, backend,
                           SeedFromName(std::string(s.name) + m.name));
      const Outputs clean = RunAttention(p, FastRun());
      ASSERT_EQ(clean.status, QKV_OK) << qkv_status_string(clean.status);
      const qkv_attention_desc& d = p.desc;
      const int64_t group = d.q_heads / d.kv_heads;
      int idx = 0;
      for (int64_t j : positions) {
        const int64_t pb = idx % d.batch;
        const int64_t pkv = (idx / 2) % d.kv_heads;
        const int64_t dim = values ? d.value_dim : d.head_dim;
        const int64_t pt = (idx * 7) % dim;
        ++idx;
        std::vector<float>& buf = values ? p.v : p.k;
        const size_t at = static_cast<size_t>(
            ((pb * d.kv_heads + pkv) * d.kv_len + j) * dim + pt);
        const float saved = buf[at];
        // NaN, and an infinity whose sign alternates with the position.
        const float poisons[] = {kNaN, idx % 2 ? kInf : -kInf};
        for (float poison : poisons) {
          buf[at] = poison;
          const Outputs got = RunAttention(p, FastRun());
          buf[at] = saved;
          const std::string where =
              std::string(s.name) + "/" + m.name + ": " + PoisonName(poison) +
              " in " + (values ? "v" : "k") + "[b=" + std::to_string(pb) +
              "][kvh=" + std::to_string(pkv) + "][j=" + std::to_string(j) +
              "][" + std::to_string(pt) + "]";
          if (got.status != QKV_OK) {
            t->Leak(where + ": status " + std::to_string(got.status));
            continue;
          }
          for (int64_t b = 0; b < d.batch; ++b) {
            for (int64_t h = 0; h < d.q_heads; ++h) {
              for (int64_t i = 0; i < d.q_len; ++i) {
                const bool reads =
                    b == pb && h / group == pkv && Visible(p, b, h, i, j);
                if (reads) continue;
                const int64_t r = (b * d.q_heads + h) * d.q_len + i;
                std::string why;
                if (!RowEqual(d, clean, got, r, &why)) {
                  t->Leak(where + " changed row (b=" + std::to_string(b) +
                          ", h=" + std::to_string(h) + ", i=" +
                          std::to_string(i) + ") that cannot see key " +
                          std::to_string(j) + ": " + why);
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST_P(NonFiniteTest, PoisonedKeyReachesOnlyRowsThatSeeIt) {
  PoisonKeysOrValues(this, false);
  ReportLeaks("NaN/Inf in k stays in the rows that see that key");
}

TEST_P(NonFiniteTest, PoisonedValueReachesOnlyRowsThatSeeIt) {
  PoisonKeysOrValues(this, true);
  ReportLeaks("NaN/Inf in v stays in the rows that see that key");
}

// (b) for q: a poisoned query row changes no other row.
TEST_P(NonFiniteTest, PoisonedQueryStaysInItsRow) {
  for (const Shape& s : {kTile, kDecode, kTiny}) {
    for (const MaskConfig& m : kMasks) {
      Problem p = MakeCase(s, m, score(), backend(),
                           SeedFromName(std::string(s.name) + m.name + "q"));
      const Outputs clean = RunAttention(p, FastRun());
      ASSERT_EQ(clean.status, QKV_OK) << qkv_status_string(clean.status);
      const qkv_attention_desc& d = p.desc;
      const int64_t rows = d.batch * d.q_heads * d.q_len;
      for (int64_t pr : {int64_t{0}, int64_t{5}, rows / 2 + 1, rows - 1}) {
        if (pr >= rows) continue;
        const int64_t pt = (pr * 5) % d.head_dim;
        const size_t at = static_cast<size_t>(pr * d.head_dim + pt);
        const float saved = p.q[at];
        for (float poison : kPoisons) {
          p.q[at] = poison;
          const Outputs got = RunAttention(p, FastRun());
          p.q[at] = saved;
          const std::string where = std::string(s.name) + "/" + m.name + ": " +
                                    PoisonName(poison) + " in q row " +
                                    std::to_string(pr) + "[" +
                                    std::to_string(pt) + "]";
          if (got.status != QKV_OK) {
            Leak(where + ": status " + std::to_string(got.status));
            continue;
          }
          for (int64_t r = 0; r < rows; ++r) {
            if (r == pr) continue;
            std::string why;
            if (!RowEqual(d, clean, got, r, &why)) {
              Leak(where + " changed row " + std::to_string(r) + ": " + why);
            }
          }
        }
      }
    }
  }
  ReportLeaks("NaN/Inf in one q row changes no other row");
}

// (c) Rows that see no key: zeros and -INFINITY, even when everything they
// could have read (their own q, and every k and v) is NaN or Inf.
TEST_P(NonFiniteTest, FullyMaskedRowsGiveZerosEvenWithPoison) {
  struct Masked {
    const char* name;
    Shape shape;
    MaskConfig mask;
  };
  // Causal with q_len > kv_len: rows i < q_len - kv_len see nothing. Valid
  // lengths / bias with zero-length rows come from the setters below.
  const Masked cases[] = {
      {"causal_q_longer_than_kv",
       {"", 2, 4, 2, 40, 10, 20, 12},
       {"causal", true, 0, false}},
      {"valid_lens_zero",
       {"", 2, 4, 2, 19, 150, 20, 12},
       {"valid_lens", false, 1, false}},
      {"valid_lens_per_query_zero",
       {"", 2, 4, 2, 19, 150, 20, 12},
       {"valid_lens_per_query", false, 2, false}},
      {"bias_all_neg_inf_rows",
       {"", 2, 4, 2, 19, 150, 20, 12},
       {"bias", false, 0, true}},
      {"decode_valid_lens_zero",
       {"", 2, 2, 1, 2, 150, 20, 12},
       {"valid_lens", false, 1, false}},
      {"decode_bias_all_neg_inf",
       {"", 2, 2, 1, 2, 150, 20, 12},
       {"bias", false, 0, true}},
      {"tiny_valid_lens_zero",
       {"", 3, 4, 1, 1, 1, 1, 1},
       {"valid_lens_per_query", false, 2, false}},
      {"tiny_causal_q_longer",
       {"", 2, 2, 1, 5, 3, 4, 3},
       {"causal", true, 0, false}},
      {"tiny_bias_all_neg_inf",
       {"", 2, 2, 2, 3, 3, 4, 3},
       {"bias", false, 0, true}},
  };
  for (const Masked& c : cases) {
    const Shape& s = c.shape;
    Problem p = MakeCase(s, c.mask, score(), backend(), SeedFromName(c.name));
    qkv_attention_desc& d = p.desc;
    // Make some rows see nothing: batch 0 has valid length 0; per-query
    // lengths are 0 on every third row; every third bias row is all -inf.
    if (c.mask.valid == 1) p.valid_lens[0] = 0;
    if (c.mask.valid == 2) {
      for (size_t r = 0; r < p.valid_lens.size(); r += 3) p.valid_lens[r] = 0;
    }
    if (c.mask.bias) {
      const int64_t rows = d.batch * d.q_heads * d.q_len;
      for (int64_t r = 0; r < rows; r += 3) {
        for (int64_t j = 0; j < d.kv_len; ++j) {
          p.bias[static_cast<size_t>(r * d.kv_len + j)] = -kInf;
        }
      }
    }
    std::vector<int64_t> masked;
    for (int64_t b = 0; b < d.batch; ++b) {
      for (int64_t h = 0; h < d.q_heads; ++h) {
        for (int64_t i = 0; i < d.q_len; ++i) {
          bool any = false;
          for (int64_t j = 0; j < d.kv_len && !any; ++j) {
            any = Visible(p, b, h, i, j);
          }
          if (!any) masked.push_back((b * d.q_heads + h) * d.q_len + i);
        }
      }
    }
    ASSERT_FALSE(masked.empty()) << c.name;
    for (int poison = 0; poison < 4; ++poison) {
      // 0: clean; 1: NaN in every k and v; 2: +Inf in every k and v and NaN
      // in the masked rows' q; 3: NaN in every q, k and v.
      Problem pp = p;
      if (poison >= 1) {
        const float x = poison == 2 ? kInf : kNaN;
        for (float& e : pp.k) e = x;
        for (float& e : pp.v) e = x;
      }
      if (poison == 2) {
        for (int64_t r : masked) {
          for (int64_t t = 0; t < d.head_dim; ++t) {
            pp.q[static_cast<size_t>(r * d.head_dim + t)] = kNaN;
          }
        }
      }
      if (poison == 3) {
        for (float& e : pp.q) e = kNaN;
      }
      const char* const kPoisonNames[] = {
          "clean", "NaN k,v", "+Inf k,v, NaN q of masked rows", "NaN q,k,v"};
      const std::string where =
          std::string(c.name) + " (" + kPoisonNames[poison] + ")";
      const Outputs got = RunAttention(pp, FastRun());
      if (got.status != QKV_OK) {
        Leak(where + ": status " + std::to_string(got.status));
        continue;
      }
      for (int64_t r : masked) {
        const size_t row = static_cast<size_t>(r);
        std::string why;
        for (int64_t c2 = 0; c2 < d.value_dim && why.empty(); ++c2) {
          const float o = got.out[row * static_cast<size_t>(d.value_dim) +
                                  static_cast<size_t>(c2)];
          if (o != 0.0f)
            why = "out[" + std::to_string(c2) + "] = " + FloatBits(o);
        }
        for (int64_t j = 0; j < d.kv_len && why.empty(); ++j) {
          const float w = got.weights[row * static_cast<size_t>(d.kv_len) +
                                      static_cast<size_t>(j)];
          if (w != 0.0f)
            why = "weights[" + std::to_string(j) + "] = " + FloatBits(w);
        }
        if (why.empty() && !(got.lse[row] == -kInf)) {
          why = "lse = " + FloatBits(got.lse[row]);
        }
        if (!why.empty()) {
          Leak(where + ": fully masked row " + std::to_string(r) + ": " + why);
        }
      }
    }
  }
  ReportLeaks("a row that sees no key gives zeros and lse -INFINITY");
}

// (d) Logits around 1e4 with the best visible key ahead of the runner-up by
// more than 104 (exp underflows to exactly 0 in f32 below -103.97): weights
// are exactly one-hot, out is the chosen v row, lse the best logit.
TEST_P(NonFiniteTest, HugeLogitsGiveExactOneHot) {
  const MaskConfig masks[] = {kMasks[0], kMasks[1], kMasks[3], kMasks[4],
                              kMasks[5]};
  for (const Shape& s : {kTile, kDecode, kTiny}) {
    for (const MaskConfig& m : masks) {
      const std::string where = std::string(s.name) + "/" + m.name;
      Problem p =
          MakeCase(s, m, score(), backend(), SeedFromName(where + "huge"));
      qkv_attention_desc& d = p.desc;
      std::mt19937 rng(SeedFromName(where));
      // u: a permutation of kv_len evenly spaced values in [-1, 1].
      std::vector<float> u(static_cast<size_t>(d.kv_len));
      for (size_t j = 0; j < u.size(); ++j) {
        u[j] = -1.0f +
               2.0f * static_cast<float>(j) / static_cast<float>(u.size() - 1);
      }
      std::shuffle(u.begin(), u.end(), rng);
      if (m.bias) {  // finite bias entries play no part: only -inf hides
        for (float& x : p.bias) {
          if (x != -kInf) x = 0.0f;
        }
      }
      const int64_t kv_rows = d.batch * d.kv_heads * d.kv_len;
      const int64_t q_rows = d.batch * d.q_heads * d.q_len;
      std::fill(p.k.begin(), p.k.end(), 0.0f);
      std::fill(p.q.begin(), p.q.end(), 0.0f);
      if (score() == QKV_SCORE_DOT) {
        // s = q . k = 100 * sign * 100 * u_j (+ a small term): 1e4 * u_j.
        d.scale = 1.0f;
        for (int64_t r = 0; r < kv_rows; ++r) {
          p.k[static_cast<size_t>(r * d.head_dim)] =
              100.0f * u[static_cast<size_t>(r % d.kv_len)];
          p.k[static_cast<size_t>(r * d.head_dim + 1)] =
              static_cast<float>((r * 13) % 7) * 0.1f;
        }
        for (int64_t r = 0; r < q_rows; ++r) {
          p.q[static_cast<size_t>(r * d.head_dim)] = r % 2 ? -100.0f : 100.0f;
          p.q[static_cast<size_t>(r * d.head_dim + 1)] = 0.5f;
        }
      } else if (score() == QKV_SCORE_GAUSSIAN) {
        // s = -|q - k|^2 = -1e4 - (x_r - 30 u'_j)^2 with keys 30 apart.
        d.scale = 1.0f;
        for (int64_t r = 0; r < kv_rows; ++r) {
          p.k[static_cast<size_t>(r * d.head_dim)] =
              30.0f * 74.5f * u[static_cast<size_t>(r % d.kv_len)];
        }
        // Each row sits 1 away from one of its visible keys: the runner-up
        // is at least 29 away, 840 behind.
        const int64_t group = d.q_heads / d.kv_heads;
        for (int64_t b = 0; b < d.batch; ++b) {
          for (int64_t h = 0; h < d.q_heads; ++h) {
            for (int64_t i = 0; i < d.q_len; ++i) {
              const int64_t r = (b * d.q_heads + h) * d.q_len + i;
              std::vector<int64_t> seen;
              for (int64_t j = 0; j < d.kv_len; ++j) {
                if (Visible(p, b, h, i, j)) seen.push_back(j);
              }
              float x = 0.0f;
              if (!seen.empty()) {
                const int64_t j = seen[rng() % seen.size()];
                const int64_t kvr = (b * d.kv_heads + h / group) * d.kv_len + j;
                x = p.k[static_cast<size_t>(kvr * d.head_dim)] + 1.0f;
              }
              p.q[static_cast<size_t>(r * d.head_dim)] = x;
              p.q[static_cast<size_t>(r * d.head_dim + 1)] = 100.0f;
            }
          }
        }
      } else {
        // s = 3e4 * tanh(q_0 + k_0): hidden 1, W_q = W_k = e_0, keys spread
        // over [-0.8, 0.8], queries in {-0.2, 0, 0.2}.
        d.additive_hidden = 1;
        p.w_q.assign(static_cast<size_t>(d.head_dim), 0.0f);
        p.w_k.assign(static_cast<size_t>(d.head_dim), 0.0f);
        p.w_q[0] = 1.0f;
        p.w_k[0] = 1.0f;
        p.w_v.assign(1, 3e4f);
        for (int64_t r = 0; r < kv_rows; ++r) {
          p.k[static_cast<size_t>(r * d.head_dim)] =
              0.8f * u[static_cast<size_t>(r % d.kv_len)];
        }
        for (int64_t r = 0; r < q_rows; ++r) {
          p.q[static_cast<size_t>(r * d.head_dim)] =
              0.2f * static_cast<float>(r % 3 - 1);
        }
      }
      const Outputs got = RunAttention(p, FastRun());
      ASSERT_EQ(got.status, QKV_OK)
          << where << ": " << qkv_status_string(got.status);
      const int64_t group = d.q_heads / d.kv_heads;
      float max_v = 0.0f;
      for (float x : p.v) max_v = std::fmax(max_v, std::fabs(x));
      int one_hot_rows = 0, huge_rows = 0;
      for (int64_t b = 0; b < d.batch; ++b) {
        for (int64_t h = 0; h < d.q_heads; ++h) {
          for (int64_t i = 0; i < d.q_len; ++i) {
            const int64_t r = (b * d.q_heads + h) * d.q_len + i;
            const int64_t kvr0 = (b * d.kv_heads + h / group) * d.kv_len;
            // Exact logits in double; best and runner-up over visible keys.
            double best = -HUGE_VAL, second = -HUGE_VAL;
            int64_t arg = -1;
            for (int64_t j = 0; j < d.kv_len; ++j) {
              if (!Visible(p, b, h, i, j)) continue;
              const float* qr = &p.q[static_cast<size_t>(r * d.head_dim)];
              const float* kr =
                  &p.k[static_cast<size_t>((kvr0 + j) * d.head_dim)];
              double sc = 0.0;
              for (int64_t t = 0; t < d.head_dim; ++t) {
                if (score() == QKV_SCORE_DOT) {
                  sc += static_cast<double>(qr[t]) * kr[t];
                } else if (score() == QKV_SCORE_GAUSSIAN) {
                  const double e = static_cast<double>(qr[t]) - kr[t];
                  sc -= e * e;
                }
              }
              if (score() == QKV_SCORE_ADDITIVE) {
                sc = 3e4 * std::tanh(static_cast<double>(qr[0]) + kr[0]);
              }
              if (sc > best) {
                second = best;
                best = sc;
                arg = j;
              } else if (sc > second) {
                second = sc;
              }
            }
            if (arg < 0) continue;  // fully masked: covered elsewhere
            ASSERT_GT(best - second, 110.0)
                << where << " row " << r << ": test construction";
            ++one_hot_rows;
            if (std::fabs(best) >= 5e3) ++huge_rows;
            std::string why;
            for (int64_t j = 0; j < d.kv_len && why.empty(); ++j) {
              const float w =
                  got.weights[static_cast<size_t>(r * d.kv_len + j)];
              const float want = j == arg ? 1.0f : 0.0f;
              if (w != want) {
                why = "weights[" + std::to_string(j) + "] = " + FloatBits(w) +
                      ", want exactly " + (j == arg ? "1" : "0");
              }
            }
            const float* vr =
                &p.v[static_cast<size_t>((kvr0 + arg) * d.value_dim)];
            for (int64_t c = 0; c < d.value_dim && why.empty(); ++c) {
              const float o = got.out[static_cast<size_t>(r * d.value_dim + c)];
              if (!(std::fabs(o - vr[c]) <= 5e-5f * max_v)) {
                why = "out[" + std::to_string(c) + "] = " + FloatBits(o) +
                      ", want v[" + std::to_string(arg) +
                      "] = " + FloatBits(vr[c]);
              }
            }
            const float lse = got.lse[static_cast<size_t>(r)];
            if (why.empty() &&
                !(std::fabs(lse - best) <= 1e-5 * std::fabs(best))) {
              why = "lse = " + FloatBits(lse) + ", best logit " +
                    std::to_string(best);
            }
            if (!why.empty()) {
              Leak(where + " row " + std::to_string(r) + " (best key " +
                   std::to_string(arg) + ", logit " + std::to_string(best) +
                   ", lead " + std::to_string(best - second) + "): " + why);
            }
          }
        }
      }
      EXPECT_GT(one_hot_rows, 0) << where;
      EXPECT_GT(huge_rows, 0) << where << ": no row with a logit beyond 5e3";
    }
  }
  ReportLeaks("huge logits give exactly one-hot weights");
}

// (e) A scale whose product with a query element overflows f32 while the
// score scale * (q . k) does not: the score is what it says, not a NaN from
// inf * 0. scale = 2^127 with q_0 = +-2, q_1 = 3 and keys (c_j 2^-126, 0,
// ...) gives scores 2 q_0 c_j exactly, the same scores as scale 1 with keys
// (2 c_j, 0, ...): the two calls must agree bit for bit.
TEST_P(NonFiniteTest, HugeScaleAppliesAfterTheDotProduct) {
  if (score() != QKV_SCORE_DOT) return;  // the other scores fold no scale
  for (const Shape& s : {kTile, kDecode, kTiny}) {
    for (const MaskConfig& m : {kMasks[0], kMasks[5]}) {
      const std::string where = std::string(s.name) + "/" + m.name;
      Problem huge = MakeCase(s, m, score(), backend(), SeedFromName(where));
      qkv_attention_desc& d = huge.desc;
      const int64_t kv_rows = d.batch * d.kv_heads * d.kv_len;
      const int64_t q_rows = d.batch * d.q_heads * d.q_len;
      for (int64_t r = 0; r < q_rows; ++r) {
        huge.q[static_cast<size_t>(r * d.head_dim)] = r % 2 ? -2.0f : 2.0f;
        huge.q[static_cast<size_t>(r * d.head_dim + 1)] = 3.0f;
      }
      Problem plain = huge;
      std::fill(huge.k.begin(), huge.k.end(), 0.0f);
      std::fill(plain.k.begin(), plain.k.end(), 0.0f);
      for (int64_t r = 0; r < kv_rows; ++r) {
        const float c = static_cast<float>((r * 5) % 7 - 3);  // -3..3
        huge.k[static_cast<size_t>(r * d.head_dim)] = std::ldexp(c, -126);
        plain.k[static_cast<size_t>(r * d.head_dim)] = 2.0f * c;
      }
      d.scale = std::ldexp(1.0f, 127);
      plain.desc.scale = 1.0f;
      const Outputs a = RunAttention(huge);
      const Outputs b = RunAttention(plain);
      ASSERT_EQ(a.status, QKV_OK) << where;
      ASSERT_EQ(b.status, QKV_OK) << where;
      EXPECT_TRUE(BitwiseEqual(a.out, b.out)) << where << ": out";
      EXPECT_TRUE(BitwiseEqual(a.weights, b.weights)) << where << ": weights";
      EXPECT_TRUE(BitwiseEqual(a.lse, b.lse)) << where << ": lse";
      for (float x : a.out) ASSERT_TRUE(std::isfinite(x)) << where;
    }
  }
}

std::vector<Param> AllParams() {
  std::vector<Param> params;
  for (const std::string& b : BackendNames()) {
    for (int score = 0; score < 3; ++score) params.emplace_back(b, score);
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Backends, NonFiniteTest,
                         ::testing::ValuesIn(AllParams()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return SanitizeForTestName(std::get<0>(info.param)) +
                                  "_" + ScoreName(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace qkv_test
