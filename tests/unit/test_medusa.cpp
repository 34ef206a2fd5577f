// Medusa inference pieces against references: the heads' file round trip and its checks, one
// evaluation of all heads (F32 equal to the scalar reference, Q8_0 close), the tree option's
// parser (valid trees and each malformed kind), and the proposer's tree against a brute-force
// construction from the heads' sorted logits, with budgets that cut it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/random_head.h"
#include "common/test_paths.h"
#include "drafter/medusa_heads.h"
#include "drafter/medusa_proposer.h"
#include "drafter/medusa_tree.h"
#include "drafter/medusa_weights.h"
#include "drafter/redrafter_weights.h"
#include "drafter/safetensors.h"
#include "model/gguf.h"
#include "model/model.h"
#include "util/check.h"

namespace specdec {
namespace {

class MedusaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = Model::load(test::tiny_model("stories260K.gguf")).release(); }
  static void TearDownTestSuite() { delete model_; }
  static MedusaWeights heads(int k, int vd, uint64_t seed) {
    std::vector<int32_t> vocab;
    for (int i = 0; i < vd; ++i) vocab.push_back(3 + 7 * i);
    return test::random_medusa(*model_, vocab, k, seed);
  }
  static Model* model_;
};
Model* MedusaTest::model_ = nullptr;

TEST_F(MedusaTest, FileRoundTripAndChecks) {
  MedusaWeights w = heads(3, 40, 1);
  w.info["train.epochs"] = "2";
  const std::string path =
      (std::filesystem::temp_directory_path() / ("specdec_medusa_" + std::to_string(getpid()))).string();
  save_medusa(path, w);
  const MedusaWeights r = load_medusa(path);
  EXPECT_EQ(r.shape.n_heads, 3);
  EXPECT_EQ(r.shape.n_draft_vocab, 40);
  EXPECT_EQ(r.draft_vocab, w.draft_vocab);
  EXPECT_EQ(r.w_out[2], w.w_out[2]);
  EXPECT_EQ(r.w_res[1], w.w_res[1]);
  EXPECT_EQ(r.info.at("train.epochs"), "2");
  EXPECT_NO_THROW(check_medusa_target(r, *model_, path));
  MedusaWeights other = w;
  other.target_fingerprint = "llama:1:2:3";
  EXPECT_THROW(check_medusa_target(other, *model_, path), Error);
  // A ReDrafter loader refuses a Medusa file by name.
  EXPECT_THROW(load_redrafter(path), Error);
  std::filesystem::remove(path);
}

// Metadata that claims a larger dim than the tensors have: a specdec::Error before the heads'
// dim x dim matrices are allocated (2^40 floats: a bad_alloc before).
TEST_F(MedusaTest, MetadataThatLiesIsAnErrorBeforeAllocating) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("specdec_medusa_lying_" + std::to_string(getpid()))).string();
  save_medusa(path, heads(2, 40, 3));
  StFile f = read_safetensors(path);
  f.metadata["specdec.dim"] = "1048576";
  write_safetensors(path, f);
  try {
    load_medusa(path);
    ADD_FAILURE() << "a lying dim was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("heads.0.weight"), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a specdec::Error: " << e.what();
  }
  std::filesystem::remove(path);
}

