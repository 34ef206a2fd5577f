// specdec bench --url http://HOST:PORT: a server under load, measured from the client side (as
// `vllm bench serve`).
//
// The requests: the load mode's (load_figures.h). Synthetic ones go to /v1/completions as token-id
// arrays with ignore_eos, so each generates exactly its output length; their ids are drawn from
// the vocabulary of -m's GGUF when -m is given (the same prompts as the engine load mode), else
// from the ids the server's /tokenize gives for a fixed English text. A --prompts file sends its
// lines as text (--chat: to /v1/chat/completions, one user message), up to -n tokens each.
// Every request streams (stream_options.include_usage, return_token_ids), with --temp/--top-k/
// --top-p and the seed --seed + its index.
//
// Arrivals: --request-rate R draws the gaps between sends from an exponential distribution of
// rate R (a Poisson process, seeded by --seed); inf (the default) sends them all at once. At
// most --concurrency requests are in flight (default 64): one thread each, taking the requests in
// order; a request waits for its arrival time and a free thread, and its times start when it is
// sent.
//
// Per request: send, each streamed chunk with tokens (token_ids, or text/content when the server
// sends no ids), end; output tokens from the final usage (else the chunks' ids, else one per
// chunk). Figures as the engine load mode (load_figures.h): throughput_tok_s = output tokens /
// wall time from the first send to the last end, ttft/tpot/itl/e2e. A request fails on a
// connection error, an HTTP status other than 200, an error event in the stream, a stream that
// ends without [DONE], or --timeout; failed requests count in "errors" only, and the first
// distinct messages are in "error_messages".
//
// JSON (--output-format json), one object:
//   {"bench": "url", "url", "model" (the server's), "endpoint", "dataset": {...},
//    "num_requests", "concurrency", "request_rate" (a number, or "inf"), "seed",
//    "throughput_tok_s", "throughput_tok_s_runs", "requests_per_s", "ttft_ms", "tpot_ms",
//    "itl_ms", "e2e_ms" ({"mean", "p50", "p90", "p99"}), "errors", "error_messages",
//    "completed", "input_tokens", "output_tokens", "wall_s",
//    "drafted", "accepted", "acceptance_rate", "tokens_per_pass" (from specdec's usage chunks;
//    0 from other servers)}
#include "bench_url.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <httplib.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "load_figures.h"
#include "model/gguf.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec::cli {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

constexpr int kDefaultConcurrency = 64;
constexpr int kMaxConcurrency = 1024;  // threads at most
constexpr size_t kMaxErrorMessages = 5;
constexpr double kConnectTimeoutS = 10;

// Tokenized by the server when -m is not given; its distinct ids make the synthetic prompts.
constexpr const char* kPoolText =
    "Once upon a time, in a small village by the sea, there lived a girl named Lily who loved "
    "to watch the boats. Every morning she ran down to the harbour with her dog, counted the "
    "sails and waved to the fishermen. One day a storm came, the sky turned dark and the waves "
    "grew big and loud. The people were scared, but Lily remembered what her grandfather had "
    "told her: the lighthouse keeps everyone safe. She climbed the hill, lit the lamp and "
    "watched the boats come home, one by one. The next morning the sun was bright, the birds "
    "sang, and the whole village thanked her with cake, apples, bread, milk and a big blue kite. "
    "Quick brown foxes jump over lazy dogs; 0123456789 + - * / = ( ) [ ] ? ! \" ' : ; , .";

// http://HOST:PORT[/PATH], split into the client's scheme-host-port and a path prefix (without a
// trailing / or /v1).
struct ServerUrl {
  std::string host_port;  // "http://127.0.0.1:8080"
  std::string prefix;     // "" or "/some/path"
};

ServerUrl parse_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) {
    throw Error(fmt::format("--url {}: expected http://HOST:PORT (https is not supported)", url));
  }
  const size_t slash = url.find('/', scheme.size());
  ServerUrl u;
  u.host_port = url.substr(0, slash);
  if (u.host_port.size() == scheme.size()) throw Error(fmt::format("--url {}: no host", url));
  if (slash != std::string::npos) u.prefix = url.substr(slash);
  while (!u.prefix.empty() && u.prefix.back() == '/') u.prefix.pop_back();
  if (u.prefix.size() >= 3 && u.prefix.compare(u.prefix.size() - 3, 3, "/v1") == 0) {
    u.prefix.resize(u.prefix.size() - 3);
  }
  return u;
}

