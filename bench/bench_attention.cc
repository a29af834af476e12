// Google Benchmark suite for qkv_attention_f32.
//
// S1-S4 (and S1_gqa8_decode: 64 query heads over 8 kv heads, 4096 keys,
// d 128) run every backend the library offers on this CPU (from
// qkv_backend_name(i)), with 1 and 2 workers of a std::thread pool for the
// fast backends, beside the OpenBLAS three-step baseline (1 and 2 workers) and
// the scalar reference backend, all in the same run. Names are
//   attention_f32/<shape>/<implementation>/workers:<n>
// e.g. attention_f32/S2_prefill/highway:AVX3_DL/workers:1, and
//   attention_f32/S2_prefill/openblas_3step/workers:1.
// Two sweeps run every SIMD backend (1 and 2 workers) and OpenBLAS (1 and 2)
// with shorter runs (MinTime 0.1 s, 3 repetitions, whatever the command line
// says), the reference and the scalar Highway targets at 1 worker where
// cheap (at most kReferenceMaxFlops per call):
//   sweep_kv<n>  kv_len 128..16384, q_len 128, 4 heads, d 64
//   sweep_d<n>   head_dim 32, 64, 80, 128, 256, q_len = kv_len = 512, 4 heads
// The machine's limits come first, measured by the same binary in the same
// run (machine_limits.cc):
//   limits/fma_peak/<target>/threads:<n>   multiply-add peak of each SIMD
//                                          target (flop counter)
//   limits/stream_read/256MiB/threads:<n>  sum of a 256 MiB float array,
//                                          four streams per thread (bytes
//                                          counter)
// Then two workers against one on S2 and S3, paired in time, for each
// engine's best backend and OpenBLAS (the scaling section below):
//   scaling/<shape>/<implementation>
// Then the backward pass (qkv_attention_backward_f32) on S2 and S3, against
// the forward and against the same gradients written as OpenBLAS calls (the
// backward section below):
//   backward_f32/<shape>/<implementation>/workers:<n>
//   backward_paired/<shape>/<backend>      forward, backward, baseline
//                                          paired in time
//   scaling_backward/<shape>/<backend>     2 workers against 1, paired
// Last, the 0.2 variants (sliding window, ALiBi, sinks, softcap) and layouts
// (token-major, a padded cache) against the same call without them, paired
// in time on the default backend (the vs plain section below):
//   vs_plain/<shape>/<variant>/<backend>
// bench/run.sh runs this binary with repetitions and turns the medians into a
// table, with each row's fraction of the limit that bounds it.
//
// Counters (rates use wall-clock time: every benchmark is UseRealTime):
//   flop     FLOP/s, FLOPs = 4 * batch * heads * q_len * kv_len * d (half with
//            causal), the convention of the Performance issue
//   bytes    bytes/s of q + k + v + out (f32)
//   kv_bytes bytes/s of K and V read (f32), once per call: S1 decode's figure
//            of merit (with one query per head it streams K and V once)
//   max_err  max |out - out_openblas| / max |v|, checked once per benchmark
//            outside the timing loop (-1 when no OpenBLAS to compare with)
//   machine  (2-worker rows) what the machine gave two threads for this work
//            just after the timing loop: MachineFor below
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "baseline_blas.h"
#include "machine_limits.h"
#include "qkv/qkv.h"
#include "support/thread_pool.h"

namespace qkv_bench {
namespace {

// Which implementations a shape runs (see the top of the file).
enum class Kind { kMain, kScoreKind, kKvSweep, kDimSweep };

struct Shape {
  std::string name;
  int64_t batch, heads, q_len, kv_len, head_dim;
  bool causal;
  Kind kind;
  qkv_score score = QKV_SCORE_DOT;
  int64_t hidden = 0;  // QKV_SCORE_ADDITIVE: additive_hidden
  int64_t kv_heads = 0;  // GQA: heads / kv_heads query heads per kv head (0: heads)

  int64_t KvHeads() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t Group() const { return heads / KvHeads(); }

  int64_t value_dim() const { return head_dim; }
  // (query, key) pairs scored per call.
  double Pairs() const {
    const double n = static_cast<double>(batch) * heads * q_len * kv_len;
    return causal ? n / 2 : n;
  }
  // DOT and GAUSSIAN: 2 flops per element of the score and of the output.
  // ADDITIVE: per pair, hidden (add, tanh, fma) counted as 3 flops each plus
  // the output's 2 * value_dim; the once-per-call projections are left out.
  double Flops() const {
    if (score == QKV_SCORE_ADDITIVE) {
      return Pairs() * (3.0 * hidden + 2.0 * value_dim());
    }
    return Pairs() * 2.0 * (head_dim + value_dim());
  }
  // The backward pass (DOT): five matrix products over the visible pairs,
  // 2 flops per element each: S = Q K^T, dQ = dS K and dK = dS^T Q over
  // head_dim, dP = dO V^T and dV = P^T dO over value_dim. 2.5x Flops() when
  // value_dim = head_dim (FlashAttention-2's count).
  double BackwardFlops() const {
    return Pairs() * 2.0 * (3.0 * head_dim + 2.0 * value_dim());
  }
  size_t QFloats() const { return size_t(batch * heads * q_len * head_dim); }
  size_t KFloats() const {
    return size_t(batch * KvHeads() * kv_len * head_dim);
  }
  size_t VFloats() const {
    return size_t(batch * KvHeads() * kv_len * value_dim());
  }
  size_t OutFloats() const {
    return size_t(batch * heads * q_len * value_dim());
  }
  double Bytes() const {
    return 4.0 * double(QFloats() + KFloats() + VFloats() + OutFloats());
  }
  double KvBytes() const { return 4.0 * double(KFloats() + VFloats()); }
};

// 64-byte aligned float buffer, allocated once and kept for the whole run.
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float, FreeDeleter>;

// n floats (zeroed), `align`-aligned, the size rounded up to a multiple of
// it; with `huge` (align 2 MiB) on 2 MiB pages where the kernel grants them
// (madvise(MADV_HUGEPAGE) before the first touch: Linux's transparent huge
// pages in their "madvise" or "always" mode; "never" leaves 4 KiB pages;
// HugeBytes says how much the kernel did back). Aborts when out of memory.
Buffer AllocAligned(size_t n, size_t align, bool huge = false) {
  const size_t bytes =
      (std::max<size_t>(n, 1) * sizeof(float) + align - 1) / align * align;
  void* p = std::aligned_alloc(align, bytes);
  if (p == nullptr) {
    std::fprintf(stderr, "qkv_bench: out of memory (%zu bytes)\n", bytes);
    std::abort();
  }
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);  // a hint: may leave 4 KiB
#endif
  std::memset(p, 0, bytes);
  return Buffer(static_cast<float*>(p));
}

Buffer AllocFloats(size_t n) { return AllocAligned(n, 64); }
Buffer AllocHugeFloats(size_t n) {
  return AllocAligned(n, size_t{2} << 20, true);
}

// Bytes of huge pages (AnonHugePages) in the mappings that hold a or b (each
// mapping once: the kernel may join the two), from /proc/self/smaps; 0
// without that file.
double HugeBytes(const void* a, const void* b) {
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return 0.0;
  const uintptr_t x = reinterpret_cast<uintptr_t>(a);
  const uintptr_t y = reinterpret_cast<uintptr_t>(b);
  char line[512];
  bool in = false;
  double kib = 0.0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo = 0, hi = 0;  // a mapping's first line: lo-hi perms ...
    if (std::sscanf(line, "%lx-%lx", &lo, &hi) == 2) {
      in = (x >= lo && x < hi) || (y >= lo && y < hi);
      continue;
    }
    double v = 0.0;
    if (in && std::sscanf(line, "AnonHugePages: %lf kB", &v) == 1) kib += v;
  }
  std::fclose(f);
  return kib * 1024.0;
}

// Inputs of one shape, shared by all its benchmarks, filled on first use.
struct ShapeData {
  Buffer q, k, v, out;
  Buffer expected;  // the OpenBLAS 3-step's output, for max_err
  bool have_expected = false;
  float max_abs_v = 0.0f;
  std::vector<float> w_q, w_k, w_v;  // ADDITIVE weights
};

ShapeData& DataFor(const Shape& s) {
  static std::map<std::string, std::unique_ptr<ShapeData>> cache;
  std::unique_ptr<ShapeData>& slot = cache[s.name];
  if (slot) return *slot;
  slot.reset(new ShapeData);
  ShapeData& d = *slot;
  std::mt19937 rng(12345);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto fill = [&](size_t n) {
    Buffer b = AllocFloats(n);
    for (size_t i = 0; i < n; ++i) b.get()[i] = dist(rng);
    return b;
  };
  d.q = fill(s.QFloats());
  d.k = fill(s.KFloats());
  d.v = fill(s.VFloats());
  d.out = AllocFloats(s.OutFloats());
  if (s.score == QKV_SCORE_ADDITIVE) {
    const size_t w = static_cast<size_t>(s.hidden * s.head_dim);
    d.w_q.resize(w);
    d.w_k.resize(w);
    d.w_v.resize(static_cast<size_t>(s.hidden));
    for (float& x : d.w_q) x = 0.2f * dist(rng);
    for (float& x : d.w_k) x = 0.2f * dist(rng);
    for (float& x : d.w_v) x = dist(rng);
  }
  for (size_t i = 0; i < s.VFloats(); ++i) {
    d.max_abs_v = std::max(d.max_abs_v, std::fabs(d.v.get()[i]));
  }
  return d;
}

BlasShape BlasShapeOf(const Shape& s) {
  return BlasShape{s.q_len,
                   s.kv_len,
                   s.head_dim,
                   s.value_dim(),
                   1.0f / std::sqrt(static_cast<float>(s.head_dim)),
                   s.causal};
}

// The 3-step baseline over all heads; heads are tasks of our pool, so
// "workers:2" means two single-threaded OpenBLAS calls side by side.
struct BlasRun {
  const Shape* shape;
  BlasShape bs;
  const float *q, *k, *v;
  float* out;
  float* scratch;  // one BlasScratchFloats per worker
  size_t scratch_floats;

  static void Task(void* arg, size_t task, size_t worker) {
    const BlasRun& r = *static_cast<const BlasRun*>(arg);
    const Shape& s = *r.shape;
    const size_t t = task;
    const size_t kv = t / size_t(s.Group());  // (b, h) -> (b, kv head)
    BlasAttentionHead(
        r.bs, r.q + t * s.q_len * s.head_dim, r.k + kv * s.kv_len * s.head_dim,
        r.v + kv * s.kv_len * s.value_dim(),
        r.out + t * s.q_len * s.value_dim(),
        r.scratch + worker * r.scratch_floats);
  }
};

