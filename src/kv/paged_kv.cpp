#include "kv/paged_kv.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/ops.h"  // f32_to_f16, f16_to_f32
#include "backend/k_tiles.h"
#include "backend/kv_quant.h"
#include "kv/block_pieces.h"
#include "util/check.h"

namespace specdec {

PagedKvStorage::PagedKvStorage(int n_layers, int n_kv_heads, int head_dim, int32_t n_blocks,
                               int64_t block_slots, KvType type,
                               std::unique_ptr<KvDeviceMemory> device)
    : n_layers_(n_layers),
      n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      row_elems_(static_cast<int64_t>(n_kv_heads) * head_dim),
      n_blocks_(n_blocks),
      block_slots_(block_slots),
      type_(type),
      device_(std::move(device)) {
  SPECDEC_CHECK(n_layers > 0 && n_kv_heads > 0 && head_dim > 0 && n_blocks > 0, "bad KV shape");
  SPECDEC_CHECK(block_slots > 0 && block_slots % kKTileSlots == 0,
                "KV block size must be a positive multiple of 16 slots");
  if (device_ != nullptr) return;  // no host memory
  // Zeroed (HugeBuffer): the tail of a partly filled tile is read (and discarded) by the
  // attention kernels. Huge pages where the system allows (util/huge_pages.h): decode and
  // verification read every layer's K/V rows once per step, as they read the weights.
  const auto bytes = static_cast<size_t>(n_layers) * n_blocks * block_layer_bytes();
  k_ = HugeBuffer(bytes);
  v_ = HugeBuffer(bytes);
  const auto scales = static_cast<size_t>(n_layers) * n_blocks * block_scale_floats();
  k_scale_.assign(scales, 0.0f);
  v_scale_.assign(scales, 0.0f);
}

PagedKvStorage::PagedKvStorage(const PagedKvStorage& other)
    : n_layers_(other.n_layers_),
      n_kv_heads_(other.n_kv_heads_),
      head_dim_(other.head_dim_),
      row_elems_(other.row_elems_),
      n_blocks_(other.n_blocks_),
      block_slots_(other.block_slots_),
      type_(other.type_),
      k_(other.k_),
      v_(other.v_),
      k_scale_(other.k_scale_),
      v_scale_(other.v_scale_),
      device_(other.device_ != nullptr ? other.device_->clone() : nullptr) {}

PagedKvStorage& PagedKvStorage::operator=(const PagedKvStorage& other) {
  if (this != &other) *this = PagedKvStorage(other);
  return *this;
}

int32_t PagedKvStorage::blocks_in(int64_t bytes, int n_layers, int n_kv_heads, int head_dim,
                                  int64_t block_slots, KvType type) {
  const int64_t per_block = 2 * static_cast<int64_t>(n_layers) * block_slots * n_kv_heads *
                            (head_dim * static_cast<int64_t>(kv_type_bytes(type)) +
                             static_cast<int64_t>(kv_scale_bytes(type)));
  return static_cast<int32_t>(std::clamp<int64_t>(bytes / per_block, 0, INT32_MAX));
}

KvView PagedKvStorage::view(int layer, const int32_t* table) const {
  if (device_ != nullptr) throw Error("the KV cache is on the device");
  KvView view;
  view.k = k_block(layer, 0);
  view.v = v_block(layer, 0);
  view.type = type_;
  view.block_slots = block_slots_;
  view.k_block_bytes = block_layer_bytes();
  view.v_block_bytes = block_layer_bytes();
  if (type_ == KvType::kQ8) {
    view.k_scale = k_scales(layer, 0);
    view.v_scale = v_scales(layer, 0);
    view.scale_block_floats = block_scale_floats();
  }
  view.table = table;
  return view;
}

void PagedKvStorage::check_range(int layer, std::span<const int32_t> table, int64_t slot,
                                 int64_t n) const {
  SPECDEC_CHECK(layer >= 0 && layer < n_layers_ && slot >= 0 && n >= 0 &&
                    slot + n <= static_cast<int64_t>(table.size()) * block_slots_,
                "KV access outside the sequence's blocks");
}

void PagedKvStorage::write(int layer, std::span<const int32_t> table, int64_t slot, int64_t n,
                           const float* k, const float* v) {
  check_range(layer, table, slot, n);
  if (device_ != nullptr) {
    device_->write(layer, table, slot, n, k, v);
    return;
  }
  if (type_ == KvType::kQ8) {
    write_q8(layer, table, slot, n, k, v);
    return;
  }
  const size_t row_bytes = static_cast<size_t>(row_elems_) * kv_type_bytes(type_);
  uint16_t* k_halves = type_ == KvType::kF16 ? halves_scratch(n * row_elems_) : nullptr;
  if (k_halves != nullptr) f32_to_f16(k, n * row_elems_, k_halves);  // [n, n_kv_heads, head_dim]
  for_block_pieces(table, block_slots_, slot, n,
                   [&](int64_t o, int32_t block, int64_t local, int64_t count) {
    SPECDEC_DCHECK(block >= 0 && block < n_blocks_, "KV block id out of range");
    const int64_t elems = count * row_elems_;
    uint8_t* v_dst = v_block(layer, block) + local * row_bytes;
    if (type_ == KvType::kF32) {
      std::memcpy(k_block(layer, block) + local * row_bytes, k + o * row_elems_,
                  static_cast<size_t>(elems) * sizeof(float));
      std::memcpy(v_dst, v + o * row_elems_, static_cast<size_t>(elems) * sizeof(float));
    } else {
      k_rows_to_tiles(k_halves + o * row_elems_, local, count, n_kv_heads_, head_dim_,
                      reinterpret_cast<uint16_t*>(k_block(layer, block)));
      f32_to_f16(v + o * row_elems_, elems, reinterpret_cast<uint16_t*>(v_dst));
    }
  });
}

void PagedKvStorage::read(int layer, std::span<const int32_t> table, int64_t slot, int64_t n,
                          float* k, float* v) const {
  check_range(layer, table, slot, n);
  if (device_ != nullptr) {
    device_->read(layer, table, slot, n, k, v);
    return;
  }
  if (type_ == KvType::kQ8) {
    read_q8(layer, table, slot, n, k, v);
    return;
  }
  const size_t row_bytes = static_cast<size_t>(row_elems_) * kv_type_bytes(type_);
  for_block_pieces(table, block_slots_, slot, n,
                   [&](int64_t o, int32_t block, int64_t local, int64_t count) {
    const int64_t elems = count * row_elems_;
    if (v != nullptr) {
      const uint8_t* src = v_block(layer, block) + local * row_bytes;
      if (type_ == KvType::kF32) {
        std::memcpy(v + o * row_elems_, src, static_cast<size_t>(elems) * sizeof(float));
      } else {
        f16_to_f32(reinterpret_cast<const uint16_t*>(src), elems, v + o * row_elems_);
      }
    }
    if (k == nullptr) return;
    if (type_ == KvType::kF32) {
      std::memcpy(k + o * row_elems_, k_block(layer, block) + local * row_bytes,
                  static_cast<size_t>(elems) * sizeof(float));
      return;
    }
    // Tiles -> rows of halves [count, n_kv_heads, head_dim], then -> float.
    const auto* tiles = reinterpret_cast<const uint16_t*>(k_block(layer, block));
    uint16_t* rows = halves_scratch(elems);
    for (int h = 0; h < n_kv_heads_; ++h) {
      k_tiles_to_head_rows(tiles, local, count, h, n_kv_heads_, head_dim_,
                           rows + static_cast<int64_t>(h) * head_dim_, row_elems_);
    }
    f16_to_f32(rows, elems, k + o * row_elems_);
  });
}

void PagedKvStorage::copy_slot(std::span<const int32_t> table, int64_t from, int64_t to) {
  check_range(0, table, std::max(from, to), 1);
  SPECDEC_CHECK(from >= 0 && to >= 0, "KV copy_slot: negative slot");
  if (from == to) return;
  if (device_ != nullptr) {
    device_->copy_slot(table, from, to);
    return;
  }
  const size_t row_bytes = static_cast<size_t>(row_elems_) * kv_type_bytes(type_);
  const int32_t from_block = table[static_cast<size_t>(from / block_slots_)];
  const int32_t to_block = table[static_cast<size_t>(to / block_slots_)];
  const int64_t from_local = from % block_slots_, to_local = to % block_slots_;
  // One element of a K tile, of `bytes` bytes, from the source slot to the destination slot.
  auto copy_tiled = [&](const uint8_t* src, uint8_t* dst, size_t bytes) {
    for (int h = 0; h < n_kv_heads_; ++h) {
      for (int d = 0; d < head_dim_; ++d) {
        std::memcpy(dst + k_tile_index(to_local, h, d, n_kv_heads_, head_dim_) * bytes,
                    src + k_tile_index(from_local, h, d, n_kv_heads_, head_dim_) * bytes, bytes);
      }
    }
  };
  for (int layer = 0; layer < n_layers_; ++layer) {
    for (int64_t h = 0; type_ == KvType::kQ8 && h < n_kv_heads_; ++h) {
      k_scales(layer, to_block)[h * block_slots_ + to_local] =
          k_scales(layer, from_block)[h * block_slots_ + from_local];
      v_scales(layer, to_block)[h * block_slots_ + to_local] =
          v_scales(layer, from_block)[h * block_slots_ + from_local];
    }
    if (k_tiled(type_)) {
      copy_tiled(k_block(layer, from_block), k_block(layer, to_block), kv_type_bytes(type_));
    } else {
      std::memcpy(k_block(layer, to_block) + to_local * row_bytes,
                  k_block(layer, from_block) + from_local * row_bytes, row_bytes);
    }
    std::memcpy(v_block(layer, to_block) + to_local * row_bytes,
                v_block(layer, from_block) + from_local * row_bytes, row_bytes);
  }
}

void PagedKvStorage::write_q8(int layer, std::span<const int32_t> table, int64_t slot, int64_t n,
                              const float* k, const float* v) {
  // Codes of the new rows, [n, n_kv_heads, head_dim], and their scales [n, n_kv_heads].
  thread_local std::vector<int8_t> k_codes;
  thread_local std::vector<float> k_scale_rows;
  if (k_codes.size() < static_cast<size_t>(n * row_elems_)) {
    k_codes.resize(static_cast<size_t>(n * row_elems_));
  }
  if (k_scale_rows.size() < static_cast<size_t>(n * n_kv_heads_)) {
    k_scale_rows.resize(static_cast<size_t>(n * n_kv_heads_));
  }
  for (int64_t r = 0; r < n * n_kv_heads_; ++r) {
    k_scale_rows[r] = quantize_kv_row(k + r * head_dim_, head_dim_, k_codes.data() + r * head_dim_);
  }
  for_block_pieces(
      table, block_slots_, slot, n, [&](int64_t o, int32_t block, int64_t local, int64_t count) {
        SPECDEC_DCHECK(block >= 0 && block < n_blocks_, "KV block id out of range");
        k_rows_to_tiles(k_codes.data() + o * row_elems_, local, count, n_kv_heads_, head_dim_,
                        reinterpret_cast<int8_t*>(k_block(layer, block)));
        auto* v_codes = reinterpret_cast<int8_t*>(v_block(layer, block)) + local * row_elems_;
        for (int64_t i = 0; i < count; ++i) {
          for (int h = 0; h < n_kv_heads_; ++h) {
            const int64_t row = (o + i) * n_kv_heads_ + h;    // of the new rows
            const int64_t at = h * block_slots_ + local + i;  // in the block's scales
            k_scales(layer, block)[at] = k_scale_rows[row];
            v_scales(layer, block)[at] = quantize_kv_row(
                v + row * head_dim_, head_dim_, v_codes + (i * n_kv_heads_ + h) * head_dim_);
          }
        }
      });
}

void PagedKvStorage::read_q8(int layer, std::span<const int32_t> table, int64_t slot, int64_t n,
                             float* k, float* v) const {
  for_block_pieces(
      table, block_slots_, slot, n, [&](int64_t o, int32_t block, int64_t local, int64_t count) {
        const auto* k_codes = reinterpret_cast<const int8_t*>(k_block(layer, block));
        const auto* v_codes = reinterpret_cast<const int8_t*>(v_block(layer, block));
        const float* ks = k_scales(layer, block);
        const float* vs = v_scales(layer, block);
        for (int64_t i = 0; i < count; ++i) {
          const int64_t s = local + i;
          for (int h = 0; h < n_kv_heads_; ++h) {
            float* k_out = k == nullptr ? nullptr : k + ((o + i) * n_kv_heads_ + h) * head_dim_;
            float* v_out = v == nullptr ? nullptr : v + ((o + i) * n_kv_heads_ + h) * head_dim_;
            const float kd = ks[h * block_slots_ + s], vd = vs[h * block_slots_ + s];
            for (int d = 0; d < head_dim_; ++d) {
              if (k_out != nullptr) {
                k_out[d] =
                    dequantize_kv(k_codes[k_tile_index(s, h, d, n_kv_heads_, head_dim_)], kd);
              }
              if (v_out != nullptr) {
                v_out[d] = dequantize_kv(v_codes[(s * n_kv_heads_ + h) * head_dim_ + d], vd);
              }
            }
          }
        }
      });
}

}  // namespace specdec
