// K tiles back to float rows (k16_tiles_to_rows for an f16 cache, k8_tiles_to_rows for q8_0
// codes): every variant that has the kernel gives exactly the elements of the tile layout
// (backend/k_tiles.h) as floats, for whole and partial tiles, several tiles apart by a stride,
// head_dim with tails, and stores nothing past n_slots rows.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quant_blocks.h"  // fp16_to_fp32
#include "backend/k_tiles.h"

namespace specdec {
namespace {

std::vector<Isa> supported_variants() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

inline float to_float(uint16_t h) { return fp16_to_fp32(h); }
inline float to_float(int8_t c) { return static_cast<float>(c); }

// One variant's kernel (fn) against the layout, for element type T.
template <class T, class Fn>
void check_tiles_to_rows(Isa isa, Fn fn, std::mt19937& gen) {
  std::uniform_int_distribution<int> bits(0, 0x7bff);  // finite halves; codes from the low byte
  const int n_kv = 3, h = 2;
  for (int head_dim : {64, 8, 20, 7, 128}) {
    for (int64_t n_slots : {1, 7, 8, 9, 16, 17, 40, 64}) {
      const int64_t slots = k_tile_slots(n_slots);
      std::vector<T> tiles(static_cast<size_t>(slots * n_kv * head_dim));  // the layer's tiles
      for (T& e : tiles) e = static_cast<T>(bits(gen));
      const int64_t tile_stride = static_cast<int64_t>(n_kv) * head_dim * kKTileSlots;
      std::vector<float> got(static_cast<size_t>((n_slots + 1) * head_dim), -7.0f);
      fn(tiles.data() + k_tile_index(0, h, 0, n_kv, head_dim), tile_stride, n_slots, head_dim,
         got.data());
      for (int64_t j = 0; j < n_slots; ++j) {
        for (int d = 0; d < head_dim; ++d) {
          const float want = to_float(tiles[k_tile_index(j, h, d, n_kv, head_dim)]);
          ASSERT_EQ(got[j * head_dim + d], want)
              << isa_name(isa) << " head_dim " << head_dim << " slots " << n_slots << " slot " << j
              << " dim " << d;
        }
      }
      for (int d = 0; d < head_dim; ++d) {
        ASSERT_EQ(got[n_slots * head_dim + d], -7.0f) << isa_name(isa) << ": a row past n_slots";
      }
    }
  }
}

TEST(KTiles, TilesToRowsEveryVariant) {
  std::mt19937 gen(31);
  int checked = 0;
  for (Isa isa : supported_variants()) {
    const OpsKernels& kern = ops_kernels_for(isa, true);
    if (kern.k16_tiles_to_rows != nullptr) {
      check_tiles_to_rows<uint16_t>(isa, kern.k16_tiles_to_rows, gen);
      ++checked;
    }
    if (kern.k8_tiles_to_rows != nullptr) {
      check_tiles_to_rows<int8_t>(isa, kern.k8_tiles_to_rows, gen);
      ++checked;
    }
  }
  if (isa_supported(Isa::kAvx2)) EXPECT_GE(checked, 2) << "the AVX2 converters went untested";
}

}  // namespace
}  // namespace specdec
