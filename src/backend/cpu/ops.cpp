// Dispatch of the element-wise ops on active_isa(), and the attention driver shared by every
// variant: it blocks the queries, turns the mask into runs of visible KV slots, splits the work
// over the pool and keeps the scratch; the per-ISA tables (OpsKernels) supply the inner loops.
//
// Attention, per block of query tokens (all n_new when they are few):
//   - The slots every token of the block sees - the cached prefix [0, n_past) and the leading
//     new tokens all of them see - are scored once for the whole block, in tiles of slots that
//     cover every KV head (contiguous K rows): each K row is dotted with all the block's query
//     vectors of its head. A token's other visible slots (its mask runs) are scored per token.
//     A query vector's scores form one row in visible-list order.
//   - The softmax and Σ p·v run over fixed chunks of kChunk visible-list positions: chunk c of a
//     row holds positions [c·kChunk, (c+1)·kChunk). exp(score - row max) and its sum, and Σ p·v
//     (each V row read once for all the block's vectors of its head), are computed per chunk
//     from zero; the chunks are then added in order, c = 0, 1, .., and scaled by 1/Σ.
// Threads: with several blocks per thread each block is one task. Otherwise the threads share a
// block: each scores a contiguous range of slots and then takes the chunks of that range (so it
// reads its own slice of K and V, contiguous), and after a barrier each adds up a share of the
// rows.
//
// Invariance: a query vector's output depends only on q and the contents of its ordered list of
// visible slots. Each score is one dot product whose instruction sequence does not depend on the
// rest of the kernel call (OpsKernels::attn_scores); the row max is exact in any order; chunk
// boundaries are positions in the vector's own visible list, and each chunk's exp-sum and Σ p·v
// are computed by the same kernel calls on the same values, in slot order, whichever block,
// task, thread or run split the chunk falls in (OpsKernels::attn_accumulate adds slot by slot
// into each output element, so splitting a chunk into tiles and runs changes nothing); the chunk
// results are added in the same order. A token decoded alone (n_new = 1) therefore gets the same
// bits as the same token in a speculative batch or tree.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
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

// Visible-list positions per softmax / accumulation chunk. Part of the numerics: every call
// must use the same value (it is what makes the result independent of how work is split).
constexpr int64_t kChunk = 64;
// Slots per tile of the shared prefix: a tile's K or V rows of every head (24 KiB for 3 KV heads
// of 64) stay in L1 while all the block's query vectors use them.
constexpr int64_t kTileSlots = 64;
// Query vectors (tokens x query heads) per block: bounds the scratch; 28 tokens of 9 heads, 8 of
// 32 heads.
constexpr int64_t kBlockRows = 256;
// Blocks per thread from which each block is a task of its own; below it threads share blocks.
constexpr int64_t kTasksPerThread = 4;

// Which KV slots each new token sees, for the whole call. Built by the calling thread and only
// read while the pool runs.
struct AttentionPlan {
  int64_t tokens_per_block = 0;
  int64_t n_blocks = 0;
  std::vector<int64_t> n_shared;   // [n_blocks] slots [0, n_shared) seen by the whole block
  std::vector<int64_t> ld;         // [n_blocks] longest visible list: stride of score rows
  std::vector<int64_t> n_visible;  // [n_new] visible slots of each token
  std::vector<int64_t> runs;       // [n_runs, 2] {first slot, count} past the block's n_shared
  std::vector<int64_t> runs_end;   // [n_new] token i's pairs end at runs[runs_end[i]]
};

// Threads of one pool job wait here for each other; one slot per barrier of the call.
struct alignas(64) BarrierSlot {
  std::atomic<int> arrived{0};
  std::atomic<int> open{0};
};

