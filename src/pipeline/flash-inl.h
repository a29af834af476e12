// The FlashAttention pipeline of the SIMD engines, written once: Flash<O>
// for a vector-operations layer O (src/highway/ops_hwy-inl.h,
// src/xsimd/ops_xsimd-inl.h). Each engine compiles it once per SIMD target,
// inside that target's namespace (QKV_SIMD_NAMESPACE: Highway's
// HWY_NAMESPACE, or the xsimd architecture's), so nothing here is ever
// shared between objects built for different instruction sets.
//
// This file declares Flash<O>'s members; their definitions are in files of
// one concern each, included at the end inside this file's per-target
// namespace, in the order of the stages:
//   K/V source   kv_source-inl.h: the (batch, kv head)'s key and value rows
//                as blocks of f32 rows (dense f32 read in place, additive
//                scores read projections), every row at KvRowAt's address
//                (src/semantics.h). Operands: pipeline/operands.h; the
//                element types' traits: kv_types-inl.h (before the struct).
//   scores       tile_scores-inl.h: rows in lanes (tile path: R = RV * N
//                query rows of one kv head's GQA group, queries packed
//                transposed, keys broadcast); row_scores-inl.h: keys or
//                head_dim in lanes (row path: decoding, at most
//                kRowPathMaxRows rows, and GQA-8 decoding on AVX-512 and
//                AVX2; tiny path: kv_len <= N). The score kind's
//                accumulation and finishing factor live here (ScoreTerm,
//                the factor applied as scores leave their registers).
//   epilogue     epilogue-inl.h: per block, only when needed: bias, then the
//                rows' key intervals [lo, hi) (src/semantics.h) as a mask.
//                Blocks outside every row's interval are skipped at both
//                ends.
//   softmax      online: a running max m and sum l per row, one rescale of
//                the output per block (tile_output-inl.h, row_output-inl.h).
//   output       o = o * alpha + p V, transposed in the tile path.
//   finisher     finish-inl.h: out = o / l, lse = m + log(l), weights
//                normalized from the raw scores, for every path.
// The paths, one file each (path_*-inl.h), run those stages over a task's
// rows. plan-inl.h makes every choice (a call's plan, each task's path);
// entry-inl.h divides a call into tasks (pipeline/tasks.h), sizes their
// workspace (pipeline/workspace.h) and switches once on the plan's path
// (pipeline/paths.h). math-inl.h holds exp and tanh, blocks-inl.h the
// building blocks the unit tests call.
//
// exp is ExpNonPositive (max error 1.03 ulp on [-87, 0] with FMA, 0 below
// -87): its argument here is always <= 0 or -inf.
//
// The includer has included engine.h and the ops layer, and defined
// QKV_SIMD_NAMESPACE. Per-target include guard (Highway's convention):
// foreach_target includes this once per target.
#if defined(QKV_PIPELINE_FLASH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_PIPELINE_FLASH_INL_H_
#undef QKV_PIPELINE_FLASH_INL_H_
#else
#define QKV_PIPELINE_FLASH_INL_H_
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "engine.h"
#include "pipeline/paths.h"
#include "semantics.h"
// The pipeline's scalar parts, in the order they build on each other.
#include "pipeline/operands.h"
#include "pipeline/tasks.h"
#include "pipeline/prefetch.h"
#include "pipeline/workspace.h"
#include "pipeline/rows.h"

#ifndef QKV_SIMD_NAMESPACE
#error "define QKV_SIMD_NAMESPACE (the per-target namespace) first"
#endif

