// QKV_REFERENCE_WORKSPACE_SIZE (include/qkv/qkv.h) is what
// qkv_attention_workspace_size returns for the reference backend, for every
// score kind, mask and worker count, and it is a constant expression.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

#include "qkv/qkv.h"

namespace {

static_assert(QKV_REFERENCE_WORKSPACE_SIZE(1, 0, 1) == 64 + 63,
              "a constant expression");

void Noop(void*, size_t, qkv_task_fn, void*) {}

TEST(WorkspaceMacroTest, EqualsTheQueryForTheReferenceBackend) {
  const float w = 0.5f;
  const int32_t lens[4] = {1, 1, 1, 1};
  for (int64_t kv_len : {1, 3, 15, 16, 17, 64, 100, 1000, 4097}) {
    for (int score = 0; score < 3; ++score) {
      for (int64_t hidden : {1, 7, 64}) {
        if (score != QKV_SCORE_ADDITIVE && hidden != 1) continue;
        for (size_t workers : {0, 1, 2, 7}) {
          qkv_attention_desc d;
          qkv_attention_desc_init(&d, 2, 4, 2, 3, kv_len, 8, 5);
          d.backend = "reference";
          d.score = static_cast<qkv_score>(score);
          d.mask = QKV_MASK_CAUSAL | QKV_MASK_VALID_LENS;
          d.valid_lens = lens;
          if (score == QKV_SCORE_ADDITIVE) {
            d.additive_hidden = hidden;
            d.additive_w_q = d.additive_w_k = d.additive_w_v = &w;
          }
          if (workers > 0) {
            d.parallel_for = &Noop;
            d.num_workers = workers;
          }
          const size_t want = QKV_REFERENCE_WORKSPACE_SIZE(
              kv_len, score == QKV_SCORE_ADDITIVE ? hidden : 0,
              workers > 0 ? workers : 1);
          EXPECT_EQ(qkv_attention_workspace_size(&d), want)
              << "kv_len " << kv_len << " score " << score << " hidden "
              << hidden << " workers " << workers;
        }
      }
    }
  }
}

}  // namespace
