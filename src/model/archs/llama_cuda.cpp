// The `llama` architecture on the GPU: LlamaModel's forward pass (llama.cpp) as cuda_ops.h
// kernels on device buffers.
//
//   per pass, one upload: token ids, positions, the physical KV slot of every new token, the
//     attention descriptors of the sequences, their block tables, tree masks and the output rows
//   x = get_rows(tok_embd, tokens)                              // [n, dim]
//   for each layer:
//     xn = rmsnorm(x) * attn_norm; q, k, v = xn·Wqᵀ, xn·Wkᵀ, xn·Wvᵀ; rope(q), rope(k)
//     kv_write(k, v at the physical slots); attn = paged_attention(q, each sequence's blocks)
//     x += attn·Woᵀ; xn = rmsnorm(x) * ffn_norm; x += swiglu(xn·Wgateᵀ, xn·Wupᵀ)·Wdownᵀ
//   sel = rmsnorm(x[output rows]) * output_norm; logits = sel·Woutᵀ    // downloaded to host
//
// Fused launches (default; SPECDEC_CUDA_FUSE=0 at load runs the separate ops, the same bits):
// Wq|Wk|Wv and Wgate|Wup are stacked into one matrix each where their types agree (MatrixGroup),
// each residual add runs with the norm after it (add_rmsnorm: the next layer's attn_norm, after
// the last layer output_norm on every row, the output rows then gathered), and rope of q and k
// runs with the K/V writes (rope_qkv_kv_write). Per layer, 9 launches instead of 16 (13 instead
// of 23 with the quantization kernels of the int8 matmul types).
//
// CUDA graphs (issue 27): the upload (pinned host memory, asynchronous) and the download stay
// outside; everything between - every layer, the final norm and the output matmul - is recorded
// into a graph keyed by the pass's launch signature (key_, built in forward) at its second sight
// and replayed after. The signature holds every host value the launches take: n, n_out, the number of
// attention sequences (and their rows and pools when they are in different pools), the staging
// section offsets, the device addresses of the staging / activation buffers and of the KV pools,
// the bound passed as max_visible (bucketed) and the matmul mode. Per-step values (n_past, block
// tables, masks, positions, slots) are device data, uploaded each pass. A reallocated buffer of
// the model clears the model's graphs; memory the model does not own (the matmul's activation
// scratch) is re-checked by cuda::GraphCache before each replay. SPECDEC_CUDA_GRAPHS=0 (or
// cuda::set_graphs_enabled(false)) turns graphs off; a tensor dump callback does too.
#include "model/archs/llama_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/ops.h"  // f32_to_f16, f16_to_f32
#include "kv/block_pieces.h"
#include "model/gguf.h"
#include "model/weights.h"
#include "util/check.h"

