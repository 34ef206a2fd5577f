#include "speculative/batched_draft.h"

#include "speculative/draft_model.h"
#include "util/check.h"

namespace specdec {

BatchedDraftModel::BatchedDraftModel(Model& draft, ThreadPool* pool, int32_t n_blocks,
                                     int32_t block_size)
    : draft_(draft), thread_pool_(pool) {
  storage_ = draft.make_paged_kv(n_blocks, block_size, KvType::kF16);  // on the draft's device
  pool_ = std::make_unique<BlockPool>(n_blocks, block_size, /*prefix_cache=*/false);
  kv_ = std::make_unique<KvBlockManager>(storage_.get(), pool_.get());
}

void BatchedDraftModel::add(int64_t seq, int64_t ctx_size, uint64_t seed,
                            const DraftModelConfig& config) {
  SPECDEC_CHECK(!contains(seq), "a draft sequence was added twice");
  auto s = std::make_unique<SeqState>(config);
  s->capacity = draft_context(draft_, ctx_size);
  s->decoder.begin(seed);
  seqs_.emplace(seq, std::move(s));
}

void BatchedDraftModel::remove(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  kv_->free(&it->second->table);
  seqs_.erase(it);
}

int64_t BatchedDraftModel::cached_tokens(int64_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() || it->second->evicted ? 0 : it->second->cache.slots();
}

void BatchedDraftModel::evict(SeqState* s) {
  kv_->free(&s->table);
  s->evicted = true;
}

void BatchedDraftModel::reset(SeqState* s) {
  kv_->free(&s->table);
  s->cache.clear();
  s->evicted = false;
}

bool BatchedDraftModel::reserve(SeqState* s, int64_t n) {
  while (!kv_->reserve(&s->table, n)) {
    // The least recently drafted sequence that holds blocks and is not drafting in this call.
    SeqState* victim = nullptr;
    for (auto& [id, other] : seqs_) {
      if (other->last_call == n_calls_ || other->table.blocks.empty()) continue;
      if (victim == nullptr || other->last_call < victim->last_call) victim = other.get();
    }
    if (victim == nullptr) return false;
    evict(victim);
    ++stats_.evictions;
  }
  return true;
}

void BatchedDraftModel::run_and_decide() {
  const ForwardResult r = draft_.forward(batches_, thread_pool_, &scratch_);
  ++stats_.passes;
  const auto n_vocab = static_cast<size_t>(draft_.config().n_vocab);
  size_t n_next = 0;
  for (size_t i = 0; i < running_.size(); ++i) {
    Work& w = *running_[i];
    stats_.tokens_run += static_cast<int64_t>(batches_[i].batch.tokens.size());
    // The history the decoder sees: the sequence and the chain so far (the cache's tokens).
    w.token = w.state->decoder.next(r.logits.subspan(i * n_vocab, n_vocab),
                                    w.state->cache.tokens, w.tree);
    if (w.token != DraftDecoder::kStop) running_[n_next++] = &w;
  }
  running_.resize(n_next);
}

void BatchedDraftModel::propose(std::span<const DraftJob> jobs) {
  if (jobs.empty()) return;
  ++n_calls_;
  ++stats_.calls;
  work_.resize(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    auto it = seqs_.find(jobs[i].seq);
    SPECDEC_CHECK(it != seqs_.end(), "draft job for a sequence that was not added");
    SPECDEC_CHECK(it->second->last_call != n_calls_, "two draft jobs for one sequence");
    const DraftJob& job = jobs[i];
    SPECDEC_CHECK(
        !job.tokens.empty() && job.tree->size() == 1 && job.tree->token(0) == job.tokens.back(),
        "a draft job's tree must be reset to the history's last token");
    it->second->last_call = n_calls_;  // not evicted for the jobs before it
    work_[i].state = it->second.get();
    work_[i].tree = job.tree;
  }
  // Pass 1: every job's uncached suffix of its history, its last token's logits out.
  running_.clear();
  batches_.clear();
  for (size_t i = 0; i < jobs.size(); ++i) {
    const DraftJob& job = jobs[i];
    Work& w = work_[i];
    SeqState& s = *w.state;
    const int max_tokens = draft_room(s.capacity, job.tokens.size(), job.max_tokens);
    if (max_tokens <= 0) continue;
    // Planned on a copy: a job dropped for want of blocks leaves the record as it was.
    planned_ = s.cache;
    int64_t keep = plan_draft_catch_up(&planned_, job.tokens, job.n_prompt,
                                       s.decoder.config().catch_up_window, &w.positions);
    if (s.evicted) {
      // The K/V is gone but the record says what it read: those positions first, so that the
      // cache becomes the one it would have been.
      std::vector<int32_t> again;
      for (int64_t p = 0; static_cast<int64_t>(again.size()) < keep; ++p) {
        if (p == planned_.gap_begin) p = std::max(p, planned_.gap_end);
        again.push_back(static_cast<int32_t>(p));
      }
      w.positions.insert(w.positions.begin(), again.begin(), again.end());
      keep = 0;
    }
    const auto n_run = static_cast<int64_t>(w.positions.size());
    // Slots it may fill: what stays, this catch-up and the chain's drafts but the last.
    if (!reserve(&s, keep + n_run + max_tokens - 1)) {
      evict(&s);
      ++stats_.jobs_dropped;
      continue;
    }
    stats_.tokens_skipped += std::max<int64_t>(
        0, (planned_.gap_end - planned_.gap_begin) - (s.cache.gap_end - s.cache.gap_begin));
    std::swap(s.cache, planned_);
    s.evicted = false;
    s.decoder.start(max_tokens, job.draft_step_cost, job.node_cost);
    w.run.resize(static_cast<size_t>(n_run));
    for (int64_t i = 0; i < n_run; ++i) w.run[i] = job.tokens[static_cast<size_t>(w.positions[i])];
    w.row = static_cast<int32_t>(n_run - 1);
    SeqBatch b;
    b.kv = SeqKv{storage_.get(), s.table.blocks, keep, s.capacity};
    b.batch.tokens = w.run;
    b.batch.positions = w.positions;
    b.batch.output_rows = {&w.row, 1};
    batches_.push_back(b);
    running_.push_back(&w);
  }
  try {
    if (!running_.empty()) run_and_decide();
    // One pass per depth: each chain's new token after its cache.
    while (!running_.empty()) {
      batches_.resize(running_.size());
      for (size_t i = 0; i < running_.size(); ++i) {
        Work& w = *running_[i];
        SeqState& s = *w.state;
        w.positions.assign(1, static_cast<int32_t>(s.cache.tokens.size()));
        w.row = 0;
        SeqBatch& b = batches_[i];
        b.kv = SeqKv{storage_.get(), s.table.blocks, s.cache.slots(), s.capacity};
        b.batch = ForwardBatch{};
        b.batch.tokens = {&w.token, 1};
        b.batch.positions = w.positions;
        b.batch.output_rows = {&w.row, 1};
        s.cache.tokens.push_back(w.token);
      }
      run_and_decide();
    }
  } catch (const Error&) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      reset(work_[i].state);
      jobs[i].tree->reset(jobs[i].tokens.back());
    }
    throw;
  }
  // The blocks past each cache go back (the next call reserves what it needs).
  for (Work& w : work_) {
    if (!w.state->evicted) kv_->shrink(&w.state->table, w.state->cache.slots());
  }
}

void BatchedDraftModel::check_invariants() const {
  pool_->check_invariants();
  // Nothing is shared (no prefix cache): every used block is in exactly one table.
  int64_t held = 0;
  for (const auto& [id, s] : seqs_) {
    held += static_cast<int64_t>(s->table.blocks.size());
    for (int32_t b : s->table.blocks) {
      SPECDEC_CHECK(pool_->refcount(b) == 1, "a draft block's refcount is not its one table");
    }
    const int64_t held_slots = s->evicted ? 0 : s->cache.slots();
    SPECDEC_CHECK(static_cast<int64_t>(s->table.blocks.size()) == kv_->blocks_for(held_slots),
                  "a draft table does not fit its cached tokens");
    SPECDEC_CHECK(static_cast<int64_t>(s->cache.tokens.size()) <= s->capacity,
                  "a draft cache holds more than its context");
  }
  SPECDEC_CHECK(held == pool_->num_used(), "draft blocks used outside the tables");
}

}  // namespace specdec
