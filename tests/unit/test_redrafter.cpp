// ReDrafter inference pieces against references: the safetensors round trip and its errors, the
// head file, one batched head step (F32: equal to the scalar reference; Q8_0: close), beam
// search against a plain reference search over redrafter_step_ref, and beam-to-tree packing
// against a brute-force prefix enumeration on random beams (node count, parents, depths, mask,
// each beam recovered from its end node, the node budget).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "common/test_paths.h"
#include "drafter/beam_search.h"
#include "drafter/beam_tree.h"
#include "drafter/head_matrix.h"
#include "drafter/redrafter_head.h"
#include "drafter/redrafter_proposer.h"
#include "drafter/redrafter_weights.h"
#include "drafter/safetensors.h"
#include "model/gguf.h"
#include "model/model.h"
#include "util/check.h"

namespace specdec {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("specdec_" + std::to_string(getpid()) + "_" + name))
      .string();
}

// A head with random weights of the given shape over the first vd ids of a vocabulary of nv.
ReDrafterWeights random_head(int dim, int s, int blocks, int vd, int nv, uint64_t seed,
                             float scale = 0.3f) {
  // (scale: the spread of the matrices; small scales give flat, uncertain heads.)
  ReDrafterShape sh{dim, s, blocks, vd, nv};
  std::vector<int32_t> vocab(vd);
  std::mt19937_64 rng(seed);
  // Distinct ids spread over the vocabulary.
  std::vector<int32_t> all(nv);
  for (int i = 0; i < nv; ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng);
  std::copy_n(all.begin(), vd, vocab.begin());
  ReDrafterWeights w = make_redrafter(sh, vocab, "test:fingerprint");
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& v, float sd) {
    for (float& x : v) x = nd(rng) * sd;
  };
  fill(w.w_embed, scale / std::sqrt(static_cast<float>(dim)) * 4);
  fill(w.w_state, scale / std::sqrt(static_cast<float>(s)) * 4);
  fill(w.b_state, 0.1f);
  for (int l = 0; l < blocks; ++l) {
    fill(w.w_block[l], scale / std::sqrt(static_cast<float>(sh.width())) * 4);
    fill(w.b_block[l], 0.1f);
  }
  fill(w.w_out, 1.0f / std::sqrt(static_cast<float>(sh.width())) * 4);
  return w;
}

TEST(Safetensors, RoundTripKeepsEveryTensorAndTheMetadata) {
  StFile f;
  f.metadata = {{"a", "1"}, {"kind", "test"}};
  const std::vector<float> x = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 7.0f};
  const std::vector<int32_t> ids = {5, 1, 9};
  f.tensors.push_back(st_from_f32("x32", {2, 3}, x, StDtype::kF32));
  f.tensors.push_back(st_from_f32("x16", {6}, x, StDtype::kF16));
  f.tensors.push_back(st_from_f32("xbf", {3, 2}, x, StDtype::kBF16));
  f.tensors.push_back(st_from_i32("ids", {3}, ids));
  const std::string path = temp_path("rt.safetensors");
  write_safetensors(path, f);
  const StFile g = read_safetensors(path);
  EXPECT_EQ(g.metadata, f.metadata);
  ASSERT_EQ(g.tensors.size(), 4u);
  EXPECT_EQ(g.find("x32")->to_f32(), x);
  EXPECT_EQ(g.find("x32")->shape, (std::vector<int64_t>{2, 3}));
  const std::vector<float> h = g.find("x16")->to_f32();
  const std::vector<float> b = g.find("xbf")->to_f32();
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(h[i], x[i], std::fabs(x[i]) * 1e-3 + 1e-6);
    EXPECT_NEAR(b[i], x[i], std::fabs(x[i]) * 1e-2 + 1e-6);
  }
  EXPECT_EQ(g.find("ids")->to_i32(), ids);
  EXPECT_THROW(g.find("ids")->to_f32(), Error);
  const int64_t want[] = {3, 2};
  EXPECT_THROW(g.require(path, "x32", want), Error);
  EXPECT_THROW(g.require(path, "nope", want), Error);
  std::filesystem::remove(path);
}

