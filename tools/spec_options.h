// The speculative-decoding options shared by `generate` and `bench`, and how they become a
// Proposer plus a draft-length policy for the Generator.
#pragma once

#include <memory>
#include <string>

#include "engine/generator.h"
#include "model/model.h"
#include "drafter/medusa_heads.h"
#include "drafter/redrafter_head.h"
#include "speculative/proposer.h"

namespace CLI {
class App;
}

namespace specdec::cli {

struct SpecOptions {
  std::string spec = "none";  // none | ngram | draft | redrafter | medusa
  std::string draft_model;
  std::string drafter;        // redrafter / medusa: the head file ("" = the one for the model)
  std::string medusa_tree;    // medusa: paths of top-k ranks; "" = the default tree
  int beams = 2;              // redrafter: beam search width M (2 x 2: best measured on CPU)
  int beam_length = 2;        // redrafter: tokens per beam C
  int prompt_lookup = 8;      // redrafter: prompt-lookup drafts in the head's tree at most
  // redrafter / medusa: the head's weights in memory: auto (Q4_1 on the CPU, Q8_0 beside a GPU
  // target), q4_1, q8_0, f16 or f32.
  std::string head_type = "auto";
  std::string num_draft = "auto";  // N (fixed) or auto (adaptive, at most --num-draft-max)
  int num_draft_max = 8;
  std::string tree;  // "WIDTH,DEPTH": ngram: merge WIDTH continuations; draft: top-WIDTH at DEPTH levels
  int ngram_min = 1;
  int ngram_max = 4;
  float draft_p_min = 0.0f;
  float draft_temp = -1.0f;  // < 0: same as the target's temperature
};

void add_spec_options(CLI::App* cmd, SpecOptions* o);

// "redrafter (M beams x C tokens, LENGTH, prompt lookup ...)": the run's description of a
// ReDrafter setup, the same for the single-sequence and the engine commands.
std::string redrafter_description(const SpecOptions& o, const std::string& length);

// What a run with speculation needs; proposer is null for --spec none.
struct SpecSetup {
  std::unique_ptr<Model> draft_model;
  std::unique_ptr<ReDrafterHead> drafter_head;
  std::unique_ptr<MedusaHeads> medusa_heads;
  std::unique_ptr<Proposer> proposer;
  DraftLengthConfig draft_length;
  double draft_token_cost = 0.0;  // a draft model's token in target passes (its bytes / target's)
  std::string description;  // e.g. "ngram (n 1..4, chain, adaptive <= 8)"
};

// Validates the options (specdec::Error with the option's name when wrong); returns the
// draft-length policy they ask for.
DraftLengthConfig check_spec_options(const SpecOptions& o);
// "WIDTH,DEPTH" of --tree (empty: 1, 0); specdec::Error when malformed.
void parse_tree_option(const std::string& s, int* width, int* depth);
// The tree of the options: --tree, or without it kDraftTree for an adaptive draft model (whose
// branch alternatives are added only while likely enough to pay their verification), else a
// chain (1, 0).
void tree_shape(const SpecOptions& o, int* width, int* depth);
// Measured on the Qwen2.5-Coder pair (session 23, Emerald Rapids, interleaved, greedy):
// MT-Bench-20 1.19x as a chain, 1.27x at 2,1, 1.29x at 3,2 and 4,3 (slowest prompt 0.94, 1.01,
// 1.15, 1.18x); HumanEval-20 1.58x chain, 1.67x / 1.66x at 3,2 / 4,3.
constexpr int kDraftTreeWidth = 4, kDraftTreeDepth = 3;

// Validates the options (specdec::Error with the option's name when wrong) and builds the setup.
// A draft model is loaded on `device` (the target's).
SpecSetup make_spec(const SpecOptions& o, const Model& target, ThreadPool* pool, int64_t ctx_size,
                    const SamplingParams& target_sampling, bool quiet,
                    Device device = Device::kCpu);

// The ReDrafter head of --spec redrafter (null otherwise): --drafter, or the head found for
// `target` (drafter/head_registry.h); specdec::Error when none is found or it was trained for
// another model. Prints what it loaded unless quiet.
std::unique_ptr<ReDrafterHead> load_drafter_head(const SpecOptions& o, const Model& target,
                                                 bool quiet);
// The same for --spec medusa: the Medusa heads (null otherwise).
std::unique_ptr<MedusaHeads> load_medusa_heads(const SpecOptions& o, const Model& target, bool quiet);

}  // namespace specdec::cli
