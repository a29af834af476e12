// Today's result bits, pinned per backend: a refactoring of the pipeline
// (its plan, element types, address function, kernels) must keep every bit
// of every result, and a change that moves bits must say so.
//
// A corpus of cases that between them take every forward path (tile, narrow
// tile, tile group, rows, joint rows, GQA-8 rows, interleaved heads, tiny,
// and AMD's blocks in phases and pipelined int8 decoding) with each K/V
// type, score kind and epilogue term; inputs come from an integer generator
// (the same values on every platform). Each case's out, lse (and weights
// where asked) are hashed (FNV-1a over their bytes) and, with the paths its
// tasks took (pipeline/paths.h), compared with tests/bits_pinned.inc, keyed
// by architecture and compiler, backend and lane count (SVE's lane count is
// the machine's vector length). A backend with no pinned hashes (a target or
// compiler this file was not written on) is skipped, saying so.
//
// Re-pinning (only for a change meant to move bits, named in its commit):
//   QKV_BITS_PRINT=1 build/tests/qkv_tests --gtest_filter='*Bits*'
// prints every hash as a line of bits_pinned.inc (for the aarch64 lines run
// the aarch64 build under qemu-aarch64 -cpu cortex-a72 and -cpu max at the
// vector lengths of .ci/cross).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine.h"
#include "pipeline/paths.h"
#include "qkv/qkv.h"
#include "test_util.h"

