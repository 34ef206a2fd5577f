// The attention driver shared by every kernel variant (scalar, AVX2, AVX-512): it turns the mask
// into visible-slot lists, blocks the query tokens, splits the work over the pool and keeps the
// scratch; the per-ISA tables (OpsKernels) supply the inner loops.
//
// Numerics, per query vector (token i, head h) with visible slot list L_i (slot order, length
// n_i), in log2 units (q is packed times scale·log2(e)): the list is cut into chunks of
// kAttnChunk positions. For chunk c, from zero:
//   s_j = <q, k_{L_i[j]}>, m_c = max s_j, p_j = 2^(s_j - m_c), l_c = Σ p_j,
//   a_c = Σ_j p_j · v_{L_i[j]} (slot order),
// and the chunks are merged in order c = 0, 1, .. into a running (M, L, A) that starts at
// (-inf, 0, 0) (OpsKernels::attn_merge_weights, then attn_merge_rows or, bitwise the same,
// attn_accumulate_merge); out = A / L. Each chunk is self-contained (its own max), so a chunk
// can be computed by any thread at any time and only the merge is sequential.
//
// Work layout. Token i sees the slots [0, lead_i) - the cached prefix and the leading new tokens
// it sees without a gap (all of them up to itself under a causal mask) - and then a few runs of
// further new-token slots (tree and arbitrary masks). Tokens are processed in blocks; the rows of
// a block are ordered (KV head h, token t, head g of the group), so the rows_per_head rows of one
// KV head are contiguous. For a chunk, one attn_scores call scores the block's slots
// [c0, min(c1, tile_end)) (tile_end = the block's largest lead) against all rows of a KV head at
// once (each K row read once for the block); the columns past a row's lead are then overwritten
// by its own runs' scores, and the columns past its visible count are masked by
// attn_chunk_softmax. Σ p·v likewise: one pass over the tile slots for all rows (in a chunk with
// runs, the run columns of run tokens moved aside and zeroed, so those rows add exact zeros),
// then each run token's runs. Under a causal mask every chunk is a tile chunk: the diagonal costs
// at most a block's worth of masked columns per row.
//
// Threads: with enough blocks each block is one thread's task (largest first, taken from a
// shared counter), chunk by chunk over all KV heads, each chunk merged as it is done. A
// verification pass with enough query rows (AttentionPlan::block_per_thread) is cut into one
// block per thread and run the same way. Otherwise (decode, short verification) the threads
// share each block: thread 0 takes its (chunk, KV head) units from the front and merges them as
// it goes, the others take them from the back and store their chunk results (so the split
// adapts to a thread that starts late or runs slowly), and after a barrier each thread finishes
// the merge of a share of the rows.
//
// Memory: decode and verification stream the cached K/V from DRAM (the rest of the forward pass
// evicts them between layers). An f16 cache keeps K in tiles of 16 slots (backend/k_tiles.h): where
// the variant has attn_scores_k16 the scores of a chunk's tile columns read the tiles directly
// (bitwise the scores of attn_scores on the same values); otherwise, and for run pieces, the
// K rows a kernel call needs are converted (exactly) into a float tile. Σ p·v reads the f16 V
// rows directly where the variant has attn_accumulate_f16 (converting as it loads); other
// variants convert V rows into a float tile too. Either way the arithmetic is that of the float
// cache on the same values. A q8_0 cache goes the same ways with int8 codes in place of halves
// (attn_scores_k8, attn_accumulate_i8, i8_to_f32_rows), run by run, with the slots' scales
// applied around the kernels (scale_columns): the K scales on the scores a run produced, the V
// scales on a copy of the p a run consumes (ops.h has the arithmetic). A thread working
// on a chunk has the kernels prefetch the next chunk it will work on (AttnPrefetch), a third per
// KV head, so that the next K/V rows arrive while it computes.
//
// Invariance: a query vector's output depends only on q and the contents of its ordered visible
// list. A score is one dot product whose instruction sequence does not depend on the rest of the
// kernel call; a chunk's softmax sums over the kAttnChunk columns in a fixed order with exact
// zeros past the visible count; Σ p·v adds slot by slot into each output element, and p = 0
// steps (masked columns) leave it unchanged; chunk boundaries are positions of the vector's own
// list and the merge runs over them in order, with the same arithmetic, whatever block, task or
// thread computed them. A token decoded alone (n_new = 1) therefore gets the same bits as the
// same token in a speculative batch or tree.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/thread_pool.h"
#include "backend/k_tiles.h"
#include "backend/kv_view.h"
#include "util/check.h"

namespace specdec {
namespace {

constexpr int64_t kChunk = kAttnChunk;
// Query vectors of one KV head per block: large enough that each K/V tile is reused by many
// rows (16 tokens of a 3-head group), small enough that a block's scratch stays in L1/L2.
constexpr int64_t kBlockRowsPerHead = 48;
// Blocks per thread from which each block is one thread's task; below it the threads share each
// block.
constexpr int64_t kTasksPerThread = 4;
// Query rows per KV head from which a verification-sized call (one block of the default size, or
// one per thread) is cut into one block per thread instead of being shared: the scores kernel
// keeps its 12-row passes, and the threads skip the barrier and the merge of each other's chunk
// results (~7 us per layer at 512 cached slots). 8 new tokens at 512 cached, paired A/B of the
// forward pass: 0.99x (16 tokens 0.98x); with 6 rows per thread (4 tokens) it is 1.02x.
constexpr int64_t kSplitRowsPerThread = 12;

// Which KV slots each new token sees, for the whole call. Built by the calling thread and only
// read while the pool runs.
struct AttentionPlan {
  int64_t tokens_per_block = 0;
  bool block_per_thread = false;     // the tokens cut into one block per thread (make_plan)
  int64_t n_blocks = 0;
  std::vector<int64_t> lead;         // [n_new] token i sees slots [0, lead[i]) ..
  std::vector<int64_t> runs;         // [n_runs, 2] .. then these {first slot, count} runs
  std::vector<int64_t> runs_end;     // [n_new] token i's pairs end at runs[runs_end[i]]
  std::vector<int64_t> n_visible;    // [n_new] visible slots of each token
  std::vector<int64_t> tile_end;     // [n_blocks] largest lead of the block's tokens
  std::vector<int64_t> max_visible;  // [n_blocks] longest visible list of the block
  std::vector<uint8_t> has_runs;     // [n_blocks] whether any token of the block has runs
};

// One block of a job whose threads share each block: the units its threads claimed, and the
// barrier where they wait for each other.
struct alignas(64) BlockSync {
  std::atomic<int64_t> claimed{0};  // units claimed by all threads together
  std::atomic<int64_t> back{0};     // units claimed from the back (more than two threads)
  std::atomic<int64_t> front{0};    // units thread 0 took from the front, set before the barrier
  std::atomic<int> arrived{0};
  std::atomic<int> open{0};

