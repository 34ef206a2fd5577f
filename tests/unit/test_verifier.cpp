// Verifier::verify driven directly on a synthetic small-vocabulary "model" (logits a fixed
// pseudo-random function of the prefix): greedy follows the target's argmax path (repetition
// penalty along the path included) and never touches the Rng; with sampling, the tokens emitted
// through chains with sampled q, deterministic chains, trees of deterministic children, mixed
// trees and i.i.d. sampled siblings are distributed EXACTLY as the target's sampling
// distribution: a G-test of many seeded runs against the exact probabilities (p < 1e-4 fails).
// The same machinery rejects deliberately biased verifiers. Also: the statistics helper itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <vector>

#include "common/biased_verifier.h"
#include "common/stats.h"
#include "sample/rng.h"
#include "sample/sampler.h"
#include "speculative/verifier.h"
#include "speculative/token_tree.h"

namespace specdec {
namespace {

constexpr int kVocab = 6;
constexpr double kAlpha = 1e-4;  // a fit this unlikely fails the test

// --- The statistics helper ---------------------------------------------------------------------

TEST(Stats, ChiSquareQuantilesMatchTables) {
  struct Row {
    double dof, alpha, want;
  };
  // Standard table values (upper-tail critical points).
  const Row table[] = {{1, 0.05, 3.841},    {1, 0.01, 6.635},   {1, 0.001, 10.828},
                       {2, 0.05, 5.991},    {5, 0.05, 11.070},  {10, 0.01, 23.209},
                       {10, 0.001, 29.588}, {30, 0.05, 43.773}, {100, 0.05, 124.342}};
  for (const Row& r : table) {
    EXPECT_NEAR(test::chi_square_quantile(r.dof, r.alpha), r.want, 2e-3)
        << "dof " << r.dof << " alpha " << r.alpha;
    EXPECT_NEAR(test::chi_square_sf(r.want, r.dof), r.alpha, r.alpha * 1e-3);
    // Wilson–Hilferty: within 1% from 5 degrees of freedom up.
    if (r.dof >= 5) {
      EXPECT_NEAR(test::chi_square_quantile_wh(r.dof, r.alpha), r.want, 0.01 * r.want);
    }
  }
  EXPECT_NEAR(test::normal_upper_quantile(0.025), 1.959964, 1e-5);
  EXPECT_NEAR(test::chi_square_sf(0.0, 3), 1.0, 1e-12);
}

TEST(Stats, GTestAcceptsAFairSampleAndRejectsABiasedOne) {
  const std::vector<double> probs = {0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0};
  Rng rng(99);
  std::vector<int64_t> fair(6, 0), biased(6, 0);
  for (int i = 0; i < 20000; ++i) {
    std::vector<float> p(probs.begin(), probs.end());
    ++fair[sample_from_probs(p, rng)];
    p[0] = 0.45f;  // a 10% relative bias on the first cell
    p[1] = 0.30f;
    ++biased[sample_from_probs(p, rng)];
  }
  const test::FitResult f = test::g_test(fair, probs);
  EXPECT_EQ(f.n, 20000);
  EXPECT_EQ(f.dof, 4);
  EXPECT_GT(f.p_value, kAlpha) << f.summary();
  const test::FitResult b = test::g_test(biased, probs);
  EXPECT_LT(b.p_value, kAlpha) << b.summary();
  // One observation where the probability is 0 is impossible.
  std::vector<int64_t> impossible = fair;
  impossible[5] = 1;
  EXPECT_EQ(test::g_test(impossible, probs).p_value, 0.0);
  // Small cells are pooled: 1000 cells of expected 0.02 each become one bin.
  std::vector<double> many(1001, 0.02 / 1000);
  many[1000] = 0.98;
  std::vector<int64_t> counts(1001, 0);
  counts[1000] = 980;
  for (int i = 0; i < 20; ++i) counts[i * 37] = 1;
  const test::FitResult pooled = test::g_test(counts, many);
  EXPECT_EQ(pooled.bins, 2);
  EXPECT_GT(pooled.p_value, kAlpha) << pooled.summary();
}

// --- A synthetic model over kVocab tokens --------------------------------------------------------

uint64_t hash_prefix(std::span<const int32_t> prefix, uint64_t salt) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ salt;
  for (int32_t t : prefix) {
    h ^= static_cast<uint64_t>(t) + 0x632be59bd9b4e019ull;
    h = Rng::splitmix64(&h);
  }
  return h;
}

// Target logits for the next token after `prefix`: [kVocab] in [-2, 2].
std::vector<float> target_logits(std::span<const int32_t> prefix) {
  Rng rng(hash_prefix(prefix, 1));
  std::vector<float> l(kVocab);
  for (float& x : l) x = static_cast<float>(4.0 * rng.uniform() - 2.0);
  return l;
}

// Draft logits: the target's plus noise, so drafts are often but not always right.
std::vector<float> draft_logits(std::span<const int32_t> prefix) {
  std::vector<float> l = target_logits(prefix);
  Rng rng(hash_prefix(prefix, 2));
  for (float& x : l) x += static_cast<float>(2.0 * rng.uniform() - 1.0);
  return l;
}

std::vector<float> softmax_of(const std::vector<float>& l) {
  std::vector<float> p(l.size());
  const float mx = *std::max_element(l.begin(), l.end());
  double s = 0;
  for (size_t i = 0; i < l.size(); ++i) s += p[i] = std::exp(l[i] - mx);
  for (float& x : p) x = static_cast<float>(x / s);
  return p;
}

// Tokens of q in decreasing probability (ties: lower id first).
std::vector<int32_t> ranked(const std::vector<float>& q) {
  std::vector<int32_t> order(q.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return q[a] > q[b]; });
  return order;
}

