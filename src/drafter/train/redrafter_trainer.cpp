// The training loop of a ReDrafter head (redrafter_trainer.h).
//
//   split (by seed) ─► per epoch: the training positions shuffled by the generator
//   ─► per update: make_batch ─► forward / backward ─► clip ─► lr_at ─► AdamW
//   ─► progress events, evaluations, checkpoints (weights, moments, step, generator)
#include "drafter/train/redrafter_trainer.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <xxhash.h>

#include "drafter/train/redrafter_params.h"
#include "drafter/train/train_checkpoint.h"
#include "drafter/train/train_data.h"
#include "sample/rng.h"
#include "util/check.h"

namespace specdec {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void check_options(const ReDrafterTrainOptions& o) {
  auto bad = [](const std::string& what) { throw Error("train-drafter: " + what); };
  if (o.steps < 1 || o.steps > 64) bad(fmt::format("steps must be 1..64 (got {})", o.steps));
  if (o.batch < 1) bad(fmt::format("batch must be at least 1 (got {})", o.batch));
  if (o.epochs < 1) bad(fmt::format("epochs must be at least 1 (got {})", o.epochs));
  if (!(o.lr > 0) || !(o.lr_min >= 0) || o.lr_min > o.lr) {
    bad(fmt::format("learning rates must satisfy 0 <= lr_min <= lr, lr > 0 (got {} / {})", o.lr,
                    o.lr_min));
  }
  if (!(o.eval_fraction >= 0 && o.eval_fraction < 1)) {
    bad(fmt::format("eval fraction must be in [0, 1) (got {})", o.eval_fraction));
  }
  if (!(o.adam.beta1 >= 0 && o.adam.beta1 < 1 && o.adam.beta2 >= 0 && o.adam.beta2 < 1 &&
        o.adam.eps > 0 && o.adam.weight_decay >= 0)) {
    bad("AdamW settings out of range (0 <= beta < 1, eps > 0, weight decay >= 0)");
  }
  if (!(o.soft_labels >= 0 && o.soft_labels <= 1)) {
    bad(fmt::format("soft label weight must be in [0, 1] (got {})", o.soft_labels));
  }
  if ((o.checkpoint_every > 0 || o.resume) && o.checkpoint_path.empty()) {
    bad("checkpoints need a checkpoint path");
  }
  if (o.checkpoint_every < 0 || o.eval_every < 0 || o.stop_after < 0) {
    bad("step counts must not be negative");
  }
}

void check_data(const ReDrafterWeights& w, const DistillDataset& d,
                std::span<const float> embedding) {
  if (d.dim != w.shape.dim) {
    throw Error(fmt::format(
        "train-drafter: the dataset's hidden states are {} wide, the head's target is {} wide "
        "(the dataset was made with another model)",
        d.dim, w.shape.dim));
  }
  if (static_cast<int64_t>(embedding.size()) != int64_t{w.shape.n_target_vocab} * w.shape.dim) {
    throw Error("train-drafter: the embedding table is not [n_target_vocab, dim]");
  }
  for (int32_t t : d.tokens) {
    if (t < 0 || t >= w.shape.n_target_vocab) {
      throw Error(fmt::format(
          "train-drafter: the dataset holds token {} outside the target's vocabulary of {} (the "
          "dataset was made with another model)",
          t, w.shape.n_target_vocab));
    }
  }
}

// The settings a resumed run must share with the checkpoint's run, as "key=value" lines.
std::string run_config(const ReDrafterWeights& w, const DistillDataset& d,
                       const ReDrafterTrainOptions& o, int64_t warmup) {
  const uint64_t tokens_hash = XXH64(d.tokens.data(), d.tokens.size() * sizeof(int32_t), 0) ^
                               XXH64(d.n_prompt.data(), d.n_prompt.size() * sizeof(int32_t), 1);
  const uint64_t vocab_hash =
      XXH64(w.draft_vocab.data(), w.draft_vocab.size() * sizeof(int32_t), 0);
  return fmt::format(
      "head={}x{}x{}x{}\ntarget={}\nsteps={}\nbatch={}\nepochs={}\nlr={}\nlr_min={}\nwarmup={}\n"
      "beta1={}\nbeta2={}\neps={}\nweight_decay={}\nclip={}\nseed={}\neval_fraction={}\n"
      "data={}:{}:{}:{:016x}\ndraft_vocab={:016x}\nsoft_labels={}",
      w.shape.dim, w.shape.state_dim, w.shape.n_blocks, w.shape.n_draft_vocab,
      w.target_fingerprint, o.steps, o.batch, o.epochs, o.lr, o.lr_min, warmup, o.adam.beta1,
      o.adam.beta2, o.adam.eps, o.adam.weight_decay, o.clip, o.seed, o.eval_fraction, d.n_seqs(),
      d.n_tokens(), d.dim, tokens_hash, vocab_hash, o.soft_labels);
}

std::map<std::string, std::string> config_lines(const std::string& config) {
  std::map<std::string, std::string> out;
  size_t pos = 0;
  while (pos <= config.size()) {
    size_t end = config.find('\n', pos);
    if (end == std::string::npos) end = config.size();
    const std::string line = config.substr(pos, end - pos);
    const size_t eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
    pos = end + 1;
  }
  return out;
}

void check_same_run(const std::string& path, const std::string& saved, const std::string& now) {
  if (saved == now) return;
  const auto a = config_lines(saved), b = config_lines(now);
  std::string diff;
  for (const auto& [k, v] : b) {
    const auto it = a.find(k);
    const std::string old = it == a.end() ? "(none)" : it->second;
    if (old != v) diff += fmt::format(" {}: checkpoint {}, now {};", k, old, v);
  }
  throw Error(fmt::format(
      "{}: this checkpoint belongs to another training run (differs in{}); resume with the same "
      "options and data, or start afresh without --resume",
      path, diff.empty() ? " format" : diff));
}

}  // namespace

