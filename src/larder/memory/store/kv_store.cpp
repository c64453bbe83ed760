#include "larder/memory/store/kv_store.h"

#include "larder/core/log.h"

namespace larder::memory {

namespace {
constexpr size_t kMaxDirty = 4096;

// Spills (evictions, demotions, oversize puts) to the SSD write-behind queue and to the remote
// queue, which skips entries it has written already.
class FanOutSink final : public SpillSink {
 public:
  FanOutSink(SpillSink* a, SpillSink* b) : a_(a), b_(b) {}
  void spill(std::shared_ptr<const Entry> e) override {
    b_->spill(e);
    a_->spill(std::move(e));
  }

 private:
  SpillSink *a_, *b_;
};

// How long a flush waits for the remote queue: each item is bounded by the tier's timeouts and a
// dead Redis fails fast (backoff), so this only bounds a long queue against a slow Redis.
constexpr auto kRemoteFlushLimit = std::chrono::seconds(10);
}  // namespace

// The cold tiers below RAM as the RAM tier sees them when there is a remote tier: the SSD tier
// (local, index only: no I/O to find) and, only inside complete_take, what the lookup thread
// already fetched from Redis — a take never does a remote round trip on the engine thread
// (remote_lookup.h). Synchronous stores (pressure relief, a spill with no sink) go to the SSD
// tier when there is one; without one they must not do Redis I/O here either: they succeed
// exactly when the remote write queue has already written the entry (every put is offered to
// it), so pressure relief drops entries the shared tier holds and keeps the others resident.
class TieredCold final : public ColdTier {
 public:
  TieredCold(SsdTier* ssd, RemoteWriteQueue* q) : ssd_(ssd), q_(q) {}
  void set_fetched(const RemoteFetch* f) { fetched_ = f; }
  std::optional<ColdFind> find(std::span<const TokenId> prompt, const std::string& ns, int64_t longer_than) override {
    std::optional<ColdFind> s = ssd_ ? ssd_->find(prompt, ns, longer_than) : std::nullopt;
    const int64_t floor = std::max(longer_than, s ? s->prefix_len : 0);
    if (fetched_ && fetched_->entry && fetched_->found.prefix_len > floor) return fetched_->found;
    return s;
  }
  std::shared_ptr<const Entry> restore(const ColdFind& found, std::string* reason) override {
    if (found.tier != Tier::kRemote) return ssd_ ? ssd_->restore(found, reason) : nullptr;
    if (fetched_ && fetched_->entry) return fetched_->entry;
    if (reason) *reason = "remote_error";
    return nullptr;
  }
  bool store(const Entry& e) override { return ssd_ ? ssd_->store(e) : q_->written(e); }
  ColdProbe probe(std::span<const TokenId> prompt, const std::string& ns) override {
    return ssd_ ? ssd_->probe(prompt, ns) : ColdProbe{};
  }
  std::string last_find_failure() const override { return fetched_ ? fetched_->failure : std::string(); }

