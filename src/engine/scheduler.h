// The scheduling policy (who runs, how many tokens), kept apart from the mechanism that builds
// the batch (engine.cpp), as TensorRT-LLM separates its capacity scheduler from its micro-batch
// scheduler. Each step it plans {sequence: tokens} (DESIGN §7: a plan, not modes):
//   1. every running decode gets its one token (decodes never stall behind prompts);
//   2. running prompts (or recomputes) get chunks of what is left of the token budget, in
//      arrival order (chunked prefill) - while anything decodes, at most
//      prefill_tokens_while_decoding() prompt tokens in all, so that a long prompt arriving
//      stretches no decoder's inter-token latency by more than a bounded factor;
//   3. waiting requests are admitted first come first served while the sequence cap, the budget
//      and the free blocks allow (a new request first takes its longest cached prefix);
// a sequence whose blocks cannot be reserved preempts the most recently arrived running one
// (its blocks are freed, it is recomputed later: preemption by recompute), possibly itself.
// The oldest request always progresses (it is never the victim while others run, and a sequence
// never holds more than the pool), so nobody waits forever. Draft tokens are planned after
// this, from what is left of the budget (engine.cpp).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/sequence.h"
#include "kv/block_table.h"

namespace specdec {

struct SchedulerLimits {
  int max_batch_tokens = 512;
  int max_seqs = 64;
  // Prompt tokens per step while some sequence decodes (EngineConfig's field of the same name:
  // 0 from the cost model below, -1 unlimited, > 0 fixed).
  int max_prefill_tokens_decoding = 0;
  double token_cost = 0.08;  // the cost model's c: a pass over n tokens costs 1 + c (n - 1)
  // What reading one cached token's K/V costs, in one-token passes (KV bytes of a slot over the
  // weight bytes a pass streams: decode is memory-bound).
  double slot_cost = 0;
};

// The automatic limit: a step with `decodes` decode tokens over `context` cached slots in all
// may add this many prompt tokens and still cost at most kDecodeStepSlack times its decodes
// alone (1 + c (decodes - 1) + slot_cost * context passes); never fewer than kMinPrefillChunk,
// so that prompts always progress.
constexpr double kDecodeStepSlack = 2.5;
constexpr int64_t kMinPrefillChunk = 16;
int64_t prefill_tokens_while_decoding(const SchedulerLimits& limits, int64_t decodes,
                                      int64_t context);

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int64_t n_tokens = 0;  // tokens from tokens[n_computed] (drafts not included)
};

class Scheduler {
 public:
  Scheduler(SchedulerLimits limits, KvBlockManager* kv) : limits_(limits), kv_(kv) {}

  // Queues a new (or preempted) sequence, keeping the waiting list in arrival order.
  void enqueue(Sequence* seq);
  // Removes a sequence from whichever list holds it (finished or cancelled) and frees its blocks.
  void remove(Sequence* seq);

  // The plan of one step; tokens left in the budget go to *budget_left.
  std::vector<ScheduledSeq> schedule(int64_t* budget_left);

  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }
  int64_t preemptions() const { return preemptions_; }

 private:
  // Frees the sequence's blocks and puts it back on the waiting list.
  void preempt(Sequence* seq);
  // Reserves blocks for n more tokens of seq, preempting later arrivals as needed; false when
  // seq itself had to be preempted.
  bool reserve_or_preempt(Sequence* seq, int64_t n, std::vector<ScheduledSeq>* plan,
                          int64_t* budget);

  SchedulerLimits limits_;
  KvBlockManager* kv_;
  std::deque<Sequence*> waiting_;  // arrival order
  std::vector<Sequence*> running_;  // arrival order
  int64_t preemptions_ = 0;
};

}  // namespace specdec
