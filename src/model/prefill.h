// Chunked prompt processing into a contiguous cache: the Generator's prefill and the draft
// model's reading of the prompt (DraftModelProposer::begin).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"

namespace specdec {

class ThreadPool;

// Runs prompt tokens [0, n) through the model into kv (which must be empty), `chunk` tokens per
// pass, and returns the logits of the last prompt token: [n_vocab]; with `hidden`, also its
// hidden state. With logits == false only the K/V are written (no output row: empty result).
// A pass that throws leaves the chunks before it in kv.
std::vector<float> prefill(Model& model, KvCache& kv, std::span<const int32_t> prompt, int chunk,
                           ThreadPool* pool, std::vector<float>* hidden = nullptr,
                           bool logits = true);

}  // namespace specdec
