// The distillation dataset (src/drafter/distill_data.h) on the tiny TinyStories model: its answers
// are what plain solo generation gives for the same prompts (greedy, and sampled with the
// documented seed rule); every stored hidden row is, within f16 rounding, the hidden state of a
// single forward pass over the same prefix (although the dataset computes them in packed chunks);
// the facts say what was used and skipped; save / load round-trips exactly and refuses truncated
// or corrupted files with a specdec::Error naming the file; choose_draft_vocab counts answer
// tokens only, most frequent first, ties by smaller id. One check on SmolLM2 (skipped without
// it) covers the chat template path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "backend/cpu/quant_blocks.h"
#include "backend/cpu/thread_pool.h"
#include "common/solo_run.h"
#include "common/test_paths.h"
#include "drafter/distill_data.h"
#include "model/model.h"
#include "specdec/engine.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec {
namespace {

class DistillData : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = Model::load(test::tiny_model("stories260K.gguf")).release();
    tok_ = Tokenizer::from_gguf(model_->file()).release();
    pool_ = new ThreadPool(2);
  }
  static void TearDownTestSuite() {
    delete pool_;
    delete tok_;
    delete model_;
  }

  static std::vector<std::string> prompts() {
    return {"Once upon a time",
            "   ",  // empty: skipped
            "The little dog ran to the park and",
            // over max_prompt_tokens: skipped
            "Lily and Tom were friends. They liked to play in the garden with their ball. One day "
            "the ball went over the fence and they were sad.",
            "Tim had a red car.", "The sun was hot", "Sue saw a big tree"};
  }

  static DistillOptions options() {
    DistillOptions o;
    o.chat = false;  // the tiny models have no chat template
    o.max_prompt_tokens = 16;
    o.max_new_tokens = 40;
    o.max_seqs = 2;       // fewer than the prompts, and a window of 4 submitted at a time
    o.hidden_chunk = 24;  // sequences cut across passes and packed together
    return o;
  }

  // The solo run of prompt `p` under `o` (the reference of every answer).
  static std::vector<int32_t> solo(const std::vector<int32_t>& p, const DistillOptions& o,
                                   uint64_t seed) {
    Request r;
    r.prompt = p;
    r.max_tokens = o.max_new_tokens;
    r.sampling.temperature = o.temperature;
    r.sampling.seed = seed;
    return test::solo_output(*model_, *tok_, pool_, r);
  }

  // Hidden state at the last token of tokens[0, n): one forward pass over the prefix alone.
  static std::vector<float> hidden_of_prefix(const int32_t* tokens, int64_t n) {
    KvCache kv = model_->make_kv_cache(n);
    std::vector<int32_t> positions(static_cast<size_t>(n));  // [n]
    for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    const int32_t last = static_cast<int32_t>(n - 1);
    ForwardBatch b;
    b.tokens = {tokens, static_cast<size_t>(n)};
    b.positions = positions;
    b.output_rows = {&last, 1};
    b.want_hidden = true;
    const ForwardResult r = model_->forward(kv, b, pool_);
    return {r.hidden.begin(), r.hidden.end()};  // [dim]
  }

  static Model* model_;
  static Tokenizer* tok_;
  static ThreadPool* pool_;
};

Model* DistillData::model_ = nullptr;
Tokenizer* DistillData::tok_ = nullptr;
ThreadPool* DistillData::pool_ = nullptr;

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() /
          (std::string("specdec_distill_") + std::to_string(::getpid()) + "_" + name))
      .string();
}

