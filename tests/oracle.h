// A double-precision attention oracle written from the spec in
// include/qkv/qkv.h, independent of every kernel: plain loops, two-pass
// softmax, no tiling, no online rescaling, no vector math.
#ifndef QKV_TESTS_ORACLE_H_
#define QKV_TESTS_ORACLE_H_

#include <cstdint>
#include <vector>

#include "qkv/qkv.h"

namespace qkv_test {

struct OracleOutput {
  std::vector<double> out;       // [batch][q_heads][q_len][value_dim]
  std::vector<double> weights;   // [batch][q_heads][q_len][kv_len]
  std::vector<double> lse;       // [batch][q_heads][q_len]; -inf: no key
  std::vector<uint8_t> visible;  // [batch][q_heads][q_len][kv_len]: 1 iff
                                 // every active mask lets the key through
};

// Exact attention for `desc` (sizes, score, scale, mask, valid_lens, bias and
// its strides, additive weights; the threading and backend fields are
// ignored). The descriptor must be valid: the oracle does not validate.
OracleOutput OracleAttention(const qkv_attention_desc& desc, const float* q,
                             const float* k, const float* v);

}  // namespace qkv_test

#endif  // QKV_TESTS_ORACLE_H_
