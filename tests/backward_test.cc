// The backward pass (qkv_attention_backward_f32) against a double-precision
// analytic gradient oracle written in this file from the spec in
// include/qkv/qkv.h, on every backend the library lists for this CPU.
//
// The oracle recomputes the forward in double (scores, softcap, bias, ALiBi,
// masks, softmax with the sink) and then the gradients of
// L = sum(d_out * out):
//   dV_j += P_j dO            dP_j = dO . v_j        D = dO . out
//   dS_j = P_j (dP_j - D)     dA_j = dS_j * (1 - tanh^2(a_j / c)) (softcap)
//   DOT       dq += dA_j scale k_j             dk_j += dA_j scale q
//   GAUSSIAN  dq += dA_j (-2 scale)(q - k_j)   dk_j += dA_j 2 scale (q - k_j)
// summed over the query heads of a GQA group for dk and dv. The oracle
// itself is checked against central finite differences of its own double
// forward, and its forward against tests/oracle.cc.
//
// Each case: the forward qkv_attention_f32 on a backend writes out and lse,
// then the backward on the same backend; every gradient must be within
// 1e-3 * max|exact| of the exact one (the documented bound), keys no query
// sees and rows that see no key exactly 0, the gaps of strided gradients
// never written (NaN sentinel), inputs untouched, gradients overwritten and
// not accumulated (prefilled with garbage), a workspace one byte short
// refused with nothing written. NULL d_q / d_k / d_v each skipped. Bitwise
// identical results for 1, 2, 3 and 8 workers of a real pool, a shuffled
// schedule and parallel_for NULL (not on WASI: no threads). Finally the
// comparison is shown to catch a wrong gradient: deliberately broken
// oracles (no softcap chain factor, no sink, no GQA sum, ...) must disagree
// with the library.
//
// One test per case and backend ("Cases/BackwardTest.MatchesOracle/
// gqa_8_over_2_highway_AVX2"); the size sweep one test per backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "oracle.h"
#include "qkv/qkv.h"
#if !defined(__wasi__)  // no threads on WASI: no worker-count cases there
#include "support/thread_pool.h"
#endif
#include "test_util.h"

namespace qkv_test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kDInf = std::numeric_limits<double>::infinity();
// Each gradient within kGradTol * max|exact| (the documented bound), plus
// kRoundTol times the largest magnitude of the terms that make up an element
// (the sum of |term| over the keys, see GradOracle::dq_mag): a gradient that
// vanishes by cancellation (a row with one visible key has d_q = 0 exactly,
// as dS = P (dP - D) with P = 1 and dP = D) comes out of f32 as rounding
// noise of that size, which no f32 implementation avoids. kRoundTol is 100
// f32 epsilons: a gradient that is really wrong is off by far more.
constexpr double kGradTol = 1e-3;
constexpr double kRoundTol = 1e-5;
constexpr double kGradFloor = 1e-30;
constexpr uint32_t kSentinel = GuardedBuffer::kSentinelBits;  // a NaN
constexpr size_t kGuard = 32;  // sentinel floats before and after a tensor

bool IsSentinel(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u == kSentinel;
}

// ---------------------------------------------------------------------------
// Strided tensors [n0][n1][n2][dim] (batch, heads, tokens, dim) in a buffer
// whose every element the strides do not address (and kGuard floats on each
// side) holds the NaN sentinel.

enum class Layout {
  kDense,       // strides {0, 0, 0}
  kTokenMajor,  // [n0][n2][n1][dim]
  kCapacity,    // token-major with room for n2 + 29 tokens per batch
  kHeadPadded,  // [n0][n1][n2 + 5][dim + 3] + 7: gaps after rows and heads
  kBroadcast,   // batch stride 0: one [n1][n2][dim] for the whole batch
};

const char* LayoutName(Layout l) {
  switch (l) {
    case Layout::kDense:
      return "dense";
    case Layout::kTokenMajor:
      return "token_major";
    case Layout::kCapacity:
      return "capacity";
    case Layout::kHeadPadded:
      return "head_padded";
    case Layout::kBroadcast:
      return "broadcast";
  }
  return "?";
}

struct Tensor {
  qkv_strides strides = {0, 0, 0};  // what the descriptor gets
  int64_t sb = 0, sh = 0, st = 0;   // the strides in effect
  int64_t n0 = 0, n1 = 0, n2 = 0, dim = 0;
  std::vector<float> buf;
  std::vector<uint8_t> addressed;  // per element of buf

  float* data() { return buf.data() + kGuard; }
  const float* data() const { return buf.data() + kGuard; }
  int64_t Offset(int64_t b, int64_t h, int64_t t) const {
    return b * sb + h * sh + t * st;
  }
  const float* Row(int64_t b, int64_t h, int64_t t) const {
    return data() + Offset(b, h, t);
  }
  float* Row(int64_t b, int64_t h, int64_t t) {
    return data() + Offset(b, h, t);
  }
};

Tensor MakeTensor(Layout layout, int64_t n0, int64_t n1, int64_t n2,
                  int64_t dim) {
  Tensor t;
  t.n0 = n0;
  t.n1 = n1;
  t.n2 = n2;
  t.dim = dim;
  const int64_t m2 = std::max<int64_t>(n2, 1);  // keep strides >= dim
  switch (layout) {
    case Layout::kDense:
      t.st = dim;
      t.sh = m2 * dim;
      t.sb = n1 * t.sh;
      break;
    case Layout::kTokenMajor:
      t.sh = dim;
      t.st = n1 * dim;
      t.sb = m2 * n1 * dim;
      break;
    case Layout::kCapacity:
      t.sh = dim;
      t.st = n1 * dim;
      t.sb = (n2 + 29) * n1 * dim;
      break;
    case Layout::kHeadPadded:
      t.st = dim + 3;
      t.sh = (m2 + 5) * (dim + 3);
      t.sb = n1 * t.sh + 7;
      break;
    case Layout::kBroadcast:
      t.st = dim;
      t.sh = m2 * dim;
      t.sb = 0;
      break;
  }
  if (layout != Layout::kDense) t.strides = {t.sb, t.sh, t.st};
  const bool empty = n0 == 0 || n1 == 0 || n2 == 0;
  const int64_t extent =
      empty ? 0 : (n0 - 1) * t.sb + (n1 - 1) * t.sh + (n2 - 1) * t.st + dim;
  t.buf.assign(2 * kGuard + static_cast<size_t>(extent), Bits(kSentinel));
  t.addressed.assign(t.buf.size(), 0);
  for (int64_t b = 0; b < n0; ++b) {
    for (int64_t h = 0; h < n1; ++h) {
      for (int64_t s = 0; s < n2; ++s) {
        const size_t at = kGuard + static_cast<size_t>(t.Offset(b, h, s));
        for (int64_t c = 0; c < dim; ++c) t.addressed[at + c] = 1;
      }
    }
  }
  return t;
}

void FillTensor(Tensor* t, std::mt19937* rng, float mag) {
  std::uniform_real_distribution<float> uni(-mag, mag);
  for (size_t i = 0; i < t->buf.size(); ++i) {
    if (t->addressed[i] != 0) t->buf[i] = uni(*rng);
  }
}

// Garbage (large finite values of both signs) in every addressed element:
// a gradient that is accumulated rather than overwritten shows it.
void FillGarbage(Tensor* t) {
  for (size_t i = 0; i < t->buf.size(); ++i) {
    if (t->addressed[i] != 0) {
      t->buf[i] =
          (i % 3 == 0 ? -1.0f : 1.0f) * 1.0e4f * static_cast<float>(i % 11 + 1);
    }
  }
}

// A dense double copy [n0][n1][n2][dim] of a tensor's addressed rows.
std::vector<double> Gather(const Tensor& t) {
  std::vector<double> r(static_cast<size_t>(t.n0 * t.n1 * t.n2 * t.dim));
  size_t at = 0;
  for (int64_t b = 0; b < t.n0; ++b) {
    for (int64_t h = 0; h < t.n1; ++h) {
      for (int64_t s = 0; s < t.n2; ++s) {
        const float* row = t.Row(b, h, s);
        for (int64_t c = 0; c < t.dim; ++c) r[at++] = row[c];
      }
    }
  }
  return r;
}

// ---------------------------------------------------------------------------
// The double-precision gradient oracle. Inputs dense [b][h][t][dim] in
// double; the descriptor supplies the sizes, score, scale, masks and their
// data (valid_lens, bias, window, kv_start), alibi_slopes, softcap, q_pos
// and sinks (its strides are not read).

