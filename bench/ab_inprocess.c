/* In-process A/B of two builds of libqkv.so: both are loaded with
 * dlopen(RTLD_LOCAL) into one process and called in turn, round by round,
 * on the same inputs, so that the VM's drifts (its speed moves by 30% over
 * minutes) fall on both alike. Per round, each library runs the call
 * `calls` times and keeps its fastest; the ratio B/A of a round is taken,
 * and the median over the rounds is reported with its quartiles. Which
 * library goes first alternates between rounds.
 *
 *   qkv_ab_inprocess LIB_A LIB_B [SECONDS_PER_CASE] [FILTER] [SHAPES]
 *
 * Cases: the benchmark suite's S1-S4, S1_gqa8_decode, gqa4_decode_16k (32
 * query heads over 8 kv heads, 16384 keys: 128 MiB of K and V, as S1;
 * gqa2_decode_16k the same with 16 query heads;
 * gqa4_decode_512, 4 MiB, from cache; gqa8_decode_256, S1_gqa8_decode's
 * arithmetic on 2 MiB, from L2), S1
 * from a token-major cache (32 kv heads, and 8 with 4 query heads each;
 * S1_token_major_u: K and V 16 bytes past a 64-byte line, as from malloc),
 * S1 and S2 with f16, bf16 and int8 caches (S1_f16, S1_bf16, S1_int8,
 * S2_f16; qkv_attention, the caches filled by library B's
 * qkv_quantize_rows), the backward pass on S2 and S3 (S2_backward, S3_backward:
 * d_q, d_k and d_v from the forward's out and lse), its kv_len and head_dim
 * sweeps (bench/bench_attention.cc), one worker, on every backend whose name
 * contains FILTER (default: every SIMD backend of library B), on the cases
 * whose name contains SHAPES (default: all). Prints one line per case: median A
 * and B time in us, B/A median [q1, q3], rounds. Build: bench/CMakeLists.txt
 * (target qkv_ab_inprocess; plain C, -ldl). QKV_AB_COLD=1: every call from
 * memory (see evict_caches). */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qkv/qkv.h"

typedef void (*init_fn)(qkv_attention_desc *, int64_t, int64_t, int64_t,
                        int64_t, int64_t, int64_t, int64_t);
typedef size_t (*ws_fn)(const qkv_attention_desc *);
typedef qkv_status (*attn_fn)(const qkv_attention_desc *, const float *,
                              const float *, const float *, float *, float *,
                              float *, void *, size_t);
typedef size_t (*bws_fn)(const qkv_attention_desc *);
typedef qkv_status (*bwd_fn)(const qkv_attention_desc *, const float *,
                             const float *, const float *, const float *,
                             const float *, const float *, float *, float *,
                             float *, void *, size_t);
typedef qkv_status (*gen_fn)(const qkv_attention_desc *, const float *,
                             const void *, const void *, float *, float *,
                             float *, void *, size_t);
typedef qkv_status (*quant_fn)(qkv_dtype, int64_t, int64_t, const float *,
                               int64_t, void *, int64_t, float *);
typedef size_t (*count_fn)(void);
typedef const char *(*name_fn)(size_t);

typedef struct {
  void *handle;
  init_fn init;
  ws_fn ws;
  attn_fn attn;
  gen_fn gen;
  quant_fn quant;
  bws_fn bws;
  bwd_fn bwd;
  count_fn count;
  name_fn name;
} lib;

static void *sym(void *h, const char *name, const char *path) {
  void *p = dlsym(h, name);
  if (p == NULL) {
    fprintf(stderr, "%s: no %s\n", path, name);
    exit(2);
  }
  return p;
}

