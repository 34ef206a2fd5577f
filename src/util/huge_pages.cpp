#include "util/huge_pages.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace specdec {
namespace {

// Advice only: where THP is off madvise fails or does nothing, and the memory stays usable.
void advise_huge_pages(void* p, size_t bytes) {
#if defined(MADV_HUGEPAGE)
  (void)madvise(p, bytes, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace

HugeBuffer::HugeBuffer(size_t bytes, Init init) : size_(bytes) {
  if (bytes == 0) return;
  const size_t align = bytes >= kHugePageBytes ? kHugePageBytes : 64;
  const size_t rounded = (bytes + align - 1) / align * align;  // aligned_alloc wants a multiple
  data_ = static_cast<uint8_t*>(std::aligned_alloc(align, rounded));
  if (data_ == nullptr) throw std::bad_alloc();
  if (align == kHugePageBytes) advise_huge_pages(data_, rounded);
  // After the advice, so that the first touch takes huge pages.
  if (init == Init::kZero) std::memset(data_, 0, bytes);
}

HugeBuffer::~HugeBuffer() {
  std::free(data_);
}

HugeBuffer::HugeBuffer(const HugeBuffer& other) : HugeBuffer(other.size_, Init::kNone) {
  if (size_ != 0) std::memcpy(data_, other.data_, size_);
}

HugeBuffer& HugeBuffer::operator=(const HugeBuffer& other) {
  if (this != &other) *this = HugeBuffer(other);
  return *this;
}

HugeBuffer::HugeBuffer(HugeBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

HugeBuffer& HugeBuffer::operator=(HugeBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

uint8_t* HugeArena::allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  if (chunks_.empty() || used_ + rounded > chunks_.back().size()) {
    // A new chunk: whole huge pages, at least chunk_bytes_. The old chunk's tail stays unused.
    const size_t size =
        (std::max(rounded, chunk_bytes_) + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    chunks_.emplace_back(size);
    used_ = 0;
  }
  uint8_t* p = chunks_.back().data() + used_;
  used_ += rounded;
  return p;
}

}  // namespace specdec
