#include "sample/sampler.h"

#include <fmt/format.h>

#include <emmintrin.h>  // SSE2, the x86-64 baseline: greedy's arg max

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "util/check.h"

namespace specdec {

void SamplingParams::validate() const {
  if (!(std::isfinite(temperature) && temperature >= 0.0f)) {
    throw Error(
        fmt::format("sampling option temperature must be a finite number >= 0 (0 = "
                    "greedy), got {}",
                    temperature));
  }
  if (top_k < 0) {
    throw Error(fmt::format("sampling option top_k must be >= 0 (0 = off), got {}", top_k));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    throw Error(fmt::format("sampling option top_p must be in (0, 1] (1 = off), got {}", top_p));
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    throw Error(fmt::format("sampling option min_p must be in [0, 1] (0 = off), got {}", min_p));
  }
  if (!(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f)) {
    throw Error(
        fmt::format("sampling option repetition_penalty must be a finite number > 0 "
                    "(1 = off), got {}",
                    repetition_penalty));
  }
  if (repeat_last_n < -1) {
    throw Error(
        fmt::format("sampling option repeat_last_n must be >= -1 (0 = none, -1 = the "
                    "whole history), got {}",
                    repeat_last_n));
  }
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  params_.validate();
}

namespace {

// The largest value of x[0, n) and whether any value is NaN, on 16 lanes of SSE2 (the x86-64
// baseline); first_index_of then finds the first block of 16 holding a value. Loops left to the
// compiler stayed scalar (~1 ns per logit: 50-65 us of each SmolLM2 decode step's 49,152
// logits); these take ~10 us.
struct MaxNan {
  float max;
  bool nan;
};

MaxNan max_and_nan(const float* x, int64_t n) {
  const __m128 neg_inf = _mm_set1_ps(-std::numeric_limits<float>::infinity());
  __m128 m0 = neg_inf, m1 = neg_inf, m2 = neg_inf, m3 = neg_inf;
  __m128 bad = _mm_setzero_ps();  // lanes that met a NaN (all ones)
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128 v0 = _mm_loadu_ps(x + i), v1 = _mm_loadu_ps(x + i + 4);
    const __m128 v2 = _mm_loadu_ps(x + i + 8), v3 = _mm_loadu_ps(x + i + 12);
    bad = _mm_or_ps(bad, _mm_or_ps(_mm_or_ps(_mm_cmpunord_ps(v0, v0), _mm_cmpunord_ps(v1, v1)),
                                   _mm_or_ps(_mm_cmpunord_ps(v2, v2), _mm_cmpunord_ps(v3, v3))));
    m0 = _mm_max_ps(m0, v0);
    m1 = _mm_max_ps(m1, v1);
    m2 = _mm_max_ps(m2, v2);
    m3 = _mm_max_ps(m3, v3);
  }
  alignas(16) float lanes[16];
  _mm_store_ps(lanes, m0);
  _mm_store_ps(lanes + 4, m1);
  _mm_store_ps(lanes + 8, m2);
  _mm_store_ps(lanes + 12, m3);
  MaxNan r{-std::numeric_limits<float>::infinity(), _mm_movemask_ps(bad) != 0};
  for (float v : lanes) r.max = v > r.max ? v : r.max;
  for (; i < n; ++i) {
    r.max = x[i] > r.max ? x[i] : r.max;
    r.nan = r.nan || x[i] != x[i];
  }
  return r;
}

// The first index of x[0, n) holding `value` (n if none).
int64_t first_index_of(const float* x, int64_t n, float value) {
  const __m128 want = _mm_set1_ps(value);
  int64_t b = 0;
  for (; b + 16 <= n; b += 16) {
    const int hit = _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(x + b), want)) |
                    _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(x + b + 4), want)) << 4 |
                    _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(x + b + 8), want)) << 8 |
                    _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(x + b + 12), want)) << 12;
    if (hit != 0) return b + __builtin_ctz(static_cast<unsigned>(hit));
  }
  for (; b < n && x[b] != value; ++b) {
  }
  return b;
}

