// Greedy speculative decoding is lossless: for every method (n-gram chain, n-gram tree, draft
// model chain, draft model tree), every fixed draft length 1..8 and the adaptive length, the
// output equals plain greedy decoding (Generator without a proposer) token for token, on both
// tiny models (each as target, the other or itself as draft) and on SmolLM2 (n-gram on
// input-grounded prompts; SmolLM2 as its own draft). Edge cases: 1- and 2-token prompts, a stop
// token inside an accepted draft, drafts that run into the context limit (the target's and the
// draft model's shorter one), max_new_tokens cutting a draft, and a repetition penalty.
// Acceptance is asserted to be positive so that no test can pass with speculation doing nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "common/sanitizer.h"
#include "common/test_paths.h"
#include "engine/generator.h"
#include "model/model.h"
#include "speculative/draft_model.h"
#include "speculative/ngram.h"
#include "tokenizer/tokenizer.h"

namespace specdec {
namespace {

enum class Method { kNgramChain, kNgramTree, kDraftChain, kDraftTree };

struct MethodSpec {
  std::string name;
  Method method;
  Model* draft = nullptr;  // kDraft*: the draft model (a separate instance when self-drafting)
};

std::unique_ptr<Proposer> make_proposer(const MethodSpec& m, Model& target, ThreadPool* pool,
                                        int64_t ctx) {
  switch (m.method) {
    case Method::kNgramChain:
      return std::make_unique<NgramProposer>(NgramConfig{});
    case Method::kNgramTree: {
      NgramConfig c;
      c.tree_width = 3;
      return std::make_unique<NgramProposer>(c);
    }
    case Method::kDraftChain:
      return std::make_unique<DraftModelProposer>(*m.draft, target, pool, ctx, DraftModelConfig{});
    case Method::kDraftTree: {
      DraftModelConfig c;
      c.branch_top_k = 3;
      c.branch_levels = 2;
      return std::make_unique<DraftModelProposer>(*m.draft, target, pool, ctx, c);
    }
  }
  return nullptr;
}

// Forwards to another proposer and records every verification outcome.
class Recorder final : public Proposer {
 public:
  explicit Recorder(Proposer* inner) : inner_(inner) {}
  const char* name() const override { return inner_->name(); }
  bool wants_hidden() const override { return inner_->wants_hidden(); }
  void begin(std::span<const int32_t> prompt, uint64_t seed) override {
    steps.clear();
    inner_->begin(prompt, seed);
  }
  void propose(const DraftRequest& request, TokenTree* tree) override {
    inner_->propose(request, tree);
  }
  void observe(std::span<const int32_t> accepted, int32_t bonus) override {
    steps.emplace_back(std::vector<int32_t>(accepted.begin(), accepted.end()), bonus);
    inner_->observe(accepted, bonus);
  }
  std::vector<std::pair<std::vector<int32_t>, int32_t>> steps;  // (accepted drafts, bonus)

 private:
  Proposer* inner_;
};

struct Length {
  std::string name;
  DraftLengthConfig config;
};

std::vector<Length> all_lengths() {
  std::vector<Length> out;
  for (int k = 1; k <= 8; ++k) {
    DraftLengthConfig c;
    c.max_draft = k;
    c.adaptive = false;
    out.push_back({"k=" + std::to_string(k), c});
  }
  DraftLengthConfig a;
  a.max_draft = 8;
  a.adaptive = true;
  out.push_back({"adaptive", a});
  return out;
}

Length fixed(int k) {
  DraftLengthConfig c;
  c.max_draft = k;
  c.adaptive = false;
  return {"k=" + std::to_string(k), c};
}

struct Outcome {
  std::vector<int32_t> tokens;
  GenerationStats stats;
};

Outcome generate(Model& model, ThreadPool* pool, int64_t ctx, std::span<const int32_t> prompt,
                 GenerationConfig config) {
  Generator gen(model, pool, ctx);
  Outcome o;
  o.tokens = gen.generate(prompt, config, nullptr, &o.stats);
  return o;
}

// Every pass emits its accepted drafts plus one token and the draft budget never overshoots the
// remaining tokens, so unless a stop token cut the last pass short the counts add up exactly.
void expect_consistent_stats(const Outcome& o, const std::string& what) {
  const GenerationStats& st = o.stats;
  EXPECT_EQ(st.n_generated, static_cast<int64_t>(o.tokens.size())) << what;
  EXPECT_LE(st.n_accepted, st.n_drafted) << what;
  if (st.finish == FinishReason::kLength || st.finish == FinishReason::kContext) {
    EXPECT_EQ(st.n_generated, 1 + st.n_forward_passes + st.n_accepted) << what;
  }
}

class SpecGreedyTiny : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    stories_ = Model::load(test::tiny_model("stories260K.gguf")).release();
    stories_self_ = Model::load(test::tiny_model("stories260K.gguf")).release();
    tiny280_ = Model::load(test::tiny_model("tinystories280K.gguf")).release();
    tiny280_self_ = Model::load(test::tiny_model("tinystories280K.gguf")).release();
    tok_ = Tokenizer::from_gguf(stories_->file()).release();
    pool_ = new ThreadPool(2);
  }
  static void TearDownTestSuite() {
    delete pool_;
    delete tok_;
    delete tiny280_self_;
    delete tiny280_;
    delete stories_self_;
    delete stories_;
  }

