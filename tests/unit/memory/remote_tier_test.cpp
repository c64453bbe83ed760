// remote_tier_test.cpp — the remote KV tier (issue 46): URL parsing (strict, password never
// shown), chained chunk keys, LKV1 values in memory, bounded failure against dead and silent
// endpoints, and a round trip through a real redis-server when one is installed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "kv_test_util.h"
#include "larder/memory/store/kv_store.h"
#include "larder/memory/store/lkv_format.h"
#include "larder/memory/store/remote_queue.h"
#include "larder/memory/store/remote_tier.h"
#include "larder/memory/store/remote_url.h"

namespace larder::memory {
namespace {

using testing::cat;
using testing::kv_matches;
using testing::prefilled;
using testing::prefix_matches;
using testing::seq;
using testing::TempDir;

StoreIdentity ident(const std::string& w = "weights-a") {
  StoreIdentity id;
  id.weights_id = w;
  id.config_fp = "cfg";
  id.kv_scheme = "f32";
  id.tokenizer_fp = "tok";
  id.numerics_id = "cpu-avx2-v1";
  return id;
}

std::shared_ptr<const Entry> entry_of(const std::vector<int32_t>& t, const std::string& ns = "base") {
  return make_entry(t, prefilled(t), ns, "full").value();
}

// ---- URL ----------------------------------------------------------------------------------

TEST(RemoteUrl, ParsesTheGrammar) {
  auto a = parse_remote_url("redis://127.0.0.1");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_FALSE(a->unix_socket);
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 6379);
  EXPECT_EQ(a->db, 0);
  EXPECT_TRUE(a->password.empty());

  auto b = parse_remote_url("redis://:s3cret@cache.internal:6380/2");
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b->host, "cache.internal");
  EXPECT_EQ(b->port, 6380);
  EXPECT_EQ(b->db, 2);
  EXPECT_EQ(b->password, "s3cret");
  EXPECT_TRUE(b->user.empty());

  auto c = parse_remote_url("redis://larder:p%40ss%3Aw@[::1]:7000/");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->host, "::1");
  EXPECT_EQ(c->port, 7000);
  EXPECT_EQ(c->user, "larder");
  EXPECT_EQ(c->password, "p@ss:w");

  auto d = parse_remote_url("redis+unix:///tmp/x/redis.sock?db=3");
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_TRUE(d->unix_socket);
  EXPECT_EQ(d->path, "/tmp/x/redis.sock");
  EXPECT_EQ(d->db, 3);

  auto e = parse_remote_url("redis+unix://:pw@/run/redis.sock");
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  EXPECT_EQ(e->path, "/run/redis.sock");
  EXPECT_EQ(e->password, "pw");

  auto f = parse_remote_url("redis://hunter2@h");  // redis-cli's form: a password alone
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(f->password, "hunter2");
}

TEST(RemoteUrl, RejectsBadInputNamingThePartNeverThePassword) {
  const char* bad[] = {
      "",                                   // empty
      "http://h:6379",                      // scheme
      "redis:/h",                           // scheme form
      "redis://",                           // host missing
      "redis://:s3cret@",                   // host missing after auth
      "redis://h:0",                        // port range
      "redis://h:65536",                    // port range
      "redis://h:-1",                       // sign
      "redis://h:63 79",                    // space
      "redis://h:6379x",                    // junk in port
      "redis://h/abc",                      // db not a number
      "redis://h/-1",                       // db sign
      "redis://h?db=1",                     // query on tcp
      "redis://h#frag",                     // fragment
      "redis://h%20x",                      // bad host char
      "redis://[::1",                       // unclosed bracket
      "redis://[zz::1]",                    // not hex
      "redis://:s3cret%zz@h",               // bad escape in the password
      "redis://:s3cret%0a@h",               // control char in the password
      "redis+unix://relative/path",         // not absolute
      "redis+unix:///tmp/s?db=x",           // bad db
      "redis+unix:///tmp/s?foo=1",          // unknown parameter
      "redis://h\n",                        // control character
  };
  for (const char* u : bad) {
    auto r = parse_remote_url(u);
    EXPECT_FALSE(r.is_ok()) << "accepted: " << u;
    if (!r.is_ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << u;
      EXPECT_EQ(r.status().message().find("s3cret"), std::string::npos) << r.status().message();
      EXPECT_NE(r.status().message().find("[kv-remote] invalid URL: "), std::string::npos);
    }
  }
  EXPECT_FALSE(parse_remote_url(std::string(5000, 'a')).is_ok());
  EXPECT_FALSE(parse_remote_url("redis+unix:///" + std::string(200, 'a')).is_ok());  // sun_path limit
}