// Throws unless `logits` can be sampled from: a vocabulary of 1 to INT32_MAX tokens.
void check_vocabulary(std::span<const float> logits) {
  const int64_t n = static_cast<int64_t>(logits.size());
  if (n == 0) throw Error("sampler: the logits are empty (n_vocab = 0)");
  if (n > std::numeric_limits<int32_t>::max()) {
    throw Error(fmt::format("sampler: n_vocab {} does not fit token ids", n));
  }
}

// The largest of x[0, logits.size()) (the logits as given, or a penalized copy of them, which
// has its NaNs in the same places); throws on a NaN (naming its token in `logits`) or when the
// largest is not finite.
float finite_max(const float* x, std::span<const float> logits) {
  const MaxNan r = max_and_nan(x, static_cast<int64_t>(logits.size()));
  if (r.nan) {
    const int64_t at =
        std::find_if(logits.begin(), logits.end(), [](float v) { return v != v; }) - logits.begin();
    throw Error(fmt::format("sampler: the logit of token {} is NaN", at));
  }
  if (!std::isfinite(r.max)) {
    throw Error(fmt::format("sampler: the largest logit is {}; need a finite one", r.max));
  }
  return r.max;
}

// e^x for x <= 0 on four lanes, in SSE2 with separate multiplies and adds, so that every x86-64
// CPU gives the same bits: x = k ln2 + r with |r| <= ln2 / 2 (Cody-Waite, ln2 in two parts),
// Cephes' polynomial for e^r (relative error ~1e-7), 2^k from the exponent bits; 0 below -87.3
// (where e^x would be subnormal) and for -inf.
inline __m128 exp_nonpositive(__m128 x) {
  const __m128 live = _mm_cmpge_ps(x, _mm_set1_ps(-87.3f));
  x = _mm_max_ps(x, _mm_set1_ps(-87.3f));
  const __m128 fx =
      _mm_add_ps(_mm_mul_ps(x, _mm_set1_ps(1.44269504088896341f)), _mm_set1_ps(0.5f));
  __m128 k = _mm_cvtepi32_ps(_mm_cvttps_epi32(fx));  // floor(fx): truncation, then one down
  k = _mm_sub_ps(k, _mm_and_ps(_mm_cmpgt_ps(k, fx), _mm_set1_ps(1.0f)));
  __m128 r = _mm_sub_ps(x, _mm_mul_ps(k, _mm_set1_ps(0.693359375f)));
  r = _mm_sub_ps(r, _mm_mul_ps(k, _mm_set1_ps(-2.12194440e-4f)));
  __m128 y = _mm_set1_ps(1.9875691500e-4f);
  y = _mm_add_ps(_mm_mul_ps(y, r), _mm_set1_ps(1.3981999507e-3f));
  y = _mm_add_ps(_mm_mul_ps(y, r), _mm_set1_ps(8.3334519073e-3f));
  y = _mm_add_ps(_mm_mul_ps(y, r), _mm_set1_ps(4.1665795894e-2f));
  y = _mm_add_ps(_mm_mul_ps(y, r), _mm_set1_ps(1.6666665459e-1f));
  y = _mm_add_ps(_mm_mul_ps(y, r), _mm_set1_ps(5.0000001201e-1f));
  y = _mm_add_ps(_mm_add_ps(_mm_mul_ps(y, _mm_mul_ps(r, r)), r), _mm_set1_ps(1.0f));
  const __m128i pow2k =
      _mm_slli_epi32(_mm_add_epi32(_mm_cvttps_epi32(k), _mm_set1_epi32(127)), 23);
  return _mm_and_ps(_mm_mul_ps(y, _mm_castsi128_ps(pow2k)), live);
}

float exp_one(float x) {
  alignas(16) float v[4];
  _mm_store_ps(v, exp_nonpositive(_mm_set1_ps(x)));
  return v[0];
}

