// The microcontroller test runner: qkv's oracle cases scaled to a small
// board's RAM, with no GoogleTest, no heap, no exceptions and only static
// buffers (about 40 KiB of .bss), so it runs on a Cortex-M4 with 128 KiB of
// RAM as well as on the host. Output goes to stdout (semihosting on a board);
// the exit code is the verdict: 0 when every check passed, 1 otherwise.
//
// Every case runs on every backend this build lists (reference, and helium on
// a Cortex-M55), compares with a double-precision oracle written from the
// spec in include/qkv/qkv.h (independent of the kernels), and checks that the
// library writes nowhere outside the outputs and the workspace it was given.
// F16, BF16 and I8 K/V caches are checked against the oracles over their
// dequantized values, or, in a build without them, that they are refused.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "qkv/qkv.h"

namespace {

// ------------------------------------------------------------------ buffers
constexpr int kMaxIn = 1024;      // floats of q, k or v
constexpr int kMaxOut = 512;      // floats of out
constexpr int kMaxW = 1024;       // floats of weights (and bias)
constexpr int kMaxRows = 96;      // rows (lse)
constexpr int kMaxHidden = 8;     // additive hidden size
constexpr int kMaxKv = 64;        // keys per head
constexpr int kGuard = 8;         // canary floats around every output
constexpr size_t kMaxWs = QKV_REFERENCE_WORKSPACE_SIZE(kMaxKv, kMaxHidden, 3);

float g_q[kMaxIn], g_k[kMaxIn], g_v[kMaxIn], g_bias[kMaxW];
float g_wq[kMaxHidden * 32], g_wk[kMaxHidden * 32], g_wv[kMaxHidden];
int32_t g_lens[kMaxRows];
float g_out[kMaxOut + 2 * kGuard], g_w[kMaxW + 2 * kGuard];
float g_lse[kMaxRows + 2 * kGuard];
unsigned char g_ws[kMaxWs + 1 + 64];  // +1: a misaligned start; +64: canary
double g_ref_out[kMaxOut], g_ref_w[kMaxW], g_ref_lse[kMaxRows];
double g_scores[kMaxKv];
unsigned char g_visible[kMaxKv];
double g_kproj[kMaxKv * 4 * kMaxHidden];

// The workspace size macro is a constant expression (it sized g_ws above and
// sizes this one): firmware reserves its workspace at compile time.
static_assert(QKV_REFERENCE_WORKSPACE_SIZE(64, 0, 1) == 256 + 63,
              "64 scores are 256 bytes, plus 63 bytes of alignment slack");
static_assert(QKV_REFERENCE_WORKSPACE_SIZE(5, 3, 2) == 2 * 128 + 63,
              "(5 + 6 * 3) floats = 92 bytes -> 128 per worker");

int g_failures = 0;
int g_checks = 0;
const char* g_case = "";
const char* g_backend = "";

void Fail(const char* what, double got, double want) {
  ++g_failures;
  if (g_failures <= 40) {
    printf("FAIL %s [%s]: %s (got %.9g, want %.9g)\n", g_case, g_backend,
           what, got, want);
  }
}

void Check(bool ok, const char* what) {
  ++g_checks;
  if (!ok) Fail(what, 0, 1);
}

// weights within 2e-5 and lse within 1e-5 relative (-inf exactly) of the
// oracle's g_ref_w and g_ref_lse.
void CheckWeightsAndLse(const float* w, int n_w, const float* lse,
                        int64_t rows) {
  for (int i = 0; i < n_w; ++i) {
    ++g_checks;
    if (!(fabs(w[i] - g_ref_w[i]) <= 2e-5)) {
      Fail("weights", w[i], g_ref_w[i]);
      break;
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    ++g_checks;
    const double want = g_ref_lse[i];
    const bool ok = want == -INFINITY
                        ? lse[i] == -INFINITY
                        : fabs(lse[i] - want) <= 1e-5 * (1 + fabs(want));
    if (!ok) {
      Fail("lse", lse[i], want);
      break;
    }
  }
}

// A small xorshift generator: the same inputs on every board.
uint32_t g_rng = 1;
float Uniform(float lo, float hi) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 17;
  g_rng ^= g_rng << 5;
  return lo + (hi - lo) * static_cast<float>(g_rng >> 8) * (1.0f / 16777216.0f);
}
void Fill(float* x, int n, float mag) {
  for (int i = 0; i < n; ++i) x[i] = Uniform(-mag, mag);
}

constexpr uint32_t kSentinel = 0x7FBADBADu;  // a NaN
constexpr uint32_t kCanary = 0xDEADBEEFu;

void Poison(float* buf, int n) {
  for (int i = 0; i < n + 2 * kGuard; ++i) {
    const uint32_t bits = (i < kGuard || i >= kGuard + n) ? kCanary : kSentinel;
    memcpy(&buf[i], &bits, 4);
  }
}
bool Untouched(const float* buf, int n, bool body) {
  for (int i = 0; i < n + 2 * kGuard; ++i) {
    const bool guard = i < kGuard || i >= kGuard + n;
    if (!guard && !body) continue;
    uint32_t bits;
    memcpy(&bits, &buf[i], 4);
    if (bits != (guard ? kCanary : kSentinel)) return false;
  }
  return true;
}

// What the calls pass as k and v when kv_dtype is not F32 (the typed
// caches of the low-precision cases below).
const void* g_k_typed = nullptr;
const void* g_v_typed = nullptr;

// The call under test on g_q: qkv_attention_f32 on g_k and g_v for F32
// caches, qkv_attention on the typed caches otherwise.
qkv_status Attend(const qkv_attention_desc& d, float* out, float* w, float* lse,
                  void* ws, size_t ws_size) {
  if (d.kv_dtype == QKV_DTYPE_F32) {
    return qkv_attention_f32(&d, g_q, g_k, g_v, out, w, lse, ws, ws_size);
  }
  return qkv_attention(&d, g_q, g_k_typed, g_v_typed, out, w, lse, ws, ws_size);
}

// The call in the static buffers with its guards: first with a workspace one
// byte short (refused, nothing written), then in full (OK, nothing written
// before or past the workspace or outside an output). n_out, n_w and n_r
// count out, weights and lse. False when the call failed.
bool CallGuarded(const qkv_attention_desc& d, float* out, float* w,
                 float* lse, size_t ws, int n_out, int n_w, int n_r) {
  Poison(g_out, n_out);
  Poison(g_w, n_w);
  Poison(g_lse, n_r);
  qkv_status st = Attend(d, out, w, lse, g_ws + 1, ws - 1);
  if (st != QKV_ERR_WORKSPACE_TOO_SMALL) Fail("short workspace status", st, 2);
  Check(Untouched(g_out, n_out, true) && Untouched(g_w, n_w, true) &&
            Untouched(g_lse, n_r, true),
        "a refused call wrote an output");

  memset(g_ws, 0xA5, sizeof g_ws);
  st = Attend(d, out, w, lse, g_ws + 1, ws);
  if (st != QKV_OK) {
    Fail("status", st, 0);
    return false;
  }
  Check(g_ws[0] == 0xA5, "wrote before the workspace");
  for (size_t i = ws + 1; i < ws + 1 + 64 && i < sizeof g_ws; ++i) {
    if (g_ws[i] != 0xA5) {
      Check(false, "wrote past the workspace");
      break;
    }
  }
  Check(Untouched(g_out, n_out, false) && Untouched(g_w, n_w, false) &&
            Untouched(g_lse, n_r, false),
        "wrote outside an output");
  return true;
}

// ------------------------------------------------------------------- oracle
bool Visible(const qkv_attention_desc& d, int64_t b, int64_t i, int64_t j) {
  if ((d.mask & QKV_MASK_CAUSAL) && j > i + d.kv_len - d.q_len) return false;
  if (d.mask & QKV_MASK_VALID_LENS) {
    const int32_t len =
        d.valid_lens[d.valid_lens_per_query ? b * d.q_len + i : b];
    if (j >= len) return false;
  }
  return true;
}

void Oracle(const qkv_attention_desc& d) {
  const int64_t group = d.q_heads / d.kv_heads;
  const int64_t hd = d.head_dim, dv = d.value_dim, lk = d.kv_len;
  const int64_t hidden = d.score == QKV_SCORE_ADDITIVE ? d.additive_hidden : 0;
  for (int64_t r = 0; r < d.batch * d.kv_heads * lk && hidden > 0; ++r) {
    for (int64_t u = 0; u < hidden; ++u) {
      double acc = 0;
      for (int64_t c = 0; c < hd; ++c) {
        acc += static_cast<double>(d.additive_w_k[u * hd + c]) * g_k[r * hd + c];
      }
      g_kproj[r * hidden + u] = acc;
    }
  }
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.q_heads; ++h) {
      const int64_t kvh = b * d.kv_heads + h / group;
      for (int64_t i = 0; i < d.q_len; ++i) {
        const int64_t row = (b * d.q_heads + h) * d.q_len + i;
        const float* q = g_q + row * hd;
        double qproj[kMaxHidden];
        for (int64_t u = 0; u < hidden; ++u) {
          double acc = 0;
          for (int64_t c = 0; c < hd; ++c) {
            acc += static_cast<double>(d.additive_w_q[u * hd + c]) * q[c];
          }
          qproj[u] = acc;
        }
        double mx = -INFINITY;
        bool any = false;
        for (int64_t j = 0; j < lk; ++j) {
          g_visible[j] = 0;
          if (!Visible(d, b, i, j)) continue;
          double bias = 0;
          if (d.mask & QKV_MASK_BIAS) {
            const float bv = d.bias[b * d.bias_batch_stride +
                                    h * d.bias_head_stride + i * lk + j];
            if (bv == -INFINITY) continue;
            bias = bv;
          }
          const float* k = g_k + (kvh * lk + j) * hd;
          double s = 0;
          if (d.score == QKV_SCORE_DOT) {
            for (int64_t c = 0; c < hd; ++c) s += static_cast<double>(q[c]) * k[c];
            s *= d.scale;
          } else if (d.score == QKV_SCORE_GAUSSIAN) {
            for (int64_t c = 0; c < hd; ++c) {
              const double e = static_cast<double>(q[c]) - k[c];
              s += e * e;
            }
            s *= -static_cast<double>(d.scale);
          } else {
            const double* kp = g_kproj + (kvh * lk + j) * hidden;
            for (int64_t u = 0; u < hidden; ++u) {
              s += d.additive_w_v[u] * tanh(qproj[u] + kp[u]);
            }
          }
          s += bias;
          g_scores[j] = s;
          g_visible[j] = 1;
          if (!any || s > mx) mx = s;
          any = true;
        }
        for (int64_t c = 0; c < dv; ++c) g_ref_out[row * dv + c] = 0;
        for (int64_t j = 0; j < lk; ++j) g_ref_w[row * lk + j] = 0;
        g_ref_lse[row] = -INFINITY;
        if (!any) continue;
        double sum = 0;
        for (int64_t j = 0; j < lk; ++j) {
          if (g_visible[j]) sum += (g_scores[j] = exp(g_scores[j] - mx));
        }
        g_ref_lse[row] = mx + log(sum);
        for (int64_t j = 0; j < lk; ++j) {
          if (!g_visible[j]) continue;
          const double p = g_scores[j] / sum;
          g_ref_w[row * lk + j] = p;
          const float* v = g_v + (kvh * lk + j) * dv;
          for (int64_t c = 0; c < dv; ++c) g_ref_out[row * dv + c] += p * v[c];
        }
      }
    }
  }
}