enum class Kind {
  kSampledChain,        // 3 drafts, each sampled from q (kept in the tree)
  kSampledChainTopK,    // the same with q restricted to its top 3 (zeros where p is not)
  kGreedyChain,         // 3 deterministic drafts: argmax q
  kDeterministicTree,   // top-3 of q under the root, each followed by 2 greedy drafts
  kMixedTree,           // a sampled child, then 2 deterministic siblings; then sampled / greedy
  kIidSampledSiblings,  // 3 children sampled i.i.d. from the same q, each with a sampled child
};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kSampledChain:
      return "sampled_chain";
    case Kind::kSampledChainTopK:
      return "sampled_chain_topk";
    case Kind::kGreedyChain:
      return "greedy_chain";
    case Kind::kDeterministicTree:
      return "deterministic_tree";
    case Kind::kMixedTree:
      return "mixed_tree";
    case Kind::kIidSampledSiblings:
      return "iid_sampled_siblings";
  }
  return "?";
}

class TreeBuilder {
 public:
  explicit TreeBuilder(uint64_t seed) : rng_(seed) {}

  void build(Kind kind, std::span<const int32_t> history, TokenTree* tree) {
    tree->reset(history.back());
    history_.assign(history.begin(), history.end());
    tree_ = tree;
    switch (kind) {
      case Kind::kSampledChain:
      case Kind::kSampledChainTopK: {
        int node = 0;
        for (int d = 0; d < 3; ++d) node = add_sampled(node, kind == Kind::kSampledChainTopK);
        break;
      }
      case Kind::kGreedyChain: {
        int node = 0;
        for (int d = 0; d < 3; ++d) node = add_greedy(node);
        break;
      }
      case Kind::kDeterministicTree: {
        const std::vector<int32_t> top = ranked(q_at(0, false));
        for (int i = 0; i < 3; ++i) {
          int node = tree->add(0, top[i]);
          for (int d = 0; d < 2; ++d) node = add_greedy(node);
        }
        break;
      }
      case Kind::kMixedTree: {
        const int s = add_sampled(0, false);
        const std::vector<int32_t> top = ranked(q_at(0, false));
        int added = 0;
        for (int32_t t : top) {
          if (t == tree->token(s) || added == 2) continue;
          add_greedy(tree->add(0, t));
          ++added;
        }
        add_sampled(s, false);
        break;
      }
      case Kind::kIidSampledSiblings: {
        for (int i = 0; i < 3; ++i) add_sampled(add_sampled(0, false), false);
        break;
      }
    }
  }

