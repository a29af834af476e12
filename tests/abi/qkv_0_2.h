/* Fixture: include/qkv/qkv.h exactly as qkv 0.2.0 shipped it (never edited;
 * tests/abi/CMakeLists.txt compiles old programs against it). */
/* qkv: allocation-free attention for CPUs and microcontrollers.
 *
 * The one public ABI of the library: C99, plain structs, pointers and scalars.
 * Everything below the "fixed contract" banner keeps its name, value and
 * meaning forever; the descriptor only ever grows at its end.
 *
 *   out = softmax(a(q, k) + mask) v, per query row, over the kv_len keys.
 *
 * Usage (see README.md for the full semantics and the bad-input table):
 *
 *   qkv_attention_desc desc;
 *   qkv_attention_desc_init(&desc, batch, q_heads, kv_heads, q_len, kv_len,
 *                           head_dim, value_dim);
 *   desc.mask = QKV_MASK_CAUSAL;
 *   size_t bytes = qkv_attention_workspace_size(&desc);
 *   void *ws = bytes ? my_arena_alloc(bytes) : NULL;   // yours, any alignment
 *   qkv_status st = qkv_attention_f32(&desc, q, k, v, out, NULL, NULL, ws, bytes);
 */
#ifndef QKV_QKV_H_
#define QKV_QKV_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32) && defined(QKV_SHARED_BUILD)
#define QKV_API __declspec(dllexport)
#elif defined(__GNUC__) || defined(__clang__)
#define QKV_API __attribute__((visibility("default")))
#else
#define QKV_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Fixed contract                                                           */
/* ------------------------------------------------------------------------ */

#define QKV_VERSION_MAJOR 0
#define QKV_VERSION_MINOR 2
#define QKV_VERSION_PATCH 0

/* (MAJOR << 16) | (MINOR << 8) | PATCH of the linked library. */
QKV_API uint32_t qkv_version(void);

/* Engine and SIMD target the library uses when the descriptor does not name
 * one, e.g. "highway:AVX3_DL" or "reference". Chosen once, on first use.
 * Never NULL. */
QKV_API const char *qkv_backend(void);

typedef enum qkv_status { /* values pinned forever */
  QKV_OK = 0,
  QKV_ERR_INVALID_ARGUMENT = 1,
  QKV_ERR_WORKSPACE_TOO_SMALL = 2,
  QKV_ERR_UNSUPPORTED = 3
} qkv_status;

/* A short English sentence for the status. Never NULL, also for unknown
 * values. */
QKV_API const char *qkv_status_string(qkv_status status);

typedef enum qkv_score {
  QKV_SCORE_DOT = 0,      /* s = scale * (q . k) */
  QKV_SCORE_GAUSSIAN = 1, /* s = -scale * |q - k|^2 (Nadaraya-Watson: scale = 1/2) */
  QKV_SCORE_ADDITIVE = 2  /* s = w_v . tanh(W_q q + W_k k) (Bahdanau); scale unused */
} qkv_score;

/* Mask flags, combinable: a key is visible iff every active mask allows it. */
enum {
  QKV_MASK_NONE = 0,
  QKV_MASK_CAUSAL = 1,     /* query i sees key j iff j <= i + kv_len - q_len */
  QKV_MASK_VALID_LENS = 2, /* query sees key j iff j < valid length */
  QKV_MASK_BIAS = 4,       /* bias is added to the scores; -INFINITY hides */
  /* added in 0.2 (fields at the end of qkv_attention_desc): */
  QKV_MASK_WINDOW = 8,     /* p - window_left <= j <= p + window_right */
  QKV_MASK_KV_START = 16   /* query sees key j iff j >= kv_start[batch] */
};
/* p above is the query's position (desc.q_pos): with causal, query p sees
 * key j iff j <= p; by default p = kv_len - q_len + i for query i. */

/* Runs task `task` of a call on worker `worker` (< num_workers). */
typedef void (*qkv_task_fn)(void *arg, size_t task, size_t worker);
/* The caller's thread pool: must run fn(arg, t, w) once for every t in
 * [0, num_tasks), in any order, on any workers w < num_workers, and return
 * when all have finished. Called at most once per qkv_attention_f32 call
 * (not at all when the call has a single task: that runs inline). */
