// kv_store.h — the Layer-0 KV store: the API runtime/ drives (kv-store.md §3, §8, §10, §13).
//
//   auto store = KvStore::open(cfg);                        // RAM tier (+ SSD, + remote tier)
//   TakeResult t = store->take(prompt_ids, ns);             // longest usable prefix: RAM, SSD, remote
//   (the engine: begin_take → on a later step, once ready, complete_take: see below)
//   SequenceState s = t.hit ? std::move(*t.hit).into_state(layout, ctx)
//                           : SequenceState(layout, ctx);   // prefill from t.report.reused_tokens
//   ... prefill, decode ...
//   store->put(forwarded_ids, std::move(s), ns);            // after EOS/stop/cancel, not on error
//   store->flush();                                         // SIGTERM / POST /admin/kv/flush
//
// Engine-loop duties: set_engine_busy(true/false) around running rows (the SSD writer's idle
// gate, the remote writer's pace); when fully idle call write_behind() (snapshots of new entries
// for the SSD tier; the remote tier is offered every put at once) and, every few seconds,
// demote_idle(--ssd-demote-idle); after a take, when live memory is over budget, call
// relieve_pressure(over_budget). stats() feeds /stats (stats_json) and /metrics
// (stats_prometheus); every TakeResult carries its CacheReport for x-larder-cache and logs.
//
// Remote lookups never run on the engine thread (issue 46): begin_take consults RAM and SSD at
// once and, when the remote tier could serve a longer prefix, returns a pending RemoteLookup that
// the lookup thread runs (remote_lookup.h); the engine keeps stepping its other sequences and,
// once the lookup is ready (its on_ready callback, or polling ready()), calls complete_take,
// which takes from RAM / SSD again with the fetched entry as a candidate. A client that leaves
// meanwhile: RemoteLookup::cancel. take() is both steps, blocking (CLI, tests).
//
// Threads: one engine thread owns the store and calls every method, stats() included (the
// server asks the engine for a copy through its queue; system.md §4). The SSD writer thread
// (inside SpillQueue) runs the startup scan and drains the write-behind queue; the remote writer
// (inside RemoteWriteQueue) drains the remote tier's queue; the lookup thread (inside
// RemoteLookups) fetches; all cross-thread state is inside those queues, the lookup jobs and the
// tiers (documented there). Nothing here installs signal
// handlers: on SIGTERM the server stops admission, drains, and calls flush() on the engine
// thread (§8.4); the returned FlushReport lists what could not be written.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "larder/memory/store/ram_tier.h"
#include "larder/memory/store/remote_lookup.h"
#include "larder/memory/store/remote_queue.h"
#include "larder/memory/store/remote_tier.h"
#include "larder/memory/store/spill_queue.h"
#include "larder/memory/store/ssd_tier.h"

