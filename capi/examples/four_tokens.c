/* The four-token example of scaled dot-product attention, through qkv's C API.
 *
 * Four 2-D token embeddings, Q = K = V = embeddings (identity projections),
 * scale 1/sqrt(d_k) = 1/sqrt(2): prints the 4x4 attention weights and the
 * contextualized vectors, then the same with a causal mask (token i attends
 * to tokens 0..i only). Each result is checked against a plain double
 * precision computation; the exit status is 0 only if all agree, so this
 * program doubles as a test (ctest -R example_four_tokens).
 *
 * Uses only the public header; the workspace comes from malloc, sized by
 * qkv_attention_workspace_size.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "qkv/qkv.h"

#define N_TOKENS 4
#define DIM 2

static const char *const kTokens[N_TOKENS] = {"Token-1", "Token-2", "Token-3",
                                              "Token-4"};

static const float kEmbeddings[N_TOKENS * DIM] = {
    0.9f, 0.1f, /* Token-1 */
    0.2f, 0.8f, /* Token-2 */
    0.1f, 0.9f, /* Token-3 */
    0.8f, 0.2f  /* Token-4 */
};

/* softmax(Q K^T / sqrt(d)) V in double, key j visible to query i iff
 * !causal || j <= i (q_len == kv_len, so bottom-right alignment is plain). */
static void Expected(int causal, double weights[N_TOKENS][N_TOKENS],
                     double out[N_TOKENS][DIM]) {
  const double scale = 1.0 / sqrt((double)DIM);
  int i, j, c;
  for (i = 0; i < N_TOKENS; ++i) {
    double max = -INFINITY, sum = 0.0;
    double s[N_TOKENS];
    for (j = 0; j < N_TOKENS; ++j) {
      s[j] = 0.0;
      for (c = 0; c < DIM; ++c) {
        s[j] += (double)kEmbeddings[i * DIM + c] * kEmbeddings[j * DIM + c];
      }
      s[j] *= scale;
      if ((!causal || j <= i) && s[j] > max) max = s[j];
    }
    for (j = 0; j < N_TOKENS; ++j) {
      weights[i][j] = (!causal || j <= i) ? exp(s[j] - max) : 0.0;
      sum += weights[i][j];
    }
    for (c = 0; c < DIM; ++c) out[i][c] = 0.0;
    for (j = 0; j < N_TOKENS; ++j) {
      weights[i][j] /= sum;
      for (c = 0; c < DIM; ++c) {
        out[i][c] += weights[i][j] * kEmbeddings[j * DIM + c];
      }
    }
  }
}

/* Runs one variant, prints it, returns the number of values off by more than
 * the documented accuracy (2e-5 on weights, 5e-5 * max|v| = 4.5e-5 on out),
 * or -1 on an error status. */
static int Run(const char *title, uint32_t mask) {
  qkv_attention_desc desc;
  float weights[N_TOKENS * N_TOKENS];
  float out[N_TOKENS * DIM];
  double want_w[N_TOKENS][N_TOKENS], want_out[N_TOKENS][DIM];
  size_t ws_bytes;
  void *ws = NULL;
  qkv_status status;
  int i, j, bad = 0;

  /* batch 1, one head (q_heads = kv_heads = 1), 4 queries, 4 keys, d = 2 */
  qkv_attention_desc_init(&desc, 1, 1, 1, N_TOKENS, N_TOKENS, DIM, DIM);
  desc.scale = 1.0f / sqrtf((float)DIM); /* what _init sets; spelled out */
  desc.mask = mask;

  ws_bytes = qkv_attention_workspace_size(&desc);
  if (ws_bytes > 0) {
    ws = malloc(ws_bytes);
    if (ws == NULL) {
      fprintf(stderr, "out of memory (%lu bytes of workspace)\n",
              (unsigned long)ws_bytes);
      return -1;
    }
  }
  status = qkv_attention_f32(&desc, kEmbeddings, kEmbeddings, kEmbeddings, out,
                             weights, NULL, ws, ws_bytes);
  free(ws);
  if (status != QKV_OK) {
    fprintf(stderr, "%s: qkv_attention_f32 failed: %s (%d)\n", title,
            qkv_status_string(status), (int)status);
    return -1;
  }

  Expected(mask & QKV_MASK_CAUSAL, want_w, want_out);
  printf("\n%s (workspace %lu bytes)\n", title, (unsigned long)ws_bytes);
  printf("attention weights (rows: queries, columns: keys; rows sum to 1)\n");
  printf("%-8s", "");
  for (j = 0; j < N_TOKENS; ++j) printf(" %8s", kTokens[j]);
  printf("\n");
  for (i = 0; i < N_TOKENS; ++i) {
    printf("%-8s", kTokens[i]);
    for (j = 0; j < N_TOKENS; ++j) {
      const float w = weights[i * N_TOKENS + j];
      printf(" %8.4f", w);
      if (!(fabs(w - want_w[i][j]) <= 2e-5)) ++bad;
    }
    printf("\n");
  }
  printf("contextualized vectors (weights x V)\n");
  for (i = 0; i < N_TOKENS; ++i) {
    printf("%-8s [%.4f, %.4f]\n", kTokens[i], out[i * DIM], out[i * DIM + 1]);
    for (j = 0; j < DIM; ++j) {
      if (!(fabs(out[i * DIM + j] - want_out[i][j]) <= 5e-5 * 0.9)) ++bad;
    }
  }
  if (bad > 0) {
    fprintf(stderr, "%s: %d values differ from the double-precision result\n",
            title, bad);
  }
  return bad;
}

int main(void) {
  const uint32_t v = qkv_version();
  int i, bad_plain, bad_causal;

  printf("qkv %u.%u.%u (header %d.%d.%d), backend %s\n", (unsigned)(v >> 16),
         (unsigned)((v >> 8) & 0xffu), (unsigned)(v & 0xffu), QKV_VERSION_MAJOR,
         QKV_VERSION_MINOR, QKV_VERSION_PATCH, qkv_backend());
  printf("token embeddings (Q = K = V), scale 1/sqrt(2)\n");
  for (i = 0; i < N_TOKENS; ++i) {
    printf("%-8s [%.1f, %.1f]\n", kTokens[i], kEmbeddings[i * DIM],
           kEmbeddings[i * DIM + 1]);
  }

  bad_plain = Run("scaled dot-product attention", QKV_MASK_NONE);
  bad_causal = Run("causal (Token-i sees Token-1 .. Token-i)", QKV_MASK_CAUSAL);
  if (bad_plain != 0 || bad_causal != 0) return EXIT_FAILURE;
  printf("\nok: matches a double-precision computation\n");
  return EXIT_SUCCESS;
}
