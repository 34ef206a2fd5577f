// The `llama` architecture (also `mistral` and `qwen2`): pre-norm transformer with RMSNorm, GQA
// attention with RoPE, SwiGLU feed-forward, optional tied output embedding. What the
// architectures differ in is data (ModelConfig): qwen2 adds biases to Q, K and V and rotates
// the halves of each head (RopeStyle::kNeox) where llama rotates adjacent pairs.
//
//   x = embed(tokens)                                     // [n, dim]
//   for each layer:
//     xn   = rmsnorm(x) * attn_norm
//     q,k,v = xn·Wqᵀ + bq, xn·Wkᵀ + bk, xn·Wvᵀ + bv       // [n, q_dim], [n, kv_dim] x2
//                                                         // (biases: qwen2 only)
//     q,k  = rope(q, positions), rope(k, positions)
//     K/V cache[slots] = k, v
//     x   += attention(q, K, V, mask)·Woᵀ
//     xn   = rmsnorm(x) * ffn_norm
//     x   += (silu(xn·Wgateᵀ) * xn·Wupᵀ)·Wdownᵀ
//   logits = rmsnorm(x[output_rows]) * output_norm · Woutᵀ
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/packed_weights.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/thread_pool.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/weights.h"
#include "util/check.h"
#ifdef SPECDEC_CUDA
#include "model/archs/llama_cuda.h"
#endif
#include "util/huge_pages.h"

namespace specdec {
namespace {

struct LayerWeights {
  const float* attn_norm = nullptr;  // [dim]
  WeightMatrix wq;                   // [q_dim, dim]
  WeightMatrix wk;                   // [kv_dim, dim]
  WeightMatrix wv;                   // [kv_dim, dim]
  const float* bq = nullptr;         // [q_dim] biases of Q, K, V (null: none, as in llama)
  const float* bk = nullptr;         // [kv_dim]
  const float* bv = nullptr;         // [kv_dim]
  WeightMatrix wo;                   // [dim, q_dim]
  const float* ffn_norm = nullptr;   // [dim]
  WeightMatrix w_gate;               // [ffn_dim, dim]
  WeightMatrix w_up;                 // [ffn_dim, dim]
  WeightMatrix w_down;               // [dim, ffn_dim]
  // Stacked copies in the packed layout (null `packed` when not built): one matmul, one
  // activation quantization and one thread join instead of three or two.
  WeightMatrix qkv;      // [q_dim + 2 kv_dim, dim] rows of wq, then wk, then wv
  WeightMatrix gate_up;  // [2 ffn_dim, dim] rows of w_gate, then w_up
};

class LlamaModel final : public Model {
 public:
  LlamaModel(std::unique_ptr<GgufFile> file, ModelConfig config)
      : Model(std::move(file), std::move(config)) {
    load_weights();
  }

  int64_t weight_bytes() const override { return weight_bytes_; }
  int64_t matmul_flops_per_token() const override { return flops_per_token_; }
  using Model::forward;
  ForwardResult forward(std::span<const SeqBatch> seqs, ThreadPool* pool,
                        ForwardScratch* scratch) override;

 private:
  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols, bool count = true);
  const float* vector(const std::string& name, int64_t n);
  void load_weights();
  void pack_weights();
  void dump(const char* name, int layer, const float* data, int64_t rows, int64_t cols) const {
    if (dump_) dump_(name, layer, data, rows, cols);
  }