  // Methods for a target: n-gram chain/tree, the other tiny model and the target itself (a second
  // instance) as draft, each as chain and tree.
  static std::vector<MethodSpec> methods_for(Model* target) {
    Model* other = target == stories_ ? tiny280_ : stories_;
    Model* self = target == stories_ ? stories_self_ : tiny280_self_;
    return {{"ngram_chain", Method::kNgramChain},
            {"ngram_tree", Method::kNgramTree},
            {"draft_other_chain", Method::kDraftChain, other},
            {"draft_other_tree", Method::kDraftTree, other},
            {"draft_self_chain", Method::kDraftChain, self},
            {"draft_self_tree", Method::kDraftTree, self}};
  }

  static std::vector<std::vector<int32_t>> prompts() {
    return {
        // Repetitive story text: n-gram drafts get accepted.
        tok_->encode("One day, a little girl named Lily went to the park. She saw a big dog. "
                     "The dog",
                     true, false),
        // Shorter than the n-gram size: BOS alone, and BOS plus one token.
        {tok_->bos_id()},
        tok_->encode("Once", true, false),
    };
  }

  static Model* stories_;
  static Model* stories_self_;
  static Model* tiny280_;
  static Model* tiny280_self_;
  static Tokenizer* tok_;
  static ThreadPool* pool_;
};
Model* SpecGreedyTiny::stories_ = nullptr;
Model* SpecGreedyTiny::stories_self_ = nullptr;
Model* SpecGreedyTiny::tiny280_ = nullptr;
Model* SpecGreedyTiny::tiny280_self_ = nullptr;
Tokenizer* SpecGreedyTiny::tok_ = nullptr;
ThreadPool* SpecGreedyTiny::pool_ = nullptr;

TEST_F(SpecGreedyTiny, EveryMethodAndLengthMatchesPlain) {
  const std::vector<std::vector<int32_t>> ps = prompts();
  ASSERT_EQ(ps[1].size(), 1u);
  ASSERT_EQ(ps[2].size(), 2u);
  for (Model* target : {stories_, tiny280_}) {
    const int64_t ctx = target->config().n_ctx_train;
    const std::string tname = target == stories_ ? "stories260K" : "tinystories280K";
    for (const MethodSpec& m : methods_for(target)) {
      GenerationStats total;
      for (size_t pi = 0; pi < ps.size(); ++pi) {
        // Every method, length and prompt under a sanitizer too, over fewer tokens (17x slower).
        const int n_new = test::sanitizer_scaled(96, 3);
        GenerationConfig config;
        config.max_new_tokens = n_new;
        const Outcome plain = generate(*target, pool_, ctx, ps[pi], config);
        ASSERT_EQ(plain.tokens.size(), static_cast<size_t>(n_new));
        for (const Length& len : all_lengths()) {
          std::unique_ptr<Proposer> proposer = make_proposer(m, *target, pool_, ctx);
          config.proposer = proposer.get();
          config.draft = len.config;
          const Outcome spec = generate(*target, pool_, ctx, ps[pi], config);
          const std::string what =
              tname + " " + m.name + " " + len.name + " prompt " + std::to_string(pi);
          ASSERT_EQ(spec.tokens, plain.tokens) << what;
          EXPECT_EQ(spec.stats.finish, plain.stats.finish) << what;
          expect_consistent_stats(spec, what);
          total.n_drafted += spec.stats.n_drafted;
          total.n_accepted += spec.stats.n_accepted;
          total.n_forward_passes += spec.stats.n_forward_passes;
          total.n_generated += spec.stats.n_generated;
        }
      }
      std::printf("%-16s %-18s drafted %6lld accepted %6lld (%.1f%%) tokens/pass %.2f\n",
                  tname.c_str(), m.name.c_str(), static_cast<long long>(total.n_drafted),
                  static_cast<long long>(total.n_accepted), 100.0 * total.acceptance_rate(),
                  static_cast<double>(total.n_generated) / total.n_forward_passes);
      EXPECT_GT(total.n_accepted, 0) << tname << " " << m.name << ": nothing accepted";
      if (m.name == "draft_self_chain") {
        // The target drafting for itself proposes exactly its own greedy choices: a draft can
        // only be rejected if the kernels computed a row differently in a batch than alone.
        EXPECT_EQ(total.n_accepted, total.n_drafted)
            << tname << ": self-drafting rejected a draft; are the kernels row-invariant?";
      }
    }
  }
}

