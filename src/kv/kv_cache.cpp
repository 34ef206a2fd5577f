#include "kv/kv_cache.h"

#include <algorithm>

#include "backend/k_tiles.h"
#include "util/check.h"

namespace specdec {

KvCache::KvCache(int n_layers, int n_kv_heads, int head_dim, int64_t capacity, KvType type,
                 std::unique_ptr<KvDeviceMemory> device)
    : capacity_(capacity),
      storage_(n_layers, n_kv_heads, head_dim, 1, storage_slots(capacity), type,
               std::move(device)) {
  SPECDEC_CHECK(capacity > 0, "bad KV shape");
}

int64_t KvCache::storage_slots(int64_t capacity) {
  return k_tile_slots(std::max<int64_t>(capacity, 1));
}

void KvCache::write(int layer, int64_t slot, int64_t n, const float* k, const float* v) {
  SPECDEC_CHECK(layer >= 0 && layer < n_layers() && slot >= 0 && n >= 0 && slot + n <= capacity_,
                "KV write outside the cache");
  storage_.write(layer, table_, slot, n, k, v);
}

void KvCache::read(int layer, int64_t slot, int64_t n, float* k, float* v) const {
  SPECDEC_CHECK(layer >= 0 && layer < n_layers() && slot >= 0 && n >= 0 && slot + n <= capacity_,
                "KV read outside the cache");
  storage_.read(layer, table_, slot, n, k, v);
}

void KvCache::append(int64_t n) {
  SPECDEC_CHECK(n >= 0 && size_ + n <= capacity_, "KV append past capacity");
  size_ += n;
}

void KvCache::truncate(int64_t n) {
  SPECDEC_CHECK(n >= 0 && n <= size_, "KV truncate past size");
  size_ = n;
}

void KvCache::keep_slots(int64_t base, std::span<const int64_t> keep) {
  SPECDEC_CHECK(base >= 0 && base <= size_, "KV keep_slots base past size");
  int64_t prev = base - 1;
  for (int64_t s : keep) {
    SPECDEC_CHECK(s > prev && s < size_, "KV keep_slots needs increasing slots inside the cache");
    prev = s;
  }
  for (size_t i = 0; i < keep.size(); ++i) {
    storage_.copy_slot(table_, keep[i], base + static_cast<int64_t>(i));
  }
  size_ = base + static_cast<int64_t>(keep.size());
}

}  // namespace specdec
