// Speculative sampling is lossless on the tiny pair (target stories260K, draft tinystories280K):
// for every method (n-gram chain and tree, draft model with deterministic greedy drafts, with
// sampled drafts whose q is kept, trees of both kinds, ReDrafter's beam trees and Medusa's static tree) the first generated tokens of many
// seeded runs follow the EXACT target distribution, computed from the model's logits with
// Sampler::distribution for every prefix: a G-test of the joint of (token 1, token 2) and of the
// marginal of token 3 at a fixed significance (p < 1e-4 fails; seeds fixed, so reproducible).
// The same machinery, fed by a test-side generation loop with a deliberately biased verifier,
// rejects the bias; with the real Verifier that loop reproduces Generator token for token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "common/biased_verifier.h"
#include "common/random_head.h"
#include "common/sanitizer.h"
#include "drafter/medusa_proposer.h"
#include "drafter/redrafter_proposer.h"
#include "common/stats.h"
#include "common/test_paths.h"
#include "engine/generator.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "speculative/verifier.h"
#include "speculative/draft_model.h"
#include "speculative/ngram.h"
#include "tokenizer/tokenizer.h"

namespace specdec {
namespace {

constexpr double kAlpha = 1e-4;
// Seeded runs per method and setting of the fits that must pass; half under a sanitizer (30x
// slower there), where they still have 50+ bins. The biased verifiers keep their 4000 runs
// everywhere: at 2000, Medusa's eager acceptance is caught with p = 2e-5 only.
constexpr int kRuns = test::sanitizer_scaled(4000, 2);
constexpr int kBiasedRuns = 4000;
constexpr double kUncoveredMass = 2e-3;  // token-3 test: pairs beyond this tail mass share a bin
constexpr int64_t kCtx = 128;            // target and draft context of every run

// The exact distribution of the first three tokens after a prompt, as far as the tests need it.
struct Exact {
  int n_vocab = 0;
  std::vector<double> joint12;        // [n_vocab * n_vocab] P(t1, t2)
  std::vector<uint8_t> covered;       // [n_vocab * n_vocab] pair's t3 distribution computed
  std::vector<double> marginal3;      // [n_vocab + 1] P(pair covered, t3); last: P(not covered)
  double entropy1 = 0, entropy2 = 0;  // H(t1), E[H(t2 | t1)] in nats
};

Exact exact_distribution(Model& model, std::span<const int32_t> prompt,
                         const SamplingParams& params) {
  Exact e;
  const int V = model.config().n_vocab;
  e.n_vocab = V;
  Sampler sampler(params);
  const int64_t n = static_cast<int64_t>(prompt.size());
  KvCache kv = model.make_kv_cache(n + 2);
  const std::vector<float> logits1 = prefill(model, kv, prompt, 512, nullptr);
  std::vector<int32_t> hist(prompt.begin(), prompt.end());
  std::vector<float> p1, p2, p3;
  sampler.distribution(logits1, hist, &p1);
  e.entropy1 = test::entropy_nats(std::vector<double>(p1.begin(), p1.end()));
  auto step = [&](int32_t token, std::vector<float>* probs) {
    const int32_t pos = static_cast<int32_t>(kv.size()), row = 0;
    ForwardBatch b;
    b.tokens = {&token, 1};
    b.positions = {&pos, 1};
    b.output_rows = {&row, 1};
    const ForwardResult r = model.forward(kv, b, nullptr);
    hist.push_back(token);
    sampler.distribution(r.logits, hist, probs);
  };
  e.joint12.assign(static_cast<size_t>(V) * V, 0.0);
  for (int t1 = 0; t1 < V; ++t1) {
    if (p1[t1] <= 0) continue;
    kv.truncate(n);
    hist.resize(n);
    step(t1, &p2);
    e.entropy2 += p1[t1] * test::entropy_nats(std::vector<double>(p2.begin(), p2.end()));
    for (int t2 = 0; t2 < V; ++t2) e.joint12[static_cast<size_t>(t1) * V + t2] = p1[t1] * p2[t2];
  }
  // Token 3: exact over the most likely pairs covering all but kUncoveredMass; the rest is one
  // bin whose probability is known exactly too.
  std::vector<int64_t> order(e.joint12.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return e.joint12[a] > e.joint12[b]; });
  e.covered.assign(e.joint12.size(), 0);
  e.marginal3.assign(V + 1, 0.0);
  double mass = 0;
  for (int64_t cell : order) {
    if (mass >= 1.0 - kUncoveredMass || e.joint12[cell] <= 0) break;
    const int32_t t1 = static_cast<int32_t>(cell / V), t2 = static_cast<int32_t>(cell % V);
    kv.truncate(n);
    hist.resize(n);
    step(t1, &p2);
    step(t2, &p3);
    for (int v = 0; v < V; ++v) e.marginal3[v] += e.joint12[cell] * p3[v];
    e.covered[cell] = 1;
    mass += e.joint12[cell];
  }
  double total = 0;
  for (double p : e.joint12) total += p;
  e.marginal3[V] = std::max(0.0, total - mass);
  return e;
}

struct Samples {
  std::vector<int64_t> joint12;    // [V * V]
  std::vector<int64_t> marginal3;  // [V + 1]
};

Samples empty_samples(int V) {
  return {std::vector<int64_t>(static_cast<size_t>(V) * V, 0), std::vector<int64_t>(V + 1, 0)};
}

void add_sample(const Exact& e, std::span<const int32_t> tokens, Samples* s) {
  ASSERT_EQ(tokens.size(), 3u);
  const int64_t pair = static_cast<int64_t>(tokens[0]) * e.n_vocab + tokens[1];
  ++s->joint12[pair];
  ++s->marginal3[e.covered[pair] ? tokens[2] : e.n_vocab];
}

// Both fits; returns the smaller p-value. `expect_fit`: fail unless both pass; else report only.
double fit(const Exact& e, const Samples& s, const std::string& what, bool expect_fit) {
  const test::FitResult f12 = test::g_test(s.joint12, e.joint12);
  const test::FitResult f3 = test::g_test(s.marginal3, e.marginal3);
  std::printf("%-34s (t1,t2): %s\n%-34s t3:      %s\n", what.c_str(), f12.summary().c_str(), "",
              f3.summary().c_str());
  if (expect_fit) {
    EXPECT_GT(f12.p_value, kAlpha) << what << " (t1, t2): " << f12.summary();
    EXPECT_GT(f3.p_value, kAlpha) << what << " t3: " << f3.summary();
    // Enough bins that the test has power.
    EXPECT_GT(f12.dof, 30) << what;
    EXPECT_GT(f3.dof, 10) << what;
  }
  return std::min(f12.p_value, f3.p_value);
}

enum class Method {
  kPlain,
  kNgramChain,
  kNgramTree,
  kDraftGreedy,
  kDraftSampled,
  kDraftTree,
  kDraftSampledTree,
  kReDrafter,
  kMedusa
};

struct MethodSpec {
  const char* name;
  Method method;
  int draft_length;
  // The adaptive draft-model policy with its cost rules: chains end and branch alternatives are
  // dropped by the draft's own probabilities (DraftDecoder's gains), speculation goes on and off
  // (DraftLengthConfig::proposer_stops). Costs high enough that the rules cut trees here.
  bool gains = false;
};

const MethodSpec kMethods[] = {
    {"plain", Method::kPlain, 0},
    {"ngram_chain", Method::kNgramChain, 4},
    {"ngram_tree", Method::kNgramTree, 6},
    {"draft_greedy_q", Method::kDraftGreedy, 4},
    {"draft_sampled_q", Method::kDraftSampled, 4},
    {"draft_tree_greedy", Method::kDraftTree, 6},
    {"draft_tree_sampled_mixed", Method::kDraftSampledTree, 5},
    {"draft_tree_sampled_gains", Method::kDraftSampledTree, 5, true},
    {"redrafter_3x2", Method::kReDrafter, 6},
    {"medusa_tree", Method::kMedusa, 6},
};

class SpecSampling : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    target_ = Model::load(test::tiny_model("stories260K.gguf")).release();
    draft_ = Model::load(test::tiny_model("tinystories280K.gguf")).release();
    tok_ = Tokenizer::from_gguf(target_->file()).release();
    // A random ReDrafter head over the 24 likeliest second tokens (as a trained head would
    // draft likely tokens; the tests below assert that drafts are accepted).
    SamplingParams t1;
    t1.temperature = 1.0f;
    const Exact e = exact_distribution(*target_, prompt(), t1);
    std::vector<std::pair<double, int32_t>> t2;
    for (int v = 0; v < e.n_vocab; ++v) {
      double m = 0;
      for (int a = 0; a < e.n_vocab; ++a) m += e.joint12[static_cast<size_t>(a) * e.n_vocab + v];
      t2.push_back({-m, v});
    }
    std::sort(t2.begin(), t2.end());
    std::vector<int32_t> vocab;
    for (int i = 0; i < 24; ++i) vocab.push_back(t2[i].second);
    head_ = new ReDrafterHead(test::random_head(*target_, vocab, 32, 2, 9, 1.5f));
    medusa_ = new MedusaHeads(test::random_medusa(*target_, vocab, 3, 10, 1.5f));
  }
  static void TearDownTestSuite() {
    delete medusa_;
    delete head_;
    delete tok_;
    delete draft_;
    delete target_;
  }

  // A prompt with repeated words, so that n-gram drafts exist for the likely first tokens (about
  // half of them; a quarter of the runs accept one), whose next tokens are far from
  // deterministic (entropy checked below).
  static std::vector<int32_t> prompt() {
    return tok_->encode("He said, \"I like the park.\" She said, \"I like the", true, false);
  }

  // A proposer for one run: the draft model samples with its own seed, derived from the run's.
  static std::unique_ptr<Proposer> make_proposer(Method method, const SamplingParams& params,
                                                 uint64_t seed) {
    DraftModelConfig dc;
    dc.sampling = params;
    dc.sampling.seed = seed ^ 0x5851f42d4c957f2dull;
    switch (method) {
      case Method::kPlain:
        return nullptr;
      case Method::kReDrafter:
        return std::make_unique<ReDrafterProposer>(*head_, *target_, nullptr, BeamSearchConfig{3, 2});
      case Method::kMedusa:
        return std::make_unique<MedusaProposer>(*medusa_, parse_medusa_tree("0;1;0,0;1,0;0,1;0,0,0"),
                                                nullptr);
      case Method::kNgramChain:
        return std::make_unique<NgramProposer>(NgramConfig{});
      case Method::kNgramTree: {
        NgramConfig c;
        c.tree_width = 3;
        return std::make_unique<NgramProposer>(c);
      }
      case Method::kDraftGreedy:
        break;
      case Method::kDraftSampled:
        dc.sample = true;
        break;
      case Method::kDraftTree:
        dc.branch_top_k = 3;
        dc.branch_levels = 2;
        break;
      case Method::kDraftSampledTree:
        dc.sample = true;
        dc.branch_top_k = 3;
        dc.branch_levels = 1;
        break;
    }
    return std::make_unique<DraftModelProposer>(*draft_, *target_, nullptr, kCtx, dc);
  }

  static Model* target_;
  static Model* draft_;
  static Tokenizer* tok_;
  static ReDrafterHead* head_;
  static MedusaHeads* medusa_;
};
ReDrafterHead* SpecSampling::head_ = nullptr;
MedusaHeads* SpecSampling::medusa_ = nullptr;
Model* SpecSampling::target_ = nullptr;
Model* SpecSampling::draft_ = nullptr;
Tokenizer* SpecSampling::tok_ = nullptr;