double parse_rate(const std::string& s) {
  if (s == "inf" || s == "Inf" || s == "INF") return std::numeric_limits<double>::infinity();
  double r = 0;
  size_t used = 0;
  try {
    r = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || !(r > 0)) {
    throw Error(fmt::format("--request-rate must be a positive number or inf, got '{}'", s));
  }
  return r;
}

std::unique_ptr<httplib::Client> make_client(const ServerUrl& url, const UrlOptions& u) {
  auto c = std::make_unique<httplib::Client>(url.host_port);
  if (!c->is_valid()) throw Error(fmt::format("--url {}: not a valid address", u.url));
  c->set_connection_timeout(std::chrono::duration<double>(kConnectTimeoutS));
  c->set_read_timeout(std::chrono::duration<double>(u.timeout_s));
  c->set_write_timeout(std::chrono::duration<double>(kConnectTimeoutS));
  if (!u.api_key.empty()) c->set_bearer_token_auth(u.api_key);
  return c;
}

// The message of an OpenAI error body, else the body itself (shortened).
std::string error_message(const std::string& body) {
  try {
    const Json j = Json::parse(body);
    if (j.contains("error") && j["error"].is_object() && j["error"].contains("message")) {
      return j["error"]["message"].get<std::string>();
    }
  } catch (const std::exception&) {
  }
  return body.size() > 200 ? body.substr(0, 200) + "..." : body;
}

// A GET or POST whose answer must be a 200 JSON object; throws with what went wrong.
Json call_json(httplib::Client& c, const UrlOptions& u, const std::string& method,
               const std::string& path, const Json* body) {
  httplib::Result res = method == "GET" ? c.Get(path.c_str())
                                        : c.Post(path.c_str(), body->dump(), "application/json");
  if (!res) {
    throw Error(
        fmt::format("{}{}: cannot reach the server ({} error); is `specdec serve` running there?",
                    u.url, path, httplib::to_string(res.error())));
  }
  if (res->status != 200) {
    throw Error(fmt::format("{} {}{}: HTTP {}: {}{}", method, u.url, path, res->status,
                            error_message(res->body), res->status == 401 ? " (--api-key)" : ""));
  }
  try {
    return Json::parse(res->body);
  } catch (const std::exception& e) {
    throw Error(fmt::format("{} {}{}: not JSON: {}", method, u.url, path, e.what()));
  }
}

// The server's model: its id and context (0 when it does not say).
struct ServedModel {
  std::string id;
  int64_t max_model_len = 0;
};

ServedModel served_model(httplib::Client& c, const ServerUrl& url, const UrlOptions& u) {
  const Json j = call_json(c, u, "GET", url.prefix + "/v1/models", nullptr);
  if (!j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].contains("id") || !j["data"][0]["id"].is_string()) {
    throw Error(fmt::format("{}/v1/models: no model in the answer", u.url));
  }
  ServedModel m;
  m.id = j["data"][0]["id"].get<std::string>();
  const Json& len = j["data"][0].contains("max_model_len") ? j["data"][0]["max_model_len"] : Json();
  if (len.is_number_integer()) m.max_model_len = len.get<int64_t>();
  return m;
}

