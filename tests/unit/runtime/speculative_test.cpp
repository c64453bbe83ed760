// The prompt-lookup drafter (runtime/speculative.h): which continuation it proposes, how the draft
// length follows the acceptance rate, and when it pauses.
#include <gtest/gtest.h>

#include "larder/runtime/speculative.h"

namespace larder::runtime {
namespace {

SpecOptions opts(int k, int nmin = 1, int nmax = 3) {
  SpecOptions o;
  o.draft_max = k;
  o.ngram_min = nmin;
  o.ngram_max = nmax;
  return o;
}

TEST(NgramDrafter, ProposesWhatFollowedTheSuffixEarlier) {
  NgramDrafter d(opts(4));
  // ... 1 2 3 [4 5 6 7 8] ... 1 2 3 → 4 5 6 7
  const std::vector<int32_t> h = {9, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3};
  EXPECT_EQ(d.draft(h, 100), (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(d.draft(h, 2), (std::vector<int32_t>{4, 5}));  // the caller's room bounds it
  EXPECT_TRUE(d.draft(h, 0).empty());
}

TEST(NgramDrafter, LongestSuffixWinsThenMostRecentOccurrence) {
  NgramDrafter d(opts(2));
  // The 1-gram "3" last occurred before 7, but the 2-gram "2 3" before 5: the longer match wins.
  const std::vector<int32_t> h = {2, 3, 5, 5, 8, 3, 7, 7, 2, 3};
  EXPECT_EQ(d.draft(h, 100), (std::vector<int32_t>{5, 5}));
  // Two occurrences of the same n-gram: the most recent one.
  const std::vector<int32_t> h2 = {4, 1, 1, 4, 2, 2, 4};
  EXPECT_EQ(d.draft(h2, 100), (std::vector<int32_t>{2, 2}));
}

TEST(NgramDrafter, ADraftStopsAtTheEndOfTheHistory) {
  NgramDrafter d(opts(8));
  const std::vector<int32_t> h = {5, 6, 5};  // "5" occurred at 0, followed by 6 5
  EXPECT_EQ(d.draft(h, 100), (std::vector<int32_t>{6, 5}));
}

TEST(NgramDrafter, NoRecurringSuffixNoDraft) {
  NgramDrafter d(opts(4));
  EXPECT_TRUE(d.draft({1, 2, 3, 4, 5}, 100).empty());
  EXPECT_TRUE(d.draft({7}, 100).empty());
  EXPECT_TRUE(d.draft({}, 100).empty());
  NgramDrafter two(opts(4, 2, 3));  // 1-grams not used: "3" recurs alone, no 2-gram does
  EXPECT_TRUE(two.draft({3, 1, 2, 3}, 100).empty());
}

TEST(NgramDrafter, DraftLengthFollowsAcceptance) {
  NgramDrafter d(opts(8));
  EXPECT_EQ(d.k(), 8);
  d.feedback(8, 2);  // two taken: draft one past that next time
  EXPECT_EQ(d.k(), 3);
  d.feedback(3, 3);  // all taken: look further ahead
  EXPECT_EQ(d.k(), 6);
  d.feedback(6, 6);
  EXPECT_EQ(d.k(), 8);  // capped at draft_max
  EXPECT_EQ(d.drafted(), 17);
  EXPECT_EQ(d.accepted(), 11);
}

TEST(NgramDrafter, PausesWhenDraftsAreRejectedAndTriesAgainLater) {
  NgramDrafter d(opts(4));
  const std::vector<int32_t> h = {1, 2, 1};
  int rejected = 0;
  while (!d.paused()) {
    ASSERT_FALSE(d.draft(h, 100).empty());
    d.feedback(static_cast<int>(d.k()), 0);
    ASSERT_LT(++rejected, 10) << "never paused";
  }
  EXPECT_EQ(d.k(), 1);
  int skipped = 0;
  while (d.draft(h, 100).empty()) ASSERT_LT(++skipped, 1000);
  EXPECT_EQ(skipped, 16);  // the first pause; the next one is longer
  while (!d.paused()) d.feedback(1, 0);
  skipped = 0;
  while (d.draft(h, 100).empty()) ASSERT_LT(++skipped, 1000);
  EXPECT_EQ(skipped, 32);
}

TEST(Drafter, DraftsShorterThanDraftMinAreNotVerified) {
  SpecOptions o = opts(6);
  o.draft_min = 3;
  NgramDrafter d(o);
  // "2" occurred with only one token after it: fewer than draft_min, nothing to verify.
  EXPECT_TRUE(d.draft({5, 2, 2}, 100).empty());
  EXPECT_EQ(d.draft({1, 2, 7, 8, 9, 1, 2}, 100), (std::vector<int32_t>{7, 8, 9, 1, 2}));
  EXPECT_TRUE(d.draft({1, 2, 7, 8, 9, 1, 2}, 2).empty());  // the room leaves less than draft_min
  // The adaptive length never goes below draft_min: none taken asks for draft_min next time.
  d.feedback(6, 0);
  EXPECT_EQ(d.k(), 3);
}

// A drafted token that costs a fraction of a target step (a draft model) must be taken at least
// that often: drafting pauses below max(0.2, draft_cost), where prompt lookup would go on.
TEST(Drafter, PausesBelowTheDraftCost) {
  const std::vector<int32_t> h = {1, 2, 3, 1, 2};
  SpecOptions cheap = opts(4), dear = opts(4);
  dear.draft_cost = 0.45;
  NgramDrafter a(cheap), b(dear);
  for (int i = 0; i < 3; ++i) {  // 3 of every 8 taken: 37.5 %
    a.feedback(8, 3);
    b.feedback(8, 3);
  }
  EXPECT_FALSE(a.paused());
  EXPECT_TRUE(b.paused());
  EXPECT_TRUE(b.draft(h, 100).empty());
}

TEST(NgramDrafter, OffAtDraftMaxZero) {
  NgramDrafter d(opts(0));
  EXPECT_TRUE(d.draft({1, 2, 1}, 100).empty());
}

}  // namespace
}  // namespace larder::runtime
