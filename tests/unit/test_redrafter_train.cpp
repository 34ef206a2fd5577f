// Training a ReDrafter head (drafter/train/): positions, split and batches of a distillation
// dataset; AdamW, clipping and the schedule; checkpoints; and the training loop - the loss falls
// on data with learnable structure, a run interrupted and resumed from its checkpoint ends with
// the same bits as an uninterrupted one (mid-epoch and at an epoch boundary), the same seed
// gives the same weights and so do 1 and 2 threads, and a checkpoint of another run is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/thread_pool.h"
#include "drafter/redrafter_weights.h"
#include "drafter/train/adamw.h"
#include "drafter/train/optimizer_kernels.h"
#include "drafter/train/redrafter_init.h"
#include "drafter/train/redrafter_params.h"
#include "drafter/train/redrafter_trainer.h"
#include "drafter/train/train_checkpoint.h"
#include "drafter/train/train_data.h"
#include "util/check.h"

namespace specdec {
namespace {

// Token sequences from a sparse Markov chain (each token is followed by its first successor
// with probability 3/4, else its second), prompts of random tokens, and hidden states that
// encode the next token (as a target's would): h_i = P[t_{i+1}] + noise. The best head predicts
// step k's target from the token it reads with accuracy 3/4.
struct Synthetic {
  DistillDataset data;
  std::vector<float> embedding;  // [n_vocab, dim]
  int n_vocab = 0;
};

Synthetic make_synthetic(int n_seqs, int len, int dim, int n_vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<int32_t> succ(2 * n_vocab);
  for (int32_t& s : succ) s = static_cast<int32_t>(gen() % n_vocab);
  std::vector<float> proj(static_cast<size_t>(n_vocab) * dim);
  for (float& x : proj) x = normal(gen);
  Synthetic s;
  s.n_vocab = n_vocab;
  s.embedding.resize(static_cast<size_t>(n_vocab) * dim);
  for (float& x : s.embedding) x = normal(gen);
  DistillDataset& d = s.data;
  d.dim = dim;
  d.seq_offsets.push_back(0);
  for (int q = 0; q < n_seqs; ++q) {
    const int n_prompt = 3 + static_cast<int>(gen() % 4);
    const int n = len + static_cast<int>(gen() % 5);
    int32_t t = static_cast<int32_t>(gen() % n_vocab);
    for (int i = 0; i < n; ++i) {
      d.tokens.push_back(t);
      if (i < n_prompt) {
        t = static_cast<int32_t>(gen() % n_vocab);
      } else {
        t = succ[2 * t + (gen() % 4 == 0 ? 1 : 0)];
      }
    }
    d.n_prompt.push_back(n_prompt);
    d.seq_offsets.push_back(static_cast<int64_t>(d.tokens.size()));
  }
  // h_i encodes t_{i+1} (the last token's h: noise only)
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
  return s;
}

ReDrafterWeights fresh_head(const Synthetic& s, int state, int blocks, int vocab, uint64_t seed) {
  std::vector<int32_t> ids(vocab);
  for (int v = 0; v < vocab; ++v) ids[v] = v;  // tokens vocab .. n_vocab-1 are out of it
  ReDrafterWeights w = make_redrafter({s.data.dim, state, blocks, vocab, s.n_vocab}, ids, "synthetic");
  init_redrafter(w, seed, {});
  return w;
}

bool same_bits(ReDrafterWeights& a, ReDrafterWeights& b) {
  std::vector<ParamTensor> pa = redrafter_param_tensors(a), pb = redrafter_param_tensors(b);
  if (pa.size() != pb.size()) return false;
  for (size_t t = 0; t < pa.size(); ++t) {
    if (pa[t].data.size() != pb[t].data.size() ||
        std::memcmp(pa[t].data.data(), pb[t].data.data(), pa[t].data.size() * 4) != 0) {
      return false;
    }
  }
  return true;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("specdec_train_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// ---- data ----------------------------------------------------------------------------------

DistillDataset tiny_dataset() {
  // seq 0: 6 tokens, prompt 2 → positions i with i >= 1 and i + 2 <= 5: 1, 2, 3
  // seq 1: 3 tokens, prompt 3 → i >= 2 and i + 2 <= 2: none
  // seq 2: 4 tokens, prompt 0 → i >= 0 and i + 2 <= 3: 0, 1
  DistillDataset d;
  d.dim = 2;
  d.seq_offsets = {0, 6, 9, 13};
  d.n_prompt = {2, 3, 0};
  d.tokens = {5, 6, 7, 8, 9, 1, 2, 3, 4, 7, 1, 9, 8};
  d.hidden.resize(13 * 2);
  std::vector<float> h(2);
  for (int i = 0; i < 13; ++i) {
    h = {static_cast<float>(i), -0.5f * i};
    f32_to_f16(h.data(), 2, d.hidden.data() + 2 * i);
  }
  return d;
}

TEST(TrainData, PositionsAreAnswerRootsWithATarget) {
  const DistillDataset d = tiny_dataset();
  EXPECT_EQ(training_positions(d, {}, false), (std::vector<int64_t>{1, 2, 3, 9, 10}));
}

// The batch of positions 3 and 9 of tiny_dataset(), 3 steps, draft vocabulary {9, 7, 8}
// (9 → 0, 7 → 1, 8 → 2; others out of it).
const std::vector<int64_t> kTinyPositions = {3, 9};
ReDrafterBatch tiny_batch(const DistillDataset& d) {
  ReDrafterBatch b;
  make_batch(d, kTinyPositions, 3, draft_index_map(std::vector<int32_t>{9, 7, 8}, 12), &b);
  return b;
}

TEST(TrainData, BatchInputsTargetsAndMasks) {
  const DistillDataset d = tiny_dataset();
  const ReDrafterBatch b = tiny_batch(d);
  ASSERT_EQ(b.n, 2);
  // position 3 (seq 0: ... t3=8, t4=9, t5=1, end 6): root t4 = 9; inputs 9, 1, (past end: root)
  // targets t5 = 1 (OOV), past end, past end
  // position 9 (seq 2: t9=7, t10=1, t11=9, t12=8): root 1; inputs 1, 9, 8; targets 9, 8, past
  EXPECT_EQ(b.inputs, (std::vector<int32_t>{9, 1, 1, 9, 9, 8}));
  EXPECT_EQ(b.targets, (std::vector<int32_t>{kTargetOutOfVocab, 0, kTargetPastEnd, 2,
                                             kTargetPastEnd, kTargetPastEnd}));
  EXPECT_EQ(b.hidden, (std::vector<float>{3.0f, -1.5f, 9.0f, -4.5f}));
}

// Soft labels: the target of step k of position i is predicted by h_{i+1+k}; its label is the
// softmax of the target rows times that hidden state, summing to 1; rows past the end are 0.
TEST(TrainData, SoftLabelsAreTheTargetsDistributionAtEachTarget) {
  const DistillDataset d = tiny_dataset();
  ReDrafterBatch b = tiny_batch(d);
  const std::vector<float> rows = {0.5f, 0.25f, -1.0f, 0.0f, 0.1f, 0.3f};  // [V_d = 3, dim = 2]
  std::vector<float> scratch;
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    make_soft_labels(d, kTinyPositions, rows, 0.6f, &b, &scratch, &pool);
    ASSERT_EQ(b.soft.size(), 2u * 3u * 3u);
    EXPECT_EQ(b.soft_weight, 0.6f);
    // rows r = k * B + b: (k0, p3) h4, (k0, p9) h10, (k1, p3) past the end, (k1, p9) h11,
    // (k2, *) past the end (position 9's sequence ends at 13: step 2 targets t13)
    const int64_t hidden_of_row[6] = {4, 10, -1, 11, -1, -1};
    for (int r = 0; r < 6; ++r) {
      const float* p = b.soft.data() + r * 3;
      if (hidden_of_row[r] < 0) {
        EXPECT_EQ(p[0] + p[1] + p[2], 0.0f) << r;
        continue;
      }
      const double i = static_cast<double>(hidden_of_row[r]);
      double z[3], sum = 0;
      for (int v = 0; v < 3; ++v) {
        z[v] = rows[v * 2] * i + rows[v * 2 + 1] * (-0.5 * i);
        sum += std::exp(z[v]);
      }
      for (int v = 0; v < 3; ++v) EXPECT_NEAR(p[v], std::exp(z[v]) / sum, 1e-6) << r << " " << v;
    }
  }
}

TEST(TrainData, SplitHoldsOutWholeSequencesBySeed) {
  const Synthetic s = make_synthetic(100, 20, 4, 16, 1);
  const PositionSplit a = split_positions(s.data, 0.1, 7), b = split_positions(s.data, 0.1, 7),
                      c = split_positions(s.data, 0.1, 8);
  EXPECT_EQ(a.n_eval_seqs, 10);
  EXPECT_EQ(a.train, b.train);
  EXPECT_EQ(a.eval, b.eval);
  EXPECT_NE(a.eval, c.eval);
  EXPECT_EQ(a.train.size() + a.eval.size(), training_positions(s.data, {}, false).size());
  // no sequence on both sides
  auto seq_of = [&](int64_t i) {
    return std::upper_bound(s.data.seq_offsets.begin(), s.data.seq_offsets.end(), i) -
           s.data.seq_offsets.begin();
  };
  std::set<int64_t> eval_seqs;
  for (int64_t i : a.eval) eval_seqs.insert(seq_of(i));
  EXPECT_EQ(static_cast<int64_t>(eval_seqs.size()), a.n_eval_seqs);
  for (int64_t i : a.train) EXPECT_EQ(eval_seqs.count(seq_of(i)), 0u);
  EXPECT_EQ(split_positions(s.data, 0.0, 7).eval.size(), 0u);
  EXPECT_EQ(split_positions(s.data, 0.001, 7).n_eval_seqs, 1);  // at least one
}

// ---- optimizer -----------------------------------------------------------------------------

TEST(AdamW, OneUpdateByHand) {
  ReDrafterWeights w = make_redrafter({2, 1, 0, 1, 4}, {3}, "t");  // w_embed [1,2], w_state [1,1]
  w.w_embed = {1.0f, -2.0f};
  w.b_state = {0.5f};
  ReDrafterWeights g = zeros_like(w);
  g.w_embed = {0.1f, -0.3f};
  g.b_state = {2.0f};
  AdamWState st = make_adamw_state(w);
  AdamWOptions o;
  o.weight_decay = 0.1;
  adamw_update(w, g, st, 0.01, o, nullptr);
  // t = 1: m̂ = g, v̂ = g², step = lr g / (|g| + eps) = lr sign(g); decay lr wd w on matrices
  EXPECT_NEAR(w.w_embed[0], 1.0 - 0.01 - 0.01 * 0.1 * 1.0, 1e-6);
  EXPECT_NEAR(w.w_embed[1], -2.0 + 0.01 + 0.01 * 0.1 * 2.0, 1e-6);
  EXPECT_NEAR(w.b_state[0], 0.5 - 0.01, 1e-6);  // no decay on biases
  EXPECT_NEAR(st.m.w_embed[0], 0.1 * 0.1, 1e-7);
  EXPECT_NEAR(st.v.w_embed[1], 0.001 * 0.09, 1e-8);
  EXPECT_EQ(st.t, 1);
}

TEST(AdamW, ClippingAndSchedule) {
  ReDrafterWeights g = make_redrafter({2, 1, 0, 1, 4}, {3}, "t");
  g.w_embed = {3.0f, 0.0f};
  g.b_state = {4.0f};
  EXPECT_NEAR(clip_grad_norm(g, 1.0), 5.0, 1e-9);
  EXPECT_NEAR(global_grad_norm(g), 1.0, 1e-6);
  EXPECT_NEAR(g.w_embed[0], 0.6, 1e-6);
  EXPECT_NEAR(clip_grad_norm(g, 10.0), 1.0, 1e-6);  // below the bound: unchanged
  EXPECT_NEAR(g.w_embed[0], 0.6, 1e-6);
  // warmup 10 of 110: linear to the peak, then cosine to lr_min at the last update
  EXPECT_NEAR(lr_at(0, 110, 10, 1e-3, 1e-5), 1e-4, 1e-12);
  EXPECT_NEAR(lr_at(9, 110, 10, 1e-3, 1e-5), 1e-3, 1e-12);
  EXPECT_NEAR(lr_at(10, 110, 10, 1e-3, 1e-5), 1e-3, 1e-12);
  EXPECT_NEAR(lr_at(109, 110, 10, 1e-3, 1e-5), 1e-5, 1e-12);
  const double mid = lr_at(10 + 99 / 2, 110, 10, 1e-3, 0.0);
  EXPECT_NEAR(mid, 0.5e-3, 1e-5);
}

TEST(AdamW, KernelVariantsAndThreadCountsGiveTheSameBits) {
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : {1, 7, 16, 33, 1000}) {
    std::vector<float> g(n), w(n), m(n), v(n);
    for (int64_t i = 0; i < n; ++i) {
      g[i] = normal(gen);
      w[i] = normal(gen);
      m[i] = 0.1f * normal(gen);
      v[i] = std::fabs(0.01f * normal(gen));
    }
    const AdamWStep s{0.9f, 0.1f, 0.999f, 0.001f, 1e-3f, 3.2f, 1e-8f, 1e-5f, 0.7f};
    std::vector<float> w1 = w, m1 = m, v1 = v, w2 = w, m2 = m, v2 = v;
    adamw_kernel(Isa::kScalar, s, n, g.data(), w1.data(), m1.data(), v1.data());
    const double ref = sum_squares_kernel(Isa::kScalar, g.data(), n);
    if (isa_supported(Isa::kAvx512)) {
      adamw_kernel(Isa::kAvx512, s, n, g.data(), w2.data(), m2.data(), v2.data());
      EXPECT_EQ(0, std::memcmp(w1.data(), w2.data(), n * 4)) << n;
      EXPECT_EQ(0, std::memcmp(m1.data(), m2.data(), n * 4)) << n;
      EXPECT_EQ(0, std::memcmp(v1.data(), v2.data(), n * 4)) << n;
      EXPECT_EQ(ref, sum_squares_kernel(Isa::kAvx512, g.data(), n)) << n;
    }
    double exact = 0;
    for (float x : g) exact += double(x) * x;
    EXPECT_NEAR(ref, exact, 1e-12 * exact);
    // the update itself: one element by hand
    const float g0 = g[0] * 0.7f, m0 = 0.9f * m[0] + 0.1f * g0, v0 = 0.999f * v[0] + 0.001f * g0 * g0;
    EXPECT_NEAR(w1[0], w[0] - (1e-3f * m0 / (std::sqrt(v0) * 3.2f + 1e-8f) + 1e-5f * w[0]), 1e-6);
  }
  // The norm over a head, 1 or 2 threads.
  const Synthetic syn = make_synthetic(4, 10, 40, 50, 3);
  ReDrafterWeights head = fresh_head(syn, 70, 2, 45, 9);
  ThreadPool p2(2);
  EXPECT_EQ(global_grad_norm(head, nullptr), global_grad_norm(head, &p2));
}

// ---- checkpoints ---------------------------------------------------------------------------

TEST(TrainCheckpoint, RoundTripAndErrors) {
  const Synthetic s = make_synthetic(4, 10, 6, 12, 3);
  TrainCheckpoint c;
  c.weights = fresh_head(s, 5, 2, 10, 4);
  c.adam = make_adamw_state(c.weights);
  c.adam.m.w_out[3] = 0.25f;
  c.adam.v.b_block[1][2] = 7.0f;
  c.adam.t = 17;
  c.step = 17;
  c.epoch_rng = Rng(99).state();
  c.config = "a=1\nb=2";
  c.elapsed_s = 1.5;
  const std::string path = temp_path("ckpt.safetensors");
  save_train_checkpoint(path, c);
  TrainCheckpoint r = load_train_checkpoint(path);
  EXPECT_TRUE(same_bits(r.weights, c.weights));
  EXPECT_TRUE(same_bits(r.adam.m, c.adam.m));
  EXPECT_TRUE(same_bits(r.adam.v, c.adam.v));
  EXPECT_EQ(r.adam.t, 17);
  EXPECT_EQ(r.step, 17);
  EXPECT_EQ(r.epoch_rng, c.epoch_rng);
  EXPECT_EQ(r.config, c.config);
  EXPECT_EQ(r.weights.draft_vocab, c.weights.draft_vocab);
  // A head file is not a checkpoint.
  save_redrafter(path, c.weights);
  EXPECT_THROW(load_train_checkpoint(path), Error);
  std::filesystem::remove(path);
  EXPECT_THROW(load_train_checkpoint(path), Error);
}

// ---- the training loop ---------------------------------------------------------------------

ReDrafterTrainOptions small_options() {
  ReDrafterTrainOptions o;
  o.steps = 3;
  o.batch = 64;
  o.epochs = 2;
  o.lr = 3e-3;
  o.seed = 5;
  o.eval_fraction = 0.05;
  return o;
}

TEST(TrainRedrafter, LossFallsOnLearnableData) {
  const Synthetic s = make_synthetic(300, 40, 16, 40, 11);
  ReDrafterWeights w = fresh_head(s, 16, 1, 32, 5);
  ReDrafterTrainOptions o = small_options();
  o.epochs = 3;
  ThreadPool pool(2);
  const PositionSplit split = split_positions(s.data, o.eval_fraction, o.seed);
  const ReDrafterLossStats before =
      evaluate_redrafter(w, s.data, s.embedding, split.eval, o.steps, 256, &pool);
  std::vector<double> evals;
  const auto t0 = std::chrono::steady_clock::now();
  const ReDrafterTrainReport r =
      train_redrafter(w, s.data, s.embedding, o, &pool, [&](const ReDrafterTrainEvent& e) {
        if (e.kind == ReDrafterTrainEvent::Kind::kEval) evals.push_back(e.eval->mean_loss());
      });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.n_eval_positions, static_cast<int64_t>(split.eval.size()));
  std::printf("eval loss %.3f -> %.3f per target; step accuracy %.2f %.2f %.2f; accepted %.2f; "
              "%lld updates in %.2f s\n",
              before.mean_loss(), r.eval.mean_loss(), r.eval.accuracy(0), r.eval.accuracy(1),
              r.eval.accuracy(2), r.eval.accepted_length(), (long long)r.steps, seconds);
  // ln 32 = 3.47 at chance; the chain's entropy is 0.56 nats (+ out-of-vocabulary misses)
  EXPECT_GT(before.mean_loss(), 2.5);
  EXPECT_LT(r.eval.mean_loss(), 1.0);
  EXPECT_LT(r.eval.mean_loss(), 0.4 * before.mean_loss());
  EXPECT_GT(r.eval.accuracy(0), 0.55);
  EXPECT_GT(r.eval.accuracy(2), 0.55);
  EXPECT_GT(r.eval.accepted_length(), 1.0);
  ASSERT_GE(evals.size(), 5u);
  EXPECT_LT(evals.back(), evals.front());  // (its time is printed, never asserted)
}

TEST(TrainRedrafter, ResumeGivesTheSameBitsAsAnUninterruptedRun) {
  const Synthetic s = make_synthetic(60, 30, 8, 20, 21);
  ThreadPool pool(2);
  ReDrafterTrainOptions o = small_options();
  o.batch = 50;
  o.checkpoint_every = 4;
  o.checkpoint_path = temp_path("resume_a.safetensors");
  ReDrafterWeights full = fresh_head(s, 8, 2, 16, 5);
  const ReDrafterTrainReport r_full = train_redrafter(full, s.data, s.embedding, o, &pool);
  ASSERT_TRUE(r_full.finished);
  const int64_t per_epoch = r_full.total_steps / o.epochs;
  ASSERT_GT(per_epoch, 3);
  // Interrupted mid-epoch, at an epoch boundary, and after a checkpoint written between them.
  for (int64_t stop : {int64_t{3}, per_epoch, per_epoch + 1}) {
    ReDrafterTrainOptions oa = o;
    oa.checkpoint_path = temp_path("resume_b.safetensors");
    oa.stop_after = stop;
    ReDrafterWeights w = fresh_head(s, 8, 2, 16, 5);
    const ReDrafterTrainReport first = train_redrafter(w, s.data, s.embedding, oa, &pool);
    ASSERT_FALSE(first.finished);
    ASSERT_EQ(first.steps, stop);
    ReDrafterTrainOptions ob = oa;
    ob.stop_after = 0;
    ob.resume = true;
    ReDrafterWeights resumed = fresh_head(s, 8, 2, 16, 77);  // replaced by the checkpoint's
    ThreadPool pool1(1);  // and with another thread count
    const ReDrafterTrainReport second = train_redrafter(resumed, s.data, s.embedding, ob, &pool1);
    EXPECT_TRUE(second.finished);
    EXPECT_EQ(second.resumed_from, stop);
    EXPECT_TRUE(same_bits(resumed, full)) << "stopped after " << stop;
    EXPECT_EQ(second.eval.loss_sum, r_full.eval.loss_sum);
    std::filesystem::remove(oa.checkpoint_path);
  }
  std::filesystem::remove(o.checkpoint_path);
}

TEST(TrainRedrafter, SameSeedSameWeightsWithOneOrTwoThreads) {
  const Synthetic s = make_synthetic(40, 30, 8, 20, 31);
  ReDrafterTrainOptions o = small_options();
  ThreadPool p1(1), p2(2);
  ReDrafterWeights a = fresh_head(s, 8, 2, 16, 5), b = fresh_head(s, 8, 2, 16, 5),
                   c = fresh_head(s, 8, 2, 16, 5);
  train_redrafter(a, s.data, s.embedding, o, &p1);
  train_redrafter(b, s.data, s.embedding, o, &p2);
  train_redrafter(c, s.data, s.embedding, o, nullptr);
  EXPECT_TRUE(same_bits(a, b));
  EXPECT_TRUE(same_bits(a, c));
  ReDrafterTrainOptions o2 = o;
  o2.seed = 6;  // another shuffle and split
  ReDrafterWeights d = fresh_head(s, 8, 2, 16, 5);
  train_redrafter(d, s.data, s.embedding, o2, &p2);
  EXPECT_FALSE(same_bits(a, d));
}

TEST(TrainRedrafter, RefusesACheckpointOfAnotherRunAndBadInput) {
  const Synthetic s = make_synthetic(20, 20, 8, 20, 41);
  ReDrafterTrainOptions o = small_options();
  o.checkpoint_path = temp_path("other.safetensors");
  o.stop_after = 2;
  ReDrafterWeights w = fresh_head(s, 8, 1, 16, 5);
  train_redrafter(w, s.data, s.embedding, o, nullptr);
  o.stop_after = 0;
  o.resume = true;
  o.lr = 1e-4;
  try {
    train_redrafter(w, s.data, s.embedding, o, nullptr);
    ADD_FAILURE() << "resumed another run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lr: checkpoint"), std::string::npos) << e.what();
  }
  std::filesystem::remove(o.checkpoint_path);
  EXPECT_THROW(train_redrafter(w, s.data, s.embedding, o, nullptr), Error);  // no checkpoint
  ReDrafterTrainOptions bad = small_options();
  bad.batch = 0;
  EXPECT_THROW(train_redrafter(w, s.data, s.embedding, bad, nullptr), Error);
  // a dataset from another model: width and vocabulary
  ReDrafterWeights wide = make_redrafter({9, 4, 1, 16, 20}, w.draft_vocab, "x");
  std::vector<float> wide_emb(20 * 9, 0.0f);
  EXPECT_THROW(train_redrafter(wide, s.data, wide_emb, small_options(), nullptr), Error);
  Synthetic odd = s;
  odd.data.tokens[5] = 25;
  EXPECT_THROW(train_redrafter(w, odd.data, s.embedding, small_options(), nullptr), Error);
}

}  // namespace
}  // namespace specdec
