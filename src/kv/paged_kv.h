// The memory of a paged KV cache: n_blocks blocks of block_slots token slots each, for every
// layer, stored as `type` (f16 by default, f32 for the exact reference arithmetic, q8_0 for half
// the bytes of f16: backend/kv_quant.h).
//
//   K, per layer: [n_blocks, K block]   K block = [block_slots, n_kv_heads, head_dim] (f32)
//                                                  or tiles [block_slots / 16, n_kv_heads,
//                                                  head_dim, 16] (f16, q8_0: backend/k_tiles.h)
//   V, per layer: [n_blocks, block_slots, n_kv_heads, head_dim]
//   q8_0 scales of K and of V, per layer: [n_blocks, n_kv_heads, block_slots] floats
//
// A sequence owns an ordered list of block ids (its block table, from BlockPool); its slot s is
// slot s % block_slots of block table[s / block_slots]. The attention kernels read a layer
// through a KvView (backend/kv_view.h); blocks with consecutive ids are contiguous, so a
// sequence whose blocks happen to follow each other reads like a contiguous cache.
// block_slots is a multiple of 16 (whole K tiles); memory is zeroed at construction (the
// kernels read, and discard, the unused lanes of a partly filled tile).
//
// On a device (kv_device.h): built with a KvDeviceMemory, the storage holds no host buffer (an 8B
// model's pool is gigabytes); write / read / copy_slot go to the device memory in its own layout,
// and view() throws (the CPU kernels cannot read it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>

#include <vector>

#include "backend/kv_type.h"
#include "backend/kv_view.h"
#include "kv/kv_device.h"
#include "util/huge_pages.h"

namespace specdec {

class PagedKvStorage {
 public:
  // device: where the pool lives when not in host memory (null: host memory); it must have been
  // made for this shape (the model's make_kv_device_memory does).
  PagedKvStorage(int n_layers, int n_kv_heads, int head_dim, int32_t n_blocks,
                 int64_t block_slots, KvType type = KvType::kF16,
                 std::unique_ptr<KvDeviceMemory> device = nullptr);
  // Copies are deep (a device pool is cloned on the device).
  PagedKvStorage(const PagedKvStorage& other);
  PagedKvStorage& operator=(const PagedKvStorage& other);
  PagedKvStorage(PagedKvStorage&&) noexcept = default;
  PagedKvStorage& operator=(PagedKvStorage&&) noexcept = default;

  int n_layers() const { return n_layers_; }
  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }
  int32_t n_blocks() const { return n_blocks_; }
  int64_t block_slots() const { return block_slots_; }
  KvType type() const { return type_; }
  int64_t row_elems() const { return row_elems_; }  // n_kv_heads * head_dim

  // Bytes of one block over all layers (K and V, with q8_0's scales), and of the whole pool.
  int64_t block_bytes() const {
    return 2 * n_layers_ * (block_layer_bytes() + block_scale_floats() * 4);
  }
  int64_t bytes() const { return block_bytes() * n_blocks_; }
  // Blocks that fit in `bytes` for this shape (>= 0).
  static int32_t blocks_in(int64_t bytes, int n_layers, int n_kv_heads, int head_dim,
                           int64_t block_slots, KvType type);

  // The device memory of a pool on a device (null: the pool is in host memory).
  KvDeviceMemory* device_memory() { return device_.get(); }
  const KvDeviceMemory* device_memory() const { return device_.get(); }
  bool on_device() const { return device_ != nullptr; }

  // Layer `layer` of the sequence with block table `table` (which must cover every slot the
  // reader touches). Throws specdec::Error for a pool on a device.
  KvView view(int layer, const int32_t* table) const;

