// A small std::thread pool implementing qkv_parallel_for_fn, shared by the
// tests and the benchmarks. The library itself never starts a thread; this is
// what a caller would plug in.
//
// Waking a thread through a condition variable costs tens of microseconds on
// a VM (a futex syscall on each side and a reschedule), as much as a whole
// small attention call. So both waits spin first: a pool thread polls the
// generation counter, and the caller polls the count of busy threads, for up
// to kSpinMicros with a pause instruction between polls, and only then sleep
// on the condition variable. Back-to-back calls (a benchmark, a model's
// layers) never touch the kernel; an idle pool sleeps after kSpinMicros.
//
// Spinning only pays while every thread has a core of its own. On a busy
// machine a spinning thread gets preempted at the end of its time slice, and
// then nothing wakes it when work arrives: it waits for its next slice
// (milliseconds), where a sleeping thread would have been woken and
// scheduled at once; and a spinning caller holds the core the thread it
// waits for was woken on. So a waiter that finds it was descheduled while
// spinning (a gap of kPreemptedMicros between two looks at the clock) does
// not spin for the next kBackoffMillis, and the caller does not spin for
// pool threads it had to wake: then the pool behaves like a plain
// condition-variable pool, which the scheduler serves well under load.
#ifndef QKV_TESTS_SUPPORT_THREAD_POOL_H_
#define QKV_TESTS_SUPPORT_THREAD_POOL_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64) || \
    defined(_M_IX86)
#include <immintrin.h>
#endif

#include "qkv/qkv.h"

namespace qkv_test {

// Worker 0 is the calling thread; workers 1..n-1 are pool threads. Tasks are
// handed out dynamically (an atomic counter), so the task-to-worker mapping
// differs from run to run: exactly what the determinism tests want.
class ThreadPool {
 public:
  // How long a wait polls before it sleeps on the condition variable.
  static constexpr int64_t kSpinMicros = 50;
  // A gap this long between two polls means the thread was descheduled: a
  // scheduler time slice is milliseconds. A VM's own hiccups (the host
  // interrupting a vCPU for tens to hundreds of microseconds) must not
  // count: at 20 us they did, several times a second, and a 2-worker S3
  // call then paid a futex wake-up (56-63 us per call instead of 47-53).
  static constexpr int64_t kPreemptedMicros = 1000;
  // How long a waiter then sleeps without spinning first.
  static constexpr int64_t kBackoffMillis = 100;

  explicit ThreadPool(size_t num_workers)
      : num_workers_(num_workers == 0 ? 1 : num_workers) {
    for (size_t w = 1; w < num_workers_; ++w) {
      threads_.emplace_back([this, w] { WorkerLoop(w); });
    }
  }
  ~ThreadPool() {
    stop_.store(true, std::memory_order_relaxed);
    Publish();  // the release store orders stop_ before the new generation
    for (auto& t : threads_) t.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t num_workers() const { return num_workers_; }

  // Matches qkv_parallel_for_fn with ctx = this pool.
  static void ParallelFor(void* ctx, size_t num_tasks, qkv_task_fn fn,
                          void* arg) {
    static_cast<ThreadPool*>(ctx)->Run(num_tasks, fn, arg);
  }

  // Sets desc->parallel_for, parallel_ctx and num_workers to this pool.
  void Attach(qkv_attention_desc* desc) {
    desc->parallel_for = &ThreadPool::ParallelFor;
    desc->parallel_ctx = this;
    desc->num_workers = num_workers_;
  }

  // Runs fn(arg, t, w) for every t < num_tasks and returns when all are done.
  // One caller at a time per pool (like any parallel_for context).
  void Run(size_t num_tasks, qkv_task_fn fn, void* arg) {
    if (num_workers_ == 1) {
      for (size_t t = 0; t < num_tasks; ++t) fn(arg, t, 0);
      return;
    }
    // No pool thread is reading these: the previous Run waited for all of
    // them to finish, and they only read after seeing the next generation.
    fn_ = fn;
    arg_ = arg;
    num_tasks_ = num_tasks;
    next_.store(0, std::memory_order_relaxed);
    busy_.store(num_workers_ - 1, std::memory_order_relaxed);
    const bool woke = Publish();
    Drain(0);
    // Join: poll (unless a pool thread had to be woken: it may need this
    // core), then sleep until the last pool thread reports.
    auto done = [this] { return busy_.load(std::memory_order_acquire) == 0; };
    if (!(woke ? done() : SpinUntil(done, &caller_no_spin_until_))) {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait(lock, done);
    }
  }

 private:
  static void Pause() {
#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64) || \
    defined(_M_IX86)
    _mm_pause();
#elif defined(__aarch64__) || \
    (defined(__arm__) && defined(__ARM_ARCH) && __ARM_ARCH >= 7)
    // The spin-loop hint (ARMv7-A and later have YIELD too). Not
    // std::this_thread::yield: a sched_yield syscall per poll makes a spin
    // of kSpinMicros a few polls long and, under load or emulation, looks
    // like preemption, so every wait ended in a futex sleep (32-bit ARM under
    // qemu-arm: 10-15x slower Runs).
    __asm__ __volatile__("yield");
#else
    std::this_thread::yield();
#endif
  }

  using Clock = std::chrono::steady_clock;

  // Polls done() for up to kSpinMicros; true as soon as it holds. No polling
  // before *no_spin_until, which it moves on when it finds it was
  // descheduled (see the top of the file).
  template <class Done>
  static bool SpinUntil(Done done, Clock::time_point* no_spin_until) {
    Clock::time_point last = Clock::now();
    if (last < *no_spin_until) return done();
    const Clock::time_point until =
        last + std::chrono::microseconds(kSpinMicros);
    for (;;) {
      for (int i = 0; i < 16; ++i) {
        if (done()) return true;
        Pause();
      }
      const Clock::time_point now = Clock::now();
      if (now - last >= std::chrono::microseconds(kPreemptedMicros)) {
        *no_spin_until = now + std::chrono::milliseconds(kBackoffMillis);
        return done();
      }
      if (now >= until) return done();
      last = now;
    }
  }

  // Starts the next generation: pool threads polling see it at once;
  // sleeping ones are woken. The mutex makes the wake-up race-free: a thread
  // that checked the generation under it before the store is counted in
  // sleepers_ and notified; one that checks after the store sees it.
  // Returns whether it had to wake any.
  bool Publish() {
    generation_.fetch_add(1, std::memory_order_release);
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      wake = sleepers_ > 0;
    }
    if (wake) cv_.notify_all();
    return wake;
  }