TEST(RemoteUrl, RedactedNeverShowsThePasswordAndEnvSuppliesOne) {
  auto a = parse_remote_url("redis://user:s3cret@h:1/4");
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->redacted(), "redis://user:***@h:1/4");
  auto b = parse_remote_url("redis+unix://:s3cret@/tmp/r.sock?db=2");
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->redacted(), "redis+unix://:***@/tmp/r.sock?db=2");
  // The environment's password fills in only when the URL has none.
  auto c = parse_remote_url("redis://h", "fromenv");
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->password, "fromenv");
  EXPECT_EQ(c->redacted(), "redis://:***@h:6379");
  auto d = parse_remote_url("redis://:inurl@h", "fromenv");
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(d->password, "inurl");
  EXPECT_EQ(parse_remote_url("redis://[::1]:7")->redacted(), "redis://[::1]:7");
}

// ---- keys ---------------------------------------------------------------------------------

TEST(RemoteKeys, ChainedContentHash) {
  const std::string id = identity_id(ident());
  const auto t = seq(5, 100);  // 6 full chunks of 16, 4 tokens left over
  const auto k = remote_chunk_keys(id, "base", 16, t);
  ASSERT_EQ(k.size(), 6u);  // a partial chunk has no key
  for (const auto& key : k) {
    EXPECT_EQ(key.rfind("larder:kv:1:", 0), 0u);
    EXPECT_EQ(key.size(), 12u + 32u);
  }
  EXPECT_EQ(remote_chunk_keys(id, "base", 16, t), k);  // deterministic (no per-process seed)
  EXPECT_EQ(remote_chunk_keys(id, "base", 16, t, 3), std::vector<std::string>(k.begin(), k.begin() + 3));
  // A prefix has the same leading keys (replicas find each other's prefixes).
  const auto pre = remote_chunk_keys(id, "base", 16, std::vector<int32_t>(t.begin(), t.begin() + 40));
  ASSERT_EQ(pre.size(), 2u);
  EXPECT_EQ(pre[0], k[0]);
  EXPECT_EQ(pre[1], k[1]);
  // One changed token in chunk 2 changes chunk 2 and every later key (the chain), not earlier ones.
  auto u = t;
  u[40] += 1;
  const auto ku = remote_chunk_keys(id, "base", 16, u);
  EXPECT_EQ(ku[0], k[0]);
  EXPECT_EQ(ku[1], k[1]);
  for (size_t i = 2; i < 6; ++i) EXPECT_NE(ku[i], k[i]) << i;
  // Equal chunk contents at another position get another key (the chain pins position).
  const auto rep = remote_chunk_keys(id, "base", 16, cat(seq(1, 16), seq(1, 16)));
  EXPECT_NE(rep[0], rep[1]);
  // Another model, namespace or chunk size never collides.
  const auto other_model = remote_chunk_keys(identity_id(ident("weights-b")), "base", 16, t);
  StoreIdentity num = ident();
  num.numerics_id = "cpu-avx512-v1";
  const auto other_numerics = remote_chunk_keys(identity_id(num), "base", 16, t);
  const auto other_ns = remote_chunk_keys(id, "0123456789abcdef0123456789abcdef", 16, t);
  const auto other_size = remote_chunk_keys(id, "base", 32, t);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NE(other_model[i], k[i]);
    EXPECT_NE(other_numerics[i], k[i]);
    EXPECT_NE(other_ns[i], k[i]);
    EXPECT_NE(other_size[i], k[i]);
  }
  EXPECT_TRUE(remote_chunk_keys(id, "base", 16, seq(1, 15)).empty());
}

// ---- values -------------------------------------------------------------------------------

TEST(RemoteValue, EncodeIsTheFileImageAndDecodeVerifiesEverything) {
  TempDir d;
  const auto toks = seq(3, 48);
  auto e = entry_of(toks);
  auto v = encode_lkv(*e, ident());
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  const std::string path = d.path + "/x.lkv";
  ASSERT_TRUE(write_lkv(path, *e, ident(), posix_io()).is_ok());
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Same created_ms → same bytes: one serialization, one set of checks.
  auto e2 = std::make_shared<Entry>(*e);
  e2->created_ms = 77;
  auto v2 = encode_lkv(*e2, ident());
  ASSERT_TRUE(write_lkv(d.path + "/y.lkv", *e2, ident(), posix_io()).is_ok());
  std::ifstream in2(d.path + "/y.lkv", std::ios::binary);
  EXPECT_EQ(*v2, std::string((std::istreambuf_iterator<char>(in2)), std::istreambuf_iterator<char>()));
  EXPECT_EQ(v->size(), file.size());

  auto back = decode_lkv(*v, nullptr, VerifyPolicy::kFull, "value x");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ((*back)->tokens, toks);
  EXPECT_TRUE(prefix_matches(*(*back)->kv, toks, 48));
  EXPECT_EQ((*back)->kv->pieces()[0].seg->backing, Backing::kAnon);  // copy: nothing aliases the reply

  // One flipped byte in the KV rows: corrupt, and the message names the value, not /proc.
  std::string bad = *v;
  bad[bad.size() - 3] ^= 0x40;
  auto c = decode_lkv(bad, nullptr, VerifyPolicy::kFull, "value x");
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(c.status().message().find("value x"), std::string::npos) << c.status().message();
  EXPECT_EQ(c.status().message().find("/proc/"), std::string::npos) << c.status().message();
  // Truncated, and another model's value.
  EXPECT_EQ(decode_lkv(v->substr(0, v->size() - 100), nullptr, VerifyPolicy::kFull, "v").status().code(),
            StatusCode::kCorrupt);
  const StoreIdentity other = ident("weights-b");
  EXPECT_EQ(decode_lkv(*v, &other, VerifyPolicy::kFull, "v").status().code(), StatusCode::kIncompatible);
  EXPECT_FALSE(decode_lkv("", nullptr, VerifyPolicy::kFull, "v").is_ok());
}