// Deliberate errors, to show that the comparison catches them.
enum class Mutation {
  kNone,
  kNoSoftcapChain,     // drops the factor 1 - tanh^2(a / c)
  kNoSink,             // the sink left out of the denominator
  kNoGroupSum,         // dk, dv only from the first query head of a group
  kNoDSubtracted,      // dS = P dP (D = 0)
  kGaussianSignFlip,   // ds/dq = +2 scale (q - k)
  kAlibiIgnored,       // no ALiBi term in the scores
  kBiasIgnored,        // finite bias values left out (-inf still hides)
  kCausalDiagonalOff,  // causal keeps j < p instead of j <= p
};

struct GradOracle {
  std::vector<double> out;  // [b][h][i][value_dim]
  std::vector<double> lse;  // [b][h][i]: sink or -inf for a row seeing none
  std::vector<double> dq, dk, dv;  // dense like q, k, v
  // The same sums with every term replaced by an upper bound of its
  // magnitude (P (|dO| |v| + |dO| |out|) for dS): the scale of the rounding
  // error of an f32 computation of the element.
  std::vector<double> dq_mag, dk_mag, dv_mag;
  std::vector<uint8_t> row_sees;  // [b][h][i]: a visible key
  std::vector<uint8_t> key_seen;  // [b][kvh][j]: some query row sees it
  std::vector<double> max_p;      // [b][h][i]: the row's largest weight
  int64_t saturated = 0;          // softcap: visible keys with |a/c| > 4
  int64_t linear = 0;             // softcap: visible keys with |a/c| < 1
};

int64_t PositionOf(const qkv_attention_desc& d, int64_t b, int64_t i) {
  return d.q_pos != nullptr ? int64_t{d.q_pos[b]} + i : d.kv_len - d.q_len + i;
}

GradOracle OracleGrad(const qkv_attention_desc& d, const std::vector<double>& q,
                      const std::vector<double>& k,
                      const std::vector<double>& v,
                      const std::vector<double>& dout,
                      Mutation mutation = Mutation::kNone) {
  const int64_t B = d.batch, H = d.q_heads, KVH = d.kv_heads;
  const int64_t Lq = d.q_len, Lk = d.kv_len, Dk = d.head_dim, Dv = d.value_dim;
  const int64_t group = H / KVH;
  const double scale = d.scale;
  const double cap = d.softcap;
  GradOracle r;
  r.out.assign(static_cast<size_t>(B * H * Lq * Dv), 0.0);
  r.lse.assign(static_cast<size_t>(B * H * Lq), -kDInf);
  r.dq.assign(static_cast<size_t>(B * H * Lq * Dk), 0.0);
  r.dk.assign(static_cast<size_t>(B * KVH * Lk * Dk), 0.0);
  r.dv.assign(static_cast<size_t>(B * KVH * Lk * Dv), 0.0);
  r.dq_mag.assign(r.dq.size(), 0.0);
  r.dk_mag.assign(r.dk.size(), 0.0);
  r.dv_mag.assign(r.dv.size(), 0.0);
  r.row_sees.assign(static_cast<size_t>(B * H * Lq), 0);
  r.key_seen.assign(static_cast<size_t>(B * KVH * Lk), 0);
  r.max_p.assign(static_cast<size_t>(B * H * Lq), 0.0);

  std::vector<double> s(static_cast<size_t>(Lk)), fprime(s.size()), p(s.size()),
      dp(s.size());
  std::vector<uint8_t> vis(s.size());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / group;
      const double slope =
          d.alibi_slopes != nullptr && mutation != Mutation::kAlibiIgnored
              ? static_cast<double>(d.alibi_slopes[h])
              : 0.0;
      double sink =
          d.sinks != nullptr ? static_cast<double>(d.sinks[h]) : -kDInf;
      if (mutation == Mutation::kNoSink) sink = -kDInf;
      for (int64_t i = 0; i < Lq; ++i) {
        const int64_t row = (b * H + h) * Lq + i;
        const int64_t pos = PositionOf(d, b, i);
        const double* qr = q.data() + row * Dk;
        const double* dor = dout.data() + row * Dv;
        double m = sink;
        bool any = false;
        for (int64_t j = 0; j < Lk; ++j) {
          const size_t sj = static_cast<size_t>(j);
          vis[sj] = 0;
          if ((d.mask & QKV_MASK_CAUSAL) != 0) {
            if (mutation == Mutation::kCausalDiagonalOff ? j >= pos : j > pos) {
              continue;
            }
          }
          if ((d.mask & QKV_MASK_WINDOW) != 0) {
            if (d.window_left >= 0 && pos - j > d.window_left) continue;
            if (d.window_right >= 0 && j - pos > d.window_right) continue;
          }
          if ((d.mask & QKV_MASK_VALID_LENS) != 0) {
            const int64_t len = d.valid_lens_per_query != 0
                                    ? d.valid_lens[b * Lq + i]
                                    : d.valid_lens[b];
            if (j >= len) continue;
          }
          if ((d.mask & QKV_MASK_KV_START) != 0 && j < d.kv_start[b]) continue;
          double bias = 0.0;
          if ((d.mask & QKV_MASK_BIAS) != 0) {
            const float bv = d.bias[b * d.bias_batch_stride +
                                    h * d.bias_head_stride + i * Lk + j];
            if (bv == -kInf) continue;
            if (mutation != Mutation::kBiasIgnored) bias = bv;
          }
          const double* kr = k.data() + ((b * KVH + kvh) * Lk + j) * Dk;
          double a = 0.0;
          if (d.score == QKV_SCORE_GAUSSIAN) {
            for (int64_t c = 0; c < Dk; ++c)
              a += (qr[c] - kr[c]) * (qr[c] - kr[c]);
            a *= -scale;
          } else {
            for (int64_t c = 0; c < Dk; ++c) a += qr[c] * kr[c];
            a *= scale;
          }
          double f = a, fp = 1.0;
          if (cap > 0.0) {
            const double t = std::tanh(a / cap);
            f = cap * t;
            if (mutation != Mutation::kNoSoftcapChain) fp = 1.0 - t * t;
            if (std::fabs(a / cap) > 4.0) ++r.saturated;
            if (std::fabs(a / cap) < 1.0) ++r.linear;
          }
          const int64_t dist = pos > j ? pos - j : j - pos;
          s[sj] = f + bias - slope * static_cast<double>(dist);
          fprime[sj] = fp;
          vis[sj] = 1;
          m = std::max(m, s[sj]);
          any = true;
        }
        if (!any) {
          r.lse[static_cast<size_t>(row)] = sink;
          continue;  // out 0, no gradient through this row
        }
        r.row_sees[static_cast<size_t>(row)] = 1;
        double z = sink == -kDInf ? 0.0 : std::exp(sink - m);
        for (int64_t j = 0; j < Lk; ++j) {
          if (vis[static_cast<size_t>(j)] != 0)
            z += std::exp(s[static_cast<size_t>(j)] - m);
        }
        r.lse[static_cast<size_t>(row)] = m + std::log(z);
        double* o = r.out.data() + row * Dv;
        for (int64_t j = 0; j < Lk; ++j) {
          const size_t sj = static_cast<size_t>(j);
          if (vis[sj] == 0) continue;
          p[sj] = std::exp(s[sj] - m) / z;
          r.max_p[static_cast<size_t>(row)] =
              std::max(r.max_p[static_cast<size_t>(row)], p[sj]);
          r.key_seen[static_cast<size_t>((b * KVH + kvh) * Lk + j)] = 1;
          const double* vr = v.data() + ((b * KVH + kvh) * Lk + j) * Dv;
          for (int64_t c = 0; c < Dv; ++c) o[c] += p[sj] * vr[c];
        }
        // D = sum_j P_j dP_j = dO . out (the sink carries no value).
        double dsum = 0.0, dsum_mag = 0.0;
        if (mutation != Mutation::kNoDSubtracted) {
          for (int64_t c = 0; c < Dv; ++c) dsum += dor[c] * o[c];
        }
        for (int64_t c = 0; c < Dv; ++c) dsum_mag += std::fabs(dor[c] * o[c]);
        const bool to_kv = mutation != Mutation::kNoGroupSum || h % group == 0;
        double* dqr = r.dq.data() + row * Dk;
        double* dqm = r.dq_mag.data() + row * Dk;
        for (int64_t j = 0; j < Lk; ++j) {
          const size_t sj = static_cast<size_t>(j);
          if (vis[sj] == 0) continue;
          const int64_t krow = (b * KVH + kvh) * Lk + j;
          const double* kr = k.data() + krow * Dk;
          const double* vr = v.data() + krow * Dv;
          double dpj = 0.0, dpj_mag = 0.0;
          for (int64_t c = 0; c < Dv; ++c) {
            dpj += dor[c] * vr[c];
            dpj_mag += std::fabs(dor[c] * vr[c]);
          }
          const double da = p[sj] * (dpj - dsum) * fprime[sj];
          const double da_mag = p[sj] * (dpj_mag + dsum_mag) * fprime[sj];
          double* dkr = r.dk.data() + krow * Dk;
          double* dvr = r.dv.data() + krow * Dv;
          double* dkm = r.dk_mag.data() + krow * Dk;
          double* dvm = r.dv_mag.data() + krow * Dv;
          for (int64_t c = 0; c < Dv && to_kv; ++c) {
            dvr[c] += p[sj] * dor[c];
            dvm[c] += std::fabs(p[sj] * dor[c]);
          }
          if (d.score == QKV_SCORE_GAUSSIAN) {
            const double g = mutation == Mutation::kGaussianSignFlip
                                 ? 2.0 * scale
                                 : -2.0 * scale;
            for (int64_t c = 0; c < Dk; ++c) {
              const double diff = qr[c] - kr[c];
              dqr[c] += da * g * diff;
              dqm[c] += da_mag * std::fabs(g * diff);
              if (to_kv) {
                dkr[c] -= da * g * diff;
                dkm[c] += da_mag * std::fabs(g * diff);
              }
            }
          } else {
            for (int64_t c = 0; c < Dk; ++c) {
              dqr[c] += da * scale * kr[c];
              dqm[c] += da_mag * std::fabs(scale * kr[c]);
              if (to_kv) {
                dkr[c] += da * scale * qr[c];
                dkm[c] += da_mag * std::fabs(scale * qr[c]);
              }
            }
          }
        }
      }
    }
  }
  return r;
}

