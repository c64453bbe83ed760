// ssd_tier_test.cpp — LKV1 files, the SSD tier, the write-behind queue and the store facade
// with real files: round trips bit for bit, restarts, corruption, fault injection, ENOSPC,
// SIGKILL during writes, caps, durability (kv-store.md §6–§8, §11.1, §11.2, §12).
#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>
#include <xxhash.h>

#include "kv_test_util.h"
#include "larder/memory/store/cache_admin.h"
#include "larder/memory/store/cache_dir.h"
#include "larder/memory/store/kv_store.h"
#include "larder/memory/store/lkv_format.h"
#include "larder/memory/store/ssd_tier.h"

namespace larder::memory {
namespace {

using testing::cat;
using testing::count_files;
using testing::extend;
using testing::Kinds;
using testing::kCtx;
using testing::kLayout;
using testing::kv_matches;
using testing::list_files;
using testing::prefilled;
using testing::prefix_matches;
using testing::seq;
using testing::TempDir;

// A pre-wrap ring (window 256 > every prompt here) keeps hybrid entries trimmable.
const Kinds kAll{.ring = true, .window = 256, .recurrent = false, .attachment = false};

StoreIdentity ident(const std::string& w = "weights-a") {
  StoreIdentity id;
  id.weights_id = w;
  id.config_fp = "cfg";
  id.kv_scheme = "f32";
  id.tokenizer_fp = "tok";
  id.numerics_id = "cpu-avx2-v1";
  id.model_label = "synthetic";
  return id;
}

std::shared_ptr<const Entry> entry_of(const std::vector<int32_t>& t, const Kinds& k = {}, const std::string& ns = "base") {
  return make_entry(t, prefilled(t, k), ns, "full").value();
}

std::unique_ptr<SsdTier> open_tier(const std::string& dir, uint64_t cap = 1ull << 30, IoLayer* io = nullptr,
                                   const StoreIdentity& id = ident(), VerifyPolicy v = VerifyPolicy::kFull,
                                   RestoreMode m = RestoreMode::kMmap, bool scan = true) {
  SsdConfig c;
  c.dir = dir;
  c.cap_bytes = cap;
  c.identity = id;
  c.io = io;
  c.verify = v;
  c.restore = m;
  auto t = SsdTier::open(c).value();
  if (scan) t->scan();
  return t;
}

std::string read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out << bytes;
}

void flip_byte(const std::string& path, uint64_t off) {
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char c;
  ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(off)), 1);
  c ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(off)), 1);
  ::close(fd);
}

// Compares every state of a restored entry with a fresh prefill of its tokens, bit for bit.
void expect_equivalent(const Entry& e, const Kinds& k) {
  SequenceState ref = prefilled(e.tokens, k);
  const int64_t n = static_cast<int64_t>(e.tokens.size());
  ASSERT_TRUE(e.kv);
  EXPECT_TRUE(prefix_matches(*e.kv, e.tokens, n));
  ASSERT_EQ(e.layers.size(), ref.layers.size());
  for (size_t i = 0; i < e.layers.size(); ++i) {
    std::vector<StateTensor> a = e.layers[i]->tensors(), b = ref.layers[i]->tensors();
    ASSERT_EQ(a.size(), b.size());
    for (size_t t = 0; t < a.size(); ++t) {
      ASSERT_EQ(a[t].bytes, b[t].bytes);
      EXPECT_EQ(0, std::memcmp(a[t].data, b[t].data, a[t].bytes)) << e.layers[i]->signature();
    }
    EXPECT_EQ(e.layers[i]->params(), ref.layers[i]->params());
  }
  ASSERT_EQ(e.attachments.size(), ref.attachments.size());
  for (size_t i = 0; i < e.attachments.size(); ++i) {
    EXPECT_EQ(e.attachments[i].schema, ref.attachments[i].schema);
    EXPECT_EQ(e.attachments[i].metadata, ref.attachments[i].metadata);
    ASSERT_EQ(e.attachments[i].tensors.size(), ref.attachments[i].tensors.size());
    for (size_t t = 0; t < e.attachments[i].tensors.size(); ++t)
      EXPECT_EQ(0, std::memcmp(e.attachments[i].tensors[t].data, ref.attachments[i].tensors[t].data,
                               e.attachments[i].tensors[t].bytes));
  }
}

// ---- format -------------------------------------------------------------------------------

TEST(Lkv, RoundTripEveryKindBitExactMmapAndCopy) {
  TempDir d;
  for (Kinds k : {Kinds{}, Kinds{.ring = true, .window = 64}, Kinds{.ring = true, .window = 8},
                  Kinds{.recurrent = true}, Kinds{.attachment = true},
                  Kinds{.ring = true, .window = 16, .recurrent = true, .attachment = true}}) {
    const auto toks = seq(7, 37);
    auto e = entry_of(toks, k);
    const std::string path = d.path + "/x.lkv";
    ASSERT_TRUE(write_lkv(path, *e, ident(), posix_io()).is_ok());
    EXPECT_EQ(count_files(d.path, ".tmp"), 0u);
    for (RestoreMode m : {RestoreMode::kMmap, RestoreMode::kCopy}) {
      auto r = read_lkv(path, nullptr, VerifyPolicy::kFull, m);
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      const Entry& got = **r;
      EXPECT_EQ(got.tokens, toks);
      EXPECT_EQ(got.trimmable, e->trimmable);
      EXPECT_EQ(got.signature, e->signature);
      expect_equivalent(got, k);
      // mmap restore aliases the file: the KV rows are mapped bytes, not heap copies.
      EXPECT_EQ(got.kv->pieces()[0].seg->backing, m == RestoreMode::kMmap ? Backing::kMapped : Backing::kAnon);
    }
    // save → load(verify) → re-save is byte-identical.
    auto r = read_lkv(path, nullptr, VerifyPolicy::kFull, RestoreMode::kMmap);
    const std::string again = d.path + "/y.lkv";
    ASSERT_TRUE(write_lkv(again, **r, ident(), posix_io()).is_ok());
    EXPECT_EQ(read_all(path), read_all(again));
    ::unlink(path.c_str());
    ::unlink(again.c_str());
  }
}

