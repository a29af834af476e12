// The portable backward pass: src/pipeline/backward-inl.h over plain floats
// (one "lane"), for the reference and Helium engines. Its own object, so
// that a firmware that never calls qkv_attention_backward_f32 links none of
// it (--gc-sections drops the rest).
#include <math.h>

#include "engine.h"

#define QKV_SIMD_NAMESPACE scalar_backward

namespace qkv {
namespace scalar_backward {

// The vector operations of backward-inl.h on single floats.
struct ScalarOps {
  using V = float;
  static constexpr int kUnroll = 4;  // tiles of 4 rows by 2 floats
  static constexpr size_t kTransposeLanes = 0;  // no in-register transposes
  static void Transpose(V*) {}
  static size_t Lanes() { return 1; }
  static V Zero() { return 0.0f; }
  static V Set(float x) { return x; }
  static V LoadU(const float* p) { return *p; }
  static void StoreU(V v, float* p) { *p = v; }
  static V Add(V a, V b) { return a + b; }
  static V Sub(V a, V b) { return a - b; }
  static V Mul(V a, V b) { return a * b; }
  static V MulAdd(V a, V b, V c) { return a * b + c; }
};

// libm's expf (<= 1 ulp in glibc and newlib).
struct LibmExp {
  static float Apply(float x) { return expf(x); }
};

}  // namespace scalar_backward
}  // namespace qkv

#include "pipeline/backward-inl.h"

namespace qkv {

const BackwardEngine* ReferenceBackward() {
  // Blocks of 8 rows and 16 keys: about 2 KiB of blocks in the workspace.
  return &scalar_backward::Backward<scalar_backward::ScalarOps,
                                    scalar_backward::LibmExp, 8, 16>::kEngine;
}

}  // namespace qkv
