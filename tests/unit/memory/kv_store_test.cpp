// kv_store_test.cpp — the store facade as runtime/ drives it: multi-turn chats, prompt
// boundaries, write-behind bookkeeping, isolation by content-derived namespaces.
#include "larder/memory/store/kv_store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>

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
using testing::TempDir;

KvStoreConfig cfg(const std::string& dir = "") {
  KvStoreConfig c;
  c.ram_cap_bytes = 64ull << 20;
  c.ssd_dir = dir;
  c.identity.weights_id = "w";
  c.identity.kv_scheme = "f32";
  return c;
}

// One engine request: take → prefill the suffix → "generate" `reply` → put.
struct Turn {
  int64_t reused = 0;
  std::string reason;
  Tier tier = Tier::kNone;
};
Turn run_request(KvStore& s, const std::vector<int32_t>& prompt, const std::vector<int32_t>& reply,
                 const std::string& ns, const Kinds& k = {}, bool boundary = false) {
  Turn out;
  TakeResult t = s.take(prompt, ns);
  out.reused = t.report.reused_tokens;
  out.reason = t.report.reason;
  out.tier = t.report.tier;
  SequenceState st = t.hit ? std::move(*t.hit).into_state(kLayout, testing::kCtx) : testing::fresh(k);
  extend(st, prompt, out.reused);
  EXPECT_TRUE(kv_matches(st.kv, prompt, static_cast<int64_t>(prompt.size())));
  if (boundary) {
    EXPECT_TRUE(s.put_prompt_boundary(prompt, st, ns).is_ok());
  }
  const auto full = cat(prompt, reply);
  extend(st, full, static_cast<int64_t>(prompt.size()));
  EXPECT_TRUE(s.put(full, std::move(st), ns).is_ok());
  return out;
}

TEST(KvStoreFacade, MultiTurnChatReusesPreviousTurnEvenWhenReplyRetokenizes) {
  for (Kinds k : {Kinds{}, Kinds{.recurrent = true}, Kinds{.ring = true, .window = 16}}) {
    auto s = KvStore::open(cfg()).value();
    const auto sys = seq(1, 40);
    auto prompt = cat(sys, seq(100, 10));  // system + user 1 + generation prompt
    Turn t1 = run_request(*s, prompt, seq(200, 12), "base", k, true);
    EXPECT_EQ(t1.reused, 0);
    EXPECT_EQ(t1.reason, "empty_namespace");
    for (int turn = 2; turn <= 4; ++turn) {
      // The template re-renders the reply with different tokens (e.g. reasoning stripped).
      const auto next = cat(cat(prompt, seq(300 * turn, 9)), seq(1000 * turn, 8));
      Turn t = run_request(*s, next, seq(5000 * turn, 12), "base", k, true);
      EXPECT_GE(t.reused, static_cast<int64_t>(prompt.size())) << "turn " << turn;  // never a silent 0
      EXPECT_EQ(t.tier, Tier::kRam);
      prompt = next;
    }
  }
}

TEST(KvStoreFacade, PromptBoundaryIsANoopForTrimmableStates) {
  auto s = KvStore::open(cfg()).value();
  SequenceState st = prefilled(seq(1, 20));
  ASSERT_TRUE(s->put_prompt_boundary(seq(1, 20), st, "base").is_ok());
  EXPECT_EQ(s->stats().ram.entries, 0u);
  SequenceState rec = prefilled(seq(1, 20), {.recurrent = true});
  ASSERT_TRUE(s->put_prompt_boundary(seq(1, 20), rec, "base").is_ok());
  EXPECT_EQ(s->stats().ram.entries, 1u);
  ASSERT_TRUE(s->put_prompt_boundary(seq(1, 20), rec, "base").is_ok());  // same tokens: not stored twice
  EXPECT_EQ(s->stats().ram.entries, 1u);
}

