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
  std::vector<double> out;       // [batch][q_heads][q_len][value_dim], dense
  std::vector<double> weights;   // [batch][q_heads][q_len][kv_len]
  std::vector<double> lse;       // [batch][q_heads][q_len]; a row that sees
                                 // no key: its sink, or -inf without one
  std::vector<uint8_t> visible;  // [batch][q_heads][q_len][kv_len]: 1 iff
                                 // every active mask lets the key through
};

// Exact attention for `desc`: sizes (batch, q_len and kv_len may be 0),
// score, scale, every mask (causal, valid lengths, bias and its strides,
// window, kv_start), additive weights, and the 0.2 variants: q_pos, softcap,
// alibi_slopes, sinks, and the q, k, v strides (k and v must be f32). Fields
// past desc.struct_size take their defaults. out is always dense, whatever
// desc.out_strides says; the threading and backend fields are ignored. The
// descriptor must be valid: the oracle does not validate.
OracleOutput OracleAttention(const qkv_attention_desc& desc, const float* q,
                             const float* k, const float* v);

// The position of query i of batch b (desc.q_pos, or kv_len - q_len + i).
int64_t OraclePosition(const qkv_attention_desc& desc, int64_t b, int64_t i);

// Offset in elements of element (b, h, t, 0) of a tensor of n_heads x n_tokens
// rows of `dim` under `strides` (all zero: dense).
int64_t OracleOffset(const qkv_strides& strides, int64_t n_heads,
                     int64_t n_tokens, int64_t dim, int64_t b, int64_t h,
                     int64_t t);

}  // namespace qkv_test

#endif  // QKV_TESTS_ORACLE_H_