void ComputeExpected(const Shape& s, ShapeData& d) {
  // The 3-step baseline computes dot-product attention only.
  if (d.have_expected || !BlasAvailable() || s.score != QKV_SCORE_DOT) return;
  d.expected = AllocFloats(s.OutFloats());
  const BlasShape bs = BlasShapeOf(s);
  Buffer scratch = AllocFloats(BlasScratchFloats(bs));
  BlasRun run{&s,
              bs,
              d.q.get(),
              d.k.get(),
              d.v.get(),
              d.expected.get(),
              scratch.get(),
              BlasScratchFloats(bs)};
  for (size_t t = 0; t < size_t(s.batch * s.heads); ++t) {
    BlasRun::Task(&run, t, 0);
  }
  d.have_expected = true;
}

double MaxErr(const Shape& s, const ShapeData& d, const float* out) {
  if (!d.have_expected) return -1.0;
  double err = 0.0;
  for (size_t i = 0; i < s.OutFloats(); ++i) {
    const double e = std::fabs(double(out[i]) - double(d.expected.get()[i]));
    if (!(e <= err)) err = e;  // NaN sticks
  }
  return d.max_abs_v > 0 ? err / d.max_abs_v : err;
}

void SetCounters(benchmark::State& state, const Shape& s, double max_err) {
  const double iters = static_cast<double>(state.iterations());
  state.counters["flop"] =
      benchmark::Counter(s.Flops() * iters, benchmark::Counter::kIsRate);
  state.counters["bytes"] =
      benchmark::Counter(s.Bytes() * iters, benchmark::Counter::kIsRate);
  state.counters["kv_bytes"] =
      benchmark::Counter(s.KvBytes() * iters, benchmark::Counter::kIsRate);
  state.counters["pairs"] =
      benchmark::Counter(s.Pairs() * iters, benchmark::Counter::kIsRate);
  state.counters["max_err"] = benchmark::Counter(max_err);
}

qkv_test::ThreadPool& Pool(size_t workers) {
  static std::map<size_t, std::unique_ptr<qkv_test::ThreadPool>> pools;
  std::unique_ptr<qkv_test::ThreadPool>& p = pools[workers];
  if (!p) p.reset(new qkv_test::ThreadPool(workers));
  return *p;
}

// What the machine gives two threads for this work right now: the
// throughput of two copies of the 1-worker call side by side, in units of
// one (2.0: two full cores), median of a few tries; see the scaling
// section below. Every 2-worker benchmark records it after its timing loop
// as the counter "machine". backward: of the backward pass (impl a backend
// or "openblas_5gemm").
double MachineFor(const Shape& s, const std::string& impl,
                  bool backward = false);

// One qkv benchmark: a backend, a shape, a worker count (0: no pool,
// parallel_for NULL). The workspace is allocated on first run and kept.
struct QkvCase {
  Shape shape;
  std::string backend;
  size_t workers;
  Buffer workspace;
  size_t workspace_bytes = 0;
  bool ready = false;
  qkv_status status = QKV_OK;
  double max_err = -1.0;
};

// The descriptor of shape s on `backend` with a pool of `workers` (0: none).
qkv_attention_desc DescFor(const Shape& s, const ShapeData& d,
                           const char* backend, size_t workers) {
  qkv_attention_desc desc;
  qkv_attention_desc_init(&desc, s.batch, s.heads, s.KvHeads(), s.q_len,
                          s.kv_len, s.head_dim, s.value_dim());
  if (s.causal) desc.mask = QKV_MASK_CAUSAL;
  desc.score = s.score;
  if (s.score == QKV_SCORE_GAUSSIAN) desc.scale = 0.5f / s.head_dim;
  if (s.score == QKV_SCORE_ADDITIVE) {
    desc.additive_hidden = s.hidden;
    desc.additive_w_q = d.w_q.data();
    desc.additive_w_k = d.w_k.data();
    desc.additive_w_v = d.w_v.data();
  }
  desc.backend = backend;
  if (workers > 0) Pool(workers).Attach(&desc);
  return desc;
}

void RunQkv(benchmark::State& state, QkvCase* c) {
  const Shape& s = c->shape;
  ShapeData& d = DataFor(s);
  qkv_attention_desc desc = DescFor(s, d, c->backend.c_str(), c->workers);
  if (!c->ready) {
    c->workspace_bytes = qkv_attention_workspace_size(&desc);
    if (c->workspace_bytes > 0) {
      c->workspace = AllocFloats((c->workspace_bytes + 3) / 4);
    }
    ComputeExpected(s, d);
  }
  void* ws = c->workspace.get();
  const size_t ws_bytes = c->workspace_bytes;
  if (!c->ready) {
    // One untimed call (only the first time: the reference is slow): checks
    // the status and the result, and warms the caches.
    std::memset(d.out.get(), 0, s.OutFloats() * sizeof(float));
    c->status = qkv_attention_f32(&desc, d.q.get(), d.k.get(), d.v.get(),
                                  d.out.get(), nullptr, nullptr, ws, ws_bytes);
    if (c->status == QKV_OK) c->max_err = MaxErr(s, d, d.out.get());
    c->ready = true;
  }
  if (c->status != QKV_OK) {
    state.SkipWithError(qkv_status_string(c->status));
    return;
  }
  for (auto _ : state) {
    qkv_attention_f32(&desc, d.q.get(), d.k.get(), d.v.get(), d.out.get(),
                      nullptr, nullptr, ws, ws_bytes);
    benchmark::ClobberMemory();
  }
  SetCounters(state, s, c->max_err);
  if (c->workers == 2) state.counters["machine"] = MachineFor(s, c->backend);
}

struct BlasCase {
  Shape shape;
  size_t workers;
  Buffer scratch;
  bool ready = false;
};

void RunBlas(benchmark::State& state, BlasCase* c) {
  const Shape& s = c->shape;
  ShapeData& d = DataFor(s);
  const BlasShape bs = BlasShapeOf(s);
  const size_t per_worker = BlasScratchFloats(bs);
  if (!c->ready) {
    c->scratch = AllocFloats(per_worker * c->workers);
    ComputeExpected(s, d);
  }
  BlasRun run{&s,        bs,          d.q.get(),        d.k.get(),
              d.v.get(), d.out.get(), c->scratch.get(), per_worker};
  qkv_test::ThreadPool& pool = Pool(c->workers);
  const size_t tasks = size_t(s.batch * s.heads);
  if (!c->ready) {
    pool.Run(tasks, &BlasRun::Task, &run);  // warm-up, untimed
    c->ready = true;
  }
  for (auto _ : state) {
    pool.Run(tasks, &BlasRun::Task, &run);
    benchmark::ClobberMemory();
  }
  SetCounters(state, s, 0.0);
  if (c->workers == 2) {
    state.counters["machine"] = MachineFor(s, "openblas_3step");
  }
}

// ---------------------------------------------------------------- backward
// Inputs and outputs of qkv_attention_backward_f32 on one shape, shared by
// its benchmarks (the backward_f32 rows, their paired ratios and scaling),
// made on first use: out and lse from one forward call on the default
// backend, d_out uniform in [-1, 1], and the OpenBLAS baseline's gradients
// (BlasAttentionBackwardHead) that every implementation's first call is
// checked against (the counter max_err).
struct BackwardData {
  Buffer out, lse, d_out;
  Buffer grad[3];      // d_q, d_k, d_v: what the timed calls write
  Buffer expected[3];  // the baseline's d_q, d_k, d_v
  float max_abs[3] = {0, 0, 0};
  bool have_expected = false;
  qkv_status forward_status = QKV_OK;

  size_t GradFloats(const Shape& s, int i) const {
    return i == 0 ? s.QFloats() : i == 1 ? s.KFloats() : s.VFloats();
  }
};

BackwardData& BackwardDataFor(const Shape& s) {
  static std::map<std::string, std::unique_ptr<BackwardData>> cache;
  std::unique_ptr<BackwardData>& slot = cache[s.name];
  if (slot) return *slot;
  slot.reset(new BackwardData);
  BackwardData& g = *slot;
  ShapeData& d = DataFor(s);
  std::mt19937 rng(54321);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  g.out = AllocFloats(s.OutFloats());
  g.lse = AllocFloats(size_t(s.batch * s.heads * s.q_len));
  g.d_out = AllocFloats(s.OutFloats());
  for (size_t i = 0; i < s.OutFloats(); ++i) g.d_out.get()[i] = dist(rng);
  for (int i = 0; i < 3; ++i) g.grad[i] = AllocFloats(g.GradFloats(s, i));
  // The training step's forward call: out and lse as the backward pass
  // receives them.
  qkv_attention_desc desc = DescFor(s, d, nullptr, 0);
  const size_t bytes = qkv_attention_workspace_size(&desc);
  Buffer ws = AllocFloats((bytes + 3) / 4);
  g.forward_status =
      qkv_attention_f32(&desc, d.q.get(), d.k.get(), d.v.get(), g.out.get(),
                        nullptr, g.lse.get(), ws.get(), bytes);
  return g;
}

// The baseline's backward pass over all heads; heads are tasks of our pool,
// as for the three-step forward.
struct BlasBackwardRun {
  const Shape* shape;
  BlasShape bs;
  const float *q, *k, *v, *out, *lse, *d_out;
  float *d_q, *d_k, *d_v;
  float* scratch;  // one BlasBackwardScratchFloats per worker
  size_t scratch_floats;

  static void Task(void* arg, size_t task, size_t worker) {
    const BlasBackwardRun& r = *static_cast<const BlasBackwardRun*>(arg);
    const Shape& s = *r.shape;
    const size_t t = task;
    const size_t qd = size_t(s.q_len * s.head_dim);
    const size_t kd = size_t(s.kv_len * s.head_dim);
    const size_t vd = size_t(s.kv_len * s.value_dim());
    const size_t od = size_t(s.q_len * s.value_dim());
    BlasAttentionBackwardHead(
        r.bs, r.q + t * qd, r.k + t * kd, r.v + t * vd, r.out + t * od,
        r.lse + t * size_t(s.q_len), r.d_out + t * od, r.d_q + t * qd,
        r.d_k + t * kd, r.d_v + t * vd, r.scratch + worker * r.scratch_floats);
  }