// A sum of floats four at a time in four double lanes, added up in a fixed order at the end.
struct DoubleLanes {
  __m128d lo = _mm_setzero_pd(), hi = _mm_setzero_pd();
  void add(__m128 e) {
    lo = _mm_add_pd(lo, _mm_cvtps_pd(e));
    hi = _mm_add_pd(hi, _mm_cvtps_pd(_mm_movehl_ps(e, e)));
  }
  double total() const {
    alignas(16) double v[4];
    _mm_store_pd(v, lo);
    _mm_store_pd(v + 2, hi);
    return (v[0] + v[1]) + (v[2] + v[3]);
  }
};

// Σ e^((l_i - max) / t) over the tokens with l_i >= threshold (the others count 0), each term
// also stored to out[i] where out is given: the softmax numerators of the whole vocabulary.
// Four float lanes, summed in four double lanes (fixed order: the same on every machine).
double exp_sum(const float* l, int64_t n, float max, float t, float threshold, float* out) {
  const __m128 vmax = _mm_set1_ps(max), vt = _mm_set1_ps(t), vthr = _mm_set1_ps(threshold);
  DoubleLanes lanes;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128 li = _mm_loadu_ps(l + i);
    const __m128 e = _mm_and_ps(exp_nonpositive(_mm_div_ps(_mm_sub_ps(li, vmax), vt)),
                                _mm_cmpge_ps(li, vthr));
    if (out != nullptr) _mm_storeu_ps(out + i, e);
    lanes.add(e);
  }
  double sum = lanes.total();
  for (; i < n; ++i) {
    const float e = l[i] >= threshold ? exp_one((l[i] - max) / t) : 0.0f;
    if (out != nullptr) out[i] = e;
    sum += e;
  }
  return sum;
}

// x[i] = float(x[i] * a) (the product in double) for i in [0, n).
void scale_in_double(float* x, int64_t n, double a) {
  const __m128d va = _mm_set1_pd(a);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128 e = _mm_loadu_ps(x + i);
    const __m128 lo = _mm_cvtpd_ps(_mm_mul_pd(_mm_cvtps_pd(e), va));
    const __m128 hi = _mm_cvtpd_ps(_mm_mul_pd(_mm_cvtps_pd(_mm_movehl_ps(e, e)), va));
    _mm_storeu_ps(x + i, _mm_movelh_ps(lo, hi));
  }
  for (; i < n; ++i) x[i] = static_cast<float>(x[i] * a);
}

// The inverse CDF over all of p[0, n) (zeros included, which add nothing): the first token
// whose cumulative probability passes u x total, where the cumulative runs block by block:
// each block's sum (DoubleLanes) is added whole, and only the block where the target
// falls is walked token by token (the last token with p > 0 if rounding leaves the target at
// the total). -1 if no p is positive.
constexpr int64_t kDrawBlock = 64;

int32_t draw_blocked(const float* p, int64_t n, double u, std::vector<double>* block_sums) {
  const int64_t blocks = (n + kDrawBlock - 1) / kDrawBlock;
  block_sums->resize(static_cast<size_t>(blocks));
  double total = 0.0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kDrawBlock, i1 = std::min(n, i0 + kDrawBlock);
    DoubleLanes lanes;
    int64_t i = i0;
    for (; i + 4 <= i1; i += 4) lanes.add(_mm_loadu_ps(p + i));
    double s = lanes.total();
    for (; i < i1; ++i) s += p[i];
    (*block_sums)[static_cast<size_t>(b)] = s;
    total += s;
  }
  const double target = u * total;
  double cumulative = 0.0;
  for (int64_t b = 0; b < blocks; ++b) {
    const double s = (*block_sums)[static_cast<size_t>(b)];
    if (cumulative + s > target) {
      const int64_t i1 = std::min(n, (b + 1) * kDrawBlock);
      for (int64_t i = b * kDrawBlock; i < i1; ++i) {
        if (p[i] <= 0.0f) continue;
        cumulative += p[i];
        if (cumulative > target) return static_cast<int32_t>(i);
      }
      // Rounding inside the block left the target above it: go on after it.
      continue;
    }
    cumulative += s;
  }
  for (int64_t i = n - 1; i >= 0; --i) {
    if (p[i] > 0.0f) return static_cast<int32_t>(i);
  }
  return -1;
}

}  // namespace