// ---------------------------------------------------------------------------
// Cases.

struct BCase {
  std::string name;
  int64_t batch = 1, q_heads = 1, kv_heads = 1, q_len = 1, kv_len = 1,
          head_dim = 8, value_dim = 8;
  qkv_score score = QKV_SCORE_DOT;
  bool has_scale = false;
  float scale = 0.0f;
  uint32_t mask = 0;
  int64_t window_left = -1, window_right = -1;
  float alibi = 0.0f;  // slopes alibi * 2^-(h % 4); 0: no ALiBi
  float softcap = 0.0f;
  std::vector<float> sinks;                    // [q_heads] when set
  std::vector<int32_t> q_pos, kv_start, lens;  // [batch] when set
  bool lens_per_query = false;  // random [batch][q_len], every 4th row 0
  bool bias = false;            // random, -inf entries, hidden row and key
  bool bias_broadcast = false;  // one [q_len][kv_len] for all batches, heads
  Layout q_layout = Layout::kDense, k_layout = Layout::kDense,
         v_layout = Layout::kDense, out_layout = Layout::kDense;
  float q_mag = 1.0f, k_mag = 1.0f, v_mag = 1.0f;
  bool want_dq = true, want_dk = true, want_dv = true;

  BCase& Causal() {
    mask |= QKV_MASK_CAUSAL;
    return *this;
  }
  BCase& Window(int64_t left, int64_t right) {
    mask |= QKV_MASK_WINDOW;
    window_left = left;
    window_right = right;
    return *this;
  }
  BCase& Alibi(float a) {
    alibi = a;
    return *this;
  }
  BCase& Softcap(float c) {
    softcap = c;
    return *this;
  }
  BCase& Sinks(std::vector<float> s) {
    sinks = std::move(s);
    return *this;
  }
  BCase& QPos(std::vector<int32_t> p) {
    q_pos = std::move(p);
    return *this;
  }
  BCase& KvStart(std::vector<int32_t> s) {
    mask |= QKV_MASK_KV_START;
    kv_start = std::move(s);
    return *this;
  }
  BCase& Lens(std::vector<int32_t> l) {
    mask |= QKV_MASK_VALID_LENS;
    lens = std::move(l);
    return *this;
  }
  BCase& LensPerQuery() {
    mask |= QKV_MASK_VALID_LENS;
    lens_per_query = true;
    return *this;
  }
  BCase& Bias(bool broadcast = false) {
    mask |= QKV_MASK_BIAS;
    bias = true;
    bias_broadcast = broadcast;
    return *this;
  }
  BCase& Layouts(Layout q, Layout k, Layout v, Layout out) {
    q_layout = q;
    k_layout = k;
    v_layout = v;
    out_layout = out;
    return *this;
  }
  BCase& AllLayouts(Layout l) { return Layouts(l, l, l, l); }
  BCase& Mags(float q, float k, float v) {
    q_mag = q;
    k_mag = k;
    v_mag = v;
    return *this;
  }
  BCase& Scale(float s) {
    has_scale = true;
    scale = s;
    return *this;
  }
  BCase& Gaussian() {
    score = QKV_SCORE_GAUSSIAN;
    return *this;
  }
  BCase& Grads(bool dq, bool dk, bool dv) {
    want_dq = dq;
    want_dk = dk;
    want_dv = dv;
    return *this;
  }
};

void PrintTo(const BCase& c, std::ostream* os) {
  *os << c.name << " (b" << c.batch << " h" << c.q_heads << "/" << c.kv_heads
      << " q" << c.q_len << " kv" << c.kv_len << " d" << c.head_dim << "/"
      << c.value_dim << (c.score == QKV_SCORE_GAUSSIAN ? " gaussian" : " dot")
      << " layouts " << LayoutName(c.q_layout) << "," << LayoutName(c.k_layout)
      << "," << LayoutName(c.v_layout) << "," << LayoutName(c.out_layout)
      << ")";
}

BCase Shape(const std::string& name, int64_t batch, int64_t q_heads,
            int64_t kv_heads, int64_t q_len, int64_t kv_len, int64_t head_dim,
            int64_t value_dim) {
  BCase c;
  c.name = name;
  c.batch = batch;
  c.q_heads = q_heads;
  c.kv_heads = kv_heads;
  c.q_len = q_len;
  c.kv_len = kv_len;
  c.head_dim = head_dim;
  c.value_dim = value_dim;
  return c;
}

