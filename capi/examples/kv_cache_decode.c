/* A KV-cache decode loop through qkv's C API, with f32, f16, bf16 and int8
 * caches.
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
 * cache is [batch][kv_heads][MAX_LEN][dim]; each step makes one call per
 * (batch, kv head) on that head's rows [0, kv_len) of the cache, dense, with
 * q_heads = the group's 4 query heads and kv_heads = 1 (llama_decode.c reads
 * a token-major cache in place with strides instead).
 *
 * No allocation in the loop: the cache, the step buffers and one workspace
 * (the largest any step needs, from qkv_attention_workspace_size) are
 * allocated before it. After every step of the f32 run the new outputs are
 * checked against a from-scratch causal call over the whole sequence so far
 * (all batches and heads at once): each value must be bitwise equal or
 * within 1e-6.
 *
 * Then the same decode again with the cache stored as f16, bf16 and int8
 * (desc.kv_dtype): qkv_quantize_rows converts each new token's key and value
 * row into the cache (int8: with one float scale per row, desc.k_scales and
 * v_scales, [batch][kv_heads][MAX_LEN] like the cache), and qkv_attention
 * reads the cache in that type. For each cache type it prints the cache's
 * bytes, the time per decode step (the conversion of the new row included;
 * clock(), a demonstration, not a benchmark: bench/ measures) and the
 * largest difference of its outputs, over every step, from the f32 run's.
 * That difference is the rounding of K and V to the cache type (qkv
 * attends over the stored values to f32 accuracy); it must stay below a
 * loose limit per type, which reading the wrong bytes or ignoring int8's
 * scales would break. A backend that does not serve a cache type
 * (QKV_ERR_UNSUPPORTED) is reported and skipped. Exit status 0 only when
 * every check holds (ctest -R example_kv_cache_decode).
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
#define CACHE_ROWS (BATCH * KV_HEADS * MAX_LEN)
#define TOLERANCE 1e-6

/* The cache types, f32 first (the others are compared with it). limit: the
 * largest |out - f32 out| accepted, 4 to 5 times what this data gives
 * (2.4e-4, 2.0e-3 and 4.3e-3 for |k|, |v| < 1: f16 keeps 11 significant
 * bits, bf16 8, int8 steps of max|row| / 127), far below what wrong bytes
 * or lost scales give (0.1 and more). */
static const struct {
  qkv_dtype dtype;
  const char *name;
  size_t bytes; /* of one element */
  double limit;
} kTypes[] = {{QKV_DTYPE_F32, "f32", 4, 0.0},
              {QKV_DTYPE_F16, "f16", 2, 1e-3},
              {QKV_DTYPE_BF16, "bf16", 2, 1e-2},
              {QKV_DTYPE_I8, "int8", 1, 2e-2}};
#define NUM_TYPES ((int)(sizeof(kTypes) / sizeof(kTypes[0])))

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

/* The cache, [B][Hkv][MAX_LEN][D] elements of the run's type (sized, and
 * aligned, for f32), and the int8 row scales [B][Hkv][MAX_LEN]. */
static float k_cache[CACHE_ROWS * DIM];
static float v_cache[CACHE_ROWS * VDIM];
static float k_scales[CACHE_ROWS];
static float v_scales[CACHE_ROWS];
/* The step buffers: q and out of up to PROMPT new tokens. */
static float q_step[BATCH * Q_HEADS * PROMPT * DIM];
static float out_step[BATCH * Q_HEADS * PROMPT * VDIM];
/* Every token's output of the f32 run and of the current one:
 * [B][Hq][MAX_LEN][Dv]. */
static float out_f32[BATCH * Q_HEADS * MAX_LEN * VDIM];
static float out_run[BATCH * Q_HEADS * MAX_LEN * VDIM];

/* The from-scratch check: dense copies of the sequence so far. */
static float q_full[BATCH * Q_HEADS * MAX_LEN * DIM];
static float k_full[BATCH * KV_HEADS * MAX_LEN * DIM];
static float v_full[BATCH * KV_HEADS * MAX_LEN * VDIM];
static float out_full[BATCH * Q_HEADS * MAX_LEN * VDIM];

/* One workspace for every step, one for the from-scratch calls. */
static void *g_step_ws, *g_full_ws;
static size_t g_step_bytes, g_full_bytes;

static void InitStepDesc(qkv_attention_desc *d, int64_t q_len, int64_t kv_len,
                         qkv_dtype dtype) {
  /* one (batch, kv head): its GROUP query heads against 1 kv head */
  qkv_attention_desc_init(d, 1, GROUP, 1, q_len, kv_len, DIM, VDIM);
  d->mask = QKV_MASK_CAUSAL;
  d->kv_dtype = dtype;
}