// ------------------------------------------------------------------- checks
// A serial "pool" that runs the tasks backwards, spread over its workers.
void ReversePool(void* ctx, size_t n, qkv_task_fn fn, void* arg) {
  const size_t workers = *static_cast<const size_t*>(ctx);
  for (size_t t = n; t-- > 0;) fn(arg, t, t % workers);
}

size_t Rows(const qkv_attention_desc& d) {
  return static_cast<size_t>(d.batch * d.q_heads * d.q_len);
}

// Runs `d` (inputs in g_q, g_k, g_v) on the current backend and compares
// with the oracle: out within 5e-5 * max|v|, weights within 2e-5, lse within
// 1e-5 * (1 + |lse|); -inf lse exactly. Also checks the workspace query
// against QKV_REFERENCE_WORKSPACE_SIZE, a short workspace, and that 3
// workers in reverse order give the same bits.
void RunCase(const char* name, qkv_attention_desc d) {
  g_case = name;
  d.backend = g_backend;
  const size_t rows = Rows(d);
  const int n_out = static_cast<int>(rows * d.value_dim);
  const int n_w = static_cast<int>(rows * d.kv_len);
  const int n_v = static_cast<int>(d.batch * d.kv_heads * d.kv_len * d.value_dim);
  if (n_out > kMaxOut || n_w > kMaxW || rows > kMaxRows || d.kv_len > kMaxKv) {
    Check(false, "case too large for the buffers");
    return;
  }
  Oracle(d);

  // The macro holds for the microcontroller backends (on the host, the
  // SIMD backends need more and are checked against the query only).
  const bool mcu_backend =
      strcmp(g_backend, "reference") == 0 || strcmp(g_backend, "helium") == 0;
  const size_t ws = qkv_attention_workspace_size(&d);
  const size_t want_ws = QKV_REFERENCE_WORKSPACE_SIZE(
      d.kv_len, d.score == QKV_SCORE_ADDITIVE ? d.additive_hidden : 0, 1);
  if (mcu_backend && ws != want_ws) {
    Fail("workspace query != QKV_REFERENCE_WORKSPACE_SIZE", ws, want_ws);
  }
  if (ws > kMaxWs) {
    Check(false, "workspace larger than the static buffer");
    return;
  }
  float* out = g_out + kGuard;
  float* w = g_w + kGuard;
  float* lse = g_lse + kGuard;

  if (!CallGuarded(d, out, w, lse, ws, n_out, n_w, static_cast<int>(rows))) {
    return;
  }

  double max_v = 0;
  for (int i = 0; i < n_v; ++i) {
    // A plain compare: GCC 12's aarch64 vectorizer crashes on an fmax
    // reduction here (internal compiler error in vect_transform_reduction).
    const double a = fabs(static_cast<double>(g_v[i]));
    if (a > max_v) max_v = a;
  }
  const double tol_out = 5e-5 * (max_v > 0 ? max_v : 1);
  for (int i = 0; i < n_out; ++i) {
    ++g_checks;
    if (!(fabs(out[i] - g_ref_out[i]) <= tol_out)) {
      Fail("out", out[i], g_ref_out[i]);
      break;
    }
  }
  CheckWeightsAndLse(w, n_w, lse, static_cast<int64_t>(rows));

  // Three workers, tasks in reverse: bitwise the same (the macro covers the
  // bigger workspace too).
  static float out2[kMaxOut];
  size_t workers = 3;
  qkv_attention_desc dp = d;
  dp.parallel_for = &ReversePool;
  dp.parallel_ctx = &workers;
  dp.num_workers = workers;
  const size_t ws3 = qkv_attention_workspace_size(&dp);
  const size_t want3 = QKV_REFERENCE_WORKSPACE_SIZE(
      d.kv_len, d.score == QKV_SCORE_ADDITIVE ? d.additive_hidden : 0, 3);
  if (mcu_backend && ws3 != want3) Fail("3-worker workspace != macro", ws3, want3);
  if (ws3 <= sizeof g_ws) {
    const qkv_status st = Attend(dp, out2, nullptr, nullptr, g_ws, ws3);
    Check(st == QKV_OK && memcmp(out, out2, n_out * sizeof(float)) == 0,
          "3 workers in reverse order differ from one");
  }
}

qkv_attention_desc Desc(int64_t b, int64_t hq, int64_t hkv, int64_t lq,
                        int64_t lk, int64_t d, int64_t dv, uint32_t seed) {
  qkv_attention_desc desc;
  qkv_attention_desc_init(&desc, b, hq, hkv, lq, lk, d, dv);
  if (b * hq * lq * d > kMaxIn || b * hkv * lk * d > kMaxIn ||
      b * hkv * lk * dv > kMaxIn) {
    g_case = "Desc";
    Check(false, "inputs too large for the buffers");
    desc.batch = 0;  // RunCase then fails on the status, nothing overflows
    return desc;
  }
  g_rng = seed;
  Fill(g_q, static_cast<int>(b * hq * lq * d), 1.0f);
  Fill(g_k, static_cast<int>(b * hkv * lk * d), 1.0f);
  Fill(g_v, static_cast<int>(b * hkv * lk * dv), 1.0f);
  return desc;
}

void OracleCases() {
  qkv_attention_desc d;
  // Sizes around the 4-lane vectors (3, 4, 5, 7, 9) and the 16-row tasks.
  d = Desc(1, 1, 1, 5, 7, 8, 6, 11);
  RunCase("dot_plain", d);
  d = Desc(2, 2, 2, 17, 9, 5, 7, 12);
  RunCase("dot_b2_h2_q17", d);
  d = Desc(1, 2, 2, 4, 13, 3, 9, 13);
  d.mask = QKV_MASK_CAUSAL;
  RunCase("causal_kv_longer", d);
  d = Desc(1, 1, 1, 9, 9, 16, 4, 14);
  d.mask = QKV_MASK_CAUSAL;
  RunCase("causal_square", d);
  d = Desc(1, 1, 1, 6, 3, 4, 4, 15);
  d.mask = QKV_MASK_CAUSAL;  // q_len > kv_len: the first rows see nothing
  RunCase("causal_fully_masked_rows", d);

  d = Desc(3, 2, 1, 3, 10, 8, 5, 16);
  d.mask = QKV_MASK_VALID_LENS;
  g_lens[0] = 10, g_lens[1] = 0, g_lens[2] = 4;  // a whole batch masked
  d.valid_lens = g_lens;
  RunCase("valid_lens_per_batch", d);
  d = Desc(2, 1, 1, 4, 8, 4, 4, 17);
  d.mask = QKV_MASK_VALID_LENS;
  const int32_t lens[8] = {8, 1, 0, 5, 3, 7, 2, 6};
  memcpy(g_lens, lens, sizeof lens);
  d.valid_lens = g_lens;
  d.valid_lens_per_query = 1;
  RunCase("valid_lens_per_query", d);

  d = Desc(2, 2, 2, 5, 11, 6, 6, 18);
  d.mask = QKV_MASK_BIAS;
  g_rng = 99;
  Fill(g_bias, 2 * 5 * 11, 2.0f);
  for (int j = 0; j < 11; ++j) g_bias[2 * 11 + j] = -INFINITY;  // row 2 hidden
  g_bias[11 + 3] = -INFINITY;
  d.bias = g_bias;
  d.bias_batch_stride = 0;  // broadcast over batch
  d.bias_head_stride = 5 * 11;
  RunCase("bias_neg_inf_rows", d);

  d = Desc(2, 4, 2, 6, 9, 7, 5, 19);
  d.mask = QKV_MASK_CAUSAL | QKV_MASK_VALID_LENS | QKV_MASK_BIAS;
  g_lens[0] = 6, g_lens[1] = 9;
  d.valid_lens = g_lens;
  g_rng = 7;
  Fill(g_bias, 6 * 9, 1.0f);
  d.bias = g_bias;
  RunCase("all_masks_gqa2", d);

  d = Desc(1, 6, 1, 3, 12, 4, 8, 20);
  RunCase("mqa_6_to_1", d);
  d = Desc(1, 4, 2, 1, 15, 32, 32, 21);
  d.mask = QKV_MASK_CAUSAL;
  RunCase("decode_gqa2_d32", d);

  d = Desc(1, 2, 1, 5, 9, 5, 3, 22);
  d.score = QKV_SCORE_GAUSSIAN;
  d.scale = 0.5f;
  RunCase("gaussian", d);
  d = Desc(1, 2, 2, 4, 6, 6, 4, 23);
  d.score = QKV_SCORE_ADDITIVE;
  d.additive_hidden = 5;
  g_rng = 5;
  Fill(g_wq, 5 * 6, 1.0f);
  Fill(g_wk, 5 * 6, 1.0f);
  Fill(g_wv, 5, 1.0f);
  d.additive_w_q = g_wq;
  d.additive_w_k = g_wk;
  d.additive_w_v = g_wv;
  d.mask = QKV_MASK_CAUSAL;
  RunCase("additive_causal", d);

  d = Desc(1, 1, 1, 4, 7, 4, 4, 24);
  d.scale = 0.0f;
  RunCase("scale_zero_average_pooling", d);
  // Logits near 1e4: a naive exp overflows; softmax must not.
  d = Desc(1, 1, 1, 4, 8, 8, 4, 25);
  for (int i = 0; i < 4 * 8; ++i) g_q[i] *= 60.0f;
  for (int i = 0; i < 8 * 8; ++i) g_k[i] *= 60.0f;
  d.scale = 1.0f;
  RunCase("huge_logits", d);
  d = Desc(1, 1, 1, 16, 64, 4, 4, 26);  // the largest key count
  d.mask = QKV_MASK_CAUSAL;
  RunCase("kv64", d);
}