  WeightMatrix tok_embd_;               // [n_vocab, dim]
  const float* output_norm_ = nullptr;  // [dim]
  WeightMatrix output_;                 // [n_vocab, dim] (tok_embd_ when tied)
  std::vector<LayerWeights> layers_;
  HugeArena arena_;                    // memory of every packed matrix (outlives packed_)
  std::vector<PackedWeights> packed_;  // owners of every `packed` pointer above
  int64_t weight_bytes_ = 0;
  int64_t flops_per_token_ = 0;
};

WeightMatrix LlamaModel::matrix(const std::string& name, int64_t rows, int64_t cols, bool count) {
  const GgufTensor* t = &require_matrix(*file_, name, rows, cols);
  const GgmlTypeTraits& traits = ggml_type_traits(t->type);
  if (!traits.weight_supported) {
    throw Error(fmt::format("{}: tensor '{}' has weight type {}, which specdec does not support",
                            file_->path(), name, traits.name));
  }
  WeightMatrix w;
  w.type = t->type;
  w.data = t->data;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = ggml_row_bytes(t->type, cols);
  if (count) {
    weight_bytes_ += static_cast<int64_t>(t->nbytes);
    flops_per_token_ += 2 * rows * cols;
  }
  return w;
}

const float* LlamaModel::vector(const std::string& name, int64_t n) {
  const GgufTensor* t = &require_f32_vector(*file_, name, n);
  if (reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0) {
    throw Error(fmt::format("{}: tensor '{}' is misaligned", file_->path(), name));
  }
  weight_bytes_ += static_cast<int64_t>(t->nbytes);
  return reinterpret_cast<const float*>(t->data);
}

void LlamaModel::load_weights() {
  const ModelConfig& c = config_;
  // The embedding table is read one row per token, not streamed: not counted in weight_bytes.
  tok_embd_ = matrix("token_embd.weight", c.n_vocab, c.dim, /*count=*/false);
  output_norm_ = vector("output_norm.weight", c.dim);
  if (file_->find_tensor("output.weight")) {
    output_ = matrix("output.weight", c.n_vocab, c.dim);
  } else {
    output_ = matrix("token_embd.weight", c.n_vocab, c.dim);  // tied
  }
  layers_.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = fmt::format("blk.{}.", l);
    LayerWeights& w = layers_[l];
    w.attn_norm = vector(p + "attn_norm.weight", c.dim);
    w.wq = matrix(p + "attn_q.weight", c.q_dim(), c.dim);
    w.wk = matrix(p + "attn_k.weight", c.kv_dim(), c.dim);
    w.wv = matrix(p + "attn_v.weight", c.kv_dim(), c.dim);
    // Q/K/V biases: required where the architecture has them, read when a file carries them.
    if (c.qkv_bias || file_->find_tensor(p + "attn_q.bias") != nullptr) {
      w.bq = vector(p + "attn_q.bias", c.q_dim());
      w.bk = vector(p + "attn_k.bias", c.kv_dim());
      w.bv = vector(p + "attn_v.bias", c.kv_dim());
    }
    w.wo = matrix(p + "attn_output.weight", c.dim, c.q_dim());
    w.ffn_norm = vector(p + "ffn_norm.weight", c.dim);
    w.w_gate = matrix(p + "ffn_gate.weight", c.ffn_dim, c.dim);
    w.w_up = matrix(p + "ffn_up.weight", c.ffn_dim, c.dim);
    w.w_down = matrix(p + "ffn_down.weight", c.dim, c.ffn_dim);
  }
  pack_weights();
}

