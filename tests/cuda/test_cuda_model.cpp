// The llama model on the GPU (Model::load(path, Device::kCuda)) against the references the CPU
// model is held to, and against the CPU model itself:
//   (a) the golden prompt logits and greedy continuations of the tiny models (../shared/golden,
//       the CPU golden test's tolerances) and SmolLM2's golden greedy run (its file's rule);
//   (b) the same batch on the CPU and the GPU: logits close (relative to the row's largest);
//   (c) batch invariance: a chain verified in one pass gets bitwise the logits of decoding it one
//       token at a time; many sequences in scattered blocks of one device pool, in one pass, get
//       bitwise the logits, hidden states and K/V each gets alone; sequences in different pools
//       (their own KvCache each) in one pass too; a token tree's rows equal its branches decoded
//       as chains (1e-4, as on the CPU);
//   (d) the engine on the GPU: concurrent greedy requests with speculation none / ngram / draft
//       model (the draft on the GPU too) give each request's plain greedy output alone;
//   (e) the device KV pool: write / read / copy_slot / copies as the host pool's;
//   (f) errors: a host KV cache on the GPU model, bad batches (nothing written), view();
//   (g) CUDA graphs: a fixed script of passes (batch composition changing, trees, chains, two
//       pools, after the matmul scratch and the model's buffers grew) gives bitwise the same
//       logits with graphs on and off, and the engine with graphs on equals solo decoding.
//   (h) the fused kernels and stacked matrices (the default) against the separate ops
//       (SPECDEC_CUDA_FUSE=0): the (g) script's logits, every dumped intermediate - bitwise.
//   (i) qwen2 (Q/K/V biases, NEOX RoPE) on a random qwen2-shaped file written here: CPU vs GPU,
//       fused == separate ops and graphs == no graphs bitwise, and the biases do change the
//       logits (a file with zero biases is a different model).
// Every test skips itself where no CUDA device answers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/thread_pool.h"
#include "backend/cuda/cuda_ops.h"
#include "common/gguf_writer.h"
#include "common/random_blocks.h"
#include "common/random_head.h"
#include "common/skip_without_gpu.h"
#include "common/solo_run.h"
#include "common/test_paths.h"
#include "drafter/head_registry.h"
#include "drafter/medusa_heads.h"
#include "drafter/redrafter_head.h"
#include "drafter/redrafter_weights.h"
#include "engine/generator.h"
#include "kv/kv_cache.h"
#include "kv/paged_kv.h"
#include "model/device.h"
#include "model/forward_scratch.h"
#include "model/gguf.h"
#include "model/model.h"
#include "specdec/engine.h"
#include "speculative/token_tree.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec {
namespace {

std::unique_ptr<Model> load_gpu(const std::string& path) { return Model::load(path, Device::kCuda); }

bool have_smollm2() { return test::file_exists(test::default_model_path()); }

nlohmann::json load_golden(const char* name) {
  return nlohmann::json::parse(test::read_file(test::golden_file(name)));
}

std::vector<int32_t> iota_vec(int64_t n, int32_t from = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

int64_t first_difference(const float* a, const float* b, int64_t n) {
  for (int64_t e = 0; e < n; ++e) {
    if (std::memcmp(a + e, b + e, sizeof(float)) != 0) return e;
  }
  return -1;
}

float max_diff(const float* a, const float* b, size_t n) {
  float d = 0;
  for (size_t i = 0; i < n; ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

// Runs `tokens` as one chain pass after kv's cached tokens; returns the logits of every row.
std::vector<float> run_chain(Model& model, KvCache& kv, const std::vector<int32_t>& tokens,
                             const std::vector<uint8_t>* mask = nullptr) {
  const auto n = static_cast<int64_t>(tokens.size());
  const std::vector<int32_t> positions = iota_vec(n, static_cast<int32_t>(kv.size()));
  const std::vector<int32_t> rows = iota_vec(n);
  ForwardBatch b;
  b.tokens = tokens;
  b.positions = positions;
  b.output_rows = rows;
  if (mask != nullptr) b.mask = *mask;
  const ForwardResult r = model.forward(kv, b, nullptr);
  return {r.logits.begin(), r.logits.end()};
}

// ---- (a) goldens --------------------------------------------------------------------------------

struct GoldenCase {
  const char* model_file;
  const char* golden_name;
};

class CudaGolden : public ::testing::TestWithParam<GoldenCase> {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
};

// As GoldenTest.PromptLogitsMatchTop8(F16Cache): every position's logits of the reference's top
// 8 within `tolerance`, and the reference's best token ours.
void check_prompt_logits(const GoldenCase& gc, KvType kv_type, float tolerance) {
  auto model = load_gpu(test::tiny_model(gc.model_file));
  ASSERT_STREQ(model->device_name(), "cuda");
  const nlohmann::json golden = load_golden(gc.golden_name);
  const int n_vocab = model->config().n_vocab;
  ASSERT_EQ(n_vocab, golden["n_vocab"].get<int>());
  float worst = 0;
  for (const auto& c : golden["cases"]) {
    const std::vector<int32_t> tokens = c["tokens"].get<std::vector<int32_t>>();
    const int n = static_cast<int>(tokens.size());
    KvCache kv = model->make_kv_cache(256, kv_type);
    ASSERT_TRUE(kv.on_device());
    const std::vector<float> logits = run_chain(*model, kv, tokens);
    const auto& topk = c["prompt_logits_topk"];
    ASSERT_EQ(static_cast<int>(topk.size()), n);
    for (int i = 0; i < n; ++i) {
      const float* row = logits.data() + static_cast<size_t>(i) * n_vocab;
      float max_err = 0;
      for (const auto& pair : topk[i]) {
        max_err = std::max(max_err, std::abs(row[pair[0].get<int>()] - pair[1].get<float>()));
      }
      worst = std::max(worst, max_err);
      EXPECT_LE(max_err, tolerance) << c["prompt"] << " position " << i;
      const int ours = static_cast<int>(std::max_element(row, row + n_vocab) - row);
      EXPECT_EQ(ours, topk[i][0][0].get<int>()) << c["prompt"] << " position " << i;
    }
  }
  std::printf("%s on the GPU, %s KV: max |logit - golden| %.3g\n", gc.model_file,
              kv_type_name(kv_type), worst);
}

TEST_P(CudaGolden, PromptLogitsMatchTop8) { check_prompt_logits(GetParam(), KvType::kF32, 1e-3f); }

TEST_P(CudaGolden, PromptLogitsMatchTop8F16Cache) {
  check_prompt_logits(GetParam(), KvType::kF16, 0.05f);
}

void check_greedy(const GoldenCase& gc, KvType kv_type) {
  auto model = load_gpu(test::tiny_model(gc.model_file));
  auto tok = Tokenizer::from_gguf(model->file());
  const nlohmann::json golden = load_golden(gc.golden_name);
  Generator gen(*model, nullptr, model->config().n_ctx_train, kv_type);
  for (const auto& c : golden["cases"]) {
    const std::vector<int32_t> tokens = c["tokens"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = c["greedy"].get<std::vector<int32_t>>();
    GenerationConfig config;
    config.max_new_tokens = static_cast<int>(want.size());
    const std::vector<int32_t> got = gen.generate(tokens, config, nullptr, nullptr);
    EXPECT_EQ(got, want) << c["prompt"];
  }
}

TEST_P(CudaGolden, Greedy128TokensIdentical) { check_greedy(GetParam(), KvType::kF16); }
TEST_P(CudaGolden, Greedy128TokensIdenticalF32Cache) { check_greedy(GetParam(), KvType::kF32); }

INSTANTIATE_TEST_SUITE_P(TinyModels, CudaGolden,
                         ::testing::Values(GoldenCase{"stories260K.gguf", "stories260K.json"},
                                           GoldenCase{"tinystories280K.gguf",
                                                      "tinystories280K.json"}),
                         [](const auto& info) {
                           const std::string s = info.param.golden_name;
                           return s.substr(0, s.find('.'));
                         });

// SmolLM2's golden run, with the CPU test's rule and reasons (tests/e2e/test_smollm2.cpp,
// GoldenGreedyWithinTheKnownGap: the file's own rule - top-5 log-probabilities within 0.1 up to
// a 0.05 near-tie - is not met by the CPU variants either): greedy ids equal and log-probabilities
// within 0.75 up to the first position whose reference top-2 margin is below 0.5; prints how many
// positions are within the file's 0.1.
TEST(CudaSmolLM2, GoldenGreedy) {
  SKIP_WITHOUT_GPU();
  if (!have_smollm2()) GTEST_SKIP() << "default model missing at " << test::default_model_path();
  auto model = load_gpu(test::default_model_path());
  const nlohmann::json golden = load_golden("smollm2-135m.json");
  const int n_vocab = model->config().n_vocab;
  int checked = 0, within_file_rule = 0;
  float worst = 0;
  for (const auto& c : golden["cases"]) {
    std::vector<int32_t> seq = c["tokens"].get<std::vector<int32_t>>();
    const auto& steps = c["steps"];
    KvCache kv = model->make_kv_cache(static_cast<int64_t>(seq.size() + steps.size() + 1));
    std::vector<float> logits = run_chain(*model, kv, seq);
    logits.erase(logits.begin(), logits.end() - n_vocab);  // the last row
    for (size_t step = 0; step < steps.size(); ++step) {
      const auto& top5 = steps[step]["top5"];
      if (top5[0][1].get<double>() - top5[1][1].get<double>() < 0.5) break;  // see above
      const float mx = *std::max_element(logits.begin(), logits.end());
      double sum = 0;
      for (float l : logits) sum += std::exp(static_cast<double>(l - mx));
      const double log_z = mx + std::log(sum);
      const int32_t ours =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      ASSERT_EQ(ours, steps[step]["id"].get<int32_t>()) << c["prompt"] << " step " << step;
      double step_worst = 0;
      for (const auto& pair : top5) {
        const double lp = logits[pair[0].get<size_t>()] - log_z;
        const double err = std::abs(lp - pair[1].get<double>());
        worst = std::max(worst, static_cast<float>(err));
        step_worst = std::max(step_worst, err);
        EXPECT_LE(err, 0.75) << c["prompt"] << " step " << step << " id " << pair[0];
      }
      within_file_rule += step_worst <= 0.1;
      ++checked;
      logits = run_chain(*model, kv, {ours});
    }
  }
  std::printf("SmolLM2 golden on the GPU: %d positions checked (margin >= 0.5), %d within the "
              "file's 0.1, max |logprob - golden| %.3g\n", checked, within_file_rule, worst);
  EXPECT_GE(checked, 10);
}

// ---- (b) CPU vs GPU -----------------------------------------------------------------------------

// One prompt pass (every row out) on both: per row, max |gpu - cpu| <= rel * max |cpu logit|.
void check_cpu_vs_gpu(const std::string& path, float rel, const char* name) {
  auto cpu = Model::load(path);
  auto gpu = load_gpu(path);
  const int n_vocab = cpu->config().n_vocab;
  std::mt19937 gen(7);
  std::uniform_int_distribution<int32_t> token(3, n_vocab - 1);
  std::vector<int32_t> tokens(40);
  for (auto& t : tokens) t = token(gen);
  KvCache cpu_kv = cpu->make_kv_cache(64, KvType::kF32);
  KvCache gpu_kv = gpu->make_kv_cache(64, KvType::kF32);
  ASSERT_FALSE(cpu_kv.on_device());
  ASSERT_TRUE(gpu_kv.on_device());
  const std::vector<float> a = run_chain(*cpu, cpu_kv, tokens);
  const std::vector<float> b = run_chain(*gpu, gpu_kv, tokens);
  ASSERT_EQ(a.size(), b.size());
  float worst = 0;
  int same_argmax = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const float* ra = a.data() + i * n_vocab;
    const float* rb = b.data() + i * n_vocab;
    float scale = 0;
    for (int v = 0; v < n_vocab; ++v) scale = std::max(scale, std::abs(ra[v]));
    const float r = max_diff(ra, rb, static_cast<size_t>(n_vocab)) / std::max(scale, 1e-6f);
    worst = std::max(worst, r);
    EXPECT_LE(r, rel) << name << " row " << i;
    same_argmax += std::max_element(ra, ra + n_vocab) - ra == std::max_element(rb, rb + n_vocab) - rb;
  }
  // And the K/V they cached (layer 0 and the last), within the same relative bound.
  const auto elems = static_cast<size_t>(tokens.size()) * cpu_kv.row_elems();
  std::vector<float> ck(elems), cv(elems), gk(elems), gv(elems);
  for (int l : {0, cpu->config().n_layers - 1}) {
    cpu_kv.read(l, 0, static_cast<int64_t>(tokens.size()), ck.data(), cv.data());
    gpu_kv.read(l, 0, static_cast<int64_t>(tokens.size()), gk.data(), gv.data());
    float scale = 1e-6f;
    for (float x : ck) scale = std::max(scale, std::abs(x));
    EXPECT_LE(max_diff(ck.data(), gk.data(), elems) / scale, rel) << name << " K layer " << l;
  }
  std::printf("%s CPU vs GPU: max |diff| / max |logit| per row %.3g, same argmax %d/%zu\n", name,
              worst, same_argmax, tokens.size());
  EXPECT_GE(same_argmax, static_cast<int>(tokens.size()) * 3 / 4) << name;
}

// stories260K: both in float arithmetic (the CPU's golden error is below 1e-3 absolute).
TEST(CudaVsCpu, Stories260KLogitsClose) {
  SKIP_WITHOUT_GPU();
  check_cpu_vs_gpu(test::tiny_model("stories260K.gguf"), 1e-3f, "stories260K");
}

// SmolLM2 (Q4_1 / Q8_0): the CPU rounds activations to 8-bit blocks before each quantized
// matmul (as the golden's reference does), so the two differ by that rounding through 30 layers.
TEST(CudaVsCpu, SmolLM2LogitsClose) {
  SKIP_WITHOUT_GPU();
  if (!have_smollm2()) GTEST_SKIP() << "default model missing at " << test::default_model_path();
  check_cpu_vs_gpu(test::default_model_path(), 0.05f, "SmolLM2");
}

// ---- (c) batch invariance -----------------------------------------------------------------------

// A chain of 8 verified in one pass after a prefix == the same 8 tokens decoded one at a time,
// bit for bit (and the K/V they leave).
void check_chain_vs_sequential(Model& model, KvType type, const char* name) {
  const int n_vocab = model.config().n_vocab;
  std::mt19937 gen(3);
  std::uniform_int_distribution<int32_t> token(3, n_vocab - 1);
  std::vector<int32_t> prefix(37), chain(8);
  for (auto& t : prefix) t = token(gen);
  for (auto& t : chain) t = token(gen);
  KvCache base = model.make_kv_cache(64, type);
  run_chain(model, base, prefix);
  KvCache one_pass = base;  // a copy on the device
  const std::vector<float> batched = run_chain(model, one_pass, chain);
  KvCache seq_kv = base;
  for (size_t i = 0; i < chain.size(); ++i) {
    const std::vector<float> alone = run_chain(model, seq_kv, {chain[i]});
    const int64_t e = first_difference(batched.data() + i * n_vocab, alone.data(), n_vocab);
    EXPECT_EQ(e, -1) << name << ": chain row " << i
                     << " differs from decoding it alone, first at logit " << e;
  }
  const int64_t n = one_pass.size();
  ASSERT_EQ(n, seq_kv.size());
  const auto elems = static_cast<size_t>(n * base.row_elems());
  std::vector<float> ak(elems), av(elems), bk(elems), bv(elems);
  for (int l = 0; l < model.config().n_layers; ++l) {
    one_pass.read(l, 0, n, ak.data(), av.data());
    seq_kv.read(l, 0, n, bk.data(), bv.data());
    EXPECT_TRUE(same_bits(ak.data(), bk.data(), elems)) << name << " K layer " << l;
    EXPECT_TRUE(same_bits(av.data(), bv.data(), elems)) << name << " V layer " << l;
  }
}

TEST(CudaBatchInvariance, ChainEqualsOneTokenAtATime) {
  SKIP_WITHOUT_GPU();
  auto model = load_gpu(test::tiny_model("stories260K.gguf"));
  check_chain_vs_sequential(*model, KvType::kF16, "stories260K f16");
  check_chain_vs_sequential(*model, KvType::kF32, "stories260K f32");
  if (have_smollm2()) {
    auto smol = load_gpu(test::default_model_path());
    check_chain_vs_sequential(*smol, KvType::kF16, "SmolLM2 f16");
  }
}

// The CPU BatchedForward test on the GPU: sequences in prefill, chunked prefill, decode (at
// block edges), a tree and a chain, plus an idle one, each in its own scattered blocks of one
// device pool, in one pass == each alone through a KvCache on the device.
const std::vector<int> kTreeParents = {-1, 0, 1, 0, 3, 1, 5, 3};

struct SeqSpec {
  const char* name;
  int64_t prefix;
  int64_t n_new;
  bool tree = false;
};

const SeqSpec kSpecs[] = {
    {"prefill 300", 0, 300},
    {"prefill 1", 0, 1},
    {"chunked prefill 37 after 20", 20, 37},
    {"decode after 1", 1, 1},
    {"decode after 63", 63, 1},
    {"decode after 200", 200, 1},
    {"tree of 8 after 45", 45, 8, true},
    {"chain of 8 after 130", 130, 8},
    {"idle, 10 cached", 10, 0},
};

struct Seq {
  SeqSpec spec;
  std::vector<int32_t> history, tokens, positions, rows, table;
  std::vector<uint8_t> mask;
  std::vector<float> logits, hidden;
  std::unique_ptr<KvCache> alone;

  ForwardBatch batch(bool want_hidden) const {
    ForwardBatch b;
    b.tokens = tokens;
    b.positions = positions;
    b.mask = mask;
    b.output_rows = rows;
    b.want_hidden = want_hidden;
    return b;
  }
};

ForwardBatch chain_batch(const std::vector<int32_t>& tokens, std::vector<int32_t>* positions,
                         int64_t past) {
  *positions = iota_vec(static_cast<int64_t>(tokens.size()), static_cast<int32_t>(past));
  ForwardBatch b;
  b.tokens = tokens;
  b.positions = *positions;
  return b;
}

std::vector<float> snapshot(const PagedKvStorage& kv) {
  const std::vector<int32_t> every = iota_vec(kv.n_blocks());
  const int64_t n = kv.n_blocks() * kv.block_slots();
  const auto layer_elems = static_cast<size_t>(n * kv.row_elems());
  std::vector<float> out(2 * layer_elems * kv.n_layers());
  for (int l = 0; l < kv.n_layers(); ++l) {
    kv.read(l, every, 0, n, out.data() + 2 * l * layer_elems,
            out.data() + (2 * l + 1) * layer_elems);
  }
  return out;
}

void expect_same_kv(const PagedKvStorage& paged, const Seq& s, int64_t n, const char* when) {
  const auto elems = static_cast<size_t>(n * paged.row_elems());
  std::vector<float> pk(elems), pv(elems), ck(elems), cv(elems);
  for (int l = 0; l < paged.n_layers(); ++l) {
    paged.read(l, s.table, 0, n, pk.data(), pv.data());
    s.alone->read(l, 0, n, ck.data(), cv.data());
    EXPECT_TRUE(same_bits(pk.data(), ck.data(), elems)) << s.spec.name << ": K of layer " << l << " " << when;
    EXPECT_TRUE(same_bits(pv.data(), cv.data(), elems)) << s.spec.name << ": V of layer " << l << " " << when;
  }
}

void check_batched_forward(Model& model, KvType type, int64_t block_slots, const char* name) {
  const ModelConfig& c = model.config();
  const int64_t n_vocab = c.n_vocab;
  std::mt19937 gen(42);
  std::uniform_int_distribution<int32_t> token(1, c.n_vocab - 1);
  std::vector<Seq> seqs;
  for (const SeqSpec& spec : kSpecs) {
    Seq s;
    s.spec = spec;
    for (int64_t i = 0; i < spec.prefix; ++i) s.history.push_back(token(gen));
    for (int64_t i = 0; i < spec.n_new; ++i) s.tokens.push_back(token(gen));
    if (spec.tree) {
      TokenTree tree;
      tree.reset(s.tokens[0]);
      for (size_t i = 1; i < kTreeParents.size(); ++i) tree.add(kTreeParents[i], s.tokens[i]);
      tree.build_mask(&s.mask);
      tree.build_positions(spec.prefix, &s.positions);
      s.rows = iota_vec(tree.size());
    } else {
      s.positions = iota_vec(spec.n_new, static_cast<int32_t>(spec.prefix));
      for (int64_t r : {int64_t{0}, spec.n_new / 2, spec.n_new - 1}) {
        if (r >= 0 && r < spec.n_new && (s.rows.empty() || r > s.rows.back())) {
          s.rows.push_back(static_cast<int32_t>(r));
        }
      }
    }
    seqs.push_back(std::move(s));
  }

  // 1. Each alone through its own device KvCache.
  for (Seq& s : seqs) {
    s.alone = std::make_unique<KvCache>(
        model.make_kv_cache(std::max<int64_t>(1, s.spec.prefix + s.spec.n_new), type));
    ASSERT_TRUE(s.alone->on_device());
    if (s.spec.prefix > 0) {
      std::vector<int32_t> positions;
      model.forward(*s.alone, chain_batch(s.history, &positions, 0), nullptr);
    }
    if (s.spec.n_new == 0) continue;
    const ForwardResult r = model.forward(*s.alone, s.batch(true), nullptr);
    ASSERT_EQ(r.logits.size(), s.rows.size() * n_vocab) << s.spec.name;
    ASSERT_EQ(r.hidden.size(), s.rows.size() * c.dim) << s.spec.name;
    s.logits.assign(r.logits.begin(), r.logits.end());
    s.hidden.assign(r.hidden.begin(), r.hidden.end());
  }

  // 2. One device pool, every sequence's blocks scattered in it.
  int32_t n_blocks = 3;
  for (const Seq& s : seqs) {
    n_blocks +=
        static_cast<int32_t>((s.spec.prefix + s.spec.n_new + block_slots - 1) / block_slots) + 1;
  }
  std::unique_ptr<PagedKvStorage> storage = model.make_paged_kv(n_blocks, block_slots, type);
  ASSERT_TRUE(storage->on_device());
  std::vector<int32_t> ids = iota_vec(n_blocks);
  std::shuffle(ids.begin(), ids.end(), gen);
  size_t next = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Seq& s = seqs[i];
    const int64_t need = (s.spec.prefix + s.spec.n_new + block_slots - 1) / block_slots + i % 2;
    for (int64_t b = 0; b < need; ++b) s.table.push_back(ids[next++]);
  }
  ForwardScratch scratch;

  // 3. The histories in one pass.
  {
    std::vector<std::vector<int32_t>> positions(seqs.size());
    std::vector<SeqBatch> batch;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i].spec.prefix == 0) continue;
      batch.push_back({SeqKv{storage.get(), seqs[i].table, 0},
                       chain_batch(seqs[i].history, &positions[i], 0)});
    }
    const ForwardResult r = model.forward(batch, nullptr, &scratch);
    EXPECT_TRUE(r.logits.empty());
    for (const Seq& s : seqs) expect_same_kv(*storage, s, s.spec.prefix, "after the history");
  }