 private:
  // q at `node`: softmax of the draft logits after history + path (optionally top-3 only).
  std::vector<float> q_at(int node, bool top3) {
    tree_->path_to(node, &path_);
    prefix_ = history_;
    for (int32_t n : path_) prefix_.push_back(tree_->token(n));
    std::vector<float> q = softmax_of(draft_logits(prefix_));
    if (top3) {
      const std::vector<int32_t> top = ranked(q);
      double kept = 0;
      for (int i = 0; i < 3; ++i) kept += q[top[i]];
      for (int i = 3; i < kVocab; ++i) q[top[i]] = 0;
      for (float& x : q) x = static_cast<float>(x / kept);
    }
    return q;
  }
  int add_sampled(int parent, bool top3) {
    const std::vector<float> q = q_at(parent, top3);
    const int32_t x = sample_from_probs(q, rng_);
    return tree_->add(parent, x, tree_->add_dist(q));
  }
  int add_greedy(int parent) { return tree_->add(parent, ranked(q_at(parent, false))[0]); }

  Rng rng_;
  TokenTree* tree_ = nullptr;
  std::vector<int32_t> history_, prefix_, path_;
};

// Target logits for every node of the tree: [size, kVocab].
std::vector<float> tree_logits(const TokenTree& tree, std::span<const int32_t> history) {
  std::vector<float> rows;
  std::vector<int32_t> path, prefix;
  for (int i = 0; i < tree.size(); ++i) {
    tree.path_to(i, &path);
    prefix.assign(history.begin(), history.end());
    for (int32_t n : path) prefix.push_back(tree.token(n));
    const std::vector<float> l = target_logits(prefix);
    rows.insert(rows.end(), l.begin(), l.end());
  }
  return rows;
}

const std::vector<int32_t> kPrompt = {1, 4};
constexpr int kTokens = 3;  // tokens generated per run: the joint over kVocab^3 cells

// Exact joint probabilities of the first kTokens tokens: [kVocab^kTokens], t1 most significant.
std::vector<double> exact_joint(const SamplingParams& params) {
  Sampler sampler(params);
  std::vector<double> joint(1, 1.0);
  std::vector<std::vector<int32_t>> prefixes = {kPrompt};
  std::vector<float> p;
  for (int step = 0; step < kTokens; ++step) {
    std::vector<double> next_joint;
    std::vector<std::vector<int32_t>> next_prefixes;
    for (size_t i = 0; i < prefixes.size(); ++i) {
      sampler.distribution(target_logits(prefixes[i]), prefixes[i], &p);
      for (int v = 0; v < kVocab; ++v) {
        next_joint.push_back(joint[i] * p[v]);
        next_prefixes.push_back(prefixes[i]);
        next_prefixes.back().push_back(v);
      }
    }
    joint = std::move(next_joint);
    prefixes = std::move(next_prefixes);
  }
  return joint;
}

// One run: the first token sampled plainly, then verify() rounds over trees of `kind` until
// kTokens tokens exist. Returns the joint cell index. Checks the result's invariants.
template <class VerifyFn>
int64_t run_once(Kind kind, const SamplingParams& params, uint64_t seed, VerifyFn&& verify) {
  SamplingParams sp = params;
  sp.seed = seed;
  Sampler sampler(sp);
  TreeBuilder builder(Rng::splitmix64(&seed));
  std::vector<int32_t> hist = kPrompt;
  hist.push_back(sampler.sample(target_logits(hist), hist));
  TokenTree tree;
  VerifyResult res;
  while (static_cast<int>(hist.size() - kPrompt.size()) < kTokens) {
    builder.build(kind, hist, &tree);
    const std::vector<float> logits = tree_logits(tree, hist);
    verify(tree, logits, hist, sampler, &res);
    // The accepted nodes form a path from the root; tokens are theirs plus the bonus.
    EXPECT_EQ(res.tokens.size(), res.accepted_nodes.size() + 1);
    int parent = 0;
    for (size_t i = 0; i < res.accepted_nodes.size(); ++i) {
      EXPECT_EQ(tree.parent(res.accepted_nodes[i]), parent);
      EXPECT_EQ(res.tokens[i], tree.token(res.accepted_nodes[i]));
      parent = res.accepted_nodes[i];
    }
    EXPECT_EQ(res.final_node, parent);
    EXPECT_EQ(res.tokens.back(), res.bonus);
    for (int32_t t : res.tokens) hist.push_back(t);
  }
  int64_t cell = 0;
  for (int i = 0; i < kTokens; ++i) cell = cell * kVocab + hist[kPrompt.size() + i];
  return cell;
}