// ---- failure is bounded -------------------------------------------------------------------

// A loopback port with a listening socket that never accepts or answers: connects complete
// (the kernel's backlog), every command then waits — a hung Redis.
struct SilentServer {
  int fd = -1;
  int port = 0;
  SilentServer() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd, 16);
    socklen_t n = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
    port = ntohs(a.sin_port);
  }
  ~SilentServer() { ::close(fd); }
};

int closed_port() {
  SilentServer s;  // bound then closed: nothing listens there afterwards
  return s.port;
}

std::unique_ptr<RemoteTier> tier_for(const std::string& url, int timeout_ms = 50, int64_t chunk = 16,
                                     const StoreIdentity& id = ident()) {
  RemoteConfig c;
  c.url = parse_remote_url(url).value();
  c.timeout_ms = timeout_ms;
  c.chunk_tokens = chunk;
  c.identity = id;
  return RemoteTier::open(std::move(c)).value();
}

TEST(RemoteTier, DeadServerIsAFastMissThenBackoff) {
  auto t = tier_for("redis://127.0.0.1:" + std::to_string(closed_port()));
  const auto p = seq(1, 64);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(t->find(p, "base").has_value());
  EXPECT_EQ(t->last_find_failure(), "remote_error");
  EXPECT_FALSE(t->find(p, "base").has_value());  // inside the backoff: no connect at all
  EXPECT_EQ(t->last_find_failure(), "remote_down");
  EXPECT_FALSE(t->store(*entry_of(p)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  const RemoteStats s = t->stats();
  EXPECT_FALSE(s.connected);
  EXPECT_GE(s.errors, 1u);
  EXPECT_GE(s.down, 1u);
  EXPECT_EQ(s.write_failures, 1u);
  // Nothing to gain → no round trip, no failure: a one-token prompt, or RAM serves len - 1.
  EXPECT_FALSE(t->find(seq(1, 1), "base").has_value());
  EXPECT_EQ(t->last_find_failure(), "");
  EXPECT_FALSE(t->find(p, "base", 63).has_value());
  EXPECT_EQ(t->last_find_failure(), "");
  EXPECT_EQ(t->stats().skipped, 2u);
}

TEST(RemoteTier, SilentServerTimesOutWithinTheLimit) {
  SilentServer s;
  auto t = tier_for("redis://127.0.0.1:" + std::to_string(s.port), /*timeout_ms=*/80);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(t->find(seq(1, 64), "base").has_value());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(t->last_find_failure(), "remote_timeout");
  EXPECT_GE(took, 0.07);
  EXPECT_LT(took, 0.5);  // the timeout, not forever
  EXPECT_EQ(t->stats().timeouts, 1u);
}

// ---- a real redis-server ------------------------------------------------------------------

// A redis-server child that cannot outlive the test: it dies with this process
// (PR_SET_PDEATHSIG) and never holds the test's stdout/stderr (ctest waits for their EOF, so a
// surviving child would hang the run until ctest's timeout).
struct RedisServer {
  pid_t pid = -1;
  TempDir dir;
  std::string sock;
  bool start() {
    if (::access("/usr/bin/redis-server", X_OK) != 0) return false;
    sock = dir.path + "/redis.sock";
    // Everything the child needs is built before fork: between fork and exec the child of a
    // threaded process may only make async-signal-safe calls (no allocation).
    const std::string log = dir.path + "/log";
    std::vector<const char*> argv = {"redis-server", "--port", "0", "--unixsocket", sock.c_str(), "--save", "",
                                     "--appendonly", "no", "--dir", dir.path.c_str(), "--logfile", log.c_str(),
                                     nullptr};
    const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull < 0) return false;
    const pid_t parent = ::getpid();
    pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
      ::dup2(devnull, 0);
      ::dup2(devnull, 1);
      ::dup2(devnull, 2);
      ::execv("/usr/bin/redis-server", const_cast<char* const*>(argv.data()));
      ::_exit(127);
    }
    ::close(devnull);
    if (pid < 0) return false;
    for (int i = 0; i < 300 && ::access(sock.c_str(), F_OK) != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return ::access(sock.c_str(), F_OK) == 0;
  }
  void stop() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    pid = -1;
    if (!sock.empty()) ::unlink(sock.c_str());
  }
  // A new, empty server on the same socket (what a restart without persistence looks like).
  bool restart() {
    stop();
    return start();
  }
  ~RedisServer() { stop(); }
};