  auto make_batch = [&](const std::vector<size_t>& order, int want_hidden_of) {
    std::vector<SeqBatch> batch;
    for (size_t i : order) {
      const Seq& s = seqs[i];
      batch.push_back({SeqKv{storage.get(), s.table, s.spec.prefix},
                       s.batch(static_cast<int>(i) == want_hidden_of)});
    }
    return batch;
  };
  auto check_result = [&](const ForwardResult& r, const std::vector<size_t>& order,
                          const std::string& what) {
    size_t n_out = 0;
    for (size_t i : order) n_out += seqs[i].rows.size();
    ASSERT_EQ(r.logits.size(), n_out * n_vocab) << what;
    ASSERT_EQ(r.hidden.size(), n_out * c.dim) << what;
    size_t row = 0;
    for (size_t i : order) {
      const Seq& s = seqs[i];
      for (size_t k = 0; k < s.rows.size(); ++k, ++row) {
        const int64_t e = first_difference(r.logits.data() + row * n_vocab,
                                           s.logits.data() + k * n_vocab, n_vocab);
        EXPECT_EQ(e, -1) << what << ": " << s.spec.name << " row " << s.rows[k]
                         << " logits differ from the sequence alone at " << e;
        const int64_t h =
            first_difference(r.hidden.data() + row * c.dim, s.hidden.data() + k * c.dim, c.dim);
        EXPECT_EQ(h, -1) << what << ": " << s.spec.name << " row " << s.rows[k]
                         << " hidden state differs from the sequence alone at " << h;
      }
    }
  };
  std::vector<size_t> order(seqs.size());
  std::iota(order.begin(), order.end(), 0);
  const int tree_index = 6;
  {
    const std::vector<SeqBatch> batch = make_batch(order, tree_index);
    const ForwardResult r = model.forward(batch, nullptr, &scratch);
    check_result(r, order, std::string(name) + " batch of " + std::to_string(seqs.size()));
    for (const Seq& s : seqs) expect_same_kv(*storage, s, s.spec.prefix + s.spec.n_new, "after the pass");
  }
  {
    std::vector<size_t> reversed(order.rbegin(), order.rend());
    const std::vector<SeqBatch> batch = make_batch(reversed, 0);
    const ForwardResult r = model.forward(batch, nullptr, &scratch);
    check_result(r, reversed, std::string(name) + " reversed");
  }
  {
    const ForwardResult r = model.forward(std::span<const SeqBatch>{}, nullptr, &scratch);
    EXPECT_TRUE(r.logits.empty());
  }

