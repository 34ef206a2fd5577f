#include "engine_options.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "calibration.h"
#include "cli_common.h"
#include "util/check.h"

namespace specdec::cli {

void add_engine_options(CLI::App* cmd, EngineOptions* o) {
  cmd->add_option("--kv-cache-mib", o->kv_cache_mib, "KV cache pool size in MiB (paged blocks)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))->capture_default_str();
  cmd->add_option("--block-size", o->block_size, "Token slots per KV block (a multiple of 16)")
      ->check(CLI::Range(16, 4096))->capture_default_str();
  cmd->add_flag("--no-prefix-cache", o->no_prefix_cache,
                "Do not reuse the KV blocks of common prompt prefixes");
  cmd->add_option("--max-batch-tokens", o->max_batch_tokens,
                  "Tokens per engine step (prompt chunks + decode + draft tokens)")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--max-prefill-tokens-decoding", o->max_prefill_tokens_decoding,
                  "Prompt tokens per step while other requests decode (bounds their inter-token "
                  "latency); 0: from the cost model (a step costs at most 2.5x its decodes), -1: "
                  "only --max-batch-tokens")
      ->check(CLI::Range(-1, 1 << 20))->capture_default_str();
  cmd->add_option("--max-seqs", o->max_seqs, "Requests running at once at most")
      ->check(CLI::Range(1, 1 << 16))->capture_default_str();
  cmd->add_option("--calibration", o->calibration,
                  "Cost-model constants from `specdec bench --calibrate` (default: "
                  "$SPECDEC_CACHE/calibration.json when present)");
}

EngineConfig make_engine_config(const EngineOptions& o, const std::string& kv_type,
                                int64_t max_context, const Model& target, Model* draft_model,
                                bool quiet, Device device) {
  if (o.block_size % 16 != 0) {
    throw Error(fmt::format("--block-size must be a multiple of 16, got {}", o.block_size));
  }
  EngineConfig c;
  c.kv_cache_mib = o.kv_cache_mib;
  c.block_size = o.block_size;
  c.prefix_cache = !o.no_prefix_cache;
  c.max_batch_tokens = o.max_batch_tokens;
  c.max_seqs = o.max_seqs;
  c.max_prefill_tokens_decoding = o.max_prefill_tokens_decoding;
  c.max_context = max_context;
  c.kv_type = kv_type;
  c.draft_model = draft_model;
  c.verify_token_cost = calibrated_verify_token_cost(o.calibration, c.verify_token_cost, quiet,
                                                     calibration_kernels(device),
                                                     target.file().path());
  c.pass_cost_curve =
      calibrated_pass_cost(o.calibration, calibration_kernels(device), target.file().path());
  return c;
}

SpecParams make_spec_params(const SpecOptions& o, std::string* description) {
  const DraftLengthConfig length_policy = check_spec_options(o);
  SpecParams p;
  if (o.spec == "none") {
    *description = "none";
    return p;
  }
  p.method = o.spec == "ngram"       ? SpecMethod::kNgram
             : o.spec == "redrafter" ? SpecMethod::kReDrafter
             : o.spec == "medusa"    ? SpecMethod::kMedusa
                                     : SpecMethod::kDraft;
  p.medusa_tree = o.medusa_tree;
  p.beams = o.beams;
  p.beam_length = o.beam_length;
  p.prompt_lookup = o.prompt_lookup;
  p.num_draft = length_policy.max_draft;
  p.adaptive = length_policy.adaptive;
  // ReDrafter's tree size is fixed (M x C, pruned by the proposer); "auto" makes it weigh its
  // nodes against the batch's pass in the engine, as adaptive n-gram requests do.
  if (o.spec == "redrafter") p.adaptive = o.num_draft == "auto";
  p.ngram_min = o.ngram_min;
  p.ngram_max = o.ngram_max;
  p.draft_p_min = o.draft_p_min;
  p.draft_temp = o.draft_temp;
  int width = 1, depth = 0;
  tree_shape(o, &width, &depth);
  p.tree_width = width;
  p.tree_depth = depth;
  const std::string length = p.adaptive ? fmt::format("adaptive <= {}", p.num_draft)
                                        : fmt::format("{} per step", p.num_draft);
  if (p.method == SpecMethod::kNgram) {
    *description = fmt::format("ngram (n {}..{}, {}, {})", o.ngram_min, o.ngram_max,
                               width > 1 ? fmt::format("tree width {}", width) : "chain", length);
  } else if (p.method == SpecMethod::kMedusa) {
    *description = fmt::format("medusa (tree of {} nodes, {})", p.num_draft, length);
  } else if (p.method == SpecMethod::kReDrafter) {
    *description = redrafter_description(o, length);
  } else {
    *description = fmt::format("draft model {} ({}, {})", o.draft_model,
                               width > 1 ? fmt::format("top-{} at {} levels", width, depth)
                                         : "chain",
                               length);
  }
  return p;
}

std::unique_ptr<Model> load_draft_model(const SpecOptions& o, bool quiet, Device device) {
  if (o.spec != "draft") return nullptr;
  if (o.draft_model.empty()) throw Error("--spec draft needs --draft-model PATH");
  return load_model_with_progress(resolve_model_path(o.draft_model, "--draft-model"), quiet, device);
}

}  // namespace specdec::cli
