// The engine against single-sequence generation: every request's output in a batch equals its
// solo run (Generator with a contiguous cache), greedy and sampled, plain and speculative; prefix
// reuse computes only the suffix and changes nothing; a pool too small for the work preempts
// and still gives every request its solo output and leaks no block; cancellation frees blocks;
// bad requests get errors naming the limit while the others go on; submit / cancel from several
// threads while the loop steps.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "common/busy_threads.h"
#include "common/solo_run.h"
#include "common/test_paths.h"
#include "engine/generator.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "specdec/engine.h"
#include "speculative/ngram.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec {
namespace {

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = Model::load(test::tiny_model("stories260K.gguf")).release();
    draft_ = Model::load(test::tiny_model("tinystories280K.gguf")).release();
    tok_ = Tokenizer::from_gguf(model_->file()).release();
    pool_ = new ThreadPool(2);
  }
  static void TearDownTestSuite() {
    delete pool_;
    delete tok_;
    delete draft_;
    delete model_;
  }

  // A prompt of `len` tokens: BOS, the encoded story start, then deterministic filler.
  static std::vector<int32_t> prompt(int len, uint32_t seed, const char* text = "Once upon a time") {
    std::vector<int32_t> p = tok_->encode(text, true, false);
    std::mt19937 rng(seed);
    while (static_cast<int>(p.size()) < len) {
      p.push_back(static_cast<int32_t>(3 + rng() % (model_->config().n_vocab - 3)));
    }
    p.resize(static_cast<size_t>(len));
    return p;
  }

  // Solo output with the single-sequence Generator (contiguous KV cache).
  static std::vector<int32_t> solo(const Request& r) {
    return test::solo_output(*model_, *tok_, pool_, r);
  }

  struct Collected {
    std::vector<int32_t> tokens;
    std::string text;
    bool finished = false;
    int finish_calls = 0;
    StopReason reason = StopReason::kNone;
    RequestStats stats;
  };

  // Runs every request through one engine (all submitted up front), stepping until done.
  static std::vector<Collected> run_all(std::vector<Request> requests, EngineConfig config,
                                        Engine** keep = nullptr) {
    Engine engine(*model_, tok_, pool_, config);
    std::vector<Collected> out(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      requests[i].on_output = [&out, i](const RequestOutput& o) {
        out[i].tokens.insert(out[i].tokens.end(), o.tokens.begin(), o.tokens.end());
        out[i].text += o.text;
        if (o.finished) {
          out[i].finished = true;
          ++out[i].finish_calls;
          out[i].reason = o.reason;
        }
        out[i].stats = o.stats;
        return true;
      };
      const SubmitResult r = engine.submit(requests[i]);
      EXPECT_TRUE(r.ok()) << r.error;
    }
    int guard = 0;
    while (engine.has_work()) {
      engine.step();
      engine.check_invariants();
      if (++guard > 100000) ADD_FAILURE() << "the engine does not finish";
      if (guard > 100000) break;
    }
    const EngineStats st = engine.stats();
    EXPECT_EQ(st.kv_blocks_used, 0) << "blocks leaked";
    EXPECT_EQ(st.requests_running, 0);
    return out;
  }

  // Runs r alone on a fresh engine: each output goes to `each`, the tokens (checked against the
  // solo run) are returned. With speculation, some draft must be accepted (else the tree's rows
  // went untested).
  static std::vector<int32_t> run_one(Request r,
                                      const std::function<void(const RequestOutput&)>& each) {
    std::vector<int32_t> tokens;
    const bool spec = r.spec.method != SpecMethod::kNone;
    r.on_output = [&](const RequestOutput& o) {
      if (o.finished && spec) {
        EXPECT_GT(o.stats.n_accepted, 0) << "no draft accepted: the tree rows went untested";
      }
      each(o);
      tokens.insert(tokens.end(), o.tokens.begin(), o.tokens.end());
      return true;
    };
    Engine engine(*model_, tok_, pool_, EngineConfig{});
    EXPECT_TRUE(engine.submit(r).ok());
    while (engine.has_work()) engine.step();
    EXPECT_EQ(tokens, solo(r));
    return tokens;
  }

  static Model* model_;
  static Model* draft_;
  static Tokenizer* tok_;
  static ThreadPool* pool_;
};