 private:
  SsdTier* ssd_;
  RemoteWriteQueue* q_;
  const RemoteFetch* fetched_ = nullptr;  // set for the duration of one complete_take
};

KvStore::KvStore(KvStoreConfig cfg) : cfg_(std::move(cfg)) {}

Result<std::unique_ptr<KvStore>> KvStore::open(KvStoreConfig cfg) {
  std::unique_ptr<KvStore> s(new KvStore(std::move(cfg)));
  const KvStoreConfig& c = s->cfg_;
  if (!c.ssd_dir.empty()) {
    if (c.ram_cap_bytes == 0) {
      // §7: the SSD tier requires the RAM tier (its spills are the SSD tier's main producer).
      return invalid_argument("[kv-store] --ssd-cache requires a RAM tier (--prompt-cache > 0)");
    }
    SsdConfig sc;
    sc.dir = c.ssd_dir;
    sc.cap_bytes = c.ssd_cap_bytes;
    sc.identity = c.identity;
    sc.verify = c.verify;
    sc.restore = c.restore;
    sc.io = c.io;
    sc.expected_signature = c.signature;
    LARDER_ASSIGN_OR_RETURN(s->ssd_, SsdTier::open(std::move(sc)));
    if (!c.background_scan) s->ssd_->scan();
  }
  if (!c.remote_url.empty()) {
    if (c.ram_cap_bytes == 0)
      return invalid_argument("[kv-store] --kv-remote requires a RAM tier (--prompt-cache > 0)");
    RemoteConfig rc;
    LARDER_ASSIGN_OR_RETURN(rc.url, parse_remote_url(c.remote_url, c.remote_password_env));
    rc.timeout_ms = c.remote_timeout_ms;
    rc.chunk_tokens = c.remote_chunk_tokens;
    rc.identity = c.identity;
    rc.expected_signature = c.signature;
    rc.verify = c.verify;
    LARDER_ASSIGN_OR_RETURN(s->remote_, RemoteTier::open(std::move(rc)));
  }
  // The SSD tier's bounded write-behind queue (§8.1) and the remote tier's own queue, which
  // drains while the engine is busy too (remote_queue.h).
  if (s->ssd_) s->queue_ = std::make_unique<SpillQueue>(s->ssd_.get(), c.spill_queue_cap_bytes, c.background_scan);
  if (s->remote_) s->remote_queue_ = std::make_unique<RemoteWriteQueue>(s->remote_.get(), c.remote_queue);
  ColdTier* cold = s->ssd_.get();
  SpillSink* sink = s->queue_.get();
  if (s->remote_) {
    s->lookups_ = std::make_unique<RemoteLookups>(s->remote_.get());
    s->chain_ = std::make_unique<TieredCold>(s->ssd_.get(), s->remote_queue_.get());
    cold = s->chain_.get();
    if (s->ssd_) {
      s->fanout_ = std::make_unique<FanOutSink>(s->queue_.get(), s->remote_queue_.get());
      sink = s->fanout_.get();
    } else {
      sink = s->remote_queue_.get();
    }
  }
  s->ram_ = std::make_unique<RamTier>(c.ram_cap_bytes, cold, sink);
  s->ram_->set_signature(c.signature);
  const bool dirty = s->ssd_ && c.write_behind;
  if (dirty || s->remote_) {
    KvStore* self = s.get();
    s->ram_->set_on_put([self, dirty](std::span<const TokenId> t, const std::string& ns) {
      if (dirty) self->dirty_.insert({ns, std::vector<TokenId>(t.begin(), t.end())});
      // Offered to the shared tier at once, busy or not: other replicas need it now.
      if (self->remote_queue_) self->remote_queue_->publish(self->ram_->find_exact(t, ns));
    });
  }
  return s;
}

KvStore::~KvStore() {
  // RAM first (its clear never spills), then the writer thread, then the tiers it writes to.
  ram_.reset();
  lookups_.reset();  // cancels queued lookups; the one in flight ends within the tier's timeouts
  fanout_.reset();
  queue_.reset();
  remote_queue_.reset();
  chain_.reset();
  remote_.reset();
  ssd_.reset();
}

NsStats& KvStore::ns_counters(const std::string& ns) {
  auto it = ns_counts_.find(ns);
  if (it != ns_counts_.end()) return it->second;
  return ns_counts_[ns_counts_.size() < kMaxCountedNamespaces ? ns : std::string()];
}

void KvStore::count(const TakeResult& r, const std::string& ns) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  NsStats& n = ns_counters(ns);
  if (r.hit) {
    ++n.hits;
    n.reused_tokens += static_cast<uint64_t>(r.hit->tokens);
  } else {
    ++n.misses;
  }
  if (!r.hit) {
    ++miss_;
  } else if (r.hit->tier == Tier::kSsd) {
    ++hit_ssd_;
    reused_ssd_ += static_cast<uint64_t>(r.hit->tokens);
  } else if (r.hit->tier == Tier::kRemote) {
    ++hit_remote_;
    reused_remote_ += static_cast<uint64_t>(r.hit->tokens);
  } else {
    ++hit_ram_;
    reused_ram_ += static_cast<uint64_t>(r.hit->tokens);
  }
  if (r.hit && r.hit->label.rfind("checkpoint:", 0) == 0) ++checkpoint_hits_[r.hit->label.substr(11)];
  if (r.report.reason != "hit" && r.report.reason != "exact_repeat") {
    std::string key = r.report.reason;
    if (key.rfind("diverged_at:", 0) == 0) key = "diverged";  // bounded label set for metrics
    if (key.rfind("ssd_removed:", 0) == 0) key = "ssd_removed";
    if (key.rfind("other_namespace:", 0) == 0) key = "other_namespace";
    ++reasons_[key];
  }
}