  // The run writing `grad` (d_q, d_k, d_v) with `scratch`.
  static BlasBackwardRun Of(const Shape& s, const BackwardData& g,
                            float* const grad[3], float* scratch) {
    const ShapeData& d = DataFor(s);
    const BlasShape bs = BlasShapeOf(s);
    BlasBackwardRun run;
    run.shape = &s;
    run.bs = bs;
    run.q = d.q.get();
    run.k = d.k.get();
    run.v = d.v.get();
    run.out = g.out.get();
    run.lse = g.lse.get();
    run.d_out = g.d_out.get();
    run.d_q = grad[0];
    run.d_k = grad[1];
    run.d_v = grad[2];
    run.scratch = scratch;
    run.scratch_floats = BlasBackwardScratchFloats(bs);
    return run;
  }
};

void ComputeBackwardExpected(const Shape& s, BackwardData& g) {
  if (g.have_expected || !BlasAvailable() || s.score != QKV_SCORE_DOT ||
      g.forward_status != QKV_OK) {
    return;
  }
  float* grad[3];
  for (int i = 0; i < 3; ++i) {
    g.expected[i] = AllocFloats(g.GradFloats(s, i));
    grad[i] = g.expected[i].get();
  }
  Buffer scratch = AllocFloats(BlasBackwardScratchFloats(BlasShapeOf(s)));
  BlasBackwardRun run = BlasBackwardRun::Of(s, g, grad, scratch.get());
  for (size_t t = 0; t < size_t(s.batch * s.heads); ++t) {
    BlasBackwardRun::Task(&run, t, 0);
  }
  for (int i = 0; i < 3; ++i) {
    for (size_t j = 0; j < g.GradFloats(s, i); ++j) {
      g.max_abs[i] = std::max(g.max_abs[i], std::fabs(grad[i][j]));
    }
  }
  g.have_expected = true;
}

// max over d_q, d_k, d_v of max |grad - baseline grad| / max |baseline grad|
// (the accuracy the header promises is 1e-3 of that); -1 without a baseline.
double BackwardMaxErr(const Shape& s, const BackwardData& g,
                      float* const grad[3]) {
  if (!g.have_expected) return -1.0;
  double worst = 0.0;
  for (int i = 0; i < 3; ++i) {
    double err = 0.0;
    for (size_t j = 0; j < g.GradFloats(s, i); ++j) {
      const double e =
          std::fabs(double(grad[i][j]) - double(g.expected[i].get()[j]));
      if (!(e <= err)) err = e;  // NaN sticks
    }
    if (g.max_abs[i] > 0) err /= g.max_abs[i];
    if (!(err <= worst)) worst = err;
  }
  return worst;
}

std::vector<Shape> Shapes() {
  std::vector<Shape> v = {
      {"S1_decode", 1, 32, 1, 4096, 128, false, Kind::kMain},
      {"S2_prefill", 1, 8, 1024, 1024, 64, true, Kind::kMain},
      {"S3_small", 1, 4, 128, 128, 64, false, Kind::kMain},
      {"S4_toy", 1, 1, 4, 4, 2, false, Kind::kMain},
  };
  // Decoding with 8 query heads per kv head (Llama-3-70B's ratio): 64 query
  // heads over 8 kv heads, S1's cache size per kv head.
  Shape gqa8 = {"S1_gqa8_decode", 1, 64, 1, 4096, 128, false, Kind::kMain};
  gqa8.kv_heads = 8;
  v.insert(v.begin() + 1, gqa8);
  // The other score kinds on S3's shape: the default backend and the
  // reference (the 3-step baseline has no counterpart).
  Shape gaussian = {"S3_gaussian", 1, 4, 128, 128, 64, false, Kind::kScoreKind};
  gaussian.score = QKV_SCORE_GAUSSIAN;
  v.push_back(gaussian);
  Shape additive = {"S3_additive_h64", 1,     4, 128, 128, 64,
                    false,             Kind::kScoreKind};
  additive.score = QKV_SCORE_ADDITIVE;
  additive.hidden = 64;
  v.push_back(additive);
  for (int64_t kv = 128; kv <= 16384; kv *= 2) {
    v.push_back({"sweep_kv" + std::to_string(kv), 1, 4, 128, kv, 64, false,
                 Kind::kKvSweep});
  }
  for (int64_t d : {32, 64, 80, 128, 256}) {
    v.push_back({"sweep_d" + std::to_string(d), 1, 4, 512, 512, d, false,
                 Kind::kDimSweep});
  }
  return v;
}

// The scalar reference is slow on the big shapes: one call per repetition and
// three repetitions (the median still exists) instead of the command line's.
constexpr double kSlowReferenceFlops = 5e7;
// On the sweeps the reference and the scalar SIMD targets run only up to this
// many FLOPs per call (about 0.1 s for them).
constexpr double kReferenceMaxFlops = 2e8;
// The sweeps' shorter runs.
constexpr double kSweepMinTime = 0.1;
constexpr int kSweepRepetitions = 3;

// Backends with no SIMD: as slow as the reference.
bool IsScalarBackend(const std::string& name) {
  return name == "reference" || name.find("SCALAR") != std::string::npos ||
         name.find("EMU128") != std::string::npos ||
         name.find("scalar") != std::string::npos;
}

// ---------------------------------------------------------------- limits

// Steps of the multiply-add loop per thread and iteration: a few ms on every
// target, so waking the second thread costs nothing in comparison.
constexpr int64_t kPeakSteps = int64_t{1} << 20;
// Read at run time, so the compiler cannot fold the loop.
volatile float g_peak_m = 0.999f;
volatile float g_peak_a = 0.001f;

struct PeakRun {
  PeakTarget target;
  float m, a;
  float sink[4];

  static void Task(void* arg, size_t task, size_t /*worker*/) {
    PeakRun& r = *static_cast<PeakRun*>(arg);
    r.sink[task] = r.target.run(kPeakSteps, r.m, r.a);
  }
};

void RunPeak(benchmark::State& state, PeakTarget target, size_t threads) {
  PeakRun run{target, g_peak_m, g_peak_a, {0, 0, 0, 0}};
  qkv_test::ThreadPool& pool = Pool(threads);
  // The first limit measured pays for an idle machine's low clock (the
  // first AVX-512 peak came out 15% low): half a second of the same loop on
  // every core before it.
  static bool warmed = false;
  if (!warmed) {
    warmed = true;
    PeakRun warm = run;
    qkv_test::ThreadPool& all = Pool(2);
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while (std::chrono::steady_clock::now() < until) {
      all.Run(2, &PeakRun::Task, &warm);
    }
  }
  pool.Run(threads, &PeakRun::Task, &run);  // warm-up: wakes the pool
  for (auto _ : state) {
    pool.Run(threads, &PeakRun::Task, &run);
    benchmark::DoNotOptimize(run.sink);
  }
  state.counters["flop"] = benchmark::Counter(
      target.FlopsPerStep() * double(kPeakSteps) * double(threads) *
          double(state.iterations()),
      benchmark::Counter::kIsRate);
}

// The streaming read: 256 MiB, well past L2 (and most of any L3 share), in
// chunks handed out to the pool's threads.
constexpr size_t kStreamFloats = (size_t{256} << 20) / sizeof(float);
constexpr size_t kStreamChunks = 64;

const float* StreamBuffer() {
  static Buffer buffer;
  if (!buffer) {
    buffer = AllocFloats(kStreamFloats);
    // Written, not just zeroed pages: every page is backed by its own memory.
    for (size_t i = 0; i < kStreamFloats; ++i) buffer.get()[i] = 1.0f;
  }
  return buffer.get();
}

struct StreamRun {
  const float* p;
  float sink[kStreamChunks];

  static void Task(void* arg, size_t task, size_t /*worker*/) {
    StreamRun& r = *static_cast<StreamRun*>(arg);
    constexpr size_t kChunk = kStreamFloats / kStreamChunks;
    r.sink[task] = StreamSum(r.p + task * kChunk, kChunk);
  }
};

void RunStream(benchmark::State& state, size_t threads) {
  StreamRun run;
  run.p = StreamBuffer();
  qkv_test::ThreadPool& pool = Pool(threads);
  pool.Run(kStreamChunks, &StreamRun::Task, &run);  // warm-up
  for (auto _ : state) {
    pool.Run(kStreamChunks, &StreamRun::Task, &run);
    benchmark::DoNotOptimize(run.sink);
  }
  state.counters["bytes"] = benchmark::Counter(
      double(kStreamFloats * sizeof(float)) * double(state.iterations()),
      benchmark::Counter::kIsRate);
}