TEST_F(SpecGreedyTiny, RepetitionPenaltyMatchesPlain) {
  const std::vector<int32_t> prompt = prompts()[0];
  for (Model* target : {stories_, tiny280_}) {
    const int64_t ctx = target->config().n_ctx_train;
    GenerationConfig config;
    config.max_new_tokens = 96;
    config.sampling.repetition_penalty = 1.3f;
    const Outcome plain = generate(*target, pool_, ctx, prompt, config);
    GenerationConfig unpenalized = config;
    unpenalized.sampling.repetition_penalty = 1.0f;
    ASSERT_NE(plain.tokens, generate(*target, pool_, ctx, prompt, unpenalized).tokens)
        << "the penalty should change this output, or the test shows nothing";
    for (const MethodSpec& m : methods_for(target)) {
      int64_t accepted = 0;
      for (const Length& len : {fixed(1), fixed(3), fixed(8), all_lengths().back()}) {
        std::unique_ptr<Proposer> proposer = make_proposer(m, *target, pool_, ctx);
        config.proposer = proposer.get();
        config.draft = len.config;
        const Outcome spec = generate(*target, pool_, ctx, prompt, config);
        ASSERT_EQ(spec.tokens, plain.tokens) << m.name << " " << len.name << " penalty 1.3";
        expect_consistent_stats(spec, m.name);
        accepted += spec.stats.n_accepted;
      }
      EXPECT_GT(accepted, 0) << m.name << " with penalty: nothing accepted";
    }
  }
}

TEST_F(SpecGreedyTiny, StopTokenInsideAnAcceptedDraft) {
  const std::vector<int32_t> prompt = prompts()[0];
  Model* target = stories_;
  const int64_t ctx = target->config().n_ctx_train;
  for (const MethodSpec& m : methods_for(target)) {
    if (m.method == Method::kNgramTree || m.method == Method::kDraftTree) continue;
    // 1. A run without stop tokens, recording which tokens came from accepted drafts.
    std::unique_ptr<Proposer> inner = make_proposer(m, *target, pool_, ctx);
    Recorder rec(inner.get());
    GenerationConfig config;
    config.max_new_tokens = 96;
    config.proposer = &rec;
    config.draft = fixed(6).config;
    const Outcome full = generate(*target, pool_, ctx, prompt, config);
    // 2. A token whose first occurrence is an accepted draft with at least one more accepted
    // draft after it in the same pass (so the pass is cut in the middle of its drafts).
    int32_t stop = -1;
    int64_t stop_pos = -1;
    int64_t pos = 1;  // out[0] came from the prompt's logits
    for (const auto& [accepted, bonus] : rec.steps) {
      for (size_t j = 0; j + 1 < accepted.size() && stop < 0; ++j) {
        const int32_t t = accepted[j];
        const auto first = std::find(full.tokens.begin(), full.tokens.end(), t);
        if (first - full.tokens.begin() == pos + static_cast<int64_t>(j)) {
          stop = t;
          stop_pos = pos + static_cast<int64_t>(j);
        }
      }
      pos += static_cast<int64_t>(accepted.size()) + 1;
    }
    ASSERT_GE(stop, 0) << m.name << ": no accepted draft run to put a stop token in";
    // 3. With that token as a stop token, speculation stops right after it, exactly as plain.
    GenerationConfig plain_config;
    plain_config.max_new_tokens = 96;
    plain_config.stop_tokens = {stop};
    const Outcome plain = generate(*target, pool_, ctx, prompt, plain_config);
    config.stop_tokens = {stop};
    std::unique_ptr<Proposer> inner2 = make_proposer(m, *target, pool_, ctx);
    Recorder rec2(inner2.get());
    config.proposer = &rec2;
    const Outcome spec = generate(*target, pool_, ctx, prompt, config);
    EXPECT_EQ(spec.tokens, plain.tokens) << m.name;
    EXPECT_EQ(static_cast<int64_t>(spec.tokens.size()), stop_pos + 1) << m.name;
    EXPECT_EQ(spec.tokens.back(), stop);
    EXPECT_EQ(spec.stats.finish, FinishReason::kStop);
    EXPECT_EQ(plain.stats.finish, FinishReason::kStop);
    ASSERT_FALSE(rec2.steps.empty());
    const std::vector<int32_t>& last = rec2.steps.back().first;
    const auto at = std::find(last.begin(), last.end(), stop);
    ASSERT_NE(at, last.end()) << m.name << ": the stop token was not an accepted draft";
    EXPECT_LT(at - last.begin() + 1, static_cast<int64_t>(last.size()))
        << m.name << ": the pass should have had accepted drafts after the stop token";
  }
}

