// Speculation with trained-head proposers is lossless: greedy output with a ReDrafter head or
// Medusa heads equals plain greedy decoding for many prompts, beam shapes and trees
// (single-sequence Generator), and every request of an engine batch that mixes ReDrafter
// (several beam shapes), Medusa, n-gram and plain requests, greedy and sampled, with and
// without preemption, gets exactly its solo output (sampled: the same seed).
// The heads are random (tests/common/random_head.h) over the target's most frequent tokens, so
// drafts are accepted sometimes and rejected often: both paths run, and acceptance is asserted.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "common/random_head.h"
#include "common/solo_run.h"
#include "common/test_paths.h"
#include "drafter/head_registry.h"
#include "drafter/medusa_proposer.h"
#include "drafter/redrafter_head.h"
#include "drafter/redrafter_proposer.h"
#include "drafter/redrafter_weights.h"
#include "engine/generator.h"
#include "model/model.h"
#include "specdec/engine.h"
#include "tokenizer/tokenizer.h"

namespace specdec {
namespace {

const char* const kTexts[] = {
    "Once upon a time", "Lily and Ben went to the park.", "The little dog was sad because",
    "One day, a girl named Sue", "Tom had a red ball. He", "The sun was hot and the"};

class HeadSpec : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = Model::load(test::tiny_model("stories260K.gguf")).release();
    tok_ = Tokenizer::from_gguf(model_->file()).release();
    pool_ = new ThreadPool(2);
    std::vector<std::vector<int32_t>> prompts;
    for (const char* t : kTexts) prompts.push_back(tok_->encode(t, true, false));
    const std::vector<int32_t> vocab = test::frequent_tokens(*model_, prompts, 24);
    head_ = new ReDrafterHead(test::random_head(*model_, vocab, 32, 2, 5));
    medusa_ = new MedusaHeads(test::random_medusa(*model_, vocab, 4, 6));
  }
  static void TearDownTestSuite() {
    delete medusa_;
    delete head_;
    delete pool_;
    delete tok_;
    delete model_;
  }
  static std::vector<int32_t> prompt(int i) { return tok_->encode(kTexts[i % 6], true, false); }

  static Model* model_;
  static Tokenizer* tok_;
  static ThreadPool* pool_;
  static ReDrafterHead* head_;
  static MedusaHeads* medusa_;
};
MedusaHeads* HeadSpec::medusa_ = nullptr;
Model* HeadSpec::model_ = nullptr;
Tokenizer* HeadSpec::tok_ = nullptr;
ThreadPool* HeadSpec::pool_ = nullptr;
ReDrafterHead* HeadSpec::head_ = nullptr;

TEST_F(HeadSpec, GreedyOutputEqualsPlainDecoding) {
  Generator gen(*model_, pool_, 512);
  int64_t drafted = 0, accepted = 0;
  for (int p = 0; p < 6; ++p) {
    GenerationConfig plain;
    plain.max_new_tokens = 80;
    const std::vector<int32_t> want = gen.generate(prompt(p), plain, nullptr, nullptr);
    for (auto [m, c] : {std::pair{1, 4}, std::pair{3, 3}, std::pair{4, 4}, std::pair{2, 6},
                        std::pair{8, 2}}) {
      for (int budget : {m * c, 3, -1}) {
        // -1: the whole tree with the adaptive pruning (ReDrafterPolicy), else every node.
        ReDrafterPolicy policy;
        policy.prune = budget < 0;
        if (budget < 0) budget = m * c;
        ReDrafterProposer proposer(*head_, *model_, pool_, BeamSearchConfig{m, c}, policy);
        GenerationConfig g = plain;
        g.proposer = &proposer;
        g.draft.adaptive = false;
        g.draft.max_draft = budget;
        GenerationStats st;
        const std::vector<int32_t> got = gen.generate(prompt(p), g, nullptr, &st);
        ASSERT_EQ(got, want) << "prompt " << p << " beams " << m << "x" << c << " budget " << budget
                             << (policy.prune ? " pruned" : "");
        drafted += st.n_drafted;
        accepted += st.n_accepted;
        EXPECT_EQ(st.n_generated, 1 + st.n_forward_passes + st.n_accepted);
      }
    }
  }
  std::printf("drafted %lld accepted %lld\n", static_cast<long long>(drafted),
              static_cast<long long>(accepted));
  EXPECT_GT(accepted, 50);
  EXPECT_LT(accepted, drafted);
}

