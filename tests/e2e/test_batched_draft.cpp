// The batched draft model (BatchedDraftModel: one paged draft KV pool, one draft pass per depth
// over all sequences) makes exactly the trees the single-sequence DraftModelProposer makes for
// the same history and seed: token for token, parent for parent, and every kept draft
// distribution q bit for bit. Checked on the tiny pair (target stories260K, ctx 512; draft
// tinystories280K, ctx 256) over many steps of several sequences whose histories grow by a
// random accepted path of their tree and one more token, so the draft caches are kept, cut and
// caught up in every way: greedy chains, sampled chains (q kept), top-k branching trees of both
// kinds, histories running into the draft's context limit, and a pool so small that caches are
// evicted and jobs dropped (never an error). In the engine: sampled draft-model requests give
// their solo output (Generator + DraftModelProposer, same seed), a tiny draft pool costs drafts
// but no output token, and a draft model with another vocabulary is refused at construction.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "common/solo_run.h"
#include "common/test_paths.h"
#include "engine/generator.h"
#include "engine/sequence.h"
#include "model/model.h"
#include "specdec/engine.h"
#include "speculative/batched_draft.h"
#include "speculative/draft_model.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec {
namespace {

constexpr int64_t kCtx = 512;  // the sequences' context (the target's); the draft's is 256

class BatchedDraft : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    target_ = Model::load(test::tiny_model("stories260K.gguf")).release();
    draft_ = Model::load(test::tiny_model("tinystories280K.gguf")).release();
    tok_ = Tokenizer::from_gguf(target_->file()).release();
    pool_ = new ThreadPool(2);
  }
  static void TearDownTestSuite() {
    delete pool_;
    delete tok_;
    delete draft_;
    delete target_;
  }

  // A story start (the draft agrees with the target on it), then deterministic filler.
  static std::vector<int32_t> prompt(int len, uint32_t seed) {
    std::vector<int32_t> p = tok_->encode(
        seed % 2 ? "Once upon a time, there was a little girl named Lily. She loved to play"
                 : "One day, a boy named Tim went to the park with his mom.",
        true, false);
    if (len < static_cast<int>(p.size())) p.resize(static_cast<size_t>(len));
    std::mt19937 rng(seed);
    while (static_cast<int>(p.size()) < len) {
      p.push_back(static_cast<int32_t>(3 + rng() % (target_->config().n_vocab - 3)));
    }
    return p;
  }

  static Model* target_;
  static Model* draft_;
  static Tokenizer* tok_;
  static ThreadPool* pool_;
};
Model* BatchedDraft::target_ = nullptr;
Model* BatchedDraft::draft_ = nullptr;
Tokenizer* BatchedDraft::tok_ = nullptr;
ThreadPool* BatchedDraft::pool_ = nullptr;

// Same nodes, parents, and kept distributions (bitwise).
void expect_same_tree(const TokenTree& got, const TokenTree& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (int i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got.token(i), want.token(i)) << where << " node " << i;
    ASSERT_EQ(got.parent(i), want.parent(i)) << where << " node " << i;
    ASSERT_EQ(got.dist_index(i) == TokenTree::kNoDist, want.dist_index(i) == TokenTree::kNoDist)
        << where << " node " << i;
    if (got.dist_index(i) == TokenTree::kNoDist) continue;
    const std::span<const float> a = got.dist(got.dist_index(i));
    const std::span<const float> b = want.dist(want.dist_index(i));
    ASSERT_EQ(a.size(), b.size()) << where << " node " << i;
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
        << where << " node " << i << ": the kept q differs";
  }
}

struct Scenario {
  const char* name = "";
  DraftModelConfig config;
  std::vector<int> prompt_lens;  // one sequence each
  int steps = 12;
  int max_draft = 6;        // a job asks for 1 + (step + i) % max_draft drafts
  int32_t n_blocks = 4096;  // of the batched drafter's pool
  bool rotate = false;      // every third sequence sits a step out (idle: evictable)
  int draft_every = 1;      // > 1: a sequence drafts every this many steps (its history grows)
  int replace_at = -1;      // at this step sequence 0 ends and a new one starts
};