TEST_F(SpecGreedyTiny, DraftsReachingTheContextLimit) {
  const std::vector<int32_t> prompt = prompts()[0];
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  for (Model* target : {stories_, tiny280_}) {
    for (int64_t extra : {1, 2, 5, 13}) {
      const int64_t ctx = n_prompt + extra;
      GenerationConfig config;
      config.max_new_tokens = 200;
      const Outcome plain = generate(*target, pool_, ctx, prompt, config);
      ASSERT_EQ(plain.stats.finish, FinishReason::kContext);
      // The cache holds the prompt and all generated tokens but the last.
      ASSERT_EQ(static_cast<int64_t>(plain.tokens.size()), extra + 1);
      int64_t drafted = 0;
      for (const MethodSpec& m : methods_for(target)) {
        for (const Length& len : {fixed(8), fixed(3), all_lengths().back()}) {
          std::unique_ptr<Proposer> proposer = make_proposer(m, *target, pool_, ctx);
          config.proposer = proposer.get();
          config.draft = len.config;
          const Outcome spec = generate(*target, pool_, ctx, prompt, config);
          const std::string what = m.name + " " + len.name + " ctx prompt+" + std::to_string(extra);
          EXPECT_EQ(spec.tokens, plain.tokens) << what;
          EXPECT_EQ(spec.stats.finish, FinishReason::kContext) << what;
          expect_consistent_stats(spec, what);
          drafted += spec.stats.n_drafted;
        }
      }
      if (extra > 1) {
        EXPECT_GT(drafted, 0) << "no drafts near the context limit";
      }
    }
  }
}

TEST_F(SpecGreedyTiny, DraftModelWithAShorterContextThanTheTarget) {
  // stories260K (ctx 512) drafted by tinystories280K (ctx 256): past 256 tokens the draft model
  // has no room and proposes nothing; the output stays plain's.
  const std::vector<int32_t> prompt = prompts()[0];
  const int64_t ctx = stories_->config().n_ctx_train;
  ASSERT_LT(tiny280_->config().n_ctx_train, ctx);
  GenerationConfig config;
  config.max_new_tokens = 400;
  const Outcome plain = generate(*stories_, pool_, ctx, prompt, config);
  for (Method method : {Method::kDraftChain, Method::kDraftTree}) {
    std::unique_ptr<Proposer> proposer =
        make_proposer({"draft", method, tiny280_}, *stories_, pool_, ctx);
    Recorder rec(proposer.get());
    config.proposer = &rec;
    config.draft = fixed(5).config;
    const Outcome spec = generate(*stories_, pool_, ctx, prompt, config);
    EXPECT_EQ(spec.tokens, plain.tokens);
    EXPECT_GT(spec.stats.n_accepted, 0);
    expect_consistent_stats(spec, "short draft context");
    // After the draft's context is full, passes verify nothing (one token each).
    int64_t pos = static_cast<int64_t>(prompt.size()) + 1;
    bool drafted_late = false;
    for (const auto& step : rec.steps) {
      if (pos >= tiny280_->config().n_ctx_train && !step.first.empty()) drafted_late = true;
      pos += static_cast<int64_t>(step.first.size()) + 1;
    }
    EXPECT_FALSE(drafted_late) << "the draft model proposed beyond its own context";
  }
}

