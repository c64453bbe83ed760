// entry.h — what the KV store keeps, lends and receives (kv-store.md §1, §3, §4).
//
// Ownership (C++ form of §4): an `Entry` is immutable once built and shared as
// shared_ptr<const Entry>: the RAM tier, the spill queue (write-behind) and the SSD writer hold
// references, never copies. Lending never mutates it: a hit receives the entry's KvBlock (a
// KvPrefix, attached zero-copy), and COW views of its other layer states. mlx-bun's
// retain/dispose "share" becomes structural: a segment's backing (heap rows or a file mapping)
// is released when the last shared_ptr to it goes, exactly once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "larder/memory/kv_cache.h"
#include "larder/memory/sequence_state.h"
#include "larder/memory/states/kv_block.h"
#include "larder/memory/states/layer_state.h"

namespace larder::memory {

using TokenId = int32_t;

// A request's mutable model state (memory/sequence_state.h) is what the engine prefills into
// and what `put` takes.

struct Entry {
  std::vector<TokenId> tokens;
  std::string ns;
  std::shared_ptr<const KvBlock> kv;                 // null when the model has no plain layers
  std::vector<std::shared_ptr<const LayerState>> layers;
  std::vector<Attachment> attachments;
  bool trimmable = true;  // no attachments and every layer trimmable (evaluated at put, §2.6)
  int64_t floor = 0;      // max over layers of min_reusable_offset (§2.3)
  std::string label = "full";  // "full" | "checkpoint:<boundary-kind>"
  std::string signature;       // storage signature of every layer (kind, dtype, layout)
  int64_t created_ms = 0;      // set when restored from a file (a re-save keeps it: byte-identical)

  void storage(std::vector<StorageRef>* out) const;
  size_t bytes(Backing backing) const;  // distinct bytes within this entry
};

// Builds the storage signature of a state list: "plain_kv:f32:L=..:h=..:d=..|ring:...|att:<schema>".
std::string state_signature(const KvLayout& layout, const std::vector<const LayerState*>& layers,
                            const std::vector<const Attachment*>& attachments);

enum class Tier : uint8_t { kNone, kRam, kSsd, kRemote };
const char* tier_name(Tier t);

// kv-store.md §11.6: why a take reused what it reused.
struct CacheReport {
  Tier tier = Tier::kNone;
  int64_t reused_tokens = 0;
  int64_t best_candidate_tokens = 0;  // longest common prefix seen in any tier (same ns)
  std::string reason;                 // hit | exact_repeat | diverged_at:<i> | ... (§11.6)
};

// A served prefix. Attach with `hit.into_state(max_tokens)` (or attach `kv` yourself).
struct Hit {
  int64_t tokens = 0;  // p: reused prefix length
  Tier tier = Tier::kNone;
  std::shared_ptr<const KvPrefix> kv;  // covers at least [0, tokens)
  std::vector<std::unique_ptr<LayerState>> layers;  // private COW views, trimmed to `tokens`
  std::vector<Attachment> attachments;              // full-range views (exact boundary only)
  std::string label;

  // A SequenceState positioned at `tokens`, zero-copy: the KV prefix is attached, not copied.
  SequenceState into_state(const KvLayout& layout, int64_t max_tokens) &&;
  // The same for a model's schema: the lent layer states fill the schema's non-plain slots in
  // order. An entry whose states do not fit the schema (kinds, count) is refused: that is a
  // store keyed without the model's state signature, and serving it would be garbage.
  Result<SequenceState> into_state(const StateSchema& schema, int64_t max_tokens) &&;
};

struct TakeResult {
  std::optional<Hit> hit;
  CacheReport report;
};

int64_t common_prefix(std::span<const TokenId> a, std::span<const TokenId> b);

}  // namespace larder::memory
