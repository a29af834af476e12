// Allocation guard: no qkv function calls the allocator.
//
// The executable replaces malloc, calloc, realloc, free, aligned_alloc,
// posix_memalign, memalign, valloc and every operator new/delete
// (alloc_interpose.c, alloc_interpose_new.cc; under ASan/TSan the sanitizer's
// malloc hooks instead). A global flag arms the counter only around qkv calls;
// everything the test itself needs (inputs, outputs, workspaces, the thread
// pool and its threads) is allocated outside the armed windows. The counter is
// global, not per thread, so allocations made by qkv tasks running on the
// pool's threads are counted too.
//
// It calls every exported function: the very first call (which builds the
// engine list), the version and backend queries, every status string, the
// descriptor init, the workspace query, and qkv_attention_f32 on every
// backend, score kind and mask, with and without weights/lse, with and
// without a thread pool, plus the error paths. Linked once against libqkv.a
// and once against libqkv.so (two executables, one source).
//
// Exit status 0 iff the self-check proves the counting works and no armed
// window saw an allocator call.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "alloc_counter.h"
#include "qkv/qkv.h"
#include "support/thread_pool.h"

#if QKV_ALLOC_USE_SANITIZER_HOOKS
// From <sanitizer/allocator_interface.h>, which GCC does not install; the
// ASan and TSan runtimes of GCC and clang all export it.
extern "C" int __sanitizer_install_malloc_and_free_hooks(
    void (*malloc_hook)(const volatile void*, size_t),
    void (*free_hook)(const volatile void*));
#endif

#ifndef QKV_ALLOC_GUARD_LINKAGE
#define QKV_ALLOC_GUARD_LINKAGE "unknown"
#endif

namespace {

std::atomic<bool> g_armed{false};
std::atomic<uint64_t> g_counts[QKV_ALLOC_KINDS];

const char* const kKindNames[QKV_ALLOC_KINDS] = {
    "malloc", "calloc", "realloc",    "free",     "aligned",
    "new",    "delete", "hook-alloc", "hook-free"};

}  // namespace

extern "C" void qkv_alloc_note(int kind) {
  if (g_armed.load(std::memory_order_relaxed) && kind >= 0 &&
      kind < QKV_ALLOC_KINDS) {
    g_counts[kind].fetch_add(1, std::memory_order_relaxed);
  }
}

#if QKV_ALLOC_USE_SANITIZER_HOOKS
extern "C" {
static void MallocHook(const volatile void*, size_t) {
  qkv_alloc_note(QKV_ALLOC_HOOK_ALLOC);
}
static void FreeHook(const volatile void*) {
  qkv_alloc_note(QKV_ALLOC_HOOK_FREE);
}
}
#endif