TEST_F(SpecGreedyTiny, MaxNewTokensCutsTheDraftBudget) {
  const std::vector<int32_t> prompt = prompts()[0];
  const int64_t ctx = stories_->config().n_ctx_train;
  for (int max_new : {1, 2, 3, 10}) {
    GenerationConfig config;
    config.max_new_tokens = max_new;
    const Outcome plain = generate(*stories_, pool_, ctx, prompt, config);
    ASSERT_EQ(static_cast<int>(plain.tokens.size()), max_new);
    for (const MethodSpec& m : methods_for(stories_)) {
      std::unique_ptr<Proposer> proposer = make_proposer(m, *stories_, pool_, ctx);
      config.proposer = proposer.get();
      config.draft = fixed(8).config;
      const Outcome spec = generate(*stories_, pool_, ctx, prompt, config);
      EXPECT_EQ(spec.tokens, plain.tokens) << m.name << " max_new " << max_new;
      EXPECT_EQ(spec.stats.finish, FinishReason::kLength);
      expect_consistent_stats(spec, m.name);
    }
  }
}

// --- SmolLM2 -------------------------------------------------------------------------------------

class SpecGreedySmolLM2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = test::default_model_path();
    if (!test::file_exists(path)) return;
    model_ = Model::load(path).release();
    self_ = Model::load(path).release();
    tok_ = Tokenizer::from_gguf(model_->file()).release();
    pool_ = new ThreadPool(2);
  }
  static void TearDownTestSuite() {
    delete pool_;
    delete tok_;
    delete self_;
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_)
      GTEST_SKIP() << "default model missing at " << test::default_model_path()
                   << "; run scripts/setup.sh";
  }

  // Input-grounded: the answer copies a passage of the prompt, so n-gram drafts are accepted.
  static std::vector<int32_t> repeat_prompt() {
    const std::string text = test::read_file(test::shared_dir() + "/text/plain-english.txt");
    const std::string passage = text.substr(0, text.find("\n\n"));
    const std::string chat = tok_->apply_chat_template(
        {{"user", "Repeat the following text exactly, word for word:\n\n" + passage}}, true);
    return tok_->encode(chat, false, true);
  }

  static constexpr int64_t kCtx = 512;
  static Model* model_;
  static Model* self_;
  static Tokenizer* tok_;
  static ThreadPool* pool_;
};
Model* SpecGreedySmolLM2::model_ = nullptr;
Model* SpecGreedySmolLM2::self_ = nullptr;
Tokenizer* SpecGreedySmolLM2::tok_ = nullptr;
ThreadPool* SpecGreedySmolLM2::pool_ = nullptr;

TEST_F(SpecGreedySmolLM2, NgramEveryLengthMatchesPlain) {
  const std::vector<int32_t> prompt = repeat_prompt();
  GenerationConfig config;
  config.max_new_tokens = 40;
  const Outcome plain = generate(*model_, pool_, kCtx, prompt, config);
  ASSERT_EQ(plain.tokens.size(), 40u);
  std::vector<Length> tree_lengths = {fixed(4), fixed(8), all_lengths().back()};
  for (const MethodSpec& m : {MethodSpec{"ngram_chain", Method::kNgramChain},
                              MethodSpec{"ngram_tree", Method::kNgramTree}}) {
    GenerationStats total;
    for (const Length& len : m.method == Method::kNgramChain ? all_lengths() : tree_lengths) {
      std::unique_ptr<Proposer> proposer = make_proposer(m, *model_, pool_, kCtx);
      config.proposer = proposer.get();
      config.draft = len.config;
      const Outcome spec = generate(*model_, pool_, kCtx, prompt, config);
      ASSERT_EQ(spec.tokens, plain.tokens) << m.name << " " << len.name;
      expect_consistent_stats(spec, m.name + " " + len.name);
      EXPECT_GT(spec.stats.n_accepted, 0) << m.name << " " << len.name << ": nothing accepted";
      total.n_drafted += spec.stats.n_drafted;
      total.n_accepted += spec.stats.n_accepted;
    }
    std::printf("SmolLM2 %-12s drafted %5lld accepted %5lld (%.1f%%)\n", m.name.c_str(),
                static_cast<long long>(total.n_drafted), static_cast<long long>(total.n_accepted),
                100.0 * total.acceptance_rate());
  }
}