namespace larder::memory {

struct KvStoreConfig {
  size_t ram_cap_bytes = 8ull << 30;              // --prompt-cache (0 = every put spills and drops)
  std::string ssd_dir;                            // --ssd-cache (empty = off)
  uint64_t ssd_cap_bytes = 32ull << 30;           // --ssd-cache-max
  size_t spill_queue_cap_bytes = 2ull << 30;      // --ssd-spill-queue
  bool write_behind = true;                       // --ssd-writebehind
  VerifyPolicy verify = VerifyPolicy::kFull;      // --ssd-cache-verify
  RestoreMode restore = RestoreMode::kMmap;       // --ssd-cache-restore
  StoreIdentity identity;                         // model fingerprints (§9)
  std::string signature;                          // expected storage signature; empty = unchecked
  IoLayer* io = nullptr;                          // fault injection; null = posix
  bool background_scan = true;                    // scan on the writer thread (else before open returns)
  std::string remote_url;                         // --kv-remote (empty = off); see remote_url.h
  std::string remote_password_env;                // LARDER_KV_REMOTE_PASSWORD (used when the URL has none)
  int remote_timeout_ms = 100;                    // --kv-remote-timeout-ms
  int64_t remote_chunk_tokens = 256;              // tokens per remote value (serve derives ~4 MiB)
  RemoteQueueConfig remote_queue;                 // --kv-remote-queue, --kv-remote-write-mibps
};

struct FlushReport {
  bool ssd_enabled = false;
  bool durable = false;     // nothing pending, nothing dropped/failed in this flush, nothing missing
  size_t written = 0;       // entries persisted by this flush (queue drain + forced)
  size_t already = 0;       // RAM entries already covered by a durable file
  size_t failed = 0;        // writes that failed (disk full, I/O error, over cap)
  size_t dropped = 0;       // queued items dropped by the queue cap since the previous flush
  size_t missing = 0;       // dirty keys that left RAM without a durable copy
  std::vector<std::string> not_written;  // "<ns>:<n tokens>:<reason>" per entry not on disk
};

// One namespace's share of the store (issue 45): what is held in each tier and what its takes
// found. Lookups count a take once (a hit in any tier, or a miss).
struct NsStats {
  size_t ram_entries = 0, ram_bytes = 0, ram_mapped_bytes = 0;
  size_t ssd_entries = 0;
  uint64_t ssd_bytes = 0;
  uint64_t hits = 0, misses = 0, reused_tokens = 0;
};

struct StoreStats {
  RamStats ram;
  bool ssd_enabled = false;
  SsdStats ssd;
  bool remote_enabled = false;
  std::string remote_url;  // redacted
  int64_t remote_chunk_tokens = 0;
  RemoteStats remote;
  RemoteQueueStats remote_queue;
  QueueStats queue;
  uint64_t lookups_hit_ram = 0, lookups_hit_ssd = 0, lookups_hit_remote = 0, lookups_miss = 0;
  uint64_t reused_tokens_ram = 0, reused_tokens_ssd = 0, reused_tokens_remote = 0;
  size_t dirty_keys = 0;
  uint64_t missing_keys = 0;  // dirty keys that left RAM with no durable copy (cumulative)
  int64_t longest_durable_prefix_tokens = 0;
  std::map<std::string, uint64_t> miss_reasons;  // reason class (diverged_at:* folded) → count
  // Boundary checkpoints by kind (prompt_end, message_end): captured, and hits they served.
  std::map<std::string, uint64_t> checkpoints_stored, checkpoint_hits;
  // By namespace id. The take counters keep at most KvStore::kMaxCountedNamespaces ids (each
  // cache_salt is a namespace); takes of further ones are counted under "" (folded into "other").
  std::map<std::string, NsStats> namespaces;
};
// Namespace id → the label /stats and /metrics show it under. The server names each namespace it
// can name (the base, each --lora adapter at its scale: adapters are fixed at start, so the label
// set is bounded); every other id (per-request scales, cache_salt, adapters of an earlier run on
// the SSD tier) is folded into one "other" entry. "base" is always labelled "base".
using NsLabels = std::map<std::string, std::string>;
nlohmann::json stats_json(const StoreStats& s, const NsLabels& labels = {});
// Prometheus text exposition with the names of kv-store.md §13.
std::string stats_prometheus(const StoreStats& s, const NsLabels& labels = {});

class TieredCold;  // kv_store.cpp

// A take begun by begin_take: done now (`pending` null, `result` is the take), or waiting for
// its remote lookup (finish it with complete_take once pending->ready(), or cancel it).
struct TakeStart {
  TakeResult result;
  std::shared_ptr<RemoteLookup> pending;
};

class KvStore {
 public:
  static Result<std::unique_ptr<KvStore>> open(KvStoreConfig cfg);
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // Blocking: begin_take, then wait for the remote lookup if one started, then complete_take.
  TakeResult take(std::span<const TokenId> prompt, const std::string& ns);
  // Engine thread. RAM and SSD answer now; when the remote tier may hold a longer prefix the
  // result is a pending lookup on the lookup thread, and `on_ready` (may be empty) runs there
  // once it is ready (it must not block; it is never called after pending->cancel() returns).
  TakeStart begin_take(std::span<const TokenId> prompt, const std::string& ns, std::function<void()> on_ready = {});
  // Engine thread, once lookup.ready(): the take, with what the lookup fetched as a candidate
  // beside RAM and SSD (counted and explained like any take; a failed lookup names its reason).
  TakeResult complete_take(const RemoteLookup& lookup);
  // The caller could not use what take() returned (the entry's state does not fit the model's
  // schema, or it covers the whole prompt and cannot be trimmed back): the take is re-counted as
  // a miss with `reason`, and `report` becomes that miss (tier none, nothing reused) — a hit that
  // reused nothing must never be reported as a hit.
  void unusable_hit(CacheReport* report, const std::string& reason, const std::string& ns);
  int64_t peek(std::span<const TokenId> prompt, const std::string& ns) const { return ram_->peek(prompt, ns); }
  // POST /v1/kv/lookup: what a take of `prompt` would reuse from RAM and from the SSD tier, each
  // on its own, with no side effect (no LRU touch, no restore, no hit/miss counted). Engine
  // thread (the RAM tier); the remote tier answers for itself off it (RemoteTier::peek).
  struct LocalLookup {
    int64_t ram = 0, ssd = 0;
    bool ssd_enabled = false, ssd_scanning = false;
  };
  LocalLookup lookup_local(std::span<const TokenId> prompt, const std::string& ns);
  Status put(std::span<const TokenId> tokens, SequenceState&& state, const std::string& ns,
             const PutOptions& opts = {});
  // The prompt boundary (end of the rendered prompt, before generation) as a reusable point:
  // call at the boundary during prefill for models whose state is not fully trimmable, so the
  // next turn of a multi-turn chat hits even when the reply re-tokenizes differently (§11.3).
  // Plain-KV states trim to any prefix and need no checkpoint (a no-op then); a state with a ring
  // is kept even before it wraps (it may wrap while the answer is decoded). runtime::Sequence
  // calls this at len(prompt) − 1.
  Status put_prompt_boundary(std::span<const TokenId> prompt, const SequenceState& state, const std::string& ns) {
    return put_boundary(prompt, state, ns, "prompt_end");
  }
  // The same at any boundary of the prompt; `kind` labels the entry ("checkpoint:<kind>") and
  // counts it in stats: "prompt_end", or "message_end" for the end of a chat message (§11.3).
  // Attention KV and the untrimmable state go into one entry: restored together or not at all.
  Status put_boundary(std::span<const TokenId> prefix, const SequenceState& state, const std::string& ns,
                      const std::string& kind);