Model* EngineTest::model_ = nullptr;
Model* EngineTest::draft_ = nullptr;
Tokenizer* EngineTest::tok_ = nullptr;
ThreadPool* EngineTest::pool_ = nullptr;

Request make_request(std::vector<int32_t> prompt, int max_tokens, float temp = 0.0f,
                     uint64_t seed = 0, SpecMethod spec = SpecMethod::kNone) {
  Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temp;
  r.sampling.seed = seed;
  r.spec.method = spec;
  r.spec.num_draft = 4;
  r.spec.adaptive = false;
  return r;
}

TEST_F(EngineTest, BatchedGreedyEqualsSoloForMixedRequests) {
  std::vector<Request> reqs;
  const int lens[] = {1, 2, 5, 17, 40, 64, 100, 150, 230, 300, 33, 8, 16, 90, 260, 12};
  for (int i = 0; i < 16; ++i) {
    const SpecMethod spec = i % 3 == 1 ? SpecMethod::kNgram : SpecMethod::kNone;
    reqs.push_back(make_request(prompt(lens[i], 100 + i), 24 + (i % 5) * 8, 0.0f, 0, spec));
  }
  // Two share a long prefix with another.
  reqs[3].prompt = reqs[9].prompt;
  reqs[3].prompt.resize(200);
  reqs[3].prompt.push_back(7);
  for (int batch : {1, 3, 16}) {
    EngineConfig config;
    config.max_seqs = batch;
    config.max_batch_tokens = 128;  // long prompts are chunked and mixed with decodes
    config.kv_cache_mib = 16;
    const std::vector<Collected> got = run_all(reqs, config);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got[i].tokens, solo(reqs[i])) << "request " << i << " batch " << batch;
      EXPECT_TRUE(got[i].finished);
      EXPECT_EQ(got[i].finish_calls, 1);
    }
  }
}

// The q8_0 cache (--kv-type q8_0): batched and speculative output is still each request's solo
// output over a q8_0 cache (the quantization depends on each row alone, and attention over it
// keeps the bit-exact invariance), and differs from the f16 cache's somewhere.
TEST_F(EngineTest, BatchedGreedyEqualsSoloWithQ8Cache) {
  std::vector<Request> reqs;
  const int lens[] = {3, 40, 130, 17, 260, 64, 9, 90};
  for (int i = 0; i < 8; ++i) {
    const SpecMethod spec = i % 2 == 1 ? SpecMethod::kNgram : SpecMethod::kNone;
    reqs.push_back(make_request(prompt(lens[i], 300 + i), 40, 0.0f, 0, spec));
  }
  EngineConfig config;
  config.kv_type = "q8_0";
  config.max_batch_tokens = 96;
  const std::vector<Collected> got = run_all(reqs, config);
  int differs_from_f16 = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, test::solo_output(*model_, *tok_, pool_, reqs[i], nullptr, 0, nullptr,
                                               nullptr, KvType::kQ8))
        << "request " << i;
    if (got[i].tokens != solo(reqs[i])) ++differs_from_f16;
  }
  EXPECT_GT(differs_from_f16, 0) << "the q8_0 cache changed nothing: was it used?";
}

TEST_F(EngineTest, BatchedSampledEqualsSoloWithSeeds) {
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) {
    reqs.push_back(make_request(prompt(10 + 30 * i, 7 + i), 40, 0.9f, 1000 + i,
                                i % 2 ? SpecMethod::kNgram : SpecMethod::kNone));
  }
  // A budget that never cuts a draft: the draft lengths, and so the random draws of the
  // rejection sampling, are those of the solo run.
  EngineConfig config;
  config.max_batch_tokens = 2048;
  const std::vector<Collected> got = run_all(reqs, config);
  int differs_from_greedy = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, solo(reqs[i])) << "request " << i;
    Request greedy = reqs[i];
    greedy.sampling.temperature = 0;
    if (solo(greedy) != got[i].tokens) ++differs_from_greedy;
  }
  EXPECT_GT(differs_from_greedy, 0) << "sampling had no effect: the test would prove nothing";
}