TEST(KvStoreFacade, AdaptersAndSaltsIsolate) {
  auto s = KvStore::open(cfg()).value();
  const std::string a = namespace_id({{"adapter-a-bytes", 1.0}});
  const std::string a_changed = namespace_id({{"adapter-a-bytes-v2", 1.0}});  // same name, new weights
  const std::string salted = namespace_id({}, "tenant-1");
  const auto prompt = seq(1, 50);
  run_request(*s, prompt, seq(100, 5), a);
  EXPECT_EQ(run_request(*s, prompt, seq(100, 5), a).reused, 49);
  Turn t = run_request(*s, prompt, seq(100, 5), a_changed);
  EXPECT_EQ(t.reused, 0);
  EXPECT_EQ(t.reason, "other_namespace:" + a);  // names the namespace that holds the prefix
  EXPECT_EQ(run_request(*s, prompt, seq(100, 5), salted).reused, 0);
  EXPECT_EQ(run_request(*s, prompt, seq(100, 5), "base").reused, 0);
}

// A miss in a namespace that holds other entries is still explained as the other namespace's
// prefix when that one is longer than anything here (it used to read diverged_at:<i>), RAM and
// SSD alike; the metrics fold the reason's id away (a bounded label set).
TEST(KvStoreFacade, MissAcrossNamespacesNamesTheOtherNamespace) {
  TempDir d;
  const std::string a = namespace_id({{"adapter-a-bytes", 1.0}});
  const std::string b = namespace_id({{"adapter-b-bytes", 1.0}});
  const auto prompt = cat(seq(1, 3), seq(10, 40));
  {
    auto s = KvStore::open(cfg(d.path)).value();
    s->wait_ssd_ready();
    run_request(*s, cat(seq(1, 3), seq(900, 10)), seq(100, 5), b);  // b shares 3 tokens with prompt
    run_request(*s, prompt, seq(100, 5), a);
    Turn t = run_request(*s, prompt, seq(300, 5), b);
    EXPECT_EQ(t.reused, 3);
    EXPECT_EQ(t.reason, "other_namespace:" + a);
    EXPECT_EQ(s->stats().miss_reasons.count("other_namespace"), 1u);
    ASSERT_TRUE(s->flush().durable);
  }
  auto s = KvStore::open(cfg(d.path)).value();  // restart: only the SSD tier holds them
  s->wait_ssd_ready();
  const std::string c = namespace_id({{"adapter-c-bytes", 1.0}});
  const auto longer = cat(prompt, seq(100, 2));  // a's entry holds 2 tokens more of it than b's
  Turn t = run_request(*s, longer, seq(100, 5), c);
  EXPECT_EQ(t.reused, 0);
  EXPECT_EQ(t.reason, "other_namespace:" + a);
  EXPECT_EQ(run_request(*s, longer, seq(100, 5), a).tier, Tier::kSsd);
}

// /stats and /metrics by namespace: entries and bytes per tier, hits and misses per namespace;
// labelled namespaces by label, the rest folded into "other", "base" always present.
TEST(KvStoreFacade, StatsBreakTheStoreDownByNamespace) {
  TempDir d;
  const std::string a = namespace_id({{"adapter-a-bytes", 1.0}});
  const std::string salted = namespace_id({}, "tenant-1");
  auto s = KvStore::open(cfg(d.path)).value();
  s->wait_ssd_ready();
  run_request(*s, seq(1, 30), seq(100, 5), a);
  run_request(*s, seq(1, 30), seq(100, 5), a);  // a hit
  run_request(*s, seq(500, 20), seq(100, 5), "base");
  run_request(*s, seq(700, 20), seq(100, 5), salted);
  ASSERT_TRUE(s->flush().durable);
  StoreStats st = s->stats();
  ASSERT_EQ(st.namespaces.count(a), 1u);
  const NsStats& na = st.namespaces.at(a);
  EXPECT_EQ(na.hits, 1u);
  EXPECT_EQ(na.misses, 1u);
  EXPECT_EQ(na.reused_tokens, 29u);
  EXPECT_GE(na.ram_entries, 1u);
  EXPECT_GT(na.ram_bytes, 0u);
  EXPECT_GE(na.ssd_entries, 1u);
  EXPECT_GT(na.ssd_bytes, 0u);
  EXPECT_EQ(st.namespaces.at("base").misses, 1u);
  size_t ram = 0, ssd = 0;
  for (const auto& [ns, n] : st.namespaces) {
    ram += n.ram_entries;
    ssd += n.ssd_entries;
  }
  EXPECT_EQ(ram, st.ram.entries);
  EXPECT_EQ(ssd, st.ssd.entries);

  const NsLabels labels{{a, "x,x_copy@" + a.substr(0, 8)}};
  nlohmann::json j = stats_json(st, labels)["namespaces"];
  ASSERT_TRUE(j.contains("x,x_copy@" + a.substr(0, 8))) << j.dump();
  EXPECT_EQ(j["x,x_copy@" + a.substr(0, 8)]["hits"], 1);
  EXPECT_EQ(j["x,x_copy@" + a.substr(0, 8)]["id"], a);
  EXPECT_EQ(j["base"]["misses"], 1);
  EXPECT_EQ(j["other"]["namespaces"], 1);  // the salted one, not named
  EXPECT_EQ(j["other"]["misses"], 1);
  EXPECT_EQ(j.size(), 3u);
  const std::string prom = stats_prometheus(st, {{a, "we\"ird"}});
  EXPECT_NE(prom.find("larder_kv_namespace_lookups_total{namespace=\"we\\\"ird\",result=\"hit\"} 1\n"),
            std::string::npos) << prom;
  EXPECT_NE(prom.find("larder_kv_namespace_entries{namespace=\"other\",tier=\"ssd\"} "), std::string::npos);
  EXPECT_NE(prom.find("larder_kv_namespace_lookups_total{namespace=\"base\",result=\"miss\"} 1\n"),
            std::string::npos);
}

