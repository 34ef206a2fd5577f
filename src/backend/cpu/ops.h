// Element-wise and attention ops of the transformer forward pass, on float32 buffers (the cached
// K/V that attention reads may also be IEEE halves, see KvType).
// Each op has a scalar reference (`*_ref` in ops_ref.cpp) and SIMD variants chosen at run time;
// the conformance test compares every variant with the reference.
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_features.h"
#include "backend/kv_type.h"
#include "backend/kv_view.h"

namespace specdec {

class ThreadPool;

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * weight[:]    x, y: [n_rows, dim]; may alias.
void rmsnorm(const float* x, const float* weight, float eps, int64_t n_rows, int64_t dim, float* y);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).  n elements; out may alias.
void swiglu(const float* gate, const float* up, int64_t n, float* out);

// In place: x[i] = exp(x[i] - max) / Σ.  n >= 1.
void softmax(float* x, int64_t n);

// log Σ exp(x[i]), through softmax's kernels; x is left as exp(x[i] - max).  n >= 1.
float log_sum_exp_inplace(float* x, int64_t n);

enum class RopeStyle {
  kNorm,  // rotate adjacent pairs (x[2i], x[2i+1]): GGUF `llama` (q/k weights permuted)
  kNeox,  // rotate halves (x[i], x[i + rope_dim/2])
};

// In place on x: [n_tokens, n_heads, head_dim]; token t is at position positions[t].
// The first rope_dim dims of each head rotate with theta_i = pos * freq_scale *
// freq_base^(-2i/rope_dim) (float math, as llama.cpp); the rest pass through. rope_dim even.
void rope(float* x, const int32_t* positions, int64_t n_tokens, int n_heads, int head_dim,
          int rope_dim, float freq_base, float freq_scale, RopeStyle style);
// The same in two steps, so that a forward pass computes the angles once for all layers:
//   rope_angles: cos_sin [n_tokens, rope_dim / 2, 2] = (cos theta_i, sin theta_i) per token;
//   rope_apply: rotates x [n_tokens, n_heads, head_dim] with them. rope() == angles + apply.
void rope_angles(const int32_t* positions, int64_t n_tokens, int rope_dim, float freq_base,
                 float freq_scale, float* cos_sin);
void rope_apply(float* x, const float* cos_sin, int64_t n_tokens, int n_heads, int head_dim,
                int rope_dim, RopeStyle style);

// IEEE half <-> float for n elements (the f16 KV cache). f32_to_f16 rounds to nearest even
// (overflow to inf; a NaN stays a NaN, its payload is not specified); f16_to_f32 is exact.
void f32_to_f16(const float* x, int64_t n, uint16_t* y);
void f16_to_f32(const uint16_t* x, int64_t n, float* y);

// Attention of n_new query tokens over a sequence's KV rows [0, n_past + n_new):
//   q:   [n_new, n_heads, head_dim]
//   k,v: [n_past + n_new, n_kv_heads, head_dim] (row j of the cache = token slot j; the new
//        tokens' K/V are already written at slots n_past ..), elements of kv_type; for kF16, K
//        is in tiles of 16 slots instead (backend/k_tiles.h: [ceil(slots / 16), n_kv_heads,
//        head_dim, 16], the whole last tile allocated). f16 values enter the arithmetic exactly,
//        so the result is that of the float cache holding the same values.
//        kQ8 (only through a KvView, which carries the scales): K tiles and V rows of int8 codes
//        c with a scale d per (slot, KV head). The arithmetic is that of the float cache
//        holding the codes, except that each score is multiplied by its slot's K scale before
//        the softmax (s_j = <q, c_j> · dk_j) and each p by its slot's V scale before Σ p·v
//        (a += (p_j · dv_j) · c_j); the softmax sum l takes the unscaled p. So a q8_0 score
//        costs the f16 one's instructions, and the invariance below holds as for f16.
//   mask: [n_new, n_new] row-major, mask[i * n_new + j] != 0 if new token i may attend to new
//        token j; nullptr means causal (j <= i). Every query sees all n_past cached slots.
//   out: [n_new, n_heads, head_dim]
// GQA: query head h reads KV head h / (n_heads / n_kv_heads). scale usually 1/sqrt(head_dim).
// n_new == 0 is a no-op; a query that sees no slot at all gets zeros. The numerics are those of
// a flash-attention pass over fixed chunks of kAttnChunk visible slots, each with its own max,
// merged in order (attention_driver.cpp). Scratch grows to the largest call seen and is reused.
// Bit-exact invariance: a query head's output depends only on its q and the contents of its
// visible slots in slot order - not on n_new, the mask of other queries, the thread count or how
// the work is split - so a token verified in a batch or tree gets exactly the output it gets when
// decoded alone (n_new = 1 after its visible slots).
struct AttentionShape {
  int64_t n_past = 0;
  int64_t n_new = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;
};
void attention(const AttentionShape& s, const float* q, const void* k, const void* v,
               KvType kv_type, const uint8_t* mask, float* out, ThreadPool* pool);
