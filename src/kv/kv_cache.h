#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "backend/kv_type.h"
#include "kv/kv_device.h"
#include "kv/paged_kv.h"

namespace specdec {

// Per-sequence contiguous K/V cache (the single-sequence Generator's, and a draft model's): a
// PagedKvStorage of one block as large as the context, so it has the paged layout - for every
// layer one row of n_kv_heads * head_dim elements per token slot, for K and for V, stored as
// `type()` (f16 by default, f32 for the exact reference arithmetic); an f16 cache keeps K in
// tiles of 16 slots (backend/k_tiles.h). Slots [0, size()) hold tokens; a forward pass writes its
// new tokens' rows at slots size() .. and the caller append()s them; speculative decoding rolls
// back with truncate() or keeps an accepted tree path with keep_slots().
class KvCache {
 public:
  // device: the memory of the one block (storage_slots(capacity) slots) when the cache is on a
  // device (Model::make_kv_cache makes it); null: host memory.
  KvCache(int n_layers, int n_kv_heads, int head_dim, int64_t capacity, KvType type = KvType::kF16,
          std::unique_ptr<KvDeviceMemory> device = nullptr);
  // The slots of the storage's one block for a cache of `capacity` tokens (whole K tiles).
  static int64_t storage_slots(int64_t capacity);

  int64_t size() const { return size_; }
  int64_t capacity() const { return capacity_; }
  int n_layers() const { return storage_.n_layers(); }
  KvType type() const { return storage_.type(); }
  int64_t row_elems() const { return storage_.row_elems(); }  // n_kv_heads * head_dim
  int n_kv_heads() const { return storage_.n_kv_heads(); }
  int head_dim() const { return storage_.head_dim(); }
  bool on_device() const { return storage_.on_device(); }
  PagedKvStorage& storage() { return storage_; }

  // K/V of one layer, elements of type() (float or IEEE half): V [slots, n_kv_heads, head_dim];
  // K the same for f32, tiles [slots / 16, n_kv_heads, head_dim, 16] for f16 (k_tiles.h);
  // slots = capacity rounded up to whole tiles. Throw specdec::Error for a cache on a device.
  const void* k(int layer) const { return storage_.view(layer, table_).k; }
  const void* v(int layer) const { return storage_.view(layer, table_).v; }

  // What a forward pass needs: the storage, the one-block table, size() cached slots.
  SeqKv seq() { return SeqKv{&storage_, {table_, 1}, size_, capacity_}; }

  // Stores the float rows k, v: [n, n_kv_heads, head_dim] at slots [slot, slot + n) of `layer`
  // (converted to type(), rounding to nearest even). slot + n <= capacity().
  void write(int layer, int64_t slot, int64_t n, const float* k, const float* v);
  // Reads slots [slot, slot + n) of `layer` back as floats into k, v: [n, n_kv_heads, head_dim]
  // (either may be null). slot + n <= capacity().
  void read(int layer, int64_t slot, int64_t n, float* k, float* v) const;

  // Marks n more slots as holding tokens (after a forward pass wrote them).
  void append(int64_t n);
  // Forgets every slot from n on (n <= size()).
  void truncate(int64_t n);
  // Tree acceptance: keeps slots [0, base) and then, in order, the slots listed in `keep`
  // (each >= base, strictly increasing), moved to base, base+1, ...; forgets the rest.
  void keep_slots(int64_t base, std::span<const int64_t> keep);
  void clear() { size_ = 0; }

 private:
  int64_t capacity_;
  PagedKvStorage storage_;  // one block of capacity_ slots rounded up to whole tiles
  int32_t table_[1] = {0};
  int64_t size_ = 0;
};

}  // namespace specdec
