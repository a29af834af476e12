/* A KV-cache decode loop through qkv's C API.
 *
 * The way a decoder-only transformer generates text: the keys and values of
 * every token seen so far live in a cache allocated once for the longest
 * sequence; each step appends the new token's key and value and attends
 * with its single query (q_len 1) over the cache so far. QKV_MASK_CAUSAL is
 * bottom-right aligned (query i sees key j iff j <= i + kv_len - q_len), so
 * the same flag serves the prompt (q_len = kv_len, a triangle) and every
 * decode step (q_len 1 sees the whole cache) with no offset to pass.
 *
 * Shapes: batch 2, 8 query heads sharing 2 kv heads (GQA, groups of 4),
 * head_dim = value_dim = 64, a 7-token prompt, then 40 decode steps. The
 * cache is [batch][kv_heads][MAX_LEN][dim]; qkv wants k as a dense
 * [batch][kv_heads][kv_len][dim], which a slice of the cache is only for one
 * (batch, kv head) at a time, so each step makes one call per (batch, kv
 * head) with q_heads = the group's 4 query heads and kv_heads = 1.
 *
 * No allocation in the loop: the cache, the step buffers and one workspace
 * (the largest any step needs, from qkv_attention_workspace_size) are
 * allocated before it. After every step the new outputs are checked against
 * a from-scratch causal call over the whole sequence so far (all batches and
 * heads at once): each value must be bitwise equal or within 1e-6. Exit
 * status 0 only then (ctest -R example_kv_cache_decode).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qkv/qkv.h"

#define BATCH 2
#define Q_HEADS 8
#define KV_HEADS 2
#define GROUP (Q_HEADS / KV_HEADS)
#define DIM 64
#define VDIM 64
#define PROMPT 7
#define STEPS 40
#define MAX_LEN (PROMPT + STEPS)
#define TOLERANCE 1e-6

static unsigned long long g_rng = 2024;
static float Uniform(void) { /* [-1, 1) */
  g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)((double)(g_rng >> 11) / 4503599627370496.0 - 1.0);
}

/* Every token's projections, made up front: q_all [B][Hq][MAX_LEN][D],
 * k_all/v_all [B][Hkv][MAX_LEN][D]. A model would compute token t's from
 * token t-1's output; random numbers exercise the cache just as well. */
static float q_all[BATCH * Q_HEADS * MAX_LEN * DIM];
static float k_all[BATCH * KV_HEADS * MAX_LEN * DIM];
static float v_all[BATCH * KV_HEADS * MAX_LEN * VDIM];

/* The cache and the step buffers (q and out of up to PROMPT new tokens). */
static float k_cache[BATCH * KV_HEADS * MAX_LEN * DIM];
static float v_cache[BATCH * KV_HEADS * MAX_LEN * VDIM];
static float q_step[BATCH * Q_HEADS * PROMPT * DIM];
static float out_step[BATCH * Q_HEADS * PROMPT * VDIM];

/* The from-scratch check: dense copies of the sequence so far. */
static float q_full[BATCH * Q_HEADS * MAX_LEN * DIM];
static float k_full[BATCH * KV_HEADS * MAX_LEN * DIM];
static float v_full[BATCH * KV_HEADS * MAX_LEN * VDIM];
static float out_full[BATCH * Q_HEADS * MAX_LEN * VDIM];

static void InitStepDesc(qkv_attention_desc *d, int64_t q_len, int64_t kv_len) {
  /* one (batch, kv head): its GROUP query heads against 1 kv head */
  qkv_attention_desc_init(d, 1, GROUP, 1, q_len, kv_len, DIM, VDIM);
  d->mask = QKV_MASK_CAUSAL;
}

static void InitFullDesc(qkv_attention_desc *d, int64_t len) {
  qkv_attention_desc_init(d, BATCH, Q_HEADS, KV_HEADS, len, len, DIM, VDIM);
  d->mask = QKV_MASK_CAUSAL;
}

