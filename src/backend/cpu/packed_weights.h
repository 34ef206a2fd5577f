// Row-interleaved ("packed") weights: a load-time copy of a Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K matrix
// laid out for the AVX-512 kernels, so that one vector load yields the codes of 16 weight rows at
// once and a single broadcast activation group feeds a dot product against all 16 (lane r = weight
// row r). The AVX2 kernels (matmul_packed_avx2.cpp) read the same layout as two halves of 8 rows:
// bytes [32 h, 32 h + 32) of each 64-byte code vector, and 8 of the 16 f16 scales. A pass over k
// activation rows then unpacks each weight once, keeps it in registers for all k rows, and needs no
// horizontal reductions; this is what makes a verification pass over 8 tokens cost little more than
// a decode step over 1.
//
// Layout. Rows are grouped in blocks of 16 (the last one padded with zero rows). With
// nsub = cols / 32 sub-blocks per row, one block of 16 rows is `packed_block_bytes` bytes:
//   codes  [nsub][kCodeBytes]  sub-block b, then per 4-element group g a 64-byte vector in which
//                              bytes 4r .. 4r+3 are the codes of row r, elements 4g .. 4g+3
//     Q4_0 / Q4_1 (kCodeBytes 256): vector v = 0..3 holds group v in its low nibbles and group
//       v + 4 in its high nibbles, i.e. simply bytes qs[4v .. 4v+3] of each row's GGML block;
//     Q8_0 (kCodeBytes 512): vector g = 0..7, codes as unsigned bytes q + 128;
//     Q4_K (kCodeBytes 256): the same nibble layout; the codes of sub-block b are those of
//       quant_blocks.h's sub-block view (GGML keeps two sub-blocks in the two nibbles of one
//       32-byte run; the packer moves them to the layout above);
//   d      [nsub][16] f16      the block scale of each row (GGML's f16, unchanged)
//   m      [nsub][16] f16      the block min (Q4_1 only)
//     Q5_0 / Q5_1 (kCodeBytes 320): the nibbles as Q4_0 / Q4_1's (GGML's qs), then one vector of
//       the 5th bits: bit 2 v / 2 v + 1 of byte 4 r + k belongs to the low / high nibble of byte
//       4 r + k of code vector v (code = nibble | bit << 4, 0..31);
//     Q6_K (kCodeBytes 384): 256 bytes of the low 4 bits as above, then 2 vectors of the high
//       2 bits: in byte 4 r + k of vector w (0, 1), bits 0-1 / 2-3 belong to the low / high
//       nibble of byte 4 r + k of code vector w, bits 4-5 / 6-7 to those of code vector w + 2
//       (code = nibble | high << 4, 0..63; the kernels subtract the offset 32 as for Q4_0's 8).
//       Sub-block b of 32 is GGML's sub-blocks 2 b (elements 0-15: the low nibbles) and 2 b + 1
//       (16-31: the high nibbles), each with its own scale;
//   Q4_K instead of d and m: per super-block of 256 elements (8 sub-blocks), 320 bytes:
//     d    [16] f16     the super-block scale of each row
//     dmin [16] f16     the super-block scale of the mins
//     sc   [8][16] u8   the 6-bit sub-block scales (get_scale_min_k4 unpacked: 16 bytes where
//     mn   [8][16] u8   GGML's 12 pack them, 2.8% more bytes than the file), sub-block j's mins
//     so that the sub-block view's dw = d * sc[j] and mw = -(dmin * mn[j]) are formed in the
//     kernels with the reference's float products.
//   Q6_K instead of d: per super-block, 288 bytes: d [16] f16, then sc [16][16] i8 (GGML's 16
//     scales of 16 elements; dw = d * sc[s] as in the sub-block view). A Q6_K copy is never
//     stacked (the AVX-512 panels of a prefill and the AVX2 prefill kernel read its file rows).
// The AVX-512 and the AVX2 kernels read every layout (see avx2_reads_packed).
//   padding to a multiple of 64 bytes.
// The values are exactly GGML's: the same codes and f16 scales, so the kernels run the arithmetic
// of quant_kernels.h unchanged and equal the scalar reference bit for bit.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/cpu/matmul.h"

