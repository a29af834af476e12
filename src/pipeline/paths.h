// The forward pipeline's paths (src/pipeline/flash-inl.h, Flash::RunTask),
// as bits of a trace that tests read to assert which path a case took
// (tests/bits_test.cc), and a test hook that forces a path. Tracing is off
// unless a test turns it on; off, a task pays a relaxed load of a flag no
// one writes, and another of the forced path.
#ifndef QKV_SRC_PIPELINE_PATHS_H_
#define QKV_SRC_PIPELINE_PATHS_H_

#include <stdint.h>

#include <atomic>

namespace qkv {

enum PathBit : uint32_t {
  kPathTiny = 1u << 0,          // RunTiny: toy widths, keys in lanes
  kPathRowsHeads = 1u << 1,     // RunRowsHeads: heads interleaved
  kPathRowPhases = 1u << 2,     // RunRowPhases: 1-2 rows, blocks in phases
  kPathRowPipelined = 1u << 3,  // RunRowPipelined: int8 decoding
  kPathRows = 1u << 4,          // RunRows, one row at a time
  kPathRowsJoint = 1u << 5,     // RunRows, rows that see the same keys
  kPathRows8 = 1u << 6,         // RunRows from a tile: GQA-8 decoding
  kPathTileGroup = 1u << 7,     // RunTileGroup: tiles sharing K/V blocks
  kPathTileNarrow = 1u << 8,    // RunTile<1> at 8 lanes of a 16-lane target
  kPathTile1 = 1u << 9,         // RunTile<1>: one row vector
  kPathTile2 = 1u << 10,        // RunTile<2>: two row vectors
};

// The architecture, for the plan's rules measured on x86 only
// (src/pipeline/plan-inl.h); no other code reads it to choose.
#if defined(__x86_64__) || defined(__i386__)
constexpr bool kX86 = true;
#else
constexpr bool kX86 = false;
#endif

extern std::atomic<bool> g_trace_paths;
extern std::atomic<uint32_t> g_paths_traced;

// Internal linkage: each SIMD object keeps its own copy (no function may be
// emitted by two objects of other instruction sets).
static inline void TracePath(uint32_t bit) {
  if (g_trace_paths.load(std::memory_order_relaxed)) {
    g_paths_traced.fetch_or(bit, std::memory_order_relaxed);
  }
}

// A path the calls must take where a task can take it, for tests: one of
// the row path's schedules (kPathRows, kPathRowPhases, kPathRowPipelined;
// the last two exist on x86 only) or of the tile path's (kPathTile2,
// kPathTile1, kPathTileNarrow, kPathTileGroup), each family computing the
// same bits, so that a test can run each on any CPU and compare; 0 (the
// default) leaves the choice to the plan. Flash::PlanCall, RowSchedule and
// TaskPath (plan-inl.h) say which calls and tasks can take each.
extern std::atomic<uint32_t> g_forced_path;
static inline uint32_t ForcedPath() {
  return g_forced_path.load(std::memory_order_relaxed);
}
void ForcePath(uint32_t bit);

// Turns tracing on (or off) and clears the trace.
void TracePaths(bool on);
// The paths run since the last TracePaths or PathsTraced, and clears them.
uint32_t PathsTraced();

}  // namespace qkv

#endif  // QKV_SRC_PIPELINE_PATHS_H_