  void Drain(size_t worker) {
    for (;;) {
      const size_t t = next_.fetch_add(1, std::memory_order_relaxed);
      if (t >= num_tasks_) return;
      fn_(arg_, t, worker);
    }
  }

  void WorkerLoop(size_t worker) {
    uint64_t seen = 0;
    Clock::time_point no_spin_until{};
    for (;;) {
      auto moved = [&] {
        return generation_.load(std::memory_order_acquire) != seen;
      };
      if (!SpinUntil(moved, &no_spin_until)) {
        std::unique_lock<std::mutex> lock(mu_);
        ++sleepers_;
        cv_.wait(lock, moved);
        --sleepers_;
      }
      // Exactly one generation ahead: the next one needs this thread's
      // report on this one first.
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_relaxed)) return;
      Drain(worker);
      if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        // The last one: wake the caller if it went to sleep. Under the mutex,
        // so the caller cannot check busy_ and then miss this notify.
        std::lock_guard<std::mutex> lock(mu_);
        done_cv_.notify_one();
      }
    }
  }

  const size_t num_workers_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  int sleepers_ = 0;  // guarded by mu_
  Clock::time_point caller_no_spin_until_{};  // Run's (one caller at a time)
  std::atomic<uint64_t> generation_{0};
  std::atomic<size_t> busy_{0};  // pool threads not yet done with this Run
  std::atomic<bool> stop_{false};
  qkv_task_fn fn_ = nullptr;
  void* arg_ = nullptr;
  size_t num_tasks_ = 0;
  std::atomic<size_t> next_{0};
};

// Runs every task serially on the calling thread, in a random permutation,
// each on a random worker index < num_workers.
struct ShuffledPool {
  std::mt19937 rng;
  size_t num_workers;
  int calls = 0;
  bool bad_task = false;

  static void ParallelFor(void* ctx, size_t num_tasks, qkv_task_fn fn,
                          void* arg) {
    auto* self = static_cast<ShuffledPool*>(ctx);
    ++self->calls;
    std::vector<size_t> order(num_tasks);
    std::iota(order.begin(), order.end(), size_t{0});
    std::shuffle(order.begin(), order.end(), self->rng);
    std::uniform_int_distribution<size_t> worker(0, self->num_workers - 1);
    for (size_t t : order) fn(arg, t, worker(self->rng));
  }
};

// Forwards to a ThreadPool and counts the calls (at most one per
// qkv call).
struct CountingPool {
  ThreadPool* pool;
  int calls = 0;
  static void ParallelFor(void* ctx, size_t num_tasks, qkv_task_fn fn,
                          void* arg) {
    auto* self = static_cast<CountingPool*>(ctx);
    ++self->calls;
    self->pool->Run(num_tasks, fn, arg);
  }
};

// `d` run through `pool` (a CountingPool or ShuffledPool) on `workers`.
template <class Pool>
qkv_attention_desc OnPool(qkv_attention_desc d, Pool* pool, size_t workers) {
  d.parallel_for = &Pool::ParallelFor;
  d.parallel_ctx = pool;
  d.num_workers = workers;
  return d;
}

}  // namespace qkv_test

#endif  // QKV_TESTS_SUPPORT_THREAD_POOL_H_
