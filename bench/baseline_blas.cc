// Compiled with -O3 -march=native -ffast-math (see bench/CMakeLists.txt): the
// softmax loops below must vectorize, with expf through glibc's libmvec
// (_ZGV*_expf), or the baseline would be the weak scalar 3-step.
#include "baseline_blas.h"

#include <math.h>

#include <algorithm>
#include <cstring>

#ifdef QKV_BENCH_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace qkv_bench {

namespace {

// Softmax of row[0, n) in place; row[n, len) (keys the causal mask hides) is
// zeroed so the second GEMM can run over the full kv_len.
void SoftmaxRow(float* __restrict row, int64_t n, int64_t len) {
  if (n <= 0) {
    std::memset(row, 0, sizeof(float) * static_cast<size_t>(len));
    return;
  }
  float max = row[0];
  for (int64_t j = 1; j < n; ++j) max = std::max(max, row[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float e = expf(row[j] - max);
    row[j] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) row[j] *= inv;
  for (int64_t j = n; j < len; ++j) row[j] = 0.0f;
}

// Keys row i of a head sees: [0, visible).
int64_t Visible(const BlasShape& s, int64_t i) {
  return s.causal
             ? std::max<int64_t>(
                   0, std::min<int64_t>(s.kv_len, i + s.kv_len - s.q_len + 1))
             : s.kv_len;
}

// P = exp(S - lse) in place over row[0, n), 0 over row[n, len) (masked).
void ProbabilitiesRow(float* __restrict row, float lse, int64_t n,
                      int64_t len) {
  for (int64_t j = 0; j < n; ++j) row[j] = expf(row[j] - lse);
  for (int64_t j = std::max<int64_t>(n, 0); j < len; ++j) row[j] = 0.0f;
}

// dS = scale * P * (dP - D) in place over dp[0, len) (P is 0 where masked,
// so dS is too).
void ScoreGradRow(const float* __restrict p, float* __restrict dp, float d,
                  float scale, int64_t len) {
  for (int64_t j = 0; j < len; ++j) dp[j] = scale * p[j] * (dp[j] - d);
}

}  // namespace

#ifdef QKV_BENCH_HAVE_OPENBLAS

bool BlasAvailable() { return true; }

void BlasSetThreads(int threads) { openblas_set_num_threads(threads); }

std::string BlasConfig() {
  const char* c = openblas_get_config();
  return c ? c : "";
}

std::string BlasCoreName() {
  const char* c = openblas_get_corename();
  return c ? c : "";
}

size_t BlasScratchFloats(const BlasShape& s) {
  return static_cast<size_t>(s.q_len) * static_cast<size_t>(s.kv_len);
}

void BlasAttentionHead(const BlasShape& s, const float* q, const float* k,
                       const float* v, float* out, float* scratch) {
  const int m = static_cast<int>(s.q_len);
  const int n = static_cast<int>(s.kv_len);
  const int d = static_cast<int>(s.head_dim);
  const int dv = static_cast<int>(s.value_dim);
  // S = scale * Q K^T  [q_len][kv_len]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, d, s.scale, q, d,
              k, d, 0.0f, scratch, n);
  for (int64_t i = 0; i < s.q_len; ++i) {
    const int64_t visible =
        s.causal ? std::min<int64_t>(s.kv_len, i + s.kv_len - s.q_len + 1)
                 : s.kv_len;
    SoftmaxRow(scratch + i * s.kv_len, visible, s.kv_len);
  }
  // O = P V  [q_len][value_dim]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, dv, n, 1.0f,
              scratch, n, v, dv, 0.0f, out, dv);
}

size_t BlasBackwardScratchFloats(const BlasShape& s) {
  return 2 * static_cast<size_t>(s.q_len) * static_cast<size_t>(s.kv_len) +
         static_cast<size_t>(s.q_len);
}

void BlasAttentionBackwardHead(const BlasShape& s, const float* q,
                               const float* k, const float* v, const float* out,
                               const float* lse, const float* d_out, float* d_q,
                               float* d_k, float* d_v, float* scratch) {
  const int m = static_cast<int>(s.q_len);
  const int n = static_cast<int>(s.kv_len);
  const int d = static_cast<int>(s.head_dim);
  const int dv = static_cast<int>(s.value_dim);
  float* p = scratch;                     // [q_len][kv_len]
  float* dp = p + s.q_len * s.kv_len;     // [q_len][kv_len]
  float* dsum = dp + s.q_len * s.kv_len;  // [q_len]
  // S = scale * Q K^T, then P = exp(S - lse) with the mask
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, d, s.scale, q, d,
              k, d, 0.0f, p, n);
  for (int64_t i = 0; i < s.q_len; ++i) {
    ProbabilitiesRow(p + i * s.kv_len, lse[i], Visible(s, i), s.kv_len);
  }
  // dP = dO V^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, dv, 1.0f, d_out,
              dv, v, dv, 0.0f, dp, n);
  // D_i = dO_i . O_i
  for (int64_t i = 0; i < s.q_len; ++i) {
    const float* a = d_out + i * s.value_dim;
    const float* b = out + i * s.value_dim;
    float acc = 0.0f;
    for (int64_t c = 0; c < s.value_dim; ++c) acc += a[c] * b[c];
    dsum[i] = acc;
  }
  // dS = scale * P (dP - D), in dP's place
  for (int64_t i = 0; i < s.q_len; ++i) {
    ScoreGradRow(p + i * s.kv_len, dp + i * s.kv_len, dsum[i], s.scale,
                 s.kv_len);
  }
  // dV = P^T dO  [kv_len][value_dim]
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, dv, m, 1.0f, p, n,
              d_out, dv, 0.0f, d_v, dv);
  // dQ = dS K  [q_len][head_dim]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, d, n, 1.0f, dp, n,
              k, d, 0.0f, d_q, d);
  // dK = dS^T Q  [kv_len][head_dim]
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, m, 1.0f, dp, n, q,
              d, 0.0f, d_k, d);
}

#else  // !QKV_BENCH_HAVE_OPENBLAS

bool BlasAvailable() { return false; }
void BlasSetThreads(int) {}
std::string BlasConfig() { return "not built"; }
std::string BlasCoreName() { return ""; }
size_t BlasScratchFloats(const BlasShape&) { return 0; }
void BlasAttentionHead(const BlasShape& s, const float*, const float*,
                       const float*, float*, float* scratch) {
  // Keeps SoftmaxRow referenced so both configurations compile the same code.
  if (scratch != nullptr) SoftmaxRow(scratch, 0, s.kv_len);
}
size_t BlasBackwardScratchFloats(const BlasShape&) { return 0; }
void BlasAttentionBackwardHead(const BlasShape& s, const float*, const float*,
                               const float*, const float*, const float*,
                               const float*, float*, float*, float*,
                               float* scratch) {
  // As above: the loops stay referenced.
  if (scratch != nullptr) {
    ProbabilitiesRow(scratch, 0.0f, 0, 0);
    ScoreGradRow(scratch, scratch, 0.0f, 0.0f, 0);
    (void)Visible(s, 0);
  }
}

#endif  // QKV_BENCH_HAVE_OPENBLAS

}  // namespace qkv_bench