// Runs every method kRuns times through Generator and checks the fits.
void check_methods(Model& target, const std::vector<int32_t>& prompt, const SamplingParams& params,
                   const char* setting, std::span<const MethodSpec> methods,
                   const std::function<std::unique_ptr<Proposer>(Method, uint64_t)>& make) {
  const Exact exact = exact_distribution(target, prompt, params);
  std::printf("%s: H(t1) = %.3f nats, E[H(t2 | t1)] = %.3f nats, t3 bins cover %.4f\n", setting,
              exact.entropy1, exact.entropy2, 1.0 - exact.marginal3.back());
  // Power: the first tokens are far from deterministic.
  EXPECT_GT(exact.entropy1, 1.0) << setting;
  EXPECT_GT(exact.entropy2, 1.0) << setting;
  Generator gen(target, nullptr, kCtx);
  uint64_t seed_base = 1000;
  for (const MethodSpec& m : methods) {
    Samples s = empty_samples(exact.n_vocab);
    GenerationStats total, st;
    for (int r = 0; r < kRuns; ++r) {
      const uint64_t seed = seed_base + r;
      std::unique_ptr<Proposer> proposer = make(m.method, seed);
      GenerationConfig config;
      // Six tokens, of which the first three are tested (a lossless process's prefix is exact
      // too): the first pass then verifies up to 4 drafts, so trees have room to branch.
      config.max_new_tokens = 6;
      config.sampling = params;
      config.sampling.seed = seed;
      config.proposer = proposer.get();
      config.draft.adaptive = false;
      config.draft.max_draft = m.draft_length;
      if (m.gains) {
        config.draft.adaptive = true;
        config.draft.proposer_stops = true;
        config.draft_token_cost = 0.3;    // chains end below reach x q = 0.45
        config.verify_token_cost = 0.15;  // alternatives dropped below reach x q = 0.15
      }
      const std::vector<int32_t> out = gen.generate(prompt, config, nullptr, &st);
      ASSERT_EQ(out.size(), 6u);
      add_sample(exact, std::span<const int32_t>(out).first(3), &s);
      total.n_drafted += st.n_drafted;
      total.n_accepted += st.n_accepted;
    }
    seed_base += kRuns;
    fit(exact, s, std::string(setting) + " " + m.name, true);
    if (m.method != Method::kPlain) {
      std::printf("%-34s drafted %lld accepted %lld\n", "", static_cast<long long>(total.n_drafted),
                  static_cast<long long>(total.n_accepted));
      // Drafts must be verified, and accepted often enough to matter for tokens 2 and 3.
      EXPECT_GT(total.n_accepted, kRuns / 10) << setting << " " << m.name;
      EXPECT_LT(total.n_accepted, total.n_drafted) << setting << " " << m.name;
    }
  }
}