#ifdef HWY_BEFORE_NAMESPACE
HWY_BEFORE_NAMESPACE();
#endif
namespace qkv {
namespace QKV_SIMD_NAMESPACE {

// Accumulators are named variables, not arrays (SVE vectors are sizeless
// and cannot be array elements); lanes u >= U of an unroll are compiled
// away.
#undef QKV_UNROLL8
#define QKV_UNROLL8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

// The per-block steps are inlined into the tile loop whatever the
// compiler's estimate: they pass vectors (running max, sum, rescale) by
// pointer, which must stay in registers.
#undef QKV_FLASH_INLINE
#define QKV_FLASH_INLINE inline __attribute__((always_inline))
// GCC's register allocation of a loop as one region: by regions it spilled
// vectors of RowScores8's loop, which then reloaded them as memory operands
// (as it reloads a vector used twice, which O::InRegister stops).
#undef QKV_ONE_REGION
#if defined(__GNUC__) && !defined(__clang__)
#define QKV_ONE_REGION __attribute__((optimize("ira-region=one")))
#else
#define QKV_ONE_REGION
#endif

#undef QKV_ROWS4
#define QKV_ROWS4(X, u) X(0, u) X(1, u) X(2, u) X(3, u)
#undef QKV_ROWS4_KEYS8
#define QKV_ROWS4_KEYS8(X)                                           \
  QKV_ROWS4(X, 0) QKV_ROWS4(X, 1) QKV_ROWS4(X, 2) QKV_ROWS4(X, 3) \
  QKV_ROWS4(X, 4) QKV_ROWS4(X, 5) QKV_ROWS4(X, 6) QKV_ROWS4(X, 7)

// The K/V element types' traits (a fragment of this namespace).
#include "pipeline/kv_types-inl.h"

template <class O>
struct Flash {
  using Ops = O;
  using V = typename O::V;

  // Keys (scores) or value columns (output) per step of a register tile
  // of RV row vectors: RV * U accumulators. Two FMA ports with 4 cycles of
  // latency need at least 8 chains in flight, and exactly 8 leave no slack
  // for the loads between them. Targets with 32 vector registers
  // (O::kUnroll 8: AVX-512, NEON, SVE) take 8 keys (16 accumulators at RV
  // 2); the 16-register ones take 8 at RV 1 and 6 at RV 2 (12 accumulators,
  // 2 rows of q and a broadcast: 15 registers). The guarded output also
  // holds RV masks, so it takes 4 at RV 2 there.
  template <int RV>
  static constexpr int TileUnroll() {
    return O::kUnroll >= 8 || RV == 1 ? 8 : 6;
  }

  template <int RV, bool kGuard>
  static constexpr int OutputUnroll() {
    return kGuard && O::kUnroll < 8 && RV > 1 ? 4 : TileUnroll<RV>();
  }

  // What a block's epilogue has to do beyond the masks.
  struct EpilogueTerms {
    float softcap;  // 0: off
    bool bias;      // some row has a bias row
    bool alibi;     // ALiBi slopes are set
  };

  // What a path leaves for the finisher of one row.
  struct RowState {
    int64_t row;         // flat row index into weights and lse
    float* out;          // the row's output
    float m, l;          // running max and sum (l = 0: no visible key)
    float sink;          // the head's sink, or -inf
    const float* o;      // unnormalized output: column c at o[c * stride],
    size_t o_stride;     //   columns [c_begin, dv) still to write; NULL:
    int64_t c_begin;     //   the path wrote out itself if the row saw a key
    int64_t w_lo, w_hi;  // weights[w_lo, w_hi) hold raw scores
  };

  // A call's plan (PlanCall, plan-inl.h): the path of its tasks (kPathTile2:
  // tiles, each task's width its own, TaskPath), the rows of a tile task
  // (a tile or a group of them) and the key splits of a pipelined task.
  struct CallPlan {
    PathBit path;
    size_t task_rows;
    int64_t splits_per_task;
  };

  // How RunRows walks a task's rows: PlanRows (plan-inl.h) says.
  struct RowsPlan {
    bool prefetch, fused_k, fused_v, joint, keys_late, hardware_keys;
    bool keys_past_split;
  };

  // Row readers: the keys and values of the row path as rows of an element
  // type (pipeline/kv_types-inl.h). F32Rows for the f32 rows in place or
  // dequantized by the block source; a single decoding row (the
  // memory-bound case) reads F16, BF16 and I8 rows converting in registers
  // instead of dequantizing each block into the workspace and reading it
  // back (the fused path). I8 rows are read unscaled; the row's scale
  // multiplies its finished score (keys) or its probability (values).
  using F32Rows = KvType<O, QKV_DTYPE_F32>;
  using F16Rows = KvType<O, QKV_DTYPE_F16>;
  using BF16Rows = KvType<O, QKV_DTYPE_BF16>;
  using I8Rows = KvType<O, QKV_DTYPE_I8>;

  // Keys per score step of R rows on the row path (R x U accumulators):
  // 4, or 2 for 3 and 4 rows on 16-register targets (bench/README.md).
  template <int R>
  static constexpr int RowUnroll() {
    return O::kUnroll >= 8 || R <= 2 ? 4 : 2;
  }

