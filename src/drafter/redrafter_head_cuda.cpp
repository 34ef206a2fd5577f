// A ReDrafter head's step on the GPU (built with -DSPECDEC_CUDA=ON): the head beside a GPU target,
// so that beam search does not stream the head's weights (5 MB as Q8_0 for SmolLM2's) through
// the host's memory at every step - on the GPU that host time was a quarter of the run and
// made ReDrafter slower than plain decoding (docs/perf-log/2026-11-27-session-25.md).
//
// Per step (n rows, one stream, host buffers pinned):
//   upload   stage = [h (dim) | in (n, dim + S)]
//   s_pre  [n, S]       = in · [W_e | W_s]ᵀ                          cuda::matmul
//   s_out  [n, S], x [n, D] = silu(s_pre + b_s), concat(h, s_out)    cuda::redrafter_state
//   per block: y [n, D] = x · W_lᵀ; x += silu(y + b_l)               matmul, bias_silu_residual
//   logits [n, V_d]     = x · W_oᵀ                                    matmul
//   download [s_out | logits], one wait
// Everything between the copies is recorded into a CUDA graph per n (cuda::GraphCache, at the
// second sight of an n; SPECDEC_CUDA_GRAPHS=0 turns graphs off).
#include <cstring>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "drafter/head_matrix.h"
#include "drafter/redrafter_head.h"
#include "util/check.h"