// On machines with the AVX-512 or AVX2 kernels, Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q6_K
// matrices get a packed copy (packed_weights.h); Q/K/V and gate/up are stacked into one matrix
// each (AVX-512 and AVX-VNNI passes use the stacks; AVX2 passes below kPackedPanelMinRows rows
// too for the types its kernels read packed, avx2_reads_packed; otherwise each part from the
// file's rows). The file's own bytes stay mapped for the other kernels (prefill on AVX2, and the
// embedding lookup).
// SPECDEC_PACKED_WEIGHTS=0 turns packing off (for comparisons).
void LlamaModel::pack_weights() {
  const char* env = std::getenv("SPECDEC_PACKED_WEIGHTS");
  if (!isa_supported(Isa::kAvx2) || (env != nullptr && std::strcmp(env, "0") == 0)) return;
  ThreadPool pool(2);
  // Packs `parts` stacked (rows concatenated); each part then points at its rows of the stack.
  auto pack = [&](std::initializer_list<WeightMatrix*> parts) -> WeightMatrix {
    std::vector<WeightMatrix> list;
    for (WeightMatrix* m : parts) list.push_back(*m);
    packed_.push_back(PackedWeights::pack(list, &pool, &arena_));
    const PackedWeights& pw = packed_.back();
    size_t k = 0;
    for (WeightMatrix* m : parts) *m = pw.part(k++);
    return pw.stacked();
  };
  auto pack_each = [&](std::initializer_list<WeightMatrix*> parts) {
    for (WeightMatrix* m : parts) {
      if (packable(m->type)) pack({m});
    }
  };
  // One packable type and width; every part but the last fills whole blocks of 16 rows.
  auto stackable = [&](std::initializer_list<const WeightMatrix*> parts) {
    const WeightMatrix& first = **parts.begin();
    size_t k = 0;
    for (const WeightMatrix* m : parts) {
      if (!packable(m->type) || m->type != first.type || m->cols != first.cols ||
          packed_format(m->type).six_bit) {  // Q6_K: one by one (packed_weights.h)
        return false;
      }
      if (++k < parts.size() && m->rows % kPackRows != 0) return false;
    }
    return true;
  };
  packed_.reserve(5 * layers_.size() + 1);  // pointers into packed_ must stay put
  for (LayerWeights& w : layers_) {
    if (stackable({&w.wq, &w.wk, &w.wv})) {
      w.qkv = pack({&w.wq, &w.wk, &w.wv});
    } else {
      pack_each({&w.wq, &w.wk, &w.wv});
    }
    if (stackable({&w.w_gate, &w.w_up})) {
      w.gate_up = pack({&w.w_gate, &w.w_up});
    } else {
      pack_each({&w.w_gate, &w.w_up});
    }
    pack_each({&w.wo, &w.w_down});
  }
  pack_each({&output_});
}

// Attention over at most this many (query token, visible slot) pairs runs on one thread: on
// the 2-vCPU test machine one thread is as fast as two up to ~128-192 cached slots for one
// token (build/bench_attention --threads 1|2, K/V from DRAM), and the idle threads can prefetch
// weights instead. Interleaved decode A/B: +1-3% tokens/s at contexts below 132.
constexpr int64_t kSoloAttentionPairs = 160;
constexpr int64_t kSoloPrefetchBytes = 64 << 10;  // per idle thread (L2 holds 1+ MiB)

bool solo_attention(int64_t n, int64_t n_past, const ThreadPool* pool) {
  return pool != nullptr && pool->size() > 1 && n * (n_past + n) <= kSoloAttentionPairs;
}

// Batches of at least this many rows (prefill) run their element-wise steps (norms, residual
// adds, the Q/K/V split and RoPE, swiglu) as row ranges on all threads; below it a job's
// hand-over costs more than the step (a few microseconds for a verification pass).
constexpr int64_t kParallelRows = 32;

// fn(i0, i1) over the rows [0, n): split between the pool's threads for large batches.
template <class F>
void for_rows(int64_t n, ThreadPool* pool, F&& fn) {
  if (pool != nullptr && pool->size() > 1 && n >= kParallelRows) {
    pool->parallel_for(n, 1, fn);
  } else {
    fn(int64_t{0}, n);
  }
}

// y[i] += b[i] for the `rows` rows of `cols` at y.
void add_bias_rows(float* y, const float* b, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * cols;
    for (int64_t i = 0; i < cols; ++i) yr[i] += b[i];
  }
}

