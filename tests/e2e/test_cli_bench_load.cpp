// `specdec bench --concurrency N` (the load mode) end to end, through the built binary on the
// tiny model: every figure of the JSON report is there with sane values; speculation under load
// is lossless (each request's greedy tokens are the plain run's, with drafts accepted) and a
// shared prefix hits the prefix cache; a prompts file sends each line once, as its index; bad
// values name the option.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/test_paths.h"

namespace specdec {
namespace {

using test::run_stdout;

std::string bench_cmd(const std::string& args) {
  return std::string(SPECDEC_BINARY_DIR) + "/specdec bench -m " +
         test::tiny_model("stories260K.gguf") + " -t 2 " + args;
}

nlohmann::json bench_json(const std::string& args) {
  const std::string cmd = bench_cmd("--output-format json " + args);
  int status = 0;
  const std::string out = run_stdout(cmd, &status);
  EXPECT_EQ(status, 0) << cmd;
  return nlohmann::json::parse(out);
}

// A file of this test's own under the build folder (ctest runs tests as parallel processes).
std::string test_file(const std::string& name) {
  return std::string(SPECDEC_BINARY_DIR) + "/cli_bench_load_" + name;
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line)) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

void expect_distribution(const nlohmann::json& d, const char* name) {
  SCOPED_TRACE(name);
  const double mean = d.at("mean").get<double>(), p50 = d.at("p50").get<double>(),
               p90 = d.at("p90").get<double>(), p99 = d.at("p99").get<double>();
  EXPECT_GT(mean, 0.0);
  EXPECT_GE(p50, 0.0);
  EXPECT_LE(p50, p90);
  EXPECT_LE(p90, p99);
}

// The figures of one mode.
void expect_figures(const nlohmann::json& f, int num_requests, int concurrency) {
  EXPECT_GT(f.at("throughput_tok_s").get<double>(), 0.0);
  EXPECT_GT(f.at("requests_per_s").get<double>(), 0.0);
  expect_distribution(f.at("ttft_ms"), "ttft_ms");
  expect_distribution(f.at("tpot_ms"), "tpot_ms");
  expect_distribution(f.at("itl_ms"), "itl_ms");
  expect_distribution(f.at("e2e_ms"), "e2e_ms");
  EXPECT_LE(f.at("ttft_ms").at("p50").get<double>(), f.at("e2e_ms").at("p99").get<double>());
  EXPECT_EQ(f.at("errors").get<int>(), 0);
  EXPECT_EQ(f.at("num_requests").get<int>(), num_requests);
  EXPECT_EQ(f.at("concurrency").get<int>(), concurrency);
  const auto total = f.at("kv_blocks_total").get<int64_t>();
  const auto peak = f.at("kv_blocks_peak").get<int64_t>();
  EXPECT_GT(peak, 0);
  EXPECT_LE(peak, total);
  EXPECT_GT(f.at("kv_pool_bytes").get<int64_t>(), 0);
  const double hit_rate = f.at("prefix_cache_hit_rate").get<double>();
  EXPECT_GE(hit_rate, 0.0);
  EXPECT_LE(hit_rate, 1.0);
  EXPECT_GE(f.at("tokens_per_pass").get<double>(), 1.0);
  const double acceptance = f.at("acceptance_rate").get<double>();
  EXPECT_GE(acceptance, 0.0);
  EXPECT_LE(acceptance, 1.0);
  EXPECT_LE(f.at("accepted").get<int64_t>(), f.at("drafted").get<int64_t>());
  EXPECT_TRUE(f.at("spec_methods").is_object());
}

TEST(CliBenchLoad, SyntheticFigures) {
  const nlohmann::json j =
      bench_json("--concurrency 4 --num-requests 8 --input-mean 32 --output-mean 16");
  EXPECT_EQ(j.at("bench").get<std::string>(), "load");
  EXPECT_FALSE(j.at("cpu").get<std::string>().empty());
  EXPECT_FALSE(j.at("isa").get<std::string>().empty());
  EXPECT_EQ(j.at("mode").get<std::string>(), "plain");
  EXPECT_EQ(j.at("speculation").get<std::string>(), "none");
  EXPECT_FALSE(j.contains("speedup"));
  EXPECT_FALSE(j.contains("spec"));
  EXPECT_EQ(j.at("dataset").at("kind").get<std::string>(), "synthetic");
  expect_figures(j, 8, 4);
  expect_figures(j.at("plain"), 8, 4);
  // Synthetic requests ignore end-of-generation tokens: exactly their output length each.
  EXPECT_EQ(j.at("output_tokens").get<int>(), 8 * 16);
  EXPECT_EQ(j.at("input_tokens").get<int>(), 8 * 32);
  EXPECT_DOUBLE_EQ(j.at("tokens_per_pass").get<double>(), 1.0);
  EXPECT_EQ(j.at("drafted").get<int>(), 0);
  EXPECT_TRUE(j.at("spec_methods").empty());
}

TEST(CliBenchLoad, SpecIsLosslessAndSharesThePrefix) {
  const std::string dump = test_file("spec_dump.jsonl");
  std::remove(dump.c_str());
  const nlohmann::json j = bench_json(
      "--concurrency 4 --num-requests 8 --input-mean 32 --input-stdev 8 --output-mean 64 "
      "--output-stdev 4 --spec ngram --num-draft 4 --repeats 1 --prefix-len 64 --dump-outputs " +
      dump);
  EXPECT_EQ(j.at("mode").get<std::string>(), "spec");
  EXPECT_GT(j.at("speedup").get<double>(), 0.0);
  expect_figures(j, 8, 4);
  expect_figures(j.at("plain"), 8, 4);
  expect_figures(j.at("spec"), 8, 4);
  EXPECT_EQ(j.at("throughput_tok_s"), j.at("spec").at("throughput_tok_s"));
  EXPECT_GT(j.at("prefix_cache_hit_rate").get<double>(), 0.0);
  EXPECT_GT(j.at("plain").at("prefix_cache_hit_rate").get<double>(), 0.0);
  const nlohmann::json& ngram = j.at("spec_methods").at("ngram");
  // Drafts every step (--num-draft 4), some accepted: the comparison below checks verification.
  EXPECT_GT(ngram.at("accepted").get<int64_t>(), 0);
  EXPECT_EQ(ngram.at("drafted"), j.at("drafted"));
  EXPECT_EQ(j.at("plain").at("output_tokens"), j.at("spec").at("output_tokens"));

  const std::vector<nlohmann::json> rows = read_jsonl(dump);
  ASSERT_EQ(rows.size(), 16u);  // one line per request and mode
  std::map<int, std::vector<int>> plain, spec;
  for (const nlohmann::json& row : rows) {
    auto& side = row.at("mode").get<std::string>() == "plain" ? plain : spec;
    const int index = row.at("index").get<int>();
    EXPECT_FALSE(side.count(index)) << "index " << index << " twice";
    side[index] = row.at("tokens").get<std::vector<int>>();
    EXPECT_TRUE(row.at("text").is_string());
  }
  ASSERT_EQ(plain.size(), 8u);
  ASSERT_EQ(spec.size(), 8u);
  for (const auto& [index, tokens] : plain) {
    EXPECT_FALSE(tokens.empty());
    EXPECT_EQ(tokens, spec.at(index)) << "request " << index;
  }
}

TEST(CliBenchLoad, PromptsFileSendsEachLineOnce) {
  const std::string prompts = test_file("prompts.jsonl");
  const std::string dump = test_file("prompts_dump.jsonl");
  std::remove(dump.c_str());
  const std::vector<std::string> lines = {
      R"("Once upon a time, there was a little girl named Lily.")",
      R"({"prompt": "The cat sat on the mat. The cat sat on the"})",
      R"({"text": "Tom and his dog went to the park."})",
      R"("One day, a big bird")",
      R"({"prompt": "Sue had a red ball.", "id": 7})",
  };
  {
    std::ofstream f(prompts);
    for (const std::string& l : lines) f << l << '\n';
  }
  const nlohmann::json j = bench_json("--concurrency 2 -n 24 --prompts " + prompts +
                                      " --spec ngram --dump-outputs " + dump);
  EXPECT_EQ(j.at("dataset").at("kind").get<std::string>(), "prompts");
  expect_figures(j, 5, 2);
  EXPECT_GT(j.at("accepted").get<int64_t>(), 0);  // the tiny model's stories repeat
  const std::vector<nlohmann::json> rows = read_jsonl(dump);
  ASSERT_EQ(rows.size(), 2 * lines.size());
  std::map<std::string, std::vector<int>> seen;  // mode -> indices in dump order
  std::map<int, std::vector<int>> plain_tokens;
  for (const nlohmann::json& row : rows) {
    seen[row.at("mode").get<std::string>()].push_back(row.at("index").get<int>());
    const auto tokens = row.at("tokens").get<std::vector<int>>();
    EXPECT_GE(tokens.size(), 1u);
    EXPECT_LE(tokens.size(), 24u);
    if (row.at("mode") == "plain") {
      plain_tokens[row.at("index").get<int>()] = tokens;
    } else {
      EXPECT_EQ(tokens, plain_tokens.at(row.at("index").get<int>()));
    }
  }
  const std::vector<int> expected = {0, 1, 2, 3, 4};
  EXPECT_EQ(seen["plain"], expected);
  EXPECT_EQ(seen["spec"], expected);
}

TEST(CliBenchLoad, TextReport) {
  int status = 0;
  const std::string out =
      run_stdout(bench_cmd("--num-requests 3 --input-mean 16 --output-mean 8"), &status);
  EXPECT_EQ(status, 0);
  EXPECT_NE(out.find("kernels:"), std::string::npos) << out;
  EXPECT_NE(out.find("3 requests, concurrency 1"), std::string::npos) << out;
  EXPECT_NE(out.find("TTFT"), std::string::npos) << out;
}

TEST(CliBenchLoad, BadValuesNameTheOption) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--concurrency 0", "--concurrency"},
      {"--num-requests 0", "--num-requests"},
      {"--concurrency 2 --input-stdev -1", "--input-stdev"},
      {"--concurrency 2 --prefix-len 100000", "--prefix-len"},
  };
  for (const auto& [args, option] : cases) {
    int status = 0;
    const std::string out = run_stdout(bench_cmd(args) + " 2>&1", &status);
    EXPECT_NE(status, 0) << args;
    EXPECT_NE(out.find(option), std::string::npos) << args << ": " << out;
  }
}

}  // namespace
}  // namespace specdec