namespace specdec {

class HugeArena;
class ThreadPool;

inline constexpr int64_t kPackRows = 16;  // weight rows per packed block

// The per-type facts of the layout above, shared by the packer and the kernels.
struct PackedFormat {
  int64_t code_bytes = 0;  // per sub-block of 16 rows (0: the type has no packed layout)
  int64_t head_bytes = 0;  // bytes before the codes in a GGML block (f16 d, f16 m)
  bool has_min = false;    // an f16 min per block follows the scales
  bool eight_bit = false;  // codes are whole bytes (else two nibble groups per byte)
  // K-quants: bytes of the scales of one super-block (8 sub-blocks of 32), 16 rows; 0: scales
  // per sub-block (d, m above)
  int64_t super_head_bytes = 0;
  bool six_bit = false;   // Q6_K: 2 high bits per code after the nibbles, scales per 16 elements
  bool five_bit = false;  // Q5_0 / Q5_1: 1 high bit per code after the nibbles
  constexpr bool super() const { return super_head_bytes != 0; }
};

inline constexpr int64_t kSuperSubs = 8;  // sub-blocks of 32 per super-block

constexpr PackedFormat packed_format(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return {256, 2, false, false};
    case GgmlType::kQ4_1:
      return {256, 4, true, false};
    case GgmlType::kQ8_0:
      return {512, 2, false, true};
    case GgmlType::kQ5_0:
      return {320, 6, false, false, 0, false, true};
    case GgmlType::kQ5_1:
      return {320, 8, true, false, 0, false, true};
    case GgmlType::kQ4_K:
      return {256, 0, true, false, 320, false};
    case GgmlType::kQ6_K:
      return {384, 0, false, false, 288, true};
    default:
      return {};
  }
}

// Types with a packed layout.
bool packable(GgmlType type);

// Whether the AVX2 kernels read the packed layout of `type`: that of every packable type, Q6_K
// included (a type without one is multiplied from the file's rows).
constexpr bool avx2_reads_packed(GgmlType type) {
  return packed_format(type).code_bytes != 0;
}

// Bytes of one block of 16 rows for a row of `cols` elements (0 if the type is not packable).
int64_t packed_block_bytes(GgmlType type, int64_t cols);

// Owns the packed copy of one matrix or of several stacked ones (rows concatenated, in order).
class PackedWeights {
 public:
  PackedWeights() = default;

  // Packs `parts` stacked: all of one packable type and one width; every part but the last must
  // have a multiple of 16 rows (so each part starts a block). Throws specdec::Error otherwise.
  // The copy lives in `arena` when one is given (which must outlive it; a model packs all its
  // matrices into one, in huge pages), else in memory of its own.
  static PackedWeights pack(std::span<const WeightMatrix> parts, ThreadPool* pool,
                            HugeArena* arena = nullptr);

  // The stacked matrix: packed only (data == nullptr) when there are several parts, else the
  // single part with its original data as well.
  WeightMatrix stacked() const { return stacked_; }
  // Part k: its original descriptor plus `packed` pointing at its rows inside the stack.
  WeightMatrix part(size_t k) const;

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, FreeDeleter> storage_;  // owned memory (none when in an arena)
  uint8_t* base_ = nullptr;  // [blocks, packed_block_bytes], 64-aligned: storage_ or the arena's
  WeightMatrix stacked_;
  struct Part {
    WeightMatrix original;
    int64_t first_block = 0;
  };
  std::vector<Part> parts_;
};

// Element k of row r of a packed matrix as the (code, dw, mw) of the sub-block view of
// quant_blocks.h; for tests of the layout.
void packed_element(const WeightMatrix& w, int64_t r, int64_t k, uint8_t* code, float* dw,
                    float* mw);

}  // namespace specdec
