// The scheduler's limit on prompt tokens per step while other sequences decode: fixed values,
// no limit, and the cost-model bound (a step costs at most kDecodeStepSlack times its decodes
// alone, counting the decoders' cached context), clamped to [kMinPrefillChunk, max_batch_tokens].
#include <gtest/gtest.h>

#include "engine/scheduler.h"

namespace specdec {
namespace {

TEST(PrefillLimit, FixedAndUnlimited) {
  SchedulerLimits l;
  l.max_batch_tokens = 512;
  l.max_prefill_tokens_decoding = 40;
  EXPECT_EQ(prefill_tokens_while_decoding(l, 8, 1000), 40);
  l.max_prefill_tokens_decoding = -1;
  EXPECT_EQ(prefill_tokens_while_decoding(l, 8, 1000), 512);
}

TEST(PrefillLimit, CostModelBoundsTheStepCost) {
  SchedulerLimits l;
  l.max_batch_tokens = 4096;
  l.token_cost = 0.1;
  l.slot_cost = 0.001;
  // 8 decodes over 1000 slots: alone = 1 + 0.1 * 7 + 1.0 = 2.7 passes.
  const int64_t t = prefill_tokens_while_decoding(l, 8, 1000);
  const double alone = 2.7;
  EXPECT_LE(alone + l.token_cost * static_cast<double>(t), kDecodeStepSlack * alone + 1e-9);
  EXPECT_GT(alone + l.token_cost * static_cast<double>(t + 1), kDecodeStepSlack * alone);
  // More context to read per step: a larger chunk fits in the same relative slack.
  EXPECT_GT(prefill_tokens_while_decoding(l, 8, 8000), t);
  // Cheap extra tokens (a GPU): the whole budget.
  l.token_cost = 1e-4;
  EXPECT_EQ(prefill_tokens_while_decoding(l, 8, 1000), 4096);
  // Expensive ones: never below the minimum chunk.
  l.token_cost = 10;
  EXPECT_EQ(prefill_tokens_while_decoding(l, 1, 0), kMinPrefillChunk);
  // No decodes: no limit.
  EXPECT_EQ(prefill_tokens_while_decoding(l, 0, 0), 4096);
}

}  // namespace
}  // namespace specdec