TEST(Safetensors, MalformedFilesAreClearErrors) {
  StFile f;
  f.tensors.push_back(st_from_f32("w", {4, 4}, std::vector<float>(16, 1.0f)));
  const std::string path = temp_path("bad.safetensors");
  write_safetensors(path, f);
  std::string bytes = test::read_file(path);
  auto write = [&](const std::string& content) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
  };
  // Truncated data.
  write(bytes.substr(0, bytes.size() - 5));
  EXPECT_THROW(read_safetensors(path), Error);
  // Header length past the end.
  std::string big = bytes;
  big[6] = 1;
  write(big);
  EXPECT_THROW(read_safetensors(path), Error);
  // Not JSON.
  std::string nj = bytes;
  nj[8] = '[';
  nj[9] = '[';
  write(nj);
  EXPECT_THROW(read_safetensors(path), Error);
  // Too short.
  write("abc");
  EXPECT_THROW(read_safetensors(path), Error);
  EXPECT_THROW(read_safetensors(temp_path("missing.safetensors")), Error);
  // Two tensors on the same bytes.
  const std::string hdr =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  std::string ov(8, '\0');
  uint64_t n = hdr.size();
  for (int i = 0; i < 8; ++i, n >>= 8) ov[i] = static_cast<char>(n & 0xff);
  write(ov + hdr + std::string(12, '\0'));
  EXPECT_THROW(read_safetensors(path), Error);
  std::filesystem::remove(path);
}

TEST(ReDrafterWeights, HeadFileRoundTripAndChecks) {
  ReDrafterWeights w = random_head(64, 32, 2, 40, 512, 7);
  w.info["train.steps"] = "12";
  const std::string path = temp_path("head.safetensors");
  save_redrafter(path, w);
  const ReDrafterWeights r = load_redrafter(path);
  EXPECT_EQ(r.shape.dim, 64);
  EXPECT_EQ(r.shape.state_dim, 32);
  EXPECT_EQ(r.shape.n_blocks, 2);
  EXPECT_EQ(r.shape.n_draft_vocab, 40);
  EXPECT_EQ(r.draft_vocab, w.draft_vocab);
  EXPECT_EQ(r.w_out, w.w_out);
  EXPECT_EQ(r.w_block[1], w.w_block[1]);
  EXPECT_EQ(r.target_fingerprint, "test:fingerprint");
  EXPECT_EQ(r.info.at("train.steps"), "12");
  // A repeated vocabulary id is refused.
  ReDrafterWeights bad = w;
  bad.draft_vocab[3] = bad.draft_vocab[4];
  save_redrafter(path, bad);
  EXPECT_THROW(load_redrafter(path), Error);
  // A head for another model is refused by name.
  std::unique_ptr<Model> tiny = Model::load(test::tiny_model("stories260K.gguf"));
  try {
    check_redrafter_target(w, *tiny, path);
    FAIL() << "no error for a head of another model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another model"), std::string::npos) << e.what();
  }
  ReDrafterWeights ok = w;
  ok.target_fingerprint = tiny->fingerprint();
  EXPECT_NO_THROW(check_redrafter_target(ok, *tiny, path));
  std::filesystem::remove(path);
}

// A head file whose metadata claims sizes its tensors do not have is a specdec::Error naming
// the tensor, raised before anything of the claimed size is allocated (2^24 x 2^24 floats: a
// bad_alloc before; a claimed 2^24 blocks filled all the memory of the machine).
TEST(ReDrafterWeights, MetadataThatLiesIsAnErrorBeforeAllocating) {
  const std::string path = temp_path("lying_head.safetensors");
  save_redrafter(path, random_head(64, 32, 2, 40, 512, 8));
  const StFile good = read_safetensors(path);
  // (Both dims at once: without the check the first matrix alone is 2^48 floats, refused at
  // once, so a regression fails here without touching the memory.)
  using Meta = std::map<std::string, std::string>;
  for (const Meta& lie : {Meta{{"specdec.state_dim", "16777216"}, {"specdec.dim", "16777216"}},
                          Meta{{"specdec.n_blocks", "3"}}}) {
    StFile f = good;
    for (const auto& [key, value] : lie) f.metadata[key] = value;
    write_safetensors(path, f);
    const std::string what = lie.begin()->first + " = " + lie.begin()->second;
    try {
      load_redrafter(path);
      ADD_FAILURE() << what << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": not a specdec::Error: " << e.what();
    }
  }
  std::filesystem::remove(path);
}

