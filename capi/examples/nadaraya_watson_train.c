/* Training attention by hand: the parametric Nadaraya-Watson regression of
 * the d2l chapter, its kernel width w learned by stochastic gradient
 * descent through qkv_attention_f32 and qkv_attention_backward_f32, with no
 * framework.
 *
 * 50 training points x_i drawn uniformly from [0, 5) and sorted, with
 * targets y_i = 2 sin(x_i) + x_i^0.8 + noise (normal, sd 0.5), from a
 * fixed-seed generator. The model predicts
 *
 *   f(x) = sum_i softmax_i(-((x - x_i) w)^2 / 2) y_i
 *
 * which is attention with the Gaussian score at scale 1/2 over queries
 * q = w x and keys k_i = w x_i (head_dim 1), values y_i (value_dim 1).
 * Training is leave-one-out: the query x_i sees every training key except
 * its own (a bias of -INFINITY on the diagonal, QKV_MASK_BIAS), else w
 * would grow without bound and each point would just copy its own target.
 *
 * One step: the forward call gives the predictions (and lse, which the
 * backward pass needs); the loss is the mean squared error
 * L = (1/n) sum_i (f_i - y_i)^2, so d_out_i = 2 (f_i - y_i) / n; the
 * backward call gives dL/dq and dL/dk, and as q_i = w x_i and k_i = w x_i
 * the chain rule gives dL/dw = sum_i d_q_i x_i + sum_i d_k_i x_i. The
 * values do not depend on w (d_v is not needed: NULL).
 *
 * Before training the gradient is checked against a central finite
 * difference of the loss. Prints the loss every few epochs, the learned w
 * and the error of the fit against the noise-free curve; exits non-zero if
 * a call fails, the gradient check fails or the loss did not drop
 * substantially, so it doubles as a test
 * (ctest -R example_nadaraya_watson_train).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "qkv/qkv.h"

#define N_TRAIN 50
#define N_TEST 50
#define EPOCHS 60

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

/* The training problem and the buffers of one step. */
typedef struct Model {
  float x[N_TRAIN], y[N_TRAIN];
  float bias[N_TRAIN * N_TRAIN]; /* 0, -INFINITY on the diagonal */
  float q[N_TRAIN], k[N_TRAIN];  /* w * x */
  float out[N_TRAIN], lse[N_TRAIN], d_out[N_TRAIN];
  float d_q[N_TRAIN], d_k[N_TRAIN];
  qkv_attention_desc desc;
  void *workspace, *backward_workspace;
  size_t workspace_size, backward_workspace_size;
} Model;

/* The leave-one-out loss at w (the predictions left in m->out, their lse
 * in m->lse); returns a negative number if the call fails. */
static double Loss(Model *m, float w) {
  double loss = 0.0;
  qkv_status st;
  int i;
  for (i = 0; i < N_TRAIN; ++i) m->q[i] = m->k[i] = w * m->x[i];
  st = qkv_attention_f32(&m->desc, m->q, m->k, m->y, m->out, NULL, m->lse,
                         m->workspace, m->workspace_size);
  if (st != QKV_OK) {
    fprintf(stderr, "qkv_attention_f32: %s\n", qkv_status_string(st));
    return -1.0;
  }
  for (i = 0; i < N_TRAIN; ++i) {
    const double e = (double)m->out[i] - m->y[i];
    loss += e * e / N_TRAIN;
  }
  return loss;
}

/* dLoss/dw at the w of the last Loss call, through the backward pass;
 * returns 0 on success. */
static int Gradient(Model *m, double *grad) {
  qkv_status st;
  int i;
  for (i = 0; i < N_TRAIN; ++i) {
    m->d_out[i] = (float)(2.0 * ((double)m->out[i] - m->y[i]) / N_TRAIN);
  }
  st = qkv_attention_backward_f32(&m->desc, m->q, m->k, m->y, m->out, m->lse,
                                  m->d_out, m->d_q, m->d_k, NULL,
                                  m->backward_workspace,
                                  m->backward_workspace_size);
  if (st != QKV_OK) {
    fprintf(stderr, "qkv_attention_backward_f32: %s\n",
            qkv_status_string(st));
    return 1;
  }
  /* q_i = w x_i and k_i = w x_i: dL/dw = sum d_q_i x_i + sum d_k_i x_i. */
  *grad = 0.0;
  for (i = 0; i < N_TRAIN; ++i) {
    *grad += (double)m->d_q[i] * m->x[i] + (double)m->d_k[i] * m->x[i];
  }
  return 0;
}

/* Mean squared error against the noise-free curve on a test grid, every
 * training point a key (no leave-one-out at test time). */