TEST(Lkv, LayoutIsPageAlignedAndSelfDescribing) {
  TempDir d;
  auto e = entry_of(seq(1, 50), {.recurrent = true, .attachment = true});
  const std::string path = d.path + "/x.lkv";
  ASSERT_TRUE(write_lkv(path, *e, ident(), posix_io()).is_ok());
  auto info = read_lkv_info(path, nullptr);
  ASSERT_TRUE(info.is_ok());
  EXPECT_EQ(std::string(info->prefix.magic, 8), std::string("LARDKV1\n", 8));
  EXPECT_EQ(info->prefix.data_offset % 4096, 0u);
  const auto& h = info->header;
  EXPECT_EQ(h["n_tokens"], 50);
  EXPECT_EQ(h["identity"]["weights_id"], "weights-a");
  for (const auto& l : h["layers"])
    for (const auto& t : l["tensors"]) {
      EXPECT_EQ(t["off"].get<uint64_t>() % 4096, 0u);
      EXPECT_EQ(t["xxh3"].get<std::string>().size(), 16u);
    }
  EXPECT_EQ(h["attachments"][0]["schema"], "mtp.v1");
}

// The KV dtype travels with the entry: an f16 or q8_0 entry's file records it (tensor dtype and
// signature), restores as that dtype with the same bytes, and a state of another KV dtype never
// adopts it (the signature — part of the store identity — differs, and into_state refuses).
TEST(Lkv, KvDtypeIsRecordedAndNeverMisread) {
  TempDir d;
  std::mt19937 rng(5);
  for (DType dt : {DType::kF16, DType::kQ8_0}) {
    const KvLayout L{2, 2, 32, dt};
    const auto toks = seq(3, 40);
    const int64_t n = static_cast<int64_t>(toks.size());
    SequenceState s(L, kCtx);
    ASSERT_TRUE(s.kv.reserve(n).is_ok());
    std::vector<std::vector<uint8_t>> want_k(2), want_v(2);
    for (int l = 0; l < 2; ++l) {
      for (auto* w : {&want_k[l], &want_v[l]}) {
        w->resize(static_cast<size_t>(n * L.row_bytes()));
        for (auto& b : *w) b = static_cast<uint8_t>(rng() & 0x3f);  // finite f16 / small scales
      }
      std::memcpy(s.kv.k_row(l, 0), want_k[l].data(), want_k[l].size());
      std::memcpy(s.kv.v_row(l, 0), want_v[l].data(), want_v[l].size());
    }
    s.kv.advance(n);
    auto e = make_entry(toks, std::move(s), "base", "full").value();
    const std::string tag = kv_dtype_tag(dt);
    EXPECT_NE(e->signature.find("plain_kv:" + tag + ":"), std::string::npos) << e->signature;
    const std::string path = d.path + "/" + tag + ".lkv";
    ASSERT_TRUE(write_lkv(path, *e, ident(), posix_io()).is_ok());
    auto info = read_lkv_info(path, nullptr);
    ASSERT_TRUE(info.is_ok());
    EXPECT_EQ(info->header["layers"][0]["tensors"][0]["dtype"], dtype_name(dt));
    EXPECT_EQ(info->header["layers"][0]["tensors"][0]["bytes"], n * L.row_bytes());
    for (RestoreMode m : {RestoreMode::kMmap, RestoreMode::kCopy}) {
      auto r = read_lkv(path, nullptr, VerifyPolicy::kFull, m);
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      const Entry& got = **r;
      EXPECT_EQ(got.kv->layout(), L);
      EXPECT_EQ(got.signature, e->signature);
      std::vector<KvSpan> sp;
      for (int l = 0; l < 2; ++l) {
        sp.clear();
        got.kv->prefix_spans(l, n, &sp);
        ASSERT_EQ(sp.size(), 1u);
        EXPECT_EQ(sp[0].dtype, dt);
        EXPECT_EQ(0, std::memcmp(sp[0].k, want_k[l].data(), want_k[l].size()));
        EXPECT_EQ(0, std::memcmp(sp[0].v, want_v[l].data(), want_v[l].size()));
      }
    }
    // An f32 model state (the same shapes) refuses the entry instead of reading f16 bytes as f32.
    Hit h;
    h.kv = e->kv;
    h.tokens = n;
    StateSchema f32_schema = StateSchema::all_plain(KvLayout{2, 2, 32});
    auto adopted = std::move(h).into_state(f32_schema, kCtx);
    EXPECT_FALSE(adopted.is_ok());
    EXPECT_NE(state_signature(KvLayout{2, 2, 32}, {}, {}), e->signature);
  }
  // A file that claims F16 rows of the wrong byte size is refused as corrupt, not misread.
  {
    auto e = entry_of(seq(1, 20));  // f32 rows
    const std::string path = d.path + "/liar.lkv";
    ASSERT_TRUE(write_lkv(path, *e, ident(), posix_io()).is_ok());
    std::string bytes = read_all(path);
    const size_t at = bytes.find("\"dtype\":\"F32\"");
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, 13, "\"dtype\":\"F16\"");
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    auto r = read_lkv(path, nullptr, VerifyPolicy::kFull, RestoreMode::kMmap);
    EXPECT_FALSE(r.is_ok());
  }
}

// ---- SSD tier -----------------------------------------------------------------------------

TEST(SsdTier, StoreFindRestoreAndRestartRebuildsIndexFromHeaders) {
  TempDir d;
  const auto toks = seq(1, 60);
  {
    auto t = open_tier(d.path);
    ASSERT_TRUE(t->store(*entry_of(toks)));
    EXPECT_EQ(t->stats().entries, 1u);
  }
  auto t = open_tier(d.path);  // "restart"
  EXPECT_EQ(t->stats().scan_indexed, 1u);
  const auto prompt = cat(seq(1, 40), {999});
  auto f = t->find(prompt, "base");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->prefix_len, 40);
  EXPECT_FALSE(t->find(prompt, "other"));
  std::string reason;
  auto e = t->restore(*f, &reason);
  ASSERT_TRUE(e);
  Result<Hit> h = serve_entry(*e, 40, Tier::kSsd);
  ASSERT_TRUE(h.is_ok());
  SequenceState s = std::move(h).value().into_state(kLayout, testing::kCtx);
  EXPECT_TRUE(kv_matches(s.kv, prompt, 40));
  // Continuation after restore equals a never-evicted continuation.
  extend(s, prompt, 40);
  EXPECT_TRUE(kv_matches(s.kv, prompt, 41));
}