TEST_F(MedusaTest, HeadsEqualTheReference) {
  const MedusaWeights w = heads(4, 50, 2);
  const int dim = w.shape.dim, vd = w.shape.n_draft_vocab;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> h(dim);
  for (float& x : h) x = nd(rng);
  std::vector<float> want(4 * vd);
  for (int k = 0; k < 4; ++k) medusa_head_ref(w, k, h.data(), want.data() + k * vd);
  for (GgmlType type : {GgmlType::kF32, GgmlType::kQ8_0}) {
    MedusaHeads mh(w, type);
    EXPECT_EQ(mh.weight_type(), type);
    std::vector<float> got(4 * vd), scratch;
    mh.run(h, got.data(), &scratch, nullptr);
    double scale = 1.0, worst = 0.0;
    for (float x : want) scale = std::max(scale, std::fabs(double(x)));
    for (int i = 0; i < 4 * vd; ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
    EXPECT_LT(worst, (type == GgmlType::kF32 ? 1e-5 : 3e-2) * scale);
  }
}

TEST_F(MedusaTest, TreeOptionParsing) {
  const MedusaTree t = parse_medusa_tree("0;1;0,0;0,1;1,0;0,0,0");
  ASSERT_EQ(t.paths.size(), 6u);
  EXPECT_EQ(t.paths[4], (std::vector<int>{1, 0}));
  EXPECT_EQ(t.depth(), 3);
  EXPECT_EQ(t.max_rank(), 2);
  EXPECT_EQ(default_medusa_tree("cuda").paths.size(), 16u);
  EXPECT_EQ(default_medusa_tree("cpu").paths.size(), 3u);
  for (const char* bad : {"", "0;;1", "0,0", "0;0", "0;x", "0;1,", "0;64", "0;-1", "0;1;1,0,0"}) {
    EXPECT_THROW(parse_medusa_tree(bad), Error) << bad;
  }
}

TEST_F(MedusaTest, ProposerBuildsTheTreeFromTheHeadsRanks) {
  const MedusaWeights w = heads(4, 30, 3);
  const int dim = w.shape.dim, vd = w.shape.n_draft_vocab;
  MedusaHeads mh(w, GgmlType::kF32);
  const MedusaTree shape = default_medusa_tree("cuda");
  MedusaProposer proposer(mh, shape, nullptr);
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> h(dim);
    for (float& x : h) x = nd(rng);
    // Brute force: each head's draft indices sorted by logit (ties to the lower index).
    std::vector<float> logits(4 * vd), scratch;
    mh.run(h, logits.data(), &scratch, nullptr);
    std::vector<std::vector<int>> order(4);
    for (int k = 0; k < 4; ++k) {
      for (int v = 0; v < vd; ++v) order[k].push_back(v);
      std::stable_sort(order[k].begin(), order[k].end(),
                       [&](int a, int b) { return logits[k * vd + a] > logits[k * vd + b]; });
    }
    for (int budget : {16, 7, 1}) {
      TokenTree tree;
      tree.reset(11);
      const std::vector<int32_t> toks = {1, 2, 11};
      DraftRequest req;
      req.tokens = toks;
      req.max_tokens = budget;
      req.target_hidden = h;
      proposer.propose(req, &tree);
      ASSERT_EQ(tree.num_drafts(), std::min<int>(budget, shape.paths.size()));
      std::map<std::vector<int>, int> node;
      for (int i = 0; i < tree.num_drafts(); ++i) {
        const std::vector<int>& p = shape.paths[i];
        const int k = static_cast<int>(p.size()) - 1;
        EXPECT_EQ(tree.token(i + 1), w.draft_vocab[order[k][p.back()]]);
        EXPECT_EQ(tree.depth(i + 1), static_cast<int>(p.size()));
        const int parent = p.size() == 1 ? 0 : node.at(std::vector<int>(p.begin(), p.end() - 1));
        EXPECT_EQ(tree.parent(i + 1), parent);
        node[p] = i + 1;
      }
    }
  }
  // No hidden state: no drafts.
  TokenTree tree;
  tree.reset(11);
  const std::vector<int32_t> toks = {11};
  DraftRequest req;
  req.tokens = toks;
  req.max_tokens = 8;
  proposer.propose(req, &tree);
  EXPECT_EQ(tree.num_drafts(), 0);
  // A tree deeper than the heads is refused.
  EXPECT_THROW(MedusaProposer(mh, parse_medusa_tree("0;0,0;0,0,0;0,0,0,0;0,0,0,0,0"), nullptr), Error);
}

}  // namespace
}  // namespace specdec
