// Attention over a q8_0 KV cache (KvType::kQ8: int8 codes, a float scale per (slot, KV head)):
// - the fused kernels (attn_scores_k8 over K tiles of codes, attn_accumulate(_merge)_i8 over V
//   rows of codes) give bitwise what the float kernels give on the codes as float rows, and
//   i8_to_f32_rows converts every code exactly, in every variant that has them;
// - bit-exact invariance, what speculative decoding relies on: each token of a multi-token call
//   (chains, trees, arbitrary masks; 1, 2 and 3 threads) gets the bits of a one-token call over a
//   q8_0 cache holding exactly the slots it sees (the same rows, quantized the same way);
// - against a naive double attention over the dequantized values (d · c), and within the
//   quantization's error of attention over the original floats, while a cache whose scales are
//   ignored (the codes taken as values) is far off: the check can fail.
// test_paged_attention.cpp runs q8_0 through block tables (paged == contiguous, bitwise).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/thread_pool.h"
#include "backend/k_tiles.h"
#include "backend/kv_quant.h"
#include "common/attention_cases.h"
#include "kv/kv_cache.h"

namespace specdec {
namespace {

constexpr double kU = FLT_EPSILON / 2;  // unit roundoff of float

using test::attention_naive;
using test::attention_variants;
using test::first_bitwise_difference;
using test::make_shape;
using test::random_mask;
using test::random_vector;
using test::tree_mask;
using test::visible;

// A q8_0 cache (one layer) holding the rows k, v: [n, kv_row], all marked cached.
KvCache q8_cache(const AttentionShape& s, const std::vector<float>& k,
                 const std::vector<float>& v) {
  const int64_t kv_row = static_cast<int64_t>(s.n_kv_heads) * s.head_dim;
  const int64_t n = static_cast<int64_t>(k.size()) / kv_row;
  KvCache cache(1, s.n_kv_heads, s.head_dim, std::max<int64_t>(n, 1), KvType::kQ8);
  cache.write(0, 0, n, k.data(), v.data());
  cache.append(n);
  return cache;
}

void attend(Isa isa, const AttentionShape& s, const float* q, KvCache& cache, const uint8_t* mask,
            float* out, ThreadPool* pool) {
  const SeqKv seq = cache.seq();
  attention_isa(isa, s, q, seq.storage->view(0, seq.table.data()), mask, out, pool);
}

// --- the fused kernels --------------------------------------------------------------------------

TEST(KvQ8, I8ToF32RowsExactEveryVariant) {
  std::vector<int8_t> codes(256 * 3);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<int8_t>(i * 7 + 3);
  for (Isa isa : attention_variants()) {
    const OpsKernels& kern = ops_kernels_for(isa, true);
    for (int cols : {1, 7, 16, 20, 64, 100}) {
      std::vector<float> out(static_cast<size_t>(3 * cols) + 1, 9.0f);
      kern.i8_to_f32_rows(codes.data(), 256, 3, cols, out.data());
      for (int r = 0; r < 3; ++r) {
        for (int c = 0; c < cols; ++c) {
          ASSERT_EQ(out[r * cols + c], static_cast<float>(codes[r * 256 + c]))
              << isa_name(isa) << " cols " << cols << " row " << r << " col " << c;
        }
      }
      EXPECT_EQ(out.back(), 9.0f) << "wrote past the rows";
    }
  }
}

// One rounded product per element: every variant's bits are the scalar reference's, in place or
// not, at every tail length.
TEST(KvQ8, ScaleColumnsEqualsReference) {
  std::mt19937 gen(20);
  const OpsKernels& ref = ops_kernels_for(Isa::kScalar, true);
  for (Isa isa : attention_variants()) {
    const OpsKernels& kern = ops_kernels_for(isa, true);
    for (int64_t n : {1, 5, 8, 16, 17, 40, 64}) {
      for (int rows : {1, 3, 24}) {
        const std::vector<float> x = random_vector(gen, rows * 70, -50, 50);
        const std::vector<float> d = random_vector(gen, n, 0, 0.1f);
        std::vector<float> want(static_cast<size_t>(rows * 66), 5.0f), got = want;
        ref.scale_columns(x.data(), 70, rows, d.data(), n, want.data(), 66);
        kern.scale_columns(x.data(), 70, rows, d.data(), n, got.data(), 66);
        ASSERT_EQ(first_bitwise_difference(want.data(), got.data(), rows * 66), -1)
            << isa_name(isa) << " n " << n << " rows " << rows;
        ASSERT_EQ(want[n], n < 66 ? 5.0f : want[n]) << "wrote past the columns";
        std::vector<float> in_place = x;
        kern.scale_columns(in_place.data(), 70, rows, d.data(), n, in_place.data(), 70);
        for (int r = 0; r < rows; ++r) {
          for (int64_t j = 0; j < 70; ++j) {
            ASSERT_EQ(in_place[r * 70 + j], j < n ? want[r * 66 + j] : x[r * 70 + j])
                << isa_name(isa) << " in place, row " << r << " column " << j;
          }
        }
      }
    }
  }
}

TEST(KvQ8, FusedKernelsEqualFloatKernelsOnCodes) {
  std::mt19937 gen(21);
  std::uniform_int_distribution<int> code(-127, 127);
  int variants_with_fused = 0;
  for (Isa isa : attention_variants()) {
    const OpsKernels& kern = ops_kernels_for(isa, true);
    const bool scores = kern.attn_scores_k8 != nullptr;
    const bool sums = kern.attn_accumulate_i8 != nullptr;
    if (!scores && !sums) continue;
    ++variants_with_fused;
    ASSERT_EQ(sums, kern.attn_accumulate_merge_i8 != nullptr) << isa_name(isa);
    for (int head_dim : {64, 20, 7, 128}) {
      const int n_kv = 3;
      const int64_t kv_row = static_cast<int64_t>(n_kv) * head_dim;
      for (int n_q : {1, 2, 3, 4, 6, 13, 24}) {
        for (int64_t n_slots : {1, 16, 17, 40, 64}) {
          // K: tiles of codes for slots [0, n_slots) of 3 KV heads (head 1 used); float rows.
          const int64_t tiles_slots = k_tile_slots(n_slots);
          std::vector<int8_t> rows(static_cast<size_t>(tiles_slots * kv_row));
          for (int8_t& c : rows) c = static_cast<int8_t>(code(gen));
          std::vector<int8_t> kt(rows.size());
          k_rows_to_tiles(rows.data(), 0, tiles_slots, n_kv, head_dim, kt.data());
          std::vector<float> kf(static_cast<size_t>(n_slots * head_dim));  // head 1, [n, hd]
          for (int64_t j = 0; j < n_slots; ++j) {
            for (int d = 0; d < head_dim; ++d)
              kf[j * head_dim + d] = rows[j * kv_row + head_dim + d];
          }
          const std::vector<float> q = random_vector(gen, n_q * head_dim, -1, 1);
          std::vector<float> packed(static_cast<size_t>(attn_packed_floats(n_q, head_dim)));
          kern.attn_pack_q(q.data(), n_q, n_q, 0, head_dim, 0.2f, packed.data());
          std::vector<float> want(static_cast<size_t>(n_q * kAttnChunk), 0.0f), got = want;
          kern.attn_scores(packed.data(), n_q, kf.data(), head_dim, n_slots, head_dim, want.data(),
                           kAttnChunk, {});
          if (scores) {
            kern.attn_scores_k8(
                packed.data(), n_q, kt.data() + k_tile_index(0, 1, 0, n_kv, head_dim),
                n_kv * head_dim * kKTileSlots, n_slots, head_dim, got.data(), kAttnChunk, {});
            ASSERT_EQ(first_bitwise_difference(want.data(), got.data(), n_q * kAttnChunk), -1)
                << isa_name(isa) << " scores: head_dim " << head_dim << " n_q " << n_q << " slots "
                << n_slots;
          }
          if (!sums) continue;
          // V: rows of codes of 3 KV heads, head 1 used.
          const std::vector<float> p = random_vector(gen, n_q * kAttnChunk, 0, 1);
          std::vector<float> vf(rows.size());
          for (size_t e = 0; e < rows.size(); ++e) vf[e] = rows[e];
          const std::vector<float> wo = random_vector(gen, n_q, 0, 1);
          const std::vector<float> wn = random_vector(gen, n_q, 0, 1);
          const std::vector<float> state = random_vector(gen, n_q * head_dim, -3, 3);
          std::vector<float> a = state, b = state;
          kern.attn_accumulate(p.data(), kAttnChunk, n_q, vf.data() + head_dim, kv_row, n_slots,
                               head_dim, a.data(), {});
          kern.attn_accumulate_i8(p.data(), kAttnChunk, n_q, rows.data() + head_dim, kv_row,
                                  n_slots, head_dim, b.data(), {});
          ASSERT_EQ(first_bitwise_difference(a.data(), b.data(), n_q * head_dim), -1)
              << isa_name(isa) << " accumulate: head_dim " << head_dim << " n_q " << n_q;
          a = state;
          b = state;
          kern.attn_accumulate_merge(p.data(), kAttnChunk, n_q, vf.data() + head_dim, kv_row,
                                     n_slots, head_dim, wo.data(), wn.data(), a.data(), {});
          kern.attn_accumulate_merge_i8(p.data(), kAttnChunk, n_q, rows.data() + head_dim, kv_row,
                                        n_slots, head_dim, wo.data(), wn.data(), b.data(), {});
          ASSERT_EQ(first_bitwise_difference(a.data(), b.data(), n_q * head_dim), -1)
              << isa_name(isa) << " merge: head_dim " << head_dim << " n_q " << n_q;
        }
      }
    }
  }
  if (isa_supported(Isa::kAvx512)) {
    EXPECT_GT(variants_with_fused, 0);
  }
}

// --- whole attention calls ----------------------------------------------------------------------

// Each token of the call against the same token alone over a cache of the slots it sees.
void check_invariance(const AttentionShape& s, const std::vector<uint8_t>& mask_bytes,
                      ThreadPool* pool2, ThreadPool* pool3, std::mt19937& gen) {
  const uint8_t* mask = mask_bytes.empty() ? nullptr : mask_bytes.data();
  const int64_t n_kv = s.n_past + s.n_new;
  const int64_t kv_row = static_cast<int64_t>(s.n_kv_heads) * s.head_dim;
  const int64_t q_row = static_cast<int64_t>(s.n_heads) * s.head_dim;
  const std::vector<float> q = random_vector(gen, s.n_new * q_row, -2, 2);
  const std::vector<float> k = random_vector(gen, n_kv * kv_row, -2, 2);
  const std::vector<float> v = random_vector(gen, n_kv * kv_row, -1, 1);
  KvCache cache = q8_cache(s, k, v);
  ThreadPool* const pools[3] = {nullptr, pool2, pool3};
  for (Isa isa : attention_variants()) {
    std::vector<float> multi[3];
    for (int p = 0; p < 3; ++p) {
      multi[p].resize(static_cast<size_t>(s.n_new * q_row));
      attend(isa, s, q.data(), cache, mask, multi[p].data(), pools[p]);
    }
    for (int64_t i = 0; i < s.n_new; ++i) {
      std::vector<float> k1, v1;  // the rows token i sees, in slot order
      for (int64_t slot = 0; slot < n_kv; ++slot) {
        if (!visible(s, mask, i, slot)) continue;
        k1.insert(k1.end(), k.begin() + slot * kv_row, k.begin() + (slot + 1) * kv_row);
        v1.insert(v1.end(), v.begin() + slot * kv_row, v.begin() + (slot + 1) * kv_row);
      }
      const int64_t n_visible = static_cast<int64_t>(k1.size()) / kv_row;
      AttentionShape one = s;
      one.n_past = n_visible - 1;
      one.n_new = 1;
      KvCache alone_cache = q8_cache(s, k1, v1);
      for (ThreadPool* pool : pools) {
        std::vector<float> alone(static_cast<size_t>(q_row));
        attend(isa, one, q.data() + i * q_row, alone_cache, nullptr, alone.data(), pool);
        for (int p = 0; p < 3; ++p) {
          const int64_t e =
              first_bitwise_difference(alone.data(), multi[p].data() + i * q_row, q_row);
          ASSERT_EQ(e, -1) << isa_name(isa) << " n_past " << s.n_past << " n_new " << s.n_new
                           << " hd " << s.head_dim << (mask ? " masked" : " causal") << ": token "
                           << i << " element " << e;
        }
      }
    }
  }
}

TEST(KvQ8, TokenOutputIndependentOfBatch) {
  std::mt19937 gen(22);
  ThreadPool pool2(2), pool3(3);
  for (int64_t n_past : {0, 1, 37, 70, 300}) {
    for (int64_t n_new : {1, 2, 5, 8}) {
      const AttentionShape s = make_shape(n_past, n_new, 9, 3, 64);
      check_invariance(s, {}, &pool2, &pool3, gen);
      check_invariance(s, tree_mask(gen, n_new), &pool2, &pool3, gen);
      check_invariance(s, random_mask(gen, n_new), &pool2, &pool3, gen);
    }
  }
  check_invariance(make_shape(20, 50, 9, 3, 64), tree_mask(gen, 50), &pool2, &pool3, gen);
  check_invariance(make_shape(0, 120, 9, 3, 64), {}, &pool2, &pool3, gen);
  check_invariance(make_shape(13, 7, 6, 2, 20), random_mask(gen, 7), &pool2, &pool3, gen);
  check_invariance(make_shape(9, 5, 4, 2, 7), tree_mask(gen, 5), &pool2, &pool3, gen);
}

// Against the naive attention over the dequantized values (the same tolerance as over an f16
// cache: q8_0 scales each score and p instead of each value, one more rounding per product), and
// close to attention over the original floats (quantization error), where reading the codes as
// the values (the scales ignored) is not.
TEST(KvQ8, MatchesDequantizedValuesAndStaysCloseToFloat) {
  std::mt19937 gen(23);
  ThreadPool pool2(2);
  for (const AttentionShape& s :
       {make_shape(0, 1, 9, 3, 64), make_shape(200, 1, 9, 3, 64), make_shape(130, 8, 9, 3, 64),
        make_shape(40, 30, 8, 2, 48), make_shape(513, 3, 4, 1, 20)}) {
    const int64_t n_kv = s.n_past + s.n_new;
    const int64_t kv_row = static_cast<int64_t>(s.n_kv_heads) * s.head_dim;
    const std::vector<float> q = random_vector(gen, s.n_new * s.n_heads * s.head_dim, -2, 2);
    const std::vector<float> k = random_vector(gen, n_kv * kv_row, -2, 2);
    const std::vector<float> v = random_vector(gen, n_kv * kv_row, -1, 1);
    KvCache cache = q8_cache(s, k, v);
    std::vector<float> kd(k.size()), vd(v.size());
    cache.read(0, 0, n_kv, kd.data(), vd.data());
    std::vector<float> k_codes(k.size()), v_codes(v.size());  // the codes taken as values
    for (size_t r = 0; r < k.size(); r += static_cast<size_t>(s.head_dim)) {
      std::vector<int8_t> c(static_cast<size_t>(s.head_dim));
      quantize_kv_row(&k[r], s.head_dim, c.data());
      for (int d = 0; d < s.head_dim; ++d) k_codes[r + d] = c[d];
      quantize_kv_row(&v[r], s.head_dim, c.data());
      for (int d = 0; d < s.head_dim; ++d) v_codes[r + d] = c[d];
    }
    const std::vector<double> naive = attention_naive(s, q, kd, vd, nullptr);
    const std::vector<double> exact = attention_naive(s, q, k, v, nullptr);
    const std::vector<double> unscaled = attention_naive(s, q, k_codes, v_codes, nullptr);
    const double delta = static_cast<double>(s.head_dim) * s.head_dim * kU * s.scale;
    const double tol = 2 * delta + (2.0 * n_kv + 8) * kU;
    double worst_exact = 0, worst_unscaled = 0;
    for (size_t e = 0; e < exact.size(); ++e) {
      worst_exact = std::max(worst_exact, std::fabs(naive[e] - exact[e]));
      worst_unscaled = std::max(worst_unscaled, std::fabs(unscaled[e] - exact[e]));
    }
    // Step d / 2 <= 2 / 254 on K (scores move by up to ~|q|·|dk|) and 1 / 254 on V.
    EXPECT_LT(worst_exact, 0.05) << "n_past " << s.n_past;
    EXPECT_GT(worst_unscaled, 10 * worst_exact) << "the control should be far off";
    for (Isa isa : attention_variants()) {
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
        std::vector<float> got(exact.size());
        attend(isa, s, q.data(), cache, nullptr, got.data(), pool);
        for (size_t e = 0; e < got.size(); ++e) {
          ASSERT_NEAR(got[e], naive[e], tol) << isa_name(isa) << " n_past " << s.n_past << " n_new "
                                             << s.n_new << " element " << e;
        }
      }
    }
  }
}

}  // namespace
}  // namespace specdec