// Buffers of a block shared by all threads of the job; the calling thread's, kept across calls.
struct SharedBlockBuffers {
  AttentionPlan plan;
  std::vector<float> scores;       // [n_rows, ld]
  std::vector<float> partial_max;  // [n_threads, n_rows] row max over each thread's columns
  std::vector<float> chunk_sums;   // [n_chunks, n_rows] Σ exp of each chunk
  std::vector<float> chunk_acc;    // [n_chunks, n_rows, head_dim] Σ p·v of each chunk
  std::unique_ptr<BarrierSlot[]> barriers;  // [n_barriers]
  int64_t n_barriers = 0;
};

// Per-thread scratch (a block processed by one thread uses only these).
struct AttentionScratch {
  std::vector<float> q;        // [n_rows, head_dim] the block's query vectors, by KV head
  std::vector<float> scores;   // [n_rows, ld] scores, then exp(score - max), visible order
  std::vector<float> row_max;  // [n_rows]
  std::vector<float> sums;     // [2, n_rows] Σ exp so far, and of the current chunk
  std::vector<float> acc;      // [2, n_rows, head_dim] Σ p·v so far, and of the current chunk
};

// Both grow to the largest call seen and are kept, so steady-state calls do not allocate
// (pool workers live as long as the pool).
SharedBlockBuffers& shared_block_buffers() {
  thread_local SharedBlockBuffers buffers;
  return buffers;
}

AttentionScratch& attention_scratch() {
  thread_local AttentionScratch scratch;
  return scratch;
}

template <class T>
T* grow(std::vector<T>* v, int64_t n) {
  if (v->size() < static_cast<size_t>(n)) v->resize(static_cast<size_t>(n));
  return v->data();
}

// Number of leading new tokens (0, 1, .. without a gap) that new token `i` sees.
int64_t leading_visible(const AttentionShape& s, const uint8_t* mask, int64_t i) {
  if (mask == nullptr) return i + 1;
  const uint8_t* row = mask + i * s.n_new;  // [n_new]
  int64_t j = 0;
  while (j < s.n_new && row[j] != 0) ++j;
  return j;
}

// Appends to `runs` the slots of new tokens j >= first that new token `i` sees, as runs of
// consecutive slots ({first slot, count} pairs), and returns how many slots they hold.
int64_t visible_runs_from(const AttentionShape& s, const uint8_t* mask, int64_t i, int64_t first,
                          std::vector<int64_t>* runs) {
  if (mask == nullptr) {
    if (i + 1 <= first) return 0;
    runs->push_back(s.n_past + first);
    runs->push_back(i + 1 - first);
    return i + 1 - first;
  }
  const uint8_t* row = mask + i * s.n_new;  // [n_new]
  int64_t n_visible = 0;
  int64_t j = first;
  while (j < s.n_new) {
    if (row[j] == 0) {
      ++j;
      continue;
    }
    const int64_t run_first = j;
    while (j < s.n_new && row[j] != 0) ++j;
    runs->push_back(s.n_past + run_first);
    runs->push_back(j - run_first);
    n_visible += j - run_first;
  }
  return n_visible;
}

void make_plan(const AttentionShape& s, const uint8_t* mask, AttentionPlan* plan) {
  plan->tokens_per_block = std::max<int64_t>(1, kBlockRows / s.n_heads);
  plan->n_blocks = (s.n_new + plan->tokens_per_block - 1) / plan->tokens_per_block;
  plan->n_shared.resize(static_cast<size_t>(plan->n_blocks));
  plan->ld.resize(static_cast<size_t>(plan->n_blocks));
  plan->n_visible.resize(static_cast<size_t>(s.n_new));
  plan->runs_end.resize(static_cast<size_t>(s.n_new));
  plan->runs.clear();
  for (int64_t b = 0; b < plan->n_blocks; ++b) {
    const int64_t token_begin = b * plan->tokens_per_block;
    const int64_t token_end = std::min(s.n_new, token_begin + plan->tokens_per_block);
    int64_t n_lead = s.n_new;
    for (int64_t i = token_begin; i < token_end; ++i) {
      n_lead = std::min(n_lead, leading_visible(s, mask, i));
    }
    plan->n_shared[b] = s.n_past + n_lead;
    int64_t ld = 1;
    for (int64_t i = token_begin; i < token_end; ++i) {
      plan->n_visible[i] = plan->n_shared[b] + visible_runs_from(s, mask, i, n_lead, &plan->runs);
      plan->runs_end[i] = static_cast<int64_t>(plan->runs.size());
      ld = std::max(ld, plan->n_visible[i]);
    }
    plan->ld[b] = ld;
  }
}

