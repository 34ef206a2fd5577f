#include "drafter/redrafter_head.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/quant_blocks.h"
#include "backend/cpu/thread_pool.h"
#include "util/check.h"

namespace specdec {

namespace {

float silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

std::vector<uint8_t> quantize_rows(GgmlType type, const float* rows, int64_t n_rows, int64_t n_cols) {
  const int64_t rb = ggml_row_bytes(type, n_cols);
  std::vector<uint8_t> out(static_cast<size_t>(rb * n_rows));
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* x = rows + r * n_cols;
    uint8_t* dst = out.data() + r * rb;
    if (type == GgmlType::kF32) {
      std::memcpy(dst, x, static_cast<size_t>(n_cols) * 4);
    } else if (type == GgmlType::kF16) {
      for (int64_t c = 0; c < n_cols; ++c) {
        const uint16_t h = fp32_to_fp16(x[c]);
        std::memcpy(dst + 2 * c, &h, 2);
      }
    } else if (type == GgmlType::kQ8_0) {
      SPECDEC_CHECK(n_cols % kQK == 0, "Q8_0 rows need a multiple of 32 columns");
      auto* blocks = reinterpret_cast<BlockQ8_0*>(dst);
      for (int64_t b = 0; b < n_cols / kQK; ++b) {
        const float* v = x + b * kQK;
        float amax = 0.0f;
        for (int64_t j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(v[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        blocks[b].d = fp32_to_fp16(d);
        for (int64_t j = 0; j < kQK; ++j) {
          blocks[b].qs[j] = static_cast<int8_t>(std::lround(v[j] * id));
        }
      }
    } else {
      SPECDEC_CHECK(false, "quantize_rows: unsupported type");
    }
  }
  return out;
}

ReDrafterHead::Matrix ReDrafterHead::make_matrix(const std::vector<float>& rows, int64_t n_rows,
                                                 int64_t n_cols) const {
  Matrix m;
  m.bytes = quantize_rows(type_, rows.data(), n_rows, n_cols);
  m.w.type = type_;
  m.w.data = m.bytes.data();
  m.w.rows = n_rows;
  m.w.cols = n_cols;
  m.w.row_bytes = ggml_row_bytes(type_, n_cols);
  if (packable(type_) && isa_supported(Isa::kAvx2)) {
    const WeightMatrix parts[] = {m.w};
    m.packed = PackedWeights::pack(parts, nullptr);
    m.w = m.packed.stacked();
  }
  return m;
}

ReDrafterHead::ReDrafterHead(const ReDrafterWeights& w, GgmlType weight_type)
    : shape_(w.shape), type_(weight_type), draft_vocab_(w.draft_vocab) {
  const int64_t s = shape_.state_dim, dim = shape_.dim, d = shape_.width();
  if (type_ == GgmlType::kQ8_0 && ((dim + s) % kQK != 0 || d % kQK != 0)) type_ = GgmlType::kF32;
  SPECDEC_CHECK(type_ == GgmlType::kQ8_0 || type_ == GgmlType::kF16 || type_ == GgmlType::kF32,
                "ReDrafterHead: weight type must be Q8_0, F16 or F32");
  // The RNN's two matrices side by side: row i = [W_e row i | W_s row i].
  std::vector<float> rnn(static_cast<size_t>(s * (dim + s)));
  for (int64_t i = 0; i < s; ++i) {
    std::copy_n(w.w_embed.data() + i * dim, dim, rnn.data() + i * (dim + s));
    std::copy_n(w.w_state.data() + i * s, s, rnn.data() + i * (dim + s) + dim);
  }
  rnn_ = make_matrix(rnn, s, dim + s);
  b_state_ = w.b_state;
  blocks_.reserve(shape_.n_blocks);
  for (int l = 0; l < shape_.n_blocks; ++l) blocks_.push_back(make_matrix(w.w_block[l], d, d));
  b_block_ = w.b_block;
  out_ = make_matrix(w.w_out, shape_.n_draft_vocab, d);
}

int64_t ReDrafterHead::weight_bytes() const {
  auto bytes = [](const Matrix& m) { return m.w.rows * ggml_row_bytes(m.w.type, m.w.cols); };
  int64_t total = bytes(rnn_) + bytes(out_);
  for (const Matrix& m : blocks_) total += bytes(m);
  return total;
}

void ReDrafterHead::step(std::span<const float> h, const float* in, int n, float* s_out,
                         float* logits, ReDrafterScratch* scratch, ThreadPool* pool) const {
  const int64_t s = shape_.state_dim, dim = shape_.dim, d = shape_.width();
  SPECDEC_CHECK(static_cast<int64_t>(h.size()) == dim, "ReDrafterHead::step: hidden size");
  if (n <= 0) return;
  matmul(rnn_.w, in, n, s_out, pool);
  for (int r = 0; r < n; ++r) {
    float* row = s_out + static_cast<int64_t>(r) * s;
    for (int64_t i = 0; i < s; ++i) row[i] = silu(row[i] + b_state_[i]);
  }
  scratch->x.resize(static_cast<size_t>(n * d));
  scratch->y.resize(static_cast<size_t>(n * d));
  float* x = scratch->x.data();
  float* y = scratch->y.data();
  for (int r = 0; r < n; ++r) {
    std::copy(h.begin(), h.end(), x + r * d);
    std::copy_n(s_out + static_cast<int64_t>(r) * s, s, x + r * d + dim);
  }
  for (int l = 0; l < shape_.n_blocks; ++l) {
    matmul(blocks_[l].w, x, n, y, pool);
    const float* b = b_block_[l].data();
    for (int64_t i = 0; i < n * d; ++i) x[i] += silu(y[i] + b[i % d]);
  }
  matmul(out_.w, x, n, logits, pool);
}

}  // namespace specdec