TEST_F(HeadSpec, MedusaGreedyOutputEqualsPlainDecoding) {
  Generator gen(*model_, pool_, 512);
  int64_t drafted = 0, accepted = 0;
  for (int p = 0; p < 6; ++p) {
    GenerationConfig plain;
    plain.max_new_tokens = 80;
    const std::vector<int32_t> want = gen.generate(prompt(p), plain, nullptr, nullptr);
    for (const char* tree : {"", "0;0,0;0,0,0;0,0,0,0", "0;1;2;3;4;5", "0;1;0,0;1,0;0,1;0,0,0"}) {
      for (int budget : {16, 2}) {
        MedusaProposer proposer(
            *medusa_, *tree ? parse_medusa_tree(tree) : default_medusa_tree("cuda"), pool_);
        GenerationConfig g = plain;
        g.proposer = &proposer;
        g.draft.adaptive = false;
        g.draft.max_draft = budget;
        GenerationStats st;
        ASSERT_EQ(gen.generate(prompt(p), g, nullptr, &st), want)
            << "prompt " << p << " tree '" << tree << "' budget " << budget;
        drafted += st.n_drafted;
        accepted += st.n_accepted;
      }
    }
  }
  std::printf("drafted %lld accepted %lld\n", static_cast<long long>(drafted),
              static_cast<long long>(accepted));
  EXPECT_GT(accepted, 50);
  EXPECT_LT(accepted, drafted);
}

TEST_F(HeadSpec, EngineBatchMixEqualsSoloRuns) {
  std::vector<Request> requests;
  for (int i = 0; i < 12; ++i) {
    Request r;
    r.prompt = prompt(i);
    r.max_tokens = 40 + 7 * i;
    r.ignore_eos = true;
    r.sampling.temperature = i % 3 == 2 ? 0.8f : 0.0f;
    r.sampling.seed = 100 + i;
    r.spec.adaptive = false;
    if (i % 4 == 3) {
      r.spec.method = i % 8 == 3 ? SpecMethod::kNgram : SpecMethod::kMedusa;
      r.spec.num_draft = i % 8 == 3 ? 4 : 10;
    } else if (i % 4 != 0) {
      r.spec.method = SpecMethod::kReDrafter;
      r.spec.beams = 1 + i % 5;
      r.spec.beam_length = 2 + i % 3;
      r.spec.num_draft = r.spec.beams * r.spec.beam_length;
    }
    requests.push_back(r);
  }
  for (int32_t kv_blocks : {0, 12}) {  // 12 blocks of 16: preemption
    EngineConfig config;
    config.drafter_head = head_;
    config.medusa_heads = medusa_;
    config.kv_blocks = kv_blocks;
    config.max_context = 512;
    Engine engine(*model_, tok_, pool_, config);
    std::vector<std::vector<int32_t>> out(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      Request r = requests[i];
      r.on_output = [&out, i](const RequestOutput& o) {
        out[i].insert(out[i].end(), o.tokens.begin(), o.tokens.end());
        return true;
      };
      ASSERT_TRUE(engine.submit(r).ok());
    }
    while (engine.has_work()) {
      engine.step();
      engine.check_invariants();
    }
    const EngineStats st = engine.stats();
    EXPECT_EQ(st.kv_blocks_used, 0);
    if (kv_blocks > 0) {
      EXPECT_GT(st.preemptions, 0);
    }
    ASSERT_TRUE(st.spec.count("redrafter"));
    EXPECT_GT(st.spec.at("redrafter").accepted, 0);
    ASSERT_TRUE(st.spec.count("medusa"));
    EXPECT_GT(st.spec.at("medusa").accepted, 0);
    for (size_t i = 0; i < requests.size(); ++i) {
      // A full pool cuts drafts, and sampled draws depend on the draft sizes (not their
      // distribution): only greedy requests must replay their solo runs then.
      if (kv_blocks > 0 && !requests[i].sampling.greedy()) continue;
      const std::vector<int32_t> want =
          test::solo_output(*model_, *tok_, pool_, requests[i], nullptr, 512, head_, medusa_);
      EXPECT_EQ(out[i], want) << "request " << i << " kv_blocks " << kv_blocks;
    }
  }
}

