// Each task's rows: their queries, outputs, positions and key intervals
// (summarized for block skipping), set up for the tile, row and tiny paths. Not
// SIMD: both SIMD engines instantiate the one pipeline
// (src/pipeline/flash-inl.h) over it, so they split work, mask and lay out
// memory identically.
#ifndef QKV_SRC_PIPELINE_ROWS_H_
#define QKV_SRC_PIPELINE_ROWS_H_

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "pipeline/tasks.h"
#include "pipeline/workspace.h"

namespace qkv {
// Internal linkage for everything here: this header is compiled into the
// per-target SIMD objects (src/semantics.h says why that matters).
namespace {  // NOLINT(build/namespaces)

// Flat row r of a (batch, kv head) group is query i = r % q_len of query
// head h = kvh * group + r / q_len. RowWalker visits rows in order, counting
// (h, i) up: one division to start mid-group, none from row 0.
struct RowWalker {
  int64_t h, i;
  RowWalker(const Problem& p, int64_t kvh) : h(kvh * p.group), i(0) {}
  RowWalker(const Problem& p, int64_t kvh, int64_t r0)
      : h(kvh * p.group + r0 / p.q_len), i(r0 % p.q_len) {}
  // Index of the row in q, out, weights and lse (in rows).
  int64_t Row(const Problem& p, int64_t b) const {
    return (b * p.q_heads + h) * p.q_len + i;
  }
  void Next(const Problem& p) {
    if (++i == p.q_len) {
      i = 0;
      ++h;
    }
  }
};

// The keys a set of rows sees, summarized for block skipping: blocks
// outside [begin, end) are never computed, and blocks inside
// [full_begin, full_end) need no mask (every row sees all of their keys).
struct RowsSpan {
  int64_t begin, end;            // min lo, max hi (begin = end: nothing)
  int64_t full_begin, full_end;  // max lo, min hi
  void Add(const KeyInterval& k) {
    if (k.lo >= k.hi) {  // sees nothing: no key is fully visible
      full_end = 0;
      return;
    }
    begin = k.lo < begin ? k.lo : begin;
    end = k.hi > end ? k.hi : end;
    full_begin = k.lo > full_begin ? k.lo : full_begin;
    full_end = k.hi < full_end ? k.hi : full_end;
  }
  // True when some row does not see every key of [j0, j0 + nb).
  bool Masks(int64_t j0, int64_t nb) const {
    return j0 < full_begin || j0 + nb > full_end;
  }
};

inline RowsSpan EmptySpan(const Problem& p) {
  RowsSpan s;
  s.begin = p.kv_len;
  s.end = 0;
  s.full_begin = 0;
  s.full_end = p.kv_len;
  return s;
}

// Row r of a task: its indices, key interval, bias row, query, output,
// position, ALiBi slope and sink, from the walker's (h, i).
inline KeyInterval SetUpRow(const Problem& p, const Operands& op, int64_t b,
                            const RowWalker& at, size_t r, const Tile& tile) {
  const KeyInterval keys = RowKeys(p, b, at.i);
  tile.row[r] = at.Row(p, b);
  tile.lo[r] = static_cast<int32_t>(keys.lo);
  tile.hi[r] = static_cast<int32_t>(keys.hi);
  tile.bias[r] = BiasRow(p, b, at.h, at.i);
  tile.q[r] = QueryOf(op, b, at.h, at.i);
  tile.out[r] = OutRow(p, b, at.h, at.i);
  tile.pos[r] = QueryPos(p, b, at.i);
  tile.neg_slope[r] = -AlibiSlope(p, at.h);
  tile.sink[r] = RowSink(p, at.h);
  return keys;
}

// Tile path: every lane's row (lanes >= rows are padding: an empty
// interval, no slope, never written out), the span of the real rows'
// intervals, and the transposed output zeroed.
inline RowsSpan SetUpTileRows(const Problem& p, const Operands& op, int64_t b,
                              int64_t kvh, int64_t r0, int64_t rows, size_t R,
                              const Tile& tile) {
  RowsSpan span = EmptySpan(p);
  RowWalker at(p, kvh, r0);
  for (size_t r = 0; r < R; ++r) {
    if (static_cast<int64_t>(r) < rows) {
      span.Add(SetUpRow(p, op, b, at, r, tile));
      at.Next(p);
    } else {
      tile.lo[r] = 0;
      tile.hi[r] = 0;
      tile.bias[r] = nullptr;
      tile.pos[r] = 0;
      tile.neg_slope[r] = 0.0f;
      tile.sink[r] = -INFINITY;
    }
  }
  if (span.begin > span.end) span.begin = span.end;
  for (size_t i = 0; i < static_cast<size_t>(p.value_dim) * R; ++i) {
    tile.ot[i] = 0.0f;
  }
  return span;
}

// The tile's key intervals relative to block [j0, j0 + kBlockKeys),
// clamped to [0, kBlockKeys]: small integers, exact in float, so the
// mask is a float compare with the key's index in the block.
inline void RelativeIntervals(const Tile& tile, size_t R, int64_t j0) {
  for (size_t r = 0; r < R; ++r) {
    int64_t lo = tile.lo[r] - j0, hi = tile.hi[r] - j0;
    lo = lo < 0 ? 0 : (lo > kBlockKeys ? kBlockKeys : lo);
    hi = hi < 0 ? 0 : (hi > kBlockKeys ? kBlockKeys : hi);
    tile.rel_lo[r] = static_cast<float>(lo);
    tile.rel_hi[r] = static_cast<float>(hi);
  }
}

// The tile's positions relative to block j0, for ALiBi's |pos - j|.
inline void RelativePositions(const Tile& tile, size_t R, int64_t j0) {
  for (size_t r = 0; r < R; ++r) {
    tile.rel_pos[r] = static_cast<float>(tile.pos[r] - j0);
  }
}

// qt[t][r] = q_row(r)[t] * q_scale, zero for padding lanes (scalar; SIMD
// engines transpose full tiles with gathers instead).
inline void PackQueriesScalar(const Operands& op, int64_t rows, size_t R,
                              const Tile& tile) {
  const int64_t d = op.dim;
  for (size_t r = 0; r < R; ++r) {
    if (static_cast<int64_t>(r) < rows) {
      const float* q = tile.q[r];
      for (int64_t t = 0; t < d; ++t) tile.qt[t * R + r] = q[t] * op.q_scale;
    } else {
      for (int64_t t = 0; t < d; ++t) tile.qt[t * R + r] = 0.0f;
    }
  }
}

// Row path: rows, key intervals, bias rows, running max and sum, packed
// queries and zeroed outputs of every row of (b, kvh). Returns their span.
inline RowsSpan SetUpRowPath(const Problem& p, const Operands& op, int64_t b,
                             int64_t kvh, int64_t rows, const Tile& tile) {
  const int64_t d = op.dim, dv = p.value_dim;
  RowsSpan span = EmptySpan(p);
  RowWalker at(p, kvh);
  for (int64_t r = 0; r < rows; ++r) {
    span.Add(SetUpRow(p, op, b, at, static_cast<size_t>(r), tile));
    at.Next(p);
    tile.m[r] = -INFINITY;
    tile.sum[r] = 0.0f;
    const float* q = tile.q[r];
    for (int64_t t = 0; t < d; ++t) tile.q_rows[r * d + t] = q[t] * op.q_scale;
    for (int64_t c = 0; c < dv; ++c) tile.o_rows[r * dv + c] = 0.0f;
  }
  if (span.begin > span.end) span.begin = span.end;
  return span;
}

// Flash-decoding: stores this split's (max, sum, output) of the task's
// rows; the split that completes the set merges all of them, in split
// order, into tile.m, tile.sum and the output o (row r's column c at
// o[r * row_stride + c * col_stride]: o_rows on the row path, the
// transposed ot on the tile path) and returns true. Others return false.
// Never inlined: under -ffp-contract=fast the compiler fuses the merge's
// products into their additions where the caller's target has FMA, in
// some inlined copies and not in others, which made the merge's bits
// depend on inlining; one out-of-line copy per object does the same
// arithmetic for every caller.
__attribute__((noinline)) inline bool MergeSplits(const Problem& p,
                                                  const TileTask& task,
                                                  const unsigned char* shared,
                                                  const Tile& tile, float* o,
                                                  int64_t row_stride,
                                                  int64_t col_stride) {
  const int64_t dv = p.value_dim, stride = dv + 2;
  float* mine = SplitPartial(p, shared, task.b, task.kvh, task.split) +
                task.r0 * stride;
  for (int64_t r = 0; r < task.rows; ++r) {
    float* part = mine + r * stride;
    part[0] = tile.m[r];
    part[1] = tile.sum[r];
    const float* orow = o + r * row_stride;
    for (int64_t c = 0; c < dv; ++c) part[2 + c] = orow[c * col_stride];
  }
  if (!LastSplitDone(p, shared, task.b, task.kvh, task.r0)) return false;
  const int64_t splits = KeySplits(p);
  for (int64_t r = 0; r < task.rows; ++r) {
    const int64_t at = (task.r0 + r) * stride;
    float m = -INFINITY;
    for (int64_t s = 0; s < splits; ++s) {
      const float ms = SplitPartial(p, shared, task.b, task.kvh, s)[at];
      m = ms > m ? ms : m;
    }
    float sum = 0.0f;
    float* orow = o + r * row_stride;
    for (int64_t c = 0; c < dv; ++c) orow[c * col_stride] = 0.0f;
    if (m != -INFINITY) {
      for (int64_t s = 0; s < splits; ++s) {
        const float* part = SplitPartial(p, shared, task.b, task.kvh, s) + at;
        if (part[0] == -INFINITY) continue;  // this split saw no key
        const float f = expf(part[0] - m);
        sum += part[1] * f;
        for (int64_t c = 0; c < dv; ++c) {
          orow[c * col_stride] += part[2 + c] * f;
        }
      }
    }
    tile.m[r] = m;
    tile.sum[r] = sum;
  }
  return true;
}

// Adds row r's bias to its scores st[j * stride] for keys [j0, j0 + nb); a
// -inf bias hides the key whatever its score (even NaN from a bad key).
inline void AddBias(const float* bias_row, int64_t j0, int64_t nb,
                    size_t stride, float* st) {
  const float* bias = bias_row + j0;
  for (int64_t j = 0; j < nb; ++j) {
    float& s = st[static_cast<size_t>(j) * stride];
    s = WithBias(s, bias[j]);
  }
}

}  // namespace
}  // namespace qkv

#endif  // QKV_SRC_PIPELINE_ROWS_H_
