// The paged KV cache of the CUDA backend (cuda_ops.h): kv_write, kv_copy_slot, paged_attention.
//
// paged_attention: one thread block of 128 threads (4 warps) per (query row, head), two passes
// over the row's candidate slots [0, n_past + n_new) in chunks of kChunk slots:
//   pass 1: every visible slot's score s = (q·k)·scale (a warp per slot: lane l sums the dims
//           2l, 2l+1, 2l+64, .. with fmaf in that order, then a fixed xor-shuffle tree), and the
//           exact maximum M of the scores (a max does not depend on the order);
//   pass 2: the same scores again (the same instructions, so the same bits), p = expf(s - M),
//           and, one visible slot after the other in slot order, L += p, acc[d] = fmaf(p, v[d],
//           acc[d]) (thread i owns the dims 2i, 2i+1); out = acc / L.
// The result of a (row, head) is a function of its q and of the K/V values of its visible slots
// in slot order only: not of the other rows, the chunking, nor the invisible slots between the
// visible ones (a tree-masked token gets the bits it gets decoded alone after its ancestors).
// K is read twice (no scratch of the scores); no split of long contexts over thread blocks.
//
// paged_attention_fast_kernel (SPECDEC_CUDA_ATTN=fast): the same arithmetic for every
// (row, head) - each visible slot's score from the same lane sums and tree, the same exact
// maximum, the same serial accumulation in slot order - so bitwise the legacy kernel's results,
// with the latency taken out:
// 256 threads; pass 1 computes each score once (a warp loads the K rows of kUnroll slots before
// reducing any) into shared memory ([max_visible] floats); pass 2 stages a chunk of kVChunk
// visible V rows in shared memory with every thread's loads in flight, then accumulates from it.
// (The legacy kernel waited for one V row per slot in its serial loop: ~4.5 ms a token for
// SmolLM2 at a few hundred cached tokens on an H100.)
//
// paged_attention_split_kernel + paged_attention_combine_kernel (the default; flash decoding):
// the fast kernel's passes over tiles of a row's visible slots (64 by default), one thread block
// per (row, head, tile), the tiles merged in order - below, at the kernels. Decode steps spread
// over many thread blocks: SmolLM2 on an H200 after a 960-token prompt 107 -> 606 tok/s, after
// 3,840 tokens 32 -> 430 (docs/perf-log/2026-11-27-session-25.md).
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_ops.h"

namespace specdec::cuda {
namespace {

constexpr int kAttnThreads = 128;
constexpr int kAttnWarps = kAttnThreads / 32;
constexpr int kChunk = 128;     // slots per chunk (pass 2's score tile)
constexpr int kMaxHeadDim = 256;  // 2 dims per thread in pass 2
// The fast kernel.
constexpr int kFastThreads = 256;
constexpr int kFastWarps = kFastThreads / 32;
constexpr int kUnroll = 4;                     // slots a warp loads before reducing
constexpr int kLanePairs = kMaxHeadDim / 64;   // K pairs per lane at most (head_dim / 64)
constexpr int kVChunk = 32;                    // V rows staged per step
constexpr int64_t kMaxScoreBytes = 160 << 10;  // beyond: the legacy kernel
// The split kernel: visible slots per tile by default (attention_tile()).
constexpr int64_t kDefaultTile = 64;

template <KvType K>
struct KvElem;
template <>
struct KvElem<KvType::kF16> {
  using T = __half;
  // The pair of elements (2p, 2p + 1) of a row, as floats (p: pair index; the row is 4-aligned).
  static __device__ __forceinline__ float2 pair(const void* row, int p) {
    const __half2 h = reinterpret_cast<const __half2*>(row)[p];
    return __half22float2(h);
  }
};
template <>
struct KvElem<KvType::kF32> {
  using T = float;
  static __device__ __forceinline__ float2 pair(const void* row, int p) {
    return reinterpret_cast<const float2*>(row)[p];
  }
};

// ---- kv_write -------------------------------------------------------------------------------------

template <KvType K>
__global__ void kv_write_kernel(typename KvElem<K>::T* kc, typename KvElem<K>::T* vc,
                                const int64_t* __restrict__ phys, int64_t n, int64_t row_elems,
                                const float* __restrict__ k, const float* __restrict__ v) {
  const int64_t total = n * row_elems;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / row_elems, e = i % row_elems;
    const int64_t dst = phys[t] * row_elems + e;
    if constexpr (K == KvType::kF16) {
      kc[dst] = __float2half_rn(k[i]);
      vc[dst] = __float2half_rn(v[i]);
    } else {
      kc[dst] = k[i];
      vc[dst] = v[i];
    }
  }
}

// ---- kv_copy_slot ---------------------------------------------------------------------------------

// Element e of the row, in layer l, of K (which = 0) and V (which = 1): blockIdx.y = 2 l + which.
template <class T>
__global__ void kv_copy_slot_kernel(T* k, T* v, int64_t layer_elems, int64_t row_elems,
                                    int64_t from, int64_t to) {
  const int64_t l = blockIdx.y / 2;
  T* base = (blockIdx.y % 2 == 0 ? k : v) + l * layer_elems;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < row_elems;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    base[to * row_elems + e] = base[from * row_elems + e];
  }
}

