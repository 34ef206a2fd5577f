// The CUDA backend's host API (built only with -DSPECDEC_CUDA=ON): device memory, and the ops of
// the transformer forward pass on device buffers. Plain C++ - no CUDA header - so that the model
// and the tools include it from .cpp files; the kernels are in the .cu files beside it.
//
// Conventions:
//   - Every pointer an op takes is device memory, float32 unless said otherwise; shapes are
//     written on every buffer, row-major.
//   - All work goes, in order, on one stream of the process (stream()); an op returns once its
//     kernels are queued. download()/synchronize() wait for it.
//   - Errors (no device, out of memory, a failed launch) throw specdec::Error naming the call.
//   - Batch invariance: a row's result never depends on which other rows share the call (the
//     reduction order of row t is fixed whatever n is), so a token verified in a batch or tree
//     gets exactly the bits it gets decoded alone - greedy speculation on the GPU equals plain
//     greedy decoding on the GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/cpu/ops.h"  // RopeStyle
#include "backend/ggml_type.h"
#include "backend/kv_type.h"

namespace specdec::cuda {

// ---- device and memory (cuda_device.cu) -----------------------------------------------------

struct DeviceInfo {
  std::string name;         // "NVIDIA H100 80GB HBM3"
  int cc_major = 0;         // compute capability
  int cc_minor = 0;
  int sm_count = 0;
  int64_t total_bytes = 0;  // global memory
  int64_t free_bytes = 0;
};

// True when a CUDA device can be used (never throws: false on a machine without a GPU/driver).
bool available();
// The current device (device 0). Throws when there is none.
DeviceInfo device_info();
// Measured device-memory bandwidth in GB/s: a timed device-to-device copy of `bytes` (median of
// several), counting bytes read plus bytes written.
double measure_bandwidth_gbs(int64_t bytes = int64_t{1} << 30);

void* alloc(size_t bytes);  // cudaMalloc; throws naming the size and the free memory
void release(void* p);      // cudaFree (null is fine)
void upload(void* dst_device, const void* src_host, size_t bytes);      // queued, then waits
void download(void* dst_host, const void* src_device, size_t bytes);    // waits for the stream
void copy_device(void* dst_device, const void* src_device, size_t bytes);  // queued
void zero(void* dst_device, size_t bytes);                             // queued
void synchronize();  // waits for the stream; throws on an earlier asynchronous kernel error

// Owner of one device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : p_(alloc(bytes)), bytes_(bytes) {}
  ~DeviceBuffer() { release(p_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release(p_);
      p_ = o.p_;
      bytes_ = o.bytes_;
      o.p_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return p_; }
  template <class T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }
  // Grows (contents lost) to at least `bytes`.
  void reserve(size_t bytes) {
    if (bytes > bytes_) *this = DeviceBuffer(bytes);
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// ---- ops (cuda_matmul.cu, cuda_elementwise.cu, cuda_attention.cu) ---------------------------

// A weight matrix on the device in its GGUF type, rows of row_bytes bytes (ggml_row_bytes):
// W [rows, cols]. Types: every one the CPU supports as a weight (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).
struct DeviceMatrix {
  GgmlType type = GgmlType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_bytes = 0;
};
bool matmul_supported(GgmlType type);

// y[n, rows] = x[n, cols] · Wᵀ  (dequantized in the kernel; n >= 0, any size).
// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: x is quantized per token as the CPU's quantized path does (int8
// blocks of 32, d = amax / 127) and multiplied on int8 tensor cores; the float types and the
// K-quants multiply float x by the dequantized weights.
void matmul(const DeviceMatrix& w, const float* x, int64_t n, float* y);
// A/B switch: true = the original float-dequantizing kernel for every type (default false, or
// true when the environment has SPECDEC_CUDA_MATMUL=legacy). Not for use while work is queued
// that depends on the choice.
void set_matmul_legacy(bool legacy);
bool matmul_legacy();

// out[i, :] = dequantized row ids[i] of `table` [rows, cols]: the embedding lookup.
//   ids: [n] int32 on the device (each in [0, rows)); out: [n, cols].
void get_rows(const DeviceMatrix& table, const int32_t* ids, int64_t n, float* out);

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * weight[:]   x, y: [n_rows, dim]; may alias.
void rmsnorm(const float* x, const float* weight, float eps, int64_t n_rows, int64_t dim, float* y);

// x[i] += y[i], i < n.
void add(float* x, const float* y, int64_t n);
// y[r, c] += bias[c] for r < n_rows, c < cols; row r at y + r * stride (stride >= cols): the
// Q/K/V biases on their (possibly stacked) matmul output, as the CPU's add_bias_rows.
void add_bias_rows(float* y, int64_t stride, const float* bias, int64_t n_rows, int64_t cols);
// out[i] = silu(gate[i]) * up[i]   (n elements; out may alias gate).
void swiglu(const float* gate, const float* up, int64_t n, float* out);
// For the stacked gate|up output of one matmul: gu [n_rows, 2 * ffn] (gate then up per row),
// out [n_rows, ffn].
void swiglu_rows(const float* gu, int64_t n_rows, int64_t ffn, float* out);

// A ReDrafter head's step (drafter/redrafter_head.h), its element-wise parts, silu(v) =
// v / (1 + exp(-v)) rounded as the CPU head rounds it:
//   s_out[r, :] = silu(s_pre[r, :] + b);  x[r, :] = concat(h, s_out[r, :])
//   s_pre, s_out: [n, state]; b: [state]; h: [dim]; x: [n, dim + state].
void redrafter_state(const float* s_pre, const float* b, const float* h, int64_t n, int64_t dim,
                     int64_t state, float* s_out, float* x);
//   x[r, :] += silu(y[r, :] + b)   x, y: [n, d]; b: [d].
void bias_silu_residual(float* x, const float* y, const float* b, int64_t n, int64_t d);

// In place on x: [n_tokens, n_heads, head_dim]; token t at position positions[t] (device int32
// [n_tokens]); the CPU's rope() numerics (theta_i = pos * freq_scale * freq_base^(-2i/rope_dim),
// float math), the first rope_dim dims of each head rotate, the rest pass through.
void rope(float* x, const int32_t* positions, int64_t n_tokens, int n_heads, int head_dim,
          int rope_dim, float freq_base, float freq_scale, RopeStyle style);

// ---- the paged KV cache on the device (cuda_attention.cu) -------------------------------------
//
// A pool of n_blocks blocks of block_slots slots, all layers, K and V alike:
//   K, V: [n_layers, n_blocks, block_slots, n_kv_heads, head_dim] of `type` (f16: IEEE half).
// The physical slot of a sequence's slot s is table[s / block_slots] * block_slots +
// s % block_slots; a layer's K is k + layer * n_blocks * block_slots * n_kv_heads * head_dim.
struct DeviceKvLayer {
  void* k = nullptr;  // [n_blocks * block_slots, n_kv_heads, head_dim] of type
  void* v = nullptr;
  KvType type = KvType::kF16;
  int n_kv_heads = 0;
  int head_dim = 0;
  int64_t block_slots = 0;
};

// Writes k, v: [n, n_kv_heads, head_dim] (float) at the physical slots phys_slots[i] (device
// int64 [n]), converted to the layer's type (round to nearest even).
void kv_write(const DeviceKvLayer& layer, const int64_t* phys_slots, int64_t n, const float* k,
              const float* v);

// One sequence of a batched attention call. All arrays it points to are on the device.
struct DeviceAttnSeq {
  int64_t row0 = 0;      // its first row in q / out
  int64_t n_new = 0;     // its query rows [row0, row0 + n_new)
  int64_t n_past = 0;    // cached slots every query sees; new token j is at slot n_past + j
  int64_t table = 0;     // offset of its block table in `tables` (covers n_past + n_new slots)
  int64_t mask = -1;     // offset of its [n_new, n_new] u8 mask in `masks`; -1 = causal
};

// Attention of every sequence's new tokens over its own paged K/V (written before the call):
//   q:   [n_rows, n_heads, head_dim]          out: [n_rows, n_heads, head_dim]
//   seqs: [n_seqs] DeviceAttnSeq (device); tables: int32 block ids; masks: u8
//   query i of a sequence sees slots [0, n_past) and new slot n_past + j where mask[i, j] != 0
//   (causal: j <= i); GQA: head h reads KV head h / (n_heads / n_kv_heads). A query that sees
//   nothing gets zeros. Each (query row, head) result is independent of the other rows
//   (batch invariance above). max_visible: an upper bound of n_past + n_new over the sequences
//   (the kernels size their shared memory and tiles by it; a row beyond it gets NaN).
// Three kernels:
//   split (the default): a row's visible slots cut into tiles (attention_tile(): 64) by their
//     rank among the visible ones, one thread block per (row, head, tile), the tiles merged in
//     tile order by a second kernel (flash decoding: long contexts spread over many thread
//     blocks). A row of at most one tile of visible slots gets bitwise the fast kernel's
//     result; a longer one a result within float rounding of it, the same in any batch (the
//     tiles depend on the row's visible slots only).
//   fast: one thread block per (row, head); stages each chunk's V rows in shared memory and
//     computes every score once (loads of several slots in flight);
//   legacy: bitwise the fast kernel's results; reads K twice and V slot by slot.
// Greedy speculation equals plain decoding under each (one kernel serves every pass of a run).
void paged_attention(const DeviceKvLayer& layer, const float* q, int64_t n_rows, int n_heads,
                     float scale, const DeviceAttnSeq* seqs, int64_t n_seqs,
                     const int32_t* tables, const uint8_t* masks, int64_t max_visible,
                     float* out);

// A/B switches for paged_attention (not for use while work is queued): legacy (default false;
// true when the environment has SPECDEC_CUDA_ATTN=legacy) takes the legacy kernel; split
// (default true; false when SPECDEC_CUDA_ATTN is fast or legacy) the split kernel, else the fast
// one.
void set_attention_legacy(bool legacy);
bool attention_legacy();
void set_attention_split(bool split);
bool attention_split();
// Visible slots per tile of the split kernel: SPECDEC_CUDA_ATTN_TILE (16 to 4096) or 64, fixed
// for the process (a row's bits depend on it).
int64_t attention_tile();

// Copies physical slot `from` to `to` in every layer of a pool (tree acceptance compaction):
//   k, v: pool bases as in DeviceKvLayer, layer_elems = n_blocks * block_slots * row_elems.
void kv_copy_slot(void* k, void* v, KvType type, int n_layers, int64_t layer_elems,
                  int64_t row_elems, int64_t from, int64_t to);

}  // namespace specdec::cuda

// ==== CUDA graphs, pinned host memory, asynchronous copies (cuda_graph.cu) ====================
// (Added for issue 27, "CUDA graphs for the decode step": the model's forward pass records its
// kernels once per launch signature and replays them.)

#include <functional>
#include <vector>

namespace specdec::cuda {

// Whether the model's forward pass may use CUDA graphs: from the environment at first use
// (SPECDEC_CUDA_GRAPHS=0 turns them off; anything else, or unset, on), then set_graphs_enabled.
bool graphs_enabled();
void set_graphs_enabled(bool enabled);

// Process-wide counters of every GraphCache (for tests and benchmarks).
struct GraphStats {
  int64_t captures = 0;       // graphs recorded, instantiated and launched
  int64_t replays = 0;        // launches of a cached graph
  int64_t invalidated = 0;    // cached graphs dropped because memory they use was reallocated
  int64_t failed = 0;         // captures that failed (that signature then runs without a graph)
};
GraphStats graph_stats();

// Page-locked host memory (cudaHostAlloc), so that copies to and from it are truly asynchronous.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const { return p_; }
  template <class T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }
  // Grows (contents lost) to at least `bytes` (at least doubling). Waits for the stream first:
  // a queued copy may still read or write the old memory.
  void reserve(size_t bytes);

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Queued on the stream, no wait: the host memory must stay valid and unchanged (upload) or
// unread (download) until the stream is synchronized; asynchronous only for pinned host memory.
void upload_async(void* dst_device, const void* src_host, size_t bytes);
void download_async(void* dst_host, const void* src_device, size_t bytes);

// A device allocation whose identity the caller's graph keys already cover (its address is in
// the key, or it lives as long as the cache): not re-checked at replay.
struct DeviceRange {
  const void* data = nullptr;
  size_t bytes = 0;
};

// Graphs of the stream's work keyed by a launch signature: a vector of integers that must hold
// every host-side value of the recorded launches - shapes, scalars and the device addresses of
// the caller's buffers - so that equal keys mean identical launches. Memory the caller does not
// know about (e.g. the activation scratch inside matmul) is found in the recorded graph at
// capture: every kernel / memset / memcpy argument that points into a device allocation outside
// the caller's DeviceRanges is remembered with that allocation's process-wide unique buffer id,
// and a replay first checks that each such allocation is still the same one (else the graph is
// dropped: invalidated).
//
// Use, per pass (one thread at a time; the stream must not be used by other threads meanwhile):
// cache.queue(key, work, known) does all of the following; by hand:
//   switch (cache.prepare(key)) {
//     case kReplayed: the work is queued;
//     case kRun:      queue it normally (first sight of the key, or it cannot be captured);
//     case kCapture:  begin_capture(); queue it; end_capture(key, ranges) - true: the graph was
//                     recorded and launched (the work is queued); false: queue it normally.
//                     If queuing throws: abort_capture(key), then queue it normally.
//   }
// A key gets a graph at its second sight (the first runs normally, so that scratch memory that
// grows on first use has grown). At most max_graphs graphs are kept (least recently used go).
class GraphCache {
 public:
  enum class Step { kRun, kCapture, kReplayed };
  explicit GraphCache(int max_graphs = 64);
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  Step prepare(const std::vector<int64_t>& key);
  // The protocol above in one call: `work` queues the pass's launches (run, recorded or not run
  // at all when a graph is replayed), `known` gives the caller's DeviceRanges at a capture.
  // When this returns, the work is queued, once.
  void queue(const std::vector<int64_t>& key, const std::function<void()>& work,
             const std::function<std::vector<DeviceRange>()>& known);
  void begin_capture();
  bool end_capture(const std::vector<int64_t>& key, const std::vector<DeviceRange>& known);
  void abort_capture(const std::vector<int64_t>& key, const char* why);
  // Drops every graph (the caller's buffers were reallocated).
  void clear();
  int size() const;  // graphs held

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace specdec::cuda

// ==== fused ops of the forward pass (cuda_elementwise.cu) =====================================
// Fewer launches per layer, each bitwise equal to the separate ops it replaces (the same float
// operations in the same order, from the same device functions).

namespace specdec::cuda {

// x[r, :] += y[r, :]; out[r, :] = rmsnorm(x[r, :]) * weight[:]: bitwise add(x, y, n_rows * dim)
// then rmsnorm(x, weight, eps, n_rows, dim, out). x, y, out: [n_rows, dim]; out must not alias x
// (y may alias out).
void add_rmsnorm(float* x, const float* y, const float* weight, float eps, int64_t n_rows,
                 int64_t dim, float* out);

// The attention's projections as rope_qkv reads them: q [n, n_heads, head_dim] and k, v
// [n, n_kv_heads, head_dim], each with its own row stride in floats (views into one stacked
// matmul output [n, q_dim + 2 kv_dim], or separate buffers). The biases (qwen2; null: none) are
// added to every row before anything else, as add_bias_rows does: q_bias [n_heads * head_dim],
// k_bias and v_bias [n_kv_heads * head_dim].
struct QkvSource {
  const float* q = nullptr;
  int64_t q_stride = 0;
  const float* k = nullptr;
  int64_t k_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
  const float* q_bias = nullptr;
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
};

// One launch: q_out = rope(q), k_out = rope(k), v_out = v, contiguous ([n, n_heads, head_dim],
// [n, n_kv_heads, head_dim] twice); bitwise rope() on q and on k (the same numerics). The
// outputs must not overlap the sources.
void rope_qkv(const QkvSource& src, const int32_t* positions, int64_t n_tokens, int n_heads,
              int n_kv_heads, int head_dim, int rope_dim, float freq_base, float freq_scale,
              RopeStyle style, float* q_out, float* k_out, float* v_out);

// One launch: q_out = rope(q) (contiguous [n, n_heads, head_dim]) and rope(k), v written into
// the layer's K / V at phys_slots (device int64 [n]); bitwise rope() then kv_write().
void rope_qkv_kv_write(const QkvSource& src, const int32_t* positions, const int64_t* phys_slots,
                       int64_t n_tokens, int n_heads, int rope_dim, float freq_base,
                       float freq_scale, RopeStyle style, const DeviceKvLayer& layer,
                       float* q_out);

}  // namespace specdec::cuda
