#include "engine/scheduler.h"

#include <algorithm>

#include "util/check.h"

namespace specdec {
namespace {

bool by_arrival(const Sequence* a, const Sequence* b) {
  return a->arrival < b->arrival;
}

// Tokens a running sequence computes this step without drafts: its decode token, or what is
// left of its prompt. A recompute after preemption stops before the root (the last emitted
// token), which then gets an ordinary decode step with its drafts - the step it would have had
// without the preemption, so the output (sampled too) does not depend on it.
int64_t base_tokens(const Sequence* s) {
  if (s->decoding()) return 1;
  return s->n_uncomputed() - (s->n_generated() > 0 ? 1 : 0);
}

}  // namespace

void Scheduler::enqueue(Sequence* seq) {
  seq->state = RequestState::kWaiting;
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), seq, by_arrival), seq);
}

void Scheduler::remove(Sequence* seq) {
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end()) {
    running_.erase(it);
  }
  if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end()) {
    waiting_.erase(it);
  }
  if (seq->admitted) kv_->free(&seq->table);
  seq->admitted = false;
}

void Scheduler::preempt(Sequence* seq) {
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  kv_->free(&seq->table);
  seq->admitted = false;
  seq->n_computed = 0;
  ++seq->stats.n_preempted;
  ++preemptions_;
  enqueue(seq);
}

bool Scheduler::reserve_or_preempt(Sequence* seq, int64_t n, std::vector<ScheduledSeq>* plan,
                                   int64_t* budget) {
  while (!kv_->reserve(&seq->table, seq->n_computed + n)) {
    SPECDEC_CHECK(!running_.empty(), "scheduler: a running sequence is not on the running list");
    Sequence* victim = running_.back();  // the most recent arrival
    for (auto it = plan->begin(); it != plan->end(); ++it) {
      if (it->seq == victim) {
        *budget += it->n_tokens;
        plan->erase(it);
        break;
      }
    }
    preempt(victim);
    if (victim == seq) return false;
  }
  return true;
}

int64_t prefill_tokens_while_decoding(const SchedulerLimits& limits, int64_t decodes,
                                      int64_t context) {
  if (limits.max_prefill_tokens_decoding > 0) return limits.max_prefill_tokens_decoding;
  if (limits.max_prefill_tokens_decoding < 0 || decodes <= 0 || limits.token_cost <= 0) {
    return limits.max_batch_tokens;
  }
  // alone + c T <= slack * alone
  const double c = limits.token_cost;
  const double alone = 1.0 + c * static_cast<double>(decodes - 1) +
                       limits.slot_cost * static_cast<double>(context);
  const auto t = static_cast<int64_t>((kDecodeStepSlack - 1.0) * alone / c);
  return std::clamp<int64_t>(t, kMinPrefillChunk, limits.max_batch_tokens);
}

std::vector<ScheduledSeq> Scheduler::schedule(int64_t* budget_left) {
  std::vector<ScheduledSeq> plan;
  int64_t budget = limits_.max_batch_tokens;
  const std::vector<Sequence*> snapshot = running_;  // preemption edits running_
  // 1. One token for every decode.
  for (Sequence* s : snapshot) {
    if (budget < 1) break;
    if (!s->admitted || !s->decoding()) continue;
    if (reserve_or_preempt(s, 1, &plan, &budget)) {
      plan.push_back({s, 1});
      budget -= 1;
    }
  }
  // Prompt tokens this step may add (fewer while decoders wait on the step).
  const auto decodes = static_cast<int64_t>(plan.size());
  int64_t context = 0;
  for (const ScheduledSeq& p : plan) context += p.seq->n_computed;
  int64_t prefill =
      decodes > 0 ? prefill_tokens_while_decoding(limits_, decodes, context) : budget;
  // 2. Chunks of running prompts (and recomputes).
  for (Sequence* s : snapshot) {
    if (budget < 1 || prefill < 1) break;
    if (!s->admitted || s->decoding()) continue;
    const int64_t n = std::min({base_tokens(s), budget, prefill});
    if (reserve_or_preempt(s, n, &plan, &budget)) {
      plan.push_back({s, n});
      budget -= n;
      prefill -= n;
    }
  }
  // 3. Admission, first come first served, while blocks stay for the running sequences' next
  // tokens (one block each), so that admitting does not immediately force a preemption.
  while (!waiting_.empty() && budget >= 1 && prefill >= 1 &&
         static_cast<int64_t>(running_.size()) < limits_.max_seqs) {
    Sequence* s = waiting_.front();
    // The last token is always computed (its logits give the next token).
    const int64_t cached =
        kv_->admit(s->tokens, static_cast<int64_t>(s->tokens.size()) - 1, &s->table);
    s->n_computed = cached;
    const int64_t n = std::min({base_tokens(s), budget, prefill});
    const int32_t need =
        kv_->blocks_for(s->n_computed + n) - static_cast<int32_t>(s->table.blocks.size());
    const auto headroom = static_cast<int32_t>(running_.size());
    if (kv_->pool().num_available() - need < headroom ||
        !kv_->reserve(&s->table, s->n_computed + n)) {
      kv_->free(&s->table);
      s->n_computed = 0;
      break;
    }
    waiting_.pop_front();
    s->admitted = true;
    s->state = RequestState::kRunning;
    s->stats.n_cached = cached;
    if (kv_->pool().prefix_cache()) {
      kv_->record_admission(static_cast<int64_t>(s->tokens.size()) - 1, cached);
    }
    running_.insert(std::upper_bound(running_.begin(), running_.end(), s, by_arrival), s);
    plan.push_back({s, n});
    budget -= n;
    prefill -= n;
  }
  *budget_left = budget;
  return plan;
}

}  // namespace specdec
