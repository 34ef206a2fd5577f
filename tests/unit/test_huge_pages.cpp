// HugeBuffer and HugeArena: the memory the packed weights and K/V caches live in. Whatever the
// system does with the huge-page advice, buffers are zeroed, aligned, independent, and copy deep.
#include "util/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace specdec {
namespace {

bool all_zero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

TEST(HugeBuffer, ZeroedAndAligned) {
  for (size_t bytes : {size_t{1}, size_t{100}, size_t{4096}, kHugePageBytes - 1, kHugePageBytes,
                       kHugePageBytes * 3 + 17}) {
    HugeBuffer b(bytes);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_EQ(b.size(), bytes);
    const size_t align = bytes >= kHugePageBytes ? kHugePageBytes : 64;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % align, 0u) << bytes;
    EXPECT_TRUE(all_zero(b.data(), bytes)) << bytes;
    b.data()[bytes - 1] = 1;  // the whole size is writable
  }
  // Unset contents: the same size and alignment, every byte writable.
  HugeBuffer unset(kHugePageBytes + 3, HugeBuffer::Init::kNone);
  EXPECT_EQ(unset.size(), kHugePageBytes + 3);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(unset.data()) % kHugePageBytes, 0u);
  std::memset(unset.data(), 5, unset.size());
  EXPECT_EQ(unset.data()[kHugePageBytes + 2], 5);
  HugeBuffer empty;
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(HugeBuffer(0).data(), nullptr);
}

TEST(HugeBuffer, CopiesAreDeepAndMovesTransfer) {
  HugeBuffer a(kHugePageBytes + 5);
  a.data()[0] = 3;
  a.data()[kHugePageBytes + 4] = 9;
  HugeBuffer b = a;
  ASSERT_NE(b.data(), a.data());
  EXPECT_EQ(b.data()[0], 3);
  EXPECT_EQ(b.data()[kHugePageBytes + 4], 9);
  b.data()[0] = 4;
  EXPECT_EQ(a.data()[0], 3);
  HugeBuffer small(10);
  small = a;  // copy-assign over a buffer of another size
  EXPECT_EQ(small.size(), a.size());
  EXPECT_EQ(small.data()[kHugePageBytes + 4], 9);
  uint8_t* p = a.data();
  HugeBuffer c = std::move(a);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(a.size(), 0u);
  HugeBuffer d(4);
  d = std::move(c);
  EXPECT_EQ(d.data(), p);
  EXPECT_EQ(d.size(), kHugePageBytes + 5);
}

// Pieces are 64-byte aligned, zeroed, disjoint, and stay valid as the arena grows (a request
// larger than a chunk gets a chunk of its own).
TEST(HugeArena, PiecesAreAlignedZeroedAndDisjoint) {
  HugeArena arena(size_t{1} << 20);
  struct Piece {
    uint8_t* p;
    size_t n;
  };
  std::vector<Piece> pieces;
  const size_t sizes[] = {1, 64, 65, 300000, 700000, 5000000, 100, 1 << 20, 3};
  for (size_t k = 0; k < std::size(sizes); ++k) {
    uint8_t* p = arena.allocate(sizes[k]);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    EXPECT_TRUE(all_zero(p, sizes[k])) << k;
    std::memset(p, static_cast<int>(k + 1), sizes[k]);
    pieces.push_back({p, sizes[k]});
  }
  for (size_t k = 0; k < pieces.size(); ++k) {  // nothing overwrote an earlier piece
    for (size_t i = 0; i < pieces[k].n; i += 997) {
      ASSERT_EQ(pieces[k].p[i], static_cast<uint8_t>(k + 1)) << k << " " << i;
    }
    ASSERT_EQ(pieces[k].p[pieces[k].n - 1], static_cast<uint8_t>(k + 1)) << k;
  }
}

}  // namespace
}  // namespace specdec