// ---------------------------------------------------------------- bad input
void BadCase(const char* what, const qkv_attention_desc* d, const float* q,
             const float* k, const float* v, float* out, void* ws,
             size_t ws_size, qkv_status want) {
  g_case = what;
  Poison(g_out, kMaxOut);
  Poison(g_w, kMaxW);
  Poison(g_lse, kMaxRows);
  const qkv_status st = qkv_attention_f32(d, q, k, v, out, g_w + kGuard,
                                          g_lse + kGuard, ws, ws_size);
  if (st != want) Fail("status", st, want);
  Check(Untouched(g_out, kMaxOut, true) && Untouched(g_w, kMaxW, true) &&
            Untouched(g_lse, kMaxRows, true),
        "bad input wrote an output");
}

void BadInputCases() {
  qkv_attention_desc good = Desc(1, 2, 1, 4, 5, 4, 4, 30);
  // The reference backend, whose workspace fits g_ws on every build (a host
  // SIMD backend may need more than g_ws, which would then overlap outputs).
  good.backend = "reference";
  float* out = g_out + kGuard;
  const size_t ws = qkv_attention_workspace_size(&good);
  const qkv_status kInvalid = QKV_ERR_INVALID_ARGUMENT;
  qkv_attention_desc d;

  BadCase("null_desc", nullptr, g_q, g_k, g_v, out, g_ws, ws, kInvalid);
  BadCase("null_q", &good, nullptr, g_k, g_v, out, g_ws, ws, kInvalid);
  BadCase("null_out", &good, g_q, g_k, g_v, nullptr, g_ws, ws, kInvalid);
  d = good, d.struct_size = 0;
  BadCase("struct_size_0", &d, g_q, g_k, g_v, out, g_ws, ws, kInvalid);
  d = good, d.kv_len = -1;  // 0 is valid since 0.2
  BadCase("kv_len_negative", &d, g_q, g_k, g_v, out, g_ws, ws, kInvalid);
  d = good, d.head_dim = -1;
  BadCase("head_dim_negative", &d, g_q, g_k, g_v, out, g_ws, ws, kInvalid);
  d = good, d.q_heads = 3, d.kv_heads = 2;
  BadCase("heads_not_divisible", &d, g_q, g_k, g_v, out, g_ws, ws, kInvalid);
  d = good, d.mask = 32;  // 8 and 16 are 0.2's WINDOW and KV_START
  BadCase("unknown_mask_bit", &d, g_q, g_k, g_v, out, g_ws, ws, kInvalid);
  d = good;
  const int bad_score = 7;
  memcpy(&d.score, &bad_score, sizeof bad_score);
  BadCase("unknown_score", &d, g_q, g_k, g_v, out, g_ws, ws, kInvalid);
  d = good, d.scale = NAN;
  BadCase("nan_scale", &d, g_q, g_k, g_v, out, g_ws, ws, kInvalid);
  d = good, d.batch = INT64_C(1) << 40, d.q_len = INT64_C(1) << 40;
  BadCase("element_count_overflow", &d, g_q, g_k, g_v, out, g_ws, ws, kInvalid);
  d = good, d.mask = QKV_MASK_VALID_LENS;
  BadCase("valid_lens_null", &d, g_q, g_k, g_v, out, g_ws, ws, kInvalid);
  g_lens[0] = 6;  // > kv_len
  d.valid_lens = g_lens;
  BadCase("valid_len_out_of_range", &d, g_q, g_k, g_v, out, g_ws, ws, kInvalid);
  d = good, d.mask = QKV_MASK_BIAS;
  BadCase("bias_null", &d, g_q, g_k, g_v, out, g_ws, ws, kInvalid);
  d = good, d.score = QKV_SCORE_ADDITIVE, d.additive_hidden = 4;
  BadCase("additive_without_weights", &d, g_q, g_k, g_v, out, g_ws, ws, kInvalid);
  d = good, d.parallel_for = &ReversePool, d.num_workers = 0;
  BadCase("pool_without_workers", &d, g_q, g_k, g_v, out, g_ws, ws, kInvalid);
  BadCase("out_overlaps_q", &good, g_q, g_k, g_v, g_q + 4, g_ws, ws, kInvalid);
  BadCase("null_workspace_nonzero_size", &good, g_q, g_k, g_v, out, nullptr,
          ws, kInvalid);
  d = good, d.backend = "no-such-backend";
  BadCase("unknown_backend", &d, g_q, g_k, g_v, out, g_ws, ws,
          QKV_ERR_UNSUPPORTED);
  BadCase("workspace_too_small", &good, g_q, g_k, g_v, out, g_ws, ws - 1,
          QKV_ERR_WORKSPACE_TOO_SMALL);
  d = good, d.scale = INFINITY;  // invalid beats a small workspace
  BadCase("invalid_before_workspace", &d, g_q, g_k, g_v, out, g_ws, 0, kInvalid);
  Check(qkv_attention_workspace_size(nullptr) == 0, "workspace of NULL desc");
  Check(qkv_status_string(static_cast<qkv_status>(42)) != nullptr,
        "status string of an unknown value");
}

// ------------------------------------------------------------------- merge
// Attention over keys [0, 23) and [23, 40) of one head, merged, against the
// call over all 40 keys (the forward's bound); bitwise commutative.
void MergeCases() {
  g_case = "merge";
  constexpr int kQ = 6, kKv = 40, kCut = 23, kD = 8, kV = 5;
  float* q = g_q;
  float* k = g_k;
  float* v = g_v;
  Fill(q, kQ * kD, 2.0f);
  Fill(k, kKv * kD, 1.0f);
  Fill(v, kKv * kV, 1.0f);
  static float out[3][kQ * kV], lse[3][kQ];
  const int64_t lens[3] = {kKv, kCut, kKv - kCut};
  const float* ks[3] = {k, k, k + kCut * kD};
  const float* vs[3] = {v, v, v + kCut * kV};
  for (int c = 0; c < 3; ++c) {
    qkv_attention_desc d;
    qkv_attention_desc_init(&d, 1, 1, 1, kQ, lens[c], kD, kV);
    d.backend = g_backend;
    Check(qkv_attention_f32(&d, q, ks[c], vs[c], out[c], nullptr, lse[c], g_ws,
                            sizeof g_ws) == QKV_OK,
          "merge: a chunk's call");
  }
  static float ab[kQ * kV], ab_lse[kQ], ba[kQ * kV], ba_lse[kQ];
  memcpy(ab, out[2], sizeof ab);
  memcpy(ab_lse, lse[2], sizeof ab_lse);
  memcpy(ba, out[1], sizeof ba);
  memcpy(ba_lse, lse[1], sizeof ba_lse);
  Check(qkv_attention_merge_f32(kQ, kV, out[1], lse[1], ab, ab_lse) == QKV_OK &&
            qkv_attention_merge_f32(kQ, kV, out[2], lse[2], ba, ba_lse) == QKV_OK,
        "merge: status");
  Check(memcmp(ab, ba, sizeof ab) == 0 && memcmp(ab_lse, ba_lse, sizeof ab_lse) == 0,
        "merge: bitwise commutative");
  for (int i = 0; i < kQ * kV; ++i) {
    if (fabs(ab[i] - out[0][i]) > 1e-4) Fail("merge: out", ab[i], out[0][i]);
  }
  for (int i = 0; i < kQ; ++i) {
    if (fabs(ab_lse[i] - lse[0][i]) > 1e-5 * (1 + fabs(lse[0][i]))) {
      Fail("merge: lse", ab_lse[i], lse[0][i]);
    }
  }
  Check(qkv_attention_merge_f32(-1, kV, out[1], lse[1], ab, ab_lse) ==
            QKV_ERR_INVALID_ARGUMENT,
        "merge: rows -1");
}

