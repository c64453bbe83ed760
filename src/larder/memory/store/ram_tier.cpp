#include "larder/memory/store/ram_tier.h"

#include <algorithm>

#include "larder/core/log.h"

namespace larder::memory {

namespace {
constexpr size_t kMaxGhosts = 32;

bool is_prefix_of(const std::vector<TokenId>& a, const std::vector<TokenId>& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}
}  // namespace

// ---- building and serving entries ---------------------------------------------------------

Result<std::shared_ptr<const Entry>> make_entry(std::span<const TokenId> tokens, SequenceState&& state,
                                                const std::string& ns, const std::string& label) {
  // §3.3 step 1: everything that can fail runs before ownership is adopted, so on error the
  // caller still owns an intact state.
  const int64_t n = static_cast<int64_t>(tokens.size());
  const KvLayout& layout = state.kv.layout();
  if (layout.n_layers > 0 && state.kv.length() != n) {
    return invalid_argument(strfmt("[kv-store] put of %lld tokens but the KV cache holds %lld",
                                   static_cast<long long>(n), static_cast<long long>(state.kv.length())));
  }
  bool trimmable = state.attachments.empty();
  int64_t floor = 0;
  std::vector<const LayerState*> lp;
  for (const auto& l : state.layers) {
    if (!l) return invalid_argument("[kv-store] put with a null layer state");
    if (l->offset() != n) {
      return invalid_argument(strfmt("[kv-store] put of %lld tokens but a %s layer absorbed %lld",
                                     static_cast<long long>(n), state_kind_name(l->kind()),
                                     static_cast<long long>(l->offset())));
    }
    trimmable = trimmable && l->trimmable();
    floor = std::max(floor, l->min_reusable_offset());
    lp.push_back(l.get());
  }
  std::vector<const Attachment*> ap;
  for (const Attachment& a : state.attachments) ap.push_back(&a);

  auto e = std::make_shared<Entry>();
  e->tokens.assign(tokens.begin(), tokens.end());
  e->ns = ns;
  e->trimmable = trimmable;
  e->floor = floor;
  e->label = label;
  e->signature = state_signature(layout, lp, ap);
  // Ownership transfer: private KV rows are adopted (moved), not copied.
  if (layout.n_layers > 0) e->kv = KvBlock::adopt(std::move(state.kv));
  for (auto& l : state.layers) e->layers.emplace_back(std::move(l));
  state.layers.clear();
  e->attachments = std::move(state.attachments);
  state.attachments.clear();
  return std::shared_ptr<const Entry>(std::move(e));
}

Result<Hit> serve_entry(const Entry& e, int64_t p, Tier tier) {
  Hit h;
  h.tokens = p;
  h.tier = tier;
  h.label = e.label;
  h.kv = e.kv;  // the block itself: attach_prefix(kv, p) reads [0, p) only — a zero-copy trim
  const int64_t t = static_cast<int64_t>(e.tokens.size()) - p;
  for (const auto& l : e.layers) {
    std::unique_ptr<LayerState> v = l->view();
    if (t > 0) LARDER_RETURN_IF_ERROR(v->trim(t));  // trims the view, never the donor
    h.layers.push_back(std::move(v));
  }
  h.attachments = e.attachments;  // full-range views (only served at t == 0)
  return h;
}

// ---- RamTier ------------------------------------------------------------------------------

RamTier::RamTier(size_t cap_bytes, ColdTier* cold, SpillSink* sink)
    : cap_bytes_(cap_bytes), cold_(cold), sink_(sink) {}

RamTier::~RamTier() { clear(); }

int64_t RamTier::usable(const Entry& e, std::span<const TokenId> prompt) {
  if (prompt.empty()) return -1;
  const int64_t lcp = common_prefix(e.tokens, prompt);
  const int64_t p = std::min<int64_t>(lcp, static_cast<int64_t>(prompt.size()) - 1);  // §2.1
  if (p <= 0 || p < e.floor) return -1;                                                 // §2.3, §2.4
  const int64_t t = static_cast<int64_t>(e.tokens.size()) - p;
  if (t > 0 && !e.trimmable) return -1;  // §2.2: untrimmable entries match only whole
  return p;
}

size_t RamTier::total_anon_bytes() const {
  std::vector<StorageRef> refs;
  for (const Record& r : records_) r.entry->storage(&refs);
  return distinct_bytes(refs, Backing::kAnon);
}

TakeResult RamTier::take(std::span<const TokenId> prompt, const std::string& ns) {
  int64_t best = 0;
  int best_idx = -1;
  for (size_t i = 0; i < records_.size(); ++i) {
    const Entry& e = *records_[i].entry;
    if (e.ns != ns) continue;  // §2.5
    const int64_t p = usable(e, prompt);
    if (p > best) {  // strict: ties go to the earliest inserted (§2.4)
      best = p;
      best_idx = static_cast<int>(i);
    }
  }
  // Counters describe RAM candidacy only (§3.1 step 2).
  if (best_idx >= 0) ++stats_.hits; else ++stats_.misses;

  std::string cold_failure;
  ColdProbe probe;
  if (cold_) {
    probe = cold_->probe(prompt, ns);
    std::optional<ColdFind> found = cold_->find(prompt, ns, best);
    if (!found || found->prefix_len <= best) cold_failure = cold_->last_find_failure();
    // Strictly longer only: ties go to RAM, a restore costs I/O (§3.1 step 3).
    if (found && found->prefix_len > best) {
      std::string reason;
      std::shared_ptr<const Entry> restored = cold_->restore(*found, &reason);
      if (!restored) {
        ++stats_.restore_failures;
        cold_failure = reason.empty() ? (found->tier == Tier::kRemote ? "remote_error" : "ssd_io") : reason;
      } else {
        ++stats_.restores;
        // The restored entry is owned by this scope: any rejection below drops it, which
        // releases its mapping (the C++ form of mlx-bun's ownership guard).
        const int64_t p = found->prefix_len;
        const int64_t t = static_cast<int64_t>(restored->tokens.size()) - p;
        if (p < restored->floor) {
          ++stats_.cold_rejects;
          cold_failure = "below_floor";
        } else if (t > 0 && !restored->trimmable) {
          ++stats_.cold_rejects;
          cold_failure = "untrimmable_tail";
          // Loud: mlx-bun's silent ~84 s restore-then-re-prefill path (kv-store.md §14.20).
          LARDER_LOG_WARN("[kv-store] %s entry of %zu tokens needs a trim of %lld but is untrimmable "
                          "(wrapped ring, recurrent state or attachments): falling back",
                          tier_name(found->tier), restored->tokens.size(), static_cast<long long>(t));
        } else {
          Result<Hit> h = serve_entry(*restored, p, found->tier);
          if (h.is_ok()) {
            TakeResult r;
            // A remote hit that is shorter than what was found (a bad later chunk) says why.
            r.report = explain(prompt, ns, p, found->tier, restored.get(),
                               found->tier == Tier::kRemote ? cold_->last_find_failure() : "", probe);
            r.hit = std::move(h).value();
            return r;
          }
          cold_failure = found->tier == Tier::kRemote ? "remote_corrupt" : "ssd_corrupt";
          LARDER_LOG_WARN("[kv-store] restored %s entry could not be served: %s", tier_name(found->tier),
                          h.status().to_string().c_str());
        }
      }
    }
  }

  TakeResult r;
  if (best_idx >= 0) {
    Record& rec = records_[best_idx];
    // Recency bump in place (§3.1 step 4, §11.10); the donor stays in the store.
    rec.last_used = ++clock_;
    rec.last_used_wall = std::chrono::steady_clock::now();
    Result<Hit> h = serve_entry(*rec.entry, best, Tier::kRam);
    if (h.is_ok()) {
      r.report = explain(prompt, ns, best, Tier::kRam, rec.entry.get(), cold_failure, probe);
      r.hit = std::move(h).value();
      return r;
    }
    LARDER_LOG_WARN("[kv-store] RAM entry could not be served: %s", h.status().to_string().c_str());
  }
  r.report = explain(prompt, ns, 0, Tier::kNone, nullptr, cold_failure, probe);
  return r;
}

CacheReport RamTier::explain(std::span<const TokenId> prompt, const std::string& ns, int64_t reused,
                             Tier tier, const Entry* served, const std::string& cold_failure,
                             const ColdProbe& probe) const {
  CacheReport rep;
  rep.tier = tier;
  rep.reused_tokens = reused;
  const int64_t cap = static_cast<int64_t>(prompt.size()) - 1;
  bool any_same_ns = probe.any_same_ns;
  int64_t best_lcp = probe.best_lcp, other_lcp = probe.best_lcp_other_ns;
  std::string other_ns = probe.best_other_ns;
  // The longest same-ns candidate that was *not* usable, and why.
  int64_t blocked_len = 0;
  std::string blocked_reason;
  for (const Record& r : records_) {
    const Entry& e = *r.entry;
    const int64_t lcp = common_prefix(e.tokens, prompt);
    if (e.ns != ns) {
      if (lcp > other_lcp || (lcp == other_lcp && lcp > 0 && other_ns.empty())) {
        other_lcp = lcp;
        other_ns = e.ns;
      }
      continue;
    }
    any_same_ns = true;
    best_lcp = std::max(best_lcp, lcp);
    const int64_t p = std::min(lcp, cap);
    if (p > reused && usable(e, prompt) < 0) {
      const bool floor = p < e.floor;
      if (p > blocked_len) {
        blocked_len = p;
        blocked_reason = floor ? "below_floor" : "untrimmable_tail";
      }
    }
  }
  int64_t ghost_lcp = 0;
  for (const Ghost& g : ghosts_) {
    if (g.ns == ns) ghost_lcp = std::max(ghost_lcp, std::min(common_prefix(g.tokens, prompt), cap));
  }
  rep.best_candidate_tokens = std::max(best_lcp, reused);
  // A longer prefix than this ns could serve is held under another one (another adapter set,
  // scale or salt; §11.4): named, so a miss across namespaces is explained, not a bare divergence.
  const bool other_longer = std::min(other_lcp, cap) > std::max(reused, std::min(best_lcp, cap)) && !other_ns.empty();
  const std::string other_reason = "other_namespace:" + other_ns;

  if (reused > 0) {
    if (served && served->tokens.size() == prompt.size() &&
        std::equal(served->tokens.begin(), served->tokens.end(), prompt.begin())) {
      rep.reason = "exact_repeat";
    } else if (!cold_failure.empty()) {
      rep.reason = cold_failure;  // a longer SSD match existed but could not be used
    } else if (std::min(probe.removed_lcp, cap) > reused) {
      rep.reason = "ssd_removed:" + probe.removed_file;
    } else if (blocked_len > reused) {
      rep.reason = blocked_reason;
    } else if (ghost_lcp > reused) {
      rep.reason = "evicted:ram";
    } else if (std::min(probe.evicted_lcp, cap) > reused) {
      rep.reason = "evicted:ssd";
    } else if (other_longer) {
      rep.reason = other_reason;
    } else if (reused < cap && served && static_cast<int64_t>(served->tokens.size()) > reused) {
      rep.reason = strfmt("diverged_at:%lld", static_cast<long long>(reused));
    } else {
      rep.reason = "hit";  // everything stored for this prompt was reused
    }
    return rep;
  }
  if (!cold_failure.empty()) {
    rep.reason = cold_failure;
  } else if (std::min(probe.removed_lcp, cap) > 0) {
    rep.reason = "ssd_removed:" + probe.removed_file;  // the startup scan removed the file that held it
  } else if (blocked_len > 0) {
    rep.reason = blocked_reason;
  } else if (ghost_lcp > 0) {
    rep.reason = "evicted:ram";
  } else if (std::min(probe.evicted_lcp, cap) > 0) {
    rep.reason = "evicted:ssd";
  } else if (probe.scanning) {
    rep.reason = "ssd_scanning";
  } else if (other_longer) {
    rep.reason = other_reason;
  } else if (!any_same_ns) {
    rep.reason = "empty_namespace";
  } else {
    rep.reason = strfmt("diverged_at:%lld", static_cast<long long>(std::min(best_lcp, std::max<int64_t>(cap, 0))));
  }
  return rep;
}

int64_t RamTier::peek(std::span<const TokenId> prompt, const std::string& ns) const {
  int64_t best = 0;
  for (const Record& r : records_) {
    if (r.entry->ns != ns) continue;
    best = std::max(best, usable(*r.entry, prompt));
  }
  return best;
}

Status RamTier::put(std::span<const TokenId> tokens, SequenceState&& state, const std::string& ns,
                    const PutOptions& opts) {
  if (!signature_.empty()) {
    std::vector<const LayerState*> lp;
    for (const auto& l : state.layers) lp.push_back(l.get());
    std::vector<const Attachment*> ap;
    for (const Attachment& a : state.attachments) ap.push_back(&a);
    const std::string sig = state_signature(state.kv.layout(), lp, ap);
    if (sig != signature_) {
      return incompatible(strfmt("[kv-store] put with storage signature '%s', store expects '%s'",
                                 sig.c_str(), signature_.c_str()));
    }
  }
  LARDER_ASSIGN_OR_RETURN(std::shared_ptr<const Entry> e, make_entry(tokens, std::move(state), ns, opts.label));
  // §3.3 step 2: from here on the store owns the entry; nothing is returned to the caller.
  put_entry(std::move(e));
  return Status::ok();
}

Status RamTier::put_checkpoint(std::span<const TokenId> tokens, const SequenceState& state,
                               const std::string& ns, const std::string& boundary_kind) {
  const int64_t upto = static_cast<int64_t>(tokens.size());
  const KvLayout& layout = state.kv.layout();
  if (layout.n_layers > 0 && state.kv.length() < upto) {
    return invalid_argument("[kv-store] checkpoint past the KV cache length");
  }
  // Untrimmable kinds only exist at their current offset: the engine captures the checkpoint
  // exactly at the boundary (it splits prefill chunks there, §11.3).
  for (const auto& l : state.layers) {
    if (l->offset() != upto) {
      return invalid_argument(strfmt("[kv-store] checkpoint at %lld but a %s layer is at %lld",
                                     static_cast<long long>(upto), state_kind_name(l->kind()),
                                     static_cast<long long>(l->offset())));
    }
  }
  if (find_exact(tokens, ns)) return Status::ok();  // same tokens are never stored twice (§11.3)
  auto e = std::make_shared<Entry>();
  e->tokens.assign(tokens.begin(), tokens.end());
  e->ns = ns;
  e->label = "checkpoint:" + boundary_kind;
  bool trimmable = state.attachments.empty();
  std::vector<const LayerState*> lp;
  for (const auto& l : state.layers) {
    trimmable = trimmable && l->trimmable();
    e->floor = std::max(e->floor, l->min_reusable_offset());
    // Copy, not view: the owner keeps mutating ring/recurrent state in place. A view would
    // make the owner's next write copy the whole state anyway (COW), so the cost is equal and
    // the entry's bytes are then its own.
    std::unique_ptr<LayerState> v = l->view();
    std::vector<StateTensor> ts;
    for (const StateTensor& t : v->tensors()) ts.push_back(StateTensor::copy_of(t));
    LARDER_ASSIGN_OR_RETURN(std::unique_ptr<LayerState> c, restore_layer_state(l->kind(), v->params(), ts));
    lp.push_back(l.get());
    e->layers.emplace_back(std::move(c));
  }
  std::vector<const Attachment*> ap;
  for (const Attachment& a : state.attachments) {
    Attachment c = a;
    for (StateTensor& t : c.tensors) t = StateTensor::copy_of(t);
    e->attachments.push_back(std::move(c));
    ap.push_back(&a);
  }
  e->trimmable = trimmable;
  e->signature = state_signature(layout, lp, ap);
  if (layout.n_layers > 0) e->kv = KvBlock::snapshot(state.kv, upto);
  put_entry(std::move(e));
  return Status::ok();
}

void RamTier::put_entry(std::shared_ptr<const Entry> e) {
  const size_t bytes = e->bytes(Backing::kAnon);
  if (bytes > cap_bytes_) {  // §3.3 step 3: oversize → spill, then drop
    ++stats_.oversize;
    remember_ghost(*e);
    dispose(std::move(e), /*spill=*/true);
    return;
  }
  const Entry* fresh = e.get();
  records_.push_back({e, ++clock_, std::chrono::steady_clock::now()});
  // §3.3 step 5 (exact duplicate, regardless of trimmability) and step 6 (supersede strict
  // ancestors, only when the new entry is trimmable: an untrimmable entry serves only its exact
  // length, so the shorter checkpoints — e.g. the prompt boundary — must survive).
  std::vector<std::shared_ptr<const Entry>> removed;
  for (auto it = records_.begin(); it != records_.end();) {
    const Entry& old = *it->entry;
    bool drop = false;
    if (&old != fresh && old.ns == fresh->ns) {
      if (old.tokens == fresh->tokens) {
        drop = true;
        ++stats_.duplicates;
      } else if (fresh->trimmable && old.tokens.size() < fresh->tokens.size() &&
                 static_cast<int64_t>(old.tokens.size()) >= fresh->floor &&
                 is_prefix_of(old.tokens, fresh->tokens)) {
        drop = true;
        ++stats_.superseded;
      }
    }
    if (drop) {
      removed.push_back(std::move(it->entry));
      it = records_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& r : removed) dispose(std::move(r), /*spill=*/false);
  // §3.3 step 7: LRU eviction with spill; never the entry just inserted while others exist.
  // Loops on the real distinct-byte total: evicting an entry whose segments are shared frees
  // less than its nominal size (§11.5).
  while (records_.size() > 1 && total_anon_bytes() > cap_bytes_) {
    size_t victim = records_.size();
    for (size_t i = 0; i < records_.size(); ++i) {
      if (records_[i].entry.get() == fresh) continue;
      if (victim == records_.size() || records_[i].last_used < records_[victim].last_used) victim = i;
    }
    if (victim == records_.size()) break;
    std::shared_ptr<const Entry> v = std::move(records_[victim].entry);
    records_.erase(records_.begin() + static_cast<long>(victim));
    ++stats_.evictions;
    remember_ghost(*v);
    dispose(std::move(v), /*spill=*/true);
  }
  if (on_put_) on_put_(fresh->tokens, fresh->ns);  // observers cannot fail (no exceptions)
}

void RamTier::remember_ghost(const Entry& e) {
  ghosts_.push_back({e.ns, e.tokens});
  while (ghosts_.size() > kMaxGhosts) ghosts_.pop_front();
}

void RamTier::dispose(std::shared_ptr<const Entry> e, bool spill) {
  // §3.7. The owned spill receives a reference to the immutable entry (its "views"); the RAM
  // tier's reference goes now, so the bytes stay alive only while the queue holds them and are
  // released on every settle path of the queue. Without a sink, a cold tier stores
  // synchronously (best effort; failures are logged by the tier).
  if (spill) {
    if (sink_) {
      sink_->spill(e);
      ++stats_.spills;
    } else if (cold_) {
      if (cold_->store(*e)) ++stats_.spills;
    }
  }
  e.reset();
}

size_t RamTier::relieve_pressure(const std::function<bool()>& over_budget) {
  size_t count = 0;
  while (!records_.empty() && over_budget()) {
    size_t oldest = 0;
    for (size_t i = 1; i < records_.size(); ++i)
      if (records_[i].last_used < records_[oldest].last_used) oldest = i;
    // Synchronous write, not an enqueue: queued views would keep the memory alive (§3.4).
    // A failed write must not be presented as a demotion: stop and keep the entry resident.
    if (cold_ && !cold_->store(*records_[oldest].entry)) break;
    std::shared_ptr<const Entry> v = std::move(records_[oldest].entry);
    records_.erase(records_.begin() + static_cast<long>(oldest));
    if (!cold_) remember_ghost(*v);
    dispose(std::move(v), /*spill=*/false);
    ++stats_.demotions;
    ++count;
  }
  return count;
}

size_t RamTier::demote_idle(std::chrono::steady_clock::duration idle) {
  if (!cold_ && !sink_) return 0;  // demoting with nowhere to go is data loss (§3.5)
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<const Entry>> out;
  for (auto it = records_.begin(); it != records_.end();) {
    if (now - it->last_used_wall >= idle) {
      out.push_back(std::move(it->entry));
      it = records_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& e : out) {
    dispose(std::move(e), /*spill=*/true);
    ++stats_.demotions;
  }
  return out.size();
}

void RamTier::clear() {
  // Detach first, then drop without spill: a clear must never rewrite the SSD tier (§3.6).
  std::vector<Record> all = std::move(records_);
  records_.clear();
  for (Record& r : all) dispose(std::move(r.entry), /*spill=*/false);
}

RamStats RamTier::stats() const {
  RamStats s = stats_;
  s.entries = records_.size();
  std::vector<StorageRef> refs;
  for (const Record& r : records_) r.entry->storage(&refs);
  s.bytes = distinct_bytes(refs, Backing::kAnon);
  s.mapped_bytes = distinct_bytes(refs, Backing::kMapped);
  return s;
}

std::map<std::string, RamNsStats> RamTier::stats_by_ns() const {
  std::map<std::string, std::vector<StorageRef>> refs;
  std::map<std::string, RamNsStats> out;
  for (const Record& r : records_) {
    ++out[r.entry->ns].entries;
    r.entry->storage(&refs[r.entry->ns]);
  }
  for (auto& [ns, st] : out) {
    st.bytes = distinct_bytes(refs[ns], Backing::kAnon);
    st.mapped_bytes = distinct_bytes(refs[ns], Backing::kMapped);
  }
  return out;
}

std::vector<std::shared_ptr<const Entry>> RamTier::entries() const {
  std::vector<std::shared_ptr<const Entry>> out;
  for (const Record& r : records_) out.push_back(r.entry);
  return out;
}

std::shared_ptr<const Entry> RamTier::find_exact(std::span<const TokenId> tokens, const std::string& ns) const {
  for (const Record& r : records_) {
    if (r.entry->ns == ns && r.entry->tokens.size() == tokens.size() &&
        std::equal(tokens.begin(), tokens.end(), r.entry->tokens.begin()))
      return r.entry;
  }
  return nullptr;
}

bool RamTier::covers(std::span<const TokenId> tokens, const std::string& ns) const {
  for (const Record& r : records_) {
    const Entry& e = *r.entry;
    if (e.ns != ns || e.tokens.size() < tokens.size()) continue;
    if (!std::equal(tokens.begin(), tokens.end(), e.tokens.begin())) continue;
    if (e.tokens.size() == tokens.size() || (e.trimmable && static_cast<int64_t>(tokens.size()) >= e.floor))
      return true;
  }
  return false;
}

}  // namespace larder::memory