std::vector<BCase> AllCases() {
  using L = Layout;
  std::vector<BCase> cs;
  // ---- sizes around vector widths and tile sizes: every head_dim with
  // every kv_len, q_len cycling through the same list; DOT and GAUSSIAN
  // alternate, every third case causal, GQA 2 over 1 every other.
  const int64_t dims[] = {1, 3, 8, 16, 17, 64, 65, 128};
  const int64_t lens[] = {1, 2, 7, 15, 16, 17, 31, 33, 63, 64, 65, 100, 130};
  const int64_t n_lens = static_cast<int64_t>(sizeof lens / sizeof lens[0]);
  int64_t serial = 0;
  for (int64_t di = 0; di < 8; ++di) {
    for (int64_t li = 0; li < n_lens; ++li, ++serial) {
      const int64_t d = dims[di];
      const int64_t kv = lens[li];
      const int64_t q = lens[(li * 5 + di * 3) % n_lens];
      const bool gauss = serial % 2 == 1;
      const bool causal = serial % 3 == 0;
      const int64_t kvh = serial % 4 < 2 ? 1 : 2;
      BCase c = Shape(std::string("size_") + (gauss ? "gauss" : "dot") + "_d" +
                          std::to_string(d) + "_q" + std::to_string(q) + "_kv" +
                          std::to_string(kv) + (causal ? "_causal" : ""),
                      1, 2, kvh, q, kv, d, d == 1 ? 2 : d);
      if (gauss) c.Gaussian();
      if (causal) c.Causal();
      cs.push_back(c);
    }
  }
  // ---- GQA and MQA
  cs.push_back(Shape("gqa_8_over_2", 2, 8, 2, 33, 65, 16, 16).Causal());
  cs.push_back(Shape("gqa_8_over_2_gauss", 2, 8, 2, 17, 64, 8, 8).Gaussian());
  cs.push_back(Shape("mqa_4_over_1", 1, 4, 1, 17, 100, 64, 64).Gaussian());
  cs.push_back(Shape("mqa_4_over_1_decode", 2, 4, 1, 1, 130, 64, 64));
  // ---- causal with q_len < kv_len and q_len > kv_len (rows see no key)
  cs.push_back(Shape("causal_q_lt_kv", 2, 2, 1, 15, 64, 17, 17).Causal());
  cs.push_back(
      Shape("causal_q_gt_kv_empty_rows", 1, 2, 2, 64, 31, 8, 8).Causal());
  cs.push_back(Shape("causal_q_gt_kv_gauss_empty_rows", 1, 4, 2, 33, 7, 16, 16)
                   .Causal()
                   .Gaussian());
  // ---- sliding windows
  cs.push_back(Shape("window", 1, 2, 1, 65, 130, 16, 16).Window(20, 5));
  cs.push_back(
      Shape("window_causal", 2, 4, 2, 64, 100, 8, 8).Causal().Window(31, -1));
  cs.push_back(Shape("window_right_only", 1, 2, 2, 40, 63, 8, 8).Window(-1, 3));
  cs.push_back(Shape("window_width1", 1, 2, 1, 33, 33, 8, 8).Window(0, 0));
  cs.push_back(
      Shape("window_gauss", 1, 2, 1, 31, 65, 17, 9).Window(10, 10).Gaussian());
  // ---- valid lengths: per batch (one batch 0: all its rows masked) and
  // per query (every 4th row 0)
  cs.push_back(
      Shape("lens_batch_empty_rows_unseen_keys", 3, 2, 1, 16, 65, 16, 16)
          .Lens({65, 0, 17}));
  cs.push_back(
      Shape("lens_query_empty_rows", 2, 4, 2, 17, 64, 8, 8).LensPerQuery());
  cs.push_back(Shape("lens_query_gauss_empty_rows", 2, 2, 1, 15, 33, 16, 16)
                   .LensPerQuery()
                   .Gaussian());
  // ---- kv_start (left padding): a batch whose every key is padding
  cs.push_back(Shape("kv_start_empty_rows_unseen_keys", 3, 2, 1, 16, 65, 16, 16)
                   .Causal()
                   .KvStart({0, 10, 65}));
  cs.push_back(Shape("kv_start_lens", 2, 2, 2, 17, 40, 8, 8)
                   .KvStart({10, 0})
                   .LensPerQuery());
  // ---- bias with -inf entries (a whole row and a whole key hidden)
  cs.push_back(Shape("bias_unseen_keys", 2, 4, 2, 17, 33, 16, 16).Bias());
  cs.push_back(
      Shape("bias_gauss_unseen_keys", 1, 2, 1, 33, 65, 8, 8).Bias().Gaussian());
  cs.push_back(
      Shape("bias_broadcast", 2, 2, 1, 16, 31, 8, 8).Bias(true).Causal());
  // ---- ALiBi
  cs.push_back(Shape("alibi", 1, 4, 2, 33, 65, 16, 16).Alibi(0.5f).Causal());
  cs.push_back(
      Shape("alibi_qpos", 2, 2, 2, 20, 60, 8, 8).Alibi(0.25f).QPos({64, -20}));
  // ---- softcap: raw scores spread well past the cap (tanh saturates for
  // many keys), others in the linear range
  cs.push_back(Shape("softcap_saturating", 1, 2, 1, 33, 65, 16, 16)
                   .Scale(1.0f)
                   .Mags(2.5f, 2.5f, 1.0f)
                   .Softcap(5.0f));
  cs.push_back(Shape("softcap_huge_logits", 1, 2, 2, 31, 64, 8, 8)
                   .Scale(100.0f)
                   .Softcap(2.0f));
  cs.push_back(Shape("softcap_gauss", 1, 4, 2, 17, 33, 8, 8)
                   .Gaussian()
                   .Scale(2.0f)
                   .Softcap(4.0f));
  // ---- sinks: finite of both signs, -inf, rows that see no key
  cs.push_back(Shape("sinks_mixed_empty_rows", 2, 4, 2, 33, 33, 16, 16)
                   .Causal()
                   .Sinks({3.0f, -kInf, -2.0f, 0.5f})
                   .QPos({-5, 10}));
  cs.push_back(
      Shape("sinks_dominant", 1, 2, 1, 17, 65, 8, 8).Sinks({20.0f, 12.0f}));
  cs.push_back(Shape("sinks_huge", 1, 4, 2, 7, 31, 8, 8)
                   .Sinks({1e30f, -1e30f, 3e38f, -kInf}));
  cs.push_back(Shape("sinks_gauss", 1, 2, 2, 16, 17, 8, 8)
                   .Gaussian()
                   .Sinks({-1.0f, 2.0f}));
  // ---- query positions: negative (rows see nothing), ragged, past the end
  cs.push_back(Shape("qpos_negative_empty_rows", 1, 2, 2, 20, 40, 8, 8)
                   .Causal()
                   .QPos({-7}));
  cs.push_back(Shape("qpos_ragged", 2, 2, 1, 8, 40, 16, 16)
                   .Causal()
                   .Lens({40, 21})
                   .QPos({32, 13}));
  cs.push_back(Shape("qpos_past_end", 1, 2, 1, 10, 40, 8, 8)
                   .Causal()
                   .Window(10, -1)
                   .QPos({45}));
  // ---- huge logits: nearly one-hot softmax (a few rows with close
  // runners-up keep the exact gradient of q and k away from zero)
  cs.push_back(Shape("huge_logits_dot", 1, 2, 1, 33, 65, 16, 16).Scale(100.0f));
  cs.push_back(Shape("huge_logits_gauss", 1, 2, 2, 31, 64, 8, 8)
                   .Gaussian()
                   .Scale(50.0f));
  // ---- value_dim != head_dim
  cs.push_back(Shape("value_dim_7", 1, 2, 1, 17, 33, 16, 7));
  cs.push_back(
      Shape("value_dim_65_head_dim_3", 1, 2, 2, 15, 31, 3, 65).Gaussian());
  cs.push_back(
      Shape("value_dim_1_head_dim_65", 2, 2, 1, 16, 17, 65, 1).Causal());
  // ---- average pooling (scale 0): dq and dk exactly 0
  cs.push_back(Shape("scale_zero", 1, 2, 1, 7, 15, 8, 8).Scale(0.0f));
  // ---- strides: token-major, a cache with spare capacity, padded rows and
  // heads; gaps hold NaN, the gradients' gaps must keep it
  cs.push_back(Shape("token_major", 2, 4, 2, 33, 64, 16, 16)
                   .Causal()
                   .AllLayouts(L::kTokenMajor));
  cs.push_back(
      Shape("cache_capacity", 2, 4, 2, 17, 65, 16, 8)
          .Causal()
          .Layouts(L::kTokenMajor, L::kCapacity, L::kCapacity, L::kTokenMajor));
  cs.push_back(Shape("head_padded", 2, 2, 2, 31, 33, 17, 15)
                   .Window(12, 3)
                   .AllLayouts(L::kHeadPadded));
  cs.push_back(Shape("mixed_layouts_gauss", 2, 4, 1, 15, 63, 8, 16)
                   .Gaussian()
                   .Layouts(L::kHeadPadded, L::kCapacity, L::kTokenMajor,
                            L::kHeadPadded));
  // A cache broadcast over the batch: no d_k, d_v of its own (NULL); and
  // queries broadcast: no d_q.
  cs.push_back(
      Shape("broadcast_kv_dq_only", 3, 2, 1, 16, 33, 8, 8)
          .Causal()
          .QPos({20, 5, 32})
          .Layouts(L::kDense, L::kBroadcast, L::kBroadcast, L::kTokenMajor)
          .Grads(true, false, false));
  cs.push_back(Shape("broadcast_q_dkdv_only", 2, 2, 2, 7, 33, 8, 8)
                   .Layouts(L::kBroadcast, L::kTokenMajor, L::kDense, L::kDense)
                   .Grads(false, true, true));
  // ---- NULL gradients, each skipped, the others still right
  for (int which = 0; which < 7; ++which) {
    const bool dq = (which & 1) != 0, dk = (which & 2) != 0,
               dv = (which & 4) != 0;
    std::string n = "grads";
    n += dq ? "_dq" : "";
    n += dk ? "_dk" : "";
    n += dv ? "_dv" : "";
    if (which == 0) n = "grads_none";
    cs.push_back(Shape(n, 2, 4, 2, 17, 33, 16, 16)
                     .Causal()
                     .Sinks({1.0f, -kInf, 0.0f, -1.0f})
                     .AllLayouts(L::kHeadPadded)
                     .Grads(dq, dk, dv));
  }
  // ---- everything at once
  cs.push_back(Shape("everything_gqa", 2, 8, 2, 40, 130, 16, 16)
                   .Causal()
                   .Window(50, -1)
                   .Alibi(0.125f)
                   .Softcap(6.0f)
                   .Sinks({2.0f, -kInf, -1.0f, 0.5f, 1.5f, -3.0f, 0.0f, 4.0f})
                   .Bias()
                   .Lens({130, 100})
                   .QPos({90, 60})
                   .KvStart({3, 40}));
  cs.push_back(Shape("everything_gauss_strided", 2, 4, 1, 33, 65, 17, 9)
                   .Gaussian()
                   .Scale(0.5f)
                   .Causal()
                   .Window(40, 2)
                   .Alibi(0.25f)
                   .Softcap(3.0f)
                   .Sinks({0.0f, 1.0f, -kInf, -2.0f})
                   .Bias()
                   .LensPerQuery()
                   .KvStart({5, 0})
                   .Layouts(L::kHeadPadded, L::kCapacity, L::kTokenMajor,
                            L::kHeadPadded));
  // ---- caps so small that every score is +-cap: uniform weights, no
  // gradient through the scores; a subnormal cap (its inverse overflows)
  // with q = 0, where every score is exactly 0 and the chain factor is 1
  cs.push_back(Shape("softcap_tiny", 1, 2, 1, 15, 33, 8, 8).Softcap(1e-30f));
  cs.push_back(Shape("softcap_subnormal_q0", 1, 2, 2, 7, 17, 8, 8)
                   .Softcap(1e-40f)
                   .Mags(0.0f, 1.0f, 1.0f));
  // ---- window sides past every key; positions at the ends of int32
  cs.push_back(
      Shape("window_huge_sides", 1, 2, 1, 17, 40, 8, 8)
          .Window(std::numeric_limits<int64_t>::max(), int64_t{1} << 40));
  cs.push_back(Shape("qpos_int32_extremes_empty_rows", 2, 2, 1, 3, 20, 8, 8)
                   .Causal()
                   .QPos({std::numeric_limits<int32_t>::min(),
                          std::numeric_limits<int32_t>::max()}));
  // ---- longer: many keys per task, q_len 1 (decoding) and a big tile
  cs.push_back(Shape("long_decode_kv700", 1, 4, 1, 1, 700, 64, 64)
                   .Window(500, -1)
                   .Sinks({0.5f, -kInf, 1.0f, -1.0f}));
  cs.push_back(Shape("long_tile_q130_kv300", 1, 4, 2, 130, 300, 32, 32)
                   .Causal()
                   .Alibi(0.0625f));
  // ---- no keys; no queries (every key unseen: d_k and d_v all 0)
  cs.push_back(Shape("kv_len_0_empty_rows", 2, 4, 2, 5, 0, 8, 8)
                   .Sinks({1.0f, -kInf, 0.0f, 2.0f}));
  cs.push_back(
      Shape("q_len_0_unseen_keys", 2, 2, 1, 0, 17, 8, 8)
          .Layouts(L::kDense, L::kHeadPadded, L::kTokenMajor, L::kDense));
  cs.push_back(Shape("batch_0", 0, 2, 1, 5, 17, 8, 8).Causal());
  return cs;
}

