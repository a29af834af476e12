/* A llama-style decode loop on a token-major KV cache, with no copies.
 *
 * llama.cpp and vLLM keep each layer's cache token-major: per sequence a
 * [capacity][kv_heads][head_dim] array, one row per token, allocated once
 * for the longest sequence. The model writes each new token's key and value
 * straight into its row of the cache, and attention reads the cache where it
 * lies: the descriptor's strides (in floats) say where element (b, h, t, c)
 * is, so nothing is copied or transposed, one call serves every sequence and
 * head, and the rows past a sequence's length (the spare capacity) are never
 * read. The queries and the output are token-major too ([token][heads][dim],
 * the layout of the projections around attention).
 *
 * Shapes: batch 2 with prompts of 20 and 9 tokens (a ragged batch), 8 query
 * heads over 2 kv heads (GQA, groups of 4), head_dim = value_dim = 64, a
 * cache of capacity 64 per sequence, then 24 decode steps (final lengths 44
 * and 33). Each query at position p sees the keys p - 15 .. p: causal and a
 * sliding window of 16 (QKV_MASK_WINDOW, window_left 15), and every query
 * head has an attention sink (gpt-oss: a logit in the softmax denominator
 * that carries no value; head 6 has none, -INFINITY).
 *
 * Positions: each step's new tokens continue where their sequence's cache
 * left off. Sequence b holds len[b] tokens and appends n[b]: its query i is
 * at position len[b] + i (desc.q_pos[b] = len[b]) and it sees only the keys
 * before len[b] + n[b] (desc.valid_lens[b]). kv_len is the longest
 * sequence's length; the other one's rows beyond its own length are hidden
 * by its valid length. The prompts go in one call with q_len 20 (the longest
 * prompt); the shorter prompt's query rows 9..19 are padding, computed and
 * ignored. Each decode step is one call with q_len 1.
 *
 * After every call its output is checked against Naive below, attention
 * written out from its definition in double precision: the largest error
 * must stay within 1e-4 * max|v|. Exit status 0 only then
 * (ctest -R example_llama_decode).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "qkv/qkv.h"

#define BATCH 2
#define Q_HEADS 8
#define KV_HEADS 2
#define GROUP (Q_HEADS / KV_HEADS)
#define DIM 64
#define VDIM 64
#define CAPACITY 64    /* cache rows per sequence, more than ever filled */
#define MAX_NEW 20     /* the longest prompt: rows of the query and output buffers */
#define STEPS 24       /* decode steps after the prompt */
#define WINDOW_LEFT 15 /* query p sees keys p - 15 .. p */
#define TOLERANCE 1e-4 /* relative to max|v| */

static const int kPrompt[BATCH] = {20, 9};
/* One sink logit per query head; -INFINITY: no sink for that head. */
static const float kSinks[Q_HEADS] = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f, 3.0f, -INFINITY, 1.5f};

/* The cache, token-major: k_cache[b][t][h][c] is key c of kv head h of token
 * t of sequence b. */
static float k_cache[BATCH][CAPACITY][KV_HEADS][DIM];
static float v_cache[BATCH][CAPACITY][KV_HEADS][VDIM];
/* The new tokens' queries and attention output: [b][token][head][c]. */
static float q_new[BATCH][MAX_NEW][Q_HEADS][DIM];
static float out_new[BATCH][MAX_NEW][Q_HEADS][VDIM];

static unsigned long long g_rng = 2025;
static float Uniform(void) { /* [-1, 1) */
  g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)((double)(g_rng >> 11) / 4503599627370496.0 - 1.0);
}

/* Token t of sequence b, new at row `row` of the step buffers: the model's
 * projections, written where they live. Random numbers stand in for them;
 * q is scaled up so that the weights are not nearly uniform. */
static void Project(int b, int t, int row) {
  int h, c;
  for (h = 0; h < Q_HEADS; ++h) {
    for (c = 0; c < DIM; ++c) q_new[b][row][h][c] = 3.0f * Uniform();
  }
  for (h = 0; h < KV_HEADS; ++h) {
    for (c = 0; c < DIM; ++c) k_cache[b][t][h][c] = Uniform();
    for (c = 0; c < VDIM; ++c) v_cache[b][t][h][c] = Uniform();
  }
}

/* Strides (in floats) of a token-major [batch][rows][heads][dim] array. */
static qkv_strides TokenMajor(int64_t rows, int64_t heads, int64_t dim) {
  qkv_strides s;
  s.batch = rows * heads * dim;
  s.head = dim;
  s.token = heads * dim;
  return s;
}

