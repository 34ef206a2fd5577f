// The tiny TinyStories models against reference outputs from an independent implementation
// (../shared/golden): prompt logits (top-8 at every position) within 1e-3 with a float KV cache
// (the reference's arithmetic), within 1e-2 with the default f16 cache, and 128-token greedy
// continuations identical with either.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "backend/cpu/thread_pool.h"
#include "common/test_paths.h"
#include "engine/generator.h"
#include "model/gguf.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace specdec {
namespace {

struct GoldenCase {
  std::string model_file;
  std::string golden_name;
};

class GoldenTest : public ::testing::TestWithParam<GoldenCase> {};

nlohmann::json load_golden(const std::string& name) {
  return nlohmann::json::parse(test::read_file(test::golden_file(name.c_str())));
}

// Every prompt's logits against the reference's top 8 at every position, the KV cache stored as
// kv_type: each within `tolerance`, and the reference's best token ours too.
void check_prompt_logits(const GoldenCase& gc, KvType kv_type, float tolerance) {
  auto model = Model::load(test::tiny_model(gc.model_file.c_str()));
  const nlohmann::json golden = load_golden(gc.golden_name);
  ThreadPool pool(2);
  const int n_vocab = model->config().n_vocab;
  ASSERT_EQ(n_vocab, golden["n_vocab"].get<int>());
  for (const auto& c : golden["cases"]) {
    const std::vector<int32_t> tokens = c["tokens"].get<std::vector<int32_t>>();
    const int n = static_cast<int>(tokens.size());
    std::vector<int32_t> positions(n), rows(n);
    for (int i = 0; i < n; ++i) positions[i] = rows[i] = i;
    KvCache kv = model->make_kv_cache(256, kv_type);
    ForwardBatch b;
    b.tokens = tokens;
    b.positions = positions;
    b.output_rows = rows;
    const ForwardResult r = model->forward(kv, b, &pool);
    const auto& topk = c["prompt_logits_topk"];
    ASSERT_EQ(static_cast<int>(topk.size()), n);
    for (int i = 0; i < n; ++i) {
      const float* row = r.logits.data() + static_cast<size_t>(i) * n_vocab;
      float max_err = 0;
      for (const auto& pair : topk[i]) {
        const int id = pair[0].get<int>();
        const float want = pair[1].get<float>();
        max_err = std::max(max_err, std::abs(row[id] - want));
      }
      EXPECT_LE(max_err, tolerance) << c["prompt"] << " position " << i;
      // And the reference's best token is ours too.
      const int ours = static_cast<int>(std::max_element(row, row + n_vocab) - row);
      EXPECT_EQ(ours, topk[i][0][0].get<int>()) << c["prompt"] << " position " << i;
    }
  }
}

TEST_P(GoldenTest, PromptLogitsMatchTop8) {
  check_prompt_logits(GetParam(), KvType::kF32, 1e-3f);
}

// An f16 cache rounds every K/V element to 11 significant bits (relative error <= 2^-11); through
// the models' layers that moves the logits by up to ~2e-2 (measured: at most 0.006 for
// stories260K and 0.021 for tinystories280K over the golden prompts, logits of magnitude ~5-15).
// The bound 0.05 leaves room for that and still fails a conversion that stores every element
// three half-ulps off (measured: 0.12), let alone a wrong exponent or swapped halves; the
// rounding itself is checked bit for bit by Ops.F32ToF16EqualsReference.
TEST_P(GoldenTest, PromptLogitsMatchTop8F16Cache) {
  check_prompt_logits(GetParam(), KvType::kF16, 0.05f);
}

void check_greedy(const GoldenCase& gc, KvType kv_type) {
  auto model = Model::load(test::tiny_model(gc.model_file.c_str()));
  auto tok = Tokenizer::from_gguf(model->file());
  const nlohmann::json golden = load_golden(gc.golden_name);
  ThreadPool pool(2);
  Generator gen(*model, &pool, model->config().n_ctx_train, kv_type);
  for (const auto& c : golden["cases"]) {
    const std::vector<int32_t> tokens = c["tokens"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok->encode(c["prompt"].get<std::string>(), true, false), tokens);
    const std::vector<int32_t> want = c["greedy"].get<std::vector<int32_t>>();
    GenerationConfig config;
    config.max_new_tokens = static_cast<int>(want.size());
    const std::vector<int32_t> got = gen.generate(tokens, config, nullptr, nullptr);
    EXPECT_EQ(got, want) << c["prompt"];
    EXPECT_EQ(tok->decode(got, DecodeOptions{.text_start = false}), c["greedy_text"].get<std::string>()) << c["prompt"];
  }
}

TEST_P(GoldenTest, Greedy128TokensIdentical) {
  check_greedy(GetParam(), KvType::kF16);
}

TEST_P(GoldenTest, Greedy128TokensIdenticalF32Cache) {
  check_greedy(GetParam(), KvType::kF32);
}

// The same logits whether the prompt runs in one pass, in chunks, or token by token.
TEST_P(GoldenTest, ChunkingDoesNotChangeLogits) {
  const GoldenCase& gc = GetParam();
  auto model = Model::load(test::tiny_model(gc.model_file.c_str()));
  const nlohmann::json golden = load_golden(gc.golden_name);
  const std::vector<int32_t> tokens = golden["cases"][3]["tokens"].get<std::vector<int32_t>>();
  const int n = static_cast<int>(tokens.size());
  const int n_vocab = model->config().n_vocab;
  std::vector<float> whole;
  {
    KvCache kv = model->make_kv_cache(n);
    whole = prefill(*model, kv, tokens, n, nullptr);
  }
  for (int chunk : {1, 3, 7}) {
    KvCache kv = model->make_kv_cache(n);
    const std::vector<float> got = prefill(*model, kv, tokens, chunk, nullptr);
    ASSERT_EQ(got.size(), static_cast<size_t>(n_vocab));
    for (int v = 0; v < n_vocab; ++v) ASSERT_NEAR(got[v], whole[v], 1e-4) << "chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, GoldenTest,
                         ::testing::Values(GoldenCase{"stories260K.gguf", "stories260K.json"},
                                           GoldenCase{"tinystories280K.gguf",
                                                      "tinystories280K.json"}),
                         [](const auto& info) {
                           return info.param.golden_name.substr(0, info.param.golden_name.find('.'));
                         });

}  // namespace
}  // namespace specdec