namespace {

struct Pinned {
  const char* arch;
  const char* backend;
  unsigned lanes;
  const char* name;
  uint64_t hash;
  uint32_t paths;  // PathBits(): the paths the case's tasks took
};

const Pinned kPinned[] = {
#include "bits_pinned.inc"
    {nullptr, nullptr, 0, nullptr, 0, 0}};

// Architecture and compiler: a compiler may fuse a * b + c differently
// (clang's -ffp-contract=on), and aarch64's GCC fuses the scalar code too.
// GCC fuses only from -O2 on, so the sanitized builds (-O1) pin nothing.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define QKV_BITS_CC "sanitized"
#elif defined(__clang__)
#define QKV_BITS_CC "clang"
#elif defined(__GNUC__)
#define QKV_BITS_CC "gcc"
#else
#define QKV_BITS_CC "other"
#endif
#if defined(__x86_64__)
const char kArch[] = "x86_64-" QKV_BITS_CC;
#elif defined(__aarch64__)
const char kArch[] = "aarch64-" QKV_BITS_CC;
#elif defined(__arm__)
const char kArch[] = "arm-" QKV_BITS_CC;
#elif defined(__wasm__)
const char kArch[] = "wasm32-" QKV_BITS_CC;
#else
const char kArch[] = "other-" QKV_BITS_CC;
#endif

enum Extra : unsigned {
  kCausal = 1,
  kLens = 2,
  kBias = 4,
  kWindow = 8,
  kAlibi = 16,
  kSoftcap = 32,
  kSinks = 64,
  kKvStart = 128,
  kWeights = 256,     // weights requested (and hashed)
  kTokenMajor = 512,  // K and V [batch][kv_len][kv_heads][dim]
};

struct BitsCase {
  const char* name;
  int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim, value_dim;
  qkv_dtype dtype;
  qkv_score score;
  unsigned extra;
};

// Names say the shape; the path each takes on a 16-lane x86 target is in
// the comment (other lane counts cross the boundaries elsewhere).
const BitsCase kCases[] = {
    // Decoding (rows path; tiny for toy widths).
    {"dec_mha_kv1_d128", 1, 4, 4, 1, 1, 128, 128, QKV_DTYPE_F32, QKV_SCORE_DOT, 0},
    {"dec_mha_kv15_d128", 1, 4, 4, 1, 15, 128, 128, QKV_DTYPE_F32, QKV_SCORE_DOT, 0},
    {"dec_mha_kv16_d128", 1, 4, 4, 1, 16, 128, 128, QKV_DTYPE_F32, QKV_SCORE_DOT, 0},
    {"dec_mha_kv17_d128", 1, 4, 4, 1, 17, 128, 128, QKV_DTYPE_F32, QKV_SCORE_DOT, 0},
    {"dec_mha_kv300_d64", 2, 2, 2, 1, 300, 64, 64, QKV_DTYPE_F32, QKV_SCORE_DOT, kLens},
    {"dec_mha_kv1500_d128_split", 1, 2, 2, 1, 1500, 128, 128, QKV_DTYPE_F32, QKV_SCORE_DOT, 0},
    {"dec_gqa4_kv700_d64", 1, 8, 2, 1, 700, 64, 64, QKV_DTYPE_F32, QKV_SCORE_DOT, 0},
    {"dec_gqa8_kv500_d128", 1, 8, 1, 1, 500, 128, 128, QKV_DTYPE_F32, QKV_SCORE_DOT, 0},
    {"dec_gqa4_kv100_d80_bias", 1, 4, 1, 1, 100, 80, 48, QKV_DTYPE_F32, QKV_SCORE_DOT, kBias},
    {"dec_f16_kv700_d128", 1, 4, 4, 1, 700, 128, 128, QKV_DTYPE_F16, QKV_SCORE_DOT, 0},
    {"dec_bf16_gqa4_kv333_d64", 1, 8, 2, 1, 333, 64, 64, QKV_DTYPE_BF16, QKV_SCORE_DOT, 0},
    {"dec_i8_kv1200_d128", 1, 2, 2, 1, 1200, 128, 128, QKV_DTYPE_I8, QKV_SCORE_DOT, 0},
    {"dec_i8_gqa8_kv257_d64", 1, 8, 1, 1, 257, 64, 64, QKV_DTYPE_I8, QKV_SCORE_DOT, 0},
    // A few queries (joint rows, interleaved heads, narrow tiles).
    {"q3_gqa4_kv400_d64_causal", 1, 8, 2, 3, 400, 64, 64, QKV_DTYPE_F32, QKV_SCORE_DOT, kCausal},
    {"q5_mha_kv129_d96", 1, 2, 2, 5, 129, 96, 40, QKV_DTYPE_F16, QKV_SCORE_DOT, kCausal},
    {"q8_mha_kv64_d32", 1, 3, 3, 8, 64, 32, 32, QKV_DTYPE_F32, QKV_SCORE_DOT, 0},
    // Prefill (tiles, tile groups).
    {"pre_q100_kv100_d64_causal", 1, 2, 2, 100, 100, 64, 64, QKV_DTYPE_F32, QKV_SCORE_DOT, kCausal},
    {"pre_q33_kv300_d80_bias", 1, 2, 1, 33, 300, 80, 48, QKV_DTYPE_F32, QKV_SCORE_DOT, kBias | kLens},
    {"pre_q64_kv257_d64_f16", 1, 2, 2, 64, 257, 64, 64, QKV_DTYPE_F16, QKV_SCORE_DOT, kCausal},
    {"pre_q40_kv200_d64_i8", 1, 2, 2, 40, 200, 64, 64, QKV_DTYPE_I8, QKV_SCORE_DOT, kCausal},
    {"pre_q130_kv300_d128_bf16", 1, 1, 1, 130, 300, 128, 128, QKV_DTYPE_BF16, QKV_SCORE_DOT, 0},
    {"pre_q256_kv256_d64_gqa2", 1, 4, 2, 256, 256, 64, 64, QKV_DTYPE_F32, QKV_SCORE_DOT, kCausal},
    // Epilogue terms.
    {"terms_window_alibi", 1, 4, 2, 20, 150, 64, 64, QKV_DTYPE_F32, QKV_SCORE_DOT, kCausal | kWindow | kAlibi},
    {"terms_softcap_sinks", 1, 4, 4, 1, 90, 64, 64, QKV_DTYPE_F32, QKV_SCORE_DOT, kSoftcap | kSinks},
    {"terms_kv_start_lens", 2, 2, 2, 7, 80, 48, 48, QKV_DTYPE_F16, QKV_SCORE_DOT, kKvStart | kLens},
    {"terms_all_q17", 1, 4, 2, 17, 120, 64, 32, QKV_DTYPE_F32, QKV_SCORE_DOT,
     kCausal | kBias | kWindow | kAlibi | kSoftcap | kSinks},
    // Other score kinds.
    {"gauss_q9_kv77_d16", 1, 2, 2, 9, 77, 16, 8, QKV_DTYPE_F32, QKV_SCORE_GAUSSIAN, 0},
    {"gauss_dec_kv300_d64", 1, 2, 1, 1, 300, 64, 64, QKV_DTYPE_F16, QKV_SCORE_GAUSSIAN, 0},
    {"additive_q4_kv50_d32", 1, 2, 2, 4, 50, 32, 16, QKV_DTYPE_F32, QKV_SCORE_ADDITIVE, 0},
    {"additive_dec_kv40_d16_i8", 1, 2, 1, 1, 40, 16, 16, QKV_DTYPE_I8, QKV_SCORE_ADDITIVE, 0},
    // Heads interleaved, a tile of one vector, K/V past the prefetch size
    // (on AMD: blocks in phases, int8 decoding pipelined).
    {"tokmajor_dec_kv300_d64", 1, 4, 4, 1, 300, 64, 64, QKV_DTYPE_F32, QKV_SCORE_DOT, kTokenMajor},
    {"tokmajor_dec_f16_kv200_d64", 2, 4, 2, 1, 200, 64, 32, QKV_DTYPE_F16, QKV_SCORE_DOT, kTokenMajor | kLens},
    {"q12_mha_kv100_d64", 1, 2, 2, 12, 100, 64, 64, QKV_DTYPE_F32, QKV_SCORE_DOT, kCausal},
    {"big_dec_kv8192_d64", 1, 2, 2, 1, 8192, 64, 64, QKV_DTYPE_F32, QKV_SCORE_DOT, 0},
    {"big_dec_i8_kv16384_d128", 1, 2, 2, 1, 16384, 128, 128, QKV_DTYPE_I8, QKV_SCORE_DOT, 0},
    // Weights written.
    {"w_dec_gqa4_kv70_d64", 1, 8, 2, 1, 70, 64, 64, QKV_DTYPE_F32, QKV_SCORE_DOT, kWeights},
    {"w_pre_q20_kv90_d32_bias", 1, 2, 2, 20, 90, 32, 32, QKV_DTYPE_F16, QKV_SCORE_DOT, kWeights | kBias | kCausal},
    {"w_tiny_q2_kv6_d8", 1, 1, 1, 2, 6, 8, 8, QKV_DTYPE_F32, QKV_SCORE_DOT, kWeights | kSoftcap},
    // Toy widths (tiny path).
    {"tiny_q3_kv5_d8", 1, 2, 2, 3, 5, 8, 8, QKV_DTYPE_F32, QKV_SCORE_DOT, 0},
    {"tiny_q1_kv7_d4_causal", 2, 2, 1, 2, 7, 4, 6, QKV_DTYPE_F16, QKV_SCORE_DOT, kCausal},
};

// splitmix64: the same values on every platform.
struct Gen {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // A multiple of 2^-12 in [lo, hi): exact in f32.
  float Uniform(float lo, float hi) {
    const double u = static_cast<double>(Next() >> 52) / 4096.0;
    return static_cast<float>(lo + (hi - lo) * u);
  }
  void Fill(std::vector<float>* x, float lo, float hi) {
    for (float& e : *x) e = Uniform(lo, hi);
  }
};

uint64_t Fnv(const void* data, size_t bytes, uint64_t h) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

// K or V in its element type: [rows][n] floats quantized by the library.
struct Cache {
  std::vector<unsigned char> bytes;
  std::vector<float> scales;
};

Cache Store(qkv_dtype dtype, const std::vector<float>& x, int64_t rows,
            int64_t n) {
  static const size_t kSize[] = {4, 2, 2, 1};
  Cache c;
  c.bytes.resize(static_cast<size_t>(rows * n) * kSize[dtype]);
  if (dtype == QKV_DTYPE_I8) c.scales.resize(static_cast<size_t>(rows));
  const qkv_status st =
      qkv_quantize_rows(dtype, rows, n, x.data(), n, c.bytes.data(), n,
                        dtype == QKV_DTYPE_I8 ? c.scales.data() : nullptr);
  EXPECT_EQ(st, QKV_OK);
  return c;
}

// The case's hash on `backend`, or 0 with a failure.
uint64_t RunCase(const BitsCase& c, const char* backend, uint32_t* paths) {
  qkv_attention_desc d;
  qkv_attention_desc_init(&d, c.batch, c.q_heads, c.kv_heads, c.q_len,
                          c.kv_len, c.head_dim, c.value_dim);
  d.backend = backend;
  d.score = c.score;
  d.kv_dtype = c.dtype;
  Gen g{qkv_test::SeedFromName(c.name)};
  const int64_t kv_rows = c.batch * c.kv_heads * c.kv_len;
  std::vector<float> q(static_cast<size_t>(c.batch * c.q_heads * c.q_len *
                                           c.head_dim));
  std::vector<float> k(static_cast<size_t>(kv_rows * c.head_dim));
  std::vector<float> v(static_cast<size_t>(kv_rows * c.value_dim));
  g.Fill(&q, -1.5f, 1.5f);
  g.Fill(&k, -1.5f, 1.5f);
  g.Fill(&v, -2.0f, 2.0f);
  if (c.score == QKV_SCORE_GAUSSIAN) d.scale = 0.5f;
  const int64_t hidden = 24;
  std::vector<float> wq(hidden * c.head_dim), wk(hidden * c.head_dim),
      wv(hidden);
  if (c.score == QKV_SCORE_ADDITIVE) {
    g.Fill(&wq, -0.5f, 0.5f);
    g.Fill(&wk, -0.5f, 0.5f);
    g.Fill(&wv, -1.0f, 1.0f);
    d.additive_hidden = hidden;
    d.additive_w_q = wq.data();
    d.additive_w_k = wk.data();
    d.additive_w_v = wv.data();
  }
  std::vector<int32_t> lens(static_cast<size_t>(c.batch));
  std::vector<int32_t> starts(static_cast<size_t>(c.batch));
  std::vector<float> bias(static_cast<size_t>(c.batch * c.q_heads * c.q_len *
                                              c.kv_len));
  std::vector<float> slopes(static_cast<size_t>(c.q_heads));
  std::vector<float> sinks(static_cast<size_t>(c.q_heads));
  if (c.extra & kTokenMajor) {
    d.k_strides = {c.kv_len * c.kv_heads * c.head_dim, c.head_dim,
                   c.kv_heads * c.head_dim};
    d.v_strides = {c.kv_len * c.kv_heads * c.value_dim, c.value_dim,
                   c.kv_heads * c.value_dim};
  }
  if (c.extra & kCausal) d.mask |= QKV_MASK_CAUSAL;
  if (c.extra & kLens) {
    for (size_t b = 0; b < lens.size(); ++b) {
      lens[b] = static_cast<int32_t>(c.kv_len - 3 - 11 * b);
    }
    d.mask |= QKV_MASK_VALID_LENS;
    d.valid_lens = lens.data();
  }
  if (c.extra & kKvStart) {
    for (size_t b = 0; b < starts.size(); ++b) {
      starts[b] = static_cast<int32_t>(5 + 9 * b);
    }
    d.mask |= QKV_MASK_KV_START;
    d.kv_start = starts.data();
  }
  if (c.extra & kBias) {
    g.Fill(&bias, -3.0f, 1.0f);
    for (size_t i = 0; i < bias.size(); i += 13) bias[i] = -INFINITY;
    d.mask |= QKV_MASK_BIAS;
    d.bias = bias.data();
    d.bias_batch_stride = c.q_heads * c.q_len * c.kv_len;
    d.bias_head_stride = c.q_len * c.kv_len;
  }
  if (c.extra & kWindow) {
    d.mask |= QKV_MASK_WINDOW;
    d.window_left = 37;
    d.window_right = 0;
  }
  if (c.extra & kAlibi) {
    for (size_t h = 0; h < slopes.size(); ++h) {
      slopes[h] = std::ldexp(1.0f, -static_cast<int>(h + 1));
    }
    d.alibi_slopes = slopes.data();
  }
  if (c.extra & kSoftcap) d.softcap = 2.5f;
  if (c.extra & kSinks) {
    g.Fill(&sinks, -1.0f, 1.0f);
    d.sinks = sinks.data();
  }
  const Cache kc = Store(c.dtype, k, kv_rows, c.head_dim);
  const Cache vc = Store(c.dtype, v, kv_rows, c.value_dim);
  if (c.dtype == QKV_DTYPE_I8) {
    d.k_scales = kc.scales.data();
    d.v_scales = vc.scales.data();
  }
  std::vector<float> out(static_cast<size_t>(c.batch * c.q_heads * c.q_len *
                                             c.value_dim));
  std::vector<float> lse(static_cast<size_t>(c.batch * c.q_heads * c.q_len));
  std::vector<float> weights((c.extra & kWeights) ? bias.size() : 0);
  float* const w = weights.empty() ? nullptr : weights.data();
  std::vector<unsigned char> ws(qkv_attention_workspace_size(&d) + 1);
  char why[256] = "";
  qkv::TracePaths(true);
  const qkv_status st = qkv_attention(&d, q.data(), kc.bytes.data(),
                                      vc.bytes.data(), out.data(), w,
                                      lse.data(), ws.data(), ws.size());
  *paths = qkv::PathsTraced();
  qkv::TracePaths(false);
  if (st != QKV_OK) {
    qkv_attention_explain(&d, q.data(), kc.bytes.data(), vc.bytes.data(),
                          out.data(), w, lse.data(), ws.data(),
                          ws.size(), why, sizeof why);
    ADD_FAILURE() << c.name << " on " << backend << ": "
                  << qkv_status_string(st) << ": " << why;
    return 0;
  }
  uint64_t h = 14695981039346656037ull;
  h = Fnv(out.data(), out.size() * sizeof(float), h);
  h = Fnv(weights.data(), weights.size() * sizeof(float), h);
  return Fnv(lse.data(), lse.size() * sizeof(float), h);
}

unsigned LanesOf(const char* backend) {
  const qkv::PipelineBlocks* b = qkv::BlocksOf(qkv::FindEngine(backend));
  return b != nullptr ? static_cast<unsigned>(b->lanes()) : 0;
}

const Pinned* FindPinned(const char* backend, unsigned lanes,
                         const char* name) {
  for (const Pinned& p : kPinned) {
    if (p.arch != nullptr && strcmp(p.arch, kArch) == 0 &&
        strcmp(p.backend, backend) == 0 && p.lanes == lanes &&
        (name == nullptr || strcmp(p.name, name) == 0)) {
      return &p;
    }
  }
  return nullptr;
}

// The traced paths, with the row path's AMD schedules (blocks in phases,
// int8 decoding pipelined: KeysPrefetchedLate) counted as the row path
// they replace elsewhere, so that one pin serves every x86 vendor.
uint32_t PathBits(uint32_t traced) {
  const uint32_t amd = qkv::kPathRowPhases | qkv::kPathRowPipelined;
  return (traced & amd) != 0 ? (traced & ~amd) | qkv::kPathRows : traced;
}

// Checks one backend's cases against their pins; returns how many kept
// both their bits and their paths, and the union of the paths traced.
int CheckBackend(const char* backend, unsigned lanes, bool print,
                 uint32_t* traced_union) {
  int same = 0;
  for (const BitsCase& c : kCases) {
    uint32_t traced = 0;
    const uint64_t h = RunCase(c, backend, &traced);
    *traced_union |= traced;
    const uint32_t paths = PathBits(traced);
    if (print) {
      printf("    {\"%s\", \"%s\", %u, \"%s\", 0x%016llxull, 0x%03x},\n",
             kArch, backend, lanes, c.name,
             static_cast<unsigned long long>(h), paths);
      continue;
    }
    const Pinned* p = FindPinned(backend, lanes, c.name);
    if (p == nullptr) {
      ADD_FAILURE() << c.name << " on " << backend << ": no pinned hash";
    } else if (p->hash != h) {
      ADD_FAILURE() << c.name << " on " << backend << " (" << lanes
                    << " lanes): the bits moved (hash " << std::hex << h
                    << ", pinned " << p->hash << ")";
    } else if (p->paths != paths) {
      ADD_FAILURE() << c.name << " on " << backend << " (" << lanes
                    << " lanes): took paths 0x" << std::hex << paths
                    << ", pinned 0x" << p->paths << " (pipeline/paths.h)";
    } else {
      ++same;
    }
  }
  return same;
}

class Bits : public testing::TestWithParam<std::string> {};

TEST_P(Bits, KeepsThePinnedBitsAndPaths) {
  const char* backend = GetParam().c_str();
  const bool print = getenv("QKV_BITS_PRINT") != nullptr;
  const unsigned lanes = LanesOf(backend);
  if (!print && FindPinned(backend, lanes, nullptr) == nullptr) {
    GTEST_SKIP() << kArch << " " << backend << "/" << lanes
                 << " lanes: no pinned hashes (not checked)";
  }
  uint32_t traced = 0;
  const int same = CheckBackend(backend, lanes, print, &traced);
  if (print) return;
  printf("[ bits ] %s %s/%u lanes: %d of %zu cases keep their bits and "
         "paths (paths 0x%03x)\n",
         kArch, backend, lanes, same, sizeof kCases / sizeof kCases[0],
         traced);
#if defined(__x86_64__)
  // The corpus takes every path of a 16-lane x86 target, and the AMD
  // schedules where they run.
  if (lanes == 16) {
    uint32_t want = (qkv::kPathTile2 << 1) - 1;
    if (!qkv::KeysPrefetchedLate()) {
      want &= ~(qkv::kPathRowPhases | qkv::kPathRowPipelined);
    }
    EXPECT_EQ(traced, want) << backend << ": a path no case takes";
  }
#endif
}

// Forces ForcedPath's bit for the scope (pipeline/paths.h), then none.
struct ForcePathScope {
  explicit ForcePathScope(uint32_t bit) { qkv::ForcePath(bit); }
  ~ForcePathScope() { qkv::ForcePath(0); }
};

// The row path's schedules compute the same bits (the pins count RunRowPhases
// and RunRowPipelined as RunRows), and so do the tile path's widths and tile
// groups: each forced in turn onto every call and task that can take it
// (pipeline/plan-inl.h, RowSchedule and TaskPath), every case keeps its
// pinned bits, and on x86 some case takes each (on Intel the pipeline itself
// never takes RunRowPhases nor RunRowPipelined: only this test runs them).
TEST_P(Bits, ForcedPathsKeepThePinnedBits) {
  const char* backend = GetParam().c_str();
  const unsigned lanes = LanesOf(backend);
  if (FindPinned(backend, lanes, nullptr) == nullptr) {
    GTEST_SKIP() << kArch << " " << backend << "/" << lanes
                 << " lanes: no pinned hashes (not checked)";
  }
  const struct {
    uint32_t bit;
    const char* name;
  } kForced[] = {{qkv::kPathRows, "RunRows"},
                 {qkv::kPathRowPhases, "RunRowPhases"},
                 {qkv::kPathRowPipelined, "RunRowPipelined"},
                 {qkv::kPathTile2, "RunTile<2>"},
                 {qkv::kPathTile1, "RunTile<1>"},
                 {qkv::kPathTileNarrow, "RunNarrowTile"},
                 {qkv::kPathTileGroup, "RunTileGroup"}};
  for (const auto& f : kForced) {
    int took = 0;
    {
      const ForcePathScope force(f.bit);
      for (const BitsCase& c : kCases) {
        uint32_t traced = 0;
        const uint64_t h = RunCase(c, backend, &traced);
        const Pinned* p = FindPinned(backend, lanes, c.name);
        ASSERT_NE(p, nullptr) << c.name;
        EXPECT_EQ(h, p->hash) << c.name << " on " << backend << " with "
                              << f.name << " forced: the bits moved";
        if ((traced & f.bit) != 0) ++took;
      }
    }
    printf("[ bits ] %s %s: %s forced, taken by %d cases, same bits\n", kArch,
           backend, f.name, took);
#if defined(__x86_64__)
    // Every SIMD backend runs the pipeline (lanes > 0), and the corpus has
    // cases each schedule can take.
    // (The 8-lane tile of a wider target exists at 16 lanes only.)
    if (lanes > 0 && (f.bit != qkv::kPathTileNarrow || lanes == 16)) {
      EXPECT_GT(took, 0) << backend << ": no case took " << f.name;
    }
#endif
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Bits,
                         testing::ValuesIn(qkv_test::BackendNames()),
                         qkv_test::BackendTestName);

}  // namespace