void RegisterLimits() {
  PeakTarget targets[16];
  const size_t n = PeakTargets(targets, 16);
  for (size_t threads : {size_t(1), size_t(2)}) {
    for (size_t i = 0; i < n; ++i) {
      const std::string name = std::string("limits/fma_peak/") +
                               targets[i].name +
                               "/threads:" + std::to_string(threads);
      benchmark::RegisterBenchmark(name.c_str(), RunPeak, targets[i], threads)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
    const std::string name =
        "limits/stream_read/256MiB/threads:" + std::to_string(threads);
    benchmark::RegisterBenchmark(name.c_str(), RunStream, threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

// ---------------------------------------------------------------- scaling
// Two workers against one, and against what this machine gives two threads
// for the same work. The VM this suite was written on does not always give
// its two vCPUs two cores' worth: for seconds at a time one of them runs a
// 1-worker S3 call 20-40% slower than the other (while the FMA-peak loop
// still scales 2.0x: it is the caches or memory a neighbour shares, not the
// multiply-add units), and any 2-worker figure measured then is low
// whatever the code does. So the baseline for a 2-worker time is two
// independent copies of the 1-worker call, one on each of the pool's two
// threads at the same time (own output and workspace, the same inputs):
//   machine = t1 / t_a + t1 / t_b
// where t1 is a 1-worker call alone and t_a, t_b the copies' times side by
// side: the throughput of two threads doing this work with nothing shared
// but the inputs, in units of one thread's (2.0: two full cores). A
// parallel split cannot beat it by much and should come close.
//
// scaling/<shape>/<implementation> measures rounds of the shape on 1 worker
// then as two copies, and on 2 workers, each about kSliceMicros; the
// 2-worker slice goes last and first in turn. Counters, medians over the rounds:
//   speedup       t(1 worker) / t(2 workers)
//   machine       the two copies' throughput as above
//   efficiency    speedup / machine, round by round
//   speedup_full  speedup over the rounds with machine >= kFullMachine
//   full_rounds, rounds, us_1w, us_2w
constexpr int kScalingRounds = 100;
constexpr double kSliceMicros = 400.0;
constexpr double kFullMachine = 1.9;

double Median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double MicrosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now() - t0)
      .count();
}

// Wakes the pool's threads before a timed slice: after a 1-thread slice
// they are asleep (see thread_pool.h), and a futex wake-up (tens of
// microseconds here) is not what is being measured.
void Wake(size_t threads) {
  Pool(threads).Run(threads, [](void*, size_t, size_t) {}, nullptr);
}

// One implementation on one shape, callable on 1 worker, 2 workers, or as
// copy 0 or 1 of the 1-worker call (own workspace and output).
struct ScalingCase {
  Shape shape;
  std::string impl;  // a backend name, "openblas_3step" or "openblas_5gemm"
  // The backward pass (qkv_attention_backward_f32, or the baseline's) in
  // place of the forward call; its inputs from BackwardDataFor.
  bool backward = false;
  // [0], [1]: the copies' 1-worker workspaces (BLAS: scratch); [2]: the
  // 2-worker one. The 1-worker call is copy 0.
  Buffer ws[3];
  size_t ws_bytes[3] = {0, 0, 0};
  Buffer copy_out;      // copy 1's output (copy 0 writes the shape's own)
  Buffer copy_grad[3];  // backward: copy 1's d_q, d_k, d_v
  qkv_attention_desc one = {}, two = {};
  bool ready = false;
  bool ok = true;

  bool blas() const {
    return impl == "openblas_3step" || impl == "openblas_5gemm";
  }

  void Prepare() {
    ShapeData& d = DataFor(shape);
    copy_out = AllocFloats(shape.OutFloats());
    if (backward) {
      const BackwardData& g = BackwardDataFor(shape);
      for (int i = 0; i < 3; ++i) {
        copy_grad[i] = AllocFloats(g.GradFloats(shape, i));
      }
    }
    if (blas()) {
      const BlasShape bs = BlasShapeOf(shape);
      const size_t scratch =
          backward ? BlasBackwardScratchFloats(bs) : BlasScratchFloats(bs);
      ws[0] = AllocFloats(scratch);
      ws[1] = AllocFloats(scratch);
      ws[2] = AllocFloats(scratch * 2);
    } else {
      one = DescFor(shape, d, impl.c_str(), 0);
      two = DescFor(shape, d, impl.c_str(), 2);
      for (size_t i = 0; i < 3; ++i) {
        const qkv_attention_desc* desc = i < 2 ? &one : &two;
        ws_bytes[i] = backward ? qkv_attention_backward_workspace_size(desc)
                               : qkv_attention_workspace_size(desc);
        if (ws_bytes[i] > 0) ws[i] = AllocFloats((ws_bytes[i] + 3) / 4);
      }
    }
    ready = true;
  }

  // A baseline's per-head task over every head: on the 2-worker pool for
  // slot 2, else inline.
  template <class Run>
  void OverHeads(size_t slot, Run* run) {
    const size_t heads = size_t(shape.batch * shape.heads);
    if (slot == 2) {
      Pool(2).Run(heads, &Run::Task, run);
    } else {
      for (size_t t = 0; t < heads; ++t) Run::Task(run, t, 0);
    }
  }

  void CallBackward(size_t slot) {
    ShapeData& d = DataFor(shape);
    BackwardData& g = BackwardDataFor(shape);
    float* grad[3];
    for (int i = 0; i < 3; ++i) {
      grad[i] = slot == 1 ? copy_grad[i].get() : g.grad[i].get();
    }
    if (blas()) {
      BlasBackwardRun run = BlasBackwardRun::Of(shape, g, grad, ws[slot].get());
      OverHeads(slot, &run);
      return;
    }
    const qkv_attention_desc* desc = slot == 2 ? &two : &one;
    ok = ok && qkv_attention_backward_f32(
                   desc, d.q.get(), d.k.get(), d.v.get(), g.out.get(),
                   g.lse.get(), g.d_out.get(), grad[0], grad[1], grad[2],
                   ws[slot].get(), ws_bytes[slot]) == QKV_OK;
  }

  // slot 0 or 1: that copy of the 1-worker call; 2: the 2-worker call.
  void Call(size_t slot) {
    if (backward) {
      CallBackward(slot);
      return;
    }
    ShapeData& d = DataFor(shape);
    float* out = slot == 1 ? copy_out.get() : d.out.get();
    if (blas()) {
      const BlasShape bs = BlasShapeOf(shape);
      BlasRun run{&shape,    bs,  d.q.get(),      d.k.get(),
                  d.v.get(), out, ws[slot].get(), BlasScratchFloats(bs)};
      OverHeads(slot, &run);
      return;
    }
    const qkv_attention_desc* desc = slot == 2 ? &two : &one;
    ok = ok && qkv_attention_f32(desc, d.q.get(), d.k.get(), d.v.get(), out,
                                 nullptr, nullptr, ws[slot].get(),
                                 ws_bytes[slot]) == QKV_OK;
  }

  // Microseconds of `calls` calls in `slot`, after one untimed call: the
  // slice before left the caches as another slot uses them (the 1-worker
  // call's output lines in the caller's core, say), and a caller's steady
  // stream of calls in one configuration is what is being measured.
  double Time(size_t slot, int calls) {
    if (slot == 2) Wake(2);
    Call(slot);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) Call(slot);
    return MicrosSince(t0);
  }

  // The two copies side by side, `calls` calls each: their times, or false
  // when one thread ran both (the pool thread was not there in time).
  bool Copies(int calls, double* t_a, double* t_b) {
    struct Run {
      ScalingCase* c;
      int calls;
      double us[2];
      size_t worker[2];
      static void Task(void* arg, size_t task, size_t worker) {
        Run& r = *static_cast<Run*>(arg);
        r.worker[task] = worker;
        r.us[task] = r.c->Time(task, r.calls);
      }
    } run{this, calls, {0, 0}, {0, 0}};
    Wake(2);
    Pool(2).Run(2, &Run::Task, &run);
    *t_a = run.us[0];
    *t_b = run.us[1];
    return run.worker[0] != run.worker[1];
  }

  // Calls per slice: enough for kSliceMicros at one worker.
  int CallsPerSlice() {
    if (!ready) Prepare();
    Call(0);
    Call(1);
    Call(2);
    const double one_call = Time(0, 1);
    return std::max(1, int(std::ceil(kSliceMicros / one_call)));
  }

  // The 1-worker slice (its time in *t1), then the two copies: the round's
  // machine figure (NaN when a copy did not get its thread).
  double Machine(int calls, double* t1) {
    *t1 = Time(0, calls);
    double a, b;
    if (!Copies(calls, &a, &b)) return std::nan("");
    return *t1 / a + *t1 / b;
  }
};

// The ScalingCase of (shape, implementation, direction), made on first use.
ScalingCase* ScalingCaseFor(const Shape& s, const std::string& impl,
                            bool backward = false) {
  static std::map<std::string, std::unique_ptr<ScalingCase>> cases;
  std::unique_ptr<ScalingCase>& c =
      cases[s.name + "/" + impl + (backward ? "/backward" : "")];
  if (!c) {
    c.reset(new ScalingCase);
    c->shape = s;
    c->impl = impl;
    c->backward = backward;
  }
  return c.get();
}

// The spot check after a 2-worker benchmark's timing loop: rounds of (the
// 1-worker call, the two copies) for at least kMachineCheckMicros and three
// rounds, at most fifteen; the median. NaN for calls too small to split
// (they run inline whatever the pool: S4) or when it failed.
constexpr double kMachineCheckMicros = 20000.0;
constexpr double kMachineMinFlops = 1e6;

double MachineFor(const Shape& s, const std::string& impl, bool backward) {
  if (s.Flops() < kMachineMinFlops) return std::nan("");
  ScalingCase* c = ScalingCaseFor(s, impl, backward);
  const int calls = c->CallsPerSlice();
  std::vector<double> m;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < 15; ++r) {
    if (r >= 3 && MicrosSince(t0) >= kMachineCheckMicros) break;
    double t1;
    const double x = c->Machine(calls, &t1);
    if (x == x) m.push_back(x);
  }
  return c->ok ? Median(m) : std::nan("");
}

void RunScaling(benchmark::State& state, ScalingCase* c) {
  const int calls = c->CallsPerSlice();
  std::vector<double> speedup, machine, efficiency, full, t1s, t2s;
  for (auto _ : state) {
    for (int r = 0; r < kScalingRounds; ++r) {
      double t1, t2, m;
      if (r % 2 == 0) {
        m = c->Machine(calls, &t1);
        t2 = c->Time(2, calls);
      } else {
        t2 = c->Time(2, calls);
        m = c->Machine(calls, &t1);
      }
      speedup.push_back(t1 / t2);
      t1s.push_back(t1 / calls);
      t2s.push_back(t2 / calls);
      if (m == m) {
        machine.push_back(m);
        efficiency.push_back(speedup.back() / m);
        if (m >= kFullMachine) full.push_back(speedup.back());
      }
    }
  }
  if (!c->ok) {
    state.SkipWithError(c->backward ? "qkv_attention_backward_f32 failed"
                                    : "qkv_attention_f32 failed");
    return;
  }
  state.counters["speedup"] = Median(speedup);
  state.counters["machine"] = Median(machine);
  state.counters["efficiency"] = Median(efficiency);
  state.counters["speedup_full"] = Median(full);
  state.counters["full_rounds"] = double(full.size());
  state.counters["rounds"] = double(speedup.size());
  state.counters["us_1w"] = Median(t1s);
  state.counters["us_2w"] = Median(t2s);
}

void RegisterScaling(const std::vector<std::string>& backends, bool blas) {
  for (const Shape& s : Shapes()) {
    if (s.name != "S2_prefill" && s.name != "S3_small") continue;
    std::vector<std::string> impls;
    // Each engine's best backend (the first of its name in the list).
    for (const std::string& be : backends) {
      if (IsScalarBackend(be)) continue;
      const std::string engine = be.substr(0, be.find(':'));
      bool first = true;
      for (const std::string& seen : impls) {
        first = first && seen.substr(0, seen.find(':')) != engine;
      }
      if (first) impls.push_back(be);
    }
    if (blas) impls.push_back("openblas_3step");
    for (const std::string& impl : impls) {
      const std::string name = "scaling/" + s.name + "/" + impl;
      benchmark::RegisterBenchmark(name.c_str(), RunScaling,
                                   ScalingCaseFor(s, impl))
          ->UseRealTime()
          ->Iterations(1)
          ->Repetitions(1)
          ->Unit(benchmark::kMillisecond);
    }
  }
}

