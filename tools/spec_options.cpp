#include "spec_options.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "cli_common.h"
#include "drafter/head_registry.h"
#include "drafter/medusa_proposer.h"
#include "drafter/medusa_weights.h"
#include "drafter/redrafter_proposer.h"
#include "drafter/redrafter_weights.h"
#include "speculative/draft_model.h"
#include "speculative/ngram.h"
#include "util/check.h"

namespace specdec::cli {

void add_spec_options(CLI::App* cmd, SpecOptions* o) {
  cmd->add_option("--spec", o->spec,
                  "Speculative method: none, ngram (prompt lookup), draft, redrafter (a trained "
                  "recurrent drafter head), medusa (trained Medusa heads)")
      ->check(CLI::IsMember({"none", "ngram", "draft", "redrafter", "medusa"}))
      ->capture_default_str();
  cmd->add_option("--drafter", o->drafter,
                  "Head file (.safetensors) for --spec redrafter or medusa; default: the one "
                  "trained for this model in $SPECDEC_HEADS, the source tree's heads/ or "
                  "<cache>/heads");
  cmd->add_option("--medusa-tree", o->medusa_tree,
                  "Medusa's static tree: paths of top-k ranks, one per head, e.g. "
                  "\"0;1;0,0;0,1;0,0,0\" (default: \"0;1;0,0\" on the CPU, 16 nodes over 4 "
                  "heads beside a GPU)");
  cmd->add_option("--beams", o->beams, "ReDrafter: beams of the head's beam search")
      ->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--beam-length", o->beam_length, "ReDrafter: draft tokens per beam")
      ->check(CLI::Range(1, 16))->capture_default_str();
  cmd->add_option("--prompt-lookup", o->prompt_lookup,
                  "ReDrafter: prompt-lookup (n-gram) drafts at most in the head's tree, each kept "
                  "by its running acceptance like a beam node; 0: the head's beams only")
      ->check(CLI::Range(0, 16))->capture_default_str();
  cmd->add_option("--head-type", o->head_type,
                  "ReDrafter / Medusa: the head's weights in memory: auto (q4_1 on the CPU, where "
                  "each drafting step streams them from memory; q8_0 beside a GPU target), q4_1, "
                  "q8_0, f16 or f32")
      ->check(CLI::IsMember({"auto", "q4_1", "q8_0", "f16", "f32"}))
      ->capture_default_str();
  cmd->add_option("--draft-model", o->draft_model, "GGUF draft model for --spec draft (same vocabulary)");
  cmd->add_option("--num-draft", o->num_draft,
                  "Draft tokens per step: N (fixed) or auto (adaptive, at most --num-draft-max)")
      ->capture_default_str();
  cmd->add_option("--num-draft-max", o->num_draft_max, "Upper bound of the adaptive draft length")
      ->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--tree", o->tree,
                  "WIDTH,DEPTH: ngram merges WIDTH matches into a tree; draft adds the top-WIDTH "
                  "candidates at the first DEPTH levels (default for draft with --num-draft "
                  "auto: 4,3, each alternative only while likely enough to pay its "
                  "verification; 1,1 asks for a chain)");
  cmd->add_option("--ngram-min", o->ngram_min, "Shortest n-gram to match")
      ->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--ngram-max", o->ngram_max, "Longest n-gram to match")
      ->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--draft-p-min", o->draft_p_min,
                  "Stop a draft when the draft model's top probability falls below this")
      ->check(CLI::Range(0.0, 1.0))->check(finite_number())->capture_default_str();
  cmd->add_option("--draft-temp", o->draft_temp,
                  "Draft model temperature (default: the target's; 0 drafts greedily)")
      ->check(finite_number());
}

namespace {

}  // namespace

std::string redrafter_description(const SpecOptions& o, const std::string& length) {
  return fmt::format("redrafter ({} beams x {} tokens, {}, prompt lookup {})", o.beams,
                     o.beam_length, length,
                     o.prompt_lookup > 0 ? fmt::format("<= {}", o.prompt_lookup) : "off");
}

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


