// The 0.2 variants and layouts against the double-precision oracle, on every
// backend the library lists for this CPU: sliding windows (inside and across
// 64-key blocks, width 1), ALiBi, softcap (with logits of 1e6), sinks (+-50,
// -inf), query positions (ragged, negative, past kv_len), kv_start, alone
// and all combined, with GQA and MQA, on each path of the SIMD pipeline
// (tile, row, tiny, flash-decoding splits); strided q, k, v and out
// (token-major, a cache with spare capacity, NaN-filled gaps, a cache
// broadcast over the batch); kv_len 0, batch 0 and q_len 0; the general
// entry qkv_attention; bitwise identical results for 1, 2 and 3 workers.
//
// One test per case ("Cases/VariantsTest.MatchesOracleOnEveryBackend/
// combined_row_split"), each running every backend in turn (a failure names
// the backend): a test per backend and case would start ~900 processes
// under CTest, most of the suite's time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <random>
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
constexpr double kOutTol = 5e-5;      // times max|v| (the documented bound)
constexpr double kWeightsTol = 2e-5;  // absolute (the documented bound)
constexpr double kLseTol = 2e-5;      // times max(1, |lse|)
constexpr uint32_t kSentinel = GuardedBuffer::kSentinelBits;  // a NaN
constexpr size_t kGuard = 32;  // sentinel floats before and after a tensor

bool IsSentinel(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u == kSentinel;
}

// ---------------------------------------------------------------------------
// Strided tensors [n0][n1][n2][dim] in a buffer whose every element that the
// strides do not address (and kGuard floats on each side) holds the NaN
// sentinel.

enum class Layout {
  kDense,         // strides {0, 0, 0}
  kExplicit,      // the dense strides, spelled out
  kTokenMajor,    // [n0][n2][n1][dim]
  kCapacity,      // token-major with room for n2 + 37 tokens per batch
  kHeadCapacity,  // [n0][n1][n2 + 21][dim]: spare rows after each head
  kPadded,        // gaps after every row, head and batch
  kBroadcast,     // batch stride 0: one [n1][n2][dim] for the whole batch
};