/* The descriptor of one call: q_len new tokens per sequence over kv_len
 * cached ones, q_pos[b] and valid_lens[b] per sequence as above. */
static void InitDesc(qkv_attention_desc *d, int q_len, int kv_len, const int32_t *q_pos,
                     const int32_t *valid_lens) {
  qkv_attention_desc_init(d, BATCH, Q_HEADS, KV_HEADS, q_len, kv_len, DIM, VDIM);
  d->mask = QKV_MASK_CAUSAL | QKV_MASK_WINDOW | QKV_MASK_VALID_LENS;
  d->window_left = WINDOW_LEFT;
  d->window_right = -1; /* unbounded: causal already stops at p */
  d->q_pos = q_pos;
  d->valid_lens = valid_lens;
  d->sinks = kSinks;
  d->q_strides = TokenMajor(MAX_NEW, Q_HEADS, DIM);
  d->k_strides = TokenMajor(CAPACITY, KV_HEADS, DIM); /* capacity, not kv_len */
  d->v_strides = TokenMajor(CAPACITY, KV_HEADS, VDIM);
  d->out_strides = TokenMajor(MAX_NEW, Q_HEADS, VDIM);
}

/* One call for the new tokens: sequence b holds len[b] tokens in the cache
 * before them and appends n[b] (their K and V already in rows len[b] ..
 * len[b] + n[b] - 1, their queries in rows 0 .. n[b] - 1 of q_new). On an
 * error status, why gets qkv_attention_explain's sentence. */
static qkv_status Attend(const int len[BATCH], const int n[BATCH], void *ws, size_t ws_bytes,
                         char *why, size_t why_size) {
  int32_t q_pos[BATCH], valid_lens[BATCH];
  int b, q_len = 0, kv_len = 0;
  qkv_attention_desc d;
  qkv_status st;
  for (b = 0; b < BATCH; ++b) {
    q_pos[b] = len[b];
    valid_lens[b] = len[b] + n[b];
    if (n[b] > q_len) q_len = n[b];
    if (valid_lens[b] > kv_len) kv_len = valid_lens[b];
  }
  InitDesc(&d, q_len, kv_len, q_pos, valid_lens);
  st = qkv_attention(&d, &q_new[0][0][0][0], k_cache, v_cache, &out_new[0][0][0][0], NULL, NULL,
                     ws, ws_bytes);
  if (st != QKV_OK) {
    qkv_attention_explain(&d, &q_new[0][0][0][0], k_cache, v_cache, &out_new[0][0][0][0], NULL,
                          NULL, ws, ws_bytes, why, why_size);
  }
  return st;
}

/* Query head h of sequence b at position p, from the definition, in double:
 * the keys j < valid_len with p - WINDOW_LEFT <= j <= p, softmax with the
 * head's sink in the denominator, the weighted sum of their values. */
static void Naive(int b, int h, int p, int valid_len, const float *q, double out[VDIM]) {
  const int g = h / GROUP;
  const double scale = 1.0 / sqrt((double)DIM), sink = kSinks[h];
  double s[CAPACITY], m = sink, denominator;
  int j, c, lo = p - WINDOW_LEFT, hi = p < valid_len - 1 ? p : valid_len - 1;
  if (lo < 0) lo = 0;
  for (c = 0; c < VDIM; ++c) out[c] = 0.0;
  for (j = lo; j <= hi; ++j) {
    double dot = 0.0;
    for (c = 0; c < DIM; ++c) dot += (double)q[c] * k_cache[b][j][g][c];
    s[j] = scale * dot;
    if (s[j] > m) m = s[j];
  }
  if (m == -INFINITY) return; /* no visible key and no sink */
  denominator = exp(sink - m);  /* 0 without a sink */
  for (j = lo; j <= hi; ++j) denominator += exp(s[j] - m);
  for (j = lo; j <= hi; ++j) {
    const double w = exp(s[j] - m) / denominator;
    for (c = 0; c < VDIM; ++c) out[c] += w * v_cache[b][j][g][c];
  }
}

