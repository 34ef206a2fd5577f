// `specdec train-drafter` end to end on the tiny TinyStories model, through the built binary:
// it builds the distillation dataset from a prompts file, trains a ReDrafter head whose held-out
// loss falls and whose greedy accepted length is real, writes the head with the command line and
// the training facts in its metadata (the head loads and belongs to the target), reuses the
// dataset on a second run, stops with --stop-after and resumes with --resume to the very weights
// of an uninterrupted run, and refuses bad requests with clear messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/test_paths.h"
#include "drafter/distill_data.h"
#include "drafter/medusa_weights.h"
#include "drafter/redrafter_weights.h"
#include "drafter/train/redrafter_params.h"
#include "model/gguf.h"
#include "model/model.h"

namespace specdec {
namespace {

using test::run_stdout;

std::string dir() { return std::string(SPECDEC_BINARY_DIR) + "/cli_train_drafter"; }

// The prompts: story openings (never a benchmark set).
std::string write_prompts(const std::string& name) {
  std::filesystem::create_directories(dir());
  const std::string path = dir() + "/" + name + ".jsonl";
  std::ofstream f(path);
  const char* starts[] = {"Once upon a time", "One day", "Lily and Tom", "The little dog",
                          "There was a girl", "Tim had a", "A big cat", "The sun was"};
  const char* verbs[] = {"went", "saw", "liked", "wanted", "found"};
  for (int i = 0; i < 120; ++i) f << '"' << starts[i % 8] << ' ' << verbs[(i / 8) % 5] << "\"\n";
  return path;
}

// `dataset` keeps each test's files its own: ctest runs the tests as parallel processes.
std::string train_cmd(const std::string& dataset, const std::string& out,
                      const std::string& extra) {
  return std::string(SPECDEC_BINARY_DIR) + "/specdec train-drafter -m " +
         test::tiny_model("stories260K.gguf") + " --data " + write_prompts(dataset) + " --dataset " +
         dir() + "/" + dataset + ".sdds --no-chat --max-new-tokens 48 --draft-vocab 200 --state-dim 24 "
         "--blocks 2 --batch 64 --out " + out + " " + extra + " 2>&1";
}

bool same_weights(ReDrafterWeights& a, ReDrafterWeights& b) {
  std::vector<ParamTensor> pa = redrafter_param_tensors(a), pb = redrafter_param_tensors(b);
  for (size_t t = 0; t < pa.size(); ++t) {
    if (std::memcmp(pa[t].data.data(), pb[t].data.data(), pa[t].data.size() * 4) != 0) return false;
  }
  return pa.size() == pb.size();
}

TEST(CliTrainDrafter, TrainsAHeadForTheTarget) {
  std::filesystem::remove(dir() + "/a.sdds");
  const std::string out = dir() + "/head.safetensors";
  int status = 0;
  std::string log = run_stdout(train_cmd("a", out, "--steps 3 --epochs 3 -t 2"), &status);
  ASSERT_EQ(status, 0) << log;
  EXPECT_NE(log.find("dataset: answering"), std::string::npos) << log;
  ASSERT_TRUE(std::filesystem::exists(dir() + "/a.sdds"));
  const ReDrafterWeights w = load_redrafter(out);
  std::unique_ptr<Model> target = Model::load(test::tiny_model("stories260K.gguf"));
  EXPECT_NO_THROW(check_redrafter_target(w, *target, out));
  EXPECT_EQ(w.shape.state_dim, 24);
  EXPECT_EQ(w.shape.n_blocks, 2);
  EXPECT_LE(w.shape.n_draft_vocab, 200);
  EXPECT_NE(w.info.at("train.command").find("train-drafter"), std::string::npos);
  EXPECT_NE(w.info.at("train.command").find("--state-dim 24"), std::string::npos);
  EXPECT_EQ(w.info.at("train.steps"), "3");
  // held-out figures: three accuracies, a loss well below chance, drafts that get accepted
  const std::string acc = w.info.at("train.eval_accuracy");
  EXPECT_EQ(std::count(acc.begin(), acc.end(), ','), 2) << acc;
  EXPECT_LT(std::stod(w.info.at("train.eval_loss")), 0.6 * std::log(w.shape.n_draft_vocab));
  EXPECT_GT(std::stod(w.info.at("train.eval_accepted_length")), 0.8);
  EXPECT_GT(std::stoll(w.info.at("train.positions")), 1000);
  EXPECT_GT(std::stod(w.info.at("train.seconds")), 0.0);

  // A second run reuses the dataset.
  log = run_stdout(train_cmd("a", dir() + "/head2.safetensors", "--steps 2 --epochs 1 -t 2"), &status);
  ASSERT_EQ(status, 0) << log;
  EXPECT_NE(log.find("dataset: reusing"), std::string::npos) << log;
}

TEST(CliTrainDrafter, ResumeEndsWithTheWeightsOfAnUninterruptedRun) {
  int status = 0;
  const std::string full = dir() + "/full.safetensors", part = dir() + "/part.safetensors";
  std::string log = run_stdout(train_cmd("b", full, "--epochs 3 -t 2 --dtype f32 --checkpoint-every 7"), &status);
  ASSERT_EQ(status, 0) << log;
  std::filesystem::remove(part + ".ckpt");
  std::filesystem::remove(part);
  log = run_stdout(train_cmd("b", part, "--epochs 3 -t 2 --dtype f32 --checkpoint-every 7 --stop-after 40"), &status);
  ASSERT_EQ(status, 0) << log;
  EXPECT_NE(log.find("continue with --resume"), std::string::npos) << log;
  EXPECT_FALSE(std::filesystem::exists(part));
  log = run_stdout(train_cmd("b", part, "--epochs 3 -t 1 --dtype f32 --checkpoint-every 7 --resume"), &status);
  ASSERT_EQ(status, 0) << log;
  ReDrafterWeights a = load_redrafter(full), b = load_redrafter(part);
  EXPECT_TRUE(same_weights(a, b));
  // With another learning rate the checkpoint is refused, naming the difference.
  log = run_stdout(train_cmd("b", part, "--epochs 3 --dtype f32 --checkpoint-every 7 --resume --lr 0.01"), &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(log.find("another training run"), std::string::npos) << log;
  EXPECT_NE(log.find("lr:"), std::string::npos) << log;
}

// A dataset in shards: the first 40 prompts, then the rest from where the first run says the
// next shard starts (--dataset-only, no head), then one training over both, with soft labels.
TEST(CliTrainDrafter, ShardsBuiltAheadAndTrainedTogether) {
  const std::string base = std::string(SPECDEC_BINARY_DIR) + "/specdec train-drafter -m " +
                           test::tiny_model("stories260K.gguf") + " --data " +
                           write_prompts("s") + " --no-chat --max-new-tokens 32 -t 2 ";
  const std::string s1 = dir() + "/s1.sdds", s2 = dir() + "/s2.sdds";
  std::filesystem::remove(s1);
  std::filesystem::remove(s2);
  int status = 0;
  std::string log = run_stdout(base + "--dataset " + s1 + " --max-prompts 40 --dataset-only 2>&1",
                               &status);
  ASSERT_EQ(status, 0) << log;
  EXPECT_NE(log.find("--dataset-only"), std::string::npos) << log;
  const size_t at = log.find("--first-prompt ");
  ASSERT_NE(at, std::string::npos) << log;
  const int next = std::stoi(log.substr(at + 15));
  EXPECT_EQ(next, 40);  // no prompt of this file is skipped
  log = run_stdout(base + "--dataset " + s2 + " --first-prompt " + std::to_string(next) +
                       " --dataset-only 2>&1",
                   &status);
  ASSERT_EQ(status, 0) << log;
  EXPECT_EQ(load_distill_dataset(s2).n_seqs(), 80);
  const std::string out = dir() + "/shards.safetensors";
  log = run_stdout(base + "--dataset " + s1 + " --dataset " + s2 +
                       " --draft-vocab 200 --state-dim 24 --batch 64 --epochs 3 "
                       "--soft-labels 0.5 --out " + out + " 2>&1",
                   &status);
  ASSERT_EQ(status, 0) << log;
  EXPECT_NE(log.find("2 shards joined: 120 sequences"), std::string::npos) << log;
  const ReDrafterWeights w = load_redrafter(out);
  EXPECT_EQ(w.info.at("train.dataset"), "s1.sdds,s2.sdds");
  EXPECT_EQ(w.info.at("train.soft_labels"), "0.5");
  EXPECT_LT(std::stod(w.info.at("train.eval_loss")), 0.6 * std::log(w.shape.n_draft_vocab));
  // Several --dataset files must all exist.
  log = run_stdout(base + "--dataset " + s1 + " --dataset " + dir() + "/none.sdds --out " + out +
                       " 2>&1",
                   &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(log.find("every one must exist"), std::string::npos) << log;
}

TEST(CliTrainDrafter, ClearErrors) {
  int status = 0;
  std::string made = run_stdout(train_cmd("c", dir() + "/c.safetensors", "--epochs 1"), &status);
  ASSERT_EQ(status, 0) << made;
  // Medusa heads train from the same dataset; resuming them is not supported yet, and says so.
  std::string log = run_stdout(train_cmd("c", dir() + "/m.safetensors", "--kind medusa --heads 3"), &status);
  ASSERT_EQ(status, 0) << log;
  EXPECT_EQ(load_medusa(dir() + "/m.safetensors").shape.n_heads, 3);
  log = run_stdout(train_cmd("c", dir() + "/x.safetensors", "--kind medusa --resume"), &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(log.find("not supported yet"), std::string::npos) << log;
  const std::string bench = dir() + "/humaneval.jsonl";
  std::ofstream(bench) << "\"def f():\"\n";
  log = run_stdout(std::string(SPECDEC_BINARY_DIR) + "/specdec train-drafter -m " +
                       test::tiny_model("stories260K.gguf") + " --data " + bench +
                       " --out " + dir() + "/x.safetensors 2>&1",
                   &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(log.find("benchmark"), std::string::npos) << log;
  log = run_stdout(train_cmd("c", dir() + "/x.safetensors", "--resume --checkpoint " + dir() +
                                                          "/none.ckpt"),
                   &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(log.find("no checkpoint"), std::string::npos) << log;
  // a dataset made with another model (tinystories280K: another embedding)
  log = run_stdout(std::string(SPECDEC_BINARY_DIR) + "/specdec train-drafter -m " +
                       test::tiny_model("tinystories280K.gguf") + " --dataset " + dir() +
                       "/c.sdds --out " + dir() + "/x.safetensors 2>&1",
                   &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(log.find("another model"), std::string::npos) << log;
}

}  // namespace
}  // namespace specdec
