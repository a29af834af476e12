/* Compiled as strict C99 with -pedantic-errors -Wall -Wextra -Werror: the
 * public header must stay plain C. Never linked. */
#include <stddef.h>

#include "qkv/qkv.h"

size_t qkv_header_c99_check(const float *q, const float *k, const float *v,
                            float *out);

static void serial_for(void *ctx, size_t num_tasks, qkv_task_fn fn, void *arg) {
  size_t t;
  (void)ctx;
  for (t = 0; t < num_tasks; ++t) fn(arg, t, 0);
}

size_t qkv_header_c99_check(const float *q, const float *k, const float *v,
                            float *out) {
  qkv_attention_desc desc;
  qkv_parallel_for_fn pf = serial_for;
  qkv_status st;
  size_t bytes;
  qkv_attention_desc_init(&desc, 1, 1, 1, 1, 1, 4, 4);
  desc.score = QKV_SCORE_GAUSSIAN;
  desc.mask = QKV_MASK_CAUSAL | QKV_MASK_VALID_LENS | QKV_MASK_BIAS;
  desc.mask = QKV_MASK_NONE;
  desc.parallel_for = pf;
  desc.num_workers = 1;
  desc.backend = "reference";
  bytes = qkv_attention_workspace_size(&desc);
  st = qkv_attention_f32(&desc, q, k, v, out, NULL, NULL, NULL, 0);
  if (st != QKV_OK && qkv_status_string(st) == NULL) return 0;
  if (qkv_version() == 0 || qkv_backend() == NULL) return 0;
  if (qkv_backend_count() == 0 || qkv_backend_name(0) == NULL) return 0;
  return bytes + (size_t)QKV_ERR_UNSUPPORTED + (size_t)QKV_SCORE_ADDITIVE;
}
