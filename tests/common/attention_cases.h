// Helpers shared by the attention tests (tests/ops/test_ops.cpp, test_paged_attention.cpp,
// test_kv_q8_attention.cpp): the kernel variants to run, random inputs, masks, the naive double
// attention every variant is checked against, and a bitwise comparison.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/ops.h"

namespace specdec::test {

// The attention kernel tables this machine can run (scalar, AVX2, AVX-512; AVX-VNNI runs the
// AVX2 table).
std::vector<Isa> attention_variants();

// n floats uniform in [lo, hi).
std::vector<float> random_vector(std::mt19937& gen, int64_t n, float lo, float hi);

// Index of the first element whose bits differ, or -1.
int64_t first_bitwise_difference(const float* a, const float* b, int64_t n);

// A shape with scale 1 / sqrt(head_dim).
AttentionShape make_shape(int64_t n_past, int64_t n_new, int n_heads, int n_kv_heads, int head_dim);

// A random tree over the new tokens (parent before child): mask[i][j] = j is i or an ancestor.
std::vector<uint8_t> tree_mask(std::mt19937& gen, int64_t n);

// Arbitrary bits with the diagonal set. [n, n]
std::vector<uint8_t> random_mask(std::mt19937& gen, int64_t n);

// Whether new token i sees cache slot `slot` (mask null: causal).
bool visible(const AttentionShape& s, const uint8_t* mask, int64_t i, int64_t slot);

// Naive O(n²) attention in double over k, v: [n_past + n_new, n_kv_heads, head_dim];
// out: [n_new, n_heads, head_dim].
std::vector<double> attention_naive(const AttentionShape& s, const std::vector<float>& q,
                                    const std::vector<float>& k, const std::vector<float>& v,
                                    const uint8_t* mask);

}  // namespace specdec::test