typedef void (*qkv_parallel_for_fn)(void *ctx, size_t num_tasks, qkv_task_fn fn,
                                    void *arg);

/* Element type of a K/V cache (added in 0.2): k and v of qkv_attention.
 * F16 is IEEE binary16 and BF16 bfloat16 (uint16_t bit patterns); I8 holds
 * x = scale * q, q an int8_t, with one float scale per (batch, kv head,
 * key) row of K (k_scales) and of V (v_scales). q, out, weights and lse
 * stay f32, and all arithmetic is f32 with f32 accumulation. */
typedef enum qkv_dtype {
  QKV_DTYPE_F32 = 0,
  QKV_DTYPE_F16 = 1,
  QKV_DTYPE_BF16 = 2,
  QKV_DTYPE_I8 = 3
} qkv_dtype;

/* Strides of a [batch][head][token][dim] tensor, in elements; dim is
 * contiguous (added in 0.2). */
typedef struct qkv_strides {
  int64_t batch, head, token;
} qkv_strides;

typedef struct qkv_attention_desc {
  size_t struct_size; /* sizeof as the caller compiled it; set by _init */
  /* q_heads % kv_heads == 0; query head h reads kv head h / (q_heads / kv_heads) */
  int64_t batch, q_heads, kv_heads;
  int64_t q_len, kv_len, head_dim, value_dim;
  qkv_score score;
  /* _init sets 1/sqrt(head_dim); 0 is allowed: uniform weights (average pooling) */
  float scale;
  uint32_t mask; /* QKV_MASK_* flags */
  /* [batch], or [batch][q_len] when valid_lens_per_query != 0; each in [0, kv_len] */
  const int32_t *valid_lens;
  int32_t valid_lens_per_query;
  /* added to scores: row i of [q_len][kv_len] at
   * bias + b*bias_batch_stride + h*bias_head_stride; -INFINITY hides a key */
  const float *bias;
  int64_t bias_batch_stride, bias_head_stride; /* in elements; 0 broadcasts */
  /* QKV_SCORE_ADDITIVE: W_q, W_k are [additive_hidden][head_dim], w_v is [additive_hidden] */
  int64_t additive_hidden;
  const float *additive_w_q, *additive_w_k, *additive_w_v;
  qkv_parallel_for_fn parallel_for; /* NULL: run on the calling thread */
  void *parallel_ctx;
  size_t num_workers; /* the pool's size; worker indices passed to fn are < num_workers */

  /* ---- added in 0.1 beyond the fixed contract (a shorter struct_size
   * leaves them at their defaults) ---- */
  /* NULL or "": the default backend (qkv_backend()). Otherwise one of the
   * names qkv_backend_name() lists, e.g. "reference" or "highway:AVX2";
   * a name this build or CPU cannot run gives QKV_ERR_UNSUPPORTED. */
  const char *backend;

  /* ---- added in 0.2: variants and layouts. _init zeroes them, and so
   * does a shorter struct_size: f32, dense, no window, no ALiBi, no
   * softcap, default positions, no sinks. ---- */
  /* Element type of k and v (qkv_attention; qkv_attention_f32 reads F32
   * only). The result is within the accuracy bound below of the exact
   * attention over the values the cache holds (F16 and BF16 decoded
   * exactly, I8 as scale * q): the kernels add no error of their own.
   * Microcontroller builds serve F16, BF16 and I8 only when configured with
   * QKV_LOW_PRECISION_KV=ON (CMake; OFF by default there, so that an
   * f32-only firmware keeps its size); otherwise they return
   * QKV_ERR_UNSUPPORTED for them. */
  qkv_dtype kv_dtype;
  /* QKV_DTYPE_I8: the scale of K's (V's) row (b, kv head h, key j) is
   * k_scales[b * batch + h * head + j * token] with k_scale_strides (in
   * floats, the rule of the other strides: all 0 is dense
   * [batch][kv_heads][kv_len]; a token-major cache keeps its scales
   * token-major, {seq * kv_heads, 1, kv_heads}). NULL with I8 (and
   * kv_len > 0): QKV_ERR_INVALID_ARGUMENT. Their values are data, like K's
   * and V's, and not checked. Not read for the other types. */
  const float *k_scales, *v_scales;
  /* Layouts, in elements (of kv_dtype for k and v): element (b, h, t, c)
   * of q, k, v or out is at b * batch + h * head + t * token + c. All
   * three 0: dense, as documented at qkv_attention_f32. Otherwise all
   * three are used as given: 0 broadcasts (one cache for the whole batch);
   * a non-zero stride of q, k or v smaller than head_dim (value_dim for v)
   * is invalid. out's strides must nest (sorted, each at least the extent
   * of the smaller ones), so no two output elements share memory. weights,
   * lse and bias stay dense. Token-major [batch][seq][heads][dim]:
   * {seq * heads * dim, dim, heads * dim}; a cache with capacity C puts C
   * in place of seq. */
  qkv_strides q_strides, k_strides, v_strides, out_strides;
  qkv_strides k_scale_strides, v_scale_strides; /* not read for F32 */
  /* QKV_MASK_WINDOW: query at position p sees key j iff
   * p - window_left <= j <= p + window_right; a negative value leaves that
   * side unbounded. Mistral's 4096 window: {4095, 0} (or {4095, -1} with
   * QKV_MASK_CAUSAL). */
  int64_t window_left, window_right;
  /* NULL or [q_heads], finite: adds -alibi_slopes[h] * |p - j| to the
   * score of query head h at position p for key j (after softcap and bias). */
  const float *alibi_slopes;
  /* 0: off. > 0: the score a(q, k) becomes softcap * tanh(a / softcap)
   * before bias and ALiBi (Gemma 2). Negative, NaN or inf: invalid. */
  float softcap;
  /* NULL or [batch]: query i of batch b has position q_pos[b] + i (any
   * int32, negative and past kv_len included). NULL: kv_len - q_len + i.
   * A ragged batch: valid_lens[b] with q_pos[b] = valid_lens[b] - q_len. */
  const int32_t *q_pos;
  /* NULL or [q_heads] (gpt-oss): a logit in every softmax denominator of
   * head h that carries no value: weights_j = exp(s_j) / (exp(sinks[h]) +
   * sum over visible keys of exp(s)); lse includes it; a row that sees no
   * key gets out 0, weights 0 and lse = sinks[h]. Finite or -INFINITY (no
   * sink for that head); NaN or +inf: invalid. */
  const float *sinks;
  /* QKV_MASK_KV_START: [batch], each in [0, kv_len]: keys before
   * kv_start[b] are padding (a left-padded batch), hidden from every query
   * and head of batch b. Costs nothing: it narrows the keys a row visits. */
  const int32_t *kv_start;
} qkv_attention_desc;