TEST(SsdTier, LeftoverTempFilesReapedAndUnknownFilesKept) {
  TempDir d;
  auto t = open_tier(d.path);
  ASSERT_TRUE(t->store(*entry_of(seq(1, 10))));
  const std::string nsdir = t->identity_dir() + "/base";
  // What an interrupted write leaves: <entry-id>.lkv.tmp, zero where the prefix goes (it is
  // written last), or empty (killed right after the open).
  write_file(nsdir + "/" + entry_id("base", seq(5, 9)) + ".lkv.tmp", std::string(8192, '\0'));
  write_file(nsdir + "/" + entry_id("base", seq(6, 9)) + ".lkv.tmp", "");
  // Not provably ours: another name, or bytes where the prefix goes that are no LKV1 prefix.
  write_file(nsdir + "/deadbeef.lkv.tmp", "partial");
  write_file(nsdir + "/" + entry_id("base", seq(7, 9)) + ".lkv.tmp", "my own notes, named like a temp file");
  write_file(nsdir + "/notes.txt", "keep me");
  auto t2 = open_tier(d.path);
  EXPECT_EQ(t2->stats().scan_tmp_reaped, 2u);
  EXPECT_EQ(count_files(d.path, ".tmp"), 2u);
  EXPECT_EQ(read_all(nsdir + "/deadbeef.lkv.tmp"), "partial");
  EXPECT_EQ(count_files(d.path, "notes.txt"), 1u);
  EXPECT_EQ(t2->stats().entries, 1u);
}

// Issue 47: a namespace folder that is a symbolic link was followed by the startup scan, which
// deleted *.lkv / *.lkv.tmp files at its target, outside the cache directory.
TEST(SsdTier, ScanNeverFollowsALinkedNamespaceFolderNorDeletesForeignFiles) {
  TempDir d, outside;
  std::string valid, id_dir;
  {
    auto t = open_tier(d.path);
    ASSERT_TRUE(t->store(*entry_of(seq(1, 30))));
    valid = read_all(t->records()[0].path);
    id_dir = t->identity_dir();
  }
  // Outside the cache: a valid LKV1 file (a copy), a temp-like file, a non-LKV1 file.
  const std::string copy = outside.path + "/" + entry_id("base", seq(1, 30)) + ".lkv";
  const std::string tmp = outside.path + "/" + entry_id("base", seq(2, 30)) + ".lkv.tmp";
  const std::string other = outside.path + "/thesis.lkv";
  write_file(copy, valid);
  write_file(tmp, std::string(8192, '\0'));
  write_file(other, "chapter 1");
  ASSERT_EQ(::symlink(outside.path.c_str(), (id_dir + "/evil").c_str()), 0);
  ASSERT_EQ(::symlink(outside.path.c_str(), (id_dir + "/base2").c_str()), 0);
  ASSERT_EQ(::symlink(copy.c_str(), (id_dir + "/base/" + entry_id("base", seq(3, 30)) + ".lkv").c_str()), 0);
  // Inside the cache, named *.lkv but not an LKV1 file: not the tier's to delete either.
  write_file(id_dir + "/base/mine.lkv", "not a cache file");
  auto t = open_tier(d.path);
  EXPECT_EQ(t->stats().entries, 1u);
  EXPECT_TRUE(read_all(copy) == valid) << "the copy outside changed";
  EXPECT_TRUE(read_all(tmp) == std::string(8192, '\0')) << "the temp file outside changed";
  EXPECT_EQ(read_all(other), "chapter 1");
  EXPECT_EQ(read_all(id_dir + "/base/mine.lkv"), "not a cache file");
  struct stat st {};
  EXPECT_EQ(::lstat((id_dir + "/evil").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  // Stores never write through a linked namespace folder either.
  EXPECT_FALSE(t->store(*entry_of(seq(1, 30), {}, "base2")));
  EXPECT_EQ(count_files(outside.path, ".lkv"), 2u);
}

TEST(SsdTier, OpenRefusesAFolderThatIsNotACacheAndALinkedIdentityFolder) {
  TempDir home, outside;
  write_file(home.path + "/notes.txt", "mine");
  SsdConfig c;
  c.dir = home.path;
  c.identity = ident();
  auto r = SsdTier::open(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("not a larder cache"), std::string::npos) << r.status().message();
  EXPECT_FALSE(std::filesystem::exists(home.path + "/" + std::string(kCacheMarkerName)));
  EXPECT_EQ(read_all(home.path + "/notes.txt"), "mine");
  // A new folder gets the marker; an identity folder that is a link is refused.
  TempDir d;
  c.dir = d.path + "/cache";
  open_tier(c.dir, 1ull << 30, nullptr, ident("weights-b"));  // a cache (marker) of another model
  EXPECT_EQ(check_cache_dir(c.dir).kind, CacheDirKind::kMarked);
  ASSERT_EQ(::symlink(outside.path.c_str(), (c.dir + "/" + identity_id(c.identity)).c_str()), 0);
  r = SsdTier::open(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("symbolic link"), std::string::npos) << r.status().message();
  // A cache written before the marker existed (only the layout and LKV1 files) is adopted.
  TempDir legacy;
  {
    auto t = open_tier(legacy.path);
    ASSERT_TRUE(t->store(*entry_of(seq(1, 30))));
  }
  ASSERT_EQ(::unlink((legacy.path + "/" + std::string(kCacheMarkerName)).c_str()), 0);
  EXPECT_EQ(check_cache_dir(legacy.path).kind, CacheDirKind::kLegacy);
  EXPECT_EQ(open_tier(legacy.path)->stats().entries, 1u);
  EXPECT_EQ(check_cache_dir(legacy.path).kind, CacheDirKind::kMarked);
}

TEST(SsdTier, ForeignIdentityIgnoredAndLeftAlone) {
  TempDir d;
  {
    auto a = open_tier(d.path);
    ASSERT_TRUE(a->store(*entry_of(seq(1, 30))));
  }
  auto b = open_tier(d.path, 1ull << 30, nullptr, ident("weights-b"));  // other weights, same DIR
  EXPECT_EQ(b->stats().entries, 0u);
  EXPECT_FALSE(b->find(cat(seq(1, 30), {5}), "base"));
  EXPECT_EQ(count_files(d.path, ".lkv"), 1u);  // A's file untouched
  auto a2 = open_tier(d.path);
  EXPECT_EQ(a2->stats().entries, 1u);
}

TEST(SsdTier, TruncatedBitFlippedAndVersionBumpedFilesAreMissesAndRemoved) {
  TempDir d;
  const auto toks = seq(1, 80);
  const auto prompt = cat(toks, {1});
  struct Case {
    const char* name;
    bool after_scan;  // damage an indexed file (restore path) or before restart (scan path)
    std::string want_reason;
  };
  for (const Case& c : {Case{"truncate", false, ""}, Case{"truncate", true, "ssd_corrupt"},
                        Case{"flip-tensor", true, "ssd_corrupt"}, Case{"flip-header", false, ""},
                        Case{"version", false, ""}, Case{"version", true, "ssd_incompatible"}}) {
    SCOPED_TRACE(std::string(c.name) + (c.after_scan ? " after scan" : " before scan"));
    auto t = open_tier(d.path);
    t->clear();
    ASSERT_TRUE(t->store(*entry_of(toks)));
    const std::string path = t->records()[0].path;
    const uint64_t file_bytes = t->records()[0].bytes;
    auto damage = [&] {
      const std::string name = c.name;
      if (name == "truncate") {
        ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(file_bytes / 2)), 0);
      } else if (name == "flip-tensor") {
        auto info = read_lkv_info(path, nullptr);
        flip_byte(path, info->header["layers"][1]["tensors"][1]["off"].get<uint64_t>() + 17);
      } else if (name == "flip-header") {
        flip_byte(path, 60);
      } else {  // a newer format version, with a valid prefix checksum
        int fd = ::open(path.c_str(), O_RDWR);
        LkvPrefix p;
        ASSERT_EQ(::pread(fd, &p, sizeof p, 0), static_cast<ssize_t>(sizeof p));
        p.version = 2;
        p.prefix_xxh3 = XXH3_64bits(&p, 40);
        ASSERT_EQ(::pwrite(fd, &p, sizeof p, 0), static_cast<ssize_t>(sizeof p));
        ::close(fd);
      }
    };
    if (c.after_scan) {
      damage();
      auto f = t->find(prompt, "base");
      ASSERT_TRUE(f);
      std::string reason;
      EXPECT_FALSE(t->restore(*f, &reason));  // never garbage, never a crash
      EXPECT_EQ(reason, c.want_reason);
      EXPECT_EQ(t->stats().entries, 0u);
      EXPECT_EQ(count_files(d.path, ".lkv"), 0u);  // removed
    } else {
      t.reset();
      damage();
      auto t2 = open_tier(d.path);
      EXPECT_EQ(t2->stats().scan_removed, 1u);
      EXPECT_EQ(t2->stats().entries, 0u);
      EXPECT_FALSE(t2->find(prompt, "base"));
      EXPECT_EQ(count_files(d.path, ".lkv"), 0u);
      // The miss names the removed file when its key was still readable (a truncated tail),
      // never a plain divergence; a damaged key section cannot be attributed.
      RamTier ram(1ull << 30, t2.get());
      TakeResult miss = ram.take(prompt, "base");
      EXPECT_FALSE(miss.hit);
      const std::string file = path.substr(path.rfind('/') + 1);
      if (std::string(c.name) == "truncate") {
        EXPECT_EQ(miss.report.reason, "ssd_removed:" + file);
      } else {
        EXPECT_EQ(miss.report.reason.rfind("ssd_removed", 0), std::string::npos) << miss.report.reason;
      }
    }
  }
}