// ---------------------------------------------------------------------------
// A case built: its tensors, masks and descriptor.

struct Built {
  BCase c;
  Tensor q, k, v, d_out;
  std::vector<float> bias, slopes, sinks;
  std::vector<int32_t> lens, q_pos, kv_start;
  std::string backend;

  // The descriptor, pointers into this object (serial, no pool).
  qkv_attention_desc Bound() const {
    qkv_attention_desc d;
    qkv_attention_desc_init(&d, c.batch, c.q_heads, c.kv_heads, c.q_len,
                            c.kv_len, c.head_dim, c.value_dim);
    d.score = c.score;
    if (c.has_scale) d.scale = c.scale;
    d.mask = c.mask;
    if (!lens.empty()) {
      d.valid_lens = lens.data();
      d.valid_lens_per_query = c.lens_per_query ? 1 : 0;
    }
    if (c.bias) {
      d.bias = bias.data();
      if (c.bias_broadcast) {
        d.bias_batch_stride = d.bias_head_stride = 0;
      } else {
        d.bias_head_stride = c.q_len * c.kv_len;
        d.bias_batch_stride = c.q_heads * c.q_len * c.kv_len;
      }
    }
    d.window_left = c.window_left;
    d.window_right = c.window_right;
    if (!slopes.empty()) d.alibi_slopes = slopes.data();
    d.softcap = c.softcap;
    if (!q_pos.empty()) d.q_pos = q_pos.data();
    if (!sinks.empty()) d.sinks = sinks.data();
    if (!kv_start.empty()) d.kv_start = kv_start.data();
    d.q_strides = q.strides;
    d.k_strides = k.strides;
    d.v_strides = v.strides;
    d.out_strides = d_out.strides;
    d.backend = backend.empty() ? nullptr : backend.c_str();
    return d;
  }
};

std::unique_ptr<Built> Build(const BCase& c, const std::string& backend) {
  auto p = std::make_unique<Built>();
  p->c = c;
  p->backend = backend;
  std::mt19937 rng(SeedFromName(c.name));
  p->q = MakeTensor(c.q_layout, c.batch, c.q_heads, c.q_len, c.head_dim);
  p->k = MakeTensor(c.k_layout, c.batch, c.kv_heads, c.kv_len, c.head_dim);
  p->v = MakeTensor(c.v_layout, c.batch, c.kv_heads, c.kv_len, c.value_dim);
  p->d_out = MakeTensor(c.out_layout, c.batch, c.q_heads, c.q_len, c.value_dim);
  FillTensor(&p->q, &rng, c.q_mag);
  FillTensor(&p->k, &rng, c.k_mag);
  FillTensor(&p->v, &rng, c.v_mag);
  FillTensor(&p->d_out, &rng, 1.0f);
  if (c.lens_per_query) {
    std::uniform_int_distribution<int32_t> len(0,
                                               static_cast<int32_t>(c.kv_len));
    for (int64_t r = 0; r < c.batch * c.q_len; ++r) {
      p->lens.push_back(r % 4 == 1   ? 0
                        : r % 4 == 2 ? static_cast<int32_t>(c.kv_len)
                                     : len(rng));
    }
  } else {
    p->lens = c.lens;
  }
  if (c.bias) {
    const int64_t n = c.bias_broadcast
                          ? c.q_len * c.kv_len
                          : c.batch * c.q_heads * c.q_len * c.kv_len;
    p->bias.resize(static_cast<size_t>(n));
    std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
    for (float& x : p->bias) x = uni(rng);
    for (size_t i = 3; i < p->bias.size(); i += 7) p->bias[i] = -kInf;
    // Row 0 of the first block hides every key; key 0 is hidden from every
    // row of batch 0 (every head): it gets no gradient.
    for (int64_t j = 0; j < c.kv_len && c.q_len > 0; ++j) {
      p->bias[static_cast<size_t>(j)] = -kInf;
    }
    const int64_t blocks = c.bias_broadcast ? 1 : c.q_heads;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      for (int64_t i = 0; i < c.q_len; ++i) {
        p->bias[static_cast<size_t>((blk * c.q_len + i) * c.kv_len)] = -kInf;
      }
    }
  }
  if (c.alibi != 0.0f) {
    for (int64_t h = 0; h < c.q_heads; ++h) {
      p->slopes.push_back(c.alibi / static_cast<float>(1 << (h % 4)));
    }
  }
  p->sinks = c.sinks;
  p->q_pos = c.q_pos;
  p->kv_start = c.kv_start;
  return p;
}

GradOracle OracleFor(const Built& p, Mutation m = Mutation::kNone) {
  const qkv_attention_desc d = p.Bound();
  return OracleGrad(d, Gather(p.q), Gather(p.k), Gather(p.v), Gather(p.d_out),
                    m);
}

// ---------------------------------------------------------------------------
// Calls.

std::string Explain(const Built& p, const qkv_attention_desc& d) {
  char message[256];
  const qkv_status st = qkv_attention_explain(
      &d, p.q.data(), p.k.data(), p.v.data(), p.d_out.data(), nullptr, nullptr,
      nullptr, 0, message, sizeof message);
  return std::string(qkv_status_string(st)) + " (" + message + ")";
}

struct Forward {
  qkv_status status = QKV_ERR_INVALID_ARGUMENT;
  Tensor out;
  std::vector<float> lse;
};

Forward RunForward(const Built& p, const qkv_attention_desc& d) {
  Forward f;
  f.out = MakeTensor(p.c.out_layout, p.c.batch, p.c.q_heads, p.c.q_len,
                     p.c.value_dim);
  f.lse.assign(static_cast<size_t>(p.c.batch * p.c.q_heads * p.c.q_len) + 1,
               Bits(kSentinel));
  const size_t ws_size = qkv_attention_workspace_size(&d);
  MisalignedWorkspace ws(ws_size);
  f.status = qkv_attention_f32(&d, p.q.data(), p.k.data(), p.v.data(),
                               f.out.data(), nullptr, f.lse.data(),
                               ws_size > 0 ? ws.data() : nullptr, ws_size);
  return f;
}

struct GradOptions {
  bool dq = true, dk = true, dv = true;
  bool garbage = false;  // prefill the gradients' rows with garbage
  bool check_short_workspace = true;
};

