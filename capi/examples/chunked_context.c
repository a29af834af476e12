/* A long context attended chunk by chunk, merged with qkv_attention_merge_f32.
 *
 * When a KV cache is too large for one buffer (spilled to host memory or
 * disk in pieces), or is spread over devices (context parallelism), each
 * piece is attended on its own: one qkv_attention_f32 call per chunk, with
 * the lse output (log of the softmax denominator over the chunk's keys).
 * qkv_attention_merge_f32 then combines two partial results over disjoint
 * keys into the result over their union, exactly up to rounding, so folding
 * the chunks' results one into another gives attention over the whole
 * context.
 *
 * Shapes: batch 2, 4 query heads over 2 kv heads (GQA), 5 queries, a context
 * of 1000 keys split into uneven chunks of 300, 1, 256 and 443 keys
 * (head_dim 32, value_dim 48). K is [batch][kv_heads][kv_len][head_dim]; a
 * chunk of it is dense for one (batch, kv head) only, so each chunk is
 * copied into its own dense [batch][kv_heads][chunk][dim] buffers, as a
 * spilled cache would hold it, and one call serves all heads of the chunk.
 *
 * Masks, each case checked:
 *   - none;
 *   - valid lengths per batch over the whole context, which each chunk turns
 *     into clamp(valid - chunk begin, 0, chunk size): a chunk a sequence
 *     does not reach gives rows with out 0 and lse -inf (the call still
 *     needs kv_len >= 1, which every chunk has), and a sequence of valid
 *     length 0 ends with out 0, lse -inf;
 *   - a bias [batch][q_heads][q_len][kv_len] with -INFINITY entries (one row
 *     sees only the first chunk, one row sees nothing): each chunk gets its
 *     columns, copied into a dense [batch][q_heads][q_len][chunk] bias;
 *   - both.
 * For each: the chunks merged in order and in reverse order are compared
 * with one call over all 1000 keys (out within 5e-5 * max|v|, lse within
 * 1e-5 * max(1, |lse|), the same rows -inf), and merge(a, b) == merge(b, a)
 * bitwise for every pair of chunk results. Exit status 0 only if all hold
 * (ctest -R example_chunked_context).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qkv/qkv.h"

#define BATCH 2
#define Q_HEADS 4
#define KV_HEADS 2
#define Q_LEN 5
#define KV_LEN 1000
#define DIM 32
#define VDIM 48
#define N_CHUNKS 4
#define ROWS (BATCH * Q_HEADS * Q_LEN) /* rows of out and lse */

static const int kChunkLen[N_CHUNKS] = {300, 1, 256, 443};

typedef struct Case {
  const char *name;
  int valid, bias;
  int32_t valid_lens[BATCH];
} Case;

static const Case kCases[] = {
    {"no mask", 0, 0, {0, 0}},
    {"valid {300, 700}", 1, 0, {300, 700}}, /* ends on a chunk edge; inside one */
    {"valid {0, 1000}", 1, 0, {0, 1000}},   /* one sequence sees nothing */
    {"valid {301, 5}", 1, 0, {301, 5}},     /* chunks 2 and 3: nobody */
    {"bias", 0, 1, {0, 0}},
    {"valid {557, 999} + bias", 1, 1, {557, 999}},
};
#define N_CASES ((int)(sizeof(kCases) / sizeof(kCases[0])))

static unsigned long long g_rng = 77;
static float Uniform(void) { /* [-1, 1) */
  g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)((double)(g_rng >> 11) / 4503599627370496.0 - 1.0);
}

/* The whole context and the queries. */
static float q[BATCH * Q_HEADS * Q_LEN * DIM];
static float k[BATCH * KV_HEADS * KV_LEN * DIM];
static float v[BATCH * KV_HEADS * KV_LEN * VDIM];
static float bias[BATCH * Q_HEADS * Q_LEN * KV_LEN];

/* One chunk's dense copies (sized for the whole context). */
static float k_chunk[BATCH * KV_HEADS * KV_LEN * DIM];
static float v_chunk[BATCH * KV_HEADS * KV_LEN * VDIM];
static float bias_chunk[BATCH * Q_HEADS * Q_LEN * KV_LEN];

/* Each chunk's result, the merged ones and the single call's. */
static float out_chunk[N_CHUNKS][ROWS * VDIM], lse_chunk[N_CHUNKS][ROWS];
static float out_merged[ROWS * VDIM], lse_merged[ROWS];
static float out_full[ROWS * VDIM], lse_full[ROWS];

/* A workspace grown to the largest call (outside any hot loop). */
static void *g_ws;
static size_t g_ws_bytes;

static qkv_status Attend(const qkv_attention_desc *d, const float *keys, const float *values,
                         float *out, float *lse) {
  const size_t bytes = qkv_attention_workspace_size(d);
  if (bytes > g_ws_bytes) {
    free(g_ws);
    g_ws = malloc(bytes);
    g_ws_bytes = g_ws ? bytes : 0;
    if (!g_ws) return QKV_ERR_WORKSPACE_TOO_SMALL;
  }
  return qkv_attention_f32(d, q, keys, values, out, NULL, lse, g_ws, g_ws_bytes);
}

