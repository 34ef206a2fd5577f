// specdec train-drafter: trains a drafter head for a target model by self-distillation.
//
//   prompts (--data, ShareGPT first turns) ─► distillation dataset (--dataset: built with the
//   target once - answers + hidden states - and reused) ─► draft vocabulary (the answers' most
//   frequent tokens) ─► head initialised from --seed ─► train_redrafter (checkpoints every
//   --checkpoint-every updates, --resume continues one exactly) ─► --out (safetensors, with the
//   command line and the training facts as "train.*" metadata)
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/matmul.h"
#include "backend/cpu/thread_pool.h"
#include "bench_spec.h"
#include "cli_common.h"
#include "commands.h"
#include "drafter/distill_data.h"
#include "drafter/medusa_weights.h"
#include "drafter/redrafter_weights.h"
#include "drafter/train/medusa_grad.h"
#include "drafter/train/medusa_trainer.h"
#include "drafter/train/redrafter_init.h"
#include "drafter/train/redrafter_trainer.h"
#include "model/gguf.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"
#include "util/paths.h"

namespace specdec::cli {
namespace {

struct TrainDrafterOptions {
  std::string model;
  std::string kind = "redrafter";
  std::string data;          // prompts (JSONL of strings)
  std::vector<std::string> datasets;  // distillation dataset files (shards, joined in order)
  std::string out;
  std::string checkpoint;    // default: out + ".ckpt"
  std::string dtype = "f16";
  std::string init_out = "random";
  int threads = 0;
  // dataset
  int max_prompts = 0;
  int first_prompt = 0;
  int max_new_tokens = 256;
  int max_prompt_tokens = 512;
  bool no_chat = false;
  bool hidden_passes = false;
  bool dataset_only = false;
  // head
  int draft_vocab = 4096;
  int state_dim = 256;
  int blocks = 2;
  int heads = 4;             // medusa
  // training
  ReDrafterTrainOptions train;
  double init_scale = 1.0;
};

std::string format_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  const int64_t t = std::llround(s);
  return fmt::format("{}:{:02d}:{:02d}", t / 3600, static_cast<int>(t / 60 % 60),
                     static_cast<int>(t % 60));
}

// This process's command line as typed (arguments joined by spaces, quoted when needed).
std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out;
  size_t pos = 0;
  while (pos < raw.size()) {
    const size_t end = raw.find('\0', pos);
    std::string arg = raw.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    if (!out.empty()) out += ' ';
    if (arg.empty() || arg.find_first_of(" \t\"'$\\") != std::string::npos) {
      std::string q = "'";
      for (char c : arg) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      out += q + "'";
    } else {
      out += arg;
    }
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return out;
}

std::string file_stem(const std::string& path) { return std::filesystem::path(path).stem().string(); }

void check_options(const TrainDrafterOptions& o) {
  if (o.kind != "redrafter" && o.kind != "medusa") {
    throw Error(fmt::format("--kind: unknown head kind '{}' (redrafter or medusa)", o.kind));
  }
  if (o.out.empty() && !o.dataset_only) {
    throw Error("--out: the head file to write is required (or --dataset-only)");
  }
  const std::string stem = file_stem(o.data);
  if (stem.rfind("humaneval", 0) == 0 || stem.rfind("mtbench", 0) == 0) {
    throw Error(fmt::format(
        "--data {}: a benchmark prompt set; train on other prompts (e.g. ShareGPT: "
        "scripts/fetch-prompts.sh sharegpt) so that benchmark figures stay honest",
        o.data));
  }
  if (o.kind == "medusa" && o.train.soft_labels > 0) {
    throw Error("--soft-labels: ReDrafter heads only for now");
  }
  if (o.out.size() >= 5 && o.out.substr(o.out.size() - 5) == ".ckpt") {
    throw Error("--out: the head file must not end in .ckpt (that is the checkpoint's name)");
  }
}

// The dataset: loaded when the file exists (checked against the target), else built from the
// prompts and saved there.
DistillDataset get_dataset(const TrainDrafterOptions& o, const std::string& path, Model& model,
                           ThreadPool* pool) {
  if (std::filesystem::exists(path)) {
    fmt::print(stderr, "dataset: reusing {}\n", path);
    DistillDataset d = load_distill_dataset(path);
    const std::string target = distill_target(d);
    if (!target.empty() && target != model.fingerprint()) {
      throw Error(fmt::format(
          "{}: this dataset was made with another model ({}; this one is {}); remove it or "
          "pass another --dataset",
          path, target, model.fingerprint()));
    }
    if (d.dim != model.config().dim) {
      throw Error(fmt::format("{}: hidden states {} wide, the model's are {}", path, d.dim,
                              model.config().dim));
    }
    return d;
  }
  const std::string data = o.data.empty() ? cache_dir() + "/prompts/sharegpt.jsonl" : o.data;
  if (!std::filesystem::exists(data)) {
    throw Error(fmt::format(
        "--data {}: no such prompts file (scripts/fetch-prompts.sh sharegpt writes the default)",
        data));
  }
  const std::vector<std::string> prompts = read_prompts_file(data);
  std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(model.file());
  DistillOptions d_opt;
  d_opt.max_prompts = o.max_prompts;
  d_opt.first_prompt = o.first_prompt;
  d_opt.max_new_tokens = o.max_new_tokens;
  d_opt.max_prompt_tokens = o.max_prompt_tokens;
  d_opt.seed = o.train.seed;
  d_opt.chat = !o.no_chat;
  d_opt.hidden_passes = o.hidden_passes;
  if (static_cast<size_t>(o.first_prompt) >= prompts.size()) {
    throw Error(fmt::format("--first-prompt {}: {} holds {} prompts", o.first_prompt, data,
                            prompts.size()));
  }
  const size_t available = prompts.size() - static_cast<size_t>(o.first_prompt);
  fmt::print(stderr,
             "dataset: answering {} prompts of {} from index {} with the target (max {} new "
             "tokens)\n",
             o.max_prompts > 0 ? std::min<size_t>(o.max_prompts, available) : available, data,
             o.first_prompt, o.max_new_tokens);
  const auto t0 = std::chrono::steady_clock::now();
  double last_shown = -1;
  DistillTimings timings;
  DistillDataset d = build_distill_dataset(
      model, *tok, prompts, d_opt, pool, [&](int64_t done, int64_t total) {
        const double s = seconds_since(t0);
        if (done < total && s - last_shown < 0.5) return;
        last_shown = s;
        fmt::print(stderr, "\rdataset: {}/{} answers, {} elapsed, ETA {}   ", done, total,
                   format_duration(s),
                   format_duration(done > 0 ? s / static_cast<double>(done) * (total - done) : -1));
      },
      &timings);
  const nlohmann::json facts = nlohmann::json::parse(d.facts, nullptr, false);
  fmt::print(stderr,
             "\ndataset: {} sequences, {} tokens in {}; saving {} (a next shard starts at "
             "--first-prompt {})\n",
             d.n_seqs(), d.n_tokens(), format_duration(seconds_since(t0)), path,
             facts.is_object() && facts.contains("next_prompt") ? facts["next_prompt"].dump()
                                                                : "?");
  // Where the time went: the engine's answers (prefill + batched decode, the hidden rows with
  // them) and, with --hidden-passes, the passes over prompt + answer (prefill-shaped chunks).
  fmt::print(stderr, "dataset: answers {} ({} prompt + {} answer tokens, {:.1f} answer tok/s)",
             format_duration(timings.answer_s), timings.prompt_tokens, timings.answer_tokens,
             timings.answer_s > 0 ? static_cast<double>(timings.answer_tokens) / timings.answer_s
                                  : 0.0);
  if (o.hidden_passes) {
    fmt::print(stderr, ", hidden passes {} ({} tokens, {:.1f} tok/s)",
               format_duration(timings.hidden_s), timings.hidden_tokens,
               timings.hidden_s > 0
                   ? static_cast<double>(timings.hidden_tokens) / timings.hidden_s
                   : 0.0);
  }
  fmt::print(stderr, "\n");
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  save_distill_dataset(path, d);
  return d;
}

// The target's output rows of the draft vocabulary as floats: [V_d, dim] (its "output.weight",
// or the token embedding when the two are tied).
std::vector<float> target_output_rows(const Model& model, const std::vector<int32_t>& vocab) {
  const int64_t dim = model.config().dim;
  std::vector<float> rows(vocab.size() * dim);
  const GgufTensor* out = model.file().find_tensor("output.weight");
  if (!out) {
    model.embed_tokens(vocab, rows.data());
    return rows;
  }
  WeightMatrix w;
  w.type = out->type;
  w.data = out->data;
  w.cols = out->ne[0];
  w.rows = out->ne[1];
  w.row_bytes = ggml_row_bytes(out->type, w.cols);
  for (size_t v = 0; v < vocab.size(); ++v) dequantize_row(w, vocab[v], rows.data() + v * dim);
  return rows;
}

void run_train_drafter(TrainDrafterOptions& o) {
  check_options(o);
  const std::string cmdline = command_line();
  const std::string path = resolve_model_path(o.model);
  std::unique_ptr<Model> model = load_model_with_progress(path, /*quiet=*/false);
  ThreadPool pool(compute_threads(o.threads));
  const std::string data_name = o.data.empty() ? "sharegpt" : file_stem(o.data);
  std::vector<std::string> dataset_paths = o.datasets;
  if (dataset_paths.empty()) {
    dataset_paths.push_back(fmt::format("{}/distill/{}-{}-p{}-n{}{}.sdds", cache_dir(),
                                        file_stem(path), data_name, o.max_prompts,
                                        o.max_new_tokens,
                                        o.first_prompt > 0
                                            ? fmt::format("-from{}", o.first_prompt)
                                            : std::string()));
  }
  if (dataset_paths.size() > 1) {  // shards: all must exist (each is built by its own run)
    for (const std::string& p : dataset_paths) {
      if (!std::filesystem::exists(p)) {
        throw Error(fmt::format(
            "--dataset {}: no such file; with several --dataset files every one must exist "
            "(build a shard with one --dataset and --first-prompt)",
            p));
      }
    }
  }
  DistillDataset data = get_dataset(o, dataset_paths[0], *model, &pool);
  for (size_t i = 1; i < dataset_paths.size(); ++i) {
    append_distill_dataset(data, get_dataset(o, dataset_paths[i], *model, &pool));
  }
  if (dataset_paths.size() > 1) {
    fmt::print(stderr, "dataset: {} shards joined: {} sequences, {} tokens\n",
               dataset_paths.size(), data.n_seqs(), data.n_tokens());
  }
  std::string dataset_path;  // the files' names, for messages and the head's metadata
  for (const std::string& p : dataset_paths) {
    dataset_path += (dataset_path.empty() ? "" : ",") + p;
  }
  if (o.dataset_only) {
    fmt::print(stderr, "dataset: {} sequences, {} tokens; no training (--dataset-only)\n",
               data.n_seqs(), data.n_tokens());
    return;
  }

  const ModelConfig& cfg = model->config();
  std::vector<int32_t> vocab = choose_draft_vocab(data, o.draft_vocab);
  if (vocab.empty()) throw Error(fmt::format("{}: the dataset has no answer tokens", dataset_path));
  std::vector<float> out_rows;  // [V_d, dim] the target's output rows of the draft vocabulary
  if (o.init_out == "target" || o.train.soft_labels > 0) {
    out_rows = target_output_rows(*model, vocab);
  }
  o.train.soft_rows = out_rows;
  if (o.checkpoint.empty()) o.checkpoint = o.out + ".ckpt";
  for (const std::string& file : {o.out, o.checkpoint}) {  // before hours of training, not after
    const std::filesystem::path parent = std::filesystem::path(file).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
  }
  o.train.checkpoint_path = o.checkpoint;
  bool progress_shown = false;
  const char* unit = o.kind == "medusa" ? "head" : "step";
  auto on_event = [&](const ReDrafterTrainEvent& e) {
    if (e.kind == ReDrafterTrainEvent::Kind::kProgress) {
      fmt::print(stderr,
                 "\rstep {}/{} epoch {}/{} | loss {:.4f} | lr {:.2e} | |g| {:.3f} | {:.0f} tok/s "
                 "| {} elapsed, ETA {}   ",
                 e.step, e.total_steps, e.epoch + 1, o.train.epochs, e.train_loss, e.lr,
                 e.grad_norm, e.positions_per_s, format_duration(e.elapsed_s),
                 format_duration(e.eta_s));
      progress_shown = true;
    } else if (e.kind == ReDrafterTrainEvent::Kind::kEval) {
      std::string acc;
      for (size_t k = 0; k < e.eval->n_targets.size(); ++k) {
        acc += fmt::format("{}{:.3f}", k ? " " : "", e.eval->accuracy(static_cast<int>(k)));
      }
      fmt::print(stderr, "{}eval @ {}: loss {:.4f} per target | accuracy by {} {} | greedy "
                         "accepted {:.3f}\n",
                 progress_shown ? "\n" : "", e.step, e.eval->mean_loss(), unit, acc,
                 e.eval->accepted_length());
      progress_shown = false;
    }
  };
  // The training facts ("train.*"), the same for both kinds.
  auto train_info = [&](const ReDrafterTrainReport& r, std::map<std::string, std::string>& info,
                        std::string& acc) {
    for (size_t k = 0; k < r.eval.n_targets.size(); ++k) {
      acc += fmt::format("{}{:.4f}", k ? "," : "", r.eval.accuracy(static_cast<int>(k)));
    }
    int64_t answer_tokens = 0, in_vocab = 0;
    std::vector<uint8_t> in(cfg.n_vocab, 0);
    for (int32_t t : vocab) in[t] = 1;
    for (int64_t s = 0; s < data.n_seqs(); ++s) {
      for (int64_t i = data.seq_offsets[s] + data.n_prompt[s]; i < data.seq_offsets[s + 1]; ++i) {
        ++answer_tokens;
        in_vocab += in[data.tokens[i]];
      }
    }
    info["train.command"] = cmdline;
    std::string names;
    for (const std::string& p : dataset_paths) {
      names += (names.empty() ? "" : ",") + std::filesystem::path(p).filename().string();
    }
    info["train.dataset"] = names;
    info["train.dataset_facts"] = data.facts;
    info["train.sequences"] = fmt::format("{} train, {} held out", r.n_train_seqs, r.n_eval_seqs);
    info["train.positions"] = std::to_string(r.n_train_positions);
    info["train.positions_trained"] = std::to_string(r.positions_trained);
    info["train.draft_vocab_coverage"] =
        fmt::format("{:.4f}", answer_tokens ? double(in_vocab) / answer_tokens : 0.0);
    info["train.updates"] = std::to_string(r.steps);
    info["train.batch"] = std::to_string(o.train.batch);
    info["train.epochs"] = std::to_string(o.train.epochs);
    info["train.lr"] = fmt::format("{}", o.train.lr);
    info["train.seed"] = std::to_string(o.train.seed);
    info["train.init_out"] = o.init_out;
    info["train.soft_labels"] = fmt::format("{}", o.train.soft_labels);
    info["train.seconds"] = fmt::format("{:.1f}", r.seconds);
    info["train.positions_per_s"] = fmt::format("{:.0f}", r.positions_per_s);
    info["train.threads"] = std::to_string(pool.size());
    if (r.eval.n_positions > 0) {
      info["train.eval_positions"] = std::to_string(r.eval.n_positions);
      info["train.eval_loss"] = fmt::format("{:.4f}", r.eval.mean_loss());
      info["train.eval_accuracy"] = acc;
      info["train.eval_accepted_length"] = fmt::format("{:.4f}", r.eval.accepted_length());
    }
  };
  auto report_end = [&](const ReDrafterTrainReport& r, const std::string& acc) {
    fmt::print(stderr, "wrote {} ({} updates, {} positions trained in {}, {:.0f} tok/s); ", o.out,
               r.steps, r.positions_trained, format_duration(r.seconds), r.positions_per_s);
    if (r.eval.n_positions > 0) {
      fmt::print(stderr, "held-out loss {:.4f}, accuracy by {} {}, greedy accepted {:.3f}\n",
                 r.eval.mean_loss(), unit, acc, r.eval.accepted_length());
    } else {
      fmt::print(stderr, "no held-out sequences (--eval-fraction 0)\n");
    }
  };

  if (o.kind == "medusa") {
    const MedusaShape mshape{cfg.dim, o.heads, static_cast<int>(vocab.size()), cfg.n_vocab};
    MedusaWeights mw = make_medusa(mshape, vocab, model->fingerprint());
    init_medusa(mw, o.train.seed, o.init_scale, o.init_out == "zero" ? 0.0 : -1.0,
                o.init_out == "target" ? out_rows.data() : nullptr);
    o.train.checkpoint_every = 0;  // not supported for Medusa yet (train_medusa refuses resume)
    o.train.checkpoint_path.clear();
    fmt::print(stderr,
               "head: medusa dim {} heads {} draft vocabulary {} ({:.2f}M parameters); {} "
               "threads\n",
               mshape.dim, mshape.n_heads, mshape.n_draft_vocab, mshape.num_params() / 1e6,
               pool.size());
    const ReDrafterTrainReport r = train_medusa(mw, data, o.train, &pool, on_event);
    if (progress_shown) fmt::print(stderr, "\n");
    if (!r.finished) {
      fmt::print(stderr, "stopped after {} of {} updates (--stop-after); nothing written\n",
                 r.steps, r.total_steps);
      return;
    }
    std::string acc;
    train_info(r, mw.info, acc);
    mw.info["train.heads"] = std::to_string(o.heads);
    save_medusa(o.out, mw, o.dtype == "f32" ? StDtype::kF32 : StDtype::kF16);
    report_end(r, acc);
    return;
  }

  const ReDrafterShape shape{cfg.dim, o.state_dim, o.blocks, static_cast<int>(vocab.size()),
                             cfg.n_vocab};
  ReDrafterWeights w = make_redrafter(shape, vocab, model->fingerprint());
  ReDrafterInitOptions init;
  init.scale = o.init_scale;
  if (o.init_out == "zero") init.out_std = 0.0;
  init_redrafter(w, o.train.seed, init,
                 o.init_out == "target" ? out_rows.data() : nullptr);
  std::vector<int32_t> all_ids(cfg.n_vocab);
  for (int i = 0; i < cfg.n_vocab; ++i) all_ids[i] = i;
  std::vector<float> embedding(static_cast<size_t>(cfg.n_vocab) * cfg.dim);  // [n_vocab, dim]
  model->embed_tokens(all_ids, embedding.data());
  fmt::print(stderr,
             "head: redrafter dim {} state {} blocks {} draft vocabulary {} ({:.2f}M parameters), "
             "{} steps; {} threads\n",
             shape.dim, shape.state_dim, shape.n_blocks, shape.n_draft_vocab,
             shape.num_params() / 1e6, o.train.steps, pool.size());
  const ReDrafterTrainReport r = train_redrafter(w, data, embedding, o.train, &pool, on_event);
  if (progress_shown) fmt::print(stderr, "\n");
  if (!r.finished) {
    fmt::print(stderr, "stopped after {} of {} updates; checkpoint {} (continue with --resume)\n",
               r.steps, r.total_steps, o.checkpoint);
    return;
  }
  std::string acc;
  train_info(r, w.info, acc);
  w.info["train.steps"] = std::to_string(o.train.steps);
  save_redrafter(o.out, w, o.dtype == "f32" ? StDtype::kF32 : StDtype::kF16);
  report_end(r, acc);
}

}  // namespace

