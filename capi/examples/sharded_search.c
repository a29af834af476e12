/* A differentiable search engine over documents sharded across MPI ranks.
 *
 * Attention is a soft database lookup: a batch of queries scores every
 * document's key (an embedding), and each answer is the softmax-weighted sum
 * of the documents' values (payloads). Here the N documents live on several
 * machines: rank r holds the contiguous block [begin, end) of the document
 * index, computes attention of the whole query batch over its own shard with
 * one qkv_attention_f32 call (asking for the lse, the log of the softmax
 * denominator), and the ranks combine their partial answers exactly with
 * qkv_attention_merge_f32. No rank ever sees another's documents.
 *
 *   mpirun -np 4 qkv_sharded_search [--docs N] [--queries Q] [--dim D]
 *       [--value-dim V] [--threads T] [--reps R] [--mask none|valid|bias|both]
 *       [--combine reduce|gather] [--check]
 *
 * The data: document d's key (D floats) and value (V floats) are a hash of d
 * alone, so each rank generates only its shard and the documents do not
 * depend on the rank count. Query i is a noisy, scaled copy of the key of a
 * "target" document (also a hash of i), generated identically on every rank,
 * so its attention concentrates near that document wherever it is stored.
 * Masks (--mask):
 *   valid  a valid length per query over the GLOBAL document index (query 0:
 *          0, it sees nothing and gets out 0, lse -inf; query 1: all N;
 *          query 2: N/3 + 1, which ends inside a shard; the others hashed).
 *          Each rank passes clamp(valid - begin, 0, shard size).
 *   bias   a per-(query, document) bias: a recency prior that favours
 *          higher document numbers, -INFINITY for about 1 in 8 pairs (a
 *          filter), and every document hidden from the last query. Each rank
 *          builds its [Q][shard] slice.
 *   both   the two together.
 *
 * Combining (--combine):
 *   reduce (default) MPI_Reduce to rank 0 with a user MPI_Op created with
 *          commute = 0, over a contiguous datatype of V + 1 floats: the
 *          partial results are packed [Q][V + 1], each row's out followed by
 *          its lse, and the op merges row by row. One collective call, and
 *          MPI picks a tree: log2(ranks) steps instead of ranks - 1 at the
 *          root, merges spread over the ranks, and no buffer of ranks * Q
 *          rows anywhere.
 *   gather MPI_Gather of every rank's packed rows to rank 0, which merges
 *          them in rank order itself (((r0 + r1) + r2) + ...): simple and
 *          obviously ordered, but the root receives and merges everything.
 *
 * Why the result is deterministic for a fixed rank count. The merge is
 * bitwise commutative (merging a into b gives the bits of b into a) but not
 * associative in rounding: ((a + b) + c) and (a + (b + c)) may differ in the
 * last bits, both within the accuracy bound. Created with commute = 0, the op
 * must be applied in rank order (MPI 3.1, 5.9.5: the result is
 * v0 op v1 op ... op v(p-1), parenthesized as the implementation likes);
 * with commute = 1 MPI could also reorder the operands as messages arrive.
 * Open MPI's "tuned" collectives pick the algorithm, and so the
 * parenthesization, from the communicator size and the message size alone
 * (4.1, non-commutative ops: linear at the root below 12 ranks and 2048
 * bytes, else an in-order binary tree; 64 queries of 65 floats are 16640
 * bytes), so a fixed np and query batch give a fixed tree and fixed bits run
 * after run. At 1 and 2 ranks reduce and gather give the same bits (at most
 * one merge, commutative); at 4 they differ in the last bits (another tree). The standard
 * itself only recommends ("advice to implementors", 5.9.1) that a reduction
 * give the same result whenever the function is applied to the same
 * arguments in the same order; it does not promise it, and another MPI (or
 * a forced coll_tuned_reduce_algorithm) may choose another tree. Gather mode
 * fixes the order in this program. Either way each rank's part is
 * deterministic (qkv is bitwise identical for any thread count), and a
 * different rank count gives a different, equally accurate, set of bits.
 *
 * Every rank has its own small thread pool (--threads, default 1) handed to
 * qkv through desc.parallel_for. MPI is called from the main thread only
 * (MPI_THREAD_FUNNELED).
 *
 * Output (rank 0): the shard sizes, the median time per query batch over R
 * repetitions and how it splits into local attention, the merge function and
 * the rest of the reduction (see Timing), and `result-hash: <hex>`, an FNV-1a
 * hash of the merged out and lse bytes, which a test compares across runs.
 * With --check rank 0 also computes one qkv_attention_f32 call over all N
 * documents and compares: out within 5e-5 * max|v|, lse within
 * 1e-5 * max(1, |lse|), the same rows -inf; the exit status is nonzero on a
 * failure (capi/examples/run_mpi_test.sh, ctest -R mpi_sharded_search).
 */