/* Fills every field: struct_size = sizeof(qkv_attention_desc), the sizes,
 * score DOT, scale 1/sqrt(head_dim) (0 if head_dim <= 0), no mask, every
 * pointer NULL, every stride and count 0. NULL desc: does nothing. */
QKV_API void qkv_attention_desc_init(qkv_attention_desc *desc, int64_t batch,
                                     int64_t q_heads, int64_t kv_heads,
                                     int64_t q_len, int64_t kv_len,
                                     int64_t head_dim, int64_t value_dim);

/* Bytes of workspace qkv_attention_f32 needs for this descriptor (its shape,
 * score, backend and num_workers; the data pointers are not read). 0 when no
 * workspace is needed, and also when the descriptor is invalid (the call
 * itself then reports why). */
QKV_API size_t qkv_attention_workspace_size(const qkv_attention_desc *desc);

/* Attention in f32. Layouts are dense row-major unless desc's strides say
 * otherwise (q, k, v, out; see qkv_strides):
 *   q   [batch][q_heads][q_len][head_dim]
 *   k   [batch][kv_heads][kv_len][head_dim]
 *   v   [batch][kv_heads][kv_len][value_dim]
 *   out [batch][q_heads][q_len][value_dim]
 *   weights (optional, NULL to skip) [batch][q_heads][q_len][kv_len]
 *   lse     (optional, NULL to skip) [batch][q_heads][q_len]: natural log of
 *           the sum of exp of the visible scores (and the sink); -INFINITY
 *           for a row that sees no key and has no sink (its out and weights
 *           are zeros).
 * batch, q_len and kv_len may be 0: batch or q_len 0 is nothing to do (OK,
 * pointers not read); kv_len 0 gives every row out 0 and lse -INFINITY (or
 * its sink), k and v not read. Outputs must not overlap the inputs, each
 * other or the workspace (compared as the address ranges their strides
 * span); inputs may overlap themselves and each other. The workspace needs
 * no alignment. On any status but QKV_OK nothing is written to out, weights
 * or lse, and qkv_attention_explain says why. Accuracy: out within
 * 5e-5 * max|v| and weights within 2e-5 of the exact result. Output is
 * bitwise identical for every num_workers and schedule, and with
 * parallel_for NULL. Requires desc->kv_dtype == QKV_DTYPE_F32. */