TEST(RemoteTier, RoundTripThroughRealRedisSharesAcrossInstancesNeverAcrossModels) {
  RedisServer r;
  if (!r.start()) GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server; scripts/setup.sh does)";
  const std::string url = "redis+unix://" + r.sock;
  auto a = tier_for(url, 500);
  const auto toks = seq(11, 70);  // 4 chunks of 16 + 6 tokens
  ASSERT_TRUE(a->store(*entry_of(toks)));
  EXPECT_EQ(a->stats().chunks_written, 4u);
  ASSERT_TRUE(a->store(*entry_of(toks)));  // SET NX: nothing rewritten
  EXPECT_EQ(a->stats().chunks_written, 4u);
  EXPECT_EQ(a->stats().chunks_present, 4u);

  // Another instance (a replica): finds the chunks and restores rows equal to a fresh prefill.
  auto b = tier_for(url, 500);
  const auto prompt = cat(std::vector<int32_t>(toks.begin(), toks.begin() + 60), seq(900, 10));
  auto f = b->find(prompt, "base");
  ASSERT_TRUE(f.has_value()) << b->last_find_failure();
  EXPECT_EQ(f->prefix_len, 48);  // chunks 0..2 match, chunk 3 diverges at 60
  EXPECT_EQ(f->tier, Tier::kRemote);
  std::string reason;
  auto e = b->restore(*f, &reason);
  ASSERT_TRUE(e) << reason;
  EXPECT_EQ(e->tokens.size(), 48u);
  EXPECT_TRUE(e->trimmable);
  EXPECT_TRUE(prefix_matches(*e->kv, toks, 48));
  EXPECT_EQ(b->stats().chunks_read, 3u);
  EXPECT_GT(b->stats().bytes_read, 0u);

  // Another namespace or model: no hit, by key.
  EXPECT_FALSE(b->find(prompt, "0123456789abcdef0123456789abcdef").has_value());
  auto c = tier_for(url, 500, 16, ident("weights-b"));
  EXPECT_FALSE(c->find(prompt, "base").has_value());
  EXPECT_EQ(c->stats().misses, 1u);
}

// Ring / recurrent / attachment entries are exact-boundary checkpoints: stored whole, found
// through the boundary index beside the chunk chain, served only at their own length.
TEST(RemoteTier, ExactBoundaryCheckpointsOfRingAndRecurrentState) {
  RedisServer r;
  if (!r.start()) GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server; scripts/setup.sh does)";
  const std::string url = "redis+unix://" + r.sock;
  for (testing::Kinds k : {testing::Kinds{.recurrent = true}, testing::Kinds{.ring = true, .window = 8},
                           testing::Kinds{.attachment = true}}) {
    auto a = tier_for(url, 500);
    const auto toks = seq(k.recurrent ? 100 : k.ring ? 300 : 500, 37);  // 2 chunks + 5: not chunk-aligned
    auto e = make_entry(toks, prefilled(toks, k), "base", "checkpoint:prompt_end").value();
    ASSERT_TRUE(a->store(*e));
    EXPECT_EQ(a->stats().chunks_written, 1u);  // one whole value, no plain chunks
    EXPECT_EQ(a->stats().unsupported, 0u);
    ASSERT_TRUE(a->store(*e));  // present: not rewritten
    EXPECT_EQ(a->stats().chunks_written, 1u);

    auto b = tier_for(url, 500);
    const auto prompt = cat(toks, seq(9000, 4));
    auto f = b->find(prompt, "base");
    ASSERT_TRUE(f.has_value()) << b->last_find_failure();
    EXPECT_EQ(f->prefix_len, 37);
    std::string reason;
    auto got = b->restore(*f, &reason);
    ASSERT_TRUE(got) << reason;
    EXPECT_EQ(got->tokens, toks);
    EXPECT_EQ(got->signature, e->signature);
    EXPECT_EQ(got->layers.size(), e->layers.size());
    for (size_t l = 0; l < e->layers.size(); ++l) {
      const auto want = e->layers[l]->tensors(), have = got->layers[l]->tensors();
      ASSERT_EQ(want.size(), have.size());
      for (size_t t = 0; t < want.size(); ++t) {
        ASSERT_EQ(want[t].bytes, have[t].bytes);
        EXPECT_EQ(std::memcmp(want[t].data, have[t].data, want[t].bytes), 0) << "layer " << l << " tensor " << t;
      }
    }
    EXPECT_EQ(got->attachments.size(), e->attachments.size());
    EXPECT_TRUE(prefix_matches(*got->kv, toks, 37));
    // Not at a shorter prompt (untrimmable state exists only at its own length), never another ns.
    EXPECT_FALSE(b->find(std::vector<int32_t>(toks.begin(), toks.begin() + 30), "base").has_value());
    EXPECT_FALSE(b->find(prompt, "0123456789abcdef0123456789abcdef").has_value());
    // The exact prompt reuses len - 1 at most: the checkpoint (len 37) does not serve a 37-token prompt.
    EXPECT_FALSE(b->find(toks, "base").has_value());
  }
}