template <class T>
T* grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// Checks one sequence's batch (throws specdec::Error, nothing written).
void check_batch(const ModelConfig& c, const SeqBatch& sb) {
  const ForwardBatch& batch = sb.batch;
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  const int64_t n_out = static_cast<int64_t>(batch.output_rows.size());
  if (static_cast<int64_t>(batch.positions.size()) != n) {
    throw Error(fmt::format("forward: {} tokens but {} positions", n, batch.positions.size()));
  }
  if (!batch.mask.empty() && static_cast<int64_t>(batch.mask.size()) != n * n) {
    throw Error(fmt::format("forward: mask has {} entries, expected {}", batch.mask.size(), n * n));
  }
  if (sb.kv.storage == nullptr || sb.kv.n_past < 0) throw Error("forward: no KV cache");
  if (sb.kv.n_past + n > sb.kv.capacity()) {
    throw Error(fmt::format("forward: {} cached + {} new tokens exceed the context size {}",
                            sb.kv.n_past, n, sb.kv.capacity()));
  }
  for (int32_t block : sb.kv.table) {
    if (block < 0 || block >= sb.kv.storage->n_blocks()) {
      throw Error(fmt::format("forward: KV block id {} is outside the pool [0, {})", block,
                              sb.kv.storage->n_blocks()));
    }
  }
  if (sb.kv.storage->n_layers() != c.n_layers || sb.kv.storage->n_kv_heads() != c.n_kv_heads ||
      sb.kv.storage->head_dim() != c.head_dim) {
    throw Error("forward: the KV cache has another model's shape");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (batch.tokens[i] < 0 || batch.tokens[i] >= c.n_vocab) {
      throw Error(fmt::format("forward: token id {} is outside the vocabulary [0, {})",
                              batch.tokens[i], c.n_vocab));
    }
    if (batch.positions[i] < 0) throw Error("forward: negative position");
  }
  for (int64_t r = 0; r < n_out; ++r) {
    if (batch.output_rows[r] < 0 || batch.output_rows[r] >= n ||
        (r > 0 && batch.output_rows[r] <= batch.output_rows[r - 1])) {
      throw Error("forward: output_rows must be increasing row indices of the batch");
    }
  }
}

// (query, visible slot) pairs of a sequence's attention: its cost.
int64_t attention_pairs(const SeqBatch& sb) {
  const auto n = static_cast<int64_t>(sb.batch.tokens.size());
  return n * (sb.kv.n_past + n);
}

