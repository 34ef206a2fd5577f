// The layout of K in an f16 or q8_0 cache: tiles of kKTileSlots slots, one dim of 16 slots
// contiguous (elements: halves, or int8 codes for q8_0).
//
//   K (f16 / q8_0 cache), per layer: [ceil(slots / 16), n_kv_heads, head_dim, 16] elements
//   element (slot s, KV head h, dim d) at ((s / 16 · n_kv_heads + h) · head_dim + d) · 16 + s % 16
//
// so that attention scores can hold 16 slots in the lanes of one vector: one load (and one
// f16 -> f32 conversion) gives dim d of 16 slots, used by every query row of the KV head, with
// no horizontal sums and no lanes wasted when a KV head has fewer than 4 query rows (decode).
// The 16 slots of a tile and all KV heads of a tile are contiguous, so a chunk of 64 slots is
// still one contiguous range of memory. V, and both K and V of an f32 cache, stay rows
// [slots, n_kv_heads, head_dim] (the Σ p·v kernels want a slot's dims in the lanes).
#pragma once

#include <cstdint>

#include "backend/kv_type.h"

namespace specdec {

inline constexpr int64_t kKTileSlots = 16;

// Whether a cache of this type stores K in tiles (otherwise rows).
inline constexpr bool k_tiled(KvType t) {
  return t == KvType::kF16 || t == KvType::kQ8;
}

// Slots that K storage of a cache of `capacity` slots has room for: whole tiles.
inline constexpr int64_t k_tile_slots(int64_t capacity) {
  return (capacity + kKTileSlots - 1) / kKTileSlots * kKTileSlots;
}

// Index (in elements) of element (slot, head, dim) of a tiled K layer.
inline constexpr int64_t k_tile_index(int64_t slot, int64_t head, int64_t dim, int64_t n_kv_heads,
                                      int64_t head_dim) {
  return ((slot / kKTileSlots * n_kv_heads + head) * head_dim + dim) * kKTileSlots +
         slot % kKTileSlots;
}

// Rows -> tiles: rows [n, n_kv_heads, head_dim] elements become slots [slot, slot + n) of the
// tiled layer `tiles`.
template <class T>
inline void k_rows_to_tiles(const T* rows, int64_t slot, int64_t n, int64_t n_kv_heads,
                            int64_t head_dim, T* tiles) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < n_kv_heads; ++h) {
      const T* src = rows + (i * n_kv_heads + h) * head_dim;  // [head_dim]
      T* dst = tiles + k_tile_index(slot + i, h, 0, n_kv_heads, head_dim);
      for (int64_t d = 0; d < head_dim; ++d) dst[d * kKTileSlots] = src[d];
    }
  }
}

// Tiles -> rows: the head_dim elements of KV head `head` for slots [slot, slot + n) of the tiled
// layer, into rows[i * row_stride + d] (row_stride = head_dim: that head's rows alone;
// n_kv_heads · head_dim, rows + head · head_dim: its part of full cache rows).
template <class T>
inline void k_tiles_to_head_rows(const T* tiles, int64_t slot, int64_t n, int64_t head,
                                 int64_t n_kv_heads, int64_t head_dim, T* rows,
                                 int64_t row_stride) {
  for (int64_t i = 0; i < n; ++i) {
    const T* src = tiles + k_tile_index(slot + i, head, 0, n_kv_heads, head_dim);
    T* dst = rows + i * row_stride;  // [head_dim]
    for (int64_t d = 0; d < head_dim; ++d) dst[d] = src[d * kKTileSlots];
  }
}

}  // namespace specdec