#define _POSIX_C_SOURCE 200809L /* pthreads under -std=c99 */

#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qkv/qkv.h"

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

/* MPI_COMM_WORLD reports errors (MPI_ERRORS_RETURN, set in main) instead of
 * aborting inside the library; this says which call failed, then aborts
 * the job (one rank failing in a collective would leave the others
 * waiting). */
static void MpiFail(int code, const char *call, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) {
    snprintf(text, sizeof(text), "error %d", code);
  }
  fprintf(stderr, "sharded_search: %s failed (line %d): %s\n", call, line, text);
  MPI_Abort(MPI_COMM_WORLD, 3);
}

#define CHECK_MPI(call)                                    \
  do {                                                     \
    const int mpi_code_ = (call);                          \
    if (mpi_code_ != MPI_SUCCESS) MpiFail(mpi_code_, #call, __LINE__); \
  } while (0)

static void *Alloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "sharded_search: out of memory (%lu bytes)\n",
            (unsigned long)bytes);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  return p;
}

/* ------------------------------------------------------------------------ */
/* Deterministic data: every number is a hash of what it describes          */
/* ------------------------------------------------------------------------ */

enum { kStreamKey = 1, kStreamValue, kStreamQuery, kStreamTarget,
       kStreamValid, kStreamFilter };

