// Drafter heads on the GPU (src/drafter/redrafter_head_cuda.cpp): the ReDrafter head's step on
// the device against the same head on the CPU (same weights, same matmul type), its CUDA graphs
// against no graphs, and beam search with the device head. Built with -DSPECDEC_CUDA=ON; every
// test skips on a machine without a GPU. The engine's greedy output with the device head equals
// plain decoding: tests/cuda/test_cuda_model.cpp (CudaEngine.*ReDrafter*).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "backend/cuda/cuda_ops.h"
#include "common/random_head.h"
#include "common/skip_without_gpu.h"
#include "common/test_paths.h"
#include "drafter/beam_search.h"
#include "drafter/head_registry.h"
#include "drafter/redrafter_head.h"
#include "drafter/redrafter_weights.h"
#include "model/device.h"
#include "model/gguf.h"
#include "model/model.h"

namespace specdec {
namespace {

std::vector<float> random_floats(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

struct StepOut {
  std::vector<float> s;       // [n, S]
  std::vector<float> logits;  // [n, V_d]
};

StepOut run_step(const ReDrafterHead& head, const std::vector<float>& h,
                 const std::vector<float>& in, int n, ThreadPool* pool) {
  const ReDrafterShape& sh = head.shape();
  StepOut o;
  o.s.assign(static_cast<size_t>(n) * sh.state_dim, 0.0f);
  o.logits.assign(static_cast<size_t>(n) * sh.n_draft_vocab, 0.0f);
  ReDrafterScratch scratch;
  head.step(h, in.data(), n, o.s.data(), o.logits.data(), &scratch, pool);
  return o;
}

// max |a - b| / max(max |b|, 1e-6) over each row of `cols`; the largest such ratio.
double max_row_error(const std::vector<float>& a, const std::vector<float>& b, int64_t cols) {
  double worst = 0.0;
  for (size_t r = 0; r * cols < b.size(); ++r) {
    double diff = 0.0, scale = 1e-6;
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = r * cols + c;
      diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

int argmax(const float* x, int n) {
  return static_cast<int>(std::max_element(x, x + n) - x);
}

// The device step against the CPU step of the same head for 1 to 6 rows (random inputs in the
// range real ones take); then each n again (graph capture at the second sight, replay at the
// third): the device's own results bitwise equal across the three.
void check_head(const ReDrafterWeights& w, GgmlType type, const char* name) {
  ReDrafterHead cpu(w, type);
  ReDrafterHead gpu(w, type);
  gpu.set_device(make_redrafter_head_device(w, gpu.weight_type(), "cuda"));
  ASSERT_STREQ(gpu.device_name(), "cuda");
  ASSERT_STREQ(cpu.device_name(), "cpu");
  const ReDrafterShape& sh = w.shape;
  ThreadPool pool(2);
  std::mt19937 rng(42);
  double worst_s = 0.0, worst_logits = 0.0;
  int same_top = 0, rows = 0;
  for (int n = 1; n <= 6; ++n) {
    const std::vector<float> h = random_floats(rng, static_cast<size_t>(sh.dim), 1.0f);
    const std::vector<float> in =
        random_floats(rng, static_cast<size_t>(n) * sh.width(), 0.5f);
    const StepOut want = run_step(cpu, h, in, n, &pool);
    const StepOut first = run_step(gpu, h, in, n, nullptr);
    worst_s = std::max(worst_s, max_row_error(first.s, want.s, sh.state_dim));
    worst_logits = std::max(worst_logits, max_row_error(first.logits, want.logits, sh.n_draft_vocab));
    for (int r = 0; r < n; ++r) {
      const float* a = first.logits.data() + static_cast<size_t>(r) * sh.n_draft_vocab;
      const float* b = want.logits.data() + static_cast<size_t>(r) * sh.n_draft_vocab;
      same_top += argmax(a, sh.n_draft_vocab) == argmax(b, sh.n_draft_vocab) ? 1 : 0;
      ++rows;
    }
    for (int again = 0; again < 2; ++again) {  // captured, then replayed
      const StepOut o = run_step(gpu, h, in, n, nullptr);
      EXPECT_EQ(o.s, first.s) << name << " n " << n << " run " << again + 2;
      EXPECT_EQ(o.logits, first.logits) << name << " n " << n << " run " << again + 2;
    }
  }
  std::printf("%s (%s): GPU vs CPU head step: max |diff| / max |value| per row: state %.3g, "
              "logits %.3g; same argmax %d/%d\n",
              name, ggml_type_name(static_cast<uint32_t>(cpu.weight_type())).c_str(), worst_s,
              worst_logits, same_top, rows);
  // Seen on an H200: 2-3e-7 for every type (the same int8 codes, sums in another order, expf
  // against the host's exp). A flipped rounding of one activation's int8 code would move a
  // result by ~1/127 of its block's scale, so the bound leaves room for a few such flips.
  EXPECT_LT(worst_s, 1e-3) << name;
  EXPECT_LT(worst_logits, 1e-3) << name;
  EXPECT_GE(same_top, rows - 1) << name;
}

TEST(CudaDrafter, ReDrafterStepMatchesCpuEveryType) {
  SKIP_WITHOUT_GPU();
  auto model = Model::load(test::tiny_model("stories260K.gguf"), Device::kCpu);
  const ReDrafterWeights w = test::random_head(*model, test::story_tokens(*model, 48), 32, 2, 5);
  check_head(w, GgmlType::kQ8_0, "stories260K random head");
  check_head(w, GgmlType::kF16, "stories260K random head");
  check_head(w, GgmlType::kF32, "stories260K random head");
}

TEST(CudaDrafter, ShippedSmolLM2HeadMatchesCpu) {
  SKIP_WITHOUT_GPU();
  if (!test::file_exists(test::default_model_path())) {
    GTEST_SKIP() << "default model missing at " << test::default_model_path();
  }
  auto model = Model::load(test::default_model_path(), Device::kCpu);
  const std::string path = find_drafter_head(*model, "redrafter");
  ASSERT_FALSE(path.empty()) << "no ReDrafter head for the default model";
  check_head(load_redrafter(path), GgmlType::kQ8_0, "SmolLM2 shipped head");
}

// Beam search with the device head finds the CPU head's beams, whatever the beam shape, on the
// hidden states of a real context (rows of a CPU pass over a prompt). A near tie between two
// candidates may rank them differently, so at most one search in the lot may differ.
TEST(CudaDrafter, BeamSearchWithDeviceHeadFindsTheCpuBeams) {
  SKIP_WITHOUT_GPU();
  auto model = Model::load(test::tiny_model("stories260K.gguf"), Device::kCpu);
  const ReDrafterWeights w = test::random_head(*model, test::story_tokens(*model, 48), 32, 2, 9);
  ReDrafterHead cpu(w);
  ReDrafterHead gpu(w);
  gpu.set_device(make_redrafter_head_device(w, gpu.weight_type(), "cuda"));
  ReDrafterBeamSearch search_cpu(cpu, *model), search_gpu(gpu, *model);
  ThreadPool pool(2);
  std::mt19937 rng(3);
  int differ = 0, searches = 0;
  for (int beams = 1; beams <= 4; ++beams) {
    for (int length = 1; length <= 4; ++length) {
      const std::vector<float> h = random_floats(rng, static_cast<size_t>(w.shape.dim), 1.0f);
      const int32_t root = w.draft_vocab[rng() % w.draft_vocab.size()];
      Beams a, b;
      search_cpu.run(h, root, BeamSearchConfig{beams, length}, &a, &pool);
      search_gpu.run(h, root, BeamSearchConfig{beams, length}, &b, nullptr);
      ASSERT_EQ(a.n, b.n);
      differ += a.tokens == b.tokens ? 0 : 1;
      ++searches;
      for (size_t i = 0; i < a.scores.size(); ++i) {
        EXPECT_NEAR(a.scores[i], b.scores[i], 0.05) << beams << "x" << length << " beam " << i;
      }
    }
  }
  std::printf("beam search, device head vs CPU head: %d of %d searches differ\n", differ, searches);
  EXPECT_LE(differ, 1);
}

}  // namespace
}  // namespace specdec
