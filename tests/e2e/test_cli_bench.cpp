// `specdec bench --spec` end to end, through the built binary: both pairing protocols (runs one
// after the other, and --interleave, where the plain and the speculative run take turns at every
// emitted token) decode every prompt to the same greedy output as plain decoding, report
// positive speeds (and a verification cost over the requested number of pass pairs), and say
// which protocol ran. On the tiny model, whose stories repeat, n-gram speculation must be
// accepted at all.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_features.h"
#include "common/test_paths.h"
#include "model/gguf.h"
#include "model/model.h"

namespace specdec {
namespace {

using test::run_stdout;

// `name` keeps each test's prompts file its own: ctest runs the tests as parallel processes.
nlohmann::json bench(const std::string& name, const std::string& extra) {
  const std::string prompts = std::string(SPECDEC_BINARY_DIR) + "/cli_bench_" + name + ".jsonl";
  {
    std::ofstream f(prompts);
    f << "\"Once upon a time, there was a little girl named Lily.\"\n"
         "\"The cat sat on the mat. The cat sat on the\"\n"
         "\"Tom and his dog went to the park.\"\n";
  }
  const std::string cmd = std::string(SPECDEC_BINARY_DIR) + "/specdec bench -m " +
                          test::tiny_model("stories260K.gguf") + " --spec ngram --prompts " +
                          prompts + " -n 48 -t 2 --output-format json " + extra;
  int status = 0;
  const std::string out = run_stdout(cmd, &status);
  EXPECT_EQ(status, 0) << cmd;
  return nlohmann::json::parse(out);
}

void expect_sound(const nlohmann::json& j, bool interleaved, int verify_pairs) {
  EXPECT_EQ(j.at("interleaved").get<bool>(), interleaved);
  EXPECT_EQ(j.at("identical_outputs").get<int>(), 3);
  EXPECT_GT(j.at("plain_tok_s").get<double>(), 0.0);
  EXPECT_GT(j.at("spec_tok_s").get<double>(), 0.0);
  EXPECT_GT(j.at("accepted").get<int>(), 0);
  EXPECT_GT(j.at("verify_cost_ratio").get<double>(), 0.0);
  EXPECT_GT(j.at("verify_cost_ratio_best").get<double>(), 0.0);
  EXPECT_EQ(j.at("verify_pairs").get<int>(), verify_pairs);
  ASSERT_EQ(j.at("per_prompt").size(), 3u);
  for (const auto& row : j.at("per_prompt")) {
    EXPECT_TRUE(row.at("identical").get<bool>());
    EXPECT_GT(row.at("speedup").get<double>(), 0.0);
    EXPECT_EQ(row.at("generated").get<int>(), 48);
  }
}

TEST(CliBench, SpecPairsOneAfterTheOther) {
  expect_sound(bench("sequential", "--repeats 2"), false, 40);
}

TEST(CliBench, SpecPairsInterleaved) {
  expect_sound(bench("interleaved", "--repeats 3 --interleave --verify-pairs 7"), true, 7);
}

// A prompts file of Spec-Bench's kind: categories, and a conversation of two turns whose second
// turn follows plain decoding's own answer to the first (so its prompt holds that answer). Every
// turn is a row, both modes give the same greedy output in every turn, and the figures come per
// category as well.
TEST(CliBench, ConversationsAndCategories) {
  const std::string prompts = std::string(SPECDEC_BINARY_DIR) + "/cli_bench_turns.jsonl";
  {
    std::ofstream f(prompts);
    f << R"({"category": "story", "turns": ["Once upon a time, there was a girl.", "And then?"]})"
      << "\n"
      << R"({"category": "story", "prompt": "Tom and his dog went to the park."})"
      << "\n"
      << R"("The cat sat on the mat. The cat sat on the")"
      << "\n";
  }
  const std::string base = std::string(SPECDEC_BINARY_DIR) + "/specdec bench -m " +
                           test::tiny_model("stories260K.gguf") + " --spec ngram --prompts " +
                           prompts + " -n 48 -t 2 --verify-pairs 2 --output-format json";
  int status = 0;
  const std::string out = run_stdout(base + " --chat", &status);
  ASSERT_EQ(status, 0) << out;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j.at("prompts").get<int>(), 3);
  EXPECT_EQ(j.at("turns").get<int>(), 4);
  EXPECT_EQ(j.at("identical_outputs").get<int>(), 4);
  const nlohmann::json& rows = j.at("per_prompt");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].at("turn").get<int>(), 1);
  EXPECT_EQ(rows[1].at("prompt").get<int>(), 1);
  EXPECT_EQ(rows[1].at("turn").get<int>(), 2);
  EXPECT_EQ(rows[1].at("category").get<std::string>(), "story");
  EXPECT_EQ(rows[3].at("category").get<std::string>(), "");
  // The second turn's prompt: the first turn, the answer (its tokens, give or take how the
  // decoded text re-tokenizes) and the new message.
  const int first = rows[0].at("prompt_tokens").get<int>();
  const int answer = rows[0].at("generated").get<int>();
  EXPECT_GT(rows[1].at("prompt_tokens").get<int>(), first + answer / 2) << rows.dump();
  const nlohmann::json& cats = j.at("categories");
  ASSERT_EQ(cats.size(), 2u) << cats.dump();
  EXPECT_EQ(cats.at("story").at("turns").get<int>(), 3);
  EXPECT_EQ(cats.at("story").at("identical_outputs").get<int>(), 3);
  EXPECT_GT(cats.at("story").at("speedup").get<double>(), 0.0);
  EXPECT_EQ(cats.at("(none)").at("turns").get<int>(), 1);

  // Without --chat a conversation is refused, and a malformed line is named.
  std::string err = run_stdout(base + " 2>&1", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(err.find("cli_bench_turns.jsonl:1: a conversation of 2 turns needs --chat"),
            std::string::npos)
      << err;
  {
    std::ofstream f(prompts);
    f << R"("fine")"
      << "\n"
      << R"({"category": 3, "prompt": "x"})"
      << "\n";
  }
  err = run_stdout(base + " --chat 2>&1", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(err.find("cli_bench_turns.jsonl:2: \"category\" is not a string"), std::string::npos)
      << err;
}

// The cost model's calibration is kept per model and kernels: a file measured on the GPU
// ("cuda") is not taken by the CPU's kernels, nor one measured for another model (a note says so
// and the default is used); the model's own entry for these kernels is. `bench --calibrate`
// replaces its own entry and keeps the others; a file in the format before (one bare entry) is
// still read.
TEST(CliBench, CalibrationIsUsedOnlyForTheModelAndKernelsItMeasured) {
  const std::string dir = std::string(SPECDEC_BINARY_DIR) + "/cli_calibration_cache";
  std::filesystem::create_directories(dir);
  const std::string model = test::tiny_model("stories260K.gguf");
  const std::string isa = isa_name(active_isa());
  auto entry = [&](const std::string& kernels, const std::string& m) {
    return nlohmann::json{{"isa", kernels},  {"verify_cost_ratio", 1.1}, {"verify_token_cost", 0.0143},
                          {"threads", 2},    {"context", 256},           {"model", m},
                          {"cpu", "c"}};
  };
  auto write = [&](const nlohmann::json& j) {
    std::ofstream f(dir + "/calibration.json");
    f << j.dump();
  };
  const std::string cmd = "SPECDEC_CACHE=" + dir + " " + std::string(SPECDEC_BINARY_DIR) +
                          "/specdec generate -m " + model +
                          " -p 'Once upon a time' -n 8 --spec ngram -t 2 2>&1";
  auto noted = [&]() {
    int status = 0;
    const std::string out = run_stdout(cmd, &status);
    EXPECT_EQ(status, 0) << out;
    return out.find("no calibration for stories260K.gguf with the " + isa + " kernels") !=
           std::string::npos;
  };
  write(entry("cuda", model));
  EXPECT_TRUE(noted()) << "a GPU calibration was taken by the CPU kernels";
  write({{"calibrations", {entry(isa, "/elsewhere/other-model.gguf"), entry("cuda", model)}}});
  EXPECT_TRUE(noted()) << "another model's calibration was taken";
  write(entry(isa, "/some/dir/stories260K.gguf"));  // the format before; the same file name
  EXPECT_FALSE(noted());
  write({{"calibrations", {entry(isa, "/elsewhere/other-model.gguf"), entry(isa, model)}}});
  EXPECT_FALSE(noted());

  // --calibrate replaces its entry (model, kernels) and keeps the others.
  int status = 0;
  const std::string out = run_stdout("SPECDEC_CACHE=" + dir + " " + std::string(SPECDEC_BINARY_DIR) +
                                         "/specdec bench --calibrate -m " + model +
                                         " -p 32 -t 2 --verify-pairs 3 2>&1",
                                     &status);
  ASSERT_EQ(status, 0) << out;
  std::ifstream f(dir + "/calibration.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_EQ(j.at("calibrations").size(), 2u) << j.dump();
  EXPECT_EQ(j["calibrations"][0]["model"], "/elsewhere/other-model.gguf");
  EXPECT_EQ(j["calibrations"][0]["verify_token_cost"], 0.0143);
  EXPECT_EQ(j["calibrations"][1]["model"], model);
  EXPECT_EQ(j["calibrations"][1]["context"], 32);
  // ... with the pass-cost curve: from (1, 1), n ascending, costs that do not fall.
  const auto curve = j["calibrations"][1].at("pass_cost").get<std::vector<std::pair<int, double>>>();
  ASSERT_EQ(curve.size(), 8u) << j.dump();
  EXPECT_EQ(curve.front(), (std::pair<int, double>{1, 1.0}));
  EXPECT_EQ(curve.back().first, 32);
  for (size_t i = 1; i < curve.size(); ++i) {
    EXPECT_GT(curve[i].first, curve[i - 1].first);
    EXPECT_GE(curve[i].second, curve[i - 1].second);
  }
  EXPECT_FALSE(noted());
  // A curve that falls is a clear error naming the file, not a silent cost model.
  nlohmann::json bad = entry(isa, model);
  bad["pass_cost"] = {{1, 1.0}, {8, 2.0}, {16, 1.5}};
  write({{"calibrations", {bad}}});
  const std::string err = run_stdout(cmd, &status);
  EXPECT_NE(status, 0) << err;
  EXPECT_NE(err.find("calibration.json: pass_cost must rise"), std::string::npos) << err;
}

// The roofline bench (no --spec): its figures are consistent with each other and with the model
// (the weight bytes a token streams are the model's), the ratios are ratios of what it printed,
// the verify cost is over the requested pairs at the requested context.
TEST(CliBench, RooflineFiguresAreConsistent) {
  const std::string model = test::tiny_model("stories260K.gguf");
  const std::string cmd = std::string(SPECDEC_BINARY_DIR) + "/specdec bench -m " + model +
                          " -p 64 -n 16 -t 2 --verify-pairs 6 --output-format json";
  int status = 0;
  const nlohmann::json j = nlohmann::json::parse(run_stdout(cmd, &status));
  ASSERT_EQ(status, 0) << cmd;
  EXPECT_EQ(j.at("model").get<std::string>(), model);
  EXPECT_EQ(j.at("device").get<std::string>(), "cpu");
  EXPECT_EQ(j.at("isa").get<std::string>(), isa_name(active_isa()));
  EXPECT_EQ(j.at("threads").get<int>(), 2);
  EXPECT_EQ(j.at("n_prompt").get<int>(), 64);
  EXPECT_EQ(j.at("n_gen").get<int>(), 16);
  EXPECT_EQ(j.at("verify_context").get<int>(), 64);
  EXPECT_EQ(j.at("verify_pairs").get<int>(), 6);
  EXPECT_EQ(j.at("weight_bytes_per_token").get<double>(),
            static_cast<double>(Model::load(model)->weight_bytes()));
  const double tok_s = j.at("decode_tok_s").get<double>();
  const double gbs = j.at("decode_gbs").get<double>();
  EXPECT_GT(tok_s, 0.0);
  EXPECT_NEAR(gbs, j.at("weight_bytes_per_token").get<double>() * tok_s / 1e9, 1e-9 * gbs);
  EXPECT_GT(j.at("measured_bandwidth_gbs").get<double>(), 0.0);
  EXPECT_NEAR(j.at("bandwidth_utilization").get<double>(),
              gbs / j.at("measured_bandwidth_gbs").get<double>(), 1e-9);
  EXPECT_NEAR(j.at("flop_utilization").get<double>(),
              j.at("prefill_gflops").get<double>() / j.at("measured_peak_gflops").get<double>(),
              1e-9);
  EXPECT_GT(j.at("verify_cost_ratio").get<double>(), 0.0);
  EXPECT_GT(j.at("verify_cost_ratio_best").get<double>(), 0.0);
}

}  // namespace
}  // namespace specdec