const char* LayoutName(Layout l) {
  switch (l) {
    case Layout::kDense:
      return "dense";
    case Layout::kExplicit:
      return "explicit";
    case Layout::kTokenMajor:
      return "token_major";
    case Layout::kCapacity:
      return "capacity";
    case Layout::kHeadCapacity:
      return "head_capacity";
    case Layout::kPadded:
      return "padded";
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
    case Layout::kExplicit:
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
      t.sb = (n2 + 37) * n1 * dim;
      break;
    case Layout::kHeadCapacity:
      t.st = dim;
      t.sh = (n2 + 21) * dim;
      t.sb = n1 * t.sh;
      break;
    case Layout::kPadded:
      t.st = dim + 3;
      t.sh = m2 * (dim + 3) + 5;
      t.sb = n1 * t.sh + 11;
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

// Random values in every addressed element (a broadcast element gets the
// value of its last visit: all batches then read the same one).
void FillTensor(Tensor* t, std::mt19937* rng, float mag, bool multiples) {
  std::uniform_real_distribution<float> uni(-mag, mag);
  std::uniform_int_distribution<int> step(-8, 8);
  for (size_t i = kGuard; i + kGuard < t->buf.size(); ++i) {
    if (t->addressed[i] == 0) continue;
    // multiples: 125 * [-8, 8]: dot products of up to 8 terms are exact in
    // f32 (below 2^24), whatever the order of the sums.
    t->buf[i] = multiples ? 125.0f * static_cast<float>(step(*rng)) : uni(*rng);
  }
}

// ---------------------------------------------------------------------------
// Cases.

enum class Sinks {
  kNone,
  kRandom,  // uniform in [-2, 2], head 1 -inf
  kMixed,   // +50, -50, -inf, 0.75 by head
  kHuge,    // 1e30, -1e30, 3e38, -3e38 by head
};

struct VCase {
  std::string name;
  int64_t batch = 1, q_heads = 1, kv_heads = 1, q_len = 1, kv_len = 1,
          head_dim = 8, value_dim = 8;
  qkv_score score = QKV_SCORE_DOT;
  int64_t hidden = 8;
  bool has_scale = false;
  float scale = 0.0f;
  uint32_t mask = 0;
  int64_t window_left = -1, window_right = -1;
  float alibi = 0.0f;  // slopes alibi * 2^-(h % 4); 0: no ALiBi
  float softcap = 0.0f;
  Sinks sinks = Sinks::kNone;
  std::vector<int32_t> q_pos, kv_start, lens;  // [batch] when set
  bool lens_per_query = false;                 // random [batch][q_len]
  bool bias = false;
  Layout q_layout = Layout::kDense, k_layout = Layout::kDense,
         v_layout = Layout::kDense, out_layout = Layout::kDense;
  float q_mag = 1.0f, k_mag = 1.0f, v_mag = 1.0f;
  bool multiples = false;  // q, k in 125 * [-8, 8] (exact huge logits)
  // K and V stored as kv_dtype (qkv_quantize_rows), the oracle on their
  // values decoded here; I8 scales laid out like K and V (token-major,
  // padded, broadcast alike).
  qkv_dtype dtype = QKV_DTYPE_F32;
  bool edges = false;  // f16 subnormals, int8 zero and one-outlier rows

  VCase& Dtype(qkv_dtype t) {
    dtype = t;
    return *this;
  }
  VCase& Edges() {
    edges = true;
    return *this;
  }

  VCase& Causal() {
    mask |= QKV_MASK_CAUSAL;
    return *this;
  }
  VCase& Window(int64_t left, int64_t right) {
    mask |= QKV_MASK_WINDOW;
    window_left = left;
    window_right = right;
    return *this;
  }
  VCase& Alibi(float a) {
    alibi = a;
    return *this;
  }
  VCase& Softcap(float c) {
    softcap = c;
    return *this;
  }
  VCase& WithSinks(Sinks s) {
    sinks = s;
    return *this;
  }
  VCase& QPos(std::vector<int32_t> p) {
    q_pos = std::move(p);
    return *this;
  }
  VCase& KvStart(std::vector<int32_t> s) {
    mask |= QKV_MASK_KV_START;
    kv_start = std::move(s);
    return *this;
  }
  VCase& Lens(std::vector<int32_t> l) {
    mask |= QKV_MASK_VALID_LENS;
    lens = std::move(l);
    return *this;
  }
  VCase& LensPerQuery() {
    mask |= QKV_MASK_VALID_LENS;
    lens_per_query = true;
    return *this;
  }
  VCase& Bias() {
    mask |= QKV_MASK_BIAS;
    bias = true;
    return *this;
  }
  VCase& Layouts(Layout q, Layout k, Layout v, Layout out) {
    q_layout = q;
    k_layout = k;
    v_layout = v;
    out_layout = out;
    return *this;
  }
  VCase& AllLayouts(Layout l) { return Layouts(l, l, l, l); }
  VCase& Mags(float q, float k, float v) {
    q_mag = q;
    k_mag = k;
    v_mag = v;
    return *this;
  }
  VCase& Multiples() {
    multiples = true;
    return *this;
  }
  VCase& Scale(float s) {
    has_scale = true;
    scale = s;
    return *this;
  }
  VCase& Score(qkv_score s, int64_t h = 8) {
    score = s;
    hidden = h;
    return *this;
  }
  // Window, causal, ALiBi, softcap, sinks, bias and per-batch lengths
  // (q_pos and kv_start are per shape: the caller adds them).
  VCase& Everything(int64_t left, int64_t right) {
    return Causal()
        .Window(left, right)
        .Alibi(0.125f)
        .Softcap(6.0f)
        .WithSinks(Sinks::kMixed)
        .Bias();
  }
};

// Unused where the thread-pool suites are left out (WASI).
[[maybe_unused]] void PrintTo(const VCase& c, std::ostream* os) {
  *os << c.name << " (b" << c.batch << " h" << c.q_heads << "/" << c.kv_heads
      << " q" << c.q_len << " kv" << c.kv_len << " d" << c.head_dim << "/"
      << c.value_dim << " layouts " << LayoutName(c.q_layout) << ","
      << LayoutName(c.k_layout) << "," << LayoutName(c.v_layout) << ","
      << LayoutName(c.out_layout) << ")";
}

VCase Shape(const std::string& name, int64_t batch, int64_t q_heads,
            int64_t kv_heads, int64_t q_len, int64_t kv_len, int64_t head_dim,
            int64_t value_dim) {
  VCase c;
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

// Path of the SIMD pipeline (src/pipeline/tasks.h): row path when (q_heads /
// kv_heads) * q_len <= 4 (decoding), tiny when also kv_len <= the lanes (4,
// 8 or 16) and the head is a toy width (UsesTinyPath), flash-decoding splits when a row-path kv_len exceeds 512; the
// tile path otherwise. The names say which one a case aims at.
std::vector<VCase> AllCases() {
  using L = Layout;
  std::vector<VCase> cs;
  // ---- windows alone
  cs.push_back(Shape("window_tile", 1, 2, 1, 70, 150, 16, 16).Window(20, 5));
  cs.push_back(
      Shape("window_left_only_tile", 2, 2, 2, 40, 200, 8, 8).Window(100, -1));
  cs.push_back(
      Shape("window_right_only_tile", 1, 2, 2, 40, 120, 8, 8).Window(-1, 10));
  // Bounds cut through many 64-key blocks, rows spanning block edges.
  cs.push_back(
      Shape("window_across_blocks_tile", 1, 1, 1, 130, 300, 16, 16)
          .Window(130, 70));
  // Bounds on block edges: rows at positions 128..255 see 64 keys.
  cs.push_back(Shape("window_block_edges_tile", 1, 1, 1, 128, 256, 16, 16)
                   .Window(63, 0));
  cs.push_back(Shape("window_block_edges64_tile", 1, 2, 1, 64, 192, 8, 8)
                   .Window(64, -1));
  cs.push_back(
      Shape("window_width1_tile", 1, 2, 1, 40, 40, 8, 8).Window(0, 0));
  cs.push_back(
      Shape("window_width1_row", 2, 2, 1, 2, 100, 8, 8).Window(0, 0));
  cs.push_back(
      Shape("window_width1_tiny", 1, 2, 2, 1, 5, 4, 4).Window(0, 0));
  // Rows of one tiny call at different positions: their windows differ.
  cs.push_back(
      Shape("window_tiny_rows_differ", 2, 2, 1, 2, 8, 4, 4).Window(1, 0));
  cs.push_back(Shape("window_tiny_qpos", 2, 1, 1, 4, 6, 4, 4)
                   .Window(2, 1)
                   .QPos({1, 3}));
  cs.push_back(Shape("window_width1_split", 1, 2, 2, 1, 1300, 8, 8)
                   .Window(0, 0)
                   .QPos({700}));
  cs.push_back(Shape("window_row", 2, 4, 2, 1, 300, 32, 32).Window(100, -1));
  // Sides past every key (2^40 and more), or below -1: unbounded.
  cs.push_back(Shape("window_huge_sides_tile", 1, 2, 1, 20, 40, 8, 8)
                   .Window(std::numeric_limits<int64_t>::max(),
                           int64_t{1} << 40));
  cs.push_back(Shape("window_huge_sides_row", 1, 2, 2, 1, 100, 8, 8)
                   .Window((int64_t{1} << 40) - 1,
                           std::numeric_limits<int64_t>::min())
                   .QPos({50}));
  cs.push_back(Shape("window_causal_mistral_tile", 1, 2, 1, 130, 130, 16, 16)
                   .Causal()
                   .Window(31, -1));
  // 700 keys on the row path: two splits, the window starts inside the
  // first one.
  cs.push_back(Shape("window_causal_split", 1, 4, 1, 1, 700, 16, 16)
                   .Causal()
                   .Window(255, 0));
  // Only the last split sees keys: the earlier splits' partials are empty.
  cs.push_back(
      Shape("window_last_split_only", 2, 2, 1, 1, 1300, 16, 16).Window(100, 0));
  // Decoding past the row path (5-16 rows per kv head) splits keys too: the
  // tile path's partials, merged by the last split of each tile.
  cs.push_back(Shape("window_tile_split_last_only", 1, 8, 1, 1, 1300, 16, 16)
                   .Window(100, 0));
  cs.push_back(Shape("window_tile_split_q3", 1, 8, 2, 3, 1100, 16, 16)
                   .Causal()
                   .Window(255, 0));
  // ---- ALiBi alone
  cs.push_back(Shape("alibi_tile", 2, 4, 2, 40, 100, 16, 16).Alibi(0.5f));
  cs.push_back(Shape("alibi_causal_tile", 1, 8, 8, 33, 33, 8, 8)
                   .Causal()
                   .Alibi(0.25f));
  cs.push_back(Shape("alibi_row", 1, 4, 4, 1, 300, 16, 16).Alibi(0.0625f));
  cs.push_back(Shape("alibi_split", 1, 2, 1, 2, 700, 16, 16).Alibi(0.015625f));
  cs.push_back(Shape("alibi_tiny", 1, 2, 2, 2, 7, 8, 8).Alibi(0.5f));
  // Positions past the keys: every key at distance >= 5 (ALiBi reads p).
  cs.push_back(Shape("alibi_qpos_tile", 2, 2, 2, 20, 60, 8, 8)
                   .Alibi(0.25f)
                   .QPos({64, -20}));
  // ---- softcap alone
  cs.push_back(Shape("softcap_tile", 1, 2, 1, 40, 80, 16, 16)
                   .Softcap(5.0f)
                   .Mags(2, 2, 1));
  cs.push_back(Shape("softcap_row", 1, 2, 2, 1, 300, 16, 16)
                   .Softcap(3.0f)
                   .Mags(2, 2, 1));
  // A cap far above the scores (1e4, nearly the identity): the tanh must
  // be accurate relative to its argument, not only absolutely (an error of
  // 2^-22 in tanh is 2.4e-3 in a capped score here).
  cs.push_back(Shape("softcap_wide_tile", 1, 2, 1, 40, 80, 32, 16)
                   .Softcap(1e4f)
                   .Mags(2, 2, 1));
  cs.push_back(Shape("softcap_wide_row", 1, 2, 2, 1, 300, 32, 16)
                   .Softcap(1e4f)
                   .Mags(2, 2, 1));
  // Logits up to 8e6 (exact in f32): the capped scores are -30, 0 or 30.
  cs.push_back(Shape("softcap_huge_tile", 1, 2, 1, 40, 70, 8, 8)
                   .Multiples()
                   .Scale(1.0f)
                   .Softcap(30.0f));
  cs.push_back(Shape("softcap_huge_row", 1, 4, 2, 1, 600, 8, 8)
                   .Multiples()
                   .Scale(1.0f)
                   .Softcap(30.0f));
  cs.push_back(Shape("softcap_huge_tiny", 1, 2, 1, 1, 5, 8, 8)
                   .Multiples()
                   .Scale(1.0f)
                   .Softcap(30.0f));
  // Logits up to 7812 in steps of 15.3: some rows saturate, some do not.
  cs.push_back(Shape("softcap_graded_tile", 1, 2, 2, 33, 70, 8, 8)
                   .Multiples()
                   .Scale(1.0f / 1024)
                   .Softcap(20.0f));
  // Tiny caps: every score becomes +-cap or 0 (uniform weights), also for
  // a subnormal cap whose inverse overflows, and scores of exactly 0.
  cs.push_back(
      Shape("softcap_tiny_tile", 1, 2, 1, 20, 40, 8, 8).Softcap(1e-30f));
  cs.push_back(Shape("softcap_subnormal_tile", 1, 2, 1, 20, 40, 8, 8)
                   .Softcap(1e-40f)
                   .Mags(0, 1, 1));
  cs.push_back(Shape("softcap_subnormal_row", 1, 2, 2, 1, 40, 8, 8)
                   .Softcap(1e-40f)
                   .Mags(0, 1, 1));
  cs.push_back(Shape("softcap_subnormal_tiny", 1, 2, 2, 1, 7, 8, 8)
                   .Softcap(1e-40f)
                   .Mags(0, 1, 1));
  // ---- sinks alone
  cs.push_back(
      Shape("sinks_tile", 2, 4, 2, 40, 80, 16, 16).WithSinks(Sinks::kRandom));
  cs.push_back(
      Shape("sinks_row", 2, 4, 4, 1, 100, 16, 16).WithSinks(Sinks::kRandom));
  // +50, -50, -inf, 0.75 by head.
  cs.push_back(
      Shape("sinks_pm50_tile", 1, 4, 2, 33, 70, 16, 16).WithSinks(Sinks::kMixed));
  cs.push_back(Shape("sinks_pm50_split", 1, 4, 1, 1, 1300, 16, 16)
                   .WithSinks(Sinks::kMixed));
  cs.push_back(
      Shape("sinks_pm50_tiny", 1, 4, 4, 1, 6, 4, 4).WithSinks(Sinks::kMixed));
  // Finite sinks at the ends of the float range.
  cs.push_back(
      Shape("sinks_huge_tile", 1, 4, 2, 20, 40, 8, 8).WithSinks(Sinks::kHuge));
  cs.push_back(Shape("sinks_huge_split", 1, 4, 4, 1, 600, 8, 8)
                   .WithSinks(Sinks::kHuge));
  // Rows that see no key (causal, q_len > kv_len): lse is the sink.
  cs.push_back(Shape("sinks_masked_rows_tile", 1, 4, 2, 40, 20, 8, 8)
                   .Causal()
                   .WithSinks(Sinks::kMixed));
  // ---- query positions
  // A ragged batch: valid_lens[b] with q_pos[b] = valid_lens[b] - q_len.
  cs.push_back(Shape("qpos_ragged_tile", 2, 2, 1, 8, 40, 16, 16)
                   .Causal()
                   .Lens({40, 21})
                   .QPos({32, 13}));
  cs.push_back(Shape("qpos_ragged_row", 3, 2, 2, 1, 50, 16, 16)
                   .Causal()
                   .Lens({50, 7, 1})
                   .QPos({49, 6, 0}));
  cs.push_back(Shape("qpos_negative_tile", 1, 2, 2, 20, 40, 8, 8)
                   .Causal()
                   .QPos({-7}));
  cs.push_back(Shape("qpos_negative_row", 2, 2, 1, 2, 30, 8, 8)
                   .Causal()
                   .QPos({-1, -5}));
  cs.push_back(Shape("qpos_past_end_tile", 1, 2, 1, 10, 40, 8, 8)
                   .Causal()
                   .Window(10, -1)
                   .QPos({45}));
  cs.push_back(Shape("qpos_past_end_row", 1, 1, 1, 1, 40, 8, 8)
                   .Window(3, 0)
                   .QPos({41}));
  cs.push_back(Shape("qpos_past_end_split", 1, 2, 1, 2, 1300, 8, 8)
                   .Causal()
                   .WithSinks(Sinks::kRandom)
                   .QPos({2000}));
  cs.push_back(Shape("qpos_int32_extremes", 2, 1, 1, 3, 20, 8, 8)
                   .Causal()
                   .QPos({std::numeric_limits<int32_t>::min(),
                          std::numeric_limits<int32_t>::max()}));
  // ---- kv_start (left padding)
  cs.push_back(Shape("kv_start_tile", 4, 2, 1, 20, 70, 16, 16)
                   .Causal()
                   .KvStart({0, 5, 64, 70}));
  cs.push_back(
      Shape("kv_start_row", 3, 4, 4, 1, 130, 16, 16).KvStart({0, 65, 130}));
  cs.push_back(Shape("kv_start_split", 2, 2, 1, 1, 1300, 16, 16)
                   .KvStart({600, 1299}));
  cs.push_back(Shape("kv_start_sinks_tiny", 2, 4, 2, 1, 8, 8, 8)
                   .KvStart({3, 8})
                   .WithSinks(Sinks::kMixed));
  cs.push_back(Shape("kv_start_lens_tile", 2, 2, 2, 17, 40, 8, 8)
                   .KvStart({10, 0})
                   .LensPerQuery());
  // ---- every variant at once, on every path, GQA and MQA
  cs.push_back(Shape("combined_tile_gqa", 2, 8, 2, 40, 150, 16, 16)
                   .Everything(50, -1)
                   .Lens({150, 110})
                   .QPos({100, 60})
                   .KvStart({3, 40}));
  cs.push_back(Shape("combined_tile_mqa", 1, 8, 1, 65, 130, 32, 24)
                   .Everything(70, 2)
                   .Lens({120})
                   .QPos({60})
                   .KvStart({17}));
  cs.push_back(Shape("combined_tile_long", 1, 2, 1, 130, 300, 16, 16)
                   .Everything(150, -1)
                   .LensPerQuery()
                   .KvStart({5}));
  cs.push_back(Shape("combined_row_gqa", 2, 8, 2, 1, 300, 16, 16)
                   .Everything(200, 0)
                   .Lens({300, 250})
                   .QPos({299, 240})
                   .KvStart({0, 100}));
  cs.push_back(Shape("combined_row_mqa", 1, 4, 1, 1, 200, 64, 64)
                   .Everything(64, -1)
                   .KvStart({30}));
  cs.push_back(Shape("combined_row_split", 2, 8, 2, 1, 1300, 32, 32)
                   .Everything(700, -1)
                   .Lens({1300, 1000})
                   .QPos({1299, 900})
                   .KvStart({100, 520}));
  cs.push_back(Shape("combined_row_split_q2", 1, 4, 2, 2, 1100, 16, 16)
                   .Everything(520, 3)
                   .KvStart({11}));
  // GQA 8 and MQA 16 decoding: tile-path key splits with every term.
  cs.push_back(Shape("combined_tile_split_gqa8", 2, 16, 2, 1, 1300, 32, 32)
                   .Everything(700, -1)
                   .Lens({1300, 1000})
                   .QPos({1299, 900})
                   .KvStart({100, 520}));
  cs.push_back(Shape("combined_tile_split_mqa16", 1, 16, 1, 1, 1100, 64, 64)
                   .Everything(-1, -1)
                   .QPos({1099}));
  cs.push_back(Shape("sinks_tile_split", 1, 12, 2, 1, 1300, 8, 8)
                   .WithSinks(Sinks::kHuge));
  cs.push_back(Shape("combined_tiny8", 2, 4, 2, 2, 8, 7, 5)
                   .Everything(4, -1)
                   .QPos({7, 3})
                   .KvStart({1, 0}));
  cs.push_back(Shape("combined_tiny16", 1, 4, 4, 1, 16, 16, 16)
                   .Everything(9, 0)
                   .KvStart({2}));
  cs.push_back(Shape("combined_tiny3", 1, 2, 1, 2, 3, 4, 4)
                   .Everything(1, -1)
                   .LensPerQuery()
                   .KvStart({0}));
  // head_dim around vector widths.
  for (int64_t d : {1, 7, 16, 17, 64}) {
    cs.push_back(Shape("combined_d" + std::to_string(d) + "_tile", 1, 2, 1, 33,
                       70, d, d)
                     .Everything(20, 1)
                     .KvStart({4}));
    cs.push_back(Shape("combined_d" + std::to_string(d) + "_row", 2, 2, 2, 1,
                       70, d, d == 1 ? 3 : d + 1)
                     .Everything(30, -1)
                     .QPos({69, 40}));
  }
  // The other score kinds.
  cs.push_back(Shape("combined_gaussian_tile", 1, 4, 2, 33, 70, 8, 8)
                   .Score(QKV_SCORE_GAUSSIAN)
                   .Scale(0.5f)
                   .Everything(40, -1)
                   .KvStart({3}));
  cs.push_back(Shape("combined_gaussian_row", 1, 2, 1, 2, 600, 8, 8)
                   .Score(QKV_SCORE_GAUSSIAN)
                   .Scale(0.5f)
                   .Everything(300, -1));
  cs.push_back(Shape("combined_additive_tile", 1, 2, 1, 20, 40, 8, 8)
                   .Score(QKV_SCORE_ADDITIVE, 12)
                   .Everything(25, 0)
                   .QPos({20})
                   .AllLayouts(L::kPadded));
  cs.push_back(Shape("combined_additive_row", 2, 2, 2, 1, 600, 8, 8)
                   .Score(QKV_SCORE_ADDITIVE, 5)
                   .Everything(100, -1)
                   .Layouts(L::kTokenMajor, L::kCapacity, L::kCapacity,
                            L::kTokenMajor));
  // ---- layouts
  cs.push_back(Shape("token_major_tile", 2, 8, 2, 40, 100, 16, 16)
                   .Causal()
                   .AllLayouts(L::kTokenMajor));
  // Tile groups (strided K/V): 2 x 150 = 300 rows per kv head are 3 tasks
  // of up to 4 tiles at 16 lanes (the last two tiles: 32 rows and 12, a
  // one-vector tile), 10 at 4 lanes; a window gives every tile its own
  // first key, causal its own last; kv_start and q_pos move both.
  cs.push_back(Shape("token_major_groups", 2, 4, 2, 150, 300, 16, 16)
                   .Window(40, 3)
                   .Causal()
                   .AllLayouts(L::kTokenMajor));
  cs.push_back(Shape("token_major_groups_everything", 2, 4, 2, 150, 260, 24,
                     20)
                   .Everything(70, -1)
                   .QPos({100, 0})
                   .KvStart({5, 0})
                   .Layouts(L::kPadded, L::kTokenMajor, L::kTokenMajor,
                            L::kTokenMajor));
  cs.push_back(Shape("token_major_row", 2, 8, 2, 1, 300, 64, 64)
                   .Window(128, 0)
                   .WithSinks(Sinks::kRandom)
                   .AllLayouts(L::kTokenMajor));
  cs.push_back(Shape("token_major_split", 1, 8, 2, 1, 1300, 64, 64)
                   .Everything(1000, -1)
                   .AllLayouts(L::kTokenMajor));
  cs.push_back(Shape("token_major_tile_split", 1, 16, 2, 1, 1300, 64, 64)
                   .Everything(1000, -1)
                   .AllLayouts(L::kTokenMajor));
  // Interleaved heads (a token-major decode takes up to 32 kv heads per
  // task): 35 kv heads are groups of 18 and 17; one row per kv head, a
  // window cutting inside the 8-key steps, splits.
  cs.push_back(Shape("token_major_many_heads", 2, 35, 35, 1, 700, 12, 20)
                   .Everything(333, -1)
                   .QPos({650, 0})
                   .AllLayouts(L::kTokenMajor));
  cs.push_back(Shape("token_major_tiny", 2, 4, 2, 2, 8, 16, 16)
                   .Causal()
                   .AllLayouts(L::kTokenMajor));
  // A KV cache with spare capacity: kv_len rows filled, the batch stride
  // counts C > kv_len (NaN in the spare rows).
  cs.push_back(Shape("cache_capacity_row", 2, 8, 2, 1, 200, 32, 32)
                   .Causal()
                   .Window(64, -1)
                   .Layouts(L::kTokenMajor, L::kCapacity, L::kCapacity,
                            L::kTokenMajor));
  cs.push_back(Shape("cache_capacity_tile", 2, 4, 2, 33, 90, 16, 8)
                   .Causal()
                   .Alibi(0.25f)
                   .Layouts(L::kTokenMajor, L::kCapacity, L::kCapacity,
                            L::kCapacity));
  cs.push_back(Shape("head_capacity_tile", 2, 4, 4, 20, 70, 16, 16)
                   .Causal()
                   .Layouts(L::kDense, L::kHeadCapacity, L::kHeadCapacity,
                            L::kHeadCapacity));
  cs.push_back(Shape("head_capacity_split", 1, 2, 2, 1, 1300, 16, 16)
                   .Layouts(L::kDense, L::kHeadCapacity, L::kHeadCapacity,
                            L::kPadded));
  // Gaps everywhere, filled with NaN: none may reach a result, and out's
  // gaps must keep their bits.
  cs.push_back(Shape("padded_tile", 2, 4, 2, 40, 100, 17, 15)
                   .Everything(60, -1)
                   .QPos({60, 30})
                   .AllLayouts(L::kPadded));
  cs.push_back(Shape("padded_row", 2, 8, 2, 1, 300, 16, 16)
                   .Everything(100, -1)
                   .AllLayouts(L::kPadded));
  cs.push_back(Shape("padded_tiny", 2, 4, 2, 1, 5, 7, 9)
                   .Everything(2, -1)
                   .AllLayouts(L::kPadded));
  cs.push_back(Shape("padded_split", 1, 4, 1, 1, 1300, 16, 16)
                   .Everything(900, -1)
                   .AllLayouts(L::kPadded));
  cs.push_back(Shape("explicit_dense_tile", 2, 4, 2, 20, 70, 16, 16)
                   .Causal()
                   .AllLayouts(L::kExplicit));
  // One cache for the whole batch (batch stride 0), distinct queries.
  cs.push_back(Shape("broadcast_cache_tile", 3, 4, 2, 20, 70, 16, 16)
                   .Causal()
                   .QPos({50, 10, 0})
                   .Layouts(L::kDense, L::kBroadcast, L::kBroadcast,
                            L::kTokenMajor));
  cs.push_back(Shape("broadcast_cache_row", 3, 2, 2, 1, 600, 16, 16)
                   .Window(200, 0)
                   .QPos({599, 300, 0})
                   .Layouts(L::kPadded, L::kBroadcast, L::kBroadcast,
                            L::kPadded));
  cs.push_back(Shape("broadcast_query_tile", 2, 2, 2, 20, 40, 8, 8)
                   .Causal()
                   .KvStart({0, 10})
                   .Layouts(L::kBroadcast, L::kTokenMajor, L::kTokenMajor,
                            L::kDense));
  // ---- no keys: every row gets out 0 and lse -inf, or its sink
  cs.push_back(Shape("kv0_tile", 2, 4, 2, 40, 0, 16, 16));
  cs.push_back(
      Shape("kv0_sinks_tile", 2, 4, 2, 40, 0, 16, 16).WithSinks(Sinks::kMixed));
  cs.push_back(Shape("kv0_sinks_row", 2, 4, 4, 1, 0, 8, 8)
                   .Everything(4, -1)
                   .QPos({3, -3}));
  cs.push_back(Shape("kv0_padded", 2, 4, 2, 3, 0, 8, 5)
                   .WithSinks(Sinks::kRandom)
                   .AllLayouts(L::kPadded));
  // ---- low-precision K/V caches: each dtype on every path, score kind and
  // layout, against the oracle on the values the cache holds.
  const std::pair<const char*, qkv_dtype> kTypes[] = {
      {"f16", QKV_DTYPE_F16}, {"bf16", QKV_DTYPE_BF16}, {"i8", QKV_DTYPE_I8}};
  for (const auto& [tn, t] : kTypes) {
    const std::string n = tn;
    cs.push_back(
        Shape(n + "_tile_gqa", 2, 4, 2, 70, 150, 32, 24).Causal().Dtype(t));
    cs.push_back(Shape(n + "_row_split", 1, 4, 1, 1, 1300, 64, 64).Dtype(t));
    // Decoding with K and V past 8 MiB (prefetched in software), value rows
    // wider than one pass of accumulators (taken a few keys at a time when
    // the next keys stream in during the values), a short last block.
    cs.push_back(Shape(n + "_streamed_decode", 1, 2, 2, 1, 16400, 128, 256)
                     .Lens({16390})
                     .Dtype(t));
    // The same streamed decoding (int8: pipelined, the scores of one
    // block beside the output of the one before) with every variant: a
    // window starting mid-block, a row whose keys stop in a split's middle,
    // splits with no visible key, sinks, softcap, ALiBi, bias.
    cs.push_back(Shape(n + "_streamed_everything", 2, 2, 2, 1, 16400, 128, 40)
                     .Everything(9000, -1)
                     .QPos({16399, 12001})
                     .Dtype(t));
    cs.push_back(Shape(n + "_tiny", 1, 2, 1, 1, 5, 8, 8).Dtype(t));
    cs.push_back(Shape(n + "_everything_token_major", 2, 4, 2, 33, 100, 16, 16)
                     .Everything(20, -1)
                     .AllLayouts(L::kTokenMajor)
                     .Dtype(t));
    // Decoding from a token-major cache: heads interleaved, keys and values
    // read converting in registers, splits, tails.
    cs.push_back(Shape(n + "_token_major_decode", 2, 3, 3, 1, 700, 20, 12)
                     .Everything(300, -1)
                     .QPos({600, 50})
                     .AllLayouts(L::kTokenMajor)
                     .Dtype(t));
    // Rows not a multiple of the lanes (conversion tails), gaps everywhere.
    cs.push_back(Shape(n + "_padded_row", 2, 2, 1, 2, 300, 20, 12)
                     .Window(100, 0)
                     .AllLayouts(L::kPadded)
                     .Dtype(t));
    // One row per kv head (decoding without GQA): keys and values read
    // converting in registers; splits, tails, gaps.
    cs.push_back(Shape(n + "_padded_decode", 1, 2, 2, 1, 700, 20, 12)
                     .AllLayouts(L::kPadded)
                     .Dtype(t));
    cs.push_back(Shape(n + "_everything_decode", 2, 2, 2, 1, 300, 24, 16)
                     .Everything(50, -1)
                     .QPos({299, 120})
                     .Dtype(t));
    cs.push_back(Shape(n + "_gaussian_decode", 1, 2, 2, 1, 200, 16, 16)
                     .Score(QKV_SCORE_GAUSSIAN)
                     .Scale(0.05f)
                     .Dtype(t));
    cs.push_back(Shape(n + "_padded_tile", 1, 3, 1, 20, 90, 13, 7)
                     .Causal()
                     .AllLayouts(L::kPadded)
                     .Dtype(t));
    cs.push_back(
        Shape(n + "_edges_tile", 1, 2, 1, 40, 130, 16, 16)
            .Lens({125})
            .Edges()
            .Dtype(t));
    cs.push_back(Shape(n + "_edges_row", 2, 2, 2, 1, 700, 16, 16)
                     .Lens({695, 300})
                     .Edges()
                     .Dtype(t));
    // Every K and V value below f16's smallest normal (6.1e-5): subnormal
    // halves, scaled up to ordinary logits; out is compared relative to
    // max|v|.
    cs.push_back(Shape(n + "_subnormal_tile", 1, 2, 1, 40, 80, 16, 16)
                     .Mags(1.0f, 6e-5f, 6e-5f)
                     .Scale(2e4f)
                     .Dtype(t));
    cs.push_back(Shape(n + "_subnormal_row", 1, 2, 1, 2, 300, 16, 16)
                     .Mags(1.0f, 6e-5f, 6e-5f)
                     .Scale(2e4f)
                     .Dtype(t));
    cs.push_back(Shape(n + "_gaussian_tile", 1, 2, 1, 40, 80, 16, 16)
                     .Score(QKV_SCORE_GAUSSIAN)
                     .Scale(0.05f)
                     .Dtype(t));
    cs.push_back(Shape(n + "_additive_tile", 1, 2, 1, 20, 40, 8, 8)
                     .Score(QKV_SCORE_ADDITIVE, 8)
                     .Dtype(t));
    cs.push_back(Shape(n + "_additive_tiny", 1, 2, 2, 1, 3, 8, 8)
                     .Score(QKV_SCORE_ADDITIVE, 8)
                     .Dtype(t));
    cs.push_back(Shape(n + "_broadcast_row", 3, 2, 2, 1, 600, 16, 16)
                     .QPos({599, 300, 0})
                     .Causal()
                     .Layouts(L::kDense, L::kBroadcast, L::kBroadcast,
                              L::kDense)
                     .Dtype(t));
    // A decoding step of a real-looking cache: d 128, GQA 4, spare capacity.
    cs.push_back(Shape(n + "_capacity_decode", 1, 8, 2, 1, 520, 128, 128)
                     .AllLayouts(L::kCapacity)
                     .Dtype(t));
    // GQA 8 decoding: dequantized blocks shared by a tile, key splits.
    cs.push_back(Shape(n + "_gqa8_split_decode", 1, 16, 2, 1, 1100, 32, 32)
                     .Window(700, -1)
                     .Dtype(t));
  }
  return cs;
}

// ---------------------------------------------------------------------------
// A case's descriptor and inputs.

struct Built {
  qkv_attention_desc desc;
  Tensor q, k, v;  // f32; for a low-precision case the decoded cache
  // kv_dtype elements at the same element offsets as k and v (kGuard
  // elements before), gaps holding a NaN (F16, BF16) or -128 (I8).
  std::vector<uint8_t> kq, vq;
  Tensor k_scales, v_scales;  // I8 only
  Layout out_layout = Layout::kDense;
  std::vector<float> bias, slopes, sinks, w_q, w_k, w_v;
  std::vector<int32_t> lens, q_pos, kv_start;
  std::string backend;
  float max_abs_v = 0.0f;

  // desc with its pointers set into this object.
  qkv_attention_desc Bound() const {
    qkv_attention_desc d = desc;
    d.q_strides = q.strides;
    d.k_strides = k.strides;
    d.v_strides = v.strides;
    if (desc.kv_dtype == QKV_DTYPE_I8) {
      d.k_scales = k_scales.data();
      d.v_scales = v_scales.data();
      d.k_scale_strides = k_scales.strides;
      d.v_scale_strides = v_scales.strides;
    }
    d.out_strides = MakeTensor(out_layout, d.batch, d.q_heads, d.q_len,
                               d.value_dim)
                        .strides;
    if (!lens.empty()) d.valid_lens = lens.data();
    if (!bias.empty()) d.bias = bias.data();
    if (!slopes.empty()) d.alibi_slopes = slopes.data();
    if (!sinks.empty()) d.sinks = sinks.data();
    if (!q_pos.empty()) d.q_pos = q_pos.data();
    if (!kv_start.empty()) d.kv_start = kv_start.data();
    if (!w_q.empty()) d.additive_w_q = w_q.data();
    if (!w_k.empty()) d.additive_w_k = w_k.data();
    if (!w_v.empty()) d.additive_w_v = w_v.data();
    d.backend = backend.empty() ? nullptr : backend.c_str();
    return d;
  }
  // What the call reads for k and v.
  const void* KData() const {
    return desc.kv_dtype == QKV_DTYPE_F32
               ? static_cast<const void*>(k.data())
               : static_cast<const void*>(kq.data() + kGuard * ElementSize());
  }
  const void* VData() const {
    return desc.kv_dtype == QKV_DTYPE_F32
               ? static_cast<const void*>(v.data())
               : static_cast<const void*>(vq.data() + kGuard * ElementSize());
  }
  size_t ElementSize() const {
    return desc.kv_dtype == QKV_DTYPE_F32 ? 4
           : desc.kv_dtype == QKV_DTYPE_I8 ? 1
                                            : 2;
  }
  Tensor NewOut() const {
    return MakeTensor(out_layout, desc.batch, desc.q_heads, desc.q_len,
                      desc.value_dim);
  }
};

// Decoders written from the formats' definitions, independent of the
// library's: the oracle sees exactly the values the cache holds.
float DecodeF16(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 31) return m ? std::numeric_limits<float>::quiet_NaN()
                        : static_cast<float>(sign * kInf);
  if (e == 0) return static_cast<float>(sign * std::ldexp(m, -24));
  return static_cast<float>(sign * std::ldexp(1024 + m, e - 25));
}

float DecodeBf16(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Stores t's addressed rows as `dtype` (qkv_quantize_rows, row by row: the
// I8 scales go to `scales`, laid out like t) and replaces t's values with
// the decoded ones.
void Quantize(qkv_dtype dtype, Tensor* t, std::vector<uint8_t>* raw,
              Tensor* scales) {
  const size_t e = dtype == QKV_DTYPE_I8 ? 1 : 2;
  raw->assign(t->buf.size() * e, 0);
  for (size_t i = 0; i < t->buf.size(); ++i) {  // the gaps
    if (dtype == QKV_DTYPE_I8) {
      (*raw)[i] = 0x80;  // -128: outside what quantize_rows writes
    } else {
      const uint16_t nan = dtype == QKV_DTYPE_F16 ? 0x7E00 : 0x7FC0;
      std::memcpy(raw->data() + i * e, &nan, 2);
    }
  }
  for (int64_t b = 0; b < t->n0; ++b) {
    for (int64_t h = 0; h < t->n1; ++h) {
      for (int64_t s = 0; s < t->n2; ++s) {
        const int64_t at = static_cast<int64_t>(kGuard) + t->Offset(b, h, s);
        float* x = t->buf.data() + at;
        uint8_t* dst = raw->data() + at * e;
        float* scale =
            dtype == QKV_DTYPE_I8
                ? scales->buf.data() + kGuard + scales->Offset(b, h, s)
                : nullptr;
        ASSERT_EQ(qkv_quantize_rows(dtype, 1, t->dim, x, t->dim, dst, t->dim,
                                    scale),
                  QKV_OK);
        for (int64_t c = 0; c < t->dim; ++c) {
          if (dtype == QKV_DTYPE_I8) {
            const int8_t q = static_cast<int8_t>(dst[c]);
            x[c] = *scale * static_cast<float>(q);
          } else {
            uint16_t u;
            std::memcpy(&u, dst + c * 2, 2);
            x[c] = dtype == QKV_DTYPE_F16 ? DecodeF16(u) : DecodeBf16(u);
          }
        }
      }
    }
  }
}

// Values at a low-precision format's edges, in place of random ones: f16
// subnormals, an int8 row of zeros and rows with one outlier, in values the
// largest finite f16 (65504); keys from `hidden_from` on (which the case
// hides) overflow: f16 and bf16 infinity, an int8 outlier of 1e30.
void AddEdges(qkv_dtype dtype, Tensor* t, bool values, int64_t hidden_from,
              std::mt19937* rng) {
  std::uniform_int_distribution<int> pick(0, 5);
  for (int64_t b = 0; b < t->n0; ++b) {
    for (int64_t h = 0; h < t->n1; ++h) {
      for (int64_t s = 0; s < t->n2; ++s) {
        float* x = t->buf.data() + kGuard + t->Offset(b, h, s);
        const int kind = pick(*rng);
        for (int64_t c = 0; c < t->dim; ++c) {
          if (s >= hidden_from) {
            x[c] = c % 3 == 0 ? 0.0f
                   : dtype == QKV_DTYPE_F16 ? 1e5f * (c % 2 ? 1.0f : -1.0f)
                   : dtype == QKV_DTYPE_BF16 ? 3.4e38f
                                              : 1e30f;
          } else if (kind == 0) {
            x[c] = 0.0f;  // an all-zero row (I8 scale 0)
          } else if (kind == 1 && c == 0) {
            x[c] = 40.0f;  // one outlier: the rest round to few levels
          } else if (kind == 2 && dtype == QKV_DTYPE_F16) {
            x[c] *= 1e-5f;  // subnormal binary16 (below 6.1e-5)
          } else if (kind == 3 && values && dtype == QKV_DTYPE_F16 && c == 1) {
            x[c] = 65500.0f;  // rounds to 65504, the largest finite
          }
        }
      }
    }
  }
}

std::unique_ptr<Built> Build(const VCase& c, const std::string& backend) {
  auto p = std::make_unique<Built>();
  p->backend = backend;
  qkv_attention_desc& d = p->desc;
  qkv_attention_desc_init(&d, c.batch, c.q_heads, c.kv_heads, c.q_len,
                          c.kv_len, c.head_dim, c.value_dim);
  d.score = c.score;
  if (c.has_scale) d.scale = c.scale;
  d.mask = c.mask;
  d.window_left = c.window_left;
  d.window_right = c.window_right;
  d.softcap = c.softcap;
  std::mt19937 rng(SeedFromName(c.name));
  p->q = MakeTensor(c.q_layout, c.batch, c.q_heads, c.q_len, c.head_dim);
  p->k = MakeTensor(c.k_layout, c.batch, c.kv_heads, c.kv_len, c.head_dim);
  p->v = MakeTensor(c.v_layout, c.batch, c.kv_heads, c.kv_len, c.value_dim);
  FillTensor(&p->q, &rng, c.q_mag, c.multiples);
  FillTensor(&p->k, &rng, c.k_mag, c.multiples);
  FillTensor(&p->v, &rng, c.v_mag, false);
  d.kv_dtype = c.dtype;
  if (c.dtype != QKV_DTYPE_F32) {
    if (c.edges) {  // the last 5 keys are past every valid length
      AddEdges(c.dtype, &p->k, false, c.kv_len - 5, &rng);
      AddEdges(c.dtype, &p->v, true, c.kv_len - 5, &rng);
    }
    if (c.dtype == QKV_DTYPE_I8) {
      p->k_scales = MakeTensor(c.k_layout, c.batch, c.kv_heads, c.kv_len, 1);
      p->v_scales = MakeTensor(c.v_layout, c.batch, c.kv_heads, c.kv_len, 1);
    }
    Quantize(c.dtype, &p->k, &p->kq, &p->k_scales);
    Quantize(c.dtype, &p->v, &p->vq, &p->v_scales);
  }
  p->out_layout = c.out_layout;
  for (size_t i = 0; i < p->v.buf.size(); ++i) {
    if (p->v.addressed[i]) {
      p->max_abs_v = std::max(p->max_abs_v, std::fabs(p->v.buf[i]));
    }
  }
  if (c.alibi != 0.0f) {
    for (int64_t h = 0; h < c.q_heads; ++h) {
      p->slopes.push_back(std::ldexp(c.alibi, -static_cast<int>(h % 4)));
    }
  }
  if (c.sinks == Sinks::kRandom) {
    std::uniform_real_distribution<float> s(-2.0f, 2.0f);
    for (int64_t h = 0; h < c.q_heads; ++h) {
      p->sinks.push_back(h == 1 ? -kInf : s(rng));
    }
  } else if (c.sinks == Sinks::kMixed) {
    const float kMixed[4] = {50.0f, -50.0f, -kInf, 0.75f};
    for (int64_t h = 0; h < c.q_heads; ++h) p->sinks.push_back(kMixed[h % 4]);
  } else if (c.sinks == Sinks::kHuge) {
    const float kHuge[4] = {1e30f, -1e30f, 3e38f, -3e38f};
    for (int64_t h = 0; h < c.q_heads; ++h) p->sinks.push_back(kHuge[h % 4]);
  }
  p->q_pos = c.q_pos;
  p->kv_start = c.kv_start;
  if (!c.lens.empty()) {
    p->lens = c.lens;
  } else if (c.lens_per_query) {
    d.valid_lens_per_query = 1;
    std::uniform_int_distribution<int32_t> len(0,
                                               static_cast<int32_t>(c.kv_len));
    for (int64_t r = 0; r < c.batch * c.q_len; ++r) {
      p->lens.push_back(r % 3 == 0 ? static_cast<int32_t>(c.kv_len) : len(rng));
    }
  }
  if (c.bias) {
    d.bias_head_stride = c.q_len * c.kv_len;
    d.bias_batch_stride = c.q_heads * d.bias_head_stride;
    // (At least one element: a BIAS mask needs a pointer even when there
    // is no score to add it to.)
    p->bias.resize(static_cast<size_t>(
        std::max<int64_t>(c.batch * d.bias_batch_stride, 1)));
    FillUniform(&p->bias, &rng, -1.0f, 1.0f);
    for (size_t i = 0; i < p->bias.size(); i += 7) p->bias[i] = -kInf;
  }
  if (c.score == QKV_SCORE_ADDITIVE) {
    d.additive_hidden = c.hidden;
    p->w_q.resize(static_cast<size_t>(c.hidden * c.head_dim));
    p->w_k.resize(static_cast<size_t>(c.hidden * c.head_dim));
    p->w_v.resize(static_cast<size_t>(c.hidden));
    FillUniform(&p->w_q, &rng, -0.5f, 0.5f);
    FillUniform(&p->w_k, &rng, -0.5f, 0.5f);
    FillUniform(&p->w_v, &rng, -1.0f, 1.0f);
  }
  return p;
}

// The oracle of a case, computed once per process (its inputs do not
// depend on the backend). Tests run on gtest's one thread.
const OracleOutput& OracleFor(const VCase& c, const Built& p) {
  static std::map<std::string, OracleOutput> cache;
  auto it = cache.find(c.name);
  if (it == cache.end()) {
    const qkv_attention_desc d = p.Bound();
    it = cache
             .emplace(c.name, OracleAttention(d, p.q.data(), p.k.data(),
                                              p.v.data()))
             .first;
  }
  return it->second;
}

// ---------------------------------------------------------------------------
// Calls.

struct Result {
  qkv_status status = QKV_ERR_INVALID_ARGUMENT;
  Tensor out;
  std::vector<float> weights, lse;  // empty when not asked for
};

struct CallOptions {
  bool weights = true;
  bool lse = true;
  bool general_entry = false;  // qkv_attention instead of qkv_attention_f32
  bool check_short_workspace = true;
};

qkv_status Call(bool general, const qkv_attention_desc& d, const Built& p,
                float* out, float* weights, float* lse, void* ws,
                size_t ws_size) {
  // Low-precision caches: only the general entry reads them.
  general = general || d.kv_dtype != QKV_DTYPE_F32;
  return general ? qkv_attention(&d, p.q.data(), p.KData(), p.VData(), out,
                                 weights, lse, ws, ws_size)
                 : qkv_attention_f32(&d, p.q.data(), p.k.data(), p.v.data(),
                                     out, weights, lse, ws, ws_size);
}

// One call with exactly the queried workspace (misaligned). Records a
// failure if anything outside the addressed out elements, weights, lse or
// the workspace is written, or a refused call wrote anything.
Result RunCall(const Built& p, const qkv_attention_desc& d,
           const CallOptions& opt = CallOptions()) {
  Result r;
  r.out = p.NewOut();
  const std::vector<float> out_before = r.out.buf;
  GuardedBuffer weights(opt.weights ? NumWeights(d) : 0);
  GuardedBuffer lse(opt.lse ? NumLse(d) : 0);
  float* w_ptr = opt.weights ? weights.data() : nullptr;
  float* lse_ptr = opt.lse ? lse.data() : nullptr;

  const size_t ws_size = qkv_attention_workspace_size(&d);
  if (opt.check_short_workspace && ws_size > 0) {
    MisalignedWorkspace short_ws(ws_size - 1);
    const qkv_status st = Call(opt.general_entry, d, p, r.out.data(), w_ptr,
                               lse_ptr, short_ws.data(), short_ws.size());
    EXPECT_EQ(st, QKV_ERR_WORKSPACE_TOO_SMALL)
        << "workspace of " << ws_size - 1 << " bytes, query said " << ws_size;
    EXPECT_TRUE(BitwiseEqual(r.out.buf, out_before) &&
                weights.BodyUntouched() && lse.BodyUntouched())
        << "a call refused for its workspace wrote to an output";
    EXPECT_TRUE(short_ws.GuardsIntact()) << "wrote outside the workspace";
  }
  MisalignedWorkspace ws(ws_size);
  r.status = Call(opt.general_entry, d, p, r.out.data(), w_ptr, lse_ptr,
                  ws_size > 0 ? ws.data() : nullptr, ws_size);
  EXPECT_TRUE(ws.GuardsIntact())
      << "wrote outside the " << ws_size << "-byte workspace";
  EXPECT_TRUE(weights.GuardsIntact()) << "wrote outside weights";
  EXPECT_TRUE(lse.GuardsIntact()) << "wrote outside lse";
  // Out: every element the strides do not address keeps its bits.
  size_t touched = 0, first = 0;
  for (size_t i = 0; i < r.out.buf.size(); ++i) {
    if (r.out.addressed[i] != 0 && r.status == QKV_OK) continue;
    if (!IsSentinel(r.out.buf[i])) {
      if (touched++ == 0) first = i;
    }
  }
  EXPECT_EQ(touched, 0u) << "status " << r.status << ": " << touched
                         << " out elements outside the addressed ones (or "
                            "any, on failure) were written, the first at "
                         << static_cast<int64_t>(first) -
                                static_cast<int64_t>(kGuard);
  if (r.status != QKV_OK) {
    EXPECT_TRUE(weights.BodyUntouched() && lse.BodyUntouched())
        << "status " << r.status << " but weights or lse were written";
  }
  if (opt.weights) r.weights = weights.Body();
  if (opt.lse) r.lse = lse.Body();
  return r;
}

// Why the library refuses the call (for failure messages).
std::string Explain(const Built& p, const qkv_attention_desc& d) {
  Tensor out = p.NewOut();
  char message[256];
  const qkv_status st = qkv_attention_explain(
      &d, p.q.data(), p.KData(), p.VData(), out.data(), nullptr, nullptr,
      nullptr, 0, message, sizeof message);
  return std::string(qkv_status_string(st)) + " (" + message + ")";
}

bool SameBits(const Result& a, const Result& b) {
  return a.status == b.status && BitwiseEqual(a.out.buf, b.out.buf) &&
         BitwiseEqual(a.weights, b.weights) && BitwiseEqual(a.lse, b.lse);
}

// ---------------------------------------------------------------------------
// Comparison with the oracle.

void ExpectMatchesOracle(const qkv_attention_desc& d, const OracleOutput& e,
                         const Result& got, float max_abs_v) {
  const double out_tol = kOutTol * std::max<double>(max_abs_v, 1e-30);
  const float* sinks = d.sinks;
  int reported = 0, bad = 0;
  auto report = [&](const std::string& what) {
    ++bad;
    if (reported < 8) {
      ++reported;
      ADD_FAILURE() << what;
    }
  };
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.q_heads; ++h) {
      for (int64_t i = 0; i < d.q_len; ++i) {
        const int64_t row = (b * d.q_heads + h) * d.q_len + i;
        const std::string where = "b=" + std::to_string(b) +
                                  " h=" + std::to_string(h) +
                                  " i=" + std::to_string(i) + " (position " +
                                  std::to_string(OraclePosition(d, b, i)) + ")";
        bool sees = false;
        for (int64_t j = 0; j < d.kv_len; ++j) {
          sees = sees || e.visible[static_cast<size_t>(row * d.kv_len + j)];
        }
        const double exact_lse = e.lse[static_cast<size_t>(row)];
        if (!got.lse.empty()) {
          const float g = got.lse[static_cast<size_t>(row)];
          bool ok;
          if (!sees) {
            // Exactly the sink (or -inf without one).
            const float want = sinks != nullptr ? sinks[h] : -kInf;
            ok = std::memcmp(&g, &want, sizeof g) == 0;
          } else {
            ok = std::fabs(g - exact_lse) <=
                 kLseTol * std::max(1.0, std::fabs(exact_lse));
          }
          if (!ok) {
            report("lse at " + where + ": got " + std::to_string(g) +
                   ", exact " + std::to_string(exact_lse) +
                   (sees ? "" : " (row sees no key)"));
          }
        }
        const float* out_row = got.out.Row(b, h, i);
        for (int64_t c = 0; c < d.value_dim; ++c) {
          const float g = out_row[c];
          const double x = e.out[static_cast<size_t>(row * d.value_dim + c)];
          const bool ok = sees ? std::fabs(g - x) <= out_tol : g == 0.0f;
          if (!ok) {
            report("out at " + where + " c=" + std::to_string(c) + ": got " +
                   std::to_string(g) + ", exact " + std::to_string(x) +
                   (sees ? "" : " (row sees no key)") + ", tolerance " +
                   std::to_string(out_tol));
          }
        }
        if (!got.weights.empty()) {
          for (int64_t j = 0; j < d.kv_len; ++j) {
            const size_t idx = static_cast<size_t>(row * d.kv_len + j);
            const float g = got.weights[idx];
            const bool visible = e.visible[idx] != 0;
            const bool ok = visible
                                ? std::fabs(g - e.weights[idx]) <= kWeightsTol
                                : g == 0.0f;
            if (!ok) {
              report("weights at " + where + " j=" + std::to_string(j) +
                     ": got " + std::to_string(g) + ", exact " +
                     std::to_string(e.weights[idx]) +
                     (visible ? "" : " (key is masked)"));
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(bad, 0) << bad << " mismatches in total";
}

// ---------------------------------------------------------------------------
// Every backend x case against the oracle.

void CheckAgainstOracle(const VCase& c, const std::string& backend) {
  const std::unique_ptr<Built> p = Build(c, backend);
  const qkv_attention_desc d = p->Bound();
  const std::vector<float> q0 = p->q.buf, k0 = p->k.buf, v0 = p->v.buf;
  const std::vector<uint8_t> kq0 = p->kq, vq0 = p->vq;

  const Result full = RunCall(*p, d);
  EXPECT_TRUE(BitwiseEqual(p->q.buf, q0) && BitwiseEqual(p->k.buf, k0) &&
              BitwiseEqual(p->v.buf, v0) && p->kq == kq0 && p->vq == vq0)
      << "an input buffer was modified";
  ASSERT_EQ(full.status, QKV_OK) << backend << ": " << Explain(*p, d);
  const OracleOutput& exact = OracleFor(c, *p);
  ExpectMatchesOracle(d, exact, full, p->max_abs_v);

  // qkv_attention (k and v as void*, kv_dtype F32) gives the same bits.
  CallOptions general;
  general.general_entry = true;
  general.check_short_workspace = false;
  const Result g = RunCall(*p, d, general);
  EXPECT_TRUE(SameBits(full, g))
      << "qkv_attention differs from qkv_attention_f32";

  // Without weights and lse: out keeps its bits.
  CallOptions bare;
  bare.weights = bare.lse = false;
  bare.check_short_workspace = false;
  const Result o = RunCall(*p, d, bare);
  ASSERT_EQ(o.status, QKV_OK);
  EXPECT_TRUE(BitwiseEqual(o.out.buf, full.out.buf))
      << "out differs with weights and lse NULL";
}

// One test per backend over every case, named by the backend, so that a
// run filtered by backend (.ci/cross: '*highway_SVE' at 512-bit vectors,
// '*highway_SVE2' at 128) takes every case on that backend.
class VariantsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(VariantsTest, EveryCaseMatchesOracle) {
  for (const VCase& c : AllCases()) {
    SCOPED_TRACE("case " + c.name);
    CheckAgainstOracle(c, GetParam());
  }
}

// The cases whose K and V stream from memory (8 MiB and more, prefetched in
// software) alone: CTest runs them again under each key-prefetch schedule
// (QKV_KEY_PREFETCH=values, =scores; src/engine.h).
TEST_P(VariantsTest, StreamedCasesMatchOracle) {
  int n = 0;
  for (const VCase& c : AllCases()) {
    if (c.name.find("streamed") == std::string::npos) continue;
    SCOPED_TRACE("case " + c.name);
    CheckAgainstOracle(c, GetParam());
    ++n;
  }
  EXPECT_GE(n, 3);
}

INSTANTIATE_TEST_SUITE_P(Backends, VariantsTest,
                         ::testing::ValuesIn(BackendNames()), BackendTestName);

TEST(VariantsCaseListTest, NamesAreUniqueAndShapesValid) {
  std::map<std::string, int> names;
  for (const VCase& c : AllCases()) {
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
  }
}

// The cases aim at particular keys: check that they see what their names
// say (some rows see nothing, windows leave a single key, ...), so that a
// change of the list cannot quietly make them trivial.
TEST(VariantsCaseListTest, CasesExerciseWhatTheyClaim) {
  for (const VCase& c : AllCases()) {
    if (c.kv_len == 0) continue;
    const std::unique_ptr<Built> p = Build(c, "");
    const OracleOutput& e = OracleFor(c, *p);
    const int64_t rows = c.batch * c.q_heads * c.q_len;
    int64_t min_keys = c.kv_len, max_keys = 0;
    for (int64_t r = 0; r < rows; ++r) {
      int64_t n = 0;
      for (int64_t j = 0; j < c.kv_len; ++j) {
        n += e.visible[static_cast<size_t>(r * c.kv_len + j)];
      }
      min_keys = std::min(min_keys, n);
      max_keys = std::max(max_keys, n);
    }
    EXPECT_GT(max_keys, 0) << c.name << ": no row sees a key";
    if (c.name.find("width1") != std::string::npos) {
      EXPECT_EQ(max_keys, 1) << c.name;
    }
    const bool wants_empty_rows =
        c.name.find("negative") != std::string::npos ||
        c.name.find("masked_rows") != std::string::npos ||
        c.name.find("kv_start_tile") != std::string::npos ||
        c.name.find("kv_start_row") != std::string::npos ||
        c.name.find("past_end_tile") != std::string::npos;
    if (wants_empty_rows) {
      EXPECT_EQ(min_keys, 0) << c.name << ": expected rows that see no key";
    }
  }
}

// ---------------------------------------------------------------------------
// Empty shapes and sinks without an oracle, on every backend.

// batch 0 or q_len 0: nothing to do, OK, no pointer read (NULL everywhere),
// nothing written; with every variant set, and with strides.
void EmptyBatchOrQueriesIsOkAndWritesNothing(const std::string& backend) {
  for (int which = 0; which < 2; ++which) {
    for (bool strided : {false, true}) {
      SCOPED_TRACE(std::string(which == 0 ? "batch 0" : "q_len 0") +
                   (strided ? ", token-major" : ", dense"));
      VCase c = Shape("empty", which == 0 ? 0 : 2, 4, 2, which == 0 ? 5 : 0,
                      30, 8, 8)
                    .Causal()
                    .Window(5, 0)
                    .Alibi(0.5f)
                    .Softcap(4.0f)
                    .WithSinks(Sinks::kMixed);
      if (strided) c.AllLayouts(Layout::kTokenMajor);
      if (which == 1) c.QPos({3, 4}).KvStart({0, 2});
      const std::unique_ptr<Built> p = Build(c, backend);
      const qkv_attention_desc d = p->Bound();
      EXPECT_EQ(qkv_attention_workspace_size(&d), 0u);
      // Real (sentinel) buffers: untouched.
      std::vector<float> out(64, Bits(kSentinel)), w(64, Bits(kSentinel)),
          lse(64, Bits(kSentinel));
      const std::vector<float> before = out;
      EXPECT_EQ(qkv_attention_f32(&d, p->q.data(), p->k.data(), p->v.data(),
                                  out.data(), w.data(), lse.data(), nullptr, 0),
                QKV_OK);
      EXPECT_EQ(qkv_attention(&d, p->q.data(), p->k.data(), p->v.data(),
                              out.data(), w.data(), lse.data(), nullptr, 0),
                QKV_OK);
      EXPECT_TRUE(BitwiseEqual(out, before) && BitwiseEqual(w, before) &&
                  BitwiseEqual(lse, before));
      // NULL everywhere.
      EXPECT_EQ(qkv_attention_f32(&d, nullptr, nullptr, nullptr, nullptr,
                                  nullptr, nullptr, nullptr, 0),
                QKV_OK);
      EXPECT_EQ(qkv_attention(&d, nullptr, nullptr, nullptr, nullptr, nullptr,
                              nullptr, nullptr, 0),
                QKV_OK);
      char msg[128] = "x";
      EXPECT_EQ(qkv_attention_explain(&d, nullptr, nullptr, nullptr, nullptr,
                                      nullptr, nullptr, nullptr, 0, msg,
                                      sizeof msg),
                QKV_OK);
      EXPECT_STREQ(msg, "ok");
    }
  }
}

// kv_len 0: k and v are not read (NULL is fine); every row gets out 0 and
// lse -inf or its sink; the workspace query is 0.
void NoKeysNeedsNoKeyPointers(const std::string& backend) {
  for (bool sinks : {false, true}) {
    SCOPED_TRACE(sinks ? "sinks" : "no sinks");
    VCase c = Shape("nokeys", 2, 4, 2, 3, 0, 8, 8).Causal().Window(2, 0);
    if (sinks) c.WithSinks(Sinks::kRandom);
    const std::unique_ptr<Built> p = Build(c, backend);
    const qkv_attention_desc d = p->Bound();
    EXPECT_EQ(qkv_attention_workspace_size(&d), 0u);
    GuardedBuffer out(NumOut(d)), lse(NumLse(d));
    float weights_dummy = Bits(kSentinel);  // [..][0]: no element
    ASSERT_EQ(qkv_attention_f32(&d, p->q.data(), nullptr, nullptr, out.data(),
                                &weights_dummy, lse.data(), nullptr, 0),
              QKV_OK);
    EXPECT_TRUE(out.GuardsIntact() && lse.GuardsIntact());
    EXPECT_TRUE(IsSentinel(weights_dummy)) << "wrote a weight of no key";
    for (float x : out.Body()) EXPECT_EQ(x, 0.0f);
    for (int64_t b = 0; b < d.batch; ++b) {
      for (int64_t h = 0; h < d.q_heads; ++h) {
        for (int64_t i = 0; i < d.q_len; ++i) {
          const float got = lse.Body()[static_cast<size_t>(
              (b * d.q_heads + h) * d.q_len + i)];
          const float want = sinks ? p->sinks[static_cast<size_t>(h)] : -kInf;
          EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0)
              << "lse " << got << ", want " << want << " (head " << h << ")";
        }
      }
    }
  }
}

// Sinks are one logit per head: with all-equal scores (q = 0) the weights
// are exactly 1 / (n + exp(sink)) (a check that needs no oracle).
void SinkShareOfUniformScores(const std::string& backend) {
  VCase c = Shape("sink_share", 1, 4, 4, 1, 40, 8, 8).WithSinks(Sinks::kMixed);
  c.q_mag = 0.0f;
  const std::unique_ptr<Built> p = Build(c, backend);
  const qkv_attention_desc d = p->Bound();
  const Result r = RunCall(*p, d);
  ASSERT_EQ(r.status, QKV_OK);
  for (int64_t h = 0; h < 4; ++h) {
    const double sink = p->sinks[static_cast<size_t>(h)];
    const double denom = 40.0 + std::exp(sink);
    for (int64_t j = 0; j < 40; ++j) {
      EXPECT_NEAR(r.weights[static_cast<size_t>(h * 40 + j)], 1.0 / denom,
                  2e-5)
          << "head " << h << " (sink " << sink << ") key " << j;
    }
    EXPECT_NEAR(r.lse[static_cast<size_t>(h)], std::log(denom),
                2e-5 * std::max(1.0, std::log(denom)));
  }
}

TEST(VariantsEveryBackendTest, EmptyBatchOrQueriesIsOkAndWritesNothing) {
  for (const std::string& backend : BackendNames()) {
    SCOPED_TRACE("backend " + backend);
    EmptyBatchOrQueriesIsOkAndWritesNothing(backend);
  }
}

TEST(VariantsEveryBackendTest, NoKeysNeedsNoKeyPointers) {
  for (const std::string& backend : BackendNames()) {
    SCOPED_TRACE("backend " + backend);
    NoKeysNeedsNoKeyPointers(backend);
  }
}

TEST(VariantsEveryBackendTest, SinkShareOfUniformScores) {
  for (const std::string& backend : BackendNames()) {
    SCOPED_TRACE("backend " + backend);
    SinkShareOfUniformScores(backend);
  }
}

// ---------------------------------------------------------------------------
// Bitwise identical for 1, 2 and 3 workers of a real pool, and with no pool.
#if !defined(__wasi__)

std::vector<VCase> DeterminismCases() {
  const std::vector<std::string> names = {
      "combined_tile_gqa", "combined_row_split", "combined_tiny8",
      "padded_split",      "token_major_tile",   "window_last_split_only",
      "token_major_groups_everything",
      "kv_start_split",    "f16_tile_gqa",       "i8_row_split",
      "bf16_everything_token_major"};
  std::vector<VCase> r;
  for (const VCase& c : AllCases()) {
    if (std::find(names.begin(), names.end(), c.name) != names.end()) {
      r.push_back(c);
    }
  }
  return r;
}

void CheckWorkerCounts(const VCase& c, const std::string& backend) {
  const std::unique_ptr<Built> p = Build(c, backend);
  const qkv_attention_desc serial = p->Bound();
  CallOptions opt;
  opt.check_short_workspace = false;
  const Result base = RunCall(*p, serial, opt);
  ASSERT_EQ(base.status, QKV_OK) << Explain(*p, serial);
  for (size_t workers : {size_t{1}, size_t{2}, size_t{3}}) {
    ThreadPool pool(workers);
    qkv_attention_desc d = serial;
    pool.Attach(&d);
    for (int rep = 0; rep < 2; ++rep) {
      CallOptions o;
      o.check_short_workspace = rep == 0;
      o.general_entry = rep == 1;
      const Result got = RunCall(*p, d, o);
      EXPECT_TRUE(SameBits(base, got))
          << workers << " workers, run " << rep
          << ": differs from the call without a pool";
    }
  }
}

class VariantsDeterminismTest : public ::testing::TestWithParam<VCase> {};

std::string CaseName(const ::testing::TestParamInfo<VCase>& info) {
  return info.param.name;
}

TEST_P(VariantsDeterminismTest, BitwiseIdenticalForOneTwoThreeWorkers) {
  for (const std::string& backend : BackendNames()) {
    SCOPED_TRACE("backend " + backend);
    CheckWorkerCounts(GetParam(), backend);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, VariantsDeterminismTest,
                         ::testing::ValuesIn(DeterminismCases()), CaseName);
#endif  // !__wasi__

}  // namespace
}  // namespace qkv_test
