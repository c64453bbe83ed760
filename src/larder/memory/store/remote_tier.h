// remote_tier.h — the remote KV tier on Redis, below the RAM and SSD tiers (issue 46).
//
// What is stored: fixed-size chunks of a plain-KV prefix (`chunk_tokens` tokens; the server
// derives it from the model so a value is about 4 MiB, LMCache's measured sweet spot). Chunk i
// is keyed by a chained content hash
//   h_i = XXH3-128(recipe ‖ identity-id ‖ ns ‖ h_{i-1} ‖ chunk_tokens ‖ u32 LE tokens of chunk i)
// so replicas of the same model (same identity-id: weights, config, tokenizer, KV scheme and
// numerics, kv-store.md §9) share entries and different models or namespaces never meet. A
// value is an LKV1 image of the chunk (docs/kv-store-format.md): the metadata (identity, ns,
// token ids, label "chunk:<start>", signature) sits beside the rows, every tensor and the
// token list carry checksums, and all of it is verified on fetch — a value that fails any check
// is a miss with reason remote_corrupt / remote_incompatible and is deleted. Writes are SET NX
// (an existing chunk is never rewritten: equal keys mean equal content).
//
// Lookup: `find` fetches every full chunk of the prompt in one MGET (one round trip) and keeps
// the leading run that exists; `restore`, called right after, verifies them and joins their rows
// into one KvBlock (no further copy). Unlike the SSD tier, find does I/O: it is skipped when it
// cannot beat what RAM/SSD already serve. `fetch` is both in one call with its own stash, for
// the lookup thread (remote_lookup.h): the store never runs a remote round trip on the engine
// thread, so a slow Redis never stalls the other sequences' decode steps. When a later chunk of
// a fetch is bad (corrupt, incompatible), the valid chunks before it still serve (a prefix of a
// prefix is a prefix); the bad one is deleted and the hit names the reason.
//
// Failure model: every command runs under a timeout (`timeout_ms`, connect included). A
// timeout or error drops the connection and starts a backoff (100 ms doubling to 2 s) during
// which calls fail at once ("remote_down"): a slow or dead Redis makes larder slower (local
// prefill), never wrong and never stuck. Reconnects are automatic.
//
// Threads: two connections, each behind its own mutex: one for lookups (the lookup thread's
// fetch, /v1/kv/lookup's peek on HTTP threads), one for writes (the remote write queue's thread,
// remote_queue.h; a synchronous store only where a caller asks for one, e.g. tests), so a lookup
// never waits behind a multi-megabyte write. The stash between find and restore (the ColdTier
// interface) belongs to its one caller thread (tests); fetch keeps its own on its stack. Stats
// are guarded by their own mutex.
//
// Entries with non-plain state (sliding-window rings, recurrent layers, attachments) are
// exact-boundary checkpoints: each is one value holding the whole entry (key: identity, ns and
// every token), and its length is added to an index set keyed by the last full chunk below it
// (or a per-(identity, ns) root), so `find` learns candidate lengths in the same round trip as
// the chunks and fetches the longest one that the prompt matches whole (up to len − 1); such a
// hit serves exactly that length (kv-store.md §11.3).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "larder/memory/store/identity.h"
#include "larder/memory/store/lkv_format.h"
#include "larder/memory/store/ram_tier.h"
#include "larder/memory/store/remote_url.h"

struct redisContext;

namespace larder::memory {

struct RemoteConfig {
  RemoteUrl url;
  int timeout_ms = 100;        // --kv-remote-timeout-ms: connect and every command
  int64_t chunk_tokens = 256;  // tokens per value (the server derives ~4 MiB values)
  StoreIdentity identity;
  std::string expected_signature;  // storage signature of the running model; empty = unchecked
  VerifyPolicy verify = VerifyPolicy::kFull;
};

// Latency histogram bucket bounds in seconds (+Inf implied).
inline constexpr std::array<double, 8> kRemoteLatencyBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5};

struct RemoteLatency {
  std::array<uint64_t, kRemoteLatencyBounds.size()> buckets{};  // cumulative counts per bound
  uint64_t count = 0;
  double sum = 0;
  void observe(double s);
};

struct RemoteStats {
  bool connected = false;
  uint64_t lookups = 0, hits = 0, misses = 0, skipped = 0;  // find: some chunk / none / not needed
  uint64_t chunks_read = 0, chunks_written = 0, chunks_present = 0;  // values (chunks, checkpoints); present: already there
  uint64_t bytes_read = 0, bytes_written = 0;
  uint64_t writes = 0, write_failures = 0, unsupported = 0;  // entries (unsupported: none today)
  uint64_t timeouts = 0, errors = 0, down = 0;  // down: refused at once during the backoff
  uint64_t corrupt = 0, incompatible = 0;
  uint64_t connects = 0, reconnects = 0;
  RemoteLatency read_latency, write_latency;  // per round trip
};

