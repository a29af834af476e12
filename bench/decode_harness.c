/* One decoding step (q_len 1) of H kv heads x G query heads each, L keys,
 * head_dim 128, a K/V cache of f32 (or f16, bf16, int8: optional 5th
 * argument), timed on one worker and on two (the caller and one spinning
 * helper thread as the pool), median of 15 rounds of ~2 GB of K and V
 * each. Not built by CMake: the figures of bench/README.md's
 * "Decoding against the read limit" that are not qkv_bench rows came from
 * it. Build against a build tree and run, e.g.
 *   cc -O2 bench/decode_harness.c -Iinclude -Lbuild -lqkv -lpthread \
 *      -Wl,-rpath,$PWD/build -o /tmp/decode_harness
 *   /tmp/decode_harness 1 32768 8 highway:AVX2      # H L G backend
 * (LD_LIBRARY_PATH=<other build> runs another libqkv.so: A/B). */
#include <qkv/qkv.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* A 2-worker parallel_for: task indices taken by the caller and a helper. */
static struct {
  int go, done;
  size_t n, next;
  qkv_task_fn fn;
  void *arg;
} pool;

static void run_tasks(size_t worker) {
  size_t t;
  while ((t = __atomic_fetch_add(&pool.next, 1, __ATOMIC_ACQ_REL)) < pool.n) {
    pool.fn(pool.arg, t, worker);
  }
}

static void *helper(void *unused) {
  (void)unused;
  for (;;) {
    while (!__atomic_load_n(&pool.go, __ATOMIC_ACQUIRE)) {
    }
    __atomic_store_n(&pool.go, 0, __ATOMIC_RELAXED);
    run_tasks(1);
    __atomic_store_n(&pool.done, 1, __ATOMIC_RELEASE);
  }
  return NULL;
}

static void parallel_for(void *ctx, size_t n, qkv_task_fn fn, void *arg) {
  (void)ctx;
  pool.n = n;
  pool.fn = fn;
  pool.arg = arg;
  pool.next = 0;
  pool.done = 0;
  __atomic_store_n(&pool.go, 1, __ATOMIC_RELEASE);
  run_tasks(0);
  while (!__atomic_load_n(&pool.done, __ATOMIC_ACQUIRE)) {
  }
}

static int cmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s kv_heads kv_len group backend [f32|f16|bf16|int8]\n",
            argv[0]);
    return 2;
  }
  const int H = atoi(argv[1]), L = atoi(argv[2]), G = atoi(argv[3]), D = 128;
  const char *type = argc > 5 ? argv[5] : "f32";
  const qkv_dtype dt = type[0] == 'f' && type[1] == '1'   ? QKV_DTYPE_F16
                       : type[0] == 'b'                   ? QKV_DTYPE_BF16
                       : type[0] == 'i'                   ? QKV_DTYPE_I8
                                                          : QKV_DTYPE_F32;
  const size_t eb = dt == QKV_DTYPE_F32 ? 4 : dt == QKV_DTYPE_I8 ? 1 : 2;
  const size_t n = (size_t)H * L * D;
  /* Bytes of K and V (and the int8 rows' scales) a call reads. */
  const double bytes = 2.0 * (double)(n * eb) +
                       (dt == QKV_DTYPE_I8 ? 8.0 * H * L : 0.0);
  pthread_t th;
  pthread_create(&th, NULL, helper, NULL);
  float *q = malloc(sizeof(float) * H * G * D);
  float *k = malloc(sizeof(float) * (size_t)H * L * D);
  float *v = malloc(sizeof(float) * (size_t)H * L * D);
  float *o = malloc(sizeof(float) * H * G * D);
  for (size_t i = 0; i < (size_t)H * L * D; ++i) {
    k[i] = (float)(i % 7) * 0.1f;
    v[i] = (float)(i % 5) * 0.1f;
  }
  for (int i = 0; i < H * G * D; ++i) q[i] = 0.01f * (float)(i % 3);
  void *kc = k, *vc = v; /* the cache in its type */
  float *ks = NULL, *vs = NULL;
  if (dt != QKV_DTYPE_F32) {
    kc = malloc(n * eb), vc = malloc(n * eb);
    if (dt == QKV_DTYPE_I8) {
      ks = malloc(sizeof(float) * H * L), vs = malloc(sizeof(float) * H * L);
    }
    if (qkv_quantize_rows(dt, (int64_t)H * L, D, k, D, kc, D, ks) != QKV_OK ||
        qkv_quantize_rows(dt, (int64_t)H * L, D, v, D, vc, D, vs) != QKV_OK) {
      fprintf(stderr, "qkv_quantize_rows failed\n");
      return 1;
    }
  }
  for (int workers = 1; workers <= 2; ++workers) {
    qkv_attention_desc d;
    qkv_attention_desc_init(&d, 1, H * G, H, 1, L, D, D);
    d.backend = argv[4];
    d.kv_dtype = dt;
    d.k_scales = ks;
    d.v_scales = vs;
    if (workers == 2) {
      d.parallel_for = parallel_for;
      d.num_workers = 2;
    }
    const size_t ws = qkv_attention_workspace_size(&d);
    void *work = malloc(ws > 0 ? ws : 1);
    const long reps = (long)(2e9 / bytes) + 1;
    double t[15];
    for (int r = 0; r < 15; ++r) {
      const double t0 = now();
      for (long i = 0; i < reps; ++i) {
        const qkv_status st =
            qkv_attention(&d, q, kc, vc, o, NULL, NULL, work, ws);
        if (st != QKV_OK) {
          fprintf(stderr, "qkv_attention: %s\n", qkv_status_string(st));
          return 1;
        }
      }
      t[r] = (now() - t0) / (double)reps;
    }
    qsort(t, 15, sizeof(double), cmp);
    printf("kv heads %d x group %d, %d keys, %s, %d worker(s): median %.1f "
           "us, %.1f GB/s of K+V, %.2f ns per kv head and key\n",
           H, G, L, type, workers, t[7] * 1e6, bytes / t[7] / 1e9,
           t[7] * 1e9 / ((double)H * L));
    free(work);
  }
  return 0;
}
