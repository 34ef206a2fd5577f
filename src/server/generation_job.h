// One HTTP request's generations in the engine: an engine request per choice. The engine's loop
// thread delivers their outputs into the job (callbacks only append and notify: they never
// block on a client); the HTTP thread takes them with wait() and writes them to its client.
//
//   HTTP thread                          loop thread (Request::on_output)
//   submit(requests) ──► Engine::submit   outputs ──► updates queue, metrics, in-flight count
//   wait(timeout) ◄── updates                          (a finished choice releases its slot)
//   cancel() ──► Engine::cancel (once)                 callbacks return false once cancelled
//
// The callbacks hold the shared state, so a job may be dropped while the engine still runs its
// requests (the destructor cancels them).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/metrics.h"
#include "specdec/engine.h"

namespace specdec::server {

// What one engine output brought for one choice.
struct ChoiceUpdate {
  int choice = 0;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;  // [tokens] with logprobs
  std::string text;
  bool finished = false;
  StopReason reason = StopReason::kNone;
  int32_t stop_token = -1;  // reason kStop: the stop token, or -1 and ...
  std::string stop_string;  // ... the stop string
  std::string error;
  RequestStats stats;
};

class GenerationJob {
 public:
  using Clock = std::chrono::steady_clock;

  // `in_flight` already counts the job's requests (the caller reserved them); each choice gives
  // its slot back when it finishes (or when it could not be submitted). `metrics` and
  // `in_flight` must outlive the engine.
  GenerationJob(Engine& engine, ServerMetrics& metrics, std::atomic<int64_t>& in_flight,
                Clock::time_point arrival);
  ~GenerationJob();
  GenerationJob(const GenerationJob&) = delete;
  GenerationJob& operator=(const GenerationJob&) = delete;

  // Submits requests[i] as choice i (their on_output is set here). On a refusal, cancels the
  // ones already submitted and returns the engine's answer (its reason, field and code); ok()
  // when all were accepted. Never throws: the in-flight count stays right whatever happens.
  SubmitResult submit(std::vector<Request> requests);
  // Waits up to `timeout` for updates and moves them (in delivery order) to the end of *out.
  void wait(std::chrono::milliseconds timeout, std::vector<ChoiceUpdate>* out);
  // Every choice has finished and every update was taken.
  bool done() const;
  // Cancels every choice still running (once; later calls do nothing).
  void cancel();
  bool cancelled() const;

 private:
  struct State;
  Engine& engine_;
  std::shared_ptr<State> state_;
  std::vector<int64_t> ids_;
  std::atomic<bool> cancel_sent_{false};
};

}  // namespace specdec::server
