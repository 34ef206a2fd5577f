#include "bench_spec.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "cli_common.h"
#include "engine/generator.h"
#include "engine/pass_cost.h"
#include "util/check.h"

namespace specdec::cli {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// One plain and one speculative generation of the same prompt, each with its own generator and
// cache, run in turn: a run holds the machine (the pool and both cores) from one emitted token to
// the next and then hands it to the other, so host slowdowns of more than a few milliseconds hit
// both alike. Only the turn holder runs; the other's driver thread sleeps on the condition
// variable. decode_seconds of each run is replaced by the time it held the turn after its
// prefill. A run that finishes hands the machine over for good. Side `first` takes the first
// turn, driven by the calling thread.
void generate_interleaved(Generator* const gens[2], const std::vector<int32_t>& prompt,
                          const GenerationConfig* const configs[2], int first,
                          std::vector<int32_t> out[2], GenerationStats stats[2]) {
  using Clock = std::chrono::steady_clock;
  std::mutex mu;
  std::condition_variable cv;
  int turn = first;
  bool done[2] = {false, false};
  double held[2] = {0, 0};
  Clock::time_point since[2];
  auto wait_turn = [&](std::unique_lock<std::mutex>& lock, int side) {
    cv.wait(lock, [&] { return turn == side; });
    since[side] = Clock::now();
  };
  auto drive = [&](int side) {
    {
      std::unique_lock<std::mutex> lock(mu);
      wait_turn(lock, side);
    }
    auto hand_over = [&](int32_t) {
      std::unique_lock<std::mutex> lock(mu);
      held[side] += seconds_since(since[side]);
      if (!done[1 - side]) {
        turn = 1 - side;
        cv.notify_all();
        wait_turn(lock, side);
      } else {
        since[side] = Clock::now();
      }
      return true;
    };
    out[side] = gens[side]->generate(prompt, *configs[side], hand_over, &stats[side]);
    std::unique_lock<std::mutex> lock(mu);
    held[side] += seconds_since(since[side]);
    done[side] = true;
    turn = 1 - side;
    cv.notify_all();
  };
  std::thread second(drive, 1 - first);
  drive(first);
  second.join();
  for (int side = 0; side < 2; ++side) {
    stats[side].decode_seconds = held[side] - stats[side].prefill_seconds;
  }
}

// One turn decoded plainly and speculatively. Plain and speculative runs come in pairs,
// `repeats` pairs, the order within a pair alternating. The host's speed drifts, so each mode's
// time is the median of its runs, and the speedup is the median of the pairs' ratios (runs a
// second apart see the same host). Outputs and counts come from the first runs (greedy and
// seeded sampling replay exactly).
struct TurnResult {
  GenerationStats plain, spec;  // decode_seconds: the medians
  std::vector<int32_t> plain_out, spec_out;
  double speedup = 0;
};

TurnResult run_turn(Generator& gen, Generator& spec_gen, const GenerationConfig& plain,
                    const GenerationConfig& specd, const std::vector<int32_t>& tokens, int repeats,
                    bool interleave) {
  TurnResult t;
  std::vector<double> plain_times, spec_times, pair_ratios;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    GenerationStats ps_r, ss_r;
    std::vector<int32_t> a_r, b_r;
    if (interleave) {
      // Side 0 plain, side 1 speculative; which holds the first turn alternates by pair.
      Generator* const gens[2] = {&gen, &spec_gen};
      const GenerationConfig* const configs[2] = {&plain, &specd};
      std::vector<int32_t> outs[2];
      GenerationStats st[2];
      generate_interleaved(gens, tokens, configs, r % 2, outs, st);
      a_r = std::move(outs[0]);
      b_r = std::move(outs[1]);
      ps_r = st[0];
      ss_r = st[1];
    } else if (r % 2 == 0) {
      a_r = gen.generate(tokens, plain, nullptr, &ps_r);
      b_r = gen.generate(tokens, specd, nullptr, &ss_r);
    } else {
      b_r = gen.generate(tokens, specd, nullptr, &ss_r);
      a_r = gen.generate(tokens, plain, nullptr, &ps_r);
    }
    plain_times.push_back(ps_r.decode_seconds);
    spec_times.push_back(ss_r.decode_seconds);
    pair_ratios.push_back((ss_r.n_generated / ss_r.decode_seconds) /
                          (ps_r.n_generated / ps_r.decode_seconds));
    if (r == 0) {
      t.plain = ps_r;
      t.spec = ss_r;
      t.plain_out = std::move(a_r);
      t.spec_out = std::move(b_r);
    }
  }
  t.plain.decode_seconds = median(plain_times);
  t.spec.decode_seconds = median(spec_times);
  t.speedup = median(pair_ratios);
  return t;
}

}  // namespace