KvStoreConfig store_cfg(const std::string& url, const std::string& ssd_dir = {}) {
  KvStoreConfig c;
  c.ram_cap_bytes = 64 << 20;
  c.ssd_dir = ssd_dir;
  c.remote_url = url;
  c.remote_timeout_ms = 500;
  c.remote_chunk_tokens = 16;
  c.identity = ident();
  c.background_scan = false;
  return c;
}

// The facade: RAM → (SSD →) remote; write-behind feeds Redis; a hit names its tier; a failure
// is the miss's reason.
TEST(RemoteTier, StoreFacadeTiersAndExplains) {
  RedisServer r;
  if (!r.start()) GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server; scripts/setup.sh does)";
  const std::string url = "redis+unix://" + r.sock;
  const auto toks = seq(20, 50);
  {
    auto a = KvStore::open(store_cfg(url)).value();
    ASSERT_TRUE(a->put(toks, prefilled(toks), "base").is_ok());  // offered to the remote queue at once
    EXPECT_EQ(a->write_behind(), 0u);  // the SSD write-behind has nothing to do with it
    a->flush();  // drains the remote queue into Redis
    EXPECT_EQ(a->stats().remote.chunks_written, 3u);
    EXPECT_EQ(a->stats().remote_queue.written, 1u);
  }
  for (bool with_ssd : {false, true}) {
    TempDir d;
    auto b = KvStore::open(store_cfg(url, with_ssd ? d.path : "")).value();
    const auto prompt = cat(std::vector<int32_t>(toks.begin(), toks.begin() + 40), seq(700, 5));
    TakeResult t = b->take(prompt, "base");
    ASSERT_TRUE(t.hit.has_value()) << t.report.reason;
    EXPECT_EQ(t.hit->tier, Tier::kRemote);
    EXPECT_EQ(t.report.tier, Tier::kRemote);
    EXPECT_EQ(t.hit->tokens, 32);
    EXPECT_TRUE(prefix_matches(*t.hit->kv, toks, 32));
    const StoreStats s = b->stats();
    EXPECT_EQ(s.lookups_hit_remote, 1u);
    EXPECT_EQ(s.reused_tokens_remote, 32u);
    const std::string prom = stats_prometheus(s);
    EXPECT_NE(prom.find("larder_kv_lookups_total{result=\"hit_remote\"} 1"), std::string::npos) << prom;
    EXPECT_NE(prom.find("larder_kv_remote_seconds_count{op=\"read\"} 1"), std::string::npos) << prom;
    EXPECT_EQ(stats_json(s)["remote"]["url"], url);
  }
  // Redis gone: the lookup fails fast and the miss says so.
  r.stop();
  auto c = KvStore::open(store_cfg(url)).value();
  TakeResult t = c->take(toks, "base");
  EXPECT_FALSE(t.hit.has_value());
  EXPECT_EQ(t.report.reason, "remote_error");
  EXPECT_EQ(c->stats().miss_reasons.at("remote_error"), 1u);
  // A bad URL is refused at open, without echoing the password.
  auto bad = KvStore::open(store_cfg("redis://:s3cret@h:99999"));
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message().find("s3cret"), std::string::npos);
}

