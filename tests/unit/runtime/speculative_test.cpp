// The shared drafting policy (runtime/speculative.h): which continuation prompt lookup proposes,
// the measured costs (SpecCost), and the cost model's decision — draft only what pays.
#include <gtest/gtest.h>

#include <cstdint>

#include "larder/runtime/speculative.h"

namespace larder::runtime {
namespace {

SpecOptions opts(int k, int nmin = 1, int nmax = 32) {
  SpecOptions o;
  o.draft_max = k;
  o.ngram_min = nmin;
  o.ngram_max = nmax;
  return o;
}

// Verifying any number of rows costs one step (a weight-bound forward): every draft pays.
void free_verify(Drafter& d) {
  for (int r = 1; r <= 17; ++r) d.cost().forward(r, 1.0);
}

TEST(NgramDrafter, ProposesWhatFollowedTheSuffixEarlier) {
  NgramDrafter d(opts(4));
  free_verify(d);
  // ... 1 2 3 [4 5 6 7 8] ... 1 2 3 → 4 5 (the first drafts are short) → 4 5 6 7 once taken
  const std::vector<int32_t> h = {9, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3};
  EXPECT_EQ(d.k(), 2);
  EXPECT_EQ(d.draft(h, 100), (std::vector<int32_t>{4, 5}));
  d.feedback(2, 2);
  EXPECT_EQ(d.draft(h, 100), (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(d.draft(h, 3), (std::vector<int32_t>{4, 5, 6}));  // the caller's room bounds it
  EXPECT_TRUE(d.draft(h, 0).empty());
}

TEST(NgramDrafter, NothingBeforeTheFirstStepIsTimed) {
  NgramDrafter d(opts(4));
  EXPECT_TRUE(d.draft({1, 2, 1}, 100).empty());  // no cost measured: one plain step first
  d.cost().forward(1, 1.0);
  EXPECT_FALSE(d.draft({1, 2, 1}, 100).empty());
}

TEST(NgramDrafter, LongestMatchWinsThenMostRecentOccurrence) {
  NgramDrafter d(opts(2));
  free_verify(d);
  // "3" last occurred before 7, "2 3" before 5, "1 2 3" before 9: the longest match wins.
  const std::vector<int32_t> h = {1, 2, 3, 9, 9, 2, 3, 5, 5, 8, 3, 7, 7, 1, 2, 3};
  EXPECT_EQ(d.draft(h, 100), (std::vector<int32_t>{9, 9}));
  // Two occurrences of the same n-gram: the most recent one.
  const std::vector<int32_t> h2 = {4, 1, 1, 4, 2, 2, 4};
  EXPECT_EQ(d.draft(h2, 100), (std::vector<int32_t>{2, 2}));
  // ngram_max bounds the match: with 1 the most recent "3" wins.
  NgramDrafter one(opts(2, 1, 1));
  free_verify(one);
  EXPECT_EQ(one.draft(h, 100), (std::vector<int32_t>{7, 7}));
}

TEST(NgramDrafter, TheMatchContinuesAcrossAcceptedTokens) {
  // Quoting a passage: after each taken draft the match at the passage grows longer than any
  // other occurrence of its last tokens, so the next draft continues the same passage.
  NgramDrafter d(opts(4));
  free_verify(d);
  std::vector<int32_t> h = {7, 1, 2, 3, 4, 5, 6, 1, 9, 9, 2, 8, 7};  // the passage: 7 1 2 3 4 5 6 1 9
  std::vector<int32_t> draft = d.draft(h, 100);
  EXPECT_EQ(draft, (std::vector<int32_t>{1, 2}));
  h.insert(h.end(), draft.begin(), draft.end());
  d.feedback(2, 2);
  // The suffix "7 1 2" matches the passage; "2" alone last occurred before 8.
  draft = d.draft(h, 100);
  EXPECT_EQ(draft, (std::vector<int32_t>{3, 4, 5, 6}));
  h.insert(h.end(), draft.begin(), draft.end());
  d.feedback(4, 4);
  EXPECT_EQ(d.draft(h, 100), (std::vector<int32_t>{1, 9, 9, 2}));
}

TEST(NgramDrafter, ADraftStopsAtTheEndOfTheHistory) {
  NgramDrafter d(opts(8));
  free_verify(d);
  const std::vector<int32_t> h = {5, 6, 5};  // "5" occurred at 0, followed by 6 5
  EXPECT_EQ(d.draft(h, 100), (std::vector<int32_t>{6, 5}));
}

TEST(NgramDrafter, NoRecurringSuffixNoDraft) {
  NgramDrafter d(opts(4));
  free_verify(d);
  EXPECT_TRUE(d.draft({1, 2, 3, 4, 5}, 100).empty());
  EXPECT_TRUE(d.draft({7}, 100).empty());
  EXPECT_TRUE(d.draft({}, 100).empty());
  NgramDrafter two(opts(4, 2, 3));  // 1-token matches not used: "3" recurs alone, no 2-gram does
  free_verify(two);
  EXPECT_TRUE(two.draft({3, 1, 2, 3}, 100).empty());
}

TEST(Drafter, DraftCapFollowsAcceptance) {
  NgramDrafter d(opts(8));
  EXPECT_EQ(d.k(), 2);  // short until the pair shows its rate
  d.feedback(2, 2);     // all taken: look further ahead
  EXPECT_EQ(d.k(), 4);
  d.feedback(4, 4);
  EXPECT_EQ(d.k(), 8);
  d.feedback(8, 8);
  EXPECT_EQ(d.k(), 8);  // capped at draft_max
  d.feedback(8, 2);     // two taken: one past that next time
  EXPECT_EQ(d.k(), 3);
  EXPECT_EQ(d.drafted(), 22);
  EXPECT_EQ(d.accepted(), 16);
}

TEST(Drafter, DraftsShorterThanDraftMinAreNotVerified) {
  SpecOptions o = opts(6);
  o.draft_min = 3;
  NgramDrafter d(o);
  free_verify(d);
  EXPECT_EQ(d.k(), 3);
  // "2" occurred with only one token after it: fewer than draft_min, nothing to verify.
  EXPECT_TRUE(d.draft({5, 2, 2}, 100).empty());
  EXPECT_EQ(d.draft({1, 2, 7, 8, 9, 1, 2}, 100), (std::vector<int32_t>{7, 8, 9}));
  EXPECT_TRUE(d.draft({1, 2, 7, 8, 9, 1, 2}, 2).empty());  // the room leaves less than draft_min
  d.feedback(3, 0);  // none taken asks for draft_min next time, never less
  EXPECT_EQ(d.k(), 3);
}

// ---- the measured costs ----

TEST(SpecCost, FitsALineThroughTheMeasuredForwards) {
  SpecCost c;
  EXPECT_EQ(c.forward_time(1), 0);  // nothing measured
  c.forward(1, 1.0);
  EXPECT_DOUBLE_EQ(c.forward_time(1), 1.0);
  EXPECT_DOUBLE_EQ(c.forward_time(3), 1.3);  // the prior slope: 0.15 of a step per row
  c.forward(5, 2.0);
  EXPECT_NEAR(c.forward_time(3), 1.5, 1e-12);  // the line through both
  EXPECT_NEAR(c.forward_time(9), 3.0, 1e-12);
  c.forward(100, 9.0);  // a prefill-sized forward is not a verify: not recorded
  EXPECT_NEAR(c.forward_time(9), 3.0, 1e-12);
  // Noisy samples (a loaded machine: ±30 %) at many row counts: the line, not any one sample.
  SpecCost n;
  uint64_t rng = 7;
  for (int i = 0; i < 400; ++i) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    const double noise = 0.7 + 0.6 * static_cast<double>(rng >> 11) / 9007199254740992.0;
    const int rows = 1 + i % 17;
    n.forward(rows, (1.0 + 0.05 * (rows - 1)) * noise);
  }
  EXPECT_NEAR(n.forward_time(1), 1.0, 0.15);
  EXPECT_NEAR(n.forward_time(17) / n.forward_time(1), 1.8, 0.35);
  // Verify forwards only, all of one length (a rewrite that drafts every step): the prior slope
  // through their mean.
  SpecCost v;
  v.forward(9, 2.2);
  EXPECT_NEAR(v.forward_time(1), 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(v.draft_time(0.25), 0.25);  // the prior until a draft is timed
  v.drafted(4, 2.0);
  EXPECT_DOUBLE_EQ(v.draft_time(0.25), 0.5);
}

// ---- the decision ----

TEST(Drafter, NoDraftWhereVerifyRowsCostWhatTheyMightSave) {
  NgramDrafter d(opts(8));
  for (int r = 1; r <= 9; ++r) d.cost().forward(r, r);  // compute-bound: each row a step
  EXPECT_EQ(d.plan(0, 8, {}), 0);                        // 1 + a + … never beats k + 1 steps at a < 1
  NgramDrafter cheap(opts(8));
  for (int r = 1; r <= 9; ++r) cheap.cost().forward(r, 1.0 + 0.05 * (r - 1));
  EXPECT_GT(cheap.plan(0, 8, {}), 0);
}

TEST(Drafter, LongerDraftsAsAcceptanceRises) {
  NgramDrafter d(opts(16));
  for (int r = 1; r <= 17; ++r) d.cost().forward(r, 1.0 + 0.1 * (r - 1));
  const int at_prior = d.plan(4, 16, {});  // a = 0.5
  for (int i = 0; i < 20; ++i) d.feedback(16, 16);
  EXPECT_GT(d.acceptance(0), 0.9);  // feedback went to the last drafted kind (0: none drafted yet)
  const int at_high = d.plan(0, 16, {});
  EXPECT_GT(at_high, at_prior);
  EXPECT_EQ(at_high, 16);
}

TEST(Drafter, ADearDraftNeedsAHighAcceptance) {
  // A draft model whose token costs 0.45 of a target step: at the prior 50 % it does not pay,
  // prompt lookup's free tokens do.
  SpecOptions dear = opts(6);
  dear.draft_cost = 0.45;
  NgramDrafter a(opts(6)), b(dear);
  for (Drafter* d : {static_cast<Drafter*>(&a), static_cast<Drafter*>(&b)})
    for (int r = 1; r <= 7; ++r) d->cost().forward(r, 1.0 + 0.1 * (r - 1));
  EXPECT_GT(a.plan(0, 6, {}), 0);
  EXPECT_EQ(b.plan(0, 6, {}), 0);
  // And one that pays alone does not in a batch of 8: every sequence waits for its draft forwards.
  SpecOptions mid = opts(6);
  mid.draft_cost = 0.1;
  NgramDrafter c(mid);
  for (int r = 1; r <= 16; ++r) c.cost().forward(r, 1.0 + 0.02 * (r - 1));
  EXPECT_GT(c.plan(0, 6, {1, 1}), 0);
  EXPECT_EQ(c.plan(0, 6, {8, 8}), 0);
}

// A draft source in a simulated machine: a target forward of r rows costs 1 + slope·(r - 1)
// steps, a drafted token `td` steps (told to the policy as the proposal's cost), and each drafted
// token is taken with probability `rate` (a fixed pseudo-random sequence). The simulated time is
// counted from the forwards, rows and drafted tokens — no clock.
class SimDrafter final : public Drafter {
 public:
  SimDrafter(SpecOptions o, double td, bool cheap) : Drafter(std::move(o)), td_(td), cheap_(cheap) {}

 private:
  bool cheap() const override { return cheap_; }
  Proposal propose(const std::vector<int32_t>&, int64_t want) override {
    Proposal p;
    p.tokens.assign(static_cast<size_t>(want), 1);
    p.seconds = td_ * static_cast<double>(want);
    return p;
  }
  double td_;
  bool cheap_;
};

struct SimResult {
  double time_per_token = 0;  // in plain decode steps
  int64_t drafted = 0;
};

SimResult simulate(double rate, double td, double slope, bool cheap, int64_t tokens = 4000) {
  SpecOptions o = opts(16);
  o.draft_cost = td;
  SimDrafter d(o, td, cheap);
  uint64_t rng = 12345;
  const auto taken = [&] {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(rng >> 11) / 9007199254740992.0 < rate;
  };
  const auto forward = [&](int64_t rows) { return 1.0 + slope * static_cast<double>(rows - 1); };
  double time = 0;
  int64_t made = 0;
  const std::vector<int32_t> history = {1, 1, 1};
  while (made < tokens) {
    const std::vector<int32_t> draft = d.draft(history, 1000);
    const int64_t rows = 1 + static_cast<int64_t>(draft.size());
    time += forward(rows) + td * static_cast<double>(draft.size());
    d.cost().forward(rows, forward(rows));
    int accepted = 0;
    while (accepted < static_cast<int>(draft.size()) && taken()) ++accepted;
    if (!draft.empty()) d.feedback(static_cast<int>(draft.size()), accepted);
    made += 1 + accepted;
  }
  return {time / static_cast<double>(made), d.drafted()};
}

// The decision's purpose: where drafting cannot pay, the sequence decodes at plain speed but for
// a few percent (the probes); where it pays, it is taken.
TEST(Drafter, WhereDraftingCannotPayItCostsAtMostAFewPercent) {
  // A draft model on free chat: 30 % taken, a drafted token 0.45 of a step.
  const SimResult chat = simulate(0.3, 0.45, 0.1, /*cheap=*/false);
  EXPECT_LE(chat.time_per_token, 1.03);
  // Prompt lookup finding matches that are never taken, on a forward whose rows cost a quarter.
  const SimResult never = simulate(0.0, 0.0, 0.25, /*cheap=*/true);
  EXPECT_LE(never.time_per_token, 1.03);
  // The same draft model where it is right 90 % of the time: a real gain.
  const SimResult rewrite = simulate(0.9, 0.45, 0.1, /*cheap=*/false);
  EXPECT_LT(rewrite.time_per_token, 0.85);
  // Prompt lookup quoting (95 % taken): long drafts, more than twice plain speed.
  const SimResult quote = simulate(0.95, 0.0, 0.05, /*cheap=*/true);
  EXPECT_LT(quote.time_per_token, 0.5);
  EXPECT_GT(quote.drafted, 1000);
}

TEST(NgramDrafter, OffAtDraftMaxZero) {
  NgramDrafter d(opts(0));
  free_verify(d);
  EXPECT_TRUE(d.draft({1, 2, 1}, 100).empty());
}

}  // namespace
}  // namespace larder::runtime
