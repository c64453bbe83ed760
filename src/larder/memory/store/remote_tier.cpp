#include "larder/memory/store/remote_tier.h"

#include <hiredis/hiredis.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>

#include <xxhash.h>

#include "larder/core/log.h"

namespace larder::memory {

namespace {

constexpr char kRecipe[] = "larder-kv-remote/1";
constexpr int kBackoffFirstMs = 100, kBackoffMaxMs = 2000;
constexpr size_t kWriteBatch = 8;  // values per pipelined SET round trip (bounds transient memory)

// hiredis sends with write(2), so a command on a connection whose server has gone (killed,
// restarted: the normal way a stale connection is found) raises SIGPIPE, whose default action
// ends the whole process. For the duration of a round trip the calling thread blocks SIGPIPE
// and discards one that the round trip raised, so the failure is only EPIPE, handled like any
// error (reconnect). SIGPIPE from write(2) is thread-directed, so other threads are unaffected
// and the process-wide disposition is left alone.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    const int saved_errno = errno;
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    errno = saved_errno;
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

timeval to_timeval(int ms) {
  timeval tv{};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  return tv;
}

bool is_timeout(int err, int saved_errno, const char* errstr) {
  if (err != REDIS_ERR_IO) return false;
  if (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK || saved_errno == ETIMEDOUT || saved_errno == EINPROGRESS)
    return true;
  return errstr && (std::strstr(errstr, "temporarily unavailable") || std::strstr(errstr, "timed out"));
}

redisReply* as_reply(const std::shared_ptr<void>& p) { return static_cast<redisReply*>(p.get()); }

constexpr char kBoundaryPrefix[] = "larder:kv:1:b:";
constexpr char kIndexPrefix[] = "larder:kv:1:i:";
constexpr size_t kMaxBoundaryCandidates = 4;  // values fetched per lookup (each a whole entry)

// An exact-boundary checkpoint (an entry with ring / recurrent state or attachments, servable
// only at its own length) is one value: the whole entry. Its key hashes identity, ns and every
// token; its length is listed in an index set beside the chunk chain, under the key of the last
// full chunk below it (or a per-(identity, ns) root), so a lookup finds candidate lengths in
// the same round trip as the chunks.
std::string boundary_key(const std::string& identity_id, const std::string& ns, std::span<const TokenId> tokens) {
  return kBoundaryPrefix + entry_id(identity_id + "/" + ns, tokens);
}
std::string index_key(const std::string& identity_id, const std::string& ns, const std::vector<std::string>& chunk_keys,
                      size_t full_chunks) {
  if (full_chunks == 0) return kIndexPrefix + entry_id(identity_id + "/" + ns, {});
  return kIndexPrefix + chunk_keys[full_chunks - 1].substr(std::strlen("larder:kv:1:"));
}

// One warning per failure class per process: a dead Redis must not flood the log.
void warn_once(const std::string& cls, const std::string& msg) {
  static std::mutex mu;
  static std::vector<std::string> seen;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (std::find(seen.begin(), seen.end(), cls) != seen.end()) return;
    seen.push_back(cls);
  }
  LARDER_LOG_WARN("%s (further '%s' failures are counted in /metrics, not logged)", msg.c_str(), cls.c_str());
}

}  // namespace

struct RemoteTier::Conn {
  std::mutex mu;
  redisContext* ctx = nullptr;
  std::chrono::steady_clock::time_point retry_at{};
  int backoff_ms = 0;
  bool ever = false;
  ~Conn() {
    if (ctx) redisFree(ctx);
  }
  void drop() {
    if (ctx) redisFree(ctx);
    ctx = nullptr;
    backoff_ms = backoff_ms ? std::min(backoff_ms * 2, kBackoffMaxMs) : kBackoffFirstMs;
    retry_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(backoff_ms);
  }
};

void RemoteLatency::observe(double s) {
  for (size_t i = 0; i < kRemoteLatencyBounds.size(); ++i) {
    if (s <= kRemoteLatencyBounds[i]) ++buckets[i];
  }
  ++count;
  sum += s;
}

