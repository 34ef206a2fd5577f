#include "drafter/train/score_rows.h"

#include <cstring>

#include "drafter/train/train_activations.h"
#include "drafter/train/train_rows.h"
#include "util/check.h"

namespace specdec {

void score_rows(Isa isa, float* logits, int64_t V, std::span<const int32_t> targets,
                int64_t steps, int64_t B, bool backward, std::vector<double>* row_loss,
                std::vector<int32_t>* row_argmax, ReDrafterLossStats* stats, ThreadPool* pool,
                const float* soft, float soft_weight) {
  const int64_t R = steps * B;
  SPECDEC_CHECK(static_cast<int64_t>(targets.size()) == R, "score_rows: targets size");
  row_loss->resize(static_cast<size_t>(R));
  row_argmax->resize(static_cast<size_t>(R));
  double* loss = row_loss->data();
  int32_t* argmax = row_argmax->data();
  const float inv_b = 1.0f / static_cast<float>(B);
  for_rows(pool, R, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* z = logits + r * V;
      const int32_t t = targets[r];
      loss[r] = 0.0;
      argmax[r] = -1;
      if (t < 0) {  // masked: no loss, no gradient
        if (backward) std::memset(z, 0, static_cast<size_t>(V) * sizeof(float));
        continue;
      }
      SPECDEC_CHECK(t < V, "training batch: target beyond the draft vocabulary");
      const float* p = soft != nullptr && soft_weight != 0.0f ? soft + r * V : nullptr;
      // With soft labels: CE against a p + (1 - a) onehot(t) = CE(t) + a (z_t - sum_v p_v z_v)
      // (the log-sum-exp is shared), and its gradient adds a (onehot(t) - p) / B.
      double pz = 0.0;
      const float zt = z[t];
      if (p != nullptr) {
        for (int64_t v = 0; v < V; ++v) pz += static_cast<double>(p[v]) * z[v];
      }
      const CrossEntropyRow ce = cross_entropy_row(isa, z, V, t, backward ? inv_b : 0.0f);
      loss[r] = ce.loss;
      argmax[r] = ce.argmax;
      if (p != nullptr) {
        loss[r] += soft_weight * (static_cast<double>(zt) - pz);
        if (backward) {
          const float a = soft_weight * inv_b;
          for (int64_t v = 0; v < V; ++v) z[v] -= a * p[v];
          z[t] += a;
        }
      }
    }
  });
  for (int64_t k = 0; k < steps; ++k) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t r = k * B + b;
      const int32_t t = targets[r];
      if (t != kTargetPastEnd) ++stats->n_targets[k];
      if (t < 0) continue;
      ++stats->n_scored[k];
      stats->loss_sum[k] += loss[r];
      if (argmax[r] == t) ++stats->n_correct[k];
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t k = 0; k < steps; ++k) {
      const int64_t r = k * B + b;
      if (targets[r] < 0 || argmax[r] != targets[r]) break;
      ++stats->accepted_sum;
    }
  }
  stats->n_positions = B;
}

}  // namespace specdec