// The same over the slots of a KvView (a paged cache's blocks through the sequence's block
// table, or a contiguous cache): the same bits as a contiguous cache holding the same values.
void attention(const AttentionShape& s, const float* q, const KvView& kv, const uint8_t* mask,
               float* out, ThreadPool* pool);
// The same over a float cache.
inline void attention(const AttentionShape& s, const float* q, const float* k, const float* v,
                      const uint8_t* mask, float* out, ThreadPool* pool) {
  attention(s, q, k, v, KvType::kF32, mask, out, pool);
}

// Index of the largest value (first one on ties). n >= 1.
int64_t argmax(const float* x, int64_t n);

// Explicit-variant entry points for the conformance test.
void rmsnorm_isa(Isa isa, const float* x, const float* weight, float eps, int64_t n_rows,
                 int64_t dim, float* y);
void swiglu_isa(Isa isa, const float* gate, const float* up, int64_t n, float* out);
void softmax_isa(Isa isa, float* x, int64_t n);
void f32_to_f16_isa(Isa isa, const float* x, int64_t n, uint16_t* y);
void f16_to_f32_isa(Isa isa, const uint16_t* x, int64_t n, float* y);
void rope_apply_isa(Isa isa, float* x, const float* cos_sin, int64_t n_tokens, int n_heads,
                    int head_dim, int rope_dim, RopeStyle style);
void attention_isa(Isa isa, const AttentionShape& s, const float* q, const void* k, const void* v,
                   KvType kv_type, const uint8_t* mask, float* out, ThreadPool* pool);
void attention_isa(Isa isa, const AttentionShape& s, const float* q, const KvView& kv,
                   const uint8_t* mask, float* out, ThreadPool* pool);
inline void attention_isa(Isa isa, const AttentionShape& s, const float* q, const float* k,
                          const float* v, const uint8_t* mask, float* out, ThreadPool* pool) {
  attention_isa(isa, s, q, k, v, KvType::kF32, mask, out, pool);
}

// Visible-list positions per attention chunk: the softmax of a query is computed chunk by chunk
// (each chunk with its own max) and the chunks are merged in order. Part of the numerics.
constexpr int kAttnChunk = 64;

// Floats of the packed form of n_q query rows for OpsKernels::attn_scores (every variant's
// packing fits in it).
inline int64_t attn_packed_floats(int n_q, int head_dim) {
  return static_cast<int64_t>((n_q + 3) / 4 * 4) * ((head_dim + 3) / 4 * 4);
}

// Memory the caller reads next (say, the K or V rows of its next piece of attention work), for
// an attention kernel to prefetch while it computes: a hint - the kernel never reads it, and its
// results never depend on it. bytes = 0: nothing.
struct AttnPrefetch {
  const void* begin = nullptr;
  int64_t bytes = 0;
};