static void InitFullDesc(qkv_attention_desc *d, int64_t len) {
  qkv_attention_desc_init(d, BATCH, Q_HEADS, KV_HEADS, len, len, DIM, VDIM);
  d->mask = QKV_MASK_CAUSAL;
}

/* Appends tokens [pos, pos + n) to the cache of type kTypes[type] and
 * attends their queries over the cache [0, pos + n). */
static qkv_status Step(int type, int pos, int n) {
  const qkv_dtype dtype = kTypes[type].dtype;
  const size_t e = kTypes[type].bytes;
  unsigned char *const k_bytes = (unsigned char *)k_cache;
  unsigned char *const v_bytes = (unsigned char *)v_cache;
  const int int8 = dtype == QKV_DTYPE_I8;
  int b, h, g, t;
  qkv_status st;
  for (b = 0; b < BATCH; ++b) {
    for (h = 0; h < KV_HEADS; ++h) {
      /* the new rows, converted into the cache (f32: copied) */
      const size_t row = ((size_t)b * KV_HEADS + h) * MAX_LEN + pos;
      st = qkv_quantize_rows(dtype, n, DIM, &k_all[row * DIM], 0, k_bytes + row * DIM * e,
                             0, int8 ? &k_scales[row] : NULL);
      if (st != QKV_OK) return st;
      st = qkv_quantize_rows(dtype, n, VDIM, &v_all[row * VDIM], 0,
                             v_bytes + row * VDIM * e, 0, int8 ? &v_scales[row] : NULL);
      if (st != QKV_OK) return st;
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
      InitStepDesc(&d, n, pos + n, dtype);
      if (int8) { /* this head's rows: [1][1][kv_len], dense */
        d.k_scales = &k_scales[cache];
        d.v_scales = &v_scales[cache];
      }
      st = qkv_attention(&d, &q_step[head0 * n * DIM], k_bytes + cache * DIM * e,
                         v_bytes + cache * VDIM * e, &out_step[head0 * n * VDIM], NULL,
                         NULL, g_step_ws, g_step_bytes);
      if (st != QKV_OK) return st;
    }
  }
  return QKV_OK;
}

/* Copies the step's outputs (tokens [pos, pos + n)) into hist. */
static void Keep(float *hist, int pos, int n) {
  int bh, t;
  for (bh = 0; bh < BATCH * Q_HEADS; ++bh) {
    for (t = 0; t < n; ++t) {
      memcpy(&hist[((size_t)bh * MAX_LEN + pos + t) * VDIM],
             &out_step[((size_t)bh * n + t) * VDIM], sizeof(float) * VDIM);
    }
  }
}

/* The whole sequence [0, len) from scratch; compares rows [len - n, len)
 * with out_step. Counts bitwise-equal values; returns the max difference,
 * or -1 on an error status. */