namespace specdec {
namespace {

template <class T>
T* grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

size_t align16(size_t n) { return (n + 15) & ~size_t{15}; }

// The max_visible given to paged_attention: an upper bound of n_past + n_new (the next power of
// two, at least 256) rather than the exact value, so that a decode step's launches - and its CUDA
// graph - stay the same for many steps (the attention kernels size their shared memory and the
// split kernel its grid of tiles by it).
int64_t visible_bound(int64_t v) {
  int64_t b = 256;
  while (b < v) b *= 2;
  return b;
}

// Smallest row counts the activation / output buffers are sized for: growing them reallocates
// and drops the CUDA graphs, so small passes (decode, verification) never do it twice.
constexpr int64_t kMinActivationRows = 64;
constexpr int64_t kMinOutputRows = 16;

}  // namespace

// ---- CudaKvMemory -------------------------------------------------------------------------------

CudaKvMemory::CudaKvMemory(int n_layers, int n_kv_heads, int head_dim, int32_t n_blocks,
                           int64_t block_slots, KvType type)
    : n_layers_(n_layers),
      n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      row_elems_(static_cast<int64_t>(n_kv_heads) * head_dim),
      n_blocks_(n_blocks),
      block_slots_(block_slots),
      type_(type) {
  SPECDEC_CHECK(n_layers > 0 && n_kv_heads > 0 && head_dim > 0 && n_blocks > 0 && block_slots > 0,
                "bad KV shape");
  const auto bytes = static_cast<size_t>(n_layers_ * layer_elems()) * kv_type_bytes(type_);
  k_ = cuda::DeviceBuffer(bytes);
  v_ = cuda::DeviceBuffer(bytes);
  cuda::zero(k_.data(), bytes);
  cuda::zero(v_.data(), bytes);
}

CudaKvMemory::CudaKvMemory(const CudaKvMemory& shape, NoInit)
    : n_layers_(shape.n_layers_),
      n_kv_heads_(shape.n_kv_heads_),
      head_dim_(shape.head_dim_),
      row_elems_(shape.row_elems_),
      n_blocks_(shape.n_blocks_),
      block_slots_(shape.block_slots_),
      type_(shape.type_),
      k_(shape.k_.bytes()),
      v_(shape.v_.bytes()) {}

cuda::DeviceKvLayer CudaKvMemory::layer(int layer) const {
  cuda::DeviceKvLayer l;
  l.k = static_cast<uint8_t*>(k_.data()) + offset(layer, 0);
  l.v = static_cast<uint8_t*>(v_.data()) + offset(layer, 0);
  l.type = type_;
  l.n_kv_heads = n_kv_heads_;
  l.head_dim = head_dim_;
  l.block_slots = block_slots_;
  return l;
}

void CudaKvMemory::check_blocks(std::span<const int32_t> table, int64_t slot, int64_t n) const {
  SPECDEC_CHECK(slot >= 0 && n >= 0 && slot + n <= static_cast<int64_t>(table.size()) * block_slots_,
                "KV access outside the sequence's blocks");
  for_block_pieces(table, block_slots_, slot, n, [&](int64_t, int32_t block, int64_t, int64_t) {
    SPECDEC_CHECK(block >= 0 && block < n_blocks_, "KV block id out of range");
  });
}

void CudaKvMemory::write(int layer, std::span<const int32_t> table, int64_t slot, int64_t n,
                         const float* k, const float* v) {
  SPECDEC_CHECK(layer >= 0 && layer < n_layers_, "KV layer out of range");
  check_blocks(table, slot, n);
  if (n == 0) return;
  const int64_t elems = n * row_elems_;
  const void* k_src = k;
  const void* v_src = v;
  if (type_ == KvType::kF16) {  // [2, n, row] halves: K then V
    uint16_t* halves = halves_scratch(2 * elems);
    f32_to_f16(k, elems, halves);
    f32_to_f16(v, elems, halves + elems);
    k_src = halves;
    v_src = halves + elems;
  }
  const int64_t elem_bytes = static_cast<int64_t>(kv_type_bytes(type_));
  for_block_pieces(table, block_slots_, slot, n,
                   [&](int64_t o, int32_t block, int64_t local, int64_t count) {
    const size_t dst = offset(layer, static_cast<int64_t>(block) * block_slots_ + local);
    const size_t src = static_cast<size_t>(o * row_elems_ * elem_bytes);
    const size_t bytes = static_cast<size_t>(count * row_bytes());
    cuda::upload(static_cast<uint8_t*>(k_.data()) + dst, static_cast<const uint8_t*>(k_src) + src,
                 bytes);
    cuda::upload(static_cast<uint8_t*>(v_.data()) + dst, static_cast<const uint8_t*>(v_src) + src,
                 bytes);
  });
}

void CudaKvMemory::read(int layer, std::span<const int32_t> table, int64_t slot, int64_t n,
                        float* k, float* v) const {
  SPECDEC_CHECK(layer >= 0 && layer < n_layers_, "KV layer out of range");
  check_blocks(table, slot, n);
  if (n == 0) return;
  const int64_t elems = n * row_elems_;
  const int64_t elem_bytes = static_cast<int64_t>(kv_type_bytes(type_));
  // f16: download into halves [2, n, row], then convert; f32: straight into k / v.
  uint16_t* halves = type_ == KvType::kF16 ? halves_scratch(2 * elems) : nullptr;
  auto* k_dst = halves != nullptr ? reinterpret_cast<uint8_t*>(halves)
                                  : reinterpret_cast<uint8_t*>(k);
  auto* v_dst = halves != nullptr ? reinterpret_cast<uint8_t*>(halves + elems)
                                  : reinterpret_cast<uint8_t*>(v);
  for_block_pieces(table, block_slots_, slot, n,
                   [&](int64_t o, int32_t block, int64_t local, int64_t count) {
    const size_t src = offset(layer, static_cast<int64_t>(block) * block_slots_ + local);
    const size_t dst = static_cast<size_t>(o * row_elems_ * elem_bytes);
    const size_t bytes = static_cast<size_t>(count * row_bytes());
    if (k != nullptr) {
      cuda::download(k_dst + dst, static_cast<const uint8_t*>(k_.data()) + src, bytes);
    }
    if (v != nullptr) {
      cuda::download(v_dst + dst, static_cast<const uint8_t*>(v_.data()) + src, bytes);
    }
  });
  if (halves != nullptr) {
    if (k != nullptr) f16_to_f32(halves, elems, k);
    if (v != nullptr) f16_to_f32(halves + elems, elems, v);
  }
}

void CudaKvMemory::copy_slot(std::span<const int32_t> table, int64_t from, int64_t to) {
  check_blocks(table, from, 1);
  check_blocks(table, to, 1);
  if (from == to) return;
  auto phys = [&](int64_t s) {
    return static_cast<int64_t>(table[static_cast<size_t>(s / block_slots_)]) * block_slots_ +
           s % block_slots_;
  };
  cuda::kv_copy_slot(k_.data(), v_.data(), type_, n_layers_, layer_elems(), row_elems_, phys(from),
                     phys(to));
}

std::unique_ptr<KvDeviceMemory> CudaKvMemory::clone() const {
  std::unique_ptr<CudaKvMemory> c(new CudaKvMemory(*this, NoInit{}));
  cuda::copy_device(c->k_.data(), k_.data(), k_.bytes());
  cuda::copy_device(c->v_.data(), v_.data(), v_.bytes());
  return c;
}

// ---- the model ----------------------------------------------------------------------------------

namespace {

// Matrices that multiply the same input, in output order (Wq, Wk, Wv or Wgate, Wup), as 1 to 3
// matmuls: consecutive ones of the same type are stacked into one matrix (their rows
// concatenated: GGUF rows are independent, and every matmul kernel computes an output row from
// its weight row and the token alone, so a stacked matmul gives each row the bits of its own
// matmul). Part j's output [n, parts[j].rows] is stored after the previous parts' ([n, rows]
// each, one after the other), so the outputs of q, k, v are always at fixed views.
struct MatrixGroup {
  cuda::DeviceMatrix parts[3];
  int n_parts = 0;
};

struct DeviceLayer {
  const float* attn_norm = nullptr;  // [dim]
  MatrixGroup qkv;                   // Wq [q_dim, dim], Wk [kv_dim, dim], Wv [kv_dim, dim]
  const float* bq = nullptr;         // [q_dim] biases of Q, K, V (null: none, as in llama)
  const float* bk = nullptr;         // [kv_dim]
  const float* bv = nullptr;         // [kv_dim]
  cuda::DeviceMatrix wo;             // [dim, q_dim]
  const float* ffn_norm = nullptr;   // [dim]
  MatrixGroup gate_up;               // Wgate [ffn_dim, dim], Wup [ffn_dim, dim]
  cuda::DeviceMatrix w_down;         // [dim, ffn_dim]
};

// Where matrix `which` of a group (rows[i]: the row count of its matrix i) puts its output for
// n tokens in the group's output buffer `out`: the pointer to token 0's first element and the
// row stride (that of its part).
struct GroupView {
  float* data;
  int64_t stride;
};
GroupView group_view(const MatrixGroup& g, const int64_t* rows, int which, int64_t n, float* out) {
  // Walk the parts; the matrices of part j are consecutive in `rows`.
  int64_t at = 0;   // first matrix of the current part
  float* base = out;
  for (int j = 0; j < g.n_parts; ++j) {
    int64_t col = 0;
    int64_t m = at;
    int64_t part_rows = 0;
    while (part_rows < g.parts[j].rows) part_rows += rows[m++];
    if (which < m) {
      for (int64_t i = at; i < which; ++i) col += rows[i];
      return {base + col, g.parts[j].rows};
    }
    base += n * g.parts[j].rows;
    at = m;
  }
  throw Error("forward: bad matrix group");
}

// Whether the forward pass uses the fused kernels and stacked matrices (default), or the
// separate ops (SPECDEC_CUDA_FUSE=0, read when a model is loaded: for A/B comparisons - both
// give the same bits).
bool fuse_from_env() {
  const char* e = std::getenv("SPECDEC_CUDA_FUSE");
  return e == nullptr || std::strcmp(e, "0") != 0;
}
// At most how many matrices a MatrixGroup part stacks when fused: SPECDEC_CUDA_STACK = 1, 2 or 3
// (default 3; read at load). 1 and 2 exist for the tests (the layouts of files whose Wv or Wup
// has another type than the rest: Q4_K_M's Q6_K tensors).
int stack_from_env() {
  const char* e = std::getenv("SPECDEC_CUDA_STACK");
  if (e == nullptr) return 3;
  const int v = std::atoi(e);
  return v < 1 ? 1 : (v > 3 ? 3 : v);
}

class CudaLlamaModel final : public Model {
 public:
  CudaLlamaModel(std::unique_ptr<GgufFile> file, ModelConfig config)
      : Model(std::move(file), std::move(config)),
        fuse_(fuse_from_env()),
        stack_max_(fuse_ ? stack_from_env() : 1) {
    load_weights();
  }