TEST_F(SpecGreedySmolLM2, SelfDraftMatchesPlainAndAcceptsEverything) {
  const std::vector<int32_t> prompt = repeat_prompt();
  GenerationConfig config;
  config.max_new_tokens = 24;
  const Outcome plain = generate(*model_, pool_, kCtx, prompt, config);
  for (const auto& [method, len] :
       {std::pair{Method::kDraftChain, fixed(3)}, std::pair{Method::kDraftChain, fixed(7)},
        std::pair{Method::kDraftTree, fixed(6)}}) {
    const MethodSpec m{method == Method::kDraftChain ? "self_chain" : "self_tree", method, self_};
    std::unique_ptr<Proposer> proposer = make_proposer(m, *model_, pool_, kCtx);
    config.proposer = proposer.get();
    config.draft = len.config;
    const Outcome spec = generate(*model_, pool_, kCtx, prompt, config);
    ASSERT_EQ(spec.tokens, plain.tokens) << m.name << " " << len.name;
    expect_consistent_stats(spec, m.name);
    std::printf("SmolLM2 %-10s %s drafted %lld accepted %lld passes %lld\n", m.name.c_str(),
                len.name.c_str(), static_cast<long long>(spec.stats.n_drafted),
                static_cast<long long>(spec.stats.n_accepted),
                static_cast<long long>(spec.stats.n_forward_passes));
    if (method == Method::kDraftChain) {
      EXPECT_EQ(spec.stats.n_accepted, spec.stats.n_drafted)
          << "self-drafting rejected a draft: a kernel computes a row differently in a batch";
    } else {
      EXPECT_GT(spec.stats.n_accepted, 0);
    }
  }
}

TEST_F(SpecGreedySmolLM2, EndOfTurnInsideAnAcceptedDraft) {
  // The copy (75 tokens) ends with the passage's last words "story hour.", which the prompt
  // follows with <|im_end|>: the n-gram draft proposes the end-of-turn token and the target
  // accepts it inside a draft.
  const std::vector<int32_t> prompt = repeat_prompt();
  GenerationConfig config;
  config.max_new_tokens = 160;
  config.stop_tokens = tok_->eog_ids();
  const Outcome plain = generate(*model_, pool_, kCtx, prompt, config);
  ASSERT_EQ(plain.stats.finish, FinishReason::kStop) << "the copy did not end within 160 tokens";
  NgramProposer ngram(NgramConfig{});
  Recorder rec(&ngram);
  config.proposer = &rec;
  config.draft = fixed(8).config;
  const Outcome spec = generate(*model_, pool_, kCtx, prompt, config);
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_EQ(spec.stats.finish, FinishReason::kStop);
  ASSERT_FALSE(rec.steps.empty());
  const std::vector<int32_t>& last = rec.steps.back().first;
  EXPECT_NE(std::find(last.begin(), last.end(), spec.tokens.back()), last.end())
      << "the end-of-turn token was the target's own token, not an accepted draft";
  std::printf("SmolLM2 copy: %zu tokens in %lld passes, last pass accepted %zu drafts\n",
              spec.tokens.size(), static_cast<long long>(spec.stats.n_forward_passes), last.size());
}

TEST_F(SpecGreedySmolLM2, OneTokenPromptMatchesPlain) {
  const std::vector<int32_t> prompt = tok_->encode("The", false, false);
  ASSERT_EQ(prompt.size(), 1u);
  GenerationConfig config;
  config.max_new_tokens = 32;
  const Outcome plain = generate(*model_, pool_, kCtx, prompt, config);
  for (const MethodSpec& m : {MethodSpec{"ngram_chain", Method::kNgramChain},
                              MethodSpec{"ngram_tree", Method::kNgramTree}}) {
    std::unique_ptr<Proposer> proposer = make_proposer(m, *model_, pool_, kCtx);
    config.proposer = proposer.get();
    config.draft = fixed(5).config;
    const Outcome spec = generate(*model_, pool_, kCtx, prompt, config);
    EXPECT_EQ(spec.tokens, plain.tokens) << m.name;
    expect_consistent_stats(spec, m.name);
  }
}

}  // namespace
}  // namespace specdec