// ---- paged_attention ------------------------------------------------------------------------------

// The sequence whose rows [row0, row0 + n_new) hold `row` (seqs sorted by row0; sequences with
// n_new == 0 may share a row0 with the next one).
__device__ int64_t find_seq(const DeviceAttnSeq* seqs, int64_t n_seqs, int64_t row) {
  int64_t lo = 0, hi = n_seqs;  // first index with row0 > row
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (seqs[mid].row0 <= row) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  for (int64_t s = lo - 1; s >= 0; --s) {
    const DeviceAttnSeq& q = seqs[s];
    if (row >= q.row0 && row < q.row0 + q.n_new) return s;
    if (q.n_new > 0 && q.row0 + q.n_new <= row) break;  // earlier ones end before it too
  }
  return -1;
}

// One query row's view of its sequence's paged K/V (both kernels): which slots it sees and where
// (slot, KV head) lies in the layer's K or V.
template <KvType K>
struct AttnRow {
  int64_t n_past;
  int64_t i;              // query index within the sequence
  const int32_t* table;   // the sequence's block table
  const uint8_t* mrow;    // its mask row [n_new], or null (causal)
  int64_t n_slots;        // candidate slots: a causal row sees nothing past its own slot
  int64_t block_slots;
  int64_t head_offset;    // elements from a slot's start to the row's KV head
  int64_t row_stride;     // elements per slot

  __device__ AttnRow(const DeviceAttnSeq& seq, int64_t row, const int32_t* tables,
                     const uint8_t* masks, int64_t block_slots_, int kvh, int n_kv_heads,
                     int head_dim)
      : n_past(seq.n_past),
        i(row - seq.row0),
        table(tables + seq.table),
        mrow(seq.mask >= 0 ? masks + seq.mask + (row - seq.row0) * seq.n_new : nullptr),
        n_slots(seq.n_past + (seq.mask >= 0 ? seq.n_new : row - seq.row0 + 1)),
        block_slots(block_slots_),
        head_offset(static_cast<int64_t>(kvh) * head_dim),
        row_stride(static_cast<int64_t>(n_kv_heads) * head_dim) {}

  __device__ bool visible(int64_t slot) const {
    if (slot < n_past) return true;
    const int64_t j = slot - n_past;
    return mrow == nullptr ? j <= i : mrow[j] != 0;
  }
  // Byte offset of (slot, the row's KV head) in the layer's K or V.
  __device__ int64_t offset(int64_t slot) const {
    const int64_t phys = static_cast<int64_t>(table[slot / block_slots]) * block_slots +
                         slot % block_slots;
    return (phys * row_stride + head_offset) * (K == KvType::kF16 ? 2 : 4);
  }
};