TEST_F(EngineTest, PrefixReuseComputesOnlyTheSuffix) {
  const std::vector<int32_t> shared = prompt(400, 42);
  std::vector<int32_t> a = shared, b = shared;
  a.push_back(11);
  b.push_back(12);
  b.push_back(13);
  for (bool cache : {true, false}) {
    EngineConfig config;
    config.prefix_cache = cache;
    Engine engine(*model_, tok_, pool_, config);
    std::vector<int32_t> out_a, out_b;
    RequestStats stats_b;
    Request ra = make_request(a, 8);
    ra.on_output = [&](const RequestOutput& o) {
      out_a.insert(out_a.end(), o.tokens.begin(), o.tokens.end());
      return true;
    };
    ASSERT_TRUE(engine.submit(ra).ok());
    while (engine.has_work()) engine.step();
    const int64_t computed_before = engine.stats().tokens_computed;
    Request rb = make_request(b, 8);
    rb.on_output = [&](const RequestOutput& o) {
      out_b.insert(out_b.end(), o.tokens.begin(), o.tokens.end());
      stats_b = o.stats;
      return true;
    };
    ASSERT_TRUE(engine.submit(rb).ok());
    while (engine.has_work()) engine.step();
    const int64_t computed_b = engine.stats().tokens_computed - computed_before;
    EXPECT_EQ(out_a, solo(make_request(a, 8)));
    EXPECT_EQ(out_b, solo(make_request(b, 8)));
    const int64_t bs = engine.block_size();
    if (cache) {
      EXPECT_EQ(stats_b.n_cached, 400 / bs * bs);
      // The suffix after the cached blocks, then 7 decode steps (the 8th token needs no pass).
      EXPECT_EQ(computed_b, static_cast<int64_t>(b.size()) - 400 / bs * bs + 7);
    } else {
      EXPECT_EQ(stats_b.n_cached, 0);
      EXPECT_EQ(computed_b, static_cast<int64_t>(b.size()) + 7);
    }
  }
}

// Chunked prefill that keeps decoders flowing: while a request decodes, a long prompt arriving
// is computed at most max_prefill_tokens_decoding tokens a step (the decoder gets its token
// every step), in one big chunk when nothing decodes; outputs equal the solo runs either way.
TEST_F(EngineTest, PrefillWhileDecodingIsChunkedToTheLimit) {
  for (int limit : {24, -1}) {
    EngineConfig config;
    config.max_batch_tokens = 512;
    config.max_prefill_tokens_decoding = limit;
    Engine engine(*model_, tok_, pool_, config);
    std::vector<int32_t> out_a, out_b;
    Request ra = make_request(prompt(20, 1), 40);
    ra.on_output = [&](const RequestOutput& o) {
      out_a.insert(out_a.end(), o.tokens.begin(), o.tokens.end());
      return true;
    };
    ASSERT_TRUE(engine.submit(ra).ok());
    engine.step();  // a's prompt, alone: one chunk
    EXPECT_EQ(engine.stats().tokens_computed, 20);
    Request rb = make_request(prompt(300, 2), 4);
    rb.on_output = [&](const RequestOutput& o) {
      out_b.insert(out_b.end(), o.tokens.begin(), o.tokens.end());
      return true;
    };
    ASSERT_TRUE(engine.submit(rb).ok());
    int64_t max_step = 0;
    int64_t a_tokens_during_prefill = 0;
    int64_t steps_with_prefill = 0;
    while (engine.has_work()) {
      const int64_t before = engine.stats().tokens_computed;
      const size_t a_before = out_a.size();
      const bool b_prefilling = out_b.empty();
      engine.step();
      engine.check_invariants();
      const int64_t step_tokens = engine.stats().tokens_computed - before;
      if (b_prefilling && step_tokens > 1) {
        max_step = std::max(max_step, step_tokens);
        ++steps_with_prefill;
        a_tokens_during_prefill += static_cast<int64_t>(out_a.size() - a_before);
      }
    }
    if (limit > 0) {
      EXPECT_EQ(max_step, 1 + limit) << "a decode token plus at most the limit";
      EXPECT_EQ(steps_with_prefill, (300 + limit - 1) / limit);
    } else {
      EXPECT_EQ(max_step, 1 + 300) << "the whole prompt beside the decode";
      EXPECT_EQ(steps_with_prefill, 1);
    }
    EXPECT_EQ(a_tokens_during_prefill, steps_with_prefill) << "a decodes every step";
    EXPECT_EQ(out_a, solo(make_request(prompt(20, 1), 40)));
    EXPECT_EQ(out_b, solo(make_request(prompt(300, 2), 4)));
  }
}