struct Grads {
  qkv_status status = QKV_ERR_INVALID_ARGUMENT;
  Tensor dq, dk, dv;
};

bool GapsIntact(const Tensor& t) {
  for (size_t i = 0; i < t.buf.size(); ++i) {
    if (t.addressed[i] == 0 && !IsSentinel(t.buf[i])) return false;
  }
  return true;
}

// One backward call with exactly qkv_attention_backward_workspace_size bytes
// of misaligned workspace (and first, optionally, one byte less). Records a
// failure if an input changes, a gap of a gradient or anything outside the
// workspace is written, or a refused call writes anything.
Grads RunBackward(const Built& p, const qkv_attention_desc& d, const Forward& f,
                  const GradOptions& opt) {
  Grads g;
  g.dq =
      MakeTensor(p.c.q_layout, p.c.batch, p.c.q_heads, p.c.q_len, p.c.head_dim);
  g.dk = MakeTensor(p.c.k_layout, p.c.batch, p.c.kv_heads, p.c.kv_len,
                    p.c.head_dim);
  g.dv = MakeTensor(p.c.v_layout, p.c.batch, p.c.kv_heads, p.c.kv_len,
                    p.c.value_dim);
  if (opt.garbage) {  // only the requested ones: the others stay sentinel
    if (opt.dq) FillGarbage(&g.dq);
    if (opt.dk) FillGarbage(&g.dk);
    if (opt.dv) FillGarbage(&g.dv);
  }
  float* dq = opt.dq ? g.dq.data() : nullptr;
  float* dk = opt.dk ? g.dk.data() : nullptr;
  float* dv = opt.dv ? g.dv.data() : nullptr;
  const std::vector<float> q0 = p.q.buf, k0 = p.k.buf, v0 = p.v.buf,
                           o0 = f.out.buf, l0 = f.lse, do0 = p.d_out.buf;
  const std::vector<float> dq0 = g.dq.buf, dk0 = g.dk.buf, dv0 = g.dv.buf;

  const size_t ws_size = qkv_attention_backward_workspace_size(&d);
  if (opt.check_short_workspace && ws_size > 0) {
    MisalignedWorkspace short_ws(ws_size - 1);
    const qkv_status st = qkv_attention_backward_f32(
        &d, p.q.data(), p.k.data(), p.v.data(), f.out.data(), f.lse.data(),
        p.d_out.data(), dq, dk, dv, short_ws.data(), short_ws.size());
    EXPECT_EQ(st, QKV_ERR_WORKSPACE_TOO_SMALL)
        << "workspace of " << ws_size - 1 << " bytes, query said " << ws_size;
    EXPECT_TRUE(BitwiseEqual(g.dq.buf, dq0) && BitwiseEqual(g.dk.buf, dk0) &&
                BitwiseEqual(g.dv.buf, dv0))
        << "a call refused for its workspace wrote a gradient";
    EXPECT_TRUE(short_ws.GuardsIntact()) << "wrote outside the workspace";
  }
  MisalignedWorkspace ws(ws_size);
  g.status = qkv_attention_backward_f32(
      &d, p.q.data(), p.k.data(), p.v.data(), f.out.data(), f.lse.data(),
      p.d_out.data(), dq, dk, dv, ws_size > 0 ? ws.data() : nullptr, ws_size);
  EXPECT_TRUE(ws.GuardsIntact())
      << "wrote outside the " << ws_size << "-byte workspace";
  EXPECT_TRUE(BitwiseEqual(p.q.buf, q0) && BitwiseEqual(p.k.buf, k0) &&
              BitwiseEqual(p.v.buf, v0) && BitwiseEqual(f.out.buf, o0) &&
              BitwiseEqual(f.lse, l0) && BitwiseEqual(p.d_out.buf, do0))
      << "an input was modified";
  EXPECT_TRUE(GapsIntact(g.dq) && GapsIntact(g.dk) && GapsIntact(g.dv))
      << "a gap of a strided gradient (or a guard) was written";
  if (g.status != QKV_OK || !opt.dq) {
    EXPECT_TRUE(BitwiseEqual(g.dq.buf, dq0)) << "d_q written";
  }
  if (g.status != QKV_OK || !opt.dk) {
    EXPECT_TRUE(BitwiseEqual(g.dk.buf, dk0)) << "d_k written";
  }
  if (g.status != QKV_OK || !opt.dv) {
    EXPECT_TRUE(BitwiseEqual(g.dv.buf, dv0)) << "d_v written";
  }
  return g;
}

bool SameBits(const Grads& a, const Grads& b) {
  return a.status == b.status && BitwiseEqual(a.dq.buf, b.dq.buf) &&
         BitwiseEqual(a.dk.buf, b.dk.buf) && BitwiseEqual(a.dv.buf, b.dv.buf);
}

// ---------------------------------------------------------------------------
// Comparison with the oracle.

struct Mismatches {
  int64_t count = 0;
  std::vector<std::string> first;  // up to 8 descriptions
  void Add(const std::string& s) {
    if (first.size() < 8) first.push_back(s);
    ++count;
  }
};

double MaxAbs(const std::vector<double>& x) {
  double m = 0.0;
  for (double e : x) m = std::max(m, std::fabs(e));
  return m;
}

std::string Num(double x) {
  std::ostringstream os;
  os.precision(9);
  os << x;
  return os.str();
}

// One gradient: every addressed element within kGradTol * max|exact| plus
// kRoundTol * its own magnitude (mag) plus the floor; rows flagged
// structurally zero (nonzero[b][h][t] == 0: a key no query sees, a query
// that sees no key) exactly 0.
void CompareGrad(const char* name, const Tensor& got,
                 const std::vector<double>& exact,
                 const std::vector<double>& mag,
                 const std::vector<uint8_t>& nonzero, Mismatches* mm) {
  const double tol = kGradTol * MaxAbs(exact) + kGradFloor;
  for (int64_t b = 0; b < got.n0; ++b) {
    for (int64_t h = 0; h < got.n1; ++h) {
      for (int64_t t = 0; t < got.n2; ++t) {
        const int64_t row = (b * got.n1 + h) * got.n2 + t;
        const bool structural_zero = nonzero[static_cast<size_t>(row)] == 0;
        const float* r = got.Row(b, h, t);
        for (int64_t c = 0; c < got.dim; ++c) {
          const size_t at = static_cast<size_t>(row * got.dim + c);
          const double x = exact[at];
          const double tol_c = tol + kRoundTol * mag[at];
          const float g = r[c];
          const bool ok =
              structural_zero ? g == 0.0f : std::fabs(g - x) <= tol_c;
          if (!ok) {
            mm->Add(std::string(name) + "[b=" + std::to_string(b) +
                    " h=" + std::to_string(h) + " t=" + std::to_string(t) +
                    " c=" + std::to_string(c) + "]: got " +
                    (IsSentinel(g) ? std::string("the sentinel (not written)")
                                   : Num(g)) +
                    ", exact " + Num(x) +
                    (structural_zero ? " (no query sees it: must be 0)"
                                     : ", tolerance " + Num(tol_c)));
          }
        }
      }
    }
  }
}

Mismatches CompareAll(const Grads& got, const GradOracle& e,
                      const GradOptions& opt) {
  Mismatches mm;
  if (opt.dq) CompareGrad("d_q", got.dq, e.dq, e.dq_mag, e.row_sees, &mm);
  if (opt.dk) CompareGrad("d_k", got.dk, e.dk, e.dk_mag, e.key_seen, &mm);
  if (opt.dv) CompareGrad("d_v", got.dv, e.dv, e.dv_mag, e.key_seen, &mm);
  return mm;
}

void ExpectNoMismatches(const Mismatches& mm) {
  for (const std::string& s : mm.first) ADD_FAILURE() << s;
  EXPECT_EQ(mm.count, 0) << mm.count << " mismatches in total";
}

GradOptions OptionsFor(const BCase& c) {
  GradOptions o;
  o.dq = c.want_dq;
  o.dk = c.want_dk;
  o.dv = c.want_dv;
  return o;
}

// ---------------------------------------------------------------------------
// Every backend x case against the oracle.