// One attention call: the inputs and its plan.
struct AttentionCall {
  const OpsKernels& kern;
  const AttentionShape& s;
  const float* q;  // [n_new, n_heads, head_dim]
  const float* k;  // [n_past + n_new, n_kv_heads, head_dim]
  const float* v;  // [n_past + n_new, n_kv_heads, head_dim]
  float* out;      // [n_new, n_heads, head_dim]
  const AttentionPlan& plan;
  int group;          // query heads per KV head
  int64_t kv_stride;  // floats per K/V row (slot)
};

// A block's geometry. Its rows (query vectors) are ordered (KV head h, token t, head g of the
// group): row h * rows_per_head + t * group + g.
struct Block {
  int64_t token_begin = 0;
  int64_t n_tokens = 0;
  int64_t n_shared = 0;
  int64_t ld = 0;
  int64_t rows_per_head = 0;  // n_tokens * group
  int64_t n_rows = 0;         // n_tokens * n_heads
  int64_t n_chunks = 0;       // chunks of the longest visible list
};

Block block_at(const AttentionCall& c, int64_t b) {
  Block blk;
  blk.token_begin = b * c.plan.tokens_per_block;
  blk.n_tokens = std::min(c.s.n_new - blk.token_begin, c.plan.tokens_per_block);
  blk.n_shared = c.plan.n_shared[b];
  blk.ld = c.plan.ld[b];
  blk.rows_per_head = blk.n_tokens * c.group;
  blk.n_rows = blk.n_tokens * c.s.n_heads;
  blk.n_chunks = (blk.ld + kChunk - 1) / kChunk;
  return blk;
}

// First row of token t (of the block) under KV head h; its group's rows follow.
int64_t token_row(const AttentionCall& c, const Block& blk, int h, int64_t t) {
  return h * blk.rows_per_head + t * c.group;
}

int64_t row_token(const AttentionCall& c, const Block& blk, int64_t r) {
  return blk.token_begin + r % blk.rows_per_head / c.group;
}

// Token i's runs past n_shared: pairs [runs_begin(i), runs_end[i]) of plan.runs.
int64_t runs_begin(const AttentionCall& c, int64_t i) {
  return i == 0 ? 0 : c.plan.runs_end[i - 1];
}

// Offset of row r's vector in q and out.
int64_t row_offset(const AttentionCall& c, const Block& blk, int64_t r) {
  const int64_t h = r / blk.rows_per_head;
  const int64_t t = r % blk.rows_per_head / c.group;
  const int64_t g = r % c.group;
  return ((blk.token_begin + t) * c.s.n_heads + h * c.group + g) * c.s.head_dim;
}

void gather_q(const AttentionCall& c, const Block& blk, float* qs) {
  for (int64_t r = 0; r < blk.n_rows; ++r) {
    std::copy_n(c.q + row_offset(c, blk, r), c.s.head_dim, qs + r * c.s.head_dim);
  }
}

// Scores of the shared slots [j_begin, j_end) for every row of the block.
void score_shared(const AttentionCall& c, const Block& blk, const float* qs, int64_t j_begin,
                  int64_t j_end, float* scores) {
  const int64_t hd = c.s.head_dim;
  for (int64_t j = j_begin; j < j_end; j += kTileSlots) {
    const int64_t n = std::min(kTileSlots, j_end - j);
    for (int h = 0; h < c.s.n_kv_heads; ++h) {
      const int64_t r0 = h * blk.rows_per_head;
      c.kern.attn_scores(qs + r0 * hd, static_cast<int>(blk.rows_per_head),
                         c.k + j * c.kv_stride + h * hd, c.kv_stride, n, c.s.head_dim, c.s.scale,
                         scores + r0 * blk.ld + j, blk.ld);
    }
  }
}

