#include "kv/kv_cache.h"

#include <cstring>

#include "backend/cpu/ops.h"  // f32_to_f16, f16_to_f32
#include "kv/k_tiles.h"
#include "util/check.h"

namespace specdec {

KvCache::KvCache(int n_layers, int n_kv_heads, int head_dim, int64_t capacity, KvType type)
    : n_layers_(n_layers),
      n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      row_elems_(static_cast<int64_t>(n_kv_heads) * head_dim),
      capacity_(capacity),
      k_slots_(k_tiled(type) ? k_tile_slots(capacity) : capacity),
      type_(type) {
  SPECDEC_CHECK(n_layers > 0 && n_kv_heads > 0 && head_dim > 0 && capacity > 0, "bad KV shape");
  const auto layers = static_cast<size_t>(n_layers);
  // Zeroed: the tail of a partly filled tile is read (and discarded) by the attention kernels.
  // Huge pages where the system allows (util/huge_pages.h): decode and verification read every
  // layer's K/V rows once per step, as they read the weights.
  k_ = HugeBuffer(layers * static_cast<size_t>(k_slots_) * row_bytes());
  v_ = HugeBuffer(layers * static_cast<size_t>(capacity) * row_bytes());
}

void KvCache::write(int layer, int64_t slot, int64_t n, const float* k, const float* v) {
  SPECDEC_CHECK(layer >= 0 && layer < n_layers_ && slot >= 0 && n >= 0 && slot + n <= capacity_,
                "KV write outside the cache");
  const int64_t elems = n * row_elems_;
  if (type_ == KvType::kF32) {
    std::memcpy(k_at(layer, slot), k, static_cast<size_t>(elems) * sizeof(float));
    std::memcpy(v_at(layer, slot), v, static_cast<size_t>(elems) * sizeof(float));
  } else {
    uint16_t* rows = grow_halves(elems);  // [n, n_kv_heads, head_dim]
    f32_to_f16(k, elems, rows);
    k_rows_to_tiles(rows, slot, n, n_kv_heads_, head_dim_, k_tiles(layer));
    f32_to_f16(v, elems, reinterpret_cast<uint16_t*>(v_at(layer, slot)));
  }
}

uint16_t* KvCache::grow_halves(int64_t n) {
  if (halves_.size() < static_cast<size_t>(n)) halves_.resize(static_cast<size_t>(n));
  return halves_.data();
}

void KvCache::read(int layer, int64_t slot, int64_t n, float* k, float* v) const {
  SPECDEC_CHECK(layer >= 0 && layer < n_layers_ && slot >= 0 && n >= 0 && slot + n <= capacity_,
                "KV read outside the cache");
  const int64_t elems = n * row_elems_;
  if (v != nullptr) {
    const uint8_t* src = v_.data() + layer_offset(layer) + static_cast<size_t>(slot) * row_bytes();
    if (type_ == KvType::kF32) {
      std::memcpy(v, src, static_cast<size_t>(elems) * sizeof(float));
    } else {
      f16_to_f32(reinterpret_cast<const uint16_t*>(src), elems, v);
    }
  }
  if (k == nullptr) return;
  if (type_ == KvType::kF32) {
    const uint8_t* src =
        k_.data() + k_layer_offset(layer) + static_cast<size_t>(slot) * row_bytes();
    std::memcpy(k, src, static_cast<size_t>(elems) * sizeof(float));
    return;
  }
  // Tiles -> rows of halves [n, n_kv_heads, head_dim], then -> float.
  const auto* tiles = static_cast<const uint16_t*>(this->k(layer));
  std::vector<uint16_t> rows(static_cast<size_t>(elems));
  for (int h = 0; h < n_kv_heads_; ++h) {
    k_tiles_to_head_rows(tiles, slot, n, h, n_kv_heads_, head_dim_,
                         rows.data() + static_cast<int64_t>(h) * head_dim_, row_elems_);
  }
  f16_to_f32(rows.data(), elems, k);
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
      if (k_tiled(type_)) {
        uint16_t* tiles = k_tiles(layer);
        for (int h = 0; h < n_kv_heads_; ++h) {
          for (int d = 0; d < head_dim_; ++d) {
            tiles[k_tile_index(dst, h, d, n_kv_heads_, head_dim_)] =
                tiles[k_tile_index(keep[i], h, d, n_kv_heads_, head_dim_)];
          }
        }
      } else {
        std::memcpy(k_at(layer, dst), k_at(layer, keep[i]), row_bytes());
      }
      std::memcpy(v_at(layer, dst), v_at(layer, keep[i]), row_bytes());
    }
  }
  size_ = base + static_cast<int64_t>(keep.size());
}

}  // namespace specdec