std::vector<std::string> remote_chunk_keys(const std::string& identity_id, const std::string& ns,
                                           int64_t chunk_tokens, std::span<const TokenId> tokens,
                                           size_t max_chunks) {
  std::vector<std::string> keys;
  if (chunk_tokens <= 0) return keys;
  const size_t n = std::min(tokens.size() / static_cast<size_t>(chunk_tokens), max_chunks);
  XXH128_hash_t prev{0, 0};
  const uint64_t ct = static_cast<uint64_t>(chunk_tokens);
  XXH3_state_t* s = XXH3_createState();
  for (size_t i = 0; i < n; ++i) {
    XXH3_128bits_reset(s);
    // Each field is length-prefixed so no two (identity, ns) pairs can produce the same stream.
    auto field = [&](const std::string& f) {
      const uint64_t len = f.size();
      XXH3_128bits_update(s, &len, sizeof len);
      XXH3_128bits_update(s, f.data(), f.size());
    };
    field(kRecipe);
    field(identity_id);
    field(ns);
    XXH3_128bits_update(s, &prev.high64, sizeof prev.high64);
    XXH3_128bits_update(s, &prev.low64, sizeof prev.low64);
    XXH3_128bits_update(s, &ct, sizeof ct);
    XXH3_128bits_update(s, tokens.data() + i * ct, ct * sizeof(TokenId));
    prev = XXH3_128bits_digest(s);
    keys.push_back("larder:kv:1:" + hex128(prev.high64, prev.low64));
  }
  XXH3_freeState(s);
  return keys;
}

Result<std::unique_ptr<RemoteTier>> RemoteTier::open(RemoteConfig config) {
  if (config.timeout_ms < 1 || config.timeout_ms > 60000)
    return invalid_argument("[kv-remote] --kv-remote-timeout-ms must be 1..60000");
  if (config.chunk_tokens < 1 || config.chunk_tokens > (1 << 20))
    return invalid_argument("[kv-remote] --kv-remote-chunk-tokens must be 1..1048576");
  return std::unique_ptr<RemoteTier>(new RemoteTier(std::move(config)));
}

RemoteTier::RemoteTier(RemoteConfig c)
    : cfg_(std::move(c)), identity_id_(identity_id(cfg_.identity)), read_(std::make_unique<Conn>()),
      write_(std::make_unique<Conn>()) {}

RemoteTier::~RemoteTier() = default;

void RemoteTier::count_failure(const std::string& reason) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  if (reason == "remote_timeout") ++st_.timeouts;
  else if (reason == "remote_down") ++st_.down;
  else if (reason == "remote_corrupt") ++st_.corrupt;
  else if (reason == "remote_incompatible") ++st_.incompatible;
  else ++st_.errors;
}

std::string RemoteTier::connect_locked(Conn& c) {
  if (c.ctx) return "";
  if (std::chrono::steady_clock::now() < c.retry_at) return "remote_down";
  const timeval tv = to_timeval(cfg_.timeout_ms);
  errno = 0;
  redisContext* ctx = cfg_.url.unix_socket ? redisConnectUnixWithTimeout(cfg_.url.path.c_str(), tv)
                                           : redisConnectWithTimeout(cfg_.url.host.c_str(), cfg_.url.port, tv);
  const int saved = errno;
  if (!ctx || ctx->err) {
    const bool timeout = ctx && is_timeout(ctx->err, saved, ctx->errstr);
    warn_once(timeout ? "connect_timeout" : "connect",
              strfmt("[kv-remote] cannot connect to %s: %s — serving with local prefill", cfg_.url.redacted().c_str(),
                     ctx ? ctx->errstr : "out of memory"));
    if (ctx) redisFree(ctx);
    c.drop();
    return timeout ? "remote_timeout" : "remote_error";
  }
  redisSetTimeout(ctx, tv);
  auto setup = [&](std::vector<std::string> args, const char* what) -> std::string {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    errno = 0;
    auto* r = static_cast<redisReply*>(redisCommandArgv(ctx, static_cast<int>(argv.size()), argv.data(), lens.data()));
    const int e = errno;
    std::string failure;
    if (!r) {
      failure = is_timeout(ctx->err, e, ctx->errstr) ? "remote_timeout" : "remote_error";
      warn_once(std::string("setup_") + what, strfmt("[kv-remote] %s on %s failed: %s", what,
                                                     cfg_.url.redacted().c_str(), ctx->errstr));
    } else if (r->type == REDIS_REPLY_ERROR) {
      failure = "remote_error";
      // The server's message, never the password (AUTH's reply does not echo it).
      warn_once(std::string("setup_") + what, strfmt("[kv-remote] %s on %s refused: %.*s", what,
                                                     cfg_.url.redacted().c_str(), static_cast<int>(r->len), r->str));
    }
    if (r) freeReplyObject(r);
    return failure;
  };
  std::string failure;
  if (!cfg_.url.password.empty()) {
    failure = cfg_.url.user.empty() ? setup({"AUTH", cfg_.url.password}, "AUTH")
                                    : setup({"AUTH", cfg_.url.user, cfg_.url.password}, "AUTH");
  }
  if (failure.empty() && cfg_.url.db != 0) failure = setup({"SELECT", std::to_string(cfg_.url.db)}, "SELECT");
  if (!failure.empty()) {
    redisFree(ctx);
    c.drop();
    return failure;
  }
  c.ctx = ctx;
  c.backoff_ms = 0;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++st_.connects;
    if (c.ever) ++st_.reconnects;
  }
  if (c.ever) LARDER_LOG_INFO("[kv-remote] reconnected to %s", cfg_.url.redacted().c_str());
  c.ever = true;
  return "";
}