// ----------------------------------------------------------- 0.2 variants
// The descriptor fields of 0.2 (strides, positions, window, kv_start,
// softcap, ALiBi, sinks) on every microcontroller backend, against a
// double-precision oracle of their own written from include/qkv/qkv.h.
// Inputs are NaN wherever the strides leave a gap, so a backend that reads
// one spoils its results; outputs must leave their gaps untouched.

// A [batch][head][token][dim] layout in elements (qkv_strides, all 0: dense).
struct Layout {
  int64_t sb, sh, st;
};

Layout LayoutOf(const qkv_strides& s, int64_t heads, int64_t len, int64_t dim) {
  if (s.batch == 0 && s.head == 0 && s.token == 0) {
    return Layout{heads * len * dim, len * dim, dim};
  }
  return Layout{s.batch, s.head, s.token};
}

int64_t At(const Layout& l, int64_t b, int64_t h, int64_t t) {
  return b * l.sb + h * l.sh + t * l.st;
}

// One past the last element of the layout (every size positive).
int64_t Extent(const Layout& l, int64_t batch, int64_t heads, int64_t len,
               int64_t dim) {
  return At(l, batch - 1, heads - 1, len - 1) + dim;
}

Layout QLayout(const qkv_attention_desc& d) {
  return LayoutOf(d.q_strides, d.q_heads, d.q_len, d.head_dim);
}
Layout KLayout(const qkv_attention_desc& d) {
  return LayoutOf(d.k_strides, d.kv_heads, d.kv_len, d.head_dim);
}
Layout VLayout(const qkv_attention_desc& d) {
  return LayoutOf(d.v_strides, d.kv_heads, d.kv_len, d.value_dim);
}
Layout OutLayout(const qkv_attention_desc& d) {
  return LayoutOf(d.out_strides, d.q_heads, d.q_len, d.value_dim);
}

// Fills g_q, g_k and g_v for d's layouts: NaN everywhere, then values in
// [-mag, mag) at the elements the layouts address. Returns false (and
// fails the case) when a layout does not fit the buffers.
bool FillVariantInputs(const qkv_attention_desc& d, uint32_t seed, float mag) {
  const Layout lq = QLayout(d), lk = KLayout(d), lv = VLayout(d);
  if (Extent(lq, d.batch, d.q_heads, d.q_len, d.head_dim) > kMaxIn ||
      Extent(lk, d.batch, d.kv_heads, d.kv_len, d.head_dim) > kMaxIn ||
      Extent(lv, d.batch, d.kv_heads, d.kv_len, d.value_dim) > kMaxIn) {
    Check(false, "variant inputs too large for the buffers");
    return false;
  }
  const float nan = NAN;
  for (int i = 0; i < kMaxIn; ++i) g_q[i] = g_k[i] = g_v[i] = nan;
  g_rng = seed;
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.q_heads; ++h) {
      for (int64_t t = 0; t < d.q_len; ++t) {
        Fill(g_q + At(lq, b, h, t), static_cast<int>(d.head_dim), mag);
      }
    }
    for (int64_t h = 0; h < d.kv_heads; ++h) {
      for (int64_t t = 0; t < d.kv_len; ++t) {
        Fill(g_k + At(lk, b, h, t), static_cast<int>(d.head_dim), mag);
        Fill(g_v + At(lv, b, h, t), static_cast<int>(d.value_dim), 1.0f);
      }
    }
  }
  return true;
}

// g_ref_out (dense [row][value_dim]), g_ref_w and g_ref_lse for d, DOT or
// GAUSSIAN scores. Positions, masks, the score epilogue and the sink as
// include/qkv/qkv.h states them.
void VariantOracle(const qkv_attention_desc& d) {
  const int64_t group = d.q_heads / d.kv_heads;
  const int64_t hd = d.head_dim, dv = d.value_dim, lk = d.kv_len;
  const Layout lq = QLayout(d), lkl = KLayout(d), lv = VLayout(d);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.q_heads; ++h) {
      for (int64_t i = 0; i < d.q_len; ++i) {
        const int64_t row = (b * d.q_heads + h) * d.q_len + i;
        const int64_t pos =
            d.q_pos != nullptr ? int64_t{d.q_pos[b]} + i : lk - d.q_len + i;
        const float* q = g_q + At(lq, b, h, i);
        double mx = -INFINITY;
        bool any = false;
        for (int64_t j = 0; j < lk; ++j) {
          g_visible[j] = 0;
          if ((d.mask & QKV_MASK_CAUSAL) && j > pos) continue;
          if (d.mask & QKV_MASK_VALID_LENS) {
            const int32_t len =
                d.valid_lens[d.valid_lens_per_query ? b * d.q_len + i : b];
            if (j >= len) continue;
          }
          if (d.mask & QKV_MASK_WINDOW) {
            if (d.window_left >= 0 && j < pos - d.window_left) continue;
            if (d.window_right >= 0 && j > pos + d.window_right) continue;
          }
          if ((d.mask & QKV_MASK_KV_START) && j < d.kv_start[b]) continue;
          double bias = 0;
          if (d.mask & QKV_MASK_BIAS) {
            const float bv = d.bias[b * d.bias_batch_stride +
                                    h * d.bias_head_stride + i * lk + j];
            if (bv == -INFINITY) continue;
            bias = bv;
          }
          const float* k = g_k + At(lkl, b, h / group, j);
          double s = 0;
          for (int64_t c = 0; c < hd; ++c) {
            if (d.score == QKV_SCORE_GAUSSIAN) {
              const double e = static_cast<double>(q[c]) - k[c];
              s += e * e;
            } else {
              s += static_cast<double>(q[c]) * k[c];
            }
          }
          s *= d.score == QKV_SCORE_GAUSSIAN ? -static_cast<double>(d.scale)
                                             : d.scale;
          if (d.softcap > 0) s = d.softcap * tanh(s / d.softcap);
          s += bias;
          if (d.alibi_slopes != nullptr) {
            s -= d.alibi_slopes[h] * fabs(static_cast<double>(pos - j));
          }
          g_scores[j] = s;
          g_visible[j] = 1;
          if (!any || s > mx) mx = s;
          any = true;
        }
        for (int64_t c = 0; c < dv; ++c) g_ref_out[row * dv + c] = 0;
        for (int64_t j = 0; j < lk; ++j) g_ref_w[row * lk + j] = 0;
        g_ref_lse[row] = -INFINITY;
        const double sink = d.sinks != nullptr ? d.sinks[h] : -INFINITY;
        const double m = any && mx > sink ? mx : sink;
        if (m == -INFINITY) continue;  // no key and no sink
        double den = sink == -INFINITY ? 0 : exp(sink - m);
        for (int64_t j = 0; j < lk; ++j) {
          if (g_visible[j]) den += (g_scores[j] = exp(g_scores[j] - m));
        }
        g_ref_lse[row] = m + log(den);
        for (int64_t j = 0; j < lk; ++j) {
          if (!g_visible[j]) continue;
          const double p = g_scores[j] / den;
          g_ref_w[row * lk + j] = p;
          const float* v = g_v + At(lv, b, h / group, j);
          for (int64_t c = 0; c < dv; ++c) g_ref_out[row * dv + c] += p * v[c];
        }
      }
    }
  }
}

// Runs d (inputs from FillVariantInputs) on the current backend and checks
// it as RunCase does, out through its layout: every addressed element
// against the oracle, every gap left as it was.
void RunVariantCase(const char* name, qkv_attention_desc d) {
  g_case = name;
  d.backend = g_backend;
  const int64_t rows = static_cast<int64_t>(Rows(d));
  const int64_t dv = d.value_dim;
  const Layout lo = OutLayout(d);
  const int64_t n_out = Extent(lo, d.batch, d.q_heads, d.q_len, dv);
  const int n_w = static_cast<int>(rows * d.kv_len);
  if (n_out > kMaxOut || n_w > kMaxW || rows > kMaxRows || d.kv_len > kMaxKv ||
      rows * dv > kMaxOut) {
    Check(false, "case too large for the buffers");
    return;
  }
  VariantOracle(d);

  const bool mcu_backend =
      strcmp(g_backend, "reference") == 0 || strcmp(g_backend, "helium") == 0;
  const size_t ws = qkv_attention_workspace_size(&d);
  const size_t want_ws = QKV_REFERENCE_WORKSPACE_SIZE(d.kv_len, 0, 1);
  if (mcu_backend && ws != want_ws) {
    Fail("workspace query != QKV_REFERENCE_WORKSPACE_SIZE", ws, want_ws);
  }
  if (ws == 0 || ws > kMaxWs) {
    Check(false, "workspace outside the static buffer");
    return;
  }
  float* out = g_out + kGuard;
  float* w = g_w + kGuard;
  float* lse = g_lse + kGuard;
  const int n_o = static_cast<int>(n_out), n_r = static_cast<int>(rows);

  if (!CallGuarded(d, out, w, lse, ws, n_o, n_w, n_r)) return;

  // Which elements of out the layout addresses; the rest must keep the
  // sentinel.
  static unsigned char addressed[kMaxOut];
  memset(addressed, 0, sizeof addressed);
  const Layout lv = VLayout(d);
  double max_v = 0;
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.kv_heads; ++h) {
      for (int64_t t = 0; t < d.kv_len; ++t) {
        for (int64_t c = 0; c < dv; ++c) {
          const double a = fabs(static_cast<double>(g_v[At(lv, b, h, t) + c]));
          if (a > max_v) max_v = a;
        }
      }
    }
  }
  const double tol_out = 5e-5 * (max_v > 0 ? max_v : 1);
  bool out_ok = true;
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.q_heads; ++h) {
      for (int64_t i = 0; i < d.q_len; ++i) {
        const int64_t row = (b * d.q_heads + h) * d.q_len + i;
        for (int64_t c = 0; c < dv; ++c) {
          const int64_t at = At(lo, b, h, i) + c;
          addressed[at] = 1;
          ++g_checks;
          if (out_ok && !(fabs(out[at] - g_ref_out[row * dv + c]) <= tol_out)) {
            Fail("out", out[at], g_ref_out[row * dv + c]);
            out_ok = false;
          }
        }
      }
    }
  }
  for (int64_t at = 0; at < n_out; ++at) {
    uint32_t bits;
    memcpy(&bits, &out[at], 4);
    if (!addressed[at] && bits != kSentinel) {
      Check(false, "wrote into a gap of out");
      break;
    }
  }
  CheckWeightsAndLse(w, n_w, lse, rows);

  // Three workers, tasks in reverse: the same bits at every addressed
  // element.
  static float out2[kMaxOut];
  size_t workers = 3;
  qkv_attention_desc dp = d;
  dp.parallel_for = &ReversePool;
  dp.parallel_ctx = &workers;
  dp.num_workers = workers;
  const size_t ws3 = qkv_attention_workspace_size(&dp);
  if (ws3 <= sizeof g_ws) {
    memcpy(out2, out, static_cast<size_t>(n_out) * sizeof(float));
    for (int64_t at = 0; at < n_out; ++at) {
      if (addressed[at]) out2[at] = -1.0f;
    }
    const qkv_status st = Attend(dp, out2, nullptr, nullptr, g_ws, ws3);
    const size_t bytes = static_cast<size_t>(n_out) * sizeof(float);
    Check(st == QKV_OK && memcmp(out, out2, bytes) == 0,
          "3 workers in reverse order differ from one");
  }
}