// Scores of token t's own runs, at columns n_shared.. of its rows.
void score_rest(const AttentionCall& c, const Block& blk, const float* qs, int64_t t,
                float* scores) {
  const int64_t hd = c.s.head_dim;
  const int64_t i = blk.token_begin + t;
  for (int h = 0; h < c.s.n_kv_heads; ++h) {
    const int64_t r0 = token_row(c, blk, h, t);
    int64_t column = blk.n_shared;
    for (int64_t p = runs_begin(c, i); p < c.plan.runs_end[i]; p += 2) {
      const int64_t slot = c.plan.runs[p];
      const int64_t count = c.plan.runs[p + 1];
      c.kern.attn_scores(qs + r0 * hd, c.group, c.k + slot * c.kv_stride + h * hd, c.kv_stride,
                         count, c.s.head_dim, c.s.scale, scores + r0 * blk.ld + column, blk.ld);
      column += count;
    }
  }
}

// Chunk `chunk` of every row that reaches it: exp(score - row_max) in place, Σ into sums[r].
void chunk_exp(const AttentionCall& c, const Block& blk, int64_t chunk, const float* row_max,
               float* scores, float* sums) {
  const int64_t begin = chunk * kChunk;
  for (int64_t r = 0; r < blk.n_rows; ++r) {
    const int64_t n_visible = c.plan.n_visible[row_token(c, blk, r)];
    if (begin >= n_visible) continue;
    sums[r] = c.kern.exp_shifted_sum(scores + r * blk.ld + begin,
                                     std::min(kChunk, n_visible - begin), row_max[r]);
  }
}

// acc = Σ p·v over chunk `chunk` of every row (zero for rows that do not reach it):
// acc: [n_rows, head_dim].
void chunk_accumulate(const AttentionCall& c, const Block& blk, int64_t chunk, const float* scores,
                      float* acc) {
  const int64_t hd = c.s.head_dim;
  const int64_t begin = chunk * kChunk;
  const int64_t end = begin + kChunk;
  std::fill_n(acc, blk.n_rows * hd, 0.0f);
  const int64_t shared_end = std::min(end, blk.n_shared);
  for (int64_t j = begin; j < shared_end; j += kTileSlots) {
    const int64_t n = std::min(kTileSlots, shared_end - j);
    for (int h = 0; h < c.s.n_kv_heads; ++h) {
      const int64_t r0 = h * blk.rows_per_head;
      c.kern.attn_accumulate(scores + r0 * blk.ld + j, blk.ld, static_cast<int>(blk.rows_per_head),
                             c.v + j * c.kv_stride + h * hd, c.kv_stride, n, c.s.head_dim,
                             acc + r0 * hd);
    }
  }
  if (end <= blk.n_shared) return;
  // Each token's runs: visible positions n_shared, n_shared + 1, .. in run order.
  for (int64_t t = 0; t < blk.n_tokens; ++t) {
    const int64_t i = blk.token_begin + t;
    int64_t position = blk.n_shared;
    for (int64_t p = runs_begin(c, i); p < c.plan.runs_end[i] && position < end; p += 2) {
      const int64_t count = c.plan.runs[p + 1];
      const int64_t lo = std::max(position, begin);
      const int64_t hi = std::min(position + count, end);
      if (lo < hi) {
        const int64_t slot = c.plan.runs[p] + (lo - position);
        for (int h = 0; h < c.s.n_kv_heads; ++h) {
          const int64_t r0 = token_row(c, blk, h, t);
          c.kern.attn_accumulate(scores + r0 * blk.ld + lo, blk.ld, c.group,
                                 c.v + slot * c.kv_stride + h * hd, c.kv_stride, hi - lo,
                                 c.s.head_dim, acc + r0 * hd);
        }
      }
      position += count;
    }
  }
}