QKV_API qkv_status qkv_attention_f32(const qkv_attention_desc *desc,
                                     const float *q, const float *k,
                                     const float *v, float *out, float *weights,
                                     float *lse, void *workspace,
                                     size_t workspace_size);

/* The general entry (added in 0.2): k and v are arrays of desc->kv_dtype
 * elements (strides in those elements). Otherwise qkv_attention_f32. */
QKV_API qkv_status qkv_attention(const qkv_attention_desc *desc,
                                 const float *q, const void *k, const void *v,
                                 float *out, float *weights, float *lse,
                                 void *workspace, size_t workspace_size);

/* What qkv_attention would return for these arguments, without computing
 * or writing any output (added in 0.2), and why, as one English sentence
 * naming the field or argument and its value, e.g.
 *   "k_strides.token (12) is smaller than head_dim (64)"
 * written NUL-terminated into message[0, message_size) (cut short to fit;
 * not written when message is NULL or message_size is 0). QKV_OK writes
 * "ok". No global state: safe from any thread. */
QKV_API qkv_status qkv_attention_explain(const qkv_attention_desc *desc,
                                         const float *q, const void *k,
                                         const void *v, const float *out,
                                         const float *weights,
                                         const float *lse,
                                         const void *workspace,
                                         size_t workspace_size, char *message,
                                         size_t message_size);

/* ------------------------------------------------------------------------ */
/* Gradients (added in 0.2)                                                 */
/* ------------------------------------------------------------------------ */

/* Bytes of workspace qkv_attention_backward_f32 needs for this descriptor
 * (its shape, score, backend and num_workers; data pointers not read). 0
 * when none is needed, and also when the descriptor is invalid for the
 * backward pass (the call then reports why). */
QKV_API size_t qkv_attention_backward_workspace_size(
    const qkv_attention_desc *desc);

/* The backward pass of qkv_attention_f32: given the forward call's out and
 * lse (both required, as that call wrote them) and d_out = dLoss/d(out),
 * writes d_q, d_k, d_v = dLoss/d(q), dLoss/d(k), dLoss/d(v). Each of d_q,
 * d_k, d_v may be NULL to skip it; they are overwritten, not accumulated.
 * d_k and d_v sum over the query heads of a GQA group; keys no query sees
 * get 0. Layouts: d_q like q (q_strides), d_k like k (k_strides), d_v like
 * v (v_strides), out and d_out like out (out_strides), lse dense; the gaps
 * of strided layouts are never written. Gradient layouts must not make two
 * elements share memory (a k broadcast over the batch with stride 0 has no
 * d_k of its own: pass NULL). Score kinds DOT and GAUSSIAN with every mask
 * and variant (causal, valid lens, bias, window, ALiBi, softcap, sinks,
 * q_pos, kv_start) and GQA; the bias, ALiBi slopes and sinks are constants
 * (no gradient). QKV_SCORE_ADDITIVE and kv_dtype other than F32:
 * QKV_ERR_UNSUPPORTED. A descriptor the forward call refuses: the forward's
 * status. NULL out, lse or d_out (with rows to compute), or gradients
 * overlapping the inputs, each other or the workspace:
 * QKV_ERR_INVALID_ARGUMENT; a short workspace: QKV_ERR_WORKSPACE_TOO_SMALL;
 * on any refusal nothing is written. q_len 0
 * leaves every key unseen: d_k and d_v are zeros; kv_len 0: d_q zeros.
 * Accuracy: each gradient within 1e-3 of its largest element's magnitude
 * of the exact gradient of the attention the forward computed (plus f32
 * rounding where exact terms cancel: an element that is exactly 0, such
 * as d_q of a row with one visible key, may come out near 1e-8). No
 * allocation; tasks run on desc's pool (one parallel_for call, one task
 * per (batch, kv head)); bitwise identical for every num_workers and
 * schedule. */
