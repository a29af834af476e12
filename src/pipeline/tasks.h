// How a call is split into tasks: a task owns the query rows of one (batch, kv
// head), the rows of every query head of its GQA group flattened as (head in
// group, query), consecutive in q and out; R = 2 * lanes of them per tile task,
// lanes holding rows. A (batch, kv head) with at most kRowPathMaxRows rows
// (decoding) is one row-path task instead, keys in lanes. Also the
// flash-decoding key splits and their merge, tile groups and interleaved heads.
// Not SIMD: both SIMD engines instantiate the one pipeline
// (src/pipeline/flash-inl.h) over it, so they split work, mask and lay out
// memory identically.
#ifndef QKV_SRC_PIPELINE_TASKS_H_
#define QKV_SRC_PIPELINE_TASKS_H_

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "pipeline/operands.h"

namespace qkv {
// Internal linkage for everything here: this header is compiled into the
// per-target SIMD objects (src/semantics.h says why that matters).
namespace {  // NOLINT(build/namespaces)

inline bool UsesRowPath(const Problem& p) {
  return p.group * p.q_len <= kRowPathMaxRows;
}

// Flash-decoding: a (batch, kv head) with at most kSplitMaxRows query rows
// (GQA group x q_len: decoding at every GQA ratio up to 16, row path and
// tile path alike) and more than kSplitKeys keys is split into KeySplits
// tasks of kSplitKeys keys each, so that decoding spreads over workers even
// with one kv head. Each split leaves a partial (max, sum, unnormalized
// output) per row in the shared workspace; the split that finishes last (an
// atomic count per (batch, kv head, first row of the task)) merges them in
// split order. The split and the merge order depend on the shape only, so
// the result is bitwise identical for any number of workers and schedule.
// Engines opt in by using SplitTasks/SplitTaskAt and the Split* helpers.
constexpr int64_t kSplitKeys = 512;
constexpr int64_t kSplitMaxRows = 16;

inline int64_t KeySplits(const Problem& p) {
  return p.group * p.q_len <= kSplitMaxRows
             ? (p.kv_len + kSplitKeys - 1) / kSplitKeys
             : 1;
}

// Floats of one split's partial: [rows of the group][max, sum, out[value_dim]].
inline int64_t SplitPartialFloats(const Problem& p) {
  return p.group * p.q_len * (p.value_dim + 2);
}

// A counter per (batch, kv head, task's first row): a group's rows may take
// several tiles (narrow vectors), each merging its own rows.
inline size_t SplitCountersBytes(const Problem& p) {
  if (KeySplits(p) == 1) return 0;
  return AlignUp(static_cast<size_t>(p.batch * p.kv_heads * kSplitMaxRows) *
                 sizeof(uint32_t));
}

inline size_t SplitPartialsBytes(const Problem& p) {
  if (KeySplits(p) == 1) return 0;
  return AlignUp(static_cast<size_t>(p.batch * p.kv_heads * KeySplits(p) *
                                     SplitPartialFloats(p)) *
                 sizeof(float));
}

// Shared workspace: additive projections, then split counters and partials.
inline size_t SharedWorkspace(const Problem& p) {
  return ProjectionBytes(p) + SplitCountersBytes(p) + SplitPartialsBytes(p);
}

// Zeroes the split counters; run once per call before any task (Prepare).
inline void ResetSplitCounters(const Problem& p, unsigned char* shared) {
  const size_t bytes = SplitCountersBytes(p);
  unsigned char* at = shared + ProjectionBytes(p);
  for (size_t i = 0; i < bytes; ++i) at[i] = 0;
}

// This split's partial slot. Tasks write only their own slot; the slots are
// in the shared workspace, which is otherwise read-only to tasks.
inline float* SplitPartial(const Problem& p, const unsigned char* shared,
                           int64_t b, int64_t kvh, int64_t split) {
  unsigned char* base = const_cast<unsigned char*>(shared) +
                        ProjectionBytes(p) + SplitCountersBytes(p);
  const int64_t slot = (b * p.kv_heads + kvh) * KeySplits(p) + split;
  return reinterpret_cast<float*>(base) + slot * SplitPartialFloats(p);
}

// Counts this split of the task's rows as done; true for the one that
// completes the set (it then sees every other split's partial:
// acquire-release ordering).
inline bool LastSplitDone(const Problem& p, const unsigned char* shared,
                          int64_t b, int64_t kvh, int64_t r0) {
  uint32_t* counters = reinterpret_cast<uint32_t*>(
      const_cast<unsigned char*>(shared) + ProjectionBytes(p));
  const uint32_t done = __atomic_add_fetch(
      &counters[(b * p.kv_heads + kvh) * kSplitMaxRows + r0], 1u,
      __ATOMIC_ACQ_REL);
  return done == static_cast<uint32_t>(KeySplits(p));
}

// Tile groups. Strided K and V rows (a token-major cache: one head's rows
// heads * dim floats apart) fill only a fraction of each cache page's sets
// (rows 2 KiB apart use 1/8 of a 4 KiB page's lines), so a kv head's keys
// and values that would stay in L2 as dense rows do not: every tile's pass
// over them comes from L3. The tile path then takes kGroupTiles tiles of a
// kv head per task and gives each key block to all of them in turn
// (RunTileGroup), each tile doing exactly what it does alone (4 tiles: 8
// or 16 gain little more for 2x or 4x the workspace). Dense rows
// keep one tile per task: their blocks stay cached anyway, and a tile's
// output and queries stay in L1. Low-precision K and V are grouped too: the
// tiles of a group whose block starts at the same key share one
// dequantized copy of it, made once instead of once per tile (bench/README.md,
// "The plan's rules and the figures behind them").
constexpr int64_t kGroupTiles = 4;

// Strided value rows are read this many keys at a time (AccumulateOutput):
// the output's column passes then revisit rows that still fit the few L1
// sets they share (8 keys measured slower: more output loads and stores).
constexpr int64_t kStridedValueKeys = 16;

inline bool GroupsTiles(const Problem& p) {
  return !UsesRowPath(p) && KeySplits(p) == 1 &&
         p.score != QKV_SCORE_ADDITIVE &&
         (p.kv_dtype != QKV_DTYPE_F32 || p.k_st > p.head_dim ||
          p.v_st > p.value_dim);
}

inline int64_t TilesPerHead(const Problem& p, size_t tile_rows) {
  if (UsesRowPath(p)) return 1;
  const int64_t r = static_cast<int64_t>(tile_rows);
  return (p.group * p.q_len + r - 1) / r;
}

// The split depends on the Problem and the engine's tile size only, never on
// the number of workers: results are bitwise identical for any schedule.
inline size_t NumTileTasks(const Problem& p, size_t tile_rows) {
  return static_cast<size_t>(p.batch * p.kv_heads *
                             TilesPerHead(p, tile_rows));
}

struct TileTask {
  int64_t b, kvh;
  int64_t r0, rows;  // flat rows [r0, r0 + rows) of the (b, kvh) group
  bool row_path;
  int64_t split;                // key split (0 without splitting)
  int64_t key_begin, key_end;   // the keys this task scores
  int64_t heads;                // kv heads [kvh, kvh + heads): 1, or more
                                // when InterleavesHeads
  int64_t splits;               // key splits [split, split + splits), each
                                // [key_begin, key_end) cut at kSplitKeys
};

inline TileTask TileTaskAt(const Problem& p, size_t task, size_t tile_rows) {
  const int64_t tiles = TilesPerHead(p, tile_rows);
  const int64_t t = static_cast<int64_t>(task);
  // A 64-bit division is tens of cycles: skip the ones by 1 (one tile per
  // head, one kv head), which is what small calls have.
  const int64_t bkv = tiles == 1 ? t : t / tiles;
  TileTask r;
  r.b = p.kv_heads == 1 ? bkv : bkv / p.kv_heads;
  r.kvh = bkv - r.b * p.kv_heads;
  r.row_path = UsesRowPath(p);
  const int64_t total = p.group * p.q_len;
  const int64_t size = r.row_path ? total : static_cast<int64_t>(tile_rows);
  r.r0 = (t - bkv * tiles) * size;
  r.rows = total - r.r0 < size ? total - r.r0 : size;
  r.split = 0;
  r.splits = 1;
  r.key_begin = 0;
  r.key_end = p.kv_len;
  r.heads = 1;
  return r;
}

// Interleaved heads. A token-major cache ([token][kv_heads][dim]) puts
// a kv head's consecutive rows heads * dim apart: 16 KiB for 32 heads of
// d 128, so one head's keys are 512 bytes out of every 4 KiB page, and a
// decoding task that walks one head at a time reads memory as 64 streams of
// 512-byte pieces, which the hardware prefetchers do not follow. Row-path
// tasks over such a cache take up to kHeadGroupMax kv heads of a batch at
// once instead (RunRowsHeads) and step through each key block
// kInterleaveKeys keys at a time, every head of the group in turn: a few
// whole token rows, read in address order, which the prefetchers follow.
// Each head does the same operations on the same blocks as alone, so the
// bits are the dense call's. Low-precision caches take it with a single row per kv head (the
// fused readers; several rows dequantize a block per head). Where the
// hardware prefetchers alone fall short (joint rows, rows not on 64-byte
// lines) the walk goes kInterleaveKeysPrefetched keys at a time and
// prefetches the piece kPieceLead pieces ahead (RunRowsHeads). f32 rows on
// 16-lane x86 targets go kInterleaveKeysWide keys at a time (the plan,
// HeadsStep; bench/README.md, "Interleaved heads for token-major decoding"
// and "The plan's rules and the figures behind them").
constexpr int64_t kHeadGroupMax = 32;
constexpr int64_t kInterleaveKeys = 8;
constexpr int64_t kInterleaveKeysWide = 32;
constexpr int64_t kInterleaveKeysPrefetched = 4;
constexpr int64_t kPieceLead = 4;

inline bool InterleavesHeads(const Problem& p) {
  if (!UsesRowPath(p) || p.kv_heads < 2 || p.kv_len <= kBlockKeys ||
      p.score == QKV_SCORE_ADDITIVE) {
    return false;
  }
  if (p.kv_dtype != QKV_DTYPE_F32 &&
      (p.group * p.q_len != 1 || p.score != QKV_SCORE_DOT)) {
    return false;
  }
  return p.k_sh > 0 && p.k_sh < p.k_st && p.v_sh > 0 && p.v_sh < p.v_st;
}

// Kv heads per interleaved task: all of a batch's, or as few groups of
// at most kHeadGroupMax as there can be, of equal size.
inline int64_t HeadGroup(const Problem& p) {
  const int64_t groups = (p.kv_heads + kHeadGroupMax - 1) / kHeadGroupMax;
  return (p.kv_heads + groups - 1) / groups;
}

inline int64_t HeadGroups(const Problem& p) {
  const int64_t g = HeadGroup(p);
  return (p.kv_heads + g - 1) / g;
}

// Tasks with flash-decoding splits: (batch, kv head, split) on the row path,
// (batch, group of kv heads, split) when it interleaves heads.
inline size_t SplitTasks(const Problem& p, size_t tile_rows) {
  if (InterleavesHeads(p)) {
    return static_cast<size_t>(p.batch * HeadGroups(p) * KeySplits(p));
  }
  return NumTileTasks(p, tile_rows) * static_cast<size_t>(KeySplits(p));
}

// The order of the splits' tasks follows the cache. Where a kv head's K
// rows (and V rows) come before the next head's (dense, head-major
// strides), head-major: consecutive tasks take consecutive keys of one kv
// head, so a worker going from task to task reads one stream that goes on
// where the last task stopped, which the hardware prefetchers keep
// following (bench/README.md, "Decoding splits in cache order; int8 and
// token-major on Zen 5"). Elsewhere (a token-major cache,
// [token][kv_heads][dim]: a head's rows 16 KiB apart for 32 heads of d 128,
// each row on its own 4 KiB page) split-major: consecutive tasks take the
// same keys of consecutive kv heads, so the cache is walked a few hundred
// pages at a time, which the TLB holds for the next heads, instead of every
// page of the cache once per head (measured slower, same section).
inline bool SplitsHeadMajor(const Problem& p) {
  return !(p.k_sh > 0 && p.k_sh < p.k_st) && !(p.v_sh > 0 && p.v_sh < p.v_st);
}

// r takes splits [first, first + count): their keys, to kv_len.
inline void SetSplits(const Problem& p, int64_t first, int64_t count,
                      TileTask* r) {
  r->split = first;
  r->splits = count;
  r->key_begin = first * kSplitKeys;
  const int64_t end = (first + count) * kSplitKeys;
  r->key_end = end < p.kv_len ? end : p.kv_len;
}

inline TileTask SplitTaskAt(const Problem& p, size_t task, size_t tile_rows) {
  const int64_t splits = KeySplits(p);
  if (InterleavesHeads(p)) {  // split-major too: (split, batch, head group)
    const int64_t groups = HeadGroups(p), per = HeadGroup(p);
    const int64_t t = static_cast<int64_t>(task);
    const int64_t bg = t % (p.batch * groups);
    TileTask r = TileTaskAt(p, 0, tile_rows);
    r.b = bg / groups;
    r.kvh = (bg - r.b * groups) * per;
    r.heads = p.kv_heads - r.kvh < per ? p.kv_heads - r.kvh : per;
    SetSplits(p, t / (p.batch * groups), 1, &r);
    return r;
  }
  if (splits == 1) return TileTaskAt(p, task, tile_rows);
  const size_t heads = NumTileTasks(p, tile_rows);
  const size_t n = static_cast<size_t>(splits);
  const bool head_major = SplitsHeadMajor(p);
  TileTask r = TileTaskAt(p, head_major ? task / n : task % heads, tile_rows);
  SetSplits(p, static_cast<int64_t>(head_major ? task % n : task / heads), 1,
            &r);
  return r;
}

}  // namespace
}  // namespace qkv

#endif  // QKV_SRC_PIPELINE_TASKS_H_
