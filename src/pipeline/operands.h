// The pipeline's constants and operands: key blocks, the row path's row counts,
// the score kinds, and what the score kernels read (raw or projected queries
// and keys, the K/V sources). Not SIMD: both SIMD engines instantiate the one
// pipeline (src/pipeline/flash-inl.h) over it, so they split work, mask and lay
// out memory identically.
#ifndef QKV_SRC_PIPELINE_OPERANDS_H_
#define QKV_SRC_PIPELINE_OPERANDS_H_

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "engine.h"
#include "semantics.h"

namespace qkv {
// Internal linkage for everything here: this header is compiled into the
// per-target SIMD objects (src/semantics.h says why that matters).
namespace {  // NOLINT(build/namespaces)

// Keys per online-softmax block: the score tile is kBlockKeys x R floats
// (8 KiB with R = 32), which stays in L1 next to the packed queries.
constexpr int64_t kBlockKeys = 64;

// Keys of the block that starts at j0 of keys that stop at `end`.
inline int64_t BlockKeys(int64_t j0, int64_t end) {
  return j0 + kBlockKeys < end ? kBlockKeys : end - j0;
}

// A (batch, kv head) with at most this many query rows (GQA group x q_len)
// takes the row path: decoding is memory-bound, and reading each K and V row
// once, contiguously, beats filling lanes with rows that are not there.
constexpr int64_t kRowPathMaxRows = 4;

// Rows of a tile's row state (q_rows, o_rows, s_row): the row path's, and
// the 8 rows of a decoding step at GQA 8 that x86 targets with full-width
// transposes (AVX-512, AVX2) give to the row path's RunRows from the tile
// path (Flash::RunTileOfRows).
constexpr int64_t kRowStateRows = 8;

// Score kinds. For kAdditive the "queries" and "keys" a kernel sees are the
// projections W_q q and W_k k (dimension additive_hidden) made by Prepare.
// kDotScaled is kDot with the scale applied to the finished dot product
// instead of folded into the packed queries: for |scale| > 1, where
// scale * q can overflow to inf although scale * (q . k) does not (inf * 0
// would then make a NaN score).
enum Kind { kDot, kGaussian, kAdditive, kDotScaled };

// Length of the vectors a score compares: head_dim, or additive_hidden.
inline int64_t ScoreDim(const Problem& p) {
  return p.score == QKV_SCORE_ADDITIVE ? p.additive_hidden : p.head_dim;
}

// The K/V block source of one (batch, kv head): what the score and output
// kernels read. Rows are strided (token-major caches, spare capacity). f32
// rows are read in place (k, v); F16, BF16 and I8 rows (kv_dtype) are
// dequantized a block of keys at a time into the worker's kblk and vblk
// (convert_k, convert_v), and the kernels read those, so every path, score
// kind and variant serves every element type with the f32 kernels.
struct Operands {
  const float* q;  // queries, not yet scaled: (b, h, i) at
  int64_t q_sb, q_sh, q_st;  //   q + b * q_sb + h * q_sh + i * q_st
  int64_t k_st;    // floats between the rows of a key block (KeyBlock)
  int64_t v_st;    // and of a value block (ValueBlock)
  int64_t dim;     // head_dim, or additive_hidden for kAdditive
  float q_scale;   // applied when packing queries (kDot folds scale in here)
  float finish;    // applied to finished scores (kGaussian: -scale,
                   // kDotScaled: scale, else 1)
  int kind;
  // The rows as stored, read through KvRowAt (src/semantics.h): K (or the
  // additive projections) and V.
  KvSource ksrc, vsrc;
  bool convert_k, convert_v;  // not f32 in memory: dequantize per block
};

// Additive scores read projections made once per call: [B][Hkv][Lk][hidden]
// keys, then [B][Hq][Lq][hidden] queries, in the shared workspace.
inline size_t ProjectedKeysBytes(const Problem& p) {
  return AlignUp(static_cast<size_t>(p.batch * p.kv_heads * p.kv_len *
                                     p.additive_hidden) *
                 sizeof(float));
}

// Projected queries, then (low-precision K) one dequantized key row.
inline size_t ProjectedQueriesBytes(const Problem& p) {
  return AlignUp(static_cast<size_t>(p.batch * p.q_heads * p.q_len *
                                     p.additive_hidden) *
                 sizeof(float));
}

inline size_t ProjectionBytes(const Problem& p) {
  if (p.score != QKV_SCORE_ADDITIVE) return 0;
  const size_t key_row =
      p.kv_dtype == QKV_DTYPE_F32
          ? 0
          : AlignUp(static_cast<size_t>(p.head_dim) * sizeof(float));
  return ProjectedKeysBytes(p) + ProjectedQueriesBytes(p) + key_row;
}

inline Operands OperandsFor(const Problem& p, const unsigned char* shared,
                            int64_t b, int64_t kvh) {
  Operands o;
  const bool f32 = p.kv_dtype == QKV_DTYPE_F32;
  o.vsrc = ValueSource(p, b, kvh);
  o.convert_v = !f32;
  o.v_st = f32 ? p.v_st : p.value_dim;
  if (p.score == QKV_SCORE_ADDITIVE) {
    const float* keys = reinterpret_cast<const float*>(shared);
    const int64_t hidden = p.additive_hidden;
    o.q = reinterpret_cast<const float*>(shared + ProjectedKeysBytes(p));
    o.q_st = hidden;
    o.q_sh = p.q_len * hidden;
    o.q_sb = p.q_heads * o.q_sh;
    o.k_st = hidden;
    o.ksrc.base = reinterpret_cast<const unsigned char*>(
        keys + (b * p.kv_heads + kvh) * p.kv_len * hidden);
    o.ksrc.row_bytes = hidden * static_cast<int64_t>(sizeof(float));
    o.ksrc.dtype = QKV_DTYPE_F32;
    o.ksrc.scales = nullptr;
    o.ksrc.scale_st = 0;
    o.convert_k = false;
    o.dim = hidden;
    o.q_scale = 1.0f;
    o.finish = 1.0f;
    o.kind = kAdditive;
  } else {
    o.q = p.q;
    o.q_sb = p.q_sb;
    o.q_sh = p.q_sh;
    o.q_st = p.q_st;
    o.ksrc = KeySource(p, b, kvh);
    o.convert_k = !f32;
    o.k_st = f32 ? p.k_st : p.head_dim;
    o.dim = p.head_dim;
    if (p.score == QKV_SCORE_GAUSSIAN) {
      o.q_scale = 1.0f;
      o.finish = ScoreFactor(p);  // -scale
      o.kind = kGaussian;
    } else if (p.scale >= -1.0f && p.scale <= 1.0f) {
      // |scale * q[t]| <= |q[t]|: folding the scale in cannot overflow.
      o.q_scale = ScoreFactor(p);  // scale
      o.finish = 1.0f;
      o.kind = kDot;
    } else {
      o.q_scale = 1.0f;
      o.finish = ScoreFactor(p);  // scale
      o.kind = kDotScaled;
    }
  }
  return o;
}

// Query i of (batch b, head h) as the score kernels read it.
inline const float* QueryOf(const Operands& op, int64_t b, int64_t h,
                            int64_t i) {
  return op.q + b * op.q_sb + h * op.q_sh + i * op.q_st;
}

}  // namespace
}  // namespace qkv

#endif  // QKV_SRC_PIPELINE_OPERANDS_H_
