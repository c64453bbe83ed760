// ram_tier.h — the byte-capped RAM tier of the KV store (kv-store.md §3) and the interfaces it
// tiers over: ColdTier (the SSD tier as the RAM tier sees it, §6) and SpillSink (owned spills
// to the write-behind queue, §3.7).
//
// Threads: a RamTier is owned by the single engine thread and has no locks (§4). Everything it
// hands to other threads is an immutable shared_ptr<const Entry>; those threads never see the
// record list.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "larder/core/status.h"
#include "larder/memory/store/entry.h"

namespace larder::memory {

struct ColdFind {
  int64_t prefix_len = 0;
  std::string handle;  // tier-specific (the SSD tier: entry id)
  Tier tier = Tier::kSsd;  // which tier a hit through it reports
};

// What a tier knows about a prompt without I/O, for explanations (§11.6).
struct ColdProbe {
  bool scanning = false;        // index not yet published (reason ssd_scanning)
  bool any_same_ns = false;
  int64_t best_lcp = 0;         // longest common prefix among same-ns records (usable or not)
  int64_t best_lcp_other_ns = 0;
  std::string best_other_ns;    // the other ns that holds best_lcp_other_ns (first found on ties)
  int64_t evicted_lcp = 0;      // longest usable prefix among recently evicted same-ns files
  int64_t removed_lcp = 0;      // ... among same-ns files the startup scan removed as unusable
  std::string removed_file;     // the file name of that one
};

class ColdTier {
 public:
  virtual ~ColdTier() = default;
  // Longest stored usable prefix (same gates as RAM, §2); index only, no I/O for the SSD tier.
  // `longer_than`: what RAM already serves — a tier whose lookup costs a round trip (remote)
  // skips it when it cannot do better.
  virtual std::optional<ColdFind> find(std::span<const TokenId> prompt, const std::string& ns,
                                       int64_t longer_than = 0) = 0;
  // Materializes a found entry. nullptr on any failure, never an error: the failing file is
  // removed and *reason receives ssd_corrupt | ssd_incompatible | ssd_io.
  virtual std::shared_ptr<const Entry> restore(const ColdFind& found, std::string* reason) = 0;
  // Persists synchronously (borrows the entry, done reading when it returns). false = not stored.
  virtual bool store(const Entry& entry) = 0;
  virtual ColdProbe probe(std::span<const TokenId> prompt, const std::string& ns) { return {}; }
  // Why the last find could not answer (e.g. remote_timeout), "" when it could: the reason a
  // miss or a shorter hit names (§11.6).
  virtual std::string last_find_failure() const { return {}; }
};

// Owned spill (§3.7): receives a reference to an entry leaving RAM; must not block on I/O.
class SpillSink {
 public:
  virtual ~SpillSink() = default;
  virtual void spill(std::shared_ptr<const Entry> entry) = 0;
};

struct RamStats {
  size_t entries = 0;
  size_t bytes = 0;         // distinct anonymous bytes referenced by entries (the capped bucket)
  size_t mapped_bytes = 0;  // distinct file-backed bytes referenced by entries
  uint64_t hits = 0, misses = 0;
  uint64_t evictions = 0, spills = 0, demotions = 0;
  uint64_t superseded = 0, duplicates = 0, oversize = 0;
  uint64_t restores = 0, restore_failures = 0;  // SSD restores served through this tier's take
  uint64_t cold_rejects = 0;                    // restored but unusable (floor / untrimmable tail)
};

// One namespace's share of the RAM tier (issue 45: /stats and /metrics by namespace).
struct RamNsStats {
  size_t entries = 0;
  size_t bytes = 0;         // distinct anonymous bytes of this ns's entries
  size_t mapped_bytes = 0;  // distinct file-backed bytes of this ns's entries
};

struct PutOptions {
  std::string label = "full";  // "checkpoint:<kind>" for boundary checkpoints (§11.3)
};

class RamTier {
 public:
  // cap_bytes: the RAM cap on anonymous bytes (0 = every put spills and drops, §3.3).
  // cold / sink are optional and not owned; they must outlive the tier.
  RamTier(size_t cap_bytes, ColdTier* cold = nullptr, SpillSink* sink = nullptr);
  ~RamTier();
  RamTier(const RamTier&) = delete;
  RamTier& operator=(const RamTier&) = delete;

