/* One decoding step (q_len 1) of H kv heads x G query heads each, L keys,
 * head_dim 128, f32, timed on one worker and on two (the caller and one
 * spinning helper thread as the pool), median of 15 rounds of ~2 GB of K
 * and V each. Not built by CMake: the figures of bench/README.md's
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
    fprintf(stderr, "usage: %s kv_heads kv_len group backend\n", argv[0]);
    return 2;
  }
  const int H = atoi(argv[1]), L = atoi(argv[2]), G = atoi(argv[3]), D = 128;
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
  for (int workers = 1; workers <= 2; ++workers) {
    qkv_attention_desc d;
    qkv_attention_desc_init(&d, 1, H * G, H, 1, L, D, D);
    d.backend = argv[4];
    if (workers == 2) {
      d.parallel_for = parallel_for;
      d.num_workers = 2;
    }
    const size_t ws = qkv_attention_workspace_size(&d);
    void *work = malloc(ws > 0 ? ws : 1);
    const long reps = (long)(2e9 / (8.0 * H * L * D)) + 1;
    double t[15];
    for (int r = 0; r < 15; ++r) {
      const double t0 = now();
      for (long i = 0; i < reps; ++i) {
        const qkv_status st =
            qkv_attention_f32(&d, q, k, v, o, NULL, NULL, work, ws);
        if (st != QKV_OK) {
          fprintf(stderr, "qkv_attention_f32: %s\n", qkv_status_string(st));
          return 1;
        }
      }
      t[r] = (now() - t0) / (double)reps;
    }
    qsort(t, 15, sizeof(double), cmp);
    printf("kv heads %d x group %d, %d keys, %d worker(s): median %.1f us, "
           "%.1f GB/s of K+V\n",
           H, G, L, workers, t[7] * 1e6, 8.0 * H * L * D / t[7] / 1e9);
    free(work);
  }
  return 0;
}
