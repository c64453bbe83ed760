// ssd_tier.h — the crash-safe SSD tier (kv-store.md §6, §7, §11.1, §11.2).
//
// DIR/<identity-id>/<ns-dir>/<entry-id>.lkv; the files are the database (no sidecar index):
// the in-memory index is rebuilt from headers at startup (`scan`), leftovers of interrupted
// writes (*.lkv.tmp) are reaped, files of other identities are never touched. Corrupt,
// truncated, version-bumped or foreign files are misses with a logged reason and are removed;
// the tier never takes serving down (every failure is a value, one warning per class).
//
// Threads: `find`, `probe`, `restore` run on the engine thread; `store` runs on the SSD writer
// thread (queued spills) and, synchronously, on the engine thread (pressure relief, flush).
// The index is guarded by `mu_`; file writes are serialized by `write_mu_` (held without `mu_`,
// so lookups never wait for I/O). `scan` may run on the writer thread while the engine serves:
// until it publishes, lookups report `ssd_scanning`.
#pragma once

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "larder/memory/store/identity.h"
#include "larder/memory/store/lkv_format.h"
#include "larder/memory/store/ram_tier.h"

namespace larder::memory {

struct SsdConfig {
  std::string dir;                       // --ssd-cache DIR
  uint64_t cap_bytes = 32ull << 30;      // --ssd-cache-max (allocated blocks)
  StoreIdentity identity;
  VerifyPolicy verify = VerifyPolicy::kFull;  // --ssd-cache-verify
  RestoreMode restore = RestoreMode::kMmap;   // --ssd-cache-restore
  IoLayer* io = nullptr;                 // null = posix
  // Storage signature the running model produces (kind, dtype, layout of every layer); empty =
  // unchecked. Files with another signature are incompatible (removed at scan and at restore):
  // a stale layer signature must never seed a prefill (omlx #3699).
  std::string expected_signature;
};

struct SsdStats {
  size_t entries = 0;
  uint64_t bytes = 0;  // allocated bytes of indexed files
  uint64_t writes = 0, write_failures = 0, write_no_space = 0;
  uint64_t restores = 0, restore_failures = 0;
  uint64_t corrupt = 0, incompatible = 0, io_errors = 0;  // restore failures by class
  uint64_t evictions = 0, superseded = 0, oversize = 0;
  uint64_t scan_indexed = 0, scan_removed = 0, scan_tmp_reaped = 0;
  bool ready = false;
};

struct SsdRecord {
  std::string entry_id;
  std::string ns;
  std::string path;
  std::vector<TokenId> tokens;
  uint64_t bytes = 0;
  uint64_t recency = 0;  // logical clock seeded from mtime order at scan
  bool trimmable = true;
  int64_t floor = 0;
  std::string label;
};

class SsdTier final : public ColdTier {
 public:
  // Creates DIR/<identity-id> (mode 0700). Does not scan: call scan() (the store facade runs it
  // on the writer thread).
  static Result<std::unique_ptr<SsdTier>> open(SsdConfig config);

  // Rebuilds the index from headers only (§7.5) and publishes it atomically.
  void scan();
  bool ready() const { return ready_.load(std::memory_order_acquire); }
  void wait_ready() const;
  bool wait_ready_for(std::chrono::milliseconds limit) const;  // false: still scanning

  std::optional<ColdFind> find(std::span<const TokenId> prompt, const std::string& ns,
                               int64_t longer_than = 0) override;
  std::shared_ptr<const Entry> restore(const ColdFind& found, std::string* reason) override;
  bool store(const Entry& entry) override;
  ColdProbe probe(std::span<const TokenId> prompt, const std::string& ns) override;

  // §7.6 queries.
  int64_t longest_durable_prefix() const;
  bool has_durable_prefix(std::span<const TokenId> tokens, const std::string& ns) const;

  // Removes every file of this identity (admin clear). Returns files removed.
  size_t clear();

  SsdStats stats() const;
  // Indexed files and their allocated bytes by namespace (/stats and /metrics, issue 45).
  struct NsUsage {
    size_t entries = 0;
    uint64_t bytes = 0;
  };
  std::map<std::string, NsUsage> stats_by_ns() const;
  std::vector<SsdRecord> records() const;
  const std::string& identity_dir() const { return id_dir_; }
  std::string path_for(const std::string& ns, std::span<const TokenId> tokens) const;

 private:
  explicit SsdTier(SsdConfig c);
  static int64_t usable(const SsdRecord& r, std::span<const TokenId> prompt);
  void remove_locked(size_t i, bool unlink_file);
  void evict_locked(const std::string& keep_id);
  uint64_t total_bytes_locked() const;

  SsdConfig cfg_;
  IoLayer* io_;
  std::string id_dir_;
  mutable std::mutex mu_;
  mutable std::condition_variable ready_cv_;
  std::vector<SsdRecord> index_;  // guarded by mu_
  std::deque<std::pair<std::string, std::vector<TokenId>>> ghosts_;  // evicted keys (evicted:ssd), mu_
  // Keys of files the startup scan removed as unusable, when their key was still readable, so a
  // request that would have used one is told which file it lost (ssd_removed:FILE), mu_.
  struct Removed {
    std::string ns, file;
    std::vector<TokenId> tokens;
  };
  std::deque<Removed> removed_keys_;
  uint64_t clock_ = 0;            // guarded by mu_
  std::atomic<bool> ready_{false};
  std::mutex write_mu_;
  SsdStats stats_;  // guarded by mu_
};

// Directory name of a namespace: the ns itself when it is a safe name ("base", hex ids), else
// its XXH3-64 in hex (the header stores the real ns).
std::string ns_dir_name(const std::string& ns);

}  // namespace larder::memory
