// Forward and backward pass of the Medusa heads over a minibatch (see medusa_grad.h).
#include "drafter/train/score_rows.h"
#include "drafter/train/medusa_grad.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "backend/cpu/thread_pool.h"
#include "drafter/train/train_activations.h"
#include "drafter/train/train_gemm.h"
#include "drafter/train/train_rows.h"
#include "sample/rng.h"
#include "util/check.h"

namespace specdec {

std::vector<ParamTensor> medusa_param_tensors(MedusaWeights& w) {
  std::vector<ParamTensor> out;
  for (int k = 0; k < w.shape.n_heads; ++k) {
    out.push_back({fmt::format("heads.{}.weight", k), w.w_res[k], true});
    out.push_back({fmt::format("heads.{}.bias", k), w.b_res[k], false});
    out.push_back({fmt::format("heads.{}.lm_head", k), w.w_out[k], true});
  }
  return out;
}

MedusaWeights medusa_zeros_like(const MedusaWeights& w) {
  return make_medusa(w.shape, w.draft_vocab, w.target_fingerprint);
}

ReDrafterLossStats MedusaGradient::run(const MedusaWeights& w, const ReDrafterBatch& batch,
                                       MedusaWeights* grad, ThreadPool* pool) {
  const MedusaShape& sh = w.shape;
  const int64_t B = batch.n, K = sh.n_heads, dim = sh.dim, V = sh.n_draft_vocab;
  SPECDEC_CHECK(batch.steps == K, "Medusa batch: steps must equal the number of heads");
  SPECDEC_CHECK(static_cast<int64_t>(batch.hidden.size()) == B * dim &&
                    static_cast<int64_t>(batch.targets.size()) == B * K,
                "Medusa batch: buffer sizes do not match n, heads and dim");
  n_vocab_ = V;
  const Isa isa = active_isa();
  ReDrafterLossStats stats;
  stats.reset(static_cast<int>(K));
  const bool backward = grad != nullptr;
  if (backward && (grad->shape.dim != sh.dim || grad->shape.n_heads != sh.n_heads ||
                   grad->shape.n_draft_vocab != sh.n_draft_vocab ||
                   grad->w_res.size() != w.w_res.size())) {
    *grad = medusa_zeros_like(w);
  }
  if (B == 0) {
    if (backward) *grad = medusa_zeros_like(w);
    return stats;
  }
  const int64_t R = K * B;
  y_.resize(R * dim);
  x_.resize(R * dim);
  logits_.resize(R * V);
  row_loss_.resize(R);
  row_argmax_.resize(R);
  const float* h = batch.hidden.data();
  for (int64_t k = 0; k < K; ++k) {
    float* y = y_.data() + k * B * dim;
    float* x = x_.data() + k * B * dim;
    for (int64_t b = 0; b < B; ++b) std::memcpy(y + b * dim, w.b_res[k].data(), dim * sizeof(float));
    linear_forward(B, dim, dim, h, dim, w.w_res[k].data(), dim, y, dim, true, pool);
    for_rows(pool, B * dim, 8192, [&](int64_t i0, int64_t i1) {
      silu_residual(isa, y + i0, h + i0, x + i0, i1 - i0);
    });
    linear_forward(B, dim, V, x, dim, w.w_out[k].data(), dim, logits_.data() + k * B * V, V,
                   false, pool);
  }
  score_rows(isa, logits_.data(), V, batch.targets, K, B, backward, &row_loss_, &row_argmax_,
             &stats, pool);
  if (!backward) return stats;

  MedusaWeights& g = *grad;
  dx_.resize(B * dim);
  for (int64_t k = 0; k < K; ++k) {
    const float* dz = logits_.data() + k * B * V;
    const float* x = x_.data() + k * B * dim;
    float* dy = y_.data() + k * B * dim;
    linear_backward_weight(B, dim, V, dz, V, x, dim, g.w_out[k].data(), dim, false, pool);
    linear_backward_input(B, dim, V, dz, V, w.w_out[k].data(), dim, dx_.data(), dim, false, pool);
    for_rows(pool, B * dim, 8192, [&](int64_t i0, int64_t i1) {
      silu_backward(isa, dx_.data() + i0, dy + i0, i1 - i0);
    });
    column_sums(dy, B, dim, g.b_res[k].data(), pool);
    linear_backward_weight(B, dim, dim, dy, dim, h, dim, g.w_res[k].data(), dim, false, pool);
  }
  return stats;
}

void init_medusa(MedusaWeights& w, uint64_t seed, double scale, double out_std,
                 const float* out_rows) {
  const MedusaShape& sh = w.shape;
  Rng rng(seed ^ 0x6d65647573616864ull);  // "medusahd"
  auto normal = [&]() {  // Box-Muller, one draw per pair (simple and deterministic)
    double u1 = rng.uniform();
    while (u1 <= 0.0) u1 = rng.uniform();
    const double u2 = rng.uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  };
  const double w_std = scale / std::sqrt(static_cast<double>(sh.dim));
  const double o_std = out_std >= 0 ? out_std : 1.0 / std::sqrt(static_cast<double>(sh.dim));
  for (int k = 0; k < sh.n_heads; ++k) {
    for (float& v : w.w_res[k]) v = static_cast<float>(w_std * normal());
    std::fill(w.b_res[k].begin(), w.b_res[k].end(), 0.0f);
    if (out_rows) {
      std::copy(out_rows, out_rows + int64_t{sh.n_draft_vocab} * sh.dim, w.w_out[k].begin());
    } else {
      for (float& v : w.w_out[k]) v = static_cast<float>(o_std * normal());
    }
  }
}

}  // namespace specdec