  size_t relieve_pressure(const std::function<bool()>& over_budget) { return ram_->relieve_pressure(over_budget); }
  size_t demote_idle(std::chrono::steady_clock::duration idle) { return ram_->demote_idle(idle); }
  // Engine activity for the writer's idle gate (§8.1).
  void set_engine_busy(bool busy);
  // Write-behind (§8.2): enqueue snapshots of dirty keys still in RAM; call when the engine is
  // idle. Returns snapshots enqueued.
  size_t write_behind();
  // Durability boundary (§8.3): drain the queue, then force every dirty key and every RAM entry
  // without a durable copy, one at a time. Call on the engine thread (SIGTERM, admin flush).
  FlushReport flush();
  // RAM clear (never spills, §3.6); with_ssd also removes this identity's files.
  void clear(bool with_ssd = false);
  // Blocks until the SSD index is published (tests, `generate` before its first take).
  void wait_ssd_ready() const;

  StoreStats stats() const;
  static constexpr size_t kMaxCountedNamespaces = 256;
  RamTier& ram() { return *ram_; }
  SsdTier* ssd() { return ssd_.get(); }
  RemoteTier* remote() { return remote_.get(); }

 private:
  explicit KvStore(KvStoreConfig cfg);
  void count(const TakeResult& r, const std::string& ns);
  TakeResult take_now(std::span<const TokenId> prompt, const std::string& ns, const RemoteFetch* fetched);
  NsStats& ns_counters(const std::string& ns);  // under stats_mu_

  KvStoreConfig cfg_;
  std::unique_ptr<SsdTier> ssd_;
  std::unique_ptr<RemoteTier> remote_;
  std::unique_ptr<RemoteLookups> lookups_;  // with a remote tier: the lookup thread
  std::unique_ptr<TieredCold> chain_;  // with a remote tier: SSD (if any) + a fetched remote entry
  std::unique_ptr<SpillQueue> queue_;          // SSD write-behind (with an SSD tier)
  std::unique_ptr<RemoteWriteQueue> remote_queue_;  // with a remote tier
  std::unique_ptr<SpillSink> fanout_;          // spills to both queues when both exist
  std::unique_ptr<RamTier> ram_;
  std::set<std::pair<std::string, std::vector<TokenId>>> dirty_;
  mutable std::mutex stats_mu_;  // guards the counters below (stats() may run on another thread)
  uint64_t hit_ram_ = 0, hit_ssd_ = 0, hit_remote_ = 0, miss_ = 0, reused_ram_ = 0, reused_ssd_ = 0, reused_remote_ = 0;
  std::map<std::string, uint64_t> reasons_;
  std::map<std::string, NsStats> ns_counts_;  // only hits, misses, reused_tokens are used
  std::map<std::string, uint64_t> checkpoints_stored_, checkpoint_hits_;
  uint64_t dropped_seen_ = 0;
  uint64_t missing_total_ = 0, missing_reported_ = 0;
};

}  // namespace larder::memory