// out row r = acc_r / sum_r (zeros for a row that sees nothing); acc_r is scaled in place.
void write_row(const AttentionCall& c, const Block& blk, int64_t r, float* acc_r, float sum) {
  float* out_r = c.out + row_offset(c, blk, r);  // [head_dim]
  if (c.plan.n_visible[row_token(c, blk, r)] == 0) {
    std::fill_n(out_r, c.s.head_dim, 0.0f);
    return;
  }
  c.kern.scale(acc_r, c.s.head_dim, 1.0f / sum);
  std::copy_n(acc_r, c.s.head_dim, out_r);
}

// A whole block on one thread: the chunks are added as they are done.
void attention_block(const AttentionCall& c, int64_t b) {
  AttentionScratch& scratch = attention_scratch();
  const Block blk = block_at(c, b);
  const int64_t hd = c.s.head_dim;
  float* qs = grow(&scratch.q, blk.n_rows * hd);               // [n_rows, head_dim]
  float* scores = grow(&scratch.scores, blk.n_rows * blk.ld);  // [n_rows, ld]
  float* row_max = grow(&scratch.row_max, blk.n_rows);         // [n_rows]
  float* sums = grow(&scratch.sums, 2 * blk.n_rows);           // [2, n_rows]
  float* acc = grow(&scratch.acc, 2 * blk.n_rows * hd);        // [2, n_rows, head_dim]
  float* chunk_sums = sums + blk.n_rows;                       // [n_rows]
  float* chunk_acc = acc + blk.n_rows * hd;                    // [n_rows, head_dim]
  gather_q(c, blk, qs);
  score_shared(c, blk, qs, 0, blk.n_shared, scores);
  for (int64_t t = 0; t < blk.n_tokens; ++t) score_rest(c, blk, qs, t, scores);
  for (int64_t r = 0; r < blk.n_rows; ++r) {
    const int64_t n_visible = c.plan.n_visible[row_token(c, blk, r)];
    if (n_visible > 0) row_max[r] = c.kern.row_max(scores + r * blk.ld, n_visible);
  }
  for (int64_t chunk = 0; chunk < blk.n_chunks; ++chunk) {
    chunk_exp(c, blk, chunk, row_max, scores, chunk == 0 ? sums : chunk_sums);
    chunk_accumulate(c, blk, chunk, scores, chunk == 0 ? acc : chunk_acc);
    if (chunk == 0) continue;
    for (int64_t r = 0; r < blk.n_rows; ++r) {
      if (chunk * kChunk >= c.plan.n_visible[row_token(c, blk, r)]) continue;
      sums[r] += chunk_sums[r];
      float* acc_r = acc + r * hd;               // [head_dim]
      const float* part_r = chunk_acc + r * hd;  // [head_dim]
      for (int64_t d = 0; d < hd; ++d) acc_r[d] += part_r[d];
    }
  }
  for (int64_t r = 0; r < blk.n_rows; ++r) write_row(c, blk, r, acc + r * hd, sums[r]);
}

void barrier(BarrierSlot& slot, ThreadPool* pool, int thread_index, int num_threads) {
  if (slot.arrived.fetch_add(1, std::memory_order_acq_rel) == num_threads - 1) {
    slot.open.store(1, std::memory_order_release);
  } else {
    pool->wait_for_flag(slot.open, (thread_index + 1) % num_threads);
  }
}

// First chunk of thread t's share of a block when num_threads share it: the split of the shared
// slots nearest to equal at chunk boundaries; the last thread also takes the chunks past them.
int64_t first_chunk(const Block& blk, int t, int num_threads) {
  if (t == 0) return 0;
  if (t == num_threads) return blk.n_chunks;
  return (2 * t * blk.n_shared + num_threads * kChunk) / (2 * num_threads * kChunk);
}