// A later chunk that fails verification used to turn the whole lookup into a miss; the chunks
// before it are still a valid prefix of the prompt, so they serve (the bad one is deleted, and
// the hit names why it is shorter).
TEST(RemoteTier, ABadLaterChunkLeavesTheLeadingChunksServing) {
  RedisServer r;
  if (!r.start()) GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server; scripts/setup.sh does)";
  const std::string url = "redis+unix://" + r.sock;
  const auto toks = seq(11, 70);  // 4 chunks of 16 + 6 tokens
  auto a = tier_for(url, 500);
  ASSERT_TRUE(a->store(*entry_of(toks)));
  const std::vector<std::string> keys = remote_chunk_keys(identity_id(ident()), "base", 16, toks);
  ASSERT_EQ(keys.size(), 4u);
  auto overwrite = [&](const std::string& key) {
    const std::string cmd = "redis-cli -s " + r.sock + " SET " + key + " not-an-lkv-value >/dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  };
  overwrite(keys[2]);

  auto b = tier_for(url, 500);
  RemoteFetch f = b->fetch(toks, "base", 0);
  ASSERT_TRUE(f.entry) << f.failure;
  EXPECT_EQ(f.failure, "remote_corrupt");
  EXPECT_EQ(f.found.prefix_len, 32);  // chunks 0 and 1
  EXPECT_EQ(f.found.tier, Tier::kRemote);
  EXPECT_EQ(f.entry->tokens.size(), 32u);
  EXPECT_TRUE(prefix_matches(*f.entry->kv, toks, 32));
  EXPECT_EQ(b->stats().corrupt, 1u);
  EXPECT_EQ(b->stats().chunks_read, 2u);
  std::string failure;
  EXPECT_EQ(b->peek(toks, "base", &failure), 32) << "the bad chunk was deleted";
  // Not longer than what is local: nothing to serve, the failure still named.
  ASSERT_TRUE(a->store(*entry_of(toks)));  // rewrites the deleted chunk
  overwrite(keys[3]);
  RemoteFetch g = b->fetch(toks, "base", 48);
  EXPECT_FALSE(g.entry);
  EXPECT_EQ(g.failure, "remote_corrupt");
  // A bad first chunk is a miss, as before.
  ASSERT_TRUE(a->store(*entry_of(toks)));
  overwrite(keys[0]);
  RemoteFetch h = b->fetch(toks, "base", 0);
  EXPECT_FALSE(h.entry);
  EXPECT_EQ(h.failure, "remote_corrupt");

  // Through the store: a remote hit of the leading chunks, its reason naming the bad one.
  ASSERT_TRUE(a->store(*entry_of(toks)));
  overwrite(keys[3]);
  KvStoreConfig c;
  c.ram_cap_bytes = 64 << 20;
  c.remote_url = url;
  c.remote_timeout_ms = 500;
  c.remote_chunk_tokens = 16;
  c.identity = ident();
  auto s = KvStore::open(c).value();
  TakeResult t = s->take(toks, "base");
  ASSERT_TRUE(t.hit.has_value()) << t.report.reason;
  EXPECT_EQ(t.hit->tier, Tier::kRemote);
  EXPECT_EQ(t.hit->tokens, 48);
  EXPECT_EQ(t.report.reason, "remote_corrupt");
  EXPECT_TRUE(prefix_matches(*t.hit->kv, toks, 48));
}

// The remote lookup runs on the lookup thread (issue 46): begin_take returns at once while a hung
// Redis holds the lookup; the result is picked up later; a cancelled lookup never calls back.
TEST(RemoteTier, BeginTakeNeverWaitsOnTheNetwork) {
  SilentServer hung;
  KvStoreConfig c;
  c.ram_cap_bytes = 64 << 20;
  c.remote_url = "redis://127.0.0.1:" + std::to_string(hung.port);
  c.remote_timeout_ms = 400;
  c.remote_chunk_tokens = 16;
  c.identity = ident();
  auto s = KvStore::open(c).value();
  const auto p = seq(1, 64);
  std::atomic<int> calls{0};
  auto t0 = std::chrono::steady_clock::now();
  TakeStart st = s->begin_take(p, "base", [&] { ++calls; });
  const double began = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(st.pending) << "a prompt the remote tier could serve waits for its lookup";
  EXPECT_LT(began, 0.1) << "begin_take must not wait for the network";
  EXPECT_FALSE(st.pending->ready());
  // Picked up later: a timeout is a miss that says so.
  st.pending->wait();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(took, 0.3);
  EXPECT_LT(took, 2.0);
  ASSERT_TRUE(st.pending->ready());
  EXPECT_EQ(calls.load(), 1);
  TakeResult r = s->complete_take(*st.pending);
  EXPECT_FALSE(r.hit.has_value());
  EXPECT_EQ(r.report.reason, "remote_timeout");
  EXPECT_EQ(s->stats().miss_reasons.at("remote_timeout"), 1u);

  // RAM serves len - 1: no lookup at all, the take is done at once (counted as skipped).
  ASSERT_TRUE(s->put(p, prefilled(p), "base").is_ok());
  TakeStart local = s->begin_take(p, "base");
  EXPECT_FALSE(local.pending);
  ASSERT_TRUE(local.result.hit.has_value());
  EXPECT_EQ(local.result.hit->tier, Tier::kRam);
  EXPECT_GE(s->stats().remote.skipped, 1u);

  // Cancelled (the client left): no callback, ever; the store still closes within the timeout.
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));  // past the reconnect backoff
  std::atomic<int> late{0};
  TakeStart gone = s->begin_take(seq(500, 64), "base", [&] { ++late; });
  ASSERT_TRUE(gone.pending);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // in flight
  gone.pending->cancel();
  TakeStart queued = s->begin_take(seq(900, 64), "base", [&] { ++late; });
  ASSERT_TRUE(queued.pending);
  queued.pending->cancel();  // never started
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_EQ(late.load(), 0);
  EXPECT_FALSE(gone.pending->ready());
  t0 = std::chrono::steady_clock::now();
  TakeStart last = s->begin_take(seq(1300, 64), "base", [&] { ++late; });
  s.reset();  // a lookup in flight: the destructor waits for it, bounded by the timeout
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

