// plan_draft_catch_up: which positions a draft cache keeps, skips and runs when it catches up
// with a sequence's history, checked case by case against hand-worked expectations.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "speculative/draft_decoder.h"

namespace specdec {
namespace {

std::vector<int32_t> iota(int64_t from, int64_t to) {
  std::vector<int32_t> v(static_cast<size_t>(to - from));
  std::iota(v.begin(), v.end(), static_cast<int32_t>(from));
  return v;
}

// A history of n distinct tokens (token = 1000 + position).
std::vector<int32_t> history(int64_t n) {
  std::vector<int32_t> h = iota(0, n);
  for (int32_t& t : h) t += 1000;
  return h;
}

TEST(DraftCatchUp, EmptyCacheReadsThePromptWholeAndTheLastWindowOfGenerated) {
  DraftCache c;
  std::vector<int32_t> run;
  // 10 prompt tokens, 2 generated: nothing to skip.
  EXPECT_EQ(plan_draft_catch_up(&c, history(12), 10, 4, &run), 0);
  EXPECT_EQ(run, iota(0, 12));
  EXPECT_EQ(c.slots(), 12);
  EXPECT_EQ(c.gap_begin, c.gap_end);

  // 10 prompt tokens, 20 generated, window 4: the prompt, then positions 26..29.
  c.clear();
  EXPECT_EQ(plan_draft_catch_up(&c, history(30), 10, 4, &run), 0);
  std::vector<int32_t> want = iota(0, 10);
  for (int32_t p : iota(26, 30)) want.push_back(p);
  EXPECT_EQ(run, want);
  EXPECT_EQ(c.gap_begin, 10);
  EXPECT_EQ(c.gap_end, 26);
  EXPECT_EQ(c.slots(), 14);
  EXPECT_EQ(c.tokens, history(30));

  // A window of 0 reads everything.
  c.clear();
  EXPECT_EQ(plan_draft_catch_up(&c, history(30), 10, 0, &run), 0);
  EXPECT_EQ(run, iota(0, 30));
}

TEST(DraftCatchUp, KeepsTheCommonPrefixAndRunsTheLastTokenAgain) {
  DraftCache c;
  std::vector<int32_t> run;
  plan_draft_catch_up(&c, history(12), 10, 4, &run);
  // The cache read 0..11; chain drafts 12, 13 (13 is never run, but counted as read).
  c.tokens.push_back(1012);
  c.tokens.push_back(1013);
  // The target accepted 12 and added 13' (another token): keep 0..12, run 13'.
  std::vector<int32_t> h = history(13);
  h.push_back(7);
  EXPECT_EQ(plan_draft_catch_up(&c, h, 10, 4, &run), 13);
  EXPECT_EQ(run, std::vector<int32_t>{13});
  EXPECT_EQ(c.tokens, h);
  // The same history again: its last token runs again for its logits.
  EXPECT_EQ(plan_draft_catch_up(&c, h, 10, 4, &run), 13);
  EXPECT_EQ(run, std::vector<int32_t>{13});
}

TEST(DraftCatchUp, ALaterLongPauseExtendsTheOneGap) {
  DraftCache c;
  std::vector<int32_t> run;
  plan_draft_catch_up(&c, history(30), 10, 4, &run);  // gap [10, 26), slots 14
  // 3 tokens later: all 30 positions stay (14 slots), run 30..32.
  EXPECT_EQ(plan_draft_catch_up(&c, history(33), 10, 4, &run), 14);
  EXPECT_EQ(run, iota(30, 33));
  EXPECT_EQ(c.gap_begin, 10);
  EXPECT_EQ(c.gap_end, 26);
  // 17 tokens later: the gap grows to [10, 46), the slots after the old gap go, run 46..49.
  EXPECT_EQ(plan_draft_catch_up(&c, history(50), 10, 4, &run), 10);
  EXPECT_EQ(run, iota(46, 50));
  EXPECT_EQ(c.gap_begin, 10);
  EXPECT_EQ(c.gap_end, 46);
  EXPECT_EQ(c.slots(), 14);
}

TEST(DraftCatchUp, AHistoryThatDivergesInsideTheGapCutsIt) {
  DraftCache c;
  std::vector<int32_t> run;
  plan_draft_catch_up(&c, history(30), 10, 4, &run);  // gap [10, 26)
  // A history that differs from position 20 (inside the gap): kept 0..19 of which the gap
  // [10, 20) stays, so 10 slots; run 20..23 (4 generated after the kept part: no skip).
  std::vector<int32_t> h = history(24);
  for (size_t i = 20; i < h.size(); ++i) h[i] = 5;
  EXPECT_EQ(plan_draft_catch_up(&c, h, 10, 4, &run), 10);
  EXPECT_EQ(run, iota(20, 24));
  EXPECT_EQ(c.gap_begin, 10);
  EXPECT_EQ(c.gap_end, 20);
  // One that differs before the gap: the gap vanishes.
  std::vector<int32_t> g = history(9);
  g.push_back(5);
  EXPECT_EQ(plan_draft_catch_up(&c, g, 10, 4, &run), 9);
  EXPECT_EQ(run, std::vector<int32_t>{9});
  EXPECT_EQ(c.gap_begin, c.gap_end);
  EXPECT_EQ(c.slots(), 10);
}

}  // namespace
}  // namespace specdec
