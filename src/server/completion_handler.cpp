#include "server/completion_handler.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <httplib.h>

#include "server/client_connection.h"
#include "server/generation_job.h"
#include "server/http_response.h"
#include "server/openai_format.h"
#include "server/prompt_builder.h"

namespace specdec::server {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// How often a waiting handler looks at its client's socket (and the shutdown flag).
constexpr auto kPollInterval = std::chrono::milliseconds(50);

uint64_t random_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

// One accepted request: what the stream and the final response are made of.
struct Generation {
  ServerState* state = nullptr;
  ResponseMeta meta;
  CompletionRequest request;
  std::vector<BuiltPrompt> prompts;
  std::vector<ChoiceResult> choices;  // [prompts × n], choice i of prompt i / n
  std::vector<int64_t> text_offsets;  // [choices] streamed completions: logprobs' text_offset
  std::shared_ptr<GenerationJob> job;

  void apply(const ChoiceUpdate& u) {
    ChoiceResult& c = choices[static_cast<size_t>(u.choice)];
    c.text += u.text;
    c.tokens.insert(c.tokens.end(), u.tokens.begin(), u.tokens.end());
    c.logprobs.insert(c.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
    c.stats = u.stats;
    if (u.finished) {
      c.finished = true;
      c.reason = u.reason;
      c.stop_token = u.stop_token;
      c.stop_string = u.stop_string;
      c.error = u.error;
    }
  }

  Usage usage() const {
    Usage u;
    for (const BuiltPrompt& p : prompts) u.prompt_tokens += static_cast<int64_t>(p.tokens.size());
    for (size_t i = 0; i < choices.size(); ++i) {
      u.completion_tokens += static_cast<int64_t>(choices[i].tokens.size());
      if (i % static_cast<size_t>(request.n) == 0) u.cached_tokens += choices[i].stats.n_cached;
    }
    return u;
  }

  Json specdec_totals() const {
    std::vector<const RequestStats*> stats;
    for (const ChoiceResult& c : choices) stats.push_back(&c.stats);
    return specdec_json(meta.spec_method, stats);
  }

  std::vector<std::vector<int32_t>> prompt_tokens() const {
    std::vector<std::vector<int32_t>> out;
    for (const BuiltPrompt& p : prompts) out.push_back(p.tokens);
    return out;
  }
  std::vector<std::string> prompt_texts() const {
    std::vector<std::string> out;
    for (const BuiltPrompt& p : prompts) out.push_back(p.text);
    return out;
  }
};

std::vector<Request> engine_requests(const CompletionRequest& r,
                                     const std::vector<BuiltPrompt>& prompts,
                                     const ModelBackend& b) {
  std::vector<Request> out;
  for (const BuiltPrompt& p : prompts) {
    for (int j = 0; j < r.n; ++j) {
      Request e;
      e.prompt = p.tokens;
      e.sampling = r.sampling;
      e.sampling.seed = r.seed_given ? r.sampling.seed + static_cast<uint64_t>(j) : random_seed();
      if (r.max_tokens > 0) {
        e.max_tokens = r.max_tokens;
      } else {  // until the context is full
        const int64_t room = b.max_context - static_cast<int64_t>(p.tokens.size());
        e.max_tokens =
            static_cast<int>(std::clamp<int64_t>(room, 1, std::numeric_limits<int32_t>::max()));
      }
      e.stop_tokens = r.stop_token_ids;
      e.stop = r.stop;
      e.ignore_eos = r.ignore_eos;
      e.logprobs = r.logprobs;
      e.spec = b.spec;
      out.push_back(std::move(e));
    }
  }
  return out;
}

// The engine's refusal of a request as an API error: its field in this endpoint's terms.
ApiError submit_error(const SubmitResult& refused, ApiKind kind) {
  const bool chat = kind == ApiKind::kChat;
  std::string param = refused.param;
  if (param == "prompt" && chat) param = "messages";
  if (param == "logprobs" && chat) param = "top_logprobs";
  // The server's own settings (speculation) or its failure: not the client's fault.
  if (refused.code == "internal_error" || param == "num_draft" || param == "tree" ||
      param == "ngram" || param == "spec" || param == "beams" || param == "medusa_tree" ||
      param == "draft_p_min" || param == "draft_temp") {
    ApiError e;
    e.status = 500;
    e.type = "server_error";
    e.message = refused.error;
    return e;
  }
  return invalid_request(refused.error, param, refused.code);
}

// --- streaming ---------------------------------------------------------------------------------

bool send_event(httplib::DataSink& sink, const std::string& data) {
  const std::string event = "data: " + data + "\n\n";
  return sink.write(event.data(), event.size());
}

// The whole stream, written in the chunked content provider's first call. False when the client
// is gone (the job is then cancelled).
bool write_stream(Generation& g, httplib::DataSink& sink) {
  const CompletionRequest& r = g.request;
  const bool chat = r.kind == ApiKind::kChat;
  // Chat announces the role first; echo sends the prompt's text first.
  for (size_t i = 0; i < g.choices.size(); ++i) {
    if (!chat && !(r.echo && !g.prompts[i / r.n].text.empty())) continue;
    ChunkPart part;
    part.index = static_cast<int>(i);
    part.role = chat;
    if (!chat) part.text = g.prompts[i / r.n].text;
    if (!send_event(sink, dump_json(stream_chunk(g.meta, part)))) return false;
  }
  std::vector<ChoiceUpdate> updates;
  for (;;) {
    updates.clear();
    g.job->wait(kPollInterval, &updates);
    for (const ChoiceUpdate& u : updates) {
      g.apply(u);
      if (u.finished && u.reason == StopReason::kError) {
        ApiError e;
        e.status = 500;
        e.type = "server_error";
        e.message = u.error;
        if (!send_event(sink, dump_json(error_json(e)))) return false;
      }
      const bool with_tokens = (r.return_token_ids || r.logprobs >= 0) && !u.tokens.empty();
      if (u.text.empty() && !u.finished && !with_tokens) continue;  // text held back
      ChunkPart part;
      part.index = u.choice;
      part.text = u.text;
      part.token_ids = r.return_token_ids ? &u.tokens : nullptr;
      part.logprobs = r.logprobs >= 0 ? &u.logprobs : nullptr;
      part.text_offset = &g.text_offsets[static_cast<size_t>(u.choice)];
      part.finished = u.finished;
      part.reason = u.reason;
      part.stop_token = u.stop_token;
      part.stop_string = u.stop_string;
      Json chunk = stream_chunk(g.meta, part);
      if (u.finished) chunk["specdec"] = specdec_json(g.meta.spec_method, {&u.stats});
      if (r.continuous_usage) chunk["usage"] = usage_json(g.usage());
      if (!send_event(sink, dump_json(chunk))) return false;
    }
    if (g.job->done()) break;
    if (!sink.is_writable()) return false;
    if (g.state->cancel_all.load()) g.job->cancel();
  }
  if (r.include_usage &&
      !send_event(sink, dump_json(usage_chunk(g.meta, g.usage(), g.specdec_totals())))) {
    return false;
  }
  if (!send_event(sink, "[DONE]")) return false;
  sink.done();
  return true;
}

void start_stream(std::shared_ptr<Generation> g, httplib::Response& res) {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [g](size_t /*offset*/, httplib::DataSink& sink) {
        bool ok = false;
        try {
          ok = write_stream(*g, sink);
        } catch (...) {
          ok = false;  // never let an exception out of httplib's writer
        }
        if (!ok) g->job->cancel();
        return ok;
      },
      [g](bool success) {
        if (!success) g->job->cancel();
      });
}

// --- waiting for the whole response ------------------------------------------------------------

void respond_when_done(Generation& g, const httplib::Request& req, httplib::Response& res) {
  const ClientConnection client(req);
  std::vector<ChoiceUpdate> updates;
  while (!g.job->done()) {
    updates.clear();
    g.job->wait(kPollInterval, &updates);
    for (const ChoiceUpdate& u : updates) g.apply(u);
    if (!g.job->cancelled() && (g.state->cancel_all.load() || client.closed())) g.job->cancel();
  }
  for (const ChoiceResult& c : g.choices) {
    if (c.reason == StopReason::kError) {
      ApiError e;
      e.status = 500;
      e.type = "server_error";
      e.message = c.error;
      send_error(res, e);
      return;
    }
  }
  send_json(
      res, 200,
      full_response(g.meta, g.request, g.choices, g.prompt_tokens(), g.prompt_texts(), g.usage()));
}

}  // namespace