void KvStore::unusable_hit(CacheReport* report, const std::string& reason, const std::string& ns) {
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    const uint64_t n = static_cast<uint64_t>(std::max<int64_t>(report->reused_tokens, 0));
    if (report->tier != Tier::kNone) {
      NsStats& c = ns_counters(ns);
      if (c.hits) --c.hits;
      c.reused_tokens -= std::min(c.reused_tokens, n);
      ++c.misses;
    }
    if (report->tier == Tier::kSsd) {
      if (hit_ssd_) --hit_ssd_;
      reused_ssd_ -= std::min(reused_ssd_, n);
    } else if (report->tier == Tier::kRemote) {
      if (hit_remote_) --hit_remote_;
      reused_remote_ -= std::min(reused_remote_, n);
    } else if (report->tier == Tier::kRam) {
      if (hit_ram_) --hit_ram_;
      reused_ram_ -= std::min(reused_ram_, n);
    }
    ++miss_;
    ++reasons_[reason];
  }
  report->best_candidate_tokens = std::max(report->best_candidate_tokens, report->reused_tokens);
  report->tier = Tier::kNone;
  report->reused_tokens = 0;
  report->reason = reason;
}

TakeStart KvStore::begin_take(std::span<const TokenId> prompt, const std::string& ns,
                              std::function<void()> on_ready) {
  TakeStart t;
  if (lookups_) {
    // What the local tiers serve (no side effects, no I/O): the remote tier is asked only when
    // it could beat that — a take never reuses the last prompt token, so n - 1 is the most.
    int64_t local = ram_->peek(prompt, ns);
    if (ssd_) {
      std::optional<ColdFind> f = ssd_->find(prompt, ns, local);
      if (f && f->prefix_len > local) local = f->prefix_len;
    }
    const int64_t n = static_cast<int64_t>(prompt.size());
    if (n >= 2 && n - 1 > local) {
      t.pending = lookups_->start(prompt, ns, local, std::move(on_ready));
      return t;
    }
    remote_->note_skipped();
  }
  t.result = take_now(prompt, ns, nullptr);
  return t;
}

TakeResult KvStore::complete_take(const RemoteLookup& lookup) {
  // RAM and SSD are consulted again: a request that finished meanwhile may have left a longer
  // prefix than the one fetched (the longest wins; ties go to RAM).
  return take_now(lookup.prompt(), lookup.ns(), lookup.ready() ? &lookup.result() : nullptr);
}

TakeResult KvStore::take(std::span<const TokenId> prompt, const std::string& ns) {
  TakeStart t = begin_take(prompt, ns);
  if (!t.pending) return std::move(t.result);
  t.pending->wait();
  return complete_take(*t.pending);
}

TakeResult KvStore::take_now(std::span<const TokenId> prompt, const std::string& ns, const RemoteFetch* fetched) {
  if (chain_) chain_->set_fetched(fetched);
  TakeResult r = ram_->take(prompt, ns);
  if (chain_) chain_->set_fetched(nullptr);
  count(r, ns);
  LARDER_LOG_DEBUG("[kv-store] take %zu tokens ns=%s: tier=%s reused=%lld best=%lld reason=%s", prompt.size(),
                   ns.c_str(), tier_name(r.report.tier), static_cast<long long>(r.report.reused_tokens),
                   static_cast<long long>(r.report.best_candidate_tokens), r.report.reason.c_str());
  return r;
}

Status KvStore::put(std::span<const TokenId> tokens, SequenceState&& state, const std::string& ns,
                    const PutOptions& opts) {
  if (tokens.empty()) return invalid_argument("[kv-store] put of an empty token list");
  return ram_->put(tokens, std::move(state), ns, opts);
}

