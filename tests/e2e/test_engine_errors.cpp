// The engine's error paths at its public boundary (include/specdec/engine.h): every refusal is a
// value naming the field, and leaves the engine exactly as it was (counters, KV blocks, the
// requests already in it, which still get their solo output); the boundary values of the
// context are on the right side; a callback that throws cancels only its own request (stepped
// by hand and on the loop thread, where an escaping exception would end the process); requests
// submitted after stop() wait for the next start() or step(); cancel() of an id never given,
// of a finished request or twice changes nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "common/solo_run.h"
#include "common/test_paths.h"
#include "model/model.h"
#include "specdec/engine.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec {
namespace {

class EngineErrors : public ::testing::Test {
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

  static std::vector<int32_t> prompt(int len, uint32_t seed) {
    std::vector<int32_t> p = tok_->encode("Once upon a time", true, false);
    std::mt19937 rng(seed);
    while (static_cast<int>(p.size()) < len) {
      p.push_back(static_cast<int32_t>(3 + rng() % (model_->config().n_vocab - 3)));
    }
    p.resize(static_cast<size_t>(len));
    return p;
  }

  static Request request(std::vector<int32_t> p, int max_tokens) {
    Request r;
    r.prompt = std::move(p);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  }

  struct Collected {
    std::vector<int32_t> tokens;
    int finish_calls = 0;
    StopReason reason = StopReason::kNone;
  };

  // Collects r's outputs into *c.
  static Request collecting(Request r, Collected* c) {
    r.on_output = [c](const RequestOutput& o) {
      c->tokens.insert(c->tokens.end(), o.tokens.begin(), o.tokens.end());
      if (o.finished) {
        ++c->finish_calls;
        c->reason = o.reason;
      }
      return true;
    };
    return r;
  }

  static std::vector<int32_t> solo(const Request& r) {
    return test::solo_output(*model_, *tok_, pool_, r);
  }

  static void run_to_end(Engine& engine) {
    for (int guard = 0; engine.has_work(); ++guard) {
      ASSERT_LT(guard, 100000) << "the engine does not finish";
      engine.step();
      engine.check_invariants();
    }
  }