void handle_completion(ServerState& state, ApiKind kind, const httplib::Request& req,
                       httplib::Response& res) {
  const Clock::time_point arrival = Clock::now();
  const ModelBackend* backend = state.backend.load();
  if (backend == nullptr) return send_error(res, unavailable("the model is loading", "loading"));
  if (state.shutting_down.load()) {
    return send_error(res, unavailable("the server is shutting down", "shutting_down"));
  }
  json body;
  if (auto e = parse_json_body(req.body, &body)) return send_error(res, *e);
  auto g = std::make_shared<Generation>();
  g->state = &state;
  if (auto e = parse_completion_request(body, kind, &g->request)) return send_error(res, *e);
  const CompletionRequest& r = g->request;
  if (!r.model.empty() && !backend->serves(r.model)) {
    ApiError e;
    e.status = 404;
    e.message = "the model '" + r.model + "' does not exist; this server serves '" +
                backend->model_name + "'";
    e.param = "model";
    e.code = "model_not_found";
    return send_error(res, e);
  }
  if (auto e = build_prompts(r, *backend, &g->prompts)) return send_error(res, *e);

  const auto n_choices = static_cast<int64_t>(g->prompts.size()) * r.n;
  g->meta.kind = kind;
  g->meta.id = make_response_id(kind);
  g->meta.created = static_cast<int64_t>(std::time(nullptr));
  g->meta.model = backend->model_name;
  g->meta.spec_method = backend->spec.method;
  g->meta.tokenizer = backend->tokenizer;
  g->meta.logprobs = r.logprobs;
  g->meta.ignore_eos = r.ignore_eos;
  g->choices.resize(static_cast<size_t>(n_choices));
  g->text_offsets.assign(static_cast<size_t>(n_choices), 0);
  for (size_t i = 0; i < g->choices.size(); ++i) {
    g->choices[i].prompt_index = static_cast<int>(i / static_cast<size_t>(r.n));
  }
  std::vector<Request> requests = engine_requests(r, g->prompts, *backend);
  g->job =
      std::make_shared<GenerationJob>(*backend->engine, state.metrics, state.in_flight, arrival);
  // Queue slots: from here on the job gives each one back (when its choice finishes, or at once
  // when it cannot be submitted).
  const int64_t before = state.in_flight.fetch_add(n_choices);
  if (before + n_choices > state.config.max_queue) {
    state.in_flight.fetch_sub(n_choices);
    return send_error(res, unavailable("the server is busy: " + std::to_string(before) +
                                           " generations in flight, the queue holds " +
                                           std::to_string(state.config.max_queue) + "; retry later",
                                       "queue_full"));
  }
  const SubmitResult refused = g->job->submit(std::move(requests));
  if (!refused.ok()) return send_error(res, submit_error(refused, kind));
  state.metrics.on_request_accepted(g->usage().prompt_tokens);

  if (r.stream) {
    start_stream(std::move(g), res);
  } else {
    respond_when_done(*g, req, res);
  }
}

}  // namespace specdec::server
