// Dispatch of the element-wise ops on active_isa(), and the attention driver shared by every
// variant: it splits the work over the pool, turns the mask into runs of visible KV slots and
// keeps the scratch; the per-ISA tables (OpsKernels) supply the inner loops.
#include <cstdint>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/thread_pool.h"
#include "util/check.h"

namespace specdec {
namespace {

const OpsKernels& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return ops_kernels_avx512();
    case Isa::kAvx2:
      return ops_kernels_avx2();
    case Isa::kScalar:
      break;
  }
  return ops_kernels_ref();
}

// For the explicit-variant entry points: running an unsupported variant would be SIGILL.
const OpsKernels& checked_kernels_for(Isa isa) {
  SPECDEC_CHECK(isa_supported(isa), "ops: requested ISA variant is not supported here");
  return kernels_for(isa);
}

// Per-thread scratch of the attention driver. It grows to the largest call seen and is kept,
// so steady-state calls do not allocate (pool workers live as long as the pool).
struct AttentionScratch {
  std::vector<float> scores;  // [n_q, n_visible]
  std::vector<int64_t> runs;  // [n_runs, 2]: first KV slot, number of slots
};

AttentionScratch& attention_scratch() {
  thread_local AttentionScratch scratch;
  return scratch;
}

// Collects the KV slots query `i` sees as runs of consecutive slots into `runs`
// ({first, count} pairs) and returns the number of visible slots.
int64_t visible_runs(const AttentionShape& s, const uint8_t* mask, int64_t i,
                     std::vector<int64_t>* runs) {
  runs->clear();
  if (mask == nullptr) {
    runs->push_back(0);
    runs->push_back(s.n_past + i + 1);
    return s.n_past + i + 1;
  }
  if (s.n_past > 0) {
    runs->push_back(0);
    runs->push_back(s.n_past);
  }
  int64_t n_visible = s.n_past;
  const uint8_t* row = mask + i * s.n_new;  // [n_new]
  int64_t j = 0;
  while (j < s.n_new) {
    if (row[j] == 0) {
      ++j;
      continue;
    }
    const int64_t first = j;
    while (j < s.n_new && row[j] != 0) ++j;
    const int64_t slot = s.n_past + first;
    // A run that continues the previous one (the cached prefix) is merged into it.
    if (!runs->empty() && (*runs)[runs->size() - 2] + runs->back() == slot) {
      runs->back() += j - first;
    } else {
      runs->push_back(slot);
      runs->push_back(j - first);
    }
    n_visible += j - first;
  }
  return n_visible;
}

// One task: query token `i`, query heads [h_begin, h_end), all reading KV head `kv_head`.
// Two-pass softmax: scores of every visible slot, exp(score - max), then Σ p·v scaled by 1/Σp.
void attention_task(const OpsKernels& kern, const AttentionShape& s, const float* q, const float* k,
                    const float* v, const uint8_t* mask, float* out, int64_t i, int kv_head,
                    int h_begin, int h_end) {
  AttentionScratch& scratch = attention_scratch();
  const int n_q = h_end - h_begin;
  const int64_t head_dim = s.head_dim;
  const int64_t q_offset = (i * s.n_heads + h_begin) * head_dim;
  const float* q_i = q + q_offset;  // [n_q, head_dim]
  float* out_i = out + q_offset;    // [n_q, head_dim]
  for (int64_t d = 0; d < n_q * head_dim; ++d) out_i[d] = 0.0f;

  const int64_t n_visible = visible_runs(s, mask, i, &scratch.runs);
  if (n_visible == 0) return;  // nothing to attend to: the output stays zero
  if (scratch.scores.size() < static_cast<size_t>(n_q * n_visible)) {
    scratch.scores.resize(static_cast<size_t>(n_q * n_visible));
  }
  float* scores = scratch.scores.data();  // [n_q, n_visible]
  const int64_t kv_stride = static_cast<int64_t>(s.n_kv_heads) * head_dim;
  const float* k_head = k + kv_head * head_dim;  // row j at k_head + j * kv_stride
  const float* v_head = v + kv_head * head_dim;  // row j at v_head + j * kv_stride
  const std::vector<int64_t>& runs = scratch.runs;

  int64_t column = 0;
  for (size_t r = 0; r < runs.size(); r += 2) {
    kern.attn_scores(q_i, n_q, k_head + runs[r] * kv_stride, kv_stride, runs[r + 1], s.head_dim,
                     s.scale, scores + column, n_visible);
    column += runs[r + 1];
  }
  float inv_sums[64];  // [n_q]; n_q <= 64 is checked by the caller
  for (int r = 0; r < n_q; ++r) {
    inv_sums[r] = 1.0f / kern.exp_shifted_sum(scores + r * n_visible, n_visible);
  }
  column = 0;
  for (size_t r = 0; r < runs.size(); r += 2) {
    kern.attn_accumulate(scores + column, n_visible, n_q, v_head + runs[r] * kv_stride, kv_stride,
                         runs[r + 1], s.head_dim, out_i);
    column += runs[r + 1];
  }
  for (int r = 0; r < n_q; ++r) kern.scale(out_i + r * head_dim, head_dim, inv_sums[r]);
}