bool Sampler::penalizes(std::span<const int32_t> history) const {
  return params_.repetition_penalty != 1.0f && params_.repeat_last_n != 0 && !history.empty();
}

float Sampler::penalize(std::span<const float> logits, std::span<const int32_t> history) const {
  check_vocabulary(logits);
  const int64_t n = static_cast<int64_t>(logits.size());
  logits_.assign(logits.begin(), logits.end());  // [n_vocab]; reuses the capacity

  const float penalty = params_.repetition_penalty;
  if (penalizes(history)) {
    const size_t window =
        params_.repeat_last_n < 0
            ? history.size()
            : std::min(history.size(), static_cast<size_t>(params_.repeat_last_n));
    const std::span<const int32_t> recent = history.last(window);
    for (const int32_t t : recent) {
      if (t < 0 || t >= n) {
        throw Error(
            fmt::format("sampler: history token {} is outside the vocabulary [0, {})", t, n));
      }
    }
    if (penalized_.size() < static_cast<size_t>(n)) penalized_.resize(static_cast<size_t>(n), 0);
    for (const int32_t t : recent) {
      if (penalized_[t]) continue;  // each distinct token once
      penalized_[t] = 1;
      const float l = logits_[t];
      logits_[t] = l > 0.0f ? l / penalty : l * penalty;
    }
    for (const int32_t t : recent) penalized_[t] = 0;
  }

  return finite_max(logits_.data(), logits);
}

int32_t Sampler::greedy_unpenalized(std::span<const float> logits) const {
  check_vocabulary(logits);
  const float max = finite_max(logits.data(), logits);
  return static_cast<int32_t>(
      first_index_of(logits.data(), static_cast<int64_t>(logits.size()), max));
}

int32_t Sampler::first_max(float max) const {
  return static_cast<int32_t>(
      first_index_of(logits_.data(), static_cast<int64_t>(logits_.size()), max));
}

namespace {

// Splits candidates by a logit threshold chosen from a histogram, so that sorting can start from
// about the `need` best instead of the whole vocabulary. The bucket of a logit,
// floor((hi - l) / width) over the finite logits (0 = best), is monotone in l: "bucket <= cut"
// is a threshold on the logit, and equal logits land on the same side.
constexpr int kBuckets = 256;

// Writes get(0 .. n-1) to out[0, n): the ones at or above the threshold first, then the rest
// (in reverse order); returns how many are first: at least `need` (all n when no split helps).
template <class Candidate, class Get>
int64_t split_best(const Get& get, int64_t n, int64_t need, Candidate* out) {
  float hi = -std::numeric_limits<float>::infinity();
  float lo = std::numeric_limits<float>::infinity();
  if (need < n) {
    for (int64_t i = 0; i < n; ++i) {
      const float l = get(i).logit;
      hi = l > hi ? l : hi;
      lo = l < lo && l > -std::numeric_limits<float>::infinity() ? l : lo;
    }
  }
  const float inv_width = static_cast<float>(kBuckets) / (hi - lo);
  if (need >= n || !(hi > lo) || !std::isfinite(inv_width)) {  // all equal or nothing to gain
    for (int64_t i = 0; i < n; ++i) out[i] = get(i);
    return n;
  }
  auto bucket = [hi, inv_width](float l) {
    const float f = (hi - l) * inv_width;  // +inf for l = -inf
    return static_cast<int>(f < kBuckets - 1 ? f : kBuckets - 1);
  };
  int64_t counts[kBuckets] = {};
  for (int64_t i = 0; i < n; ++i) ++counts[bucket(get(i).logit)];
  int cut = 0;
  for (int64_t total = counts[0]; total < need; total += counts[++cut]) {
  }
  // Without branches: each candidate is written to both ends of the gap, one end advances.
  int64_t front = 0, back = n;
  for (int64_t i = 0; i < n; ++i) {
    const Candidate x = get(i);
    out[front] = x;
    out[back - 1] = x;
    const bool is_front = bucket(x.logit) <= cut;
    front += is_front;
    back -= !is_front;
  }
  return front;
}

}  // namespace

