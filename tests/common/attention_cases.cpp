#include "common/attention_cases.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace specdec::test {

std::vector<Isa> attention_variants() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

std::vector<float> random_vector(std::mt19937& gen, int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

int64_t first_bitwise_difference(const float* a, const float* b, int64_t n) {
  for (int64_t e = 0; e < n; ++e) {
    if (std::memcmp(a + e, b + e, sizeof(float)) != 0) return e;
  }
  return -1;
}

AttentionShape make_shape(int64_t n_past, int64_t n_new, int n_heads, int n_kv_heads,
                          int head_dim) {
  AttentionShape s;
  s.n_past = n_past;
  s.n_new = n_new;
  s.n_heads = n_heads;
  s.n_kv_heads = n_kv_heads;
  s.head_dim = head_dim;
  s.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  return s;
}

std::vector<uint8_t> tree_mask(std::mt19937& gen, int64_t n) {
  std::vector<int64_t> parent(static_cast<size_t>(n), -1);
  std::vector<uint8_t> mask(static_cast<size_t>(n * n), 0);  // [n, n]
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0) parent[i] = std::uniform_int_distribution<int64_t>(-1, i - 1)(gen);
    for (int64_t a = i; a >= 0; a = parent[a]) mask[i * n + a] = 1;
  }
  return mask;
}

std::vector<uint8_t> random_mask(std::mt19937& gen, int64_t n) {
  std::vector<uint8_t> mask(static_cast<size_t>(n * n));  // [n, n]
  std::bernoulli_distribution bit(0.4);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) mask[i * n + j] = i == j || bit(gen);
  }
  return mask;
}

bool visible(const AttentionShape& s, const uint8_t* mask, int64_t i, int64_t slot) {
  if (slot < s.n_past) return true;
  const int64_t j = slot - s.n_past;
  return mask == nullptr ? j <= i : mask[i * s.n_new + j] != 0;
}

std::vector<double> attention_naive(const AttentionShape& s, const std::vector<float>& q,
                                    const std::vector<float>& k, const std::vector<float>& v,
                                    const uint8_t* mask) {
  const int hd = s.head_dim;
  const int group = s.n_heads / s.n_kv_heads;
  const int64_t n_kv = s.n_past + s.n_new;
  std::vector<double> out(static_cast<size_t>(s.n_new * s.n_heads * hd), 0.0);
  std::vector<double> scores(static_cast<size_t>(n_kv));
  for (int64_t i = 0; i < s.n_new; ++i) {
    for (int h = 0; h < s.n_heads; ++h) {
      const int kvh = h / group;
      const float* qh = &q[(i * s.n_heads + h) * hd];
      double max = -INFINITY;
      for (int64_t j = 0; j < n_kv; ++j) {
        if (!visible(s, mask, i, j)) continue;
        double dot = 0;
        for (int d = 0; d < hd; ++d) dot += double{qh[d]} * k[(j * s.n_kv_heads + kvh) * hd + d];
        scores[j] = dot * s.scale;
        max = std::max(max, scores[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < n_kv; ++j) {
        if (visible(s, mask, i, j)) sum += std::exp(scores[j] - max);
      }
      double* o = &out[(i * s.n_heads + h) * hd];
      for (int64_t j = 0; j < n_kv; ++j) {
        if (!visible(s, mask, i, j)) continue;
        const double p = std::exp(scores[j] - max) / sum;
        for (int d = 0; d < hd; ++d) o[d] += p * v[(j * s.n_kv_heads + kvh) * hd + d];
      }
    }
  }
  return out;
}

}  // namespace specdec::test