TEST_F(DistillData, GreedyAnswersEqualSoloGenerationAndFactsCountSkips) {
  const std::vector<std::string> ps = prompts();
  const DistillOptions o = options();
  int64_t progress_calls = 0, last_done = 0, last_total = 0;
  DistillTimings timings;
  const DistillDataset d = build_distill_dataset(
      *model_, *tok_, ps, o, pool_,
      [&](int64_t done, int64_t total) {
        ++progress_calls;
        EXPECT_EQ(done, last_done + 1);
        last_done = done;
        last_total = total;
      },
      &timings);

  // The used prompts, in order: the empty one and the long one are skipped.
  std::vector<std::vector<int32_t>> used;
  for (size_t i : {size_t{0}, size_t{2}, size_t{4}, size_t{5}, size_t{6}}) {
    used.push_back(tok_->encode(ps[i], true, true));
    ASSERT_LE(used.back().size(), static_cast<size_t>(o.max_prompt_tokens)) << ps[i];
  }
  ASSERT_GT(tok_->encode(ps[3], true, true).size(), static_cast<size_t>(o.max_prompt_tokens));
  ASSERT_EQ(d.n_seqs(), static_cast<int64_t>(used.size()));
  EXPECT_EQ(d.dim, model_->config().dim);
  EXPECT_EQ(progress_calls, d.n_seqs());
  EXPECT_EQ(last_total, d.n_seqs());

  int64_t answer_tokens = 0;
  for (size_t s = 0; s < used.size(); ++s) {
    const int64_t begin = d.seq_offsets[s], end = d.seq_offsets[s + 1];
    ASSERT_EQ(d.n_prompt[s], static_cast<int32_t>(used[s].size()));
    const std::vector<int32_t> prompt(d.tokens.begin() + begin,
                                      d.tokens.begin() + begin + d.n_prompt[s]);
    EXPECT_EQ(prompt, used[s]) << "sequence " << s;
    const std::vector<int32_t> answer(d.tokens.begin() + begin + d.n_prompt[s],
                                      d.tokens.begin() + end);
    EXPECT_EQ(answer, solo(used[s], o, 0)) << "sequence " << s;
    EXPECT_GE(answer.size(), 1u);
    EXPECT_LE(answer.size(), static_cast<size_t>(o.max_new_tokens));
    answer_tokens += static_cast<int64_t>(answer.size());
  }
  EXPECT_EQ(d.seq_offsets.back(), d.n_tokens());
  EXPECT_EQ(static_cast<int64_t>(d.hidden.size()), d.n_tokens() * d.dim);
  EXPECT_EQ(timings.answer_tokens, answer_tokens);
  // The hidden rows came with the answers: no pass of their own.
  EXPECT_EQ(timings.hidden_tokens, 0);
  EXPECT_EQ(timings.hidden_passes, 0);
  DistillOptions with_passes = o;
  with_passes.hidden_passes = true;
  DistillTimings t2;
  const DistillDataset d2 = build_distill_dataset(*model_, *tok_, ps, with_passes, pool_, {}, &t2);
  EXPECT_EQ(d2.tokens, d.tokens);
  EXPECT_EQ(t2.hidden_tokens, d.n_tokens());
  // 24-token passes: at least the tokens over 24, packed (fewer passes than pieces alone).
  EXPECT_GE(t2.hidden_passes, (d.n_tokens() + 23) / 24);

  const nlohmann::json facts = nlohmann::json::parse(d.facts);
  EXPECT_EQ(facts["target"], model_->fingerprint());
  EXPECT_EQ(facts["prompts_given"], 7);
  EXPECT_EQ(facts["prompts_used"], 5);
  EXPECT_EQ(facts["prompts_skipped_too_long"], 1);
  EXPECT_EQ(facts["prompts_skipped_empty"], 1);
  EXPECT_EQ(facts["answer_tokens"], answer_tokens);
  EXPECT_EQ(facts["options"]["max_new_tokens"], 40);
  EXPECT_EQ(facts["options"]["chat"], false);
}

// Both ways of recording: the hidden passes fill every row; the engine's rows (the default)
// fill positions n_prompt-1 .. L-2 of each sequence, and leave the others zero.
class DistillHidden : public DistillData, public ::testing::WithParamInterface<bool> {};