  // Stores the float rows k, v: [n, n_kv_heads, head_dim] at the sequence's slots
  // [slot, slot + n) of `layer` (converted to type(): f16 rounding to nearest even, q8_0 by
  // quantize_kv_row per (slot, KV head)).
  void write(int layer, std::span<const int32_t> table, int64_t slot, int64_t n, const float* k,
             const float* v);
  // Reads slots [slot, slot + n) of `layer` back as floats into k, v: [n, n_kv_heads, head_dim]
  // (either may be null; q8_0: each value dequantize_kv(code, scale)).
  void read(int layer, std::span<const int32_t> table, int64_t slot, int64_t n, float* k,
            float* v) const;
  // Copies the K/V of slot `from` to slot `to` of the sequence, in every layer (tree
  // acceptance compacts the accepted path into place).
  void copy_slot(std::span<const int32_t> table, int64_t from, int64_t to);

 private:
  int64_t block_layer_bytes() const { return block_slots_ * row_elems_ * kv_type_bytes(type_); }
  // Floats of one block's K (or V) scales in one layer: [n_kv_heads, block_slots] (q8_0), else 0.
  int64_t block_scale_floats() const {
    return type_ == KvType::kQ8 ? block_slots_ * n_kv_heads_ : 0;
  }
  float* k_scales(int layer, int32_t block) {
    return k_scale_.data() +
           (static_cast<int64_t>(layer) * n_blocks_ + block) * block_scale_floats();
  }
  float* v_scales(int layer, int32_t block) {
    return v_scale_.data() +
           (static_cast<int64_t>(layer) * n_blocks_ + block) * block_scale_floats();
  }
  const float* k_scales(int layer, int32_t block) const {
    return const_cast<PagedKvStorage*>(this)->k_scales(layer, block);
  }
  const float* v_scales(int layer, int32_t block) const {
    return const_cast<PagedKvStorage*>(this)->v_scales(layer, block);
  }
  uint8_t* k_block(int layer, int32_t block) {
    return k_.data() + (static_cast<int64_t>(layer) * n_blocks_ + block) * block_layer_bytes();
  }
  uint8_t* v_block(int layer, int32_t block) {
    return v_.data() + (static_cast<int64_t>(layer) * n_blocks_ + block) * block_layer_bytes();
  }
  const uint8_t* k_block(int layer, int32_t block) const {
    return const_cast<PagedKvStorage*>(this)->k_block(layer, block);
  }
  const uint8_t* v_block(int layer, int32_t block) const {
    return const_cast<PagedKvStorage*>(this)->v_block(layer, block);
  }
  void check_range(int layer, std::span<const int32_t> table, int64_t slot, int64_t n) const;
  void write_q8(int layer, std::span<const int32_t> table, int64_t slot, int64_t n, const float* k,
                const float* v);
  void read_q8(int layer, std::span<const int32_t> table, int64_t slot, int64_t n, float* k,
               float* v) const;

  int n_layers_;
  int n_kv_heads_;
  int head_dim_;
  int64_t row_elems_;
  int32_t n_blocks_;
  int64_t block_slots_;
  KvType type_;
  HugeBuffer k_;  // [n_layers, n_blocks, K block] of type_
  HugeBuffer v_;  // [n_layers, n_blocks, block_slots, n_kv_heads, head_dim] of type_
  std::vector<float> k_scale_;              // q8_0: [n_layers, n_blocks, n_kv_heads, block_slots]
  std::vector<float> v_scale_;              // q8_0: the same for V
  std::unique_ptr<KvDeviceMemory> device_;  // the pool, when on a device (k_, v_ empty then)
};

// What a forward pass needs of one sequence's KV: the storage, the sequence's block table (it
// must cover slots [0, n_past + the new tokens)) and how many slots hold cached tokens.
struct SeqKv {
  PagedKvStorage* storage = nullptr;
  std::span<const int32_t> table;
  int64_t n_past = 0;
  int64_t max_slots = INT64_MAX;  // the sequence's context, if below what the table covers

  int64_t capacity() const {
    return std::min(static_cast<int64_t>(table.size()) * storage->block_slots(), max_slots);
  }
};

}  // namespace specdec
