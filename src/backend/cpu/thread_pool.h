// A fixed pool of worker threads for data-parallel kernels. The calling thread takes part as
// thread 0, so ThreadPool(1) runs everything inline. Workers spin briefly between jobs (a decode
// step launches a few hundred small jobs) and then sleep. run() does not allocate. A run() issued
// while the pool is busy - from inside a job, or from a second thread - runs inline as a
// one-thread job (num_threads == 1) instead of deadlocking. Jobs must not throw on workers; an
// exception on the calling thread is rethrown after the workers finished.
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>

namespace specdec {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);  // num_threads >= 1, caller included
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return num_threads_; }

  // Calls fn(ctx, thread_index, num_threads) once on every thread and returns when all are done.
  void run(void (*fn)(void* ctx, int thread_index, int num_threads), void* ctx);

  // Calls body(thread_index, num_threads) on every thread.
  template <class F>
  void run(F&& body) {
    run([](void* ctx, int ti, int nt) { (*static_cast<std::remove_reference_t<F>*>(ctx))(ti, nt); },
        const_cast<void*>(static_cast<const void*>(&body)));
  }

  // For jobs whose threads wait on each other: returns once flag != 0 (acquire). Spins, but
  // yields the core whenever thread `awaited` of this pool (the one that sets the flag) last ran
  // on this same core, and after 50 us regardless - so an oversubscribed machine that puts two
  // pool threads on one core does not make the waiter starve the thread it waits for.
  void wait_for_flag(const std::atomic<int>& flag, int awaited) const;

  // A barrier of the nt threads of one job, both counters starting at 0: thread ti counts itself
  // in `arrived`; the last to arrive sets `open`, the others wait for it (wait_for_flag).
  void arrive_and_wait(std::atomic<int>& arrived, std::atomic<int>& open, int ti, int nt) const;

  // Splits [0, n) into contiguous chunks (multiples of `grain`) and calls body(begin, end).
  template <class F>
  void parallel_for(int64_t n, int64_t grain, F&& body) {
    if (n <= 0) return;
    run([&](int ti, int nt) {
      const int64_t units = (n + grain - 1) / grain;
      const int64_t begin = units * ti / nt * grain;
      int64_t end = units * (ti + 1) / nt * grain;
      if (end > n) end = n;
      if (begin < end) body(begin, end);
    });
  }

 private:
  struct Shared;
  int num_threads_;
  Shared* shared_;
};

}  // namespace specdec