TEST_F(EngineTest, PoolPressurePreemptsAndEveryRequestGetsItsSoloOutput) {
  // Greedy requests with and without n-gram drafts, sampled ones without: a sampled request's
  // random draws follow its draft lengths, which a full pool or budget may shorten (the output
  // is then another draw from the same distribution, not the solo one).
  std::vector<Request> reqs;
  for (int i = 0; i < 10; ++i) {
    reqs.push_back(make_request(prompt(60 + 17 * i, 300 + i), 60, i % 2 ? 0.8f : 0.0f, 5 + i,
                                i % 4 == 0 ? SpecMethod::kNgram : SpecMethod::kNone));
  }
  EngineConfig config;
  config.kv_blocks = 40;  // 640 slots for 10 requests of 120-270 tokens
  config.max_batch_tokens = 96;
  Engine probe(*model_, tok_, pool_, config);
  ASSERT_LT(probe.num_blocks() * probe.block_size(), 10 * 120) << "the pool is not under pressure";
  const std::vector<Collected> got = run_all(reqs, config);
  int64_t preempted = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, solo(reqs[i])) << "request " << i;
    preempted += got[i].stats.n_preempted;
  }
  EXPECT_GT(preempted, 0) << "no preemption happened: the test would prove nothing";
}

TEST_F(EngineTest, CancelMidGenerationFreesBlocks) {
  EngineConfig config;
  Engine engine(*model_, tok_, pool_, config);
  Collected a, b;
  Request ra = make_request(prompt(100, 1), 200);
  ra.sampling.temperature = 0;
  ra.on_output = [&](const RequestOutput& o) {
    a.tokens.insert(a.tokens.end(), o.tokens.begin(), o.tokens.end());
    if (o.finished) a.reason = o.reason, a.finished = true;
    return true;
  };
  Request rb = make_request(prompt(50, 2), 30);
  rb.on_output = [&](const RequestOutput& o) {
    b.tokens.insert(b.tokens.end(), o.tokens.begin(), o.tokens.end());
    if (o.finished) b.finished = true;
    return true;
  };
  const SubmitResult ida = engine.submit(ra);
  ASSERT_TRUE(engine.submit(rb).ok());
  for (int i = 0; i < 10; ++i) engine.step();
  EXPECT_GT(engine.stats().kv_blocks_used, 0);
  ASSERT_TRUE(engine.cancel(ida.id));
  engine.step();
  EXPECT_TRUE(a.finished);
  EXPECT_EQ(a.reason, StopReason::kCancelled);
  while (engine.has_work()) engine.step();
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
  EXPECT_EQ(b.tokens, solo(rb));
}