// ---------------------------------------------------------------- merge
// qkv_attention_merge_f32 as a streaming pass: b := merge(a, b) over `rows`
// rows of value_dim floats. bytes/s counts one out buffer (rows *
// value_dim * 4 bytes) per call, the measure; the pass reads two
// and writes one. 2048 rows of 128 (32 heads x 64 queries, 1 MiB per
// buffer) stay in L2/L3; 65536 rows (32 MiB) stream from memory.
void RunMerge(benchmark::State& state, int64_t rows, int64_t value_dim) {
  const size_t n = static_cast<size_t>(rows * value_dim);
  Buffer out_a = AllocFloats(n), out_b = AllocFloats(n);
  Buffer lse_a = AllocFloats(rows), lse_b = AllocFloats(rows);
  uint32_t x = 12345;
  auto next = [&x] {
    x = x * 1664525u + 1013904223u;
    return static_cast<float>(x >> 8) * (1.0f / 16777216.0f) - 0.5f;
  };
  for (size_t i = 0; i < n; ++i) {
    out_a.get()[i] = next();
    out_b.get()[i] = next();
  }
  for (int64_t r = 0; r < rows; ++r) {
    lse_a.get()[r] = 20.0f * next();
    lse_b.get()[r] = 20.0f * next();
  }
  for (auto _ : state) {
    if (qkv_attention_merge_f32(rows, value_dim, out_a.get(), lse_a.get(),
                                out_b.get(), lse_b.get()) != QKV_OK) {
      state.SkipWithError("qkv_attention_merge_f32 failed");
      break;
    }
    benchmark::ClobberMemory();
  }
  state.counters["bytes"] = benchmark::Counter(
      double(n * sizeof(float)) * double(state.iterations()),
      benchmark::Counter::kIsRate);
}

void RegisterMerge() {
  const int64_t shapes[][2] = {{2048, 64}, {2048, 128}, {65536, 128}};
  for (const auto& s : shapes) {
    const std::string name = "merge_f32/rows:" + std::to_string(s[0]) +
                             "/value_dim:" + std::to_string(s[1]);
    benchmark::RegisterBenchmark(name.c_str(), RunMerge, s[0], s[1])
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
}

// ---------------------------------------------------------------- kv error
// What storing K and V in low precision costs the result, not timed:
//   kv_error/<cache>/<dtype>
// one S1-shaped decoding step (32 heads, 4096 keys, d 128) on the default
// backend with K and V quantized by qkv_quantize_rows, against the same
// call on the f32 cache, for two caches:
//   random        q, k, v uniform in [-1, 1] (the suite's data: nearly flat
//                 attention)
//   llm_like      what trained models' caches look like: keys N(0, 1) with
//                 4 outlier channels per head at 12x (the channels int8 per
//                 token suffers from), queries aligned with a few keys so
//                 that attention is peaked, values N(0, 1) with the first
//                 token 10x (an attention sink)
// Counters: out_max (max |out - f32 out| / max |v|), out_rms (rms of
// out - f32 out / rms of f32 out), weights_max (max |weights - f32
// weights|).
struct KvErrorCase {
  std::string cache;
  qkv_dtype dtype;
};

void RunKvError(benchmark::State& state, KvErrorCase c) {
  const int64_t heads = 32, lk = 4096, d = 128;
  std::mt19937 rng(777);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const bool llm = c.cache == "llm_like";
  std::vector<float> q(size_t(heads * d)), k(size_t(heads * lk * d)),
      v(size_t(heads * lk * d));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < lk; ++j) {
      for (int64_t t = 0; t < d; ++t) {
        const size_t at = size_t((h * lk + j) * d + t);
        if (llm) {
          const bool outlier = (t * 7 + h) % 32 == 0;  // 4 of 128 channels
          k[at] = gauss(rng) * (outlier ? 12.0f : 1.0f);
          v[at] = gauss(rng) * (j == 0 ? 10.0f : 1.0f);
        } else {
          k[at] = uni(rng);
          v[at] = uni(rng);
        }
      }
    }
    for (int64_t t = 0; t < d; ++t) {
      float x = llm ? 0.0f : uni(rng);
      if (llm) {  // the sum of 3 random keys: a few keys stand out
        for (int64_t n = 0; n < 3; ++n) {
          x += k[size_t((h * lk + (n * 997 + h * 31) % lk) * d + t)] / 3.0f;
        }
      }
      q[size_t(h * d + t)] = x;
    }
  }
  qkv_attention_desc desc;
  qkv_attention_desc_init(&desc, 1, heads, heads, 1, lk, d, d);
  std::vector<float> out0(size_t(heads * d)), w0(size_t(heads * lk));
  std::vector<float> out1(out0.size()), w1(w0.size());
  std::vector<unsigned char> ws(qkv_attention_workspace_size(&desc) + 65536);
  qkv_status st = qkv_attention(&desc, q.data(), k.data(), v.data(),
                                out0.data(), w0.data(), nullptr, ws.data(),
                                ws.size());
  const size_t e = c.dtype == QKV_DTYPE_I8 ? 1 : 2;
  std::vector<unsigned char> kq(k.size() * e), vq(v.size() * e);
  std::vector<float> ks(size_t(heads * lk)), vs(size_t(heads * lk));
  if (st == QKV_OK) {
    st = qkv_quantize_rows(c.dtype, heads * lk, d, k.data(), d, kq.data(), d,
                           ks.data());
  }
  if (st == QKV_OK) {
    st = qkv_quantize_rows(c.dtype, heads * lk, d, v.data(), d, vq.data(), d,
                           vs.data());
  }
  desc.kv_dtype = c.dtype;
  if (c.dtype == QKV_DTYPE_I8) {
    desc.k_scales = ks.data();
    desc.v_scales = vs.data();
  }
  ws.resize(qkv_attention_workspace_size(&desc));
  for (auto _ : state) {
    if (st == QKV_OK) {
      st = qkv_attention(&desc, q.data(), kq.data(), vq.data(), out1.data(),
                         w1.data(), nullptr, ws.data(), ws.size());
    }
  }
  if (st != QKV_OK) {
    state.SkipWithError(qkv_status_string(st));
    return;
  }
  double max_v = 0, out_max = 0, num = 0, den = 0, w_max = 0;
  for (float x : v) max_v = std::max(max_v, double(std::fabs(x)));
  for (size_t i = 0; i < out0.size(); ++i) {
    const double diff = double(out1[i]) - double(out0[i]);
    out_max = std::max(out_max, std::fabs(diff));
    num += diff * diff;
    den += double(out0[i]) * double(out0[i]);
  }
  for (size_t i = 0; i < w0.size(); ++i) {
    w_max = std::max(w_max, std::fabs(double(w1[i]) - double(w0[i])));
  }
  state.counters["out_max"] = out_max / max_v;
  state.counters["out_rms"] = std::sqrt(num / den);
  state.counters["weights_max"] = w_max;
}

void RegisterKvError() {
  for (const char* cache : {"random", "llm_like"}) {
    for (const auto& t : {std::make_pair("f16", QKV_DTYPE_F16),
                          std::make_pair("bf16", QKV_DTYPE_BF16),
                          std::make_pair("int8", QKV_DTYPE_I8)}) {
      const std::string name =
          std::string("kv_error/") + cache + "/" + t.first;
      benchmark::RegisterBenchmark(name.c_str(), RunKvError,
                                   KvErrorCase{cache, t.second})
          ->Iterations(1)
          ->Repetitions(1)
          ->Unit(benchmark::kMillisecond);
    }
  }
}

// ---------------------------------------------------------------- vs plain
// The 0.2 variants and layouts, each against the same call without them, on
// the default backend (qkv_backend()) with one worker:
//   vs_plain/<shape>/<variant>/<backend>
// with
//   causal_4096/window_left255   causal 4096 x 4096, 4 heads, d 64, with
//       QKV_MASK_WINDOW, window_left 255, window_right -1 (each query sees
//       its last 256 keys), against the same call causal only
//   S2_prefill/alibi, sinks, softcap50   S2 with alibi_slopes (the ALiBi
//       paper's 2^(-8 (h + 1) / heads)), sinks (a finite one per head) or
//       softcap 50 (Gemma 2's), against S2
//   S1_decode, S2_prefill, S3_small / token_major   q, k, v and out
//       token-major ([batch][token][heads][dim], given as strides), against
//       the dense call on the same values
//   S1_decode, S2_prefill / f16, bf16, int8   K and V stored as F16, BF16
//       or I8 (qkv_quantize_rows; qkv_attention), against the f32 call:
//       the low-precision caches' speed-up is 1 / ratio, and max_diff what
//       quantizing cost the output
//   S1_decode, S1_gqa8_decode / huge_pages   K and V copied to buffers on
//       2 MiB pages (AllocHugeFloats), against the same call on ordinary
//       aligned_alloc memory (4 KiB pages); huge_frac says how much of the
//       copy the kernel backed with huge pages
//   S1_decode, S2_prefill, S3_small / padded_cache   K and V in a cache of
//       capacity 1.5 x kv_len ([batch][heads][capacity][dim], strides), q
//       and out dense, against the dense call; the spare rows hold NaN, so
//       a read of one would show in max_diff
// The VM's speed drifts by up to 30% over minutes (bench/README.md), more
// than a 5% target, so the two calls are timed paired, like the scaling
// section: rounds of a plain slice and a variant slice, in alternating
// order, each slice at least kPairedSliceMicros of calls. The layouts read
// other buffers than the plain call, so there each slice starts with one
// untimed call: each side finds its own data in the caches, as it would in
// a stream of calls. A repetition is at least kPairedMinRounds rounds and
// kPairedMicros; kPairedRepetitions of them whatever the command line says.
// Counters, medians over a repetition's rounds:
//   ratio                 variant time / plain time, round by round
//   us_plain, us_variant  per call
//   max_diff              layouts and element types: max |out - plain out|
//                         / max |v| (0: the same bits); -1 for the others,
//                         which compute something else
//   kv_gbs_plain, kv_gbs  bytes of K and V (and I8 scales) each side reads
//                         per call over its time, GB/s
//   read_frac             S1 element types and huge_pages: kv_gbs over a
//                         streaming read (StreamSum of 128 MiB; for
//                         huge_pages a buffer on huge pages too) timed in
//                         the same round, so that the VM's drift cancels
//   read_frac_plain       the same for the plain side (its read on
//                         ordinary memory)
//   huge_frac             huge_pages: the share of K and V on huge pages
//   rounds
constexpr double kPairedSliceMicros = 2000.0;
constexpr double kPairedMicros = 400000.0;
constexpr int kPairedMinRounds = 5;
constexpr int kPairedRepetitions = 3;