// A busy engine is the normal state of a replica under load: a put must reach Redis while the
// engine stays busy — no idle debounce, no write_behind(), no flush — within a bounded time.
TEST(RemoteWriteQueue, PublishesWhileTheEngineIsBusy) {
  RedisServer r;
  if (!r.start()) GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server; scripts/setup.sh does)";
  const std::string url = "redis+unix://" + r.sock;
  for (bool with_ssd : {false, true}) {
    TempDir d;
    const auto toks = seq(with_ssd ? 4000 : 3000, 50);
    auto a = KvStore::open(store_cfg(url, with_ssd ? d.path : "")).value();
    a->set_engine_busy(true);
    ASSERT_TRUE(a->put(toks, prefilled(toks), "base").is_ok());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (a->stats().remote_queue.written < 1 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const StoreStats s = a->stats();
    EXPECT_EQ(s.remote_queue.written, 1u) << "with_ssd=" << with_ssd;
    EXPECT_EQ(s.remote.chunks_written, 3u);
    if (with_ssd) {
      EXPECT_EQ(s.queue.written, 0u) << "the SSD write-behind still waits for idle";
    }
    // Another instance (a replica) finds the chunks while A is still busy.
    auto b = tier_for(url, 500);
    auto f = b->find(toks, "base");
    ASSERT_TRUE(f.has_value()) << b->last_find_failure();
    EXPECT_EQ(f->prefix_len, 48);
    // A spill of an entry already written costs nothing: skipped, not rewritten.
    a->ram().relieve_pressure([&] { return a->ram().stats().entries > 0; });
    EXPECT_EQ(a->stats().remote_queue.written, 1u);
    a->set_engine_busy(false);
  }
}

// Redis lost what this replica wrote (here a restart without persistence; maxmemory eviction and
// FLUSHALL leave the same state): the replica still holds the entry in RAM and refills the shared
// tier — a put of the same tokens writes the lost chunks again at once, and so does the spill of
// an entry whose write is older than recheck_after. The first write after the restart meets the
// connection to the old server (EPIPE, not a SIGPIPE that would end the process). Every wait is
// bounded; the server dies with the test (RedisServer).
TEST(RemoteWriteQueue, APutOrSpillAfterRedisLostTheEntryWritesItAgain) {
  RedisServer r;
  if (!r.start()) GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server; scripts/setup.sh does)";
  const std::string url = "redis+unix://" + r.sock;
  auto settled = [](KvStore& s, uint64_t n) {  // n entries written or failed, within 20 s
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    auto done = [&] { return s.stats().remote_queue.written + s.stats().remote_queue.failed >= n; };
    while (!done() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return done();
  };
  auto found = [&](const std::vector<int32_t>& toks) {
    auto b = tier_for(url, 500);  // another replica
    auto f = b->find(toks, "base");
    return f ? f->prefix_len : 0;
  };
  // A put of tokens written before (the default recheck_after: puts never consult it).
  {
    auto a = KvStore::open(store_cfg(url)).value();
    const auto toks = seq(6000, 40);
    ASSERT_TRUE(a->put(toks, prefilled(toks), "base").is_ok());
    ASSERT_TRUE(settled(*a, 1));
    ASSERT_EQ(a->stats().remote.chunks_written, 2u);
    ASSERT_EQ(found(toks), 32);
    ASSERT_TRUE(r.restart());
    ASSERT_EQ(found(toks), 0);
    ASSERT_TRUE(a->put(toks, prefilled(toks), "base").is_ok());  // the same tokens (RAM: a duplicate)
    ASSERT_TRUE(settled(*a, 2)) << "the second put was not offered: skipped " << a->stats().remote_queue.skipped;
    EXPECT_EQ(a->stats().remote_queue.written, 2u);
    EXPECT_EQ(a->stats().remote.chunks_written, 4u);
    EXPECT_EQ(found(toks), 32);
    // Offered again while Redis holds it: verified with EXISTS, nothing re-sent.
    ASSERT_TRUE(a->put(toks, prefilled(toks), "base").is_ok());
    ASSERT_TRUE(settled(*a, 3));
    EXPECT_EQ(a->stats().remote.chunks_written, 4u);
    EXPECT_EQ(a->stats().remote.chunks_present, 2u);
  }
  // A spill: within recheck_after it is skipped (no I/O), past it the write is verified.
  {
    KvStoreConfig c = store_cfg(url);
    c.remote_queue.recheck_after = std::chrono::milliseconds(1500);  // far above a write here
    auto a = KvStore::open(c).value();
    const auto toks = seq(8000, 40), other = seq(9000, 40);
    ASSERT_TRUE(a->put(toks, prefilled(toks), "base").is_ok());
    ASSERT_TRUE(a->put(other, prefilled(other), "base").is_ok());
    ASSERT_TRUE(settled(*a, 2));
    ASSERT_EQ(a->demote_idle(std::chrono::seconds(3600)), 0u);
    ASSERT_EQ(a->demote_idle(std::chrono::steady_clock::duration::zero()), 2u);  // two spills at once
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(a->stats().remote_queue.skipped, 2u) << "spills of entries just written";
    EXPECT_EQ(a->stats().remote_queue.written, 2u);
    ASSERT_TRUE(r.restart());
    ASSERT_TRUE(a->put(toks, prefilled(toks), "base").is_ok());  // a put: written again at once
    ASSERT_TRUE(settled(*a, 3));
    ASSERT_TRUE(a->put(other, prefilled(other), "base").is_ok());
    ASSERT_TRUE(settled(*a, 4));
    ASSERT_TRUE(r.restart());
    std::this_thread::sleep_for(std::chrono::milliseconds(1600));  // past recheck_after
    ASSERT_EQ(a->demote_idle(std::chrono::steady_clock::duration::zero()), 2u);
    ASSERT_TRUE(settled(*a, 6)) << "spills after recheck_after were skipped: " << a->stats().remote_queue.skipped;
    EXPECT_EQ(a->stats().remote_queue.failed, 0u);
    EXPECT_EQ(found(toks), 32);
    EXPECT_EQ(found(other), 32);
  }
}

