// Internal contract between the C ABI boundary (capi/) and the kernels
// (src/<engine>/). The boundary validates and normalizes; kernels trust the
// Problem they are given and never validate.
#ifndef QKV_SRC_ENGINE_H_
#define QKV_SRC_ENGINE_H_

#include <stddef.h>
#include <stdint.h>

#include "qkv/qkv.h"

namespace qkv {

// A validated attention call. Sizes are positive (calls with an empty
// shape never reach an engine) and every element count and every offset
// the strides reach fits in int64 and size_t; q_len and kv_len fit in
// int32.
struct Problem {
  int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim, value_dim;
  int64_t group;  // q_heads / kv_heads
  qkv_score score;
  float scale;
  bool causal;
  const int32_t* valid_lens;  // NULL unless QKV_MASK_VALID_LENS
  bool valid_lens_per_query;
  const float* bias;  // NULL unless QKV_MASK_BIAS
  int64_t bias_batch_stride, bias_head_stride;
  int64_t additive_hidden;
  const float *w_q, *w_k, *w_v;
  const float* q;
  // Keys and values: arrays of kv_dtype elements (F32: floats). Engines
  // read them through semantics.h (KeysOf/ValuesOf for F32,
  // KeySource/ValueSource and DequantizeRow for every type).
  const void *k, *v;
  qkv_dtype kv_dtype;
  // QKV_DTYPE_I8: element x = scale * q, one scale per (b, kv head, key)
  // row, row j of (b, h) at k_scales + b * ksc_sb + h * ksc_sh + j * ksc_st
  // (v_scales alike). NULL for the other types.
  const float *k_scales, *v_scales;
  int64_t ksc_sb, ksc_sh, ksc_st, vsc_sb, vsc_sh, vsc_st;
  float *out, *weights, *lse;  // weights and lse may be NULL
  // Layouts, in elements: element (b, h, t, c) of q is at
  // q + b * q_sb + h * q_sh + t * q_st + c, and so on. The boundary fills
  // them for dense calls too.
  int64_t q_sb, q_sh, q_st, k_sb, k_sh, k_st, v_sb, v_sh, v_st;
  int64_t out_sb, out_sh, out_st;
  // Positions: query i of batch b is at q_pos[b] + i, or at
  // kv_len - q_len + i when q_pos is NULL.
  const int32_t* q_pos;
  bool window;                        // QKV_MASK_WINDOW
  int64_t window_left, window_right;  // < 0: unbounded
  const int32_t* kv_start;            // NULL unless QKV_MASK_KV_START
  const float* alibi_slopes;          // NULL: no ALiBi
  float softcap;                      // 0: off
  const float* sinks;                 // NULL: no sinks
  // Workers the call runs on (1 without a pool; 0 reads as 1): engines may
  // group work into fewer, larger tasks for few workers, never changing a
  // result's bits (a task's arithmetic does not depend on which tasks it
  // shares). No default member initializer: Problem stays trivial.
  int64_t workers;
};

// Workspace slices handed to run_task start 64-byte aligned.
constexpr size_t kWorkspaceAlign = 64;

// Internal linkage: this header is compiled into objects built for
// different instruction sets (src/semantics.h says why that matters).
namespace {  // NOLINT(build/namespaces)
constexpr size_t AlignUp(size_t n) {
  return (n + kWorkspaceAlign - 1) & ~(kWorkspaceAlign - 1);
}
}  // namespace

// The building blocks of the SIMD pipeline (src/pipeline/flash-inl.h) on
// plain arrays, for the unit tests (tests/blocks_test.cc) to run at vector
// and tile edges on every target (BlocksOf).
struct PipelineBlocks {
  size_t (*lanes)();       // N: floats per vector
  size_t transpose_lanes;  // side of the in-register transpose, 0: none
  // y[i] = exp(x[i]) for i < n, x <= 0 or -inf (the pipeline's exp).
  void (*exp)(const float* x, float* y, size_t n);
  // m: a transpose_lanes-square row-major block, transposed in place.
  void (*transpose)(float* m);
  // The tile path's block epilogue for keys [j0, j0 + nb) of `rows` rows in
  // rv vectors of lanes: st[j][r] (row stride rv * lanes) gets row r's bias
  // (bias[r] NULL: none), then -inf outside the row's [lo[r], hi[r]).
  void (*epilogue)(const int32_t* lo, const int32_t* hi,
                   const float* const* bias, int64_t rows, int rv,
                   int64_t kv_len, int64_t j0, int64_t nb, float* st);
  // The row finisher: row `row` of p's out, lse and weights from the
  // running max m and sum l, unnormalized output o[c * stride] for columns
  // [c_begin, dv) (columns before c_begin are left as they are) and raw
  // scores in weights[w_lo, w_hi).
  void (*finish_row)(const Problem& p, int64_t row, float m, float l,
                     const float* o, size_t stride, int64_t c_begin,
                     int64_t w_lo, int64_t w_hi);
  // y[i] = tanh(x[i]) for i < n, as the softcap epilogue computes it.
  void (*tanh)(const float* x, float* y, size_t n);
  // sums[i] = the sum of row i of m, a transpose_lanes-square row-major
  // block, as the 8-row decoding scores add a row's lanes (O::SumLanes);
  // only where transpose_lanes is not 0.
  void (*sum_lanes)(const float* m, float* sums);
  // sums[i] and reduced[i] = the sum of row i of m, 4 rows of a vector's
  // lanes: the decoding scores' 4 lane sums at once (O::SumLanes4), and
  // each row's own reduction (O::ReduceSum), which they must equal bit for
  // bit.
  void (*sum_lanes4)(const float* m, float* sums, float* reduced);
};

// One engine at one SIMD target. Tasks are a fixed split of the problem that
// depends only on the Problem and the engine (never on the worker count), and
// every output element is written by exactly one task, so results are bitwise
// identical under any schedule.
//
// A call runs prepare (if any) once on the calling thread, filling the shared
// workspace (e.g. projected keys), then every task, each with the shared
// workspace read-only and its worker's private slice.
struct Engine {
  const char* name;  // "reference", "highway:AVX2", ...
  bool (*supports)(const Problem& p);
  size_t (*num_tasks)(const Problem& p);
  // Bytes shared by all tasks and bytes each worker needs, both multiples of
  // kWorkspaceAlign.
  size_t (*shared_workspace)(const Problem& p);
  size_t (*workspace_per_worker)(const Problem& p);
  void (*prepare)(const Problem& p, unsigned char* shared);  // may be NULL
  void (*run_task)(const Problem& p, size_t task, const unsigned char* shared,
                   unsigned char* workspace);
};

// The backward pass (qkv_attention_backward_f32) of a Problem whose out and
// lse are the forward call's results (const in fact; the Problem's pointers
// are reused for them) and whose weights is NULL. Gradients are laid out
// like their operands: d_q with q's strides, d_k with k's, d_v with v's,
// d_out with out's. NULL: not wanted.
struct Gradients {
  const float* d_out;
  float *d_q, *d_k, *d_v;
};

// One engine's backward pass, for DOT and GAUSSIAN scores and f32 K and V.
// Task t is (batch t / kv_heads, kv head t % kv_heads): it owns that kv
// head's d_k and d_v rows and its query heads' d_q rows, and writes each
// exactly once, so results are bitwise identical under any schedule.
struct BackwardEngine {
  size_t (*workspace_per_worker)(const Problem& p);  // multiple of 64
  void (*run_task)(const Problem& p, const Gradients& g, size_t task,
                   unsigned char* workspace);
};

// The backward pass of an engine: its SIMD target's for the Highway and
// xsimd engines, the portable one (src/reference/backward_ref.cc) for the
// reference and Helium engines. In their own objects, so that a firmware
// that never calls the backward pass links none of it.
const BackwardEngine* ReferenceBackward();
const BackwardEngine* HighwayBackward(const Engine* engine);  // NULL: not one
const BackwardEngine* XsimdBackward(const Engine* engine);    // NULL: not one

// The reference engine: plain C++, every score kind, used on
// microcontrollers and as the fallback everywhere. kReferenceEngine is the
// same object, named so that a constant table can hold its address.
const Engine* ReferenceEngine();
extern const Engine kReferenceEngine;

// Highway engines built into this library whose target this CPU supports,
// best first. Writes up to `max` pointers and returns how many it wrote.
size_t HighwayEngines(const Engine** out, size_t max);

// xsimd engines built into this library whose architecture this CPU
// supports, best first (src/xsimd/). Same contract as HighwayEngines.
size_t XsimdEngines(const Engine** out, size_t max);

// The Helium (MVE) engine for Cortex-M55/M85 (src/helium/), built only
// for microcontrollers with MVE-F (QKV_HAVE_HELIUM).
const Engine* HeliumEngine();
extern const Engine kHeliumEngine;

// Every runnable engine, best first. Builds with a run-time CPU check
// (Highway, xsimd) make the list once, on first use; builds whose engines
// are fixed at compile time (microcontrollers, reference-only) read a
// constant table and keep no mutable state.
size_t EngineCount();
const Engine* EngineAt(size_t index);
// Whether the SIMD pipeline's row path, streaming K and V from memory one
// row at a time, prefetches the next key block during a block's values
// (true: AMD CPUs; f32 keys on 16-lane targets, and those of one or two
// rows decoded in phases of several blocks on every x86 target, are then
// left to the hardware prefetchers) or during its scores (false:
// elsewhere). The environment
// variable QKV_KEY_PREFETCH=values or =scores, read once with the engine
// list, overrides it. Results are the same bits either way.
bool KeysPrefetchedLate();
const Engine* FindEngine(const char* name);  // NULL when not runnable here
// The building blocks of a SIMD engine of the list; NULL for the scalar
// engines (and in builds without SIMD engines).
const PipelineBlocks* BlocksOf(const Engine* engine);
const PipelineBlocks* HighwayBlocks(const Engine* engine);
const PipelineBlocks* XsimdBlocks(const Engine* engine);
// The engine a call without desc.backend uses: the first in the list that
// serves the problem, except where measurements say another is faster.
const Engine* DefaultEngineFor(const Problem& p);

}  // namespace qkv

#endif  // QKV_SRC_ENGINE_H_