struct Setting {
  const char* name;
  SamplingParams params;
};

std::vector<Setting> settings() {
  SamplingParams plain;
  plain.temperature = 1.0f;
  SamplingParams filtered;
  filtered.temperature = 0.7f;
  filtered.top_k = 4;
  filtered.top_p = 0.9f;
  SamplingParams penalized;
  penalized.temperature = 1.3f;
  penalized.repetition_penalty = 1.5f;
  penalized.min_p = 0.05f;
  return {{"t1", plain}, {"t0.7_topk4_topp0.9", filtered}, {"t1.3_penalty1.5_minp", penalized}};
}

constexpr int kRuns = 40000;

TEST(Verifier, SamplingIsExactForEveryTreeKind) {
  Verifier verifier;
  auto real = [&verifier](const TokenTree& tree, std::span<const float> logits,
                          std::span<const int32_t> hist, Sampler& sampler, VerifyResult* res) {
    verifier.verify(tree, logits, kVocab, hist, sampler, res);
  };
  const Kind kinds[] = {Kind::kSampledChain, Kind::kSampledChainTopK,
                        Kind::kGreedyChain,  Kind::kDeterministicTree,
                        Kind::kMixedTree,    Kind::kIidSampledSiblings};
  uint64_t seed_base = 1;
  for (const Setting& s : settings()) {
    const std::vector<double> want = exact_joint(s.params);
    for (Kind kind : kinds) {
      std::vector<int64_t> counts(want.size(), 0);
      for (int r = 0; r < kRuns; ++r) ++counts[run_once(kind, s.params, seed_base + r, real)];
      seed_base += kRuns;
      const test::FitResult fit = test::g_test(counts, want);
      std::printf("%-22s %-22s %s\n", s.name, kind_name(kind), fit.summary().c_str());
      EXPECT_GT(fit.p_value, kAlpha) << s.name << " " << kind_name(kind) << ": " << fit.summary();
      EXPECT_GT(fit.dof, 20) << "too few bins for a meaningful test";
    }
  }
}

TEST(Verifier, FirstEmittedTokenIsDistributedAsTheRootRow) {
  // One verify call per draw on the same history: token 0 of the result ~ p(row 0) exactly.
  Verifier verifier;
  const std::vector<int32_t> hist = {3, 1, 5};
  for (const Setting& s : settings()) {
    Sampler probe(s.params);
    std::vector<float> pf;
    probe.distribution(target_logits(hist), hist, &pf);
    const std::vector<double> want(pf.begin(), pf.end());
    for (Kind kind :
         {Kind::kSampledChain, Kind::kGreedyChain, Kind::kMixedTree, Kind::kIidSampledSiblings}) {
      SamplingParams sp = s.params;
      sp.seed = 77;
      Sampler sampler(sp);
      TreeBuilder builder(78);
      TokenTree tree;
      VerifyResult res;
      std::vector<int64_t> counts(kVocab, 0);
      for (int r = 0; r < 60000; ++r) {
        builder.build(kind, hist, &tree);
        verifier.verify(tree, tree_logits(tree, hist), kVocab, hist, sampler, &res);
        ++counts[res.tokens[0]];
      }
      const test::FitResult fit = test::g_test(counts, want);
      EXPECT_GT(fit.p_value, kAlpha) << s.name << " " << kind_name(kind) << ": " << fit.summary();
    }
  }
}

