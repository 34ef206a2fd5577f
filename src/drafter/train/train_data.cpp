#include "drafter/train/train_data.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"
#include "drafter/train/train_gemm.h"
#include "drafter/train/train_rows.h"
#include "sample/rng.h"
#include "util/check.h"

namespace specdec {

std::vector<int64_t> training_positions(const DistillDataset& d, std::span<const uint8_t> held_out,
                                        bool want) {
  std::vector<int64_t> out;
  for (int64_t s = 0; s < d.n_seqs(); ++s) {
    const bool flag = held_out.empty() ? false : held_out[s] != 0;
    if (flag != want) continue;
    const int64_t begin = d.seq_offsets[s], end = d.seq_offsets[s + 1];
    // i from max(n_prompt - 1, 0) while i + 2 <= L - 1 (L = end - begin)
    const int64_t first = begin + std::max<int64_t>(d.n_prompt[s] - 1, 0);
    for (int64_t i = first; i + 2 < end; ++i) out.push_back(i);
  }
  return out;
}

PositionSplit split_positions(const DistillDataset& d, double eval_fraction, uint64_t seed) {
  const int64_t n = d.n_seqs();
  int64_t n_eval = static_cast<int64_t>(std::llround(eval_fraction * static_cast<double>(n)));
  if (eval_fraction > 0 && n >= 2) n_eval = std::max<int64_t>(n_eval, 1);
  n_eval = std::min(n_eval, n > 1 ? n - 1 : 0);
  // A Fisher-Yates shuffle of the sequence ids by its own generator; the first n_eval are held
  // out.
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = i;
  Rng rng(seed ^ 0x6576616c73706c69ull);  // "evalspli"
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap(ids[i], ids[static_cast<int64_t>(rng.next() % static_cast<uint64_t>(i + 1))]);
  }
  std::vector<uint8_t> held_out(n, 0);
  for (int64_t i = 0; i < n_eval; ++i) held_out[ids[i]] = 1;
  PositionSplit split;
  split.train = training_positions(d, held_out, false);
  split.eval = training_positions(d, held_out, true);
  split.n_eval_seqs = n_eval;
  split.n_train_seqs = n - n_eval;
  return split;
}

std::vector<int32_t> draft_index_map(std::span<const int32_t> draft_vocab, int n_target_vocab) {
  std::vector<int32_t> map(n_target_vocab, -1);
  for (size_t v = 0; v < draft_vocab.size(); ++v) {
    SPECDEC_CHECK(draft_vocab[v] >= 0 && draft_vocab[v] < n_target_vocab,
                  "draft vocabulary id out of the target's range");
    map[draft_vocab[v]] = static_cast<int32_t>(v);
  }
  return map;
}

void make_batch(const DistillDataset& d, std::span<const int64_t> positions, int steps,
                std::span<const int32_t> draft_index, ReDrafterBatch* batch) {
  const int64_t B = static_cast<int64_t>(positions.size()), dim = d.dim;
  batch->n = static_cast<int>(B);
  batch->steps = steps;
  batch->hidden.resize(B * dim);
  batch->inputs.resize(B * steps);
  batch->targets.resize(B * steps);
  const int64_t n_target_vocab = static_cast<int64_t>(draft_index.size());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t i = positions[b];
    // the end of i's sequence: the first offset above i
    const auto it = std::upper_bound(d.seq_offsets.begin(), d.seq_offsets.end(), i);
    SPECDEC_CHECK(it != d.seq_offsets.end() && i + 2 < *it, "training position without a target");
    const int64_t end = *it;
    f16_to_f32(d.hidden.data() + i * dim, dim, batch->hidden.data() + b * dim);
    const int32_t root = d.tokens[i + 1];
    for (int k = 0; k < steps; ++k) {
      const int64_t in = i + 1 + k, tgt = i + 2 + k;
      batch->inputs[k * B + b] = in < end ? d.tokens[in] : root;
      int32_t t = kTargetPastEnd;
      if (tgt < end) {
        const int32_t tok = d.tokens[tgt];
        SPECDEC_CHECK(tok >= 0 && tok < n_target_vocab, "dataset token beyond the target's vocabulary");
        t = draft_index[tok] >= 0 ? draft_index[tok] : kTargetOutOfVocab;
      }
      batch->targets[k * B + b] = t;
    }
  }
}

void make_soft_labels(const DistillDataset& d, std::span<const int64_t> positions,
                      std::span<const float> target_rows, float weight, ReDrafterBatch* batch,
                      std::vector<float>* label_hidden, ThreadPool* pool) {
  const int64_t B = static_cast<int64_t>(positions.size()), C = batch->steps, dim = d.dim;
  const int64_t R = B * C;
  SPECDEC_CHECK(batch->n == B && static_cast<int64_t>(batch->targets.size()) == R,
                "soft labels: the batch was made from other positions");
  SPECDEC_CHECK(dim > 0 && !target_rows.empty() &&
                    static_cast<int64_t>(target_rows.size()) % dim == 0,
                "soft labels: target rows are not [V_d, dim]");
  const int64_t V = static_cast<int64_t>(target_rows.size()) / dim;
  // A target inside its sequence (make_batch marks the others kTargetPastEnd) was predicted by
  // h_{i+1+k}; rows past the end keep zeros.
  auto inside = [&](int64_t r) { return batch->targets[static_cast<size_t>(r)] != kTargetPastEnd; };
  label_hidden->assign(static_cast<size_t>(R * dim), 0.0f);  // [R, dim], row r = k * B + b
  for (int64_t k = 0; k < C; ++k) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t r = k * B + b, h = positions[b] + 1 + k;  // h predicted t_{i+2+k}
      if (!inside(r)) continue;
      SPECDEC_CHECK(h >= 1 && h + 1 < d.n_tokens(), "soft labels: position outside the dataset");
      f16_to_f32(d.hidden.data() + h * dim, dim, label_hidden->data() + r * dim);
    }
  }
  batch->soft.resize(static_cast<size_t>(R * V));
  linear_forward(R, dim, V, label_hidden->data(), dim, target_rows.data(), dim, batch->soft.data(),
                 V, false, pool);
  for_rows(pool, R, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* z = batch->soft.data() + r * V;
      if (!inside(r)) {
        std::fill(z, z + V, 0.0f);
        continue;
      }
      float zmax = z[0];
      for (int64_t v = 1; v < V; ++v) zmax = std::max(zmax, z[v]);
      double sum = 0.0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(z[v]) - zmax);
      const double inv = 1.0 / sum;
      for (int64_t v = 0; v < V; ++v) {
        z[v] = static_cast<float>(std::exp(static_cast<double>(z[v]) - zmax) * inv);
      }
    }
  });
  batch->soft_weight = weight;
}

void shuffle_positions(std::vector<int64_t>& v, Rng& rng) {
  for (int64_t i = static_cast<int64_t>(v.size()) - 1; i > 0; --i) {
    std::swap(v[i], v[static_cast<int64_t>(rng.next() % static_cast<uint64_t>(i + 1))]);
  }
}

std::vector<int64_t> capped_positions(const std::vector<int64_t>& all, int64_t cap) {
  const int64_t n = static_cast<int64_t>(all.size());
  if (cap <= 0 || n <= cap) return all;
  std::vector<int64_t> out(cap);
  for (int64_t i = 0; i < cap; ++i) out[i] = all[i * n / cap];
  return out;
}

}  // namespace specdec
