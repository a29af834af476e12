// The part of the SIMD pipeline (src/pipeline/flash-inl.h) that is not
// SIMD: how a call is split into tasks, each task's rows and their key
// intervals (summarized for block skipping), what the score kernels read
// (raw or projected queries and keys), the flash-decoding merge, and the
// layout of a worker's workspace. Both SIMD engines instantiate the one
// pipeline, so they split work, mask and lay out memory identically.
//
// A task owns the query rows of one (batch, kv head): the rows of every query
// head of its GQA group, flattened as (head in group, query). Those rows are
// consecutive in q and out (the group's heads are adjacent), R = 2 * lanes of
// them per "tile" task, lanes holding rows. A (batch, kv head) with at most
// kRowPathMaxRows rows (decoding) is one "row path" task instead, keys in
// lanes.
#ifndef QKV_SRC_TILING_H_
#define QKV_SRC_TILING_H_

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
  const float* k;  // the kv head's keys: key j at k + j * k_st
  int64_t k_st;
  const float* v;  // the kv head's values: value j at v + j * v_st
  int64_t v_st;
  int64_t dim;     // head_dim, or additive_hidden for kAdditive
  float q_scale;   // applied when packing queries (kDot folds scale in here)
  float finish;    // applied to finished scores (kGaussian: -scale,
                   // kDotScaled: scale, else 1)
  int kind;
  // The rows as stored, for conversion and prefetching: K (or the additive
  // projections) and V.
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
  o.v = f32 ? ValuesOf(p, b, kvh) : nullptr;
  o.v_st = f32 ? p.v_st : p.value_dim;
  if (p.score == QKV_SCORE_ADDITIVE) {
    const float* keys = reinterpret_cast<const float*>(shared);
    const int64_t hidden = p.additive_hidden;
    o.q = reinterpret_cast<const float*>(shared + ProjectedKeysBytes(p));
    o.q_st = hidden;
    o.q_sh = p.q_len * hidden;
    o.q_sb = p.q_heads * o.q_sh;
    o.k = keys + (b * p.kv_heads + kvh) * p.kv_len * hidden;
    o.k_st = hidden;
    o.ksrc.base = reinterpret_cast<const unsigned char*>(o.k);
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
    o.k = f32 ? KeysOf(p, b, kvh) : nullptr;
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

// ---------------------------------------------------------------- tasks

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
// (RunTileGroup), each tile doing exactly what it does alone (S2
// token-major: 1.25x the dense call ungrouped, 1.14-1.19x grouped; 8 or 16
// tiles gain a few percent more for 2x or 4x the workspace). Dense rows
// keep one tile per task: their blocks stay cached anyway, and a tile's
// output and queries stay in L1. Low-precision K and V are grouped too: the
// tiles of a group whose block starts at the same key share one
// dequantized copy of it, made once instead of once per tile (S2 with an
// f16 cache: 0.91-0.97x the time on the AVX-512 and AVX2 backends, 0.68-0.70x
// on SSE4, whose binary16 conversion is integer code).
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
// 512-byte pieces, which the hardware prefetchers do not follow (S1 decode
// token-major 1.7x the dense call on Zen 4). Row-path tasks over such a
// cache take up to kHeadGroupMax kv heads of a batch at once instead
// (RunRowsHeads) and step through each key block kInterleaveKeys keys at a
// time, every head of the group in turn: a few whole token rows, read in
// address order (a microbenchmark of that order read 26.6 GB/s on Zen 4, the
// dense per-head order with no software prefetch 14). Each head does the
// same operations on the same blocks as alone, so the bits are the dense
// call's. Low-precision caches take it with a single row per kv head (the
// fused readers; several rows dequantize a block per head). Where the
// hardware prefetchers alone fall short (joint rows, rows not on 64-byte
// lines) the walk goes kInterleaveKeysPrefetched keys at a time and
// prefetches the piece kPieceLead pieces ahead (RunRowsHeads). f32 rows on
// 16-lane x86 targets go kInterleaveKeysWide keys at a time (S1
// token-major on Zen 5: 0.92x the time of 8 keys on AVX-512, 64 keys
// 0.93-0.94x; AVX2 0.98x and SSE4 1.11-1.14x, which keep 8).
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
// following (S1 decoding on Zen 5, one worker, against split-major: f32
// 0.98x the time, f16 and bf16 0.92x, int8 0.88x, whose 512-key splits are
// 64 KiB of K: a fresh stream every 2 us). Elsewhere (a token-major cache,
// [token][kv_heads][dim]: a head's rows 16 KiB apart for 32 heads of d 128,
// each row on its own 4 KiB page) split-major: consecutive tasks take the
// same keys of consecutive kv heads, so the cache is walked a few hundred
// pages at a time, which the TLB holds for the next heads, instead of every
// page of the cache once per head (1.66x slower decoding, measured).
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

// ---------------------------------------------------------------- prefetch
// A tile reads K and V in interleaved, strided patterns (several key rows at
// once for scores, a column slice of every value row for the output) that
// hardware prefetchers follow well from L2 and L3 but poorly from DRAM:
// there the tiles stall on memory at a third of the bandwidth available.
// Calls whose K and V together reach kPrefetchKvBytes, too much to stay
// cached between calls or between the tiles of one, prefetch in software,
// just in time: the current block's V while scoring it, the next block's K
// while accumulating its output. Smaller calls skip it: from cache the
// extra instructions and the early L1 fills cost 5-8% (S2, S3).
constexpr int64_t kPrefetchKvBytes = int64_t{8} << 20;

inline bool PrefetchesKv(const Problem& p) {
  const int64_t e = KvElementBytes(p.kv_dtype);
  const int64_t bytes_per_key =
      (p.score == QKV_SCORE_ADDITIVE ? 4 : e) * ScoreDim(p) + e * p.value_dim;
  return p.batch * p.kv_heads * p.kv_len >=
         kPrefetchKvBytes / (bytes_per_key > 0 ? bytes_per_key : 1);
}

// Where a prefetch puts its line. Both paths prefetch into L2. The tile
// path prefetches a whole 64-key block (32 KiB at head_dim 128) while it
// works through another one of the same size in L1: into L1 the two evict
// each other (GQA-8 decode from DRAM, highway:AVX2 on Zen 4: 4.5 ms with
// L1, 3.2 ms with L2). The row path reads a block soon after prefetching
// it, but an L1 prefetch holds one of the core's few L1 miss buffers until
// its line arrives: into L2, S1 decoding took 0.96x the time (Emerald
// Rapids, highway:AVX3 and AVX2). On x86 that is prefetcht2
// (locality 1; prefetcht1 measured 3.4 ms on Zen 4; prefetcht0 and
// prefetchnta, with keys prefetched during the values, 1.08-1.73x the
// time of prefetcht2 on S1 decoding, Zen 4); GCC's locality 2 is
// AArch64's PLDL2KEEP. kL1 is kept for experiments.
enum class PrefetchTo { kL1, kL2 };
#if defined(__x86_64__) || defined(__i386__)
constexpr int kL2Locality = 1;
#else
constexpr int kL2Locality = 2;
#endif

// Prefetches `rows` rows of `row_bytes` bytes, `stride` bytes apart, a
// cache line at a time, spread over `steps` calls of Step(). Nothing to do
// (or on = false) makes Step() a no-op.
class PrefetchStream {
 public:
  PrefetchStream(bool on, const unsigned char* begin, int64_t rows,
                 int64_t row_bytes, int64_t stride, int64_t steps,
                 PrefetchTo to)
      : at_(reinterpret_cast<const char*>(begin)),
        line_(0),
        row_lines_(0),
        stride_bytes_(stride),
        left_(0),
        per_step_(0),
        l2_(to == PrefetchTo::kL2) {
    if (!on || rows <= 0 || row_bytes <= 0 || steps <= 0) return;
    if (stride == row_bytes) {  // contiguous: one long row
      row_bytes *= rows;
      rows = 1;
    }
    row_lines_ = (row_bytes + 63) / 64;
    left_ = row_lines_ * rows;
    per_step_ = (left_ + steps - 1) / steps;
  }

  // The state is copied into locals: stores through `this` in the loop
  // would otherwise cost more instructions than the prefetches (a call
  // may prefetch 16 lines per key).
  void Step() {
    int64_t n = left_ < per_step_ ? left_ : per_step_;
    left_ -= n;
    const char* at = at_;
    int64_t line = line_;
    while (n > 0) {
      const int64_t run = row_lines_ - line < n ? row_lines_ - line : n;
      const char* p = at + line * 64;
      if (l2_) {
        for (int64_t i = 0; i < run; ++i) {
          __builtin_prefetch(p + i * 64, 0, kL2Locality);
        }
      } else {
        for (int64_t i = 0; i < run; ++i) __builtin_prefetch(p + i * 64, 0, 3);
      }
      n -= run;
      line += run;
      if (line == row_lines_) {
        line = 0;
        at += stride_bytes_;
      }
    }
    at_ = at;
    line_ = line;
  }

 private:
  const char* at_;        // the current row
  int64_t line_;          // next line within it
  int64_t row_lines_;     // lines per row
  int64_t stride_bytes_;  // from row to row
  int64_t left_;          // lines still to prefetch
  int64_t per_step_;      // lines per Step()
  bool l2_;               // PrefetchTo::kL2
};

// The prefetches that go with key block [j0, j0 + nb) of keys that stop at
// `stop`: this block's V rows, spread over v_steps calls, and the next
// block's K rows, spread over k_steps calls (none past `stop`).
// Out of line (once per block): when GCC inlined it into the tile loop
// (after unrelated changes to the row path), RunTile<2> lost its
// specialized copies and S2 prefill took 1.01-1.03x the time on
// highway:AVX3.
struct BlockPrefetch {
  PrefetchStream v, k;
  __attribute__((noinline)) BlockPrefetch(bool on, const Operands& op,
                                          int64_t dv, int64_t j0, int64_t nb,
                                          int64_t stop, int64_t v_steps,
                                          int64_t k_steps, PrefetchTo to)
      : v(on, op.vsrc.base + j0 * op.vsrc.row_bytes, nb,
          dv * KvElementBytes(op.vsrc.dtype), op.vsrc.row_bytes, v_steps, to),
        k(on, op.ksrc.base + (j0 + nb) * op.ksrc.row_bytes,
          BlockKeys(j0 + nb, stop), op.dim * KvElementBytes(op.ksrc.dtype),
          op.ksrc.row_bytes, k_steps, to) {}
};

// ---------------------------------------------------------------- workspace

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

// ---------------------------------------------------------------- rows

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

#endif  // QKV_SRC_TILING_H_