Status KvStore::put_boundary(std::span<const TokenId> prefix, const SequenceState& state, const std::string& ns,
                             const std::string& kind) {
  // Plain KV (the KvCache) trims to any prefix: the full entry put at the end of the request
  // serves this boundary, a checkpoint would only duplicate it. Any other kind is kept even while
  // it is still trimmable here: a ring that has not wrapped at the boundary may wrap while the
  // answer is decoded, and then the full entry can no longer be cut back to this point.
  if (state.layers.empty() && state.attachments.empty()) return Status::ok();
  if (prefix.empty()) return invalid_argument("[kv-store] empty prompt boundary");
  const bool had = ram_->find_exact(prefix, ns) != nullptr;  // same tokens are never stored twice
  LARDER_RETURN_IF_ERROR(ram_->put_checkpoint(prefix, state, ns, kind));
  if (!had) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++checkpoints_stored_[kind];
  }
  return Status::ok();
}

void KvStore::set_engine_busy(bool busy) {
  if (queue_) queue_->set_busy(busy);
  if (remote_queue_) remote_queue_->set_busy(busy);
}

size_t KvStore::write_behind() {
  if (!queue_) return 0;
  size_t n = 0;
  for (auto it = dirty_.begin(); it != dirty_.end();) {
    std::shared_ptr<const Entry> e = ram_->find_exact(it->second, it->first);
    if (!e) {
      // Left RAM. Settled when a longer RAM entry covers it (superseded: flush persists that
      // one) or a durable file does; otherwise its spill may still be queued — keep it for the
      // next pass or flush. Past kMaxDirty (persistent disk failure) it is settled as missing
      // so the set stays bounded.
      if (!ssd_ || ram_->covers(it->second, it->first) || ssd_->has_durable_prefix(it->second, it->first)) {
        it = dirty_.erase(it);
      } else if (dirty_.size() > kMaxDirty) {
        ++missing_total_;
        it = dirty_.erase(it);
      } else {
        ++it;
      }
      continue;
    }
    if (!queue_->snapshot(std::move(e))) break;  // over 75 %: keys stay dirty (§11.8)
    ++n;
    it = dirty_.erase(it);
  }
  return n;
}

FlushReport KvStore::flush() {
  FlushReport rep;
  if (remote_queue_ && !remote_queue_->drain(kRemoteFlushLimit))
    LARDER_LOG_WARN("[kv-remote] flush: the remote write queue did not drain in %lld s; the rest is not shared",
                    static_cast<long long>(kRemoteFlushLimit.count()));
  if (!ssd_) {
    for (const auto& e : ram_->entries())
      rep.not_written.push_back(strfmt("%s:%zu:no_ssd_tier", e->ns.c_str(), e->tokens.size()));
    return rep;
  }
  rep.ssd_enabled = true;
  // Never wait on the startup scan without bound (this runs on the engine thread): entries
  // stored while it runs are kept by it, so a flush before it ends is still complete; it may
  // only write a file the scan would have found (counted as written, not already).
  ssd_->wait_ready_for(std::chrono::seconds(2));
  const QueueStats before = queue_->stats();
  queue_->drain();
  const QueueStats after = queue_->stats();
  rep.written += after.written - before.written;
  rep.failed += after.failed - before.failed;
  rep.dropped = after.dropped - dropped_seen_;
  dropped_seen_ = after.dropped;
  // Dirty keys one at a time, synchronously (the queue cap cannot drop a small boundary
  // snapshot behind a large one, §8.3).
  for (auto it = dirty_.begin(); it != dirty_.end();) {
    const auto& [ns, tokens] = *it;
    if (std::shared_ptr<const Entry> e = ram_->find_exact(tokens, ns)) {
      if (ssd_->has_durable_prefix(tokens, ns)) {
        ++rep.already;  // covered already (e.g. written by the drained queue)
      } else if (ssd_->store(*e)) {
        ++rep.written;
      } else {
        ++rep.failed;
        rep.not_written.push_back(strfmt("%s:%zu:write_failed", ns.c_str(), tokens.size()));
      }
    } else if (!ram_->covers(tokens, ns) && !ssd_->has_durable_prefix(tokens, ns)) {
      ++rep.missing;
      rep.not_written.push_back(strfmt("%s:%zu:left_ram_without_durable_copy", ns.c_str(), tokens.size()));
    }
    it = dirty_.erase(it);
  }
  // Every persistable RAM entry is on disk before flush returns (issue §5).
  for (const auto& e : ram_->entries()) {
    if (ssd_->has_durable_prefix(e->tokens, e->ns)) {
      ++rep.already;
      continue;
    }
    if (ssd_->store(*e)) {
      ++rep.written;
    } else {
      ++rep.failed;
      rep.not_written.push_back(strfmt("%s:%zu:write_failed", e->ns.c_str(), e->tokens.size()));
    }
  }
  rep.missing += missing_total_ - missing_reported_;
  missing_reported_ = missing_total_;
  rep.durable = rep.failed == 0 && rep.dropped == 0 && rep.missing == 0;
  return rep;
}