namespace {

// Timed target passes over n <= max_rows new tokens after `context` cached ones (tokens spread
// over the vocabulary), every row wanting logits as verification does; the cache is cut back
// to `context` after each.
class PassTimer {
 public:
  PassTimer(Model& model, ThreadPool* pool, int context, int max_rows, KvType kv_type)
      : model_(model),
        pool_(pool),
        context_(std::max(1, std::min(context, model.config().n_ctx_train - max_rows - 8))),
        kv_(model.make_kv_cache(context_ + max_rows + 8, kv_type)),
        tokens_(static_cast<size_t>(context_ + max_rows)),
        positions_(static_cast<size_t>(max_rows)),
        rows_(static_cast<size_t>(max_rows)) {
    const int n_vocab = model.config().n_vocab;
    for (size_t i = 0; i < tokens_.size(); ++i)
      tokens_[i] = static_cast<int32_t>(3 + (i * 7919) % (n_vocab - 3));
    for (int i = 0; i < max_rows; ++i) {
      positions_[static_cast<size_t>(i)] = context_ + i;
      rows_[static_cast<size_t>(i)] = i;
    }
    prefill(model, kv_, {tokens_.data(), static_cast<size_t>(context_)}, 512, pool);
  }

  // Seconds of one pass over n new tokens.
  double operator()(int n) {
    ForwardBatch b;
    b.tokens = {tokens_.data() + context_, static_cast<size_t>(n)};
    b.positions = {positions_.data(), static_cast<size_t>(n)};
    b.output_rows = {rows_.data(), static_cast<size_t>(n)};  // verification needs every row
    const auto t0 = std::chrono::steady_clock::now();
    model_.forward(kv_, b, pool_);
    const double s = seconds_since(t0);
    kv_.truncate(context_);
    return s;
  }

 private:
  Model& model_;
  ThreadPool* pool_;
  int context_;
  KvCache kv_;
  std::vector<int32_t> tokens_;     // [context + max_rows]
  std::vector<int32_t> positions_;  // [max_rows]
  std::vector<int32_t> rows_;       // [max_rows]
};

}  // namespace

VerifyCost measure_verify_cost(Model& model, ThreadPool* pool, int context, int reps,
                               KvType kv_type) {
  PassTimer pass(model, pool, context, 8, kv_type);
  pass(1);
  pass(8);
  // Median of the ratios of adjacent pairs: on a shared host the speed drifts from second to
  // second, and a pair sees (nearly) the same moment. The ratio of the fastest passes is the
  // cost with the least interference; on a busy host it usually lies below the median, since
  // the compute-bound 8-token pass loses more to a busy neighbour than the memory-bound 1-token
  // pass does.
  std::vector<double> ratios, ones, eights;
  double best1 = 0, best8 = 0;
  for (int r = 0; r < reps; ++r) {
    const double t1 = pass(1);
    const double t8 = pass(8);
    ratios.push_back(t8 / t1);
    ones.push_back(t1);
    eights.push_back(t8);
    best1 = r == 0 ? t1 : std::min(best1, t1);
    best8 = r == 0 ? t8 : std::min(best8, t8);
  }
  VerifyCost cost;
  cost.ratio = median(ratios);
  cost.best_ratio = best8 / best1;
  cost.ms_1 = median(ones) * 1e3;
  cost.ms_8 = median(eights) * 1e3;
  return cost;
}