  int64_t weight_bytes() const override { return weight_bytes_; }
  int64_t matmul_flops_per_token() const override { return flops_per_token_; }
  const char* device_name() const override { return "cuda"; }
  std::unique_ptr<KvDeviceMemory> make_kv_device_memory(int32_t n_blocks, int64_t block_slots,
                                                        KvType type) const override {
    if (type == KvType::kQ8) {
      throw Error("the q8_0 KV cache runs on the CPU only; use --kv-type f16 or f32 on the GPU");
    }
    return std::make_unique<CudaKvMemory>(config_.n_layers, config_.n_kv_heads, config_.head_dim,
                                          n_blocks, block_slots, type);
  }
  using Model::forward;
  ForwardResult forward(std::span<const SeqBatch> seqs, ThreadPool* pool,
                        ForwardScratch* scratch) override;

 private:
  const void* upload_tensor(const GgufTensor& t);
  cuda::DeviceMatrix matrix(const std::string& name, int64_t rows, int64_t cols, bool count = true);
  const GgufTensor& checked_matrix(const std::string& name, int64_t rows, int64_t cols) const;
  // Matrices of shape [rows[i], cols] multiplying the same input, stacked where they can be
  // (when fuse_; MatrixGroup).
  MatrixGroup matrix_group(const std::vector<std::string>& names, const int64_t* rows,
                           int64_t cols);
  const float* vector(const std::string& name, int64_t n);
  void load_weights();
  // Copies a device tensor to the host for the dump callback (only when one is set).
  void dump(const char* name, int layer, const float* data, int64_t rows, int64_t cols) {
    if (!dump_) return;
    dump_host_.resize(static_cast<size_t>(rows * cols));
    cuda::download(dump_host_.data(), data, dump_host_.size() * sizeof(float));
    dump_(name, layer, dump_host_.data(), rows, cols);
  }

  cuda::DeviceMatrix tok_embd_;         // [n_vocab, dim]
  const float* output_norm_ = nullptr;  // [dim]
  cuda::DeviceMatrix output_;           // [n_vocab, dim] (tok_embd_ when tied)
  std::vector<DeviceLayer> layers_;
  std::map<const GgufTensor*, cuda::DeviceBuffer> weights_;  // every uploaded tensor, once
  std::vector<cuda::DeviceBuffer> stacked_;  // the stacked matrices (MatrixGroup)
  const bool fuse_;       // fused kernels and stacked matrices (fuse_from_env)
  const int stack_max_;   // matrices per stacked part (stack_from_env; 1 when not fuse_)
  int64_t weight_bytes_ = 0;
  int64_t flops_per_token_ = 0;

  // Device ranges whose identity a graph key covers (for cuda::GraphCache::end_capture).
  std::vector<cuda::DeviceRange> known_ranges(const std::vector<CudaKvMemory*>& mems) const;