/* Appends tokens [pos, pos + n) to the cache and attends their queries over
 * the cache [0, pos + n). */
static qkv_status Step(int pos, int n, void *ws, size_t ws_bytes) {
  int b, h, g, t;
  for (b = 0; b < BATCH; ++b) {
    for (h = 0; h < KV_HEADS; ++h) {
      const size_t row = ((size_t)b * KV_HEADS + h) * MAX_LEN + pos;
      memcpy(&k_cache[row * DIM], &k_all[row * DIM], sizeof(float) * n * DIM);
      memcpy(&v_cache[row * VDIM], &v_all[row * VDIM], sizeof(float) * n * VDIM);
    }
    for (h = 0; h < Q_HEADS; ++h) {
      for (t = 0; t < n; ++t) {
        memcpy(&q_step[(((size_t)b * Q_HEADS + h) * n + t) * DIM],
               &q_all[(((size_t)b * Q_HEADS + h) * MAX_LEN + pos + t) * DIM],
               sizeof(float) * DIM);
      }
    }
  }
  for (b = 0; b < BATCH; ++b) {
    for (g = 0; g < KV_HEADS; ++g) {
      const size_t head0 = (size_t)b * Q_HEADS + (size_t)g * GROUP;
      const size_t cache = ((size_t)b * KV_HEADS + g) * MAX_LEN;
      qkv_attention_desc d;
      qkv_status st;
      InitStepDesc(&d, n, pos + n);
      st = qkv_attention_f32(&d, &q_step[head0 * n * DIM], &k_cache[cache * DIM],
                             &v_cache[cache * VDIM], &out_step[head0 * n * VDIM],
                             NULL, NULL, ws, ws_bytes);
      if (st != QKV_OK) return st;
    }
  }
  return QKV_OK;
}

/* The whole sequence [0, len) from scratch; compares rows [len - n, len)
 * with out_step. Counts bitwise-equal values; returns the max difference,
 * or -1 on an error status. */
static double Check(int len, int n, void *ws, size_t ws_bytes, long *bitwise,
                    long *total) {
  qkv_attention_desc d;
  double max_diff = 0.0;
  int b, h, t, c;
  for (b = 0; b < BATCH; ++b) {
    for (h = 0; h < Q_HEADS; ++h) {
      memcpy(&q_full[((size_t)b * Q_HEADS + h) * len * DIM],
             &q_all[((size_t)b * Q_HEADS + h) * MAX_LEN * DIM], sizeof(float) * len * DIM);
    }
    for (h = 0; h < KV_HEADS; ++h) {
      memcpy(&k_full[((size_t)b * KV_HEADS + h) * len * DIM],
             &k_all[((size_t)b * KV_HEADS + h) * MAX_LEN * DIM], sizeof(float) * len * DIM);
      memcpy(&v_full[((size_t)b * KV_HEADS + h) * len * VDIM],
             &v_all[((size_t)b * KV_HEADS + h) * MAX_LEN * VDIM], sizeof(float) * len * VDIM);
    }
  }
  InitFullDesc(&d, len);
  if (qkv_attention_f32(&d, q_full, k_full, v_full, out_full, NULL, NULL, ws, ws_bytes) !=
      QKV_OK) {
    return -1.0;
  }
  for (b = 0; b < BATCH; ++b) {
    for (h = 0; h < Q_HEADS; ++h) {
      for (t = 0; t < n; ++t) {
        const float *got = &out_step[(((size_t)b * Q_HEADS + h) * n + t) * VDIM];
        const float *want = &out_full[(((size_t)b * Q_HEADS + h) * len + len - n + t) * VDIM];
        for (c = 0; c < VDIM; ++c) {
          const double diff = fabs((double)got[c] - (double)want[c]);
          if (memcmp(&got[c], &want[c], sizeof(float)) == 0) ++*bitwise;
          if (!(diff <= max_diff)) max_diff = diff; /* NaN propagates */
          ++*total;
        }
      }
    }
  }
  return max_diff;
}

