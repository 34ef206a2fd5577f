// StealingSplit: every item handed out exactly once, owners walk their stretch in order, and a
// thread that finished helps the others - whatever the thread count and timing.
#include "backend/cpu/stealing_split.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "backend/cpu/thread_pool.h"

namespace specdec {
namespace {

// Runs the split on `pool`; thread `slow` (-1: none) sleeps before each claim. Returns how
// often each item was taken and records which thread took it.
std::vector<int> run_split(ThreadPool& pool, int64_t n, int slow, std::vector<int>* taker) {
  std::vector<std::atomic<int>> count(static_cast<size_t>(n));
  taker->assign(static_cast<size_t>(n), -1);
  StealingSplit split(n, pool.size());
  pool.run([&](int ti, int) {
    int64_t last_own = -1;
    for (StealingSplit::Claim c = split.next(ti); c.item >= 0; c = split.next(ti)) {
      if (ti == slow) std::this_thread::sleep_for(std::chrono::microseconds(200));
      ASSERT_LT(c.item, n);
      count[static_cast<size_t>(c.item)].fetch_add(1);
      (*taker)[static_cast<size_t>(c.item)] = ti;
      if (c.step > 0) {  // own stretch: strictly ascending
        EXPECT_GT(c.item, last_own);
        last_own = c.item;
      }
      // The look-ahead names items of the same walk, never past its end.
      const int64_t ahead = c.after(1);
      if (ahead >= 0) {
        EXPECT_EQ(ahead, c.item + c.step);
        EXPECT_LT(ahead, n);
      }
    }
  });
  std::vector<int> out;
  for (auto& c : count) out.push_back(c.load());
  return out;
}

TEST(StealingSplit, EveryItemExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 3, 7, 36, 60, 96, 1000}) {
      std::vector<int> taker;
      const std::vector<int> count = run_split(pool, n, -1, &taker);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(count[static_cast<size_t>(i)], 1) << "threads " << threads << " n " << n
                                                    << " item " << i;
      }
    }
  }
}

TEST(StealingSplit, SingleThreadWalksInOrder) {
  StealingSplit split(10, 1);
  for (int64_t i = 0; i < 10; ++i) {
    const StealingSplit::Claim c = split.next(0);
    EXPECT_EQ(c.item, i);
    EXPECT_EQ(c.after(4), i + 4 < 10 ? i + 4 : -1);
  }
  EXPECT_EQ(split.next(0).item, -1);
}

TEST(StealingSplit, StretchesMatchStretchBegin) {
  // Thread t's first claim is the first item of its stretch (what matmul_prefetch relies on).
  for (int nt : {1, 2, 3, 4}) {
    for (int64_t n : {5, 36, 61}) {
      StealingSplit split(n, nt);
      for (int t = 0; t < nt; ++t) {
        const int64_t begin = StealingSplit::stretch_begin(n, t, nt);
        if (begin < StealingSplit::stretch_begin(n, t + 1, nt)) {
          EXPECT_EQ(split.next(t).item, begin);
        }
      }
    }
  }
}

TEST(StealingSplit, OwnerBatchesStayItsOwnAndShrink) {
  // Thread 0's stretch is [0, 32): its first claim takes a batch of 32 / kBatchShare items.
  StealingSplit split(64, 2);
  EXPECT_EQ(split.next(0).item, 0);
  for (int64_t i = 32; i < 64; ++i) EXPECT_EQ(split.next(1).item, i);  // thread 1's own stretch
  // Thread 1 steals from the back of what thread 0 has not claimed, never from its batch.
  const StealingSplit::Claim stolen = split.next(1);
  EXPECT_EQ(stolen.item, 31);
  EXPECT_EQ(stolen.step, -1);
  const int64_t batch = 32 / StealingSplit::kBatchShare;
  for (int64_t i = 1; i < batch; ++i) EXPECT_EQ(split.next(0).item, i);
  // Thread 0 walks on in order while thread 1 takes the back, until they meet.
  std::vector<int> count(32, 0);
  count[0] = count[31] = 1;
  for (int64_t i = 1; i < batch; ++i) count[static_cast<size_t>(i)] = 1;
  int64_t last = batch - 1;
  for (;;) {
    const StealingSplit::Claim own = split.next(0);
    const StealingSplit::Claim theft = split.next(1);
    if (own.item >= 0) {
      EXPECT_GT(own.item, last);
      last = own.item;
      ++count[static_cast<size_t>(own.item)];
    }
    if (theft.item >= 0) ++count[static_cast<size_t>(theft.item)];
    if (own.item < 0 && theft.item < 0) break;
  }
  for (int v : count) EXPECT_EQ(v, 1);
}

TEST(StealingSplit, FastThreadTakesOverTheSlowOnesWork) {
  ThreadPool pool(2);
  std::vector<int> taker;
  const int64_t n = 64;
  const std::vector<int> count = run_split(pool, n, /*slow=*/1, &taker);
  int by_fast = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(count[static_cast<size_t>(i)], 1);
    by_fast += taker[static_cast<size_t>(i)] == 0;
  }
  // Thread 1 sleeps 200 us per item: thread 0 finishes its 32 and steals most of the rest.
  EXPECT_GT(by_fast, 40);
  // Thread 0 took its own stretch and stole from the back of thread 1's, so whatever thread 1
  // took is a run from the front of its stretch.
  for (int64_t i = 0; i < 32; ++i) EXPECT_EQ(taker[static_cast<size_t>(i)], 0);
  int64_t i = 32;
  while (i < n && taker[static_cast<size_t>(i)] == 1) ++i;
  for (; i < n; ++i) EXPECT_EQ(taker[static_cast<size_t>(i)], 0);
}

}  // namespace
}  // namespace specdec