  void reset() {
    claimed.store(0, std::memory_order_relaxed);
    back.store(0, std::memory_order_relaxed);
    front.store(0, std::memory_order_relaxed);
    arrived.store(0, std::memory_order_relaxed);
    open.store(0, std::memory_order_relaxed);
  }
};

// The calling thread's buffers, shared by the threads of a job and kept across calls.
struct SharedBuffers {
  AttentionPlan plan;
  alignas(64) std::atomic<int64_t> next_task{0};  // task counter of a one-task-per-thread job
  // Chunk results of the threads sharing a block, double-buffered by block parity:
  std::vector<float> chunk_ml;         // [2, n_chunks, 2, n_rows] m then l of each chunk
  std::vector<float> chunk_a;          // [2, n_chunks, n_rows, head_dim] a of each chunk
  std::vector<float> state_ml;         // [2, 2, n_rows] running M, L (thread 0's chunks merged)
  std::vector<float> state_a;          // [2, n_rows, head_dim] running A
  std::unique_ptr<BlockSync[]> syncs;  // [n_syncs], one per block
  int64_t n_syncs = 0;
};

// Per-thread scratch of one block; rows = rows_per_head unless noted.
struct Scratch {
  std::vector<float> packed;      // [n_kv_heads, packed_q] q in the kernels' form
  std::vector<float> packed_tok;  // [n_kv_heads, n_tokens, packed_tok] per token (runs)
  std::vector<float> scores;      // [rows, kChunk] scores, then p
  std::vector<float> side;        // [rows, kChunk] p of the run columns
  std::vector<int32_t> n_valid;   // [rows] visible positions of each row in the chunk
  std::vector<float> ml;          // [4, rows] m, l, wo, wn of a chunk
  std::vector<float> a;           // [rows, head_dim] a of a chunk with runs
  std::vector<float> big_ml;      // [2, n_rows] running M, L of a block task
  std::vector<float> big_a;       // [n_rows, head_dim] running A of a block task
  std::vector<float> k_tile;      // [kChunk, head_dim] K rows of an f16 cache as floats
  std::vector<float> v_tile;      // [kChunk, head_dim] V rows of an f16 cache as floats
  std::vector<float> piece;       // [kChunk, head_dim] K or V rows of a run piece (f16 cache)
  std::vector<uint16_t> k_half;   // [kChunk, head_dim] K rows gathered from f16 tiles
  std::vector<int8_t> k_i8;       // [kChunk, head_dim] K rows gathered from q8_0 tiles
  std::vector<float> p_scaled;    // [rows, kChunk] p times the V scales (q8_0)
};

// Both grow to the largest call seen and are kept, so steady-state calls do not allocate
// (pool workers live as long as the pool).
SharedBuffers& shared_buffers() {
  thread_local SharedBuffers buffers;
  return buffers;
}

Scratch& thread_scratch() {
  thread_local Scratch scratch;
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

// Appends to `runs` the slots of new tokens j >= first that new token `i` sees (mask given), as
// runs of consecutive slots ({first slot, count} pairs), and returns how many slots they hold.
int64_t visible_runs_from(const AttentionShape& s, const uint8_t* mask, int64_t i, int64_t first,
                          std::vector<int64_t>* runs) {
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

// Tokens per block: kBlockRowsPerHead rows per KV head, or for a call of at most one such block
// per thread with at least kSplitRowsPerThread rows per KV head for each, an even cut into one
// block per thread (the rows of a token always stay together).
void make_plan(const AttentionShape& s, const uint8_t* mask, int threads, AttentionPlan* plan) {
  const int group = s.n_heads / s.n_kv_heads;
  const int64_t tokens =
      std::min<int64_t>(s.n_new, std::max<int64_t>(1, kBlockRowsPerHead / group));
  plan->block_per_thread = threads > 1 && s.n_new <= tokens * threads &&
                           s.n_new * group >= kSplitRowsPerThread * threads;
  plan->tokens_per_block = plan->block_per_thread ? (s.n_new + threads - 1) / threads : tokens;
  plan->n_blocks = (s.n_new + plan->tokens_per_block - 1) / plan->tokens_per_block;
  plan->lead.resize(static_cast<size_t>(s.n_new));
  plan->runs_end.resize(static_cast<size_t>(s.n_new));
  plan->n_visible.resize(static_cast<size_t>(s.n_new));
  plan->tile_end.resize(static_cast<size_t>(plan->n_blocks));
  plan->max_visible.resize(static_cast<size_t>(plan->n_blocks));
  plan->has_runs.resize(static_cast<size_t>(plan->n_blocks));
  plan->runs.clear();
  for (int64_t b = 0; b < plan->n_blocks; ++b) {
    const int64_t token_begin = b * plan->tokens_per_block;
    const int64_t token_end = std::min(s.n_new, token_begin + plan->tokens_per_block);
    int64_t tile_end = 0, max_visible = 0;
    for (int64_t i = token_begin; i < token_end; ++i) {
      const int64_t n_lead = leading_visible(s, mask, i);
      plan->lead[i] = s.n_past + n_lead;
      plan->n_visible[i] = plan->lead[i];
      if (mask != nullptr) plan->n_visible[i] += visible_runs_from(s, mask, i, n_lead, &plan->runs);
      plan->runs_end[i] = static_cast<int64_t>(plan->runs.size());
      tile_end = std::max(tile_end, plan->lead[i]);
      max_visible = std::max(max_visible, plan->n_visible[i]);
    }
    plan->tile_end[b] = tile_end;
    plan->max_visible[b] = max_visible;
    plan->has_runs[b] =
        (token_begin == 0 ? 0 : plan->runs_end[token_begin - 1]) != plan->runs_end[token_end - 1];
  }
}

// One attention call: the inputs and its plan.
struct AttentionCall {
  const OpsKernels& kern;
  const AttentionShape& s;
  const float* q;  // [n_new, n_heads, head_dim]
  const KvView& kv;  // slots [0, n_past + n_new), each [n_kv_heads, head_dim] of kv_type
  KvType kv_type;
  float* out;  // [n_new, n_heads, head_dim]
  const AttentionPlan& plan;
  int group;           // query heads per KV head
  int64_t kv_stride;   // elements per K/V row (slot)
  int64_t packed_q;    // floats of the packed q of one block's rows of one KV head
  int64_t packed_tok;  // floats of the packed q of one token's rows of one KV head
  float q_mult;        // scale·log2(e): scores in log2 units
};

// A block's geometry. Row h * rows_per_head + t * group + g is (KV head h, token t, head g).
struct Block {
  int64_t token_begin = 0;
  int64_t n_tokens = 0;
  int rows_per_head = 0;  // n_tokens * group
  int64_t n_rows = 0;     // n_tokens * n_heads
  int64_t tile_end = 0;
  int64_t max_visible = 0;
  int64_t n_chunks = 0;
  bool has_runs = false;
};

Block block_at(const AttentionCall& c, int64_t b) {
  Block blk;
  blk.token_begin = b * c.plan.tokens_per_block;
  blk.n_tokens = std::min(c.s.n_new - blk.token_begin, c.plan.tokens_per_block);
  blk.rows_per_head = static_cast<int>(blk.n_tokens * c.group);
  blk.n_rows = blk.n_tokens * c.s.n_heads;
  blk.tile_end = c.plan.tile_end[b];
  blk.max_visible = c.plan.max_visible[b];
  blk.n_chunks = (blk.max_visible + kChunk - 1) / kChunk;
  blk.has_runs = c.plan.has_runs[b] != 0;
  return blk;
}

// Token i's runs: pairs [runs_begin(i), runs_end[i]) of plan.runs.
int64_t runs_begin(const AttentionCall& c, int64_t i) {
  return i == 0 ? 0 : c.plan.runs_end[i - 1];
}

// Offset in q and out of the group's first head of block token t under KV head h.
int64_t token_offset(const AttentionCall& c, const Block& blk, int h, int64_t t) {
  return ((blk.token_begin + t) * c.s.n_heads + static_cast<int64_t>(h) * c.group) * c.s.head_dim;
}

// Packs the q rows of KV head h: packed_h [packed_q] for the block (its tokens' runs of `group`
// query heads, one token apart in q), and (blocks with runs) packed_tok_h [n_tokens, packed_tok]
// per token.
void pack_head(const AttentionCall& c, const Block& blk, int h, float* packed_h,
               float* packed_tok_h) {
  const int64_t token_stride = static_cast<int64_t>(c.s.n_heads) * c.s.head_dim;
  c.kern.attn_pack_q(c.q + token_offset(c, blk, h, 0), blk.rows_per_head, c.group, token_stride,
                     c.s.head_dim, c.q_mult, packed_h);
  if (!blk.has_runs) return;
  for (int64_t t = 0; t < blk.n_tokens; ++t) {
    c.kern.attn_pack_q(c.q + token_offset(c, blk, h, t), c.group, c.group, token_stride,
                       c.s.head_dim, c.q_mult, packed_tok_h + t * c.packed_tok);
  }
}

// Calls fn(column, slot, count) for the pieces of token i's runs that fall in the chunk's
// columns [c0, c1) (column = visible position - c0).
template <class F>
void for_run_pieces(const AttentionCall& c, int64_t i, int64_t c0, int64_t c1, F&& fn) {
  int64_t position = c.plan.lead[i];
  for (int64_t p = runs_begin(c, i); p < c.plan.runs_end[i] && position < c1; p += 2) {
    const int64_t count = c.plan.runs[p + 1];
    const int64_t lo = std::max(position, c0);
    const int64_t hi = std::min(position + count, c1);
    if (lo < hi) fn(lo - c0, c.plan.runs[p] + (lo - position), hi - lo);
    position += count;
  }
}

// Whether token i has run positions in [c0, c1).
bool runs_in_chunk(const AttentionCall& c, int64_t i, int64_t c0, int64_t c1) {
  return c.plan.lead[i] < c1 && c.plan.n_visible[i] > std::max(c.plan.lead[i], c0);
}

// Rows [local, local + count) of KV head h of one contiguous run's K or V rows (base: run.k or
// run.v) as floats, `stride` floats apart: the cache's own rows for a float cache; for an f16
// cache, converted into `tile` [count, head_dim].
struct FloatRows {
  const float* p;
  int64_t stride;
};

FloatRows head_rows(const AttentionCall& c, const uint8_t* base, int h, int64_t local,
                    int64_t count, std::vector<float>* tile) {
  const int64_t offset = local * c.kv_stride + static_cast<int64_t>(h) * c.s.head_dim;
  if (c.kv_type == KvType::kF32) {
    return {reinterpret_cast<const float*>(base) + offset, c.kv_stride};
  }
  float* t = grow(tile, count * c.s.head_dim);
  if (c.kv_type == KvType::kQ8) {  // the codes (the driver applies the scales)
    c.kern.i8_to_f32_rows(reinterpret_cast<const int8_t*>(base) + offset, c.kv_stride, count,
                          c.s.head_dim, t);
  } else {
    c.kern.f16_to_f32_rows(reinterpret_cast<const uint16_t*>(base) + offset, c.kv_stride, count,
                           c.s.head_dim, t);
  }
  return {t, c.s.head_dim};
}

// q8_0: p_scaled[r * n + j] = p[r * ld_p + j] · (V scale of slot local + j, KV head h) for the n
// columns of one run (p · dv, the factor q8_0's Σ p·v takes). p_scaled: [n_q, n].
const float* scale_p(const AttentionCall& c, int h, const KvRun& run, const float* p, int64_t ld_p,
                     int n_q, Scratch& sc) {
  float* out = grow(&sc.p_scaled, static_cast<int64_t>(n_q) * run.n);
  for_run_scales(c.kv, run.v_scale, run, h, [&](int64_t j0, const float* d, int64_t count) {
    c.kern.scale_columns(p + j0, ld_p, n_q, d, count, out + j0, run.n);
  });
  return out;
}

// q8_0: the scores of one run's n columns times the slots' K scales (<q, c_j> · dk_j), for n_q
// rows of s (ld_s apart).
void scale_scores(const AttentionCall& c, int h, const KvRun& run, float* s, int64_t ld_s,
                  int n_q) {
  for_run_scales(c.kv, run.k_scale, run, h, [&](int64_t j0, const float* d, int64_t count) {
    c.kern.scale_columns(s + j0, ld_s, n_q, d, count, s + j0, ld_s);
  });
}

// Σ p·v over the V rows [slot, slot + count) of KV head h for n_q rows of p (ld_p apart):
// added to out [n_q, head_dim], or with wo / wn merged into it as attn_accumulate_merge does
// (only for slots in one contiguous run, single_run). A paged cache's runs are summed one after
// the other, each slot once in slot order: the same bits as one call (OpsKernels contract).
// An f16 cache's rows are read directly where the variant has the f16 kernels (each value
// converted as it is loaded), otherwise converted into `tile` first. In-process A/B at 512
// cached tokens: 0.96-0.97x the decode step time, 0.98-0.99x for 8 new tokens (whose 24 rows
// per KV head convert each value four times), prefill unchanged.
void sum_pv(const AttentionCall& c, int h, int64_t slot, int64_t count, const float* p,
            int64_t ld_p, int n_q, const float* wo, const float* wn, float* out,
            std::vector<float>* tile, AttnPrefetch next) {
  const int hd = c.s.head_dim;
  for_kv_runs(c.kv, slot, count, [&](int64_t o, const KvRun& run) {
    SPECDEC_DCHECK(wo == nullptr || run.n == count, "sum_pv: a merge over several runs");
    const float* p_run = p + o;  // the run's columns
    int64_t ld_run = ld_p;
    const AttnPrefetch hint = o == 0 ? next : AttnPrefetch{};
    if (c.kv_type == KvType::kQ8) {
      p_run = scale_p(c, h, run, p_run, ld_p, n_q, thread_scratch());
      ld_run = run.n;
      if (c.kern.attn_accumulate_i8 != nullptr) {
        const int8_t* v = reinterpret_cast<const int8_t*>(run.v) + run.local * c.kv_stride +
                          static_cast<int64_t>(h) * hd;  // rows c.kv_stride codes apart
        if (wo != nullptr) {
          c.kern.attn_accumulate_merge_i8(p_run, ld_run, n_q, v, c.kv_stride, run.n, hd, wo, wn,
                                          out, hint);
        } else {
          c.kern.attn_accumulate_i8(p_run, ld_run, n_q, v, c.kv_stride, run.n, hd, out, hint);
        }
        return;
      }
    }
    if (c.kv_type == KvType::kF16 && c.kern.attn_accumulate_f16 != nullptr) {
      const uint16_t* v = reinterpret_cast<const uint16_t*>(run.v) + run.local * c.kv_stride +
                          static_cast<int64_t>(h) * hd;  // rows c.kv_stride halves apart
      if (wo != nullptr) {
        c.kern.attn_accumulate_merge_f16(p_run, ld_p, n_q, v, c.kv_stride, run.n, hd, wo, wn, out,
                                         hint);
      } else {
        c.kern.attn_accumulate_f16(p_run, ld_p, n_q, v, c.kv_stride, run.n, hd, out, hint);
      }
      return;
    }
    const FloatRows v = head_rows(c, run.v, h, run.local, run.n, tile);
    if (wo != nullptr) {
      c.kern.attn_accumulate_merge(p_run, ld_run, n_q, v.p, v.stride, run.n, hd, wo, wn, out, hint);
    } else {
      c.kern.attn_accumulate(p_run, ld_run, n_q, v.p, v.stride, run.n, hd, out, hint);
    }
  });
}

// Whether the slots [slot, slot + count) are one contiguous run (always, for a KvCache).
bool single_run(const AttentionCall& c, int64_t slot, int64_t count) {
  return kv_run(c.kv, slot, count).n == count;
}

// head_rows for the K rows of one contiguous run (f16 layout: tiles): from a tile's first slot
// the variant's k16_tiles_to_rows transposes them; otherwise (run pieces, variants without it)
// they are gathered into rows of halves and converted.
FloatRows k_head_rows(const AttentionCall& c, int h, const KvRun& run, std::vector<float>* tile,
                      Scratch& sc) {
  if (!k_tiled(c.kv_type)) return head_rows(c, run.k, h, run.local, run.n, tile);
  const int64_t hd = c.s.head_dim, n_kv = c.s.n_kv_heads;
  float* t = grow(tile, run.n * hd);  // [run.n, head_dim]
  if (c.kv_type == KvType::kQ8) {     // the codes as float rows
    const auto* codes = reinterpret_cast<const int8_t*>(run.k);
    if (run.local % kKTileSlots == 0 && c.kern.k8_tiles_to_rows != nullptr) {
      c.kern.k8_tiles_to_rows(codes + k_tile_index(run.local, h, 0, n_kv, hd),
                              n_kv * hd * kKTileSlots, run.n, c.s.head_dim, t);
      return {t, hd};
    }
    int8_t* rows = grow(&sc.k_i8, run.n * hd);  // [run.n, head_dim], gathered
    k_tiles_to_head_rows(reinterpret_cast<const int8_t*>(run.k), run.local, run.n, h, n_kv, hd,
                         rows, hd);
    c.kern.i8_to_f32_rows(rows, hd, run.n, c.s.head_dim, t);
    return {t, hd};
  }
  const auto* tiles = reinterpret_cast<const uint16_t*>(run.k);
  if (run.local % kKTileSlots == 0 && c.kern.k16_tiles_to_rows != nullptr) {
    c.kern.k16_tiles_to_rows(tiles + k_tile_index(run.local, h, 0, n_kv, hd),
                             n_kv * hd * kKTileSlots, run.n, c.s.head_dim, t);
    return {t, hd};
  }
  uint16_t* rows = grow(&sc.k_half, run.n * hd);  // [run.n, head_dim]
  k_tiles_to_head_rows(tiles, run.local, run.n, h, n_kv, hd, rows, hd);
  c.kern.f16_to_f32_rows(rows, hd, run.n, c.s.head_dim, t);
  return {t, hd};
}

// Scores of the packed q rows (n_q of them) against the K rows [slot, slot + count) of KV head
// h, run by run: s[r * kChunk + j] for column j = slot - first slot. tiles: f16 tiles are read
// directly where the variant can (runs starting at a tile's first slot); otherwise, and for run
// pieces (tiles = false), the rows are converted to floats first. Either way the same bits.
void scores_rows(const AttentionCall& c, int h, const float* packed, int n_q, int64_t slot,
                 int64_t count, float* s, Scratch& sc, std::vector<float>* tile, bool tiles,
                 AttnPrefetch next) {
  const int64_t hd = c.s.head_dim, n_kv = c.s.n_kv_heads;
  for_kv_runs(c.kv, slot, count, [&](int64_t o, const KvRun& run) {
    const AttnPrefetch hint = o == 0 ? next : AttnPrefetch{};
    if (c.kv_type == KvType::kQ8) {
      if (tiles && c.kern.attn_scores_k8 != nullptr && run.local % kKTileSlots == 0) {
        c.kern.attn_scores_k8(
            packed, n_q,
            reinterpret_cast<const int8_t*>(run.k) + k_tile_index(run.local, h, 0, n_kv, hd),
            n_kv * hd * kKTileSlots, run.n, c.s.head_dim, s + o, kChunk, hint);
      } else {
        const FloatRows k = k_head_rows(c, h, run, tile, sc);
        c.kern.attn_scores(packed, n_q, k.p, k.stride, run.n, c.s.head_dim, s + o, kChunk, hint);
      }
      scale_scores(c, h, run, s + o, kChunk, n_q);
      return;
    }
    if (tiles && k_tiled(c.kv_type) && c.kern.attn_scores_k16 != nullptr &&
        run.local % kKTileSlots == 0) {
      c.kern.attn_scores_k16(
          packed, n_q,
          reinterpret_cast<const uint16_t*>(run.k) + k_tile_index(run.local, h, 0, n_kv, hd),
          n_kv * hd * kKTileSlots, run.n, c.s.head_dim, s + o, kChunk, hint);
      return;
    }
    const FloatRows k = k_head_rows(c, h, run, tile, sc);
    c.kern.attn_scores(packed, n_q, k.p, k.stride, run.n, c.s.head_dim, s + o, kChunk, hint);
  });
}

// Chunk `chunk` of the block: its columns [c0, c1) of visible positions, the tile slots
// [c0, c0 + tile_cols) scored for all rows, and whether any token has run positions in it.
struct Chunk {
  int64_t c0 = 0;
  int64_t c1 = 0;
  int64_t tile_cols = 0;
  bool runs = false;
};

Chunk chunk_at(const AttentionCall& c, const Block& blk, int64_t chunk) {
  Chunk ch;
  ch.c0 = chunk * kChunk;
  ch.c1 = std::min(ch.c0 + kChunk, blk.max_visible);
  ch.tile_cols = std::min(ch.c1, blk.tile_end) - ch.c0;
  for (int64_t t = 0; blk.has_runs && !ch.runs && t < blk.n_tokens; ++t) {
    ch.runs = runs_in_chunk(c, blk.token_begin + t, ch.c0, ch.c1);
  }
  return ch;
}

// Prefetch hints for the K and V rows a thread reads next.
struct NextRows {
  AttnPrefetch k;
  AttnPrefetch v;
};

// Part `part` of `parts` of the K and V tile rows of chunk `chunk` of the block (the rows of a
// chunk hold all KV heads, one contiguous range in K and one in V); none for a chunk outside the
// block. A thread working through a chunk's KV heads one by one prefetches the next chunk it will
// work on, a part per head.
NextRows chunk_part(const AttentionCall& c, const Block& blk, int64_t chunk, int part, int parts) {
  NextRows next;
  if (chunk < 0 || chunk >= blk.n_chunks) return next;
  const int64_t c0 = chunk * kChunk;
  const int64_t n = std::min(std::min(c0 + kChunk, blk.max_visible), blk.tile_end) - c0;
  if (n <= 0) return next;
  const auto row_bytes = static_cast<int64_t>(c.kv_stride * kv_type_bytes(c.kv_type));
  // Part `part` of the chunk's bytes in K (is_k) or V, over its contiguous runs in slot order,
  // clipped to the run it begins in (a paged cache's chunk may span several).
  auto part_of = [&](bool is_k) {
    // K tiles: the runs' slots are whole tiles (c0 and block starts are multiples of 16), the
    // last one entire.
    auto run_bytes = [&](const KvRun& run) {
      return (is_k && k_tiled(c.kv_type) ? k_tile_slots(run.n) : run.n) * row_bytes;
    };
    int64_t total = 0;
    for_kv_runs(c.kv, c0, n, [&](int64_t, const KvRun& run) { total += run_bytes(run); });
    const int64_t begin = total * part / parts;
    const int64_t end = total * (part + 1) / parts;
    AttnPrefetch hint;
    int64_t at = 0;  // bytes of the runs before this one
    for_kv_runs(c.kv, c0, n, [&](int64_t, const KvRun& run) {
      const int64_t bytes = run_bytes(run);
      if (hint.begin == nullptr && begin < end && begin < at + bytes) {
        const uint8_t* base = (is_k ? run.k : run.v) + run.local * row_bytes;
        hint = AttnPrefetch{base + (begin - at), std::min(end, at + bytes) - begin};
      }
      at += bytes;
    });
    return hint;
  };
  next.k = part_of(true);
  next.v = part_of(false);
  return next;
}

// First half of a chunk of the rows_per_head rows of KV head h: its p in sc.scores (and, for run
// tokens, the run columns in sc.side), m and l: [rows_per_head]. next_k: K rows to prefetch.
void chunk_probs(const AttentionCall& c, const Block& blk, int h, const Chunk& ch,
                 const float* packed_h, const float* packed_tok_h, Scratch& sc, float* m, float* l,
                 AttnPrefetch next_k) {
  const int rows = blk.rows_per_head;
  const int64_t c0 = ch.c0, c1 = ch.c1, tile_cols = ch.tile_cols;
  float* scores = grow(&sc.scores, rows * kChunk);  // [rows, kChunk]
  int32_t* n_valid = grow(&sc.n_valid, rows);       // [rows]
  for (int64_t t = 0; t < blk.n_tokens; ++t) {
    const int64_t n = std::clamp<int64_t>(c.plan.n_visible[blk.token_begin + t] - c0, 0, kChunk);
    std::fill_n(n_valid + t * c.group, c.group, static_cast<int32_t>(n));
  }
  if (tile_cols > 0) {
    // c0 (a multiple of kChunk) is a tile's first slot: the tiles are read directly.
    scores_rows(c, h, packed_h, rows, c0, tile_cols, scores, sc, &sc.k_tile, true, next_k);
  }
  if (ch.runs) {
    for (int64_t t = 0; t < blk.n_tokens; ++t) {
      const int64_t i = blk.token_begin + t;
      if (!runs_in_chunk(c, i, c0, c1)) continue;
      for_run_pieces(c, i, c0, c1, [&](int64_t column, int64_t slot, int64_t count) {
        scores_rows(c, h, packed_tok_h + t * c.packed_tok, c.group, slot, count,
                    scores + t * c.group * kChunk + column, sc, &sc.piece, false, {});
      });
    }
  }
  c.kern.attn_chunk_softmax(scores, kChunk, rows, n_valid, m, l);
  if (!ch.runs) return;
  // Run columns of run tokens move aside, so the tile pass adds zeros for them.
  float* side = grow(&sc.side, rows * kChunk);  // [rows, kChunk]
  for (int64_t t = 0; t < blk.n_tokens; ++t) {
    const int64_t i = blk.token_begin + t;
    if (!runs_in_chunk(c, i, c0, c1)) continue;
    const int64_t first = std::max(c.plan.lead[i], c0) - c0;
    for (int g = 0; g < c.group; ++g) {
      float* row = scores + (t * c.group + g) * kChunk;  // [kChunk]
      std::copy(row + first, row + kChunk, side + (t * c.group + g) * kChunk + first);
      std::fill(row + first, row + kChunk, 0.0f);
    }
  }
}

// Second half: a = Σ p·v of the chunk from zero, a: [rows_per_head, head_dim]. next_v: V rows to
// prefetch.
void chunk_sums(const AttentionCall& c, const Block& blk, int h, const Chunk& ch, Scratch& sc,
                float* a, AttnPrefetch next_v) {
  const int64_t hd = c.s.head_dim;
  const int rows = blk.rows_per_head;
  const int64_t c0 = ch.c0, c1 = ch.c1, tile_cols = ch.tile_cols;
  std::fill_n(a, rows * hd, 0.0f);
  if (tile_cols > 0) {
    sum_pv(c, h, c0, tile_cols, sc.scores.data(), kChunk, rows, nullptr, nullptr, a, &sc.v_tile,
           next_v);
  }
  if (!ch.runs) return;
  for (int64_t t = 0; t < blk.n_tokens; ++t) {
    const int64_t i = blk.token_begin + t;
    if (!runs_in_chunk(c, i, c0, c1)) continue;
    for_run_pieces(c, i, c0, c1, [&](int64_t column, int64_t slot, int64_t count) {
      sum_pv(c, h, slot, count, sc.side.data() + t * c.group * kChunk + column, kChunk, c.group,
             nullptr, nullptr, a + t * c.group * hd, &sc.piece, {});
    });
  }
}

// out of row r (KV head h, token t, head g) = A_r / L_r, zeros for a row that sees nothing;
// rows [r_begin, r_end) of the block, big_l: [r_end - r_begin], big_a: [.., head_dim].
void write_rows(const AttentionCall& c, const Block& blk, int64_t r_begin, int64_t r_end,
                const float* big_l, const float* big_a) {
  const int64_t hd = c.s.head_dim;
  int64_t r = r_begin;
  int h = static_cast<int>(r / blk.rows_per_head);
  int64_t t = r % blk.rows_per_head / c.group;
  int64_t g = r % c.group;
  for (; r < r_end; ++r) {
    float* out_r = c.out + token_offset(c, blk, h, t) + g * hd;  // [head_dim]
    const float* a_r = big_a + (r - r_begin) * hd;               // [head_dim]
    const float inv = c.plan.n_visible[blk.token_begin + t] == 0 ? 0.0f : 1.0f / big_l[r - r_begin];
    for (int64_t d = 0; d < hd; ++d) out_r[d] = a_r[d] * inv;
    if (++g < c.group) continue;  // the next row: (h, t, g) in row order
    g = 0;
    if (++t < blk.n_tokens) continue;
    t = 0;
    ++h;
  }
}

// Running state (-inf, 0, 0) of n rows: big_m, big_l: [n], big_a: [n, head_dim].
void reset_state(int64_t n, int64_t hd, float* big_m, float* big_l, float* big_a) {
  std::fill_n(big_m, n, -INFINITY);
  std::fill_n(big_l, n, 0.0f);
  std::fill_n(big_a, n * hd, 0.0f);
}

// Chunk ch of KV head h merged into the running state of the head's rows (big_m_h, big_l_h:
// [rows_per_head], big_a_h: [rows_per_head, head_dim]); the Σ p·v is fused with the merge unless
// the chunk has runs. next: what to prefetch meanwhile.
void merge_chunk(const AttentionCall& c, const Block& blk, int h, const Chunk& ch,
                 const float* packed_h, const float* packed_tok_h, Scratch& sc, float* big_m_h,
                 float* big_l_h, float* big_a_h, const NextRows& next) {
  const int rows = blk.rows_per_head;
  float* ml = grow(&sc.ml, 4 * rows);  // [4, rows] m, l, wo, wn of the chunk
  chunk_probs(c, blk, h, ch, packed_h, packed_tok_h, sc, ml, ml + rows, next.k);
  c.kern.attn_merge_weights(ml, ml + rows, rows, big_m_h, big_l_h, ml + 2 * rows, ml + 3 * rows);
  if (!ch.runs && ch.tile_cols > 0 && single_run(c, ch.c0, ch.tile_cols)) {
    sum_pv(c, h, ch.c0, ch.tile_cols, sc.scores.data(), kChunk, rows, ml + 2 * rows, ml + 3 * rows,
           big_a_h, &sc.v_tile, next.v);
  } else {
    float* a = grow(&sc.a, rows * c.s.head_dim);  // [rows, head_dim]
    chunk_sums(c, blk, h, ch, sc, a, next.v);
    c.kern.attn_merge_rows(a, rows, c.s.head_dim, ml + 2 * rows, ml + 3 * rows, big_a_h);
  }
}

// Packs the block's q for every KV head: packed: [n_kv_heads, packed_q],
// packed_tok: [n_kv_heads, n_tokens, packed_tok].
void pack_block(const AttentionCall& c, const Block& blk, Scratch& sc, float** packed,
                float** packed_tok) {
  *packed = grow(&sc.packed, c.s.n_kv_heads * c.packed_q);
  *packed_tok = grow(&sc.packed_tok, c.s.n_kv_heads * blk.n_tokens * c.packed_tok);
  for (int h = 0; h < c.s.n_kv_heads; ++h) {
    pack_head(c, blk, h, *packed + h * c.packed_q, *packed_tok + h * blk.n_tokens * c.packed_tok);
  }
}

// Block b on one thread: chunk by chunk, every KV head (the chunk's K/V rows of all heads are
// contiguous), each chunk merged as it is done.
void block_task(const AttentionCall& c, int64_t b) {
  Scratch& sc = thread_scratch();
  const Block blk = block_at(c, b);
  const int64_t hd = c.s.head_dim;
  const int rows = blk.rows_per_head;
  const int64_t n_rows = blk.n_rows;
  float *packed = nullptr, *packed_tok = nullptr;
  pack_block(c, blk, sc, &packed, &packed_tok);
  float* big_ml = grow(&sc.big_ml, 2 * n_rows);  // [2, n_rows] M, L
  float* big_a = grow(&sc.big_a, n_rows * hd);   // [n_rows, hd]
  reset_state(n_rows, hd, big_ml, big_ml + n_rows, big_a);
  for (int64_t chunk = 0; chunk < blk.n_chunks; ++chunk) {
    const Chunk ch = chunk_at(c, blk, chunk);
    for (int h = 0; h < c.s.n_kv_heads; ++h) {
      const int64_t r0 = static_cast<int64_t>(h) * rows;
      merge_chunk(c, blk, h, ch, packed + h * c.packed_q,
                  packed_tok + h * blk.n_tokens * c.packed_tok, sc, big_ml + r0,
                  big_ml + n_rows + r0, big_a + r0 * hd,
                  chunk_part(c, blk, chunk + 1, h, c.s.n_kv_heads));
    }
  }
  write_rows(c, blk, 0, n_rows, big_ml + n_rows, big_a);
}

// Task k of a one-task-per-thread job: blocks from the last (under a causal mask the largest).
void run_task(const AttentionCall& c, int64_t k) {
  block_task(c, c.plan.n_blocks - 1 - k);
}

// Thread `ti`'s claims of a block's units. Thread 0 takes units from the front, in order (it
// merges them as it goes); the others take them from the back. With two threads, each first
// takes kReservedShare of the units at its end without asking; every further claim counts
// against the units in between first, so the two ends never overlap, and a thread that started
// late or runs slowly simply takes fewer of them. (A claim moves a cache line between the cores,
// hence the reserved shares; more threads claim every unit.)
class UnitClaims {
 public:
  static constexpr int64_t kReservedShare = 25;  // percent

  UnitClaims(BlockSync& sync, int ti, int nt, int64_t units)
      : sync_(sync),
        ti_(ti),
        nt_(nt),
        units_(units),
        reserved_(nt == 2 ? units * kReservedShare / 100 : 0) {}

  // The next unit (-1: none left).
  int64_t next() {
    if (taken_ >= reserved_ &&
        sync_.claimed.fetch_add(1, std::memory_order_relaxed) >= units_ - 2 * reserved_) {
      return -1;
    }
    if (ti_ == 0) return taken_++;
    if (nt_ == 2) return units_ - 1 - taken_++;
    ++taken_;
    return units_ - 1 - sync_.back.fetch_add(1, std::memory_order_relaxed);
  }
  int64_t taken() const { return taken_; }

 private:
  BlockSync& sync_;
  int ti_;
  int nt_;
  int64_t units_;
  int64_t reserved_;
  int64_t taken_ = 0;
};

// Thread `ti` of `nt` in a job where all threads work on each block in turn. A block's work is
// n_chunks x n_kv_heads units (chunk-major, so that the K/V rows of a chunk are read together),
// claimed one at a time (UnitClaims): thread 0 takes them from the front and merges each into a
// running state in the shared buffers as it goes; the others take them from the back and store
// their chunk results there. While on a chunk, a thread has the kernels prefetch the next chunk
// in its direction (chunk_part). Barrier; then each thread takes a share of the rows, continues
// their merge over the stored chunks in order and writes them out.
// The buffers are double-buffered by block parity (block b + 2 rewrites them only after every
// thread passed block b + 1's barrier).
void blocks_shared(const AttentionCall& c, SharedBuffers& shared, ThreadPool* pool, int ti, int nt,
                   int64_t max_chunks, int64_t max_rows) {
  Scratch& sc = thread_scratch();
  const int64_t hd = c.s.head_dim;
  const int n_kv = c.s.n_kv_heads;
  for (int64_t b = 0; b < c.plan.n_blocks; ++b) {
    BlockSync& sync = shared.syncs[b];
    const Block blk = block_at(c, b);
    const int rows = blk.rows_per_head;
    const int64_t n_rows = blk.n_rows;
    float* chunk_ml = shared.chunk_ml.data() + (b % 2) * max_chunks * 2 * max_rows;
    float* chunk_a = shared.chunk_a.data() + (b % 2) * max_chunks * max_rows * hd;
    float* state_ml = shared.state_ml.data() + (b % 2) * 2 * max_rows;  // [2, n_rows] M, L
    float* state_a = shared.state_a.data() + (b % 2) * max_rows * hd;   // [n_rows, hd]
    const int64_t units = blk.n_chunks * n_kv;
    if (ti == 0) reset_state(n_rows, hd, state_ml, state_ml + n_rows, state_a);
    UnitClaims claims(sync, ti, nt, units);
    int64_t u = claims.next();
    if (u >= 0) {
      float *packed = nullptr, *packed_tok = nullptr;
      pack_block(c, blk, sc, &packed, &packed_tok);
      const int64_t step = ti == 0 ? 1 : -1;  // the direction this thread goes through the chunks
      int64_t chunk = -1;
      Chunk ch;
      for (; u >= 0; u = claims.next()) {
        if (u / n_kv != chunk) {
          chunk = u / n_kv;
          ch = chunk_at(c, blk, chunk);
        }
        const int h = static_cast<int>(u % n_kv);
        const int64_t r0 = static_cast<int64_t>(h) * rows;
        const float* packed_h = packed + h * c.packed_q;
        const float* packed_tok_h = packed_tok + h * blk.n_tokens * c.packed_tok;
        const NextRows next = chunk_part(c, blk, chunk + step, h, n_kv);
        if (ti == 0) {
          merge_chunk(c, blk, h, ch, packed_h, packed_tok_h, sc, state_ml + r0,
                      state_ml + n_rows + r0, state_a + r0 * hd, next);
        } else {
          float* m = chunk_ml + chunk * 2 * n_rows;  // [2, n_rows]
          chunk_probs(c, blk, h, ch, packed_h, packed_tok_h, sc, m + r0, m + n_rows + r0, next.k);
          chunk_sums(c, blk, h, ch, sc, chunk_a + (chunk * n_rows + r0) * hd, next.v);
        }
      }
    }
    if (ti == 0) sync.front.store(claims.taken(), std::memory_order_relaxed);
    pool->arrive_and_wait(sync.arrived, sync.open, ti, nt);
    const int64_t u_first = sync.front.load(std::memory_order_relaxed);  // thread 0's units

    // Rows [r_begin, r_end), by runs of one KV head: merged over the head's chunks from the first
    // one thread 0 did not do.
    const int64_t r_begin = n_rows * ti / nt;
    const int64_t r_end = n_rows * (ti + 1) / nt;
    for (int64_t r = r_begin; r < r_end;) {
      const int h = static_cast<int>(r / rows);
      const int64_t seg_end = std::min(r_end, static_cast<int64_t>(h + 1) * rows);
      const int n = static_cast<int>(seg_end - r);
      const int64_t first = u_first > h ? (u_first - 1 - h) / n_kv + 1 : 0;
      float* w = grow(&sc.ml, 2 * n);  // [2, n] wo, wn
      for (int64_t chunk = first; chunk < blk.n_chunks; ++chunk) {
        const float* m = chunk_ml + chunk * 2 * n_rows;  // [2, n_rows]
        c.kern.attn_merge_weights(m + r, m + n_rows + r, n, state_ml + r, state_ml + n_rows + r, w,
                                  w + n);
        c.kern.attn_merge_rows(chunk_a + (chunk * n_rows + r) * hd, n, c.s.head_dim, w, w + n,
                               state_a + r * hd);
      }
      r = seg_end;
    }
    write_rows(c, blk, r_begin, r_end, state_ml + n_rows + r_begin, state_a + r_begin * hd);
  }
}

void attention_with(const OpsKernels& kern, const AttentionShape& s, const float* q,
                    const KvView& kv, const uint8_t* mask, float* out, ThreadPool* pool) {
  SPECDEC_CHECK(s.n_past >= 0 && s.n_new >= 0, "attention: negative token count");
  if (s.n_new == 0) return;
  SPECDEC_CHECK(s.n_heads > 0 && s.n_kv_heads > 0 && s.head_dim > 0,
                "attention: heads and head_dim must be positive");
  SPECDEC_CHECK(s.n_heads % s.n_kv_heads == 0,
                "attention: n_heads must be a multiple of n_kv_heads");
  SharedBuffers& shared = shared_buffers();
  const int pool_threads = pool == nullptr ? 1 : pool->size();
  make_plan(s, mask, pool_threads, &shared.plan);
  const AttentionPlan& plan = shared.plan;
  const int group = s.n_heads / s.n_kv_heads;
  const AttentionCall call{
      .kern = kern,
      .s = s,
      .q = q,
      .kv = kv,
      .kv_type = kv.type,
      .out = out,
      .plan = plan,
      .group = group,
      .kv_stride = static_cast<int64_t>(s.n_kv_heads) * s.head_dim,
      .packed_q = attn_packed_floats(static_cast<int>(plan.tokens_per_block * group), s.head_dim),
      .packed_tok = attn_packed_floats(group, s.head_dim),
      .q_mult = s.scale * 1.44269504088896341f};
  const int64_t n_tasks = plan.n_blocks;
  if (pool_threads == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) run_task(call, t);
    return;
  }
  if (n_tasks >= kTasksPerThread * pool_threads || plan.block_per_thread) {
    shared.next_task.store(0, std::memory_order_relaxed);
    pool->run([&](int, int) {
      for (int64_t t = shared.next_task.fetch_add(1, std::memory_order_relaxed); t < n_tasks;
           t = shared.next_task.fetch_add(1, std::memory_order_relaxed)) {
        run_task(call, t);
      }
    });
    return;
  }
  // The threads share each block: size the chunk buffers for the largest block.
  int64_t max_chunks = 0, max_rows = 0;
  for (int64_t b = 0; b < plan.n_blocks; ++b) {
    const Block blk = block_at(call, b);
    max_chunks = std::max(max_chunks, blk.n_chunks);
    max_rows = std::max(max_rows, blk.n_rows);
  }
  grow(&shared.chunk_ml, 2 * max_chunks * 2 * max_rows);
  grow(&shared.chunk_a, 2 * max_chunks * max_rows * s.head_dim);
  grow(&shared.state_ml, 2 * 2 * max_rows);
  grow(&shared.state_a, 2 * max_rows * s.head_dim);
  if (shared.n_syncs < plan.n_blocks) {
    shared.syncs = std::make_unique<BlockSync[]>(static_cast<size_t>(plan.n_blocks));
    shared.n_syncs = plan.n_blocks;
  }
  for (int64_t i = 0; i < plan.n_blocks; ++i) shared.syncs[i].reset();
  pool->run([&](int thread_index, int num_threads) {
    if (num_threads == 1) {  // the pool was busy and runs this inline
      for (int64_t t = 0; t < n_tasks; ++t) run_task(call, t);
    } else {
      blocks_shared(call, shared, pool, thread_index, num_threads, max_chunks, max_rows);
    }
  });
}

}  // namespace

void attention_isa(Isa isa, const AttentionShape& s, const float* q, const KvView& kv,
                   const uint8_t* mask, float* out, ThreadPool* pool) {
  attention_with(ops_kernels_for(isa, true), s, q, kv, mask, out, pool);
}

void attention(const AttentionShape& s, const float* q, const KvView& kv, const uint8_t* mask,
               float* out, ThreadPool* pool) {
  attention_with(ops_kernels_for(active_isa(), false), s, q, kv, mask, out, pool);
}

void attention_isa(Isa isa, const AttentionShape& s, const float* q, const void* k, const void* v,
                   KvType kv_type, const uint8_t* mask, float* out, ThreadPool* pool) {
  SPECDEC_CHECK(kv_type != KvType::kQ8, "attention: a q8_0 cache is read through its KvView");
  attention_isa(isa, s, q, KvView::contiguous(k, v, kv_type, s.n_past + s.n_new), mask, out, pool);
}

void attention(const AttentionShape& s, const float* q, const void* k, const void* v,
               KvType kv_type, const uint8_t* mask, float* out, ThreadPool* pool) {
  SPECDEC_CHECK(kv_type != KvType::kQ8, "attention: a q8_0 cache is read through its KvView");
  attention(s, q, KvView::contiguous(k, v, kv_type, s.n_past + s.n_new), mask, out, pool);
}

}  // namespace specdec