TEST_P(DistillHidden, RowsEqualSinglePassOverThePrefix) {
  DistillOptions o = options();
  o.max_new_tokens = 30;
  o.hidden_passes = GetParam();
  const std::vector<std::string> ps = {"Once upon a time", "Tim had a red car.", "The sun was hot"};
  const DistillDataset d = build_distill_dataset(*model_, *tok_, ps, o, pool_);
  ASSERT_EQ(d.n_seqs(), 3);
  std::vector<float> row(static_cast<size_t>(d.dim));  // [dim]
  int64_t checked = 0, exact = 0, zero_rows = 0;
  for (int64_t s = 0; s < d.n_seqs(); ++s) {
    const int64_t begin = d.seq_offsets[s], end = d.seq_offsets[s + 1];
    ASSERT_GE(end - begin, d.n_prompt[s] + 2) << "an answer of two tokens at least";
    for (int64_t t = begin; t < end; ++t) {
      d.hidden_row(t, row.data());
      if (!o.hidden_passes && (t < begin + d.n_prompt[s] - 1 || t == end - 1)) {
        EXPECT_TRUE(std::all_of(row.begin(), row.end(), [](float x) { return x == 0.0f; }))
            << "sequence " << s << " position " << t - begin << " is not recorded";
        ++zero_rows;
        continue;
      }
      const std::vector<float> ref = hidden_of_prefix(d.tokens.data() + begin, t - begin + 1);
      ASSERT_EQ(ref.size(), row.size());
      for (int i = 0; i < d.dim; ++i) {
        const float want = ref[static_cast<size_t>(i)];
        const float got = row[static_cast<size_t>(i)];
        // Half rounding: at most half an ulp of 11 bits, or of the smallest normal half.
        const float tol = std::max(std::fabs(want) * 0x1p-11f, 0x1p-25f);
        ASSERT_LE(std::fabs(got - want), tol)
            << "sequence " << s << " position " << t - begin << " dim " << i;
        exact += fp32_to_fp16(want) == d.hidden[static_cast<size_t>(t * d.dim + i)];
        ++checked;
      }
    }
  }
  // The passes are batch-invariant: the halves are exactly those of the single pass's floats.
  EXPECT_EQ(exact, checked);
  int64_t expect_zero = 0;
  for (int64_t s = 0; s < d.n_seqs() && !o.hidden_passes; ++s) expect_zero += d.n_prompt[s];
  EXPECT_EQ(zero_rows, expect_zero);
}

INSTANTIATE_TEST_SUITE_P(Recording, DistillHidden, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("HiddenPasses") : std::string("Engine");
                         });

TEST_F(DistillData, SampledAnswersUseTheSeedOfThePromptIndex) {
  DistillOptions o = options();
  o.temperature = 0.9f;
  o.seed = 77;
  const std::vector<std::string> ps = {"", "Once upon a time", "The sun was hot"};
  const DistillDataset d = build_distill_dataset(*model_, *tok_, ps, o, pool_);
  ASSERT_EQ(d.n_seqs(), 2);
  for (int64_t s = 0; s < 2; ++s) {
    const size_t index = static_cast<size_t>(s) + 1;  // the empty prompt 0 is skipped
    const std::vector<int32_t> p = tok_->encode(ps[index], true, true);
    const std::vector<int32_t> answer(d.tokens.begin() + d.seq_offsets[s] + d.n_prompt[s],
                                      d.tokens.begin() + d.seq_offsets[s + 1]);
    EXPECT_EQ(answer, solo(p, o, o.seed + index)) << "sequence " << s;
  }
  // Another seed gives other answers (the seed is used at all).
  DistillOptions o2 = o;
  o2.seed = 78;
  const DistillDataset d2 = build_distill_dataset(*model_, *tok_, ps, o2, pool_);
  EXPECT_NE(d.tokens, d2.tokens);
}

TEST_F(DistillData, MaxPromptsCountsUsedPrompts) {
  DistillOptions o = options();
  o.max_new_tokens = 4;
  o.max_prompts = 2;
  const DistillDataset d = build_distill_dataset(*model_, *tok_, prompts(), o, pool_);
  ASSERT_EQ(d.n_seqs(), 2);  // "Once upon a time" and "The little dog ..." (the empty skipped)
  EXPECT_EQ(d.n_prompt[1], static_cast<int32_t>(tok_->encode(prompts()[2], true, true).size()));
}