void CheckAgainstOracle(const BCase& c, const std::string& backend) {
  const std::unique_ptr<Built> p = Build(c, backend);
  const qkv_attention_desc d = p->Bound();
  const Forward f = RunForward(*p, d);
  ASSERT_EQ(f.status, QKV_OK) << "forward: " << Explain(*p, d);
  const GradOracle exact = OracleFor(*p);

  // The forward's lse, used by the backward, agrees with the oracle's.
  for (size_t r = 0; r < exact.lse.size(); ++r) {
    const double x = exact.lse[r];
    const float g = f.lse[r];
    if (std::isinf(x)) {
      ASSERT_EQ(g, x) << "forward lse of row " << r;
    } else {
      ASSERT_NEAR(g, x, 2e-5 * std::max(1.0, std::fabs(x)))
          << "forward lse of row " << r;
    }
  }

  GradOptions opt = OptionsFor(c);
  const Grads g = RunBackward(*p, d, f, opt);
  ASSERT_EQ(g.status, QKV_OK) << "backward: " << qkv_status_string(g.status);
  ExpectNoMismatches(CompareAll(g, exact, opt));

  // Overwritten, not accumulated: garbage in the gradients first gives the
  // same bits.
  GradOptions garbage = opt;
  garbage.garbage = true;
  garbage.check_short_workspace = false;
  const Grads g2 = RunBackward(*p, d, f, garbage);
  EXPECT_TRUE(SameBits(g, g2))
      << "gradients prefilled with garbage differ: accumulated, not "
         "overwritten";
}

// One test per (case, backend), named <case>_<backend>, so that a run
// filtered by backend (.ci/cross: '*highway_SVE' at 512-bit vectors,
// '*highway_SVE2' at 128) takes every case on that backend.
class BackwardTest
    : public ::testing::TestWithParam<std::tuple<std::string, BCase>> {};

TEST_P(BackwardTest, MatchesOracle) {
  const std::string& backend = std::get<0>(GetParam());
  SCOPED_TRACE("backend " + backend);
  CheckAgainstOracle(std::get<1>(GetParam()), backend);
}

std::string CaseName(
    const ::testing::TestParamInfo<std::tuple<std::string, BCase>>& info) {
  return std::get<1>(info.param).name + "_" +
         SanitizeForTestName(std::get<0>(info.param));
}

// The size sweep ("size_*", 104 cases) is one test per backend
// (BackwardSizeTest), the other cases one test per (case, backend): a
// process per case under ctest costs more than the case itself.
bool IsSizeCase(const BCase& c) { return c.name.rfind("size_", 0) == 0; }