void tree_shape(const SpecOptions& o, int* width, int* depth) {
  parse_tree_option(o.tree, width, depth);
  if (o.tree.empty() && o.spec == "draft" && o.num_draft == "auto") {
    *width = kDraftTreeWidth;
    *depth = kDraftTreeDepth;
  }
}

DraftLengthConfig check_spec_options(const SpecOptions& o) {
  DraftLengthConfig dl;
  if (o.ngram_min > o.ngram_max) {
    throw Error(fmt::format("--ngram-min {} is larger than --ngram-max {}", o.ngram_min, o.ngram_max));
  }
  if (o.spec == "redrafter" && o.num_draft == "auto") {
    // The tree of M beams of C tokens, every node verified (adaptive beam shapes: not yet).
    dl.adaptive = false;
    dl.max_draft = std::min(64, o.beams * o.beam_length);
  } else if (o.spec == "medusa" && o.num_draft == "auto") {
    dl.adaptive = false;  // the static tree, every node verified
    // Before the model's device is known: the larger default (the GPU's) as the bound.
    dl.max_draft = static_cast<int>(medusa_tree_or_default(o.medusa_tree, "cuda").paths.size());
  } else if (o.num_draft == "auto") {
    dl.adaptive = true;
    dl.max_draft = o.num_draft_max;
    // A draft model ends its chains by its own probabilities (DraftDecoder's cost rules).
    dl.proposer_stops = o.spec == "draft";
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
  if (o.spec != "redrafter" && o.spec != "medusa" && !o.drafter.empty()) {
    throw Error("--drafter needs --spec redrafter or --spec medusa");
  }
  if (o.spec != "medusa" && !o.medusa_tree.empty()) throw Error("--medusa-tree needs --spec medusa");
  if (!o.medusa_tree.empty()) parse_medusa_tree(o.medusa_tree);  // throws naming the option
  if (o.beams < 1 || o.beams > 64 || o.beam_length < 1 || o.beam_length > 16) {
    throw Error(fmt::format("--beams must be in [1, 64] and --beam-length in [1, 16], got {} and {}",
                            o.beams, o.beam_length));
  }
  return dl;
}

SpecSetup make_spec(const SpecOptions& o, const Model& target, ThreadPool* pool, int64_t ctx_size,
                    const SamplingParams& target_sampling, bool quiet, Device device) {
  SpecSetup setup;
  setup.draft_length = check_spec_options(o);
  int width = 1, depth = 0;
  tree_shape(o, &width, &depth);
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
        load_model_with_progress(resolve_model_path(o.draft_model, "--draft-model"), quiet, device);
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
  if (o.spec == "redrafter") {
    setup.drafter_head = load_drafter_head(o, target, quiet);
    setup.draft_token_cost = static_cast<double>(setup.drafter_head->weight_bytes()) /
                             static_cast<double>(std::max<int64_t>(1, target.weight_bytes()));
    ReDrafterPolicy policy;
    policy.lookup_max = o.prompt_lookup;
    setup.proposer = std::make_unique<ReDrafterProposer>(
        *setup.drafter_head, target, pool, BeamSearchConfig{o.beams, o.beam_length}, policy);
    setup.description = redrafter_description(o, length_desc);
    return setup;
  }
  if (o.spec == "medusa") {
    setup.medusa_heads = load_medusa_heads(o, target, quiet);
    setup.draft_token_cost = static_cast<double>(setup.medusa_heads->weight_bytes()) /
                             static_cast<double>(std::max<int64_t>(1, target.weight_bytes()));
    MedusaTree tree = medusa_tree_or_default(o.medusa_tree, target.device_name());
    const size_t nodes = tree.paths.size();
    setup.proposer = std::make_unique<MedusaProposer>(*setup.medusa_heads, std::move(tree), pool);
    setup.description = fmt::format("medusa ({} heads, tree of {} nodes, {})",
                                    setup.medusa_heads->shape().n_heads, nodes, length_desc);
    return setup;
  }
  throw Error(fmt::format("unknown --spec '{}'", o.spec));
}

namespace {

// --drafter, or the head of `kind` found for the target; specdec::Error when there is none.
std::string head_path(const SpecOptions& o, const Model& target, const char* kind) {
  if (!o.drafter.empty()) return o.drafter;
  const std::string path = find_drafter_head(target, kind);
  if (path.empty()) {
    std::string dirs;
    for (const std::string& d : drafter_head_dirs()) dirs += (dirs.empty() ? "" : ", ") + d;
    throw Error(fmt::format(
        "--spec {}: no {} head trained for this model was found (searched {}); name one with "
        "--drafter FILE or train one with `specdec train-drafter --kind {}`",
        kind, kind, dirs, kind));
  }
  return path;
}

// --head-type: the weight type of a head that steps on `device` ("cpu" or the target's GPU).
// On the CPU, auto is Q4_1: the target's pass evicts the head from the caches, so each drafting
// step streams its weights from memory (5.3 MB as Q8_0 for SmolLM2's head, 3.1 MB as Q4_1, which
// drafted as accurately on MT-Bench). A GPU reads the head from its own memory at full speed and
// keeps Q8_0, the type its tests cover.
GgmlType head_weight_type_for(const SpecOptions& o, const std::string& device) {
  if (o.head_type == "q4_1") return GgmlType::kQ4_1;
  if (o.head_type == "q8_0") return GgmlType::kQ8_0;
  if (o.head_type == "f16") return GgmlType::kF16;
  if (o.head_type == "f32") return GgmlType::kF32;
  SPECDEC_CHECK(o.head_type == "auto", "--head-type: checked by the option");
  return device == "cpu" ? GgmlType::kQ4_1 : GgmlType::kQ8_0;
}

}  // namespace

std::unique_ptr<MedusaHeads> load_medusa_heads(const SpecOptions& o, const Model& target, bool quiet) {
  if (o.spec != "medusa") return nullptr;
  const std::string path = head_path(o, target, "medusa");
  const MedusaWeights w = load_medusa(path);
  check_medusa_target(w, target, path);
  // Medusa's heads always step on the CPU.
  auto heads = std::make_unique<MedusaHeads>(w, head_weight_type_for(o, "cpu"));
  if (!quiet) {
    fmt::print(stderr, "drafter: {} ({} Medusa heads, {:.1f}M parameters, {} draft tokens, {:.1f} MB as {})\n",
               path, w.shape.n_heads, static_cast<double>(w.shape.num_params()) / 1e6,
               w.shape.n_draft_vocab, static_cast<double>(heads->weight_bytes()) / 1e6,
               ggml_type_name(static_cast<uint32_t>(heads->weight_type())));
  }
  return heads;
}

std::unique_ptr<ReDrafterHead> load_drafter_head(const SpecOptions& o, const Model& target,
                                                 bool quiet) {
  if (o.spec != "redrafter") return nullptr;
  const std::string path = head_path(o, target, "redrafter");
  const ReDrafterWeights w = load_redrafter(path);
  check_redrafter_target(w, target, path);
  // Beside a GPU target the head steps on the GPU too (SPECDEC_HEAD_DEVICE=cpu keeps it on the
  // host, for A/B runs).
  const char* want = std::getenv("SPECDEC_HEAD_DEVICE");
  const std::string target_device = target.device_name();
  const bool on_device = target_device != "cpu" && !(want != nullptr && std::string(want) == "cpu");
  auto head = std::make_unique<ReDrafterHead>(w, head_weight_type_for(o, on_device ? target_device : "cpu"));
  if (on_device) head->set_device(make_redrafter_head_device(w, head->weight_type(), target_device));
  if (!quiet) {
    fmt::print(stderr,
               "drafter: {} ({:.1f}M parameters, {} draft tokens, {:.1f} MB a step as {}, on {})\n",
               path, static_cast<double>(w.shape.num_params()) / 1e6, w.shape.n_draft_vocab,
               static_cast<double>(head->weight_bytes()) / 1e6,
               ggml_type_name(static_cast<uint32_t>(head->weight_type())), head->device_name());
  }
  return head;
}

}  // namespace specdec::cli