template <KvType K>
__global__ void __launch_bounds__(kAttnThreads)
    paged_attention_kernel(const uint8_t* __restrict__ kc, const uint8_t* __restrict__ vc,
                           int n_kv_heads, int head_dim, int64_t block_slots,
                           const float* __restrict__ q, int64_t n_rows, int n_heads, float scale,
                           const DeviceAttnSeq* __restrict__ seqs, int64_t n_seqs,
                           const int32_t* __restrict__ tables, const uint8_t* __restrict__ masks,
                           float* __restrict__ out) {
  __shared__ __align__(16) float qs[kMaxHeadDim];
  __shared__ float scores[kChunk];
  __shared__ float warp_max[kAttnWarps];

  const int64_t row = static_cast<int64_t>(blockIdx.x) / n_heads;
  const int h = static_cast<int>(static_cast<int64_t>(blockIdx.x) % n_heads);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int n_pairs = head_dim / 2;
  float* o = out + (row * n_heads + h) * head_dim;

  const int64_t si = find_seq(seqs, n_seqs, row);  // the same in every thread
  if (si < 0) {
    for (int d = tid; d < head_dim; d += kAttnThreads) o[d] = 0.0f;
    return;
  }
  const AttnRow<K> r(seqs[si], row, tables, masks, block_slots, h / (n_heads / n_kv_heads),
                     n_kv_heads, head_dim);
  const int64_t n_slots = r.n_slots;

  for (int d = tid; d < head_dim; d += kAttnThreads) qs[d] = q[(row * n_heads + h) * head_dim + d];
  __syncthreads();

  // The score of a visible slot, computed by one whole warp (every lane gets it).
  auto score = [&](int64_t slot) -> float {
    const uint8_t* krow = kc + r.offset(slot);
    float a = 0.0f;
    for (int p = lane; p < n_pairs; p += 32) {
      const float2 kv = KvElem<K>::pair(krow, p);
      a = fmaf(qs[2 * p], kv.x, a);
      a = fmaf(qs[2 * p + 1], kv.y, a);
    }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
    return __fmul_rn(a, scale);
  };

  // Pass 1: the maximum score.
  float m = -INFINITY;
  for (int64_t slot = warp; slot < n_slots; slot += kAttnWarps) {
    if (!r.visible(slot)) continue;  // uniform over the warp
    const float s = score(slot);
    m = fmaxf(m, s);
  }
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  float big_m = warp_max[0];
  for (int w = 1; w < kAttnWarps; ++w) big_m = fmaxf(big_m, warp_max[w]);
  if (big_m == -INFINITY) {  // nothing visible
    for (int d = tid; d < head_dim; d += kAttnThreads) o[d] = 0.0f;
    return;
  }

  // Pass 2: weights and the weighted sum of V, slot by slot.
  float l_sum = 0.0f, acc0 = 0.0f, acc1 = 0.0f;
  const bool owns = tid < n_pairs;
  for (int64_t c0 = 0; c0 < n_slots; c0 += kChunk) {
    for (int j = warp; j < kChunk; j += kAttnWarps) {
      const int64_t slot = c0 + j;
      float s = -INFINITY;  // marks a slot not visible (or past the end)
      if (slot < n_slots && r.visible(slot)) s = score(slot);
      if (lane == 0) scores[j] = s;
    }
    __syncthreads();
    const int64_t in_chunk = n_slots - c0 < kChunk ? n_slots - c0 : kChunk;
    for (int j = 0; j < in_chunk; ++j) {
      const float s = scores[j];
      if (s == -INFINITY) continue;  // not visible (a visible score is finite or +-inf only
                                     // for inf inputs; -inf would weigh 0 anyway)
      const float p = expf(__fsub_rn(s, big_m));
      l_sum = __fadd_rn(l_sum, p);
      if (owns) {
        const float2 vv = KvElem<K>::pair(vc + r.offset(c0 + j), tid);
        acc0 = fmaf(p, vv.x, acc0);
        acc1 = fmaf(p, vv.y, acc1);
      }
    }
    __syncthreads();  // scores is rewritten by the next chunk
  }
  if (owns) {
    o[2 * tid] = __fdiv_rn(acc0, l_sum);
    o[2 * tid + 1] = __fdiv_rn(acc1, l_sum);
  }
}