void VariantCases() {
  static int32_t pos[4], starts[4], lens[4];
  static float slopes[4], sinks[4];
  qkv_attention_desc d;

  // Windows: rows see [pos - 3, pos + 1], lo > 0 for all but the first.
  qkv_attention_desc_init(&d, 1, 4, 2, 6, 13, 5, 6);
  d.mask = QKV_MASK_WINDOW;
  d.window_left = 3, d.window_right = 1;
  if (FillVariantInputs(d, 40, 1.0f)) RunVariantCase("window_lo_gqa2", d);
  // An unbounded left side and positions before the first key: the first
  // rows of batch 0 see nothing.
  qkv_attention_desc_init(&d, 2, 1, 1, 5, 12, 4, 4);
  d.mask = QKV_MASK_WINDOW;
  d.window_left = -1, d.window_right = 2;
  pos[0] = -4, pos[1] = 6;
  d.q_pos = pos;
  if (FillVariantInputs(d, 41, 1.0f)) RunVariantCase("window_right_q_pos", d);
  // Mistral's causal window {w, 0} over 33 keys (vector and task edges).
  qkv_attention_desc_init(&d, 1, 1, 1, 17, 33, 8, 9);
  d.mask = QKV_MASK_WINDOW | QKV_MASK_CAUSAL;
  d.window_left = 6, d.window_right = 0;
  if (FillVariantInputs(d, 42, 1.0f)) RunVariantCase("window_causal_6", d);

  // Positions: causal from q_pos (past kv_len in batch 2), with valid
  // lengths.
  qkv_attention_desc_init(&d, 3, 2, 2, 4, 10, 7, 5);
  d.mask = QKV_MASK_CAUSAL | QKV_MASK_VALID_LENS;
  pos[0] = 6, pos[1] = 0, pos[2] = 20;
  lens[0] = 10, lens[1] = 4, lens[2] = 7;
  d.q_pos = pos;
  d.valid_lens = lens;
  if (FillVariantInputs(d, 43, 1.0f)) RunVariantCase("causal_q_pos", d);

  // kv_start: left padding, batch 2 all padding.
  qkv_attention_desc_init(&d, 3, 2, 1, 3, 9, 8, 5);
  d.mask = QKV_MASK_KV_START | QKV_MASK_CAUSAL;
  starts[0] = 0, starts[1] = 4, starts[2] = 9;
  d.kv_start = starts;
  if (FillVariantInputs(d, 44, 1.0f)) RunVariantCase("kv_start_causal", d);

  // Softcap before the bias: logits up to about +-20, capped at 4, then a
  // bias with -inf entries (row 2 of head 1 wholly hidden).
  qkv_attention_desc_init(&d, 1, 2, 2, 5, 11, 6, 6);
  d.scale = 1.0f;
  d.softcap = 4.0f;
  d.mask = QKV_MASK_BIAS;
  g_rng = 45;
  Fill(g_bias, 2 * 5 * 11, 2.0f);
  for (int j = 0; j < 11; ++j) g_bias[5 * 11 + 2 * 11 + j] = -INFINITY;
  g_bias[3] = -INFINITY;
  d.bias = g_bias;
  d.bias_head_stride = 5 * 11;
  if (FillVariantInputs(d, 46, 2.0f)) RunVariantCase("softcap_bias", d);
  qkv_attention_desc_init(&d, 1, 2, 1, 6, 9, 5, 3);
  d.score = QKV_SCORE_GAUSSIAN;
  d.scale = 0.5f;
  d.softcap = 1.5f;
  d.mask = QKV_MASK_CAUSAL;
  if (FillVariantInputs(d, 47, 1.0f)) RunVariantCase("softcap_gaussian", d);

  // ALiBi on both sides of the query's position (no mask), one head with
  // slope 0.
  qkv_attention_desc_init(&d, 2, 3, 3, 4, 14, 4, 3);
  slopes[0] = 0.5f, slopes[1] = 0.0625f, slopes[2] = 0.0f;
  d.alibi_slopes = slopes;
  pos[0] = 5, pos[1] = 20;
  d.q_pos = pos;
  if (FillVariantInputs(d, 48, 1.0f)) RunVariantCase("alibi_two_sided", d);
  // After softcap and bias, with causal.
  qkv_attention_desc_init(&d, 1, 2, 1, 7, 10, 9, 4);
  d.mask = QKV_MASK_CAUSAL | QKV_MASK_BIAS;
  g_rng = 49;
  Fill(g_bias, 7 * 10, 1.0f);
  d.bias = g_bias;
  slopes[0] = 0.25f, slopes[1] = 1.0f;
  d.alibi_slopes = slopes;
  d.softcap = 3.0f;
  if (FillVariantInputs(d, 50, 1.5f)) RunVariantCase("alibi_softcap_bias", d);
  // Positions near +-2^31: distances past int32 (lse shows a wrong one).
  qkv_attention_desc_init(&d, 2, 2, 1, 4, 8, 4, 4);
  pos[0] = INT32_MAX - 2, pos[1] = INT32_MIN;
  d.q_pos = pos;
  slopes[0] = 1e-9f, slopes[1] = 3e-10f;
  d.alibi_slopes = slopes;
  if (FillVariantInputs(d, 51, 1.0f)) RunVariantCase("alibi_far_positions", d);

  // Sinks: a finite one, none (-inf) and one that outweighs the keys; batch
  // 1 sees no key (out 0, weights 0, lse = the sink).
  qkv_attention_desc_init(&d, 2, 3, 1, 5, 7, 4, 4);
  sinks[0] = 0.5f, sinks[1] = -INFINITY, sinks[2] = 4.0f;
  d.sinks = sinks;
  d.mask = QKV_MASK_VALID_LENS;
  lens[0] = 7, lens[1] = 0;
  d.valid_lens = lens;
  if (FillVariantInputs(d, 52, 1.0f)) RunVariantCase("sinks_masked_batch", d);
  // Causal with q_len > kv_len: the first rows see nothing but the sink.
  qkv_attention_desc_init(&d, 1, 1, 1, 6, 3, 4, 4);
  sinks[0] = -1.0f;
  d.sinks = sinks;
  d.mask = QKV_MASK_CAUSAL;
  if (FillVariantInputs(d, 53, 1.0f)) RunVariantCase("sink_masked_rows", d);

  // Token-major layouts ([batch][token][head][dim]): K in a cache of
  // capacity 11 with rows padded to 8 floats, V dense token-major, q
  // token-major, out token-major with rows padded to 8.
  qkv_attention_desc_init(&d, 2, 4, 2, 3, 9, 5, 6);
  d.k_strides.batch = 11 * 2 * 8, d.k_strides.head = 8, d.k_strides.token = 16;
  d.v_strides.batch = 9 * 2 * 6, d.v_strides.head = 6, d.v_strides.token = 12;
  d.q_strides.batch = 3 * 4 * 5, d.q_strides.head = 5, d.q_strides.token = 20;
  d.out_strides.batch = 3 * 4 * 8, d.out_strides.head = 8,
  d.out_strides.token = 32;
  d.mask = QKV_MASK_CAUSAL;
  if (FillVariantInputs(d, 54, 1.0f)) RunVariantCase("strided_token_major", d);
  // One cache for the whole batch (batch strides 0), 16 columns of V.
  qkv_attention_desc_init(&d, 3, 2, 1, 2, 12, 4, 17);
  d.k_strides.batch = 0, d.k_strides.head = 0, d.k_strides.token = 4;
  d.v_strides.batch = 0, d.v_strides.head = 0, d.v_strides.token = 20;
  if (FillVariantInputs(d, 55, 1.0f)) RunVariantCase("strided_broadcast_kv", d);

  // Everything at once, strided, GQA 2.
  qkv_attention_desc_init(&d, 2, 4, 2, 5, 12, 6, 5);
  d.mask =
      QKV_MASK_WINDOW | QKV_MASK_KV_START | QKV_MASK_CAUSAL | QKV_MASK_BIAS;
  d.window_left = 5, d.window_right = 1;
  starts[0] = 2, starts[1] = 0;
  d.kv_start = starts;
  pos[0] = 6, pos[1] = 3;
  d.q_pos = pos;
  g_rng = 56;
  Fill(g_bias, 4 * 5 * 12, 1.0f);
  g_bias[7] = -INFINITY;
  d.bias = g_bias;
  d.bias_batch_stride = 0, d.bias_head_stride = 5 * 12;
  slopes[0] = 0.125f, slopes[1] = 0.0f, slopes[2] = 0.5f, slopes[3] = 0.03f;
  d.alibi_slopes = slopes;
  sinks[0] = 1.0f, sinks[1] = -INFINITY, sinks[2] = -2.0f, sinks[3] = 0.0f;
  d.sinks = sinks;
  d.softcap = 5.0f;
  d.k_strides.batch = 12 * 2 * 8, d.k_strides.head = 8, d.k_strides.token = 16;
  d.v_strides.batch = 12 * 2 * 5, d.v_strides.head = 12 * 5,
  d.v_strides.token = 5;
  d.out_strides.batch = 5 * 4 * 6, d.out_strides.head = 6,
  d.out_strides.token = 24;
  if (FillVariantInputs(d, 57, 2.0f)) RunVariantCase("all_variants", d);
}