// m: [rows, cols] floats replaced by their values after rounding to `type` (quantize_rows, then
// the matmul's own dequantization).
void round_to(GgmlType type, std::vector<float>* m, int64_t rows, int64_t cols) {
  const std::vector<uint8_t> q = quantize_rows(type, m->data(), rows, cols);
  WeightMatrix wm;
  wm.type = type;
  wm.data = q.data();
  wm.rows = rows;
  wm.cols = cols;
  wm.row_bytes = ggml_row_bytes(type, cols);
  for (int64_t r = 0; r < rows; ++r) dequantize_row(wm, r, m->data() + r * cols);
}

TEST(HeadMatrix, Q4_1RowsReconstructWithinHalfAStep) {
  // Blocks of 32: random, constant, and a block with one outlier.
  const int64_t cols = 96;
  std::vector<float> x(2 * cols);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.3f, 2.0f);
  for (float& v : x) v = nd(rng);
  for (int64_t j = 32; j < 64; ++j) x[j] = -1.25f;
  x[cols + 70] = 40.0f;
  std::vector<float> r = x;
  round_to(GgmlType::kQ4_1, &r, 2, cols);
  for (int64_t b = 0; b < 2 * cols / 32; ++b) {
    const auto [lo, hi] = std::minmax_element(x.begin() + b * 32, x.begin() + (b + 1) * 32);
    // Half a code step, plus the f16 rounding of the stored scale (15 steps) and min.
    const float step = (*hi - *lo) / 15.0f;
    const float tol = 0.5f * step + 15.0f * step / 1024.0f + std::fabs(*lo) / 1024.0f + 1e-6f;
    for (int64_t j = b * 32; j < (b + 1) * 32; ++j) {
      EXPECT_NEAR(r[j], x[j], tol) << "block " << b << " element " << j;
    }
  }
  // A constant block comes back exactly; the codes use all 16 levels where the values spread.
  for (int64_t j = 32; j < 64; ++j) EXPECT_EQ(r[j], -1.25f);
  std::set<float> levels(r.begin(), r.begin() + 32);
  EXPECT_GE(levels.size(), 12u);
  // A head with a width that is not a multiple of 32 stays F32 instead.
  EXPECT_EQ(head_weight_type(GgmlType::kQ4_1, {64, 40}), GgmlType::kF32);
  EXPECT_EQ(head_weight_type(GgmlType::kQ4_1, {64, 96}), GgmlType::kQ4_1);
}

