// The layout of a worker's workspace for each path (Tile, LayoutTile,
// LayoutRowTile, LayoutTiny). Not SIMD: both SIMD engines instantiate the one
// pipeline (src/pipeline/flash-inl.h) over it, so they split work, mask and lay
// out memory identically.
#ifndef QKV_SRC_PIPELINE_WORKSPACE_H_
#define QKV_SRC_PIPELINE_WORKSPACE_H_

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "pipeline/tasks.h"

namespace qkv {
// Internal linkage for everything here: this header is compiled into the
// per-target SIMD objects (src/semantics.h says why that matters).
namespace {  // NOLINT(build/namespaces)

// Workspace of one worker, every region 64-byte aligned. R = 2 * lanes.
struct Tile {
  float* qt;           // [dim][R] queries, transposed, pre-scaled
  float* st;           // [kBlockKeys][R] scores, then probabilities
  float* ot;           // [value_dim][R] unnormalized output, transposed
  float* m;            // [R] running max
  float* inv_l;        // [R] 1 / sum
  float* sum;          // [R] sum
  float* tail;         // [lanes] scratch for partial vectors
  int32_t* lo;         // [R] first visible key per row
  int32_t* hi;         // [R] end of the visible keys (lo = hi = 0: padding)
  float* rel_lo;       // [R] lo and hi relative to the current block,
  float* rel_hi;       // [R] clamped to [0, kBlockKeys]: exact in float
  int64_t* row;        // [R] flat row index into weights and lse
  const float** bias;  // [R] bias row or NULL
  const float** q;     // [R] the row's query (scores' operand)
  float** out;         // [R] the row's output
  int64_t* pos;        // [R] the row's position (QueryPos)
  float* neg_slope;    // [R] -ALiBi slope of the row's head (0: none)
  float* rel_pos;      // [R] pos relative to the current block (ALiBi)
  float* sink;         // [R] the row's sink, or -inf
  // Row path: keys in lanes.
  float* q_rows;  // [kRowStateRows][dim] pre-scaled queries
  float* o_rows;  // [kRowStateRows][value_dim] unnormalized output
  float* s_row;   // [kRowStateRows][kBlockKeys + lanes] scores
  // Low-precision K/V: one block of keys and values dequantized (NULL for
  // f32, which is read in place).
  float* kblk;  // [kBlockKeys][dim]
  float* vblk;  // [kBlockKeys][value_dim]
};

// 0, 1, 2, ...: the key index of each lane in the tiny path (vectors of up
// to 2048 bits).
alignas(64) constexpr float kLaneIndex[64] = {
    0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
    16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
    32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
    48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};

// Tiny path (a row-path problem with kv_len <= lanes): keys and values
// transposed, keys in lanes. Such a problem runs nothing else, so its
// worker workspace is this small layout alone.
struct TinyTile {
  float* tail;   // [lanes] scratch for partial vectors
  float* kt;     // [dim][lanes]
  float* vt;     // [value_dim][lanes]
  float* kblk;   // [lanes][dim] low-precision keys dequantized, else NULL
  float* vblk;   // [lanes][value_dim] values alike
};

// The transposes cost a strided gather per dim and key block, and each
// output channel a lane reduction: only toy widths repay them. f32 up to 32
// summed dims (head_dim + value_dim), converted types up to 16, and at most
// 256 dims x keys; wider heads with few keys take the row path (measured in
// bench/README.md, "Path boundaries: the tiny path's widths").
constexpr int64_t kTinyMaxDims = 32;
constexpr int64_t kTinyMaxDimsConverted = 16;
constexpr int64_t kTinyMaxDimKeys = 256;

inline bool UsesTinyPath(const Problem& p, size_t lanes) {
  const int64_t dims = ScoreDim(p) + p.value_dim;
  const int64_t max_dims = p.kv_dtype == QKV_DTYPE_F32 ? kTinyMaxDims
                                                       : kTinyMaxDimsConverted;
  return UsesRowPath(p) && p.kv_len <= static_cast<int64_t>(lanes) &&
         dims <= max_dims && dims * p.kv_len <= kTinyMaxDimKeys;
}

// Bytes of a tiny-path worker's workspace; with base non-NULL also fills
// *tile.
inline size_t LayoutTiny(const Problem& p, size_t lanes, unsigned char* base,
                         TinyTile* tile) {
  const size_t dim = static_cast<size_t>(ScoreDim(p));
  const size_t tail_bytes = AlignUp(lanes * 4);
  const size_t kt_bytes = AlignUp(dim * lanes * 4);
  const size_t vt_bytes = AlignUp(static_cast<size_t>(p.value_dim) * lanes * 4);
  const bool convert = p.kv_dtype != QKV_DTYPE_F32;
  const size_t kblk_bytes =
      convert && p.score != QKV_SCORE_ADDITIVE ? kt_bytes : 0;
  const size_t vblk_bytes = convert ? vt_bytes : 0;
  if (tile != nullptr) {
    unsigned char* at = base;
    tile->tail = reinterpret_cast<float*>(at);
    tile->kt = reinterpret_cast<float*>(at += tail_bytes);
    tile->vt = reinterpret_cast<float*>(at += kt_bytes);
    at += vt_bytes;
    tile->kblk = kblk_bytes != 0 ? reinterpret_cast<float*>(at) : nullptr;
    tile->vblk = vblk_bytes != 0 ? reinterpret_cast<float*>(at + kblk_bytes)
                                 : nullptr;
  }
  return tail_bytes + kt_bytes + vt_bytes + kblk_bytes + vblk_bytes;
}

// Floats of one row's block of scores on the row path: a block and the
// padding of its last vector.
inline size_t RowScoreFloats(size_t lanes) {
  return static_cast<size_t>(kBlockKeys) + lanes;
}

// Carves a worker's workspace: each call takes the next 64-byte aligned
// region (NULL when only counting bytes).
class WorkspaceCarver {
 public:
  explicit WorkspaceCarver(unsigned char* base) : base_(base), offset_(0) {}
  template <class T>
  T* Take(size_t count) {
    unsigned char* at = base_ != nullptr ? base_ + offset_ : nullptr;
    offset_ += AlignUp(count * sizeof(T));
    return reinterpret_cast<T*>(at);
  }
  size_t bytes() const { return offset_; }

