// AdamW (Loshchilov & Hutter: Adam with decoupled weight decay) over a ReDrafter head's
// parameters, global-norm gradient clipping, and the learning-rate schedule (linear warmup,
// then cosine decay). Element-wise work is shared over the pool; every reduction runs in a fixed
// order, so a step's bits do not depend on the thread count.
#pragma once

#include <cstdint>

#include "drafter/redrafter_weights.h"
#include "drafter/train/redrafter_params.h"

namespace specdec {

class ThreadPool;

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // on matrices only (ParamTensor::decay), not biases
};

struct AdamWState {
  ReDrafterWeights m;  // first moments, shaped like the head
  ReDrafterWeights v;  // second moments
  int64_t t = 0;       // updates done
};

AdamWState make_adamw_state(const ReDrafterWeights& w);

// One update of w with gradient g * grad_scale at learning rate lr (t advances first,
// bias-corrected; optimizer_kernels.h has the exact arithmetic):
//   m = β1 m + (1-β1) g;  v = β2 v + (1-β2) g²
//   w -= lr (m / (1-β1^t)) / (sqrt(v / (1-β2^t)) + eps) + lr wd w   (wd on matrices only)
void adamw_update(ReDrafterWeights& w, const ReDrafterWeights& g, AdamWState& state, double lr,
                  const AdamWOptions& o, ThreadPool* pool, float grad_scale = 1.0f);

// sqrt(Σ g²) over every parameter, in double: partial sums over fixed chunks, added in order.
double global_grad_norm(ReDrafterWeights& g, ThreadPool* pool = nullptr);
// The factor that brings a gradient of norm `norm` down to max_norm (1 when it is below, or
// max_norm <= 0: no clipping).
float clip_scale(double norm, double max_norm);
// Scales g in place by clip_scale; returns the norm before.
double clip_grad_norm(ReDrafterWeights& g, double max_norm, ThreadPool* pool = nullptr);

// The learning rate of update `step` (0-based) of `total`: lr_max (step + 1) / warmup during the
// first `warmup` updates, then cosine from lr_max down to lr_min at the last update.
// The same over parameter lists of any head (w, g and the moments m, v tensor by tensor in
// one order, e.g. redrafter_param_tensors / medusa_param_tensors); t: the update count.
void adamw_update_tensors(const std::vector<ParamTensor>& w, const std::vector<ParamTensor>& g,
                          const std::vector<ParamTensor>& m, const std::vector<ParamTensor>& v,
                          int64_t& t, double lr, const AdamWOptions& o, ThreadPool* pool,
                          float grad_scale = 1.0f);
double global_grad_norm_tensors(const std::vector<ParamTensor>& g, ThreadPool* pool = nullptr);

double lr_at(int64_t step, int64_t total, int64_t warmup, double lr_max, double lr_min);

}  // namespace specdec