TEST(SsdTier, CapEvictsLruAndRestoreBumpsRecency) {
  TempDir d;
  auto probe = open_tier(d.path);
  ASSERT_TRUE(probe->store(*entry_of(seq(1, 100))));
  const uint64_t one = probe->stats().bytes;
  probe->clear();
  probe.reset();
  auto t = open_tier(d.path, one * 2 + one / 2);
  ASSERT_TRUE(t->store(*entry_of(seq(1, 100))));     // A
  ASSERT_TRUE(t->store(*entry_of(seq(1000, 100))));  // B
  std::string reason;
  auto f = t->find(cat(seq(1, 100), {1}), "base");
  ASSERT_TRUE(f && t->restore(*f, &reason));         // A becomes most recent
  ASSERT_TRUE(t->store(*entry_of(seq(2000, 100))));  // C evicts B
  EXPECT_TRUE(t->find(cat(seq(1, 100), {1}), "base"));
  EXPECT_FALSE(t->find(cat(seq(1000, 100), {1}), "base"));
  EXPECT_TRUE(t->find(cat(seq(2000, 100), {1}), "base"));
  EXPECT_LE(t->stats().bytes, one * 2 + one / 2);
  EXPECT_EQ(t->stats().evictions, 1u);
  // Explained through the RAM tier: the longer match was evicted from the SSD tier.
  RamTier ram(1ull << 30, t.get());
  TakeResult miss = ram.take(cat(seq(1000, 100), {1}), "base");
  EXPECT_FALSE(miss.hit);
  EXPECT_EQ(miss.report.reason, "evicted:ssd");
}

TEST(SsdTier, SupersedeOnlyTrimmableDuplicatesCollapse) {
  TempDir d;
  auto t = open_tier(d.path);
  ASSERT_TRUE(t->store(*entry_of(seq(1, 10))));
  ASSERT_TRUE(t->store(*entry_of(seq(1, 10))));  // same entry-id: replaced by rename
  EXPECT_EQ(t->stats().entries, 1u);
  ASSERT_TRUE(t->store(*entry_of(seq(1, 10), {}, "tenant")));
  ASSERT_TRUE(t->store(*entry_of(seq(1, 20))));
  EXPECT_EQ(t->stats().entries, 2u);  // base ancestor superseded; tenant kept
  ASSERT_TRUE(t->store(*entry_of(seq(500, 10), {.recurrent = true})));
  ASSERT_TRUE(t->store(*entry_of(seq(500, 20), {.recurrent = true})));
  EXPECT_EQ(t->stats().entries, 4u);  // untrimmable: the ancestor survives
  EXPECT_EQ(count_files(d.path, ".lkv"), 4u);
  // Untrimmable entries are found only whole: at 15 tokens the 20-token entry is unusable and
  // the 10-token checkpoint serves.
  auto f = t->find(cat(seq(500, 15), {1}), "base");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->prefix_len, 10);
  f = t->find(cat(seq(500, 20), {1}), "base");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->prefix_len, 20);
}

