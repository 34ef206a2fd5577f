// A request's solo output, the reference of every engine test: the single-sequence Generator
// (contiguous KV cache) with the same sampling, stop tokens and speculation as the request
// (fixed draft length: the engine tests use non-adaptive drafts so the lengths match).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/kv_type.h"
#include "specdec/engine.h"

namespace specdec {

class Model;
class Tokenizer;
class ThreadPool;
class ReDrafterHead;
class MedusaHeads;

namespace test {

// ctx <= 0: the model's context. draft: the draft model of SpecMethod::kDraft requests; head:
// the drafter head of SpecMethod::kReDrafter requests; medusa: the heads of kMedusa requests;
// kv_type: the solo cache's (the engine's --kv-type).
std::vector<int32_t> solo_output(Model& model, const Tokenizer& tok, ThreadPool* pool,
                                 const Request& r, Model* draft = nullptr, int64_t ctx = 0,
                                 const ReDrafterHead* head = nullptr,
                                 const MedusaHeads* medusa = nullptr,
                                 KvType kv_type = KvType::kF16);

}  // namespace test
}  // namespace specdec
