#include "common/solo_run.h"

#include <memory>

#include "drafter/medusa_proposer.h"
#include "drafter/redrafter_proposer.h"
#include "engine/generator.h"
#include "engine/sequence.h"
#include "model/model.h"
#include "speculative/draft_model.h"
#include "speculative/ngram.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec::test {

std::vector<int32_t> solo_output(Model& model, const Tokenizer& tok, ThreadPool* pool,
                                 const Request& r, Model* draft, int64_t ctx,
                                 const ReDrafterHead* head, const MedusaHeads* medusa,
                                 KvType kv_type) {
  if (ctx <= 0) ctx = model.config().n_ctx_train;
  Generator gen(model, pool, ctx, kv_type);
  GenerationConfig g;
  g.max_new_tokens = r.max_tokens;
  g.sampling = r.sampling;
  if (!r.ignore_eos) g.stop_tokens = tok.eog_ids();
  g.stop_tokens.insert(g.stop_tokens.end(), r.stop_tokens.begin(), r.stop_tokens.end());
  std::unique_ptr<Proposer> proposer;
  if (r.spec.method == SpecMethod::kNgram) {
    NgramConfig c;
    c.ngram_min = r.spec.ngram_min;
    c.ngram_max = r.spec.ngram_max;
    c.tree_width = r.spec.tree_width;
    proposer = std::make_unique<NgramProposer>(c);
  } else if (r.spec.method == SpecMethod::kDraft) {
    SPECDEC_CHECK(draft != nullptr, "solo_output: a draft request without a draft model");
    proposer = std::make_unique<DraftModelProposer>(*draft, model, pool, ctx, draft_model_config(r));
  } else if (r.spec.method == SpecMethod::kReDrafter) {
    SPECDEC_CHECK(head != nullptr, "solo_output: a ReDrafter request without a head");
    proposer = std::make_unique<ReDrafterProposer>(*head, model, pool,
                                                   BeamSearchConfig{r.spec.beams, r.spec.beam_length});
  } else if (r.spec.method == SpecMethod::kMedusa) {
    SPECDEC_CHECK(medusa != nullptr, "solo_output: a Medusa request without heads");
    proposer = std::make_unique<MedusaProposer>(
        *medusa, medusa_tree_or_default(r.spec.medusa_tree, model.device_name()), pool);
  }
  if (proposer) {
    g.proposer = proposer.get();
    g.draft.max_draft = r.spec.num_draft;
    g.draft.adaptive = false;
  }
  return gen.generate(r.prompt, g, nullptr, nullptr);
}

}  // namespace specdec::test