// ---- fault injection ----------------------------------------------------------------------

struct FaultyIo final : IoLayer {
  int fail_write_at = -1;  // index of the pwrite that fails
  int err = EIO;
  bool fail_sync = false, fail_rename = false;
  int writes = 0;
  ssize_t pwrite(int fd, const void* b, size_t n, off_t o) override {
    if (fail_write_at >= 0 && writes++ == fail_write_at) return -err;
    return IoLayer::pwrite(fd, b, n, o);
  }
  int fdatasync(int fd) override { return fail_sync ? -EIO : IoLayer::fdatasync(fd); }
  int rename(const char* a, const char* b) override { return fail_rename ? -EIO : IoLayer::rename(a, b); }
};

TEST(SsdFaults, WriteErrorsAtEveryStepLeaveNothingBehind) {
  TempDir d;
  FaultyIo io;
  auto t = open_tier(d.path, 1ull << 30, &io);
  auto e = entry_of(seq(1, 64), {.ring = true, .window = 8, .recurrent = true});
  for (int at = 0; at < 8; ++at) {
    io = FaultyIo();
    io.fail_write_at = at;
    EXPECT_FALSE(t->store(*e)) << at;
    EXPECT_EQ(count_files(d.path, ".tmp"), 0u);
    EXPECT_EQ(count_files(d.path, ".lkv"), 0u);
  }
  io = FaultyIo();
  io.fail_sync = true;
  EXPECT_FALSE(t->store(*e));
  io = FaultyIo();
  io.fail_rename = true;
  EXPECT_FALSE(t->store(*e));
  EXPECT_EQ(count_files(d.path, ".tmp"), 0u);
  EXPECT_EQ(t->stats().entries, 0u);
  EXPECT_EQ(t->stats().write_failures, 10u);
  io = FaultyIo();
  EXPECT_TRUE(t->store(*e));  // the tier serves on after failures
  EXPECT_EQ(t->stats().entries, 1u);
}

TEST(SsdFaults, DiskFullIsAFailedWriteNotACrash) {
  TempDir d;
  const std::string mnt = d.path + "/small";
  ::mkdir(mnt.c_str(), 0700);
  const bool mounted = ::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=96k") == 0;
  FaultyIo io;
  if (!mounted) {  // not permitted here: inject ENOSPC at the I/O layer instead
    io.fail_write_at = 1;
    io.err = ENOSPC;
  }
  std::printf("[ ENOSPC ] method: %s\n", mounted ? "tmpfs mount (size=96k)" : "injected I/O layer (mount refused)");
  ::testing::Test::RecordProperty("enospc_method", mounted ? "tmpfs" : "injected");
  {
    auto t = open_tier(mnt, 1ull << 30, mounted ? nullptr : &io);
    auto big = entry_of(seq(1, 2000));  // 2 layers × 2 × 2000 × 8 floats = 256 KiB > 96 KiB
    EXPECT_FALSE(t->store(*big));
    EXPECT_EQ(t->stats().write_no_space, 1u);
    EXPECT_EQ(count_files(mnt, ".tmp"), 0u);
    io = FaultyIo();
    EXPECT_TRUE(t->store(*entry_of(seq(1, 20))));  // space freed by the unlink: serving on
  }
  if (mounted) ASSERT_EQ(::umount(mnt.c_str()), 0);
}

TEST(SsdFaults, SigkillDuringWritesNeverPoisons) {
  TempDir d;
  const Kinds k{.ring = true, .window = 32, .recurrent = true};
  std::mt19937 rng(12345);
  int killed_mid_run = 0;
  for (int round = 0; round < 50; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Child: write entries as fast as possible until killed. Sizes vary so kills land in
      // tensor writes, header writes, syncs and renames.
      auto t = open_tier(d.path, 1ull << 30, nullptr, ident(), VerifyPolicy::kFull, RestoreMode::kMmap, false);
      for (int i = 0;; ++i) {
        const auto toks = seq(round * 100000 + i * 1000, 20 + (i % 5) * 150);
        t->store(*entry_of(toks, k));
      }
      ::_exit(0);
    }
    ::usleep(1000 + rng() % 15000);
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) ++killed_mid_run;
  }
  EXPECT_EQ(killed_mid_run, 50);
  // Restart: scan, then restore every indexed entry with full verification.
  auto t = open_tier(d.path);
  const SsdStats st = t->stats();
  std::printf("[ SIGKILL ] 50 kills: %zu entries indexed, %llu temp files reaped, %llu removed at scan\n",
              st.entries, static_cast<unsigned long long>(st.scan_tmp_reaped),
              static_cast<unsigned long long>(st.scan_removed));
  EXPECT_GT(st.entries, 0u);
  EXPECT_EQ(count_files(d.path, ".tmp"), 0u);
  size_t poisoned = 0;
  for (const SsdRecord& r : t->records()) {
    std::string reason;
    auto e = t->restore(ColdFind{static_cast<int64_t>(r.tokens.size()), r.entry_id}, &reason);
    if (!e) {
      ++poisoned;  // a published file must always restore
      continue;
    }
    expect_equivalent(*e, k);
    if (::testing::Test::HasFailure()) ++poisoned;
  }
  EXPECT_EQ(poisoned, 0u);
}

// ---- store facade: write-behind, flush, restart, pressure ---------------------------------

KvStoreConfig store_cfg(const std::string& dir, size_t ram_cap = 1ull << 30, IoLayer* io = nullptr) {
  KvStoreConfig c;
  c.ram_cap_bytes = ram_cap;
  c.ssd_dir = dir;
  c.identity = ident();
  c.io = io;
  return c;
}