TEST_F(SpecSampling, EveryMethodMatchesTheExactDistribution) {
  SamplingParams params;
  params.temperature = 1.0f;
  check_methods(*target_, prompt(), params, "t1", kMethods,
                [&](Method m, uint64_t seed) { return make_proposer(m, params, seed); });
}

TEST_F(SpecSampling, TopKTopPMatchesTheExactDistribution) {
  SamplingParams params;
  params.temperature = 1.0f;
  params.top_k = 40;
  params.top_p = 0.95f;
  const MethodSpec methods[] = {{"plain", Method::kPlain, 0},
                                {"ngram_tree", Method::kNgramTree, 6},
                                {"draft_tree_sampled_mixed", Method::kDraftSampledTree, 5}};
  check_methods(*target_, prompt(), params, "t1_topk40_topp0.95", methods,
                [&](Method m, uint64_t seed) { return make_proposer(m, params, seed); });
}

// A test-side copy of the generation loop with a pluggable verifier.
using VerifyFn = std::function<void(const TokenTree&, std::span<const float>, int,
                                    std::span<const int32_t>, Sampler&, VerifyResult*)>;

std::vector<int32_t> loop_generate(Model& target, KvCache& kv, std::span<const int32_t> prompt,
                                   const SamplingParams& params, Proposer* proposer, int k,
                                   int n_tokens, const VerifyFn& verify) {
  kv.clear();
  const int n_vocab = target.config().n_vocab;
  Sampler sampler(params);
  std::vector<int32_t> hist(prompt.begin(), prompt.end());
  std::vector<int32_t> out;
  if (proposer) proposer->begin(prompt, params.seed);
  const bool want_hidden = proposer && proposer->wants_hidden();
  std::vector<float> hidden;  // [dim] before the root, for ReDrafter
  const std::vector<float> logits =
      prefill(target, kv, prompt, 512, nullptr, want_hidden ? &hidden : nullptr);
  out.push_back(sampler.sample(logits, hist));
  hist.push_back(out.back());
  TokenTree tree;
  VerifyResult res;
  std::vector<uint8_t> mask;
  std::vector<int32_t> positions, rows;
  std::vector<int64_t> keep;
  while (static_cast<int>(out.size()) < n_tokens) {
    const int64_t past = kv.size();
    tree.reset(hist.back());
    const int budget = std::min(k, n_tokens - static_cast<int>(out.size()) - 1);
    if (proposer && budget > 0) {
      DraftRequest req;
      req.tokens = hist;
      req.max_tokens = budget;
      if (want_hidden) req.target_hidden = hidden;
      req.node_cost = GenerationConfig{}.verify_token_cost;  // as Generator
      proposer->propose(req, &tree);
    }
    tree.build_positions(past, &positions);
    tree.build_mask(&mask);
    rows.resize(tree.size());
    std::iota(rows.begin(), rows.end(), 0);
    ForwardBatch b;
    b.tokens = tree.tokens();
    b.positions = positions;
    b.mask = mask;
    b.output_rows = rows;
    b.want_hidden = want_hidden;
    const ForwardResult r = target.forward(kv, b, nullptr);
    verify(tree, r.logits, n_vocab, hist, sampler, &res);
    if (want_hidden) {
      const int dim = target.config().dim;
      hidden.assign(r.hidden.begin() + static_cast<int64_t>(res.final_node) * dim,
                    r.hidden.begin() + static_cast<int64_t>(res.final_node + 1) * dim);
    }
    keep = {past};
    for (int32_t node : res.accepted_nodes) keep.push_back(past + node);
    kv.keep_slots(past, keep);
    if (proposer) {
      proposer->observe({res.tokens.data(), res.accepted_nodes.size()}, res.bonus);
    }
    for (int32_t t : res.tokens) {
      if (static_cast<int>(out.size()) == n_tokens) break;
      out.push_back(t);
      hist.push_back(t);
    }
  }
  return out;
}