std::vector<std::pair<int, double>> measure_pass_cost(Model& model, ThreadPool* pool, int context,
                                                      int reps, KvType kv_type) {
  constexpr int kMaxRows = kPassCostRows[std::size(kPassCostRows) - 1];
  PassTimer pass(model, pool, context, kMaxRows, kv_type);
  for (int n : kPassCostRows) pass(n);  // warm every shape once
  // Per size, the median of pair ratios (a 1-token pass just before it), as measure_verify_cost.
  std::vector<std::vector<double>> ratios(std::size(kPassCostRows));
  for (int r = 0; r < std::max(1, reps); ++r) {
    for (size_t k = 1; k < std::size(kPassCostRows); ++k) {
      const double t1 = pass(1);
      ratios[k].push_back(pass(kPassCostRows[k]) / t1);
    }
  }
  // Every token adds at least kMinPassTokenCost (a median below its neighbour's, on a noisy
  // host, must not make a stretch of the curve look free).
  std::vector<std::pair<int, double>> curve = {{1, 1.0}};
  for (size_t k = 1; k < std::size(kPassCostRows); ++k) {
    const auto [n0, r0] = curve.back();
    const double floor = r0 + kMinPassTokenCost * (kPassCostRows[k] - n0);
    curve.emplace_back(kPassCostRows[k], std::max(floor, median(ratios[k])));
  }
  return curve;
}

std::vector<BenchPrompt> read_bench_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("{}: cannot open prompts file", path));
  std::vector<BenchPrompt> prompts;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}:{}: not JSON: {}", path, line_no, e.what()));
    }
    auto bad = [&](const std::string& why) {
      return Error(
          fmt::format("{}:{}: {} (expected a JSON string, an array of strings, or an "
                      "object with \"turns\" or \"prompt\" and an optional "
                      "\"category\")",
                      path, line_no, why));
    };
    BenchPrompt p;
    p.line = line_no;
    auto take_turns = [&](const nlohmann::json& turns) {
      if (!turns.is_array() || turns.empty()) throw bad("the turns are not a non-empty array");
      for (const auto& t : turns) {
        if (!t.is_string()) throw bad("a turn is not a string");
        p.turns.push_back(t.get<std::string>());
      }
    };
    if (j.is_string()) {
      p.turns.push_back(j.get<std::string>());
    } else if (j.is_array()) {
      take_turns(j);
    } else if (j.is_object()) {
      if (j.contains("category")) {
        if (!j["category"].is_string()) throw bad("\"category\" is not a string");
        p.category = j["category"].get<std::string>();
      }
      if (j.contains("turns")) {
        take_turns(j["turns"]);
      } else if (j.contains("prompt") && j["prompt"].is_string()) {
        p.turns.push_back(j["prompt"].get<std::string>());
      } else {
        throw bad("an object without \"turns\" or a \"prompt\" string");
      }
    } else {
      throw bad("neither a string, an array nor an object");
    }
    prompts.push_back(std::move(p));
  }
  if (prompts.empty()) throw Error(fmt::format("{}: no prompts", path));
  return prompts;
}

std::vector<std::string> read_prompts_file(const std::string& path) {
  std::vector<std::string> texts;
  for (BenchPrompt& p : read_bench_prompts(path)) {
    if (p.turns.size() != 1) {
      throw Error(fmt::format("{}:{}: a conversation of {} turns; only `bench --spec` runs those",
                              path, p.line, p.turns.size()));
    }
    texts.push_back(std::move(p.turns[0]));
  }
  return texts;
}