static double TestError(const Model *m, float w) {
  float q[N_TEST], k[N_TRAIN], y_hat[N_TEST];
  qkv_attention_desc desc;
  size_t bytes;
  void *ws;
  qkv_status st;
  double mse = 0.0;
  int i;
  for (i = 0; i < N_TEST; ++i) q[i] = w * 0.1f * (float)i;
  for (i = 0; i < N_TRAIN; ++i) k[i] = w * m->x[i];
  qkv_attention_desc_init(&desc, 1, 1, 1, N_TEST, N_TRAIN, 1, 1);
  desc.score = QKV_SCORE_GAUSSIAN;
  desc.scale = 0.5f;
  bytes = qkv_attention_workspace_size(&desc);
  ws = bytes ? malloc(bytes) : NULL;
  st = qkv_attention_f32(&desc, q, k, m->y, y_hat, NULL, NULL, ws, bytes);
  free(ws);
  if (st != QKV_OK) return -1.0;
  for (i = 0; i < N_TEST; ++i) {
    const double e = y_hat[i] - Truth(0.1 * i);
    mse += e * e / N_TEST;
  }
  return mse;
}

int main(void) {
  static Model m; /* ~11 KB: off the stack */
  unsigned long long rng = 42;
  const float w0 = 1.0f, lr = 1.0f;
  float w = w0;
  double loss0, loss = 0.0, grad, loss_plus, loss_minus, fd;
  const float h = 1e-2f;
  int i, j, epoch, failed = 0;

  for (i = 0; i < N_TRAIN; ++i) m.x[i] = (float)(5.0 * Uniform(&rng));
  qsort(m.x, N_TRAIN, sizeof(float), CompareFloats);
  for (i = 0; i < N_TRAIN; ++i) {
    m.y[i] = (float)(Truth(m.x[i]) + 0.5 * Normal(&rng));
  }
  for (i = 0; i < N_TRAIN; ++i) {
    for (j = 0; j < N_TRAIN; ++j) {
      m.bias[i * N_TRAIN + j] = i == j ? -INFINITY : 0.0f;
    }
  }

  /* batch 1, one head, N_TRAIN queries over N_TRAIN keys, d = dv = 1 */
  qkv_attention_desc_init(&m.desc, 1, 1, 1, N_TRAIN, N_TRAIN, 1, 1);
  m.desc.score = QKV_SCORE_GAUSSIAN;
  m.desc.scale = 0.5f; /* exp(-(q - k)^2 / 2) */
  m.desc.mask = QKV_MASK_BIAS;
  m.desc.bias = m.bias; /* [q_len][kv_len]; strides 0: one batch, one head */
  m.workspace_size = qkv_attention_workspace_size(&m.desc);
  m.backward_workspace_size = qkv_attention_backward_workspace_size(&m.desc);
  m.workspace = m.workspace_size ? malloc(m.workspace_size) : NULL;
  m.backward_workspace =
      m.backward_workspace_size ? malloc(m.backward_workspace_size) : NULL;
  if ((m.workspace_size && !m.workspace) ||
      (m.backward_workspace_size && !m.backward_workspace)) {
    fprintf(stderr, "out of memory\n");
    return 1;
  }

  printf("Training the Nadaraya-Watson kernel width on %s\n", qkv_backend());

  /* The backward pass against a central difference of the loss at w0. */
  loss_plus = Loss(&m, w0 + h);
  loss_minus = Loss(&m, w0 - h);
  loss0 = Loss(&m, w0);
  if (loss_plus < 0.0 || loss_minus < 0.0 || loss0 < 0.0 ||
      Gradient(&m, &grad) != 0) {
    return 1;
  }
  fd = (loss_plus - loss_minus) / (2.0 * h);
  printf("dL/dw at w = %.2f: backward %.6f, finite difference %.6f\n", w0,
         grad, fd);
  if (fabs(grad - fd) > 0.02 * fabs(fd) + 1e-4) {
    fprintf(stderr, "the gradient disagrees with the finite difference\n");
    failed = 2;
  }

  /* Full-batch gradient descent on w. */
  for (epoch = 0; epoch <= EPOCHS && !failed; ++epoch) {
    loss = Loss(&m, w);
    if (loss < 0.0 || Gradient(&m, &grad) != 0) {
      failed = 1;
      break;
    }
    if (epoch % 10 == 0) {
      printf("epoch %2d  w %.4f  loss %.5f  dL/dw %+.5f\n", epoch, w, loss,
             grad);
    }
    if (epoch < EPOCHS) w -= lr * (float)grad;
  }
  printf("learned w = %.4f (started at %.2f): leave-one-out loss %.5f -> "
         "%.5f\n",
         w, w0, loss0, loss);
  printf("MSE against the noise-free curve: %.4f at w = %.2f, %.4f learned\n",
         TestError(&m, w0), w0, TestError(&m, w));

  free(m.workspace);
  free(m.backward_workspace);
  if (failed) return failed;
  /* The loss must have dropped substantially. */
  if (!(loss < 0.8 * loss0)) {
    fprintf(stderr, "the loss did not drop: %.5f -> %.5f\n", loss0, loss);
    return 3;
  }
  return 0;
}