// The ids synthetic prompts are drawn from: -m's vocabulary, or the server's tokens of kPoolText.
TokenSpace token_space(httplib::Client& c, const ServerUrl& url, const UrlOptions& u,
                       const std::string& model_flag, const ServedModel& m) {
  TokenSpace space;
  if (!model_flag.empty()) {
    const std::unique_ptr<GgufFile> gguf = GgufFile::open(resolve_model_path(model_flag));
    space.n_vocab = Tokenizer::from_gguf(*gguf)->n_vocab();
    return space;
  }
  const Json body = {{"model", m.id}, {"content", kPoolText}, {"prompt", kPoolText}};
  Json j;
  try {
    j = call_json(c, u, "POST", url.prefix + "/tokenize", &body);
  } catch (const Error& e) {
    throw Error(
        fmt::format("{}; pass -m with the served model's GGUF file (its vocabulary makes "
                    "the synthetic prompts)",
                    e.what()));
  }
  if (j.contains("tokens") && j["tokens"].is_array()) {
    for (const Json& t : j["tokens"]) {
      if (t.is_number_integer()) space.pool.push_back(t.get<int32_t>());
    }
  }
  std::sort(space.pool.begin(), space.pool.end());
  space.pool.erase(std::unique(space.pool.begin(), space.pool.end()), space.pool.end());
  if (space.pool.empty()) {
    throw Error(
        fmt::format("{}/tokenize gave no token ids; pass -m with the served model's GGUF "
                    "file",
                    u.url));
  }
  space.n_vocab = space.pool.back() + 1;
  return space;
}

// What one request went through.
struct UrlRecord {
  RequestTiming timing;
  int64_t input_tokens = 0;
  int64_t drafted = 0, accepted = 0, passes = 0;
  std::string error;
};

// The request body of one request.
Json request_body(const LoadRequest& r, const LoadDataset& ds, const LoadBenchInput& in,
                  const std::string& model) {
  Json b;
  b["model"] = model;
  if (in.chat) {
    b["messages"] = Json::array({{{"role", "user"}, {"content", r.text}}});
  } else if (ds.synthetic) {
    b["prompt"] = r.prompt;
  } else {
    b["prompt"] = r.text;
  }
  b["max_tokens"] = r.max_tokens;
  b["temperature"] = in.sampling.temperature;
  if (in.sampling.top_p < 1.0f) b["top_p"] = in.sampling.top_p;
  if (in.sampling.top_k > 0) b["top_k"] = in.sampling.top_k;
  b["seed"] = in.sampling.seed + static_cast<uint64_t>(r.index);
  if (ds.synthetic) b["ignore_eos"] = true;
  b["stream"] = true;
  b["stream_options"] = {{"include_usage", true}};
  b["return_token_ids"] = true;
  return b;
}

// Reads the server-sent events of one streamed response into rec.
class StreamReader {
 public:
  StreamReader(UrlRecord* rec, bool chat, Clock::time_point t0) : rec_(rec), chat_(chat), t0_(t0) {}

  void feed(const char* data, size_t n) {
    buffer_.append(data, n);
    size_t start = 0;
    for (size_t nl; (nl = buffer_.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string line = buffer_.substr(start, nl - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      try {
        on_line(line);
      } catch (const std::exception& e) {  // a field of an unexpected type
        if (error_.empty()) error_ = fmt::format("a malformed stream event: {}", e.what());
      }
    }
    buffer_.erase(0, start);
  }

  bool done() const { return done_; }
  int64_t chunk_tokens() const { return chunk_tokens_; }
  int64_t usage_completion_tokens() const { return usage_completion_; }
  const std::string& error() const { return error_; }

 private:
  void on_line(const std::string& line) {
    if (line.rfind("data:", 0) != 0) return;  // blank separators, comments, other fields
    size_t at = 5;
    if (at < line.size() && line[at] == ' ') ++at;
    const std::string payload = line.substr(at);
    if (payload == "[DONE]") {
      done_ = true;
      return;
    }
    const Json j = Json::parse(payload);
    if (j.contains("error")) {
      if (error_.empty()) error_ = error_message(payload);
      return;
    }
    const double t = std::chrono::duration<double>(Clock::now() - t0_).count();
    int64_t n = 0;
    if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
      const Json& c = j["choices"][0];
      const auto ids = c.find("token_ids");
      const Json* text = nullptr;
      if (chat_ && c.contains("delta") && c["delta"].contains("content")) {
        text = &c["delta"]["content"];
      } else if (!chat_ && c.contains("text")) {
        text = &c["text"];
      }
      if (ids != c.end() && ids->is_array()) {
        n = static_cast<int64_t>(ids->size());
      } else if (text != nullptr && text->is_string() && !text->get<std::string>().empty()) {
        n = 1;
      }
    }
    if (n > 0) {
      rec_->timing.chunk_s.push_back(t);
      if (rec_->timing.first_s < 0) rec_->timing.first_s = t;
      chunk_tokens_ += n;
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      const Json& usage = j["usage"];
      usage_completion_ = usage.value("completion_tokens", usage_completion_);
      rec_->input_tokens = usage.value("prompt_tokens", rec_->input_tokens);
    }
    const bool usage_chunk = !j.contains("choices") || j["choices"].empty();
    if (usage_chunk && j.contains("specdec") && j["specdec"].is_object()) {
      const Json& s = j["specdec"];
      rec_->drafted = s.value("drafted_tokens", int64_t{0});
      rec_->accepted = s.value("accepted_tokens", int64_t{0});
      rec_->passes = s.value("target_passes", int64_t{0});
    }
  }

  UrlRecord* rec_;
  bool chat_;
  Clock::time_point t0_;
  std::string buffer_;
  bool done_ = false;
  int64_t chunk_tokens_ = 0;
  int64_t usage_completion_ = -1;
  std::string error_;
};

// Sends one request and streams its answer into rec (times since t0).
void send_request(httplib::Client& c, const std::string& path, const std::string& body,
                  double timeout_s, bool chat, Clock::time_point t0, UrlRecord* rec) {
  StreamReader reader(rec, chat, t0);
  std::string error_body;
  int status = 0;
  bool timed_out = false;
  const Clock::time_point sent = Clock::now();
  rec->timing.submit_s = std::chrono::duration<double>(sent - t0).count();

  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (status != 200) {
      if (error_body.size() < 4096) error_body.append(data, n);
    } else {
      reader.feed(data, n);
    }
    if (std::chrono::duration<double>(Clock::now() - sent).count() > timeout_s) {
      timed_out = true;
      return false;
    }
    return true;
  };
  const httplib::Result res = c.send(req);
  rec->timing.end_s = std::chrono::duration<double>(Clock::now() - t0).count();

