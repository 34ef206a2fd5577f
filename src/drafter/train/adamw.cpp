#include "drafter/train/adamw.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "backend/cpu/thread_pool.h"
#include "drafter/train/redrafter_params.h"
#include "util/check.h"

namespace specdec {

AdamWState make_adamw_state(const ReDrafterWeights& w) {
  AdamWState s;
  s.m = zeros_like(w);
  s.v = zeros_like(w);
  return s;
}

void adamw_update(ReDrafterWeights& w, const ReDrafterWeights& g, AdamWState& state, double lr,
                  const AdamWOptions& o, ThreadPool* pool) {
  state.t += 1;
  const double c1 = 1.0 - std::pow(o.beta1, static_cast<double>(state.t));
  const double c2 = 1.0 - std::pow(o.beta2, static_cast<double>(state.t));
  const float b1 = static_cast<float>(o.beta1), b2 = static_cast<float>(o.beta2);
  const float step = static_cast<float>(lr / c1);          // lr / (1 - β1^t)
  const float inv_sqrt_c2 = static_cast<float>(1.0 / std::sqrt(c2));
  const float eps = static_cast<float>(o.eps);
  std::vector<ParamTensor> pw = redrafter_param_tensors(w);
  std::vector<ParamTensor> pg = redrafter_param_tensors(const_cast<ReDrafterWeights&>(g));
  std::vector<ParamTensor> pm = redrafter_param_tensors(state.m);
  std::vector<ParamTensor> pv = redrafter_param_tensors(state.v);
  SPECDEC_CHECK(pw.size() == pg.size() && pw.size() == pm.size() && pw.size() == pv.size(),
                "AdamW: gradient or moments shaped unlike the weights");
  for (size_t t = 0; t < pw.size(); ++t) {
    SPECDEC_CHECK(pw[t].data.size() == pg[t].data.size() && pw[t].data.size() == pm[t].data.size() &&
                      pw[t].data.size() == pv[t].data.size(),
                  "AdamW: tensor sizes differ");
    const float decay = pw[t].decay ? static_cast<float>(lr * o.weight_decay) : 0.0f;
    float* wp = pw[t].data.data();
    const float* gp = pg[t].data.data();
    float* mp = pm[t].data.data();
    float* vp = pv[t].data.data();
    auto body = [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const float gi = gp[i];
        mp[i] = b1 * mp[i] + (1.0f - b1) * gi;
        vp[i] = b2 * vp[i] + (1.0f - b2) * gi * gi;
        const float denom = std::sqrt(vp[i]) * inv_sqrt_c2 + eps;
        wp[i] -= step * mp[i] / denom + decay * wp[i];
      }
    };
    const int64_t n = static_cast<int64_t>(pw[t].data.size());
    if (pool && pool->size() > 1 && n > 1 << 15) {
      pool->parallel_for(n, 4096, body);
    } else {
      body(0, n);
    }
  }
}

double global_grad_norm(ReDrafterWeights& g) {
  double sum = 0;
  for (const ParamTensor& p : redrafter_param_tensors(g)) {
    for (float x : p.data) sum += static_cast<double>(x) * x;
  }
  return std::sqrt(sum);
}

double clip_grad_norm(ReDrafterWeights& g, double max_norm) {
  const double norm = global_grad_norm(g);
  if (max_norm > 0 && norm > max_norm) {
    const float scale = static_cast<float>(max_norm / (norm + 1e-6));
    for (ParamTensor& p : redrafter_param_tensors(g)) {
      for (float& x : p.data) x *= scale;
    }
  }
  return norm;
}

double lr_at(int64_t step, int64_t total, int64_t warmup, double lr_max, double lr_min) {
  if (step < warmup) return lr_max * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const int64_t span = std::max<int64_t>(total - warmup - 1, 1);
  const double progress = std::clamp(static_cast<double>(step - warmup) / span, 0.0, 1.0);
  return lr_min + 0.5 * (lr_max - lr_min) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace specdec
