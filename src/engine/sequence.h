// One request inside the engine: its tokens, how many of them have K/V in its blocks, its
// sampler, proposer (or draft-model configuration) and text stream. Owned by the engine; the
// scheduler reads and moves it between the waiting and running lists.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "engine/stop_strings.h"
#include "kv/block_table.h"
#include "sample/sampler.h"
#include "speculative/draft_decoder.h"
#include "speculative/draft_length.h"
#include "speculative/proposer.h"
#include "speculative/token_tree.h"
#include "specdec/engine.h"
#include "tokenizer/detokenizer.h"

namespace specdec {

// The draft model's configuration for a request with SpecMethod::kDraft: the request's sampling
// (draft_temp replacing its temperature), greedy drafts when that is greedy, top-k branches.
inline DraftModelConfig draft_model_config(const Request& r) {
  DraftModelConfig c;
  c.p_min = r.spec.draft_p_min;
  c.sampling = r.sampling;
  if (r.spec.draft_temp >= 0) c.sampling.temperature = r.spec.draft_temp;
  c.sample = !c.sampling.greedy();
  c.branch_top_k = r.spec.tree_width;
  c.branch_levels = r.spec.tree_depth;
  return c;
}

struct Sequence {
  int64_t id = -1;
  int64_t arrival = 0;  // submission order: first come, first served; preempted last-come first
  Request request;
  RequestState state = RequestState::kWaiting;
  std::vector<int32_t> tokens;  // [n_prompt + emitted] prompt, then every emitted token
  int64_t n_prompt = 0;
  int64_t n_computed = 0;       // tokens[0, n_computed) have their K/V in `table`
  int64_t max_context = 0;      // tokens this sequence may hold (context and pool)
  bool admitted = false;        // holds blocks (running)
  BlockTable table;
  Sampler sampler;
  std::unique_ptr<Proposer> proposer;  // its own proposer (n-gram), or null
  // Drafts from the engine's BatchedDraftModel (handle = id) with this configuration.
  std::optional<DraftModelConfig> draft_model;
  std::optional<DraftLengthController> draft_length;
  TokenTree tree;               // this step's tokens when decoding (root + drafts)
  // [dim] the target's final-normed hidden state at the token before the root, kept for a
  // proposer that wants it (ReDrafter); survives preemption (a recompute gives the same bits).
  std::vector<float> hidden;
  std::optional<IncrementalDetokenizer> detok;
  StopStrings stop_strings;
  RequestStats stats;
  RequestOutput out;            // what this step produced, delivered after the step
  bool cancel_requested = false;

  Sequence(int64_t id_, Request req)
      : id(id_), request(std::move(req)), sampler(request.sampling) {}

  bool speculates() const { return proposer != nullptr || draft_model.has_value(); }
  int64_t n_generated() const { return static_cast<int64_t>(tokens.size()) - n_prompt; }
  // Tokens whose K/V the next step must compute (>= 1 while running): prompt chunks, a
  // recompute after preemption, or the one root token of a decode step.
  int64_t n_uncomputed() const { return static_cast<int64_t>(tokens.size()) - n_computed; }
  // A decode step: the root is the only uncomputed token and it was generated (drafts may
  // follow it).
  bool decoding() const { return n_uncomputed() == 1 && n_generated() > 0; }
};

}  // namespace specdec