  // The pass's buffers (one pass at a time: the device and its stream are shared).
  std::mutex mu_;
  cuda::PinnedBuffer staging_;   // host side of the pass's one upload
  cuda::PinnedBuffer host_out_;  // host side of the download: logits, then hidden rows
  cuda::DeviceBuffer d_staging_;
  // d_qkv_: the q, k, v projections (MatrixGroup layout) [n, q_dim + 2 kv_dim]; d_q_ / d_k_ /
  // d_v_: contiguous q, k, v after rope; d_gu_: gate and up [n, 2 ffn_dim]; d_act_: swiglu's
  // output [n, ffn_dim].
  cuda::DeviceBuffer d_x_, d_xn_, d_qkv_, d_q_, d_k_, d_v_, d_attn_, d_proj_, d_gu_, d_act_,
      d_sel_, d_logits_;
  std::vector<float> dump_host_;
  cuda::GraphCache graphs_{64};  // the pass's device work by launch signature
  std::vector<int64_t> key_;      // the current pass's signature
};

const void* CudaLlamaModel::upload_tensor(const GgufTensor& t) {
  auto it = weights_.find(&t);
  if (it != weights_.end()) return it->second.data();
  cuda::DeviceBuffer buf(static_cast<size_t>(t.nbytes));
  cuda::upload(buf.data(), t.data, static_cast<size_t>(t.nbytes));
  const void* p = buf.data();
  weights_.emplace(&t, std::move(buf));
  return p;
}

const GgufTensor& CudaLlamaModel::checked_matrix(const std::string& name, int64_t rows,
                                                 int64_t cols) const {
  const GgufTensor* t = &require_matrix(*file_, name, rows, cols);
  if (!cuda::matmul_supported(t->type)) {
    throw Error(fmt::format("{}: tensor '{}' has weight type {}, which the CUDA backend does not "
                            "support",
                            file_->path(), name, ggml_type_traits(t->type).name));
  }
  return *t;
}

MatrixGroup CudaLlamaModel::matrix_group(const std::vector<std::string>& names,
                                         const int64_t* rows, int64_t cols) {
  const auto n = static_cast<int>(names.size());
  SPECDEC_CHECK(n >= 1 && n <= 3, "matrix_group: 1 to 3 matrices");
  std::vector<const GgufTensor*> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = &checked_matrix(names[i], rows[i], cols);
  MatrixGroup g;
  for (int i = 0; i < n;) {
    int e = i + 1;  // the part: matrices [i, e)
    while (e < n && e - i < stack_max_ &&
           t[static_cast<size_t>(e)]->type == t[static_cast<size_t>(i)]->type) {
      ++e;
    }
    if (e == i + 1) {
      g.parts[g.n_parts++] = matrix(names[i], rows[i], cols);
      i = e;
      continue;
    }
    const GgmlType type = t[static_cast<size_t>(i)]->type;
    const int64_t row_bytes = ggml_row_bytes(type, cols);
    int64_t part_rows = 0;
    for (int m = i; m < e; ++m) part_rows += rows[m];
    cuda::DeviceBuffer buf(static_cast<size_t>(part_rows * row_bytes));
    int64_t at = 0;
    for (int m = i; m < e; ++m) {
      const GgufTensor& tm = *t[static_cast<size_t>(m)];
      const int64_t bytes = rows[m] * row_bytes;
      SPECDEC_CHECK(bytes <= static_cast<int64_t>(tm.nbytes), "matrix_group: tensor bytes");
      cuda::upload(static_cast<uint8_t*>(buf.data()) + at, tm.data, static_cast<size_t>(bytes));
      at += bytes;
      weight_bytes_ += static_cast<int64_t>(tm.nbytes);
      flops_per_token_ += 2 * rows[m] * cols;
    }
    cuda::DeviceMatrix w;
    w.type = type;
    w.data = buf.data();
    w.rows = part_rows;
    w.cols = cols;
    w.row_bytes = row_bytes;
    g.parts[g.n_parts++] = w;
    stacked_.push_back(std::move(buf));
    i = e;
  }
  return g;
}

cuda::DeviceMatrix CudaLlamaModel::matrix(const std::string& name, int64_t rows, int64_t cols,
                                          bool count) {
  const GgufTensor* t = &checked_matrix(name, rows, cols);
  cuda::DeviceMatrix w;
  w.type = t->type;
  w.data = upload_tensor(*t);
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = ggml_row_bytes(t->type, cols);
  if (count) {
    weight_bytes_ += static_cast<int64_t>(t->nbytes);
    flops_per_token_ += 2 * rows * cols;
  }
  return w;
}

const float* CudaLlamaModel::vector(const std::string& name, int64_t n) {
  const GgufTensor* t = &require_f32_vector(*file_, name, n);
  weight_bytes_ += static_cast<int64_t>(t->nbytes);
  return static_cast<const float*>(upload_tensor(*t));
}

void CudaLlamaModel::load_weights() {
  const ModelConfig& c = config_;
  // As the CPU model: the embedding table is read one row per token, not counted.
  tok_embd_ = matrix("token_embd.weight", c.n_vocab, c.dim, /*count=*/false);
  output_norm_ = vector("output_norm.weight", c.dim);
  if (file_->find_tensor("output.weight")) {
    output_ = matrix("output.weight", c.n_vocab, c.dim);
  } else {
    output_ = matrix("token_embd.weight", c.n_vocab, c.dim);  // tied (uploaded once)
  }
  layers_.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = fmt::format("blk.{}.", l);
    DeviceLayer& w = layers_[l];
    w.attn_norm = vector(p + "attn_norm.weight", c.dim);
    const int64_t qkv_rows[3] = {c.q_dim(), c.kv_dim(), c.kv_dim()};
    w.qkv = matrix_group({p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"},
                         qkv_rows, c.dim);
    // Q/K/V biases: required where the architecture has them, read when a file carries them
    // (as the CPU model).
    if (c.qkv_bias || file_->find_tensor(p + "attn_q.bias") != nullptr) {
      w.bq = vector(p + "attn_q.bias", c.q_dim());
      w.bk = vector(p + "attn_k.bias", c.kv_dim());
      w.bv = vector(p + "attn_v.bias", c.kv_dim());
    }
    w.wo = matrix(p + "attn_output.weight", c.dim, c.q_dim());
    w.ffn_norm = vector(p + "ffn_norm.weight", c.dim);
    const int64_t gu_rows[2] = {c.ffn_dim, c.ffn_dim};
    w.gate_up = matrix_group({p + "ffn_gate.weight", p + "ffn_up.weight"}, gu_rows, c.dim);
    w.w_down = matrix(p + "ffn_down.weight", c.dim, c.ffn_dim);
  }
  cuda::synchronize();
}

ForwardResult CudaLlamaModel::forward(std::span<const SeqBatch> seqs, ThreadPool* /*pool*/,
                                      ForwardScratch* scratch) {
  const ModelConfig& c = config_;
  ForwardScratch& sc = *scratch;
  // Every check before anything is written (as the CPU model).
  std::vector<CudaKvMemory*> mems(seqs.size());
  for (size_t si = 0; si < seqs.size(); ++si) {
    check_seq_batch(seqs[si]);
    KvDeviceMemory* dm = seqs[si].kv.storage->device_memory();
    mems[si] = dm == nullptr ? nullptr : dynamic_cast<CudaKvMemory*>(dm);
    if (mems[si] == nullptr) {
      throw Error("forward: the model is on the GPU but a sequence's KV cache is not (make it "
                  "with the model's make_kv_cache / make_paged_kv)");
    }
    if (mems[si]->n_layers() != c.n_layers || mems[si]->n_kv_heads() != c.n_kv_heads ||
        mems[si]->head_dim() != c.head_dim || mems[si]->type() != seqs[si].kv.storage->type() ||
        mems[si]->block_slots() != seqs[si].kv.storage->block_slots() ||
        mems[si]->n_blocks() != seqs[si].kv.storage->n_blocks()) {
      throw Error("forward: the KV cache's device memory has another shape than its storage");
    }
  }
  std::lock_guard<std::mutex> lock(mu_);

  const auto n_seqs = static_cast<int64_t>(seqs.size());
  int64_t* offsets = grow(sc.offsets, static_cast<size_t>(n_seqs + 1));  // [n_seqs + 1]
  offsets[0] = 0;
  int64_t n_out = 0;
  bool want_hidden = false;
  bool one_pool = true;  // every sequence in the same device pool: one launch per op
  int64_t n_tables = 0, n_mask = 0;
  for (int64_t si = 0; si < n_seqs; ++si) {
    const SeqBatch& sb = seqs[si];
    const auto n_new = static_cast<int64_t>(sb.batch.tokens.size());
    offsets[si + 1] = offsets[si] + n_new;
    n_out += static_cast<int64_t>(sb.batch.output_rows.size());
    want_hidden = want_hidden || sb.batch.want_hidden;
    one_pool = one_pool && mems[si] == mems[0];
    if (n_new > 0) {
      const int64_t bs = sb.kv.storage->block_slots();
      n_tables += (sb.kv.n_past + n_new + bs - 1) / bs;
      if (!sb.batch.mask.empty()) n_mask += n_new * n_new;
    }
  }
  const int64_t n = offsets[n_seqs];
  if (n == 0) return {};

  // The pass's one upload: [tokens int32 n | positions int32 n | physical slots int64 n |
  // attention descriptors | output rows int32 n_out | masks u8 | block tables int32], each
  // section 16-byte aligned. The block tables go last: the offsets of the sections the kernels
  // are given then depend only on the pass's shape, not on how many blocks its sequences span
  // (which grows during decoding), so a decode step keeps its CUDA graph.
  size_t total = 0;
  auto take = [&](size_t bytes) {
    const size_t at = total;
    total = align16(total + bytes);
    return at;
  };
  const size_t o_tokens = take(static_cast<size_t>(n) * sizeof(int32_t));
  const size_t o_positions = take(static_cast<size_t>(n) * sizeof(int32_t));
  const size_t o_phys = take(static_cast<size_t>(n) * sizeof(int64_t));
  const size_t o_seqs = take(static_cast<size_t>(n_seqs) * sizeof(cuda::DeviceAttnSeq));
  const size_t o_out_rows = take(static_cast<size_t>(n_out) * sizeof(int32_t));
  const size_t o_masks = take(static_cast<size_t>(n_mask));
  const size_t o_tables = take(static_cast<size_t>(n_tables) * sizeof(int32_t));
  const int64_t logit_elems = n_out * c.n_vocab;
  const int64_t hidden_elems = want_hidden ? n_out * c.dim : 0;
  // Pinned host memory (grown before anything of this pass is queued: growing waits).
  staging_.reserve(total);
  if (n_out > 0) {
    host_out_.reserve(static_cast<size_t>(logit_elems + hidden_elems) * sizeof(float));
  }
  uint8_t* h = staging_.as<uint8_t>();
  std::memset(h, 0, total);
  auto* tokens = reinterpret_cast<int32_t*>(h + o_tokens);
  auto* positions = reinterpret_cast<int32_t*>(h + o_positions);
  auto* phys = reinterpret_cast<int64_t*>(h + o_phys);
  auto* tables = reinterpret_cast<int32_t*>(h + o_tables);
  uint8_t* masks = h + o_masks;
  auto* out_rows = reinterpret_cast<int32_t*>(h + o_out_rows);
  // Attention descriptors of the sequences with new tokens (descs[k] is sequence attn_seq[k]).
  // With one pool, row0 is the sequence's first row of the pass (one call for all); otherwise 0
  // (one call per sequence, on its rows).
  std::vector<cuda::DeviceAttnSeq> descs;
  std::vector<int64_t> attn_seq;
  int64_t max_visible = 0;
  int64_t at_table = 0, at_mask = 0, at_out = 0;
  for (int64_t si = 0; si < n_seqs; ++si) {
    const SeqBatch& sb = seqs[si];
    const ForwardBatch& b = sb.batch;
    const auto n_new = static_cast<int64_t>(b.tokens.size());
    const int64_t bs = sb.kv.storage->block_slots();
    for (int64_t i = 0; i < n_new; ++i) {
      const int64_t row = offsets[si] + i;
      tokens[row] = b.tokens[static_cast<size_t>(i)];
      positions[row] = b.positions[static_cast<size_t>(i)];
      const int64_t s = sb.kv.n_past + i;
      phys[row] = static_cast<int64_t>(sb.kv.table[static_cast<size_t>(s / bs)]) * bs + s % bs;
    }
    for (int32_t r : b.output_rows) out_rows[at_out++] = static_cast<int32_t>(offsets[si] + r);
    if (n_new == 0) continue;
    cuda::DeviceAttnSeq d;
    d.row0 = one_pool ? offsets[si] : 0;
    d.n_new = n_new;
    d.n_past = sb.kv.n_past;
    d.table = at_table;
    const int64_t n_blocks = (sb.kv.n_past + n_new + bs - 1) / bs;
    std::copy(sb.kv.table.begin(), sb.kv.table.begin() + n_blocks, tables + at_table);
    at_table += n_blocks;
    if (!b.mask.empty()) {
      d.mask = at_mask;
      std::copy(b.mask.begin(), b.mask.end(), masks + at_mask);
      at_mask += n_new * n_new;
    } else {
      d.mask = -1;
    }
    descs.push_back(d);
    attn_seq.push_back(si);
    max_visible = std::max(max_visible, sb.kv.n_past + n_new);
  }
  SPECDEC_CHECK(at_table == n_tables && at_mask == n_mask && at_out == n_out,
                "forward: staging sizes");
  if (!descs.empty()) {
    std::memcpy(h + o_seqs, descs.data(), descs.size() * sizeof(cuda::DeviceAttnSeq));
  }

  // Device buffers, all sized before anything is queued or recorded. A reallocation (growth)
  // drops this model's graphs (their addresses are gone).
  bool grew = false;
  auto grow_device = [&](cuda::DeviceBuffer& buf, size_t bytes) {
    if (bytes <= buf.bytes()) return;
    buf.reserve(bytes);
    grew = true;
  };
  if (total > d_staging_.bytes()) {
    grow_device(d_staging_, std::max({total, 2 * d_staging_.bytes(), size_t{64} << 10}));
  }
  const int64_t q_dim = c.q_dim(), kv_row = c.kv_dim();
  const int64_t act_rows = std::max(n, kMinActivationRows);
  auto act = [&](cuda::DeviceBuffer& buf, int64_t width) {
    grow_device(buf, static_cast<size_t>(act_rows * width) * sizeof(float));
    return buf.as<float>();
  };
  float* x = act(d_x_, c.dim);                  // [n, dim]
  float* xn = act(d_xn_, c.dim);                // [n, dim]
  float* qkv = act(d_qkv_, q_dim + 2 * kv_row); // [n, q_dim + 2 kv_dim] (MatrixGroup layout)
  float* q = act(d_q_, q_dim);                  // [n, q_dim]
  float* k = act(d_k_, kv_row);                 // [n, kv_dim]
  float* v = act(d_v_, kv_row);                 // [n, kv_dim]
  float* attn = act(d_attn_, q_dim);            // [n, q_dim]
  float* proj = act(d_proj_, c.dim);            // [n, dim]
  float* gu = act(d_gu_, 2 * c.ffn_dim);        // [n, 2 ffn_dim] (MatrixGroup layout)
  float* ffn_act = act(d_act_, c.ffn_dim);      // [n, ffn_dim]
  float* sel = nullptr;                  // [n_out, dim]
  float* logits = nullptr;               // [n_out, n_vocab]
  if (n_out > 0) {
    const int64_t out_rows_cap = std::max(n_out, kMinOutputRows);
    grow_device(d_sel_, static_cast<size_t>(out_rows_cap * c.dim) * sizeof(float));
    grow_device(d_logits_, static_cast<size_t>(out_rows_cap * c.n_vocab) * sizeof(float));
    sel = d_sel_.as<float>();
    logits = d_logits_.as<float>();
  }
  if (grew) graphs_.clear();

  cuda::upload_async(d_staging_.data(), h, total);  // pinned: staging_ stays untouched until the
                                                    // synchronize at the end of the pass
  const uint8_t* d = d_staging_.as<uint8_t>();
  const auto* d_tokens = reinterpret_cast<const int32_t*>(d + o_tokens);
  const auto* d_positions = reinterpret_cast<const int32_t*>(d + o_positions);
  const auto* d_phys = reinterpret_cast<const int64_t*>(d + o_phys);
  const auto* d_seqs = reinterpret_cast<const cuda::DeviceAttnSeq*>(d + o_seqs);
  const auto* d_tables = reinterpret_cast<const int32_t*>(d + o_tables);
  const auto* d_masks = d + o_masks;
  const auto* d_out_rows = reinterpret_cast<const int32_t*>(d + o_out_rows);

  // The pass's device work, from the embedding to the logits (what a graph records).
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const int64_t qkv_rows[3] = {q_dim, kv_row, kv_row};
  // Fused (fuse_): the residual add and the next norm in one kernel; rope of q and k, v's copy
  // and the K/V writes in one; the final norm on every row before the gather of the output
  // rows. Otherwise the separate ops (and every matrix on its own: matrix_group). Both give the
  // same bits.
  auto queue_pass = [&] {
    cuda::get_rows(tok_embd_, d_tokens, n, x);
    dump("inp_embd", -1, x, n, c.dim);
    for (int l = 0; l < c.n_layers; ++l) {
      const DeviceLayer& w = layers_[l];
      // xn = attn_norm(x): fused, the previous layer's last kernel computed it.
      if (!fuse_ || l == 0) cuda::rmsnorm(x, w.attn_norm, c.rms_eps, n, c.dim, xn);
      dump("attn_norm", l, xn, n, c.dim);
      {
        float* out = qkv;
        for (int j = 0; j < w.qkv.n_parts; ++j) {
          cuda::matmul(w.qkv.parts[j], xn, n, out);
          out += n * w.qkv.parts[j].rows;
        }
      }
      const GroupView qv = group_view(w.qkv, qkv_rows, 0, n, qkv);
      const GroupView kv = group_view(w.qkv, qkv_rows, 1, n, qkv);
      const GroupView vv = group_view(w.qkv, qkv_rows, 2, n, qkv);
      const cuda::QkvSource src{qv.data, qv.stride, kv.data, kv.stride, vv.data, vv.stride,
                                w.bq,    w.bk,      w.bv};
      // After this step: q_r, k_r, v_r contiguous [n, q_dim] / [n, kv_dim] (k_r, v_r only when
      // `written` is false: then the K/V writes follow).
      const float* q_r = q;
      const float* k_r = k;
      const float* v_r = v;
      bool written = false;
      if (!fuse_) {
        // Three separate parts: contiguous views (rope in place).
        q_r = qv.data;
        k_r = kv.data;
        v_r = vv.data;
        if (w.bq != nullptr) {  // the biases before RoPE, as the CPU
          cuda::add_bias_rows(qv.data, qv.stride, w.bq, n, q_dim);
          cuda::add_bias_rows(kv.data, kv.stride, w.bk, n, kv_row);
          cuda::add_bias_rows(vv.data, vv.stride, w.bv, n, kv_row);
        }
        cuda::rope(qv.data, d_positions, n, c.n_heads, c.head_dim, c.rope_dim, c.rope_freq_base,
                   c.rope_freq_scale, c.rope_style);
        cuda::rope(kv.data, d_positions, n, c.n_kv_heads, c.head_dim, c.rope_dim,
                   c.rope_freq_base, c.rope_freq_scale, c.rope_style);
      } else if (one_pool && !dump_) {
        cuda::rope_qkv_kv_write(src, d_positions, d_phys, n, c.n_heads, c.rope_dim,
                                c.rope_freq_base, c.rope_freq_scale, c.rope_style,
                                mems[0]->layer(l), q);
        written = true;
      } else if (!dump_) {
        // Sequences in different pools: one launch each, on its rows.
        for (size_t kk = 0; kk < descs.size(); ++kk) {
          const int64_t row0 = offsets[attn_seq[kk]];
          const cuda::QkvSource s{src.q + row0 * src.q_stride, src.q_stride,
                                  src.k + row0 * src.k_stride, src.k_stride,
                                  src.v + row0 * src.v_stride, src.v_stride,
                                  src.q_bias, src.k_bias, src.v_bias};
          cuda::rope_qkv_kv_write(s, d_positions + row0, d_phys + row0, descs[kk].n_new,
                                  c.n_heads, c.rope_dim, c.rope_freq_base, c.rope_freq_scale,
                                  c.rope_style, mems[static_cast<size_t>(attn_seq[kk])]->layer(l),
                                  q + row0 * q_dim);
        }
        written = true;
      } else {
        cuda::rope_qkv(src, d_positions, n, c.n_heads, c.n_kv_heads, c.head_dim, c.rope_dim,
                       c.rope_freq_base, c.rope_freq_scale, c.rope_style, q, k, v);
      }
      dump("q_rope", l, q_r, n, q_dim);
      dump("k_rope", l, k_r, n, kv_row);
      dump("v", l, v_r, n, kv_row);
      if (one_pool) {
        // Every new token's K/V at its physical slot, then every sequence's attention: one call
        // each for the pass.
        const cuda::DeviceKvLayer kv_layer = mems[0]->layer(l);
        if (!written) cuda::kv_write(kv_layer, d_phys, n, k_r, v_r);
        if (!descs.empty()) {
          cuda::paged_attention(kv_layer, q_r, n, c.n_heads, scale, d_seqs,
                                static_cast<int64_t>(descs.size()), d_tables, d_masks,
                                visible_bound(max_visible), attn);
        }
      } else {
        // Sequences in different pools: one call each, on its rows.
        for (size_t kk = 0; kk < descs.size(); ++kk) {
          const int64_t si = attn_seq[kk];
          const int64_t row0 = offsets[si];
          const cuda::DeviceKvLayer kv_layer = mems[static_cast<size_t>(si)]->layer(l);
          if (!written) {
            cuda::kv_write(kv_layer, d_phys + row0, descs[kk].n_new, k_r + row0 * kv_row,
                           v_r + row0 * kv_row);
          }
          cuda::paged_attention(kv_layer, q_r + row0 * q_dim, descs[kk].n_new, c.n_heads, scale,
                                d_seqs + kk, 1, d_tables, d_masks,
                                visible_bound(descs[kk].n_past + descs[kk].n_new),
                                attn + row0 * q_dim);
        }
      }
      dump("attn_out", l, attn, n, q_dim);
      cuda::matmul(w.wo, attn, n, proj);
      if (fuse_) {
        cuda::add_rmsnorm(x, proj, w.ffn_norm, c.rms_eps, n, c.dim, xn);
        dump("attn_residual", l, x, n, c.dim);
      } else {
        cuda::add(x, proj, n * c.dim);
        dump("attn_residual", l, x, n, c.dim);
        cuda::rmsnorm(x, w.ffn_norm, c.rms_eps, n, c.dim, xn);
      }
      {
        float* out = gu;
        for (int j = 0; j < w.gate_up.n_parts; ++j) {
          cuda::matmul(w.gate_up.parts[j], xn, n, out);
          out += n * w.gate_up.parts[j].rows;
        }
      }
      if (w.gate_up.n_parts == 1) {
        cuda::swiglu_rows(gu, n, c.ffn_dim, ffn_act);
      } else {
        cuda::swiglu(gu, gu + n * c.ffn_dim, n * c.ffn_dim, ffn_act);
      }
      dump("ffn_act", l, ffn_act, n, c.ffn_dim);
      cuda::matmul(w.w_down, ffn_act, n, proj);
      // Fused: the residual add with the next layer's attn_norm, or after the last layer with
      // the output norm (on every row: the output rows are gathered from xn below).
      const float* next_norm = l + 1 < c.n_layers ? layers_[l + 1].attn_norm
                               : n_out > 0          ? output_norm_
                                                    : nullptr;
      if (fuse_ && next_norm != nullptr) {
        cuda::add_rmsnorm(x, proj, next_norm, c.rms_eps, n, c.dim, xn);
      } else {
        cuda::add(x, proj, n * c.dim);
      }
      dump("layer_out", l, x, n, c.dim);
    }
    if (n_out == 0) return;
    // The output rows, final-normed (fused: xn holds every row normed; else x's rows, normed
    // after the gather), then the logits.
    cuda::DeviceMatrix rows_of;
    rows_of.type = GgmlType::kF32;
    rows_of.data = fuse_ ? xn : x;
    rows_of.rows = n;
    rows_of.cols = c.dim;
    rows_of.row_bytes = static_cast<int64_t>(c.dim) * static_cast<int64_t>(sizeof(float));
    cuda::get_rows(rows_of, d_out_rows, n_out, sel);
    if (!fuse_) cuda::rmsnorm(sel, output_norm_, c.rms_eps, n_out, c.dim, sel);
    dump("result_norm", -1, sel, n_out, c.dim);
    cuda::matmul(output_, sel, n_out, logits);
  };

  ForwardResult result;
  try {
    // With graphs: the launch signature (every host value of queue_pass's launches).
    if (cuda::graphs_enabled() && !dump_) {
      std::vector<int64_t>& key = key_;
      key.clear();
      auto put = [&](int64_t val) { key.push_back(val); };
      auto put_ptr = [&](const void* p) {
        key.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)));
      };
      auto put_kv = [&](const CudaKvMemory* m) {
        put_ptr(m->k_data());
        put_ptr(m->v_data());
        put(m->n_blocks());
        put(m->block_slots());
        put(static_cast<int64_t>(m->type()));
      };
      put(cuda::matmul_legacy() ? 1 : 0);
      put(cuda::attention_legacy() ? 1 : 0);
      put(cuda::attention_split() ? 1 : 0);
      put(n);
      put(n_out);
      put(static_cast<int64_t>(descs.size()));
      put(one_pool ? 1 : 0);
      for (size_t o : {o_tokens, o_positions, o_phys, o_seqs, o_out_rows, o_masks, o_tables}) {
        put(static_cast<int64_t>(o));
      }
      put_ptr(d_staging_.data());
      for (const float* p : {x, xn, qkv, q, k, v, attn, proj, gu, ffn_act,
                             static_cast<float*>(sel), static_cast<float*>(logits)}) {
        put_ptr(p);
      }
      if (one_pool) {
        put_kv(mems[0]);
        put(visible_bound(max_visible));
      } else {
        for (size_t kk = 0; kk < descs.size(); ++kk) {
          const int64_t si = attn_seq[kk];
          put(offsets[si]);
          put(descs[kk].n_new);
          put_kv(mems[static_cast<size_t>(si)]);
          put(visible_bound(descs[kk].n_past + descs[kk].n_new));
        }
      }
      graphs_.queue(key, queue_pass, [&] { return known_ranges(mems); });
    } else {
      queue_pass();
    }