// ------------------------------------------------ low-precision K and V
// F16, BF16 and I8 caches (qkv_attention's kv_dtype) on every
// microcontroller backend. A case's f32 K and V (from its setup, in its
// layouts) are converted by qkv_quantize_rows into typed caches with the
// same layouts (strides count elements of the type), and decoded back here,
// independently of the library, into g_k and g_v: the oracles' exact
// attention over those dequantized values is what the call must match, with
// the f32 bounds (the kernels add no error beyond f32 arithmetic). Gaps of
// the typed layouts hold NaN (F16, BF16) or 127 (I8), gaps of the I8 scale
// layouts NaN, so a backend that reads one spoils its results.
// QKV_LOW_PRECISION_KV (tests/mcu/CMakeLists.txt, from the library's option):
// whether the library serves these types; without them it must refuse
// them.
#ifndef QKV_LOW_PRECISION_KV
#define QKV_LOW_PRECISION_KV 1
#endif

constexpr int kMaxScales = 256;         // floats of each I8 scale layout
uint16_t g_k16[kMaxIn], g_v16[kMaxIn];  // F16 or BF16; I8 in their bytes
float g_k_scales[kMaxScales], g_v_scales[kMaxScales];

// IEEE binary16 and bfloat16 to float, written from their definitions.
float HalfToFloat(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  double mag;
  if (e == 0) {
    mag = ldexp(m, -24);  // subnormal (or zero)
  } else if (e == 31) {
    mag = m != 0 ? NAN : INFINITY;
  } else {
    mag = ldexp(1024 + m, e - 25);
  }
  return static_cast<float>((h & 0x8000) ? -mag : mag);
}

float BFloat16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

const char* DtypeName(qkv_dtype t) {
  return t == QKV_DTYPE_F16 ? "f16" : t == QKV_DTYPE_BF16 ? "bf16" : "i8";
}

// The I8 scale layout of one of K or V: {batch, head, token} strides, all 0
// meaning dense [batch][kv head][token].
Layout ScaleLayout(const qkv_strides& s, const qkv_attention_desc& d) {
  return LayoutOf(s, d.kv_heads, d.kv_len, 1);
}

// Converts the f32 rows of one of K or V (layout l, rows of n) into `type`
// at `typed`, then decodes every row back into f32 in place. Returns false
// when qkv_quantize_rows refuses a row or a layout does not fit.
bool QuantizeRows(const qkv_attention_desc& d, qkv_dtype type, const Layout& l,
                  const Layout& ls, int64_t n, float* f32, uint16_t* typed,
                  float* scales) {
  int8_t* i8 = reinterpret_cast<int8_t*>(typed);
  if (Extent(ls, d.batch, d.kv_heads, d.kv_len, 1) > kMaxScales) return false;
  const uint16_t nan16 = type == QKV_DTYPE_F16 ? 0x7E00 : 0x7FC0;
  for (int i = 0; i < kMaxIn; ++i) typed[i] = nan16;
  if (type == QKV_DTYPE_I8) memset(i8, 127, kMaxIn * sizeof(uint16_t));
  for (int i = 0; i < kMaxScales; ++i) scales[i] = NAN;
  // Every row first (a broadcast layout converts a row more than once, the
  // last conversion stays), then the decode of what is stored.
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t b = 0; b < d.batch; ++b) {
      for (int64_t h = 0; h < d.kv_heads; ++h) {
        for (int64_t t = 0; t < d.kv_len; ++t) {
          const int64_t at = At(l, b, h, t);
          float* scale =
              type == QKV_DTYPE_I8 ? scales + At(ls, b, h, t) : nullptr;
          if (pass == 0) {
            void* dst = type == QKV_DTYPE_I8 ? static_cast<void*>(i8 + at)
                                             : static_cast<void*>(typed + at);
            if (qkv_quantize_rows(type, 1, n, f32 + at, 0, dst, 0, scale) !=
                QKV_OK) {
              return false;
            }
            continue;
          }
          for (int64_t c = 0; c < n; ++c) {
            if (type == QKV_DTYPE_F16) {
              f32[at + c] = HalfToFloat(typed[at + c]);
            } else if (type == QKV_DTYPE_BF16) {
              f32[at + c] = BFloat16ToFloat(typed[at + c]);
            } else {
              f32[at + c] = *scale * static_cast<float>(i8[at + c]);
            }
          }
        }
      }
    }
  }
  return true;
}

// Makes d (inputs in g_q, g_k, g_v, laid out as d says) a call on `type`
// caches: the typed K and V, their scales (I8, in d's scale layouts) and the
// dequantized values in g_k and g_v for the oracles.
bool ToLowPrecision(qkv_attention_desc* d, qkv_dtype type) {
  d->kv_dtype = type;
  g_k_typed = g_k16;
  g_v_typed = g_v16;
  if (type == QKV_DTYPE_I8) {
    d->k_scales = g_k_scales;
    d->v_scales = g_v_scales;
  }
  const bool ok =
      QuantizeRows(*d, type, KLayout(*d), ScaleLayout(d->k_scale_strides, *d),
                   d->head_dim, g_k, g_k16, g_k_scales) &&
      QuantizeRows(*d, type, VLayout(*d), ScaleLayout(d->v_scale_strides, *d),
                   d->value_dim, g_v, g_v16, g_v_scales);
  if (!ok) Check(false, "low-precision inputs do not fit the buffers");
  return ok;
}

// Sets row t of (batch b, kv head h) of one of K or V (layout l, rows of n
// floats) to zeros but `big` at column c.
void SetRow(float* x, const Layout& l, int64_t b, int64_t h, int64_t t,
            int64_t n, int64_t c, float big) {
  for (int64_t i = 0; i < n; ++i) x[At(l, b, h, t) + i] = 0.0f;
  x[At(l, b, h, t) + c] = big;
}

