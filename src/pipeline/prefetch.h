// Software prefetch of K and V: when a call prefetches, and the block prefetch
// streams the paths issue. Not SIMD: both SIMD engines instantiate the one
// pipeline (src/pipeline/flash-inl.h) over it, so they split work, mask and lay
// out memory identically.
#ifndef QKV_SRC_PIPELINE_PREFETCH_H_
#define QKV_SRC_PIPELINE_PREFETCH_H_

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "pipeline/operands.h"

namespace qkv {
// Internal linkage for everything here: this header is compiled into the
// per-target SIMD objects (src/semantics.h says why that matters).
namespace {  // NOLINT(build/namespaces)

// A tile reads K and V in interleaved, strided patterns (several key rows at
// once for scores, a column slice of every value row for the output) that
// hardware prefetchers follow well from L2 and L3 but poorly from DRAM:
// there the tiles stall on memory far below the bandwidth available.
// Calls whose K and V together reach kPrefetchKvBytes, too much to stay
// cached between calls or between the tiles of one, prefetch in software,
// just in time: the current block's V while scoring it, the next block's K
// while accumulating its output. Smaller calls skip it: from cache the
// extra instructions and the early L1 fills made S2 and S3 slower
// (bench/README.md, "The pipeline written once").
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
// each other (GQA-8 decoding from DRAM on Zen 4, highway:AVX2, measured
// faster into L2: bench/README.md, "Tiles for 16 registers, L2 prefetch,
// 8-lane tiles"). The row path reads a block soon after prefetching it,
// but an L1 prefetch holds one of the core's few L1 miss buffers until its
// line arrives: into L2, S1 decoding measured faster on Emerald Rapids,
// highway:AVX3 and AVX2 ("Row path prefetching into L2"). On x86 that is
// prefetcht2 (locality 1; prefetcht1, and prefetcht0 and prefetchnta with
// keys prefetched during the values, measured slower on Zen 4: "Keys
// prefetched during the values on AMD" and "The plan's rules and the
// figures behind them"); GCC's locality 2 is AArch64's PLDL2KEEP. kL1 is
// kept for experiments.
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
// specialized copies and S2 prefill measured slower on highway:AVX3
// (bench/README.md, "The row path's lane sums 4 at a time").
struct BlockPrefetch {
  PrefetchStream v, k;
  __attribute__((noinline)) BlockPrefetch(bool on, const Operands& op,
                                          int64_t dv, int64_t j0, int64_t nb,
                                          int64_t stop, int64_t v_steps,
                                          int64_t k_steps, PrefetchTo to)
      : v(on, KvRowAt(op.vsrc, j0), nb,
          dv * KvElementBytes(op.vsrc.dtype), op.vsrc.row_bytes, v_steps, to),
        k(on, KvRowAt(op.ksrc, j0 + nb),
          BlockKeys(j0 + nb, stop), op.dim * KvElementBytes(op.ksrc.dtype),
          op.ksrc.row_bytes, k_steps, to) {}
};

}  // namespace
}  // namespace qkv

#endif  // QKV_SRC_PIPELINE_PREFETCH_H_
