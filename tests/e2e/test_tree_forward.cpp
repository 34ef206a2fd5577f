// The tree forward pass and KV rollback that speculative decoding stands on, on stories260K and
// SmolLM2: the logits of every node of one tree pass (TokenTree::build_mask / build_positions)
// equal those of decoding that node's branch alone as a chain after the same prefix (1e-4);
// after keep_slots with any node's path the cache's K and V rows (all layers) equal those of
// plainly decoding that path (1e-5) and decoding continues identically; truncate after a chain
// does the same; an explicit causal mask equals the implicit one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "common/test_paths.h"
#include "engine/generator.h"
#include "model/model.h"
#include "speculative/token_tree.h"
#include "tokenizer/tokenizer.h"

namespace specdec {
namespace {

// node:     0   1   2   3   4   5   6   7   8   9
// parent:   -   0   1   2   0   4   1   0   6   3
// Node 6 hangs under node 1 after node 4's branch, so paths like 0-1-6-8 see KV slots that are
// not contiguous (past+0, +1, +6, +8): the attention's run splitting is exercised.
const std::vector<int> kParents = {-1, 0, 1, 2, 0, 4, 1, 0, 6, 3};

TokenTree make_tree(const std::vector<int32_t>& tokens) {
  TokenTree tree;
  tree.reset(tokens[0]);
  for (size_t i = 1; i < kParents.size(); ++i) tree.add(kParents[i], tokens[i]);
  return tree;
}

// Runs `tokens` as a chain at positions past, past+1, ... and returns the last row's logits.
std::vector<float> run_chain(Model& model, KvCache& kv, const std::vector<int32_t>& tokens,
                             ThreadPool* pool, bool explicit_mask = false) {
  const int n = static_cast<int>(tokens.size());
  std::vector<int32_t> positions(n);
  for (int i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(kv.size() + i);
  std::vector<uint8_t> mask;  // [n, n]
  if (explicit_mask) {
    mask.assign(static_cast<size_t>(n) * n, 0);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j <= i; ++j) mask[i * n + j] = 1;
    }
  }
  const int32_t last = n - 1;
  ForwardBatch b;
  b.tokens = tokens;
  b.positions = positions;
  b.mask = mask;
  b.output_rows = {&last, 1};
  const ForwardResult r = model.forward(kv, b, pool);
  return {r.logits.begin(), r.logits.end()};
}

float max_diff(const float* a, const float* b, size_t n) {
  float d = 0;
  for (size_t i = 0; i < n; ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

// Largest |difference| over all layers' K and V rows [0, a.size()) (as floats); requires equal
// sizes.
float kv_diff(const KvCache& a, const KvCache& b) {
  EXPECT_EQ(a.size(), b.size());
  EXPECT_EQ(a.type(), b.type());
  float d = 0;
  const int64_t slots = std::min(a.size(), b.size());
  const auto n = static_cast<size_t>(slots * a.row_elems());
  std::vector<float> ak(n), av(n), bk(n), bv(n);  // [slots, n_kv_heads, head_dim]
  for (int l = 0; l < a.n_layers(); ++l) {
    a.read(l, 0, slots, ak.data(), av.data());
    b.read(l, 0, slots, bk.data(), bv.data());
    d = std::max(d, max_diff(ak.data(), bk.data(), n));
    d = std::max(d, max_diff(av.data(), bv.data(), n));
  }
  return d;
}

struct Tolerance {
  float logits = 1e-4f;
  float kv = 1e-5f;
};

void check_tree_forward(Model& model, ThreadPool* pool, const std::vector<int32_t>& prefix,
                        const std::vector<int32_t>& node_tokens, const char* name,
                        KvType kv_type = KvType::kF16) {
  const Tolerance tol;
  const int n_vocab = model.config().n_vocab;
  const TokenTree tree = make_tree(node_tokens);
  const int n = tree.size();
  const int64_t past = static_cast<int64_t>(prefix.size());
  const int64_t cap = past + n + 2;

  KvCache base = model.make_kv_cache(cap, kv_type);
  prefill(model, base, prefix, 512, pool);
  ASSERT_EQ(base.size(), past);

  // 1. One pass over the whole tree.
  KvCache tree_kv = base;
  std::vector<uint8_t> mask;
  std::vector<int32_t> positions, rows(n);
  tree.build_mask(&mask);
  tree.build_positions(past, &positions);
  for (int i = 0; i < n; ++i) rows[i] = i;
  ForwardBatch b;
  b.tokens = tree.tokens();
  b.positions = positions;
  b.mask = mask;
  b.output_rows = rows;
  const ForwardResult r = model.forward(tree_kv, b, pool);
  const std::vector<float> tree_logits(r.logits.begin(), r.logits.end());  // [n, n_vocab]
  ASSERT_EQ(tree_kv.size(), past + n);
  {
    // The mask matters: the same nodes run as a causal chain give clearly different logits
    // (so the comparisons below can fail).
    KvCache causal_kv = base;
    ForwardBatch c = b;
    c.mask = {};
    const ForwardResult cr = model.forward(causal_kv, c, pool);
    EXPECT_GT(max_diff(cr.logits.data(), tree_logits.data(), tree_logits.size()), 1e-2f) << name;
  }

  // 2. Each node's branch alone, as a chain after the same prefix.
  std::vector<KvCache> branch_kv;
  std::vector<int32_t> path;
  float worst_logits = 0;
  for (int i = 0; i < n; ++i) {
    tree.path_to(i, &path);
    std::vector<int32_t> chain = {tree.token(0)};
    for (int32_t node : path) chain.push_back(tree.token(node));
    branch_kv.push_back(base);
    const std::vector<float> want = run_chain(model, branch_kv.back(), chain, pool);
    const float d =
        max_diff(tree_logits.data() + static_cast<size_t>(i) * n_vocab, want.data(), n_vocab);
    worst_logits = std::max(worst_logits, d);
    EXPECT_LE(d, tol.logits) << name << ": node " << i << " logits differ from its branch";
  }

  // 3. Keep any node's path: the cache equals plain decoding of that path, and decoding goes on
  // the same way from both.
  float worst_kv = 0, worst_next = 0;
  const int32_t next_token = node_tokens[1];
  for (int i = 0; i < n; ++i) {
    tree.path_to(i, &path);
    std::vector<int64_t> keep = {past};
    for (int32_t node : path) keep.push_back(past + node);
    KvCache kept = tree_kv;
    kept.keep_slots(past, keep);
    ASSERT_EQ(kept.size(), past + 1 + static_cast<int64_t>(path.size()));
    const float d = kv_diff(kept, branch_kv[i]);
    worst_kv = std::max(worst_kv, d);
    EXPECT_LE(d, tol.kv) << name << ": KV after keep_slots of node " << i << "'s path";
    KvCache plain = branch_kv[i];
    const std::vector<float> a = run_chain(model, kept, {next_token}, pool);
    const std::vector<float> want = run_chain(model, plain, {next_token}, pool);
    const float dn = max_diff(a.data(), want.data(), n_vocab);
    worst_next = std::max(worst_next, dn);
    EXPECT_LE(dn, tol.logits) << name << ": decoding after keep_slots of node " << i;
  }

  // 4. A chain root-1-2-3, truncated to root-1: equals the branch of node 1, and the next token
  // (node 6's) gives node 6's tree logits.
  KvCache chain_kv = base;
  run_chain(model, chain_kv, {tree.token(0), tree.token(1), tree.token(2), tree.token(3)}, pool);
  chain_kv.truncate(past + 2);
  const float dt = kv_diff(chain_kv, branch_kv[1]);
  EXPECT_LE(dt, tol.kv) << name << ": KV after truncate";
  const std::vector<float> after = run_chain(model, chain_kv, {tree.token(6)}, pool);
  const float da = max_diff(after.data(), tree_logits.data() + 6 * n_vocab, n_vocab);
  EXPECT_LE(da, tol.logits) << name << ": decoding after truncate";

  // 5. An explicit causal mask is the same as none.
  KvCache m1 = base, m2 = base;
  const std::vector<int32_t> chain = {tree.token(0), tree.token(1), tree.token(2)};
  const std::vector<float> implicit = run_chain(model, m1, chain, pool, false);
  const std::vector<float> explicit_causal = run_chain(model, m2, chain, pool, true);
  EXPECT_LE(max_diff(implicit.data(), explicit_causal.data(), n_vocab), tol.logits) << name;

  std::printf(
      "%s: max |tree - branch| logits %.3g, KV after keep_slots %.3g, next-token logits "
      "%.3g, truncate KV %.3g / logits %.3g\n",
      name, worst_logits, worst_kv, worst_next, dt, da);
}

TEST(TreeForward, Stories260K) {
  auto model = Model::load(test::tiny_model("stories260K.gguf"));
  auto tok = Tokenizer::from_gguf(model->file());
  ThreadPool pool(2);
  const std::vector<int32_t> prefix =
      tok->encode("One day, a little girl named Lily went to the park.", true, false);
  std::vector<int32_t> nodes = tok->encode(" She saw a big dog and a red ball", false, false);
  ASSERT_GE(nodes.size(), kParents.size());
  nodes.resize(kParents.size());
  check_tree_forward(*model, &pool, prefix, nodes, "stories260K");
  // Without a pool, and with a one-token prefix.
  check_tree_forward(*model, nullptr, {tok->bos_id()}, nodes, "stories260K (no pool, BOS)");
  // A float cache.
  check_tree_forward(*model, &pool, prefix, nodes, "stories260K (f32 KV)", KvType::kF32);
  // A q8_0 cache.
  check_tree_forward(*model, &pool, prefix, nodes, "stories260K (q8_0 KV)", KvType::kQ8);
}

TEST(TreeForward, SmolLM2) {
  const std::string path = test::default_model_path();
  if (!test::file_exists(path)) {
    GTEST_SKIP() << "default model missing at " << path << "; run scripts/setup.sh";
  }
  auto model = Model::load(path);
  auto tok = Tokenizer::from_gguf(model->file());
  ThreadPool pool(2);
  const std::vector<int32_t> prefix = tok->encode("The town library opens at nine", false, false);
  std::vector<int32_t> nodes =
      tok->encode(" in the morning, and on most days a small line forms", false, false);
  ASSERT_GE(nodes.size(), kParents.size());
  nodes.resize(kParents.size());
  check_tree_forward(*model, &pool, prefix, nodes, "SmolLM2");
}

}  // namespace
}  // namespace specdec