TEST(ReDrafterHead, BatchedStepEqualsTheReference) {
  const int dim = 64, s = 32, vd = 50;
  const ReDrafterWeights w = random_head(dim, s, 2, vd, 512, 11);
  // Q4_1's weights are compared with the reference on the same rounded weights (the head's
  // other error is its 8-bit activations, as Q8_0's); the other types with the float weights.
  ReDrafterWeights w4 = w;
  round_to(GgmlType::kQ4_1, &w4.w_embed, s, dim);
  round_to(GgmlType::kQ4_1, &w4.w_state, s, s);
  for (auto& b : w4.w_block) round_to(GgmlType::kQ4_1, &b, dim + s, dim + s);
  round_to(GgmlType::kQ4_1, &w4.w_out, vd, dim + s);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  const int n = 5;
  std::vector<float> h(dim), in(n * (dim + s));
  for (float& x : h) x = nd(rng);
  for (float& x : in) x = nd(rng);
  std::vector<float> s_ref(n * s), l_ref(n * vd), s_ref4(n * s), l_ref4(n * vd);
  for (int r = 0; r < n; ++r) {
    redrafter_step_ref(w, h.data(), in.data() + r * (dim + s), in.data() + r * (dim + s) + dim,
                       s_ref.data() + r * s, l_ref.data() + r * vd);
    redrafter_step_ref(w4, h.data(), in.data() + r * (dim + s), in.data() + r * (dim + s) + dim,
                       s_ref4.data() + r * s, l_ref4.data() + r * vd);
  }
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_1}) {
    ReDrafterHead head(w, type);
    if (type == GgmlType::kQ4_1) {
      s_ref = s_ref4;
      l_ref = l_ref4;
    }
    EXPECT_EQ(head.weight_type(), type);
    ReDrafterScratch scratch;
    std::vector<float> s_out(n * s), logits(n * vd);
    head.step(h, in.data(), n, s_out.data(), logits.data(), &scratch, nullptr);
    // Relative to the largest logit: F16 weights round to 11 bits, Q8_0 weights and activations
    // to 8 (Q4_1: activations to 8, weights as the reference's).
    double scale = 1.0;
    for (float x : l_ref) scale = std::max(scale, std::fabs(double(x)));
    const double tol =
        (type == GgmlType::kF32 ? 1e-5 : type == GgmlType::kF16 ? 2e-3 : 3e-2) * scale;
    double worst = 0;
    for (int i = 0; i < n * vd; ++i) worst = std::max(worst, std::fabs(double(logits[i]) - l_ref[i]));
    for (int i = 0; i < n * s; ++i) worst = std::max(worst, std::fabs(double(s_out[i]) - s_ref[i]));
    EXPECT_LT(worst, tol) << ggml_type_name(static_cast<uint32_t>(type));
    std::printf("%s: worst difference %.4f, largest logit %.2f\n",
                ggml_type_name(static_cast<uint32_t>(type)).c_str(), worst, scale);
    // Each row is independent of the others in the batch.
    std::vector<float> s1(s), l1(vd);
    head.step(h, in.data() + 3 * (dim + s), 1, s1.data(), l1.data(), &scratch, nullptr);
    for (int i = 0; i < vd; ++i) ASSERT_EQ(l1[i], logits[3 * vd + i]) << ggml_type_name(static_cast<uint32_t>(type));
  }
}

// A plain beam search over the scalar reference: every (beam, token) candidate scored in double,
// the M best kept (ties: lower beam, then lower index).
void reference_beams(const ReDrafterWeights& w, const Model& target, const std::vector<float>& h,
                     int32_t root, int m, int len, std::vector<std::vector<int32_t>>* beams,
                     std::vector<double>* scores) {
  const int dim = w.shape.dim, s = w.shape.state_dim, vd = w.shape.n_draft_vocab;
  struct B {
    std::vector<int32_t> toks;  // draft indices
    std::vector<float> state;
    double score;
    int32_t last;
  };
  std::vector<B> live = {{{}, std::vector<float>(s, 0.0f), 0.0, root}};
  for (int k = 0; k < len; ++k) {
    struct C {
      double score;
      int row, v;
      std::vector<float> st;
    };
    std::vector<C> cands;
    for (int r = 0; r < static_cast<int>(live.size()); ++r) {
      std::vector<float> e(dim), so(s), lg(vd);
      target.embed_tokens({&live[r].last, 1}, e.data());
      redrafter_step_ref(w, h.data(), e.data(), live[r].state.data(), so.data(), lg.data());
      double mx = -1e30, sum = 0;
      for (float x : lg) mx = std::max<double>(mx, x);
      for (float x : lg) sum += std::exp(x - mx);
      for (int v = 0; v < vd; ++v) cands.push_back({live[r].score + lg[v] - mx - std::log(sum), r, v, so});
    }
    std::stable_sort(cands.begin(), cands.end(), [](const C& a, const C& b) { return a.score > b.score; });
    std::vector<B> next;
    for (int i = 0; i < std::min<int>(m, cands.size()); ++i) {
      B b = live[cands[i].row];
      b.toks.push_back(cands[i].v);
      b.state = cands[i].st;
      b.score = cands[i].score;
      b.last = w.draft_vocab[cands[i].v];
      next.push_back(b);
    }
    live = next;
  }
  beams->clear();
  scores->clear();
  for (const B& b : live) {
    std::vector<int32_t> ids;
    for (int32_t v : b.toks) ids.push_back(w.draft_vocab[v]);
    beams->push_back(ids);
    scores->push_back(b.score);
  }
}

