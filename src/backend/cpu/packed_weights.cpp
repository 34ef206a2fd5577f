// Packing of Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K matrices into the row-interleaved layout of
// packed_weights.h. Plain scalar byte moves: packing runs once at load time (~0.1 s for
// SmolLM2-135M).
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

// Q4_K rows [row0, row0 + count) into block `out` (see packed_weights.h): sub-block b = 8 s + j
// of super-block s has its 32 codes in the low (j even) or high (j odd) nibbles of
// qs[32 (j / 2) ..]; they are re-paired as the 32-element types' nibbles (byte 4 v + k of row r
// holds elements 4 v + k and 16 + 4 v + k).
void pack_block_q4_k(const WeightMatrix& w, int64_t row0, int64_t count, uint8_t* out) {
  const int64_t nsub = w.cols / kQK;
  uint8_t* heads = out + nsub * 256;  // [nsub / 8][320]
  for (int64_t r = 0; r < count; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + (row0 + r) * w.row_bytes;
    for (int64_t s = 0; s < nsub / kSuperSubs; ++s) {
      BlockQ4_K blk;
      std::memcpy(&blk, row + s * static_cast<int64_t>(sizeof(BlockQ4_K)), sizeof blk);
      uint8_t* head = heads + s * 320;
      std::memcpy(head + 2 * r, &blk.d, 2);
      std::memcpy(head + 32 + 2 * r, &blk.dmin, 2);
      for (int j = 0; j < kSuperSubs; ++j) {
        get_scale_min_k4(j, blk.scales, head + 64 + 16 * j + r, head + 192 + 16 * j + r);
        uint8_t q[32];
        const uint8_t* qs = blk.qs + 32 * (j / 2);
        for (int l = 0; l < 32; ++l) q[l] = (j % 2 == 0) ? (qs[l] & 0xf) : (qs[l] >> 4);
        uint8_t* codes = out + (kSuperSubs * s + j) * 256;
        for (int v = 0; v < 4; ++v) {
          for (int k = 0; k < 4; ++k) {
            codes[64 * v + 4 * r + k] =
                static_cast<uint8_t>(q[4 * v + k] | (q[16 + 4 * v + k] << 4));
          }
        }
      }
    }
  }
}

// Q6_K rows [row0, row0 + count) into block `out` (see packed_weights.h). Element e = 128 h +
// 32 g + l of a super-block (half h, group g 0..3, l 0..31) has the low 4 bits
// ql[64 h + l + 32 (g & 1)] (low nibble for g < 2, else high) and the high 2 bits
// qh[32 h + l] >> 2 g: it is element l of sub-block 4 h + g.
void pack_block_q6_k(const WeightMatrix& w, int64_t row0, int64_t count, uint8_t* out) {
  const int64_t nsub = w.cols / kQK;
  uint8_t* heads = out + nsub * 384;  // [nsub / 8][288]
  for (int64_t r = 0; r < count; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + (row0 + r) * w.row_bytes;
    for (int64_t s = 0; s < nsub / kSuperSubs; ++s) {
      BlockQ6_K blk;
      std::memcpy(&blk, row + s * static_cast<int64_t>(sizeof(BlockQ6_K)), sizeof blk);
      uint8_t* head = heads + s * 288;
      std::memcpy(head + 2 * r, &blk.d, 2);
      for (int k = 0; k < 16; ++k) head[32 + 16 * k + r] = static_cast<uint8_t>(blk.scales[k]);
      for (int u = 0; u < kSuperSubs; ++u) {
        const int h = u / 4, g = u % 4;
        uint8_t q[32];  // codes 0..63 of sub-block 8 s + u
        for (int l = 0; l < 32; ++l) {
          const uint8_t low_byte = blk.ql[64 * h + l + 32 * (g & 1)];
          const int low = g < 2 ? (low_byte & 0xf) : (low_byte >> 4);
          q[l] = static_cast<uint8_t>(low | (((blk.qh[32 * h + l] >> (2 * g)) & 3) << 4));
        }
        uint8_t* codes = out + (kSuperSubs * s + u) * 384;
        for (int v = 0; v < 4; ++v) {
          for (int k = 0; k < 4; ++k) {
            const int lo = q[4 * v + k], hi = q[16 + 4 * v + k];
            codes[64 * v + 4 * r + k] = static_cast<uint8_t>((lo & 0xf) | ((hi & 0xf) << 4));
            codes[256 + 64 * (v % 2) + 4 * r + k] |=
                static_cast<uint8_t>(((lo >> 4) | ((hi >> 4) << 2)) << (4 * (v / 2)));
          }
        }
      }
    }
  }
}