// The fast kernel's two passes over the row's slots [s0, s1) (the split kernel's tiles use them
// too): every slot's score (-inf when not visible) into scores[0, s1 - s0) and their maximum
// big_m, then the serial accumulation in slot order: l_sum = sum of p, thread tid's acc0 / acc1 =
// sum of p * v over the dims 2 tid, 2 tid + 1 (p = expf(s - big_m)). big_m = -inf: nothing
// visible (l_sum, acc untouched). Every thread of the block calls it; qs holds the query.
template <KvType K>
__device__ __forceinline__ void attend_slots(const AttnRow<K>& r, const uint8_t* __restrict__ kc,
                                             const uint8_t* __restrict__ vc, int head_dim,
                                             float scale, const float* qs, int64_t s0,
                                             int64_t s1, float* scores,
                                             typename KvElem<K>::T* vtile, float* warp_max,
                                             float& big_m, float& l_sum, float& acc0,
                                             float& acc1) {
  using T = typename KvElem<K>::T;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int n_pairs = head_dim / 2;
  const int64_t n = s1 - s0;

  // Pass 1: every slot's score (-inf when not visible) and the maximum. A warp takes kUnroll
  // slots at a time: their K pairs are all loaded before the first is reduced. Each score is the
  // legacy kernel's: lane l sums its pairs l, l + 32, .. with fmaf in that order, then the same
  // xor-shuffle tree, then * scale.
  float m = -INFINITY;
  for (int64_t base = warp; base < n; base += static_cast<int64_t>(kFastWarps) * kUnroll) {
    float2 kk[kUnroll][kLanePairs];
    bool vis[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = base + static_cast<int64_t>(kFastWarps) * u;
      vis[u] = j < n && r.visible(s0 + j);  // uniform over the warp
      if (vis[u]) {
        const uint8_t* krow = kc + r.offset(s0 + j);
#pragma unroll
        for (int pp = 0; pp < kLanePairs; ++pp) {
          const int p = lane + 32 * pp;
          if (p < n_pairs) kk[u][pp] = KvElem<K>::pair(krow, p);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = base + static_cast<int64_t>(kFastWarps) * u;
      if (j >= n) break;
      float sc = -INFINITY;
      if (vis[u]) {
        float a = 0.0f;
#pragma unroll
        for (int pp = 0; pp < kLanePairs; ++pp) {
          const int p = lane + 32 * pp;
          if (p < n_pairs) {
            a = fmaf(qs[2 * p], kk[u][pp].x, a);
            a = fmaf(qs[2 * p + 1], kk[u][pp].y, a);
          }
        }
#pragma unroll
        for (int off = 16; off >= 1; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
        sc = __fmul_rn(a, scale);
        m = fmaxf(m, sc);
      }
      if (lane == 0) scores[j] = sc;
    }
  }
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  big_m = warp_max[0];
  for (int w = 1; w < kFastWarps; ++w) big_m = fmaxf(big_m, warp_max[w]);
  if (big_m == -INFINITY) return;

  // Pass 2: chunks of kVChunk slots - the visible slots' V rows staged (every thread's loads in
  // flight), then the legacy kernel's serial accumulation in slot order.
  const bool owns = tid < n_pairs;
  for (int64_t c0 = 0; c0 < n; c0 += kVChunk) {
    const int in_chunk = n - c0 < kVChunk ? static_cast<int>(n - c0) : kVChunk;
    for (int e = tid; e < in_chunk * n_pairs; e += kFastThreads) {
      const int j = e / n_pairs, p = e - j * n_pairs;
      if (scores[c0 + j] == -INFINITY) continue;  // not read below
      const T* vrow = reinterpret_cast<const T*>(vc + r.offset(s0 + c0 + j));
      if constexpr (K == KvType::kF16) {
        reinterpret_cast<__half2*>(vtile + j * head_dim)[p] =
            reinterpret_cast<const __half2*>(vrow)[p];
      } else {
        reinterpret_cast<float2*>(vtile + j * head_dim)[p] =
            reinterpret_cast<const float2*>(vrow)[p];
      }
    }
    __syncthreads();
    for (int j = 0; j < in_chunk; ++j) {
      const float sc = scores[c0 + j];
      if (sc == -INFINITY) continue;
      const float p = expf(__fsub_rn(sc, big_m));
      l_sum = __fadd_rn(l_sum, p);
      if (owns) {
        const float2 vv = KvElem<K>::pair(vtile + j * head_dim, tid);
        acc0 = fmaf(p, vv.x, acc0);
        acc1 = fmaf(p, vv.y, acc1);
      }
    }
    __syncthreads();  // the tile is rewritten by the next chunk
  }
}

template <KvType K>
__global__ void __launch_bounds__(kFastThreads)
    paged_attention_fast_kernel(const uint8_t* __restrict__ kc, const uint8_t* __restrict__ vc,
                                int n_kv_heads, int head_dim, int64_t block_slots,
                                const float* __restrict__ q, int64_t n_rows, int n_heads,
                                float scale, const DeviceAttnSeq* __restrict__ seqs,
                                int64_t n_seqs, const int32_t* __restrict__ tables,
                                const uint8_t* __restrict__ masks, int64_t score_cap,
                                float* __restrict__ out) {
  using T = typename KvElem<K>::T;
  __shared__ __align__(16) float qs[kMaxHeadDim];
  __shared__ float warp_max[kFastWarps];
  extern __shared__ __align__(16) uint8_t dyn[];
  // dyn: scores [score_cap] floats, then the V tile [kVChunk, head_dim] of T.
  float* scores = reinterpret_cast<float*>(dyn);
  T* vtile = reinterpret_cast<T*>(dyn + ((score_cap * 4 + 15) & ~int64_t{15}));

  const int64_t row = static_cast<int64_t>(blockIdx.x) / n_heads;
  const int h = static_cast<int>(static_cast<int64_t>(blockIdx.x) % n_heads);
  const int tid = static_cast<int>(threadIdx.x);
  const int n_pairs = head_dim / 2;
  float* o = out + (row * n_heads + h) * head_dim;

  const int64_t si = find_seq(seqs, n_seqs, row);
  if (si < 0) {
    for (int d = tid; d < head_dim; d += kFastThreads) o[d] = 0.0f;
    return;
  }
  const AttnRow<K> r(seqs[si], row, tables, masks, block_slots, h / (n_heads / n_kv_heads),
                     n_kv_heads, head_dim);
  const int64_t n_slots = r.n_slots;
  if (n_slots > score_cap) {  // the caller's bound was wrong: a loud result, not a silent one
    for (int d = tid; d < head_dim; d += kFastThreads) o[d] = __int_as_float(0x7fc00000);
    return;
  }
  for (int d = tid; d < head_dim; d += kFastThreads) {
    qs[d] = q[(row * n_heads + h) * head_dim + d];
  }
  __syncthreads();

  float big_m = -INFINITY, l_sum = 0.0f, acc0 = 0.0f, acc1 = 0.0f;
  attend_slots<K>(r, kc, vc, head_dim, scale, qs, 0, n_slots, scores, vtile, warp_max, big_m,
                  l_sum, acc0, acc1);
  if (big_m == -INFINITY) {
    for (int d = tid; d < head_dim; d += kFastThreads) o[d] = 0.0f;
    return;
  }
  if (tid < n_pairs) {
    o[2 * tid] = __fdiv_rn(acc0, l_sum);
    o[2 * tid + 1] = __fdiv_rn(acc1, l_sum);
  }
}

// ---- the split kernel (flash decoding) --------------------------------------------------------
//
// A row's visible slots, in slot order, are cut into tiles of `tile` (attention_tile(), the same
// for every launch of a process) by their rank among the visible ones (tile t: ranks
// [t tile, (t + 1) tile)); thread block (row, head, t) runs the fast
// kernel's passes over the slots that hold its ranks. A row of one tile writes its result as the
// fast kernel does (bitwise the fast and the legacy kernel's); a row of several writes per tile
// (its max, its sum of p, its weighted V) and the combine kernel merges them in tile order:
//   M = max_t m_t;  w_t = expf(m_t - M);  L = sum_t l_t w_t;  out = (sum_t acc_t w_t) / L.
// The tiles of a row depend only on its visible slots, so a row's bits are the same in any batch,
// tree or launch (batch invariance), and decode steps at long contexts spread over many thread
// blocks instead of one per (row, head).

// Scratch of the split kernel per (row, head): the tile count (int32 [n_rows, n_heads]), then
// per tile [m, l, acc (head_dim)] (float [n_rows, n_heads, max_tiles, head_dim + 2]).
template <KvType K>
__global__ void __launch_bounds__(kFastThreads)
    paged_attention_split_kernel(const uint8_t* __restrict__ kc, const uint8_t* __restrict__ vc,
                                 int n_kv_heads, int head_dim, int64_t block_slots,
                                 const float* __restrict__ q, int64_t n_rows, int n_heads,
                                 float scale, const DeviceAttnSeq* __restrict__ seqs,
                                 int64_t n_seqs, const int32_t* __restrict__ tables,
                                 const uint8_t* __restrict__ masks, int64_t score_cap,
                                 int64_t tile, int64_t max_tiles, int32_t* __restrict__ tile_count,
                                 float* __restrict__ part, float* __restrict__ out) {
  using T = typename KvElem<K>::T;
  __shared__ __align__(16) float qs[kMaxHeadDim];
  __shared__ float warp_max[kFastWarps];
  __shared__ int64_t range[2];
  extern __shared__ __align__(16) uint8_t dyn[];
  float* scores = reinterpret_cast<float*>(dyn);
  T* vtile = reinterpret_cast<T*>(dyn + ((score_cap * 4 + 15) & ~int64_t{15}));

  const int64_t row = static_cast<int64_t>(blockIdx.x) / n_heads;
  const int h = static_cast<int>(static_cast<int64_t>(blockIdx.x) % n_heads);
  const int64_t t = blockIdx.y;
  const int tid = static_cast<int>(threadIdx.x);
  const int n_pairs = head_dim / 2;
  const int64_t rh = row * n_heads + h;
  float* o = out + rh * head_dim;

  const int64_t si = find_seq(seqs, n_seqs, row);
  if (si < 0) {
    if (t == 0) {
      if (tid == 0) tile_count[rh] = 0;
      for (int d = tid; d < head_dim; d += kFastThreads) o[d] = 0.0f;
    }
    return;
  }
  const AttnRow<K> r(seqs[si], row, tables, masks, block_slots, h / (n_heads / n_kv_heads),
                     n_kv_heads, head_dim);
  // Visible new slots: i + 1 (causal), or the ones the mask row marks.
  const int64_t n_new_slots = r.n_slots - r.n_past;
  int64_t vis_new = n_new_slots;
  if (r.mrow != nullptr) {
    vis_new = 0;
    for (int64_t base = 0; base < n_new_slots; base += kFastThreads) {
      const int64_t j = base + tid;
      vis_new += __syncthreads_count(j < n_new_slots && r.mrow[j] != 0);
    }
  }
  const int64_t visible = r.n_past + vis_new;
  const int64_t n_tiles = (visible + tile - 1) / tile;
  if (t == 0 && tid == 0) tile_count[rh] = static_cast<int32_t>(n_tiles);
  if (visible == 0) {
    if (t == 0) {
      for (int d = tid; d < head_dim; d += kFastThreads) o[d] = 0.0f;
    }
    return;
  }
  if (t >= n_tiles) return;
  // The slots of ranks [a, b): past slots are ranks themselves, and so are a causal row's new
  // ones; a masked row's k-th visible new slot is found by a scan.
  const int64_t a = t * tile, b = min(visible, a + tile);
  if (tid == 0) {
    int64_t s0 = a, s_last = b - 1;
    if (r.mrow != nullptr && b - 1 >= r.n_past) {
      int64_t rank = r.n_past;
      for (int64_t j = 0; j < n_new_slots; ++j) {
        if (r.mrow[j] == 0) continue;
        if (rank == a) s0 = r.n_past + j;
        if (rank == b - 1) {
          s_last = r.n_past + j;
          break;
        }
        ++rank;
      }
    }
    range[0] = s0;
    range[1] = s_last + 1;
  }
  for (int d = tid; d < head_dim; d += kFastThreads) qs[d] = q[rh * head_dim + d];
  __syncthreads();
  const int64_t s0 = range[0], s1 = range[1];
  if (s1 - s0 > score_cap) {  // the caller's bound was wrong: a loud result, not a silent one
    if (t == 0) {
      for (int d = tid; d < head_dim; d += kFastThreads) o[d] = __int_as_float(0x7fc00000);
    }
    return;
  }
  float big_m = -INFINITY, l_sum = 0.0f, acc0 = 0.0f, acc1 = 0.0f;
  attend_slots<K>(r, kc, vc, head_dim, scale, qs, s0, s1, scores, vtile, warp_max, big_m, l_sum,
                  acc0, acc1);
  if (n_tiles == 1) {
    if (tid < n_pairs) {
      o[2 * tid] = __fdiv_rn(acc0, l_sum);
      o[2 * tid + 1] = __fdiv_rn(acc1, l_sum);
    }
    return;
  }
  float* pt = part + (rh * max_tiles + t) * (head_dim + 2);
  if (tid == 0) {
    pt[0] = big_m;
    pt[1] = l_sum;
  }
  if (tid < n_pairs) {
    pt[2 + 2 * tid] = acc0;
    pt[3 + 2 * tid] = acc1;
  }
}

// One thread block per (row, head) of several tiles: the tiles merged in tile order.
__global__ void __launch_bounds__(kMaxHeadDim / 2)
    paged_attention_combine_kernel(int64_t n_rh, int head_dim, int64_t max_tiles,
                                   const int32_t* __restrict__ tile_count,
                                   const float* __restrict__ part, float* __restrict__ out) {
  const int64_t rh = blockIdx.x;
  if (rh >= n_rh) return;
  const int64_t n_tiles = tile_count[rh];
  if (n_tiles <= 1) return;  // written by the split kernel
  const int tid = static_cast<int>(threadIdx.x);
  const int n_pairs = head_dim / 2;
  const int64_t stride = head_dim + 2;
  const float* pt = part + rh * max_tiles * stride;
  float big_m = pt[0];
  for (int64_t t = 1; t < n_tiles; ++t) big_m = fmaxf(big_m, pt[t * stride]);
  float l_sum = 0.0f, acc0 = 0.0f, acc1 = 0.0f;
  for (int64_t t = 0; t < n_tiles; ++t) {
    const float w = expf(__fsub_rn(pt[t * stride], big_m));
    l_sum = __fadd_rn(l_sum, __fmul_rn(pt[t * stride + 1], w));
    if (tid < n_pairs) {
      acc0 = __fadd_rn(acc0, __fmul_rn(pt[t * stride + 2 + 2 * tid], w));
      acc1 = __fadd_rn(acc1, __fmul_rn(pt[t * stride + 3 + 2 * tid], w));
    }
  }
  if (tid < n_pairs) {
    float* o = out + rh * head_dim;
    o[2 * tid] = __fdiv_rn(acc0, l_sum);
    o[2 * tid + 1] = __fdiv_rn(acc1, l_sum);
  }
}

std::atomic<bool>& attention_legacy_flag() {
  static std::atomic<bool> f{[] {
    const char* e = std::getenv("SPECDEC_CUDA_ATTN");
    return e != nullptr && std::strcmp(e, "legacy") == 0;
  }()};
  return f;
}

std::atomic<bool>& attention_split_flag() {
  static std::atomic<bool> f{[] {
    const char* e = std::getenv("SPECDEC_CUDA_ATTN");
    return e == nullptr || (std::strcmp(e, "fast") != 0 && std::strcmp(e, "legacy") != 0);
  }()};
  return f;
}

// The split kernel's scratch: tile counts and partial results.
detail::StreamScratch& split_scratch() {
  static auto* s = new detail::StreamScratch("paged_attention: split scratch", size_t{1} << 20);
  return *s;
}

int64_t checked_grid(int64_t blocks, const char* op) {
  if (blocks > 0x7fffffffLL) throw Error(std::string("cuda::") + op + ": grid too large");
  return blocks;
}

unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks < 1 ? 1 : blocks) : 65536);
}