struct Outcome {
  int64_t compared = 0;  // trees compared with the reference (drafts or none)
  int64_t drafted = 0;   // of them, trees with drafts
  int64_t cut = 0;       // jobs whose draft room was below what they asked for (context)
  int64_t no_room = 0;   // jobs without room in the draft's context
  int64_t dropped = 0;   // jobs without drafts for want of blocks
  int64_t sampled = 0;   // nodes with a kept q
  int64_t branched = 0;  // trees that are not chains
  BatchedDraftStats stats;
};

// One simulated sequence: the batched drafter's handle and the reference proposer, fed the same
// history.
struct Sim {
  int64_t id = 0;
  uint64_t seed = 0;
  std::vector<int32_t> tokens;
  int64_t n_prompt = 0;
  std::unique_ptr<DraftModelProposer> ref;
  TokenTree tree, ref_tree;
};

Outcome run_scenario(const Scenario& sc, Model& target, Model& draft, ThreadPool* pool,
                     const std::function<std::vector<int32_t>(int, uint32_t)>& make_prompt) {
  Outcome out;
  BatchedDraftModel batched(draft, pool, sc.n_blocks, 16);
  std::vector<Sim> sims(sc.prompt_lens.size());
  auto start = [&](Sim& s, int64_t id, int len) {
    s.id = id;
    s.seed = 7919 * static_cast<uint64_t>(id) + 13;
    s.tokens = make_prompt(len, static_cast<uint32_t>(id));
    s.n_prompt = static_cast<int64_t>(s.tokens.size());
    s.ref = std::make_unique<DraftModelProposer>(draft, target, pool, kCtx, sc.config);
    s.ref->begin(s.tokens, s.seed);
    batched.add(s.id, kCtx, s.seed, sc.config);
  };
  for (size_t i = 0; i < sims.size(); ++i)
    start(sims[i], static_cast<int64_t>(i), sc.prompt_lens[i]);
  const int64_t draft_ctx = std::min<int64_t>(kCtx, draft.config().n_ctx_train);
  std::mt19937 rng(12345);
  std::vector<DraftJob> jobs;
  std::vector<Sim*> in_jobs;
  std::vector<int32_t> path;
  for (int step = 0; step < sc.steps; ++step) {
    if (step == sc.replace_at) {
      batched.remove(sims[0].id);
      EXPECT_FALSE(batched.contains(sims[0].id));
      start(sims[0], 100 + step, sc.prompt_lens[0]);
    }
    jobs.clear();
    in_jobs.clear();
    for (size_t i = 0; i < sims.size(); ++i) {
      Sim& s = sims[i];
      s.tree.reset(s.tokens.back());
      if (sc.rotate && (step + static_cast<int>(i)) % 3 == 0) continue;
      if ((step + static_cast<int>(i)) % sc.draft_every != 0) continue;
      const int k = 1 + (step + static_cast<int>(i)) % sc.max_draft;
      jobs.push_back(DraftJob{s.id, s.tokens, k, &s.tree, s.n_prompt});
      in_jobs.push_back(&s);
    }
    batched.propose(jobs);
    batched.check_invariants();
    for (size_t j = 0; j < jobs.size(); ++j) {
      Sim& s = *in_jobs[j];
      const int room = draft_room(draft_ctx, s.tokens.size(), jobs[j].max_tokens);
      if (room <= 0) ++out.no_room;
      if (room > 0 && room < jobs[j].max_tokens) ++out.cut;
      // With p_min = 0 a job with room always drafts unless it was dropped; a dropped job's
      // reference is not asked either (its draws would run ahead of the batched one's).
      if (room > 0 && s.tree.num_drafts() == 0 && sc.config.p_min == 0) {
        ++out.dropped;
        continue;
      }
      s.ref_tree.reset(s.tokens.back());
      DraftRequest req;
      req.tokens = s.tokens;
      req.max_tokens = jobs[j].max_tokens;
      s.ref->propose(req, &s.ref_tree);
      expect_same_tree(s.tree, s.ref_tree,
                       std::string(sc.name) + " step " + std::to_string(step) + " seq " +
                           std::to_string(s.id) + " history " + std::to_string(s.tokens.size()));
      ++out.compared;
      if (s.tree.num_drafts() > 0) ++out.drafted;
      if (!s.tree.is_chain()) ++out.branched;
      for (int n = 1; n < s.tree.size(); ++n)
        out.sampled += s.tree.dist_index(n) != TokenTree::kNoDist;
    }
    // Histories grow by a random accepted path (possibly a branch, possibly nothing) and one
    // more token, as after a verification.
    for (Sim& s : sims) {
      const int node = static_cast<int>(rng() % static_cast<uint32_t>(s.tree.size()));
      s.tree.path_to(node, &path);
      for (int32_t n : path) s.tokens.push_back(s.tree.token(n));
      s.tokens.push_back(static_cast<int32_t>(3 + rng() % (target.config().n_vocab - 3)));
    }
  }
  for (Sim& s : sims) batched.remove(s.id);
  EXPECT_EQ(batched.block_pool().num_used(), 0) << sc.name << ": draft blocks leaked";
  out.stats = batched.stats();
  EXPECT_EQ(out.dropped, out.stats.jobs_dropped) << sc.name;
  std::printf(
      "[ %-10s] %lld trees compared (%lld with drafts, %lld branched, %lld sampled nodes); %lld "
      "cut and %lld without room by the draft's context; %lld dropped, %lld evictions; %lld "
      "passes, %lld draft tokens run, %lld skipped\n",
      sc.name, static_cast<long long>(out.compared), static_cast<long long>(out.drafted),
      static_cast<long long>(out.branched), static_cast<long long>(out.sampled),
      static_cast<long long>(out.cut), static_cast<long long>(out.no_room),
      static_cast<long long>(out.dropped), static_cast<long long>(out.stats.evictions),
      static_cast<long long>(out.stats.passes), static_cast<long long>(out.stats.tokens_run),
      static_cast<long long>(out.stats.tokens_skipped));
  return out;
}