// A head on a device this build lacks (or no such device) is a clear error; the head itself
// stays on the CPU.
TEST(ReDrafterHead, DeviceThisBuildLacksIsAnError) {
  const ReDrafterWeights w = random_head(64, 32, 1, 50, 512, 2);
  ReDrafterHead head(w);
  EXPECT_STREQ(head.device_name(), "cpu");
  EXPECT_THROW(make_redrafter_head_device(w, head.weight_type(), "tpu"), Error);
#ifndef SPECDEC_CUDA
  EXPECT_THROW(make_redrafter_head_device(w, head.weight_type(), "cuda"), Error);
#endif
  EXPECT_STREQ(head.device_name(), "cpu");
}

TEST(ReDrafterBeamSearch, MatchesAReferenceSearch) {
  std::unique_ptr<Model> tiny = Model::load(test::tiny_model("stories260K.gguf"));
  const int dim = tiny->config().dim;
  for (uint64_t seed : {1, 2, 3, 4, 5}) {
    const ReDrafterWeights w = random_head(dim, 32, 2, 30, tiny->config().n_vocab, seed);
    ReDrafterHead head(w, GgmlType::kF32);
    ReDrafterBeamSearch search(head, *tiny);
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    std::vector<float> h(dim);
    for (float& x : h) x = nd(rng);
    for (auto [m, len] : {std::pair{1, 4}, std::pair{3, 3}, std::pair{5, 4}, std::pair{4, 1}}) {
      Beams got;
      search.run(h, 17, BeamSearchConfig{m, len}, &got, nullptr);
      std::vector<std::vector<int32_t>> want;
      std::vector<double> want_scores;
      reference_beams(w, *tiny, h, 17, m, len, &want, &want_scores);
      ASSERT_EQ(got.n, static_cast<int>(want.size()));
      for (int b = 0; b < got.n; ++b) {
        const std::vector<int32_t> toks(got.tokens.begin() + b * len, got.tokens.begin() + (b + 1) * len);
        EXPECT_EQ(toks, want[b]) << "seed " << seed << " M " << m << " C " << len << " beam " << b;
        EXPECT_NEAR(got.scores[b], want_scores[b], 1e-3);
        if (b > 0) {
          EXPECT_LE(got.scores[b], got.scores[b - 1]);
        }
      }
    }
  }
}