TEST(KvStore, FlushPersistsEveryRamEntryAndRestartRestoresFromSsd) {
  TempDir d;
  const auto a = seq(1, 120), b = seq(5000, 90);
  {
    auto s = KvStore::open(store_cfg(d.path)).value();
    s->wait_ssd_ready();
    ASSERT_TRUE(s->put(a, prefilled(a, kAll), "base").is_ok());
    ASSERT_TRUE(s->put(b, prefilled(b, kAll), "base").is_ok());
    EXPECT_EQ(s->stats().dirty_keys, 2u);
    EXPECT_EQ(s->write_behind(), 2u);
    FlushReport f = s->flush();
    EXPECT_TRUE(f.durable);
    EXPECT_TRUE(f.not_written.empty());
    EXPECT_EQ(count_files(d.path, ".lkv"), 2u);
  }
  auto s = KvStore::open(store_cfg(d.path)).value();
  s->wait_ssd_ready();
  const auto prompt = cat(seq(1, 100), {42, 43});
  TakeResult t = s->take(prompt, "base");
  ASSERT_TRUE(t.hit);
  EXPECT_EQ(t.hit->tier, Tier::kSsd);
  EXPECT_EQ(t.report.tier, Tier::kSsd);
  EXPECT_EQ(t.hit->tokens, 100);
  SequenceState st = std::move(*t.hit).into_state(kLayout, testing::kCtx);
  EXPECT_TRUE(kv_matches(st.kv, prompt, 100));
  ASSERT_EQ(st.layers.size(), 1u);
  EXPECT_EQ(st.layers[0]->offset(), 100);  // the ring view was trimmed, pre-wrap
  extend(st, prompt, 100);
  EXPECT_TRUE(kv_matches(st.kv, prompt, 102));
  // Putting the extended state makes it resident; the mapping is referenced, not copied.
  ASSERT_TRUE(s->put(prompt, std::move(st), "base").is_ok());
  EXPECT_GT(s->stats().ram.mapped_bytes, 0u);
  EXPECT_EQ(s->stats().lookups_hit_ssd, 1u);
}

TEST(KvStore, EvictionSpillsThroughQueueAndLaterRestores) {
  TempDir d;
  const size_t one = prefilled(seq(1, 100)).kv.owned_bytes();
  auto s = KvStore::open(store_cfg(d.path, one + one / 2)).value();
  s->wait_ssd_ready();
  ASSERT_TRUE(s->put(seq(1, 100), prefilled(seq(1, 100)), "base").is_ok());
  ASSERT_TRUE(s->put(seq(900, 100), prefilled(seq(900, 100)), "base").is_ok());  // evicts + spills the first
  EXPECT_EQ(s->stats().ram.entries, 1u);
  FlushReport f = s->flush();
  EXPECT_TRUE(f.durable);
  TakeResult t = s->take(cat(seq(1, 100), {7}), "base");
  ASSERT_TRUE(t.hit);
  EXPECT_EQ(t.hit->tier, Tier::kSsd);
  EXPECT_EQ(t.hit->tokens, 100);
  // demote_idle spills everything; a later take restores it.
  EXPECT_EQ(s->demote_idle(std::chrono::seconds(0)), 1u);
  (void)s->flush();
  t = s->take(cat(seq(900, 100), {7}), "base");
  ASSERT_TRUE(t.hit);
  EXPECT_EQ(t.hit->tier, Tier::kSsd);
}

TEST(KvStore, PressureReliefWithFailingDiskKeepsEntriesAndFlushReports) {
  TempDir d;
  FaultyIo io;
  auto s = KvStore::open(store_cfg(d.path, 1ull << 30, &io)).value();
  s->wait_ssd_ready();
  ASSERT_TRUE(s->put(seq(1, 50), prefilled(seq(1, 50)), "base").is_ok());
  io.fail_write_at = 0;
  io.err = EIO;
  EXPECT_EQ(s->relieve_pressure([] { return true; }), 0u);
  EXPECT_EQ(s->stats().ram.entries, 1u);
  EXPECT_EQ(s->stats().ram.demotions, 0u);
  io.writes = 0;
  io.fail_write_at = 0;
  FlushReport f = s->flush();
  EXPECT_FALSE(f.durable);
  EXPECT_GE(f.failed, 1u);
  ASSERT_FALSE(f.not_written.empty());
  EXPECT_NE(f.not_written[0].find("write_failed"), std::string::npos);
  io = FaultyIo();
  EXPECT_EQ(s->relieve_pressure([&] { return s->stats().ram.entries > 0; }), 1u);
  EXPECT_EQ(s->stats().ram.demotions, 1u);
  EXPECT_EQ(count_files(d.path, ".lkv"), 1u);
}

TEST(KvStore, CorruptFileIsAMissWithReasonAndServingContinues) {
  TempDir d;
  const auto a = seq(1, 60);
  {
    auto s = KvStore::open(store_cfg(d.path)).value();
    s->wait_ssd_ready();
    ASSERT_TRUE(s->put(a, prefilled(a), "base").is_ok());
    ASSERT_TRUE(s->flush().durable);
  }
  auto files = testing::list_files(d.path, ".lkv");
  ASSERT_EQ(files.size(), 1u);
  auto info = read_lkv_info(files[0], nullptr);
  flip_byte(files[0], info->header["layers"][0]["tensors"][0]["off"].get<uint64_t>() + 5);
  auto s = KvStore::open(store_cfg(d.path)).value();
  s->wait_ssd_ready();
  TakeResult t = s->take(cat(a, {1}), "base");
  EXPECT_FALSE(t.hit);
  EXPECT_EQ(t.report.reason, "ssd_corrupt");
  EXPECT_EQ(count_files(d.path, ".lkv"), 0u);
  EXPECT_EQ(s->stats().miss_reasons.at("ssd_corrupt"), 1u);
  // Serving continues: the request prefills cold and its put works.
  ASSERT_TRUE(s->put(cat(a, {1}), prefilled(cat(a, {1})), "base").is_ok());
  EXPECT_TRUE(s->take(cat(a, {1, 2}), "base").hit);
}

TEST(KvStore, ScanningIsReportedAndSsdRequiresRam) {
  TempDir d;
  KvStoreConfig c = store_cfg(d.path, 0);
  EXPECT_FALSE(KvStore::open(c).is_ok());
  auto s = KvStore::open(store_cfg(d.path)).value();
  s->wait_ssd_ready();
  TakeResult t = s->take(seq(1, 5), "base");
  EXPECT_EQ(t.report.reason, "empty_namespace");
  const std::string prom = stats_prometheus(s->stats());
  EXPECT_NE(prom.find("larder_kv_lookups_total{result=\"miss\"} 1"), std::string::npos);
  EXPECT_TRUE(stats_json(s->stats()).contains("ram"));
}