TEST_F(EngineTest, BadRequestsGetErrorsNamingTheLimitAndOthersGoOn) {
  EngineConfig config;
  config.kv_cache_mib = 1;
  Engine engine(*model_, tok_, pool_, config);
  const int ctx = model_->config().n_ctx_train;
  Request too_long = make_request(prompt(ctx + 5, 3), 4);
  SubmitResult r = engine.submit(too_long);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.error.find(std::to_string(ctx)), std::string::npos) << r.error;
  EXPECT_NE(r.error.find(std::to_string(ctx + 5)), std::string::npos) << r.error;

  EXPECT_EQ(r.param, "prompt");
  EXPECT_EQ(r.code, "context_length_exceeded");

  Request zero = make_request(prompt(5, 3), 0);
  r = engine.submit(zero);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.error.find("max_tokens"), std::string::npos) << r.error;
  EXPECT_EQ(r.param, "max_tokens");

  Request neg_temp = make_request(prompt(5, 3), 4, -1.0f);
  r = engine.submit(neg_temp);
  EXPECT_NE(r.error.find("temperature"), std::string::npos) << r.error;
  EXPECT_EQ(r.param, "temperature");

  for (float top_p : {0.0f, 1.5f}) {
    Request bad_p = make_request(prompt(5, 3), 4);
    bad_p.sampling.top_p = top_p;
    r = engine.submit(bad_p);
    EXPECT_NE(r.error.find("top_p"), std::string::npos) << r.error;
  }
  Request empty = make_request({}, 4);
  EXPECT_FALSE(engine.submit(empty).ok());
  Request bad_id = make_request({1, 100000}, 4);
  EXPECT_NE(engine.submit(bad_id).error.find("vocabulary"), std::string::npos);
  Request draft = make_request(prompt(5, 3), 4, 0, 0, SpecMethod::kDraft);
  EXPECT_NE(engine.submit(draft).error.find("draft model"), std::string::npos);

  // A pool smaller than the context: the pool is the limit.
  EngineConfig tiny_pool;
  tiny_pool.kv_blocks = 20;  // 320 slots
  Engine small(*model_, tok_, pool_, tiny_pool);
  const int64_t slots = static_cast<int64_t>(small.num_blocks()) * small.block_size();
  ASSERT_LT(slots, ctx);
  r = small.submit(make_request(prompt(static_cast<int>(slots) + 10, 3), 4));
  EXPECT_NE(r.error.find("KV pool"), std::string::npos) << r.error;

  // The engine still works.
  Request ok = make_request(prompt(20, 9), 10);
  std::vector<int32_t> got;
  ok.on_output = [&](const RequestOutput& o) {
    got.insert(got.end(), o.tokens.begin(), o.tokens.end());
    return true;
  };
  ASSERT_TRUE(engine.submit(ok).ok());
  while (engine.has_work()) engine.step();
  EXPECT_EQ(got, solo(ok));
}

TEST_F(EngineTest, BadConfigurationsThrow) {
  EngineConfig c;
  c.block_size = 10;
  EXPECT_THROW({ Engine e(*model_, tok_, pool_, c); }, Error);
  c = EngineConfig{};
  c.kv_type = "q8";
  EXPECT_THROW({ Engine e(*model_, tok_, pool_, c); }, Error);
  c = EngineConfig{};
  c.max_batch_tokens = 0;
  EXPECT_THROW({ Engine e(*model_, tok_, pool_, c); }, Error);
}

TEST_F(EngineTest, StopStringsCutTheTextAndNothingPastThemIsSent) {
  Request r = make_request(prompt(4, 0), 60);
  const std::vector<int32_t> full = solo(r);
  std::string full_text;
  {
    DecodeOptions o;
    o.text_start = false;
    full_text = tok_->decode(full, o);
  }
  ASSERT_GT(full_text.size(), 20u);
  const std::string stop = full_text.substr(10, 4);
  r.stop = {stop};
  const std::vector<Collected> got = run_all({r}, EngineConfig{});
  EXPECT_EQ(got[0].reason, StopReason::kStop);
  EXPECT_EQ(got[0].text, full_text.substr(0, full_text.find(stop)));
}