QKV_API qkv_status qkv_attention_backward_f32(
    const qkv_attention_desc *desc, const float *q, const float *k,
    const float *v, const float *out, const float *lse, const float *d_out,
    float *d_q, float *d_k, float *d_v, void *workspace, size_t workspace_size);

/* What qkv_attention_backward_f32 would return for these arguments, without
 * computing or writing anything, and why, as qkv_attention_explain says it
 * for the forward call. */
QKV_API qkv_status qkv_attention_backward_explain(
    const qkv_attention_desc *desc, const float *q, const float *k,
    const float *v, const float *out, const float *lse, const float *d_out,
    const float *d_q, const float *d_k, const float *d_v,
    const void *workspace, size_t workspace_size, char *message,
    size_t message_size);

/* ------------------------------------------------------------------------ */
/* Filling a K/V cache (added in 0.2)                                       */
/* ------------------------------------------------------------------------ */

/* Converts `rows` rows of `n` floats (row r at src + r * src_row_stride) to
 * `dtype` elements (row r at element r * dst_row_stride of dst; strides in
 * elements, 0 meaning n):
 *   QKV_DTYPE_F32   a copy
 *   QKV_DTYPE_F16   IEEE binary16, round to nearest even (|x| >= 65520
 *                   becomes +-inf, below 2^-14 subnormal, NaN stays NaN)
 *   QKV_DTYPE_BF16  bfloat16, round to nearest even (NaN stays NaN)
 *   QKV_DTYPE_I8    scales[r] = max|x| / 127 (0 for an all-zero row) and
 *                   q = nearest(x / scales[r]), ties to even, in [-127, 127],
 *                   so that x ~ scales[r] * q; a row whose max|x| / 127
 *                   underflows to 0 gets scale 0 and q = 0.
 * QKV_ERR_INVALID_ARGUMENT, writing nothing, for: a dtype outside the enum,
 * rows, n or a stride negative, a non-zero stride below n, src or dst NULL
 * when rows > 0 and n > 0, scales NULL with QKV_DTYPE_I8 and rows > 0, a
 * non-finite src value with QKV_DTYPE_I8, extents that are not addressable,
 * or src, dst and scales (I8) overlapping as address ranges. rows == 0 does
 * nothing; n == 0 reads nothing and sets I8 scales to 0. No allocation. */
QKV_API qkv_status qkv_quantize_rows(qkv_dtype dtype, int64_t rows, int64_t n,
                                     const float *src, int64_t src_row_stride,
                                     void *dst, int64_t dst_row_stride,
                                     float *scales);

/* ------------------------------------------------------------------------ */
/* Merging partial results (added in 0.1)                                   */
/* ------------------------------------------------------------------------ */

