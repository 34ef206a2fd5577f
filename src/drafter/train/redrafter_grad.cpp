// Forward and backward pass of the ReDrafter head over a minibatch (see redrafter_grad.h).
#include "drafter/train/score_rows.h"
#include "drafter/train/redrafter_grad.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/thread_pool.h"
#include "drafter/train/train_activations.h"
#include "drafter/train/train_gemm.h"
#include "drafter/train/train_rows.h"
#include "util/check.h"

namespace specdec {
namespace {

// rows of m[rows, cols] = v[cols]
void fill_rows(float* m, int64_t rows, int64_t cols, const float* v) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(m + r * cols, v, cols * sizeof(float));
}

}  // namespace

void ReDrafterLossStats::reset(int steps) {
  loss_sum.assign(steps, 0.0);
  n_scored.assign(steps, 0);
  n_targets.assign(steps, 0);
  n_correct.assign(steps, 0);
  n_positions = 0;
  accepted_sum = 0;
}

void ReDrafterLossStats::add(const ReDrafterLossStats& o) {
  if (loss_sum.empty()) reset(static_cast<int>(o.loss_sum.size()));
  SPECDEC_CHECK(o.loss_sum.size() == loss_sum.size(), "loss stats of different step counts");
  for (size_t k = 0; k < loss_sum.size(); ++k) {
    loss_sum[k] += o.loss_sum[k];
    n_scored[k] += o.n_scored[k];
    n_targets[k] += o.n_targets[k];
    n_correct[k] += o.n_correct[k];
  }
  n_positions += o.n_positions;
  accepted_sum += o.accepted_sum;
}

double ReDrafterLossStats::objective() const {
  double s = 0;
  for (double l : loss_sum) s += l;
  return n_positions ? s / static_cast<double>(n_positions) : 0.0;
}

double ReDrafterLossStats::mean_loss() const {
  double s = 0;
  int64_t n = 0;
  for (size_t k = 0; k < loss_sum.size(); ++k) {
    s += loss_sum[k];
    n += n_scored[k];
  }
  return n ? s / static_cast<double>(n) : 0.0;
}

double ReDrafterLossStats::accuracy(int k) const {
  return n_targets[k] ? static_cast<double>(n_correct[k]) / static_cast<double>(n_targets[k])
                      : 0.0;
}

double ReDrafterLossStats::accepted_length() const {
  return n_positions ? static_cast<double>(accepted_sum) / static_cast<double>(n_positions) : 0.0;
}

