#include "load_figures.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <utility>

#include <fmt/format.h>

#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec::cli {
namespace {

// A length from N(mean, stdev), rounded and clamped to [lo, hi].
int draw_length(std::mt19937_64& rng, double mean, double stdev, int lo, int hi) {
  double x = mean;
  if (stdev > 0) x = std::normal_distribution<double>(mean, stdev)(rng);
  const double clamped =
      std::clamp(std::round(x), static_cast<double>(lo), static_cast<double>(hi));
  return static_cast<int>(clamped);
}

std::vector<int32_t> random_tokens(std::mt19937_64& rng, int n, const TokenSpace& space) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  if (!space.pool.empty()) {
    std::uniform_int_distribution<size_t> dist(0, space.pool.size() - 1);
    for (int32_t& x : t) x = space.pool[dist(rng)];
    return t;
  }
  std::uniform_int_distribution<int32_t> dist(std::min(3, space.n_vocab - 1), space.n_vocab - 1);
  for (int32_t& x : t) x = dist(rng);
  return t;
}

// One request a non-blank line: a JSON string, or an object with a "prompt" or "text" string.
// Returns (0-based line, text) pairs.
std::vector<std::pair<int64_t, std::string>> read_prompt_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("{}: cannot open prompts file", path));
  std::vector<std::pair<int64_t, std::string>> prompts;
  std::string line;
  for (int64_t line_no = 0; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::ordered_json::exception& e) {
      throw Error(fmt::format("{}:{}: not JSON: {}", path, line_no + 1, e.what()));
    }
    if (j.is_string()) {
      prompts.emplace_back(line_no, j.get<std::string>());
    } else if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) {
      prompts.emplace_back(line_no, j["prompt"].get<std::string>());
    } else if (j.is_object() && j.contains("text") && j["text"].is_string()) {
      prompts.emplace_back(line_no, j["text"].get<std::string>());
    } else {
      throw Error(fmt::format(
          "{}:{}: expected a JSON string or an object with a \"prompt\" or \"text\" string", path,
          line_no + 1));
    }
  }
  if (prompts.empty()) throw Error(fmt::format("{}: no prompts", path));
  return prompts;
}

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double pos = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

}  // namespace

void check_dataset_options(const LoadOptions& o, const LoadBenchInput& in) {
  if (o.concurrency != -1 && o.concurrency < 1) {
    throw Error(fmt::format("--concurrency must be at least 1, got {}", o.concurrency));
  }
  if (o.num_requests != -1 && o.num_requests < 1) {
    throw Error(fmt::format("--num-requests must be at least 1, got {}", o.num_requests));
  }
  if (o.input_stdev < 0) {
    throw Error(fmt::format("--input-stdev must not be negative, got {}", o.input_stdev));
  }
  if (o.output_stdev < 0) {
    throw Error(fmt::format("--output-stdev must not be negative, got {}", o.output_stdev));
  }
  if (o.prefix_len < 0) {
    throw Error(fmt::format("--prefix-len must not be negative, got {}", o.prefix_len));
  }
  if (!in.prompts_file.empty()) {
    if (o.input_mean != -1 || o.output_mean != -1 || o.input_stdev != 0 || o.output_stdev != 0) {
      throw Error(
          "--input-mean/--input-stdev/--output-mean/--output-stdev describe synthetic requests; "
          "with --prompts the output length is -n");
    }
    if (in.n_gen < 1) throw Error(fmt::format("-n must be at least 1, got {}", in.n_gen));
  } else {
    const double input_mean = o.input_mean != -1 ? o.input_mean : in.n_prompt;
    const double output_mean = o.output_mean != -1 ? o.output_mean : in.n_gen;
    if (input_mean < 1) {
      throw Error(fmt::format("--input-mean must be at least 1, got {}", input_mean));
    }
    if (output_mean < 1) {
      throw Error(fmt::format("--output-mean must be at least 1, got {}", output_mean));
    }
    if (in.chat) throw Error("--chat needs --prompts (synthetic prompts are token ids)");
  }
}