 private:
  unsigned char* base_;
  size_t offset_;
};

// The per-row arrays of R rows every path keeps, and the row path's
// queries, outputs and scores of `rows` rows.
inline void TakeRowState(WorkspaceCarver* w, size_t R, size_t rows,
                         size_t lanes, size_t dim, size_t dv, Tile* t) {
  t->m = w->Take<float>(R);
  t->sum = w->Take<float>(R);
  t->tail = w->Take<float>(lanes);
  t->lo = w->Take<int32_t>(R);
  t->hi = w->Take<int32_t>(R);
  t->row = w->Take<int64_t>(R);
  t->bias = w->Take<const float*>(R);
  t->q = w->Take<const float*>(R);
  t->out = w->Take<float*>(R);
  t->pos = w->Take<int64_t>(R);
  t->neg_slope = w->Take<float>(R);
  t->sink = w->Take<float>(R);
  t->q_rows = w->Take<float>(rows * dim);
  t->o_rows = w->Take<float>(rows * dv);
  t->s_row = w->Take<float>(rows * RowScoreFloats(lanes));
}

// Bytes of one worker's workspace; with base non-NULL also fills *tile.
inline size_t LayoutTile(const Problem& p, size_t lanes, unsigned char* base,
                         Tile* tile) {
  const size_t r = 2 * lanes;
  const size_t dim = static_cast<size_t>(ScoreDim(p));
  const size_t dv = static_cast<size_t>(p.value_dim);
  WorkspaceCarver w(base);
  Tile t{};
  t.qt = w.Take<float>(dim * r);
  t.st = w.Take<float>(static_cast<size_t>(kBlockKeys) * r);
  t.ot = w.Take<float>(dv * r);
  t.inv_l = w.Take<float>(r);
  t.rel_lo = w.Take<float>(r);
  t.rel_hi = w.Take<float>(r);
  t.rel_pos = w.Take<float>(r);
  TakeRowState(&w, r, static_cast<size_t>(kRowStateRows), lanes, dim, dv,
               &t);
  const bool convert = p.kv_dtype != QKV_DTYPE_F32;
  const bool convert_k = convert && p.score != QKV_SCORE_ADDITIVE;
  if (convert_k) t.kblk = w.Take<float>(static_cast<size_t>(kBlockKeys) * dim);
  if (convert) t.vblk = w.Take<float>(static_cast<size_t>(kBlockKeys) * dv);
  if (tile != nullptr) *tile = t;
  return w.bytes();
}

// One kv head's row-path state in an interleaved task (RunRowsHeads):
// what RunRows keeps in its Tile, for the group's rows (at most
// kRowPathMaxRows; 2.1 KiB a head for one row of d 128), with a score row
// per row (the group's heads keep a block's scores while the other heads
// are scored). The tile path's arrays are NULL. Bytes; with base non-NULL
// also fills *tile.
inline size_t LayoutRowTile(const Problem& p, size_t lanes,
                            unsigned char* base, Tile* tile) {
  const size_t rows = static_cast<size_t>(p.group * p.q_len);  // <= 4
  WorkspaceCarver w(base);
  Tile t{};
  TakeRowState(&w, rows, rows, lanes, static_cast<size_t>(ScoreDim(p)),
               static_cast<size_t>(p.value_dim), &t);
  if (tile != nullptr) *tile = t;
  return w.bytes();
}

}  // namespace
}  // namespace qkv

#endif  // QKV_SRC_PIPELINE_WORKSPACE_H_