// Full queue: the oldest queued entries are dropped and counted; the queue never holds more than
// its cap plus one entry. A Redis that never answers keeps the writer on its first item.
TEST(RemoteWriteQueue, DropsTheOldestWhenFullAndCountsIt) {
  SilentServer hung;
  auto t = tier_for("redis://127.0.0.1:" + std::to_string(hung.port), /*timeout_ms=*/400);
  std::vector<std::shared_ptr<const Entry>> es;
  for (int i = 0; i < 6; ++i) es.push_back(entry_of(seq(100 * (i + 1), 40)));
  const size_t one = es[0]->bytes(Backing::kAnon) + es[0]->bytes(Backing::kMapped);
  RemoteWriteQueue q(t.get(), {.cap_bytes = 2 * one + one / 2, .busy_bytes_per_s = 0});
  for (auto& e : es) q.publish(e);
  const RemoteQueueStats s = q.stats();
  EXPECT_GE(s.dropped, 3u);  // 6 offered, at most 2 queued + 1 in flight
  EXPECT_LE(s.queued_bytes, 2 * one + one / 2);
  EXPECT_EQ(s.dropped + s.queued_items + (s.in_flight ? 1 : 0) + s.written + s.failed, 6u);
  // The newest survives: it is never its own victim.
  EXPECT_TRUE(q.drain(std::chrono::seconds(20)));
  const RemoteQueueStats e = q.stats();
  EXPECT_EQ(e.written, 0u);
  EXPECT_EQ(e.failed + e.dropped, 6u);
  EXPECT_GE(e.failed, 1u);
}

// While busy, the writer keeps to its byte budget; idle, it is unpaced.
TEST(RemoteWriteQueue, PacedToItsBudgetWhileBusy) {
  RedisServer r;
  if (!r.start()) GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server; scripts/setup.sh does)";
  auto t = tier_for("redis+unix://" + r.sock, 2000, /*chunk=*/4);
  // 5 entries of 40 tokens = 10 values each (two pipelined batches: 8 + 2).
  std::vector<std::shared_ptr<const Entry>> es;
  for (int i = 0; i < 5; ++i) es.push_back(entry_of(seq(1000 * (i + 1), 40)));
  const uint64_t rate = 256 << 10;  // 256 KiB/s: ~1 MiB of values takes ~4 s
  RemoteWriteQueue q(t.get(), {.cap_bytes = 1ull << 30, .busy_bytes_per_s = rate});
  q.set_busy(true);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& e : es) q.publish(e);
  const auto deadline = t0 + std::chrono::seconds(25);
  while (q.stats().written < es.size() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(q.stats().written, es.size());
  const uint64_t sent = t->stats().bytes_written;
  // The first batch goes at once; every later byte waited for the budget (a lower bound only:
  // a loaded host may be slower, never faster).
  const uint64_t first_batch = sent / 10 * 8 / static_cast<uint64_t>(es.size());
  EXPECT_GE(took, 0.9 * static_cast<double>(sent - first_batch) / static_cast<double>(rate)) << sent;
  EXPECT_GT(q.stats().paced_s, 0.0);
  // Idle: the same amount goes unpaced (a bound far above the paced time).
  q.set_busy(false);
  std::vector<std::shared_ptr<const Entry>> more;
  for (int i = 0; i < 5; ++i) more.push_back(entry_of(seq(50000 + 1000 * i, 40)));
  const double paced_before = q.stats().paced_s;
  for (auto& e : more) q.publish(e);
  ASSERT_TRUE(q.drain(std::chrono::seconds(20)));
  EXPECT_EQ(q.stats().written, 10u);
  EXPECT_EQ(q.stats().paced_s, paced_before);
}

}  // namespace
}  // namespace larder::memory
