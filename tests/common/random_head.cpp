#include "common/random_head.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "engine/generator.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace specdec::test {

std::vector<int32_t> frequent_tokens(Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                     int n) {
  std::map<int32_t, int> count;
  Generator gen(model, nullptr, model.config().n_ctx_train);
  for (const std::vector<int32_t>& p : prompts) {
    GenerationConfig g;
    g.max_new_tokens = 96;
    for (int32_t t : gen.generate(p, g, nullptr, nullptr)) ++count[t];
  }
  std::vector<std::pair<int, int32_t>> order;
  for (const auto& [t, c] : count) order.push_back({-c, t});
  std::sort(order.begin(), order.end());
  std::vector<int32_t> out;
  for (size_t i = 0; i < order.size() && static_cast<int>(out.size()) < n; ++i) {
    out.push_back(order[i].second);
  }
  return out;
}

std::vector<int32_t> story_tokens(Model& model, int n) {
  auto tok = Tokenizer::from_gguf(model.file());
  std::vector<std::vector<int32_t>> prompts;
  for (const char* t : {"Once upon a time", "Lily and Ben went to the park.", "Tom had a red ball."}) {
    prompts.push_back(tok->encode(t, true, false));
  }
  return frequent_tokens(model, prompts, n);
}

ReDrafterWeights random_head(const Model& target, std::vector<int32_t> vocab, int state_dim,
                             int n_blocks, uint64_t seed, float prior_step) {
  ReDrafterShape sh;
  sh.dim = target.config().dim;
  sh.state_dim = state_dim;
  sh.n_blocks = n_blocks;
  sh.n_draft_vocab = static_cast<int>(vocab.size());
  sh.n_target_vocab = target.config().n_vocab;
  ReDrafterWeights w = make_redrafter(sh, std::move(vocab), target.fingerprint());
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& v, float sd) {
    for (float& x : v) x = nd(rng) * sd;
  };
  const float d = static_cast<float>(sh.width());
  fill(w.w_embed, 0.5f / std::sqrt(static_cast<float>(sh.dim)));
  fill(w.w_state, 0.5f / std::sqrt(static_cast<float>(state_dim)));
  for (float& b : w.b_state) b = 1.0f;
  for (int l = 0; l < n_blocks; ++l) {
    fill(w.w_block[l], 0.3f / std::sqrt(d));
    fill(w.b_block[l], 0.05f);
  }
  fill(w.w_out, 1.0f / std::sqrt(d));
  // The prior: rank r of the vocabulary gets about -prior_step r from the state's columns.
  const float s_mean = 1.0f / (1.0f + std::exp(-1.0f));  // SiLU(1)
  for (int v = 0; v < sh.n_draft_vocab; ++v) {
    for (int j = 0; j < state_dim; ++j) {
      w.w_out[static_cast<size_t>(v) * sh.width() + sh.dim + j] +=
          -prior_step * static_cast<float>(v) / (s_mean * static_cast<float>(state_dim));
    }
  }
  return w;
}

MedusaWeights random_medusa(const Model& target, std::vector<int32_t> vocab, int n_heads,
                            uint64_t seed, float prior_step) {
  MedusaShape sh;
  sh.dim = target.config().dim;
  sh.n_heads = n_heads;
  sh.n_draft_vocab = static_cast<int>(vocab.size());
  sh.n_target_vocab = target.config().n_vocab;
  MedusaWeights w = make_medusa(sh, std::move(vocab), target.fingerprint());
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float dim = static_cast<float>(sh.dim);
  constexpr float kBias = 4.0f;  // SiLU(4) ~ 3.93 in every component of x_k
  const float s_mean = kBias / (1.0f + std::exp(-kBias));
  for (int k = 0; k < n_heads; ++k) {
    for (float& x : w.w_res[k]) x = nd(rng) * 0.3f / std::sqrt(dim);
    for (float& x : w.b_res[k]) x = kBias;
    for (float& x : w.w_out[k]) x = nd(rng) * 1.0f / std::sqrt(dim);
    for (int v = 0; v < sh.n_draft_vocab; ++v) {
      for (int j = 0; j < sh.dim; ++j) {
        w.w_out[k][static_cast<size_t>(v) * sh.dim + j] +=
            -prior_step * static_cast<float>(v) / (s_mean * dim);
      }
    }
  }
  return w;
}

}  // namespace specdec::test