ForwardResult LlamaModel::forward(std::span<const SeqBatch> seqs, ThreadPool* pool,
                                  ForwardScratch* scratch) {
  const ModelConfig& c = config_;
  ForwardScratch& sc = *scratch;
  for (const SeqBatch& sb : seqs) {
    check_batch(c, sb);
    if (sb.kv.storage->on_device()) {
      throw Error("forward: the model is on the CPU but a sequence's KV cache is on the device");
    }
  }
  // Rows of the pass: the sequences' tokens one after the other.
  const auto n_seqs = static_cast<int64_t>(seqs.size());
  int64_t* offsets = grow(sc.offsets, n_seqs + 1);  // [n_seqs + 1]
  offsets[0] = 0;
  int64_t n_out = 0;
  bool want_hidden = false;
  bool skip_logits = true;
  for (int64_t si = 0; si < n_seqs; ++si) {
    offsets[si + 1] = offsets[si] + static_cast<int64_t>(seqs[si].batch.tokens.size());
    n_out += static_cast<int64_t>(seqs[si].batch.output_rows.size());
    want_hidden = want_hidden || seqs[si].batch.want_hidden;
    skip_logits = skip_logits && seqs[si].batch.skip_logits && seqs[si].batch.want_hidden;
  }
  const int64_t n = offsets[n_seqs];
  if (n == 0) return {};

  float* x = grow(sc.x, n * c.dim);               // [n, dim]
  float* xn = grow(sc.xn, n * c.dim);             // [n, dim]
  float* q = grow(sc.q, n * c.q_dim());           // [n, q_dim]
  float* attn = grow(sc.attn, n * c.q_dim());     // [n, q_dim]
  float* proj = grow(sc.proj, n * c.dim);         // [n, dim]
  float* gate = grow(sc.gate, n * c.ffn_dim);     // [n, ffn_dim]
  float* up = grow(sc.up, n * c.ffn_dim);         // [n, ffn_dim]
  float* k_new = grow(sc.k_new, n * c.kv_dim());  // [n, n_kv_heads, head_dim]
  float* v_new = grow(sc.v_new, n * c.kv_dim());  // [n, n_kv_heads, head_dim]
  int32_t* positions = grow(sc.positions, n);     // [n]
  for (int64_t si = 0; si < n_seqs; ++si) {
    const ForwardBatch& b = seqs[si].batch;
    for (size_t i = 0; i < b.tokens.size(); ++i) {
      dequantize_row(tok_embd_, b.tokens[i], x + (offsets[si] + static_cast<int64_t>(i)) * c.dim);
      positions[offsets[si] + static_cast<int64_t>(i)] = b.positions[i];
    }
  }
  dump("inp_embd", -1, x, n, c.dim);

  const int64_t kv_row = c.kv_dim();
  // RoPE angles of the batch's positions, once for all layers.
  float* cos_sin = grow(sc.rope, n * c.rope_dim);  // [n, rope_dim / 2, 2]
  rope_angles(positions, n, c.rope_dim, c.rope_freq_base, c.rope_freq_scale, cos_sin);
  // Sequences whose attention is more than a thread's share of the pass's run one after the
  // other on all threads; the others are tasks, one sequence per thread at a time (largest
  // first). The same bits either way (attention does not depend on how its work is split).
  const int threads = pool == nullptr ? 1 : pool->size();
  std::vector<int64_t>& order = sc.attn_order;  // sequences by attention pairs, largest first
  order.resize(static_cast<size_t>(n_seqs));
  int64_t total_pairs = 0;
  for (int64_t si = 0; si < n_seqs; ++si) {
    order[si] = si;
    total_pairs += attention_pairs(seqs[si]);
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return attention_pairs(seqs[a]) > attention_pairs(seqs[b]);
  });
  int64_t n_big = 0;  // order[0, n_big): run on all threads
  while (n_big < n_seqs && (n_seqs == 1 || threads == 1 ||
                            attention_pairs(seqs[order[n_big]]) * threads > total_pairs)) {
    ++n_big;
  }

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = layers_[l];
    // Attention block.
    if (l == 0) {  // later layers normalize in the previous layer's last row pass
      for_rows(n, pool, [&](int64_t i0, int64_t i1) {
        rmsnorm(x + i0 * c.dim, w.attn_norm, c.rms_eps, i1 - i0, c.dim, xn + i0 * c.dim);
      });
    }
    dump("attn_norm", l, xn, n, c.dim);
    // The stacked Q/K/V and gate/up matrices exist only packed: AVX-512 and AVX-VNNI read them
    // at any n, AVX2 below the row count where prefill's tile kernel (on the file's rows) takes
    // over.
    auto stack_ok = [&](const WeightMatrix& stack) {
      const Isa isa = active_isa();
      return stack.packed != nullptr &&
             (isa == Isa::kAvx512 || (isa_avx2_class(isa) && avx2_reads_packed(stack.type) &&
                                      (isa == Isa::kAvxVnni || n < detail::kPackedPanelMinRows)));
    };
    const bool stacked_qkv = stack_ok(w.qkv);
    const int64_t width = c.q_dim() + 2 * kv_row;
    float* qkv = stacked_qkv ? grow(sc.qkv, n * width) : nullptr;  // [n, q_dim + 2 kv_dim]
    if (stacked_qkv) {
      matmul(w.qkv, xn, n, qkv, pool);
    } else {
      matmul(w.wq, xn, n, q, pool);
      matmul(w.wk, xn, n, k_new, pool);
      matmul(w.wv, xn, n, v_new, pool);
    }
    for_rows(n, pool, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; stacked_qkv && i < i1; ++i) {
        const float* src = qkv + i * width;
        const size_t q_bytes = static_cast<size_t>(c.q_dim()) * sizeof(float);
        const size_t kv_bytes = static_cast<size_t>(kv_row) * sizeof(float);
        std::memcpy(q + i * c.q_dim(), src, q_bytes);
        std::memcpy(k_new + i * kv_row, src + c.q_dim(), kv_bytes);
        std::memcpy(v_new + i * kv_row, src + c.q_dim() + kv_row, kv_bytes);
      }
      if (w.bq != nullptr) {  // the biases, on the (stacked output's) parts, before RoPE
        add_bias_rows(q + i0 * c.q_dim(), w.bq, i1 - i0, c.q_dim());
        add_bias_rows(k_new + i0 * kv_row, w.bk, i1 - i0, kv_row);
        add_bias_rows(v_new + i0 * kv_row, w.bv, i1 - i0, kv_row);
      }
      rope_apply(q + i0 * c.q_dim(), cos_sin + i0 * c.rope_dim, i1 - i0, c.n_heads, c.head_dim,
                 c.rope_dim, c.rope_style);
      rope_apply(k_new + i0 * kv_row, cos_sin + i0 * c.rope_dim, i1 - i0, c.n_kv_heads, c.head_dim,
                 c.rope_dim, c.rope_style);
    });
    dump("q_rope", l, q, n, c.q_dim());
    dump("k_rope", l, k_new, n, kv_row);
    dump("v", l, v_new, n, kv_row);
    // Sequence si's new K/V into its slots [n_past, n_past + n_new), in the cache's type (each
    // sequence writes only blocks it owns alone, so sequences may write in parallel).
    auto write_kv = [&](int64_t si) {
      const SeqKv& kv = seqs[si].kv;
      kv.storage->write(l, kv.table, kv.n_past, offsets[si + 1] - offsets[si],
                        k_new + offsets[si] * kv_row, v_new + offsets[si] * kv_row);
    };
    // Attention of sequence si over its own cache, on `on` (null: the calling thread alone).
    auto seq_attention = [&](int64_t si, ThreadPool* on) {
      const SeqBatch& sb = seqs[si];
      AttentionShape shape;
      shape.n_past = sb.kv.n_past;
      shape.n_new = offsets[si + 1] - offsets[si];
      shape.n_heads = c.n_heads;
      shape.n_kv_heads = c.n_kv_heads;
      shape.head_dim = c.head_dim;
      shape.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
      const uint8_t* mask = sb.batch.mask.empty() ? nullptr : sb.batch.mask.data();
      attention(shape, q + offsets[si] * c.q_dim(), sb.kv.storage->view(l, sb.kv.table.data()),
                mask, attn + offsets[si] * c.q_dim(), on);
    };
    if (n_seqs == 1 && solo_attention(n, seqs[0].kv.n_past, pool)) {
      // Little attention work: thread 0 does it alone (cheaper than sharing it), the other
      // threads meanwhile bring the start of their stretch of wo into their caches.
      write_kv(0);
      pool->run([&](int ti, int nt) {
        if (ti == 0) {
          seq_attention(0, nullptr);
        } else {
          matmul_prefetch(w.wo, ti, nt, kSoloPrefetchBytes);
        }
      });
    } else {
      for (int64_t k = 0; k < n_big; ++k) {
        write_kv(order[k]);
        seq_attention(order[k], pool);
      }
      if (n_big < n_seqs) {
        // One task per sequence: its K/V write, then its attention (the writes of a decode
        // batch are a few microseconds each, no longer serial on thread 0).
        std::atomic<int64_t> next{n_big};
        pool->run([&](int, int) {
          for (int64_t k = next.fetch_add(1); k < n_seqs; k = next.fetch_add(1)) {
            write_kv(order[k]);
            seq_attention(order[k], nullptr);
          }
        });
      }
    }
    dump("attn_out", l, attn, n, c.q_dim());
    matmul(w.wo, attn, n, proj, pool);
    // Residual add, then the feed-forward block's norm, row range by row range.
    for_rows(n, pool, [&](int64_t i0, int64_t i1) {
      for (int64_t e = i0 * c.dim; e < i1 * c.dim; ++e) x[e] += proj[e];
      rmsnorm(x + i0 * c.dim, w.ffn_norm, c.rms_eps, i1 - i0, c.dim, xn + i0 * c.dim);
    });
    dump("attn_residual", l, x, n, c.dim);
    if (stack_ok(w.gate_up)) {
      float* gu = grow(sc.gate_up, n * 2 * c.ffn_dim);  // [n, 2 ffn_dim] gate | up
      matmul(w.gate_up, xn, n, gu, pool);
      if (dump_) {  // the activations exist as floats only for a dump
        for (int64_t i = 0; i < n; ++i) {
          swiglu(gu + i * 2 * c.ffn_dim, gu + i * 2 * c.ffn_dim + c.ffn_dim, c.ffn_dim,
                 gate + i * c.ffn_dim);
        }
        dump("ffn_act", l, gate, n, c.ffn_dim);
      }
      // swiglu formed while the down matmul quantizes its input (on all threads).
      matmul_swiglu(w.w_down, gu, n, proj, gate, pool);
    } else {
      matmul(w.w_gate, xn, n, gate, pool);
      matmul(w.w_up, xn, n, up, pool);
      for_rows(n, pool, [&](int64_t i0, int64_t i1) {
        swiglu(gate + i0 * c.ffn_dim, up + i0 * c.ffn_dim, (i1 - i0) * c.ffn_dim,
               gate + i0 * c.ffn_dim);
      });
      dump("ffn_act", l, gate, n, c.ffn_dim);
      matmul(w.w_down, gate, n, proj, pool);
    }
    // Residual add, then the next layer's attention norm, row range by row range.
    const float* next_norm = l + 1 < c.n_layers ? layers_[l + 1].attn_norm : nullptr;
    for_rows(n, pool, [&](int64_t i0, int64_t i1) {
      for (int64_t e = i0 * c.dim; e < i1 * c.dim; ++e) x[e] += proj[e];
      if (next_norm != nullptr) {
        rmsnorm(x + i0 * c.dim, next_norm, c.rms_eps, i1 - i0, c.dim, xn + i0 * c.dim);
      }
    });
    dump("layer_out", l, x, n, c.dim);
  }

  ForwardResult result;
  if (n_out == 0) return result;
  float* sel = grow(sc.sel, n_out * c.dim);  // [n_out, dim]
  int64_t r_out = 0;
  for (int64_t si = 0; si < n_seqs; ++si) {
    for (int32_t row : seqs[si].batch.output_rows) {
      const float* src = x + (offsets[si] + row) * c.dim;
      std::copy(src, src + c.dim, sel + r_out++ * c.dim);
    }
  }
  rmsnorm(sel, output_norm_, c.rms_eps, n_out, c.dim, sel);
  dump("result_norm", -1, sel, n_out, c.dim);
  if (skip_logits) {
    result.hidden = {sel, static_cast<size_t>(n_out * c.dim)};
    return result;
  }
  float* logits = grow(sc.logits, n_out * c.n_vocab);  // [n_out, n_vocab]
  matmul(output_, sel, n_out, logits, pool);
  dump("result_output", -1, logits, n_out, c.n_vocab);
  result.logits = {logits, static_cast<size_t>(n_out * c.n_vocab)};
  if (want_hidden) result.hidden = {sel, static_cast<size_t>(n_out * c.dim)};
  return result;
}

}  // namespace