// Rows [row0, row0 + count) of `w` (count <= 16; missing rows stay zero) into block `out`.
void pack_block(const WeightMatrix& w, int64_t row0, int64_t count, uint8_t* out) {
  const PackedFormat f = packed_format(w.type);
  if (f.six_bit) {
    pack_block_q6_k(w, row0, count, out);
    return;
  }
  if (f.super()) {
    pack_block_q4_k(w, row0, count, out);
    return;
  }
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
      if (f.five_bit) {  // bit j of GGML's little-endian qh: the 5th bit of element j
        uint32_t qh;
        std::memcpy(&qh, qs - 4, 4);
        for (int v = 0; v < 4; ++v) {
          for (int k = 0; k < 4; ++k) {
            codes[256 + 4 * r + k] |= static_cast<uint8_t>(((qh >> (4 * v + k)) & 1) << (2 * v));
            codes[256 + 4 * r + k] |=
                static_cast<uint8_t>(((qh >> (16 + 4 * v + k)) & 1) << (2 * v + 1));
          }
        }
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
  const int64_t bytes = f.super() ? nsub * f.code_bytes + nsub / kSuperSubs * f.super_head_bytes
                                  : nsub * (f.code_bytes + 32 * (f.has_min ? 2 : 1));
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
  if (packed_format(first.type).six_bit && parts.size() > 1) {
    // A prefill multiplies Q6_K from the file's rows (AVX-512 panels, the AVX2 tile kernel),
    // which a stack does not keep.
    throw Error("PackedWeights::pack: Q6_K matrices are packed one by one, not stacked");
  }
  PackedWeights out;
  int64_t blocks = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const WeightMatrix& p = parts[k];
    if (p.type != first.type || p.cols != first.cols || p.data == nullptr ||
        p.cols % (packed_format(p.type).super() ? kQK_K : kQK) != 0 ||
        p.row_bytes != ggml_row_bytes(p.type, p.cols) || p.rows <= 0) {
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
  if (f.five_bit) {
    const int v = static_cast<int>((e % 16) / 4);
    const uint8_t hb = codes[256 + 4 * lane + e % 4];
    *code = static_cast<uint8_t>(*code | (((hb >> (2 * v + (e < 16 ? 0 : 1))) & 1) << 4));
  }
  if (f.six_bit) {  // the 16-element sub-block of e: dw = d * sc, as the sub-block view forms it
    const uint8_t hb = codes[256 + 64 * (((e % 16) / 4) % 2) + 4 * lane + e % 4];
    const int shift = 4 * (((e % 16) / 4) / 2) + (e < 16 ? 0 : 2);
    *code = static_cast<uint8_t>(*code | (((hb >> shift) & 3) << 4));
    const uint8_t* head = blk + nsub * f.code_bytes + (b / kSuperSubs) * f.super_head_bytes;
    std::memcpy(&h, head + 2 * lane, 2);
    const int64_t sub16 = 2 * (b % kSuperSubs) + (e < 16 ? 0 : 1);
    *dw = fp16_to_fp32(h) * static_cast<float>(static_cast<int8_t>(head[32 + 16 * sub16 + lane]));
    *mw = 0.0f;
    return;
  }
  if (f.super()) {  // dw = d * sc, mw = -(dmin * mn), as the sub-block view forms them
    const uint8_t* head = blk + nsub * f.code_bytes + (b / kSuperSubs) * f.super_head_bytes;
    const int64_t j = b % kSuperSubs;
    uint16_t hm;
    std::memcpy(&h, head + 2 * lane, 2);
    std::memcpy(&hm, head + 32 + 2 * lane, 2);
    *dw = fp16_to_fp32(h) * static_cast<float>(head[64 + 16 * j + lane]);
    *mw = -(fp16_to_fp32(hm) * static_cast<float>(head[192 + 16 * j + lane]));
    return;
  }
  std::memcpy(&h, blk + nsub * f.code_bytes + b * 32 + 2 * lane, 2);
  *dw = fp16_to_fp32(h);
  *mw = 0.0f;
  if (f.has_min) {
    std::memcpy(&h, blk + nsub * f.code_bytes + nsub * 32 + b * 32 + 2 * lane, 2);
    *mw = fp16_to_fp32(h);
  }
}

}  // namespace specdec