// Strides of a [batch][heads][len][dim] array laid out token-major.
qkv_strides TokenMajor(int64_t heads, int64_t len, int64_t dim) {
  return qkv_strides{len * heads * dim, dim, heads * dim};
}

// Strides of a [batch][heads][len][dim] array in a cache of `capacity` rows.
qkv_strides Padded(int64_t heads, int64_t capacity, int64_t dim) {
  return qkv_strides{heads * capacity * dim, capacity * dim, dim};
}

// Offset of element (b, h, t, c) under strides st (all non-zero).
size_t At(const qkv_strides& st, int64_t b, int64_t h, int64_t t, int64_t c) {
  return size_t(b * st.batch + h * st.head + t * st.token + c);
}

// The dense [batch][heads][len][dim] array `dense` copied to strides st; the
// elements the strides do not reach hold NaN.
Buffer Restride(const float* dense, int64_t batch, int64_t heads, int64_t len,
                int64_t dim, const qkv_strides& st) {
  const size_t extent = At(st, batch - 1, heads - 1, len - 1, dim);
  Buffer out = AllocFloats(extent);
  std::fill(out.get(), out.get() + extent, std::nanf(""));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t t = 0; t < len; ++t) {
        std::memcpy(out.get() + At(st, b, h, t, 0),
                    dense + ((b * heads + h) * len + t) * dim,
                    sizeof(float) * size_t(dim));
      }
    }
  }
  return out;
}

// One (shape, variant) pair on one backend; side 0 is the plain call, side 1
// the variant.
struct PairedCase {
  Shape shape;
  std::string variant;
  std::string backend;
  std::vector<float> per_head;  // ALiBi slopes or sinks
  Buffer q, k, v, out;          // layouts: the inputs and output restrided
  Buffer k_scales, v_scales;    // int8: the rows' scales
  Buffer stream;                // decoding: the read-limit buffer
  Buffer stream_v;              // huge_pages: the variant's, on huge pages
  size_t stream_floats = 0;
  bool layout = false;
  bool reads = false;           // decoding: time the read limit too
  double huge_frac = -1.0;      // huge_pages: how much of K, V got them
  double kv_bytes[2] = {0, 0};  // K and V bytes each side reads per call
  qkv_attention_desc desc[2] = {};
  const float *q_of[2] = {}, *k_of[2] = {}, *v_of[2] = {};
  float* out_of[2] = {};
  Buffer ws[2];
  size_t ws_bytes[2] = {0, 0};
  int calls[2] = {1, 1};  // per slice
  bool ready = false;
  bool ok = true;
  std::string error;  // why the first call of a side failed
  double max_diff = -1.0;

  void Prepare() {
    ready = true;
    const Shape& s = shape;
    ShapeData& d = DataFor(s);
    for (int side = 0; side < 2; ++side) {
      desc[side] = DescFor(s, d, backend.c_str(), 1);
      q_of[side] = d.q.get();
      k_of[side] = d.k.get();
      v_of[side] = d.v.get();
      out_of[side] = d.out.get();
    }
    qkv_attention_desc& x = desc[1];
    if (variant == "window_left255") {
      x.mask |= QKV_MASK_WINDOW;
      x.window_left = 255;
      x.window_right = -1;
    } else if (variant == "alibi" || variant == "sinks") {
      for (int64_t h = 0; h < s.heads; ++h) {
        per_head.push_back(variant == "alibi"
                               ? std::exp2(-8.0f * float(h + 1) / float(s.heads))
                               : 0.5f * float(h) - 1.0f);
      }
      if (variant == "alibi") {
        x.alibi_slopes = per_head.data();
      } else {
        x.sinks = per_head.data();
      }
    } else if (variant == "softcap50") {
      x.softcap = 50.0f;
    } else if (variant == "token_major" || variant == "padded_cache") {
      layout = true;
      const int64_t dv = s.value_dim();
      if (variant == "token_major") {
        x.q_strides = TokenMajor(s.heads, s.q_len, s.head_dim);
        x.k_strides = TokenMajor(s.heads, s.kv_len, s.head_dim);
        x.v_strides = TokenMajor(s.heads, s.kv_len, dv);
        x.out_strides = TokenMajor(s.heads, s.q_len, dv);
        q = Restride(d.q.get(), s.batch, s.heads, s.q_len, s.head_dim,
                     x.q_strides);
        out = Restride(d.out.get(), s.batch, s.heads, s.q_len, dv,
                       x.out_strides);
        q_of[1] = q.get();
      } else {
        const int64_t capacity = s.kv_len + s.kv_len / 2;
        x.k_strides = Padded(s.heads, capacity, s.head_dim);
        x.v_strides = Padded(s.heads, capacity, dv);
        out = AllocFloats(s.OutFloats());
      }
      k = Restride(d.k.get(), s.batch, s.heads, s.kv_len, s.head_dim,
                   x.k_strides);
      v = Restride(d.v.get(), s.batch, s.heads, s.kv_len, dv, x.v_strides);
      k_of[1] = k.get();
      v_of[1] = v.get();
      out_of[1] = out.get();
    } else if (variant == "f16" || variant == "bf16" || variant == "int8") {
      layout = true;  // other inputs: compare, and warm each side's own
      const qkv_dtype t = variant == "f16"    ? QKV_DTYPE_F16
                          : variant == "bf16" ? QKV_DTYPE_BF16
                                              : QKV_DTYPE_I8;
      const size_t e = t == QKV_DTYPE_I8 ? 1 : 2;
      const int64_t rows = s.batch * s.heads * s.kv_len;
      k = AllocFloats((size_t(rows * s.head_dim) * e + 3) / 4);
      v = AllocFloats((size_t(rows * s.value_dim()) * e + 3) / 4);
      if (t == QKV_DTYPE_I8) {
        k_scales = AllocFloats(size_t(rows));
        v_scales = AllocFloats(size_t(rows));
        x.k_scales = k_scales.get();
        x.v_scales = v_scales.get();
      }
      if (qkv_quantize_rows(t, rows, s.head_dim, d.k.get(), s.head_dim,
                            k.get(), s.head_dim, k_scales.get()) != QKV_OK ||
          qkv_quantize_rows(t, rows, s.value_dim(), d.v.get(), s.value_dim(),
                            v.get(), s.value_dim(),
                            v_scales.get()) != QKV_OK) {
        error = variant + ": qkv_quantize_rows failed";
        return;
      }
      x.kv_dtype = t;
      reads = s.name == "S1_decode";
      k_of[1] = k.get();
      v_of[1] = v.get();
      out = AllocFloats(s.OutFloats());
      out_of[1] = out.get();
    } else if (variant == "huge_pages") {
      layout = true;  // other buffers: compare, and warm each side's own
      const size_t rows = size_t(s.batch * s.KvHeads() * s.kv_len);
      const size_t kn = rows * size_t(s.head_dim);
      const size_t vn = rows * size_t(s.value_dim());
      k = AllocHugeFloats(kn);
      v = AllocHugeFloats(vn);
      std::memcpy(k.get(), d.k.get(), kn * sizeof(float));
      std::memcpy(v.get(), d.v.get(), vn * sizeof(float));
      huge_frac = std::min(
          1.0, HugeBytes(k.get(), v.get()) / double((kn + vn) * sizeof(float)));
      reads = true;
      k_of[1] = k.get();
      v_of[1] = v.get();
      out = AllocFloats(s.OutFloats());
      out_of[1] = out.get();
    }
    if (reads) {
      stream_floats = size_t{32} << 20;  // 128 MiB: past any L3 here
      stream = AllocFloats(stream_floats);
      for (size_t i = 0; i < stream_floats; ++i) stream.get()[i] = 1.0f;
      if (variant == "huge_pages") {  // the variant's read on its pages
        stream_v = AllocHugeFloats(stream_floats);
        for (size_t i = 0; i < stream_floats; ++i) stream_v.get()[i] = 1.0f;
      }
    }
    for (int side = 0; side < 2; ++side) {
      const double e = desc[side].kv_dtype == QKV_DTYPE_F32   ? 4
                       : desc[side].kv_dtype == QKV_DTYPE_I8 ? 1
                                                             : 2;
      const double rows = double(s.batch * s.KvHeads() * s.kv_len);
      kv_bytes[side] = rows * (double(s.head_dim + s.value_dim()) * e +
                               (desc[side].kv_dtype == QKV_DTYPE_I8 ? 8 : 0));
    }
    for (int side = 0; side < 2; ++side) {
      ws_bytes[side] = qkv_attention_workspace_size(&desc[side]);
      if (ws_bytes[side] > 0) ws[side] = AllocFloats((ws_bytes[side] + 3) / 4);
      const qkv_status st = Call(side);
      if (st != QKV_OK) {
        char why[256];
        qkv_attention_explain(&desc[side], q_of[side], k_of[side], v_of[side],
                              out_of[side], nullptr, nullptr, ws[side].get(),
                              ws_bytes[side], why, sizeof why);
        error = std::string(side == 0 ? "plain" : variant) + ": " +
                qkv_status_string(st) + ": " + why;
        return;
      }
    }
    if (layout) max_diff = LayoutDiff(d);
    for (int side = 0; side < 2; ++side) {
      const double one = Time(side, 1);
      calls[side] = std::max(1, int(std::ceil(kPairedSliceMicros / one)));
    }
  }

  qkv_status Call(int side) {
    const qkv_status st = qkv_attention(
        &desc[side], q_of[side], k_of[side], v_of[side], out_of[side],
        nullptr, nullptr, ws[side].get(), ws_bytes[side]);
    ok = ok && st == QKV_OK;
    return st;
  }

  // max |variant out - plain out| / max |v| after one call of each side.
  double LayoutDiff(const ShapeData& d) const {
    const Shape& s = shape;
    const int64_t dv = s.value_dim();
    qkv_strides st = desc[1].out_strides;
    if (st.batch == 0 && st.head == 0 && st.token == 0) {
      st = qkv_strides{s.heads * s.q_len * dv, s.q_len * dv, dv};
    }
    double diff = 0.0;
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t h = 0; h < s.heads; ++h) {
        for (int64_t t = 0; t < s.q_len; ++t) {
          for (int64_t c = 0; c < dv; ++c) {
            const double e =
                std::fabs(double(out_of[1][At(st, b, h, t, c)]) -
                          double(d.out.get()[((b * s.heads + h) * s.q_len + t) *
                                                 dv + c]));
            if (!(e <= diff)) diff = e;  // NaN sticks
          }
        }
      }
    }
    return d.max_abs_v > 0 ? diff / d.max_abs_v : diff;
  }

  // Microseconds of `n` calls of a side (after an untimed one for layouts).
  double Time(int side, int n) {
    if (layout) Call(side);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) Call(side);
    return MicrosSince(t0);
  }
};