  if (timed_out) {
    rec->error = fmt::format("timed out after {} s (--timeout)", timeout_s);
  } else if (!res) {
    rec->error = fmt::format("HTTP request failed: {}", httplib::to_string(res.error()));
  } else if (res->status != 200) {
    rec->error = fmt::format("HTTP {}: {}", res->status,
                             error_message(error_body.empty() ? res->body : error_body));
  } else if (!reader.error().empty()) {
    rec->error = reader.error();
  } else if (!reader.done()) {
    rec->error = "the stream ended without data: [DONE]";
  }
  rec->timing.output_tokens = reader.usage_completion_tokens() >= 0
                                  ? reader.usage_completion_tokens()
                                  : reader.chunk_tokens();
  rec->timing.error = !rec->error.empty();
  rec->timing.counted = !rec->timing.error;
}

// Send times (seconds after the start) of n requests: a Poisson process of rate `rate`, or all
// at 0 when it is infinite.
std::vector<double> arrival_times(int n, double rate, uint64_t seed) {
  std::vector<double> t(static_cast<size_t>(n), 0.0);
  if (std::isinf(rate)) return t;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);  // not the dataset's stream
  std::exponential_distribution<double> gap(rate);
  for (size_t i = 1; i < t.size(); ++i) t[i] = t[i - 1] + gap(rng);
  return t;
}

struct RunOutcome {
  std::vector<UrlRecord> records;
  double wall_s = 0;
};

