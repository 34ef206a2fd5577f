#include "drafter/redrafter_head.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/thread_pool.h"
#include "util/check.h"

namespace specdec {

namespace {

float silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

ReDrafterHead::ReDrafterHead(const ReDrafterWeights& w, GgmlType weight_type)
    : shape_(w.shape), type_(weight_type), draft_vocab_(w.draft_vocab) {
  const int64_t s = shape_.state_dim, dim = shape_.dim, d = shape_.width();
  type_ = head_weight_type(type_, {dim + s, d});
  SPECDEC_CHECK(type_ == GgmlType::kQ8_0 || type_ == GgmlType::kQ4_1 || type_ == GgmlType::kF16 ||
                    type_ == GgmlType::kF32,
                "ReDrafterHead: weight type must be Q8_0, Q4_1, F16 or F32");
  rnn_ = HeadMatrix(type_, redrafter_rnn_rows(w).data(), s, dim + s);
  b_state_ = w.b_state;
  blocks_.reserve(shape_.n_blocks);
  for (int l = 0; l < shape_.n_blocks; ++l) blocks_.emplace_back(type_, w.w_block[l].data(), d, d);
  b_block_ = w.b_block;
  out_ = HeadMatrix(type_, w.w_out.data(), shape_.n_draft_vocab, d);
}

int64_t ReDrafterHead::weight_bytes() const {
  int64_t total = rnn_.bytes() + out_.bytes();
  for (const HeadMatrix& m : blocks_) total += m.bytes();
  return total;
}

void ReDrafterHead::step(std::span<const float> h, const float* in, int n, float* s_out,
                         float* logits, ReDrafterScratch* scratch, ThreadPool* pool) const {
  SPECDEC_CHECK(static_cast<int64_t>(h.size()) == shape_.dim, "ReDrafterHead::step: hidden size");
  if (n <= 0) return;
  if (device_) {
    device_->step(h, in, n, s_out, logits);
    return;
  }
  scratch->h_rows.assign(static_cast<size_t>(n), h.data());  // step_rows leaves h_rows alone
  step_rows(scratch->h_rows.data(), in, n, s_out, logits, scratch, pool);
}

void ReDrafterHead::step_rows(const float* const* h_rows, const float* in, int n, float* s_out,
                              float* logits, ReDrafterScratch* scratch, ThreadPool* pool) const {
  const int64_t s = shape_.state_dim, dim = shape_.dim, d = shape_.width();
  if (n <= 0) return;
  if (device_) {
    for (int r0 = 0; r0 < n;) {
      int r1 = r0 + 1;
      while (r1 < n && h_rows[r1] == h_rows[r0]) ++r1;
      device_->step({h_rows[r0], static_cast<size_t>(dim)}, in + r0 * (dim + s), r1 - r0,
                    s_out + r0 * s, logits + static_cast<int64_t>(r0) * shape_.n_draft_vocab);
      r0 = r1;
    }
    return;
  }
  matmul(rnn_.w(), in, n, s_out, pool);
  for (int r = 0; r < n; ++r) {
    float* row = s_out + static_cast<int64_t>(r) * s;
    for (int64_t i = 0; i < s; ++i) row[i] = silu(row[i] + b_state_[i]);
  }
  scratch->x.resize(static_cast<size_t>(n * d));
  scratch->y.resize(static_cast<size_t>(n * d));
  float* x = scratch->x.data();
  float* y = scratch->y.data();
  for (int r = 0; r < n; ++r) {
    std::copy_n(h_rows[r], dim, x + r * d);
    std::copy_n(s_out + static_cast<int64_t>(r) * s, s, x + r * d + dim);
  }
  for (int l = 0; l < shape_.n_blocks; ++l) {
    matmul(blocks_[l].w(), x, n, y, pool);
    const float* b = b_block_[l].data();
    for (int64_t i = 0; i < n * d; ++i) x[i] += silu(y[i] + b[i % d]);
  }
  matmul(out_.w(), x, n, logits, pool);
}

#ifndef SPECDEC_CUDA
// Without the CUDA backend no device but the CPU exists (redrafter_head_cuda.cpp otherwise).
std::unique_ptr<ReDrafterHeadDevice> make_redrafter_head_device(const ReDrafterWeights& w,
                                                                GgmlType weight_type,
                                                                const std::string& device) {
  (void)w;
  (void)weight_type;
  throw Error("a ReDrafter head on device '" + device +
              "' needs the CUDA backend (cmake -DSPECDEC_CUDA=ON)");
}
#endif

}  // namespace specdec