// Thread `ti` of `nt` in a job where all threads work on each block in turn. Per block:
// scores of the thread's slot range (and of every nt-th token's runs) and their row maxima;
// barrier; exp-sums and Σ p·v of the chunks of that range into the shared buffers; barrier;
// the thread's share of rows added up over the chunks and written out.
void attention_blocks_shared(const AttentionCall& c, SharedBlockBuffers& shared, ThreadPool* pool,
                             int ti, int nt) {
  AttentionScratch& scratch = attention_scratch();
  const int64_t hd = c.s.head_dim;
  for (int64_t b = 0; b < c.plan.n_blocks; ++b) {
    const Block blk = block_at(c, b);
    float* qs = grow(&scratch.q, blk.n_rows * hd);        // [n_rows, head_dim]
    float* row_max = grow(&scratch.row_max, blk.n_rows);  // [n_rows]
    float* scores = shared.scores.data();                 // [n_rows, ld]
    float* partial_max = shared.partial_max.data();       // [nt, n_rows]
    float* chunk_sums = shared.chunk_sums.data();         // [n_chunks, n_rows]
    float* chunk_acc = shared.chunk_acc.data();           // [n_chunks, n_rows, head_dim]
    const int64_t chunk_begin = first_chunk(blk, ti, nt);
    const int64_t chunk_end = first_chunk(blk, ti + 1, nt);
    const int64_t j_begin = std::min(chunk_begin * kChunk, blk.n_shared);
    const int64_t j_end = ti == nt - 1 ? blk.n_shared : std::min(chunk_end * kChunk, blk.n_shared);

    gather_q(c, blk, qs);
    score_shared(c, blk, qs, j_begin, j_end, scores);
    for (int64_t t = ti; t < blk.n_tokens; t += nt) score_rest(c, blk, qs, t, scores);
    float* my_max = partial_max + ti * blk.n_rows;  // [n_rows]
    for (int64_t r = 0; r < blk.n_rows; ++r) {
      const float* row = scores + r * blk.ld;  // [ld]
      float m = j_begin < j_end ? c.kern.row_max(row + j_begin, j_end - j_begin) : -INFINITY;
      const int64_t i = row_token(c, blk, r);
      if ((i - blk.token_begin) % nt == ti && c.plan.n_visible[i] > blk.n_shared) {
        m = std::max(m, c.kern.row_max(row + blk.n_shared, c.plan.n_visible[i] - blk.n_shared));
      }
      my_max[r] = m;
    }
    barrier(shared.barriers[2 * b], pool, ti, nt);

    for (int64_t r = 0; r < blk.n_rows; ++r) {
      float m = partial_max[r];
      for (int t = 1; t < nt; ++t) m = std::max(m, partial_max[t * blk.n_rows + r]);
      row_max[r] = m;
    }
    for (int64_t chunk = chunk_begin; chunk < chunk_end; ++chunk) {
      chunk_exp(c, blk, chunk, row_max, scores, chunk_sums + chunk * blk.n_rows);
      chunk_accumulate(c, blk, chunk, scores, chunk_acc + chunk * blk.n_rows * hd);
    }
    barrier(shared.barriers[2 * b + 1], pool, ti, nt);

    // The next block's scores and maxima may be written from here on: the rows below read only
    // chunk_sums and chunk_acc, which the next block writes after its first barrier.
    for (int64_t r = blk.n_rows * ti / nt; r < blk.n_rows * (ti + 1) / nt; ++r) {
      const int64_t n_visible = c.plan.n_visible[row_token(c, blk, r)];
      float* acc_r = chunk_acc + r * hd;  // [head_dim] chunk 0, then the running total
      float sum = chunk_sums[r];
      for (int64_t chunk = 1; chunk * kChunk < n_visible; ++chunk) {
        sum += chunk_sums[chunk * blk.n_rows + r];
        const float* part_r = chunk_acc + (chunk * blk.n_rows + r) * hd;  // [head_dim]
        for (int64_t d = 0; d < hd; ++d) acc_r[d] += part_r[d];
      }
      write_row(c, blk, r, acc_r, sum);
    }
  }
}

