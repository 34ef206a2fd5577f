#include "kv/kv_cache.h"

#include <cstring>

#include "backend/cpu/ops.h"  // f32_to_f16, f16_to_f32
#include "util/check.h"

namespace specdec {

KvCache::KvCache(int n_layers, int n_kv_heads, int head_dim, int64_t capacity, KvType type)
    : n_layers_(n_layers),
      row_elems_(static_cast<int64_t>(n_kv_heads) * head_dim),
      capacity_(capacity),
      type_(type) {
  SPECDEC_CHECK(n_layers > 0 && n_kv_heads > 0 && head_dim > 0 && capacity > 0, "bad KV shape");
  const size_t bytes = static_cast<size_t>(n_layers) * static_cast<size_t>(capacity) * row_bytes();
  k_.resize(bytes);
  v_.resize(bytes);
}

void KvCache::write(int layer, int64_t slot, int64_t n, const float* k, const float* v) {
  SPECDEC_CHECK(layer >= 0 && layer < n_layers_ && slot >= 0 && n >= 0 && slot + n <= capacity_,
                "KV write outside the cache");
  const int64_t elems = n * row_elems_;
  if (type_ == KvType::kF32) {
    std::memcpy(k_at(layer, slot), k, static_cast<size_t>(elems) * sizeof(float));
    std::memcpy(v_at(layer, slot), v, static_cast<size_t>(elems) * sizeof(float));
  } else {
    f32_to_f16(k, elems, reinterpret_cast<uint16_t*>(k_at(layer, slot)));
    f32_to_f16(v, elems, reinterpret_cast<uint16_t*>(v_at(layer, slot)));
  }
}

void KvCache::read(int layer, int64_t slot, int64_t n, float* k, float* v) const {
  SPECDEC_CHECK(layer >= 0 && layer < n_layers_ && slot >= 0 && n >= 0 && slot + n <= capacity_,
                "KV read outside the cache");
  const int64_t elems = n * row_elems_;
  const size_t offset = layer_offset(layer) + static_cast<size_t>(slot) * row_bytes();
  for (int which = 0; which < 2; ++which) {
    float* dst = which == 0 ? k : v;
    if (dst == nullptr) continue;
    const uint8_t* src = (which == 0 ? k_ : v_).data() + offset;
    if (type_ == KvType::kF32) {
      std::memcpy(dst, src, static_cast<size_t>(elems) * sizeof(float));
    } else {
      f16_to_f32(reinterpret_cast<const uint16_t*>(src), elems, dst);
    }
  }
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
  for (int layer = 0; layer < n_layers_; ++layer) {
    for (size_t i = 0; i < keep.size(); ++i) {
      const int64_t dst = base + static_cast<int64_t>(i);
      if (keep[i] == dst) continue;
      std::memcpy(k_at(layer, dst), k_at(layer, keep[i]), row_bytes());
      std::memcpy(v_at(layer, dst), v_at(layer, keep[i]), row_bytes());
    }
  }
  size_ = base + static_cast<int64_t>(keep.size());
}

}  // namespace specdec