Model::Model(std::unique_ptr<GgufFile> file, ModelConfig config)
    : file_(std::move(file)), config_(std::move(config)) {}

ForwardResult Model::forward(KvCache& kv, const ForwardBatch& batch, ThreadPool* pool) {
  const SeqBatch seq{kv.seq(), batch};
  const ForwardResult result = forward({&seq, 1}, pool, &scratch_);
  kv.append(static_cast<int64_t>(batch.tokens.size()));
  return result;
}

void Model::check_seq_batch(const SeqBatch& sb) const {
  check_batch(config_, sb);
}

KvCache Model::make_kv_cache(int64_t capacity, KvType type) const {
  return KvCache(config_.n_layers, config_.n_kv_heads, config_.head_dim, capacity, type,
                 make_kv_device_memory(1, KvCache::storage_slots(capacity), type));
}

std::unique_ptr<PagedKvStorage> Model::make_paged_kv(int32_t n_blocks, int64_t block_slots,
                                                     KvType type) const {
  return std::make_unique<PagedKvStorage>(config_.n_layers, config_.n_kv_heads, config_.head_dim,
                                          n_blocks, block_slots, type,
                                          make_kv_device_memory(n_blocks, block_slots, type));
}

std::unique_ptr<Model> Model::load(const std::string& path) {
  std::unique_ptr<GgufFile> file = GgufFile::open(path);
  ModelConfig config = ModelConfig::from_gguf(*file);
  return std::make_unique<LlamaModel>(std::move(file), std::move(config));
}

std::unique_ptr<Model> Model::load(const std::string& path, Device device) {
  if (device == Device::kCpu) return load(path);
#ifdef SPECDEC_CUDA
  return load_cuda_llama(path);
#else
  throw Error("specdec was built without CUDA (cmake -DSPECDEC_CUDA=ON)");
#endif
}

}  // namespace specdec
