#include "spec_options.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli_common.h"
#include "speculative/draft_model.h"
#include "speculative/ngram.h"
#include "util/check.h"

namespace specdec::cli {

void add_spec_options(CLI::App* cmd, SpecOptions* o) {
  cmd->add_option("--spec", o->spec, "Speculative method: none, ngram (prompt lookup), draft")
      ->check(CLI::IsMember({"none", "ngram", "draft"}))->capture_default_str();
  cmd->add_option("--draft-model", o->draft_model, "GGUF draft model for --spec draft (same vocabulary)");
  cmd->add_option("--num-draft", o->num_draft,
                  "Draft tokens per step: N (fixed) or auto (adaptive, at most --num-draft-max)")
      ->capture_default_str();
  cmd->add_option("--num-draft-max", o->num_draft_max, "Upper bound of the adaptive draft length")
      ->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--tree", o->tree,
                  "WIDTH,DEPTH: ngram merges WIDTH matches into a tree; draft adds the top-WIDTH "
                  "candidates at the first DEPTH levels");
  cmd->add_option("--ngram-min", o->ngram_min, "Shortest n-gram to match")
      ->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--ngram-max", o->ngram_max, "Longest n-gram to match")
      ->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--draft-p-min", o->draft_p_min,
                  "Stop a draft when the draft model's top probability falls below this")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  cmd->add_option("--draft-temp", o->draft_temp,
                  "Draft model temperature (default: the target's; 0 drafts greedily)");
}

namespace {

}  // namespace

void parse_tree_option(const std::string& s, int* width, int* depth) {
  *width = 1;
  *depth = 0;
  if (s.empty()) return;
  int w = 0, d = 0;
  char comma = 0, extra = 0;
  if (std::sscanf(s.c_str(), "%d%c%d%c", &w, &comma, &d, &extra) != 3 || comma != ',' || w < 1 ||
      d < 1 || w > 64 || d > 64) {
    throw Error(fmt::format("--tree expects WIDTH,DEPTH with 1 <= both <= 64, got '{}'", s));
  }
  *width = w;
  *depth = d;
}


DraftLengthConfig check_spec_options(const SpecOptions& o) {
  DraftLengthConfig dl;
  if (o.ngram_min > o.ngram_max) {
    throw Error(fmt::format("--ngram-min {} is larger than --ngram-max {}", o.ngram_min, o.ngram_max));
  }
  if (o.num_draft == "auto") {
    dl.adaptive = true;
    dl.max_draft = o.num_draft_max;
  } else {
    int n = -1;
    char extra = 0;
    if (std::sscanf(o.num_draft.c_str(), "%d%c", &n, &extra) != 1 || n < 0 || n > 64) {
      throw Error(fmt::format("--num-draft expects a number from 0 to 64 or 'auto', got '{}'",
                              o.num_draft));
    }
    dl.adaptive = false;
    dl.max_draft = n;
  }
  int width = 1, depth = 0;
  parse_tree_option(o.tree, &width, &depth);
  if (o.spec != "draft" && !o.draft_model.empty()) {
    throw Error("--draft-model needs --spec draft");
  }
  if (o.spec == "draft" && o.draft_model.empty()) {
    throw Error("--spec draft needs --draft-model PATH");
  }
  return dl;
}

SpecSetup make_spec(const SpecOptions& o, const Model& target, ThreadPool* pool, int64_t ctx_size,
                    const SamplingParams& target_sampling, bool quiet, Device device) {
  SpecSetup setup;
  setup.draft_length = check_spec_options(o);
  int width = 1, depth = 0;
  parse_tree_option(o.tree, &width, &depth);
  const std::string length_desc =
      setup.draft_length.adaptive ? fmt::format("adaptive <= {}", setup.draft_length.max_draft)
                                  : fmt::format("{} per step", setup.draft_length.max_draft);
  if (o.spec == "none") {
    setup.description = "none";
    return setup;
  }
  if (o.spec == "ngram") {
    NgramConfig c;
    c.ngram_min = o.ngram_min;
    c.ngram_max = o.ngram_max;
    c.tree_width = width;
    setup.proposer = std::make_unique<NgramProposer>(c);
    setup.description = fmt::format("ngram (n {}..{}, {}, {})", o.ngram_min, o.ngram_max,
                                    width > 1 ? fmt::format("tree width {}", width) : "chain",
                                    length_desc);
    return setup;
  }
  if (o.spec == "draft") {
    if (o.draft_model.empty()) throw Error("--spec draft needs --draft-model PATH");
    setup.draft_model =
        load_model_with_progress(resolve_model_path(o.draft_model), quiet, device);
    setup.draft_token_cost = static_cast<double>(setup.draft_model->weight_bytes()) /
                             static_cast<double>(std::max<int64_t>(1, target.weight_bytes()));
    DraftModelConfig c;
    c.p_min = o.draft_p_min;
    c.sampling = target_sampling;
    if (o.draft_temp >= 0) c.sampling.temperature = o.draft_temp;
    c.sample = !c.sampling.greedy();
    c.branch_top_k = width;
    c.branch_levels = depth;
    setup.proposer =
        std::make_unique<DraftModelProposer>(*setup.draft_model, target, pool, ctx_size, c);
    setup.description = fmt::format(
        "draft model {} ({}, {}, {})", o.draft_model, c.sample ? "sampled" : "greedy",
        width > 1 ? fmt::format("top-{} at {} levels", width, depth) : "chain", length_desc);
    return setup;
  }
  throw Error(fmt::format("unknown --spec '{}'", o.spec));
}

}  // namespace specdec::cli