    if (n_out == 0) {
      cuda::synchronize();  // the K/V writes are done (and any kernel error surfaces here)
      return result;
    }
    // One asynchronous download into pinned memory (logits, then the hidden rows), one wait.
    float* h_out = host_out_.as<float>();
    cuda::download_async(h_out, logits, static_cast<size_t>(logit_elems) * sizeof(float));
    if (want_hidden) {
      cuda::download_async(h_out + logit_elems, sel,
                           static_cast<size_t>(hidden_elems) * sizeof(float));
    }
    cuda::synchronize();
  } catch (...) {
    // Nothing queued may still read staging_ / write host_out_ when the next pass starts.
    try {
      cuda::synchronize();
    } catch (...) {
    }
    throw;
  }
  float* h_logits = grow(sc.logits, static_cast<size_t>(logit_elems));
  std::memcpy(h_logits, host_out_.as<float>(), static_cast<size_t>(logit_elems) * sizeof(float));
  if (dump_) dump_("result_output", -1, h_logits, n_out, c.n_vocab);
  result.logits = {h_logits, static_cast<size_t>(logit_elems)};
  if (want_hidden) {
    float* h_sel = grow(sc.sel, static_cast<size_t>(hidden_elems));
    std::memcpy(h_sel, host_out_.as<float>() + logit_elems,
                static_cast<size_t>(hidden_elems) * sizeof(float));
    result.hidden = {h_sel, static_cast<size_t>(hidden_elems)};
  }
  return result;
}