void check_layer(const DeviceKvLayer& layer, const char* op) {
  if (layer.k == nullptr || layer.v == nullptr || layer.n_kv_heads <= 0 || layer.head_dim <= 0 ||
      layer.block_slots <= 0) {
    throw Error(std::string("cuda::") + op + ": bad KV layer");
  }
}

}  // namespace

void kv_write(const DeviceKvLayer& layer, const int64_t* phys_slots, int64_t n, const float* k,
              const float* v) {
  if (n <= 0) return;
  check_layer(layer, "kv_write");
  const int64_t row_elems = static_cast<int64_t>(layer.n_kv_heads) * layer.head_dim;
  const unsigned grid = grid_for(n * row_elems, 256);
  if (layer.type == KvType::kF16) {
    kv_write_kernel<KvType::kF16><<<grid, 256, 0, detail::stream()>>>(
        static_cast<__half*>(layer.k), static_cast<__half*>(layer.v), phys_slots, n, row_elems, k,
        v);
  } else {
    kv_write_kernel<KvType::kF32><<<grid, 256, 0, detail::stream()>>>(
        static_cast<float*>(layer.k), static_cast<float*>(layer.v), phys_slots, n, row_elems, k,
        v);
  }
  CUDA_CHECK_LAUNCH("kv_write_kernel");
}