  // §3.1. Never an error: a failure on any path is a miss (or a shorter hit) with a reason.
  TakeResult take(std::span<const TokenId> prompt, const std::string& ns);
  // §3.2: RAM only, no side effects.
  int64_t peek(std::span<const TokenId> prompt, const std::string& ns) const;

  // §3.3. Validates first (token count vs every state's offset, signature); on error the caller
  // still owns `state`. On ok the store owns it, even if it was spilled or dropped at once.
  Status put(std::span<const TokenId> tokens, SequenceState&& state, const std::string& ns,
             const PutOptions& opts = {});
  // A boundary checkpoint of a live state at `upto` tokens (tokens.size() == upto). The state
  // stays with its owner: shared KV prefix pieces are referenced, private rows and the other
  // kinds are copied (§11.3). Checkpoints of untrimmable state are ordinary untrimmable entries.
  Status put_checkpoint(std::span<const TokenId> tokens, const SequenceState& state,
                        const std::string& ns, const std::string& boundary_kind);
  // Inserts a built entry (also used by tests and by the store facade).
  void put_entry(std::shared_ptr<const Entry> entry);

  // §3.4. Stops, keeping the entry resident, as soon as a cold store returns false.
  size_t relieve_pressure(const std::function<bool()>& over_budget);
  // §3.5. No-op without a cold tier or spill sink. idle = 0 demotes everything (drain).
  size_t demote_idle(std::chrono::steady_clock::duration idle);
  // §3.6: drop everything, never spilling.
  void clear();

  void set_on_put(std::function<void(std::span<const TokenId>, const std::string&)> f) { on_put_ = std::move(f); }
  // Expected storage signature (empty = unchecked). Puts with another signature are refused.
  void set_signature(std::string sig) { signature_ = std::move(sig); }

  RamStats stats() const;
  // Entries and bytes by namespace (entries of two namespaces never share storage: a KV prefix
  // computed under one adapter set is never attached under another).
  std::map<std::string, RamNsStats> stats_by_ns() const;
  size_t cap_bytes() const { return cap_bytes_; }
  // Snapshot of resident entries, oldest insertion first (for flush and write-behind).
  std::vector<std::shared_ptr<const Entry>> entries() const;
  std::shared_ptr<const Entry> find_exact(std::span<const TokenId> tokens, const std::string& ns) const;
  // Some resident same-ns entry can serve exactly `tokens` (equal, or longer and trimmable).
  bool covers(std::span<const TokenId> tokens, const std::string& ns) const;

 private:
  struct Record {
    std::shared_ptr<const Entry> entry;
    uint64_t last_used = 0;
    std::chrono::steady_clock::time_point last_used_wall;
  };
  struct Ghost {
    std::string ns;
    std::vector<TokenId> tokens;
  };
  // Usable prefix of one entry for a prompt, or -1 (§2.1–§2.3).
  static int64_t usable(const Entry& e, std::span<const TokenId> prompt);
  size_t total_anon_bytes() const;
  void dispose(std::shared_ptr<const Entry> e, bool spill);
  void remember_ghost(const Entry& e);
  CacheReport explain(std::span<const TokenId> prompt, const std::string& ns, int64_t reused, Tier tier,
                      const Entry* served, const std::string& cold_failure, const ColdProbe& probe) const;

  size_t cap_bytes_;
  ColdTier* cold_;
  SpillSink* sink_;
  std::vector<Record> records_;  // insertion order = deterministic scan order (§2.4 ties)
  uint64_t clock_ = 0;
  std::deque<Ghost> ghosts_;     // recently evicted keys (reason evicted:ram)
  std::function<void(std::span<const TokenId>, const std::string&)> on_put_;
  std::string signature_;
  mutable RamStats stats_;
};

// Serves `p` tokens of an entry: the KV block is lent as is (attach reads [0, p)), other layer
// states are viewed and the views trimmed — never the entry (§3.1 step 4).
Result<Hit> serve_entry(const Entry& e, int64_t p, Tier tier);

// Builds an entry from a finished state (no copy of private KV rows); validation first.
Result<std::shared_ptr<const Entry>> make_entry(std::span<const TokenId> tokens, SequenceState&& state,
                                                const std::string& ns, const std::string& label);

}  // namespace larder::memory
