// The OpenBLAS three-step attention baseline: per head, S = scale * Q K^T
// (cblas_sgemm), a masked row softmax that the compiler vectorizes
// (baseline_blas.cc is built with -O3 -march=native -ffast-math, so expf goes
// through glibc's libmvec), then O = P V (cblas_sgemm). This is the
// "vectorized 3-step" of the Performance issue: the baseline qkv must beat.
// And its backward pass written the same way (BlasAttentionBackwardHead):
// five sgemms and two elementwise loops, the baseline of
// qkv_attention_backward_f32.
#ifndef QKV_BENCH_BASELINE_BLAS_H_
#define QKV_BENCH_BASELINE_BLAS_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace qkv_bench {

struct BlasShape {
  int64_t q_len, kv_len, head_dim, value_dim;
  float scale;
  // Bottom-right aligned, as in qkv: query i sees key j iff
  // j <= i + kv_len - q_len.
  bool causal;
};

// False when the benchmark was built without OpenBLAS (QKV_BENCH_HAVE_OPENBLAS
// undefined); then the functions below do nothing.
bool BlasAvailable();

// Pins OpenBLAS to `threads` threads (we run it single-threaded and, for the
// 2-worker baseline, split the heads across our own pool instead).
void BlasSetThreads(int threads);

// OpenBLAS's description of itself, e.g. "OpenBLAS 0.3.21 ... SkylakeX", and
// the core it dispatched to ("SkylakeX", "Haswell", "Prescott"...).
std::string BlasConfig();
std::string BlasCoreName();

// Floats of scratch one head needs (the q_len x kv_len score matrix).
size_t BlasScratchFloats(const BlasShape& shape);

// One head: q [q_len][head_dim], k [kv_len][head_dim], v [kv_len][value_dim],
// out [q_len][value_dim]; scratch holds BlasScratchFloats(shape) floats.
void BlasAttentionHead(const BlasShape& shape, const float* q, const float* k,
                       const float* v, float* out, float* scratch);

// Floats of scratch one head's backward pass needs: P and dP (q_len x
// kv_len each) and D (q_len).
size_t BlasBackwardScratchFloats(const BlasShape& shape);

// The backward pass of one head, given the forward's out and lse (natural
// log of each row's softmax denominator, as qkv_attention_f32 writes it) and
// d_out; writes d_q [q_len][head_dim], d_k [kv_len][head_dim] and d_v
// [kv_len][value_dim] (overwritten). The plain way, nothing skipped:
//   S  = scale * Q K^T                       (sgemm)
//   P  = exp(S - lse_i), 0 where masked      (elementwise loop)
//   dP = dO V^T                              (sgemm)
//   D  = rowsum(dO * O)                      (loop)
//   dS = scale * P * (dP - D_i)              (elementwise loop)
//   dV = P^T dO, dQ = dS K, dK = dS^T Q      (sgemms)
// The sgemms run over the full q_len x kv_len, masked or not (the masked
// entries of P and dS are 0). scratch holds BlasBackwardScratchFloats(shape)
// floats.
void BlasAttentionBackwardHead(const BlasShape& shape, const float* q,
                               const float* k, const float* v, const float* out,
                               const float* lse, const float* d_out, float* d_q,
                               float* d_k, float* d_v, float* scratch);

}  // namespace qkv_bench

#endif  // QKV_BENCH_BASELINE_BLAS_H_