namespace {

int g_failures = 0;
int g_windows = 0;

struct Counts {
  uint64_t n[QKV_ALLOC_KINDS];
  uint64_t Total() const {
    uint64_t t = 0;
    for (uint64_t x : n) t += x;
    return t;
  }
  std::string Describe() const {
    std::string s;
    for (int i = 0; i < QKV_ALLOC_KINDS; ++i) {
      if (n[i] == 0) continue;
      if (!s.empty()) s += ", ";
      s += std::to_string(n[i]) + " " + kKindNames[i];
    }
    return s.empty() ? "none" : s;
  }
};

// Runs f with the counter armed and returns what it counted. f must not
// allocate by itself (no std::string, no vectors): it only calls qkv.
template <class F>
Counts Armed(F&& f) {
  // seq_cst throughout (no fences: ThreadSanitizer does not model them).
  for (auto& c : g_counts) c.store(0);
  g_armed.store(true);
  f();
  g_armed.store(false);
  Counts r;
  for (int i = 0; i < QKV_ALLOC_KINDS; ++i) r.n[i] = g_counts[i].load();
  return r;
}

// Armed window around a qkv call: any allocator call is a failure.
template <class F>
void ExpectNoAllocation(const std::string& what, F&& f) {
  ++g_windows;
  const Counts c = Armed(f);
  if (c.Total() != 0) {
    ++g_failures;
    std::printf("FAIL %s: allocator called inside qkv: %s\n", what.c_str(),
                c.Describe().c_str());
  }
}

void Check(bool ok, const std::string& what) {
  if (!ok) {
    ++g_failures;
    std::printf("FAIL %s\n", what.c_str());
  }
}

// Calls through volatile function pointers, so the compiler cannot fold a
// malloc/free pair away.
void* (*volatile g_malloc)(size_t) = &std::malloc;
void* (*volatile g_calloc)(size_t, size_t) = &std::calloc;
void* (*volatile g_realloc)(void*, size_t) = &std::realloc;
void (*volatile g_free)(void*) = &std::free;
void* (*volatile g_aligned_alloc)(size_t, size_t) = &aligned_alloc;
int (*volatile g_posix_memalign)(void**, size_t, size_t) = &posix_memalign;
char* (*volatile g_strdup)(const char*) = &strdup;
void* (*volatile g_new)(size_t) =
    static_cast<void* (*)(size_t)>(&::operator new);
void (*volatile g_delete)(void*) =
    static_cast<void (*)(void*) noexcept>(&::operator delete);

// The interposition (or the hooks) really count: allocations made by the test
// itself, and one made inside libc (strdup), in an armed window are seen.
bool SelfCheck(qkv_test::ThreadPool* pool) {
  bool ok = true;
  auto expect = [&](const char* what, const Counts& c, int kind,
                    bool observable = true) {
    const bool seen = c.n[kind] >= 1;
    if (!seen && !observable) {
      std::printf(
          "self-check %-28s not observable under this sanitizer "
          "(checked by the unsanitized and ASan builds)\n",
          what);
      return;
    }
    std::printf("self-check %-28s %s (%s)\n", what, seen ? "counted" : "MISSED",
                c.Describe().c_str());
    ok = ok && seen;
  };
#if defined(__SANITIZE_THREAD__)
  const bool aligned_observable = false;  // TSan runs no hooks for these
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
  const bool aligned_observable = false;
#else
  const bool aligned_observable = true;
#endif
#else
  const bool aligned_observable = true;
#endif
#if QKV_ALLOC_USE_SANITIZER_HOOKS
  const int kAlloc = QKV_ALLOC_HOOK_ALLOC, kFree = QKV_ALLOC_HOOK_FREE;
  const int kCalloc = kAlloc, kRealloc = kAlloc, kAligned = kAlloc,
            kNew = kAlloc, kDelete = kFree;
#else
  const int kAlloc = QKV_ALLOC_MALLOC, kFree = QKV_ALLOC_FREE;
  const int kCalloc = QKV_ALLOC_CALLOC, kRealloc = QKV_ALLOC_REALLOC,
            kAligned = QKV_ALLOC_ALIGNED, kNew = QKV_ALLOC_NEW,
            kDelete = QKV_ALLOC_DELETE;
#endif
  void* p = nullptr;
  expect("malloc", Armed([&] { p = g_malloc(24); }), kAlloc);
  expect("free", Armed([&] { g_free(p); }), kFree);
  expect("calloc", Armed([&] { p = g_calloc(3, 8); }), kCalloc);
  expect("realloc", Armed([&] { p = g_realloc(p, 4096); }), kRealloc);
  g_free(p);
  expect("aligned_alloc", Armed([&] { p = g_aligned_alloc(64, 128); }),
         kAligned, aligned_observable);
  g_free(p);
  expect("posix_memalign", Armed([&] { (void)g_posix_memalign(&p, 64, 100); }),
         kAligned, aligned_observable);
  g_free(p);
  expect("operator new", Armed([&] { p = g_new(40); }), kNew);
  expect("operator delete", Armed([&] { g_delete(p); }), kDelete);
  char* s = nullptr;
  expect("strdup (malloc inside libc)", Armed([&] { s = g_strdup("qkv"); }),
         kAlloc);
  g_free(s);
  // A task on a pool thread (not the arming thread) is counted too: qkv
  // tasks run there.
  // Worker 0 (this thread) only waits, so whatever is counted came from a
  // pool thread.
  static std::atomic<bool> helper_ran{false};
  struct Task {
    static void Run(void*, size_t, size_t worker) {
      if (worker != 0) {
        g_free(g_malloc(16));
        helper_ran.store(true);
        return;
      }
      const auto until =
          std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!helper_ran.load() && std::chrono::steady_clock::now() < until) {
        std::this_thread::yield();
      }
    }
  };
  expect("malloc on pool threads",
         Armed([&] { pool->Run(64, &Task::Run, nullptr); }), kAlloc);
  // And the disarmed state counts nothing.
  for (auto& c : g_counts) c.store(0);
  p = g_malloc(8);
  g_free(p);
  uint64_t idle = 0;
  for (auto& c : g_counts) idle += c.load();
  std::printf("self-check %-28s %s\n", "disarmed malloc/free",
              idle == 0 ? "not counted" : "COUNTED");
  ok = ok && idle == 0;
  return ok;
}