  // 4. (f) A bad sequence in the batch throws and writes nothing.
  {
    const std::vector<float> before = snapshot(*storage);
    const Seq& d = seqs[5];
    const std::vector<int32_t> short_table(d.table.begin(),
                                           d.table.begin() + d.spec.prefix / block_slots);
    std::vector<SeqBatch> batch = make_batch({2, 3, 5, 6, 0}, -1);
    batch[2].kv.table = short_table;
    EXPECT_THROW(model.forward(batch, nullptr, &scratch), Error) << name;
    EXPECT_TRUE(snapshot(*storage) == before) << name << ": a failed pass wrote K/V";
    const std::vector<int32_t> bad_token = {static_cast<int32_t>(n_vocab)};
    batch = make_batch({2, 3, 5, 6, 0}, -1);
    batch[4].batch.tokens = {bad_token.data(), 1};
    batch[4].batch.positions = {seqs[3].positions.data(), 1};
    batch[4].batch.output_rows = {};
    EXPECT_THROW(model.forward(batch, nullptr, &scratch), Error) << name;
    EXPECT_TRUE(snapshot(*storage) == before) << name << ": a failed pass wrote K/V";
  }

  // 5. Negative control: a table with two blocks swapped changes that sequence's logits only.
  {
    std::vector<int32_t> swapped = seqs[5].table;
    std::swap(swapped[0], swapped[1]);
    std::vector<SeqBatch> batch = make_batch({3, 5, 6}, -1);
    batch[1].kv.table = swapped;
    const ForwardResult r = model.forward(batch, nullptr, &scratch);
    ASSERT_EQ(r.logits.size(), (1 + 1 + 8) * static_cast<size_t>(n_vocab));
    EXPECT_EQ(first_difference(r.logits.data(), seqs[3].logits.data(), n_vocab), -1);
    EXPECT_NE(first_difference(r.logits.data() + n_vocab, seqs[5].logits.data(), n_vocab), -1)
        << name << ": swapping two blocks of a table changed nothing";
    EXPECT_EQ(first_difference(r.logits.data() + 2 * n_vocab, seqs[6].logits.data(), 8 * n_vocab),
              -1);
  }

