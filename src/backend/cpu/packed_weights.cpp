// Packing of Q4_0 / Q4_1 / Q8_0 matrices into the row-interleaved layout of packed_weights.h.
// Plain scalar byte moves: packing runs once at load time (~0.1 s for SmolLM2-135M).
#include "backend/cpu/packed_weights.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "backend/cpu/quant_blocks.h"
#include "backend/cpu/thread_pool.h"
#include "util/check.h"
#include "util/huge_pages.h"

namespace specdec {
namespace {

// Rows [row0, row0 + count) of `w` (count <= 16; missing rows stay zero) into block `out`.
void pack_block(const WeightMatrix& w, int64_t row0, int64_t count, uint8_t* out) {
  const PackedFormat f = packed_format(w.type);
  const int64_t nsub = w.cols / kQK;
  const int64_t block_bytes = ggml_type_traits(w.type).block_bytes;
  uint8_t* d_out = out + nsub * f.code_bytes;  // [nsub][16] f16
  uint8_t* m_out = d_out + nsub * 32;          // [nsub][16] f16
  for (int64_t r = 0; r < count; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + (row0 + r) * w.row_bytes;
    for (int64_t b = 0; b < nsub; ++b) {
      const uint8_t* blk = row + b * block_bytes;
      const uint8_t* qs = blk + f.head_bytes;
      uint8_t* codes = out + b * f.code_bytes;
      if (f.eight_bit) {
        for (int64_t g = 0; g < 8; ++g) {
          for (int64_t j = 0; j < 4; ++j) codes[64 * g + 4 * r + j] = qs[4 * g + j] ^ 0x80u;
        }
      } else {
        for (int64_t v = 0; v < 4; ++v) std::memcpy(codes + 64 * v + 4 * r, qs + 4 * v, 4);
      }
      std::memcpy(d_out + b * 32 + 2 * r, blk, 2);
      if (f.has_min) std::memcpy(m_out + b * 32 + 2 * r, blk + 2, 2);
    }
  }
}

}  // namespace

bool packable(GgmlType type) {
  return packed_format(type).code_bytes != 0;
}

int64_t packed_block_bytes(GgmlType type, int64_t cols) {
  const PackedFormat f = packed_format(type);
  if (f.code_bytes == 0) return 0;
  const int64_t nsub = cols / kQK;
  const int64_t bytes = nsub * (f.code_bytes + 32 * (f.has_min ? 2 : 1));
  return (bytes + 63) / 64 * 64;
}

void PackedWeights::FreeDeleter::operator()(uint8_t* p) const {
  std::free(p);
}

PackedWeights PackedWeights::pack(std::span<const WeightMatrix> parts, ThreadPool* pool,
                                  HugeArena* arena) {
  SPECDEC_CHECK(!parts.empty(), "PackedWeights::pack: no matrices");
  const WeightMatrix& first = parts.front();
  if (!packable(first.type)) {
    throw Error(std::string("PackedWeights::pack: type ") + ggml_type_traits(first.type).name +
                " has no packed layout");
  }
  PackedWeights out;
  int64_t blocks = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const WeightMatrix& p = parts[k];
    if (p.type != first.type || p.cols != first.cols || p.data == nullptr ||
        p.cols % kQK != 0 || p.row_bytes != ggml_row_bytes(p.type, p.cols) || p.rows <= 0) {
      throw Error("PackedWeights::pack: parts must be valid matrices of one type and width");
    }
    if (k + 1 < parts.size() && p.rows % kPackRows != 0) {
      throw Error("PackedWeights::pack: a stacked part has " + std::to_string(p.rows) +
                  " rows, not a multiple of 16");
    }
    out.parts_.push_back({p, blocks});
    blocks += (p.rows + kPackRows - 1) / kPackRows;
  }
  const int64_t block_bytes = packed_block_bytes(first.type, first.cols);
  const auto bytes = static_cast<size_t>(blocks * block_bytes);  // [blocks, block_bytes]
  uint8_t* mem = nullptr;
  if (arena != nullptr) {
    mem = arena->allocate(bytes);  // zero-filled
  } else {
    mem = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
    if (mem == nullptr) throw std::bad_alloc();
    out.storage_.reset(mem);
    std::memset(mem, 0, bytes);
  }
  out.base_ = mem;

  auto body = [&](int64_t b0, int64_t b1) {
    for (const Part& part : out.parts_) {
      const int64_t nb = (part.original.rows + kPackRows - 1) / kPackRows;
      const int64_t lo = std::max(b0, part.first_block), hi = std::min(b1, part.first_block + nb);
      for (int64_t b = lo; b < hi; ++b) {
        const int64_t row0 = (b - part.first_block) * kPackRows;
        pack_block(part.original, row0, std::min(kPackRows, part.original.rows - row0),
                   mem + b * block_bytes);
      }
    }
  };
  if (pool) {
    pool->parallel_for(blocks, 1, body);
  } else {
    body(0, blocks);
  }

  int64_t rows = 0;
  for (const WeightMatrix& p : parts) rows += p.rows;
  out.stacked_ = parts.size() == 1 ? first : WeightMatrix{};
  out.stacked_.type = first.type;
  out.stacked_.rows = rows;
  out.stacked_.cols = first.cols;
  out.stacked_.row_bytes = first.row_bytes;
  out.stacked_.packed = mem;
  out.stacked_.packed_block_bytes = block_bytes;
  return out;
}

WeightMatrix PackedWeights::part(size_t k) const {
  SPECDEC_CHECK(k < parts_.size(), "PackedWeights::part: index out of range");
  WeightMatrix w = parts_[k].original;
  w.packed = base_ + parts_[k].first_block * stacked_.packed_block_bytes;
  w.packed_block_bytes = stacked_.packed_block_bytes;
  return w;
}

void packed_element(const WeightMatrix& w, int64_t r, int64_t k, uint8_t* code, float* dw,
                    float* mw) {
  const PackedFormat f = packed_format(w.type);
  SPECDEC_CHECK(f.code_bytes != 0 && w.packed != nullptr, "packed_element: not a packed matrix");
  SPECDEC_CHECK(r >= 0 && r < w.rows && k >= 0 && k < w.cols, "packed_element: out of range");
  const int64_t nsub = w.cols / kQK;
  const uint8_t* blk = w.packed + (r / kPackRows) * w.packed_block_bytes;
  const int64_t lane = r % kPackRows, b = k / kQK, e = k % kQK;
  const uint8_t* codes = blk + b * f.code_bytes;
  if (f.eight_bit) {
    *code = codes[64 * (e / 4) + 4 * lane + e % 4];
  } else {
    const uint8_t byte = codes[64 * ((e % 16) / 4) + 4 * lane + e % 4];
    *code = e < 16 ? byte & 0x0f : byte >> 4;
  }
  uint16_t h;
  std::memcpy(&h, blk + nsub * f.code_bytes + b * 32 + 2 * lane, 2);
  *dw = fp16_to_fp32(h);
  *mw = 0.0f;
  if (f.has_min) {
    std::memcpy(&h, blk + nsub * f.code_bytes + nsub * 32 + b * 32 + 2 * lane, 2);
    *mw = fp16_to_fp32(h);
  }
}

}  // namespace specdec