TEST(Verifier, TheSameTestRejectsBiasedVerifiers) {
  SamplingParams params;
  params.temperature = 1.0f;
  const std::vector<double> want = exact_joint(params);
  using test::Bias;
  struct Case {
    Bias bias;
    Kind kind;
  };
  for (const Case c : {Case{Bias::kResampleFromP, Kind::kGreedyChain},
                       Case{Bias::kResampleFromP, Kind::kSampledChain},
                       Case{Bias::kResampleFromP, Kind::kDeterministicTree},
                       Case{Bias::kEagerAccept, Kind::kGreedyChain}}) {
    auto biased = [&c](const TokenTree& tree, std::span<const float> logits,
                       std::span<const int32_t> hist, Sampler& sampler, VerifyResult* res) {
      test::biased_verify(c.bias, tree, logits, kVocab, hist, sampler, res);
    };
    std::vector<int64_t> counts(want.size(), 0);
    for (int r = 0; r < kRuns; ++r) ++counts[run_once(c.kind, params, 1 + r, biased)];
    const test::FitResult fit = test::g_test(counts, want);
    std::printf("biased %-15s on %-20s %s\n", test::bias_name(c.bias), kind_name(c.kind),
                fit.summary().c_str());
    EXPECT_LT(fit.p_value, kAlpha) << "bias " << test::bias_name(c.bias) << " on "
                                   << kind_name(c.kind) << " went unnoticed: " << fit.summary();
  }
}

// --- Greedy --------------------------------------------------------------------------------------

std::vector<float> rows_from(const std::vector<std::vector<float>>& rows) {
  std::vector<float> out;
  for (const auto& r : rows) out.insert(out.end(), r.begin(), r.end());
  return out;
}

TEST(Verifier, GreedyFollowsTheArgmaxPath) {
  // root(9) -> 1:2, 2:3, 3:4; 2 -> 4:5, 5:0; 5 -> 6:1
  TokenTree tree;
  tree.reset(9 % kVocab);
  tree.add(0, 2);
  tree.add(0, 3);
  tree.add(0, 4);
  tree.add(2, 5);
  tree.add(2, 0);
  tree.add(5, 1);
  const std::vector<float> logits =
      rows_from({{0.0f, 0.1f, 0.5f, 0.9f, 0.2f, 0.0f},    // 0: argmax 3 -> node 2
                 {5.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},    // 1: not on the path
                 {1.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.5f},    // 2: argmax 0 -> node 5
                 {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 9.0f},    // 3: not on the path
                 {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},    // 4
                 {0.0f, 2.0f, 1.0f, 0.0f, 0.0f, 0.0f},    // 5: argmax 1 -> node 6
                 {0.0f, 0.0f, 0.0f, 0.0f, 3.0f, 0.0f}});  // 6: leaf, bonus 4
  Sampler sampler(SamplingParams{});
  const Rng before = sampler.rng();
  Verifier verifier;
  VerifyResult res;
  const std::vector<int32_t> hist = {1, 3};
  verifier.verify(tree, logits, kVocab, hist, sampler, &res);
  EXPECT_EQ(res.accepted_nodes, (std::vector<int32_t>{2, 5, 6}));
  EXPECT_EQ(res.tokens, (std::vector<int32_t>{3, 0, 1, 4}));
  EXPECT_EQ(res.bonus, 4);
  EXPECT_EQ(res.final_node, 6);
  EXPECT_TRUE(sampler.rng() == before) << "greedy verification must not draw randomness";

  // The root's argmax is no child: nothing accepted, the bonus is that argmax.
  std::vector<float> other = logits;
  other[1] = 7.0f;  // row 0: token 1 now wins
  verifier.verify(tree, other, kVocab, hist, sampler, &res);
  EXPECT_TRUE(res.accepted_nodes.empty());
  EXPECT_EQ(res.tokens, (std::vector<int32_t>{1}));
  EXPECT_EQ(res.final_node, 0);

  // Ties go to the lower id, as in plain decoding: 2 and 3 tie at row 0 -> node 1 (token 2).
  other = logits;
  other[2] = 0.9f;
  verifier.verify(tree, other, kVocab, hist, sampler, &res);
  ASSERT_FALSE(res.accepted_nodes.empty());
  EXPECT_EQ(res.accepted_nodes[0], 1);
}