  // 6. Sequences in different pools (a device KvCache each) in one pass == alone.
  {
    std::vector<KvCache> caches;
    std::vector<size_t> picked = {2, 4, 6, 7};
    for (size_t i : picked) {
      const Seq& s = seqs[i];
      caches.push_back(model.make_kv_cache(s.spec.prefix + s.spec.n_new, type));
      std::vector<int32_t> positions;
      model.forward(caches.back(), chain_batch(s.history, &positions, 0), nullptr);
    }
    std::vector<SeqBatch> batch;
    for (size_t k = 0; k < picked.size(); ++k) {
      batch.push_back({caches[k].seq(), seqs[picked[k]].batch(true)});
    }
    const ForwardResult r = model.forward(batch, nullptr, &scratch);
    check_result(r, picked, std::string(name) + " separate pools");
  }
  std::printf("%s on the GPU (%s KV, %lld-slot blocks): %zu sequences, %d blocks\n", name,
              kv_type_name(type), static_cast<long long>(block_slots), seqs.size(), n_blocks);
}

TEST(CudaBatchedForward, Stories260K) {
  SKIP_WITHOUT_GPU();
  auto model = load_gpu(test::tiny_model("stories260K.gguf"));
  check_batched_forward(*model, KvType::kF16, 16, "stories260K");
}

TEST(CudaBatchedForward, Stories260KFloatCache32SlotBlocks) {
  SKIP_WITHOUT_GPU();
  auto model = load_gpu(test::tiny_model("stories260K.gguf"));
  check_batched_forward(*model, KvType::kF32, 32, "stories260K");
}

TEST(CudaBatchedForward, SmolLM2) {
  SKIP_WITHOUT_GPU();
  if (!have_smollm2()) GTEST_SKIP() << "default model missing at " << test::default_model_path();
  auto model = load_gpu(test::default_model_path());
  check_batched_forward(*model, KvType::kF16, 16, "SmolLM2");
}

// A token tree's rows == each node's branch decoded as a chain after the same prefix (1e-4, the
// CPU TreeForward bound: the tree reads its keys from other slots), and keep_slots of a path
// leaves the K/V of decoding that path (1e-5).
TEST(CudaBatchInvariance, TreeRowsEqualBranches) {
  SKIP_WITHOUT_GPU();
  auto model = load_gpu(test::tiny_model("stories260K.gguf"));
  const int n_vocab = model->config().n_vocab;
  const std::vector<int> parents = {-1, 0, 1, 2, 0, 4, 1, 0, 6, 3};
  std::mt19937 gen(5);
  std::uniform_int_distribution<int32_t> token(3, n_vocab - 1);
  std::vector<int32_t> prefix(20);
  for (auto& t : prefix) t = token(gen);
  TokenTree tree;
  tree.reset(token(gen));
  for (size_t i = 1; i < parents.size(); ++i) tree.add(parents[i], token(gen));
  const int n = tree.size();
  KvCache base = model->make_kv_cache(64);
  run_chain(*model, base, prefix);
  const int64_t past = base.size();
  std::vector<uint8_t> mask;
  std::vector<int32_t> positions;
  tree.build_mask(&mask);
  tree.build_positions(past, &positions);
  const std::vector<int32_t> rows = iota_vec(n);
  KvCache tree_kv = base;
  ForwardBatch b;
  b.tokens = tree.tokens();
  b.positions = positions;
  b.mask = mask;
  b.output_rows = rows;
  const ForwardResult r = model->forward(tree_kv, b, nullptr);
  const std::vector<float> tree_logits(r.logits.begin(), r.logits.end());
  std::vector<int32_t> path;
  float worst = 0, worst_kv = 0;
  for (int i = 0; i < n; ++i) {
    tree.path_to(i, &path);
    std::vector<int32_t> chain = {tree.token(0)};
    for (int32_t node : path) chain.push_back(tree.token(node));
    KvCache branch = base;
    const std::vector<float> want = run_chain(*model, branch, chain);
    const float d = max_diff(tree_logits.data() + static_cast<size_t>(i) * n_vocab,
                             want.data() + (chain.size() - 1) * n_vocab, n_vocab);
    worst = std::max(worst, d);
    EXPECT_LE(d, 1e-4f) << "node " << i;
    std::vector<int64_t> keep = {past};
    for (int32_t node : path) keep.push_back(past + node);
    KvCache kept = tree_kv;
    kept.keep_slots(past, keep);
    ASSERT_EQ(kept.size(), branch.size());
    const auto elems = static_cast<size_t>(kept.size() * kept.row_elems());
    std::vector<float> ak(elems), av(elems), bk(elems), bv(elems);
    for (int l = 0; l < model->config().n_layers; ++l) {
      kept.read(l, 0, kept.size(), ak.data(), av.data());
      branch.read(l, 0, branch.size(), bk.data(), bv.data());
      worst_kv = std::max({worst_kv, max_diff(ak.data(), bk.data(), elems),
                           max_diff(av.data(), bv.data(), elems)});
    }
  }
  EXPECT_LE(worst_kv, 1e-5f);
  std::printf("tree on the GPU: max |tree - branch| logits %.3g, KV after keep_slots %.3g\n",
              worst, worst_kv);
}

// ---- (d) the engine on the GPU ------------------------------------------------------------------

struct EngineOut {
  std::vector<int32_t> tokens;
  bool finished = false;
};