ReDrafterLossStats evaluate_redrafter(const ReDrafterWeights& w, const DistillDataset& data,
                                      std::span<const float> embedding,
                                      std::span<const int64_t> positions, int steps, int batch,
                                      ThreadPool* pool) {
  ReDrafterLossStats total;
  total.reset(steps);
  const std::vector<int32_t> draft_index = draft_index_map(w.draft_vocab, w.shape.n_target_vocab);
  ReDrafterGradient pass;
  ReDrafterBatch b;
  for (size_t i = 0; i < positions.size(); i += batch) {
    const size_t n = std::min<size_t>(batch, positions.size() - i);
    make_batch(data, positions.subspan(i, n), steps, draft_index, &b);
    total.add(pass.run(w, embedding, b, nullptr, pool));
  }
  return total;
}

ReDrafterTrainReport train_redrafter(ReDrafterWeights& w, const DistillDataset& data,
                                     std::span<const float> embedding,
                                     const ReDrafterTrainOptions& o, ThreadPool* pool,
                                     const std::function<void(const ReDrafterTrainEvent&)>& on_event) {
  check_options(o);
  check_data(w, data, embedding);
  const PositionSplit split = split_positions(data, o.eval_fraction, o.seed);
  if (split.train.empty()) {
    throw Error(
        "train-drafter: the dataset has no training position (answers of at least two tokens "
        "are needed)");
  }
  const std::vector<int64_t> eval_positions = capped_positions(split.eval, o.max_eval_positions);
  const std::vector<int32_t> draft_index = draft_index_map(w.draft_vocab, w.shape.n_target_vocab);
  if (o.soft_labels > 0 && static_cast<int64_t>(o.soft_rows.size()) !=
                               int64_t{w.shape.n_draft_vocab} * w.shape.dim) {
    throw Error("train-drafter: soft labels need the target's output rows [V_d, dim]");
  }
  const int64_t n_train = static_cast<int64_t>(split.train.size());
  const int64_t per_epoch = (n_train + o.batch - 1) / o.batch;
  const int64_t total = per_epoch * o.epochs;
  const int64_t warmup = o.warmup >= 0 ? o.warmup : std::clamp<int64_t>(total / 50, 1, 500);
  const int64_t eval_every = o.eval_every > 0 ? o.eval_every : std::max<int64_t>(total / 10, 1);
  const std::string config = run_config(w, data, o, warmup);

  ReDrafterTrainReport report;
  report.total_steps = total;
  report.n_train_positions = n_train;
  report.n_eval_positions = static_cast<int64_t>(eval_positions.size());
  report.n_train_seqs = split.n_train_seqs;
  report.n_eval_seqs = split.n_eval_seqs;

  AdamWState adam = make_adamw_state(w);
  Rng rng(o.seed);
  int64_t step = 0;
  double elapsed_before = 0;
  if (o.resume) {
    if (!std::filesystem::exists(o.checkpoint_path)) {
      throw Error(fmt::format("{}: no checkpoint to resume from", o.checkpoint_path));
    }
    TrainCheckpoint ck = load_train_checkpoint(o.checkpoint_path);
    check_same_run(o.checkpoint_path, ck.config, config);
    if (ck.step > total) {
      throw Error(fmt::format("{}: the checkpoint is at update {} of a run of {}",
                              o.checkpoint_path, ck.step, total));
    }
    std::map<std::string, std::string> info = std::move(w.info);
    w = std::move(ck.weights);
    w.info = std::move(info);
    adam = std::move(ck.adam);
    step = ck.step;
    rng = Rng::from_state(ck.epoch_rng);
    elapsed_before = ck.elapsed_s;
    report.resumed_from = step;
  }

  ReDrafterGradient pass;
  ReDrafterBatch batch;
  std::vector<float> label_hidden;  // [C * B, dim] scratch of the soft labels
  ReDrafterWeights grad = zeros_like(w);
  std::vector<int64_t> order;
  Rng::State epoch_rng = rng.state();
  int64_t order_epoch = -1;
  const Clock::time_point t0 = Clock::now();
  Clock::time_point last_event = t0;
  const int64_t first_step = step;
  double interval_loss = 0;
  int64_t interval_scored = 0;
  ReDrafterTrainEvent ev;
  ev.total_steps = total;

  // Positions trained by the first s updates (an epoch's last batch may be short).
  auto positions_done = [&](int64_t s) {
    return (s / per_epoch) * n_train + std::min((s % per_epoch) * o.batch, n_train);
  };
  auto fill_timing = [&](ReDrafterTrainEvent& e) {
    const double run_s = seconds_since(t0);
    const int64_t done_here = step - first_step;
    e.step = step;
    e.elapsed_s = elapsed_before + run_s;
    e.positions_per_s =
        run_s > 0 ? static_cast<double>(positions_done(step) - positions_done(first_step)) / run_s
                  : 0;
    e.eta_s = done_here > 0
                  ? run_s / static_cast<double>(done_here) * static_cast<double>(total - step)
                  : 0;
  };
  auto save_checkpoint = [&]() {
    TrainCheckpoint ck;
    ck.weights = w;
    ck.adam = adam;
    ck.step = step;
    // The generator as it was when the epoch of the next update began (it is only drawn from
    // at the start of an epoch, so at an epoch boundary that is its current state).
    ck.epoch_rng = step % per_epoch == 0 ? rng.state() : epoch_rng;
    ck.config = config;
    ck.elapsed_s = elapsed_before + seconds_since(t0);
    save_train_checkpoint(o.checkpoint_path, ck);
    if (on_event) {
      ReDrafterTrainEvent e = ev;
      e.kind = ReDrafterTrainEvent::Kind::kCheckpoint;
      fill_timing(e);
      on_event(e);
    }
  };
  auto run_eval = [&]() {
    report.eval = evaluate_redrafter(w, data, embedding, eval_positions, o.steps, o.batch, pool);
    if (on_event) {
      ReDrafterTrainEvent e = ev;
      e.kind = ReDrafterTrainEvent::Kind::kEval;
      e.eval = &report.eval;
      fill_timing(e);
      on_event(e);
    }
  };

  while (step < total && !(o.stop_after > 0 && step >= o.stop_after)) {
    const int64_t epoch = step / per_epoch;
    if (epoch != order_epoch) {
      // On a resumed run the generator is the one saved for this epoch's start.
      epoch_rng = rng.state();
      order = split.train;
      shuffle_positions(order, rng);
      order_epoch = epoch;
    }
    const int64_t b0 = (step % per_epoch) * o.batch;
    const int64_t b1 = std::min(b0 + o.batch, n_train);
    const std::span<const int64_t> positions = std::span<const int64_t>(order).subspan(b0, b1 - b0);
    make_batch(data, positions, o.steps, draft_index, &batch);
    if (o.soft_labels > 0) {
      make_soft_labels(data, positions, o.soft_rows, static_cast<float>(o.soft_labels), &batch,
                       &label_hidden, pool);
    }
    const ReDrafterLossStats st = pass.run(w, embedding, batch, &grad, pool);
    const double norm = global_grad_norm(grad, pool);
    const double lr = lr_at(step, total, warmup, o.lr, o.lr_min);
    adamw_update(w, grad, adam, lr, o.adam, pool, clip_scale(norm, o.clip));
    ++step;
    for (size_t k = 0; k < st.loss_sum.size(); ++k) {
      interval_loss += st.loss_sum[k];
      interval_scored += st.n_scored[k];
    }
    ev.epoch = static_cast<int>(epoch);
    ev.lr = lr;
    ev.grad_norm = norm;
    if (on_event && (seconds_since(last_event) >= 1.0 || step == total)) {
      ev.kind = ReDrafterTrainEvent::Kind::kProgress;
      ev.train_loss = interval_scored ? interval_loss / static_cast<double>(interval_scored) : 0;
      fill_timing(ev);
      on_event(ev);
      interval_loss = 0;
      interval_scored = 0;
      last_event = Clock::now();
    }
    if (o.checkpoint_every > 0 && step % o.checkpoint_every == 0 && step < total) save_checkpoint();
    if (!eval_positions.empty() && step % eval_every == 0 && step < total) run_eval();
  }
  report.steps = step;
  report.finished = step == total;
  if (!o.checkpoint_path.empty() && (o.checkpoint_every > 0 || !report.finished)) {
    save_checkpoint();
  }
  const double run_s = seconds_since(t0);
  report.seconds = elapsed_before + run_s;
  report.positions_trained = positions_done(step);
  const int64_t here = positions_done(step) - positions_done(first_step);
  report.positions_per_s = run_s > 0 ? static_cast<double>(here) / run_s : 0;
  if (report.finished && !eval_positions.empty()) run_eval();
  return report;
}

}  // namespace specdec