void attention_with(const OpsKernels& kern, const AttentionShape& s, const float* q, const float* k,
                    const float* v, const uint8_t* mask, float* out, ThreadPool* pool) {
  SPECDEC_CHECK(s.n_past >= 0 && s.n_new >= 0, "attention: negative token count");
  if (s.n_new == 0) return;
  SPECDEC_CHECK(s.n_heads > 0 && s.n_kv_heads > 0 && s.head_dim > 0,
                "attention: heads and head_dim must be positive");
  SPECDEC_CHECK(s.n_heads % s.n_kv_heads == 0,
                "attention: n_heads must be a multiple of n_kv_heads");
  SharedBlockBuffers& shared = shared_block_buffers();
  make_plan(s, mask, &shared.plan);
  const AttentionCall call{.kern = kern,
                           .s = s,
                           .q = q,
                           .k = k,
                           .v = v,
                           .out = out,
                           .plan = shared.plan,
                           .group = s.n_heads / s.n_kv_heads,
                           .kv_stride = static_cast<int64_t>(s.n_kv_heads) * s.head_dim};
  const AttentionPlan& plan = shared.plan;
  const int pool_threads = pool == nullptr ? 1 : pool->size();
  if (pool_threads == 1) {
    for (int64_t b = 0; b < plan.n_blocks; ++b) attention_block(call, b);
    return;
  }
  if (plan.n_blocks >= kTasksPerThread * pool_threads) {
    pool->run([&](int thread_index, int num_threads) {
      // Strided: under a causal mask later blocks see more slots.
      for (int64_t b = thread_index; b < plan.n_blocks; b += num_threads) attention_block(call, b);
    });
    return;
  }
  // The threads share each block: size the shared buffers for the largest block.
  int64_t max_scores = 0, max_rows = 0, max_acc = 0;
  for (int64_t b = 0; b < plan.n_blocks; ++b) {
    const Block blk = block_at(call, b);
    max_scores = std::max(max_scores, blk.n_rows * blk.ld);
    max_rows = std::max(max_rows, blk.n_rows);
    max_acc = std::max(max_acc, blk.n_chunks * blk.n_rows);
  }
  grow(&shared.scores, max_scores);
  grow(&shared.partial_max, pool_threads * max_rows);
  grow(&shared.chunk_sums, max_acc);
  grow(&shared.chunk_acc, max_acc * s.head_dim);
  if (shared.n_barriers < 2 * plan.n_blocks) {
    shared.barriers = std::make_unique<BarrierSlot[]>(static_cast<size_t>(2 * plan.n_blocks));
    shared.n_barriers = 2 * plan.n_blocks;
  }
  for (int64_t i = 0; i < 2 * plan.n_blocks; ++i) {
    shared.barriers[i].arrived.store(0, std::memory_order_relaxed);
    shared.barriers[i].open.store(0, std::memory_order_relaxed);
  }
  pool->run([&](int thread_index, int num_threads) {
    if (num_threads == 1) {  // the pool was busy and runs this inline
      for (int64_t b = 0; b < plan.n_blocks; ++b) attention_block(call, b);
    } else {
      attention_blocks_shared(call, shared, pool, thread_index, num_threads);
    }
  });
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
  kern.scale(x, n, 1.0f / kern.exp_shifted_sum(x, n, kern.row_max(x, n)));
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
  kern.scale(x, n, 1.0f / kern.exp_shifted_sum(x, n, kern.row_max(x, n)));
}

void attention(const AttentionShape& s, const float* q, const float* k, const float* v,
               const uint8_t* mask, float* out, ThreadPool* pool) {
  attention_with(kernels_for(active_isa()), s, q, k, v, mask, out, pool);
}

}  // namespace specdec