struct Inputs {
  std::vector<float> q, k, v, bias, w_q, w_k, w_v;
  std::vector<int32_t> lens_batch, lens_query;
};

struct Shape {
  const char* name;
  int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim, value_dim, hidden;
};

// Inputs sized for `s`, including every optional operand.
Inputs MakeInputs(const Shape& s) {
  std::mt19937 rng(12345);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](std::vector<float>* x, size_t n) {
    x->resize(n);
    for (float& e : *x) e = u(rng);
  };
  Inputs in;
  fill(&in.q, static_cast<size_t>(s.batch * s.q_heads * s.q_len * s.head_dim));
  fill(&in.k,
       static_cast<size_t>(s.batch * s.kv_heads * s.kv_len * s.head_dim));
  fill(&in.v,
       static_cast<size_t>(s.batch * s.kv_heads * s.kv_len * s.value_dim));
  fill(&in.bias, static_cast<size_t>(s.batch * s.q_heads * s.q_len * s.kv_len));
  for (size_t i = 0; i < in.bias.size(); i += 7) in.bias[i] = -INFINITY;
  fill(&in.w_q, static_cast<size_t>(s.hidden * s.head_dim));
  fill(&in.w_k, static_cast<size_t>(s.hidden * s.head_dim));
  fill(&in.w_v, static_cast<size_t>(s.hidden));
  for (int64_t b = 0; b < s.batch; ++b) {
    in.lens_batch.push_back(
        static_cast<int32_t>((b * 13 + 5) % (s.kv_len + 1)));
    for (int64_t i = 0; i < s.q_len; ++i) {
      in.lens_query.push_back(
          static_cast<int32_t>((b * 7 + i * 3) % (s.kv_len + 1)));
    }
  }
  return in;
}

// The descriptor for one variant: mask bits and score on `s`.
qkv_attention_desc MakeDesc(const Shape& s, const Inputs& in, qkv_score score,
                            int mask_variant, const char* backend) {
  qkv_attention_desc d;
  qkv_attention_desc_init(&d, s.batch, s.q_heads, s.kv_heads, s.q_len, s.kv_len,
                          s.head_dim, s.value_dim);
  d.score = score;
  if (score == QKV_SCORE_GAUSSIAN) d.scale = 0.5f;
  if (score == QKV_SCORE_ADDITIVE) {
    d.additive_hidden = s.hidden;
    d.additive_w_q = in.w_q.data();
    d.additive_w_k = in.w_k.data();
    d.additive_w_v = in.w_v.data();
  }
  switch (mask_variant) {
    case 0:
      break;
    case 1:
      d.mask = QKV_MASK_CAUSAL;
      break;
    case 2:
      d.mask = QKV_MASK_VALID_LENS;
      d.valid_lens = in.lens_batch.data();
      break;
    case 3:
      d.mask = QKV_MASK_VALID_LENS | QKV_MASK_CAUSAL;
      d.valid_lens = in.lens_query.data();
      d.valid_lens_per_query = 1;
      break;
    default:
      d.mask = QKV_MASK_BIAS | QKV_MASK_CAUSAL | QKV_MASK_VALID_LENS;
      d.valid_lens = in.lens_batch.data();
      d.bias = in.bias.data();
      d.bias_batch_stride = s.q_heads * s.q_len * s.kv_len;
      d.bias_head_stride = s.q_len * s.kv_len;
      break;
  }
  d.backend = backend;
  return d;
}

const char* const kScoreNames[] = {"dot", "gaussian", "additive"};
const char* const kMaskNames[] = {"none", "causal", "valid_lens",
                                  "valid_lens_per_query+causal",
                                  "bias+causal+valid_lens"};

}  // namespace

