/* Nadaraya-Watson kernel regression through qkv's C API, as in the d2l
 * chapter the seeds come from.
 *
 * 50 training points x_i drawn uniformly from [0, 5) and sorted, with
 * targets y_i = 2 sin(x_i) + x_i^0.8 + noise (normal, sd 0.5). The
 * prediction at a test point x is attention pooling with the Gaussian
 * kernel: f(x) = sum_i softmax_i(-(x - x_i)^2 / 2) y_i, which is exactly
 * qkv_attention_f32 with QKV_SCORE_GAUSSIAN, scale 1/2, queries = test
 * points, keys = training inputs and values = training targets (head_dim =
 * value_dim = 1).
 *
 * Prints the prediction next to the noise-free truth on a grid, the mean
 * squared error of the prediction against the truth, and the attention
 * weights of a few test points (each row is a bump centred on the keys nearest
 * the query, the seeds' heatmap). Exits non-zero if the fit is off, so it
 * doubles as a test (ctest -R example_nadaraya_watson).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "qkv/qkv.h"

#define N_TRAIN 50
#define N_TEST 50

/* A small deterministic generator (no global state, no libc rand). */
static unsigned long long Next(unsigned long long *state) {
  *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
  return *state >> 11;
}
static double Uniform(unsigned long long *state) {
  return (double)Next(state) / 9007199254740992.0; /* [0, 1) */
}
static double Normal(unsigned long long *state) {
  const double u1 = 1.0 - Uniform(state), u2 = Uniform(state);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
static double Truth(double x) { return 2.0 * sin(x) + pow(x, 0.8); }

static int CompareFloats(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

int main(void) {
  float x_train[N_TRAIN], y_train[N_TRAIN], x_test[N_TEST], y_hat[N_TEST];
  float weights[N_TEST * N_TRAIN];
  unsigned long long rng = 42;
  qkv_attention_desc desc;
  size_t bytes;
  void *workspace;
  qkv_status st;
  double mse = 0.0, mse_mean = 0.0, mean_y = 0.0;
  int i, j;

  for (i = 0; i < N_TRAIN; ++i) x_train[i] = (float)(5.0 * Uniform(&rng));
  qsort(x_train, N_TRAIN, sizeof(float), CompareFloats);
  for (i = 0; i < N_TRAIN; ++i) {
    y_train[i] = (float)(Truth(x_train[i]) + 0.5 * Normal(&rng));
    mean_y += y_train[i] / N_TRAIN;
  }
  for (i = 0; i < N_TEST; ++i) x_test[i] = 0.1f * (float)i;

  /* batch 1, one head, N_TEST queries, N_TRAIN keys, d = dv = 1 */
  qkv_attention_desc_init(&desc, 1, 1, 1, N_TEST, N_TRAIN, 1, 1);
  desc.score = QKV_SCORE_GAUSSIAN;
  desc.scale = 0.5f; /* exp(-(x - x_i)^2 / 2): the Gaussian kernel */
  bytes = qkv_attention_workspace_size(&desc);
  workspace = bytes ? malloc(bytes) : NULL;
  st = qkv_attention_f32(&desc, x_test, x_train, y_train, y_hat, weights, NULL,
                         workspace, bytes);
  free(workspace);
  if (st != QKV_OK) {
    fprintf(stderr, "qkv_attention_f32: %s\n", qkv_status_string(st));
    return 1;
  }

  printf("Nadaraya-Watson regression on %s\n", qkv_backend());
  printf("    x   truth  prediction\n");
  for (i = 0; i < N_TEST; ++i) {
    const double e = y_hat[i] - Truth(x_test[i]);
    mse += e * e / N_TEST;
    mse_mean += (mean_y - Truth(x_test[i])) * (mean_y - Truth(x_test[i])) / N_TEST;
    if (i % 5 == 0) {
      printf("  %.1f  %6.3f  %6.3f\n", x_test[i], Truth(x_test[i]), y_hat[i]);
    }
  }
  printf("MSE against the truth: %.4f (average pooling would give %.4f)\n",
         mse, mse_mean);

  printf("weights of the test points at x = 1.0, 2.5, 4.0 (keys 0..%d):\n",
         N_TRAIN - 1);
  for (i = 10; i <= 40; i += 15) {
    double sum = 0.0;
    int argmax = 0;
    for (j = 0; j < N_TRAIN; ++j) {
      sum += weights[i * N_TRAIN + j];
      if (weights[i * N_TRAIN + j] > weights[i * N_TRAIN + argmax]) argmax = j;
    }
    printf("  x=%.1f: sum %.6f, heaviest key x_%d = %.3f (weight %.3f)\n",
           x_test[i], sum, argmax, x_train[argmax],
           weights[i * N_TRAIN + argmax]);
    if (fabs(sum - 1.0) > 1e-5 || fabs(x_train[argmax] - x_test[i]) > 0.5) {
      return 2;
    }
  }
  /* Kernel regression must beat average pooling by a wide margin. */
  return mse < 0.5 * mse_mean ? 0 : 3;
}
