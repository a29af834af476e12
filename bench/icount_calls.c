/* qkv_icount_calls: calls one shape on one backend a given number of
 * times; bench/arm_icount.sh runs it under qemu-aarch64 to count the
 * instructions one call executes (the count of N calls minus the count of
 * none, over N).
 *
 *   qkv_icount_calls BACKEND SHAPE CALLS      (SHAPE: s1 or s2)
 *
 * s2: 4 heads, 256 x 256 causal, head_dim = value_dim = 64 (the tile path,
 *     as S2_prefill at a size an emulator counts quickly);
 * s1: 8 heads, 1 query x 2048 keys, head_dim = value_dim = 128 (the row
 *     path, as S1_decode).
 * One worker (no pool), f32, dense. Prints the (query, key) pairs one call
 * computes; exits 2 on bad arguments or a failed call. */
#include <qkv/qkv.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  if (argc != 4 || (strcmp(argv[2], "s1") != 0 && strcmp(argv[2], "s2") != 0)) {
    fprintf(stderr, "usage: %s BACKEND s1|s2 CALLS\n", argv[0]);
    return 2;
  }
  const int s2 = strcmp(argv[2], "s2") == 0;
  const int64_t heads = s2 ? 4 : 8, lq = s2 ? 256 : 1, lk = s2 ? 256 : 2048;
  const int64_t d = s2 ? 64 : 128;
  const long calls = strtol(argv[3], NULL, 10);
  qkv_attention_desc desc;
  qkv_attention_desc_init(&desc, 1, heads, heads, lq, lk, d, d);
  desc.mask = s2 ? QKV_MASK_CAUSAL : 0;
  desc.backend = argv[1];
  const size_t nq = (size_t)(heads * lq * d), nk = (size_t)(heads * lk * d);
  float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k);
  float *v = malloc(nk * sizeof *v), *out = malloc(nq * sizeof *out);
  const size_t ws_size = qkv_attention_workspace_size(&desc);
  void *ws = malloc(ws_size ? ws_size : 1);
  if (!q || !k || !v || !out || !ws) return 2;
  unsigned x = 12345;
  for (size_t i = 0; i < nk; ++i) {
    x = x * 1103515245u + 12345u;
    k[i] = (float)((x >> 9) & 1023) / 512.0f - 1.0f;
    v[i] = (float)((x >> 19) & 1023) / 512.0f - 1.0f;
    if (i < nq) q[i] = k[i] * 0.5f;
  }
  for (long c = 0; c < calls; ++c) {
    const qkv_status st = qkv_attention_f32(&desc, q, k, v, out, NULL, NULL, ws, ws_size);
    if (st != QKV_OK) {
      fprintf(stderr, "%s on %s: %s\n", argv[2], argv[1], qkv_status_string(st));
      return 2;
    }
  }
  printf("%lld\n", (long long)(s2 ? heads * lq * (lq + 1) / 2 : heads * lq * lk));
  free(q);
  free(k);
  free(v);
  free(out);
  free(ws);
  return 0;
}