  // Where RowScores streams its keys from memory, whether it reads a
  // step's keys one after the other (plan-inl.h).
  template <class E>
  static constexpr bool KeyMajorScores();

  // Value vectors per output step of R rows (R x U accumulators, R
  // broadcasts and a value vector in registers).
  template <int R>
  static constexpr int RowOutputUnroll() {
    return O::kUnroll >= 8 ? (R <= 2 ? 8 : 4) : (R <= 2 ? 4 : 2);
  }

  // RowOutputWidth; with pk (the next block's keys streaming in, a step a
  // key) and more columns than one pass of accumulators holds, kValueKeys
  // keys at a time through every column, so that a value row is used up
  // before the prefetches can evict it from L1 (each later group rescales
  // by 1: exact, the same bits).
  static constexpr int64_t kValueKeys = 8;

  // Key blocks per phase of RunRowPhases: up to kRowStateRows (the score
  // rows of the tile's row state hold a block each), as many as keep a
  // phase's values within kPhaseValueBytes (they wait in L2 for the output).
  static constexpr int64_t kPhaseValueBytes = int64_t{256} << 10;

  // One decoding row of an int8 cache from DRAM, pipelined: the scores of
  // each key block are interleaved, kPipeKeys keys at a time, with the
  // output of the block before, so that its K and V rows stream in side by
  // side; the scores' prefetches bring this block's values and the next
  // block's keys into L2. The same operations in RunRows' order: the same
  // bits. Where keys are prefetched late (AMD), 8 and 16 lanes, int8 only:
  // S1 int8 from DRAM on Zen 5 (bench/README.md, "int8 decoding
  // pipelined").
  static constexpr int64_t kPipeKeys = 16;

  // The software prefetches run for a task's first kPipeWarmKeys keys
  // only: by then the hardware prefetchers follow the K and V streams of a
  // task of several splits (SplitsPerTask): S1 int8 from DRAM on Zen 5
  // (bench/README.md, "Software prefetches in a task's first split only").
  static constexpr int64_t kPipeWarmKeys = kSplitKeys;

  // Scratch for a vector of any target (SVE up to 2048 bits).
  static constexpr size_t kMaxLanes = 64;
  // The tiny path (kv_len <= lanes) and interleaved heads (kv_len >
  // kBlockKeys) exclude each other: PlanCall may test either first.
  static_assert(kMaxLanes <= static_cast<size_t>(kBlockKeys),
                "the tiny path and interleaved heads would overlap");

  // math-inl.h: vector math: softmax's exp (ExpNonPositive) and the softcap's
  // tanh.
  static QKV_FLASH_INLINE V ExpNonPositive(V x);
  static QKV_FLASH_INLINE V ExpReduced(V xc, V* r_out, V* t_out);
  static float InvCap(float cap);
  static QKV_FLASH_INLINE V SoftcapTanh(V x);
  static QKV_FLASH_INLINE V Softcapped(V s, V cap, V inv_cap);
  static QKV_FLASH_INLINE V Abs(V x);

  // kv_source-inl.h: the K/V block source: key and value rows of any element
  // type as blocks of f32 rows.
  template <class E>
  static void DequantizeRowsOf(const KvSource& s, int64_t j0, int64_t nb,
                               int64_t n, float* __restrict dst);
  static void DequantizeRows(const KvSource& s, int64_t j0, int64_t nb,
                             int64_t n, float* __restrict dst);
  static const float* KeysInPlace(const Operands& op, int64_t j);
  static const float* ValuesInPlace(const Operands& op, int64_t j);
  static const float* KeyBlock(const Operands& op, int64_t j0, int64_t nb,
                               float* kblk);
  static const float* ValueBlock(const Operands& op, int64_t dv, int64_t j0,
                                 int64_t nb, float* vblk);