int64_t Sampler::start_sorting(int64_t need, float floor) const {
  const int64_t n = static_cast<int64_t>(logits_.size());
  candidates_.resize(static_cast<size_t>(n));
  const float* l = logits_.data();
  int64_t m = n;
  const Candidate* src = nullptr;
  if (floor > -std::numeric_limits<float>::infinity()) {  // the tokens at or above the floor
    spill_.resize(static_cast<size_t>(n));
    m = 0;
    for (int64_t i = 0; i < n; ++i) {
      spill_[static_cast<size_t>(m)] = Candidate{l[i], static_cast<int32_t>(i)};
      m += l[i] >= floor;
    }
    src = spill_.data();
  }
  if (src != nullptr) {
    n_front_ = split_best([src](int64_t i) { return src[i]; }, m, std::max<int64_t>(need, 64),
                          candidates_.data());
  } else {
    auto get = [l](int64_t i) { return Candidate{l[i], static_cast<int32_t>(i)}; };
    n_front_ = split_best(get, n, std::max<int64_t>(need, 64), candidates_.data());
  }
  n_sorted_ = 0;
  return m;
}

void Sampler::ensure_sorted(int64_t m, int64_t n) const {
  if (m <= n_sorted_) return;
  // Grow geometrically: top-p usually stops within the first few dozen tokens, so sorting the
  // whole vocabulary up front would be wasted. The front narrows nth_element and sort to about
  // the best `target` tokens; when it is too small, the rest is split again.
  int64_t target = std::max<int64_t>(2 * n_sorted_, 64);
  target = std::min(std::max(target, m), n);
  if (target > n_front_) {
    const int64_t n_rest = n - n_front_;
    spill_.assign(candidates_.begin() + n_front_, candidates_.begin() + n);
    const Candidate* rest = spill_.data();
    n_front_ += split_best([rest](int64_t i) { return rest[i]; }, n_rest, target - n_front_,
                           candidates_.data() + n_front_);
  }
  const auto first = candidates_.begin() + n_sorted_;
  const auto last = candidates_.begin() + target;
  // A lambda (not a function pointer) so that the comparison is inlined.
  auto better = [](const Candidate& a, const Candidate& b) { return Candidate::better(a, b); };
  if (target < n_front_) std::nth_element(first, last, candidates_.begin() + n_front_, better);
  std::sort(first, last, better);
  n_sorted_ = target;
}