std::string RemoteTier::roundtrip(Conn& c, const std::vector<std::vector<std::string_view>>& cmds,
                                  std::vector<std::shared_ptr<void>>* replies, bool write) {
  std::lock_guard<std::mutex> lock(c.mu);
  const SigpipeGuard no_sigpipe;  // connect (AUTH, SELECT) and every command below
  std::string failure;
  // A connection idle across a Redis restart is found dead only by using it: then, once, a
  // fresh connection is made and the commands (all idempotent: MGET, EXISTS, SET NX, DEL) are
  // sent again. A timeout is never retried (that would double the wait).
  for (int attempt = 0; attempt < 2; ++attempt) {
    replies->clear();
    const bool reused = c.ctx != nullptr;
    failure = connect_locked(c);
    if (!failure.empty()) break;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& cmd : cmds) {
      argv.clear();
      lens.clear();
      for (std::string_view a : cmd) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      if (redisAppendCommandArgv(c.ctx, static_cast<int>(argv.size()), argv.data(), lens.data()) != REDIS_OK) {
        failure = "remote_error";
        break;
      }
    }
    for (size_t i = 0; failure.empty() && i < cmds.size(); ++i) {
      void* r = nullptr;
      errno = 0;
      if (redisGetReply(c.ctx, &r) != REDIS_OK || !r) {
        const int e = errno;
        failure = is_timeout(c.ctx->err, e, c.ctx->errstr) ? "remote_timeout" : "remote_error";
        if (failure == "remote_error" && reused && attempt == 0) break;  // stale: retried below
        warn_once(failure, strfmt("[kv-remote] %s: %s (%s) — falling back to local prefill",
                                  cfg_.url.redacted().c_str(), c.ctx->errstr, failure.c_str()));
        break;
      }
      replies->emplace_back(r, freeReplyObject);
    }
    if (failure.empty()) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::lock_guard<std::mutex> sl(stats_mu_);
      (write ? st_.write_latency : st_.read_latency).observe(s);
      return "";
    }
    // A half-read pipeline leaves the stream unusable: drop it.
    replies->clear();
    if (failure == "remote_error" && reused && attempt == 0) {
      redisFree(c.ctx);
      c.ctx = nullptr;  // no backoff: reconnect now
      failure.clear();
      continue;
    }
    c.drop();  // reconnect after the backoff
    break;
  }
  count_failure(failure);
  return failure;
}

void RemoteTier::Stash::clear() {
  failure.clear();
  ns.clear();
  tokens.clear();
  keys.clear();
  values.clear();
  reply.reset();
}

std::optional<ColdFind> RemoteTier::find(std::span<const TokenId> prompt, const std::string& ns,
                                         int64_t longer_than) {
  return find_into(stash_, prompt, ns, longer_than);
}

std::shared_ptr<const Entry> RemoteTier::restore(const ColdFind& found, std::string* reason) {
  return restore_from(stash_, found, reason, nullptr);
}