// The cases of one type on the current backend.
void LowPrecisionCases(qkv_dtype type) {
  static char name[64];
  static int32_t pos[4], starts[4];
  static float slopes[4], sinks[4];
  const char* dt = DtypeName(type);
  qkv_attention_desc d;

  // GQA 2, causal, head_dim and value_dim off the 4 lanes, K in a
  // token-major cache of capacity 13 with rows padded to 8, V head-major
  // with rows padded to 7, scales with gaps.
  qkv_attention_desc_init(&d, 2, 4, 2, 5, 11, 6, 5);
  d.mask = QKV_MASK_CAUSAL;
  d.k_strides.batch = 13 * 2 * 8, d.k_strides.head = 8, d.k_strides.token = 16;
  d.v_strides.batch = 2 * 11 * 7, d.v_strides.head = 11 * 7,
  d.v_strides.token = 7;
  d.k_scale_strides.batch = 48, d.k_scale_strides.head = 1,
  d.k_scale_strides.token = 4;
  d.v_scale_strides.batch = 30, d.v_scale_strides.head = 13,
  d.v_scale_strides.token = 1;
  snprintf(name, sizeof name, "%s/strided_gqa2_causal", dt);
  if (FillVariantInputs(d, 60, 1.0f) && ToLowPrecision(&d, type)) {
    RunVariantCase(name, d);
  }

  // Decode, head_dim 32 (whole vectors) and value_dim 32 (16-column
  // blocks), GQA 2, 15 keys (a 3-key tail): a K row with one outlier (the
  // row's other values keep only a few I8 levels), a V row with one, and
  // all-zero rows (I8 scale 0); a -inf bias hides keys inside the rows of
  // heads 1 and 2 (a row with a zero weight adds its values key by key).
  qkv_attention_desc_init(&d, 1, 4, 2, 1, 15, 32, 32);
  d.mask = QKV_MASK_CAUSAL | QKV_MASK_BIAS;
  g_rng = 70;
  Fill(g_bias, 4 * 15, 0.5f);
  g_bias[15 + 4] = g_bias[2 * 15 + 11] = -INFINITY;
  d.bias = g_bias;
  d.bias_head_stride = 15;
  if (FillVariantInputs(d, 61, 1.0f)) {
    const Layout lk = KLayout(d), lv = VLayout(d);
    g_k[At(lk, 0, 0, 3) + 5] = 40.0f;
    g_v[At(lv, 0, 1, 7) + 9] = -12.0f;
    SetRow(g_k, lk, 0, 1, 2, 32, 0, 0.0f);
    SetRow(g_v, lv, 0, 0, 5, 32, 0, 0.0f);
    snprintf(name, sizeof name, "%s/decode_d32_outliers", dt);
    if (ToLowPrecision(&d, type)) RunVariantCase(name, d);
  }

  // Every variant at once, strided (the F32 all_variants case): window,
  // kv_start, causal, a bias with -inf (a hidden key inside the row's
  // interval), ALiBi, sinks, softcap.
  qkv_attention_desc_init(&d, 2, 4, 2, 5, 12, 6, 5);
  d.mask =
      QKV_MASK_WINDOW | QKV_MASK_KV_START | QKV_MASK_CAUSAL | QKV_MASK_BIAS;
  d.window_left = 5, d.window_right = 1;
  starts[0] = 2, starts[1] = 0;
  d.kv_start = starts;
  pos[0] = 6, pos[1] = 3;
  d.q_pos = pos;
  g_rng = 62;
  Fill(g_bias, 4 * 5 * 12, 1.0f);
  g_bias[7] = -INFINITY;
  d.bias = g_bias;
  d.bias_batch_stride = 0, d.bias_head_stride = 5 * 12;
  slopes[0] = 0.125f, slopes[1] = 0.0f, slopes[2] = 0.5f, slopes[3] = 0.03f;
  d.alibi_slopes = slopes;
  sinks[0] = 1.0f, sinks[1] = -INFINITY, sinks[2] = -2.0f, sinks[3] = 0.0f;
  d.sinks = sinks;
  d.softcap = 5.0f;
  d.k_strides.batch = 12 * 2 * 8, d.k_strides.head = 8, d.k_strides.token = 16;
  d.v_strides.batch = 12 * 2 * 5, d.v_strides.head = 12 * 5,
  d.v_strides.token = 5;
  d.out_strides.batch = 5 * 4 * 6, d.out_strides.head = 6,
  d.out_strides.token = 24;
  snprintf(name, sizeof name, "%s/all_variants", dt);
  if (FillVariantInputs(d, 63, 2.0f) && ToLowPrecision(&d, type)) {
    RunVariantCase(name, d);
  }

  // Gaussian scores with softcap and causal, K rows padded to 8.
  qkv_attention_desc_init(&d, 1, 2, 1, 6, 9, 5, 3);
  d.score = QKV_SCORE_GAUSSIAN;
  d.scale = 0.5f;
  d.softcap = 1.5f;
  d.mask = QKV_MASK_CAUSAL;
  d.k_strides.batch = 9 * 8, d.k_strides.head = 9 * 8, d.k_strides.token = 8;
  snprintf(name, sizeof name, "%s/gaussian_softcap", dt);
  if (FillVariantInputs(d, 64, 1.0f) && ToLowPrecision(&d, type)) {
    RunVariantCase(name, d);
  }

  // One cache (and one set of scales) for the whole batch, 17 columns of V
  // (a 16-column block and a tail).
  qkv_attention_desc_init(&d, 3, 2, 1, 2, 12, 4, 17);
  d.k_strides.batch = 0, d.k_strides.head = 0, d.k_strides.token = 4;
  d.v_strides.batch = 0, d.v_strides.head = 0, d.v_strides.token = 20;
  d.k_scale_strides.token = d.v_scale_strides.token = 1;
  snprintf(name, sizeof name, "%s/broadcast_dv17", dt);
  if (FillVariantInputs(d, 65, 1.0f) && ToLowPrecision(&d, type)) {
    RunVariantCase(name, d);
  }

  // Values around F16's subnormal range (below 2^-14 = 6.1e-5): K within
  // 1e-4 (a large scale makes its products the scores), V within 5e-5
  // (the out bound, 5e-5 * max|v|, is then far below the values, so a
  // flushed subnormal shows).
  qkv_attention_desc_init(&d, 1, 2, 1, 4, 10, 8, 4);
  d.scale = 2e4f;
  if (FillVariantInputs(d, 66, 1.0f)) {
    for (int i = 0; i < kMaxIn; ++i) g_k[i] *= 1e-4f, g_v[i] *= 5e-5f;
    snprintf(name, sizeof name, "%s/subnormal_f16_range", dt);
    if (ToLowPrecision(&d, type)) RunVariantCase(name, d);
  }

  // Additive scores (dense; the Helium backend hands them to the
  // reference task), against the first oracle.
  d = Desc(1, 2, 2, 4, 6, 6, 4, 67);
  d.score = QKV_SCORE_ADDITIVE;
  d.additive_hidden = 5;
  g_rng = 68;
  Fill(g_wq, 5 * 6, 1.0f);
  Fill(g_wk, 5 * 6, 1.0f);
  Fill(g_wv, 5, 1.0f);
  d.additive_w_q = g_wq;
  d.additive_w_k = g_wk;
  d.additive_w_v = g_wv;
  d.mask = QKV_MASK_CAUSAL;
  snprintf(name, sizeof name, "%s/additive_causal", dt);
  if (ToLowPrecision(&d, type)) RunCase(name, d);
}

// Refusals: I8 without scales is invalid, and so is any type but F32 at
// qkv_attention_f32; a build without the types (QKV_LOW_PRECISION_KV=0)
// refuses each as unsupported, I8 without scales too (it reads no scale
// pointer). Nothing is written.
void LowPrecisionRefusals(bool served) {
  qkv_attention_desc d = Desc(1, 2, 1, 4, 5, 4, 4, 69);
  d.backend = g_backend;
  g_k_typed = g_k16;
  g_v_typed = g_v16;
  memset(g_k16, 0, sizeof g_k16);
  memset(g_v16, 0, sizeof g_v16);
  const size_t ws = qkv_attention_workspace_size(&d);
  float* out = g_out + kGuard;
  for (int t = QKV_DTYPE_F16; t <= QKV_DTYPE_I8; ++t) {
    d.kv_dtype = static_cast<qkv_dtype>(t);
    d.k_scales = d.v_scales = nullptr;
    g_case = DtypeName(d.kv_dtype);
    Poison(g_out, 4 * 2 * 4);
    if (t == QKV_DTYPE_I8) {
      Check(Attend(d, out, nullptr, nullptr, g_ws, ws) ==
                (served ? QKV_ERR_INVALID_ARGUMENT : QKV_ERR_UNSUPPORTED),
            served ? "I8 without scales: invalid"
                   : "I8 without scales, types left out: unsupported");
      d.k_scales = d.v_scales = g_k_scales;
      for (int i = 0; i < 5; ++i) g_k_scales[i] = 1.0f;
    }
    if (!served) {
      Check(Attend(d, out, nullptr, nullptr, g_ws, ws) == QKV_ERR_UNSUPPORTED,
            "a type the build leaves out: unsupported");
    }
    Check(qkv_attention_f32(&d, g_q, g_k, g_v, out, nullptr, nullptr, g_ws,
                            ws) == QKV_ERR_INVALID_ARGUMENT,
          "qkv_attention_f32 with another type: invalid");
    Check(Untouched(g_out, 4 * 2 * 4, true), "a refused call wrote out");
  }
}

}  // namespace

// ---------------------------------------------------------------- backward
// The backward pass (qkv_attention_backward_f32) on the microcontroller
// backends: dense layouts, DOT and GAUSSIAN, GQA, causal, softcap, ALiBi
// and sinks, against an analytic double-precision gradient; gradients
// within 1e-3 of their largest element, written nowhere else.
constexpr int kBwIn = 256;  // floats of each operand and gradient
float g_bq[kBwIn], g_bk[kBwIn], g_bv[kBwIn], g_bout[kBwIn], g_bdout[kBwIn];
float g_blse[32];
float g_bdq[kBwIn + 2 * kGuard], g_bdk[kBwIn + 2 * kGuard],
    g_bdv[kBwIn + 2 * kGuard];
double g_gq[kBwIn], g_gk[kBwIn], g_gv[kBwIn];
unsigned char g_bws[24 * 1024];

// The exact gradients of desc's attention (batch 1) into g_gq, g_gk, g_gv.
void BackwardOracle(const qkv_attention_desc& d) {
  const int64_t hq = d.q_heads, lq = d.q_len, lk = d.kv_len;
  const int64_t dk = d.head_dim, dv = d.value_dim, group = hq / d.kv_heads;
  for (int i = 0; i < kBwIn; ++i) g_gq[i] = g_gk[i] = g_gv[i] = 0.0;
  const double factor = d.score == QKV_SCORE_GAUSSIAN ? -static_cast<double>(d.scale)
                                                      : static_cast<double>(d.scale);
  for (int64_t h = 0; h < hq; ++h) {
    const int64_t kh = h / group;
    for (int64_t i = 0; i < lq; ++i) {
      const int64_t pos = lk - lq + i;
      double a[kMaxKv], s[kMaxKv], p[kMaxKv], m = -INFINITY;
      for (int64_t j = 0; j < lk; ++j) {
        double raw = 0.0;
        for (int64_t c = 0; c < dk; ++c) {
          const double x = g_bq[(h * lq + i) * dk + c];
          const double y = g_bk[(kh * lk + j) * dk + c];
          raw += d.score == QKV_SCORE_GAUSSIAN ? (x - y) * (x - y) : x * y;
        }
        a[j] = factor * raw;
        s[j] = d.softcap > 0.0f ? d.softcap * tanh(a[j] / d.softcap) : a[j];
        if (d.alibi_slopes != nullptr) {
          s[j] -= d.alibi_slopes[h] * fabs(static_cast<double>(pos - j));
        }
        if ((d.mask & QKV_MASK_CAUSAL) && j > pos) s[j] = -INFINITY;
        if (s[j] > m) m = s[j];
      }
      const double sink = d.sinks != nullptr ? d.sinks[h] : -INFINITY;
      if (sink > m) m = sink;
      if (m == -INFINITY) continue;
      double l = sink == -INFINITY ? 0.0 : exp(sink - m);
      for (int64_t j = 0; j < lk; ++j) {
        p[j] = s[j] == -INFINITY ? 0.0 : exp(s[j] - m);
        l += p[j];
      }
      double dp[kMaxKv], dd = 0.0;
      for (int64_t j = 0; j < lk; ++j) {
        p[j] /= l;
        dp[j] = 0.0;
        for (int64_t c = 0; c < dv; ++c) {
          dp[j] += g_bdout[(h * lq + i) * dv + c] * g_bv[(kh * lk + j) * dv + c];
        }
        dd += p[j] * dp[j];
      }
      for (int64_t j = 0; j < lk; ++j) {
        double gs = p[j] * (dp[j] - dd);
        if (d.softcap > 0.0f) {
          const double t = tanh(a[j] / d.softcap);
          gs *= 1.0 - t * t;
        }
        gs *= factor;
        for (int64_t c = 0; c < dv; ++c) {
          g_gv[(kh * lk + j) * dv + c] += p[j] * g_bdout[(h * lq + i) * dv + c];
        }
        for (int64_t c = 0; c < dk; ++c) {
          const double x = g_bq[(h * lq + i) * dk + c];
          const double y = g_bk[(kh * lk + j) * dk + c];
          if (d.score == QKV_SCORE_GAUSSIAN) {
            g_gq[(h * lq + i) * dk + c] += gs * 2.0 * (x - y);
            g_gk[(kh * lk + j) * dk + c] += gs * 2.0 * (y - x);
          } else {
            g_gq[(h * lq + i) * dk + c] += gs * y;
            g_gk[(kh * lk + j) * dk + c] += gs * x;
          }
        }
      }
    }
  }
}

