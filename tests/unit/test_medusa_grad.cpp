// Medusa head training (drafter/train/medusa_grad.h, medusa_trainer.h):
//  * the batched forward equals medusa_head_ref, head by head, row by row;
//  * the gradient of EVERY parameter tensor, element by element, against central finite
//    differences of an independent double-precision objective, with masked targets (out of
//    the draft vocabulary and past the end);
//  * the loss falls and the heads learn on synthetic data with a learnable chain.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/thread_pool.h"
#include "drafter/medusa_weights.h"
#include "drafter/train/medusa_grad.h"
#include "drafter/train/medusa_trainer.h"
#include "drafter/train/train_data.h"
#include "util/check.h"

namespace specdec {
namespace {

constexpr int kTargetVocab = 23;

MedusaWeights random_heads(int dim, int heads, int vocab, float scale, uint32_t seed) {
  std::vector<int32_t> ids(vocab);
  for (int v = 0; v < vocab; ++v) ids[v] = (v * 7 + 3) % kTargetVocab;
  MedusaWeights w = make_medusa({dim, heads, vocab, kTargetVocab}, ids, "test");
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (ParamTensor& p : medusa_param_tensors(w)) {
    for (float& x : p.data) x = scale * dist(gen);
  }
  return w;
}

ReDrafterBatch random_batch(int n, int heads, int dim, int vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  ReDrafterBatch b;
  b.n = n;
  b.steps = heads;
  b.hidden.resize(static_cast<size_t>(n) * dim);
  for (float& x : b.hidden) x = dist(gen);
  b.inputs.assign(static_cast<size_t>(n) * heads, 0);
  b.targets.resize(static_cast<size_t>(n) * heads);
  for (int32_t& t : b.targets) t = static_cast<int32_t>(gen() % vocab);
  if (n >= 3 && heads >= 3) {
    b.targets[0 * n + 1] = kTargetOutOfVocab;  // position 1: head 0 a miss, heads 1, 2 scored
    b.targets[2 * n + 2] = kTargetPastEnd;     // position 2: the sequence ends after head 1
    b.targets[1 * n + 0] = kTargetOutOfVocab;  // position 0: a miss in the middle
  }
  return b;
}

// J = Σ_k (1/B) Σ_b CE over the scored targets, in double, written independently.
double reference_objective(const MedusaWeights& w, const ReDrafterBatch& batch) {
  const int dim = w.shape.dim, V = w.shape.n_draft_vocab, B = batch.n;
  double total = 0;
  for (int k = 0; k < w.shape.n_heads; ++k) {
    for (int b = 0; b < B; ++b) {
      const int t = batch.targets[k * B + b];
      if (t < 0) continue;
      const float* h = batch.hidden.data() + b * dim;
      std::vector<double> x(dim);
      for (int i = 0; i < dim; ++i) {
        double y = w.b_res[k][i];
        for (int j = 0; j < dim; ++j) y += double(w.w_res[k][i * dim + j]) * h[j];
        x[i] = h[i] + y / (1.0 + std::exp(-y));
      }
      std::vector<double> z(V);
      double zmax = -1e300;
      for (int v = 0; v < V; ++v) {
        double a = 0;
        for (int j = 0; j < dim; ++j) a += double(w.w_out[k][v * dim + j]) * x[j];
        z[v] = a;
        zmax = std::max(zmax, a);
      }
      double sum = 0;
      for (int v = 0; v < V; ++v) sum += std::exp(z[v] - zmax);
      total += zmax + std::log(sum) - z[t];
    }
  }
  return total / B;
}

TEST(MedusaGrad, ForwardEqualsTheHeadReference) {
  const int dim = 16, K = 3, V = 19, B = 7;
  const MedusaWeights w = random_heads(dim, K, V, 0.3f, 11);
  const ReDrafterBatch batch = random_batch(B, K, dim, V, 9);
  ThreadPool pool(2);
  MedusaGradient pass;
  pass.run(w, batch, nullptr, &pool);
  double max_err = 0;
  std::vector<float> logits(V);
  for (int k = 0; k < K; ++k) {
    for (int b = 0; b < B; ++b) {
      medusa_head_ref(w, k, batch.hidden.data() + b * dim, logits.data());
      for (int v = 0; v < V; ++v) {
        const double err = std::fabs(pass.logits_row(k * B + b)[v] - logits[v]);
        max_err = std::max(max_err, err / (1.0 + std::fabs(logits[v])));
      }
    }
  }
  EXPECT_LT(max_err, 1e-5);
}

TEST(MedusaGrad, EveryParameterMatchesFiniteDifferences) {
  const int dim = 8, K = 3, V = 11, B = 5;
  MedusaWeights w = random_heads(dim, K, V, 0.4f, 3);
  const ReDrafterBatch batch = random_batch(B, K, dim, V, 8);
  MedusaGradient pass;
  MedusaWeights g = medusa_zeros_like(w);
  ThreadPool pool(2);
  const ReDrafterLossStats stats = pass.run(w, batch, &g, &pool);
  EXPECT_NEAR(stats.objective(), reference_objective(w, batch), 1e-5);
  EXPECT_EQ(stats.n_targets[2], B - 1);  // the past-the-end target is not counted
  EXPECT_EQ(stats.n_scored[0], B - 1);   // the out-of-vocabulary one is a miss, not a term
  EXPECT_EQ(stats.n_scored[1], B - 1);

  std::vector<ParamTensor> params = medusa_param_tensors(w);
  std::vector<ParamTensor> grads = medusa_param_tensors(g);
  ASSERT_EQ(params.size(), 3u * K);
  int64_t checked = 0;
  for (size_t t = 0; t < params.size(); ++t) {
    double worst = 0;
    for (size_t i = 0; i < params[t].data.size(); ++i) {
      const float saved = params[t].data[i];
      const double h = 1e-3;
      params[t].data[i] = static_cast<float>(saved + h);
      const double hp = double(params[t].data[i]) - saved;
      const double jp = reference_objective(w, batch);
      params[t].data[i] = static_cast<float>(saved - h);
      const double hm = saved - double(params[t].data[i]);
      const double jm = reference_objective(w, batch);
      params[t].data[i] = saved;
      const double fd = (jp - jm) / (hp + hm);
      const double got = grads[t].data[i];
      const double err = std::fabs(fd - got);
      worst = std::max(worst, err);
      EXPECT_LE(err, 2e-5 + 1e-3 * std::fabs(fd))
          << params[t].name << "[" << i << "]: finite difference " << fd << ", backward " << got;
      ++checked;
    }
    double norm = 0;  // an all-zero gradient would pass trivially: each must carry signal
    for (float x : grads[t].data) norm += double(x) * x;
    EXPECT_GT(norm, 1e-8) << params[t].name;
    std::printf("%-16s %4zu elements, max |fd - backward| = %.2e\n", params[t].name.c_str(),
                params[t].data.size(), worst);
  }
  EXPECT_EQ(checked, w.shape.num_params());
}

// Sequences of a sparse Markov chain (first successor with probability 3/4), hidden states that
// encode the next token (h_i = P[t_{i+1}] + noise, as a target's would).
DistillDataset chain_data(int n_seqs, int len, int dim, int n_vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<int32_t> succ(2 * n_vocab);
  for (int32_t& s : succ) s = static_cast<int32_t>(gen() % n_vocab);
  std::vector<float> proj(static_cast<size_t>(n_vocab) * dim);
  for (float& x : proj) x = normal(gen);
  DistillDataset d;
  d.dim = dim;
  d.seq_offsets.push_back(0);
  for (int q = 0; q < n_seqs; ++q) {
    const int n_prompt = 3;
    int32_t t = static_cast<int32_t>(gen() % n_vocab);
    for (int i = 0; i < len; ++i) {
      d.tokens.push_back(t);
      t = i < n_prompt ? static_cast<int32_t>(gen() % n_vocab)
                       : succ[2 * t + (gen() % 4 == 0 ? 1 : 0)];
    }
    d.n_prompt.push_back(n_prompt);
    d.seq_offsets.push_back(static_cast<int64_t>(d.tokens.size()));
  }
  std::vector<float> h(dim);
  d.hidden.resize(d.tokens.size() * dim);
  for (int64_t q = 0; q < d.n_seqs(); ++q) {
    for (int64_t i = d.seq_offsets[q]; i < d.seq_offsets[q + 1]; ++i) {
      for (int j = 0; j < dim; ++j) {
        const float signal = i + 1 < d.seq_offsets[q + 1] ? proj[d.tokens[i + 1] * dim + j] : 0.0f;
        h[j] = signal + 0.1f * normal(gen);
      }
      f32_to_f16(h.data(), dim, d.hidden.data() + i * dim);
    }
  }
  return d;
}

TEST(TrainMedusa, LossFallsOnLearnableData) {
  const int dim = 16, n_vocab = 40, V = 32, K = 2;
  const DistillDataset data = chain_data(300, 40, dim, n_vocab, 11);
  std::vector<int32_t> ids(V);
  for (int v = 0; v < V; ++v) ids[v] = v;
  MedusaWeights w = make_medusa({dim, K, V, n_vocab}, ids, "synthetic");
  init_medusa(w, 5, 1.0, -1.0);
  ReDrafterTrainOptions o;
  o.batch = 64;
  o.epochs = 3;
  o.lr = 1e-2;
  o.seed = 5;
  o.eval_fraction = 0.05;
  o.checkpoint_every = 0;
  ThreadPool pool(2);
  const PositionSplit split = split_positions(data, o.eval_fraction, o.seed);
  const ReDrafterLossStats before = evaluate_medusa(w, data, split.eval, 256, &pool);
  std::vector<double> evals;
  const ReDrafterTrainReport r = train_medusa(w, data, o, &pool, [&](const ReDrafterTrainEvent& e) {
    if (e.kind == ReDrafterTrainEvent::Kind::kEval) evals.push_back(e.eval->mean_loss());
  });
  ASSERT_TRUE(r.finished);
  std::printf("eval loss %.3f -> %.3f per target; head accuracy %.2f %.2f; accepted %.2f; "
              "%lld updates in %.2f s\n",
              before.mean_loss(), r.eval.mean_loss(), r.eval.accuracy(0), r.eval.accuracy(1),
              r.eval.accepted_length(), (long long)r.steps, r.seconds);
  // chance: ln 32 = 3.47; head 0 can reach 3/4 (the chain's first successor of the root)
  EXPECT_GT(before.mean_loss(), 2.5);
  EXPECT_LT(r.eval.mean_loss(), 0.6 * before.mean_loss());
  EXPECT_GT(r.eval.accuracy(0), 0.5);
  EXPECT_GT(r.eval.accuracy(1), 0.3);
  ASSERT_GE(evals.size(), 5u);
  EXPECT_LT(evals.back(), evals.front());
}

TEST(TrainMedusa, RefusesCheckpointsAndForeignData) {
  const DistillDataset data = chain_data(20, 20, 16, 40, 3);
  std::vector<int32_t> ids = {0, 1, 2, 3};
  MedusaWeights w = make_medusa({8, 2, 4, 40}, ids, "x");  // dim 8, data 16 wide
  ReDrafterTrainOptions o;
  o.checkpoint_every = 0;
  EXPECT_THROW(train_medusa(w, data, o, nullptr), Error);
  MedusaWeights w16 = make_medusa({16, 2, 4, 40}, ids, "x");
  o.resume = true;
  o.checkpoint_path = "/nonexistent";
  EXPECT_THROW(train_medusa(w16, data, o, nullptr), Error);
}

}  // namespace
}  // namespace specdec