DraftModelConfig sampled_config(float temperature) {
  DraftModelConfig c;
  c.sample = true;
  c.sampling.temperature = temperature;
  c.sampling.top_k = 40;
  c.sampling.repetition_penalty = 1.3f;  // the draws depend on the history and the chain
  c.sampling.repeat_last_n = 16;
  return c;
}

TEST_F(BatchedDraft, GreedyChainsEqualTheSingleSequenceProposer) {
  Scenario sc;
  sc.name = "greedy";
  sc.prompt_lens = {1, 5, 17, 40, 64, 90};
  sc.replace_at = 6;
  const Outcome o = run_scenario(sc, *target_, *draft_, pool_, prompt);
  EXPECT_EQ(o.compared, 6 * sc.steps);
  EXPECT_EQ(o.drafted, o.compared);
  EXPECT_EQ(o.dropped, 0);
  // One catch-up pass and then one pass per depth: never more passes than the longest chain.
  EXPECT_LE(o.stats.passes, sc.steps * sc.max_draft);
}

TEST_F(BatchedDraft, SampledChainsKeepTheSameDrawsAndQ) {
  Scenario sc;
  sc.name = "sampled";
  sc.config = sampled_config(0.8f);
  sc.prompt_lens = {3, 12, 33, 50, 71};
  sc.replace_at = 5;
  const Outcome o = run_scenario(sc, *target_, *draft_, pool_, prompt);
  EXPECT_EQ(o.compared, 5 * sc.steps);
  EXPECT_EQ(o.sampled, [&] {
    int64_t n = 0;
    for (int step = 0; step < sc.steps; ++step)
      for (int i = 0; i < 5; ++i) n += 1 + (step + i) % sc.max_draft;
    return n;
  }()) << "every draft of a sampled chain keeps its q";
}

TEST_F(BatchedDraft, BranchingTreesGreedyAndSampledAndPMin) {
  Scenario greedy;
  greedy.name = "tree";
  greedy.config.branch_top_k = 3;
  greedy.config.branch_levels = 2;
  greedy.prompt_lens = {2, 20, 45, 80};
  const Outcome g = run_scenario(greedy, *target_, *draft_, pool_, prompt);
  EXPECT_GT(g.branched, g.compared / 2);

  Scenario sampled = greedy;
  sampled.name = "tree-q";
  sampled.config = sampled_config(1.0f);
  sampled.config.branch_top_k = 4;
  sampled.config.branch_levels = 1;
  const Outcome s = run_scenario(sampled, *target_, *draft_, pool_, prompt);
  EXPECT_GT(s.branched, s.compared / 2);
  EXPECT_GT(s.sampled, 0);

  // p_min stops some chains early (even at the first depth: trees without drafts compared too).
  Scenario pmin = greedy;
  pmin.name = "p_min";
  pmin.config.p_min = 0.3f;
  pmin.max_draft = 8;
  const Outcome p = run_scenario(pmin, *target_, *draft_, pool_, prompt);
  EXPECT_LT(p.drafted, p.compared);
  EXPECT_GT(p.drafted, 0);
}

