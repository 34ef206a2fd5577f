#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/kv_type.h"
#include "util/huge_pages.h"

namespace specdec {

// Per-sequence K/V cache: for every layer, one row of n_kv_heads * head_dim elements per token
// slot, for K and for V, stored as `type()` (f16 by default, f32 for the exact reference
// arithmetic); an f16 cache keeps K in tiles of 16 slots (kv/k_tiles.h). Slots [0, size()) hold
// tokens; a forward pass writes its new tokens' rows at slots size() .. and append()s them;
// speculative decoding rolls back with truncate() or keeps an accepted tree path with
// keep_slots().
class KvCache {
 public:
  KvCache(int n_layers, int n_kv_heads, int head_dim, int64_t capacity, KvType type = KvType::kF16);

  int64_t size() const { return size_; }
  int64_t capacity() const { return capacity_; }
  int n_layers() const { return n_layers_; }
  KvType type() const { return type_; }
  int64_t row_elems() const { return row_elems_; }  // n_kv_heads * head_dim

  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }

  // K/V of one layer, elements of type() (float or IEEE half): V [capacity, n_kv_heads,
  // head_dim]; K the same for f32, tiles [k_tile_slots(capacity) / 16, n_kv_heads, head_dim, 16]
  // for f16 (k_tiles.h).
  const void* k(int layer) const { return k_.data() + k_layer_offset(layer); }
  const void* v(int layer) const { return v_.data() + layer_offset(layer); }

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
  size_t row_bytes() const { return static_cast<size_t>(row_elems_) * kv_type_bytes(type_); }
  size_t layer_offset(int layer) const {
    return static_cast<size_t>(layer) * static_cast<size_t>(capacity_) * row_bytes();
  }
  size_t k_layer_offset(int layer) const {
    return static_cast<size_t>(layer) * static_cast<size_t>(k_slots_) * row_bytes();
  }
  // Row layout only (f32 K, and V).
  uint8_t* k_at(int layer, int64_t slot) {
    return k_.data() + k_layer_offset(layer) + static_cast<size_t>(slot) * row_bytes();
  }
  uint16_t* grow_halves(int64_t n);  // halves_, at least n
  uint16_t* k_tiles(int layer) {
    return reinterpret_cast<uint16_t*>(k_.data() + k_layer_offset(layer));
  }
  uint8_t* v_at(int layer, int64_t slot) {
    return v_.data() + layer_offset(layer) + static_cast<size_t>(slot) * row_bytes();
  }

  int n_layers_;
  int n_kv_heads_;
  int head_dim_;
  int64_t row_elems_;
  int64_t capacity_;
  int64_t k_slots_;  // slots K has room for per layer: capacity, or whole tiles (f16)
  KvType type_;
  int64_t size_ = 0;
  HugeBuffer k_;  // [n_layers, k_slots, n_kv_heads, head_dim] of type_ (f16: tiles), zeroed
  HugeBuffer v_;  // [n_layers, capacity, n_kv_heads, head_dim] of type_, zeroed
  std::vector<uint16_t> halves_;  // [n, n_kv_heads, head_dim] K rows of write (f16)
};

}  // namespace specdec