nlohmann::json run_spec_bench(Model& model, ThreadPool* pool, SpecSetup& spec,
                              const SpecBenchInput& in) {
  Generator gen(model, pool, in.ctx_size, in.kv_type);
  std::unique_ptr<Generator> gen_b;  // the speculative runs' own cache when interleaving
  if (in.interleave) gen_b = std::make_unique<Generator>(model, pool, in.ctx_size, in.kv_type);
  Generator& spec_gen = gen_b ? *gen_b : gen;
  GenerationConfig plain;
  plain.max_new_tokens = in.n_gen;
  plain.sampling = in.sampling;
  plain.stop_tokens = in.stop_tokens;
  GenerationConfig specd = plain;
  specd.proposer = spec.proposer.get();
  specd.draft = spec.draft_length;
  specd.verify_token_cost = in.verify_token_cost;
  specd.draft_token_cost = spec.draft_token_cost;

  // Warm-up: one short run of each kind, each on the generator its mode uses (page faults of
  // the caches, thread pool, scratch growth).
  {
    GenerationConfig w = plain;
    w.max_new_tokens = std::min(16, in.n_gen);
    gen.generate(in.prompts[0], w, nullptr, nullptr);
    w.proposer = specd.proposer;
    w.draft = specd.draft;
    w.verify_token_cost = specd.verify_token_cost;
    w.draft_token_cost = specd.draft_token_cost;
    spec_gen.generate(in.prompts[0], w, nullptr, nullptr);
  }

  double plain_s = 0, spec_s = 0, plain_prefill_s = 0, spec_prefill_s = 0;
  int64_t plain_tokens = 0, spec_tokens = 0, passes = 0, spec_passes = 0, drafted = 0, accepted = 0,
          plain_passes = 0;
  int identical = 0;
  double draft_s = 0;
  std::array<int64_t, GenerationStats::kPositions> accepted_at{};
  nlohmann::json rows = nlohmann::json::array();
  double min_speedup = 1e30;
  // Per category (Spec-Bench style): the same sums as the totals, over that category's turns.
  struct CategorySums {
    double plain_s = 0, spec_s = 0, min_speedup = 1e30;
    int64_t plain_tokens = 0, spec_tokens = 0, passes = 0, accepted = 0, turns = 0, identical = 0;
  };
  std::map<std::string, CategorySums> categories;
  int64_t turns_run = 0;
  for (size_t i = 0; i < in.prompts.size(); ++i) {
    const BenchPrompt* text = in.texts.empty() ? nullptr : &in.texts[i];
    const size_t n_turns = text != nullptr ? text->turns.size() : 1;
    if (n_turns > 1 && (in.tokenizer == nullptr || !in.chat)) {
      throw Error(
          fmt::format("prompt {} has {} turns: a conversation needs --chat", i + 1, n_turns));
    }
    std::vector<ChatMessage> conversation;  // the turns so far and plain decoding's answers
    std::vector<int32_t> tokens = in.prompts[i];
    for (size_t turn = 0; turn < n_turns; ++turn) {
      if (turn > 0) {
        std::vector<ChatMessage> messages = conversation;
        messages.push_back({"user", text->turns[turn]});
        tokens =
            in.tokenizer->encode(in.tokenizer->apply_chat_template(messages, true), false, true);
        if (static_cast<int64_t>(tokens.size()) + in.n_gen + 1 > in.ctx_size) {
          throw Error(
              fmt::format("prompt {}, turn {}: {} tokens of conversation plus -n {} do not "
                          "fit the context of {}",
                          i + 1, turn + 1, tokens.size(), in.n_gen, in.ctx_size));
        }
      }
      const TurnResult t = run_turn(gen, spec_gen, plain, specd, tokens, in.repeats, in.interleave);
      const GenerationStats& ps = t.plain;
      const GenerationStats& ss = t.spec;
      const std::vector<int32_t>& a = t.plain_out;
      const std::vector<int32_t>& b = t.spec_out;
      const double row_speedup = t.speedup;
      plain_prefill_s += ps.prefill_seconds;
      spec_prefill_s += ss.prefill_seconds;
      identical += a == b;
      plain_s += ps.decode_seconds;
      spec_s += ss.decode_seconds;
      plain_tokens += ps.n_generated;
      spec_tokens += ss.n_generated;
      plain_passes += ps.n_forward_passes;
      passes += ss.n_forward_passes;
      spec_passes += ss.n_spec_passes;
      drafted += ss.n_drafted;
      accepted += ss.n_accepted;
      draft_s += ss.draft_seconds;
      for (int p = 0; p < GenerationStats::kPositions; ++p) accepted_at[p] += ss.accepted_at[p];
      min_speedup = std::min(min_speedup, row_speedup);
      const std::string category = text != nullptr ? text->category : "";
      CategorySums& cat = categories[category];
      cat.plain_s += ps.decode_seconds;
      cat.spec_s += ss.decode_seconds;
      cat.plain_tokens += ps.n_generated;
      cat.spec_tokens += ss.n_generated;
      cat.passes += ss.n_forward_passes;
      cat.accepted += ss.n_accepted;
      cat.turns += 1;
      cat.identical += a == b;
      cat.min_speedup = std::min(cat.min_speedup, row_speedup);
      ++turns_run;
      rows.push_back({{"prompt", i + 1},
                      {"turn", turn + 1},
                      {"category", category},
                      {"prompt_tokens", tokens.size()},
                      {"generated", ss.n_generated},
                      {"plain_tok_s", ps.n_generated / ps.decode_seconds},
                      {"spec_tok_s", ss.n_generated / ss.decode_seconds},
                      {"speedup", row_speedup},
                      {"plain_prefill_s", ps.prefill_seconds},
                      {"spec_prefill_s", ss.prefill_seconds},
                      {"acceptance_rate", ss.acceptance_rate()},
                      {"tokens_per_pass", ss.tokens_per_pass()},
                      {"identical", a == b}});
      if (!in.quiet) {
        fmt::print(stderr,
                   "prompt {:2d}/{}{}: {:4d} tokens, plain {:6.1f} tok/s, spec {:6.1f} tok/s, "
                   "speedup {:.2f}x, accepted {}/{}, {:.2f} tokens/pass{}\n",
                   i + 1, in.prompts.size(),
                   n_turns > 1 ? fmt::format(" turn {}", turn + 1) : std::string(), ss.n_generated,
                   ps.n_generated / ps.decode_seconds, ss.n_generated / ss.decode_seconds,
                   row_speedup, ss.n_accepted, ss.n_drafted, ss.tokens_per_pass(),
                   a == b ? "" : " (outputs differ)");
      }
      if (turn + 1 < n_turns) {
        // The next turn follows plain decoding's answer (the speculative one is the same when
        // greedy), without its end-of-generation token.
        std::vector<int32_t> answer = a;
        while (!answer.empty() && std::find(in.stop_tokens.begin(), in.stop_tokens.end(),
                                            answer.back()) != in.stop_tokens.end()) {
          answer.pop_back();
        }
        conversation.push_back({"user", text->turns[turn]});
        conversation.push_back({"assistant", in.tokenizer->decode(answer)});
      }
    }
  }
  nlohmann::json j;
  j["spec"] = spec.description;
  j["prompts"] = in.prompts.size();
  j["turns"] = turns_run;
  j["plain_tok_s"] = plain_tokens / plain_s;
  j["spec_tok_s"] = spec_tokens / spec_s;
  j["speedup"] = (spec_tokens / spec_s) / (plain_tokens / plain_s);
  // The prompt's processing too (a draft model reads the prompt during the speculative run's
  // prefill): the whole requests' times, and the prefill (time to first token) alone.
  j["end_to_end_speedup"] = (plain_s + plain_prefill_s) / (spec_s + spec_prefill_s);
  j["prefill_time_ratio"] = plain_prefill_s > 0 ? spec_prefill_s / plain_prefill_s : 0.0;
  j["acceptance_rate"] = drafted ? static_cast<double>(accepted) / drafted : 0.0;
  j["mean_accepted_length"] = spec_passes ? static_cast<double>(accepted) / spec_passes : 0.0;
  j["tokens_per_pass"] = passes ? static_cast<double>(accepted + passes) / passes : 0.0;
  j["plain_target_passes"] = plain_passes;
  j["spec_target_passes"] = passes;
  // Acceptance at draft position p + 1 (of the passes that verified drafts), and the share of
  // the speculative decode time spent drafting (the rest verifies: the target's passes).
  nlohmann::json at = nlohmann::json::array();
  for (int p = 0; p < GenerationStats::kPositions && spec_passes > 0; ++p) {
    if (accepted_at[p] == 0) break;
    at.push_back(static_cast<double>(accepted_at[p]) / static_cast<double>(spec_passes));
  }
  j["acceptance_at_position"] = at;
  j["draft_time_fraction"] = spec_s > 0 ? draft_s / spec_s : 0.0;
  j["drafted"] = drafted;
  j["accepted"] = accepted;
  j["identical_outputs"] = identical;
  j["min_prompt_speedup"] = min_speedup;
  j["repeats"] = std::max(1, in.repeats);
  j["interleaved"] = in.interleave;
  j["per_prompt"] = rows;
  if (categories.size() > 1 || !categories.begin()->first.empty()) {
    nlohmann::json by = nlohmann::json::object();
    for (const auto& [name, c] : categories) {
      by[name.empty() ? "(none)" : name] = {
          {"turns", c.turns},
          {"plain_tok_s", c.plain_tokens / c.plain_s},
          {"spec_tok_s", c.spec_tokens / c.spec_s},
          {"speedup", (c.spec_tokens / c.spec_s) / (c.plain_tokens / c.plain_s)},
          {"tokens_per_pass",
           c.passes ? static_cast<double>(c.accepted + c.passes) / c.passes : 0.0},
          {"min_prompt_speedup", c.min_speedup},
          {"identical_outputs", c.identical}};
    }
    j["categories"] = by;
  }
  return j;
}

}  // namespace specdec::cli