void Sampler::distribution(std::span<const float> logits, std::span<const int32_t> history,
                           std::vector<float>* probs) const {
  const float max = penalize(logits, history);
  const int64_t n = static_cast<int64_t>(logits.size());
  probs->assign(static_cast<size_t>(n), 0.0f);  // [n_vocab]
  float* p = probs->data();
  const float* l = logits_.data();
  if (params_.greedy()) {
    const int32_t best = first_max(max);
    p[best] = 1.0f;
    candidates_.resize(1);
    candidates_[0] = {max, best};
    kept_sorted_ = true;
    n_kept_ = 1;
    return;
  }

  // The kept set is either every token (sorted == false) or candidates_[0, n_kept).
  bool sorted = false;
  int64_t n_kept = n;
  if (params_.top_k > 0 && params_.top_k < n) {
    start_sorting(params_.top_k);
    sorted = true;
    ensure_sorted(params_.top_k, n);
    n_kept = params_.top_k;
  }
  const Candidate* cand = candidates_.data();

  if (params_.top_p < 1.0f) {
    double z = 0.0;  // softmax denominator of the kept set at temperature 1
    if (sorted) {
      for (int64_t c = 0; c < n_kept; ++c) z += std::exp(cand[c].logit - max);
    } else {
      z = exp_sum(l, n, max, 1.0f, -std::numeric_limits<float>::infinity(), nullptr);
      // Only tokens within log((1 - top_p) / (2 n)) of the largest logit can be in the kept
      // set: the others together hold at most (1 - top_p) / 2 of z (each at most that share
      // of the largest token's e^0 = 1 <= z), so the tokens above the floor already hold more
      // than top_p of it, and the kept set, a prefix in the same order, ends among them.
      const float floor =
          max + std::log((1.0f - params_.top_p) / (2.0f * static_cast<float>(n)));
      n_kept = start_sorting(64, floor);
      sorted = true;
      cand = candidates_.data();
    }
    double cumulative = 0.0;
    for (int64_t c = 0; c < n_kept; ++c) {
      ensure_sorted(c + 1, n_kept);
      cumulative += std::exp(cand[c].logit - max) / z;
      if (cumulative >= params_.top_p) {
        n_kept = c + 1;
        break;
      }
    }
  }

  float threshold = -std::numeric_limits<float>::infinity();
  if (params_.min_p > 0.0f) {
    threshold = max + std::log(params_.min_p);
    if (sorted) {
      while (n_kept > 1 && cand[n_kept - 1].logit < threshold) --n_kept;
    }
  }

  // Temperature and the final softmax over the kept set.
  const float temperature = params_.temperature;
  double sum = 0.0;
  if (sorted) {
    for (int64_t c = 0; c < n_kept; ++c) {
      const float e = std::exp((cand[c].logit - max) / temperature);
      p[cand[c].id] = e;
      sum += e;
    }
    const double inv_sum = 1.0 / sum;
    for (int64_t c = 0; c < n_kept; ++c) {
      p[cand[c].id] = static_cast<float>(p[cand[c].id] * inv_sum);
    }
  } else {
    sum = exp_sum(l, n, max, temperature, threshold, p);
    scale_in_double(p, n, 1.0 / sum);
  }
  kept_sorted_ = sorted;
  n_kept_ = n_kept;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  if (params_.greedy()) {
    // Without a penalty the logits are read in place, once (no copy: a decode step's sampling
    // was ~60 us of SmolLM2's 49,152 logits); the same token as first_max(penalize(...)).
    if (!penalizes(history)) return greedy_unpenalized(logits);
    return first_max(penalize(logits, history));
  }
  distribution(logits, history, &probs_);
  const float* p = probs_.data();
  // Inverse CDF over the tokens with a positive probability, in token order. When the kept set
  // is a (short) list, it is visited in id order; the sums are the same as over the full vector,
  // whose other entries are 0.
  auto draw = [&](auto&& for_each_kept) -> int32_t {
    double total = 0.0;
    for_each_kept([&](int32_t i) {
      total += p[i];
      return false;
    });
    const double target = rng_.uniform() * total;
    double cumulative = 0.0;
    int32_t chosen = -1;
    for_each_kept([&](int32_t i) {
      cumulative += p[i];
      chosen = i;
      return cumulative > target;
    });
    return chosen;  // the last kept token if rounding left target at the total
  };
  int32_t token = -1;
  if (kept_sorted_) {
    kept_ids_.resize(static_cast<size_t>(n_kept_));
    for (int64_t c = 0; c < n_kept_; ++c) kept_ids_[c] = candidates_[c].id;
    std::sort(kept_ids_.begin(), kept_ids_.end());
    token = draw([&](auto&& visit) {
      for (const int32_t i : kept_ids_) {
        if (p[i] > 0.0f && visit(i)) return;
      }
    });
  } else {
    token = draw_blocked(p, static_cast<int64_t>(probs_.size()), rng_.uniform(), &block_sums_);
  }
  SPECDEC_CHECK(token >= 0, "sampler: the distribution has no positive probability");
  return token;
}

}  // namespace specdec