std::vector<EngineOut> run_engine(Model& model, const Tokenizer& tok, ThreadPool* pool,
                                  EngineConfig config, std::vector<Request> requests) {
  Engine engine(model, &tok, pool, config);
  std::vector<EngineOut> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].on_output = [&out, i](const RequestOutput& o) {
      out[i].tokens.insert(out[i].tokens.end(), o.tokens.begin(), o.tokens.end());
      if (o.finished) out[i].finished = true;
      return true;
    };
    const SubmitResult r = engine.submit(requests[i]);
    EXPECT_TRUE(r.ok()) << r.error;
  }
  int guard = 0;
  while (engine.has_work() && ++guard < 100000) {
    engine.step();
    engine.check_invariants();
  }
  EXPECT_EQ(engine.stats().kv_blocks_used, 0) << "blocks leaked";
  return out;
}

Request make_request(std::vector<int32_t> prompt, int max_tokens, SpecMethod spec) {
  Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  r.spec.method = spec;
  r.spec.num_draft = 4;
  r.spec.adaptive = false;
  return r;
}

// Several concurrent greedy requests (prompts of 1 to 230 tokens, one sharing another's prefix)
// with `spec`: each output == plain greedy decoding of that request alone on the GPU.
void check_engine(Model& model, Model* draft, SpecMethod spec, int n_requests, int max_tokens,
                  const char* name, const ReDrafterHead* head = nullptr,
                  const MedusaHeads* medusa = nullptr) {
  auto tok = Tokenizer::from_gguf(model.file());
  std::mt19937 rng(11);
  const int lens[] = {1, 5, 17, 40, 64, 100, 230, 12};
  std::vector<Request> reqs;
  for (int i = 0; i < n_requests; ++i) {
    std::vector<int32_t> p = tok->encode("Once upon a time", true, false);
    while (static_cast<int>(p.size()) < lens[i % 8]) {
      p.push_back(static_cast<int32_t>(3 + rng() % (model.config().n_vocab - 3)));
    }
    p.resize(static_cast<size_t>(lens[i % 8]));
    reqs.push_back(make_request(std::move(p), max_tokens + (i % 3) * 8, spec));
    if (spec == SpecMethod::kReDrafter) {  // beam shapes 1x2 .. 4x4
      reqs.back().spec.beams = 1 + i % 4;
      reqs.back().spec.beam_length = 2 + i % 3;
      reqs.back().spec.num_draft = reqs.back().spec.beams * reqs.back().spec.beam_length;
    } else if (spec == SpecMethod::kMedusa) {
      reqs.back().spec.num_draft = 10;
    }
  }
  if (n_requests > 6) {  // a shared prefix
    reqs[1].prompt = reqs[6].prompt;
    reqs[1].prompt.resize(150);
    reqs[1].prompt.push_back(7);
  }
  ThreadPool pool(2);
  const int64_t ctx = std::min(512, model.config().n_ctx_train);
  EngineConfig config;
  config.kv_cache_mib = 64;
  config.max_context = ctx;
  config.draft_model = draft;
  config.drafter_head = head;
  config.medusa_heads = medusa;
  const std::vector<EngineOut> out = run_engine(model, *tok, &pool, config, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    Request plain = reqs[i];
    plain.spec.method = SpecMethod::kNone;
    const std::vector<int32_t> want = test::solo_output(model, *tok, &pool, plain, nullptr, ctx);
    EXPECT_TRUE(out[i].finished) << name << " request " << i;
    EXPECT_EQ(out[i].tokens, want) << name << " request " << i << " (prompt "
                                   << reqs[i].prompt.size() << " tokens)";
  }
}

TEST(CudaEngine, GreedyPlainNgramDraftEqualSolo) {
  SKIP_WITHOUT_GPU();
  auto model = load_gpu(test::tiny_model("stories260K.gguf"));
  auto draft = load_gpu(test::tiny_model("tinystories280K.gguf"));
  check_engine(*model, nullptr, SpecMethod::kNone, 8, 24, "stories260K none");
  check_engine(*model, nullptr, SpecMethod::kNgram, 8, 24, "stories260K ngram");
  check_engine(*model, draft.get(), SpecMethod::kDraft, 8, 24, "stories260K draft");
}

// ReDrafter and Medusa on the GPU (random heads over the model's frequent tokens, as the CPU
// tests): the head runs on the host from the hidden rows the GPU pass returns, then on the GPU.
TEST(CudaEngine, ReDrafterMedusaEqualSolo) {
  SKIP_WITHOUT_GPU();
  auto model = load_gpu(test::tiny_model("stories260K.gguf"));
  const std::vector<int32_t> vocab = test::story_tokens(*model, 24);
  const ReDrafterWeights w = test::random_head(*model, vocab, 32, 2, 5);
  const ReDrafterHead head(w);
  const MedusaHeads medusa(test::random_medusa(*model, vocab, 4, 6));
  check_engine(*model, nullptr, SpecMethod::kReDrafter, 8, 24, "stories260K redrafter", &head);
  ReDrafterHead on_gpu(w);  // the head's steps on the GPU too
  on_gpu.set_device(make_redrafter_head_device(w, on_gpu.weight_type(), "cuda"));
  check_engine(*model, nullptr, SpecMethod::kReDrafter, 8, 24, "stories260K redrafter, head on the GPU",
               &on_gpu);
  check_engine(*model, nullptr, SpecMethod::kMedusa, 8, 24, "stories260K medusa", nullptr,
               &medusa);
}

// The shipped head for the default model (heads/, found by the model's fingerprint; on a lent
// machine $SPECDEC_HEADS names the folder) drafts for SmolLM2 on the GPU, lossless.
TEST(CudaEngine, SmolLM2ShippedReDrafterEqualsSolo) {
  SKIP_WITHOUT_GPU();
  if (!have_smollm2()) GTEST_SKIP() << "default model missing at " << test::default_model_path();
  auto model = load_gpu(test::default_model_path());
  const std::string head_path = find_drafter_head(*model, "redrafter");
  ASSERT_FALSE(head_path.empty()) << "no ReDrafter head for the default model";
  const ReDrafterWeights w = load_redrafter(head_path);
  const ReDrafterHead head(w);
  check_engine(*model, nullptr, SpecMethod::kReDrafter, 4, 24, "SmolLM2 redrafter", &head);
  ReDrafterHead on_gpu(w);
  on_gpu.set_device(make_redrafter_head_device(w, on_gpu.weight_type(), "cuda"));
  check_engine(*model, nullptr, SpecMethod::kReDrafter, 4, 24, "SmolLM2 redrafter, head on the GPU",
               &on_gpu);
}

TEST(CudaEngine, SmolLM2NgramEqualsSolo) {
  SKIP_WITHOUT_GPU();
  if (!have_smollm2()) GTEST_SKIP() << "default model missing at " << test::default_model_path();
  auto model = load_gpu(test::default_model_path());
  check_engine(*model, nullptr, SpecMethod::kNgram, 4, 24, "SmolLM2 ngram");
}

// ---- (e) the device KV pool ---------------------------------------------------------------------

