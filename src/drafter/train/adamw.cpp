#include "drafter/train/adamw.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "backend/cpu/thread_pool.h"
#include "drafter/train/optimizer_kernels.h"
#include "drafter/train/redrafter_params.h"
#include "util/check.h"

namespace specdec {

AdamWState make_adamw_state(const ReDrafterWeights& w) {
  AdamWState s;
  s.m = zeros_like(w);
  s.v = zeros_like(w);
  return s;
}

namespace {

// Element-wise work is cut into chunks of this many elements, shared over the pool; the
// norm's partial sums are per chunk and added in chunk order (any thread count, same bits).
constexpr int64_t kChunk = 1 << 14;

struct Chunk {
  int tensor;
  int64_t begin, end;
};

std::vector<Chunk> chunks_of(const std::vector<ParamTensor>& ts) {
  std::vector<Chunk> out;
  for (size_t t = 0; t < ts.size(); ++t) {
    const int64_t n = static_cast<int64_t>(ts[t].data.size());
    for (int64_t b = 0; b < n; b += kChunk) out.push_back({static_cast<int>(t), b, std::min(n, b + kChunk)});
  }
  return out;
}

template <class F>
void for_chunks(ThreadPool* pool, int64_t n_chunks, F&& body) {
  if (pool && pool->size() > 1 && n_chunks > 1) {
    pool->parallel_for(n_chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) body(c);
    });
  } else {
    for (int64_t c = 0; c < n_chunks; ++c) body(c);
  }
}

}  // namespace

void adamw_update(ReDrafterWeights& w, const ReDrafterWeights& g, AdamWState& state, double lr,
                  const AdamWOptions& o, ThreadPool* pool, float grad_scale) {
  adamw_update_tensors(redrafter_param_tensors(w),
                       redrafter_param_tensors(const_cast<ReDrafterWeights&>(g)),
                       redrafter_param_tensors(state.m), redrafter_param_tensors(state.v), state.t,
                       lr, o, pool, grad_scale);
}

void adamw_update_tensors(const std::vector<ParamTensor>& pw, const std::vector<ParamTensor>& pg,
                          const std::vector<ParamTensor>& pm, const std::vector<ParamTensor>& pv,
                          int64_t& t, double lr, const AdamWOptions& o, ThreadPool* pool,
                          float grad_scale) {
  t += 1;
  const double c1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
  const double c2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
  AdamWStep base;
  base.beta1 = static_cast<float>(o.beta1);
  base.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  base.beta2 = static_cast<float>(o.beta2);
  base.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  base.step = static_cast<float>(lr / c1);
  base.inv_sqrt_c2 = static_cast<float>(1.0 / std::sqrt(c2));
  base.eps = static_cast<float>(o.eps);
  base.grad_scale = grad_scale;
  const float decay = static_cast<float>(lr * o.weight_decay);
  SPECDEC_CHECK(pw.size() == pg.size() && pw.size() == pm.size() && pw.size() == pv.size(),
                "AdamW: gradient or moments shaped unlike the weights");
  for (size_t i = 0; i < pw.size(); ++i) {
    SPECDEC_CHECK(pw[i].data.size() == pg[i].data.size() && pw[i].data.size() == pm[i].data.size() &&
                      pw[i].data.size() == pv[i].data.size(),
                  "AdamW: tensor sizes differ");
  }
  const std::vector<Chunk> chunks = chunks_of(pw);
  const Isa isa = active_isa();
  for_chunks(pool, static_cast<int64_t>(chunks.size()), [&](int64_t c) {
    const Chunk& ch = chunks[c];
    AdamWStep s = base;
    s.decay = pw[ch.tensor].decay ? decay : 0.0f;
    adamw_kernel(isa, s, ch.end - ch.begin, pg[ch.tensor].data.data() + ch.begin,
                 pw[ch.tensor].data.data() + ch.begin, pm[ch.tensor].data.data() + ch.begin,
                 pv[ch.tensor].data.data() + ch.begin);
  });
}

double global_grad_norm(ReDrafterWeights& g, ThreadPool* pool) {
  return global_grad_norm_tensors(redrafter_param_tensors(g), pool);
}

double global_grad_norm_tensors(const std::vector<ParamTensor>& pg, ThreadPool* pool) {
  const std::vector<Chunk> chunks = chunks_of(pg);
  std::vector<double> partial(chunks.size(), 0.0);
  const Isa isa = active_isa();
  for_chunks(pool, static_cast<int64_t>(chunks.size()), [&](int64_t c) {
    const Chunk& ch = chunks[c];
    partial[c] = sum_squares_kernel(isa, pg[ch.tensor].data.data() + ch.begin, ch.end - ch.begin);
  });
  double sum = 0;
  for (double p : partial) sum += p;
  return std::sqrt(sum);
}

float clip_scale(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm ? static_cast<float>(max_norm / (norm + 1e-6)) : 1.0f;
}

double clip_grad_norm(ReDrafterWeights& g, double max_norm, ThreadPool* pool) {
  const double norm = global_grad_norm(g, pool);
  const float scale = clip_scale(norm, max_norm);
  if (scale != 1.0f) {
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