RemoteFetch RemoteTier::fetch(std::span<const TokenId> prompt, const std::string& ns, int64_t longer_than) {
  Stash st;
  RemoteFetch out;
  std::optional<ColdFind> f = find_into(st, prompt, ns, longer_than);
  out.failure = st.failure;  // e.g. the boundary candidates failed while chunks below still serve
  if (!f) return out;
  std::string reason;
  size_t valid = 0;
  out.entry = restore_from(st, *f, &reason, &valid);
  if (!out.entry) {
    out.failure = reason.empty() ? "remote_error" : reason;
    return out;
  }
  out.found = *f;
  if (!reason.empty()) {
    // A later chunk was unusable: the leading valid chunks are still a prefix of the prompt.
    out.found.prefix_len = std::min<int64_t>(f->prefix_len, static_cast<int64_t>(out.entry->tokens.size()));
    out.failure = reason;
    if (out.found.prefix_len <= longer_than) out.entry.reset();  // no better than what is local
  }
  return out;
}

std::optional<ColdFind> RemoteTier::find_into(Stash& st, std::span<const TokenId> prompt, const std::string& ns,
                                              int64_t longer_than) {
  st.clear();
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t C = cfg_.chunk_tokens;
  const int64_t max_chunks = n / C;
  // Nothing to gain (RAM / SSD already serve len - 1, the most any hit may reuse): no round trip.
  if (n < 2 || n - 1 <= longer_than) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++st_.skipped;
    return std::nullopt;
  }
  // One round trip: the prompt's chunks (MGET) and the boundary index sets along its chain.
  const int64_t max_index = (n - 1) / C;  // a boundary L <= n - 1 sits under chunk floor(L / C)
  std::vector<std::string> keys =
      remote_chunk_keys(identity_id_, ns, C, prompt, static_cast<size_t>(std::max(max_chunks, max_index)));
  std::vector<std::vector<std::string_view>> cmds;
  std::vector<std::string> index_keys;
  for (int64_t j = 0; j <= max_index; ++j) index_keys.push_back(index_key(identity_id_, ns, keys, static_cast<size_t>(j)));
  cmds.push_back({"MGET"});
  for (int64_t j = 0; j < max_chunks; ++j) cmds[0].push_back(keys[static_cast<size_t>(j)]);
  if (max_chunks == 0) cmds[0] = {"ECHO", ""};  // keeps reply 0 in place
  for (const std::string& ik : index_keys) cmds.push_back({"SMEMBERS", ik});
  std::vector<std::shared_ptr<void>> replies;
  std::string failure = roundtrip(*read_, cmds, &replies, false);
  if (!failure.empty()) {
    st.failure = failure;
    return std::nullopt;
  }
  redisReply* r = as_reply(replies[0]);
  size_t k = 0;
  if (max_chunks > 0) {
    if (r->type != REDIS_REPLY_ARRAY) {
      st.failure = "remote_error";
      count_failure(st.failure);
      return std::nullopt;
    }
    while (k < r->elements && k < static_cast<size_t>(max_chunks) && r->element[k]->type == REDIS_REPLY_STRING) ++k;
  }
  const int64_t chunk_p = std::min(static_cast<int64_t>(k) * C, n - 1);
  // Boundary candidates longer than what the chunks (and RAM / SSD) give, longest first.
  std::vector<int64_t> cands;
  for (size_t j = 0; j < index_keys.size(); ++j) {
    const redisReply* ir = as_reply(replies[j + 1]);
    if (ir->type != REDIS_REPLY_ARRAY) continue;
    for (size_t e = 0; e < ir->elements; ++e) {
      if (ir->element[e]->type != REDIS_REPLY_STRING) continue;
      const std::string v(ir->element[e]->str, ir->element[e]->len);
      char* end = nullptr;
      const long long L = std::strtoll(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || L < 1 || L > n - 1 || L / C != static_cast<long long>(j)) continue;
      if (L > std::max<int64_t>(chunk_p, longer_than)) cands.push_back(L);
    }
  }
  std::sort(cands.begin(), cands.end(), std::greater<>());
  cands.erase(std::unique(cands.begin(), cands.end()), cands.end());
  if (cands.size() > kMaxBoundaryCandidates) cands.resize(kMaxBoundaryCandidates);
  if (!cands.empty()) {
    std::vector<std::string> bkeys;
    std::vector<std::string_view> mget = {"MGET"};
    for (int64_t L : cands) bkeys.push_back(boundary_key(identity_id_, ns, prompt.first(static_cast<size_t>(L))));
    for (const std::string& b : bkeys) mget.push_back(b);
    std::vector<std::shared_ptr<void>> breplies;
    failure = roundtrip(*read_, {mget}, &breplies, false);
    if (failure.empty() && as_reply(breplies[0])->type == REDIS_REPLY_ARRAY) {
      const redisReply* br = as_reply(breplies[0]);
      for (size_t c = 0; c < cands.size() && c < br->elements; ++c) {
        if (br->element[c]->type != REDIS_REPLY_STRING) continue;
        {
          std::lock_guard<std::mutex> lock(stats_mu_);
          ++st_.lookups;
        }
        st.reply = breplies[0];
        st.keys.push_back(bkeys[c]);
        st.values.emplace_back(br->element[c]->str, br->element[c]->len);
        st.ns = ns;
        st.tokens.assign(prompt.begin(), prompt.begin() + cands[c]);
        ColdFind f;
        f.prefix_len = cands[c];
        f.handle = "remote-boundary";
        f.tier = Tier::kRemote;
        return f;
      }
    } else if (!failure.empty()) {
      st.failure = failure;  // the chunks below may still serve
    }
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++st_.lookups;
    if (k == 0) ++st_.misses;
  }
  if (k == 0 || chunk_p <= longer_than) return std::nullopt;
  st.reply = replies[0];
  for (size_t j = 0; j < k; ++j) {
    st.keys.push_back(keys[j]);
    st.values.emplace_back(r->element[j]->str, r->element[j]->len);
  }
  st.ns = ns;
  st.tokens.assign(prompt.begin(), prompt.begin() + static_cast<int64_t>(k) * C);
  ColdFind f;
  f.prefix_len = chunk_p;
  f.handle = "remote:" + std::to_string(k);
  f.tier = Tier::kRemote;
  return f;
}