// The same writes, copy_slot and reads on a host pool and a device pool read back the same bits.
void check_pool_round_trip(const Model& model, KvType type) {
  const ModelConfig& c = model.config();
  const int64_t bs = 16;
  const int32_t n_blocks = 5;
  std::unique_ptr<PagedKvStorage> dev = model.make_paged_kv(n_blocks, bs, type);
  PagedKvStorage host(c.n_layers, c.n_kv_heads, c.head_dim, n_blocks, bs, type);
  ASSERT_TRUE(dev->on_device());
  ASSERT_STREQ(dev->device_memory()->device_name(), "cuda");
  ASSERT_FALSE(host.on_device());
  EXPECT_EQ(dev->bytes(), host.bytes());
  const std::vector<int32_t> table = {3, 0, 4};  // 48 slots, scattered
  const int64_t row = host.row_elems();
  std::mt19937 gen(9);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  const int64_t slot = 5, n = 38;  // crosses both block edges
  std::vector<float> k(static_cast<size_t>(n * row)), v(k.size());
  for (int l = 0; l < c.n_layers; ++l) {
    for (auto& x : k) x = dist(gen);
    for (auto& x : v) x = dist(gen);
    dev->write(l, table, slot, n, k.data(), v.data());
    host.write(l, table, slot, n, k.data(), v.data());
  }
  dev->copy_slot(table, 7, 44);
  host.copy_slot(table, 7, 44);
  dev->copy_slot(table, 40, 2);
  host.copy_slot(table, 40, 2);
  PagedKvStorage copy = *dev;  // a deep copy on the device
  ASSERT_TRUE(copy.on_device());
  const std::vector<float> zeros(k.size(), 0.0f);
  dev->write(0, table, slot, n, zeros.data(), zeros.data());  // the copy keeps the old rows
  host.write(0, table, slot, n, zeros.data(), zeros.data());
  const int64_t all = static_cast<int64_t>(table.size()) * bs;
  const auto elems = static_cast<size_t>(all * row);
  std::vector<float> hk(elems), hv(elems), dk(elems), dv(elems), ck(elems), cv(elems);
  for (int l = 0; l < c.n_layers; ++l) {
    host.read(l, table, 0, all, hk.data(), hv.data());
    dev->read(l, table, 0, all, dk.data(), dv.data());
    EXPECT_TRUE(same_bits(hk.data(), dk.data(), elems)) << kv_type_name(type) << " K layer " << l;
    EXPECT_TRUE(same_bits(hv.data(), dv.data(), elems)) << kv_type_name(type) << " V layer " << l;
    copy.read(l, table, 0, all, ck.data(), nullptr);
    if (l > 0) {
      EXPECT_TRUE(same_bits(hk.data(), ck.data(), elems)) << "copy, layer " << l;
    } else {
      EXPECT_FALSE(same_bits(hk.data(), ck.data(), elems)) << "the copy shares the device memory";
    }
  }
  // f32: the last layer's rows (k, v of the last write, untouched by the copies) come back
  // exactly.
  if (type == KvType::kF32 && c.n_layers > 1) {
    std::vector<float> got_k(k.size()), got_v(v.size());
    dev->read(c.n_layers - 1, table, slot, n, got_k.data(), got_v.data());
    EXPECT_TRUE(same_bits(got_k.data(), k.data(), k.size()));
    EXPECT_TRUE(same_bits(got_v.data(), v.data(), v.size()));
  }
  // view() is for host pools only.
  EXPECT_THROW(dev->view(0, table.data()), Error);
}

TEST(CudaKvPool, WriteReadCopySlotMatchHostPool) {
  SKIP_WITHOUT_GPU();
  auto model = load_gpu(test::tiny_model("stories260K.gguf"));
  check_pool_round_trip(*model, KvType::kF16);
  check_pool_round_trip(*model, KvType::kF32);
}

// ---- (f) errors ---------------------------------------------------------------------------------

TEST(CudaErrors, HostKvCacheOnTheGpuModelThrows) {
  SKIP_WITHOUT_GPU();
  auto model = load_gpu(test::tiny_model("stories260K.gguf"));
  const ModelConfig& c = model->config();
  KvCache host(c.n_layers, c.n_kv_heads, c.head_dim, 32);  // no device memory
  ASSERT_FALSE(host.on_device());
  const std::vector<int32_t> tokens = {1, 2, 3};
  EXPECT_THROW(run_chain(*model, host, tokens), Error);
  EXPECT_EQ(host.size(), 0);
  // And the CPU model refuses a device cache (its kernels cannot read it).
  auto cpu = Model::load(test::tiny_model("stories260K.gguf"));
  KvCache dev = model->make_kv_cache(32);
  EXPECT_THROW(run_chain(*cpu, dev, tokens), Error);
  EXPECT_THROW(dev.k(0), Error);
}

TEST(CudaErrors, DeviceNamesAndLoad) {
  EXPECT_TRUE(cuda_built());
  EXPECT_EQ(parse_device("cuda"), Device::kCuda);
  EXPECT_EQ(parse_device("cpu"), Device::kCpu);
  EXPECT_FALSE(parse_device("gpu").has_value());
  if (!cuda::available()) {
    EXPECT_THROW(Model::load(test::tiny_model("stories260K.gguf"), Device::kCuda), Error);
    GTEST_SKIP() << "no CUDA device";
  }
  auto model = load_gpu(test::tiny_model("stories260K.gguf"));
  EXPECT_STREQ(model->device_name(), "cuda");
  auto cpu = Model::load(test::tiny_model("stories260K.gguf"));
  EXPECT_EQ(model->weight_bytes(), cpu->weight_bytes());
  EXPECT_EQ(model->matmul_flops_per_token(), cpu->matmul_flops_per_token());
  EXPECT_FALSE(gpu_name().empty());
}

// ---- (g) CUDA graphs ----------------------------------------------------------------------------

// Turns the forward pass's CUDA graphs on or off for a scope.
class GraphsSwitch {
 public:
  explicit GraphsSwitch(bool on) : was_(cuda::graphs_enabled()) { cuda::set_graphs_enabled(on); }
  ~GraphsSwitch() { cuda::set_graphs_enabled(was_); }
  GraphsSwitch(const GraphsSwitch&) = delete;
  GraphsSwitch& operator=(const GraphsSwitch&) = delete;

 private:
  bool was_;
};

// Makes the activation scratch inside cuda::matmul (the int8 path of the 32-element-block types)
// grow, i.e. be reallocated: a Q8_0 matmul needing more of it than any call before in this
// process (each call twice the last: 20 MiB, 40 MiB, ...).
void grow_matmul_scratch() {
  static int64_t n = 256;
  n *= 2;
  const int64_t rows = 16, cols = 32768;  // 1024 blocks of 32: 40 KiB of scratch per token
  cuda::DeviceMatrix w;
  w.type = GgmlType::kQ8_0;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = ggml_row_bytes(GgmlType::kQ8_0, cols);
  cuda::DeviceBuffer wbuf(static_cast<size_t>(rows * w.row_bytes));
  cuda::DeviceBuffer xbuf(static_cast<size_t>(n * cols) * sizeof(float));
  cuda::DeviceBuffer ybuf(static_cast<size_t>(n * rows) * sizeof(float));
  cuda::zero(wbuf.data(), wbuf.bytes());
  cuda::zero(xbuf.data(), xbuf.bytes());
  w.data = wbuf.data();
  cuda::matmul(w, xbuf.as<float>(), n, ybuf.as<float>());
  cuda::synchronize();
}

// A fixed script of 63 passes; returns every logit row they output, in order. Two sequences A, B
// in scattered 16-slot blocks of one device pool and a KvCache C:
//   prefill A 20 + B 9 | 24 x decode A + B | 14 x decode A | 3 x the same-shape tree on B (not
//   advancing: rejected) | matmul scratch grows | 5 x decode A | a 300-token prefill in another
//   cache (the model's buffers grow) | 6 x decode A + B | 2 x decode A + tree on B | 4 x decode A
//   + C (two pools) | 3 x a chain of 5 on A, every row out (not advancing).
// grow_scratch false: no growth of the matmul scratch (it doubles at every call: callers that run
// the script many times in one process).
std::vector<float> graph_script(Model& model, KvType type, bool grow_scratch = true) {
  const ModelConfig& c = model.config();
  std::mt19937 gen(17);
  std::uniform_int_distribution<int32_t> token(3, c.n_vocab - 1);
  const int64_t bs = 16;
  const int32_t n_blocks = 40;
  std::unique_ptr<PagedKvStorage> pool = model.make_paged_kv(n_blocks, bs, type);
  std::vector<int32_t> ids = iota_vec(n_blocks);
  std::shuffle(ids.begin(), ids.end(), gen);
  const std::vector<int32_t> table_a(ids.begin(), ids.begin() + 16);
  const std::vector<int32_t> table_b(ids.begin() + 16, ids.begin() + 32);
  KvCache cache_c = model.make_kv_cache(64, type);
  int64_t past_a = 0, past_b = 0, past_c = 0;
  ForwardScratch scratch;
  std::vector<float> out;

  struct Piece {
    SeqKv kv;
    std::vector<int32_t> tokens, positions, rows;
    std::vector<uint8_t> mask;
  };
  auto chain = [&](SeqKv kv, int64_t n_new, bool all_rows = false) {
    Piece p;
    p.kv = kv;
    for (int64_t i = 0; i < n_new; ++i) p.tokens.push_back(token(gen));
    p.positions = iota_vec(n_new, static_cast<int32_t>(kv.n_past));
    p.rows = all_rows ? iota_vec(n_new) : std::vector<int32_t>{static_cast<int32_t>(n_new - 1)};
    return p;
  };
  auto tree = [&](SeqKv kv) {
    TokenTree t;
    t.reset(token(gen));
    for (size_t i = 1; i < kTreeParents.size(); ++i) t.add(kTreeParents[i], token(gen));
    Piece p;
    p.kv = kv;
    p.tokens.assign(t.tokens().begin(), t.tokens().end());
    t.build_mask(&p.mask);
    t.build_positions(kv.n_past, &p.positions);
    p.rows = iota_vec(t.size());
    return p;
  };
  auto run = [&](const std::vector<Piece>& pieces) {
    std::vector<SeqBatch> batch;
    for (const Piece& p : pieces) {
      ForwardBatch b;
      b.tokens = p.tokens;
      b.positions = p.positions;
      b.mask = p.mask;
      b.output_rows = p.rows;
      batch.push_back({p.kv, b});
    }
    const ForwardResult r = model.forward(batch, nullptr, &scratch);
    size_t n_out = 0;
    for (const Piece& p : pieces) n_out += p.rows.size();
    EXPECT_EQ(r.logits.size(), n_out * static_cast<size_t>(c.n_vocab));
    out.insert(out.end(), r.logits.begin(), r.logits.end());
  };
  auto a = [&] { return SeqKv{pool.get(), table_a, past_a}; };
  auto b = [&] { return SeqKv{pool.get(), table_b, past_b}; };
  auto cc = [&] {
    SeqKv s = cache_c.seq();
    s.n_past = past_c;
    return s;
  };

  run({chain(a(), 20), chain(b(), 9)});
  past_a += 20;
  past_b += 9;
  for (int i = 0; i < 24; ++i, ++past_a, ++past_b) run({chain(a(), 1), chain(b(), 1)});
  for (int i = 0; i < 14; ++i, ++past_a) run({chain(a(), 1)});
  for (int i = 0; i < 3; ++i) run({tree(b())});
  if (grow_scratch) grow_matmul_scratch();
  for (int i = 0; i < 5; ++i, ++past_a) run({chain(a(), 1)});
  {
    KvCache big = model.make_kv_cache(320, type);
    run({chain(big.seq(), 300)});
  }
  for (int i = 0; i < 6; ++i, ++past_a, ++past_b) run({chain(a(), 1), chain(b(), 1)});
  for (int i = 0; i < 2; ++i, ++past_a) run({chain(a(), 1), tree(b())});
  for (int i = 0; i < 4; ++i, ++past_a, ++past_c) run({chain(a(), 1), chain(cc(), 1)});
  for (int i = 0; i < 3; ++i) run({chain(a(), 5, true)});
  return out;
}

