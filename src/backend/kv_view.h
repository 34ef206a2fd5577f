// Where one layer's cached K and V of one sequence live, as the attention kernels read them: a
// contiguous cache (KvCache) or the blocks of a paged cache (kv/paged_kv.h) through the
// sequence's block table.
//
//   slot s lives at slot s % block_slots of block table[s / block_slots];
//   block b's K begins at k + b * k_block_bytes, its V at v + b * v_block_bytes;
//   inside a block the slots have the contiguous layout: V rows [block_slots, n_kv_heads,
//   head_dim]; K the same rows (f32) or tiles of 16 slots (f16, q8_0: backend/k_tiles.h).
//   q8_0 also has the scales of K and V, [n_kv_heads, block_slots] floats per block (a head's
//   scales contiguous): block b's at k_scale + b * scale_block_floats (v_scale likewise).
//
// block_slots is a multiple of kKTileSlots, so a block holds whole K tiles. Blocks whose ids
// follow each other are next to each other in memory with the same layout, so a run of slots
// over consecutive block ids is one contiguous range, addressed from its first block (kv_run).
// table == nullptr: one contiguous block (block 0), block_slots its capacity.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/k_tiles.h"
#include "backend/kv_type.h"

namespace specdec {

struct KvView {
  const uint8_t* k = nullptr;
  const uint8_t* v = nullptr;
  KvType type = KvType::kF16;
  int64_t block_slots = 0;
  int64_t k_block_bytes = 0;
  int64_t v_block_bytes = 0;
  const float* k_scale = nullptr;  // q8_0 only
  const float* v_scale = nullptr;  // q8_0 only
  int64_t scale_block_floats = 0;  // q8_0: n_kv_heads * block_slots
  const int32_t* table = nullptr;  // [blocks covering the sequence's slots] or nullptr

  // A contiguous cache of `slots` slots (K of an f16 cache: whole tiles). Not for q8_0, whose
  // scales come from its storage (PagedKvStorage::view).
  static KvView contiguous(const void* k, const void* v, KvType type, int64_t slots) {
    KvView view;
    view.k = static_cast<const uint8_t*>(k);
    view.v = static_cast<const uint8_t*>(v);
    view.type = type;
    view.block_slots = std::max<int64_t>(k_tile_slots(slots), kKTileSlots);
    return view;
  }
};

// Slots [slot, slot + n) of a view that lie in one contiguous range: k, v point at the start of
// the range's first block, `local` is the first slot's index from there.
struct KvRun {
  const uint8_t* k = nullptr;
  const uint8_t* v = nullptr;
  const float* k_scale = nullptr;  // q8_0: the scales of the run's first block
  const float* v_scale = nullptr;  // (for_run_scales)
  int64_t local = 0;  // slot index relative to k / v
  int64_t n = 0;      // slots in the run (<= the n asked for, >= 1)
};

// The longest contiguous run of slots that starts at `slot`, at most n (>= 1) slots; every slot
// in [slot, slot + n) must be covered by the table.
inline KvRun kv_run(const KvView& kv, int64_t slot, int64_t n) {
  if (kv.table == nullptr) return {kv.k, kv.v, kv.k_scale, kv.v_scale, slot, n};
  const int64_t bs = kv.block_slots;
  int64_t index = slot / bs;
  const int32_t block = kv.table[index];
  const int64_t local = slot - index * bs;
  int64_t avail = bs - local;
  while (avail < n && kv.table[index + 1] == kv.table[index] + 1) {
    avail += bs;
    ++index;
  }
  const int64_t scales = block * kv.scale_block_floats;
  return {kv.k + block * kv.k_block_bytes,
          kv.v + block * kv.v_block_bytes,
          kv.k_scale == nullptr ? nullptr : kv.k_scale + scales,
          kv.v_scale == nullptr ? nullptr : kv.v_scale + scales,
          local,
          std::min(avail, n)};
}

// Calls fn(offset, run) for the contiguous runs covering [slot, slot + n), in slot order;
// offset = the run's first slot - slot.
template <class F>
void for_kv_runs(const KvView& kv, int64_t slot, int64_t n, F&& fn) {
  for (int64_t done = 0; done < n;) {
    const KvRun run = kv_run(kv, slot + done, n - done);
    fn(done, run);
    done += run.n;
  }
}

// q8_0: the scales of KV head h for the slots [run.local, run.local + run.n) of a run, block by
// block: fn(j, d, count) for slots run.local + j .. + count - 1, whose scales are d[0 .. count).
// scales: the run's k_scale or v_scale.
template <class F>
void for_run_scales(const KvView& kv, const float* scales, const KvRun& run, int h, F&& fn) {
  const int64_t bs = kv.block_slots;
  for (int64_t j = 0; j < run.n;) {
    const int64_t slot = run.local + j;
    const int64_t count = std::min(run.n - j, bs - slot % bs);
    fn(j, scales + slot / bs * kv.scale_block_floats + h * bs + slot % bs, count);
    j += count;
  }
}

}  // namespace specdec