/* The largest |out_new - Naive| over the real (not padding) rows of a call. */
static double MaxError(const int len[BATCH], const int n[BATCH]) {
  double ref[VDIM], worst = 0.0;
  int b, i, h, c;
  for (b = 0; b < BATCH; ++b) {
    for (i = 0; i < n[b]; ++i) {
      for (h = 0; h < Q_HEADS; ++h) {
        Naive(b, h, len[b] + i, len[b] + n[b], q_new[b][i][h], ref);
        for (c = 0; c < VDIM; ++c) {
          const double e = fabs((double)out_new[b][i][h][c] - ref[c]);
          if (!(e <= worst)) worst = e; /* NaN sticks */
        }
      }
    }
  }
  return worst;
}

int main(void) {
  int len[BATCH] = {0, 0}, n[BATCH];
  int32_t q_pos[BATCH], valid_lens[BATCH];
  qkv_attention_desc d;
  size_t ws_bytes = 0;
  void *ws;
  char why[256];
  double worst = 0.0, max_v = 0.0, decode_seconds = 0.0;
  int b, t, step, kv_len;

  /* One workspace for the whole loop: the largest any call asks for (the
   * prompt, then q_len 1 over kv_len up to the longest final length). */
  for (b = 0; b < BATCH; ++b) {
    q_pos[b] = 0;
    valid_lens[b] = kPrompt[b];
  }
  InitDesc(&d, MAX_NEW, kPrompt[0], q_pos, valid_lens);
  ws_bytes = qkv_attention_workspace_size(&d);
  for (kv_len = kPrompt[0] + 1; kv_len <= kPrompt[0] + STEPS; ++kv_len) {
    size_t bytes;
    InitDesc(&d, 1, kv_len, q_pos, valid_lens);
    bytes = qkv_attention_workspace_size(&d);
    if (bytes > ws_bytes) ws_bytes = bytes;
  }
  ws = ws_bytes ? malloc(ws_bytes) : NULL;
  if (ws_bytes && !ws) {
    fprintf(stderr, "out of memory\n");
    return 1;
  }
  printf("llama-style decode on %s: batch %d (prompts of %d and %d tokens), %d query heads\n"
         "over %d kv heads, d = %d, token-major cache of capacity %d, causal window of %d,\n"
         "sinks; %d decode steps; workspace %lu bytes\n",
         qkv_backend(), BATCH, kPrompt[0], kPrompt[1], Q_HEADS, KV_HEADS, DIM, CAPACITY,
         WINDOW_LEFT + 1, STEPS, (unsigned long)ws_bytes);

  for (step = 0; step <= STEPS; ++step) {
    clock_t start;
    qkv_status st;
    double err;
    /* The model writes the new tokens' K and V into the cache and their
     * queries into q_new: the prompt at once, then one token a step. */
    for (b = 0; b < BATCH; ++b) {
      n[b] = step == 0 ? kPrompt[b] : 1;
      for (t = 0; t < n[b]; ++t) Project(b, len[b] + t, t);
    }
    start = clock();
    st = Attend(len, n, ws, ws_bytes, why, sizeof why);
    if (step > 0) decode_seconds += (double)(clock() - start) / CLOCKS_PER_SEC;
    if (st != QKV_OK) {
      fprintf(stderr, "%s %d: %s: %s\n", step ? "step" : "prompt", step, qkv_status_string(st),
              why);
      return 1;
    }
    err = MaxError(len, n);
    if (!(err <= worst)) worst = err;
    for (b = 0; b < BATCH; ++b) len[b] += n[b];
    if (step == 0 || step % 8 == 0) {
      printf("  %s %2d: caches of %d and %d tokens, max |qkv - naive| = %.3g\n",
             step ? "step  " : "prompt", step, len[0], len[1], err);
    }
  }
  free(ws);

  for (b = 0; b < BATCH; ++b) {
    for (t = 0; t < len[b]; ++t) {
      int h, c;
      for (h = 0; h < KV_HEADS; ++h) {
        for (c = 0; c < VDIM; ++c) {
          if (fabs(v_cache[b][t][h][c]) > max_v) max_v = fabs(v_cache[b][t][h][c]);
        }
      }
    }
  }
  printf("max error %.3g (%.3g of max|v|), 0 bytes copied;\n"
         "decode: %.1f us per step (all %d heads of %d sequences in one call)\n",
         worst, worst / max_v, 1e6 * decode_seconds / STEPS, Q_HEADS, BATCH);
  if (!(worst <= TOLERANCE * max_v)) {
    fprintf(stderr, "FAILED: a call differs from the naive attention by %.3g > %g * max|v|\n",
            worst, TOLERANCE);
    return 2;
  }
  printf("ok\n");
  return 0;
}