void add_train_drafter_command(CLI::App& app) {
  auto o = std::make_shared<TrainDrafterOptions>();
  o->train.checkpoint_every = 500;
  CLI::App* cmd = app.add_subcommand(
      "train-drafter", "Train a drafter head (ReDrafter or Medusa) for a model by self-distillation");
  cmd->add_option("-m,--model", o->model,
                  "Target GGUF model (default: SmolLM2-135M-Instruct from the setup cache)");
  cmd->add_option("--kind", o->kind, "Head kind: redrafter or medusa")
      ->check(CLI::IsMember({"redrafter", "medusa"}))->capture_default_str();
  cmd->add_option("--heads", o->heads, "Medusa: K heads (head k drafts the token k+1 after the root)")
      ->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--data", o->data,
                  "Prompts, one JSON string a line (default: $SPECDEC_CACHE/prompts/"
                  "sharegpt.jsonl from scripts/fetch-prompts.sh sharegpt)");
  cmd->add_option("--dataset", o->datasets,
                  "Distillation dataset file: built from --data with the target if missing, "
                  "reused if present (default: $SPECDEC_CACHE/distill/MODEL-DATA-pN-nN.sdds); "
                  "repeat it to train on several shards joined in order (all must exist)");
  cmd->add_option("--out", o->out, "Head file to write (safetensors; not with --dataset-only)");
  cmd->add_flag("--dataset-only", o->dataset_only,
                "Build (or load and check) the dataset, then stop: a shard made ahead of training");
  cmd->add_option("--max-prompts", o->max_prompts, "Prompts answered for the dataset (0: all)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--first-prompt", o->first_prompt,
                  "Index in --data of the first prompt answered (a dataset shard: the previous "
                  "shard's run prints where the next one starts)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "Answer length at most")
      ->check(CLI::Range(2, 1 << 16))->capture_default_str();
  cmd->add_option("--max-prompt-tokens", o->max_prompt_tokens, "Longer prompts are skipped")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_flag("--no-chat", o->no_chat,
                "Answer the prompts as plain text (default: as a user turn of the chat template)");
  cmd->add_flag("--hidden-passes", o->hidden_passes,
                "Record the dataset's hidden states in one more pass over every prompt + answer "
                "(every row; ~40% more time) instead of while answering (the rows training reads)");
  cmd->add_option("--draft-vocab", o->draft_vocab,
                  "Draft vocabulary: the answers' N most frequent tokens")
      ->check(CLI::Range(2, 1 << 20))->capture_default_str();
  cmd->add_option("--state-dim", o->state_dim, "RNN state width S")
      ->check(CLI::Range(1, 1 << 14))->capture_default_str();
  cmd->add_option("--blocks", o->blocks, "Residual blocks")
      ->check(CLI::Range(0, 16))->capture_default_str();
  cmd->add_option("--steps,--beam-length", o->train.steps,
                  "C: tokens drafted after the root (teacher-forced steps)")
      ->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--epochs", o->train.epochs, "Passes over the training positions")
      ->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_option("--batch", o->train.batch, "Positions per update")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--lr", o->train.lr, "Peak learning rate (AdamW)")
      ->check(CLI::PositiveNumber)->check(finite_number())->capture_default_str();
  cmd->add_option("--lr-min", o->train.lr_min, "Learning rate at the end of the cosine")
      ->check(CLI::NonNegativeNumber)->check(finite_number())->capture_default_str();
  cmd->add_option("--warmup", o->train.warmup, "Warmup updates (-1: 2% of all, 1..500)")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 40))->capture_default_str();
  cmd->add_option("--weight-decay", o->train.adam.weight_decay, "AdamW weight decay (matrices)")
      ->check(CLI::NonNegativeNumber)->check(finite_number())->capture_default_str();
  cmd->add_option("--clip", o->train.clip, "Global gradient-norm clip (0: none)")
      ->check(CLI::NonNegativeNumber)->check(finite_number())->capture_default_str();
  cmd->add_option("--init-scale", o->init_scale, "Random matrices: std = scale / sqrt(fan_in)")
      ->check(CLI::PositiveNumber)->check(finite_number())->capture_default_str();
  cmd->add_option("--init-out", o->init_out,
                  "lm_head's start: random (std 1/sqrt(width)), zero (uniform drafts at first), "
                  "or target (the target's output rows of the draft vocabulary)")
      ->check(CLI::IsMember({"random", "zero", "target"}))->capture_default_str();
  cmd->add_option("--soft-labels", o->train.soft_labels,
                  "Knowledge distillation: weight of the target's own distribution in each "
                  "training label (the rest on the true token; 0: the true token only)")
      ->check(CLI::Range(0.0, 1.0))->check(finite_number())->capture_default_str();
  cmd->add_option("--seed", o->train.seed, "Seed of the initialisation, split and shuffles")
      ->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads (default: all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--eval-fraction", o->train.eval_fraction, "Sequences held out for evaluation")
      ->check(CLI::Range(0.0, 0.5))->check(finite_number())->capture_default_str();
  cmd->add_option("--eval-every", o->train.eval_every, "Updates between evaluations (0: ten a run)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--max-eval-positions", o->train.max_eval_positions,
                  "Held-out positions evaluated at most")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))->capture_default_str();
  cmd->add_option("--checkpoint-every", o->train.checkpoint_every,
                  "Updates between checkpoints (0: none)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--checkpoint", o->checkpoint, "Checkpoint file (default: OUT.ckpt)");
  cmd->add_flag("--resume", o->train.resume,
                "Continue from the checkpoint (the same options and data; ends with the same "
                "weights as an uninterrupted run)");
  cmd->add_option("--stop-after", o->train.stop_after,
                  "Stop after this many updates in all, leaving a checkpoint (0: run to the end)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "Float type of the head file: f16 or f32")
      ->check(CLI::IsMember({"f16", "f32"}))->capture_default_str();
  cmd->callback([o] { run_train_drafter(*o); });
}

}  // namespace specdec::cli