  // tile_scores-inl.h: tile kernels, scores: a tile's query rows in lanes
  // against keys broadcast one at a time, for every score kind.
  template <int kKind>
  static QKV_FLASH_INLINE V ScoreTerm(V q, V k, V w, V acc);
  template <int kKind>
  static float ScoreTermScalar(float q, float k, float w);
  template <int RV, int U, int kKind>
  __attribute__((noinline)) static void ScoreKeys(const float* __restrict qt,
                                                  const float* __restrict k,
                                                  int64_t d, int64_t ks,
                                                  float finish_scale,
                                                  const float* __restrict w_v,
                                                  float* __restrict st);
  template <int RV, int kKind>
  static QKV_FLASH_INLINE void ScoresOf(const float* __restrict qt, size_t R,
                                        const float* __restrict k, int64_t d,
                                        int64_t ks, int64_t nb, float finish,
                                        const float* __restrict w_v,
                                        float* __restrict st,
                                        PrefetchStream* pf);
  template <int RV>
  static QKV_FLASH_INLINE void Scores(const Operands& op, const float* w_v,
                                      const float* __restrict qt, size_t R,
                                      const float* __restrict k, int64_t nb,
                                      float* __restrict st, PrefetchStream* pf);

  // tile_output-inl.h: tile kernels, softmax and output: the online softmax of
  // a tile's block and o = o * alpha + p V with rows in lanes.
  template <int RV, int U, bool kGuard>
  __attribute__((noinline)) static void OutputColumns(
      const float* __restrict pt, const float* __restrict v, int64_t vs,
      int64_t nb, V alpha0, V alpha1, float* __restrict ot);
  template <int RV, bool kGuard>
  static QKV_FLASH_INLINE void AccumulateOutput(
      const float* __restrict pt, size_t R, const float* __restrict v,
      int64_t dv, int64_t vs, int64_t nb, V alpha0, V alpha1,
      float* __restrict ot, PrefetchStream* pf);
  template <int RV, bool kGuard>
  static QKV_FLASH_INLINE void AccumulateColumns(
      const float* __restrict pt, size_t R, const float* __restrict v,
      int64_t dv, int64_t vs, int64_t nb, V alpha0, V alpha1,
      float* __restrict ot, PrefetchStream* pf);
  template <int RV>
  static QKV_FLASH_INLINE void SoftmaxBlock(float* __restrict st, size_t R,
                                            int64_t nb, V* m0, V* l0, V* alpha0,
                                            V* m1, V* l1, V* alpha1);
  template <int RV>
  static QKV_FLASH_INLINE void PackQueries(const Operands& op, int64_t rows,
                                           size_t R, const Tile& tile);

  // epilogue-inl.h: the block epilogue: bias, softcap, ALiBi and the rows' key
  // intervals on a block of scores.
  template <int RV>
  static QKV_FLASH_INLINE void Epilogue(const Tile& tile, int64_t rows,
                                        size_t R, int64_t j0, int64_t nb,
                                        const EpilogueTerms& terms, bool masks,
                                        float* st);
  static void RowEpilogue(const Problem& p, const Tile& tile, int64_t r,
                          int64_t j0, int64_t nb, float* st);
  static EpilogueTerms TermsOf(const Problem& p);

  // finish-inl.h: the row finisher: out = o / l, lse = m + log(l) and the
  // weights normalized from their raw scores, for every path.
  static void NormalizeWeights(float* __restrict w, int64_t n, float m,
                               float inv_l, float* __restrict tail);
  static RowState RowStateOf(const Tile& tile, int64_t r);
  static void FinishRow(const Problem& p, const RowState& s, float* tail);
  template <int RV>
  static void FinishTile(const Problem& p, const Tile& tile, int64_t rows,
                         size_t R, const RowsSpan& span);

  // row_scores-inl.h: row kernels, scores: query rows against rows of keys
  // (head_dim in lanes) read as f32, f16, bf16 or int8.
  template <int kKind, class E = F32Rows>
  static float RowTail(const float* q, const typename E::T* kr,
                       const float* w_v, int64_t t0, int64_t d);
  template <int kKind, class E>
  static inline float Finished(V acc, const float* q, const typename E::T* kr,
                               const float* w_v, int64_t d_full, int64_t d,
                               float finish);
  template <int R, int U, int kKind, class E>
  static QKV_FLASH_INLINE void RowKeysStep(
      const float* __restrict q, const typename E::T* __restrict k, int64_t d,
      int64_t d_full, int64_t ks, float finish, const float* w_v,
      float* __restrict st, int64_t s_stride);
  template <int R, int kKind, class E>
  __attribute__((noinline)) static void RowScoresRows(
      const float* __restrict q, const typename E::T* __restrict k, int64_t d,
      int64_t ks, int64_t nb, float finish, const float* __restrict w_v,
      float* __restrict st, int64_t s_stride, BlockPrefetch* pf);
  __attribute__((noinline)) QKV_ONE_REGION static void RowScores8(
      const float* __restrict q, const float* __restrict k, int64_t d,
      int64_t ks, int64_t nb, float finish, float* __restrict st,
      int64_t s_stride, BlockPrefetch* pf);
  template <int kKind, class E>
  static QKV_FLASH_INLINE V KeyScoreTerms(const float* __restrict q,
                                          const typename E::T* __restrict k,
                                          const float* __restrict w_v,
                                          int64_t d_full);
  template <int kKind, class E = F32Rows>
  __attribute__((noinline)) static void RowScores(
      const float* __restrict q, const typename E::T* __restrict k, int64_t d,
      int64_t ks, int64_t nb, float finish, const float* __restrict w_v,
      float* __restrict st, BlockPrefetch* pf = nullptr);
  template <class E>
  static void RowDotScoresOf(const float* q, const KvSource& src, int64_t j0,
                             int64_t d, int64_t nb, float finish, float* st,
                             BlockPrefetch* pf);
  static void RowDotScoresLowPrecision(const float* q, const KvSource& src,
                                       int64_t j0, int64_t d, int64_t nb,
                                       float finish, float* st,
                                       BlockPrefetch* pf);