namespace specdec {
namespace {

struct DeviceWeight {
  cuda::DeviceBuffer buf;
  cuda::DeviceMatrix m;
};

// rows: [n_rows, n_cols] floats, stored on the device in `type`.
DeviceWeight upload_matrix(GgmlType type, const float* rows, int64_t n_rows, int64_t n_cols) {
  const std::vector<uint8_t> bytes = quantize_rows(type, rows, n_rows, n_cols);
  DeviceWeight w;
  w.buf = cuda::DeviceBuffer(bytes.size());
  cuda::upload(w.buf.data(), bytes.data(), bytes.size());
  w.m.type = type;
  w.m.data = w.buf.data();
  w.m.rows = n_rows;
  w.m.cols = n_cols;
  w.m.row_bytes = ggml_row_bytes(type, n_cols);
  return w;
}

cuda::DeviceBuffer upload_floats(const std::vector<float>& v) {
  cuda::DeviceBuffer b(v.size() * sizeof(float));
  cuda::upload(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

class CudaReDrafterHead final : public ReDrafterHeadDevice {
 public:
  CudaReDrafterHead(const ReDrafterWeights& w, GgmlType type) : shape_(w.shape) {
    if (!cuda::available()) throw Error("a ReDrafter head on the GPU: no CUDA device");
    if (!cuda::matmul_supported(type)) throw Error("a ReDrafter head on the GPU: weight type");
    const int64_t s = shape_.state_dim, dim = shape_.dim, d = shape_.width();
    rnn_ = upload_matrix(type, redrafter_rnn_rows(w).data(), s, dim + s);
    b_state_ = upload_floats(w.b_state);
    for (int l = 0; l < shape_.n_blocks; ++l) {
      blocks_.push_back(upload_matrix(type, w.w_block[l].data(), d, d));
      b_block_.push_back(upload_floats(w.b_block[l]));
    }
    out_ = upload_matrix(type, w.w_out.data(), shape_.n_draft_vocab, d);
    cuda::synchronize();
  }

  const char* device_name() const override { return "cuda"; }

  void step(std::span<const float> h, const float* in, int n, float* s_out,
            float* logits) override {
    const std::lock_guard<std::mutex> lock(mu_);
    const int64_t s = shape_.state_dim, dim = shape_.dim;
    const int64_t vd = shape_.n_draft_vocab;
    SPECDEC_CHECK(static_cast<int64_t>(h.size()) == dim, "ReDrafterHead (cuda): hidden size");
    if (n <= 0) return;
    reserve(n);
    const size_t in_floats = static_cast<size_t>(dim + n * (dim + s));
    const size_t out_floats = static_cast<size_t>(n) * static_cast<size_t>(s + vd);
    float* hin = host_in_.as<float>();
    std::memcpy(hin, h.data(), dim * sizeof(float));
    std::memcpy(hin + dim, in, static_cast<size_t>(n) * (dim + s) * sizeof(float));
    try {
      cuda::upload_async(d_stage_.data(), hin, in_floats * sizeof(float));
      queue_or_replay(n);
      cuda::download_async(host_out_.data(), d_out_.data(), out_floats * sizeof(float));
      cuda::synchronize();
    } catch (...) {
      try {  // nothing queued may still touch the pinned buffers
        cuda::synchronize();
      } catch (...) {
      }
      throw;
    }
    const float* hout = host_out_.as<float>();
    std::memcpy(s_out, hout, static_cast<size_t>(n) * s * sizeof(float));
    std::memcpy(logits, hout + static_cast<size_t>(n) * s, static_cast<size_t>(n) * vd * sizeof(float));
  }

 private:
  // Device and pinned buffers for n rows (grown, never shrunk; growing drops the graphs).
  void reserve(int n) {
    if (n <= capacity_) return;
    const int64_t s = shape_.state_dim, dim = shape_.dim, d = shape_.width();
    const int64_t vd = shape_.n_draft_vocab;
    const size_t f = sizeof(float);
    cuda::synchronize();
    d_stage_ = cuda::DeviceBuffer(static_cast<size_t>(dim + n * (dim + s)) * f);
    d_s_pre_ = cuda::DeviceBuffer(static_cast<size_t>(n * s) * f);
    d_out_ = cuda::DeviceBuffer(static_cast<size_t>(n * (s + vd)) * f);
    d_x_ = cuda::DeviceBuffer(static_cast<size_t>(n * d) * f);
    d_y_ = cuda::DeviceBuffer(static_cast<size_t>(n * d) * f);
    host_in_.reserve(static_cast<size_t>(dim + n * (dim + s)) * f);
    host_out_.reserve(static_cast<size_t>(n * (s + vd)) * f);
    graphs_.clear();
    capacity_ = n;
  }

  // The step's kernels on d_stage_ -> d_out_ (s_out [n, S] then logits [n, V_d]).
  void queue(int n) {
    const int64_t s = shape_.state_dim, dim = shape_.dim, d = shape_.width();
    const float* h = d_stage_.as<float>();
    const float* in = h + dim;
    float* s_out = d_out_.as<float>();
    float* logits = s_out + static_cast<int64_t>(n) * s;
    float* x = d_x_.as<float>();
    float* y = d_y_.as<float>();
    cuda::matmul(rnn_.m, in, n, d_s_pre_.as<float>());
    cuda::redrafter_state(d_s_pre_.as<float>(), b_state_.as<float>(), h, n, dim, s, s_out, x);
    for (size_t l = 0; l < blocks_.size(); ++l) {
      cuda::matmul(blocks_[l].m, x, n, y);
      cuda::bias_silu_residual(x, y, b_block_[l].as<float>(), n, d);
    }
    cuda::matmul(out_.m, x, n, logits);
  }

  void queue_or_replay(int n) {
    if (!cuda::graphs_enabled()) {
      queue(n);
      return;
    }
    key_.clear();
    key_.push_back(n);
    key_.push_back(cuda::matmul_legacy() ? 1 : 0);
    for (const cuda::DeviceBuffer* b : {&d_stage_, &d_s_pre_, &d_out_, &d_x_, &d_y_}) {
      key_.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(b->data())));
    }
    graphs_.queue(key_, [&] { queue(n); }, [&] { return known_ranges(); });
  }

  // The buffers the graph key covers, and the weights (they live as long as the cache).
  std::vector<cuda::DeviceRange> known_ranges() const {
    std::vector<cuda::DeviceRange> r;
    auto add = [&](const cuda::DeviceBuffer& b) { r.push_back({b.data(), b.bytes()}); };
    for (const cuda::DeviceBuffer* b : {&d_stage_, &d_s_pre_, &d_out_, &d_x_, &d_y_}) add(*b);
    add(rnn_.buf);
    add(b_state_);
    for (const DeviceWeight& b : blocks_) add(b.buf);
    for (const cuda::DeviceBuffer& b : b_block_) add(b);
    add(out_.buf);
    return r;
  }

  ReDrafterShape shape_;
  std::mutex mu_;
  DeviceWeight rnn_;                          // [S, dim + S]
  cuda::DeviceBuffer b_state_;                // [S]
  std::vector<DeviceWeight> blocks_;          // n_blocks x [D, D]
  std::vector<cuda::DeviceBuffer> b_block_;   // n_blocks x [D]
  DeviceWeight out_;                          // [V_d, D]
  int capacity_ = 0;                          // rows the buffers below hold
  cuda::DeviceBuffer d_stage_;                // [dim + n (dim + S)]: h, then in
  cuda::DeviceBuffer d_s_pre_;                // [n, S]
  cuda::DeviceBuffer d_out_;                  // [n, S] s_out, then [n, V_d] logits
  cuda::DeviceBuffer d_x_, d_y_;              // [n, D]
  cuda::PinnedBuffer host_in_, host_out_;     // as d_stage_, d_out_
  cuda::GraphCache graphs_{16};
  std::vector<int64_t> key_;
};

}  // namespace

std::unique_ptr<ReDrafterHeadDevice> make_redrafter_head_device(const ReDrafterWeights& w,
                                                                GgmlType weight_type,
                                                                const std::string& device) {
  if (device != "cuda") throw Error("a ReDrafter head on device '" + device + "': no such device");
  return std::make_unique<CudaReDrafterHead>(w, weight_type);
}

}  // namespace specdec