// The searches of several sequences as one batch (different hidden states, roots and shapes,
// one of them empty) give each exactly the beams it gets alone; the head's rows with a hidden
// state each equal the rows of separate steps, bit for bit. Q4_1 and F32 heads.
TEST(ReDrafterBeamSearch, ABatchOfSearchesEqualsEachAlone) {
  std::unique_ptr<Model> tiny = Model::load(test::tiny_model("stories260K.gguf"));
  const int dim = tiny->config().dim;
  const ReDrafterWeights w = random_head(dim, 32, 2, 64, tiny->config().n_vocab, 9);
  for (GgmlType type : {GgmlType::kF32, GgmlType::kQ4_1}) {
    ReDrafterHead head(w, type);
    ThreadPool pool(2);
    std::mt19937 rng(4);
    std::normal_distribution<float> nd;
    const std::vector<BeamSearchConfig> shapes = {{2, 2}, {4, 3}, {1, 4}, {3, 0}, {5, 1}};
    std::vector<std::vector<float>> hs(shapes.size(), std::vector<float>(dim));
    for (auto& h : hs) {
      for (float& x : h) x = nd(rng);
    }
    std::vector<Beams> alone(shapes.size()), batched(shapes.size());
    ReDrafterBeamSearch one(head, *tiny), many(head, *tiny);
    std::vector<BeamJob> jobs;
    for (size_t j = 0; j < shapes.size(); ++j) {
      const int32_t root = static_cast<int32_t>(11 + 13 * j);
      one.run(hs[j], root, shapes[j], &alone[j], &pool);
      jobs.push_back(BeamJob{hs[j], root, shapes[j], &batched[j]});
    }
    many.run_batch(jobs, &pool);
    for (size_t j = 0; j < shapes.size(); ++j) {
      EXPECT_EQ(batched[j].n, alone[j].n) << j;
      EXPECT_EQ(batched[j].length, alone[j].length) << j;
      EXPECT_EQ(batched[j].tokens, alone[j].tokens) << j;
      EXPECT_EQ(batched[j].scores, alone[j].scores) << j;
      EXPECT_EQ(batched[j].prefix_scores, alone[j].prefix_scores) << j;
    }
    EXPECT_EQ(batched[3].n, 0);  // a search of length 0 drafts nothing
    EXPECT_GT(batched[1].n, 1);

    // step_rows: three rows, each its own h, against three single steps.
    const int s = w.shape.state_dim, vd = w.shape.n_draft_vocab;
    std::vector<float> in(3 * (dim + s));
    for (float& x : in) x = nd(rng);
    const float* rows[3] = {hs[0].data(), hs[2].data(), hs[0].data()};
    std::vector<float> s3(3 * s), l3(3 * vd), s1(s), l1(vd);
    ReDrafterScratch scratch;
    head.step_rows(rows, in.data(), 3, s3.data(), l3.data(), &scratch, &pool);
    for (int r = 0; r < 3; ++r) {
      head.step({rows[r], static_cast<size_t>(dim)}, in.data() + r * (dim + s), 1, s1.data(),
                l1.data(), &scratch, &pool);
      EXPECT_EQ(std::vector<float>(s3.begin() + r * s, s3.begin() + (r + 1) * s), s1) << r;
      EXPECT_EQ(std::vector<float>(l3.begin() + r * vd, l3.begin() + (r + 1) * vd), l1) << r;
    }
  }
}

TEST(BeamTree, PackingMatchesABruteForcePrefixTree) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 500; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 6);
    const int len = 1 + static_cast<int>(rng() % 5);
    const int alphabet = 2 + static_cast<int>(rng() % 3);  // small: prefixes collide often
    std::vector<int32_t> beams(n * len);
    for (int32_t& t : beams) t = 100 + static_cast<int32_t>(rng() % alphabet);
    const int budget = trial % 3 == 0 ? static_cast<int>(rng() % (n * len + 1)) : n * len;
    TokenTree tree;
    tree.reset(7);
    std::vector<int32_t> ends;
    const int added = pack_beams(beams, n, len, budget, &tree, &ends);
    ASSERT_EQ(added, tree.num_drafts());
    ASSERT_LE(added, budget);
    // Brute force: the distinct prefixes in the order beams introduce them, cut at the budget.
    std::vector<std::vector<int32_t>> prefixes;
    std::set<std::vector<int32_t>> seen;
    bool full = false;
    for (int b = 0; b < n && !full; ++b) {
      for (int k = 1; k <= len; ++k) {
        std::vector<int32_t> p(beams.begin() + b * len, beams.begin() + b * len + k);
        if (seen.count(p)) continue;
        if (static_cast<int>(prefixes.size()) == budget) {
          full = true;
          break;
        }
        seen.insert(p);
        prefixes.push_back(p);
      }
    }
    ASSERT_EQ(tree.num_drafts(), static_cast<int>(prefixes.size())) << "trial " << trial;
    // Node i+1 is prefix i: its token, depth, parent (the node of the prefix one shorter).
    std::map<std::vector<int32_t>, int> node_of;
    node_of[{}] = 0;
    for (size_t i = 0; i < prefixes.size(); ++i) {
      const int node = static_cast<int>(i) + 1;
      const std::vector<int32_t>& p = prefixes[i];
      node_of[p] = node;
      EXPECT_EQ(tree.token(node), p.back());
      EXPECT_EQ(tree.depth(node), static_cast<int>(p.size()));
      EXPECT_EQ(tree.parent(node), node_of.at(std::vector<int32_t>(p.begin(), p.end() - 1)));
    }
    // Mask: node i sees node j iff prefix j is a prefix of prefix i.
    std::vector<uint8_t> mask;
    tree.build_mask(&mask);
    const int sz = tree.size();
    for (int i = 1; i < sz; ++i) {
      for (int j = 1; j < sz; ++j) {
        const auto& pi = prefixes[i - 1];
        const auto& pj = prefixes[j - 1];
        const bool anc = pj.size() <= pi.size() && std::equal(pj.begin(), pj.end(), pi.begin());
        EXPECT_EQ(mask[i * sz + j] != 0, anc);
      }
      EXPECT_EQ(mask[i * sz + 0], 1);
    }
    // Unpacking: each beam's end node's path is the beam's longest prefix in the tree.
    for (int b = 0; b < n; ++b) {
      std::vector<int32_t> path;
      tree.path_to(ends[b], &path);
      std::vector<int32_t> toks;
      for (int32_t node : path) toks.push_back(tree.token(node));
      int k = 0;
      while (k < len && seen.count(std::vector<int32_t>(beams.begin() + b * len, beams.begin() + b * len + k + 1))) ++k;
      EXPECT_EQ(toks, std::vector<int32_t>(beams.begin() + b * len, beams.begin() + b * len + k));
    }
  }
}

