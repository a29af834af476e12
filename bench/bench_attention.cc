// Google Benchmark suite for qkv_attention_f32.
//
// S1-S4 run every backend the library offers on this CPU (from
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
//   limits/stream_read/256MiB/threads:<n>  sum of a 256 MiB float array
//                                          (bytes counter)
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
#include <benchmark/benchmark.h>

#include <algorithm>
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
  size_t QFloats() const { return size_t(batch * heads * q_len * head_dim); }
  size_t KFloats() const { return size_t(batch * heads * kv_len * head_dim); }
  size_t VFloats() const {
    return size_t(batch * heads * kv_len * value_dim());
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

Buffer AllocFloats(size_t n) {
  const size_t bytes =
      ((std::max<size_t>(n, 1) * sizeof(float)) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (p == nullptr) {
    std::fprintf(stderr, "qkv_bench: out of memory (%zu bytes)\n", bytes);
    std::abort();
  }
  std::memset(p, 0, bytes);
  return Buffer(static_cast<float*>(p));
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
    BlasAttentionHead(
        r.bs, r.q + t * s.q_len * s.head_dim, r.k + t * s.kv_len * s.head_dim,
        r.v + t * s.kv_len * s.value_dim(), r.out + t * s.q_len * s.value_dim(),
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

// What the machine gives two threads right now: 2 * time(1 thread) /
// time(2 threads) of a short FMA-peak loop, median of a few tries (see the
// scaling section below). Every 2-worker benchmark records it next to its
// time, as the counter "machine".
double MachineScaling();

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
  qkv_attention_desc_init(&desc, s.batch, s.heads, s.heads, s.q_len, s.kv_len,
                          s.head_dim, s.value_dim());
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
  if (c->workers == 2) state.counters["machine"] = MachineScaling();
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
  if (c->workers == 2) state.counters["machine"] = MachineScaling();
}

std::vector<Shape> Shapes() {
  std::vector<Shape> v = {
      {"S1_decode", 1, 32, 1, 4096, 128, false, Kind::kMain},
      {"S2_prefill", 1, 8, 1024, 1024, 64, true, Kind::kMain},
      {"S3_small", 1, 4, 128, 128, 64, false, Kind::kMain},
      {"S4_toy", 1, 1, 4, 4, 2, false, Kind::kMain},
  };
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
  // A short run, for the scaling rounds (kScalingPeakSteps, below).
  static void TaskShort(void* arg, size_t task, size_t /*worker*/);
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
// Two workers against one, paired in time. The VM this suite was written on
// does not always give its two vCPUs two cores' worth of work: for seconds to
// minutes at a time the FMA-peak loop on both threads runs at 1.1-1.5x one
// thread instead of 2x (the host places the vCPUs on shared cores, or
// throttles), and a 2-worker figure measured in such a stretch says nothing
// about the code. So these benchmarks measure, round after round, in turn:
// the FMA loop on one thread and on two (the same pool threads the attention
// uses), and the shape on one worker and on two, each for about kSliceMicros,
// alternating which goes first. Counters, medians over the rounds:
//   speedup       time(1 worker) / time(2 workers) of the shape
//   machine       2 * time(FMA, 1 thread) / time(FMA, 2 threads): what the
//                 machine gave two threads in the same rounds (2.0: two cores)
//   speedup_full  the shape's speedup over the rounds where machine >=
//                 kFullMachine only (NaN when there is none)
//   full_rounds, rounds
constexpr int kScalingRounds = 150;
constexpr double kSliceMicros = 400.0;
constexpr double kFullMachine = 1.9;
constexpr int64_t kScalingPeakSteps = int64_t{1} << 17;

void PeakRun::TaskShort(void* arg, size_t task, size_t /*worker*/) {
  PeakRun& r = *static_cast<PeakRun*>(arg);
  r.sink[task] = r.target.run(kScalingPeakSteps, r.m, r.a);
}

double Median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The implementation under test: Call(workers) runs the shape once.
struct ScalingCase {
  Shape shape;
  std::string impl;  // a backend name or "openblas_3step"
  Buffer ws[3];      // qkv: the workspace for 1 and 2 workers; BLAS: scratch
  size_t ws_bytes[3] = {0, 0, 0};
  qkv_attention_desc desc[3] = {};
  bool ready = false;
  bool ok = true;

  bool blas() const { return impl == "openblas_3step"; }

  void Prepare() {
    ShapeData& d = DataFor(shape);
    for (size_t w : {size_t(1), size_t(2)}) {
      if (blas()) {
        ws[w] = AllocFloats(BlasScratchFloats(BlasShapeOf(shape)) * w);
        continue;
      }
      desc[w] = DescFor(shape, d, impl.c_str(), w);
      ws_bytes[w] = qkv_attention_workspace_size(&desc[w]);
      if (ws_bytes[w] > 0) ws[w] = AllocFloats((ws_bytes[w] + 3) / 4);
    }
    ready = true;
  }

  void Call(size_t w) {
    ShapeData& d = DataFor(shape);
    if (blas()) {
      const BlasShape bs = BlasShapeOf(shape);
      BlasRun run{&shape,    bs,          d.q.get(),    d.k.get(),
                  d.v.get(), d.out.get(), ws[w].get(), BlasScratchFloats(bs)};
      Pool(w).Run(size_t(shape.batch * shape.heads), &BlasRun::Task, &run);
      return;
    }
    ok = ok && qkv_attention_f32(&desc[w], d.q.get(), d.k.get(), d.v.get(),
                                 d.out.get(), nullptr, nullptr, ws[w].get(),
                                 ws_bytes[w]) == QKV_OK;
  }
};

double MicrosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now() - t0)
      .count();
}

// Wakes the pool's threads before a timed 2-thread slice: after a 1-thread
// slice they are asleep (see thread_pool.h), and a futex wake-up (tens of
// microseconds here) is not what is being measured.
void Wake(size_t threads) {
  Pool(threads).Run(threads, [](void*, size_t, size_t) {}, nullptr);
}

// Microseconds of the short FMA-peak loop on each of `threads` threads of
// the pool; 0 without a peak loop (no Highway).
double FmaMicros(size_t threads) {
  PeakTarget targets[16];
  if (PeakTargets(targets, 16) == 0) return 0.0;
  PeakRun peak{targets[0], g_peak_m, g_peak_a, {0, 0, 0, 0}};
  Wake(threads);
  const auto t0 = std::chrono::steady_clock::now();
  Pool(threads).Run(threads, &PeakRun::TaskShort, &peak);
  benchmark::DoNotOptimize(peak.sink);
  return MicrosSince(t0);
}

double MachineScaling() {
  std::vector<double> ratios;
  for (int i = 0; i < 5; ++i) {
    const double one = FmaMicros(1), two = FmaMicros(2);
    if (two <= 0) return std::nan("");
    ratios.push_back(2.0 * one / two);
  }
  return Median(ratios);
}

void RunScaling(benchmark::State& state, ScalingCase* c) {
  if (!c->ready) c->Prepare();
  PeakTarget targets[16];
  const bool have_peak = PeakTargets(targets, 16) > 0;
  auto fma = [](size_t threads) { return FmaMicros(threads); };
  auto wake = [](size_t threads) { Wake(threads); };
  // Calls per slice, from the 1-worker time (after a warm-up of each).
  c->Call(1);
  c->Call(2);
  auto t0 = std::chrono::steady_clock::now();
  c->Call(1);
  const double one = MicrosSince(t0);
  const int calls = std::max(1, int(std::ceil(kSliceMicros / one)));
  auto shape = [&](size_t w) {
    wake(w);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) c->Call(w);
    return MicrosSince(start);
  };
  std::vector<double> speedup, machine, full, t1, t2;
  for (auto _ : state) {
    for (int r = 0; r < kScalingRounds; ++r) {
      double f1 = 0, f2 = 0, s1, s2;
      if (r % 2 == 0) {
        if (have_peak) f1 = fma(1), f2 = fma(2);
        s1 = shape(1), s2 = shape(2);
      } else {
        s2 = shape(2), s1 = shape(1);
        if (have_peak) f2 = fma(2), f1 = fma(1);
      }
      speedup.push_back(s1 / s2);
      t1.push_back(s1 / calls);
      t2.push_back(s2 / calls);
      if (have_peak) {
        machine.push_back(2.0 * f1 / f2);
        if (machine.back() >= kFullMachine) full.push_back(speedup.back());
      }
    }
  }
  if (!c->ok) {
    state.SkipWithError("qkv_attention_f32 failed");
    return;
  }
  state.counters["speedup"] = Median(speedup);
  state.counters["machine"] = Median(machine);
  state.counters["speedup_full"] = Median(full);
  state.counters["full_rounds"] = double(full.size());
  state.counters["rounds"] = double(speedup.size());
  state.counters["us_1w"] = Median(t1);
  state.counters["us_2w"] = Median(t2);
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
      ScalingCase* c = new ScalingCase;  // lives for the run
      c->shape = s;
      c->impl = impl;
      const std::string name = "scaling/" + s.name + "/" + impl;
      benchmark::RegisterBenchmark(name.c_str(), RunScaling, c)
          ->UseRealTime()
          ->Iterations(1)
          ->Repetitions(1)
          ->Unit(benchmark::kMillisecond);
    }
  }
}

// ---------------------------------------------------------------- attention

void RegisterAll() {
  RegisterLimits();
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