TEST(Verifier, GreedyAppliesTheRepetitionPenaltyAlongThePath) {
  // root -> 1:2 -> {2:2, 3:5}. Row 0: token 3 (in the history) 2.0 > token 2 1.8, but penalized
  // 2.0/1.3 = 1.54 < 1.8, so token 2 wins. Row 1: token 2 (now on the path) 3.0/1.3 = 2.31
  // < token 5 at 2.5, so the path continues to node 3, not node 2.
  TokenTree tree;
  tree.reset(0);
  tree.add(0, 2);
  tree.add(1, 2);
  tree.add(1, 5);
  const std::vector<float> logits = rows_from({{0.0f, 0.0f, 1.8f, 2.0f, 0.0f, 0.0f},
                                               {0.0f, 0.0f, 3.0f, 0.0f, 0.0f, 2.5f},
                                               {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},
                                               {0.0f, 4.0f, 0.0f, 0.0f, 0.0f, 0.0f}});
  SamplingParams params;
  params.repetition_penalty = 1.3f;
  Sampler sampler(params);
  Verifier verifier;
  VerifyResult res;
  const std::vector<int32_t> hist = {3, 0};
  verifier.verify(tree, logits, kVocab, hist, sampler, &res);
  EXPECT_EQ(res.accepted_nodes, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(res.tokens, (std::vector<int32_t>{2, 5, 1}));
  // Without the penalty the raw argmax path is taken: token 3 is no child -> bonus 3.
  Sampler raw(SamplingParams{});
  verifier.verify(tree, logits, kVocab, hist, raw, &res);
  EXPECT_TRUE(res.accepted_nodes.empty());
  EXPECT_EQ(res.tokens, (std::vector<int32_t>{3}));
}

TEST(Verifier, GreedyMatchesAStepByStepArgmaxOnRandomTrees) {
  Rng rng(5);
  Verifier verifier;
  VerifyResult res;
  for (int trial = 0; trial < 2000; ++trial) {
    SamplingParams params;
    params.repetition_penalty = trial % 2 ? 1.0f : 1.4f;
    Sampler sampler(params);
    std::vector<int32_t> hist = {static_cast<int32_t>(rng.next() % kVocab),
                                 static_cast<int32_t>(rng.next() % kVocab)};
    TokenTree tree;
    tree.reset(hist.back());
    const int n = 1 + static_cast<int>(rng.next() % 12);
    for (int i = 1; i < n; ++i) {
      tree.add(static_cast<int>(rng.next() % i), static_cast<int32_t>(rng.next() % kVocab));
    }
    // Coarse logits so that the tree's tokens are often the argmax (and ties happen).
    std::vector<float> logits(static_cast<size_t>(n) * kVocab);
    for (float& x : logits) x = static_cast<float>(rng.next() % 4);
    verifier.verify(tree, logits, kVocab, hist, sampler, &res);
    // Reference: at each node the penalized argmax (lowest id on ties) given the path so far.
    std::vector<int32_t> want_tokens;
    std::vector<int32_t> h = hist;
    int node = 0;
    while (true) {
      std::vector<float> row(logits.begin() + node * kVocab, logits.begin() + (node + 1) * kVocab);
      if (params.repetition_penalty != 1.0f) {
        std::vector<bool> seen(kVocab, false);
        for (int32_t t : h) seen[t] = true;
        for (int v = 0; v < kVocab; ++v) {
          if (seen[v])
            row[v] = row[v] > 0 ? row[v] / params.repetition_penalty
                                : row[v] * params.repetition_penalty;
        }
      }
      const int32_t choice =
          static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      want_tokens.push_back(choice);
      int next = -1;
      for (int32_t c : tree.children(node)) {
        if (tree.token(c) == choice) {
          next = c;
          break;
        }
      }
      if (next < 0) break;
      h.push_back(choice);
      node = next;
    }
    ASSERT_EQ(res.tokens, want_tokens) << "trial " << trial;
    ASSERT_EQ(res.final_node, node);
  }
}

TEST(Verifier, SampleFromProbsSkipsZeros) {
  Rng rng(1);
  const std::vector<float> p = {0.0f, 0.5f, 0.0f, 0.5f, 0.0f};
  std::vector<int64_t> counts(5, 0);
  for (int i = 0; i < 10000; ++i) ++counts[sample_from_probs(p, rng)];
  EXPECT_EQ(counts[0] + counts[2] + counts[4], 0);
  const test::FitResult fit = test::g_test(counts, std::vector<double>{0.0, 0.5, 0.0, 0.5, 0.0});
  EXPECT_GT(fit.p_value, kAlpha) << fit.summary();
}

}  // namespace
}  // namespace specdec