TEST(KvStoreFacade, SupersededDirtyKeysDoNotMakeFlushFail) {
  TempDir d;
  auto s = KvStore::open(cfg(d.path)).value();
  s->wait_ssd_ready();
  run_request(*s, seq(1, 30), seq(100, 5), "base");
  run_request(*s, cat(cat(seq(1, 30), seq(100, 5)), seq(200, 5)), seq(300, 5), "base");
  EXPECT_EQ(s->stats().ram.entries, 1u);  // the first turn was superseded
  EXPECT_EQ(s->stats().dirty_keys, 2u);
  s->write_behind();
  FlushReport f = s->flush();
  EXPECT_TRUE(f.durable) << f.failed << " " << f.missing << " " << f.dropped;
  EXPECT_EQ(s->stats().dirty_keys, 0u);
  EXPECT_EQ(testing::count_files(d.path, ".lkv"), 1u);
  // No SSD tier: flush reports every entry as not written.
  auto ram_only = KvStore::open(cfg()).value();
  run_request(*ram_only, seq(1, 30), seq(100, 5), "base");
  FlushReport r = ram_only->flush();
  EXPECT_FALSE(r.ssd_enabled);
  EXPECT_FALSE(r.durable);
  EXPECT_EQ(r.not_written.size(), 1u);
}

TEST(KvStoreFacade, ByteCapHeldContinuouslyUnderGrowingConversations) {
  KvStoreConfig c = cfg();
  const size_t one = prefilled(seq(1, 64)).kv.owned_bytes();
  c.ram_cap_bytes = one * 6;
  auto s = KvStore::open(c).value();
  for (int conv = 0; conv < 6; ++conv) {
    std::vector<int32_t> prompt = seq(100000 * (conv + 1), 40);
    for (int turn = 0; turn < 5; ++turn) {
      run_request(*s, prompt, seq(100000 * (conv + 1) + 50000 + turn * 100, 10), "base");
      EXPECT_LE(s->stats().ram.bytes, c.ram_cap_bytes);
      prompt = cat(cat(prompt, seq(100000 * (conv + 1) + 50000 + turn * 100, 10)), seq(7, 6));
    }
  }
  EXPECT_GT(s->stats().ram.evictions, 0u);
}