int64_t RemoteTier::peek(std::span<const TokenId> prompt, const std::string& ns, std::string* failure) {
  failure->clear();
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t C = cfg_.chunk_tokens;
  if (n < 2) return 0;
  const int64_t max_chunks = n / C;
  const int64_t max_index = (n - 1) / C;
  std::vector<std::string> keys =
      remote_chunk_keys(identity_id_, ns, C, prompt, static_cast<size_t>(std::max(max_chunks, max_index)));
  std::vector<std::string> index_keys;
  for (int64_t j = 0; j <= max_index; ++j) index_keys.push_back(index_key(identity_id_, ns, keys, static_cast<size_t>(j)));
  // One round trip: EXISTS per chunk (its own reply each, so the leading run is known) and the
  // boundary index sets along the chain, as find reads them.
  std::vector<std::vector<std::string_view>> cmds;
  for (int64_t j = 0; j < max_chunks; ++j) cmds.push_back({"EXISTS", keys[static_cast<size_t>(j)]});
  for (const std::string& ik : index_keys) cmds.push_back({"SMEMBERS", ik});
  std::vector<std::shared_ptr<void>> replies;
  *failure = roundtrip(*read_, cmds, &replies, false);
  if (!failure->empty()) return 0;
  int64_t k = 0;
  while (k < max_chunks) {
    const redisReply* r = as_reply(replies[static_cast<size_t>(k)]);
    if (r->type != REDIS_REPLY_INTEGER || r->integer != 1) break;
    ++k;
  }
  const int64_t chunk_p = std::min(k * C, n - 1);
  std::vector<int64_t> cands;
  for (size_t j = 0; j < index_keys.size(); ++j) {
    const redisReply* ir = as_reply(replies[static_cast<size_t>(max_chunks) + j]);
    if (ir->type != REDIS_REPLY_ARRAY) continue;
    for (size_t e = 0; e < ir->elements; ++e) {
      if (ir->element[e]->type != REDIS_REPLY_STRING) continue;
      const std::string v(ir->element[e]->str, ir->element[e]->len);
      char* end = nullptr;
      const long long L = std::strtoll(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || L < 1 || L > n - 1 || L / C != static_cast<long long>(j)) continue;
      if (L > chunk_p) cands.push_back(L);
    }
  }
  std::sort(cands.begin(), cands.end(), std::greater<>());
  cands.erase(std::unique(cands.begin(), cands.end()), cands.end());
  if (cands.size() > kMaxBoundaryCandidates) cands.resize(kMaxBoundaryCandidates);
  if (cands.empty()) return chunk_p;
  std::vector<std::string> bkeys;
  for (int64_t L : cands) bkeys.push_back(boundary_key(identity_id_, ns, prompt.first(static_cast<size_t>(L))));
  std::vector<std::vector<std::string_view>> exists;
  for (const std::string& b : bkeys) exists.push_back({"EXISTS", b});
  std::vector<std::shared_ptr<void>> breplies;
  *failure = roundtrip(*read_, exists, &breplies, false);
  if (!failure->empty()) return chunk_p;  // what the first round trip learnt still holds
  for (size_t c = 0; c < cands.size() && c < breplies.size(); ++c) {
    const redisReply* r = as_reply(breplies[c]);
    if (r->type == REDIS_REPLY_INTEGER && r->integer == 1) return cands[c];
  }
  return chunk_p;
}