// Shards: the prompts from first_prompt on, joined after the shard before them, make the same
// sequences, tokens and hidden rows as one run over all prompts (answers do not depend on
// which prompts share the engine); the joined facts keep each shard's, and next_prompt says
// where the next shard starts.
TEST_F(DistillData, ShardsJoinedEqualOneRun) {
  DistillOptions o = options();
  o.max_new_tokens = 10;
  const std::vector<std::string> ps = prompts();
  const DistillDataset whole = build_distill_dataset(*model_, *tok_, ps, o, pool_);
  o.max_prompts = 2;  // "Once upon a time", (empty), "The little dog ..."
  DistillDataset a = build_distill_dataset(*model_, *tok_, ps, o, pool_);
  const nlohmann::json fa = nlohmann::json::parse(a.facts);
  ASSERT_EQ(fa["next_prompt"].get<int>(), 3);
  o.max_prompts = 0;
  o.first_prompt = 3;
  DistillDataset b = build_distill_dataset(*model_, *tok_, ps, o, pool_);
  EXPECT_EQ(nlohmann::json::parse(b.facts)["first_prompt"].get<int>(), 3);
  append_distill_dataset(a, std::move(b));
  EXPECT_EQ(a.seq_offsets, whole.seq_offsets);
  EXPECT_EQ(a.n_prompt, whole.n_prompt);
  EXPECT_EQ(a.tokens, whole.tokens);
  EXPECT_EQ(a.hidden, whole.hidden);
  const nlohmann::json joined = nlohmann::json::parse(a.facts);
  EXPECT_EQ(joined["target"], nlohmann::json::parse(whole.facts)["target"]);
  ASSERT_EQ(joined["shards"].size(), 2u);
  EXPECT_EQ(joined["shards"][1]["first_prompt"].get<int>(), 3);

  DistillDataset other;  // another width: refused, `a` unchanged
  other.dim = a.dim + 1;
  other.seq_offsets = {0};
  const std::vector<int32_t> before = a.tokens;
  EXPECT_THROW(append_distill_dataset(a, std::move(other)), Error);
  EXPECT_EQ(a.tokens, before);
  o.first_prompt = static_cast<int>(ps.size());  // past the end: nothing usable
  EXPECT_THROW(build_distill_dataset(*model_, *tok_, ps, o, pool_), Error);
}

TEST_F(DistillData, NoUsablePromptOrBadOptionsThrow) {
  DistillOptions o = options();
  const std::vector<std::string> none = {"", "  "};
  EXPECT_THROW(build_distill_dataset(*model_, *tok_, none, o, pool_), Error);
  o.max_prompt_tokens = 2;  // every prompt is longer
  const std::vector<std::string> ps = prompts();
  EXPECT_THROW(build_distill_dataset(*model_, *tok_, ps, o, pool_), Error);
  o = options();
  o.max_new_tokens = 0;
  EXPECT_THROW(build_distill_dataset(*model_, *tok_, ps, o, pool_), Error);
}

TEST_F(DistillData, ChatPromptsAreRenderedAsGenerateChatDoes) {
  DistillOptions o = options();
  o.chat = true;  // no template in the file: ChatML, as llama.cpp defaults
  o.max_prompt_tokens = 200;
  o.max_new_tokens = 4;
  const std::vector<std::string> ps = {"Once upon a time"};
  const DistillDataset d = build_distill_dataset(*model_, *tok_, ps, o, pool_);
  const std::vector<int32_t> want =
      tok_->encode(tok_->apply_chat_template({{"user", ps[0]}}, true), false, true);
  ASSERT_EQ(d.n_seqs(), 1);
  EXPECT_EQ(std::vector<int32_t>(d.tokens.begin(), d.tokens.begin() + d.n_prompt[0]), want);
}

// ---- save / load ----

