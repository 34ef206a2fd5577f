// Per-sequence KV cache: for every layer, K and V rows for token slots [0, capacity).
// Slot j holds the token the sequence committed j-th (its RoPE position is stored with it by the
// caller's bookkeeping, usually j). A forward pass writes its new tokens at slots
// [size(), size() + n_new) and grows size(); speculative verification then keeps what was
// accepted with truncate() (a chain) or keep_slots() (a tree path, compacted into place).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace specdec {

class KvCache {
 public:
  KvCache(int n_layers, int n_kv_heads, int head_dim, int64_t capacity);

  int64_t size() const { return size_; }
  int64_t capacity() const { return capacity_; }
  int n_layers() const { return n_layers_; }
  int64_t row_floats() const { return row_floats_; }  // n_kv_heads * head_dim

  // K/V of one layer: [capacity, n_kv_heads, head_dim].
  float* k(int layer) { return k_.data() + static_cast<size_t>(layer) * layer_floats(); }
  float* v(int layer) { return v_.data() + static_cast<size_t>(layer) * layer_floats(); }
  const float* k(int layer) const { return k_.data() + static_cast<size_t>(layer) * layer_floats(); }
  const float* v(int layer) const { return v_.data() + static_cast<size_t>(layer) * layer_floats(); }

  // Marks n more slots as holding tokens (after a forward pass wrote them).
  void append(int64_t n);
  // Forgets every slot from n on (n <= size()).
  void truncate(int64_t n);
  // Tree acceptance: keeps slots [0, base) and then, in order, the slots listed in `keep`
  // (each >= base, strictly increasing), moved to base, base+1, ...; forgets the rest.
  void keep_slots(int64_t base, std::span<const int64_t> keep);
  void clear() { size_ = 0; }

 private:
  size_t layer_floats() const { return static_cast<size_t>(capacity_) * row_floats_; }

  int n_layers_;
  int64_t row_floats_;
  int64_t capacity_;
  int64_t size_ = 0;
  std::vector<float> k_;  // [n_layers, capacity, n_kv_heads, head_dim]
  std::vector<float> v_;  // [n_layers, capacity, n_kv_heads, head_dim]
};

}  // namespace specdec
