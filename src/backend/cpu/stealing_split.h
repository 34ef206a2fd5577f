// Work split for the threads of one ThreadPool::run over n independent items (say, blocks of
// weight rows) that are best processed in order: thread t owns the stretch
// [n·t/nt, n·(t+1)/nt) and takes items from its front, in order (claimed in small batches); a
// thread whose stretch is done takes items one at a time from the back of the stretch with the
// most left. On a shared host a core's speed changes from moment to moment, and with a static
// split the fast thread waits for the slow one at every join; here it finishes the slow one's
// work instead. Each thread still reads one contiguous, ascending stretch of memory most of the
// time (what the prefetchers want).
//
// Every item is handed out exactly once. Claims use one compare-and-swap on the stretch's own
// cache line (uncontended until a thief arrives); the ThreadPool::run join orders the items'
// results for the caller. An owner claims a batch of up to kMaxBatch items at once - an eighth
// of what its stretch has left, so batches shrink to single items towards its end and a thief
// still finds the unclaimed rest - and hands them out one by one from its own line: the locked
// instruction waits for the previous item's stores and stops the next item's loads from
// starting early, and per item it was ~3% of an 8-token forward pass's samples (16-row blocks;
// batched: paired A/B 0.987x for 8 new tokens, 0.997x for one, at 512 cached).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

namespace specdec {

class StealingSplit {
 public:
  static constexpr int kMaxStretches = 32;  // threads beyond it only steal
  static constexpr uint32_t kMaxBatch = 8;     // items an owner claims at once, at most
  static constexpr uint32_t kBatchShare = 8;   // .. and at most 1 / kBatchShare of its stretch

  // n items for nt threads; n < 2^31.
  StealingSplit(int64_t n, int nt) : stretches_(std::clamp(nt, 1, kMaxStretches)) {
    for (int s = 0; s < stretches_; ++s) {
      const auto front = static_cast<uint32_t>(stretch_begin(n, s, nt));
      const auto back = static_cast<uint32_t>(stretch_begin(n, s + 1, nt));
      slot_[s].range.store(pack(front, back), std::memory_order_relaxed);
      batch_[s] = Batch{};
    }
  }

  // The first item of thread t's stretch (t = nt, or the last stretch + 1: n); threads from
  // kMaxStretches on own none.
  static int64_t stretch_begin(int64_t n, int t, int nt) {
    const int s = std::clamp(nt, 1, kMaxStretches);
    return t >= s ? n : n * t / s;
  }

  struct Claim {
    int64_t item = -1;  // -1: nothing left
    // The direction this thread walks (+1 on its own stretch, -1 when stealing) and the end
    // (exclusive) of the items left there when it claimed: what it will likely take next.
    int step = 1;
    int64_t end = -1;
    // The item k places further on, or -1 if there was none when claimed.
    int64_t after(int k) const {
      const int64_t i = item + static_cast<int64_t>(k) * step;
      return (step > 0 ? i < end : i > end) ? i : -1;
    }
  };

  // The next item for thread ti.
  Claim next(int ti) {
    if (ti < stretches_) {
      Batch& b = batch_[ti];
      if (b.next < b.end) return {b.next++, 1, b.claim_end};
      std::atomic<uint64_t>& r = slot_[ti].range;
      uint64_t cur = r.load(std::memory_order_relaxed);
      while (front(cur) < back(cur)) {
        const uint32_t take = std::clamp<uint32_t>((back(cur) - front(cur)) / kBatchShare, 1,
                                                   kMaxBatch);
        if (r.compare_exchange_weak(cur, pack(front(cur) + take, back(cur)),
                                    std::memory_order_relaxed)) {
          b.next = front(cur) + 1;
          b.end = front(cur) + take;
          b.claim_end = back(cur);
          return {front(cur), 1, back(cur)};
        }
      }
    }
    // Steal from the back of the stretch with the most items left.
    for (;;) {
      int victim = -1;
      uint32_t most = 0;
      for (int s = 0; s < stretches_; ++s) {
        const uint64_t cur = slot_[s].range.load(std::memory_order_relaxed);
        if (back(cur) > front(cur) && back(cur) - front(cur) > most) {
          most = back(cur) - front(cur);
          victim = s;
        }
      }
      if (victim < 0) return {};
      std::atomic<uint64_t>& r = slot_[victim].range;
      uint64_t cur = r.load(std::memory_order_relaxed);
      while (front(cur) < back(cur)) {
        if (r.compare_exchange_weak(cur, pack(front(cur), back(cur) - 1),
                                    std::memory_order_relaxed)) {
          return {static_cast<int64_t>(back(cur)) - 1, -1, static_cast<int64_t>(front(cur)) - 1};
        }
      }
    }
  }

 private:
  static uint64_t pack(uint32_t front, uint32_t back) {
    return static_cast<uint64_t>(back) << 32 | front;
  }
  static uint32_t front(uint64_t v) { return static_cast<uint32_t>(v); }
  static uint32_t back(uint64_t v) { return static_cast<uint32_t>(v >> 32); }

  struct alignas(64) Slot {
    std::atomic<uint64_t> range{0};  // front | back << 32: items [front, back) not yet taken
  };
  // An owner's claimed batch: items [next, end) are its own, taken in order without a claim;
  // claim_end is the stretch's back when it was claimed. Written by the owner only; set empty
  // by the constructor for the stretches in use only (a split is built per matmul call, and
  // the other entries are never read).
  struct alignas(64) Batch {
    int64_t next;
    int64_t end;
    int64_t claim_end;
  };
  int stretches_;
  std::array<Slot, kMaxStretches> slot_;
  std::array<Batch, kMaxStretches> batch_;
};

}  // namespace specdec
