#include "drafter/train/redrafter_init.h"

#include <cmath>
#include <numbers>

#include "drafter/train/redrafter_params.h"
#include "sample/rng.h"

namespace specdec {
namespace {

// Standard normal draws by Box-Muller from the generator's uniforms.
class NormalDraws {
 public:
  explicit NormalDraws(uint64_t seed) : rng_(seed) {}
  double next() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    double u1 = rng_.uniform();
    while (u1 <= 0.0) u1 = rng_.uniform();
    const double u2 = rng_.uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * std::numbers::pi * u2);
    have_spare_ = true;
    return r * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  Rng rng_;
  double spare_ = 0;
  bool have_spare_ = false;
};

void fill_normal(std::span<float> v, double std, NormalDraws& draws) {
  for (float& x : v) x = static_cast<float>(std * draws.next());
}

}  // namespace

void init_redrafter(ReDrafterWeights& w, uint64_t seed, const ReDrafterInitOptions& o,
                    const float* out_rows) {
  const ReDrafterShape& sh = w.shape;
  const int64_t dim = sh.dim, d = sh.width();
  NormalDraws draws(seed ^ 0x696e697468656164ull);  // "inithead"
  fill_normal(w.w_embed, o.scale / std::sqrt(static_cast<double>(dim)), draws);
  fill_normal(w.w_state, o.scale / std::sqrt(static_cast<double>(sh.state_dim)), draws);
  std::fill(w.b_state.begin(), w.b_state.end(), 0.0f);
  for (int l = 0; l < sh.n_blocks; ++l) {
    fill_normal(w.w_block[l], o.scale / std::sqrt(static_cast<double>(d)), draws);
    std::fill(w.b_block[l].begin(), w.b_block[l].end(), 0.0f);
  }
  if (out_rows) {
    for (int64_t v = 0; v < sh.n_draft_vocab; ++v) {
      float* row = w.w_out.data() + v * d;
      std::copy(out_rows + v * dim, out_rows + (v + 1) * dim, row);
      std::fill(row + dim, row + d, 0.0f);
    }
  } else {
    fill_normal(w.w_out, o.out_std >= 0 ? o.out_std : 1.0 / std::sqrt(static_cast<double>(d)),
                draws);
  }
}

}  // namespace specdec