TEST_F(HeadSpec, EngineRefusesReDrafterWithoutAHead) {
  EngineConfig config;
  Engine engine(*model_, tok_, pool_, config);
  Request r;
  r.prompt = prompt(0);
  r.spec.method = SpecMethod::kReDrafter;
  const SubmitResult res = engine.submit(r);
  EXPECT_FALSE(res.ok());
  EXPECT_EQ(res.param, "spec");
  EngineConfig with_head;
  with_head.drafter_head = head_;
  Engine engine2(*model_, tok_, pool_, with_head);
  r.spec.beams = 0;
  EXPECT_EQ(engine2.submit(r).param, "beams");
  r.spec.method = SpecMethod::kMedusa;
  EXPECT_EQ(engine2.submit(r).param, "spec");  // no Medusa heads loaded
  EngineConfig with_medusa;
  with_medusa.medusa_heads = medusa_;
  Engine engine3(*model_, tok_, pool_, with_medusa);
  r.spec.medusa_tree = "0;0,0;0,0,0;0,0,0,0;0,0,0,0,0";  // deeper than the 4 heads
  EXPECT_EQ(engine3.submit(r).param, "medusa_tree");
  r.spec.medusa_tree = "0;1";
  EXPECT_TRUE(engine3.submit(r).ok());
}

// The head that ships in heads/ for the default model: found by the model's fingerprint, its
// drafts accepted on chat prompts it was not trained on, the output identical to plain decoding.
TEST(ShippedHead, DefaultModelsReDrafterHeadIsFoundAndLossless) {
  const std::string path = test::default_model_path();
  if (!test::file_exists(path)) GTEST_SKIP() << "default model missing; run scripts/setup.sh";
  std::unique_ptr<Model> model = Model::load(path);
  std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(model->file());
  const std::string head_path = find_drafter_head(*model, "redrafter");
  ASSERT_FALSE(head_path.empty()) << "no ReDrafter head in heads/ for the default model";
  const ReDrafterWeights w = load_redrafter(head_path);
  check_redrafter_target(w, *model, head_path);
  EXPECT_LE(w.shape.num_params() * 2, 16 << 20);
  ThreadPool pool(2);
  Generator gen(*model, &pool, 1024);
  // Q8_0, the class's default, and Q4_1, what the commands step on the CPU (--head-type auto).
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_1}) {
    const std::string type_name = ggml_type_name(static_cast<uint32_t>(type));
    ReDrafterHead head(w, type);
    ASSERT_EQ(head.weight_type(), type);
    int64_t passes = 0, generated = 0, accepted = 0;
    for (const char* q : {"Give me three tips for a good night's sleep.",
                          "Explain what a hash table is to a beginner.",
                          "Write a short poem about the sea."}) {
      const std::vector<int32_t> prompt =
          tok->encode(tok->apply_chat_template({{"user", q}}, true), false, true);
      GenerationConfig plain;
      plain.max_new_tokens = 64;
      const std::vector<int32_t> want = gen.generate(prompt, plain, nullptr, nullptr);
      ReDrafterPolicy every_node;  // the whole 4 x 4 tree: what the head gets right, unpruned
      every_node.prune = false;
      ReDrafterProposer proposer(head, *model, &pool, BeamSearchConfig{4, 4}, every_node);
      GenerationConfig g = plain;
      g.proposer = &proposer;
      g.draft.adaptive = false;
      g.draft.max_draft = 16;
      GenerationStats st;
      EXPECT_EQ(gen.generate(prompt, g, nullptr, &st), want) << type_name << ": " << q;
      passes += st.n_forward_passes;
      generated += st.n_generated;
      accepted += st.n_accepted;
    }
    const double per_pass = static_cast<double>(accepted + passes) / static_cast<double>(passes);
    std::printf("shipped head as %s: %lld tokens in %lld passes (%.2f a pass), %lld drafts accepted\n",
                type_name.c_str(), static_cast<long long>(generated), static_cast<long long>(passes),
                per_pass, static_cast<long long>(accepted));
    EXPECT_GT(per_pass, 1.4) << type_name;  // a random head stays near 1.0
  }
}

}  // namespace
}  // namespace specdec
