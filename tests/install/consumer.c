/* The README's minimal C example, also built against the installed package
 * by tests/install/check_install.sh (pkg-config shared and static, and
 * find_package). Self-attention over the seeds' four 2-D tokens. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <qkv/qkv.h>

int main(void) {
  const float x[4][2] = {{0.9f, 0.1f}, {0.2f, 0.8f}, {0.1f, 0.9f}, {0.8f, 0.2f}};
  float out[4][2], weights[4][4];
  qkv_attention_desc desc;
  /* batch 1, 1 query head, 1 kv head, 4 queries, 4 keys, d = 2, dv = 2 */
  qkv_attention_desc_init(&desc, 1, 1, 1, 4, 4, 2, 2);
  size_t bytes = qkv_attention_workspace_size(&desc);
  void *workspace = bytes ? malloc(bytes) : NULL;
  qkv_status st = qkv_attention_f32(&desc, &x[0][0], &x[0][0], &x[0][0],
                                    &out[0][0], &weights[0][0], NULL,
                                    workspace, bytes);
  free(workspace);
  if (st != QKV_OK) {
    fprintf(stderr, "qkv: %s\n", qkv_status_string(st));
    return 1;
  }
  printf("qkv %u.%u.%u on %s\n", qkv_version() >> 16,
         (qkv_version() >> 8) & 255, qkv_version() & 255, qkv_backend());
  for (int i = 0; i < 4; ++i) {
    printf("token %d: weights %.4f %.4f %.4f %.4f -> (%.4f, %.4f)\n", i,
           weights[i][0], weights[i][1], weights[i][2], weights[i][3],
           out[i][0], out[i][1]);
  }
  /* numpy gives out[1] = (0.44735, 0.55265): softmax(x x^T / sqrt(2)) x. */
  return fabsf(out[1][0] - 0.44735f) < 1e-4f && fabsf(out[1][1] - 0.55265f) < 1e-4f ? 0 : 2;
}