void RunPaired(benchmark::State& state, PairedCase* c) {
  if (!c->ready) c->Prepare();
  if (!c->error.empty()) {
    state.SkipWithError(c->error.c_str());
    return;
  }
  std::vector<double> ratio, us_plain, us_variant, read_frac, read_frac_plain;
  float sink = 0.0f;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < kPairedMinRounds || MicrosSince(t0) < kPairedMicros;
         ++r) {
      double t[2];
      for (int i = 0; i < 2; ++i) {
        const int side = (r + i) % 2;  // plain first in even rounds
        t[side] = c->Time(side, c->calls[side]) / c->calls[side];
      }
      ratio.push_back(t[1] / t[0]);
      us_plain.push_back(t[0]);
      us_variant.push_back(t[1]);
      if (c->stream_floats > 0) {  // the read limit, this round
        double read_gbs[2];
        for (int side = 0; side < 2; ++side) {
          const float* p = side == 1 && c->stream_v ? c->stream_v.get()
                                                    : c->stream.get();
          if (side == 1 && p == c->stream.get()) {
            read_gbs[1] = read_gbs[0];
            break;
          }
          const auto s0 = std::chrono::steady_clock::now();
          sink += StreamSum(p, c->stream_floats);
          read_gbs[side] =
              double(c->stream_floats) * 4.0 / MicrosSince(s0) * 1e-3;
        }
        read_frac.push_back(c->kv_bytes[1] / t[1] * 1e-3 / read_gbs[1]);
        read_frac_plain.push_back(c->kv_bytes[0] / t[0] * 1e-3 / read_gbs[0]);
      }
    }
  }
  if (!c->ok) {
    state.SkipWithError("qkv_attention failed");
    return;
  }
  state.counters["ratio"] = Median(ratio);
  state.counters["us_plain"] = Median(us_plain);
  state.counters["us_variant"] = Median(us_variant);
  state.counters["max_diff"] = c->max_diff;
  state.counters["kv_gbs_plain"] = c->kv_bytes[0] / Median(us_plain) * 1e-3;
  state.counters["kv_gbs"] = c->kv_bytes[1] / Median(us_variant) * 1e-3;
  if (!read_frac.empty()) {
    state.counters["read_frac"] = Median(read_frac);
    state.counters["read_frac_plain"] = Median(read_frac_plain);
  }
  if (c->huge_frac >= 0) state.counters["huge_frac"] = c->huge_frac;
  benchmark::DoNotOptimize(sink);
  state.counters["rounds"] = double(ratio.size());
}

void RegisterVsPlain() {
  const std::string backend = qkv_backend();
  std::vector<std::pair<Shape, std::string>> cases;
  cases.push_back({Shape{"causal_4096", 1, 4, 4096, 4096, 64, true,
                         Kind::kMain},
                   "window_left255"});
  for (const Shape& s : Shapes()) {
    if (s.name == "S2_prefill") {
      for (const char* v : {"alibi", "sinks", "softcap50"}) {
        cases.push_back({s, v});
      }
    }
    if (s.name == "S1_decode" || s.name == "S2_prefill" ||
        s.name == "S3_small") {
      for (const char* v : {"token_major", "padded_cache"}) {
        cases.push_back({s, v});
      }
    }
    if (s.name == "S1_decode" || s.name == "S2_prefill") {
      for (const char* v : {"f16", "bf16", "int8"}) cases.push_back({s, v});
    }
    if (s.name == "S1_decode" || s.name == "S1_gqa8_decode") {
      cases.push_back({s, "huge_pages"});
    }
  }
  for (const auto& sv : cases) {
    PairedCase* c = new PairedCase;  // lives for the run
    c->shape = sv.first;
    c->variant = sv.second;
    c->backend = backend;
    const std::string name =
        "vs_plain/" + sv.first.name + "/" + sv.second + "/" + backend;
    benchmark::RegisterBenchmark(name.c_str(), RunPaired, c)
        ->UseRealTime()
        ->Iterations(1)
        ->Repetitions(kPairedRepetitions)
        ->Unit(benchmark::kMillisecond);
  }
}

// ---------------------------------------------------------------- backward
// qkv_attention_backward_f32 on S2 and S3 (DOT; S2 causal) against the
// forward and against the same backward pass written as BLAS calls:
//   backward_f32/<shape>/<backend>/workers:<n>     the default backend (1 and
//       2 workers) and the AVX2 one (1 worker) when the default is another
//       (an AVX-512 CPU measures both ISAs in one run)
//   backward_f32/<shape>/openblas_5gemm/workers:<n>   the baseline
//       (BlasAttentionBackwardHead: five sgemms, the exp and dS loops, the
//       heads split over our pool like the three-step forward's)
// Counters: flop (BackwardFlops: 2.5x the forward's), pairs, max_err (max
// |grad - baseline grad| / max |baseline grad| over d_q, d_k, d_v, checked
// once outside the timing), machine (2-worker rows, as for the forward).
// The forward rows to set them against are attention_f32/<shape>/<backend>/
// workers:<n>, in the same run. Since the VM drifts by up to 30% over
// minutes, the two ratios the targets are about are also measured paired
// in time, like the variants against the plain call:
//   backward_paired/<shape>/<backend>   one worker; rounds of three slices
//       in rotating order, each one untimed call then at least
//       kPairedSliceMicros of calls: the forward as a training step makes
//       it (out and lse written), qkv's backward, the baseline's backward.
//       Counters, medians over a repetition's rounds: bwd_over_fwd,
//       blas_over_bwd (the baseline's time over qkv's), us_fwd, us_bwd,
//       us_blas, rounds
//   scaling_backward/<shape>/<backend>   the default backend's backward on
//       2 workers against 1, paired in time with the machine's two copies:
//       the scaling section's ScalingCase, backward
struct BackwardCase {
  Shape shape;
  std::string impl;  // a backend name or "openblas_5gemm"
  size_t workers;
  Buffer workspace;  // qkv: workspace; BLAS: scratch (per worker)
  size_t workspace_bytes = 0;
  bool ready = false;
  qkv_status status = QKV_OK;
  double max_err = -1.0;

  bool blas() const { return impl == "openblas_5gemm"; }
};

void SetBackwardCounters(benchmark::State& state, const Shape& s,
                         double max_err) {
  const double iters = static_cast<double>(state.iterations());
  state.counters["flop"] = benchmark::Counter(s.BackwardFlops() * iters,
                                              benchmark::Counter::kIsRate);
  state.counters["pairs"] =
      benchmark::Counter(s.Pairs() * iters, benchmark::Counter::kIsRate);
  state.counters["max_err"] = benchmark::Counter(max_err);
}

void RunBackward(benchmark::State& state, BackwardCase* c) {
  const Shape& s = c->shape;
  ShapeData& d = DataFor(s);
  BackwardData& g = BackwardDataFor(s);
  if (g.forward_status != QKV_OK) {
    state.SkipWithError("the forward call for out and lse failed");
    return;
  }
  float* grad[3] = {g.grad[0].get(), g.grad[1].get(), g.grad[2].get()};
  qkv_attention_desc desc = DescFor(s, d, c->impl.c_str(), c->workers);
  if (!c->ready) {
    ComputeBackwardExpected(s, g);
    if (c->blas()) {
      const size_t per_worker = BlasBackwardScratchFloats(BlasShapeOf(s));
      c->workspace = AllocFloats(per_worker * c->workers);
    } else {
      c->workspace_bytes = qkv_attention_backward_workspace_size(&desc);
      if (c->workspace_bytes > 0) {
        c->workspace = AllocFloats((c->workspace_bytes + 3) / 4);
      }
    }
  }
  BlasBackwardRun run = BlasBackwardRun::Of(s, g, grad, c->workspace.get());
  qkv_test::ThreadPool& pool = Pool(c->workers);
  const size_t tasks = size_t(s.batch * s.heads);
  auto call = [&]() {
    if (c->blas()) {
      pool.Run(tasks, &BlasBackwardRun::Task, &run);
      return QKV_OK;
    }
    return qkv_attention_backward_f32(&desc, d.q.get(), d.k.get(), d.v.get(),
                                      g.out.get(), g.lse.get(), g.d_out.get(),
                                      grad[0], grad[1], grad[2],
                                      c->workspace.get(), c->workspace_bytes);
  };
  if (!c->ready) {
    // One untimed call: the status, the gradients against the baseline's,
    // and warm caches.
    for (int i = 0; i < 3; ++i) {
      std::memset(grad[i], 0, g.GradFloats(s, i) * sizeof(float));
    }
    c->status = call();
    if (c->status == QKV_OK && !c->blas()) {
      c->max_err = BackwardMaxErr(s, g, grad);
    }
    c->ready = true;
  }
  if (c->status != QKV_OK) {
    state.SkipWithError(qkv_status_string(c->status));
    return;
  }
  for (auto _ : state) {
    call();
    benchmark::ClobberMemory();
  }
  SetBackwardCounters(state, s, c->blas() ? 0.0 : c->max_err);
  if (c->workers == 2) {
    state.counters["machine"] = MachineFor(s, c->impl, true);
  }
}

// Forward, qkv backward and baseline backward of one shape and backend, one
// worker, paired in time (see above).
struct BackwardPairedCase {
  Shape shape;
  std::string backend;
  qkv_attention_desc desc = {};
  Buffer out, lse;  // the forward slice's own (the backward's inputs stay)
  Buffer fwd_ws, bwd_ws, blas_scratch;
  size_t fwd_bytes = 0, bwd_bytes = 0;
  int calls[3] = {1, 1, 1};  // per slice: forward, backward, baseline
  int sides = 3;             // 2 without OpenBLAS
  bool ready = false;
  bool ok = true;

  void Prepare() {
    ready = true;
    const Shape& s = shape;
    ShapeData& d = DataFor(s);
    BackwardData& g = BackwardDataFor(s);
    ok = g.forward_status == QKV_OK;
    desc = DescFor(s, d, backend.c_str(), 1);
    out = AllocFloats(s.OutFloats());
    lse = AllocFloats(size_t(s.batch * s.heads * s.q_len));
    fwd_bytes = qkv_attention_workspace_size(&desc);
    bwd_bytes = qkv_attention_backward_workspace_size(&desc);
    fwd_ws = AllocFloats((fwd_bytes + 3) / 4);
    bwd_ws = AllocFloats((bwd_bytes + 3) / 4);
    sides = BlasAvailable() ? 3 : 2;
    if (sides == 3) {
      blas_scratch = AllocFloats(BlasBackwardScratchFloats(BlasShapeOf(s)));
    }
    for (int side = 0; side < sides && ok; ++side) {
      const double one = Time(side, 1);
      calls[side] = std::max(1, int(std::ceil(kPairedSliceMicros / one)));
    }
  }

