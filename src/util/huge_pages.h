// Memory for the large buffers that every decode step streams (packed weights, K/V caches):
// 2 MiB-aligned and, on Linux, advised MADV_HUGEPAGE, so that transparent huge pages back it
// wherever the system allows them (THP "always" or "madvise", the latter Debian's default; with
// "never" it is ordinary memory). With 4 KiB pages a decode step of SmolLM2-135M touches ~24k
// pages of weights, one TLB miss and page walk each; with 2 MiB pages ~50 (docs/PERFORMANCE.md:
// in-process A/B, ~4% faster decode).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace specdec {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// A byte buffer of a fixed size, in huge-page-advised memory when it is at least one huge page
// long (smaller ones are 64-byte aligned heap memory). Copies are deep.
class HugeBuffer {
 public:
  // kZero: zero-filled. kNone: contents unset, for a caller that writes every byte first (the
  // bandwidth probe has each thread touch the share it will read).
  enum class Init { kZero, kNone };

  HugeBuffer() = default;
  explicit HugeBuffer(size_t bytes, Init init = Init::kZero);
  ~HugeBuffer();
  HugeBuffer(const HugeBuffer& other);
  HugeBuffer& operator=(const HugeBuffer& other);
  HugeBuffer(HugeBuffer&& other) noexcept;
  HugeBuffer& operator=(HugeBuffer&& other) noexcept;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Hands out 64-byte-aligned pieces of huge-page-advised chunks, for many buffers that live as
// long as the arena (a model's packed matrices: 121 of 0.2-30 MB for SmolLM2-135M, which one
// HugeBuffer each would round up to whole huge pages). Pieces are zero-filled; nothing is freed
// before the arena is.
class HugeArena {
 public:
  explicit HugeArena(size_t chunk_bytes = size_t{8} << 20) : chunk_bytes_(chunk_bytes) {}

  uint8_t* allocate(size_t bytes);

 private:
  size_t chunk_bytes_;
  std::vector<HugeBuffer> chunks_;
  size_t used_ = 0;  // bytes taken from the last chunk
};

}  // namespace specdec
