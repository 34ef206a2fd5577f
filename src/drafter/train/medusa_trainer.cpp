// The training loop of Medusa heads (medusa_trainer.h).
#include "drafter/train/medusa_trainer.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "drafter/train/adamw.h"
#include "drafter/train/medusa_grad.h"
#include "drafter/train/train_data.h"
#include "sample/rng.h"
#include "util/check.h"

namespace specdec {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

ReDrafterLossStats evaluate_medusa(const MedusaWeights& w, const DistillDataset& data,
                                   std::span<const int64_t> positions, int batch,
                                   ThreadPool* pool) {
  ReDrafterLossStats total;
  total.reset(w.shape.n_heads);
  const std::vector<int32_t> draft_index = draft_index_map(w.draft_vocab, w.shape.n_target_vocab);
  MedusaGradient pass;
  ReDrafterBatch b;
  for (size_t i = 0; i < positions.size(); i += batch) {
    const size_t n = std::min<size_t>(batch, positions.size() - i);
    make_batch(data, positions.subspan(i, n), w.shape.n_heads, draft_index, &b);
    total.add(pass.run(w, b, nullptr, pool));
  }
  return total;
}

ReDrafterTrainReport train_medusa(MedusaWeights& w, const DistillDataset& data,
                                  const ReDrafterTrainOptions& o, ThreadPool* pool,
                                  const std::function<void(const ReDrafterTrainEvent&)>& on_event) {
  if (o.resume || o.checkpoint_every > 0) {
    throw Error("train-drafter --kind medusa: checkpoints and --resume are not supported yet "
                "(pass --checkpoint-every 0)");
  }
  if (o.batch < 1 || o.epochs < 1 || !(o.lr > 0) || o.lr_min < 0 || o.lr_min > o.lr) {
    throw Error("train-drafter: batch, epochs or learning rates out of range");
  }
  if (w.shape.n_heads < 1) throw Error("train-drafter: Medusa needs at least one head");
  if (data.dim != w.shape.dim) {
    throw Error(fmt::format("train-drafter: the dataset's hidden states are {} wide, the heads' "
                            "target is {} wide",
                            data.dim, w.shape.dim));
  }
  for (int32_t t : data.tokens) {
    if (t < 0 || t >= w.shape.n_target_vocab) {
      throw Error(fmt::format("train-drafter: the dataset holds token {} outside the target's "
                              "vocabulary of {}",
                              t, w.shape.n_target_vocab));
    }
  }
  const PositionSplit split = split_positions(data, o.eval_fraction, o.seed);
  if (split.train.empty()) throw Error("train-drafter: the dataset has no training position");
  const std::vector<int64_t> eval_positions = capped_positions(split.eval, o.max_eval_positions);
  const std::vector<int32_t> draft_index = draft_index_map(w.draft_vocab, w.shape.n_target_vocab);
  const int K = w.shape.n_heads;
  const int64_t n_train = static_cast<int64_t>(split.train.size());
  const int64_t per_epoch = (n_train + o.batch - 1) / o.batch;
  const int64_t total = per_epoch * o.epochs;
  const int64_t warmup = o.warmup >= 0 ? o.warmup : std::clamp<int64_t>(total / 50, 1, 500);
  const int64_t eval_every = o.eval_every > 0 ? o.eval_every : std::max<int64_t>(total / 10, 1);

  ReDrafterTrainReport report;
  report.total_steps = total;
  report.n_train_positions = n_train;
  report.n_eval_positions = static_cast<int64_t>(eval_positions.size());
  report.n_train_seqs = split.n_train_seqs;
  report.n_eval_seqs = split.n_eval_seqs;

  MedusaWeights m = medusa_zeros_like(w), v = medusa_zeros_like(w), grad = medusa_zeros_like(w);
  const std::vector<ParamTensor> pw = medusa_param_tensors(w), pm = medusa_param_tensors(m),
                                 pv = medusa_param_tensors(v), pg = medusa_param_tensors(grad);
  int64_t adam_t = 0;
  Rng rng(o.seed);
  MedusaGradient pass;
  ReDrafterBatch batch;
  std::vector<int64_t> order;
  const Clock::time_point t0 = Clock::now();
  Clock::time_point last_event = t0;
  double interval_loss = 0;
  int64_t interval_scored = 0;
  int64_t step = 0;
  ReDrafterTrainEvent ev;
  ev.total_steps = total;
  auto positions_done = [&](int64_t s) {
    return (s / per_epoch) * n_train + std::min((s % per_epoch) * o.batch, n_train);
  };
  auto fill_timing = [&](ReDrafterTrainEvent& e) {
    const double s = since(t0);
    e.step = step;
    e.elapsed_s = s;
    e.positions_per_s = s > 0 ? static_cast<double>(positions_done(step)) / s : 0;
    e.eta_s = step > 0 ? s / static_cast<double>(step) * static_cast<double>(total - step) : 0;
  };
  auto run_eval = [&]() {
    report.eval = evaluate_medusa(w, data, eval_positions, o.batch, pool);
    if (on_event) {
      ReDrafterTrainEvent e = ev;
      e.kind = ReDrafterTrainEvent::Kind::kEval;
      e.eval = &report.eval;
      fill_timing(e);
      on_event(e);
    }
  };
  int64_t order_epoch = -1;
  while (step < total && !(o.stop_after > 0 && step >= o.stop_after)) {
    const int64_t epoch = step / per_epoch;
    if (epoch != order_epoch) {  // the same order as train_redrafter's for the same seed
      order = split.train;
      shuffle_positions(order, rng);
      order_epoch = epoch;
    }
    const int64_t b0 = (step % per_epoch) * o.batch;
    const int64_t b1 = std::min(b0 + o.batch, n_train);
    make_batch(data, std::span<const int64_t>(order).subspan(b0, b1 - b0), K, draft_index, &batch);
    const ReDrafterLossStats st = pass.run(w, batch, &grad, pool);
    const double norm = global_grad_norm_tensors(pg, pool);
    const double lr = lr_at(step, total, warmup, o.lr, o.lr_min);
    adamw_update_tensors(pw, pg, pm, pv, adam_t, lr, o.adam, pool, clip_scale(norm, o.clip));
    ++step;
    for (size_t k = 0; k < st.loss_sum.size(); ++k) {
      interval_loss += st.loss_sum[k];
      interval_scored += st.n_scored[k];
    }
    ev.epoch = static_cast<int>(epoch);
    ev.lr = lr;
    ev.grad_norm = norm;
    if (on_event && (since(last_event) >= 1.0 || step == total)) {
      ev.kind = ReDrafterTrainEvent::Kind::kProgress;
      ev.train_loss = interval_scored ? interval_loss / static_cast<double>(interval_scored) : 0;
      fill_timing(ev);
      on_event(ev);
      interval_loss = 0;
      interval_scored = 0;
      last_event = Clock::now();
    }
    if (!eval_positions.empty() && step % eval_every == 0 && step < total) run_eval();
  }
  report.steps = step;
  report.finished = step == total;
  report.seconds = since(t0);
  report.positions_trained = positions_done(step);
  report.positions_per_s =
      report.seconds > 0 ? static_cast<double>(report.positions_trained) / report.seconds : 0;
  if (!eval_positions.empty()) run_eval();
  return report;
}

}  // namespace specdec
