#include "kv/kv_cache.h"

#include <cstring>

#include "util/check.h"

namespace specdec {

KvCache::KvCache(int n_layers, int n_kv_heads, int head_dim, int64_t capacity)
    : n_layers_(n_layers),
      row_floats_(static_cast<int64_t>(n_kv_heads) * head_dim),
      capacity_(capacity),
      k_(static_cast<size_t>(n_layers) * capacity * n_kv_heads * head_dim),
      v_(static_cast<size_t>(n_layers) * capacity * n_kv_heads * head_dim) {
  SPECDEC_CHECK(n_layers > 0 && n_kv_heads > 0 && head_dim > 0 && capacity > 0, "bad KV shape");
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
  const size_t row_bytes = static_cast<size_t>(row_floats_) * sizeof(float);
  for (int layer = 0; layer < n_layers_; ++layer) {
    float* kl = k(layer);
    float* vl = v(layer);
    for (size_t i = 0; i < keep.size(); ++i) {
      const int64_t dst = base + static_cast<int64_t>(i);
      if (keep[i] == dst) continue;
      std::memcpy(kl + dst * row_floats_, kl + keep[i] * row_floats_, row_bytes);
      std::memcpy(vl + dst * row_floats_, vl + keep[i] * row_floats_, row_bytes);
    }
  }
  size_ = base + static_cast<int64_t>(keep.size());
}

}  // namespace specdec