  // row_output-inl.h: row kernels, softmax and output: a row's online softmax
  // and o = o * alpha + p V over rows of values.
  static float RowSoftmaxBlock(float* __restrict st, int64_t nb, float* m,
                               float* l);
  static bool AnyZero(const float* __restrict p, int64_t s_stride, int64_t rows,
                      int64_t nb);
  template <int R, int U, bool kGuard, bool kStep>
  __attribute__((noinline)) static void RowOutputRowsColumns(
      const float* __restrict pr, int64_t s_stride, const float* __restrict v,
      int64_t vs, int64_t nb, const float* __restrict alpha,
      float* __restrict o, int64_t o_stride, PrefetchStream* pk);
  template <int R>
  static void RowOutputRows(const float* __restrict pr, int64_t s_stride,
                            const float* __restrict v, int64_t dv, int64_t vs,
                            int64_t nb, const float* __restrict alpha,
                            float* __restrict o, PrefetchStream* pk = nullptr);
  template <class E>
  static void RowOutputWidth(const float* __restrict pr,
                             const typename E::T* __restrict v, int64_t dv,
                             int64_t vs, int64_t nb, float alpha,
                             float* __restrict o, PrefetchStream* pk);
  template <class E>
  static void RowOutputOf(const float* __restrict pr,
                          const typename E::T* __restrict v, int64_t dv,
                          int64_t vs, int64_t nb, float alpha,
                          float* __restrict o, PrefetchStream* pk);
  static void RowOutput(const float* __restrict pr, const float* __restrict v,
                        int64_t dv, int64_t vs, int64_t nb, float alpha,
                        float* __restrict o, PrefetchStream* pk = nullptr);
  template <class E, int U, bool kStep = false>
  __attribute__((noinline)) static void RowOutputColumnsOf(
      const float* __restrict pr, const typename E::T* __restrict v, int64_t vs,
      int64_t nb, float alpha, float* __restrict o,
      PrefetchStream* pk = nullptr);
  template <class E>
  static void RowOutputFrom(float* __restrict pr, const KvSource& src,
                            int64_t j0, int64_t dv, int64_t nb, float alpha,
                            float* __restrict o, PrefetchStream* pk);
  static void RowOutputLowPrecision(float* pr, const KvSource& src, int64_t j0,
                                    int64_t dv, int64_t nb, float alpha,
                                    float* o, PrefetchStream* pk);

  // plan-inl.h: every choice: the call's plan, each task's path, the row
  // and interleaved-heads paths' plans.
  static QKV_FLASH_INLINE CallPlan PlanCall(const Problem& p);
  static PathBit RowSchedule(const Problem& p);
  static PathBit TaskPath(const CallPlan& c, const Problem& p,
                          const Operands& op, const TileTask& t);
  static bool DecodesRows8(const Problem& p);
  static bool RowInPhases(const Problem& p);
  static bool PipelinesInt8(const Problem& p);
  static bool RowPipelined(const Problem& p);
  static bool DecodesPipelined(const Problem& p);
  static int64_t SplitsPerTask(const Problem& p);
  static bool ScoresRows8(const Operands& op);
  static bool JointRows(const Operands& op, const Tile& tile, int64_t rows);
  static QKV_FLASH_INLINE RowsPlan PlanRows(const Problem& p,
                                            const Operands& op,
                                            const Tile& tile, int64_t rows);
  static QKV_FLASH_INLINE int64_t HeadsStep(const Operands* ops, int64_t heads,
                                            bool fused, bool joint, bool* lead);