// Logprobs come from the row that produced each token: with n-gram drafts (tokens verified in
// trees) they equal those of plain decoding bit for bit, greedy tokens are the top entry, and the
// top list is sorted and a distribution's head.
TEST_F(EngineTest, LogprobsOfEveryTokenFromTheRowThatProducedIt) {
  auto run = [&](SpecMethod spec) {
    Request r = make_request(prompt(40, 77, "Once upon a time, there was a little girl"), 48, 0.0f,
                             0, spec);
    r.logprobs = 5;
    std::vector<TokenLogprob> lps;
    const std::vector<int32_t> tokens = run_one(r, [&](const RequestOutput& o) {
      EXPECT_EQ(o.logprobs.size(), o.tokens.size());
      lps.insert(lps.end(), o.logprobs.begin(), o.logprobs.end());
    });
    return std::make_pair(tokens, lps);
  };
  const auto [plain_tokens, plain] = run(SpecMethod::kNone);
  const auto [spec_tokens, spec] = run(SpecMethod::kNgram);
  ASSERT_EQ(plain.size(), plain_tokens.size());
  ASSERT_EQ(spec.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(plain[i].token, plain_tokens[i]);
    ASSERT_EQ(plain[i].top.size(), 5u);
    EXPECT_EQ(plain[i].top[0].first, plain_tokens[i]) << "greedy picks the most likely token";
    EXPECT_EQ(plain[i].top[0].second, plain[i].logprob);
    double mass = 0;
    for (size_t k = 0; k < plain[i].top.size(); ++k) {
      EXPECT_LE(plain[i].top[k].second, 0.0f);
      if (k > 0) {
        EXPECT_GE(plain[i].top[k - 1].second, plain[i].top[k].second);
      }
      mass += std::exp(plain[i].top[k].second);
    }
    EXPECT_LE(mass, 1.0 + 1e-5);
    EXPECT_EQ(spec[i].logprob, plain[i].logprob) << "token " << i;
    EXPECT_EQ(spec[i].top, plain[i].top) << "token " << i;
  }
  Request bad = make_request(prompt(5, 1), 4);
  bad.logprobs = 21;
  Engine engine(*model_, tok_, pool_, EngineConfig{});
  const SubmitResult r = engine.submit(bad);
  EXPECT_EQ(r.param, "logprobs");
}

// Request::hidden_states: row i of RequestOutput::hidden is the final-normed hidden state at the
// position that produced token i (prompt end, a tree's parent node, the final node for the
// bonus): the same bits with speculation as without, and as one pass over the prefix alone.
TEST_F(EngineTest, HiddenStatesOfEveryTokenFromTheRowThatProducedIt) {
  const int dim = model_->config().dim;
  const std::vector<int32_t> p = prompt(40, 77, "Once upon a time, there was a little girl");
  auto run = [&](SpecMethod spec) {
    Request r = make_request(p, 48, 0.0f, 0, spec);
    r.hidden_states = true;
    std::vector<float> hidden;  // [tokens, dim]
    const std::vector<int32_t> tokens = run_one(r, [&](const RequestOutput& o) {
      EXPECT_EQ(o.hidden.size(), o.tokens.size() * static_cast<size_t>(dim));
      hidden.insert(hidden.end(), o.hidden.begin(), o.hidden.end());
    });
    return std::make_pair(tokens, hidden);
  };
  const auto [plain_tokens, plain] = run(SpecMethod::kNone);
  const auto [spec_tokens, spec] = run(SpecMethod::kNgram);
  ASSERT_EQ(plain.size(), plain_tokens.size() * static_cast<size_t>(dim));
  EXPECT_EQ(spec, plain);
  // Token i came from the last row of a pass over prompt + tokens[0, i).
  std::vector<int32_t> seq = p;
  seq.insert(seq.end(), plain_tokens.begin(), plain_tokens.end());
  for (size_t i = 0; i < plain_tokens.size(); i += 7) {
    const int64_t n = static_cast<int64_t>(p.size() + i);
    KvCache kv = model_->make_kv_cache(n);
    std::vector<int32_t> positions(static_cast<size_t>(n));  // [n]
    for (int64_t t = 0; t < n; ++t) positions[static_cast<size_t>(t)] = static_cast<int32_t>(t);
    const int32_t last = static_cast<int32_t>(n - 1);
    ForwardBatch b;
    b.tokens = {seq.data(), static_cast<size_t>(n)};
    b.positions = positions;
    b.output_rows = {&last, 1};
    b.want_hidden = true;
    const ForwardResult r = model_->forward(kv, b, pool_);
    ASSERT_EQ(r.hidden.size(), static_cast<size_t>(dim));
    for (int k = 0; k < dim; ++k) {
      ASSERT_NEAR(plain[i * dim + k], r.hidden[k], 1e-5f * (1.0f + std::fabs(r.hidden[k])))
          << "token " << i << " dim " << k;
    }
  }
  // A row of zeros would pass the comparison of two runs; the hidden state is not zero.
  EXPECT_GT(std::fabs(plain[0]) + std::fabs(plain[1]) + std::fabs(plain[2]), 0.0f);
}

