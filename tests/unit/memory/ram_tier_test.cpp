// ram_tier_test.cpp — RAM-tier rules of kv-store.md §2–§5 with synthetic states and stub tiers.
#include "larder/memory/store/ram_tier.h"

#include <gtest/gtest.h>

#include "kv_test_util.h"

namespace larder::memory {
namespace {

using testing::cat;
using testing::extend;
using testing::Kinds;
using testing::kLayout;
using testing::kv_matches;
using testing::prefilled;
using testing::seq;

constexpr size_t kBig = 1ull << 30;

void put_ok(RamTier& r, const std::vector<int32_t>& t, const Kinds& k = {}, const std::string& ns = "base") {
  ASSERT_TRUE(r.put(t, prefilled(t, k), ns).is_ok());
}

// Takes and turns the hit into a live state (or a fresh one on a miss).
SequenceState take_state(RamTier& r, const std::vector<int32_t>& prompt, int64_t* p, const Kinds& k = {},
                         std::string* reason = nullptr, const std::string& ns = "base") {
  TakeResult t = r.take(prompt, ns);
  if (reason) *reason = t.report.reason;
  *p = t.hit ? t.hit->tokens : 0;
  EXPECT_EQ(t.report.reused_tokens, *p);
  if (!t.hit) return testing::fresh(k);
  return std::move(*t.hit).into_state(kLayout, testing::kCtx);
}

TEST(RamTier, LongestUsablePrefixWins) {
  RamTier r(kBig);
  const auto a = seq(1, 10);
  const auto b = cat(seq(1, 4), seq(50, 10));
  put_ok(r, b);
  put_ok(r, a);
  const auto prompt = cat(seq(1, 8), {99});
  int64_t p = 0;
  SequenceState s = take_state(r, prompt, &p);
  EXPECT_EQ(p, 8);
  EXPECT_TRUE(kv_matches(s.kv, prompt, 8));
  EXPECT_EQ(r.peek(prompt, "base"), 8);
}

TEST(RamTier, ExactRepeatReusesLenMinusOne) {
  RamTier r(kBig);
  const auto a = seq(1, 12);
  put_ok(r, a);
  TakeResult t = r.take(a, "base");
  ASSERT_TRUE(t.hit);
  EXPECT_EQ(t.hit->tokens, 11);
  EXPECT_EQ(t.report.reason, "exact_repeat");
  EXPECT_EQ(r.stats().entries, 1u);  // non-consuming: the donor stays
}

TEST(RamTier, DonorUntouchedAfterTakesAndWritesThroughViews) {
  RamTier r(kBig);
  const auto donor = seq(1, 40);
  put_ok(r, donor);
  for (int i = 0; i < 5; ++i) {
    // A view that needs trimming (p = 20 of 40), then writes to its private tail.
    const auto prompt = cat(seq(1, 20), seq(1000 + 100 * i, 30));
    int64_t p = 0;
    SequenceState s = take_state(r, prompt, &p);
    ASSERT_EQ(p, 20);
    extend(s, prompt, p);
    EXPECT_TRUE(kv_matches(s.kv, prompt, static_cast<int64_t>(prompt.size())));
    // Trimming into the shared prefix detaches (copies) and the following writes go to private rows.
    s.kv.trim(10);
    const auto other = cat(seq(1, 10), seq(7000, 20));
    extend(s, other, 10);
    EXPECT_TRUE(kv_matches(s.kv, other, 30));
  }
  // The donor's bytes are unchanged: an exact take still reads the original rows.
  std::shared_ptr<const Entry> e = r.find_exact(donor, "base");
  ASSERT_TRUE(e);
  EXPECT_TRUE(testing::prefix_matches(*e->kv, donor, 40));
  EXPECT_EQ(r.stats().entries, 1u);
}

TEST(RamTier, ManyRequestsShareOneDonorWithoutLeaks) {
  RamTier r(kBig);
  const auto system = seq(1, 64);
  put_ok(r, system);
  std::vector<SequenceState> live;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(cat(system, seq(10000 * (i + 1), 16)));  // unique marker per request
    int64_t p = 0;
    live.push_back(take_state(r, prompts.back(), &p));
    ASSERT_EQ(p, 64);
    EXPECT_EQ(live.back().kv.prefix_tokens(), 64);  // zero-copy: the donor block is attached
  }
  for (int i = 0; i < 8; ++i) extend(live[i], prompts[i], 64);
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(kv_matches(live[i].kv, prompts[i], 80)) << i;
  // One prefill: all eight share the donor block's storage.
  for (int i = 1; i < 8; ++i) EXPECT_EQ(live[i].kv.prefix().get(), live[0].kv.prefix().get());
}

TEST(RamTier, RingViewsTrimmedNotDonor) {
  RamTier r(kBig);
  Kinds k{.ring = true, .window = 32};
  const auto donor = seq(1, 20);  // pre-wrap: trimmable
  put_ok(r, donor, k);
  int64_t p = 0;
  SequenceState s = take_state(r, cat(seq(1, 12), {500, 501}), &p, k);
  ASSERT_EQ(p, 12);
  ASSERT_EQ(s.layers.size(), 1u);
  EXPECT_EQ(s.layers[0]->offset(), 12);
  std::shared_ptr<const Entry> e = r.find_exact(donor, "base");
  EXPECT_EQ(e->layers[0]->offset(), 20);
  // Writing through the view copies (COW) and leaves the donor ring's bytes unchanged.
  std::vector<float> before(static_cast<const RingState*>(e->layers[0].get())->k_row(12),
                            static_cast<const RingState*>(e->layers[0].get())->k_row(12) + 8);
  extend(s, cat(seq(1, 12), {500, 501}), 12);
  const float* after = static_cast<const RingState*>(e->layers[0].get())->k_row(12);
  EXPECT_EQ(0, std::memcmp(before.data(), after, 32));
}

TEST(RamTier, WrappedRingAndRecurrentMatchOnlyWhole) {
  for (Kinds k : {Kinds{.ring = true, .window = 8}, Kinds{.recurrent = true}, Kinds{.attachment = true}}) {
    RamTier r(kBig);
    const auto donor = seq(1, 20);  // the ring (window 8) has wrapped
    put_ok(r, donor, k);
    std::string reason;
    int64_t p = 0;
    // Divergent tail: would need a trim → unusable.
    take_state(r, cat(seq(1, 15), {900}), &p, k, &reason);
    EXPECT_EQ(p, 0);
    EXPECT_EQ(reason, "untrimmable_tail");
    // Exact repeat would also need a trim of 1 (len − 1 rule) → unusable.
    take_state(r, donor, &p, k, &reason);
    EXPECT_EQ(p, 0);
    // The whole entry as a prefix of a longer prompt: t == 0 → hit.
    const auto longer = cat(donor, {901, 902});
    SequenceState s = take_state(r, longer, &p, k, &reason);
    EXPECT_EQ(p, 20);
    EXPECT_EQ(reason, "hit");
    EXPECT_EQ(s.layers.size(), k.ring || k.recurrent ? 1u : 0u);
    EXPECT_EQ(s.attachments.size(), k.attachment ? 1u : 0u);
  }
}

TEST(RamTier, PreWrapRingIsTrimmableAndSupersedes) {
  RamTier r(kBig);
  Kinds k{.ring = true, .window = 64};
  put_ok(r, seq(1, 10), k);
  put_ok(r, seq(1, 20), k);
  EXPECT_EQ(r.stats().entries, 1u);
  EXPECT_EQ(r.stats().superseded, 1u);
}

TEST(RamTier, FreshInsertSurvivesEvictionAndLruOrder) {
  const size_t one = prefilled(seq(1, 100)).kv.owned_bytes();
  RamTier r(one * 3 + one / 2);
  put_ok(r, seq(1, 100));       // A
  put_ok(r, seq(1000, 100));    // B
  put_ok(r, seq(2000, 100));    // C
  // Serve A: it becomes most recent, so B is the LRU victim of the next insert.
  TakeResult t = r.take(cat(seq(1, 100), {5}), "base");
  ASSERT_TRUE(t.hit);
  t.hit.reset();
  put_ok(r, seq(3000, 100));    // D
  EXPECT_TRUE(r.find_exact(seq(1, 100), "base"));
  EXPECT_FALSE(r.find_exact(seq(1000, 100), "base"));
  EXPECT_TRUE(r.find_exact(seq(2000, 100), "base"));
  EXPECT_TRUE(r.find_exact(seq(3000, 100), "base"));
  EXPECT_LE(r.stats().bytes, r.cap_bytes());
  // An insert bigger than everything else but under the cap evicts all others, never itself.
  put_ok(r, seq(5000, 300));
  EXPECT_TRUE(r.find_exact(seq(5000, 300), "base"));
  EXPECT_EQ(r.stats().entries, 1u);
}

TEST(RamTier, SupersedeOnlyTrimmableAndNeverAcrossNamespaces) {
  {
    RamTier r(kBig);
    put_ok(r, seq(1, 10));
    put_ok(r, seq(1, 10), {}, "tenant-b");
    put_ok(r, seq(1, 20));
    EXPECT_EQ(r.stats().entries, 2u);  // base ancestor superseded; tenant-b kept
    EXPECT_TRUE(r.find_exact(seq(1, 10), "tenant-b"));
    EXPECT_FALSE(r.find_exact(seq(1, 10), "base"));
  }
  {
    RamTier r(kBig);
    Kinds rec{.recurrent = true};
    put_ok(r, seq(1, 10), rec);
    put_ok(r, seq(1, 20), rec);  // untrimmable: the shorter checkpoint must survive
    EXPECT_EQ(r.stats().entries, 2u);
    EXPECT_EQ(r.stats().superseded, 0u);
  }
}

TEST(RamTier, ExactDuplicateReplacesEvenWhenUntrimmable) {
  RamTier r(kBig);
  Kinds rec{.recurrent = true};
  put_ok(r, seq(1, 10), rec);
  const size_t bytes = r.stats().bytes;
  for (int i = 0; i < 5; ++i) put_ok(r, seq(1, 10), rec);
  EXPECT_EQ(r.stats().entries, 1u);
  EXPECT_EQ(r.stats().bytes, bytes);  // exact repeats do not grow bytes
  EXPECT_EQ(r.stats().duplicates, 5u);
}

struct CountingSink final : SpillSink {
  std::vector<std::shared_ptr<const Entry>> got;
  void spill(std::shared_ptr<const Entry> e) override { got.push_back(std::move(e)); }
};

TEST(RamTier, OversizeIsSpilledAndDropped) {
  CountingSink sink;
  RamTier r(1000, nullptr, &sink);
  put_ok(r, seq(1, 100));
  EXPECT_EQ(r.stats().entries, 0u);
  EXPECT_EQ(r.stats().oversize, 1u);
  ASSERT_EQ(sink.got.size(), 1u);
  EXPECT_EQ(sink.got[0]->tokens, seq(1, 100));
  RamTier zero(0, nullptr, &sink);  // cap 0: every put spills and drops
  put_ok(zero, seq(1, 5));
  EXPECT_EQ(zero.stats().entries, 0u);
  EXPECT_EQ(sink.got.size(), 2u);
}

TEST(RamTier, OwnedSpillOnePerEvictionDonorFreedWhenSettled) {
  CountingSink sink;
  const size_t one = prefilled(seq(1, 100)).kv.owned_bytes();
  RamTier r(one + one / 2, nullptr, &sink);
  put_ok(r, seq(1, 100));
  std::weak_ptr<const Entry> w = r.find_exact(seq(1, 100), "base");
  put_ok(r, seq(500, 100));
  EXPECT_EQ(sink.got.size(), 1u);
  EXPECT_FALSE(w.expired());  // alive only because the queue holds it
  sink.got.clear();           // the write settles
  EXPECT_TRUE(w.expired());
}

TEST(RamTier, ClearNeverSpills) {
  CountingSink sink;
  RamTier r(kBig, nullptr, &sink);
  put_ok(r, seq(1, 10));
  put_ok(r, seq(100, 10));
  r.clear();
  EXPECT_EQ(r.stats().entries, 0u);
  EXPECT_TRUE(sink.got.empty());
}

// A foreign KvPrefix whose destructor counts: the C++ form of the "share released once" rule.
struct CountedPrefix final : KvPrefix {
  KvLayout L;
  std::vector<std::vector<float>> k_, v_;
  int64_t n;
  int* destroyed;
  CountedPrefix(const std::vector<int32_t>& toks, int* d) : L(kLayout), n(static_cast<int64_t>(toks.size())), destroyed(d) {
    SequenceState s = prefilled(toks);
    for (int l = 0; l < L.n_layers; ++l) {
      std::vector<KvSpan> sp;
      s.kv.spans(l, n, &sp);
      k_.emplace_back(sp[0].k_f32(), sp[0].k_f32() + n * L.row_floats());
      v_.emplace_back(sp[0].v_f32(), sp[0].v_f32() + n * L.row_floats());
    }
  }
  ~CountedPrefix() override { ++*destroyed; }
  const KvLayout& layout() const override { return L; }
  int64_t tokens() const override { return n; }
  const void* k(int l) const override { return k_[l].data(); }
  const void* v(int l) const override { return v_[l].data(); }
};

TEST(RamTier, BackingReleasedExactlyOnceAfterDonorAndTakers) {
  int destroyed = 0;
  const auto base = seq(1, 30);
  {
    RamTier r(kBig);
    {
      SequenceState s(kLayout, testing::kCtx);
      s.kv.attach_prefix(std::make_shared<CountedPrefix>(base, &destroyed), 30);
      const auto full = cat(base, seq(100, 5));
      extend(s, full, 30);
      ASSERT_TRUE(r.put(full, std::move(s), "base").is_ok());
    }
    TakeResult t1 = r.take(cat(base, {7}), "base");
    TakeResult t2 = r.take(cat(base, {8}), "base");
    ASSERT_TRUE(t1.hit && t2.hit);
    r.clear();  // the donor goes; the takers still read
    EXPECT_EQ(destroyed, 0);
    SequenceState s1 = std::move(*t1.hit).into_state(kLayout, testing::kCtx);
    EXPECT_TRUE(kv_matches(s1.kv, cat(base, {7}), 30));
    t2.hit.reset();
    EXPECT_EQ(destroyed, 0);
  }
  EXPECT_EQ(destroyed, 1);
}

TEST(RamTier, SharedSegmentsCountedOnce) {
  RamTier r(kBig);
  const auto sys = seq(1, 200);
  put_ok(r, sys);
  const size_t donor_bytes = r.stats().bytes;
  auto extend_put = [&](int32_t marker) -> size_t {
    const auto prompt = cat(sys, seq(marker, 50));
    int64_t p = 0;
    SequenceState s = take_state(r, prompt, &p);
    EXPECT_EQ(p, 200);
    extend(s, prompt, p);
    const size_t tail = s.kv.owned_bytes();
    EXPECT_TRUE(r.put(prompt, std::move(s), "base").is_ok());
    return tail;
  };
  const size_t tx = extend_put(10000);  // supersedes the donor; shares its segment
  EXPECT_EQ(r.stats().entries, 1u);
  EXPECT_EQ(r.stats().bytes, donor_bytes + tx);
  const size_t ty = extend_put(20000);  // a sibling; both reference the donor's segment
  EXPECT_EQ(r.stats().entries, 2u);
  EXPECT_EQ(r.stats().bytes, donor_bytes + tx + ty);
}

TEST(RamTier, PutAdoptsPrivateRowsWithoutCopyAndKeepsSharedPrefix) {
  RamTier r(kBig);
  const auto sys = seq(1, 32);
  put_ok(r, sys);
  const auto prompt = cat(sys, seq(900, 8));
  int64_t p = 0;
  SequenceState s = take_state(r, prompt, &p);
  ASSERT_EQ(p, 32);
  const auto* db = dynamic_cast<const KvBlock*>(s.kv.prefix().get());
  ASSERT_TRUE(db);
  const KvSegment* donor_seg = db->pieces()[0].seg.get();
  extend(s, prompt, p);
  const float* tail_k0 = static_cast<const float*>(s.kv.k_row(0, 32));
  ASSERT_TRUE(r.put(prompt, std::move(s), "base").is_ok());
  std::shared_ptr<const Entry> e = r.find_exact(prompt, "base");
  ASSERT_TRUE(e);
  const auto& pieces = e->kv->pieces();
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(static_cast<const void*>(pieces[1].seg->k[0]), static_cast<const void*>(tail_k0));  // the KvCache's own rows, moved, not copied
  EXPECT_EQ(pieces[1].start, 32);
  // The first piece is the donor's segment, shared by reference (the donor entry itself was
  // superseded by this put; its segment lives on in the extended entry).
  EXPECT_EQ(pieces[0].seg.get(), donor_seg);
  EXPECT_EQ(r.stats().entries, 1u);
  EXPECT_TRUE(testing::prefix_matches(*e->kv, prompt, 40));
  // A multi-piece block still honours the contiguous KvPrefix contract (consolidated once).
  const float* k0 = static_cast<const float*>(e->kv->k(0));
  EXPECT_EQ(0, std::memcmp(k0 + 32 * kLayout.row_floats(), tail_k0, 8 * kLayout.row_floats() * 4));
}

TEST(RamTier, PutValidatesBeforeTakingOwnership) {
  RamTier r(kBig);
  SequenceState s = prefilled(seq(1, 10));
  EXPECT_FALSE(r.put(seq(1, 9), std::move(s), "base").is_ok());  // token count mismatch
  EXPECT_EQ(s.kv.length(), 10);                                  // still the caller's
  EXPECT_TRUE(kv_matches(s.kv, seq(1, 10), 10));
  r.set_signature("plain_kv:f32:L=3:h=2:d=4");
  EXPECT_EQ(r.put(seq(1, 10), std::move(s), "base").code(), StatusCode::kIncompatible);
  EXPECT_EQ(s.kv.length(), 10);
}

// Stub cold tier: scripted find/restore/store.
struct StubCold final : ColdTier {
  std::shared_ptr<const Entry> stored_entry;  // what restore returns
  int64_t find_len = 0;
  bool restore_fails = false;
  bool store_ok = true;
  int stores = 0, restores = 0;
  std::optional<ColdFind> find(std::span<const TokenId>, const std::string&, int64_t) override {
    if (find_len <= 0) return std::nullopt;
    return ColdFind{find_len, "h"};
  }
  std::shared_ptr<const Entry> restore(const ColdFind&, std::string* reason) override {
    ++restores;
    if (restore_fails) {
      *reason = "ssd_corrupt";
      return nullptr;
    }
    return stored_entry;
  }
  bool store(const Entry&) override {
    ++stores;
    return store_ok;
  }
};

std::shared_ptr<const Entry> entry_of(const std::vector<int32_t>& t, const Kinds& k = {}) {
  return make_entry(t, prefilled(t, k), "base", "full").value();
}

TEST(RamTier, ColdWinsOnlyWhenStrictlyLonger) {
  StubCold cold;
  RamTier r(kBig, &cold);
  put_ok(r, seq(1, 20));
  cold.stored_entry = entry_of(seq(1, 30));
  const auto prompt = cat(seq(1, 30), {99});
  cold.find_len = 20;  // tie → RAM, no restore I/O
  TakeResult t = r.take(prompt, "base");
  ASSERT_TRUE(t.hit);
  EXPECT_EQ(t.hit->tier, Tier::kRam);
  EXPECT_EQ(cold.restores, 0);
  cold.find_len = 30;  // strictly longer → SSD
  t = r.take(prompt, "base");
  ASSERT_TRUE(t.hit);
  EXPECT_EQ(t.hit->tier, Tier::kSsd);
  EXPECT_EQ(t.hit->tokens, 30);
  EXPECT_EQ(t.report.tier, Tier::kSsd);
  SequenceState s = std::move(*t.hit).into_state(kLayout, testing::kCtx);
  EXPECT_TRUE(kv_matches(s.kv, prompt, 30));
  EXPECT_EQ(r.stats().entries, 1u);  // a restore is not inserted into RAM by take
}

TEST(RamTier, RestoreFailureFallsBackToRam) {
  StubCold cold;
  RamTier r(kBig, &cold);
  put_ok(r, seq(1, 20));
  cold.find_len = 30;
  cold.restore_fails = true;
  TakeResult t = r.take(cat(seq(1, 30), {99}), "base");
  ASSERT_TRUE(t.hit);
  EXPECT_EQ(t.hit->tier, Tier::kRam);
  EXPECT_EQ(t.hit->tokens, 20);
  EXPECT_EQ(t.report.reason, "ssd_corrupt");  // a partial hit carries what prevented a longer one
  EXPECT_EQ(r.stats().restore_failures, 1u);
}

TEST(RamTier, UntrimmableColdTailFallsBackAndReleasesRestored) {
  StubCold cold;
  RamTier r(kBig, &cold);
  put_ok(r, seq(1, 10), {.recurrent = true});
  cold.stored_entry = entry_of(seq(1, 40), {.recurrent = true});
  std::weak_ptr<const Entry> w = cold.stored_entry;
  cold.find_len = 30;  // the stub (wrongly) offers a trimmed use of an untrimmable entry
  TakeResult t = r.take(cat(seq(1, 30), {99}), "base");
  ASSERT_TRUE(t.hit);
  EXPECT_EQ(t.hit->tier, Tier::kRam);
  EXPECT_EQ(t.hit->tokens, 10);
  EXPECT_EQ(t.report.reason, "untrimmable_tail");
  EXPECT_EQ(r.stats().cold_rejects, 1u);
  cold.stored_entry.reset();
  EXPECT_TRUE(w.expired());  // the rejected restore was released, not leaked into the result
}

TEST(RamTier, RelievePressureStopsAndKeepsEntryWhenWriteFails) {
  StubCold cold;
  RamTier r(kBig, &cold);
  put_ok(r, seq(1, 10));
  put_ok(r, seq(100, 10));
  cold.store_ok = false;
  EXPECT_EQ(r.relieve_pressure([] { return true; }), 0u);
  EXPECT_EQ(r.stats().entries, 2u);  // resident: a failed write is not a demotion
  EXPECT_EQ(r.stats().demotions, 0u);
  EXPECT_EQ(cold.stores, 1);         // stopped at the first failure
  cold.store_ok = true;
  int budget = 1;
  EXPECT_EQ(r.relieve_pressure([&] { return budget-- > 0; }), 1u);
  EXPECT_EQ(r.stats().entries, 1u);
  EXPECT_EQ(r.stats().demotions, 1u);
  EXPECT_TRUE(r.find_exact(seq(100, 10), "base"));  // the LRU one went first
}

TEST(RamTier, DemoteIdleIsNoopWithoutColdTierAndSpillsWithOne) {
  RamTier alone(kBig);
  put_ok(alone, seq(1, 10));
  EXPECT_EQ(alone.demote_idle(std::chrono::seconds(0)), 0u);
  EXPECT_EQ(alone.stats().entries, 1u);
  CountingSink sink;
  RamTier r(kBig, nullptr, &sink);
  put_ok(r, seq(1, 10));
  EXPECT_EQ(r.demote_idle(std::chrono::hours(1)), 0u);  // not idle long enough
  EXPECT_EQ(r.demote_idle(std::chrono::seconds(0)), 1u);
  EXPECT_EQ(sink.got.size(), 1u);
  EXPECT_EQ(r.stats().entries, 0u);
}

TEST(RamTier, NamespacesIsolateAndExplain) {
  RamTier r(kBig);
  put_ok(r, seq(1, 20), {}, "adapter-a");
  std::string reason;
  int64_t p = 0;
  take_state(r, cat(seq(1, 20), {5}), &p, {}, &reason, "adapter-b");
  EXPECT_EQ(p, 0);
  EXPECT_EQ(reason, "other_namespace:adapter-a");
  put_ok(r, seq(1, 2), {}, "adapter-b");  // b holds something, a holds more of this prompt
  take_state(r, cat(seq(1, 20), {5}), &p, {}, &reason, "adapter-b");
  EXPECT_EQ(p, 2);
  EXPECT_EQ(reason, "other_namespace:adapter-a");
  RamTier empty(kBig);
  take_state(empty, seq(1, 5), &p, {}, &reason);
  EXPECT_EQ(reason, "empty_namespace");
  put_ok(r, seq(1, 20), {}, "base");
  take_state(r, cat(seq(1, 7), {500, 501}), &p, {}, &reason);
  EXPECT_EQ(p, 7);
  EXPECT_EQ(reason, "diverged_at:7");
  take_state(r, seq(900, 5), &p, {}, &reason);
  EXPECT_EQ(reason, "diverged_at:0");
}

TEST(RamTier, EvictedReasonFromGhostList) {
  const size_t one = prefilled(seq(1, 100)).kv.owned_bytes();
  RamTier r(one + one / 2);
  put_ok(r, seq(1, 100));
  put_ok(r, seq(500, 100));  // evicts the first (no SSD tier)
  std::string reason;
  int64_t p = 0;
  take_state(r, cat(seq(1, 100), {3}), &p, {}, &reason);
  EXPECT_EQ(p, 0);
  EXPECT_EQ(reason, "evicted:ram");
}

TEST(RamTier, FloorBlocksShorterReuse) {
  // A layer state whose floor is 8 (e.g. delayed KV quantization converted at offset 8).
  struct FloorRing final : LayerState {
    RingState inner{64, 2, 4};
    StateKind kind() const override { return StateKind::kRing; }
    std::string signature() const override { return "floor-ring"; }
    int64_t offset() const override { return inner.offset(); }
    bool trimmable() const override { return true; }
    int64_t min_reusable_offset() const override { return 8; }
    void storage(std::vector<StorageRef>* o) const override { inner.storage(o); }
    std::unique_ptr<LayerState> view() const override { return std::make_unique<FloorRing>(*this); }
    Status trim(int64_t n) override { return inner.trim(n); }
    nlohmann::json params() const override { return inner.params(); }
    std::vector<StateTensor> tensors() const override { return inner.tensors(); }
  };
  RamTier r(kBig);
  SequenceState s(kLayout, testing::kCtx);
  auto fr = std::make_unique<FloorRing>();
  std::vector<float> row(8, 1.0f);
  for (int i = 0; i < 20; ++i) fr->inner.append(row.data(), row.data());
  s.layers.push_back(std::move(fr));
  extend(s, seq(1, 20), 0);  // plain KV only (the FloorRing is not a RingState)
  ASSERT_TRUE(r.put(seq(1, 20), std::move(s), "base").is_ok());
  int64_t p = 0;
  std::string reason;
  take_state(r, cat(seq(1, 5), {99}), &p, {}, &reason);
  EXPECT_EQ(p, 0);
  EXPECT_EQ(reason, "below_floor");
  TakeResult t = r.take(cat(seq(1, 12), {99}), "base");
  ASSERT_TRUE(t.hit);
  EXPECT_EQ(t.hit->tokens, 12);
}

TEST(RamTier, PromptBoundaryCheckpointServesNextTurnOfUntrimmableModel) {
  RamTier r(kBig);
  Kinds rec{.recurrent = true};
  const auto prompt1 = seq(1, 50);  // system + user turn 1, rendered with the generation prompt
  SequenceState s = prefilled(prompt1, rec);
  ASSERT_TRUE(r.put_checkpoint(prompt1, s, "base", "prompt_end").is_ok());
  const auto full1 = cat(prompt1, seq(600, 20));  // + generated reply
  extend(s, full1, 50);
  ASSERT_TRUE(r.put(full1, std::move(s), "base").is_ok());
  EXPECT_EQ(r.stats().entries, 2u);  // untrimmable: the boundary survives the longer put
  // Turn 2: the reply re-tokenizes differently, so the full entry diverges inside the reply.
  const auto prompt2 = cat(cat(prompt1, seq(700, 22)), seq(800, 10));
  int64_t p = 0;
  std::string reason;
  SequenceState s2 = take_state(r, prompt2, &p, rec, &reason);
  EXPECT_EQ(p, 50);
  ASSERT_EQ(s2.layers.size(), 1u);
  EXPECT_EQ(s2.layers[0]->offset(), 50);
  EXPECT_TRUE(kv_matches(s2.kv, prompt2, 50));
  // The restored recurrent state equals a fresh prefill of the prompt, bit for bit.
  SequenceState ref = prefilled(prompt1, rec);
  EXPECT_EQ(0, std::memcmp(static_cast<RecurrentState*>(s2.layers[0].get())->matrix(),
                           static_cast<RecurrentState*>(ref.layers[0].get())->matrix(), 2 * 3 * 3 * 4));
  EXPECT_EQ(reason, "hit");  // the full entry shares no more than the boundary
}

TEST(RamTier, ObserverSeesEveryStoredPut) {
  RamTier r(kBig);
  int calls = 0;
  r.set_on_put([&](std::span<const TokenId> t, const std::string& ns) {
    ++calls;
    EXPECT_EQ(ns, "base");
    EXPECT_FALSE(t.empty());
  });
  put_ok(r, seq(1, 5));
  put_ok(r, seq(1, 8));
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace larder::memory