static lib load(const char *path) {
  lib l;
  l.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (l.handle == NULL) {
    fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
    exit(2);
  }
  l.init = (init_fn)sym(l.handle, "qkv_attention_desc_init", path);
  l.ws = (ws_fn)sym(l.handle, "qkv_attention_workspace_size", path);
  l.attn = (attn_fn)sym(l.handle, "qkv_attention_f32", path);
  l.gen = (gen_fn)sym(l.handle, "qkv_attention", path);
  l.quant = (quant_fn)sym(l.handle, "qkv_quantize_rows", path);
  l.bws = (bws_fn)sym(l.handle, "qkv_attention_backward_workspace_size", path);
  l.bwd = (bwd_fn)sym(l.handle, "qkv_attention_backward_f32", path);
  l.count = (count_fn)sym(l.handle, "qkv_backend_count", path);
  l.name = (name_fn)sym(l.handle, "qkv_backend_name", path);
  return l;
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double quantile(double *v, int n, double q) {
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  return v[(int)(q * (n - 1) + 0.5)];
}

typedef struct {
  const char *name;
  int64_t heads, q_len, kv_len, d;
  int causal;
  int64_t kv_heads; /* 0: heads */
  int token_major;  /* K and V [token][kv_heads][d] */
  int backward;     /* time qkv_attention_backward_f32 (d_q, d_k, d_v) */
  qkv_dtype dtype;  /* of the K/V cache (qkv_attention) */
} shape;

/* The backward call's operands: the forward's out and lse, d_out and the
 * three gradients. */
typedef struct {
  const float *out, *lse, *d_out;
  float *d_q, *d_k, *d_v;
} grads;

static float *floats(size_t n, unsigned seed) {
  float *p = aligned_alloc(64, (n * 4 + 63) / 64 * 64);
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = (float)((seed >> 9) & 0xffff) / 65536.0f - 0.5f;
  }
  return p;
}

/* With QKV_AB_COLD set (non-empty, not "0"), each call is preceded by an
 * untimed read of 96 MiB, so that it finds nothing of the last call's K and
 * V in L3: a shape whose K and V fit L3 (S1_int8, S1_gqa8_decode: 33.5 MB)
 * would otherwise be timed partly from cache, called back to back. */
static volatile float cold_sink;
static void evict_caches(void) {
  static float *buf = NULL;
  const size_t n = (size_t)24 << 20;
  if (buf == NULL) {
    buf = aligned_alloc(64, n * 4);
    for (size_t i = 0; i < n; ++i) buf[i] = 1.0f;
  }
  float s = 0.0f;
  for (size_t i = 0; i < n; i += 16) s += buf[i];
  cold_sink = s;
}

static int cold_calls(void) {
  const char *e = getenv("QKV_AB_COLD");
  return e != NULL && e[0] != '\0' && strcmp(e, "0") != 0;
}