LoadDataset make_load_dataset(const LoadOptions& o, const LoadBenchInput& in,
                              const TokenSpace& space, int64_t ctx, const Tokenizer* tok,
                              int* num_requests) {
  LoadDataset ds;
  std::mt19937_64 rng(in.sampling.seed);
  if (o.prefix_len > ctx - 2) {
    throw Error(
        fmt::format("--prefix-len {} leaves no room for a prompt and an output in the "
                    "context of {} tokens",
                    o.prefix_len, ctx));
  }
  const std::vector<int32_t> prefix = random_tokens(rng, o.prefix_len, space);
  const int room = static_cast<int>(ctx) - o.prefix_len;  // prompt + output tokens
  if (in.prompts_file.empty()) {
    ds.synthetic = true;
    const double input_mean = o.input_mean != -1 ? o.input_mean : in.n_prompt;
    const double output_mean = o.output_mean != -1 ? o.output_mean : in.n_gen;
    ds.description = {{"kind", "synthetic"},
                      {"input_mean", input_mean},
                      {"input_stdev", o.input_stdev},
                      {"output_mean", output_mean},
                      {"output_stdev", o.output_stdev},
                      {"prefix_len", o.prefix_len},
                      {"seed", in.sampling.seed}};
    for (int i = 0; i < *num_requests; ++i) {
      LoadRequest r;
      r.index = i;
      const int n_in = draw_length(rng, input_mean, o.input_stdev, 1, room - 1);
      r.max_tokens = draw_length(rng, output_mean, o.output_stdev, 1, room - n_in);
      r.prompt = prefix;
      const std::vector<int32_t> own = random_tokens(rng, n_in, space);
      r.prompt.insert(r.prompt.end(), own.begin(), own.end());
      ds.requests.push_back(std::move(r));
    }
    return ds;
  }
  ds.synthetic = false;
  const auto lines = read_prompt_lines(in.prompts_file);
  if (*num_requests == -1) *num_requests = static_cast<int>(lines.size());
  if (*num_requests > static_cast<int>(lines.size())) {
    throw Error(fmt::format("--num-requests {} exceeds the {} prompts of {} (each is sent once)",
                            *num_requests, lines.size(), in.prompts_file));
  }
  ds.description = {{"kind", "prompts"}, {"file", in.prompts_file},    {"chat", in.chat},
                    {"n_gen", in.n_gen}, {"prefix_len", o.prefix_len}, {"seed", in.sampling.seed}};
  for (int i = 0; i < *num_requests; ++i) {
    const auto& [line_no, text] = lines[static_cast<size_t>(i)];
    LoadRequest r;
    r.index = line_no;
    r.prompt = prefix;
    r.text = text;
    r.max_tokens = in.n_gen;
    if (tok != nullptr) {
      const std::vector<int32_t> own =
          in.chat ? tok->encode(tok->apply_chat_template({{"user", text}}, true), false, true)
                  : tok->encode(text, true, true);
      r.prompt.insert(r.prompt.end(), own.begin(), own.end());
      const int64_t n = static_cast<int64_t>(r.prompt.size());
      if (n + 1 > ctx) {
        throw Error(fmt::format("{}:{}: a prompt of {} tokens does not fit the context of {}",
                                in.prompts_file, line_no + 1, n, ctx));
      }
      r.max_tokens = static_cast<int>(std::min<int64_t>(in.n_gen, ctx - n));
    }
    ds.requests.push_back(std::move(r));
  }
  return ds;
}

Distribution distribution(std::vector<double> v) {
  Distribution d;
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  d.mean = sum / static_cast<double>(v.size());
  d.p50 = percentile(v, 50);
  d.p90 = percentile(v, 90);
  d.p99 = percentile(v, 99);
  return d;
}

nlohmann::ordered_json distribution_json(const Distribution& d) {
  return {{"mean", d.mean}, {"p50", d.p50}, {"p90", d.p90}, {"p99", d.p99}};
}

void LatencyFigures::add_request(const RequestTiming& t) {
  if (t.error) ++errors;
  if (!t.counted) return;
  ++run_completed_;
  run_tokens_ += t.output_tokens;
  const double e2e = (t.end_s - t.submit_s) * 1e3;
  e2e_ms.push_back(e2e);
  if (t.first_s >= 0) {
    const double ttft = (t.first_s - t.submit_s) * 1e3;
    ttft_ms.push_back(ttft);
    if (t.output_tokens >= 2) {
      tpot_ms.push_back((e2e - ttft) / static_cast<double>(t.output_tokens - 1));
    }
  }
  for (size_t c = 1; c < t.chunk_s.size(); ++c) {
    itl_ms.push_back((t.chunk_s[c] - t.chunk_s[c - 1]) * 1e3);
  }
}

void LatencyFigures::end_run(double run_wall_s) {
  output_tokens += run_tokens_;
  completed += run_completed_;
  wall_s += run_wall_s;
  throughput_runs.push_back(run_wall_s > 0 ? static_cast<double>(run_tokens_) / run_wall_s : 0);
  requests_per_s_runs.push_back(run_wall_s > 0 ? static_cast<double>(run_completed_) / run_wall_s
                                               : 0);
  run_tokens_ = 0;
  run_completed_ = 0;
}

double LatencyFigures::mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

void LatencyFigures::to_json(nlohmann::ordered_json* j) const {
  (*j)["throughput_tok_s"] = throughput();
  (*j)["throughput_tok_s_runs"] = throughput_runs;
  (*j)["requests_per_s"] = mean(requests_per_s_runs);
  (*j)["ttft_ms"] = distribution_json(distribution(ttft_ms));
  (*j)["tpot_ms"] = distribution_json(distribution(tpot_ms));
  (*j)["itl_ms"] = distribution_json(distribution(itl_ms));
  (*j)["e2e_ms"] = distribution_json(distribution(e2e_ms));
  (*j)["errors"] = errors;
}

void LatencyFigures::print(const char* name) const {
  fmt::print("{:<5}  {:9.1f} tok/s  {:7.2f} req/s  errors {}\n", name, throughput(),
             mean(requests_per_s_runs), errors);
  auto row = [](const char* what, const std::vector<double>& v) {
    const Distribution d = distribution(v);
    fmt::print("       {:<5} ms  mean {:9.2f}  p50 {:9.2f}  p90 {:9.2f}  p99 {:9.2f}\n", what,
               d.mean, d.p50, d.p90, d.p99);
  };
  row("TTFT", ttft_ms);
  row("TPOT", tpot_ms);
  row("ITL", itl_ms);
  row("E2E", e2e_ms);
}

}  // namespace specdec::cli