  // path_tile-inl.h: the tile path: a tile of query rows of one kv head's GQA
  // group over its keys, groups of tiles sharing K/V blocks, and tiles at 8
  // lanes on wider targets.
  template <int RV>
  static QKV_FLASH_INLINE void TileBlock(const Problem& p, const Operands& op,
                                         const Tile& tile, int64_t rows,
                                         size_t R, const RowsSpan& span,
                                         const EpilogueTerms& terms, int64_t j0,
                                         bool prefetch, V* m0, V* l0, V* m1,
                                         V* l1, const float* kb = nullptr,
                                         const float* vb = nullptr);
  template <int RV>
  static void RunTile(const Problem& p, const Operands& op,
                      const TileTask& task, const unsigned char* shared,
                      const Tile& tile);
  template <int RV>
  static QKV_FLASH_INLINE void StoreRunning(const Tile& tile, V m0, V l0, V m1,
                                            V l1);
  template <int RV>
  static void GroupTileBlock(const Problem& p, const Operands& op,
                             const Tile& tile, int64_t rows, size_t R,
                             const RowsSpan& span, const EpilogueTerms& terms,
                             int64_t j0, bool prefetch, const float* kb,
                             const float* vb);
  static void RunTileGroup(const Problem& p, const Operands& op,
                           const TileTask& task, unsigned char* workspace);
  static void RunNarrowTile(const Problem& p, const Operands& op,
                            const TileTask& t, const unsigned char* shared,
                            unsigned char* workspace);

  // path_rows-inl.h: the row path: decoding rows (few queries per kv head), one
  // at a time or scored jointly, with fused readers of f16, bf16 and int8 rows.
  static void RowScoresFor(const Problem& p, const Operands& op, const float* q,
                           const float* k, int64_t nb, float* st,
                           BlockPrefetch* pf);
  static QKV_FLASH_INLINE float RowProbabilities(const Problem& p,
                                                 const Tile& tile, int64_t r,
                                                 int64_t lo, int64_t nb,
                                                 float* st);
  static void FinishRows(const Problem& p, const TileTask& task,
                         const unsigned char* shared, const Tile& tile);
  static void JointScoresOnly(const Operands& op, const Tile& tile,
                              int64_t rows, const float* k, int64_t nb,
                              float* st, int64_t s_stride, BlockPrefetch* pf);
  static void JointScores(const Problem& p, const Operands& op,
                          const Tile& tile, int64_t rows, const float* k,
                          int64_t lo, int64_t nb, int64_t s_stride,
                          BlockPrefetch* pf, float* alpha);
  static void JointOutput(const Problem& p, const Operands& op,
                          const Tile& tile, int64_t rows, const float* pr,
                          const float* v, int64_t nb, int64_t s_stride,
                          const float* alpha, PrefetchStream* pk = nullptr);
  static int64_t JointKeySteps(int64_t rows, int64_t nb, int64_t dv);
  static QKV_FLASH_INLINE void RowKeysOfBlock(const Tile& tile, int64_t r,
                                              int64_t j0, int64_t j1,
                                              int64_t end, int64_t* lo,
                                              int64_t* hi);
  static void RunRows(const Problem& p, const Operands& op,
                      const TileTask& task, const unsigned char* shared,
                      const Tile& tile);

  // path_phases-inl.h: the row path in phases: the scores of several key
  // blocks, then their outputs, the values waiting in L2.
  static int64_t PhaseBlocks(int64_t dv);
  __attribute__((noinline)) static void RunRowPhases(
      const Problem& p, const Operands& op, const TileTask& task,
      const unsigned char* shared, const Tile& tile);

  // path_pipelined-inl.h: the pipelined int8 row path: a decoding row's scores
  // of a block interleaved with the output of the block before.
  __attribute__((noinline)) static void RunRowPipelined(
      const Problem& p, const Operands& op, const TileTask& task,
      const unsigned char* shared, const Tile& tile);