  static Model* model_;
  static Model* draft_;
  static Tokenizer* tok_;
  static ThreadPool* pool_;
};

Model* EngineErrors::model_ = nullptr;
Model* EngineErrors::draft_ = nullptr;
Tokenizer* EngineErrors::tok_ = nullptr;
ThreadPool* EngineErrors::pool_ = nullptr;

// What a refusal must leave as it was.
struct Snapshot {
  EngineStats s;
  bool has_work = false;
  bool operator==(const Snapshot& o) const {
    return s.steps == o.s.steps && s.requests_waiting == o.s.requests_waiting &&
           s.requests_running == o.s.requests_running &&
           s.requests_finished == o.s.requests_finished &&
           s.tokens_prompt == o.s.tokens_prompt && s.tokens_generated == o.s.tokens_generated &&
           s.tokens_computed == o.s.tokens_computed && s.kv_blocks_used == o.s.kv_blocks_used &&
           s.kv_blocks_cached == o.s.kv_blocks_cached && has_work == o.has_work;
  }
};

Snapshot snapshot(const Engine& e) { return Snapshot{e.stats(), e.has_work()}; }

TEST_F(EngineErrors, EveryRefusalNamesItsFieldAndLeavesTheEngineAsItWas) {
  EngineConfig config;
  config.draft_model = draft_;
  Engine engine(*model_, tok_, pool_, config);
  // A request already running (prompt done, some tokens out) and one still waiting.
  Collected running_out, waiting_out;
  const Request running = request(prompt(40, 1), 60);
  const Request waiting = request(prompt(30, 2), 20);
  ASSERT_TRUE(engine.submit(collecting(running, &running_out)).ok());
  for (int i = 0; i < 5; ++i) engine.step();
  ASSERT_FALSE(running_out.tokens.empty());
  ASSERT_TRUE(engine.submit(collecting(waiting, &waiting_out)).ok());

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const int ctx = model_->config().n_ctx_train;
  struct Case {
    const char* name;
    std::string param;
    std::function<void(Request&)> spoil;
  };
  const std::vector<Case> cases = {
      {"empty prompt", "prompt", [](Request& r) { r.prompt.clear(); }},
      {"prompt of the whole context", "prompt",
       [&](Request& r) { r.prompt = prompt(ctx, 3); }},
      {"token id past the vocabulary", "prompt", [](Request& r) { r.prompt.push_back(1 << 20); }},
      {"negative token id", "prompt", [](Request& r) { r.prompt[0] = -1; }},
      {"stop token past the vocabulary", "stop_token_ids",
       [](Request& r) { r.stop_tokens = {1 << 20}; }},
      {"max_tokens 0", "max_tokens", [](Request& r) { r.max_tokens = 0; }},
      {"max_tokens negative", "max_tokens", [](Request& r) { r.max_tokens = -5; }},
      {"logprobs 21", "logprobs", [](Request& r) { r.logprobs = 21; }},
      {"logprobs -2", "logprobs", [](Request& r) { r.logprobs = -2; }},
      {"temperature NaN", "temperature", [&](Request& r) { r.sampling.temperature = nan; }},
      {"temperature inf", "temperature", [&](Request& r) { r.sampling.temperature = inf; }},
      {"temperature negative", "temperature", [](Request& r) { r.sampling.temperature = -1; }},
      {"top_p NaN", "top_p", [&](Request& r) { r.sampling.top_p = nan; }},
      {"top_p 2", "top_p", [](Request& r) { r.sampling.top_p = 2; }},
      {"min_p NaN", "min_p", [&](Request& r) { r.sampling.min_p = nan; }},
      {"top_k negative", "top_k", [](Request& r) { r.sampling.top_k = -1; }},
      {"repetition_penalty NaN", "repetition_penalty",
       [&](Request& r) { r.sampling.repetition_penalty = nan; }},
      {"repeat_last_n -2", "repeat_last_n", [](Request& r) { r.sampling.repeat_last_n = -2; }},
      {"num_draft 65", "num_draft",
       [](Request& r) {
         r.spec.method = SpecMethod::kNgram;
         r.spec.num_draft = 65;
       }},
      {"tree width 0", "tree",
       [](Request& r) {
         r.spec.method = SpecMethod::kNgram;
         r.spec.tree_width = 0;
       }},
      {"n-gram min above max", "ngram",
       [](Request& r) {
         r.spec.method = SpecMethod::kNgram;
         r.spec.ngram_min = 3;
         r.spec.ngram_max = 2;
       }},
      {"draft_p_min NaN", "draft_p_min",
       [&](Request& r) {
         r.spec.method = SpecMethod::kDraft;
         r.spec.draft_p_min = nan;
       }},
      {"draft_p_min 2", "draft_p_min",
       [](Request& r) {
         r.spec.method = SpecMethod::kDraft;
         r.spec.draft_p_min = 2;
       }},
      {"draft_temp NaN", "draft_temp",
       [&](Request& r) {
         r.spec.method = SpecMethod::kDraft;
         r.spec.draft_temp = nan;
       }},
      {"ReDrafter without a head", "spec",
       [](Request& r) { r.spec.method = SpecMethod::kReDrafter; }},
      {"Medusa without heads", "spec", [](Request& r) { r.spec.method = SpecMethod::kMedusa; }},
  };
  for (const Case& c : cases) {
    Request bad = request(prompt(8, 4), 4);
    c.spoil(bad);
    int calls = 0;
    bad.on_output = [&calls](const RequestOutput&) { return ++calls, true; };
    const Snapshot before = snapshot(engine);
    const SubmitResult r = engine.submit(std::move(bad));
    EXPECT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.id, -1) << c.name;
    EXPECT_EQ(r.param, c.param) << c.name << ": " << r.error;
    EXPECT_FALSE(r.error.empty()) << c.name;
    EXPECT_TRUE(snapshot(engine) == before) << c.name << " changed the engine";
    engine.check_invariants();
    engine.step();  // nothing of the refused request ever runs; the others go on
    EXPECT_EQ(calls, 0) << c.name;
  }
  EXPECT_TRUE(engine.has_work());
  run_to_end(engine);
  EXPECT_EQ(running_out.tokens, solo(running));
  EXPECT_EQ(waiting_out.tokens, solo(waiting));
  EXPECT_EQ(running_out.finish_calls, 1);
  EXPECT_EQ(waiting_out.finish_calls, 1);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

TEST_F(EngineErrors, APassCostCurveThatDoesNotRiseFromOneIsRefused) {
  for (const auto& curve : std::vector<std::vector<std::pair<int, double>>>{
           {{2, 1.0}, {8, 2.0}}, {{1, 1.0}, {8, 2.0}, {4, 2.5}}, {{1, 1.0}, {8, 2.0}, {16, 1.9}},
           {{1, 1.0}}}) {
    EngineConfig config;
    config.pass_cost_curve = curve;
    EXPECT_THROW(Engine(*model_, tok_, pool_, config), Error) << curve.size();
  }
  EngineConfig ok;
  ok.pass_cost_curve = {{1, 1.0}, {8, 2.0}, {16, 4.0}};
  EXPECT_NO_THROW(Engine(*model_, tok_, pool_, ok));
}

TEST_F(EngineErrors, ContextBoundaries) {
  // A prompt of ctx - 1 tokens leaves room for exactly one token; ctx tokens do not fit.
  EngineConfig config;
  config.max_context = 64;
  Engine engine(*model_, tok_, pool_, config);
  Collected fits;
  const SubmitResult ok = engine.submit(collecting(request(prompt(63, 5), 100), &fits));
  ASSERT_TRUE(ok.ok()) << ok.error;
  const SubmitResult too_long = engine.submit(request(prompt(64, 5), 100));
  EXPECT_EQ(too_long.code, "context_length_exceeded");
  EXPECT_NE(too_long.error.find("64"), std::string::npos) << too_long.error;
  run_to_end(engine);
  EXPECT_EQ(fits.tokens.size(), 1u);
  EXPECT_EQ(fits.reason, StopReason::kLength);
  EXPECT_EQ(fits.finish_calls, 1);
}

TEST_F(EngineErrors, StopStringsWithoutATokenizerAreRefused) {
  Engine engine(*model_, /*tokenizer=*/nullptr, pool_, EngineConfig{});
  Request r = request(prompt(8, 6), 4);
  r.stop = {"."};
  const SubmitResult s = engine.submit(r);
  EXPECT_EQ(s.param, "stop") << s.error;
  EXPECT_FALSE(engine.has_work());
}

// Two requests, the first's callback throws at its `throw_at`-th output (and at every one
// after it, the last included): it ends cancelled, the other runs to its solo output.
void throwing_callback_case(Engine& engine, bool loop, const Request& thrower_req,
                            const Request& other_req, std::vector<int32_t>* other_tokens,
                            int* thrower_calls, StopReason* thrower_reason,
                            int* thrower_finishes) {
  std::atomic<int> finished{0};
  Request thrower = thrower_req;
  thrower.on_output = [&](const RequestOutput& o) -> bool {
    ++*thrower_calls;
    if (o.finished) {
      *thrower_reason = o.reason;
      ++*thrower_finishes;
      ++finished;
    }
    if (*thrower_calls >= 3) throw std::runtime_error("the client's code failed");
    return true;
  };
  Request other = other_req;
  other.on_output = [&](const RequestOutput& o) {
    other_tokens->insert(other_tokens->end(), o.tokens.begin(), o.tokens.end());
    if (o.finished) ++finished;
    return true;
  };
  ASSERT_TRUE(engine.submit(thrower).ok());
  ASSERT_TRUE(engine.submit(other).ok());
  if (loop) {
    for (int i = 0; i < 3000 && finished.load() < 2; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    engine.stop();
  } else {
    while (engine.has_work()) engine.step();
  }
  ASSERT_EQ(finished.load(), 2);
}

TEST_F(EngineErrors, ACallbackThatThrowsCancelsOnlyItsRequest) {
  const Request thrower = request(prompt(20, 7), 50);
  const Request other = request(prompt(25, 8), 40);
  const std::vector<int32_t> want = solo(other);
  for (bool loop : {false, true}) {
    Engine engine(*model_, tok_, pool_, EngineConfig{});
    if (loop) engine.start();
    std::vector<int32_t> got;
    int calls = 0, finishes = 0;
    StopReason reason = StopReason::kNone;
    throwing_callback_case(engine, loop, thrower, other, &got, &calls, &reason, &finishes);
    EXPECT_EQ(reason, StopReason::kCancelled) << "loop " << loop;
    EXPECT_EQ(finishes, 1) << "loop " << loop;
    EXPECT_EQ(calls, 4) << "loop " << loop << ": 3 outputs, the third threw, then the end";
    EXPECT_EQ(got, want) << "loop " << loop;
    EXPECT_FALSE(engine.has_work());
    EXPECT_EQ(engine.stats().kv_blocks_used, 0);
    engine.check_invariants();
  }
}

TEST_F(EngineErrors, SubmitAfterStopWaitsForTheNextStartOrStep) {
  Engine engine(*model_, tok_, pool_, EngineConfig{});
  engine.start();
  engine.stop();
  Collected a;
  const Request ra = request(prompt(12, 9), 10);
  ASSERT_TRUE(engine.submit(collecting(ra, &a)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(engine.has_work());
  EXPECT_TRUE(a.tokens.empty()) << "a stopped engine ran a request";
  run_to_end(engine);  // stepped by hand
  EXPECT_EQ(a.tokens, solo(ra));
  // ... or by the loop, started again.
  std::atomic<bool> done{false};
  std::vector<int32_t> b_tokens;
  Request rb = request(prompt(14, 10), 10);
  rb.on_output = [&](const RequestOutput& o) {
    b_tokens.insert(b_tokens.end(), o.tokens.begin(), o.tokens.end());
    if (o.finished) done = true;
    return true;
  };
  ASSERT_TRUE(engine.submit(rb).ok());
  engine.start();
  for (int i = 0; i < 3000 && !done.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  engine.stop();
  ASSERT_TRUE(done.load());
  EXPECT_EQ(b_tokens, solo(rb));
}

TEST_F(EngineErrors, CancelOfUnknownFinishedOrCancelledIdsChangesNothing) {
  Engine engine(*model_, tok_, pool_, EngineConfig{});
  EXPECT_FALSE(engine.cancel(-1));
  EXPECT_FALSE(engine.cancel(0));  // no id given yet
  EXPECT_FALSE(engine.cancel(std::numeric_limits<int64_t>::max()));
  Collected a;
  const Request ra = request(prompt(10, 11), 5);
  const SubmitResult s = engine.submit(collecting(ra, &a));
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(engine.cancel(s.id + 1));
  run_to_end(engine);
  ASSERT_EQ(a.reason, StopReason::kLength);
  const Snapshot after = snapshot(engine);
  EXPECT_TRUE(engine.cancel(s.id));  // finished: nothing happens
  engine.step();
  EXPECT_TRUE(snapshot(engine).s.requests_finished == after.s.requests_finished);
  EXPECT_EQ(a.finish_calls, 1);
  EXPECT_EQ(a.reason, StopReason::kLength);
  // Cancelled twice while running: one end, cancelled.
  Collected b;
  const SubmitResult sb = engine.submit(collecting(request(prompt(10, 12), 50), &b));
  ASSERT_TRUE(sb.ok());
  engine.step();
  EXPECT_TRUE(engine.cancel(sb.id));
  EXPECT_TRUE(engine.cancel(sb.id));
  run_to_end(engine);
  EXPECT_EQ(b.finish_calls, 1);
  EXPECT_EQ(b.reason, StopReason::kCancelled);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

}  // namespace
}  // namespace specdec