TEST_F(SpecSampling, TheSameTestRejectsBiasedVerifiers) {
  SamplingParams params;
  params.temperature = 1.0f;
  const std::vector<int32_t> p = prompt();
  const Exact exact = exact_distribution(*target_, p, params);
  KvCache kv = target_->make_kv_cache(kCtx);
  Verifier verifier;
  const VerifyFn real = [&verifier](const TokenTree& tree, std::span<const float> logits,
                                    int n_vocab, std::span<const int32_t> hist, Sampler& sampler,
                                    VerifyResult* res) {
    verifier.verify(tree, logits, n_vocab, hist, sampler, res);
  };
  // With the real verifier the loop is Generator: the same tokens for the same seeds.
  Generator gen(*target_, nullptr, kCtx);
  for (Method method : {Method::kDraftGreedy, Method::kDraftSampledTree, Method::kNgramTree,
                        Method::kReDrafter, Method::kMedusa}) {
    for (uint64_t seed = 1; seed <= 40; ++seed) {
      SamplingParams sp = params;
      sp.seed = seed;
      std::unique_ptr<Proposer> a = make_proposer(method, params, seed);
      std::unique_ptr<Proposer> b = make_proposer(method, params, seed);
      GenerationConfig config;
      config.max_new_tokens = 12;
      config.sampling = sp;
      config.proposer = a.get();
      config.draft.adaptive = false;
      config.draft.max_draft = 4;
      const std::vector<int32_t> want = gen.generate(p, config, nullptr, nullptr);
      ASSERT_EQ(loop_generate(*target_, kv, p, sp, b.get(), 4, 12, real), want) << "seed " << seed;
    }
  }
  // With a biased verifier the fit fails.
  using test::Bias;
  struct Case {
    Bias bias;
    Method method;
    const char* name;
  };
  for (const Case& c : {Case{Bias::kResampleFromP, Method::kDraftGreedy, "draft_greedy_q"},
                        Case{Bias::kResampleFromP, Method::kDraftSampled, "draft_sampled_q"},
                        Case{Bias::kEagerAccept, Method::kNgramChain, "ngram_chain"},
                        Case{Bias::kResampleFromP, Method::kReDrafter, "redrafter_3x2"},
                        Case{Bias::kEagerAccept, Method::kMedusa, "medusa_tree"}}) {
    const VerifyFn biased = [&c](const TokenTree& tree, std::span<const float> logits, int n_vocab,
                                 std::span<const int32_t> hist, Sampler& sampler,
                                 VerifyResult* res) {
      test::biased_verify(c.bias, tree, logits, n_vocab, hist, sampler, res);
    };
    Samples s = empty_samples(exact.n_vocab);
    for (int r = 0; r < kBiasedRuns; ++r) {
      SamplingParams sp = params;
      sp.seed = 500000 + r;
      std::unique_ptr<Proposer> proposer = make_proposer(c.method, params, sp.seed);
      add_sample(exact, loop_generate(*target_, kv, p, sp, proposer.get(), 4, 3, biased), &s);
    }
    const double pv =
        fit(exact, s, std::string("BIASED ") + test::bias_name(c.bias) + " " + c.name, false);
    EXPECT_LT(pv, kAlpha) << test::bias_name(c.bias) << " on " << c.name << " went unnoticed";
  }
}

}  // namespace
}  // namespace specdec
