// The URL mode of `specdec bench` (--url http://HOST:PORT): the load mode's requests sent to an
// OpenAI-compatible server over HTTP, as `vllm bench serve` does. See bench_url.cpp.
#pragma once

#include <string>

#include "bench_load.h"

namespace CLI {
class App;
}

namespace specdec::cli {

struct UrlOptions {
  std::string url;                   // http://HOST:PORT (a trailing /v1 is allowed)
  std::string request_rate = "inf";  // requests per second (Poisson arrivals), or inf
  std::string api_key;               // sent as Authorization: Bearer KEY
  double timeout_s = 600;            // per request
};

void add_url_options(CLI::App* cmd, UrlOptions* o);
inline bool url_mode_requested(const UrlOptions& o) {
  return !o.url.empty();
}

// Sends the requests, prints the report (text, or one JSON object) to stdout. Throws
// specdec::Error naming the option for a bad value, and saying what failed when the server cannot
// be reached or every request failed.
void run_url_bench(const UrlOptions& u, const LoadOptions& o, const LoadBenchInput& in);

}  // namespace specdec::cli