std::vector<cuda::DeviceRange> CudaLlamaModel::known_ranges(
    const std::vector<CudaKvMemory*>& mems) const {
  std::vector<cuda::DeviceRange> r;
  r.reserve(weights_.size() + stacked_.size() + 16 + 2 * mems.size());
  for (const auto& [t, buf] : weights_) r.push_back({buf.data(), buf.bytes()});  // immutable
  for (const cuda::DeviceBuffer& buf : stacked_) r.push_back({buf.data(), buf.bytes()});
  for (const cuda::DeviceBuffer* b : {&d_staging_, &d_x_, &d_xn_, &d_qkv_, &d_q_, &d_k_, &d_v_,
                                      &d_attn_, &d_proj_, &d_gu_, &d_act_, &d_sel_,
                                      &d_logits_}) {
    r.push_back({b->data(), b->bytes()});  // addresses in the key
  }
  for (const CudaKvMemory* m : mems) {  // addresses in the key
    r.push_back({m->k_data(), m->pool_bytes()});
    r.push_back({m->v_data(), m->pool_bytes()});
  }
  return r;
}

}  // namespace

std::unique_ptr<Model> load_cuda_llama(const std::string& path) {
  if (!cuda::available()) throw Error("no CUDA device");
  std::unique_ptr<GgufFile> file = GgufFile::open(path);
  ModelConfig config = ModelConfig::from_gguf(*file);
  return std::make_unique<CudaLlamaModel>(std::move(file), std::move(config));
}

}  // namespace specdec
