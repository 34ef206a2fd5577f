#include "server/generation_job.h"

#include <condition_variable>
#include <deque>
#include <mutex>

namespace specdec::server {

struct GenerationJob::State {
  State(ServerMetrics& m, std::atomic<int64_t>& f, Clock::time_point a)
      : metrics(m), in_flight(f), arrival(a) {}

  // Per choice, touched only by the loop thread.
  struct Choice {
    bool first_token_seen = false;
    Clock::time_point last_tokens;
    int64_t last_passes = 0;  // RequestStats::n_passes at the previous output
    SpecMethod method = SpecMethod::kNone;
  };

  ServerMetrics& metrics;
  std::atomic<int64_t>& in_flight;
  const Clock::time_point arrival;
  std::vector<Choice> choices;  // sized before the first submit, never resized after
  std::atomic<bool> cancelled{false};

  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<ChoiceUpdate> pending;  // guarded by mu
  int unfinished = 0;                // guarded by mu

  // The loop thread's callback for choice `i`.
  bool on_output(int i, const RequestOutput& o) noexcept;
};

bool GenerationJob::State::on_output(int i, const RequestOutput& o) noexcept {
  try {
    const Clock::time_point now = Clock::now();
    Choice& c = choices[static_cast<size_t>(i)];
    const auto n = static_cast<int64_t>(o.tokens.size());
    if (n > 0) {
      if (!c.first_token_seen) {
        c.first_token_seen = true;
        metrics.on_first_token(std::chrono::duration<double>(now - arrival).count());
        metrics.on_tokens(n, -1.0);
      } else {
        metrics.on_tokens(n, std::chrono::duration<double>(now - c.last_tokens).count());
      }
      c.last_tokens = now;
    }
    metrics.on_target_passes(c.method, o.stats.n_passes - c.last_passes);
    c.last_passes = o.stats.n_passes;
    if (o.finished) {
      metrics.on_finished(o.reason, std::chrono::duration<double>(now - arrival).count());
      in_flight.fetch_sub(1);
    }

    ChoiceUpdate u;
    u.choice = i;
    u.tokens = o.tokens;
    u.logprobs = o.logprobs;
    u.text = o.text;
    u.finished = o.finished;
    u.reason = o.reason;
    u.stop_token = o.stop_token;
    u.stop_string = o.stop_string;
    u.error = o.error;
    u.stats = o.stats;
    {
      std::lock_guard<std::mutex> lock(mu);
      pending.push_back(std::move(u));
      if (o.finished) --unfinished;
    }
    cv.notify_all();
  } catch (...) {
    // Out of memory while queueing: the client gets less; the engine must go on.
  }
  return !cancelled.load();
}

GenerationJob::GenerationJob(Engine& engine, ServerMetrics& metrics,
                             std::atomic<int64_t>& in_flight, Clock::time_point arrival)
    : engine_(engine), state_(std::make_shared<State>(metrics, in_flight, arrival)) {}

GenerationJob::~GenerationJob() {
  if (!done()) cancel();
}

SubmitResult GenerationJob::submit(std::vector<Request> requests) {
  const int n = static_cast<int>(requests.size());
  state_->choices.resize(static_cast<size_t>(n));
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->unfinished = n;
  }
  for (int i = 0; i < n; ++i) {
    Request& r = requests[static_cast<size_t>(i)];
    state_->choices[static_cast<size_t>(i)].method = r.spec.method;
    std::shared_ptr<State> st = state_;
    r.on_output = [st, i](const RequestOutput& o) { return st->on_output(i, o); };
    SubmitResult result;
    try {
      result = engine_.submit(std::move(r));
    } catch (const std::exception& e) {  // out of memory: refused like any other request
      result.error = std::string("internal error: ") + e.what();
      result.code = "internal_error";
    }
    if (!result.ok()) {
      // Choices i.. never run: their slots go back now; the submitted ones are cancelled and
      // give theirs back when the engine finishes them.
      state_->in_flight.fetch_sub(n - i);
      {
        std::lock_guard<std::mutex> lock(state_->mu);
        state_->unfinished -= n - i;
      }
      cancel();
      return result;
    }
    ids_.push_back(result.id);
  }
  return SubmitResult{};
}

void GenerationJob::wait(std::chrono::milliseconds timeout, std::vector<ChoiceUpdate>* out) {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait_for(lock, timeout,
                      [this] { return !state_->pending.empty() || state_->unfinished == 0; });
  while (!state_->pending.empty()) {
    out->push_back(std::move(state_->pending.front()));
    state_->pending.pop_front();
  }
}

bool GenerationJob::done() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->unfinished == 0 && state_->pending.empty();
}

void GenerationJob::cancel() {
  state_->cancelled = true;
  if (cancel_sent_.exchange(true)) return;
  for (int64_t id : ids_) engine_.cancel(id);
}

bool GenerationJob::cancelled() const {
  return state_->cancelled.load();
}

}  // namespace specdec::server