RunOutcome run_requests(const ServerUrl& url, const UrlOptions& u, const std::string& path,
                        const std::vector<std::string>& bodies, const std::vector<double>& at,
                        int concurrency, bool chat) {
  const int n = static_cast<int>(bodies.size());
  RunOutcome out;
  out.records.resize(static_cast<size_t>(n));
  std::atomic<int> next{0}, done{0};
  std::mutex progress_mutex;
  int progress_shown = 0;
  const int progress_every = std::max(1, n / 10);
  const Clock::time_point t0 = Clock::now();
  auto worker = [&] {
    std::unique_ptr<httplib::Client> client = make_client(url, u);
    for (int i; (i = next.fetch_add(1)) < n;) {
      std::this_thread::sleep_until(
          t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at[i])));
      send_request(*client, path, bodies[static_cast<size_t>(i)], u.timeout_s, chat, t0,
                   &out.records[static_cast<size_t>(i)]);
      const int finished = done.fetch_add(1) + 1;
      const std::lock_guard<std::mutex> lock(progress_mutex);
      const double elapsed = seconds_since(t0);
      if (finished / progress_every > progress_shown && elapsed > 1.0) {
        progress_shown = finished / progress_every;
        fmt::print(stderr, "{}/{} requests done ({:.1f} s)\n", finished, n, elapsed);
      }
    }
  };
  std::vector<std::thread> threads;
  const int n_threads = std::min(concurrency, n);
  threads.reserve(static_cast<size_t>(n_threads));
  for (int i = 0; i < n_threads; ++i) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  // From the first send to the last end (the first send is at most a moment after t0).
  double first = 1e300, last = 0;
  for (const UrlRecord& r : out.records) {
    first = std::min(first, r.timing.submit_s);
    last = std::max(last, r.timing.end_s);
  }
  out.wall_s = n > 0 ? last - first : 0;
  return out;
}

void check_url_options(const UrlOptions& u, const LoadOptions& o, const LoadBenchInput& in) {
  check_dataset_options(o, in);
  if (u.timeout_s <= 0) throw Error(fmt::format("--timeout must be positive, got {}", u.timeout_s));
  if (o.concurrency > kMaxConcurrency) {
    throw Error(fmt::format("--concurrency {} is above the {} threads the URL mode runs at most",
                            o.concurrency, kMaxConcurrency));
  }
  if (in.spec.spec != "none") {
    throw Error("--spec is the server's option; the URL mode measures the server as it runs");
  }
  if (in.interleave) throw Error("--interleave does not apply to the URL mode (--url)");
  if (!in.prompts_file.empty() && o.prefix_len > 0) {
    throw Error(
        "--prefix-len with --url applies to synthetic prompts only (a prompts file is "
        "sent as text)");
  }
  if (!o.dump_outputs.empty()) throw Error("--dump-outputs does not apply to the URL mode");
}

void print_report(const Json& j, const LatencyFigures& f, const std::vector<std::string>& errors) {
  const Json& ds = j["dataset"];
  fmt::print("server: {} (model {})\n", j["url"].get<std::string>(), j["model"].get<std::string>());
  const std::string rate = j["request_rate"].is_string()
                               ? std::string("inf")
                               : fmt::format("{:g}/s", j["request_rate"].get<double>());
  if (ds["kind"] == "synthetic") {
    fmt::print(
        "load: {} requests to {}, concurrency {}, request rate {}, synthetic prompts {}±{} "
        "tokens, outputs {}±{} tokens, shared prefix {} (seed {})\n",
        j["num_requests"].get<int>(), j["endpoint"].get<std::string>(), j["concurrency"].get<int>(),
        rate, ds["input_mean"].get<double>(), ds["input_stdev"].get<double>(),
        ds["output_mean"].get<double>(), ds["output_stdev"].get<double>(),
        ds["prefix_len"].get<int>(), j["seed"].get<uint64_t>());
  } else {
    fmt::print(
        "load: {} requests to {}, concurrency {}, request rate {}, prompts from {} (-n {})\n",
        j["num_requests"].get<int>(), j["endpoint"].get<std::string>(), j["concurrency"].get<int>(),
        rate, ds["file"].get<std::string>(), ds["n_gen"].get<int>());
  }
  f.print("url");
  fmt::print("       {} input tokens, {} output tokens in {:.2f} s\n",
             j["input_tokens"].get<int64_t>(), j["output_tokens"].get<int64_t>(), f.wall_s);
  if (j["drafted"].get<int64_t>() > 0) {
    fmt::print("       drafted {}, accepted {} ({:.1f}%), {:.2f} tokens per target pass\n",
               j["drafted"].get<int64_t>(), j["accepted"].get<int64_t>(),
               100 * j["acceptance_rate"].get<double>(), j["tokens_per_pass"].get<double>());
  }
  for (const std::string& e : errors) fmt::print("       error: {}\n", e);
}

}  // namespace

