// Bad command lines, through the built binary: each exits with a non-zero status of its own
// (no signal, no abort, no uncaught exception, no internal check), and says on stderr what was
// wrong, naming the option or file. Option errors of generate and serve come before the model
// is loaded (serve: before it listens). A prompt longer than the context is an error on every
// command that takes prompts.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/test_paths.h"

namespace specdec {
namespace {

std::string dir() {
  const std::string d = std::string(SPECDEC_BINARY_DIR) + "/cli_errors";
  std::filesystem::create_directories(d);
  return d;
}

// Single quotes for the shell (the arguments here hold none).
std::string quoted(const std::string& s) { return "'" + s + "'"; }

std::string tiny() { return test::tiny_model("stories260K.gguf"); }

// A prompt of ~880 tokens for the tiny model (context 512).
std::string long_prompt() {
  std::string p;
  for (int i = 0; i < 80; ++i) p += "Once upon a time there was a little dog. ";
  return p;
}

struct Case {
  std::string args;                   // after `specdec`
  std::vector<std::string> expected;  // each on stderr
  bool before_load = false;           // fails before the model is loaded / the server listens
};

// Runs one case; stderr into a file of the running test's own (ctest runs them in parallel).
void expect_clear_error(const Case& c) {
  const std::string err =
      dir() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".stderr";
  const std::string cmd = "timeout 120 " + std::string(SPECDEC_BINARY_DIR) + "/specdec " +
                          c.args + " </dev/null >/dev/null 2>" + err;
  int status = 0;
  test::run_stdout(cmd, &status);
  const std::string log = test::read_file(err);
  ASSERT_TRUE(WIFEXITED(status)) << c.args << "\n" << log;
  const int code = WEXITSTATUS(status);
  EXPECT_NE(code, 0) << c.args << "\n" << log;
  EXPECT_LT(code, 124) << "timed out, or died of a signal: " << c.args << "\n" << log;
  for (const char* crash : {"terminate called", "internal check failed", "Aborted",
                            "Segmentation", "AddressSanitizer", "runtime error"}) {
    EXPECT_EQ(log.find(crash), std::string::npos) << c.args << "\n" << log;
  }
  for (const std::string& e : c.expected) {
    EXPECT_NE(log.find(e), std::string::npos) << c.args << ": no '" << e << "' in\n" << log;
  }
  if (c.before_load) {
    EXPECT_EQ(log.find("loading "), std::string::npos) << "loaded first: " << c.args << "\n" << log;
    EXPECT_EQ(log.find("listening"), std::string::npos) << "listened first: " << c.args << "\n"
                                                        << log;
  }
}

// A copy of the first `bytes` bytes of `from`.
std::string truncated_copy(const std::string& from, size_t bytes, const std::string& name) {
  const std::string data = test::read_file(from);
  EXPECT_GT(data.size(), bytes) << from;
  const std::string path = dir() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data.substr(0, bytes);
  return path;
}

TEST(CliErrors, Generate) {
  const std::string g = "generate -m " + tiny() + " -p hi ";
  const std::string draft = " --spec draft --draft-model " + test::tiny_model("tinystories280K.gguf");
  const std::string gguf = truncated_copy(tiny(), 50000, "truncated.gguf");
  const std::string head = truncated_copy(std::string(SPECDEC_SOURCE_DIR) +
                                              "/heads/redrafter-smollm2-135m-instruct.safetensors",
                                          100000, "truncated.safetensors");
  const std::vector<Case> cases = {
      {g + "-n -1", {"--n-predict"}, true},
      {g + "-t -3", {"--threads"}, true},
      {g + "-c 0", {"--ctx-size"}, true},
      {g + "--temp nan", {"temperature", "nan"}, true},
      {g + "--temp -1", {"temperature"}, true},
      {g + "--temp inf", {"temperature"}, true},
      {g + "--top-p 2", {"top_p", "2"}, true},
      {g + "--top-p nan", {"top_p"}, true},
      {g + "--min-p 1.5", {"min_p"}, true},
      {g + "--top-k -1", {"top_k"}, true},
      {g + "--repeat-penalty 0", {"repetition_penalty"}, true},
      {g + "--repeat-last-n -5", {"repeat_last_n"}, true},
      {g + "--kv-type q4", {"--kv-type"}, true},
      {g + "--block-size 17", {"--block-size"}},
      {g + "--kv-cache-mib 0", {"--kv-cache-mib"}, true},
      {g + "--spec ngram --num-draft 65", {"--num-draft"}, true},
      {g + "--spec ngram --num-draft many", {"--num-draft"}, true},
      {g + "--spec ngram --tree 0,1", {"--tree"}, true},
      {g + "--spec ngram --ngram-min 4 --ngram-max 2", {"--ngram-min"}, true},
      {g + "--spec bogus", {"--spec"}, true},
      {g + "--spec draft", {"--draft-model"}, true},
      {g + "--draft-model x.gguf", {"--spec draft"}, true},
      {g + draft + " --draft-p-min nan", {"--draft-p-min"}, true},
      {g + draft + " --draft-temp nan", {"--draft-temp"}, true},
      {g + "--spec draft --draft-model /nonexistent/draft.gguf",
       {"--draft-model /nonexistent/draft.gguf", "no such file"}},
      {g + "--spec medusa --drafter /nonexistent/heads.safetensors",
       {"/nonexistent/heads.safetensors"}},
      {g + "--spec redrafter --drafter " + head, {head}},
      {g + "--spec redrafter --head-type q2", {"--head-type"}, true},
      {g + "--spec medusa --drafter " + head, {head}},
      {g + "--calibration /nonexistent/calibration.json", {"--calibration"}},
      {"generate -m /nonexistent/model.gguf -p hi", {"/nonexistent/model.gguf", "no such file"},
       true},
      {"generate -m " + std::string(SPECDEC_SOURCE_DIR) + "/README.md -p hi", {"not a GGUF file"}},
      {"generate -m " + gguf + " -p hi", {gguf, "truncated"}},
      {"generate -m " + tiny(), {"--prompt"}, true},
  };
  for (const Case& c : cases) expect_clear_error(c);
}

TEST(CliErrors, PromptLongerThanTheContextOnEveryCommand) {
  const std::string p = quoted(long_prompt());
  const std::string m = " -m " + tiny() + " ";
  const std::string prompts = dir() + "/long.jsonl";
  std::ofstream(prompts) << "\"" << long_prompt() << "\"\n";
  const std::vector<Case> cases = {
      {"generate" + m + "-n 4 -p " + p, {"maximum context length is 512", "882"}},
      {"generate" + m + "-n 4 -c 64 -p " + p, {"maximum context length is 64"}},
      {"generate" + m + "-n 0 -p " + p, {"maximum context length"}},
      {"generate" + m + "-n 4 --chat -p " + p, {"maximum context length"}},
      {"generate" + m + "-n 4 --spec ngram -p " + p, {"maximum context length"}},
      {"generate" + m + "-n 4 --spec draft --draft-model " +
           test::tiny_model("tinystories280K.gguf") + " -p " + p,
       {"maximum context length"}},
      {"bench" + m + "-r 1 -p 600 -n 4", {"-p 600", "context"}},
      {"bench" + m + "-r 1 -p 16 -n 600", {"-n 600", "context"}},
      {"bench" + m + "-n 4 --spec ngram --prompt " + p, {"does not fit the context"}},
      {"bench" + m + "-n 4 --concurrency 2 --prompts " + prompts,
       {prompts + ":1", "does not fit the context"}},
  };
  for (const Case& c : cases) expect_clear_error(c);
  // serve answers a 400 context_length_exceeded instead (tests/server/test_errors.py).
}

TEST(CliErrors, ServeFailsBeforeListening) {
  const std::string s = "serve --port 0 -m " + tiny() + " ";
  const std::vector<Case> cases = {
      {s + "--shutdown-timeout nan", {"--shutdown-timeout"}, true},
      {s + "--shutdown-timeout -1", {"--shutdown-timeout"}, true},
      {s + "-t -1", {"--threads"}, true},
      {s + "--port 70000", {"--port"}, true},
      {s + "--max-queue 0", {"--max-queue"}, true},
      {s + "--http-threads 0", {"--http-threads"}, true},
      {s + "--max-body-size 10", {"--max-body-size"}, true},
      {s + "--spec draft", {"--draft-model"}, true},
      {s + "--spec draft --draft-model /nonexistent/draft.gguf",
       {"--draft-model /nonexistent/draft.gguf", "no such file"}, true},
      {s + "--chat-template nonsense", {"--chat-template"}, true},
      {"serve --port 0 -m /nonexistent/model.gguf", {"/nonexistent/model.gguf", "no such file"},
       true},
  };
  for (const Case& c : cases) expect_clear_error(c);
}

TEST(CliErrors, TrainDrafterAndTheCommandLine) {
  const std::string t = "train-drafter -m " + tiny() + " --out " + dir() + "/x.safetensors ";
  const std::vector<Case> cases = {
      {t + "--lr nan", {"--lr"}, true},
      {t + "--lr 0", {"--lr"}, true},
      {t + "--lr-min nan", {"--lr-min"}, true},
      {t + "--eval-fraction nan", {"--eval-fraction"}, true},
      {t + "--weight-decay nan", {"--weight-decay"}, true},
      {t + "--clip nan", {"--clip"}, true},
      {t + "--init-scale nan", {"--init-scale"}, true},
      {t + "--kind foo", {"--kind"}, true},
      {t + "--max-new-tokens 1", {"--max-new-tokens"}, true},
      {t + "--data /nonexistent/prompts.jsonl", {"/nonexistent/prompts.jsonl"}},
      {"", {"subcommand"}, true},
      {"frobnicate", {"subcommand"}, true},
      {"generate --no-such-option -p hi", {"--no-such-option"}, true},
      {"bench -m " + tiny() + " -t -3", {"--threads"}, true},
  };
  for (const Case& c : cases) expect_clear_error(c);
  // An unknown kernel variant in the environment.
  const std::string err = dir() + "/isa.stderr";
  int status = 0;
  test::run_stdout("SPECDEC_ISA=bogus " + std::string(SPECDEC_BINARY_DIR) +
                       "/specdec generate -m " + tiny() + " -p hi >/dev/null 2>" + err,
                   &status);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_NE(test::read_file(err).find("SPECDEC_ISA=bogus"), std::string::npos)
      << test::read_file(err);
}

}  // namespace
}  // namespace specdec