int main(void) {
  qkv_attention_desc d;
  size_t step_bytes = 0, full_bytes = 0, bytes;
  void *step_ws, *full_ws;
  long bitwise = 0, total = 0;
  double worst = 0.0, decode_seconds = 0.0;
  int pos, len, i;

  for (i = 0; i < BATCH * Q_HEADS * MAX_LEN * DIM; ++i) q_all[i] = Uniform();
  for (i = 0; i < BATCH * KV_HEADS * MAX_LEN * DIM; ++i) k_all[i] = Uniform();
  for (i = 0; i < BATCH * KV_HEADS * MAX_LEN * VDIM; ++i) v_all[i] = Uniform();

  /* One workspace for the whole loop: the largest any step asks for. */
  InitStepDesc(&d, PROMPT, PROMPT);
  step_bytes = qkv_attention_workspace_size(&d);
  for (len = PROMPT + 1; len <= MAX_LEN; ++len) {
    InitStepDesc(&d, 1, len);
    bytes = qkv_attention_workspace_size(&d);
    if (bytes > step_bytes) step_bytes = bytes;
  }
  for (len = PROMPT; len <= MAX_LEN; ++len) {
    InitFullDesc(&d, len);
    bytes = qkv_attention_workspace_size(&d);
    if (bytes > full_bytes) full_bytes = bytes;
  }
  step_ws = step_bytes ? malloc(step_bytes) : NULL;
  full_ws = full_bytes ? malloc(full_bytes) : NULL;
  if ((step_bytes && !step_ws) || (full_bytes && !full_ws)) {
    fprintf(stderr, "out of memory\n");
    return 1;
  }
  printf("KV-cache decode on %s: batch %d, %d query heads over %d kv heads, d = %d,\n"
         "prompt %d tokens, %d decode steps, cache of %d; workspace %lu bytes per step\n",
         qkv_backend(), BATCH, Q_HEADS, KV_HEADS, DIM, PROMPT, STEPS, MAX_LEN,
         (unsigned long)step_bytes);

  for (pos = 0; pos < MAX_LEN;) {
    const int n = pos == 0 ? PROMPT : 1; /* the prompt at once, then one by one */
    const clock_t start = clock();
    const qkv_status st = Step(pos, n, step_ws, step_bytes);
    double diff;
    if (pos > 0) decode_seconds += (double)(clock() - start) / CLOCKS_PER_SEC;
    if (st != QKV_OK) {
      fprintf(stderr, "step at %d: %s\n", pos, qkv_status_string(st));
      return 1;
    }
    pos += n;
    diff = Check(pos, n, full_ws, full_bytes, &bitwise, &total);
    if (diff < 0) {
      fprintf(stderr, "from-scratch call at length %d failed\n", pos);
      return 1;
    }
    if (n > 1 || pos % 10 == 0 || pos == MAX_LEN) {
      printf("  %s %2d: cache %2d keys, max |step - from scratch| = %.3g\n",
             n > 1 ? "prompt" : "step  ", n > 1 ? n : pos - PROMPT, pos, diff);
    }
    if (!(diff <= worst)) worst = diff;
  }
  free(step_ws);
  free(full_ws);
  printf("%ld of %ld outputs bitwise equal to the from-scratch call, max difference %.3g;\n"
         "decode: %.1f us per step (all %d heads of %d sequences)\n",
         bitwise, total, worst, 1e6 * decode_seconds / STEPS, Q_HEADS, BATCH);
  if (!(worst <= TOLERANCE)) {
    fprintf(stderr, "FAILED: a decode step differs from the full causal call by %.3g > %g\n",
            worst, TOLERANCE);
    return 2;
  }
  printf("ok\n");
  return 0;
}