  // path_heads-inl.h: the interleaved-heads path: decoding rows of several kv
  // heads in one task.
  static QKV_FLASH_INLINE void PrefetchPiece(const Operands& op, bool values,
                                             int64_t n, int64_t sa, int64_t ea);
  static QKV_FLASH_INLINE void HeadsProbabilities(
      const Problem& p, const Tile* tiles, int64_t heads, int64_t rows,
      int64_t j0, int64_t j1, int64_t key_end, float* alphas);
  static void RunRowsHeads(const Problem& p, const TileTask& task,
                           const unsigned char* shared,
                           unsigned char* workspace);

  // path_tiny-inl.h: the tiny path: at most one vector of keys, keys in lanes.
  static void TransposeRows(const float* base, int64_t stride, int32_t count,
                            float* dst);
  static QKV_FLASH_INLINE void TinyTranspose(const Problem& p,
                                             const Operands& op,
                                             const TinyTile& tile);
  static QKV_FLASH_INLINE V TinyScores(const Problem& p, const Operands& op,
                                       const TinyTile& tile, const float* q);
  static void RunRowsTiny(const Problem& p, const Operands& op,
                          const TileTask& task, unsigned char* workspace);
  static void RunTiny(const Problem& p, const Operands& op,
                      const TileTask& task, unsigned char* workspace);

  // entry-inl.h: the engine entry: how a call divides into tasks, each worker's
  // workspace, and the one switch on the path a task takes (TaskPath, RunTask).
  static bool Supports(const Problem&);
  static void Prepare(const Problem& p, unsigned char* shared);
  static size_t TileRows();
  static size_t NumTasks(const Problem& p);
  static size_t WorkspacePerWorker(const Problem& p);
  static TileTask TaskAt(const Problem& p, const CallPlan& c, size_t task);
  static void RunTask(const Problem& p, size_t task,
                      const unsigned char* shared, unsigned char* workspace);

  // blocks-inl.h: building blocks for tests: exp, tanh, transposes, lane sums,
  // the epilogue and the finisher on one block (PipelineBlocks, src/engine.h).
  static void BlockExp(const float* x, float* y, size_t n);
  static void BlockTanh(const float* x, float* y, size_t n);
  static void BlockTranspose(float* m);
  static void BlockSumLanes(const float* m, float* sums);
  static void BlockSumLanes4(const float* m, float* sums, float* reduced);
  static void BlockEpilogue(const int32_t* lo, const int32_t* hi,
                            const float* const* bias, int64_t rows, int rv,
                            int64_t kv_len, int64_t j0, int64_t nb, float* st);
  static void BlockFinishRow(const Problem& p, int64_t row, float m, float l,
                             const float* o, size_t stride, int64_t c_begin,
                             int64_t w_lo, int64_t w_hi);
  static size_t LanesOf();

  static constexpr PipelineBlocks kBlocks = {
      &LanesOf,       O::kTransposeLanes, &BlockExp,      &BlockTranspose,
      &BlockEpilogue, &BlockFinishRow,    &BlockTanh,     &BlockSumLanes,
      &BlockSumLanes4};

  static constexpr Engine MakeEngine(const char* name) {
    return Engine{name,           &Supports,           &NumTasks,
                  &SharedWorkspace, &WorkspacePerWorker, &Prepare,
                  &RunTask};
  }
};

// The definitions, one concern a file: fragments of this namespace, not
// headers of their own.
#include "pipeline/plan-inl.h"
#include "pipeline/math-inl.h"
#include "pipeline/kv_source-inl.h"
#include "pipeline/tile_scores-inl.h"
#include "pipeline/tile_output-inl.h"
#include "pipeline/epilogue-inl.h"
#include "pipeline/finish-inl.h"
#include "pipeline/row_scores-inl.h"
#include "pipeline/row_output-inl.h"
#include "pipeline/path_tile-inl.h"
#include "pipeline/path_rows-inl.h"
#include "pipeline/path_phases-inl.h"
#include "pipeline/path_pipelined-inl.h"
#include "pipeline/path_heads-inl.h"
#include "pipeline/path_tiny-inl.h"
#include "pipeline/entry-inl.h"
#include "pipeline/blocks-inl.h"

}  // namespace QKV_SIMD_NAMESPACE
}  // namespace qkv
#ifdef HWY_AFTER_NAMESPACE
HWY_AFTER_NAMESPACE();
#endif

#undef QKV_UNROLL8
#undef QKV_FLASH_INLINE
#undef QKV_ONE_REGION

#endif  // per-target include guard
