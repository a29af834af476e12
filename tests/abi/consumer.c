/* A program as its users compile it against one qkv header, run against the
 * library being built (tests/abi/CMakeLists.txt builds it three ways):
 *   QKV_ABI_OLD     against 0.2's header (tests/abi/qkv_0_2.h), linked to a
 *                   stand-in 0.2 library without symbol versions and run
 *                   against this one, as a binary built years ago is;
 *   QKV_ABI_CURRENT against this header;
 *   QKV_ABI_LARGER  against this header with fields appended to the
 *                   descriptor, as a newer release's header will be.
 * Each checks that qkv_attention_desc_init writes its descriptor and not one
 * byte past it (canaries; under ASan also an exact-size heap block), that a
 * call with it computes causal attention right (against a double-precision
 * oracle here), and, for the larger header, that its extra fields are zero
 * and that setting one gives QKV_ERR_UNSUPPORTED with nothing written.
 * Prints "N passed, N failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include QKV_ABI_HEADER

enum { kCanary = 64, kB = 1, kH = 2, kKvH = 1, kLq = 3, kLk = 5, kD = 4 };
static int passed, failed;

static void check(int ok, const char *what) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    printf("FAIL: %s\n", what);
  }
}

static int untouched(const unsigned char *p, size_t n, unsigned char fill) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != fill) return 0;
  }
  return 1;
}

static void init(qkv_attention_desc *d) {
  qkv_attention_desc_init(d, kB, kH, kKvH, kLq, kLk, kD, kD);
}

/* The initializer writes sizeof(qkv_attention_desc) as this program sees
 * it, on the heap and on the stack, and nothing after. */
static void check_init_writes_only_its_struct(void) {
  unsigned char *block = malloc(sizeof(qkv_attention_desc) + kCanary);
  memset(block, 0xA5, sizeof(qkv_attention_desc) + kCanary);
  init((qkv_attention_desc *)(void *)block);
  check(untouched(block + sizeof(qkv_attention_desc), kCanary, 0xA5),
        "heap: bytes after the descriptor untouched");
  free(block);
  /* Exact size: ASan reports any write past it. */
  qkv_attention_desc *exact = malloc(sizeof(qkv_attention_desc));
  init(exact);
  check(exact->struct_size == sizeof(qkv_attention_desc),
        "struct_size is the size this program compiled");
  free(exact);
  struct {
    qkv_attention_desc d;
    unsigned char after[kCanary];
  } s;
  memset(&s, 0x5A, sizeof s);
  init(&s.d);
  check(untouched(s.after, kCanary, 0x5A),
        "stack: bytes after the descriptor untouched");
  check(s.d.struct_size == sizeof(qkv_attention_desc) && s.d.batch == kB &&
            s.d.q_heads == kH && s.d.kv_heads == kKvH && s.d.q_len == kLq &&
            s.d.kv_len == kLk && s.d.head_dim == kD && s.d.value_dim == kD &&
            s.d.mask == 0 && s.d.backend == NULL && s.d.kv_start == NULL &&
            fabsf(s.d.scale - 0.5f) < 1e-7f,
        "defaults of the fields this header knows");
#ifdef QKV_ABI_LARGER
  check(s.d.qkv_test_future_i64 == 0 && s.d.qkv_test_future_f32 == 0.0f,
        "a newer header's extra fields are zeroed");
#endif
}

static float q[kB * kH * kLq * kD], k[kB * kKvH * kLk * kD],
    v[kB * kKvH * kLk * kD];

/* Causal attention in double: query i (position kLk - kLq + i) sees keys
 * 0..kLk - kLq + i. */
static void oracle(double *out) {
  for (int h = 0; h < kH; ++h) {
    for (int i = 0; i < kLq; ++i) {
      const float *qi = q + (h * kLq + i) * kD;
      const int last = kLk - kLq + i;
      double s[kLk], m = -INFINITY, sum = 0;
      for (int j = 0; j <= last; ++j) {
        double dot = 0;
        for (int c = 0; c < kD; ++c) dot += (double)qi[c] * k[j * kD + c];
        s[j] = dot * 0.5;
        if (s[j] > m) m = s[j];
      }
      for (int j = 0; j <= last; ++j) sum += exp(s[j] - m);
      for (int c = 0; c < kD; ++c) {
        double acc = 0;
        for (int j = 0; j <= last; ++j) acc += exp(s[j] - m) / sum * v[j * kD + c];
        out[(h * kLq + i) * kD + c] = acc;
      }
    }
  }
}

static void check_call(void) {
  for (size_t i = 0; i < sizeof q / sizeof *q; ++i) q[i] = (float)sin(0.7 * i + 0.1);
  for (size_t i = 0; i < sizeof k / sizeof *k; ++i) k[i] = (float)cos(1.3 * i);
  for (size_t i = 0; i < sizeof v / sizeof *v; ++i) v[i] = (float)sin(2.1 * i + 0.5);
  qkv_attention_desc d;
  init(&d);
  d.mask = QKV_MASK_CAUSAL;
  float out[kB * kH * kLq * kD];
  double want[kB * kH * kLq * kD];
  const size_t bytes = qkv_attention_workspace_size(&d);
  void *ws = bytes ? malloc(bytes) : NULL;
  qkv_status st = qkv_attention_f32(&d, q, k, v, out, NULL, NULL, ws, bytes);
  check(st == QKV_OK, "a causal call with this descriptor returns QKV_OK");
  oracle(want);
  double err = 0;
  for (int i = 0; i < kB * kH * kLq * kD; ++i) {
    if (fabs(out[i] - want[i]) > err) err = fabs(out[i] - want[i]);
  }
  check(st == QKV_OK && err < 5e-6, "its output matches the oracle");
#ifdef QKV_ABI_LARGER
  /* Fields this library does not know: accepted while zero, refused when
   * set, with nothing written. */
  d.qkv_test_future_i64 = 1;
  memset(out, 0x7F, sizeof out);
  st = qkv_attention_f32(&d, q, k, v, out, NULL, NULL, ws, bytes);
  check(st == QKV_ERR_UNSUPPORTED, "a set unknown field: QKV_ERR_UNSUPPORTED");
  check(untouched((const unsigned char *)out, sizeof out, 0x7F),
        "nothing written on the refusal");
  char msg[256] = "";
  qkv_attention_explain(&d, q, k, v, out, NULL, NULL, ws, bytes, msg, sizeof msg);
  check(strstr(msg, "struct_size") != NULL, "explain names struct_size");
#endif
  free(ws);
}

int main(void) {
  /* The library run is this build's, not the stand-in linked against. */
  check(qkv_version() >= 0x000300u, "runs against qkv 0.3 or later");
  check_init_writes_only_its_struct();
  check_call();
  printf("%s: %zu-byte descriptor, run against qkv %u.%u.%u\n", QKV_ABI_NAME,
         sizeof(qkv_attention_desc), qkv_version() >> 16,
         (qkv_version() >> 8) & 255, qkv_version() & 255);
  printf("abi: %d passed, %d failed\n", passed, failed);
  return failed != 0;
}