TEST(SpillQueue, ByteCapDropsOldestAndNeverTheNewest) {
  TempDir d;
  auto tier = open_tier(d.path);
  auto e1 = entry_of(seq(1, 100)), e2 = entry_of(seq(1000, 100)), e3 = entry_of(seq(2000, 100));
  const size_t one = e1->bytes(Backing::kAnon);
  SpillQueue q(tier.get(), one * 2, false);
  q.set_busy(true);  // idle gate closed: nothing is written while the engine is busy
  EXPECT_TRUE(q.snapshot(e1));
  q.spill(e2);
  q.spill(e3);  // over cap: the snapshot goes first
  QueueStats st = q.stats();
  EXPECT_EQ(st.dropped, 1u);
  EXPECT_LE(st.queued_bytes, one * 2);
  EXPECT_FALSE(q.snapshot(entry_of(seq(3000, 100))));  // above 75 %: refused, key stays dirty
  auto big = entry_of(seq(5000, 400));
  q.spill(big);  // bigger than the cap alone: it stays (soft cap of one item), older spills go
  st = q.stats();
  EXPECT_EQ(st.queued_items, 1u);
  EXPECT_EQ(st.written, 0u);
  q.set_busy(false);
  q.drain();
  st = q.stats();
  EXPECT_EQ(st.written, 1u);
  EXPECT_EQ(tier->stats().entries, 1u);
}

TEST(SsdTier, VerificationCostMeasured) {
  TempDir d;
  const KvLayout big{4, 8, 64};  // 4 layers × 8 heads × 64 dims × 2 (K,V) × 4 B = 16 KiB/token
  const auto toks = seq(1, 2048);  // 32 MiB of KV
  auto e = make_entry(toks, prefilled(toks, {}, big), "base", "full").value();
  const std::string path = d.path + "/big.lkv";
  ASSERT_TRUE(write_lkv(path, *e, ident(), posix_io()).is_ok());
  for (VerifyPolicy v : {VerifyPolicy::kOff, VerifyPolicy::kSampled, VerifyPolicy::kFull}) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = read_lkv(path, nullptr, v, RestoreMode::kMmap);
    ASSERT_TRUE(r.is_ok());
    // Touch every byte once, as the first attention pass would.
    double sum = 0;
    std::vector<KvSpan> sp;
    for (int l = 0; l < big.n_layers; ++l) {
      sp.clear();
      (*r)->kv->prefix_spans(l, 2048, &sp);
      for (int64_t i = 0; i < 2048 * big.row_floats(); i += 1024) sum += sp[0].k_f32()[i] + sp[0].v_f32()[i];
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ VERIFY ] %-7s restore+touch of 32 MiB: %.2f ms (%.2f GB/s) %g\n",
                v == VerifyPolicy::kOff ? "off" : v == VerifyPolicy::kSampled ? "sampled" : "full", s * 1e3,
                32.0 * 1.048576e-3 / s, sum * 0);
  }
}

// ---- admin --------------------------------------------------------------------------------

TEST(CacheAdmin, LsInspectVerifyClear) {
  TempDir d;
  auto t = open_tier(d.path);
  ASSERT_TRUE(t->store(*entry_of(seq(1, 30))));
  ASSERT_TRUE(t->store(*entry_of(seq(100, 30), {.recurrent = true}, "tenant")));
  write_file(t->identity_dir() + "/base/" + entry_id("base", seq(9, 9)) + ".lkv.tmp", std::string(4096, '\0'));
  { std::ofstream(t->identity_dir() + "/base/README") << "x"; }
  auto ls = cache_ls(d.path);
  ASSERT_TRUE(ls.is_ok());
  EXPECT_EQ(ls->size(), 3u);
  size_t ok = 0;
  for (const auto& f : *ls) {
    if (f.status.is_ok()) {
      ++ok;
      EXPECT_EQ(f.n_tokens, 30);
      EXPECT_EQ(f.model_label, "synthetic");
    }
  }
  EXPECT_EQ(ok, 2u);
  auto recs = t->records();
  auto insp = cache_inspect(recs[0].path);
  ASSERT_TRUE(insp.is_ok());
  EXPECT_EQ((*insp)["header"]["n_tokens"], 30);
  auto v = cache_verify(d.path);
  ASSERT_TRUE(v.is_ok());
  ASSERT_EQ(v->size(), 2u);
  for (const auto& r : *v) EXPECT_TRUE(r.status.is_ok()) << r.status.to_string();
  auto info = read_lkv_info(recs[0].path, nullptr);
  flip_byte(recs[0].path, info->header["layers"][0]["tensors"][1]["off"].get<uint64_t>());
  v = cache_verify(recs[0].path);
  ASSERT_EQ(v->size(), 1u);
  EXPECT_EQ((*v)[0].status.code(), StatusCode::kCorrupt);
  auto c = cache_clear(d.path);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->files_removed, 3u);
  EXPECT_EQ(count_files(d.path, ".lkv"), 0u);
  EXPECT_EQ(count_files(d.path, "README"), 1u);  // not ours: kept
  ASSERT_EQ(c->kept.size(), 1u);
  EXPECT_NE(c->kept[0].find("README"), std::string::npos);
}

// Issue 47: `cache clear DIR` removed every regular file one level inside DIR's subfolders,
// whatever its name (~/.ssh/id_rsa, Documents/thesis.tex), and every folder left empty.
TEST(CacheAdmin, EveryVerbRefusesAFolderThatIsNotACache) {
  TempDir home, outside;
  std::string valid;
  {
    TempDir c;
    auto t = open_tier(c.path);
    ASSERT_TRUE(t->store(*entry_of(seq(1, 30))));
    valid = read_all(t->records()[0].path);
  }
  ASSERT_EQ(::mkdir((home.path + "/.ssh").c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((home.path + "/Documents").c_str(), 0700), 0);
  write_file(home.path + "/.ssh/id_rsa", "KEY");
  write_file(home.path + "/.ssh/authorized_keys", "ssh-ed25519 AAAA");
  write_file(home.path + "/Documents/thesis.tex", "\\chapter{One}");
  write_file(home.path + "/Documents/fake.lkv", "not an LKV1 header");
  write_file(outside.path + "/" + entry_id("base", seq(1, 30)) + ".lkv", valid);
  write_file(outside.path + "/" + entry_id("base", seq(2, 30)) + ".lkv.tmp", std::string(4096, '\0'));
  ASSERT_EQ(::symlink(outside.path.c_str(), (home.path + "/Documents/base").c_str()), 0);
  const auto before = list_files(home.path, "");
  auto c = cache_clear(home.path);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("not a larder cache"), std::string::npos) << c.status().message();
  EXPECT_FALSE(cache_ls(home.path).is_ok());
  EXPECT_FALSE(cache_verify(home.path).is_ok());
  EXPECT_EQ(list_files(home.path, ""), before);
  EXPECT_EQ(read_all(home.path + "/.ssh/id_rsa"), "KEY");
  EXPECT_EQ(read_all(home.path + "/Documents/thesis.tex"), "\\chapter{One}");
  EXPECT_EQ(count_files(outside.path, ".lkv"), 1u);
  EXPECT_EQ(count_files(outside.path, ".lkv.tmp"), 1u);
  EXPECT_FALSE(cache_clear(home.path + "/nope").is_ok());
}