/* Fastest of `calls` calls of l on desc, in us. */
static double best(const lib *l, const qkv_attention_desc *d, const float *q,
                   const void *k, const void *v, float *out, void *ws,
                   size_t ws_size, int calls, const grads *g) {
  double t_best = 1e30;
  const int cold = cold_calls();
  for (int c = 0; c < calls; ++c) {
    if (cold) evict_caches();
    const double t0 = now_us();
    const qkv_status st =
        g != NULL ? l->bwd(d, q, k, v, g->out, g->lse, g->d_out, g->d_q, g->d_k,
                           g->d_v, ws, ws_size)
        : d->kv_dtype != QKV_DTYPE_F32
            ? l->gen(d, q, k, v, out, NULL, NULL, ws, ws_size)
            : l->attn(d, q, (const float *)k, (const float *)v, out, NULL, NULL,
                      ws, ws_size);
    if (st != QKV_OK) {
      fprintf(stderr, "call failed\n");
      exit(3);
    }
    const double t = now_us() - t0;
    if (t < t_best) t_best = t;
  }
  return t_best;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr,
            "usage: %s LIB_A LIB_B [SECONDS_PER_CASE] [FILTER] [SHAPES]\n",
            argv[0]);
    return 2;
  }
  lib a = load(argv[1]), b = load(argv[2]);
  const double seconds = argc > 3 ? atof(argv[3]) : 2.0;
  const char *filter = argc > 4 ? argv[4] : NULL;
  const char *shape_filter = argc > 5 ? argv[5] : NULL;
  shape shapes[32];
  int n = 0;
  shapes[n++] =
      (shape){"S1_decode", 32, 1, 4096, 128, 0, 0, 0, 0, QKV_DTYPE_F32};
  shapes[n++] =
      (shape){"S1_gqa8_decode", 64, 1, 4096, 128, 0, 8, 0, 0, QKV_DTYPE_F32};
  shapes[n++] =
      (shape){"gqa4_decode_16k", 32, 1, 16384, 128, 0, 8, 0, 0, QKV_DTYPE_F32};
  shapes[n++] =
      (shape){"gqa2_decode_16k", 16, 1, 16384, 128, 0, 8, 0, 0, QKV_DTYPE_F32};
  shapes[n++] =
      (shape){"gqa4_decode_512", 32, 1, 512, 128, 0, 8, 0, 0, QKV_DTYPE_F32};
  shapes[n++] =
      (shape){"gqa8_decode_256", 64, 1, 256, 128, 0, 8, 0, 0, QKV_DTYPE_F32};
  shapes[n++] =
      (shape){"S1_token_major", 32, 1, 4096, 128, 0, 0, 1, 0, QKV_DTYPE_F32};
  shapes[n++] =
      (shape){"S1_token_major_u", 32, 1, 4096, 128, 0, 0, 1, 0, QKV_DTYPE_F32};
  shapes[n++] =
      (shape){"S1_gqa4_token_m", 32, 1, 4096, 128, 0, 8, 1, 0, QKV_DTYPE_F32};
  shapes[n++] =
      (shape){"S2_prefill", 8, 1024, 1024, 64, 1, 0, 0, 0, QKV_DTYPE_F32};
  shapes[n++] = (shape){"S3_small", 4, 128, 128, 64, 0, 0, 0, 0, QKV_DTYPE_F32};
  shapes[n++] = (shape){"S4_toy", 1, 4, 4, 2, 0, 0, 0, 0, QKV_DTYPE_F32};
  shapes[n++] =
      (shape){"S2_backward", 8, 1024, 1024, 64, 1, 0, 0, 1, QKV_DTYPE_F32};
  shapes[n++] =
      (shape){"S3_backward", 4, 128, 128, 64, 0, 0, 0, 1, QKV_DTYPE_F32};
  shapes[n++] = (shape){"S1_f16", 32, 1, 4096, 128, 0, 0, 0, 0, QKV_DTYPE_F16};
  shapes[n++] =
      (shape){"S1_bf16", 32, 1, 4096, 128, 0, 0, 0, 0, QKV_DTYPE_BF16};
  shapes[n++] = (shape){"S1_int8", 32, 1, 4096, 128, 0, 0, 0, 0, QKV_DTYPE_I8};
  shapes[n++] = (shape){"S2_f16", 8, 1024, 1024, 64, 1, 0, 0, 0, QKV_DTYPE_F16};
  static char names[16][32];
  int m = 0;
  for (int64_t kv = 128; kv <= 16384; kv *= 2, ++m) {
    snprintf(names[m], sizeof names[m], "sweep_kv%lld", (long long)kv);
    shapes[n++] = (shape){names[m], 4, 128, kv, 64, 0, 0, 0, 0, QKV_DTYPE_F32};
  }
  const int64_t dims[] = {32, 64, 80, 128, 256};
  for (int i = 0; i < 5; ++i, ++m) {
    snprintf(names[m], sizeof names[m], "sweep_d%lld", (long long)dims[i]);
    shapes[n++] =
        (shape){names[m], 4, 512, 512, dims[i], 0, 0, 0, 0, QKV_DTYPE_F32};
  }
  printf("%-16s %-16s %12s %12s %8s %17s %7s\n", "shape", "backend", "A us",
         "B us", "B/A", "[q1, q3]", "rounds");
  for (size_t e = 0; e < b.count(); ++e) {
    const char *backend = b.name(e);
    if (strcmp(backend, "reference") == 0 || strstr(backend, "SCALAR") ||
        strstr(backend, "EMU128")) {
      continue;
    }
    if (filter != NULL && strstr(backend, filter) == NULL) continue;
    for (int s = 0; s < n; ++s) {
      const shape *sh = &shapes[s];
      if (shape_filter != NULL && strstr(sh->name, shape_filter) == NULL) {
        continue;
      }
      qkv_attention_desc da, db;
      const int64_t kvh = sh->kv_heads ? sh->kv_heads : sh->heads;
      a.init(&da, 1, sh->heads, kvh, sh->q_len, sh->kv_len, sh->d, sh->d);
      b.init(&db, 1, sh->heads, kvh, sh->q_len, sh->kv_len, sh->d, sh->d);
      da.mask = db.mask = sh->causal ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
      da.backend = db.backend = backend;
      if (sh->token_major) {
        const qkv_strides t = {sh->kv_len * kvh * sh->d, sh->d, kvh * sh->d};
        da.k_strides = da.v_strides = db.k_strides = db.v_strides = t;
      }
      const size_t nq = (size_t)(sh->heads * sh->q_len * sh->d);
      const size_t nk = (size_t)(kvh * sh->kv_len * sh->d);
      /* A name ending in _u: K and V 16 bytes past a 64-byte line. */
      const size_t nm = strlen(sh->name);
      const size_t off = nm > 2 && strcmp(sh->name + nm - 2, "_u") == 0 ? 4 : 0;
      float *q = floats(nq, 1), *k_mem = floats(nk + off, 2),
            *v_mem = floats(nk + off, 3);
      float *k = k_mem + off, *v = v_mem + off;
      float *out = floats(nq, 4);
      /* A low-precision cache: k and v quantized in place (the f32 arrays
       * are large enough for every type), I8 scales beside them. */
      float *k_scales = NULL, *v_scales = NULL;
      da.kv_dtype = db.kv_dtype = sh->dtype;
      if (sh->dtype != QKV_DTYPE_F32) {
        const int64_t rows = kvh * sh->kv_len;
        if (sh->dtype == QKV_DTYPE_I8) {
          k_scales = floats((size_t)rows, 10),
          v_scales = floats((size_t)rows, 11);
        }
        float *tmp = floats(nk, 12);
        memcpy(tmp, k, nk * 4);
        b.quant(sh->dtype, rows, sh->d, tmp, sh->d, k, sh->d, k_scales);
        memcpy(tmp, v, nk * 4);
        b.quant(sh->dtype, rows, sh->d, tmp, sh->d, v, sh->d, v_scales);
        free(tmp);
        da.k_scales = db.k_scales = k_scales;
        da.v_scales = db.v_scales = v_scales;
      }
      size_t wa = a.ws(&da), wb = b.ws(&db);
      size_t wmax = wa > wb ? wa : wb;
      grads gr, *g = NULL;
      float *lse = NULL, *d_out = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
      if (sh->backward) {
        void *fws = aligned_alloc(64, (wmax + 64) / 64 * 64);
        lse = floats((size_t)(sh->heads * sh->q_len), 5);
        if (b.attn(&db, q, k, v, out, NULL, lse, fws, wb) != QKV_OK) {
          fprintf(stderr, "forward call failed\n");
          exit(3);
        }
        free(fws);
        d_out = floats(nq, 6);
        dq = floats(nq, 7), dk = floats(nk, 8), dv = floats(nk, 9);
        gr = (grads){out, lse, d_out, dq, dk, dv};
        g = &gr;
        wa = a.bws(&da), wb = b.bws(&db);
        wmax = wa > wb ? wa : wb;
      }
      void *ws = aligned_alloc(64, (wmax + 64) / 64 * 64);
      /* Calls per round: about 2 ms of work per library per round. */
      double t1 = best(&b, &db, q, k, v, out, ws, wb, 3, g);
      int calls = (int)(2000.0 / (t1 + 1e-3));
      if (calls < 1) calls = 1;
      if (calls > 2000) calls = 2000;
      int rounds = (int)(seconds * 1e6 / (2.0 * calls * t1 + 1.0));
      if (rounds < 9) rounds = 9;
      if (rounds > 400) rounds = 400;
      double *ra = malloc(sizeof(double) * rounds);
      double *rb = malloc(sizeof(double) * rounds);
      double *ratio = malloc(sizeof(double) * rounds);
      for (int r = 0; r < rounds; ++r) {
        if (r % 2 == 0) {
          ra[r] = best(&a, &da, q, k, v, out, ws, wa, calls, g);
          rb[r] = best(&b, &db, q, k, v, out, ws, wb, calls, g);
        } else {
          rb[r] = best(&b, &db, q, k, v, out, ws, wb, calls, g);
          ra[r] = best(&a, &da, q, k, v, out, ws, wa, calls, g);
        }
        ratio[r] = rb[r] / ra[r];
      }
      const double q1 = quantile(ratio, rounds, 0.25);
      const double med = quantile(ratio, rounds, 0.5);
      const double q3 = quantile(ratio, rounds, 0.75);
      printf("%-16s %-16s %12.3f %12.3f %8.3f   [%5.3f, %5.3f] %7d\n", sh->name,
             backend, quantile(ra, rounds, 0.5), quantile(rb, rounds, 0.5), med,
             q1, q3, rounds);
      fflush(stdout);
      free(ra), free(rb), free(ratio), free(ws);
      free(q), free(k_mem), free(v_mem), free(out);
      free(lse), free(d_out), free(dq), free(dk), free(dv);
      free(k_scales), free(v_scales);
    }
  }
  return 0;
}
