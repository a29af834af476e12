// Compiled as C++11 with -Wall -Wextra -Werror -pedantic: the public header
// must be usable from old C++. Never linked.
#include <cstddef>

#include "qkv/qkv.h"

namespace qkv_test {

std::size_t HeaderCxx11Check(const float* q, const float* k, const float* v,
                             float* out) {
  qkv_attention_desc desc;
  qkv_attention_desc_init(&desc, 1, 2, 1, 3, 4, 8, 8);
  desc.score = QKV_SCORE_DOT;
  desc.mask = QKV_MASK_CAUSAL;
  desc.parallel_for = [](void*, std::size_t n, qkv_task_fn fn, void* arg) {
    for (std::size_t t = 0; t < n; ++t) fn(arg, t, 0);
  };
  desc.num_workers = 1;
  const std::size_t bytes = qkv_attention_workspace_size(&desc);
  const qkv_status st =
      qkv_attention_f32(&desc, q, k, v, out, nullptr, nullptr, nullptr, 0);
  return st == QKV_OK ? bytes : static_cast<std::size_t>(st);
}

}  // namespace qkv_test