void check_graphs_bitwise(const std::string& path, bool q32_weights, const char* name) {
  std::vector<float> off, on;
  int64_t n_vocab = 1;
  const cuda::GraphStats s0 = cuda::graph_stats();
  {
    GraphsSwitch sw(false);
    auto model = load_gpu(path);
    n_vocab = model->config().n_vocab;
    off = graph_script(*model, KvType::kF16);
  }
  const cuda::GraphStats s1 = cuda::graph_stats();
  EXPECT_EQ(s1.captures, s0.captures) << name << ": graphs recorded while off";
  EXPECT_EQ(s1.replays, s0.replays) << name << ": graphs replayed while off";
  {
    GraphsSwitch sw(true);
    auto model = load_gpu(path);  // a fresh model: its buffers grow in the script as above
    on = graph_script(*model, KvType::kF16);
  }
  const cuda::GraphStats s2 = cuda::graph_stats();
  ASSERT_EQ(on.size(), off.size()) << name;
  const int64_t e = first_difference(on.data(), off.data(), static_cast<int64_t>(on.size()));
  EXPECT_EQ(e, -1) << name << ": logits with graphs differ from without, first at element " << e
                   << " (output row " << (e < 0 ? -1 : e / n_vocab) << ")";
  const int64_t captures = s2.captures - s1.captures, replays = s2.replays - s1.replays;
  const int64_t invalidated = s2.invalidated - s1.invalidated, failed = s2.failed - s1.failed;
  std::printf("%s graphs: %lld captures, %lld replays, %lld invalidated, %lld failed\n", name,
              static_cast<long long>(captures), static_cast<long long>(replays),
              static_cast<long long>(invalidated), static_cast<long long>(failed));
  EXPECT_EQ(failed, 0) << name;
  EXPECT_GE(captures, 6) << name;
  EXPECT_GE(replays, 40) << name;
  // The decode of A alone was recorded before the matmul scratch grew and must be dropped after.
  if (q32_weights && !cuda::matmul_legacy()) {
    EXPECT_GE(invalidated, 1) << name;
  }
}

TEST(CudaGraphs, SameLogitsWithAndWithoutStories260K) {
  SKIP_WITHOUT_GPU();
  check_graphs_bitwise(test::tiny_model("stories260K.gguf"), false, "stories260K");
}

TEST(CudaGraphs, SameLogitsWithAndWithoutSmolLM2) {
  SKIP_WITHOUT_GPU();
  if (!have_smollm2()) GTEST_SKIP() << "default model missing at " << test::default_model_path();
  check_graphs_bitwise(test::default_model_path(), true, "SmolLM2");
}

// The engine with graphs on (continuous batching: the pass shapes change every few steps):
// speculation none / ngram == each request's plain greedy output alone.
TEST(CudaGraphs, EngineEqualsSoloWithGraphs) {
  SKIP_WITHOUT_GPU();
  GraphsSwitch sw(true);
  const cuda::GraphStats s0 = cuda::graph_stats();
  auto model = load_gpu(test::tiny_model("stories260K.gguf"));
  check_engine(*model, nullptr, SpecMethod::kNone, 8, 24, "stories260K none, graphs");
  check_engine(*model, nullptr, SpecMethod::kNgram, 8, 24, "stories260K ngram, graphs");
  if (have_smollm2()) {
    auto smol = load_gpu(test::default_model_path());
    check_engine(*smol, nullptr, SpecMethod::kNone, 4, 24, "SmolLM2 none, graphs");
    check_engine(*smol, nullptr, SpecMethod::kNgram, 4, 24, "SmolLM2 ngram, graphs");
  }
  const cuda::GraphStats s1 = cuda::graph_stats();
  EXPECT_GT(s1.replays, s0.replays);
  EXPECT_EQ(s1.failed, s0.failed);
}

// ---- (h) fused kernels and stacked matrices ------------------------------------------------------
//
// The forward pass fuses the residual add with the next norm, rope of q and k with the K/V
// writes, and multiplies q|k|v and gate|up as stacked matrices (SPECDEC_CUDA_FUSE, default on;
// SPECDEC_CUDA_STACK limits the stacking, as files with mixed types get it). Every variant must
// give the bits of the separate ops (SPECDEC_CUDA_FUSE=0).