/* The descriptor of a call over keys [begin, begin + len) of the context,
 * its valid lengths written to lens and its bias columns to bias_chunk. */
static void InitDesc(const Case *c, int begin, int len, int32_t lens[BATCH],
                     qkv_attention_desc *d) {
  int b, row, j;
  qkv_attention_desc_init(d, BATCH, Q_HEADS, KV_HEADS, Q_LEN, len, DIM, VDIM);
  if (c->valid) {
    for (b = 0; b < BATCH; ++b) {
      const int local = c->valid_lens[b] - begin;
      lens[b] = local < 0 ? 0 : local > len ? len : local;
    }
    d->mask |= QKV_MASK_VALID_LENS;
    d->valid_lens = lens;
  }
  if (c->bias) {
    for (row = 0; row < ROWS; ++row) {
      for (j = 0; j < len; ++j) {
        bias_chunk[(size_t)row * len + j] = bias[(size_t)row * KV_LEN + begin + j];
      }
    }
    d->mask |= QKV_MASK_BIAS;
    d->bias = bias_chunk;
    d->bias_head_stride = (int64_t)Q_LEN * len;
    d->bias_batch_stride = (int64_t)Q_HEADS * Q_LEN * len;
  }
}

/* Attends chunk `index` (keys [begin, begin + len)) into out_chunk/lse_chunk. */
static qkv_status AttendChunk(const Case *c, int index, int begin, int len) {
  qkv_attention_desc d;
  int32_t lens[BATCH];
  int bh;
  /* Copy the chunk out of every (batch, kv head): its own dense buffers. */
  for (bh = 0; bh < BATCH * KV_HEADS; ++bh) {
    memcpy(&k_chunk[(size_t)bh * len * DIM], &k[((size_t)bh * KV_LEN + begin) * DIM],
           sizeof(float) * (size_t)len * DIM);
    memcpy(&v_chunk[(size_t)bh * len * VDIM], &v[((size_t)bh * KV_LEN + begin) * VDIM],
           sizeof(float) * (size_t)len * VDIM);
  }
  InitDesc(c, begin, len, lens, &d);
  return Attend(&d, k_chunk, v_chunk, out_chunk[index], lse_chunk[index]);
}

/* Folds the chunk results into out_merged/lse_merged, first chunk first or
 * last chunk first. */
static int MergeChunks(int reverse) {
  int i;
  const int first = reverse ? N_CHUNKS - 1 : 0;
  memcpy(out_merged, out_chunk[first], sizeof(out_merged));
  memcpy(lse_merged, lse_chunk[first], sizeof(lse_merged));
  for (i = 1; i < N_CHUNKS; ++i) {
    const int c = reverse ? N_CHUNKS - 1 - i : i;
    if (qkv_attention_merge_f32(ROWS, VDIM, out_chunk[c], lse_chunk[c], out_merged,
                                lse_merged) != QKV_OK) {
      return 1;
    }
  }
  return 0;
}

/* Compares out_merged/lse_merged with the single call. Returns 0 when within
 * the bounds; the errors go to *out_err and *lse_err, the -inf rows to
 * *empty. */
static int CompareWithFull(double max_v, double *out_err, double *lse_err, int *empty) {
  int row, col, mismatch = 0;
  *out_err = *lse_err = 0.0;
  *empty = 0;
  for (row = 0; row < ROWS; ++row) {
    for (col = 0; col < VDIM; ++col) {
      const double e = fabs((double)out_merged[row * VDIM + col] - out_full[row * VDIM + col]);
      if (!(e <= *out_err)) *out_err = e; /* NaN propagates */
    }
    if (lse_full[row] == -INFINITY || lse_merged[row] == -INFINITY) {
      mismatch |= lse_full[row] != lse_merged[row];
      ++*empty;
    } else {
      const double a = fabs((double)lse_full[row]);
      const double e = fabs((double)lse_merged[row] - lse_full[row]) / (a > 1.0 ? a : 1.0);
      if (!(e <= *lse_err)) *lse_err = e;
    }
  }
  return mismatch || !(*out_err <= 5e-5 * max_v) || !(*lse_err <= 1e-5);
}

/* merge(a, b) == merge(b, a) bitwise for every pair of chunk results.
 * Returns the number of pairs that differ (or failed). */
static int CheckCommutative(void) {
  static float out_ab[ROWS * VDIM], lse_ab[ROWS], out_ba[ROWS * VDIM], lse_ba[ROWS];
  int a, b, bad = 0;
  for (a = 0; a < N_CHUNKS; ++a) {
    for (b = a + 1; b < N_CHUNKS; ++b) {
      memcpy(out_ab, out_chunk[b], sizeof(out_ab)); /* a merged into b */
      memcpy(lse_ab, lse_chunk[b], sizeof(lse_ab));
      memcpy(out_ba, out_chunk[a], sizeof(out_ba)); /* b merged into a */
      memcpy(lse_ba, lse_chunk[a], sizeof(lse_ba));
      if (qkv_attention_merge_f32(ROWS, VDIM, out_chunk[a], lse_chunk[a], out_ab, lse_ab) !=
              QKV_OK ||
          qkv_attention_merge_f32(ROWS, VDIM, out_chunk[b], lse_chunk[b], out_ba, lse_ba) !=
              QKV_OK ||
          memcmp(out_ab, out_ba, sizeof(out_ab)) != 0 ||
          memcmp(lse_ab, lse_ba, sizeof(lse_ab)) != 0) {
        ++bad;
      }
    }
  }
  return bad;
}

