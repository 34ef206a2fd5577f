// ThreadPool: every index covered exactly once, chunks aligned to the grain, 1..4 threads,
// nested and concurrent use, sleeping workers waking up, exceptions, many rapid jobs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "util/check.h"

namespace specdec {
namespace {

void expect_exact_cover(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::atomic<int> calls{0};
  std::atomic<bool> misaligned{false};
  pool.parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    calls.fetch_add(1);
    if (begin % grain != 0 || begin >= end || end > n) misaligned = true;
    for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1)
        << "n=" << n << " grain=" << grain << " i=" << i;
  }
  EXPECT_FALSE(misaligned.load()) << "n=" << n << " grain=" << grain;
  EXPECT_LE(calls.load(), pool.size());
  if (n == 0) {
    EXPECT_EQ(calls.load(), 0);
  }
}

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 8, 9, 100, 1000, 4097}) {
      for (int64_t grain : {1, 3, 8, 64}) expect_exact_cover(pool, n, grain);
    }
  }
}

TEST(ThreadPool, RunCallsEveryThreadIndexOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> seen(static_cast<size_t>(threads));
    std::atomic<bool> bad_count{false};
    pool.run([&](int ti, int nt) {
      if (nt != threads) bad_count = true;
      seen[static_cast<size_t>(ti)].fetch_add(1);
    });
    EXPECT_FALSE(bad_count.load());
    for (int t = 0; t < threads; ++t) EXPECT_EQ(seen[static_cast<size_t>(t)].load(), 1) << t;
  }
}

TEST(ThreadPool, ManyRapidJobs) {
  ThreadPool pool(2);
  std::vector<int64_t> per_thread(2, 0);  // each slot written by one thread only
  std::atomic<int64_t> total{0};
  constexpr int kJobs = 100000;
  for (int j = 0; j < kJobs; ++j) {
    pool.run([&](int ti, int) {
      per_thread[static_cast<size_t>(ti)] += 1;
      total.fetch_add(j % 7);
    });
  }
  EXPECT_EQ(per_thread[0], kJobs);
  EXPECT_EQ(per_thread[1], kJobs);
  int64_t want = 0;
  for (int j = 0; j < kJobs; ++j) want += 2 * (j % 7);
  EXPECT_EQ(total.load(), want);
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  const int64_t outer = 10, inner = 37;
  std::vector<std::atomic<int>> hits(static_cast<size_t>(outer * inner));
  pool.parallel_for(outer, 1, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      pool.parallel_for(inner, 4, [&](int64_t ib, int64_t ie) {
        for (int64_t i = ib; i < ie; ++i) hits[static_cast<size_t>(o * inner + i)].fetch_add(1);
      });
    }
  });
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << i;
}

// Two threads calling the same pool at once: every call of each covers its range exactly once
// (no range lost to or run twice for the other caller) and returns only when its work is done.
TEST(ThreadPool, ConcurrentCallersEachGetTheirWorkDoneOnce) {
  ThreadPool pool(2);
  auto caller = [&](std::vector<int>* bad_calls) {
    std::vector<std::atomic<int>> hits(100);
    for (int j = 0; j < 2000; ++j) {
      for (auto& h : hits) h.store(0);
      pool.parallel_for(100, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (const auto& h : hits) {
        if (h.load() != 1) {  // read after the call returned: all of it must be done
          bad_calls->push_back(j);
          break;
        }
      }
    }
  };
  std::vector<int> bad_a, bad_b;
  std::thread a(caller, &bad_a), b(caller, &bad_b);
  a.join();
  b.join();
  EXPECT_TRUE(bad_a.empty()) << bad_a.size() << " calls of caller a, first " << bad_a.front();
  EXPECT_TRUE(bad_b.empty()) << bad_b.size() << " calls of caller b, first " << bad_b.front();
}

TEST(ThreadPool, WorkersWakeAfterSleeping) {
  ThreadPool pool(2);
  for (int j = 0; j < 5; ++j) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));  // longer than the spin phase
    std::atomic<int> count{0};
    pool.run([&](int, int) { count.fetch_add(1); });
    EXPECT_EQ(count.load(), 2);
  }
}

TEST(ThreadPool, ExceptionOnCallerPropagatesAndPoolStaysUsable) {
  ThreadPool pool(2);
  std::atomic<int> worker_done{0};
  EXPECT_THROW(pool.run([&](int ti, int) {
    if (ti == 0) throw std::runtime_error("boom");
    worker_done.fetch_add(1);
  }),
               std::runtime_error);
  EXPECT_EQ(worker_done.load(), 1);  // run() waited for the worker before rethrowing
  expect_exact_cover(pool, 100, 1);
}

TEST(ThreadPool, RejectsZeroThreads) {
  EXPECT_THROW(ThreadPool pool(0), Error);
}

}  // namespace
}  // namespace specdec