void CheckGradient(const char* what, const float* got, const double* want,
                   int n) {
  double mx = 0.0;
  for (int i = 0; i < n; ++i) mx = fabs(want[i]) > mx ? fabs(want[i]) : mx;
  for (int i = 0; i < n; ++i) {
    ++g_checks;
    if (!(fabs(got[i] - want[i]) <= 1e-3 * mx + 1e-12)) {
      Fail(what, got[i], want[i]);
      return;
    }
  }
}

void RunBackwardCase(const char* name, qkv_attention_desc d) {
  g_case = name;
  d.backend = g_backend;
  const int nq = static_cast<int>(d.q_heads * d.q_len * d.head_dim);
  const int nk = static_cast<int>(d.kv_heads * d.kv_len * d.head_dim);
  const int nv = static_cast<int>(d.kv_heads * d.kv_len * d.value_dim);
  const int no = static_cast<int>(d.q_heads * d.q_len * d.value_dim);
  if (nq > kBwIn || nk > kBwIn || nv > kBwIn || no > kBwIn) {
    Check(false, "the case fits the runner's buffers");
    return;
  }
  Fill(g_bq, nq, 1.5f);
  Fill(g_bk, nk, 1.5f);
  Fill(g_bv, nv, 1.0f);
  Fill(g_bdout, no, 1.0f);
  size_t ws = qkv_attention_workspace_size(&d);
  Check(ws <= sizeof(g_bws), "forward workspace fits");
  Check(qkv_attention_f32(&d, g_bq, g_bk, g_bv, g_bout, nullptr, g_blse,
                          g_bws, ws) == QKV_OK,
        "forward status");
  ws = qkv_attention_backward_workspace_size(&d);
  Check(ws > 0 && ws <= sizeof(g_bws), "backward workspace fits");
  Poison(g_bdq, nq);
  Poison(g_bdk, nk);
  Poison(g_bdv, nv);
  Check(qkv_attention_backward_f32(&d, g_bq, g_bk, g_bv, g_bout, g_blse,
                                   g_bdout, g_bdq + kGuard, g_bdk + kGuard,
                                   g_bdv + kGuard, g_bws, ws) == QKV_OK,
        "backward status");
  BackwardOracle(d);
  CheckGradient("d_q", g_bdq + kGuard, g_gq, nq);
  CheckGradient("d_k", g_bdk + kGuard, g_gk, nk);
  CheckGradient("d_v", g_bdv + kGuard, g_gv, nv);
  Check(Untouched(g_bdq, nq, false) && Untouched(g_bdk, nk, false) &&
            Untouched(g_bdv, nv, false),
        "backward writes only the gradients");
  // Refusals write nothing: no d_out, and an additive score.
  Poison(g_bdq, nq);
  Check(qkv_attention_backward_f32(&d, g_bq, g_bk, g_bv, g_bout, g_blse,
                                   nullptr, g_bdq + kGuard, nullptr, nullptr,
                                   g_bws, ws) == QKV_ERR_INVALID_ARGUMENT,
        "backward without d_out is invalid");
  Check(Untouched(g_bdq, nq, true), "refusal writes nothing");
}

void BackwardCases() {
  static float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
  static float sinks[4] = {0.3f, -1.0f, 2.0f, -INFINITY};
  qkv_attention_desc d;
  qkv_attention_desc_init(&d, 1, 2, 1, 5, 7, 3, 4);
  RunBackwardCase("backward dot gqa", d);
  qkv_attention_desc_init(&d, 1, 4, 1, 6, 20, 8, 5);
  d.mask = QKV_MASK_CAUSAL;
  RunBackwardCase("backward causal, 20 keys (two key blocks)", d);
  d.softcap = 1.5f;
  d.scale = 2.0f;
  d.alibi_slopes = slopes;
  d.sinks = sinks;
  RunBackwardCase("backward softcap alibi sinks", d);
  qkv_attention_desc_init(&d, 1, 2, 2, 9, 17, 4, 4);
  d.score = QKV_SCORE_GAUSSIAN;
  d.scale = 0.5f;
  d.mask = QKV_MASK_CAUSAL;
  RunBackwardCase("backward gaussian causal", d);
  qkv_attention_desc_init(&d, 1, 2, 1, 3, 4, 4, 4);
  d.score = QKV_SCORE_ADDITIVE;
  d.additive_hidden = 2;
  d.additive_w_q = g_wq;
  d.additive_w_k = g_wk;
  d.additive_w_v = g_wv;
  g_case = "backward additive";
  Check(qkv_attention_backward_f32(&d, g_bq, g_bk, g_bv, g_bout, g_blse,
                                   g_bdout, g_bdq, g_bdk, g_bdv, g_bws,
                                   sizeof(g_bws)) == QKV_ERR_UNSUPPORTED,
        "additive scores have no backward pass");
}

int main() {
  printf("qkv %u.%u.%u on the MCU runner; backends:",
         static_cast<unsigned>(qkv_version() >> 16),
         static_cast<unsigned>((qkv_version() >> 8) & 255),
         static_cast<unsigned>(qkv_version() & 255));
  for (size_t i = 0; i < qkv_backend_count(); ++i) {
    printf(" %s", qkv_backend_name(i));
  }
  printf("\n");
  for (size_t i = 0; i < qkv_backend_count(); ++i) {
    g_backend = qkv_backend_name(i);
    // The buffers are sized for the microcontroller backends; on the host
    // the GoogleTest suite covers the SIMD ones.
    if (strcmp(g_backend, "reference") != 0 && strcmp(g_backend, "helium") != 0) {
      printf("%s: skipped (not a microcontroller backend)\n", g_backend);
      continue;
    }
    const int before = g_failures;
    OracleCases();
    printf("%s: oracle cases %s\n", g_backend,
           g_failures == before ? "passed" : "FAILED");
  }
  for (size_t i = 0; i < qkv_backend_count(); ++i) {
    g_backend = qkv_backend_name(i);
    if (strcmp(g_backend, "reference") == 0 || strcmp(g_backend, "helium") == 0) {
      MergeCases();
    }
  }
  for (size_t i = 0; i < qkv_backend_count(); ++i) {
    g_backend = qkv_backend_name(i);
    if (strcmp(g_backend, "reference") != 0 &&
        strcmp(g_backend, "helium") != 0) {
      continue;
    }
    const int before = g_failures;
    VariantCases();
    printf("%s: variant cases %s\n", g_backend,
           g_failures == before ? "passed" : "FAILED");
  }
  for (size_t i = 0; i < qkv_backend_count(); ++i) {
    g_backend = qkv_backend_name(i);
    if (strcmp(g_backend, "reference") != 0 &&
        strcmp(g_backend, "helium") != 0) {
      continue;
    }
    const int before = g_failures;
    LowPrecisionRefusals(QKV_LOW_PRECISION_KV != 0);
    if (QKV_LOW_PRECISION_KV) {
      LowPrecisionCases(QKV_DTYPE_F16);
      LowPrecisionCases(QKV_DTYPE_BF16);
      LowPrecisionCases(QKV_DTYPE_I8);
    }
    const char* verdict = g_failures != before  ? "FAILED"
                          : QKV_LOW_PRECISION_KV ? "passed"
                                                 : "refused (not built)";
    printf("%s: F16, BF16 and I8 K/V cases %s\n", g_backend, verdict);
  }
  for (size_t i = 0; i < qkv_backend_count(); ++i) {
    g_backend = qkv_backend_name(i);
    if (strcmp(g_backend, "reference") != 0 &&
        strcmp(g_backend, "helium") != 0) {
      continue;
    }
    const int before = g_failures;
    BackwardCases();
    printf("%s: backward cases %s\n", g_backend,
           g_failures == before ? "passed" : "FAILED");
  }
  g_backend = "reference";
  BadInputCases();  // validation is the boundary's, the same for every backend
  printf("%d checks, %d passed, %d failed\n", g_checks, g_checks - g_failures,
         g_failures);
  return g_failures == 0 ? 0 : 1;
}