// POST /v1/kv/lookup asks lookup_local: it must answer what a take would reuse without being a
// take — no hit or miss counted, and no LRU touch: after looking up the oldest entry, the next
// put still evicts that one (a take would have made it the newest, and evicted the other).
TEST(KvStoreFacade, LookupLocalAnswersWithoutTouchingLruOrCounters) {
  for (const bool touch : {false, true}) {
    KvStoreConfig c = cfg();
    const size_t one = prefilled(seq(1, 40)).kv.owned_bytes();
    c.ram_cap_bytes = one * 5 / 2;  // two entries fit, a third evicts the least recently used
    auto s = KvStore::open(c).value();
    const auto a = seq(1000, 40), b = seq(2000, 40), d = seq(3000, 40);
    ASSERT_TRUE(s->put(a, prefilled(a), "base").is_ok());
    ASSERT_TRUE(s->put(b, prefilled(b), "base").is_ok());
    const auto prompt_a = cat(a, seq(9000, 4));
    const StoreStats before = s->stats();
    const KvStore::LocalLookup l = s->lookup_local(prompt_a, "base");
    EXPECT_EQ(l.ram, 40);
    EXPECT_EQ(l.ssd, 0);
    EXPECT_FALSE(l.ssd_enabled);
    EXPECT_EQ(s->lookup_local(prompt_a, "other").ram, 0) << "namespaces stay apart";
    EXPECT_EQ(s->lookup_local(a, "base").ram, 39) << "never the last prompt token, as a take (§2.1)";
    const StoreStats after = s->stats();
    EXPECT_EQ(after.ram.hits, before.ram.hits);
    EXPECT_EQ(after.ram.misses, before.ram.misses);
    if (touch) {  // the control: a real take makes `a` the most recently used
      TakeResult t = s->take(prompt_a, "base");
      ASSERT_TRUE(t.hit);
      ASSERT_TRUE(s->put(a, std::move(*t.hit).into_state(kLayout, testing::kCtx), "base").is_ok());
    }
    ASSERT_TRUE(s->put(d, prefilled(d), "base").is_ok());
    EXPECT_EQ(s->lookup_local(prompt_a, "base").ram, touch ? 40 : 0) << "touch=" << touch;
    EXPECT_EQ(s->lookup_local(cat(b, seq(9000, 4)), "base").ram, touch ? 0 : 40) << "touch=" << touch;
  }
}

TEST(KvStoreFacade, LookupLocalSeesTheSsdTierIndexWithoutRestoring) {
  TempDir dir;
  KvStoreConfig c = cfg(dir.path);
  c.background_scan = false;
  const auto a = seq(500, 48);
  {
    auto s = KvStore::open(c).value();
    ASSERT_TRUE(s->put(a, prefilled(a), "base").is_ok());
    ASSERT_TRUE(s->flush().durable);
  }
  auto s = KvStore::open(c).value();  // a restart: empty RAM, the file indexed
  const KvStore::LocalLookup l = s->lookup_local(cat(a, seq(7, 3)), "base");
  EXPECT_TRUE(l.ssd_enabled);
  EXPECT_FALSE(l.ssd_scanning);
  EXPECT_EQ(l.ram, 0);
  EXPECT_EQ(l.ssd, 48);
  EXPECT_EQ(s->stats().ram.restores, 0u) << "a lookup restores nothing";
  EXPECT_EQ(s->stats().ram.entries, 0u);
}

TEST(KvStoreFacade, ChangedLayerSignatureOnRestartIsAMiss) {
  TempDir d;
  KvStoreConfig c = cfg(d.path);
  c.signature = state_signature(kLayout, {}, {});
  {
    auto s = KvStore::open(c).value();
    s->wait_ssd_ready();
    run_request(*s, seq(1, 30), seq(100, 5), "base");
    ASSERT_TRUE(s->flush().durable);
  }
  c.signature = "plain_kv:f32:L=2:h=2:d=4|ring:f32:w=16:h=2:d=4";  // the model now has a ring layer
  auto s = KvStore::open(c).value();
  s->wait_ssd_ready();
  EXPECT_EQ(s->stats().ssd.entries, 0u);
  EXPECT_EQ(s->stats().ssd.scan_removed, 1u);
  TakeResult t = s->take(cat(seq(1, 30), {1}), "base");
  EXPECT_FALSE(t.hit);
  // A put with the old signature is refused before the store takes ownership.
  SequenceState st = prefilled(seq(1, 30));
  EXPECT_EQ(s->put(seq(1, 30), std::move(st), "base").code(), StatusCode::kIncompatible);
  EXPECT_EQ(st.kv.length(), 30);
}

