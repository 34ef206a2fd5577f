// The thread pool: one job at a time, published through a generation counter.
//
//   run():   store fn/ctx, pending = workers, generation += 1 (release), wake sleepers if any,
//            run share 0, then spin until pending == 0 (acquire).
//   worker:  spin on generation for kSpinNs, then sleep on a condition variable; on a new
//            generation run its share and decrement pending (release).
// Lost wake-ups are impossible: a worker increments `sleepers` under the mutex and then re-reads
// the generation; run() bumps the generation and then reads `sleepers` (both seq_cst), so either
// the worker sees the new job or run() sees the sleeper and notifies under the same mutex.
// A run() issued while the pool is already busy (a nested call from inside a job, or a second
// thread) executes inline as a single-thread job instead of deadlocking.
#include "backend/cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "util/check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SPECDEC_CPU_RELAX() _mm_pause()
#else
#define SPECDEC_CPU_RELAX() std::this_thread::yield()
#endif

namespace specdec {
namespace {

// How long an idle worker polls before it sleeps. A decode step issues a few hundred jobs a few
// microseconds apart; gaps longer than this (between steps, between requests) pay a wake-up.
constexpr int64_t kSpinNs = 100'000;
// How long the caller polls for the workers to finish before it starts yielding its core (only
// matters when the machine is oversubscribed and a worker was descheduled).
constexpr int64_t kWaitSpinNs = 200'000;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct ThreadPool::Shared {
  alignas(64) std::atomic<uint64_t> generation{0};
  alignas(64) std::atomic<int> pending{0};
  alignas(64) void (*fn)(void*, int, int) = nullptr;
  void* ctx = nullptr;
  alignas(64) std::atomic<bool> busy{false};
  std::atomic<int> sleepers{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::thread> workers;

  // Waits until the generation differs from `seen` (or stop); returns the new generation.
  uint64_t wait_for_job(uint64_t seen) {
    int64_t start = 0;
    for (uint32_t i = 0;; ++i) {
      const uint64_t g = generation.load(std::memory_order_acquire);
      if (g != seen || stop.load(std::memory_order_relaxed)) return g;
      SPECDEC_CPU_RELAX();
      if ((i & 63) == 63) {
        const int64_t t = now_ns();
        if (start == 0) {
          start = t;
        } else if (t - start > kSpinNs) {
          break;
        }
      }
    }
    std::unique_lock<std::mutex> lock(mu);
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    uint64_t g;
    while ((g = generation.load(std::memory_order_seq_cst)) == seen &&
           !stop.load(std::memory_order_relaxed)) {
      cv.wait(lock);
    }
    sleepers.fetch_sub(1, std::memory_order_relaxed);
    return g;
  }

  void worker_main(int index, int num_threads) {
    uint64_t seen = 0;
    for (;;) {
      seen = wait_for_job(seen);
      if (stop.load(std::memory_order_acquire)) return;
      fn(ctx, index, num_threads);
      pending.fetch_sub(1, std::memory_order_release);
    }
  }

  void wait_for_workers() {
    int64_t start = 0;
    for (uint32_t i = 0; pending.load(std::memory_order_acquire) != 0; ++i) {
      SPECDEC_CPU_RELAX();
      if ((i & 63) == 63) {
        const int64_t t = now_ns();
        if (start == 0) {
          start = t;
        } else if (t - start > kWaitSpinNs) {
          std::this_thread::yield();
        }
      }
    }
  }
};

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads), shared_(new Shared) {
  if (num_threads < 1) {
    delete shared_;
    throw Error("ThreadPool: num_threads must be >= 1, got " + std::to_string(num_threads));
  }
  shared_->workers.reserve(static_cast<size_t>(num_threads - 1));
  for (int i = 1; i < num_threads; ++i) {
    shared_->workers.emplace_back([s = shared_, i, num_threads] { s->worker_main(i, num_threads); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->stop.store(true, std::memory_order_seq_cst);
  }
  shared_->cv.notify_all();
  for (std::thread& t : shared_->workers) t.join();
  delete shared_;
}

void ThreadPool::run(void (*fn)(void* ctx, int thread_index, int num_threads), void* ctx) {
  Shared& s = *shared_;
  if (num_threads_ == 1 || s.busy.exchange(true, std::memory_order_acquire)) {
    fn(ctx, 0, 1);  // single-thread pool, or a nested / concurrent call: run inline
    return;
  }
  s.fn = fn;
  s.ctx = ctx;
  s.pending.store(num_threads_ - 1, std::memory_order_relaxed);
  s.generation.fetch_add(1, std::memory_order_seq_cst);
  if (s.sleepers.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.cv.notify_all();
  }
  std::exception_ptr error;
  try {
    fn(ctx, 0, num_threads_);
  } catch (...) {
    error = std::current_exception();  // the workers still use ctx: wait for them first
  }
  s.wait_for_workers();
  s.busy.store(false, std::memory_order_release);
  if (error) std::rethrow_exception(error);
}

}  // namespace specdec
