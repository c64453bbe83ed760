#include "larder/memory/store/ssd_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <xxhash.h>

#include "larder/core/log.h"
#include "larder/memory/store/cache_dir.h"

namespace larder::memory {

namespace fs = std::filesystem;

namespace {

// A folder of the cache: created 0700, or an existing real directory — never a link (the tier
// would otherwise read, write and delete at its target, outside the cache directory).
Status make_dir(const std::string& p) {
  if (::mkdir(p.c_str(), 0700) == 0) return Status::ok();
  if (errno != EEXIST) return io_error(strfmt("[ssd-cache] cannot create %s: %s", p.c_str(), std::strerror(errno)));
  struct stat st {};
  if (::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return Status::ok();
  return io_error(strfmt("[ssd-cache] %s is %s, not a folder of the cache; larder never follows links out of its "
                         "cache directory",
                         p.c_str(), S_ISLNK(st.st_mode) ? "a symbolic link" : "not a directory"));
}

bool ends_with(const std::string& s, const char* suf) {
  const size_t n = std::strlen(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

bool is_prefix_of(const std::vector<TokenId>& a, const std::vector<TokenId>& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace

std::string ns_dir_name(const std::string& ns) {
  bool safe = !ns.empty() && ns.size() <= 64;
  for (char c : ns) safe = safe && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-');
  return safe ? ns : "h" + hex64(XXH3_64bits(ns.data(), ns.size()));
}

SsdTier::SsdTier(SsdConfig c) : cfg_(std::move(c)), io_(cfg_.io ? cfg_.io : &posix_io()) {
  id_dir_ = cfg_.dir + "/" + identity_id(cfg_.identity);
}

Result<std::unique_ptr<SsdTier>> SsdTier::open(SsdConfig config) {
  LARDER_RETURN_IF_ERROR(prepare_cache_dir(config.dir));  // refuses a folder that is not a larder cache
  std::unique_ptr<SsdTier> t(new SsdTier(std::move(config)));
  LARDER_RETURN_IF_ERROR(make_dir(t->id_dir_));
  return t;
}

std::string SsdTier::path_for(const std::string& ns, std::span<const TokenId> tokens) const {
  return id_dir_ + "/" + ns_dir_name(ns) + "/" + entry_id(ns, tokens) + ".lkv";
}

void SsdTier::scan() {
  std::vector<SsdRecord> found;
  std::vector<std::pair<int64_t, size_t>> by_mtime;
  uint64_t removed = 0, reaped = 0, removed_corrupt = 0, removed_incompatible = 0;
  std::vector<Removed> removed_keys;
  // Every directory is opened without following links and every file is judged and removed
  // relative to its directory's descriptor: a namespace folder that is a link (or becomes one)
  // is never entered, so nothing outside the cache directory is read or deleted.
  DirFd idfd = open_dir_at(AT_FDCWD, id_dir_);
  auto ns_names = idfd.ok() ? list_dir(idfd.get()) : Result<std::vector<std::string>>(std::vector<std::string>{});
  if (!idfd.ok() || !ns_names.is_ok()) {
    log_warn_once("ssd-scan-open", strfmt("[ssd-cache] cannot read %s: %s", id_dir_.c_str(),
                                          idfd.ok() ? ns_names.status().message().c_str() : std::strerror(errno)));
  }
  for (const std::string& ns_name : ns_names.is_ok() ? *ns_names : std::vector<std::string>{}) {
    const EntryKind nk = entry_kind(idfd.get(), ns_name);
    if (nk == EntryKind::kLink) {
      log_warn_once("ssd-scan-link", strfmt("[ssd-cache] %s/%s is a symbolic link: not followed, left alone",
                                            id_dir_.c_str(), ns_name.c_str()));
    }
    if (nk != EntryKind::kDir) continue;
    DirFd nsfd = open_dir_at(idfd.get(), ns_name);
    if (!nsfd.ok()) continue;  // swapped for a link since: not followed
    auto files = list_dir(nsfd.get());
    if (!files.is_ok()) continue;
    for (const std::string& name : *files) {
      const std::string path = id_dir_ + "/" + ns_name + "/" + name;
      if (ends_with(name, ".lkv.tmp")) {  // an interrupted write: never read, reaped when provably ours
        std::string why;
        if (is_own_file(nsfd.get(), name, &why)) {
          ::unlinkat(nsfd.get(), name.c_str(), 0);
          ++reaped;
        } else {
          log_warn_once("ssd-scan-foreign", strfmt("[ssd-cache] %s: %s; left alone", path.c_str(), why.c_str()));
        }
        continue;
      }
      if (!ends_with(name, ".lkv")) continue;  // unknown extensions are not ours to judge
      const EntryKind fk = entry_kind(nsfd.get(), name);
      if (fk == EntryKind::kLink) {
        log_warn_once("ssd-scan-link", strfmt("[ssd-cache] %s is a symbolic link: not followed, left alone", path.c_str()));
        continue;
      }
      LkvKey key;
      Result<LkvInfo> info = read_lkv_info_at(nsfd.get(), name, path, &cfg_.identity, &key, /*follow=*/false);
      Status bad = info.is_ok() ? Status::ok() : info.status();
      if (bad.is_ok()) {
        // The name must be the content address of (ns, tokens): a renamed or misplaced file
        // could otherwise shadow another key.
        if (name != entry_id(info->ns, info->tokens) + ".lkv" ||
            ns_name != ns_dir_name(info->ns)) {
          bad = corrupt(strfmt("[ssd-cache] %s: name does not match its content", path.c_str()));
        } else if (!cfg_.expected_signature.empty() &&
                   info->header.value("signature", "") != cfg_.expected_signature) {
          bad = incompatible(strfmt("[ssd-cache] %s: storage signature differs from the model's", path.c_str()));
        }
      }
      // Removed only when provably the tier's (valid LKV1 prefix), or a FIFO / socket under an
      // entry's name (it holds no data, and it would fail every later scan); anything else stays.
      std::string why;
      if (!bad.is_ok() && fk == EntryKind::kFile && !is_own_file(nsfd.get(), name, &why)) {
        log_warn_once("ssd-scan-foreign", strfmt("[ssd-cache] %s: %s; left alone", path.c_str(), why.c_str()));
        continue;
      }
      if (!bad.is_ok() && fk != EntryKind::kFile && !(fk == EntryKind::kOther && is_temp_name(name + ".tmp"))) {
        log_warn_once("ssd-scan-foreign", strfmt("[ssd-cache] %s: not a regular file; left alone", path.c_str()));
        continue;
      }
      if (!bad.is_ok()) {
        log_warn_once("ssd-scan-" + std::string(status_code_name(bad.code())),
                      strfmt("[ssd-cache] removing unusable file at startup: %s", bad.message().c_str()));
        LARDER_LOG_DEBUG("[ssd-cache] scan removed %s: %s", path.c_str(), bad.message().c_str());
        ::unlinkat(nsfd.get(), name.c_str(), 0);
        ++removed;
        if (!key.tokens.empty()) removed_keys.push_back({key.ns, name, std::move(key.tokens)});
        // Counted with the restore failures of the same class, so /stats shows them.
        if (bad.code() == StatusCode::kIncompatible) {
          ++removed_incompatible;
        } else if (bad.code() != StatusCode::kIoError) {
          ++removed_corrupt;
        }
        continue;
      }
      SsdRecord r;
      r.entry_id = name.substr(0, name.size() - 4);
      r.ns = info->ns;
      r.path = path;
      r.tokens = std::move(info->tokens);
      r.bytes = info->allocated_bytes;
      r.trimmable = info->header.value("trimmable", false);
      r.floor = info->header.value("floor", int64_t{0});
      r.label = info->header.value("label", "full");
      by_mtime.push_back({info->mtime_ns, found.size()});
      found.push_back(std::move(r));
    }
  }
  // Recency from mtime (restores bump it with utimensat), oldest first.
  std::sort(by_mtime.begin(), by_mtime.end());
  size_t indexed = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t c = 0;
    for (auto& [m, i] : by_mtime) found[i].recency = ++c;
    // Entries stored while the scan ran stay (they are newer than anything scanned).
    for (SsdRecord& r : index_) {
      auto it = std::find_if(found.begin(), found.end(), [&](const SsdRecord& f) { return f.entry_id == r.entry_id; });
      r.recency = ++c;
      if (it == found.end()) found.push_back(std::move(r)); else *it = std::move(r);
    }
    index_ = std::move(found);
    clock_ = c;
    stats_.scan_indexed = indexed = index_.size();
    stats_.scan_removed += removed;
    stats_.corrupt += removed_corrupt;
    stats_.incompatible += removed_incompatible;
    stats_.scan_tmp_reaped += reaped;
    for (Removed& r : removed_keys) {
      removed_keys_.push_back(std::move(r));
      if (removed_keys_.size() > 32) removed_keys_.pop_front();
    }
    evict_locked("");
    stats_.ready = true;
    ready_.store(true, std::memory_order_release);
  }
  ready_cv_.notify_all();
  LARDER_LOG_INFO("[ssd-cache] %s: %zu entries indexed, %llu unusable removed, %llu temp files reaped",
                  id_dir_.c_str(), indexed, static_cast<unsigned long long>(removed),
                  static_cast<unsigned long long>(reaped));
}

void SsdTier::wait_ready() const {
  std::unique_lock<std::mutex> lock(mu_);
  ready_cv_.wait(lock, [&] { return ready_.load(); });
}

bool SsdTier::wait_ready_for(std::chrono::milliseconds limit) const {
  std::unique_lock<std::mutex> lock(mu_);
  return ready_cv_.wait_for(lock, limit, [&] { return ready_.load(); });
}

int64_t SsdTier::usable(const SsdRecord& r, std::span<const TokenId> prompt) {
  if (prompt.empty()) return -1;
  const int64_t lcp = common_prefix(r.tokens, prompt);
  const int64_t p = std::min<int64_t>(lcp, static_cast<int64_t>(prompt.size()) - 1);
  if (p <= 0 || p < r.floor) return -1;
  if (static_cast<int64_t>(r.tokens.size()) > p && !r.trimmable) return -1;
  return p;
}

std::optional<ColdFind> SsdTier::find(std::span<const TokenId> prompt, const std::string& ns, int64_t) {
  if (!ready()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  int64_t best = 0;
  const SsdRecord* pick = nullptr;
  for (const SsdRecord& r : index_) {
    if (r.ns != ns) continue;
    const int64_t p = usable(r, prompt);
    if (p > best) {
      best = p;
      pick = &r;
    }
  }
  if (!pick) return std::nullopt;
  return ColdFind{best, pick->entry_id};
}

ColdProbe SsdTier::probe(std::span<const TokenId> prompt, const std::string& ns) {
  ColdProbe p;
  if (!ready()) {
    p.scanning = true;
    return p;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const SsdRecord& r : index_) {
    const int64_t lcp = common_prefix(r.tokens, prompt);
    if (r.ns == ns) {
      p.any_same_ns = true;
      p.best_lcp = std::max(p.best_lcp, lcp);
    } else if (lcp > p.best_lcp_other_ns) {
      p.best_lcp_other_ns = lcp;
      p.best_other_ns = r.ns;
    }
  }
  for (const auto& [ns_g, toks] : ghosts_)
    if (ns_g == ns) p.evicted_lcp = std::max(p.evicted_lcp, common_prefix(toks, prompt));
  for (const Removed& r : removed_keys_) {
    if (r.ns != ns) continue;
    const int64_t lcp = common_prefix(r.tokens, prompt);
    if (lcp > p.removed_lcp) {
      p.removed_lcp = lcp;
      p.removed_file = r.file;
    }
  }
  return p;
}

std::shared_ptr<const Entry> SsdTier::restore(const ColdFind& found, std::string* reason) {
  SsdRecord rec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(index_.begin(), index_.end(), [&](const SsdRecord& r) { return r.entry_id == found.handle; });
    if (it == index_.end()) {
      if (reason) *reason = "ssd_io";
      return nullptr;
    }
    rec = *it;
  }
  Result<std::shared_ptr<const Entry>> r = read_lkv(rec.path, &cfg_.identity, cfg_.verify, cfg_.restore);
  Status bad = r.is_ok() ? Status::ok() : r.status();
  if (bad.is_ok() && ((*r)->tokens != rec.tokens || (*r)->ns != rec.ns)) {
    bad = corrupt(strfmt("[ssd-cache] %s: content changed since it was indexed", rec.path.c_str()));
  } else if (bad.is_ok() && !cfg_.expected_signature.empty() && (*r)->signature != cfg_.expected_signature) {
    bad = incompatible(strfmt("[ssd-cache] %s: storage signature '%s' differs from the model's '%s'",
                              rec.path.c_str(), (*r)->signature.c_str(), cfg_.expected_signature.c_str()));
  }
  if (!bad.is_ok()) {
    const char* why = bad.code() == StatusCode::kCorrupt        ? "ssd_corrupt"
                      : bad.code() == StatusCode::kIncompatible ? "ssd_incompatible"
                                                                : "ssd_io";
    if (reason) *reason = why;
    log_warn_once(std::string("ssd-restore-") + why,
                  strfmt("[ssd-cache] restore failed, file removed, serving on: %s", bad.message().c_str()));
    LARDER_LOG_DEBUG("[ssd-cache] restore of %s failed: %s", rec.path.c_str(), bad.message().c_str());
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.restore_failures;
    if (bad.code() == StatusCode::kCorrupt) ++stats_.corrupt;
    else if (bad.code() == StatusCode::kIncompatible) ++stats_.incompatible;
    else ++stats_.io_errors;
    // A corrupt or foreign file is deleted (§7.4): it can never become valid, and keeping it
    // would fail every later lookup. Files are cheap to rebuild.
    for (size_t i = 0; i < index_.size(); ++i) {
      if (index_[i].entry_id == rec.entry_id) {
        remove_locked(i, true);
        break;
      }
    }
    return nullptr;
  }
  // §7.6: a restore bumps the file's mtime (recency survives restarts) and the index recency.
  ::utimensat(AT_FDCWD, rec.path.c_str(), nullptr, 0);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.restores;
  for (SsdRecord& x : index_)
    if (x.entry_id == rec.entry_id) x.recency = ++clock_;
  return std::move(r).value();
}

bool SsdTier::store(const Entry& e) {
  if (e.tokens.empty()) return false;
  std::lock_guard<std::mutex> wlock(write_mu_);
  const std::string nsdir = id_dir_ + "/" + ns_dir_name(e.ns);
  if (Status st = make_dir(nsdir); !st.is_ok()) {
    log_warn_once("ssd-mkdir", st.message());
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.write_failures;
    return false;
  }
  const std::string id = entry_id(e.ns, e.tokens);
  const std::string path = nsdir + "/" + id + ".lkv";
  WriteFailure cls = WriteFailure::kNone;
  Status st = write_lkv(path, e, cfg_.identity, *io_, &cls);
  if (!st.is_ok()) {
    log_warn_once(std::string("ssd-write-") + write_failure_name(cls),
                  strfmt("[ssd-cache] write failed (%s), entry not persisted, serving on: %s",
                         write_failure_name(cls), st.message().c_str()));
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.write_failures;
    if (cls == WriteFailure::kNoSpace) ++stats_.write_no_space;
    return false;
  }
  struct stat sb {};
  uint64_t bytes = 0;
  if (::stat(path.c_str(), &sb) == 0) bytes = static_cast<uint64_t>(sb.st_blocks) * 512;
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.writes;
  if (bytes > cfg_.cap_bytes) {  // over the cap alone: delete, warn, false (§7.6)
    io_->unlink(path.c_str());
    ++stats_.oversize;
    log_warn_once("ssd-oversize", strfmt("[ssd-cache] an entry of %llu bytes exceeds --ssd-cache-max; not kept",
                                         static_cast<unsigned long long>(bytes)));
    for (size_t i = 0; i < index_.size(); ++i)
      if (index_[i].entry_id == id) { remove_locked(i, false); break; }
    return false;
  }
  // Exact duplicate: same id, replaced by the rename already; drop the old record.
  for (size_t i = 0; i < index_.size(); ++i) {
    if (index_[i].entry_id == id) {
      remove_locked(i, false);
      break;
    }
  }
  // Supersede strict same-ns ancestors only when the new entry is trimmable (§7.6).
  if (e.trimmable) {
    for (size_t i = 0; i < index_.size();) {
      const SsdRecord& r = index_[i];
      if (r.ns == e.ns && r.tokens.size() < e.tokens.size() && static_cast<int64_t>(r.tokens.size()) >= e.floor &&
          is_prefix_of(r.tokens, e.tokens)) {
        ++stats_.superseded;
        remove_locked(i, true);
      } else {
        ++i;
      }
    }
  }
  SsdRecord rec;
  rec.entry_id = id;
  rec.ns = e.ns;
  rec.path = path;
  rec.tokens = e.tokens;
  rec.bytes = bytes;
  rec.recency = ++clock_;
  rec.trimmable = e.trimmable;
  rec.floor = e.floor;
  rec.label = e.label;
  index_.push_back(std::move(rec));
  evict_locked(id);
  return true;
}

void SsdTier::remove_locked(size_t i, bool unlink_file) {
  // Unlinking a mapped file is safe on Linux: restored segments keep the inode alive.
  if (unlink_file) io_->unlink(index_[i].path.c_str());
  index_.erase(index_.begin() + static_cast<long>(i));
}

uint64_t SsdTier::total_bytes_locked() const {
  uint64_t n = 0;
  for (const SsdRecord& r : index_) n += r.bytes;
  return n;
}

void SsdTier::evict_locked(const std::string& keep_id) {
  while (total_bytes_locked() > cfg_.cap_bytes && !index_.empty()) {
    size_t victim = index_.size();
    for (size_t i = 0; i < index_.size(); ++i) {
      if (index_[i].entry_id == keep_id) continue;
      if (victim == index_.size() || index_[i].recency < index_[victim].recency) victim = i;
    }
    if (victim == index_.size()) break;
    ++stats_.evictions;
    ghosts_.push_back({index_[victim].ns, index_[victim].tokens});
    while (ghosts_.size() > 32) ghosts_.pop_front();
    remove_locked(victim, true);
  }
}

int64_t SsdTier::longest_durable_prefix() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const SsdRecord& r : index_) n = std::max<int64_t>(n, static_cast<int64_t>(r.tokens.size()));
  return n;
}

bool SsdTier::has_durable_prefix(std::span<const TokenId> tokens, const std::string& ns) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const SsdRecord& r : index_) {
    if (r.ns != ns || r.tokens.size() < tokens.size()) continue;
    if (!std::equal(tokens.begin(), tokens.end(), r.tokens.begin())) continue;
    if (r.tokens.size() == tokens.size() || (r.trimmable && static_cast<int64_t>(tokens.size()) >= r.floor))
      return true;
  }
  return false;
}

size_t SsdTier::clear() {
  std::lock_guard<std::mutex> wlock(write_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = index_.size();
  while (!index_.empty()) remove_locked(index_.size() - 1, true);
  return n;
}

SsdStats SsdTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SsdStats s = stats_;
  s.entries = index_.size();
  s.bytes = total_bytes_locked();
  s.ready = ready();
  return s;
}

std::map<std::string, SsdTier::NsUsage> SsdTier::stats_by_ns() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, NsUsage> out;
  for (const SsdRecord& r : index_) {
    NsUsage& u = out[r.ns];
    ++u.entries;
    u.bytes += r.bytes;
  }
  return out;
}

std::vector<SsdRecord> SsdTier::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_;
}

}  // namespace larder::memory