// Sets an environment variable for a scope (nullptr: unset).
class EnvSwitch {
 public:
  EnvSwitch(const char* name, const char* value) : name_(name) {
    const char* was = std::getenv(name);
    had_ = was != nullptr;
    if (had_) was_ = was;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~EnvSwitch() {
    if (had_) {
      setenv(name_, was_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  EnvSwitch(const EnvSwitch&) = delete;
  EnvSwitch& operator=(const EnvSwitch&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string was_;
};

std::unique_ptr<Model> load_gpu_with(const std::string& path, const char* fuse, const char* stack) {
  EnvSwitch f("SPECDEC_CUDA_FUSE", fuse);
  EnvSwitch st("SPECDEC_CUDA_STACK", stack);
  return load_gpu(path);
}

void check_fused_bitwise(const std::string& path, const char* name) {
  struct Variant {
    const char* fuse;
    const char* stack;
    const char* label;
  };
  const Variant variants[] = {{"1", nullptr, "fused, q|k|v and gate|up stacked"},
                              {"1", "2", "fused, q|k + v, gate|up"},
                              {"1", "1", "fused, nothing stacked"}};
  std::vector<float> ref;
  {
    GraphsSwitch sw(false);
    auto model = load_gpu_with(path, "0", nullptr);
    ref = graph_script(*model, KvType::kF16, false);
  }
  for (const Variant& v : variants) {
    for (bool graphs : {false, true}) {
      GraphsSwitch sw(graphs);
      auto model = load_gpu_with(path, v.fuse, v.stack);
      const std::vector<float> got = graph_script(*model, KvType::kF16, false);
      ASSERT_EQ(got.size(), ref.size()) << name << ": " << v.label;
      const int64_t e = first_difference(got.data(), ref.data(), static_cast<int64_t>(got.size()));
      EXPECT_EQ(e, -1) << name << ": " << v.label << (graphs ? ", graphs" : "")
                       << ": logits differ from the separate ops first at element " << e;
    }
  }
  // The F32 cache (the fused K/V write's other type), default variant.
  {
    GraphsSwitch sw(false);
    auto sep = load_gpu_with(path, "0", nullptr);
    auto fused = load_gpu_with(path, nullptr, nullptr);
    const std::vector<float> a = graph_script(*sep, KvType::kF32, false);
    const std::vector<float> b = graph_script(*fused, KvType::kF32, false);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(first_difference(a.data(), b.data(), static_cast<int64_t>(a.size())), -1)
        << name << ": F32 cache";
  }
  // Every dumped intermediate (the fused pass's dump path: rope_qkv, then kv_write), a prefill
  // then two decode steps.
  struct Dumped {
    std::string name;
    int layer;
    std::vector<float> data;
  };
  auto dumps_of = [&](Model& model, std::vector<float>* logits) {
    std::vector<Dumped> d;
    model.set_dump([&d](const char* nm, int layer, const float* data, int64_t rows, int64_t cols) {
      d.push_back({nm, layer, std::vector<float>(data, data + rows * cols)});
    });
    KvCache kv = model.make_kv_cache(32, KvType::kF16);
    for (const std::vector<int32_t>& toks :
         {std::vector<int32_t>{1, 5, 9, 13, 17, 21, 25}, std::vector<int32_t>{7},
          std::vector<int32_t>{8}}) {
      const std::vector<float> l = run_chain(model, kv, toks);
      logits->insert(logits->end(), l.begin(), l.end());
      kv.append(static_cast<int64_t>(toks.size()));
    }
    model.set_dump(nullptr);
    return d;
  };
  auto sep = load_gpu_with(path, "0", nullptr);
  auto fused = load_gpu_with(path, nullptr, nullptr);
  std::vector<float> la, lb;
  const std::vector<Dumped> da = dumps_of(*sep, &la);
  const std::vector<Dumped> db = dumps_of(*fused, &lb);
  ASSERT_EQ(da.size(), db.size()) << name << ": dump count";
  for (size_t i = 0; i < da.size(); ++i) {
    ASSERT_EQ(da[i].name, db[i].name) << name << ": dump " << i;
    ASSERT_EQ(da[i].layer, db[i].layer) << name << ": dump " << i;
    ASSERT_EQ(da[i].data.size(), db[i].data.size()) << name << ": " << da[i].name;
    EXPECT_EQ(first_difference(da[i].data.data(), db[i].data.data(),
                               static_cast<int64_t>(da[i].data.size())),
              -1)
        << name << ": dump " << da[i].name << " layer " << da[i].layer;
  }
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(first_difference(la.data(), lb.data(), static_cast<int64_t>(la.size())), -1)
      << name << ": logits with dumps";
}

TEST(CudaFusion, FusedEqualsSeparateOpsStories260K) {
  SKIP_WITHOUT_GPU();
  check_fused_bitwise(test::tiny_model("stories260K.gguf"), "stories260K");
}

TEST(CudaFusion, FusedEqualsSeparateOpsSmolLM2) {
  SKIP_WITHOUT_GPU();
  if (!have_smollm2()) GTEST_SKIP() << "default model missing at " << test::default_model_path();
  check_fused_bitwise(test::default_model_path(), "SmolLM2");
}

// ---- (i) qwen2 -----------------------------------------------------------------------------------

// A random qwen2-shaped file: GQA (4 heads, 2 KV heads, head_dim 32), NEOX RoPE (base 1e6), Q8_0
// matrices (every code value, sane scales: test::random_block), tied embeddings, f32 norms, and
// Q/K/V biases uniform in [-bias_scale, bias_scale) (qwen2's are large: its K bias reaches tens).
std::string write_random_qwen2(const std::string& name, float bias_scale) {
  constexpr uint64_t kDim = 128, kHeads = 4, kKvHeads = 2, kHeadDim = 32, kFfn = 256, kLayers = 2,
                     kVocab = 512;
  test::GgufWriter g;
  g.kv_str("general.architecture", "qwen2");
  g.kv_str("general.name", "random-qwen2");
  g.kv_u32("qwen2.embedding_length", kDim);
  g.kv_u32("qwen2.block_count", kLayers);
  g.kv_u32("qwen2.attention.head_count", kHeads);
  g.kv_u32("qwen2.attention.head_count_kv", kKvHeads);
  g.kv_u32("qwen2.feed_forward_length", kFfn);
  g.kv_u32("qwen2.context_length", 512);
  g.kv_u32("qwen2.vocab_size", kVocab);
  g.kv_f32("qwen2.rope.freq_base", 1000000.0f);
  g.kv_f32("qwen2.attention.layer_norm_rms_epsilon", 1e-6f);
  std::mt19937 rng(2024);
  auto q8 = [&](const std::string& t, uint64_t rows, uint64_t cols) {
    const uint64_t blocks = rows * cols / 32;
    std::vector<uint8_t> data(blocks * 34);
    for (uint64_t b = 0; b < blocks; ++b) test::random_block(GgmlType::kQ8_0, rng, &data[b * 34]);
    g.tensor(t, {cols, rows}, static_cast<uint32_t>(GgmlType::kQ8_0), data);
  };
  auto f32 = [&](const std::string& t, uint64_t n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    g.tensor_f32(t, {n}, v);
  };
  q8("token_embd.weight", kVocab, kDim);
  f32("output_norm.weight", kDim, 0.9f, 1.1f);
  for (uint64_t l = 0; l < kLayers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    f32(p + "attn_norm.weight", kDim, 0.9f, 1.1f);
    q8(p + "attn_q.weight", kHeads * kHeadDim, kDim);
    q8(p + "attn_k.weight", kKvHeads * kHeadDim, kDim);
    q8(p + "attn_v.weight", kKvHeads * kHeadDim, kDim);
    f32(p + "attn_q.bias", kHeads * kHeadDim, -bias_scale, bias_scale);
    f32(p + "attn_k.bias", kKvHeads * kHeadDim, -bias_scale, bias_scale);
    f32(p + "attn_v.bias", kKvHeads * kHeadDim, -bias_scale, bias_scale);
    q8(p + "attn_output.weight", kDim, kHeads * kHeadDim);
    f32(p + "ffn_norm.weight", kDim, 0.9f, 1.1f);
    q8(p + "ffn_gate.weight", kFfn, kDim);
    q8(p + "ffn_up.weight", kFfn, kDim);
    q8(p + "ffn_down.weight", kDim, kFfn);
  }
  return test::write_temp_file(name, g.finish());
}

TEST(CudaQwen2, RandomFileCpuVsGpu) {
  SKIP_WITHOUT_GPU();
  const std::string path = write_random_qwen2("random-qwen2.gguf", 2.0f);
  ASSERT_TRUE(Model::load(path)->config().qkv_bias);
  check_cpu_vs_gpu(path, 0.02f, "random qwen2");
}

TEST(CudaQwen2, BiasesChangeTheLogits) {
  SKIP_WITHOUT_GPU();
  // Two files with the same weights (the same random stream: the zero biases draw as many
  // numbers), one with biases: the GPU must follow the CPU on the biased file, far from the
  // unbiased model (a GPU that ignored the biases would land on the latter).
  const std::string with = write_random_qwen2("random-qwen2-b.gguf", 2.0f);
  const std::string without = write_random_qwen2("random-qwen2-z.gguf", 0.0f);
  auto gpu = load_gpu(with);
  auto cpu = Model::load(with);
  auto cpu0 = Model::load(without);
  const std::vector<int32_t> tokens = {5, 77, 300, 12, 9, 411, 23, 8};
  KvCache a = gpu->make_kv_cache(16, KvType::kF32);
  KvCache b = cpu->make_kv_cache(16, KvType::kF32);
  KvCache c = cpu0->make_kv_cache(16, KvType::kF32);
  const std::vector<float> lg = run_chain(*gpu, a, tokens);
  const std::vector<float> lc = run_chain(*cpu, b, tokens);
  const std::vector<float> l0 = run_chain(*cpu0, c, tokens);
  const float d_same = max_diff(lg.data(), lc.data(), lg.size());
  const float d_zero = max_diff(lg.data(), l0.data(), lg.size());
  std::printf("random qwen2: max |gpu - cpu| %.3g, max |gpu - cpu without biases| %.3g\n", d_same,
              d_zero);
  EXPECT_GT(d_zero, 10 * d_same);
}

TEST(CudaQwen2, FusedEqualsSeparateOpsAndGraphs) {
  SKIP_WITHOUT_GPU();
  const std::string path = write_random_qwen2("random-qwen2-f.gguf", 2.0f);
  check_fused_bitwise(path, "random qwen2");
  check_graphs_bitwise(path, true, "random qwen2");
}

}  // namespace
}  // namespace specdec