// The tiny target, a random head over its 30 likeliest tokens and a random hidden state [dim]:
// what the proposer tests below draft from.
struct TinyHeadSetup {
  std::unique_ptr<Model> tiny;
  std::unique_ptr<ReDrafterHead> head;
  std::vector<float> h;
};

TinyHeadSetup tiny_head_setup(uint32_t seed) {
  TinyHeadSetup s;
  s.tiny = Model::load(test::tiny_model("stories260K.gguf"));
  const int dim = s.tiny->config().dim;
  ReDrafterWeights w = random_head(dim, 32, 2, 30, s.tiny->config().n_vocab, 4, 0.1f);
  w.target_fingerprint = s.tiny->fingerprint();
  s.head = std::make_unique<ReDrafterHead>(w, GgmlType::kF32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  s.h.resize(static_cast<size_t>(dim));
  for (float& x : s.h) x = nd(rng);
  return s;
}

TEST(ReDrafterProposer, PruningKeepsNodesWorthTheirCostAndPausesWhenNoneIs) {
  const TinyHeadSetup s = tiny_head_setup(2);
  const Model* tiny = s.tiny.get();
  const ReDrafterHead& head = *s.head;
  const std::vector<float>& h = s.h;
  const std::vector<int32_t> toks = {1, 17};
  auto draft = [&](ReDrafterProposer& p, double cost, double cost_scale = 1.0) {
    TokenTree t;
    t.reset(17);
    DraftRequest req;
    req.tokens = toks;
    req.max_tokens = 12;
    req.target_hidden = h;
    req.node_cost = cost;
    req.cost_scale = cost_scale;
    p.propose(req, &t);
    return t;
  };
  // Free nodes: the whole packed tree, as without pruning.
  ReDrafterPolicy off;
  off.prune = false;
  ReDrafterProposer all(head, *tiny, nullptr, BeamSearchConfig{3, 4}, off);
  ReDrafterProposer cheap(head, *tiny, nullptr, BeamSearchConfig{3, 4});
  const TokenTree full = draft(all, 0.08);
  const TokenTree kept = draft(cheap, 1e-12);
  ASSERT_GT(full.num_drafts(), 4);
  EXPECT_EQ(std::vector<int32_t>(kept.tokens().begin(), kept.tokens().end()),
            std::vector<int32_t>(full.tokens().begin(), full.tokens().end()));
  // A moderate cost keeps a prefix-closed part of it, nodes whose parents are kept.
  ReDrafterProposer mid(head, *tiny, nullptr, BeamSearchConfig{3, 4});
  const TokenTree some = draft(mid, 0.02);
  EXPECT_LE(some.num_drafts(), full.num_drafts());
  for (int i = 1; i < some.size(); ++i) EXPECT_LT(some.parent(i), i);
  // Nodes never worth it: three empty steps, a pause of 4 steps, then a probe of one node.
  ReDrafterProposer dear(head, *tiny, nullptr, BeamSearchConfig{3, 4});
  for (int step = 0; step < 7; ++step) EXPECT_EQ(draft(dear, 100.0).num_drafts(), 0) << step;
  const TokenTree probe = draft(dear, 100.0);
  EXPECT_EQ(probe.num_drafts(), 1);
  EXPECT_EQ(probe.token(1), full.token(1));  // the best node
  // A search that does not pay for itself (expected tokens below its cost) counts as empty
  // though it kept nodes: made dear by a batch's cost_scale, three such searches and drafting
  // pauses; with the search free (scale 0) the same nodes pay and it drafts on.
  auto scaled = [&](ReDrafterProposer& p, double scale) { return draft(p, 1e-12, scale).num_drafts(); };
  ReDrafterProposer batched(head, *tiny, nullptr, BeamSearchConfig{3, 4});
  ReDrafterProposer free_search(head, *tiny, nullptr, BeamSearchConfig{3, 4});
  ASSERT_GT(batched.draft_cost(), 0.0);
  for (int step = 0; step < 3; ++step) EXPECT_GT(scaled(batched, 1e6), 0) << step;
  EXPECT_EQ(scaled(batched, 1e6), 0);
  for (int step = 0; step < 6; ++step) EXPECT_GT(scaled(free_search, 0.0), 0) << step;
}

// Prompt lookup in the head's tree: the continuation of the recent suffix's earlier occurrence
// enters the tree as far as its running acceptance pays, grows to the whole continuation while
// its drafts are accepted and leaves the tree when they are not; without it (lookup_max 0) the
// tree holds no such chain.
TEST(ReDrafterProposer, PromptLookupJoinsTheTreeByItsRunningAcceptance) {
  const TinyHeadSetup s = tiny_head_setup(3);
  const Model* tiny = s.tiny.get();
  const ReDrafterHead& head = *s.head;
  const std::vector<float>& h = s.h;
  // The suffix (40, 41) occurred at index 1: its continuation is 42 43 44 45 40 41.
  const std::vector<int32_t> toks = {1, 40, 41, 42, 43, 44, 45, 40, 41};
  const std::vector<int32_t> continuation = {42, 43, 44, 45, 40, 41};
  auto draft = [&](ReDrafterProposer& p) {
    TokenTree t;
    t.reset(toks.back());
    DraftRequest req;
    req.tokens = toks;
    req.max_tokens = 12;
    req.target_hidden = h;
    req.node_cost = 0.03;
    p.propose(req, &t);
    return t;
  };
  // The continuation's nodes in the tree, from the root down.
  auto chain = [&](const TokenTree& t) {
    std::vector<int32_t> got;
    int node = 0;
    for (int32_t want : continuation) {
      const int next = t.child(node, want);
      if (next < 0) break;
      got.push_back(want);
      node = next;
    }
    return got;
  };
  ReDrafterPolicy no_lookup;
  no_lookup.lookup_max = 0;
  ReDrafterProposer plain(head, *tiny, nullptr, BeamSearchConfig{2, 2}, no_lookup);
  plain.begin(toks, 0);
  EXPECT_TRUE(chain(draft(plain)).empty());

  ReDrafterProposer p(head, *tiny, nullptr, BeamSearchConfig{2, 2});
  p.begin(toks, 0);
  // The prior 0.4 per depth against a node cost of 0.03: depths 1 to 3 pay, 4 (0.026) does not.
  EXPECT_EQ(chain(draft(p)).size(), 3u);
  // Every draft accepted: the whole continuation.
  for (int step = 0; step < 20; ++step) {
    const std::vector<int32_t> got = chain(draft(p));
    p.observe(got, 7);
  }
  EXPECT_EQ(chain(draft(p)), continuation);
  // Every draft rejected: the chain leaves the tree.
  for (int step = 0; step < 60; ++step) {
    draft(p);
    p.observe({}, 7);
  }
  EXPECT_TRUE(chain(draft(p)).empty());
}

}  // namespace
}  // namespace specdec