void KvStore::clear(bool with_ssd) {
  ram_->clear();
  dirty_.clear();
  if (with_ssd && ssd_) {
    if (queue_) queue_->drain();
    ssd_->clear();
  }
}

KvStore::LocalLookup KvStore::lookup_local(std::span<const TokenId> prompt, const std::string& ns) {
  LocalLookup r;
  r.ram = ram_->peek(prompt, ns);
  if (ssd_) {
    r.ssd_enabled = true;
    r.ssd_scanning = !ssd_->ready();
    if (std::optional<ColdFind> f = ssd_->find(prompt, ns)) r.ssd = f->prefix_len;  // the index only
  }
  return r;
}

void KvStore::wait_ssd_ready() const {
  if (ssd_) ssd_->wait_ready();
}

StoreStats KvStore::stats() const {
  StoreStats s;
  s.ram = ram_->stats();
  s.ssd_enabled = ssd_ != nullptr;
  if (ssd_) {
    s.ssd = ssd_->stats();
    s.longest_durable_prefix_tokens = ssd_->longest_durable_prefix();
  }
  if (queue_) s.queue = queue_->stats();
  s.remote_enabled = remote_ != nullptr;
  if (remote_) {
    s.remote = remote_->stats();
    s.remote_queue = remote_queue_->stats();
    s.remote_url = remote_->config().url.redacted();
    s.remote_chunk_tokens = remote_->config().chunk_tokens;
  }
  s.dirty_keys = dirty_.size();
  s.missing_keys = missing_total_;
  std::lock_guard<std::mutex> lock(stats_mu_);
  s.lookups_hit_ram = hit_ram_;
  s.lookups_hit_ssd = hit_ssd_;
  s.lookups_hit_remote = hit_remote_;
  s.reused_tokens_remote = reused_remote_;
  s.lookups_miss = miss_;
  s.reused_tokens_ram = reused_ram_;
  s.reused_tokens_ssd = reused_ssd_;
  s.miss_reasons = reasons_;
  s.checkpoints_stored = checkpoints_stored_;
  s.checkpoint_hits = checkpoint_hits_;
  s.namespaces = ns_counts_;
  for (const auto& [ns, r] : ram_->stats_by_ns()) {
    NsStats& n = s.namespaces[ns];
    n.ram_entries = r.entries;
    n.ram_bytes = r.bytes;
    n.ram_mapped_bytes = r.mapped_bytes;
  }
  if (ssd_) {
    for (const auto& [ns, u] : ssd_->stats_by_ns()) {
      NsStats& n = s.namespaces[ns];
      n.ssd_entries = u.entries;
      n.ssd_bytes = u.bytes;
    }
  }
  return s;
}

namespace {
struct LabelledNs {
  std::string label;
  std::string id;      // empty for "other"
  size_t folded = 0;   // namespaces folded into "other"
  NsStats st;
};

// The namespaces under their labels: the labelled ones in label order, then "other" (always
// present, so a dashboard's series do not come and go).
std::vector<LabelledNs> labelled_namespaces(const StoreStats& s, const NsLabels& labels) {
  std::map<std::string, LabelledNs> named;
  LabelledNs other{"other", "", 0, {}};
  auto add = [](NsStats& a, const NsStats& b) {
    a.ram_entries += b.ram_entries;
    a.ram_bytes += b.ram_bytes;
    a.ram_mapped_bytes += b.ram_mapped_bytes;
    a.ssd_entries += b.ssd_entries;
    a.ssd_bytes += b.ssd_bytes;
    a.hits += b.hits;
    a.misses += b.misses;
    a.reused_tokens += b.reused_tokens;
  };
  named["base"] = {"base", "base", 0, {}};
  for (const auto& [ns, st] : s.namespaces) {
    auto it = labels.find(ns);
    const std::string label = ns == "base" ? "base" : it != labels.end() ? it->second : "";
    if (label.empty()) {
      add(other.st, st);
      if (!ns.empty()) ++other.folded;
      continue;
    }
    LabelledNs& l = named[label];
    if (l.label.empty()) l = {label, ns, 0, {}};
    add(l.st, st);
  }
  std::vector<LabelledNs> out;
  for (auto& [label, l] : named) out.push_back(std::move(l));
  out.push_back(std::move(other));
  return out;
}
}  // namespace