DistillDataset small_dataset() {
  DistillDataset d;
  d.dim = 3;
  d.seq_offsets = {0, 5, 8};
  d.n_prompt = {2, 1};
  d.tokens = {1, 7, 7, 9, 2, 1, 4, 4};
  for (int i = 0; i < 8 * 3; ++i) d.hidden.push_back(fp32_to_fp16(0.25f * i - 2.0f));
  d.facts = R"({"target":"llama:32:3:00","prompts_used":2})";
  return d;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// load must throw a specdec::Error that names the file.
void expect_load_error(const std::string& path, const std::string& what) {
  try {
    load_distill_dataset(path);
    ADD_FAILURE() << "loaded a bad file: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

void expect_same(const DistillDataset& a, const DistillDataset& b) {
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.seq_offsets, b.seq_offsets);
  EXPECT_EQ(a.n_prompt, b.n_prompt);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.facts, b.facts);
}

TEST_F(DistillData, SaveLoadRoundTripOfABuiltDatasetIsExact) {
  DistillOptions o = options();
  o.max_new_tokens = 12;
  const DistillDataset d = build_distill_dataset(*model_, *tok_, prompts(), o, pool_);
  const std::string path = temp_path("built.sdds");
  save_distill_dataset(path, d);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  const DistillDataset back = load_distill_dataset(path);
  expect_same(d, back);
  std::vector<float> r1(static_cast<size_t>(d.dim)), r2(static_cast<size_t>(d.dim));
  d.hidden_row(d.n_tokens() - 1, r1.data());
  back.hidden_row(back.n_tokens() - 1, r2.data());
  EXPECT_EQ(r1, r2);
  std::filesystem::remove(path);
}

TEST(DistillFile, RoundTripAndLayout) {
  const DistillDataset d = small_dataset();
  const std::string path = temp_path("small.sdds");
  save_distill_dataset(path, d);
  const std::string bytes = read_bytes(path);
  // The documented layout: 28 header bytes, offsets, n_prompt, tokens, halves, facts.
  const size_t want = 28 + 3 * 8 + 2 * 4 + 8 * 4 + 8 * 3 * 2 + 8 + d.facts.size();
  ASSERT_EQ(bytes.size(), want);
  EXPECT_EQ(bytes.substr(0, 4), "SDDS");
  EXPECT_EQ(bytes.substr(bytes.size() - d.facts.size()), d.facts);
  expect_same(d, load_distill_dataset(path));
  std::filesystem::remove(path);
}

TEST(DistillFile, TruncatedFilesThrow) {
  const DistillDataset d = small_dataset();
  const std::string path = temp_path("trunc.sdds");
  save_distill_dataset(path, d);
  const std::string bytes = read_bytes(path);
  const std::string cut = temp_path("cut.sdds");
  for (size_t n : {size_t{0}, size_t{3}, size_t{20}, size_t{28}, size_t{40}, size_t{100},
                   bytes.size() - d.facts.size() - 8, bytes.size() - 1}) {
    ASSERT_LT(n, bytes.size());
    write_bytes(cut, bytes.substr(0, n));
    expect_load_error(cut, "cut to " + std::to_string(n) + " bytes");
  }
  write_bytes(cut, bytes + "x");  // trailing data
  expect_load_error(cut, "one byte appended");
  expect_load_error(temp_path("missing.sdds"), "missing file");
  std::filesystem::remove(path);
  std::filesystem::remove(cut);
}

TEST(DistillFile, CorruptedFilesThrow) {
  const DistillDataset d = small_dataset();
  const std::string path = temp_path("good.sdds");
  save_distill_dataset(path, d);
  const std::string good = read_bytes(path);
  const std::string bad = temp_path("bad.sdds");
  // Overwrites bytes at `at` of a copy of the good file with the value's bytes.
  auto corrupt = [&](size_t at, auto value, const std::string& what) {
    std::string b = good;
    std::memcpy(b.data() + at, &value, sizeof(value));
    write_bytes(bad, b);
    expect_load_error(bad, what);
  };
  const size_t offsets_at = 28, n_prompt_at = offsets_at + 3 * 8, tokens_at = n_prompt_at + 2 * 4;
  const size_t facts_len_at = tokens_at + 8 * 4 + 8 * 3 * 2;
  corrupt(0, 'X', "magic");
  corrupt(4, uint32_t{2}, "version");
  corrupt(8, uint32_t{0}, "dim 0");
  corrupt(8, uint32_t{4}, "dim too large for the file");
  corrupt(12, uint64_t{3}, "n_seqs too large for the file");
  corrupt(12, uint64_t{1} << 60, "n_seqs huge");
  corrupt(20, uint64_t{9}, "n_tokens too large for the file");
  corrupt(20, uint64_t{7}, "n_tokens too small for the file");
  corrupt(offsets_at, int64_t{1}, "first offset not 0");
  corrupt(offsets_at + 8, int64_t{0}, "offsets not increasing");
  corrupt(offsets_at + 8, int64_t{9}, "offset past the tokens");
  corrupt(offsets_at + 16, int64_t{7}, "last offset not n_tokens");
  corrupt(n_prompt_at, int32_t{0}, "n_prompt 0");
  corrupt(n_prompt_at + 4, int32_t{4}, "n_prompt past its sequence");
  corrupt(tokens_at + 4, int32_t{-3}, "negative token");
  corrupt(facts_len_at, uint64_t{5}, "facts length");
  corrupt(facts_len_at + 8, '!', "facts not JSON");
  // The untouched file still loads (the corruptions above are what failed).
  expect_same(d, load_distill_dataset(path));
  std::filesystem::remove(path);
  std::filesystem::remove(bad);
}

TEST(DistillFile, SaveRefusesAnInconsistentDataset) {
  const std::string path = temp_path("inconsistent.sdds");
  DistillDataset d = small_dataset();
  d.hidden.pop_back();
  EXPECT_THROW(save_distill_dataset(path, d), Error);
  d = small_dataset();
  d.n_prompt[1] = 5;
  EXPECT_THROW(save_distill_dataset(path, d), Error);
  EXPECT_FALSE(std::filesystem::exists(path));
}

// ---- choose_draft_vocab ----

TEST(DistillVocab, MostFrequentAnswerTokensTiesBySmallerId) {
  DistillDataset d;
  d.dim = 1;
  // sequence 0: prompt [9 9 9 9], answer [5 3 3 7]; sequence 1: prompt [1], answer [5 7 2 3 8]
  d.seq_offsets = {0, 8, 14};
  d.n_prompt = {4, 1};
  d.tokens = {9, 9, 9, 9, 5, 3, 3, 7, 1, 5, 7, 2, 3, 8};
  d.hidden.assign(14, 0);
  // answer counts: 3 -> 3, 5 -> 2, 7 -> 2, 2 -> 1, 8 -> 1 (9 and 1 only in prompts)
  EXPECT_EQ(choose_draft_vocab(d, 3), (std::vector<int32_t>{3, 5, 7}));
  EXPECT_EQ(choose_draft_vocab(d, 4), (std::vector<int32_t>{3, 5, 7, 2}));
  EXPECT_EQ(choose_draft_vocab(d, 100), (std::vector<int32_t>{3, 5, 7, 2, 8}));
  EXPECT_EQ(choose_draft_vocab(d, 1), (std::vector<int32_t>{3}));
  EXPECT_TRUE(choose_draft_vocab(d, 0).empty());
  EXPECT_THROW(choose_draft_vocab(d, -1), Error);
}

// ---- the default model: the chat template path on a real template ----

TEST(DistillSmolLM2, ChatAnswersEqualSoloGeneration) {
  const std::string path = test::default_model_path();
  if (!test::file_exists(path)) GTEST_SKIP() << "default model missing at " << path;
  std::unique_ptr<Model> model = Model::load(path);
  std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(model->file());
  ThreadPool pool(2);
  DistillOptions o;
  o.chat = true;
  o.max_new_tokens = 24;
  o.max_seqs = 2;
  const std::vector<std::string> ps = {"What is 2+2?", "Name three colors."};
  const DistillDataset d = build_distill_dataset(*model, *tok, ps, o, &pool);
  ASSERT_EQ(d.n_seqs(), 2);
  for (int64_t s = 0; s < 2; ++s) {
    Request r;
    r.prompt = tok->encode(tok->apply_chat_template({{"user", ps[static_cast<size_t>(s)]}}, true),
                           false, true);
    r.max_tokens = o.max_new_tokens;
    ASSERT_EQ(std::vector<int32_t>(d.tokens.begin() + d.seq_offsets[s],
                                   d.tokens.begin() + d.seq_offsets[s] + d.n_prompt[s]),
              r.prompt);
    EXPECT_EQ(std::vector<int32_t>(d.tokens.begin() + d.seq_offsets[s] + d.n_prompt[s],
                                   d.tokens.begin() + d.seq_offsets[s + 1]),
              test::solo_output(*model, *tok, &pool, r))
        << "sequence " << s;
  }
  // "What is 2+2?" is answered in fewer than 24 tokens: the answer ends with the end-of-
  // generation token, kept as its last token, and nothing follows it.
  const int32_t last = d.tokens[static_cast<size_t>(d.seq_offsets[1] - 1)];
  EXPECT_TRUE(tok->is_eog(last)) << "last token " << last;
  for (int64_t t = d.seq_offsets[0] + d.n_prompt[0]; t + 1 < d.seq_offsets[1]; ++t) {
    EXPECT_FALSE(tok->is_eog(d.tokens[static_cast<size_t>(t)])) << "at " << t;
  }
  const nlohmann::json facts = nlohmann::json::parse(d.facts);
  EXPECT_EQ(facts["target"], model->fingerprint());
  EXPECT_GE(facts["answers_ended_by_eog"], 1);
}

}  // namespace
}  // namespace specdec
