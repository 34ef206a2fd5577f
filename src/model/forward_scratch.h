// The buffers of one forward pass, grown to the largest batch seen and reused, so the hot path
// allocates nothing after warm-up. They belong to the caller of Model::forward (one per step or
// per concurrent caller), not to the model, so the forward pass is reentrant.
#pragma once

#include <cstdint>
#include <vector>

namespace specdec {

struct ForwardScratch {
  // n = all new tokens of the pass, n_out = output rows.
  std::vector<float> x;        // [n, dim] residual stream
  std::vector<float> xn;       // [n, dim] normed input of a block
  std::vector<float> q;        // [n, q_dim]
  std::vector<float> attn;     // [n, q_dim]
  std::vector<float> proj;     // [n, dim] output of Wo / Wdown
  std::vector<float> gate;     // [n, ffn_dim]
  std::vector<float> up;       // [n, ffn_dim]
  std::vector<float> k_new;    // [n, kv_dim] the batch's K rows (after RoPE), then cached
  std::vector<float> v_new;    // [n, kv_dim] the batch's V rows, then cached
  std::vector<float> qkv;      // [n, q_dim + 2 kv_dim] output of the stacked Q/K/V matmul
  std::vector<float> gate_up;  // [n, 2 ffn_dim] output of the stacked gate/up matmul
  std::vector<float> sel;      // [n_out, dim] final-normed rows chosen for output
  std::vector<float> rope;     // [n, rope_dim / 2, 2] cos / sin of the batch's RoPE angles
  std::vector<float> logits;   // [n_out, n_vocab]
  std::vector<int32_t> positions;  // [n] all sequences' positions, in batch order
  std::vector<int64_t> offsets;    // [n_seqs + 1] first row of each sequence
  std::vector<int64_t> attn_order; // [n_seqs] sequences by attention work, largest first
};

}  // namespace specdec
