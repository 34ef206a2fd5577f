// Timing program for ReDrafter drafting against the target's passes on the default model: one
// beam search (M beams x C tokens) of a random head of the given shape, against one target pass
// over 1 token and one over the packed tree (M x C tokens at most), both after `--past` cached
// tokens. Rounds alternate the three, medians are printed with the ratios that decide whether a
// head shape can pay for itself: draft / 1-token pass and tree pass / 1-token pass. With
// --jobs J > 1 it also times J sequences' searches (different hidden states) one by one against
// the same J as one batch (ReDrafterBeamSearch::run_batch, as the engine runs them), each after
// a 1-token target pass that evicts the head from the caches. Not part of ctest.
//
// Build: cmake --build <build dir> --target bench_redrafter
// Run: <build dir>/bench_redrafter [--model PATH] [--state-dim S] [--blocks L] [--vocab V]
//        [--beams M] [--length C] [--type q8_0|q4_1|f16|f32] [--threads N] [--rounds R] [--past P]
//        [--jobs J]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "drafter/beam_search.h"
#include "drafter/beam_tree.h"
#include "drafter/redrafter_head.h"
#include "model/gguf.h"
#include "model/model.h"
#include "speculative/token_tree.h"
#include "util/paths.h"

using namespace specdec;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = default_model_path();
  int s = 256, blocks = 2, vocab = 4096, beams = 4, length = 4, threads = 2, rounds = 30;
  int past = 256, n_jobs = 1;
  std::string type = "q8_0";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--model") model_path = v;
    else if (a == "--state-dim") s = std::atoi(v);
    else if (a == "--blocks") blocks = std::atoi(v);
    else if (a == "--vocab") vocab = std::atoi(v);
    else if (a == "--beams") beams = std::atoi(v);
    else if (a == "--length") length = std::atoi(v);
    else if (a == "--type") type = v;
    else if (a == "--threads") threads = std::atoi(v);
    else if (a == "--rounds") rounds = std::atoi(v);
    else if (a == "--past") past = std::atoi(v);
    else if (a == "--jobs") n_jobs = std::atoi(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  std::unique_ptr<Model> model = Model::load(model_path);
  const ModelConfig& c = model->config();
  ReDrafterShape sh{c.dim, s, blocks, std::min(vocab, c.n_vocab), c.n_vocab};
  std::vector<int32_t> ids(sh.n_draft_vocab);
  for (int i = 0; i < sh.n_draft_vocab; ++i) ids[i] = i;
  ReDrafterWeights w = make_redrafter(sh, ids, model->fingerprint());
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (auto* v : {&w.w_embed, &w.w_state, &w.b_state, &w.w_out}) {
    for (float& x : *v) x = nd(rng);
  }
  for (int l = 0; l < blocks; ++l) {
    for (float& x : w.w_block[l]) x = nd(rng);
  }
  const GgmlType gt = type == "f32"    ? GgmlType::kF32
                      : type == "f16"  ? GgmlType::kF16
                      : type == "q4_1" ? GgmlType::kQ4_1
                                       : GgmlType::kQ8_0;
  ReDrafterHead head(w, gt);
  ThreadPool pool(threads);
  ReDrafterBeamSearch search(head, *model);
  std::vector<float> h(c.dim);
  for (float& x : h) x = nd(rng) * 20;

  KvCache kv = model->make_kv_cache(past + 128);
  std::vector<int32_t> prompt(past);
  for (int i = 0; i < past; ++i) prompt[i] = 1 + (i * 7919) % (c.n_vocab - 1);
  std::vector<int32_t> pos;
  for (int i = 0; i < past; ++i) pos.push_back(i);
  ForwardBatch pre;
  pre.tokens = prompt;
  pre.positions = pos;
  model->forward(kv, pre, &pool);

  Beams b;
  TokenTree tree;
  std::vector<double> t_draft, t_one, t_tree;
  std::vector<int32_t> positions, rows;
  std::vector<uint8_t> mask;
  int nodes = 0;
  for (int r = 0; r < rounds; ++r) {
    double t0 = now();
    search.run(h, 42, BeamSearchConfig{beams, length}, &b, &pool);
    tree.reset(42);
    pack_beams(b.tokens, b.n, b.length, beams * length, &tree);
    t_draft.push_back(now() - t0);
    nodes = tree.num_drafts();
    for (int pass = 0; pass < 2; ++pass) {
      TokenTree one;
      one.reset(42);
      const TokenTree& t = pass == 0 ? one : tree;
      t.build_positions(past, &positions);
      t.build_mask(&mask);
      rows.resize(t.size());
      for (int i = 0; i < t.size(); ++i) rows[i] = i;
      ForwardBatch fb;
      fb.tokens = t.tokens();
      fb.positions = positions;
      fb.mask = t.size() > 1 ? std::span<const uint8_t>(mask) : std::span<const uint8_t>();
      fb.output_rows = rows;
      fb.want_hidden = true;
      t0 = now();
      model->forward(kv, fb, &pool);
      (pass == 0 ? t_one : t_tree).push_back(now() - t0);
      kv.truncate(past);
    }
  }
  const double d = median(t_draft), one = median(t_one), tr = median(t_tree);
  std::printf("head: S %d, %d blocks, V_d %d, %s, %.2fM params, %.2f MB a step\n", s, blocks,
              sh.n_draft_vocab, type.c_str(), sh.num_params() / 1e6, head.weight_bytes() / 1e6);
  std::printf("beams %d x %d -> %d tree nodes; threads %d; past %d\n", beams, length, nodes, threads, past);
  std::printf("draft %.3f ms, 1-token pass %.3f ms, tree pass %.3f ms\n", d * 1e3, one * 1e3, tr * 1e3);
  std::printf("draft / pass %.3f, tree pass / pass %.3f\n", d / one, tr / one);
  if (n_jobs > 1) {
    std::vector<std::vector<float>> hs(static_cast<size_t>(n_jobs), h);
    for (auto& hj : hs) {
      for (float& x : hj) x = nd(rng) * 20;
    }
    std::vector<Beams> outs(static_cast<size_t>(n_jobs));
    std::vector<BeamJob> jobs;
    for (int j = 0; j < n_jobs; ++j) {
      jobs.push_back(BeamJob{hs[static_cast<size_t>(j)], 42 + j, BeamSearchConfig{beams, length},
                             &outs[static_cast<size_t>(j)]});
    }
    auto evict = [&] {  // a 1-token target pass, as between two drafting steps
      TokenTree one;
      one.reset(42);
      one.build_positions(past, &positions);
      ForwardBatch fb;
      fb.tokens = one.tokens();
      fb.positions = positions;
      const int32_t row0 = 0;
      fb.output_rows = {&row0, 1};
      model->forward(kv, fb, &pool);
      kv.truncate(past);
    };
    std::vector<double> t_each, t_batch;
    for (int r = 0; r < rounds; ++r) {
      evict();
      double t0 = now();
      for (const BeamJob& j : jobs) search.run(j.h, j.root, j.config, j.out, &pool);
      t_each.push_back(now() - t0);
      evict();
      t0 = now();
      search.run_batch(jobs, &pool);
      t_batch.push_back(now() - t0);
    }
    const double e = median(t_each), b = median(t_batch);
    std::printf("%d searches: one by one %.3f ms, one batch %.3f ms (%.2fx)\n", n_jobs, e * 1e3,
                b * 1e3, e / b);
  }
  return 0;
}
