// Why a call is refused: the boundary (capi/qkv_api.cc) records the reason
// and the values involved only when qkv_attention_explain asks for them
// (a Why to fill); capi/explain.cc turns them into the sentence. Kept apart
// so that firmware which never explains links none of the sentences.
#ifndef QKV_CAPI_WHY_H_
#define QKV_CAPI_WHY_H_

#include <stddef.h>
#include <stdint.h>

namespace qkv {

enum Reason {
  kWhyNone = 0,
  kWhyDescNull,
  kWhyStructSize,       // a: struct_size
  kWhyStructTooShort,   // a: struct_size, b: bytes the sizes need
  kWhyNegativeSize,     // name: field, a: value
  kWhyNotPositive,      // name: field, a: value
  kWhyGroup,            // a: q_heads, b: kv_heads
  kWhyScore,            // a: score
  kWhyMask,             // a: mask
  kWhyScale,            // f: scale
  kWhyTooLarge,         // name: tensor
  kWhyNullArray,        // name: field, b: the mask flag or 0
  kWhyIndexRange,       // name: array, a: index, b: value, c: upper bound
  kWhyNegativeStride,   // name: field, a: value
  kWhyStrideTooSmall,   // name: field, a: value, b: dim, name2: dim's name
  kWhyStrideExtent,     // name: strides (the tensor does not fit memory)
  kWhyOutAlias,         // name: field, a: stride, b: extent inside it
  kWhyBiasStride,       // name: field, a: value
  kWhyAdditiveHidden,   // a: additive_hidden
  kWhyWorkers,          // (parallel_for set, num_workers 0)
  kWhyDtype,            // a: kv_dtype
  kWhyDtypeF32Entry,    // a: kv_dtype
  kWhyNotFinite,        // name: array, a: index, f: value
  kWhySoftcap,          // f: softcap
  kWhySink,             // a: head, f: value
  kWhyNullBuffer,       // name: argument
  kWhyWorkspaceNull,    // a: workspace_size
  kWhyOverlap,          // name, name2: the two buffers
  // QKV_ERR_UNSUPPORTED
  kWhyUnknownBytes,     // a: struct_size, b: sizeof here
  kWhyLength32,         // name: q_len or kv_len, a: value
  kWhyDtypeUnserved,    // a: kv_dtype
  kWhyBackend,          // text: the name
  kWhyNoEngine,
  kWhyBackwardScore,    // a: score (the backward pass: DOT and GAUSSIAN)
  kWhyBackwardDtype,    // a: kv_dtype (the backward pass: F32)
  // QKV_ERR_WORKSPACE_TOO_SMALL
  kWhyWorkspaceSmall,   // a: given, b: needed
};

// kWhyNullArray's b for the I8 scales (the others are QKV_MASK_* flags).
constexpr int64_t kWhyFlagI8 = -1;

struct Why {
  Reason reason;
  const char* name;
  const char* name2;
  const char* text;
  int64_t a, b, c;
  double f;
};

// Writes the sentence for `why` (status st) into message[0, size).
void Describe(const Why& why, int status, char* message, size_t size);

}  // namespace qkv

#endif  // QKV_CAPI_WHY_H_