// No policy reads a clock: sampled requests with adaptive drafts give the same tokens on a
// quiet machine and with busy threads competing for the cores.
TEST_F(EngineTest, SameSeedSameOutputUnderLoad) {
  auto run = [&]() {
    std::vector<Request> reqs;
    for (int i = 0; i < 3; ++i) {
      Request r = make_request(prompt(30 + 20 * i, 900 + i), 48, 0.7f, 31 + i, SpecMethod::kNgram);
      r.spec.adaptive = true;
      r.spec.num_draft = 8;
      reqs.push_back(r);
    }
    std::vector<std::vector<int32_t>> tokens;
    for (const Collected& c : run_all(reqs, EngineConfig{})) tokens.push_back(c.tokens);
    return tokens;
  };
  const auto quiet = run();
  std::vector<std::vector<int32_t>> busy;
  {
    test::BusyThreads burners(2);
    busy = run();
  }
  EXPECT_EQ(quiet, busy);
}

// A batch's drafts are weighed against what a token adds to the pass it joins: the same
// adaptive requests draft under the line's cost and not at all under a calibrated curve whose
// batch tokens cost more than their share (a knee, as the kernels' compute-bound rows have),
// with the same greedy output either way.
TEST_F(EngineTest, BatchDraftsAreWeighedByThePassCostCurve) {
  std::vector<Request> reqs;
  for (int i = 0; i < 4; ++i) {
    Request r = make_request(prompt(40 + 10 * i, 700 + i), 48, 0.0f, 0, SpecMethod::kNgram);
    r.spec.adaptive = true;
    r.spec.num_draft = 8;
    reqs.push_back(r);
  }
  auto drafted = [&](const EngineConfig& config) {
    int64_t n = 0;
    const std::vector<Collected> got = run_all(reqs, config);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got[i].tokens, solo(reqs[i])) << i;
      n += got[i].stats.n_drafted;
    }
    return n;
  };
  EngineConfig line;
  line.verify_token_cost = 0.02;
  EngineConfig knee = line;
  knee.pass_cost_curve = {{1, 1.0}, {2, 1.02}, {4, 6.0}, {8, 20.0}};
  EXPECT_GT(drafted(line), 0);
  EXPECT_EQ(drafted(knee), 0);
}

TEST_F(EngineTest, LoopThreadWithSubmitAndCancelFromSeveralThreads) {
  EngineConfig config;
  config.max_batch_tokens = 64;
  Engine engine(*model_, tok_, pool_, config);
  engine.start();
  std::mutex mu;
  std::map<int, std::vector<int32_t>> outputs;
  std::map<int, StopReason> reasons;
  std::atomic<int> finished{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 4; ++k) {
        const int key = t * 10 + k;
        Request r = make_request(prompt(10 + 7 * key, key), 20);
        r.on_output = [&, key](const RequestOutput& o) {
          std::lock_guard<std::mutex> lock(mu);
          auto& v = outputs[key];
          v.insert(v.end(), o.tokens.begin(), o.tokens.end());
          if (o.finished) {
            reasons[key] = o.reason;
            ++finished;
          }
          return true;
        };
        const SubmitResult s = engine.submit(r);
        ASSERT_TRUE(s.ok());
        if (k == 3) engine.cancel(s.id);  // may land before, during or after generation
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int i = 0; i < 2000 && finished.load() < 16; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  engine.stop();
  ASSERT_EQ(finished.load(), 16);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
  for (const auto& [key, tokens] : outputs) {
    if (reasons[key] == StopReason::kCancelled) continue;
    EXPECT_EQ(tokens, solo(make_request(prompt(10 + 7 * key, key), 20))) << key;
  }
}

}  // namespace
}  // namespace specdec