nlohmann::json stats_json(const StoreStats& s, const NsLabels& labels) {
  nlohmann::json j;
  j["ram"] = {{"entries", s.ram.entries}, {"bytes", s.ram.bytes}, {"mapped_bytes", s.ram.mapped_bytes},
              {"hits", s.ram.hits}, {"misses", s.ram.misses}, {"evictions", s.ram.evictions},
              {"spills", s.ram.spills}, {"demotions", s.ram.demotions}, {"superseded", s.ram.superseded},
              {"duplicates", s.ram.duplicates}, {"oversize", s.ram.oversize}};
  j["ssd"] = {{"enabled", s.ssd_enabled}, {"ready", s.ssd.ready}, {"entries", s.ssd.entries},
              {"bytes", s.ssd.bytes}, {"writes", s.ssd.writes}, {"write_failures", s.ssd.write_failures},
              {"restores", s.ssd.restores}, {"restore_failures", s.ssd.restore_failures},
              {"corrupt", s.ssd.corrupt}, {"incompatible", s.ssd.incompatible},
              {"evictions", s.ssd.evictions}, {"superseded", s.ssd.superseded}};
  j["queue"] = {{"items", s.queue.queued_items}, {"bytes", s.queue.queued_bytes}, {"written", s.queue.written},
                {"failed", s.queue.failed}, {"dropped", s.queue.dropped}};
  const RemoteStats& r = s.remote;
  j["remote"] = {{"enabled", s.remote_enabled}, {"url", s.remote_url}, {"chunk_tokens", s.remote_chunk_tokens},
                 {"connected", r.connected}, {"lookups", r.lookups}, {"hits", r.hits}, {"misses", r.misses},
                 {"skipped", r.skipped}, {"chunks_read", r.chunks_read}, {"chunks_written", r.chunks_written},
                 {"chunks_present", r.chunks_present}, {"bytes_read", r.bytes_read},
                 {"bytes_written", r.bytes_written}, {"writes", r.writes}, {"write_failures", r.write_failures},
                 {"timeouts", r.timeouts}, {"errors", r.errors}, {"down", r.down},
                 {"corrupt", r.corrupt}, {"incompatible", r.incompatible}, {"connects", r.connects},
                 {"reconnects", r.reconnects},
                 {"queue", {{"items", s.remote_queue.queued_items}, {"bytes", s.remote_queue.queued_bytes},
                            {"written", s.remote_queue.written}, {"failed", s.remote_queue.failed},
                            {"dropped", s.remote_queue.dropped}, {"skipped", s.remote_queue.skipped},
                            {"paced_seconds", s.remote_queue.paced_s}}}};
  j["lookups"] = {{"hit_ram", s.lookups_hit_ram}, {"hit_ssd", s.lookups_hit_ssd},
                  {"hit_remote", s.lookups_hit_remote}, {"miss", s.lookups_miss}};
  j["reused_tokens"] = {{"ram", s.reused_tokens_ram}, {"ssd", s.reused_tokens_ssd}, {"remote", s.reused_tokens_remote}};
  j["miss_reasons"] = s.miss_reasons;
  j["checkpoints"] = {{"stored", s.checkpoints_stored}, {"hits", s.checkpoint_hits}};
  j["dirty_keys"] = s.dirty_keys;
  j["longest_durable_prefix_tokens"] = s.longest_durable_prefix_tokens;
  nlohmann::json ns = nlohmann::json::object();
  for (const LabelledNs& l : labelled_namespaces(s, labels)) {
    const NsStats& n = l.st;
    nlohmann::json e = {{"ram", {{"entries", n.ram_entries}, {"bytes", n.ram_bytes}, {"mapped_bytes", n.ram_mapped_bytes}}},
                        {"ssd", {{"entries", n.ssd_entries}, {"bytes", n.ssd_bytes}}},
                        {"hits", n.hits}, {"misses", n.misses}, {"reused_tokens", n.reused_tokens}};
    if (l.id.empty()) {
      e["namespaces"] = l.folded;
    } else {
      e["id"] = l.id;
    }
    ns[l.label] = std::move(e);
  }
  j["namespaces"] = std::move(ns);
  return j;
}