// Inside a real cache, clear removes the tier's files and empty folders only: links are never
// followed (nor removed), files that are not LKV1 stay and are reported.
TEST(CacheAdmin, ClearRemovesOnlyTheCachesOwnFilesAndNeverFollowsLinks) {
  TempDir d, outside;
  auto t = open_tier(d.path);
  ASSERT_TRUE(t->store(*entry_of(seq(1, 30))));
  ASSERT_TRUE(t->store(*entry_of(seq(100, 30), {}, "tenant")));
  const std::string id_dir = t->identity_dir();
  const std::string valid = read_all(t->records()[0].path);
  const std::string leftover = id_dir + "/base/" + entry_id("base", seq(4, 9)) + ".lkv.tmp";
  write_file(leftover, std::string(8192, '\0'));
  const std::string copy = outside.path + "/" + entry_id("base", seq(1, 30)) + ".lkv";
  const std::string tmp = outside.path + "/" + entry_id("base", seq(2, 30)) + ".lkv.tmp";
  write_file(copy, valid);
  write_file(tmp, std::string(8192, '\0'));
  ASSERT_EQ(::symlink(outside.path.c_str(), (id_dir + "/evil").c_str()), 0);                    // a namespace folder
  ASSERT_EQ(::symlink(outside.path.c_str(), (d.path + "/" + std::string(32, 'a')).c_str()), 0);  // an identity folder
  ASSERT_EQ(::symlink(copy.c_str(), (id_dir + "/base/" + entry_id("base", seq(5, 9)) + ".lkv").c_str()), 0);
  write_file(id_dir + "/base/fake.lkv", "wrong header");
  write_file(d.path + "/notes.txt", "mine");
  auto c = cache_clear(d.path);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->files_removed, 3u);  // two entries and the leftover temp file
  EXPECT_TRUE(c->errors.empty());
  EXPECT_EQ(c->kept.size(), 5u);
  EXPECT_FALSE(std::filesystem::exists(leftover));
  EXPECT_FALSE(std::filesystem::exists(id_dir + "/tenant"));  // emptied: removed
  EXPECT_TRUE(std::filesystem::exists(id_dir + "/base"));     // still holds foreign files
  EXPECT_TRUE(read_all(copy) == valid) << "the copy outside changed";
  EXPECT_TRUE(read_all(tmp) == std::string(8192, '\0')) << "the temp file outside changed";
  EXPECT_EQ(read_all(id_dir + "/base/fake.lkv"), "wrong header");
  EXPECT_EQ(read_all(d.path + "/notes.txt"), "mine");
  struct stat st {};
  EXPECT_EQ(::lstat((id_dir + "/evil").c_str(), &st), 0);
  EXPECT_EQ(::lstat((d.path + "/" + std::string(32, 'a')).c_str(), &st), 0);
  // ls lists the link without reading through it; verify reads only the cache's own files.
  auto ls = cache_ls(d.path);
  ASSERT_TRUE(ls.is_ok());
  for (const auto& f : *ls) EXPECT_FALSE(f.status.is_ok()) << f.path;
  auto v = cache_verify(d.path);
  ASSERT_TRUE(v.is_ok());
  ASSERT_EQ(v->size(), 1u);  // fake.lkv: refused as corrupt, never a read through a link
  EXPECT_NE((*v)[0].path.find("fake.lkv"), std::string::npos);
}

// ---- identity -----------------------------------------------------------------------------

TEST(Identity, ContentDerivedAndDeterministic) {
  EXPECT_EQ(namespace_id({}), "base");
  const std::string a = namespace_id({{"hash-a", 1.0}});
  EXPECT_EQ(a, namespace_id({{"hash-a", 1.0}}));
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, namespace_id({{"hash-a", 0.5}}));
  EXPECT_NE(a, namespace_id({{"hash-b", 1.0}}));
  EXPECT_NE(namespace_id({}, "s1"), namespace_id({}, "s2"));
  EXPECT_NE(namespace_id({{"x", 1}, {"y", 1}}), namespace_id({{"y", 1}, {"x", 1}}));
  const auto toks = seq(1, 10);
  EXPECT_EQ(entry_id("base", toks), entry_id("base", toks));
  EXPECT_NE(entry_id("base", toks), entry_id("other", toks));
  StoreIdentity i1 = ident(), i2 = ident();
  i2.model_label = "renamed";
  EXPECT_EQ(identity_id(i1), identity_id(i2));  // labels are cosmetic
  i2.tokenizer_fp = "tok2";
  EXPECT_NE(identity_id(i1), identity_id(i2));
  // A fine-tune shares its base's header but not its bytes: the weights id tells them apart.
  TempDir d;
  std::string base(1 << 22, 'a'), tuned = base;
  tuned[((1 << 22) - 65536) * 8 / 15 + 100] = 'b';  // inside the 9th 64 KiB sample
  { std::ofstream(d.path + "/w1") << base; }
  { std::ofstream(d.path + "/w2") << tuned; }
  auto w1 = weights_fingerprint({d.path + "/w1"}), w2 = weights_fingerprint({d.path + "/w2"});
  ASSERT_TRUE(w1.is_ok() && w2.is_ok());
  EXPECT_NE(*w1, *w2);
  auto c1 = content_hash({d.path + "/w1"}), c2 = content_hash({d.path + "/w2"});
  EXPECT_NE(*c1, *c2);
}

}  // namespace
}  // namespace larder::memory
