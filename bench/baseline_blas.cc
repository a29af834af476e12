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

#endif  // QKV_BENCH_HAVE_OPENBLAS

}  // namespace qkv_bench