void kv_copy_slot(void* k, void* v, KvType type, int n_layers, int64_t layer_elems,
                  int64_t row_elems, int64_t from, int64_t to) {
  if (from == to || n_layers <= 0 || row_elems <= 0) return;
  if (n_layers > 30000) throw Error("cuda::kv_copy_slot: too many layers");
  const dim3 grid(grid_for(row_elems, 256), static_cast<unsigned>(2 * n_layers));
  if (type == KvType::kF16) {
    kv_copy_slot_kernel<uint16_t><<<grid, 256, 0, detail::stream()>>>(
        static_cast<uint16_t*>(k), static_cast<uint16_t*>(v), layer_elems, row_elems, from, to);
  } else {
    kv_copy_slot_kernel<float><<<grid, 256, 0, detail::stream()>>>(
        static_cast<float*>(k), static_cast<float*>(v), layer_elems, row_elems, from, to);
  }
  CUDA_CHECK_LAUNCH("kv_copy_slot_kernel");
}

void paged_attention(const DeviceKvLayer& layer, const float* q, int64_t n_rows, int n_heads,
                     float scale, const DeviceAttnSeq* seqs, int64_t n_seqs,
                     const int32_t* tables, const uint8_t* masks, int64_t max_visible,
                     float* out) {
  if (n_rows <= 0) return;
  check_layer(layer, "paged_attention");
  if (n_heads <= 0 || n_heads % layer.n_kv_heads != 0) {
    throw Error("cuda::paged_attention: n_heads " + std::to_string(n_heads) +
                " is not a multiple of n_kv_heads " + std::to_string(layer.n_kv_heads));
  }
  if (layer.head_dim % 2 != 0 || layer.head_dim > kMaxHeadDim) {
    throw Error("cuda::paged_attention: head_dim " + std::to_string(layer.head_dim) +
                " must be even and at most " + std::to_string(kMaxHeadDim));
  }
  const int64_t blocks = checked_grid(n_rows * n_heads, "paged_attention");
  const auto* kc = static_cast<const uint8_t*>(layer.k);
  const auto* vc = static_cast<const uint8_t*>(layer.v);
  const int64_t elem = static_cast<int64_t>(kv_type_bytes(layer.type));
  const int64_t score_cap = std::max<int64_t>(max_visible, 1);
  const int64_t smem = ((score_cap * 4 + 15) & ~int64_t{15}) + kVChunk * layer.head_dim * elem;
  // Once: the fast kernel may take up to kMaxScoreBytes of scores plus the V tile, or what the
  // device allows a thread block (less on some GPUs); longer contexts take the legacy kernel.
  static const int64_t smem_max = [] {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    const int bytes = std::min(static_cast<int>(kMaxScoreBytes + kVChunk * kMaxHeadDim * 4),
                               optin - 1024);  // the static shared memory: qs, warp_max
    CUDA_CHECK(cudaFuncSetAttribute(paged_attention_fast_kernel<KvType::kF16>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    CUDA_CHECK(cudaFuncSetAttribute(paged_attention_fast_kernel<KvType::kF32>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return static_cast<int64_t>(bytes);
  }();
  if (!attention_legacy() && attention_split()) {
    // The split kernel: tiles of `tile` visible slots; a tile's slots span at most `tile` plus
    // the invisible new slots of a masked row (fewer than n_rows), and at most max_visible.
    const int64_t tile = attention_tile();
    const int64_t max_tiles = (score_cap + tile - 1) / tile;
    const int64_t cap = std::min(score_cap, tile + n_rows);
    const int64_t smem_split = ((cap * 4 + 15) & ~int64_t{15}) + kVChunk * layer.head_dim * elem;
    static const bool split_attr = [] {
      const int bytes = static_cast<int>(kMaxScoreBytes + kVChunk * kMaxHeadDim * 4);
      int dev = 0, optin = 0;
      CUDA_CHECK(cudaGetDevice(&dev));
      CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
      const int allowed = std::min(bytes, optin - 1024);
      CUDA_CHECK(cudaFuncSetAttribute(paged_attention_split_kernel<KvType::kF16>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, allowed));
      CUDA_CHECK(cudaFuncSetAttribute(paged_attention_split_kernel<KvType::kF32>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, allowed));
      return true;
    }();
    (void)split_attr;
    if (smem_split <= smem_max && max_tiles <= 65535) {
      const int64_t n_rh = n_rows * n_heads;
      const size_t count_bytes = (static_cast<size_t>(n_rh) * 4 + 15) & ~size_t{15};
      const size_t part_bytes =
          max_tiles > 1 ? static_cast<size_t>(n_rh * max_tiles * (layer.head_dim + 2)) * 4 : 0;
      auto* base = static_cast<uint8_t*>(split_scratch().get(count_bytes + part_bytes));
      auto* tile_count = reinterpret_cast<int32_t*>(base);
      auto* part = reinterpret_cast<float*>(base + count_bytes);
      const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(max_tiles));
      if (layer.type == KvType::kF16) {
        paged_attention_split_kernel<KvType::kF16>
            <<<grid, kFastThreads, static_cast<size_t>(smem_split), detail::stream()>>>(
                kc, vc, layer.n_kv_heads, layer.head_dim, layer.block_slots, q, n_rows, n_heads,
                scale, seqs, n_seqs, tables, masks, cap, tile, max_tiles, tile_count, part, out);
      } else {
        paged_attention_split_kernel<KvType::kF32>
            <<<grid, kFastThreads, static_cast<size_t>(smem_split), detail::stream()>>>(
                kc, vc, layer.n_kv_heads, layer.head_dim, layer.block_slots, q, n_rows, n_heads,
                scale, seqs, n_seqs, tables, masks, cap, tile, max_tiles, tile_count, part, out);
      }
      CUDA_CHECK_LAUNCH("paged_attention_split_kernel");
      if (max_tiles > 1) {
        paged_attention_combine_kernel<<<static_cast<unsigned>(blocks), kMaxHeadDim / 2, 0,
                                         detail::stream()>>>(n_rh, layer.head_dim, max_tiles,
                                                             tile_count, part, out);
        CUDA_CHECK_LAUNCH("paged_attention_combine_kernel");
      }
      return;
    }
  }
  if (!attention_legacy() && smem <= smem_max) {
    if (layer.type == KvType::kF16) {
      paged_attention_fast_kernel<KvType::kF16>
          <<<static_cast<unsigned>(blocks), kFastThreads, static_cast<size_t>(smem),
             detail::stream()>>>(kc, vc, layer.n_kv_heads, layer.head_dim, layer.block_slots, q,
                                 n_rows, n_heads, scale, seqs, n_seqs, tables, masks, score_cap,
                                 out);
    } else {
      paged_attention_fast_kernel<KvType::kF32>
          <<<static_cast<unsigned>(blocks), kFastThreads, static_cast<size_t>(smem),
             detail::stream()>>>(kc, vc, layer.n_kv_heads, layer.head_dim, layer.block_slots, q,
                                 n_rows, n_heads, scale, seqs, n_seqs, tables, masks, score_cap,
                                 out);
    }
    CUDA_CHECK_LAUNCH("paged_attention_fast_kernel");
    return;
  }
  if (layer.type == KvType::kF16) {
    paged_attention_kernel<KvType::kF16>
        <<<static_cast<unsigned>(blocks), kAttnThreads, 0, detail::stream()>>>(
            kc, vc, layer.n_kv_heads, layer.head_dim, layer.block_slots, q, n_rows, n_heads,
            scale, seqs, n_seqs, tables, masks, out);
  } else {
    paged_attention_kernel<KvType::kF32>
        <<<static_cast<unsigned>(blocks), kAttnThreads, 0, detail::stream()>>>(
            kc, vc, layer.n_kv_heads, layer.head_dim, layer.block_slots, q, n_rows, n_heads,
            scale, seqs, n_seqs, tables, masks, out);
  }
  CUDA_CHECK_LAUNCH("paged_attention_kernel");
}

void set_attention_legacy(bool legacy) { attention_legacy_flag().store(legacy); }
bool attention_legacy() { return attention_legacy_flag().load(); }
void set_attention_split(bool split) { attention_split_flag().store(split); }
bool attention_split() { return attention_split_flag().load(); }

int64_t attention_tile() {
  static const int64_t tile = [] {
    const char* e = std::getenv("SPECDEC_CUDA_ATTN_TILE");
    if (e == nullptr || *e == '\0') return kDefaultTile;
    const long v = std::strtol(e, nullptr, 10);
    if (v < 16 || v > 4096) {
      throw Error("SPECDEC_CUDA_ATTN_TILE=" + std::string(e) + ": give 16 to 4096 slots");
    }
    return static_cast<int64_t>(v);
  }();
  return tile;
}

}  // namespace specdec::cuda