void add_url_options(CLI::App* cmd, UrlOptions* o) {
  cmd->add_option("--url", o->url,
                  "URL mode: send the load mode's requests to the OpenAI-compatible server at "
                  "http://HOST:PORT (streamed; figures measured by the client)");
  cmd->add_option("--request-rate", o->request_rate,
                  "URL mode: requests per second (Poisson arrivals from --seed), or inf: all at "
                  "once")
      ->capture_default_str();
  cmd->add_option("--api-key", o->api_key,
                  "URL mode: sent as Authorization: Bearer KEY (default $SPECDEC_API_KEY)")
      ->envname("SPECDEC_API_KEY");
  cmd->add_option("--timeout", o->timeout_s, "URL mode: seconds a request may take")
      ->capture_default_str();
}

void run_url_bench(const UrlOptions& u, const LoadOptions& o, const LoadBenchInput& in) {
  check_url_options(u, o, in);
  const double rate = parse_rate(u.request_rate);
  const ServerUrl url = parse_url(u.url);
  const int concurrency = o.concurrency != -1 ? o.concurrency : kDefaultConcurrency;
  int num_requests = o.num_requests;
  if (num_requests == -1 && in.prompts_file.empty()) num_requests = concurrency * 4;

  std::unique_ptr<httplib::Client> client = make_client(url, u);
  const ServedModel model = served_model(*client, url, u);
  int64_t ctx = in.ctx_size;
  if (model.max_model_len > 0) ctx = std::min(ctx, model.max_model_len);
  TokenSpace space;
  if (in.prompts_file.empty()) space = token_space(*client, url, u, in.model, model);
  const LoadDataset ds = make_load_dataset(o, in, space, ctx, nullptr, &num_requests);

  const std::string endpoint = in.chat ? "/v1/chat/completions" : "/v1/completions";
  std::vector<std::string> bodies;
  bodies.reserve(ds.requests.size());
  for (const LoadRequest& r : ds.requests) {
    bodies.push_back(request_body(r, ds, in, model.id).dump());
  }
  const std::vector<double> at = arrival_times(num_requests, rate, in.sampling.seed);
  const RunOutcome run =
      run_requests(url, u, url.prefix + endpoint, bodies, at, concurrency, in.chat);

  LatencyFigures f;
  int64_t input_tokens = 0, drafted = 0, accepted = 0, passes = 0, decode_tokens = 0;
  std::vector<std::string> errors;
  for (size_t i = 0; i < run.records.size(); ++i) {
    const UrlRecord& r = run.records[i];
    f.add_request(r.timing);
    if (!r.error.empty()) {
      if (errors.size() < kMaxErrorMessages &&
          std::find(errors.begin(), errors.end(), r.error) == errors.end()) {
        errors.push_back(r.error);
      }
      continue;
    }
    input_tokens +=
        r.input_tokens > 0 ? r.input_tokens : static_cast<int64_t>(ds.requests[i].prompt.size());
    drafted += r.drafted;
    accepted += r.accepted;
    passes += r.passes;
    decode_tokens += std::max<int64_t>(0, r.timing.output_tokens - 1);
  }
  f.end_run(run.wall_s);

  Json j;
  j["bench"] = "url";
  j["url"] = u.url;
  j["model"] = model.id;
  j["endpoint"] = endpoint;
  j["dataset"] = ds.description;
  j["num_requests"] = num_requests;
  j["concurrency"] = concurrency;
  j["request_rate"] = std::isinf(rate) ? Json("inf") : Json(rate);
  j["seed"] = in.sampling.seed;
  f.to_json(&j);
  j["error_messages"] = errors;
  j["completed"] = f.completed;
  j["input_tokens"] = input_tokens;
  j["output_tokens"] = f.output_tokens;
  j["wall_s"] = f.wall_s;
  j["drafted"] = drafted;
  j["accepted"] = accepted;
  j["acceptance_rate"] = drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0;
  j["tokens_per_pass"] = passes > 0 ? static_cast<double>(decode_tokens) / passes : 0.0;

  if (in.json) {
    std::printf("%s\n", j.dump(2).c_str());
    std::fflush(stdout);
  } else {
    print_report(j, f, errors);
  }
  if (f.completed == 0) {
    throw Error(fmt::format("all {} requests failed; the first: {}", num_requests,
                            errors.empty() ? "?" : errors.front()));
  }
}

}  // namespace specdec::cli