std::string stats_prometheus(const StoreStats& s, const NsLabels& labels) {
  std::string o;
  auto line = [&](const char* name, const std::string& labels, unsigned long long v) {
    o += strfmt("%s%s %llu\n", name, labels.empty() ? "" : ("{" + labels + "}").c_str(), v);
  };
  line("larder_kv_bytes", "bucket=\"ram\"", s.ram.bytes);
  line("larder_kv_bytes", "bucket=\"mapped\"", s.ram.mapped_bytes);
  line("larder_kv_bytes", "bucket=\"queue\"", s.queue.queued_bytes);
  line("larder_kv_bytes", "bucket=\"ssd\"", s.ssd.bytes);
  line("larder_kv_entries", "tier=\"ram\"", s.ram.entries);
  line("larder_kv_entries", "tier=\"ssd\"", s.ssd.entries);
  line("larder_kv_lookups_total", "result=\"hit_ram\"", s.lookups_hit_ram);
  line("larder_kv_lookups_total", "result=\"hit_ssd\"", s.lookups_hit_ssd);
  line("larder_kv_lookups_total", "result=\"hit_remote\"", s.lookups_hit_remote);
  line("larder_kv_lookups_total", "result=\"miss\"", s.lookups_miss);
  line("larder_kv_reused_tokens_total", "tier=\"ram\"", s.reused_tokens_ram);
  line("larder_kv_reused_tokens_total", "tier=\"ssd\"", s.reused_tokens_ssd);
  line("larder_kv_reused_tokens_total", "tier=\"remote\"", s.reused_tokens_remote);
  for (const auto& [reason, n] : s.miss_reasons) line("larder_kv_miss_total", "reason=\"" + reason + "\"", n);
  for (const auto& [kind, n] : s.checkpoints_stored) line("larder_kv_checkpoints_total", "kind=\"" + kind + "\"", n);
  for (const auto& [kind, n] : s.checkpoint_hits) line("larder_kv_checkpoint_hits_total", "kind=\"" + kind + "\"", n);
  line("larder_kv_evictions_total", "tier=\"ram\"", s.ram.evictions);
  line("larder_kv_evictions_total", "tier=\"ssd\"", s.ssd.evictions);
  line("larder_kv_spills_total", "outcome=\"written\"", s.queue.written);
  line("larder_kv_spills_total", "outcome=\"dropped\"", s.queue.dropped);
  line("larder_kv_spills_total", "outcome=\"failed\"", s.queue.failed);
  line("larder_kv_restores_total", "outcome=\"ok\"", s.ssd.restores);
  line("larder_kv_restores_total", "outcome=\"failed\"", s.ssd.restore_failures);
  line("larder_kv_demotions_total", "", s.ram.demotions);
  line("larder_kv_queue_bytes", "", s.queue.queued_bytes);
  line("larder_kv_dirty_keys", "", s.dirty_keys);
  line("larder_kv_longest_durable_prefix_tokens", "", static_cast<unsigned long long>(s.longest_durable_prefix_tokens));
  // By namespace (issue 45); the label set is bounded by NsLabels (see kv_store.h).
  for (const LabelledNs& l : labelled_namespaces(s, labels)) {
    const std::string ns = "namespace=\"" + prometheus_label_escape(l.label) + "\"";
    line("larder_kv_namespace_entries", ns + ",tier=\"ram\"", l.st.ram_entries);
    line("larder_kv_namespace_entries", ns + ",tier=\"ssd\"", l.st.ssd_entries);
    line("larder_kv_namespace_bytes", ns + ",tier=\"ram\"", l.st.ram_bytes);
    line("larder_kv_namespace_bytes", ns + ",tier=\"mapped\"", l.st.ram_mapped_bytes);
    line("larder_kv_namespace_bytes", ns + ",tier=\"ssd\"", l.st.ssd_bytes);
    line("larder_kv_namespace_lookups_total", ns + ",result=\"hit\"", l.st.hits);
    line("larder_kv_namespace_lookups_total", ns + ",result=\"miss\"", l.st.misses);
    line("larder_kv_namespace_reused_tokens_total", ns, l.st.reused_tokens);
  }
  if (s.remote_enabled) {
    // The remote tier (issue 46): per-tier hits, misses, bytes, latencies, timeouts and errors.
    const RemoteStats& r = s.remote;
    line("larder_kv_remote_connected", "", r.connected ? 1 : 0);
    line("larder_kv_remote_lookups_total", "result=\"hit\"", r.hits);
    line("larder_kv_remote_lookups_total", "result=\"miss\"", r.misses);
    line("larder_kv_remote_lookups_total", "result=\"skipped\"", r.skipped);
    line("larder_kv_remote_chunks_total", "op=\"read\"", r.chunks_read);
    line("larder_kv_remote_chunks_total", "op=\"written\"", r.chunks_written);
    line("larder_kv_remote_chunks_total", "op=\"present\"", r.chunks_present);
    line("larder_kv_remote_bytes_total", "op=\"read\"", r.bytes_read);
    line("larder_kv_remote_bytes_total", "op=\"written\"", r.bytes_written);
    line("larder_kv_remote_writes_total", "outcome=\"ok\"", r.writes);
    line("larder_kv_remote_writes_total", "outcome=\"failed\"", r.write_failures);
    line("larder_kv_remote_errors_total", "kind=\"timeout\"", r.timeouts);
    line("larder_kv_remote_errors_total", "kind=\"error\"", r.errors);
    line("larder_kv_remote_errors_total", "kind=\"down\"", r.down);
    line("larder_kv_remote_errors_total", "kind=\"corrupt\"", r.corrupt);
    line("larder_kv_remote_errors_total", "kind=\"incompatible\"", r.incompatible);
    line("larder_kv_remote_reconnects_total", "", r.reconnects);
    // The remote write queue (remote_queue.h): entries written, failed, dropped oldest-first
    // when over --kv-remote-queue, skipped (already written); its bytes; time paced while busy.
    const RemoteQueueStats& q = s.remote_queue;
    line("larder_kv_remote_queue_bytes", "", q.queued_bytes);
    line("larder_kv_remote_queue_items", "", q.queued_items);
    line("larder_kv_remote_queue_total", "outcome=\"written\"", q.written);
    line("larder_kv_remote_queue_total", "outcome=\"failed\"", q.failed);
    line("larder_kv_remote_queue_total", "outcome=\"dropped\"", q.dropped);
    line("larder_kv_remote_queue_total", "outcome=\"skipped\"", q.skipped);
    o += strfmt("larder_kv_remote_queue_paced_seconds_total %g\n", q.paced_s);
    for (const auto& [op, h] : {std::pair<const char*, const RemoteLatency*>{"read", &r.read_latency},
                                std::pair<const char*, const RemoteLatency*>{"write", &r.write_latency}}) {
      for (size_t i = 0; i < kRemoteLatencyBounds.size(); ++i) {
        o += strfmt("larder_kv_remote_seconds_bucket{op=\"%s\",le=\"%g\"} %llu\n", op, kRemoteLatencyBounds[i],
                    static_cast<unsigned long long>(h->buckets[i]));
      }
      o += strfmt("larder_kv_remote_seconds_bucket{op=\"%s\",le=\"+Inf\"} %llu\n", op,
                  static_cast<unsigned long long>(h->count));
      o += strfmt("larder_kv_remote_seconds_sum{op=\"%s\"} %g\n", op, h->sum);
      o += strfmt("larder_kv_remote_seconds_count{op=\"%s\"} %llu\n", op, static_cast<unsigned long long>(h->count));
    }
  }
  return o;
}

}  // namespace larder::memory