std::shared_ptr<const Entry> RemoteTier::restore_from(Stash& st, const ColdFind& found, std::string* reason,
                                                      size_t* partial) {
  const size_t k = st.values.size();
  const int64_t C = cfg_.chunk_tokens;
  // Counts, logs and deletes a bad value (best effort: it must not be fetched again, and equal
  // keys would never rewrite it); true when the chunks before it are to be served instead.
  auto bad = [&](const std::string& why, size_t j, const std::string& detail) {
    count_failure(why);
    if (reason) *reason = why;
    const bool keep_leading = partial && j > 0 && found.handle != "remote-boundary";
    LARDER_LOG_WARN("[kv-remote] chunk %zu (%s) is unusable: %s — deleted, %s", j, st.keys[j].c_str(), detail.c_str(),
                    keep_leading ? "serving the chunks before it" : "prefilling locally");
    std::vector<std::string_view> del = {"DEL", st.keys[j]};
    std::vector<std::shared_ptr<void>> ignored;
    roundtrip(*read_, {del}, &ignored, true);
    return keep_leading;
  };
  auto fail = [&](const std::string& why, size_t j, const std::string& detail) -> std::shared_ptr<const Entry> {
    bad(why, j, detail);
    st.reply.reset();
    st.values.clear();
    return nullptr;
  };
  if (found.handle == "remote-boundary" && k == 1) {
    Result<std::shared_ptr<const Entry>> d =
        decode_lkv(st.values[0], &cfg_.identity, cfg_.verify, "remote checkpoint " + st.keys[0]);
    if (!d.is_ok()) {
      return fail(d.status().code() == StatusCode::kIncompatible ? "remote_incompatible" : "remote_corrupt", 0,
                  d.status().message());
    }
    std::shared_ptr<const Entry> e = std::move(d).value();
    if (e->tokens != st.tokens || e->ns != st.ns ||
        static_cast<int64_t>(e->tokens.size()) != found.prefix_len) {
      return fail("remote_corrupt", 0, "its metadata does not describe this checkpoint");
    }
    if (!cfg_.expected_signature.empty() && e->signature != cfg_.expected_signature) {
      return fail("remote_incompatible", 0, "storage signature '" + e->signature + "'");
    }
    const uint64_t bytes = st.values[0].size();
    st.reply.reset();
    st.values.clear();
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++st_.hits;
    ++st_.chunks_read;
    st_.bytes_read += bytes;
    return e;
  }
  if (k == 0 || found.tier != Tier::kRemote || found.prefix_len > static_cast<int64_t>(k) * C) {
    if (reason) *reason = "remote_error";
    return nullptr;
  }
  std::vector<KvBlock::Piece> pieces;
  KvLayout layout;
  std::string signature;
  uint64_t bytes = 0;
  size_t used = k;  // chunks served: fewer when a later one is bad and `partial` allows it
  for (size_t j = 0; j < k; ++j) {
    // Why chunk j cannot be used, or "" (then its rows join the entry).
    std::string why, detail;
    Result<std::shared_ptr<const Entry>> d =
        decode_lkv(st.values[j], &cfg_.identity, cfg_.verify, "remote chunk " + st.keys[j]);
    const int64_t start = static_cast<int64_t>(j) * C;
    if (!d.is_ok()) {
      why = d.status().code() == StatusCode::kIncompatible ? "remote_incompatible" : "remote_corrupt";
      detail = d.status().message();
    } else {
      const Entry& e = **d;
      // The key is a hash: the metadata beside the rows must say it is exactly this chunk.
      const bool same_tokens = static_cast<int64_t>(e.tokens.size()) == C &&
                               std::equal(e.tokens.begin(), e.tokens.end(), st.tokens.begin() + start);
      if (!same_tokens || e.ns != st.ns || e.label != "chunk:" + std::to_string(start) || !e.kv ||
          !e.layers.empty() || !e.attachments.empty()) {
        why = "remote_corrupt";
        detail = "its metadata does not describe this chunk";
      } else if (!cfg_.expected_signature.empty() && e.signature != cfg_.expected_signature) {
        why = "remote_incompatible";
        detail = "storage signature '" + e.signature + "'";
      } else if (j > 0 && (!(e.kv->layout() == layout) || e.signature != signature)) {
        why = "remote_incompatible";
        detail = "its layout differs from chunk 0";
      }
    }
    if (!why.empty()) {
      if (!bad(why, j, detail)) {
        st.reply.reset();
        st.values.clear();
        return nullptr;
      }
      used = j;  // a prefix of a prefix is still a prefix: chunks [0, j) serve
      break;
    }
    const Entry& e = **d;
    bytes += st.values[j].size();
    if (j == 0) {
      layout = e.kv->layout();
      signature = e.signature;
    }
    for (const KvBlock::Piece& pc : e.kv->pieces()) {
      KvBlock::Piece q = pc;
      q.start += start;
      pieces.push_back(std::move(q));
    }
  }
  if (partial) *partial = used;
  auto e = std::make_shared<Entry>();
  e->tokens.assign(st.tokens.begin(), st.tokens.begin() + static_cast<int64_t>(used) * C);
  e->ns = st.ns;
  e->kv = std::make_shared<KvBlock>(layout, std::move(pieces));
  e->trimmable = true;
  e->floor = 0;
  e->label = "full";
  e->signature = signature;
  st.reply.reset();
  st.values.clear();
  std::lock_guard<std::mutex> lock(stats_mu_);
  ++st_.hits;
  st_.chunks_read += used;
  st_.bytes_read += bytes;
  return e;
}

