// A small std::thread pool implementing qkv_parallel_for_fn, shared by the
// tests and the benchmarks. The library itself never starts a thread; this is
// what a caller would plug in.
#ifndef QKV_TESTS_SUPPORT_THREAD_POOL_H_
#define QKV_TESTS_SUPPORT_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

#include "qkv/qkv.h"

namespace qkv_test {

// Worker 0 is the calling thread; workers 1..n-1 are pool threads. Tasks are
// handed out dynamically (an atomic counter), so the task-to-worker mapping
// differs from run to run: exactly what the determinism tests want.
class ThreadPool {
 public:
  explicit ThreadPool(size_t num_workers)
      : num_workers_(num_workers == 0 ? 1 : num_workers) {
    for (size_t w = 1; w < num_workers_; ++w) {
      threads_.emplace_back([this, w] { WorkerLoop(w); });
    }
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      ++generation_;
    }
    cv_.notify_all();
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

  void Run(size_t num_tasks, qkv_task_fn fn, void* arg) {
    if (num_workers_ == 1) {
      for (size_t t = 0; t < num_tasks; ++t) fn(arg, t, 0);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = fn;
      arg_ = arg;
      num_tasks_ = num_tasks;
      next_.store(0);
      active_ = num_workers_ - 1;
      ++generation_;
    }
    cv_.notify_all();
    Drain(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return active_ == 0; });
  }

 private:
  void Drain(size_t worker) {
    for (;;) {
      const size_t t = next_.fetch_add(1);
      if (t >= num_tasks_) return;
      fn_(arg_, t, worker);
    }
  }

  void WorkerLoop(size_t worker) {
    size_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (stop_) return;
      }
      Drain(worker);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (--active_ == 0) done_cv_.notify_one();
      }
    }
  }

  const size_t num_workers_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  size_t generation_ = 0;
  size_t active_ = 0;
  bool stop_ = false;
  qkv_task_fn fn_ = nullptr;
  void* arg_ = nullptr;
  size_t num_tasks_ = 0;
  std::atomic<size_t> next_{0};
};

}  // namespace qkv_test

#endif  // QKV_TESTS_SUPPORT_THREAD_POOL_H_