// One remote lookup, find and restore together (RemoteTier::fetch).
struct RemoteFetch {
  std::shared_ptr<const Entry> entry;  // verified rows of found.prefix_len tokens or more; null: nothing usable
  ColdFind found;                      // what the entry serves (tier kRemote) when entry is set
  std::string failure;  // "" or remote_timeout | remote_error | remote_down | remote_corrupt | remote_incompatible
};

// The key of every full chunk of `tokens` (at most max_chunks): "larder:kv:1:<32 hex>".
std::vector<std::string> remote_chunk_keys(const std::string& identity_id, const std::string& ns,
                                           int64_t chunk_tokens, std::span<const TokenId> tokens,
                                           size_t max_chunks = SIZE_MAX);

class RemoteTier final : public ColdTier {
 public:
  // Connects lazily (the first lookup or write); never fails for an unreachable server.
  static Result<std::unique_ptr<RemoteTier>> open(RemoteConfig config);
  ~RemoteTier() override;

  std::optional<ColdFind> find(std::span<const TokenId> prompt, const std::string& ns,
                               int64_t longer_than = 0) override;
  std::shared_ptr<const Entry> restore(const ColdFind& found, std::string* reason) override;
  bool store(const Entry& entry) override { return store(entry, {}); }
  // The same, calling `after_batch(bytes sent)` after each pipelined batch of values (the write
  // queue's pacing); when it returns false the store stops there and fails (shutdown).
  bool store(const Entry& entry, const std::function<bool(uint64_t)>& after_batch);
  std::string last_find_failure() const override { return stash_.failure; }
  // find + restore with a stash of its own (any thread; the read connection's mutex): at most
  // one round trip for the chunks and boundary indexes, one for boundary values. A bad later
  // chunk leaves the leading valid ones serving (failure then names it, entry is still set when
  // they beat `longer_than`).
  RemoteFetch fetch(std::span<const TokenId> prompt, const std::string& ns, int64_t longer_than);
  // POST /v1/kv/lookup: how many leading tokens of `prompt` a take would reuse from this tier
  // (full chunks, or a longer boundary checkpoint the prompt matches whole; at most len - 1),
  // learnt from key existence only: no value crosses the network, find's stash and counters are
  // untouched, and EXISTS leaves Redis's LRU clock of the chunks alone. Any thread (the read
  // connection's mutex). On failure returns 0 and *failure names it (remote_timeout |
  // remote_error | remote_down), else *failure is "".
  int64_t peek(std::span<const TokenId> prompt, const std::string& ns, std::string* failure);

  // A lookup the store did not need to send (RAM / SSD already serve len - 1): counted as find counts it.
  void note_skipped() {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++st_.skipped;
  }
  RemoteStats stats() const;
  const RemoteConfig& config() const { return cfg_; }

  struct Conn;  // one hiredis connection + its mutex and backoff (remote_tier.cpp)

 private:
  explicit RemoteTier(RemoteConfig c);
  void count_failure(const std::string& reason);
  // Connects `c` if needed; "" or the failure reason (remote_timeout | remote_error | remote_down).
  std::string connect_locked(Conn& c);
  // Sends `cmds` pipelined on `c` and reads one reply per command into *replies (owned, freed by
  // the shared_ptr). "" or the failure reason; on failure the connection is dropped (backoff).
  std::string roundtrip(Conn& c, const std::vector<std::vector<std::string_view>>& cmds,
                        std::vector<std::shared_ptr<void>>* replies, bool write);

  // What find learnt, for restore: the values stay inside the reply they arrived in.
  struct Stash {
    std::string failure;
    std::string ns;
    std::vector<TokenId> tokens;
    std::vector<std::string> keys;
    std::vector<std::string_view> values;  // into reply
    std::shared_ptr<void> reply;
    void clear();
  };
  std::optional<ColdFind> find_into(Stash& st, std::span<const TokenId> prompt, const std::string& ns,
                                    int64_t longer_than);
  // `partial` non-null: a bad chunk after the first leaves chunks [0, j) serving (*partial = j,
  // *reason names the bad one) instead of failing the whole restore.
  std::shared_ptr<const Entry> restore_from(Stash& st, const ColdFind& found, std::string* reason, size_t* partial);

  RemoteConfig cfg_;
  std::string identity_id_;
  std::unique_ptr<Conn> read_, write_;
  Stash stash_;  // find → restore through the ColdTier interface (its caller's thread)
  mutable std::mutex stats_mu_;
  RemoteStats st_;
};

}  // namespace larder::memory