int main(void) {
  double max_v = 0.0, worst_out = 0.0, worst_lse = 0.0;
  int failures = 0, i, ci;
  size_t n;

  for (n = 0; n < sizeof(q) / sizeof(q[0]); ++n) q[n] = 2.0f * Uniform();
  for (n = 0; n < sizeof(k) / sizeof(k[0]); ++n) k[n] = Uniform();
  for (n = 0; n < sizeof(v) / sizeof(v[0]); ++n) {
    v[n] = Uniform();
    if (fabs((double)v[n]) > max_v) max_v = fabs((double)v[n]);
  }
  /* The bias: a small random term, -INFINITY for about 1 key in 10; row 0
   * (batch 0, head 0, query 0) sees only the first chunk, the last row
   * nothing. */
  for (n = 0; n < sizeof(bias) / sizeof(bias[0]); ++n) {
    const float u = Uniform();
    bias[n] = u > 0.8f ? -INFINITY : 0.5f * u;
  }
  for (i = kChunkLen[0]; i < KV_LEN; ++i) bias[i] = -INFINITY;
  for (i = 0; i < KV_LEN; ++i) bias[(size_t)(ROWS - 1) * KV_LEN + i] = -INFINITY;

  printf("chunked context on %s: batch %d, %d query heads over %d kv heads, %d queries,\n"
         "%d keys in chunks of %d, %d, %d and %d (d = %d, dv = %d)\n",
         qkv_backend(), BATCH, Q_HEADS, KV_HEADS, Q_LEN, KV_LEN, kChunkLen[0], kChunkLen[1],
         kChunkLen[2], kChunkLen[3], DIM, VDIM);

  for (ci = 0; ci < N_CASES; ++ci) {
    const Case *c = &kCases[ci];
    qkv_attention_desc d;
    int32_t lens[BATCH];
    double out_err, lse_err, rev_out_err, rev_lse_err;
    int begin = 0, empty, bad, ordered_bad, reversed_bad, non_commutative, same_bits;
    qkv_status st;
    static float out_forward[ROWS * VDIM], lse_forward[ROWS];

    InitDesc(c, 0, KV_LEN, lens, &d); /* the single call over all keys */
    st = Attend(&d, k, v, out_full, lse_full);
    for (i = 0; i < N_CHUNKS && st == QKV_OK; ++i) {
      st = AttendChunk(c, i, begin, kChunkLen[i]);
      begin += kChunkLen[i];
    }
    if (st != QKV_OK) {
      fprintf(stderr, "%s: qkv_attention_f32: %s\n", c->name, qkv_status_string(st));
      return 1;
    }
    if (MergeChunks(0) != 0) {
      fprintf(stderr, "%s: qkv_attention_merge_f32 failed\n", c->name);
      return 1;
    }
    ordered_bad = CompareWithFull(max_v, &out_err, &lse_err, &empty);
    memcpy(out_forward, out_merged, sizeof(out_forward));
    memcpy(lse_forward, lse_merged, sizeof(lse_forward));
    if (MergeChunks(1) != 0) {
      fprintf(stderr, "%s: qkv_attention_merge_f32 failed\n", c->name);
      return 1;
    }
    reversed_bad = CompareWithFull(max_v, &rev_out_err, &rev_lse_err, &empty);
    same_bits = memcmp(out_forward, out_merged, sizeof(out_forward)) == 0 &&
                memcmp(lse_forward, lse_merged, sizeof(lse_forward)) == 0;
    non_commutative = CheckCommutative();
    bad = ordered_bad || reversed_bad || non_commutative;
    printf("  %-24s max |out - full| %.2g, lse %.2g; reversed %.2g, %.2g (%s bits);"
           " %2d of %d rows -inf; %s\n",
           c->name, out_err, lse_err, rev_out_err, rev_lse_err, same_bits ? "same" : "other",
           empty, ROWS,
           non_commutative ? "merge NOT commutative" : "merge(a,b) == merge(b,a)");
    if (bad) {
      fprintf(stderr, "FAILED: %s\n", c->name);
      ++failures;
    }
    if (!(out_err <= worst_out)) worst_out = out_err;
    if (!(rev_out_err <= worst_out)) worst_out = rev_out_err;
    if (!(lse_err <= worst_lse)) worst_lse = lse_err;
    if (!(rev_lse_err <= worst_lse)) worst_lse = rev_lse_err;
  }
  free(g_ws);
  printf("%d cases, %d chunks each, merged in both orders: max |out - one call| = %.3g "
         "(bound %.3g), max lse error %.3g (bound 1e-05); %s\n",
         N_CASES, N_CHUNKS, worst_out, 5e-5 * max_v, worst_lse,
         failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