  void Call(int side) {
    const Shape& s = shape;
    ShapeData& d = DataFor(s);
    BackwardData& g = BackwardDataFor(s);
    float* grad[3] = {g.grad[0].get(), g.grad[1].get(), g.grad[2].get()};
    if (side == 0) {
      ok = ok && qkv_attention_f32(&desc, d.q.get(), d.k.get(), d.v.get(),
                                   out.get(), nullptr, lse.get(), fwd_ws.get(),
                                   fwd_bytes) == QKV_OK;
    } else if (side == 1) {
      ok = ok && qkv_attention_backward_f32(
                     &desc, d.q.get(), d.k.get(), d.v.get(), g.out.get(),
                     g.lse.get(), g.d_out.get(), grad[0], grad[1], grad[2],
                     bwd_ws.get(), bwd_bytes) == QKV_OK;
    } else {
      BlasBackwardRun run = BlasBackwardRun::Of(s, g, grad, blas_scratch.get());
      for (size_t t = 0; t < size_t(s.batch * s.heads); ++t) {
        BlasBackwardRun::Task(&run, t, 0);
      }
    }
  }

  // Microseconds of `n` calls of a side, after an untimed one: the slice
  // before left other buffers in the caches.
  double Time(int side, int n) {
    Call(side);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) Call(side);
    return MicrosSince(t0);
  }
};

void RunBackwardPaired(benchmark::State& state, BackwardPairedCase* c) {
  if (!c->ready) c->Prepare();
  std::vector<double> bwd_over_fwd, blas_over_bwd, us[3];
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0;
         c->ok && (r < kPairedMinRounds || MicrosSince(t0) < kPairedMicros);
         ++r) {
      double t[3] = {0, 0, 0};
      for (int i = 0; i < c->sides; ++i) {
        const int side = (r + i) % c->sides;  // each side first in turn
        t[side] = c->Time(side, c->calls[side]) / c->calls[side];
      }
      bwd_over_fwd.push_back(t[1] / t[0]);
      if (c->sides == 3) blas_over_bwd.push_back(t[2] / t[1]);
      for (int side = 0; side < c->sides; ++side) us[side].push_back(t[side]);
    }
  }
  if (!c->ok) {
    state.SkipWithError(
        "qkv_attention_f32 or qkv_attention_backward_f32 "
        "failed");
    return;
  }
  state.counters["bwd_over_fwd"] = Median(bwd_over_fwd);
  state.counters["us_fwd"] = Median(us[0]);
  state.counters["us_bwd"] = Median(us[1]);
  if (c->sides == 3) {
    state.counters["blas_over_bwd"] = Median(blas_over_bwd);
    state.counters["us_blas"] = Median(us[2]);
  }
  state.counters["rounds"] = double(bwd_over_fwd.size());
}

// The AVX2 backend to measure beside the default one, or "" (the default
// is AVX2 itself, or there is none).
std::string Avx2Backend(const std::vector<std::string>& backends) {
  if (backends.empty()) return "";
  std::vector<std::string> avx2;
  for (const std::string& be : backends) {
    std::string lower = be;
    for (char& ch : lower) ch = char(std::tolower((unsigned char)ch));
    if (lower.find("avx2") != std::string::npos) avx2.push_back(be);
  }
  for (const std::string& be : avx2) {  // Highway's first, as the default
    if (be == "highway:AVX2" && be != backends[0]) return be;
  }
  for (const std::string& be : avx2) {
    if (be != backends[0]) return be;
  }
  return "";
}

void RegisterBackward(const std::vector<std::string>& backends, bool blas) {
  if (backends.empty()) return;
  const std::string def = backends[0];
  const std::string avx2 = Avx2Backend(backends);
  for (const Shape& s : Shapes()) {
    if (s.name != "S2_prefill" && s.name != "S3_small") continue;
    const std::string prefix = "backward_f32/" + s.name + "/";
    std::vector<std::pair<std::string, size_t>> rows = {{def, 1}, {def, 2}};
    if (!avx2.empty()) rows.push_back({avx2, 1});
    if (blas) {
      rows.push_back({"openblas_5gemm", 1});
      rows.push_back({"openblas_5gemm", 2});
    }
    for (const auto& row : rows) {
      BackwardCase* c = new BackwardCase;  // lives for the run
      c->shape = s;
      c->impl = row.first;
      c->workers = row.second;
      const std::string name =
          prefix + row.first + "/workers:" + std::to_string(row.second);
      benchmark::RegisterBenchmark(name.c_str(), RunBackward, c)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
    std::vector<std::string> paired = {def};
    if (!avx2.empty()) paired.push_back(avx2);
    for (const std::string& be : paired) {
      BackwardPairedCase* c = new BackwardPairedCase;  // lives for the run
      c->shape = s;
      c->backend = be;
      const std::string name = "backward_paired/" + s.name + "/" + be;
      benchmark::RegisterBenchmark(name.c_str(), RunBackwardPaired, c)
          ->UseRealTime()
          ->Iterations(1)
          ->Repetitions(kPairedRepetitions)
          ->Unit(benchmark::kMillisecond);
    }
    const std::string name = "scaling_backward/" + s.name + "/" + def;
    benchmark::RegisterBenchmark(name.c_str(), RunScaling,
                                 ScalingCaseFor(s, def, true))
        ->UseRealTime()
        ->Iterations(1)
        ->Repetitions(1)
        ->Unit(benchmark::kMillisecond);
  }
}

// ---------------------------------------------------------------- attention

void RegisterAll() {
  RegisterLimits();
  RegisterMerge();
  RegisterKvError();
  std::vector<std::string> backends;
  for (size_t i = 0; i < qkv_backend_count(); ++i) {
    const char* name = qkv_backend_name(i);
    if (name != nullptr) backends.push_back(name);
  }
  const bool blas = BlasAvailable();
  RegisterScaling(backends, blas);
  for (const Shape& s : Shapes()) {
    const std::string prefix = "attention_f32/" + s.name + "/";
    const bool sweep = s.kind == Kind::kKvSweep || s.kind == Kind::kDimSweep;
    auto shorten = [&](benchmark::internal::Benchmark* bm) {
      if (sweep) bm->MinTime(kSweepMinTime)->Repetitions(kSweepRepetitions);
    };
    for (size_t b = 0; b < backends.size(); ++b) {
      const std::string& be = backends[b];
      const bool reference = be == "reference";
      const bool scalar = IsScalarBackend(be);
      std::vector<size_t> worker_counts = {1, 2};
      if (reference) worker_counts = {0};
      switch (s.kind) {
        case Kind::kMain:
          break;
        case Kind::kScoreKind: {
          // Each engine's best backend (the default for additive scores is
          // xsimd's, see src/dispatch.cc) and the reference.
          const std::string engine = be.substr(0, be.find(':'));
          bool first_of_engine = true;
          for (size_t e = 0; e < b; ++e) {
            first_of_engine = first_of_engine &&
                              backends[e].substr(0, backends[e].find(':')) != engine;
          }
          if (!first_of_engine && !reference) continue;
          break;
        }
        case Kind::kKvSweep:
        case Kind::kDimSweep:
          if (scalar && s.Flops() > kReferenceMaxFlops) continue;
          if (scalar && !reference) worker_counts = {1};
          break;
      }
      for (size_t w : worker_counts) {
        QkvCase* c = new QkvCase{s, be, w, nullptr};  // lives for the run
        const std::string name =
            prefix + be + "/workers:" + std::to_string(w == 0 ? 1 : w);
        benchmark::internal::Benchmark* bm =
            benchmark::RegisterBenchmark(name.c_str(), RunQkv, c);
        bm->UseRealTime()->Unit(benchmark::kMicrosecond);
        if (scalar && s.Flops() >= kSlowReferenceFlops) {
          bm->Iterations(1)->Repetitions(3);
        } else {
          shorten(bm);
        }
      }
    }
    if (blas && s.score == QKV_SCORE_DOT) {
      for (size_t w : {size_t(1), size_t(2)}) {
        BlasCase* c = new BlasCase{s, w, nullptr};
        const std::string name =
            prefix + "openblas_3step/workers:" + std::to_string(w);
        benchmark::internal::Benchmark* bm =
            benchmark::RegisterBenchmark(name.c_str(), RunBlas, c);
        bm->UseRealTime()->Unit(benchmark::kMicrosecond);
        shorten(bm);
      }
    }
  }
  RegisterBackward(backends, blas);
  RegisterVsPlain();
}

void AddContext() {
  char version[32];
  const uint32_t v = qkv_version();
  std::snprintf(version, sizeof version, "%u.%u.%u", unsigned(v >> 16),
                unsigned((v >> 8) & 0xff), unsigned(v & 0xff));
  benchmark::AddCustomContext("qkv_version", version);
  benchmark::AddCustomContext("qkv_backend", qkv_backend());
  std::string all;
  for (size_t i = 0; i < qkv_backend_count(); ++i) {
    const char* n = qkv_backend_name(i);
    if (n == nullptr) continue;
    if (!all.empty()) all += ",";
    all += n;
  }
  benchmark::AddCustomContext("qkv_backends", all);
  if (BlasAvailable()) {
    benchmark::AddCustomContext("openblas_config", BlasConfig());
    benchmark::AddCustomContext("openblas_corename", BlasCoreName());
    const char* ct = std::getenv("OPENBLAS_CORETYPE");
    benchmark::AddCustomContext("openblas_coretype_env", ct ? ct : "");
    // bench/run.sh: how it chose the kernel set (its measurement).
    const char* pick = std::getenv("QKV_OPENBLAS_PICK");
    if (pick != nullptr && pick[0] != '\0') {
      benchmark::AddCustomContext("openblas_pick", pick);
    }
  } else {
    benchmark::AddCustomContext("openblas_config", "not built");
  }
  benchmark::AddCustomContext("simd_best_target", BestTargetName());
  benchmark::AddCustomContext(
      "pool_spin_us", std::to_string(qkv_test::ThreadPool::kSpinMicros));
}

}  // namespace
}  // namespace qkv_bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // Single-threaded OpenBLAS: the 2-worker baseline splits heads across our
  // own pool, like qkv does, so both sides use the same threads.
  qkv_bench::BlasSetThreads(1);
  qkv_bench::AddContext();
  qkv_bench::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