TEST_F(BatchedDraft, HistoriesRunningIntoTheDraftContext) {
  ASSERT_EQ(draft_->config().n_ctx_train, 256);
  ASSERT_EQ(target_->config().n_ctx_train, kCtx);
  for (const DraftModelConfig& config : {DraftModelConfig{}, sampled_config(0.7f)}) {
    Scenario sc;
    sc.name = config.sample ? "ctx-q" : "ctx";
    sc.config = config;
    sc.prompt_lens = {228, 236, 244, 250, 60};
    sc.steps = 10;
    sc.max_draft = 8;
    const Outcome o = run_scenario(sc, *target_, *draft_, pool_, prompt);
    EXPECT_GT(o.cut, 0) << "no draft was cut by the draft's context";
    EXPECT_GT(o.no_room, 0) << "no history filled the draft's context";
    EXPECT_GT(o.drafted, 0);
    EXPECT_EQ(o.dropped, 0);
  }
}

TEST_F(BatchedDraft, TinyPoolEvictsAndDropsButNeverFails) {
  for (const DraftModelConfig& config : {DraftModelConfig{}, sampled_config(0.9f)}) {
    Scenario sc;
    sc.name = config.sample ? "tiny-q" : "tiny";
    sc.config = config;
    sc.prompt_lens = {10, 20, 30, 40, 24, 8};
    sc.steps = 14;
    sc.n_blocks = 9;  // 144 slots: a few histories at a time
    sc.rotate = true;
    sc.replace_at = 7;
    const Outcome o = run_scenario(sc, *target_, *draft_, pool_, prompt);
    EXPECT_GT(o.stats.evictions, 0) << "no idle cache was evicted";
    EXPECT_GT(o.dropped, 0) << "no job was dropped";
    EXPECT_GT(o.drafted, o.compared / 3) << "the tiny pool still drafts for some";
  }
}

TEST_F(BatchedDraft, CatchUpWindowSkipsTheSameTokensAsTheSingleSequenceProposer) {
  // A window of 3 generated tokens: sequences that sit steps out come back with longer gaps, and
  // both drafters skip the same positions (one gap per cache, extended by later skips); a tiny
  // pool evicts caches with gaps, which read exactly their record again.
  for (const DraftModelConfig& base : {DraftModelConfig{}, sampled_config(0.9f)}) {
    for (const int32_t n_blocks : {4096, 9}) {
      Scenario sc;
      sc.name = n_blocks < 100 ? (base.sample ? "win-tiny-q" : "win-tiny")
                               : (base.sample ? "window-q" : "window");
      sc.config = base;
      sc.config.catch_up_window = 3;
      sc.prompt_lens = {10, 20, 30, 40, 24, 8};
      sc.steps = 16;
      sc.n_blocks = n_blocks;
      sc.draft_every = 3;
      sc.steps = 30;
      sc.replace_at = 13;
      const Outcome o = run_scenario(sc, *target_, *draft_, pool_, prompt);
      EXPECT_GT(o.stats.tokens_skipped, 0) << sc.name << ": no catch-up was cut by the window";
      EXPECT_GT(o.drafted, o.compared / 3) << sc.name;
      if (n_blocks < 100) {
        EXPECT_GT(o.stats.evictions, 0) << sc.name;
      }
    }
  }
}

// ---- in the engine -------------------------------------------------------------------------

// The request's solo output: Generator (contiguous caches of kCtx) with a DraftModelProposer.
std::vector<int32_t> solo(Model& target, Model& draft, const Tokenizer& tok, ThreadPool* pool,
                          const Request& r) {
  return test::solo_output(target, tok, pool, r, &draft, kCtx);
}

struct EngineRun {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<RequestStats> stats;
  std::vector<StopReason> reasons;
};

