// Training throughput of a ReDrafter head (positions per second: forward + backward + clipping +
// AdamW of one minibatch) at a given shape, on random data.
//   bench_redrafter_train [threads=2] [batch=256] [dim=576] [state=256] [vocab=4096] [blocks=2]
//                         [steps=4]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/thread_pool.h"
#include "drafter/train/adamw.h"
#include "drafter/train/redrafter_grad.h"
#include "drafter/train/redrafter_init.h"
#include "drafter/train/redrafter_params.h"

using namespace specdec;

int main(int argc, char** argv) {
  auto arg = [&](int i, int def) { return argc > i ? std::atoi(argv[i]) : def; };
  const int threads = arg(1, 2), B = arg(2, 256), dim = arg(3, 576), S = arg(4, 256),
            V = arg(5, 4096), L = arg(6, 2), C = arg(7, 4);
  const int n_target = 49152;
  std::vector<int32_t> ids(V);
  for (int v = 0; v < V; ++v) ids[v] = v * 11 % n_target;
  ReDrafterWeights w = make_redrafter({dim, S, L, V, n_target}, ids, "bench");
  init_redrafter(w, 1, {});
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> emb(static_cast<size_t>(n_target) * dim);
  for (float& x : emb) x = 0.05f * normal(gen);
  ReDrafterBatch batch;
  batch.n = B;
  batch.steps = C;
  batch.hidden.resize(static_cast<size_t>(B) * dim);
  for (float& x : batch.hidden) x = normal(gen);
  batch.inputs.resize(static_cast<size_t>(B) * C);
  batch.targets.resize(static_cast<size_t>(B) * C);
  for (int r = 0; r < B * C; ++r) {
    batch.inputs[r] = static_cast<int32_t>(gen() % n_target);
    batch.targets[r] = static_cast<int32_t>(gen() % V);
  }
  ThreadPool pool(threads);
  ReDrafterGradient pass;
  ReDrafterWeights grad = zeros_like(w);
  AdamWState adam = make_adamw_state(w);
  const ReDrafterShape& sh = w.shape;
  const double D = sh.width();
  // multiply-adds per position (see redrafter_grad.cpp): forward, then backward
  const double fwd = C * (double(S) * dim + double(S) * S + double(S) * D + (L - 1) * D * D +
                          double(V) * D) +
                     double(dim) * D;
  const double bwd = C * (2.0 * double(V) * D + 2.0 * (L - 1) * D * D + 2.0 * S * D +
                          double(S) * dim + 2.0 * S * S) +
                     double(dim) * D;
  double best = 1e30, best_fb = 1e30;
  for (int rep = 0; rep < (std::getenv("REPS") ? std::atoi(std::getenv("REPS")) : 6); ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    pass.run(w, emb, batch, &grad, &pool);
    const auto t1 = std::chrono::steady_clock::now();
    const double norm = global_grad_norm(grad, &pool);
    adamw_update(w, grad, adam, 1e-4, {}, &pool, clip_scale(norm, 1.0));
    const auto t2 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t2 - t0).count());
    best_fb = std::min(best_fb, std::chrono::duration<double>(t1 - t0).count());
  }
  std::printf("%s, %d threads: B %d C %d dim %d S %d V %d blocks %d (%.2fM parameters)\n",
              isa_name(active_isa()), threads, B, C, dim, S, V, L, sh.num_params() / 1e6);
  std::printf("update %.1f ms (forward+backward %.1f ms): %.0f positions/s, %.1f GFLOP/s in "
              "the matrix products' share\n",
              best * 1e3, best_fb * 1e3, B / best, 2.0 * (fwd + bwd) * B / best_fb * 1e-9);
  return 0;
}