static double Check(int len, int n, long *bitwise, long *total) {
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
  if (qkv_attention_f32(&d, q_full, k_full, v_full, out_full, NULL, NULL, g_full_ws,
                        g_full_bytes) != QKV_OK) {
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

/* The f32 decode, each step checked against the from-scratch call; every
 * output kept in out_f32. Returns 0, or the exit status. */
static int DecodeF32(double *decode_seconds) {
  long bitwise = 0, total = 0;
  double worst = 0.0;
  int pos;
  for (pos = 0; pos < MAX_LEN;) {
    const int n = pos == 0 ? PROMPT : 1; /* the prompt at once, then one by one */
    const clock_t start = clock();
    const qkv_status st = Step(0, pos, n);
    double diff;
    if (pos > 0) *decode_seconds += (double)(clock() - start) / CLOCKS_PER_SEC;
    if (st != QKV_OK) {
      fprintf(stderr, "f32 step at %d: %s\n", pos, qkv_status_string(st));
      return 1;
    }
    Keep(out_f32, pos, n);
    pos += n;
    diff = Check(pos, n, &bitwise, &total);
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
  printf("%ld of %ld outputs bitwise equal to the from-scratch call, max difference %.3g;\n"
         "decode: %.1f us per step (all %d heads of %d sequences)\n",
         bitwise, total, worst, 1e6 * *decode_seconds / STEPS, Q_HEADS, BATCH);
  if (!(worst <= TOLERANCE)) {
    fprintf(stderr, "FAILED: a decode step differs from the full causal call by %.3g > %g\n",
            worst, TOLERANCE);
    return 2;
  }
  return 0;
}

/* The same decode with a cache of kTypes[type], every output in out_run. */
static qkv_status Decode(int type, double *decode_seconds) {
  int pos;
  for (pos = 0; pos < MAX_LEN;) {
    const int n = pos == 0 ? PROMPT : 1;
    const clock_t start = clock();
    const qkv_status st = Step(type, pos, n);
    if (pos > 0) *decode_seconds += (double)(clock() - start) / CLOCKS_PER_SEC;
    if (st != QKV_OK) return st;
    Keep(out_run, pos, n);
    pos += n;
  }
  return QKV_OK;
}

int main(void) {
  qkv_attention_desc d;
  size_t bytes;
  double f32_seconds = 0.0;
  int len, i, type, failed = 0;

  for (i = 0; i < BATCH * Q_HEADS * MAX_LEN * DIM; ++i) q_all[i] = Uniform();
  for (i = 0; i < BATCH * KV_HEADS * MAX_LEN * DIM; ++i) k_all[i] = Uniform();
  for (i = 0; i < BATCH * KV_HEADS * MAX_LEN * VDIM; ++i) v_all[i] = Uniform();

  /* One workspace for the whole loop: the largest any step of any cache
   * type asks for. */
  for (type = 0; type < NUM_TYPES; ++type) {
    for (len = PROMPT; len <= MAX_LEN; ++len) {
      InitStepDesc(&d, len == PROMPT ? PROMPT : 1, len, kTypes[type].dtype);
      bytes = qkv_attention_workspace_size(&d);
      if (bytes > g_step_bytes) g_step_bytes = bytes;
    }
  }
  for (len = PROMPT; len <= MAX_LEN; ++len) {
    InitFullDesc(&d, len);
    bytes = qkv_attention_workspace_size(&d);
    if (bytes > g_full_bytes) g_full_bytes = bytes;
  }
  g_step_ws = g_step_bytes ? malloc(g_step_bytes) : NULL;
  g_full_ws = g_full_bytes ? malloc(g_full_bytes) : NULL;
  if ((g_step_bytes && !g_step_ws) || (g_full_bytes && !g_full_ws)) {
    fprintf(stderr, "out of memory\n");
    return 1;
  }
  printf("KV-cache decode on %s: batch %d, %d query heads over %d kv heads, d = %d,\n"
         "prompt %d tokens, %d decode steps, cache of %d; workspace %lu bytes per step\n",
         qkv_backend(), BATCH, Q_HEADS, KV_HEADS, DIM, PROMPT, STEPS, MAX_LEN,
         (unsigned long)g_step_bytes);

  failed = DecodeF32(&f32_seconds);
  if (failed != 0) return failed;

  printf("The same decode with the cache in each type (qkv_quantize_rows fills it):\n"
         "  cache  bytes   us/step  max |out - f32 out|\n");
  for (type = 0; type < NUM_TYPES; ++type) {
    const size_t cache_bytes =
        (size_t)CACHE_ROWS * ((DIM + VDIM) * kTypes[type].bytes +
                              (kTypes[type].dtype == QKV_DTYPE_I8 ? 2 * sizeof(float) : 0));
    double seconds = 0.0, diff = 0.0;
    size_t j;
    qkv_status st;
    if (type == 0) { /* the run above */
      printf("  %-5s %6lu %8.1f  0 (the reference)\n", kTypes[type].name,
             (unsigned long)cache_bytes, 1e6 * f32_seconds / STEPS);
      continue;
    }
    st = Decode(type, &seconds);
    if (st == QKV_ERR_UNSUPPORTED) {
      printf("  %-5s %6lu   not served by %s\n", kTypes[type].name,
             (unsigned long)cache_bytes, qkv_backend());
      continue;
    }
    if (st != QKV_OK) {
      fprintf(stderr, "FAILED: the %s decode: %s\n", kTypes[type].name, qkv_status_string(st));
      failed = 1;
      continue;
    }
    for (j = 0; j < sizeof(out_run) / sizeof(out_run[0]); ++j) {
      const double dj = fabs((double)out_run[j] - (double)out_f32[j]);
      if (!(dj <= diff)) diff = dj; /* NaN propagates */
    }
    printf("  %-5s %6lu %8.1f  %.3g%s\n", kTypes[type].name, (unsigned long)cache_bytes,
           1e6 * seconds / STEPS, diff,
           kTypes[type].dtype == QKV_DTYPE_I8 ? " (bytes include the row scales)" : "");
    if (!(diff <= kTypes[type].limit)) {
      fprintf(stderr, "FAILED: the %s cache's outputs differ from f32's by %.3g > %g\n",
              kTypes[type].name, diff, kTypes[type].limit);
      failed = 2;
    }
  }
  free(g_step_ws);
  free(g_full_ws);
  if (failed != 0) return failed;
  printf("ok\n");
  return 0;
}