bool RemoteTier::store(const Entry& entry, const std::function<bool(uint64_t)>& after_batch) {
  const int64_t C = cfg_.chunk_tokens;
  if (!entry.layers.empty() || !entry.attachments.empty() || !entry.kv) {
    // Sliding-window rings, recurrent state, attachments: the entry is stored whole, as an
    // exact-boundary checkpoint (a chunk of plain KV alone could not seed such a model).
    if (entry.tokens.empty()) return true;
    const std::vector<std::string> keys = remote_chunk_keys(identity_id_, entry.ns, C, entry.tokens);
    const std::string bkey = boundary_key(identity_id_, entry.ns, entry.tokens);
    const std::string ikey = index_key(identity_id_, entry.ns, keys, keys.size());
    std::vector<std::shared_ptr<void>> replies;
    auto failed = [&] {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++st_.write_failures;
      return false;
    };
    if (!roundtrip(*write_, {{"EXISTS", bkey}}, &replies, true).empty()) return failed();
    const std::string len = std::to_string(entry.tokens.size());
    if (as_reply(replies[0])->type == REDIS_REPLY_INTEGER && as_reply(replies[0])->integer > 0) {
      // Present: refresh the index entry (it may have been evicted on its own).
      if (!roundtrip(*write_, {{"SADD", ikey, len}}, &replies, true).empty()) return failed();
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++st_.chunks_present;
      ++st_.writes;
      return true;
    }
    Entry whole = entry;
    whole.created_ms = 1;  // content-only bytes, as for chunks
    Result<std::string> v = encode_lkv(whole, cfg_.identity);
    if (!v.is_ok()) {
      warn_once("encode", "[kv-remote] cannot encode a checkpoint: " + v.status().to_string());
      return failed();
    }
    // Value first, then its index entry: a reader never finds a length whose value was not sent.
    if (!roundtrip(*write_, {{"SET", bkey, *v, "NX"}, {"SADD", ikey, len}}, &replies, true).empty()) return failed();
    const redisReply* sr = as_reply(replies[0]);
    if (sr->type == REDIS_REPLY_ERROR) {
      warn_once("set_refused", strfmt("[kv-remote] SET refused: %.*s", static_cast<int>(sr->len), sr->str));
      count_failure("remote_error");
      return failed();
    }
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      if (sr->type == REDIS_REPLY_STATUS) {
        ++st_.chunks_written;
        st_.bytes_written += v->size();
      } else {
        ++st_.chunks_present;
      }
      ++st_.writes;
    }
    if (after_batch) after_batch(v->size());  // the value is stored: pacing only delays the next
    return true;
  }
  std::vector<std::string> keys = remote_chunk_keys(identity_id_, entry.ns, C, entry.tokens);
  if (keys.empty()) return true;  // shorter than one chunk: nothing a replica could reuse
  // Which chunks exist already (one small round trip), so present ones are not even encoded.
  std::vector<std::vector<std::string_view>> exists;
  for (const std::string& k : keys) exists.push_back({"EXISTS", k});
  std::vector<std::shared_ptr<void>> replies;
  auto failed = [&] {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++st_.write_failures;
    return false;
  };
  if (!roundtrip(*write_, exists, &replies, true).empty()) return failed();
  std::vector<size_t> missing;
  uint64_t present = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const redisReply* r = as_reply(replies[i]);
    if (r->type == REDIS_REPLY_INTEGER && r->integer > 0) ++present; else missing.push_back(i);
  }
  const KvLayout& layout = entry.kv->layout();
  for (size_t b = 0; b < missing.size(); b += kWriteBatch) {
    std::vector<std::string> values;
    std::vector<std::vector<std::string_view>> sets;
    const size_t end = std::min(missing.size(), b + kWriteBatch);
    values.reserve(end - b);
    for (size_t m = b; m < end; ++m) {
      const int64_t lo = static_cast<int64_t>(missing[m]) * C, hi = lo + C;
      // The chunk's rows as pieces of the entry's segments (no copy until encoding).
      std::vector<KvBlock::Piece> pieces;
      for (const KvBlock::Piece& pc : entry.kv->pieces()) {
        const int64_t a = std::max(lo, pc.start), z = std::min(hi, pc.start + pc.len);
        if (a >= z) continue;
        pieces.push_back({pc.seg, pc.seg_row + (a - pc.start), a - lo, z - a});
      }
      Entry chunk;
      chunk.tokens.assign(entry.tokens.begin() + lo, entry.tokens.begin() + hi);
      chunk.ns = entry.ns;
      chunk.kv = std::make_shared<KvBlock>(layout, std::move(pieces));
      chunk.label = "chunk:" + std::to_string(lo);
      chunk.signature = entry.signature;
      chunk.created_ms = 1;  // content-only values: replicas writing the same chunk write the same bytes
      Result<std::string> v = encode_lkv(chunk, cfg_.identity);
      if (!v.is_ok()) {
        warn_once("encode", "[kv-remote] cannot encode a chunk: " + v.status().to_string());
        return failed();
      }
      values.push_back(std::move(v).value());
    }
    for (size_t m = b; m < end; ++m) sets.push_back({"SET", keys[missing[m]], values[m - b], "NX"});
    if (!roundtrip(*write_, sets, &replies, true).empty()) return failed();
    uint64_t written = 0, bytes = 0, nx = 0;
    for (size_t i = 0; i < replies.size(); ++i) {
      const redisReply* r = as_reply(replies[i]);
      if (r->type == REDIS_REPLY_STATUS) {
        ++written;
        bytes += values[i].size();
      } else if (r->type == REDIS_REPLY_NIL) {
        ++nx;  // another replica wrote it meanwhile
      } else {
        // e.g. OOM under maxmemory with noeviction: a refused write is a future miss, no error.
        if (r->type == REDIS_REPLY_ERROR)
          warn_once("set_refused", strfmt("[kv-remote] SET refused: %.*s", static_cast<int>(r->len), r->str));
        count_failure("remote_error");
        return failed();
      }
    }
    uint64_t sent = 0;
    for (const std::string& v : values) sent += v.size();
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      st_.chunks_written += written;
      st_.chunks_present += nx;
      st_.bytes_written += bytes;
    }
    sets.clear();
    values.clear();  // not held while paced
    replies.clear();
    // The write queue's budget: the next batch waits its turn (on shutdown the rest is dropped).
    if (after_batch && !after_batch(sent) && end < missing.size()) return failed();
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  st_.chunks_present += present;
  ++st_.writes;
  return true;
}

RemoteStats RemoteTier::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  RemoteStats s = st_;
  {
    // Connected = the lookup connection is up (a try_lock: stats never wait behind a command).
    std::unique_lock<std::mutex> l(read_->mu, std::try_to_lock);
    s.connected = l.owns_lock() ? read_->ctx != nullptr : true;
  }
  return s;
}

}  // namespace larder::memory
