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
//
// Every wait is a spin (a decode step's jobs are microseconds apart), but on an oversubscribed
// machine the kernel may put two pool threads on one core; a waiter that spins there starves the
// thread it waits for until the time slice ends (milliseconds). So each thread publishes the CPU
// it runs on, and a waiter yields as soon as the thread it waits for last ran on its own CPU
// (and after kYieldAfterNs of waiting regardless).
#include "backend/cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <sched.h>

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
// After this long, any wait yields on every check.
constexpr int64_t kYieldAfterNs = 50'000;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int current_cpu() {
  const int cpu = sched_getcpu();
  return cpu < 0 ? -2 : cpu;  // -2 never equals a published CPU (-1 = not published yet)
}

struct alignas(64) PaddedCpu {
  std::atomic<int> cpu{-1};
};

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
  std::unique_ptr<PaddedCpu[]> cpus;  // [num_threads] CPU each thread last reported

  void publish_cpu(int index) { cpus[index].cpu.store(current_cpu(), std::memory_order_relaxed); }
  bool shares_my_cpu(int index, int my_cpu) const {
    return cpus[index].cpu.load(std::memory_order_relaxed) == my_cpu;
  }

  // Waits until the generation differs from `seen` (or stop); returns the new generation.
  uint64_t wait_for_job(int index, uint64_t seen) {
    int64_t start = 0;
    int my_cpu = current_cpu();
    cpus[index].cpu.store(my_cpu, std::memory_order_relaxed);
    for (uint32_t i = 0;; ++i) {
      const uint64_t g = generation.load(std::memory_order_acquire);
      if (g != seen || stop.load(std::memory_order_relaxed)) return g;
      SPECDEC_CPU_RELAX();
      if ((i & 63) == 63) {
        const int64_t t = now_ns();
        if (start == 0) start = t;
        if (t - start > kSpinNs) break;
        if (shares_my_cpu(0, my_cpu) || t - start > kYieldAfterNs) {
          std::this_thread::yield();
          my_cpu = current_cpu();
          cpus[index].cpu.store(my_cpu, std::memory_order_relaxed);
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
      seen = wait_for_job(index, seen);
      if (stop.load(std::memory_order_acquire)) return;
      publish_cpu(index);
      fn(ctx, index, num_threads);
      pending.fetch_sub(1, std::memory_order_release);
    }
  }

  // Spins until *flag != 0, yielding when thread `awaited` shares this CPU or after a while.
  void wait_for_flag(const std::atomic<int>& flag, int awaited) const {
    int64_t start = 0;
    int my_cpu = current_cpu();
    for (uint32_t i = 0; flag.load(std::memory_order_acquire) == 0; ++i) {
      SPECDEC_CPU_RELAX();
      if ((i & 15) == 15) {
        const int64_t t = now_ns();
        if (start == 0) start = t;
        if (shares_my_cpu(awaited, my_cpu) || t - start > kYieldAfterNs) {
          std::this_thread::yield();
          my_cpu = current_cpu();
        }
      }
    }
  }

  void wait_for_workers(int num_threads) {
    int64_t start = 0;
    int my_cpu = current_cpu();
    for (uint32_t i = 0; pending.load(std::memory_order_acquire) != 0; ++i) {
      SPECDEC_CPU_RELAX();
      if ((i & 15) == 15) {
        const int64_t t = now_ns();
        if (start == 0) start = t;
        bool shared = t - start > kWaitSpinNs;
        for (int w = 1; w < num_threads && !shared; ++w) shared = shares_my_cpu(w, my_cpu);
        if (shared || t - start > kYieldAfterNs) {
          std::this_thread::yield();
          my_cpu = current_cpu();
          cpus[0].cpu.store(my_cpu, std::memory_order_relaxed);
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
  shared_->cpus = std::make_unique<PaddedCpu[]>(static_cast<size_t>(num_threads));
  shared_->workers.reserve(static_cast<size_t>(num_threads - 1));
  for (int i = 1; i < num_threads; ++i) {
    shared_->workers.emplace_back(
        [s = shared_, i, num_threads] { s->worker_main(i, num_threads); });
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
  s.publish_cpu(0);
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
  s.wait_for_workers(num_threads_);
  s.busy.store(false, std::memory_order_release);
  if (error) std::rethrow_exception(error);
}

void ThreadPool::wait_for_flag(const std::atomic<int>& flag, int awaited) const {
  if (awaited < 0 || awaited >= num_threads_) awaited = 0;
  shared_->wait_for_flag(flag, awaited);
}

void ThreadPool::arrive_and_wait(std::atomic<int>& arrived, std::atomic<int>& open, int ti,
                                 int nt) const {
  if (arrived.fetch_add(1, std::memory_order_acq_rel) == nt - 1) {
    open.store(1, std::memory_order_release);
  } else {
    wait_for_flag(open, (ti + 1) % nt);
  }
}

}  // namespace specdec