// Issues the prefetches of a hint's cache lines spread over the `steps` steps of a kernel (an
// equal share per step() call, the last ones possibly empty), into L2 (prefetcht1): the driver's
// hints are used a few kernel calls later, after more data than L1 holds.
class AttnPrefetchCursor {
 public:
  AttnPrefetchCursor(AttnPrefetch hint, int64_t steps) {
    if (hint.bytes <= 0 || steps <= 0) return;
    const uintptr_t begin = reinterpret_cast<uintptr_t>(hint.begin);
    const uintptr_t first = begin & ~uintptr_t{63};
    const uintptr_t last = begin + static_cast<uintptr_t>(hint.bytes);
    next_ = reinterpret_cast<const char*>(first);
    end_ = reinterpret_cast<const char*>(last);
    const int64_t lines = static_cast<int64_t>((last - first + 63) / 64);
    per_step_ = static_cast<int>((lines + steps - 1) / steps);
  }
  // Always inlined: GCC deems a function whose only effect is __builtin_prefetch pure and drops
  // the calls to it.
  [[gnu::always_inline]] void step() {
    for (int i = 0; i < per_step_ && next_ < end_; ++i, next_ += 64) {
      __builtin_prefetch(next_, 0, 2);
    }
  }
  // Whatever is left (a kernel that made fewer steps than it planned).
  [[gnu::always_inline]] void rest() {
    for (; next_ < end_; next_ += 64) __builtin_prefetch(next_, 0, 2);
  }

 private:
  const char* next_ = nullptr;
  const char* end_ = nullptr;
  int per_step_ = 0;
};

