// The ReDrafter head's batched training pass (drafter/train/redrafter_grad.h):
//  * its forward equals redrafter_step_ref step by step (the inference-side reference);
//  * the gradient of EVERY parameter tensor, element by element, against central finite
//    differences of an independent double-precision objective, with masked targets (out of
//    the draft vocabulary, past the end, and a masked step before a scored one);
//  * the statistics (losses, accuracies, greedy accepted length) count what they say;
//  * one or two threads give the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "drafter/redrafter_weights.h"
#include "drafter/train/redrafter_grad.h"
#include "drafter/train/redrafter_params.h"

namespace specdec {
namespace {

constexpr int kTargetVocab = 23;

ReDrafterWeights random_head(int dim, int state, int blocks, int vocab, float scale,
                             uint32_t seed) {
  ReDrafterShape sh{dim, state, blocks, vocab, kTargetVocab};
  std::vector<int32_t> ids(vocab);
  for (int v = 0; v < vocab; ++v) ids[v] = (v * 7 + 3) % kTargetVocab;  // distinct (7 ⟂ 23)
  ReDrafterWeights w = make_redrafter(sh, ids, "test");
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (ParamTensor& p : redrafter_param_tensors(w)) {
    for (float& x : p.data) x = scale * dist(gen);
  }
  return w;
}

std::vector<float> random_embedding(int dim, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> e(static_cast<size_t>(kTargetVocab) * dim);
  for (float& x : e) x = dist(gen);
  return e;
}

// B positions, C steps; targets include every kind of mask.
ReDrafterBatch random_batch(int n, int steps, int dim, int vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  ReDrafterBatch b;
  b.n = n;
  b.steps = steps;
  b.hidden.resize(static_cast<size_t>(n) * dim);
  for (float& x : b.hidden) x = dist(gen);
  b.inputs.resize(static_cast<size_t>(n) * steps);
  b.targets.resize(static_cast<size_t>(n) * steps);
  for (int k = 0; k < steps; ++k) {
    for (int i = 0; i < n; ++i) {
      b.inputs[k * n + i] = static_cast<int32_t>(gen() % kTargetVocab);
      b.targets[k * n + i] = static_cast<int32_t>(gen() % vocab);
    }
  }
  if (n >= 3 && steps >= 3) {
    b.targets[0 * n + 1] = kTargetOutOfVocab;  // position 1: step 0 masked, steps 1, 2 scored
    b.targets[2 * n + 2] = kTargetPastEnd;     // position 2: the sequence ends after step 1
    b.targets[1 * n + 0] = kTargetOutOfVocab;  // position 0: a miss in the middle
  }
  return b;
}

// J of redrafter_grad.h in double precision, written independently (plain loops).
double reference_objective(const ReDrafterWeights& w, const std::vector<float>& emb,
                           const ReDrafterBatch& batch) {
  const ReDrafterShape& sh = w.shape;
  const int dim = sh.dim, S = sh.state_dim, D = sh.width(), V = sh.n_draft_vocab;
  auto silu = [](double y) { return y / (1.0 + std::exp(-y)); };
  double total = 0;
  for (int b = 0; b < batch.n; ++b) {
    std::vector<double> s(S, 0.0);
    for (int k = 0; k < batch.steps; ++k) {
      const int r = k * batch.n + b;
      const float* e = emb.data() + batch.inputs[r] * dim;
      std::vector<double> ns(S);
      for (int i = 0; i < S; ++i) {
        double a = w.b_state[i];
        for (int j = 0; j < dim; ++j) a += double(w.w_embed[i * dim + j]) * e[j];
        for (int j = 0; j < S; ++j) a += double(w.w_state[i * S + j]) * s[j];
        ns[i] = silu(a);
      }
      s = ns;
      std::vector<double> x(D);
      for (int j = 0; j < dim; ++j) x[j] = batch.hidden[b * dim + j];
      for (int j = 0; j < S; ++j) x[dim + j] = s[j];
      for (int l = 0; l < sh.n_blocks; ++l) {
        std::vector<double> y(D);
        for (int i = 0; i < D; ++i) {
          double a = w.b_block[l][i];
          for (int j = 0; j < D; ++j) a += double(w.w_block[l][i * D + j]) * x[j];
          y[i] = a;
        }
        for (int i = 0; i < D; ++i) x[i] += silu(y[i]);
      }
      const int t = batch.targets[r];
      if (t < 0) continue;
      std::vector<double> z(V);
      double zmax = -1e300;
      for (int v = 0; v < V; ++v) {
        double a = 0;
        for (int j = 0; j < D; ++j) a += double(w.w_out[v * D + j]) * x[j];
        z[v] = a;
        zmax = std::max(zmax, a);
      }
      double sum = 0;
      for (int v = 0; v < V; ++v) sum += std::exp(z[v] - zmax);
      // The label: onehot(t), or with soft labels a * soft + (1 - a) * onehot(t).
      double label_dot_z = z[t];
      if (!batch.soft.empty() && batch.soft_weight != 0.0f) {
        double pz = 0;
        for (int v = 0; v < V; ++v) pz += double(batch.soft[size_t(r) * V + v]) * z[v];
        label_dot_z = batch.soft_weight * pz + (1.0 - batch.soft_weight) * z[t];
      }
      total += zmax + std::log(sum) - label_dot_z;
    }
  }
  return total / batch.n;
}

// Soft labels for every row of `batch`: random distributions over V.
void add_soft_labels(ReDrafterBatch* batch, int V, float weight, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  batch->soft.resize(static_cast<size_t>(batch->n) * batch->steps * V);
  for (size_t r = 0; r < batch->soft.size() / V; ++r) {
    float sum = 0;
    for (int v = 0; v < V; ++v) sum += batch->soft[r * V + v] = u(gen) * u(gen);
    for (int v = 0; v < V; ++v) batch->soft[r * V + v] /= sum;
  }
  batch->soft_weight = weight;
}

TEST(ReDrafterGrad, ForwardEqualsTheStepReference) {
  const int dim = 16, S = 12, V = 19, C = 4, B = 7;
  for (int blocks : {0, 1, 2}) {
    const ReDrafterWeights w = random_head(dim, S, blocks, V, 0.3f, 11 + blocks);
    const std::vector<float> emb = random_embedding(dim, 5);
    ReDrafterBatch batch = random_batch(B, C, dim, V, 9);
    ThreadPool pool(2);
    ReDrafterGradient grad;
    grad.run(w, emb, batch, nullptr, &pool);
    double max_err = 0;
    for (int b = 0; b < B; ++b) {
      std::vector<float> s(S, 0.0f), s_next(S), logits(V);
      for (int k = 0; k < C; ++k) {
        const int r = k * B + b;
        redrafter_step_ref(w, batch.hidden.data() + b * dim, emb.data() + batch.inputs[r] * dim,
                           s.data(), s_next.data(), logits.data());
        for (int v = 0; v < V; ++v) {
          const double err = std::fabs(grad.logits_row(r)[v] - logits[v]);
          max_err = std::max(max_err, err / (1.0 + std::fabs(logits[v])));
        }
        for (int i = 0; i < S; ++i) {
          EXPECT_NEAR(grad.state_row(r)[i], s_next[i], 1e-5 * (1 + std::fabs(s_next[i])));
        }
        s = s_next;
      }
    }
    EXPECT_LT(max_err, 1e-5) << blocks << " blocks";
  }
}

void expect_gradients_match_finite_differences(ReDrafterWeights w, const std::vector<float>& emb,
                                               const ReDrafterBatch& batch);

TEST(ReDrafterGrad, EveryParameterMatchesFiniteDifferences) {
  const int dim = 8, S = 6, V = 11, C = 3, B = 5;
  expect_gradients_match_finite_differences(random_head(dim, S, 2, V, 0.4f, 3),
                                            random_embedding(dim, 4),
                                            random_batch(B, C, dim, V, 8));
}

// Knowledge distillation: the mixed label's objective and its gradient, every parameter.
TEST(ReDrafterGrad, SoftLabelsMatchFiniteDifferences) {
  const int dim = 8, S = 6, V = 11, C = 3, B = 5;
  ReDrafterBatch batch = random_batch(B, C, dim, V, 8);
  add_soft_labels(&batch, V, 0.7f, 21);
  const ReDrafterWeights w = random_head(dim, S, 2, V, 0.4f, 3);
  const std::vector<float> emb = random_embedding(dim, 4);
  // The soft part changes the objective (a test of the mixture, not of the hard labels again).
  ReDrafterBatch hard = batch;
  hard.soft.clear();
  EXPECT_GT(std::fabs(reference_objective(w, emb, batch) - reference_objective(w, emb, hard)),
            1e-3);
  expect_gradients_match_finite_differences(w, emb, batch);
}

void expect_gradients_match_finite_differences(ReDrafterWeights w, const std::vector<float>& emb,
                                               const ReDrafterBatch& batch) {
  ReDrafterGradient pass;
  ReDrafterWeights g = zeros_like(w);
  ThreadPool pool(2);
  const ReDrafterLossStats stats = pass.run(w, emb, batch, &g, &pool);
  EXPECT_NEAR(stats.objective(), reference_objective(w, emb, batch), 1e-5);

  std::vector<ParamTensor> params = redrafter_param_tensors(w);
  std::vector<ParamTensor> grads = redrafter_param_tensors(g);
  ASSERT_EQ(params.size(), 3u + 2 * 2 + 1);
  int checked = 0;
  for (size_t t = 0; t < params.size(); ++t) {
    double worst = 0;
    for (size_t i = 0; i < params[t].data.size(); ++i) {
      // Central difference over the float values actually reached (saved ± h rounded), of
      // the double-precision objective.
      const float saved = params[t].data[i];
      const double h = 1e-3;
      params[t].data[i] = static_cast<float>(saved + h);
      const double hp = double(params[t].data[i]) - saved;
      const double jp = reference_objective(w, emb, batch);
      params[t].data[i] = static_cast<float>(saved - h);
      const double hm = saved - double(params[t].data[i]);
      const double jm = reference_objective(w, emb, batch);
      params[t].data[i] = saved;
      const double fd = (jp - jm) / (hp + hm);
      const double got = grads[t].data[i];
      const double err = std::fabs(fd - got);
      worst = std::max(worst, err);
      EXPECT_LE(err, 2e-5 + 1e-3 * std::fabs(fd))
          << params[t].name << "[" << i << "]: finite difference " << fd << ", backward " << got;
      ++checked;
    }
    // A tensor whose gradient is all zero would pass trivially: each must carry signal.
    double norm = 0;
    for (float x : grads[t].data) norm += double(x) * x;
    EXPECT_GT(norm, 1e-8) << params[t].name;
    std::printf("%-16s %4zu elements, max |fd - backward| = %.2e\n", params[t].name.c_str(),
                params[t].data.size(), worst);
  }
  EXPECT_EQ(checked, static_cast<int>(w.shape.num_params()));
}

TEST(ReDrafterGrad, MaskedTargetsCarryNoGradientOfTheirOwn) {
  // Masking every target of the last step removes exactly that step's loss: the gradients of
  // the batch equal those of a batch with one step fewer.
  const int dim = 8, S = 6, V = 11, B = 4;
  const ReDrafterWeights w = random_head(dim, S, 2, V, 0.4f, 21);
  const std::vector<float> emb = random_embedding(dim, 22);
  ReDrafterBatch three = random_batch(B, 3, dim, V, 23);
  for (int b = 0; b < B; ++b) three.targets[2 * B + b] = kTargetPastEnd;
  ReDrafterBatch two = three;
  two.steps = 2;
  two.inputs.resize(2 * B);
  two.targets.resize(2 * B);
  ReDrafterGradient pass;
  ReDrafterWeights g3 = zeros_like(w), g2 = zeros_like(w);
  const ReDrafterLossStats s3 = pass.run(w, emb, three, &g3, nullptr);
  const ReDrafterLossStats s2 = pass.run(w, emb, two, &g2, nullptr);
  EXPECT_DOUBLE_EQ(s3.objective(), s2.objective());
  std::vector<ParamTensor> p3 = redrafter_param_tensors(g3), p2 = redrafter_param_tensors(g2);
  for (size_t t = 0; t < p3.size(); ++t) {
    for (size_t i = 0; i < p3[t].data.size(); ++i) {
      ASSERT_NEAR(p3[t].data[i], p2[t].data[i], 1e-6) << p3[t].name;
    }
  }
  EXPECT_EQ(s3.n_targets[2], 0);
  EXPECT_EQ(s3.n_scored[2], 0);
}

TEST(ReDrafterGrad, StatisticsCountWhatTheySay) {
  const int dim = 8, S = 6, V = 5, C = 3, B = 4;
  ReDrafterWeights w = random_head(dim, S, 1, V, 0.2f, 31);
  // Make the head always predict draft index 2: a large bias through lm_head's rows. W_o x with
  // x's first element forced large through h.
  for (int v = 0; v < V; ++v) {
    for (int j = 0; j < w.shape.width(); ++j) w.w_out[v * w.shape.width() + j] = 0.0f;
  }
  w.w_out[2 * w.shape.width() + 0] = 1.0f;
  const std::vector<float> emb = random_embedding(dim, 32);
  ReDrafterBatch batch = random_batch(B, C, dim, V, 33);
  for (int b = 0; b < B; ++b) batch.hidden[b * dim + 0] = 100.0f;  // x[0] ≈ 100 after blocks
  // position 0: 2, 2, 2 → accepts 3; position 1: 2, 1, 2 → 1; position 2: OOV first → 0;
  // position 3: 2, 2, past end → 2.
  const int32_t t[C][B] = {{2, 2, kTargetOutOfVocab, 2}, {2, 1, 2, 2}, {2, 2, 2, kTargetPastEnd}};
  for (int k = 0; k < C; ++k) {
    for (int b = 0; b < B; ++b) batch.targets[k * B + b] = t[k][b];
  }
  ReDrafterGradient pass;
  const ReDrafterLossStats st = pass.run(w, emb, batch, nullptr, nullptr);
  EXPECT_EQ(st.n_positions, B);
  EXPECT_EQ(st.accepted_sum, 3 + 1 + 0 + 2);
  EXPECT_EQ(st.n_targets, (std::vector<int64_t>{4, 4, 3}));
  EXPECT_EQ(st.n_scored, (std::vector<int64_t>{3, 4, 3}));
  EXPECT_EQ(st.n_correct, (std::vector<int64_t>{3, 3, 3}));
  EXPECT_DOUBLE_EQ(st.accuracy(0), 0.75);
  EXPECT_NEAR(st.accepted_length(), 1.5, 1e-12);
}

TEST(ReDrafterGrad, OneOrTwoThreadsSameBits) {
  const int dim = 40, S = 24, V = 300, C = 4, B = 70;
  const ReDrafterWeights w = random_head(dim, S, 2, V, 0.2f, 41);
  const std::vector<float> emb = random_embedding(dim, 42);
  const ReDrafterBatch batch = random_batch(B, C, dim, V, 43);
  ThreadPool p1(1), p2(2);
  ReDrafterGradient a, b;
  ReDrafterWeights ga = zeros_like(w), gb = zeros_like(w);
  const ReDrafterLossStats sa = a.run(w, emb, batch, &ga, &p1);
  const ReDrafterLossStats sb = b.run(w, emb, batch, &gb, &p2);
  EXPECT_EQ(sa.loss_sum, sb.loss_sum);
  std::vector<ParamTensor> pa = redrafter_param_tensors(ga), pb = redrafter_param_tensors(gb);
  for (size_t t = 0; t < pa.size(); ++t) {
    EXPECT_EQ(0, std::memcmp(pa[t].data.data(), pb[t].data.data(), pa[t].data.size() * 4))
        << pa[t].name;
  }
}

}  // namespace
}  // namespace specdec