constexpr int kMaxHeadsPerTask = 64;

void attention_with(const OpsKernels& kern, const AttentionShape& s, const float* q, const float* k,
                    const float* v, const uint8_t* mask, float* out, ThreadPool* pool) {
  SPECDEC_CHECK(s.n_past >= 0 && s.n_new >= 0, "attention: negative token count");
  if (s.n_new == 0) return;
  SPECDEC_CHECK(s.n_heads > 0 && s.n_kv_heads > 0 && s.head_dim > 0,
                "attention: heads and head_dim must be positive");
  SPECDEC_CHECK(s.n_heads % s.n_kv_heads == 0,
                "attention: n_heads must be a multiple of n_kv_heads");
  const int group = s.n_heads / s.n_kv_heads;  // query heads per KV head
  const int n_threads = pool == nullptr ? 1 : pool->size();
  // Query heads that share a KV head go in one task, so each K/V row is read once for all of
  // them; when that gives too few tasks to keep the threads busy, the group is split.
  const int64_t base_tasks = s.n_new * s.n_kv_heads;
  int n_split = (group + kMaxHeadsPerTask - 1) / kMaxHeadsPerTask;
  if (base_tasks < 2 * n_threads) {
    const int64_t want = (2 * n_threads + base_tasks - 1) / base_tasks;
    if (want > n_split) n_split = static_cast<int>(want < group ? want : group);
  }
  const int64_t n_tasks = base_tasks * n_split;
  auto body = [&](int thread_index, int num_threads) {
    // Strided assignment: under a causal mask later queries see more slots, so contiguous
    // chunks would leave the first threads idle.
    for (int64_t t = thread_index; t < n_tasks; t += num_threads) {
      const int split = static_cast<int>(t % n_split);
      const int kv_head = static_cast<int>(t / n_split % s.n_kv_heads);
      const int64_t i = t / n_split / s.n_kv_heads;
      const int h_begin = kv_head * group + group * split / n_split;
      const int h_end = kv_head * group + group * (split + 1) / n_split;
      attention_task(kern, s, q, k, v, mask, out, i, kv_head, h_begin, h_end);
    }
  };
  if (pool == nullptr || n_threads == 1 || n_tasks == 1) {
    body(0, 1);
  } else {
    pool->run([&body](int thread_index, int num_threads) { body(thread_index, num_threads); });
  }
}

}  // namespace

void rmsnorm_isa(Isa isa, const float* x, const float* weight, float eps, int64_t n_rows,
                 int64_t dim, float* y) {
  checked_kernels_for(isa).rmsnorm(x, weight, eps, n_rows, dim, y);
}

void swiglu_isa(Isa isa, const float* gate, const float* up, int64_t n, float* out) {
  checked_kernels_for(isa).swiglu(gate, up, n, out);
}

void softmax_isa(Isa isa, float* x, int64_t n) {
  SPECDEC_CHECK(n >= 1, "softmax: empty input");
  const OpsKernels& kern = checked_kernels_for(isa);
  kern.scale(x, n, 1.0f / kern.exp_shifted_sum(x, n));
}

void attention_isa(Isa isa, const AttentionShape& s, const float* q, const float* k, const float* v,
                   const uint8_t* mask, float* out, ThreadPool* pool) {
  attention_with(checked_kernels_for(isa), s, q, k, v, mask, out, pool);
}

void rmsnorm(const float* x, const float* weight, float eps, int64_t n_rows, int64_t dim,
             float* y) {
  kernels_for(active_isa()).rmsnorm(x, weight, eps, n_rows, dim, y);
}

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  kernels_for(active_isa()).swiglu(gate, up, n, out);
}

void softmax(float* x, int64_t n) {
  SPECDEC_CHECK(n >= 1, "softmax: empty input");
  const OpsKernels& kern = kernels_for(active_isa());
  kern.scale(x, n, 1.0f / kern.exp_shifted_sum(x, n));
}

void attention(const AttentionShape& s, const float* q, const float* k, const float* v,
               const uint8_t* mask, float* out, ThreadPool* pool) {
  attention_with(kernels_for(active_isa()), s, q, k, v, mask, out, pool);
}

}  // namespace specdec