std::vector<BCase> CasesWhere(bool sizes) {
  std::vector<BCase> out;
  for (const BCase& c : AllCases()) {
    if (IsSizeCase(c) == sizes) out.push_back(c);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BackwardTest,
    ::testing::Combine(::testing::ValuesIn(BackendNames()),
                       ::testing::ValuesIn(CasesWhere(false))),
    CaseName);

class BackwardSizeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BackwardSizeTest, EverySizeMatchesOracle) {
  for (const BCase& c : CasesWhere(true)) {
    SCOPED_TRACE("case " + c.name);
    CheckAgainstOracle(c, GetParam());
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, BackwardSizeTest,
                         ::testing::ValuesIn(BackendNames()), BackendTestName);

TEST(BackwardCaseListTest, NamesAreUniqueAndShapesValid) {
  std::map<std::string, int> names;
  for (const BCase& c : AllCases()) {
    EXPECT_EQ(names[c.name]++, 0) << "duplicate case " << c.name;
    if (!c.q_pos.empty()) {
      EXPECT_EQ(c.q_pos.size(), size_t(c.batch)) << c.name;
    }
    if (!c.kv_start.empty()) {
      EXPECT_EQ(c.kv_start.size(), size_t(c.batch)) << c.name;
    }
    if (!c.lens.empty()) {
      EXPECT_EQ(c.lens.size(), size_t(c.batch)) << c.name;
    }
    if (!c.sinks.empty()) {
      EXPECT_EQ(c.sinks.size(), size_t(c.q_heads)) << c.name;
    }
    // A broadcast operand has no gradient of its own.
    EXPECT_FALSE(c.q_layout == Layout::kBroadcast && c.want_dq) << c.name;
    EXPECT_FALSE(c.k_layout == Layout::kBroadcast && c.want_dk) << c.name;
    EXPECT_FALSE(c.v_layout == Layout::kBroadcast && c.want_dv) << c.name;
    EXPECT_NE(c.out_layout, Layout::kBroadcast) << c.name;
  }
}

// The cases aim at particular situations: check that they are there, so
// that a change of the list cannot quietly make them trivial.
TEST(BackwardCaseListTest, CasesExerciseWhatTheyClaim) {
  for (const BCase& c : AllCases()) {
    SCOPED_TRACE(c.name);
    const std::unique_ptr<Built> p = Build(c, "");
    const GradOracle e = OracleFor(*p);
    const auto has = [&](const char* s) {
      return c.name.find(s) != std::string::npos;
    };
    const int64_t rows = c.batch * c.q_heads * c.q_len;
    int64_t seeing = 0, one_hot = 0;
    for (int64_t r = 0; r < rows; ++r) {
      seeing += e.row_sees[static_cast<size_t>(r)];
      one_hot += e.max_p[static_cast<size_t>(r)] > 0.999 ? 1 : 0;
    }
    int64_t seen_keys = 0;
    for (uint8_t s : e.key_seen) seen_keys += s;
    if (rows > 0 && c.kv_len > 0) {
      EXPECT_GT(seeing, 0) << "no row sees a key";
    }
    if (has("empty_rows")) {
      EXPECT_LT(seeing, rows) << "expected rows that see no key";
    }
    if (has("unseen_keys")) {
      EXPECT_LT(seen_keys, static_cast<int64_t>(e.key_seen.size()))
          << "expected keys no query sees";
    }
    if (has("huge_logits") && !has("softcap")) {
      EXPECT_GT(one_hot, seeing / 2) << "expected mostly one-hot rows";
      EXPECT_LT(one_hot, seeing) << "expected some rows with a runner-up";
    }
    if (c.softcap > 0.0f && has("saturating")) {
      EXPECT_GT(e.saturated, 0) << "expected saturated softcap keys";
      EXPECT_GT(e.linear, 0) << "expected softcap keys in the linear range";
    }
    if (has("huge_logits") && c.softcap > 0.0f) {
      EXPECT_GT(e.saturated, e.linear) << "expected mostly saturated keys";
    }
    if (has("width1")) {
      for (int64_t r = 0; r < rows; ++r) {
        if (e.row_sees[static_cast<size_t>(r)] != 0) {
          EXPECT_EQ(e.max_p[static_cast<size_t>(r)], 1.0);
        }
      }
    }
    if (c.want_dq && c.want_dk && rows > 0 && c.kv_len > 0 && c.has_scale &&
        c.scale == 0.0f) {
      EXPECT_EQ(MaxAbs(e.dq), 0.0);
    }
  }
}

// ---------------------------------------------------------------------------
// The oracle itself: its forward against tests/oracle.cc (an independent
// double-precision attention), its gradients against central finite
// differences of its own double forward.

std::vector<BCase> OracleSelfCheckCases() {
  return {
      Shape("fd_dot_gqa", 2, 4, 2, 5, 7, 3, 2)
          .Causal()
          .Sinks({0.5f, -kInf, -1.0f, 1.0f}),
      Shape("fd_gauss", 1, 2, 1, 4, 6, 3, 3).Gaussian().Scale(0.7f).Bias(),
      Shape("fd_softcap_alibi", 1, 2, 2, 4, 9, 4, 2)
          .Scale(1.0f)
          .Mags(1.5f, 1.5f, 1.0f)
          .Softcap(2.0f)
          .Alibi(0.3f)
          .Window(3, 1)
          .QPos({4}),
      Shape("fd_gauss_softcap_lens", 2, 2, 1, 3, 5, 2, 3)
          .Gaussian()
          .Scale(1.3f)
          .Softcap(1.5f)
          .LensPerQuery()
          .KvStart({1, 0})
          .Sinks({0.2f, -0.4f}),
  };
}

TEST(BackwardOracleTest, ForwardAgreesWithTheAttentionOracle) {
  for (const BCase& c : OracleSelfCheckCases()) {
    SCOPED_TRACE(c.name);
    const std::unique_ptr<Built> p = Build(c, "");
    const qkv_attention_desc d = p->Bound();
    const GradOracle e = OracleFor(*p);
    const OracleOutput ref =
        OracleAttention(d, p->q.data(), p->k.data(), p->v.data());
    ASSERT_EQ(ref.out.size(), e.out.size());
    for (size_t i = 0; i < e.out.size(); ++i) {
      EXPECT_NEAR(e.out[i], ref.out[i], 1e-12) << "out " << i;
    }
    for (size_t i = 0; i < e.lse.size(); ++i) {
      if (std::isinf(ref.lse[i])) {
        EXPECT_EQ(e.lse[i], ref.lse[i]) << "lse " << i;
      } else {
        EXPECT_NEAR(e.lse[i], ref.lse[i], 1e-12) << "lse " << i;
      }
    }
  }
}

// dL/dx for L = sum(d_out * out), by central differences in every element
// of q, k and v, against the analytic gradient.
TEST(BackwardOracleTest, GradientsMatchFiniteDifferences) {
  for (const BCase& c : OracleSelfCheckCases()) {
    SCOPED_TRACE(c.name);
    const std::unique_ptr<Built> p = Build(c, "");
    const qkv_attention_desc d = p->Bound();
    std::vector<double> q = Gather(p->q), k = Gather(p->k), v = Gather(p->v);
    const std::vector<double> dout = Gather(p->d_out);
    const GradOracle e = OracleGrad(d, q, k, v, dout);
    auto loss = [&]() {
      const GradOracle f = OracleGrad(d, q, k, v, dout);
      double l = 0.0;
      for (size_t i = 0; i < f.out.size(); ++i) l += dout[i] * f.out[i];
      return l;
    };
    const double h = 1e-6;
    struct Operand {
      const char* name;
      std::vector<double>* x;
      const std::vector<double>* grad;
    };
    const Operand ops[] = {
        {"q", &q, &e.dq}, {"k", &k, &e.dk}, {"v", &v, &e.dv}};
    for (const Operand& op : ops) {
      const double tol = 1e-6 * std::max(MaxAbs(*op.grad), 1e-3);
      double nonzero = 0.0;
      for (size_t i = 0; i < op.x->size(); ++i) {
        const double x0 = (*op.x)[i];
        (*op.x)[i] = x0 + h;
        const double lp = loss();
        (*op.x)[i] = x0 - h;
        const double lm = loss();
        (*op.x)[i] = x0;
        const double fd = (lp - lm) / (2 * h);
        EXPECT_NEAR((*op.grad)[i], fd, tol) << op.name << "[" << i << "]";
        nonzero = std::max(nonzero, std::fabs(fd));
      }
      EXPECT_GT(nonzero, 1e-3) << op.name << ": a trivial gradient";
    }
  }
}

// ---------------------------------------------------------------------------
// The comparison catches wrong gradients: each deliberately broken oracle
// disagrees with the library (default backend) on a case that exercises the
// broken part, while the correct oracle agrees.

TEST(BackwardOracleTest, BrokenOraclesAreCaught) {
  struct Mutant {
    Mutation m;
    const char* case_name;
  };
  const Mutant mutants[] = {
      {Mutation::kNoSoftcapChain, "softcap_saturating"},
      {Mutation::kNoSoftcapChain, "softcap_gauss"},
      {Mutation::kNoSink, "sinks_gauss"},
      {Mutation::kNoSink, "sinks_mixed_empty_rows"},
      {Mutation::kNoGroupSum, "gqa_8_over_2"},
      {Mutation::kNoGroupSum, "mqa_4_over_1"},
      {Mutation::kNoDSubtracted, "window"},
      {Mutation::kGaussianSignFlip, "gqa_8_over_2_gauss"},
      {Mutation::kAlibiIgnored, "alibi"},
      {Mutation::kBiasIgnored, "bias_unseen_keys"},
      {Mutation::kCausalDiagonalOff, "causal_q_lt_kv"},
  };
  const std::vector<BCase> cases = AllCases();
  for (const Mutant& mu : mutants) {
    SCOPED_TRACE(mu.case_name);
    const auto it =
        std::find_if(cases.begin(), cases.end(),
                     [&](const BCase& c) { return c.name == mu.case_name; });
    ASSERT_NE(it, cases.end());
    const std::unique_ptr<Built> p = Build(*it, "");
    const qkv_attention_desc d = p->Bound();
    const Forward f = RunForward(*p, d);
    ASSERT_EQ(f.status, QKV_OK);
    const GradOptions opt;
    const Grads g = RunBackward(*p, d, f, opt);
    ASSERT_EQ(g.status, QKV_OK);
    EXPECT_EQ(CompareAll(g, OracleFor(*p), opt).count, 0);
    EXPECT_GT(CompareAll(g, OracleFor(*p, mu.m), opt).count, 0)
        << "mutation " << static_cast<int>(mu.m) << " went unnoticed";
  }
}

// ---------------------------------------------------------------------------
// Edge shapes on every backend.

// batch 0: OK, nothing written (the gradients have no element).
TEST(BackwardEveryBackendTest, EmptyBatchIsOkAndWritesNothing) {
  for (const std::string& backend : BackendNames()) {
    SCOPED_TRACE("backend " + backend);
    const std::unique_ptr<Built> p =
        Build(Shape("empty", 0, 2, 1, 5, 17, 8, 8).Causal(), backend);
    const qkv_attention_desc d = p->Bound();
    EXPECT_EQ(qkv_attention_backward_workspace_size(&d), 0u);
    std::vector<float> out(8, Bits(kSentinel)), lse(8, Bits(kSentinel)),
        dout(8, 1.0f), dq(8, Bits(kSentinel)), dk(8, Bits(kSentinel)),
        dv(8, Bits(kSentinel));
    const std::vector<float> before = dq;
    EXPECT_EQ(
        qkv_attention_backward_f32(&d, p->q.data(), p->k.data(), p->v.data(),
                                   out.data(), lse.data(), dout.data(),
                                   dq.data(), dk.data(), dv.data(), nullptr, 0),
        QKV_OK);
    EXPECT_TRUE(BitwiseEqual(dq, before) && BitwiseEqual(dk, before) &&
                BitwiseEqual(dv, before));
  }
}

// ---------------------------------------------------------------------------
// Bitwise identical for 1, 2, 3 and 8 workers of a real pool, a shuffled
// schedule, and with no pool; one parallel_for call per backward call.
#if !defined(__wasi__)

std::vector<BCase> DeterminismCases() {
  std::vector<BCase> r;
  const std::vector<std::string> names = {
      "gqa_8_over_2",         "everything_gqa",      "everything_gauss_strided",
      "huge_logits_dot",      "mqa_4_over_1_decode", "grads_dq_dv",
      "lens_query_empty_rows"};
  for (const BCase& c : AllCases()) {
    if (std::find(names.begin(), names.end(), c.name) != names.end()) {
      r.push_back(c);
    }
  }
  // Longer: 2 x 4 tasks of 65 queries over 300 keys.
  r.push_back(
      Shape("long_gqa", 2, 8, 4, 65, 300, 64, 64).Causal().Alibi(0.0625f));
  return r;
}

void CheckWorkerCounts(const BCase& c, const std::string& backend) {
  const std::unique_ptr<Built> p = Build(c, backend);
  const qkv_attention_desc serial = p->Bound();
  const Forward f = RunForward(*p, serial);
  ASSERT_EQ(f.status, QKV_OK) << Explain(*p, serial);
  GradOptions opt = OptionsFor(c);
  opt.check_short_workspace = false;
  const Grads base = RunBackward(*p, serial, f, opt);
  ASSERT_EQ(base.status, QKV_OK);
  for (size_t workers : {size_t{1}, size_t{2}, size_t{3}, size_t{8}}) {
    ThreadPool pool(workers);
    CountingPool counting{&pool};
    const qkv_attention_desc d = OnPool(serial, &counting, workers);
    for (int rep = 0; rep < 2; ++rep) {
      GradOptions o = opt;
      o.check_short_workspace = rep == 0;  // it grows with the workers
      o.garbage = rep == 1;
      counting.calls = 0;
      const Grads got = RunBackward(*p, d, f, o);
      if (rep == 1) {
        EXPECT_LE(counting.calls, 1)
            << "parallel_for called more than once per call";
      }
      EXPECT_TRUE(SameBits(base, got))
          << workers << " workers, run " << rep
          << ": differs from the call without a pool";
    }
    ShuffledPool shuffled{std::mt19937(static_cast<uint32_t>(workers * 7919)),
                          workers};
    GradOptions o = opt;
    o.check_short_workspace = false;
    const qkv_attention_desc shuffled_desc = OnPool(serial, &shuffled, workers);
    EXPECT_TRUE(SameBits(base, RunBackward(*p, shuffled_desc, f, o)))
        << workers << " workers, shuffled schedule: differs";
  }
}

class BackwardDeterminismTest : public ::testing::TestWithParam<BCase> {};

TEST_P(BackwardDeterminismTest, BitwiseIdenticalForEveryWorkerCount) {
  for (const std::string& backend : BackendNames()) {
    SCOPED_TRACE("backend " + backend);
    CheckWorkerCounts(GetParam(), backend);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BackwardDeterminismTest, ::testing::ValuesIn(DeterminismCases()),
    [](const ::testing::TestParamInfo<BCase>& info) {
      return info.param.name;
    });
#endif  // !__wasi__

}  // namespace
}  // namespace qkv_test