/* (out_b, lse_b) := merge((out_a, lse_a), (out_b, lse_b)), in place, for
 * `rows` rows of `value_dim` floats (dense: out_x[r * value_dim + c]) and
 * their lse (dense: lse_x[r]), where a and b are the out and lse of
 * attention for the same queries over two disjoint sets of keys:
 *
 *   lse = log(exp(lse_a) + exp(lse_b))
 *   out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b
 *
 * The result equals one qkv_attention_f32 call over the union of the keys
 * within that call's bound. Bitwise commutative: merging a into b gives the
 * bits of merging b into a. A side with lse -INFINITY (it saw no key) leaves
 * the other side's bits unchanged; both -INFINITY: out 0, lse -INFINITY. A
 * NaN lse gives a NaN row. Not associative in rounding: a fixed order of
 * merges (or reduction tree) gives fixed bits.
 * rows 0: nothing to do (QKV_OK; the pointers are not read). rows < 0,
 * value_dim < 1 or a NULL pointer (rows > 0): QKV_ERR_INVALID_ARGUMENT and
 * nothing written. a may be b itself; partial overlaps are not allowed. No
 * allocation, no threads; vectorized, compiled without contracting a * b + c
 * into fused multiply-adds (which would break the commutativity).
 *
 * As an MPI reduction over rows packed as value_dim outputs then the lse
 * (capi/examples/sharded_search.c):
 *
 *   static void merge_rows(void *in, void *inout, int *len, MPI_Datatype *row) {
 *     int bytes; MPI_Type_size(*row, &bytes);
 *     int64_t n = bytes / (int)sizeof(float) - 1;      // value_dim
 *     float *a = (float *)in, *b = (float *)inout;
 *     for (int r = 0; r < *len; ++r, a += n + 1, b += n + 1)
 *       qkv_attention_merge_f32(1, n, a, a + n, b, b + n);
 *   }
 *   MPI_Type_contiguous(value_dim + 1, MPI_FLOAT, &row); MPI_Type_commit(&row);
 *   MPI_Op_create(merge_rows, 0, &op);  // 0: non-commutative, rank order kept
 *   MPI_Reduce(mine, all, rows, row, op, 0, MPI_COMM_WORLD);
 *
 * For a fixed number of ranks Open MPI uses a fixed reduction tree, so the
 * bits repeat; the MPI standard recommends this but does not promise it.
 * Gathering the parts and merging them in rank order is fixed by
 * construction. */
QKV_API qkv_status qkv_attention_merge_f32(int64_t rows, int64_t value_dim,
                                           const float *out_a,
                                           const float *lse_a, float *out_b,
                                           float *lse_b);

/* ------------------------------------------------------------------------ */
/* Backends (added in 0.1)                                                  */
/* ------------------------------------------------------------------------ */

/* Number of backends this library was built with that run on this CPU. */
QKV_API size_t qkv_backend_count(void);
/* Name of backend `index` (best first; index 0 is qkv_backend()), or NULL
 * when index >= qkv_backend_count(). */
QKV_API const char *qkv_backend_name(size_t index);

/* ------------------------------------------------------------------------ */
/* Compile-time workspace size (added in 0.1, for firmware)                 */
/* ------------------------------------------------------------------------ */

/* QKV_REFERENCE_WORKSPACE_SIZE(kv_len, additive_hidden, num_workers): the
 * bytes qkv_attention_workspace_size() returns for a valid descriptor served
 * by the "reference" backend, or by "helium" (the backends of microcontroller
 * builds; Helium lays out its workspace the same way; both, for every
 * kv_dtype, read K and V in place), as a constant
 * expression when the arguments are constants:
 *
 *   static unsigned char ws[QKV_REFERENCE_WORKSPACE_SIZE(64, 0, 1)];
 *
 * kv_len: desc.kv_len. additive_hidden: desc.additive_hidden for
 * QKV_SCORE_ADDITIVE, 0 for the other scores. num_workers: desc.num_workers
 * when desc.parallel_for is set, else 1. Each worker needs kv_len floats (the
 * scores of one row), plus (kv_len + 1) * additive_hidden floats (projected
 * keys and one projected query) for additive scores, rounded up to 64 bytes;
 * the call adds 63 bytes of slack to align the caller's buffer to 64. The
 * Highway and xsimd backends need other amounts: ask
 * qkv_attention_workspace_size() there. */
#define QKV_REFERENCE_WORKSPACE_SIZE(kv_len, additive_hidden, num_workers) \
  ((((((size_t)(kv_len) * ((size_t)(additive_hidden) + 1u) +              \
       (size_t)(additive_hidden)) * 4u + 63u) & ~(size_t)63u) *            \
    (size_t)(num_workers)) + 63u)

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* QKV_QKV_H_ */