// Per-variant kernels behind the entry points above: ops.cpp dispatches on the Isa to one of
// these tables (ops_ref.cpp, ops_avx2.cpp, ops_avx512.cpp), attention_driver.cpp owns the
// attention driver (threading, masks, scratch); the tables hold only the inner loops. Not for
// other callers.
//
// Attention, for the rows (query vectors) of one KV head and one chunk of kAttnChunk visible
// positions, in log2 units (q is packed times scale·log2(e), so exp becomes exp2): attn_scores
// fills a [n_q, kAttnChunk] tile, attn_chunk_softmax turns each row into 2^(score - row max)
// (zero past the row's visible count) with its max m and sum l, attn_accumulate forms
// a = Σ p·v, and the merge folds (m, l, a) into the running (M, L, A). The SIMD variants'
// 2^x floors at 2^-125 (a result below the normal range would cost a microcode assist): weights
// that small only ever scale a zero state or terms far below a float's resolution of the sum.
// For the batch invariance every per-row result must depend only on that row's inputs, never on
// n_q, the row's index or how many K/V rows a call covers.
struct OpsKernels {
  void (*rmsnorm)(const float* x, const float* weight, float eps, int64_t n_rows, int64_t dim,
                  float* y);
  void (*swiglu)(const float* gate, const float* up, int64_t n, float* out);
  // max_i x[i]. n >= 1.
  float (*row_max)(const float* x, int64_t n);
  // x[i] = exp(x[i] - max) in place; returns Σ x[i]. n >= 1.
  float (*exp_shifted_sum)(float* x, int64_t n, float max);
  // x[i] *= a.
  void (*scale)(float* x, int64_t n, float a);
  // packed = the variant's form of q·mult for n_q rows of head_dim floats that come in runs of
  // run_rows consecutive rows, run_stride floats from run to run: row r at
  // q + (r / run_rows) * run_stride + (r % run_rows) * head_dim (so the rows of a KV head's query
  // heads over several tokens pack without a copy). packed: [attn_packed_floats(n_q, head_dim)].
  void (*attn_pack_q)(const float* q, int n_q, int run_rows, int64_t run_stride, int head_dim,
                      float mult, float* packed);
  // s[r * ld_s + j] = <q[r], k[j * k_stride ..]>   packed q of n_q rows, j < n_rows.
  // Each score must come out bitwise the same whatever n_q, n_rows, r and j are (one fixed
  // instruction sequence per dot product). `next`: memory to prefetch meanwhile.
  void (*attn_scores)(const float* packed_q, int n_q, const float* k, int64_t k_stride,
                      int64_t n_rows, int head_dim, float* s, int64_t ld_s, AttnPrefetch next);
  // Row r of s (kAttnChunk columns): n = n_valid[r] (0..kAttnChunk) scores are valid.
  // m[r] = max of them, s[r, j] = 2^(s[r, j] - m[r]) for j < n and 0 for n <= j < kAttnChunk,
  // l[r] = Σ_j s[r, j] summed in a fixed order over the kAttnChunk columns (so the zeros past n
  // change nothing). n = 0: m[r] = -inf, l[r] = 0, the row all zeros.
  void (*attn_chunk_softmax)(float* s, int64_t ld_s, int n_q, const int32_t* n_valid, float* m,
                             float* l);
  // out[r] += Σ_j p[r * ld_p + j] * v[j * v_stride ..]   out: [n_q, head_dim], j < n_rows.
  // Each output element must be updated once per j, in order j = 0, 1, .., from its current
  // value, p and v alone (no state carried within a call), so splitting the rows over calls
  // changes nothing, and a step with p = 0 leaves it unchanged. `next`: memory to prefetch.
  void (*attn_accumulate)(const float* p, int64_t ld_p, int n_q, const float* v, int64_t v_stride,
                          int64_t n_rows, int head_dim, float* out, AttnPrefetch next);
  // The merge of a chunk into the running state (M, L, A), which starts at (-inf, 0, 0), in two
  // steps. attn_merge_weights, for each row r with m[r] > -inf: M' = max(M[r], m[r]),
  // wo[r] = 2^(M[r] - M'), wn[r] = 2^(m[r] - M'), L[r] = L[r]·wo[r] + l[r]·wn[r], M[r] = M';
  // for a row with m[r] = -inf (nothing visible in the chunk): wo[r] = 1, wn[r] = 0, M and L
  // unchanged. Then each A element becomes A·wo + (a·wn) by one fixed sequence, either from a
  // stored a (attn_merge_rows) or fused with the accumulation of a from zero
  // (attn_accumulate_merge) - bitwise the same.
  void (*attn_merge_weights)(const float* m, const float* l, int n_q, float* big_m, float* big_l,
                             float* wo, float* wn);
  // big_a[r] = big_a[r]·wo[r] + a[r]·wn[r]   a, big_a: [n_q, head_dim].
  void (*attn_merge_rows)(const float* a, int n_q, int head_dim, const float* wo, const float* wn,
                          float* big_a);
  // a = Σ_j p[r * ld_p + j] * v[j * v_stride ..] from zero, as attn_accumulate, then
  // big_a[r] = big_a[r]·wo[r] + a[r]·wn[r] as attn_merge_rows.   big_a: [n_q, head_dim].
  void (*attn_accumulate_merge)(const float* p, int64_t ld_p, int n_q, const float* v,
                                int64_t v_stride, int64_t n_rows, int head_dim, const float* wo,
                                const float* wn, float* big_a, AttnPrefetch next);
  // y[i] = half(x[i]) (round to nearest even), i < n.
  void (*f32_to_f16)(const float* x, int64_t n, uint16_t* y);
  // dst[r * cols + c] = float(src[r * src_stride + c]) for r < n_rows, c < cols (exact): the
  // attention driver's f16 K/V rows of one KV head, into a float tile.
  void (*f16_to_f32_rows)(const uint16_t* src, int64_t src_stride, int64_t n_rows, int cols,
                          float* dst);
  // attn_scores over K of an f16 cache in tiles (backend/k_tiles.h): slots [0, n_slots) of one KV
  // head, kt at dim 0 of the tile holding slot 0 (a tile's first slot), consecutive tiles of
  // the head tile_stride halves apart. Each score bitwise what attn_scores gives for the same
  // values as float rows. May read (not store) the rest of the last tile. nullptr where a
  // variant has none: the driver converts the tiles into float rows for attn_scores.
  void (*attn_scores_k16)(const float* packed_q, int n_q, const uint16_t* kt, int64_t tile_stride,
                          int64_t n_slots, int head_dim, float* s, int64_t ld_s, AttnPrefetch next);
  // dst[j * head_dim + d] = float(K of slot j, dim d) for j < n_slots of one KV head's tiles
  // (kt, tile_stride as for attn_scores_k16): float rows for attn_scores (run pieces of tree
  // masks that start at a tile's first slot). nullptr: the driver gathers them itself.
  void (*k16_tiles_to_rows)(const uint16_t* kt, int64_t tile_stride, int64_t n_slots, int head_dim,
                            float* dst);
  // attn_accumulate and attn_accumulate_merge over the V rows of an f16 cache (v_stride in
  // halves), each value converted as it is loaded: bitwise the float kernels on the converted
  // rows, without the float tile. nullptr where a variant has none: the driver converts the rows.
  void (*attn_accumulate_f16)(const float* p, int64_t ld_p, int n_q, const uint16_t* v,
                              int64_t v_stride, int64_t n_rows, int head_dim, float* out,
                              AttnPrefetch next);
  void (*attn_accumulate_merge_f16)(const float* p, int64_t ld_p, int n_q, const uint16_t* v,
                                    int64_t v_stride, int64_t n_rows, int head_dim, const float* wo,
                                    const float* wn, float* big_a, AttnPrefetch next);
  // rope_apply (arguments checked): each rotated value x0·c - x1·s / x0·s + x1·c from the two
  // rounded products, as the reference computes it, so every variant gives the same bits.
  void (*rope_apply)(float* x, const float* cos_sin, int64_t n_tokens, int n_heads, int head_dim,
                     int rope_dim, RopeStyle style);
  // The q8_0 cache (KvType::kQ8) holds int8 codes; these read them as floats (exactly), and the
  // driver applies the slots' scales around them (attention_driver.cpp).
  // dst[r * cols + c] = float(src[r * src_stride + c]) for r < n_rows, c < cols.
  void (*i8_to_f32_rows)(const int8_t* src, int64_t src_stride, int64_t n_rows, int cols,
                         float* dst);
  // attn_scores_k16 over K tiles of codes (the same tile layout, elements int8): each score
  // bitwise what attn_scores gives on the codes as float rows. nullptr: the driver converts.
  void (*attn_scores_k8)(const float* packed_q, int n_q, const int8_t* kt, int64_t tile_stride,
                         int64_t n_slots, int head_dim, float* s, int64_t ld_s, AttnPrefetch next);
  // attn_accumulate / attn_accumulate_merge over V rows of codes (v_stride in codes), each code
  // converted as it is loaded: bitwise the float kernels on the converted rows. nullptr: the
  // driver converts the rows.
  void (*attn_accumulate_i8)(const float* p, int64_t ld_p, int n_q, const int8_t* v,
                             int64_t v_stride, int64_t n_rows, int head_dim, float* out,
                             AttnPrefetch next);
  void (*attn_accumulate_merge_i8)(const float* p, int64_t ld_p, int n_q, const int8_t* v,
                                   int64_t v_stride, int64_t n_rows, int head_dim, const float* wo,
                                   const float* wn, float* big_a, AttnPrefetch next);
  // out[r * ld_out + j] = x[r * ld_x + j] · d[j] for r < n_rows, j < n (one rounded product, so
  // every variant gives the same bits; out may be x): the q8_0 scales on scores and on p.
  void (*scale_columns)(const float* x, int64_t ld_x, int n_rows, const float* d, int64_t n,
                        float* out, int64_t ld_out);
  // k16_tiles_to_rows over K tiles of codes: dst[j * head_dim + d] = float(code of slot j, dim d).
  // nullptr: the driver gathers the codes itself.
  void (*k8_tiles_to_rows)(const int8_t* kt, int64_t tile_stride, int64_t n_slots, int head_dim,
                           float* dst);
};
const OpsKernels& ops_kernels_ref();
const OpsKernels& ops_kernels_avx2();    // only call where isa_supported(Isa::kAvx2)
const OpsKernels& ops_kernels_avx512();  // only call where isa_supported(Isa::kAvx512)
// The table of a variant; checked: fails (SPECDEC_CHECK) where the variant is not supported.
const OpsKernels& ops_kernels_for(Isa isa, bool checked);

}  // namespace specdec