volatile sig_atomic_t g_term = 0;
void on_term(int) { g_term = 1; }

// Issue §5: on SIGTERM the process flushes; every RAM entry is on disk when flush returns.
TEST(KvStoreFacade, SigtermFlushMakesEveryRamEntryDurable) {
  TempDir d;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGTERM, on_term);
    auto s = KvStore::open(cfg(d.path)).value();
    s->wait_ssd_ready();
    for (int i = 0; i < 5; ++i) run_request(*s, seq(1000 * (i + 1), 40), seq(7, 3), "base");
    // Nothing was written yet: no eviction, no write-behind pass.
    const char c = testing::count_files(d.path, ".lkv") == 0 ? 'r' : 'x';
    (void)!::write(ready[1], &c, 1);
    while (!g_term) ::usleep(1000);
    FlushReport f = s->flush();
    ::_exit(f.durable && f.not_written.empty() && f.written == 5 ? 0 : 3);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  EXPECT_EQ(c, 'r');
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  auto s = KvStore::open(cfg(d.path)).value();
  s->wait_ssd_ready();
  EXPECT_EQ(s->stats().ssd.entries, 5u);
  for (int i = 0; i < 5; ++i) {
    const auto prompt = cat(cat(seq(1000 * (i + 1), 40), seq(7, 3)), {1});
    TakeResult t = s->take(prompt, "base");
    ASSERT_TRUE(t.hit);
    EXPECT_EQ(t.hit->tier, Tier::kSsd);
    EXPECT_EQ(t.hit->tokens, 43);
    SequenceState st = std::move(*t.hit).into_state(kLayout, testing::kCtx);
    EXPECT_TRUE(kv_matches(st.kv, prompt, 43));
  }
}

// §12 "SIGKILL during write-behind: no poisoned hits afterwards", through the whole store:
// evictions spill through the queue and write-behind snapshots run while the process is killed.
TEST(KvStoreFacade, SigkillDuringWriteBehindNeverPoisonsAfterRestart) {
  TempDir d;
  std::mt19937 rng(777);
  const Kinds k{.ring = true, .window = 512, .recurrent = false};
  for (int round = 0; round < 20; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      KvStoreConfig c = cfg(d.path);
      c.ram_cap_bytes = prefilled(seq(1, 300)).kv.owned_bytes() * 3;  // constant eviction pressure
      auto s = KvStore::open(c).value();
      s->wait_ssd_ready();
      for (int i = 0;; ++i) {
        const auto prompt = seq(round * 1000000 + i * 1000, 40 + (i % 4) * 80);
        TakeResult t = s->take(prompt, "base");
        SequenceState st = testing::fresh(k);
        extend(st, prompt, 0);
        (void)s->put(prompt, std::move(st), "base");
        s->write_behind();
      }
    }
    ::usleep(5000 + rng() % 30000);
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status));
  }
  auto s = KvStore::open(cfg(d.path)).value();
  s->wait_ssd_ready();
  const auto recs = s->ssd()->records();
  EXPECT_GT(recs.size(), 0u);
  EXPECT_EQ(testing::count_files(d.path, ".tmp"), 0u);
  size_t poisoned = 0;
  for (const SsdRecord& r : recs) {
    // Through take, as a request would: prompt = stored tokens + 1 → reuses all of them.
    std::vector<int32_t> prompt = r.tokens;
    prompt.push_back(3);
    TakeResult t = s->take(prompt, "base");
    if (!t.hit || t.hit->tier != Tier::kSsd || t.hit->tokens != static_cast<int64_t>(r.tokens.size())) {
      ++poisoned;
      continue;
    }
    SequenceState st = std::move(*t.hit).into_state(kLayout, testing::kCtx);
    if (!kv_matches(st.kv, prompt, static_cast<int64_t>(r.tokens.size()))) ++poisoned;
  }
  std::printf("[ SIGKILL ] 20 kills during write-behind: %zu files, %zu poisoned\n", recs.size(), poisoned);
  EXPECT_EQ(poisoned, 0u);
}

}  // namespace
}  // namespace larder::memory