ReDrafterLossStats ReDrafterGradient::run(const ReDrafterWeights& w,
                                          std::span<const float> embedding,
                                          const ReDrafterBatch& batch, ReDrafterWeights* grad,
                                          ThreadPool* pool) {
  const ReDrafterShape& sh = w.shape;
  const int64_t B = batch.n, C = batch.steps, R = B * C;
  const int64_t dim = sh.dim, S = sh.state_dim, D = sh.width(), V = sh.n_draft_vocab;
  const int L = sh.n_blocks;
  SPECDEC_CHECK(B >= 0 && C >= 1, "ReDrafter batch: no steps");
  SPECDEC_CHECK(static_cast<int64_t>(batch.hidden.size()) == B * dim &&
                    static_cast<int64_t>(batch.inputs.size()) == R &&
                    static_cast<int64_t>(batch.targets.size()) == R,
                "ReDrafter batch: buffer sizes do not match n, steps and the head's width");
  SPECDEC_CHECK(static_cast<int64_t>(embedding.size()) == int64_t{sh.n_target_vocab} * dim,
                "ReDrafter training: the embedding is not [n_target_vocab, dim]");
  n_vocab_ = V;
  state_dim_ = S;
  const Isa isa = active_isa();

  ReDrafterLossStats stats;
  stats.reset(static_cast<int>(C));
  if (B == 0) {
    if (grad) *grad = make_redrafter(sh, w.draft_vocab, w.target_fingerprint);
    return stats;
  }

  e_in_.resize(R * dim);
  pre_.resize(R * S);
  state_.resize(R * S);
  x_.resize((L + 1) * R * D);
  y_.resize(std::max(L, 1) * R * D);
  h_rows_.resize(B * D);
  logits_.resize(R * V);
  row_loss_.resize(R);
  row_argmax_.resize(R);
  auto x_at = [&](int l) { return x_.data() + l * R * D; };  // [R, D]
  auto y_at = [&](int l) { return y_.data() + l * R * D; };  // [R, D]

  // ---- RNN: pre_k = b_s + W_e e(g_k) + W_s s_k; state row k = s_{k+1} = SiLU(pre_k) ----------
  for (int64_t r = 0; r < R; ++r) {
    const int32_t id = batch.inputs[r];
    SPECDEC_CHECK(id >= 0 && id < sh.n_target_vocab, "ReDrafter batch: input token out of range");
    std::memcpy(e_in_.data() + r * dim, embedding.data() + int64_t{id} * dim, dim * sizeof(float));
  }
  fill_rows(pre_.data(), R, S, w.b_state.data());
  linear_forward(R, dim, S, e_in_.data(), dim, w.w_embed.data(), dim, pre_.data(), S, true, pool);
  for (int64_t k = 0; k < C; ++k) {
    float* pre_k = pre_.data() + k * B * S;  // [B, S]
    if (k > 0) {
      linear_forward(B, S, S, state_.data() + (k - 1) * B * S, S, w.w_state.data(), S, pre_k, S,
                     true, pool);
    }
    float* s_k = state_.data() + k * B * S;
    for_rows(pool, B * S, 4096, [&](int64_t i0, int64_t i1) {
      silu_residual(isa, pre_k + i0, nullptr, s_k + i0, i1 - i0);
    });
  }

  // ---- x_0 = concat(h, s); blocks x_{l+1} = x_l + SiLU(b_l + W_l x_l) ------------------------
  float* x0 = x_at(0);
  for (int64_t r = 0; r < R; ++r) {
    std::memcpy(x0 + r * D, batch.hidden.data() + (r % B) * dim, dim * sizeof(float));
    std::memcpy(x0 + r * D + dim, state_.data() + r * S, S * sizeof(float));
  }
  for (int l = 0; l < L; ++l) {
    float* y = y_at(l);
    const float* wl = w.w_block[l].data();
    if (l == 0) {
      // h is the same for the C rows of a position: its part of the chain (the bias, then the
      // h columns) once per position, copied to every step, then the s columns continue it -
      // the same fma chain as over x_0 whole.
      fill_rows(h_rows_.data(), B, D, w.b_block[0].data());
      linear_forward(B, dim, D, batch.hidden.data(), dim, wl, D, h_rows_.data(), D, true, pool);
      for (int64_t k = 0; k < C; ++k) {
        std::memcpy(y + k * B * D, h_rows_.data(), B * D * sizeof(float));
      }
      linear_forward(R, S, D, state_.data(), S, wl + dim, D, y, D, true, pool);
    } else {
      fill_rows(y, R, D, w.b_block[l].data());
      linear_forward(R, D, D, x_at(l), D, wl, D, y, D, true, pool);
    }
    const float* xin = x_at(l);
    float* xout = x_at(l + 1);
    for_rows(pool, R * D, 8192, [&](int64_t i0, int64_t i1) {
      silu_residual(isa, y + i0, xin + i0, xout + i0, i1 - i0);
    });
  }
  const float* x_last = x_at(L);

  // ---- logits and the cross-entropy of each row --------------------------------------------
  linear_forward(R, D, V, x_last, D, w.w_out.data(), D, logits_.data(), V, false, pool);
  const bool backward = grad != nullptr;
  SPECDEC_CHECK(batch.soft.empty() || static_cast<int64_t>(batch.soft.size()) == R * V,
                "ReDrafter batch: soft labels are not [C, B, V_d]");
  score_rows(isa, logits_.data(), V, batch.targets, C, B, backward, &row_loss_, &row_argmax_,
             &stats, pool, batch.soft.empty() ? nullptr : batch.soft.data(), batch.soft_weight);
  if (!backward) return stats;

  // ---- backward ------------------------------------------------------------------------------
  ReDrafterWeights& g = *grad;
  if (g.shape.dim != sh.dim || g.shape.state_dim != S || g.shape.n_blocks != L ||
      g.shape.n_draft_vocab != V || g.w_out.size() != w.w_out.size()) {
    g = make_redrafter(sh, w.draft_vocab, w.target_fingerprint);
  }
  const float* dz = logits_.data();  // [R, V] dJ/dlogits
  dx_.resize(R * D);
  ds_.resize(R * S);
  linear_backward_weight(R, D, V, dz, V, x_last, D, g.w_out.data(), D, false, pool);
  linear_backward_input(R, D, V, dz, V, w.w_out.data(), D, dx_.data(), D, false, pool);
  for (int l = L - 1; l >= 0; --l) {
    float* dy = y_at(l);  // y_l becomes dJ/dy_l
    for_rows(pool, R * D, 8192, [&](int64_t i0, int64_t i1) {
      silu_backward(isa, dx_.data() + i0, dy + i0, i1 - i0);
    });
    column_sums(dy, R, D, g.b_block[l].data(), pool);
    const float* wl = w.w_block[l].data();
    float* gwl = g.w_block[l].data();
    if (l > 0) {
      linear_backward_weight(R, D, D, dy, D, x_at(l), D, gwl, D, false, pool);
      // dJ/dx_l = dJ/dx_{l+1} (the residual) + dy W_l
      linear_backward_input(R, D, D, dy, D, wl, D, dx_.data(), D, true, pool);
    } else {
      // s columns over all rows; h columns over positions, with dy summed over the steps first
      linear_backward_weight(R, S, D, dy, D, state_.data(), S, gwl + dim, D, false, pool);
      for_rows(pool, B, 16, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          float* sum = h_rows_.data() + b * D;
          std::memcpy(sum, dy + b * D, D * sizeof(float));
          for (int64_t k = 1; k < C; ++k) {
            const float* row = dy + (k * B + b) * D;
            for (int64_t j = 0; j < D; ++j) sum[j] += row[j];
          }
        }
      });
      linear_backward_weight(B, dim, D, h_rows_.data(), D, batch.hidden.data(), dim, gwl, D, false,
                             pool);
      // dJ/ds = (dJ/dx_0)[:, dim:] + dy W_0[:, dim:]  (the h part of dJ/dx_0 is not needed)
      for (int64_t r = 0; r < R; ++r) {
        std::memcpy(ds_.data() + r * S, dx_.data() + r * D + dim, S * sizeof(float));
      }
      linear_backward_input(R, S, D, dy, D, wl + dim, D, ds_.data(), S, true, pool);
    }
  }
  if (L == 0) {
    for (int64_t r = 0; r < R; ++r) {
      std::memcpy(ds_.data() + r * S, dx_.data() + r * D + dim, S * sizeof(float));
    }
  }
  // Back through time: dpre_k = dJ/ds_{k+1} * SiLU'(pre_k); dJ/ds_k += dpre_k W_s.
  for (int64_t k = C - 1; k >= 0; --k) {
    float* dpre = pre_.data() + k * B * S;  // pre_k becomes dJ/dpre_k
    const float* ds = ds_.data() + k * B * S;
    for_rows(pool, B * S, 4096, [&](int64_t i0, int64_t i1) {
      silu_backward(isa, ds + i0, dpre + i0, i1 - i0);
    });
    if (k > 0) {
      linear_backward_input(B, S, S, dpre, S, w.w_state.data(), S, ds_.data() + (k - 1) * B * S,
                            S, true, pool);
    }
  }
  column_sums(pre_.data(), R, S, g.b_state.data(), pool);
  linear_backward_weight(R, dim, S, pre_.data(), S, e_in_.data(), dim, g.w_embed.data(), dim,
                         false, pool);
  linear_backward_weight((C - 1) * B, S, S, pre_.data() + B * S, S, state_.data(), S,
                         g.w_state.data(), S, false, pool);
  return stats;
}

}  // namespace specdec