EngineRun run_engine(Model& target, const Tokenizer& tok, ThreadPool* pool,
                     const std::vector<Request>& requests, const EngineConfig& config) {
  EngineRun out;
  out.tokens.resize(requests.size());
  out.stats.resize(requests.size());
  out.reasons.resize(requests.size(), StopReason::kNone);
  Engine engine(target, &tok, pool, config);
  for (size_t i = 0; i < requests.size(); ++i) {
    Request r = requests[i];
    r.on_output = [&out, i](const RequestOutput& o) {
      out.tokens[i].insert(out.tokens[i].end(), o.tokens.begin(), o.tokens.end());
      out.stats[i] = o.stats;
      if (o.finished) out.reasons[i] = o.reason;
      return true;
    };
    const SubmitResult s = engine.submit(std::move(r));
    EXPECT_TRUE(s.ok()) << s.error;
  }
  for (int guard = 0; engine.has_work() && guard < 100000; ++guard) {
    engine.step();
    engine.check_invariants();
  }
  EXPECT_FALSE(engine.has_work());
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
  return out;
}

Request draft_request(std::vector<int32_t> prompt, int max_tokens, float temp, uint64_t seed) {
  Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temp;
  r.sampling.seed = seed;
  r.spec.method = SpecMethod::kDraft;
  r.spec.num_draft = 4;
  r.spec.adaptive = false;
  return r;
}

TEST_F(BatchedDraft, EngineSampledDraftRequestsEqualTheirSoloOutput) {
  std::vector<Request> reqs;
  const int lens[] = {4, 30, 120, 200, 15, 60, 230, 9};
  for (int i = 0; i < 8; ++i) {
    Request r = draft_request(prompt(lens[i], static_cast<uint32_t>(i)), 50 + (i % 3) * 20,
                              i == 7 ? 0.0f : 0.6f + 0.1f * static_cast<float>(i % 4),
                              1000 + static_cast<uint64_t>(i));
    if (i % 4 == 1) {  // a sampled tree
      r.spec.tree_width = 3;
      r.spec.tree_depth = 1;
    }
    if (i % 4 == 2) r.spec.draft_temp = 0.4f;  // the draft samples at its own temperature
    if (i == 5) r.spec.draft_p_min = 0.2f;
    if (i == 3) r.spec.num_draft = 7;
    if (i == 6) r.sampling.repetition_penalty = 1.2f;
    reqs.push_back(std::move(r));
  }
  EngineConfig config;
  config.draft_model = draft_;
  config.max_batch_tokens = 4096;  // budgets never cut a draft
  const EngineRun got = run_engine(*target_, *tok_, pool_, reqs, config);
  int64_t accepted = 0, past_draft_ctx = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got.tokens[i], solo(*target_, *draft_, *tok_, pool_, reqs[i])) << "request " << i;
    EXPECT_NE(got.reasons[i], StopReason::kError);
    accepted += got.stats[i].n_accepted;
    past_draft_ctx += reqs[i].prompt.size() + got.tokens[i].size() > 256;
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(past_draft_ctx, 0) << "no request went past the draft's context";
}

TEST_F(BatchedDraft, EngineWithATinyDraftPoolLosesDraftsNotTokens) {
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i) {
    reqs.push_back(draft_request(prompt(8 + 6 * i, static_cast<uint32_t>(i)), 40, 0.0f, 0));
  }
  EngineConfig config;
  config.draft_model = draft_;
  config.draft_kv_blocks = 5;  // 80 slots: one or two sequences' histories at a time
  const EngineRun got = run_engine(*target_, *tok_, pool_, reqs, config);
  int64_t drafted = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got.tokens[i], solo(*target_, *draft_, *tok_, pool_, reqs[i])) << "request " << i;
    EXPECT_NE(got.reasons[i], StopReason::kError);
    drafted += got.stats[i].n_drafted;
  }
  EXPECT_GT(drafted, 0);
}

TEST_F(BatchedDraft, EngineRefusesADraftModelWithAnotherVocabulary) {
  const std::string smol = test::default_model_path();
  if (!test::file_exists(smol)) GTEST_SKIP() << "default model missing at " << smol;
  std::unique_ptr<Model> other = Model::load(smol);
  EngineConfig config;
  config.draft_model = other.get();
  try {
    Engine engine(*target_, tok_, pool_, config);
    ADD_FAILURE() << "the engine took a draft model with another vocabulary";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different vocabularies"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace specdec