int main() {
#if QKV_ALLOC_USE_SANITIZER_HOOKS
  __sanitizer_install_malloc_and_free_hooks(&MallocHook, &FreeHook);
  const char* method = "sanitizer malloc hooks";
#else
  const char* method = "interposed allocator";
#endif
  std::printf("qkv allocation guard (%s library, %s)\n",
              QKV_ALLOC_GUARD_LINKAGE, method);
  // Built before anything is armed: the pool's threads and its state.
  qkv_test::ThreadPool pool(3);
  if (!SelfCheck(&pool)) {
    std::printf(
        "FAIL: the allocator counting does not work; the guard would "
        "prove nothing\n");
    return 1;
  }

  // 1. The very first call into the library builds the engine list.
  const char* first = nullptr;
  ExpectNoAllocation("first call: qkv_backend()",
                     [&] { first = qkv_backend(); });
  Check(first != nullptr, "qkv_backend() returned NULL");

  // 2. The small queries.
  uint32_t version = 0;
  size_t count = 0;
  ExpectNoAllocation("qkv_version, qkv_backend_count, qkv_backend_name", [&] {
    version = qkv_version();
    count = qkv_backend_count();
    for (size_t i = 0; i < count + 3; ++i) (void)qkv_backend_name(i);
    (void)qkv_backend_name(SIZE_MAX);
  });
  Check(version == ((uint32_t{QKV_VERSION_MAJOR} << 16) |
                    (uint32_t{QKV_VERSION_MINOR} << 8) | QKV_VERSION_PATCH),
        "qkv_version");
  const char* strings_null = nullptr;
  ExpectNoAllocation("qkv_status_string (known and unknown values)", [&] {
    const int values[] = {0, 1, 2, 3, 4, -1, 1000};
    for (int v : values) {
      const char* s = qkv_status_string(static_cast<qkv_status>(v));
      if (s == nullptr) strings_null = "NULL";
    }
  });
  Check(strings_null == nullptr, "qkv_status_string returned NULL");
  qkv_attention_desc scratch;
  ExpectNoAllocation("qkv_attention_desc_init (and with NULL)", [&] {
    qkv_attention_desc_init(&scratch, 1, 2, 1, 3, 4, 5, 6);
    qkv_attention_desc_init(nullptr, 1, 1, 1, 1, 1, 1, 1);
  });

  std::vector<std::string> backends;  // "" stands for desc.backend = NULL
  backends.push_back("");
  for (size_t i = 0; i < count; ++i) backends.push_back(qkv_backend_name(i));

  // 3. Every backend x score x mask x optional outputs x threading, on a
  // shape that takes the Highway tile path (GQA, several key blocks) and one
  // that takes its decode row path.
  const Shape shapes[] = {
      {"tile", 2, 4, 2, 21, 70, 12, 10, 6},
      {"decode", 1, 2, 1, 1, 130, 16, 8, 5},
  };
  int calls_ok = 0, calls_unsupported = 0;
  for (const Shape& s : shapes) {
    const Inputs in = MakeInputs(s);
    const size_t rows = static_cast<size_t>(s.batch * s.q_heads * s.q_len);
    std::vector<float> out(rows * static_cast<size_t>(s.value_dim));
    std::vector<float> weights(rows * static_cast<size_t>(s.kv_len));
    std::vector<float> lse(rows);
    for (const std::string& backend : backends) {
      for (int score = 0; score < 3; ++score) {
        for (int mask = 0; mask < 5; ++mask) {
          for (int optional = 0; optional < 2; ++optional) {
            for (int threaded = 0; threaded < 2; ++threaded) {
              qkv_attention_desc d =
                  MakeDesc(s, in, static_cast<qkv_score>(score), mask,
                           backend.empty() ? nullptr : backend.c_str());
              if (threaded) pool.Attach(&d);
              const std::string what =
                  std::string(s.name) +
                  " backend=" + (backend.empty() ? "default" : backend) +
                  " score=" + kScoreNames[score] + " mask=" + kMaskNames[mask] +
                  (optional ? " +weights+lse" : "") +
                  (threaded ? " pool(3)" : "");
              size_t ws_size = 0;
              ExpectNoAllocation("qkv_attention_workspace_size " + what, [&] {
                ws_size = qkv_attention_workspace_size(&d);
              });
              std::vector<unsigned char> ws(ws_size + 1);
              qkv_status st = QKV_ERR_INVALID_ARGUMENT;
              ExpectNoAllocation("qkv_attention_f32 " + what, [&] {
                st = qkv_attention_f32(
                    &d, in.q.data(), in.k.data(), in.v.data(), out.data(),
                    optional ? weights.data() : nullptr,
                    optional ? lse.data() : nullptr,
                    ws_size ? ws.data() + 1 : nullptr, ws_size);
              });
              if (st == QKV_OK) {
                ++calls_ok;
              } else if (st == QKV_ERR_UNSUPPORTED && !backend.empty()) {
                ++calls_unsupported;  // a forced backend may not serve a score
              } else {
                Check(false, what + ": status " + std::to_string(st) + " (" +
                                 qkv_status_string(st) + ")");
              }
            }
          }
        }
      }
    }
  }

  // 3b. The 0.2 variants and layouts through qkv_attention: a token-major
  // cache with spare capacity, window, kv_start, q_pos, ALiBi, softcap and
  // sinks, on every backend, both shapes (tile and row path).
  for (const Shape& s : shapes) {
    const int64_t cap = s.kv_len + 5;  // the cache's capacity
    const Inputs in = MakeInputs(s);
    std::vector<float> k(static_cast<size_t>(s.batch * cap * s.kv_heads *
                                             s.head_dim), 0.5f);
    std::vector<float> v(static_cast<size_t>(s.batch * cap * s.kv_heads *
                                             s.value_dim), 0.25f);
    const size_t rows = static_cast<size_t>(s.batch * s.q_heads * s.q_len);
    std::vector<float> out(rows * static_cast<size_t>(s.value_dim));
    std::vector<float> lse(rows);
    std::vector<float> slopes(static_cast<size_t>(s.q_heads), 0.125f);
    std::vector<float> sinks(static_cast<size_t>(s.q_heads), 1.0f);
    std::vector<int32_t> q_pos(static_cast<size_t>(s.batch), 3);
    std::vector<int32_t> kv_start(static_cast<size_t>(s.batch), 2);
    for (const std::string& backend : backends) {
      qkv_attention_desc d = MakeDesc(s, in, QKV_SCORE_DOT, 0,
                                      backend.empty() ? nullptr
                                                      : backend.c_str());
      d.mask = QKV_MASK_CAUSAL | QKV_MASK_WINDOW | QKV_MASK_KV_START;
      d.window_left = 40;
      d.window_right = 0;
      d.kv_start = kv_start.data();
      d.q_pos = q_pos.data();
      d.alibi_slopes = slopes.data();
      d.softcap = 20.0f;
      d.sinks = sinks.data();
      d.k_strides = {cap * s.kv_heads * s.head_dim, s.head_dim,
                     s.kv_heads * s.head_dim};
      d.v_strides = {cap * s.kv_heads * s.value_dim, s.value_dim,
                     s.kv_heads * s.value_dim};
      pool.Attach(&d);
      const std::string what = std::string(s.name) + " variants backend=" +
                               (backend.empty() ? "default" : backend);
      size_t ws_size = 0;
      ExpectNoAllocation("qkv_attention_workspace_size " + what,
                         [&] { ws_size = qkv_attention_workspace_size(&d); });
      std::vector<unsigned char> ws(ws_size + 1);
      qkv_status st = QKV_ERR_INVALID_ARGUMENT;
      char message[200];
      ExpectNoAllocation("qkv_attention and qkv_attention_explain " + what,
                         [&] {
                           st = qkv_attention(&d, in.q.data(), k.data(),
                                              v.data(), out.data(), nullptr,
                                              lse.data(), ws.data() + 1,
                                              ws_size);
                           (void)qkv_attention_explain(
                               &d, in.q.data(), k.data(), v.data(),
                               out.data(), nullptr, lse.data(), ws.data() + 1,
                               ws_size, message, sizeof message);
                         });
      Check(st == QKV_OK, what + ": status " + std::to_string(st));
      if (st == QKV_OK) ++calls_ok;
    }
  }

  // 4. Error paths: each returns a status without allocating.
  {
    const Shape s = shapes[0];
    const Inputs in = MakeInputs(s);
    const size_t rows = static_cast<size_t>(s.batch * s.q_heads * s.q_len);
    std::vector<float> out(rows * static_cast<size_t>(s.value_dim));
    const qkv_attention_desc good = MakeDesc(s, in, QKV_SCORE_DOT, 4, nullptr);
    const size_t need = qkv_attention_workspace_size(&good);
    std::vector<unsigned char> ws(need + 64);
    struct BigDesc {
      qkv_attention_desc d;
      unsigned char extra[32];
    };
    BigDesc newer;
    std::memset(&newer, 0, sizeof newer);
    newer.d = good;
    newer.d.struct_size = sizeof(BigDesc);
    newer.extra[5] = 1;
    qkv_attention_desc older = good;
    older.struct_size = offsetof(qkv_attention_desc, backend);
    qkv_attention_desc zero_size = good;
    zero_size.struct_size = 0;
    qkv_attention_desc bad_dims = good;
    bad_dims.kv_heads = 3;
    qkv_attention_desc bad_backend = good;
    bad_backend.backend = "no-such-engine";
    qkv_attention_desc nan_scale = good;
    nan_scale.scale = NAN;
    qkv_status sts[9];
    ExpectNoAllocation("error paths", [&] {
      sts[0] = qkv_attention_f32(nullptr, in.q.data(), in.k.data(), in.v.data(),
                                 out.data(), nullptr, nullptr, ws.data(), need);
      sts[1] =
          qkv_attention_f32(&zero_size, in.q.data(), in.k.data(), in.v.data(),
                            out.data(), nullptr, nullptr, ws.data(), need);
      sts[2] =
          qkv_attention_f32(&bad_dims, in.q.data(), in.k.data(), in.v.data(),
                            out.data(), nullptr, nullptr, ws.data(), need);
      sts[3] =
          qkv_attention_f32(&good, in.q.data(), in.k.data(), in.v.data(),
                            out.data(), nullptr, nullptr, ws.data(), need - 1);
      sts[4] =
          qkv_attention_f32(&bad_backend, in.q.data(), in.k.data(), in.v.data(),
                            out.data(), nullptr, nullptr, ws.data(), need);
      sts[5] =
          qkv_attention_f32(&newer.d, in.q.data(), in.k.data(), in.v.data(),
                            out.data(), nullptr, nullptr, ws.data(), need);
      sts[6] =
          qkv_attention_f32(&nan_scale, in.q.data(), in.k.data(), in.v.data(),
                            out.data(), nullptr, nullptr, ws.data(), need);
      sts[7] = qkv_attention_f32(&good, in.q.data(), in.k.data(), in.v.data(),
                                 nullptr, nullptr, nullptr, ws.data(), need);
      sts[8] = qkv_attention_f32(&older, in.q.data(), in.k.data(), in.v.data(),
                                 out.data(), nullptr, nullptr, ws.data(), need);
      (void)qkv_attention_workspace_size(nullptr);
      (void)qkv_attention_workspace_size(&bad_dims);
    });
    // Every sentence qkv_attention_explain formats (numbers, names, a
    // float), into a message buffer and into one cut short.
    qkv_attention_desc bad_softcap = good;
    bad_softcap.softcap = -1.5f;
    qkv_attention_desc bad_stride = good;
    bad_stride.k_strides = {1000, 1000, 3};
    const qkv_attention_desc* explained[] = {
        nullptr,  &zero_size,   &bad_dims,   &good,      &bad_backend,
        &newer.d, &nan_scale,   &older,      &bad_softcap, &bad_stride};
    char message[160];
    ExpectNoAllocation("qkv_attention_explain", [&] {
      for (const qkv_attention_desc* d : explained) {
        (void)qkv_attention_explain(d, in.q.data(), in.k.data(), in.v.data(),
                                    out.data(), nullptr, nullptr, ws.data(),
                                    need, message, sizeof message);
        (void)qkv_attention_explain(d, in.q.data(), in.k.data(), in.v.data(),
                                    out.data(), nullptr, nullptr, ws.data(),
                                    need - 1, message, 7);
      }
    });
    const qkv_status want[9] = {QKV_ERR_INVALID_ARGUMENT,
                                QKV_ERR_INVALID_ARGUMENT,
                                QKV_ERR_INVALID_ARGUMENT,
                                QKV_ERR_WORKSPACE_TOO_SMALL,
                                QKV_ERR_UNSUPPORTED,
                                QKV_ERR_UNSUPPORTED,
                                QKV_ERR_INVALID_ARGUMENT,
                                QKV_ERR_INVALID_ARGUMENT,
                                QKV_OK};
    for (int i = 0; i < 9; ++i) {
      Check(sts[i] == want[i], "error path " + std::to_string(i) + ": status " +
                                   std::to_string(sts[i]) + ", want " +
                                   std::to_string(want[i]));
    }
  }

  std::printf(
      "%d armed windows, %d calls OK, %d forced-backend calls "
      "unsupported\n",
      g_windows, calls_ok, calls_unsupported);
  if (g_failures == 0) {
    std::printf("no allocator call inside any qkv function (%s library)\n",
                QKV_ALLOC_GUARD_LINKAGE);
  }
  return g_failures == 0 ? 0 : 1;
}