static uint64_t Mix(uint64_t x) { /* splitmix64's finalizer */
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/* A hash of (stream, item, column). */
static uint64_t Hash(int stream, int64_t item, int64_t column) {
  return Mix(Mix(((uint64_t)stream << 56) ^ (uint64_t)item) + (uint64_t)column);
}

/* Uniform in [-1, 1), exactly representable (24 bits). */
static float Uniform(int stream, int64_t item, int64_t column) {
  return (float)((double)(Hash(stream, item, column) >> 40) / 8388608.0 - 1.0);
}

typedef struct Config {
  int64_t docs, queries, dim, value_dim;
  int threads, reps, check;
  int valid, bias;    /* --mask */
  int gather;         /* --combine gather */
} Config;

/* Document d's key or value row. */
static void DocRow(int stream, int64_t d, int64_t n, float *row) {
  int64_t c;
  for (c = 0; c < n; ++c) row[c] = Uniform(stream, d, c);
}

/* The query batch [Q][D]: query i is 3 * key(target_i) + noise. */
static void MakeQueries(const Config *cfg, float *q) {
  int64_t i, c;
  for (i = 0; i < cfg->queries; ++i) {
    const int64_t target = (int64_t)(Hash(kStreamTarget, i, 0) % (uint64_t)cfg->docs);
    float *row = &q[i * cfg->dim];
    DocRow(kStreamKey, target, cfg->dim, row);
    for (c = 0; c < cfg->dim; ++c) {
      row[c] = 3.0f * row[c] + 0.5f * Uniform(kStreamQuery, i, c);
    }
  }
}

/* Query i's valid length over the global document index, in [0, N]. */
static int32_t GlobalValid(const Config *cfg, int64_t i) {
  if (i == 0) return 0;                       /* sees nothing */
  if (i == 1) return (int32_t)cfg->docs;      /* sees everything */
  if (i == 2) return (int32_t)(cfg->docs / 3 + 1 <= cfg->docs ? cfg->docs / 3 + 1 : cfg->docs);
  return (int32_t)(Hash(kStreamValid, i, 0) % (uint64_t)(cfg->docs + 1));
}

/* The bias of (query i, document d): a recency prior (log-distance from the
 * newest document), -INFINITY for filtered pairs and for every document of
 * the last query (when there are more than 3 queries). */
static float Bias(const Config *cfg, int64_t i, int64_t d) {
  if (i == cfg->queries - 1 && cfg->queries > 3) return -INFINITY;
  if (Hash(kStreamFilter, i, d) % 8 == 0) return -INFINITY;
  return (float)(-0.25 * log1p((double)(cfg->docs - 1 - d) / 1000.0));
}

/* ------------------------------------------------------------------------ */
/* A small persistent thread pool for desc.parallel_for                     */
/* ------------------------------------------------------------------------ */

/* Worker 0 is the thread that calls ParallelFor; workers 1..n-1 sleep on a
 * condition variable between calls. Tasks are handed out one at a time from
 * a counter under the mutex (qkv's tasks are whole tiles: coarse enough). */
typedef struct Pool Pool;

typedef struct Helper { /* what a helper thread is started with */
  Pool *pool;
  size_t worker;
} Helper;

struct Pool {
  pthread_mutex_t mu;
  pthread_cond_t work, done;
  pthread_t *threads; /* [num_workers]; [0] unused (the caller) */
  Helper *helpers;    /* [num_workers] */
  size_t num_workers;
  unsigned long generation; /* bumped by every ParallelFor */
  int stop;
  qkv_task_fn fn;
  void *arg;
  size_t num_tasks, next_task;
  size_t busy; /* helpers not yet finished with the current generation */
};

static void RunTasks(Pool *pool, size_t worker) {
  for (;;) {
    size_t task;
    pthread_mutex_lock(&pool->mu);
    task = pool->next_task < pool->num_tasks ? pool->next_task++ : pool->num_tasks;
    pthread_mutex_unlock(&pool->mu);
    if (task == pool->num_tasks) return;
    pool->fn(pool->arg, task, worker);
  }
}

static void *HelperMain(void *p) {
  Helper *self = (Helper *)p;
  Pool *pool = self->pool;
  unsigned long seen = 0;
  for (;;) {
    pthread_mutex_lock(&pool->mu);
    while (!pool->stop && pool->generation == seen) {
      pthread_cond_wait(&pool->work, &pool->mu);
    }
    if (pool->stop) {
      pthread_mutex_unlock(&pool->mu);
      return NULL;
    }
    seen = pool->generation;
    pthread_mutex_unlock(&pool->mu);
    RunTasks(pool, self->worker);
    pthread_mutex_lock(&pool->mu);
    if (--pool->busy == 0) pthread_cond_signal(&pool->done);
    pthread_mutex_unlock(&pool->mu);
  }
}

/* qkv_parallel_for_fn. Returns once every helper has finished this
 * generation, so none can miss the next one. */
static void ParallelFor(void *ctx, size_t num_tasks, qkv_task_fn fn, void *arg) {
  Pool *pool = (Pool *)ctx;
  pthread_mutex_lock(&pool->mu);
  pool->fn = fn;
  pool->arg = arg;
  pool->num_tasks = num_tasks;
  pool->next_task = 0;
  pool->busy = pool->num_workers - 1;
  ++pool->generation;
  pthread_cond_broadcast(&pool->work);
  pthread_mutex_unlock(&pool->mu);
  RunTasks(pool, 0);
  pthread_mutex_lock(&pool->mu);
  while (pool->busy > 0) pthread_cond_wait(&pool->done, &pool->mu);
  pthread_mutex_unlock(&pool->mu);
}

static void PoolStart(Pool *pool, size_t num_workers) {
  size_t w;
  memset(pool, 0, sizeof(*pool));
  pthread_mutex_init(&pool->mu, NULL);
  pthread_cond_init(&pool->work, NULL);
  pthread_cond_init(&pool->done, NULL);
  pool->num_workers = num_workers;
  pool->threads = (pthread_t *)Alloc(sizeof(pthread_t) * num_workers);
  pool->helpers = (Helper *)Alloc(sizeof(Helper) * num_workers);
  for (w = 1; w < num_workers; ++w) {
    pool->helpers[w].pool = pool;
    pool->helpers[w].worker = w;
    if (pthread_create(&pool->threads[w], NULL, HelperMain, &pool->helpers[w]) != 0) {
      fprintf(stderr, "sharded_search: pthread_create failed\n");
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
  }
}

static void PoolStop(Pool *pool) {
  size_t w;
  pthread_mutex_lock(&pool->mu);
  pool->stop = 1;
  pthread_cond_broadcast(&pool->work);
  pthread_mutex_unlock(&pool->mu);
  for (w = 1; w < pool->num_workers; ++w) pthread_join(pool->threads[w], NULL);
  pthread_cond_destroy(&pool->done);
  pthread_cond_destroy(&pool->work);
  pthread_mutex_destroy(&pool->mu);
  free(pool->threads);
  free(pool->helpers);
}

/* ------------------------------------------------------------------------ */
/* The merge as an MPI_Op                                                   */
/* ------------------------------------------------------------------------ */

/* Seconds spent inside MergeRows in the current repetition (this rank). */
static double g_merge_seconds;

/* MPI_User_function: inoutvec := invec op inoutvec for *len elements of
 * *datatype, each a packed row [out (V floats), lse]. MPI 3.1, 5.9.5: with
 * commute = 0 invec holds the lower ranks' combination and inoutvec the
 * higher ones'; our merge gives the same bits either way round. The
 * function may call non-communication MPI functions (MPI_Type_size,
 * MPI_Wtime); an unusable datatype aborts. */
static void MergeRows(void *invec, void *inoutvec, int *len, MPI_Datatype *datatype) {
  const double start = MPI_Wtime();
  const float *in = (const float *)invec;
  float *inout = (float *)inoutvec;
  int bytes = 0, r;
  int64_t v;
  if (MPI_Type_size(*datatype, &bytes) != MPI_SUCCESS || bytes < 2 * (int)sizeof(float) ||
      bytes % (int)sizeof(float) != 0) {
    fprintf(stderr, "sharded_search: merge op given a datatype of %d bytes\n", bytes);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  v = bytes / (int)sizeof(float) - 1; /* value_dim */
  for (r = 0; r < *len; ++r) {
    const float *a = &in[(int64_t)r * (v + 1)];
    float *b = &inout[(int64_t)r * (v + 1)];
    if (qkv_attention_merge_f32(1, v, a, a + v, b, b + v) != QKV_OK) {
      fprintf(stderr, "sharded_search: qkv_attention_merge_f32 failed\n");
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
  }
  g_merge_seconds += MPI_Wtime() - start;
}

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

/* FNV-1a (64-bit) over bytes, continuing from h. */
static uint64_t Fnv1a(uint64_t h, const void *data, size_t bytes) {
  const unsigned char *p = (const unsigned char *)data;
  size_t i;
  for (i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001B3ULL;
  }
  return h;
}

/* The hash of packed rows [Q][V + 1]: every out row, then every lse. */
static uint64_t ResultHash(const float *packed, int64_t rows, int64_t v) {
  uint64_t h = 0xCBF29CE484222325ULL;
  int64_t r;
  for (r = 0; r < rows; ++r) h = Fnv1a(h, &packed[r * (v + 1)], sizeof(float) * (size_t)v);
  for (r = 0; r < rows; ++r) h = Fnv1a(h, &packed[r * (v + 1) + v], sizeof(float));
  return h;
}

static int CompareDoubles(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double Median(double *values, int n) { /* sorts values */
  qsort(values, (size_t)n, sizeof(double), CompareDoubles);
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/* Rank r's shard [*begin, *begin + *len): the first N % p ranks hold one
 * document more; ranks beyond N hold none. */
static void Shard(int64_t docs, int ranks, int r, int64_t *begin, int64_t *len) {
  const int64_t base = docs / ranks, extra = docs % ranks;
  *begin = r * base + (r < extra ? r : extra);
  *len = base + (r < extra ? 1 : 0);
}

/* Attention of the query batch over documents [begin, begin + len) (len >= 1)
 * with the configured masks: builds the descriptor, the local valid lengths
 * and the bias slice. valid and bias are caller buffers of Q and Q * len. */
static void InitDesc(const Config *cfg, int64_t begin, int64_t len, int32_t *valid,
                     float *bias, qkv_attention_desc *desc) {
  int64_t i, d;
  qkv_attention_desc_init(desc, 1, 1, 1, cfg->queries, len, cfg->dim, cfg->value_dim);
  if (cfg->valid) {
    for (i = 0; i < cfg->queries; ++i) {
      int64_t local = (int64_t)GlobalValid(cfg, i) - begin;
      valid[i] = (int32_t)(local < 0 ? 0 : local > len ? len : local);
    }
    desc->mask |= QKV_MASK_VALID_LENS;
    desc->valid_lens = valid;
    desc->valid_lens_per_query = 1;
  }
  if (cfg->bias) {
    for (i = 0; i < cfg->queries; ++i) {
      for (d = 0; d < len; ++d) bias[i * len + d] = Bias(cfg, i, begin + d);
    }
    desc->mask |= QKV_MASK_BIAS;
    desc->bias = bias; /* one [Q][len] matrix: batch and head strides 0 */
  }
}

/* Packs out [Q][V] and lse [Q] into rows [Q][V + 1]. */
static void Pack(const Config *cfg, const float *out, const float *lse, float *packed) {
  const int64_t v = cfg->value_dim;
  int64_t i;
  for (i = 0; i < cfg->queries; ++i) {
    memcpy(&packed[i * (v + 1)], &out[i * v], sizeof(float) * (size_t)v);
    packed[i * (v + 1) + v] = lse[i];
  }
}

/* Rank 0's --check: one call over all N documents, compared with the merged
 * rows. Returns 0 when within the bounds. */
static int CheckAgainstFullCall(const Config *cfg, const float *queries, const float *merged) {
  const int64_t n = cfg->docs, q = cfg->queries, v = cfg->value_dim;
  float *k = (float *)Alloc(sizeof(float) * (size_t)(n * cfg->dim));
  float *val = (float *)Alloc(sizeof(float) * (size_t)(n * v));
  float *bias = (float *)Alloc(sizeof(float) * (size_t)(cfg->bias ? q * n : 1));
  int32_t *valid = (int32_t *)Alloc(sizeof(int32_t) * (size_t)q);
  float *out = (float *)Alloc(sizeof(float) * (size_t)(q * v));
  float *lse = (float *)Alloc(sizeof(float) * (size_t)q);
  qkv_attention_desc desc;
  size_t bytes;
  void *ws;
  qkv_status st;
  double max_v = 0.0, out_err = 0.0, lse_err = 0.0;
  int64_t i, c, empty_rows = 0;
  int inf_mismatch = 0;
  for (i = 0; i < n; ++i) {
    DocRow(kStreamKey, i, cfg->dim, &k[i * cfg->dim]);
    DocRow(kStreamValue, i, v, &val[i * v]);
  }
  for (i = 0; i < n * v; ++i) {
    if (fabs((double)val[i]) > max_v) max_v = fabs((double)val[i]);
  }
  InitDesc(cfg, 0, n, valid, bias, &desc);
  bytes = qkv_attention_workspace_size(&desc);
  ws = bytes ? Alloc(bytes) : NULL;
  st = qkv_attention_f32(&desc, queries, k, val, out, NULL, lse, ws, bytes);
  if (st != QKV_OK) {
    fprintf(stderr, "check: full call failed: %s\n", qkv_status_string(st));
    return 1;
  }
  for (i = 0; i < q; ++i) {
    const float got_lse = merged[i * (v + 1) + v];
    for (c = 0; c < v; ++c) {
      const double e = fabs((double)merged[i * (v + 1) + c] - (double)out[i * v + c]);
      if (!(e <= out_err)) out_err = e; /* NaN propagates */
    }
    if (lse[i] == -INFINITY || got_lse == -INFINITY) {
      if (lse[i] != got_lse) inf_mismatch = 1;
      ++empty_rows;
    } else {
      const double a = fabs((double)lse[i]);
      const double e = fabs((double)got_lse - (double)lse[i]) / (a > 1.0 ? a : 1.0);
      if (!(e <= lse_err)) lse_err = e;
    }
  }
  free(ws);
  free(k);
  free(val);
  free(bias);
  free(valid);
  free(out);
  free(lse);
  printf("check against one call over all %lld documents: max |out err| = %.3g "
         "(bound %.3g), max lse err = %.3g (bound 1e-05 * max(1, |lse|)), "
         "%lld rows see no document%s\n",
         (long long)n, out_err, 5e-5 * max_v, lse_err, (long long)empty_rows,
         inf_mismatch ? " (MISMATCH: -inf in one result only)" : "");
  if (!(out_err <= 5e-5 * max_v) || !(lse_err <= 1e-5) || inf_mismatch) {
    fprintf(stderr, "check FAILED\n");
    return 1;
  }
  printf("check ok\n");
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Options                                                                  */
/* ------------------------------------------------------------------------ */

static void Usage(void) {
  fprintf(stderr,
          "usage: mpirun -np P qkv_sharded_search [--docs N] [--queries Q] [--dim D]\n"
          "  [--value-dim V] [--threads T] [--reps R] [--mask none|valid|bias|both]\n"
          "  [--combine reduce|gather] [--check]\n");
}

/* Parses a positive integer option value no larger than max. */
static int ParseCount(const char *text, int64_t max, int64_t *value) {
  char *end = NULL;
  long long x;
  if (!text) return 0;
  x = strtoll(text, &end, 10);
  if (end == text || *end != '\0' || x < 1 || x > max) return 0;
  *value = x;
  return 1;
}

/* Returns 0 on success, else prints the problem and the usage. */
static int ParseArgs(int argc, char **argv, int verbose, Config *cfg) {
  int a;
  cfg->docs = 20000;
  cfg->queries = 64;
  cfg->dim = 64;
  cfg->value_dim = 64;
  cfg->threads = 1;
  cfg->reps = 5;
  cfg->check = 0;
  cfg->valid = cfg->bias = 0;
  cfg->gather = 0;
  for (a = 1; a < argc; ++a) {
    const char *opt = argv[a], *val = a + 1 < argc ? argv[a + 1] : NULL;
    int64_t x = 0;
    int ok = 1, takes_value = 1;
    if (strcmp(opt, "--docs") == 0) {
      ok = ParseCount(val, INT32_MAX, &cfg->docs); /* valid lengths are int32 */
    } else if (strcmp(opt, "--queries") == 0) {
      ok = ParseCount(val, 1 << 20, &cfg->queries);
    } else if (strcmp(opt, "--dim") == 0) {
      ok = ParseCount(val, 1 << 16, &cfg->dim);
    } else if (strcmp(opt, "--value-dim") == 0) {
      ok = ParseCount(val, 1 << 16, &cfg->value_dim);
    } else if (strcmp(opt, "--threads") == 0) {
      ok = ParseCount(val, 256, &x);
      cfg->threads = (int)x;
    } else if (strcmp(opt, "--reps") == 0) {
      ok = ParseCount(val, 100000, &x);
      cfg->reps = (int)x;
    } else if (strcmp(opt, "--mask") == 0) {
      ok = val != NULL;
      if (ok && strcmp(val, "none") == 0) {
        cfg->valid = cfg->bias = 0;
      } else if (ok && strcmp(val, "valid") == 0) {
        cfg->valid = 1;
      } else if (ok && strcmp(val, "bias") == 0) {
        cfg->bias = 1;
      } else if (ok && strcmp(val, "both") == 0) {
        cfg->valid = cfg->bias = 1;
      } else {
        ok = 0;
      }
    } else if (strcmp(opt, "--combine") == 0) {
      ok = val != NULL && (strcmp(val, "reduce") == 0 || strcmp(val, "gather") == 0);
      cfg->gather = ok && strcmp(val, "gather") == 0;
    } else if (strcmp(opt, "--check") == 0) {
      cfg->check = 1;
      takes_value = 0;
    } else {
      if (verbose) fprintf(stderr, "unknown option %s\n", opt);
      if (verbose) Usage();
      return 1;
    }
    if (!ok) {
      if (verbose) fprintf(stderr, "bad or missing value for %s\n", opt);
      if (verbose) Usage();
      return 1;
    }
    a += takes_value;
  }
  /* The packed row's MPI datatype counts floats in an int. */
  if ((cfg->value_dim + 1) * cfg->queries > INT32_MAX / 4) {
    if (verbose) fprintf(stderr, "queries * (value-dim + 1) too large\n");
    return 1;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Main                                                                     */
/* ------------------------------------------------------------------------ */

/* One rank's run: its shard of the documents, the shared queries, the
 * buffers of its call and of the reduction, and the timings. */
typedef struct Run {
  Config cfg;
  int rank, ranks;
  int64_t begin, len; /* this rank's documents [begin, begin + len) */
  float *queries, *keys, *values, *bias, *out, *lse, *packed;
  float *merged, *gathered; /* rank 0 */
  int32_t *valid;
  qkv_attention_desc desc;
  size_t ws_bytes;
  void *ws;
  Pool pool;
  MPI_Datatype row_type;
  MPI_Op merge_op;
  double *t_local, *t_merge, *t_total, *max_local, *max_merge;
  uint64_t first_hash;
  int repeat_mismatch;
} Run;

/* This rank's documents, the shared query batch, the masks' inputs, the
 * call's descriptor and workspace, the reduction's types. */
static void SetUp(Run *run) {
  const Config *cfg = &run->cfg;
  const int64_t q = cfg->queries, v = cfg->value_dim, len = run->len;
  int64_t i;
  run->queries = (float *)Alloc(sizeof(float) * (size_t)(q * cfg->dim));
  run->keys = (float *)Alloc(sizeof(float) * (size_t)(len * cfg->dim));
  run->values = (float *)Alloc(sizeof(float) * (size_t)(len * v));
  run->bias = (float *)Alloc(sizeof(float) * (size_t)(cfg->bias ? q * len : 1));
  run->valid = (int32_t *)Alloc(sizeof(int32_t) * (size_t)q);
  run->out = (float *)Alloc(sizeof(float) * (size_t)(q * v));
  run->lse = (float *)Alloc(sizeof(float) * (size_t)q);
  run->packed = (float *)Alloc(sizeof(float) * (size_t)(q * (v + 1)));
  MakeQueries(cfg, run->queries);
  for (i = 0; i < len; ++i) {
    DocRow(kStreamKey, run->begin + i, cfg->dim, &run->keys[i * cfg->dim]);
    DocRow(kStreamValue, run->begin + i, v, &run->values[i * v]);
  }
  PoolStart(&run->pool, (size_t)cfg->threads);
  if (len > 0) { /* qkv needs kv_len >= 1: an empty shard makes no call */
    InitDesc(cfg, run->begin, len, run->valid, run->bias, &run->desc);
    if (cfg->threads > 1) {
      run->desc.parallel_for = ParallelFor;
      run->desc.parallel_ctx = &run->pool;
      run->desc.num_workers = (size_t)cfg->threads;
    }
    run->ws_bytes = qkv_attention_workspace_size(&run->desc);
    run->ws = run->ws_bytes ? Alloc(run->ws_bytes) : NULL;
  }
  CHECK_MPI(MPI_Type_contiguous((int)(v + 1), MPI_FLOAT, &run->row_type));
  CHECK_MPI(MPI_Type_commit(&run->row_type));
  CHECK_MPI(MPI_Op_create(MergeRows, 0 /* not commutative: keep rank order */,
                          &run->merge_op));
  if (run->rank == 0) {
    run->merged = (float *)Alloc(sizeof(float) * (size_t)(q * (v + 1)));
    if (cfg->gather) {
      run->gathered = (float *)Alloc(sizeof(float) * (size_t)(run->ranks * q * (v + 1)));
    }
  }
  run->t_local = (double *)Alloc(sizeof(double) * (size_t)cfg->reps);
  run->t_merge = (double *)Alloc(sizeof(double) * (size_t)cfg->reps);
  run->t_total = (double *)Alloc(sizeof(double) * (size_t)cfg->reps);
}

/* Rank 0's first lines: the problem and the shards. */
static void PrintHeader(const Run *run) {
  const Config *cfg = &run->cfg;
  int r;
  printf("sharded search on %s: %lld documents over %d ranks, %lld queries, "
         "d = %lld, dv = %lld, mask %s, combine %s, %d thread%s per rank\n",
         qkv_backend(), (long long)cfg->docs, run->ranks, (long long)cfg->queries,
         (long long)cfg->dim, (long long)cfg->value_dim,
         cfg->valid && cfg->bias ? "both" : cfg->valid ? "valid" : cfg->bias ? "bias" : "none",
         cfg->gather ? "gather" : "reduce", cfg->threads, cfg->threads > 1 ? "s" : "");
  printf("shards:");
  for (r = 0; r < run->ranks; ++r) {
    int64_t b, n;
    Shard(cfg->docs, run->ranks, r, &b, &n);
    printf(" %lld", (long long)n);
  }
  printf("\n");
}

/* This rank's call (or the empty shard's result) into run->out and lse. */
static void LocalAttention(Run *run) {
  const int64_t q = run->cfg.queries, v = run->cfg.value_dim;
  int64_t i;
  if (run->len > 0) {
    const qkv_status st = qkv_attention_f32(&run->desc, run->queries, run->keys, run->values,
                                            run->out, NULL, run->lse, run->ws, run->ws_bytes);
    if (st != QKV_OK) {
      fprintf(stderr, "rank %d: qkv_attention_f32: %s\n", run->rank, qkv_status_string(st));
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
  } else { /* no document: every row saw nothing */
    memset(run->out, 0, sizeof(float) * (size_t)(q * v));
    for (i = 0; i < q; ++i) run->lse[i] = -INFINITY;
  }
}

/* The ranks' packed rows merged on rank 0, by MPI_Reduce or gathered and
 * merged in rank order (((r0 + r1) + r2) + ...). */
static void Combine(Run *run) {
  const int64_t q = run->cfg.queries, v = run->cfg.value_dim;
  int r;
  if (!run->cfg.gather) {
    CHECK_MPI(MPI_Reduce(run->packed, run->merged, (int)q, run->row_type, run->merge_op, 0,
                         MPI_COMM_WORLD));
    return;
  }
  CHECK_MPI(MPI_Gather(run->packed, (int)q, run->row_type, run->gathered, (int)q,
                       run->row_type, 0, MPI_COMM_WORLD));
  if (run->rank == 0) {
    int rows = (int)q;
    memcpy(run->merged, run->gathered, sizeof(float) * (size_t)(q * (v + 1)));
    for (r = 1; r < run->ranks; ++r) {
      MergeRows(&run->gathered[(int64_t)r * q * (v + 1)], run->merged, &rows, &run->row_type);
    }
  }
}

/* Timing. Per repetition and rank: local = the qkv call, merge = time
 * inside MergeRows, total = barrier exit to the result on rank 0. One
 * untimed warm-up repetition first; every repetition must give rank 0 the
 * same bits. */
static void Repeat(Run *run) {
  int rep;
  for (rep = -1; rep < run->cfg.reps; ++rep) {
    double t0, t1, t2;
    CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
    g_merge_seconds = 0.0;
    t0 = MPI_Wtime();
    LocalAttention(run);
    t1 = MPI_Wtime();
    Pack(&run->cfg, run->out, run->lse, run->packed);
    Combine(run);
    t2 = MPI_Wtime();
    if (rep >= 0) {
      run->t_local[rep] = t1 - t0;
      run->t_merge[rep] = g_merge_seconds;
      run->t_total[rep] = t2 - t0;
    }
    if (run->rank == 0) {
      const uint64_t h = ResultHash(run->merged, run->cfg.queries, run->cfg.value_dim);
      if (rep == -1) run->first_hash = h;
      if (h != run->first_hash) run->repeat_mismatch = 1;
    }
  }
  if (run->rank == 0) {
    run->max_local = (double *)Alloc(sizeof(double) * (size_t)run->cfg.reps);
    run->max_merge = (double *)Alloc(sizeof(double) * (size_t)run->cfg.reps);
  }
  CHECK_MPI(MPI_Reduce(run->t_local, run->max_local, run->cfg.reps, MPI_DOUBLE, MPI_MAX, 0,
                       MPI_COMM_WORLD));
  CHECK_MPI(MPI_Reduce(run->t_merge, run->max_merge, run->cfg.reps, MPI_DOUBLE, MPI_MAX, 0,
                       MPI_COMM_WORLD));
}

/* Rank 0's report: the median over repetitions of its total (the batch
 * latency) and of the fractions max-over-ranks local / total (the slowest
 * shard gates the reduction), max-over-ranks merge / total, and the rest
 * (packing, messages, waiting); an answer; the checks. Returns the exit
 * status. */
static int Report(const Run *run) {
  const Config *cfg = &run->cfg;
  const int64_t q = cfg->queries, v = cfg->value_dim;
  const float *merged = run->merged;
  double *f_local = (double *)Alloc(sizeof(double) * (size_t)cfg->reps);
  double *f_merge = (double *)Alloc(sizeof(double) * (size_t)cfg->reps);
  double *f_rest = (double *)Alloc(sizeof(double) * (size_t)cfg->reps);
  double ms, pl, pm, pr;
  int64_t empty = 0, i;
  int rep, r, status = 0;
  for (rep = 0; rep < cfg->reps; ++rep) {
    const double t = run->t_total[rep] > 0 ? run->t_total[rep] : 1e-12;
    const double rest = t - run->max_local[rep] - run->max_merge[rep];
    f_local[rep] = run->max_local[rep] / t;
    f_merge[rep] = run->max_merge[rep] / t;
    f_rest[rep] = rest > 0 ? rest / t : 0.0;
  }
  ms = 1e3 * Median(run->t_total, cfg->reps);
  pl = 100 * Median(f_local, cfg->reps);
  pm = 100 * Median(f_merge, cfg->reps);
  pr = 100 * Median(f_rest, cfg->reps);
  for (i = 0; i < q; ++i) empty += merged[i * (v + 1) + v] == -INFINITY;
  printf("%d repetitions: median %.3f ms per query batch; local attention %.1f%%, "
         "merge function %.1f%%, rest of the reduction %.1f%%\n",
         cfg->reps, ms, pl, pm, pr);
  /* One line for scripts (bench/mpi_scaling.sh). */
  printf("timing: ranks=%d docs=%lld per_rank=%lld queries=%lld median_ms=%.4f "
         "local_pct=%.2f merge_pct=%.2f rest_pct=%.2f\n",
         run->ranks, (long long)cfg->docs,
         (long long)((cfg->docs + run->ranks - 1) / run->ranks), (long long)q, ms, pl, pm, pr);
  /* The answer to query 1 (query 0 sees nothing under --mask valid). */
  i = q > 1 ? 1 : 0;
  printf("query %lld: lse %.5f, answer (%.5f", (long long)i, merged[i * (v + 1) + v],
         merged[i * (v + 1)]);
  for (r = 1; r < 4 && r < v; ++r) printf(", %.5f", merged[i * (v + 1) + r]);
  printf("%s); %lld of %lld queries saw no document\n", v > 4 ? ", ..." : "",
         (long long)empty, (long long)q);
  free(f_local);
  free(f_merge);
  free(f_rest);
  if (run->repeat_mismatch) {
    fprintf(stderr, "FAILED: repetitions gave different bits\n");
    status = 1;
  }
  if (cfg->check && CheckAgainstFullCall(cfg, run->queries, merged) != 0) status = 1;
  printf("result-hash: %016llx\n", (unsigned long long)run->first_hash);
  return status;
}

static void TearDown(Run *run) {
  CHECK_MPI(MPI_Op_free(&run->merge_op));
  CHECK_MPI(MPI_Type_free(&run->row_type));
  PoolStop(&run->pool);
  free(run->ws);
  free(run->queries);
  free(run->keys);
  free(run->values);
  free(run->bias);
  free(run->valid);
  free(run->out);
  free(run->lse);
  free(run->packed);
  free(run->merged);
  free(run->gathered);
  free(run->t_local);
  free(run->t_merge);
  free(run->t_total);
  free(run->max_local);
  free(run->max_merge);
}

int main(int argc, char **argv) {
  Run run;
  int provided = 0, status = 0;
  memset(&run, 0, sizeof(run));
  run.ranks = 1;
  /* Only the main thread calls MPI; the pool's threads run qkv tasks. */
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    fprintf(stderr, "sharded_search: MPI_Init_thread failed\n");
    return 3;
  }
  CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &run.rank));
  CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &run.ranks));
  if (ParseArgs(argc, argv, run.rank == 0, &run.cfg) != 0) {
    MPI_Finalize();
    return 2;
  }
  if (provided < MPI_THREAD_FUNNELED && run.cfg.threads > 1 && run.rank == 0) {
    fprintf(stderr, "note: MPI gives thread level %d < MPI_THREAD_FUNNELED\n", provided);
  }
  Shard(run.cfg.docs, run.ranks, run.rank, &run.begin, &run.len);
  SetUp(&run);
  if (run.rank == 0) PrintHeader(&run);
  Repeat(&run);
  if (run.rank == 0) status = Report(&run);
  TearDown(&run);
  MPI_Finalize();
  return status;
}
