// Helpers of the paged KV pools' row copies (host pool in paged_kv.cpp, the GPU pool in
// model/archs/llama_cuda.cpp): a sequence's slots cut at block boundaries, and a host scratch
// of IEEE halves for the f16 conversions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace specdec {

// Calls fn(offset, block, local, count) for the pieces of slots [slot, slot + n) that lie in one
// block each, in slot order (offset = piece's first slot - slot).
template <class F>
void for_block_pieces(std::span<const int32_t> table, int64_t block_slots, int64_t slot, int64_t n,
                      F&& fn) {
  for (int64_t done = 0; done < n;) {
    const int64_t s = slot + done;
    const int64_t local = s % block_slots;
    const int64_t count = std::min(n - done, block_slots - local);
    fn(done, table[static_cast<size_t>(s / block_slots)], local, count);
    done += count;
  }
}

// A thread's scratch of at least n halves (grown once, kept).
inline uint16_t* halves_scratch(int64_t n) {
  thread_local std::vector<uint16_t> halves;
  if (halves.size() < static_cast<size_t>(n)) halves.resize(static_cast<size_t>(n));
  return halves.data();
}

}  // namespace specdec
