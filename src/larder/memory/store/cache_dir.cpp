#include "larder/memory/store/cache_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <xxhash.h>

#include "larder/core/log.h"
#include "larder/memory/store/lkv_format.h"

namespace larder::memory {

namespace {

bool ends_with(std::string_view s, std::string_view suf) {
  return s.size() >= suf.size() && s.substr(s.size() - suf.size()) == suf;
}

bool is_hex32(std::string_view s) {
  return s.size() == 32 && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// The marker's first line; the rest is for a person who finds the file.
constexpr char kMarkerHead[] = "larder SSD KV cache";
constexpr char kMarkerText[] =
    "larder SSD KV cache (LKV1). Layout and format: docs/kv-store-format.md in larder's sources.\n"
    "larder deletes only its own LKV1 files here (*.lkv, *.lkv.tmp), never anything else.\n";

bool has_marker(int dirfd) {
  int fd = ::openat(dirfd, kCacheMarkerName, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  char buf[sizeof kMarkerHead - 1];
  const bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                  ::pread(fd, buf, sizeof buf, 0) == static_cast<ssize_t>(sizeof buf) &&
                  std::memcmp(buf, kMarkerHead, sizeof buf) == 0;
  ::close(fd);
  return ok;
}

Status write_marker(int dirfd, const std::string& dir) {
  int fd = ::openat(dirfd, kCacheMarkerName, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return io_error(strfmt("[ssd-cache] cannot write %s/%s: %s", dir.c_str(), kCacheMarkerName, std::strerror(errno)));
  const size_t n = sizeof kMarkerText - 1;
  const bool ok = ::write(fd, kMarkerText, n) == static_cast<ssize_t>(n);
  ::close(fd);
  if (!ok) return io_error(strfmt("[ssd-cache] cannot write %s/%s", dir.c_str(), kCacheMarkerName));
  return Status::ok();
}

// Legacy recognition: every entry at every level of DIR has the cache's layout.
bool layout_conforms(int dirfd, std::string* why) {
  auto names = list_dir(dirfd);
  if (!names.is_ok()) {
    *why = names.status().message();
    return false;
  }
  for (const std::string& id : *names) {
    const EntryKind k = entry_kind(dirfd, id);
    if (!is_identity_dir_name(id) || k != EntryKind::kDir) {
      *why = "'" + id + (k == EntryKind::kLink ? "', a symbolic link" : "', which is not an identity folder of the cache");
      return false;
    }
    DirFd idfd = open_dir_at(dirfd, id);
    auto nss = list_dir(idfd.get());
    if (!idfd.ok() || !nss.is_ok()) {
      *why = "'" + id + "', which cannot be read";
      return false;
    }
    for (const std::string& ns : *nss) {
      const EntryKind nk = entry_kind(idfd.get(), ns);
      if (!is_ns_dir_name(ns) || nk != EntryKind::kDir) {
        *why = "'" + id + "/" + ns +
               (nk == EntryKind::kLink ? "', a symbolic link" : "', which is not a namespace folder of the cache");
        return false;
      }
      DirFd nsfd = open_dir_at(idfd.get(), ns);
      auto files = list_dir(nsfd.get());
      if (!nsfd.ok() || !files.is_ok()) {
        *why = "'" + id + "/" + ns + "', which cannot be read";
        return false;
      }
      for (const std::string& f : *files) {
        std::string w;
        if (!is_own_file(nsfd.get(), f, &w)) {
          *why = "'" + id + "/" + ns + "/" + f + "' (" + w + ")";
          return false;
        }
      }
    }
  }
  return true;
}

}  // namespace

bool is_identity_dir_name(std::string_view name) { return is_hex32(name); }

bool is_ns_dir_name(std::string_view name) {
  return !name.empty() && name.size() <= 64 &&
         std::all_of(name.begin(), name.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'; });
}

bool is_entry_name(std::string_view name) { return name.size() > 4 && ends_with(name, ".lkv"); }

bool is_temp_name(std::string_view name) {
  return name.size() == 32 + 8 && ends_with(name, ".lkv.tmp") && is_hex32(name.substr(0, 32));
}

DirFd& DirFd::operator=(DirFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

DirFd::~DirFd() {
  if (fd_ >= 0) ::close(fd_);
}

DirFd open_dir_at(int parent, const std::string& name) {
  return DirFd(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
}

Result<std::vector<std::string>> list_dir(int dirfd) {
  if (dirfd < 0) return io_error("[cache] directory not open");
  // fdopendir takes ownership of the descriptor it is given: give it a duplicate.
  int dup = ::fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return io_error(strfmt("[cache] dup: %s", std::strerror(errno)));
  DIR* d = ::fdopendir(dup);
  if (!d) {
    ::close(dup);
    return io_error(strfmt("[cache] cannot list a directory: %s", std::strerror(errno)));
  }
  ::rewinddir(d);
  std::vector<std::string> out;
  errno = 0;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) return io_error(strfmt("[cache] cannot list a directory: %s", std::strerror(err)));
  std::sort(out.begin(), out.end());
  return out;
}

EntryKind entry_kind(int dirfd, const std::string& name, uint64_t* allocated_bytes) {
  struct stat st {};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return EntryKind::kMissing;
  if (allocated_bytes) *allocated_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
  if (S_ISDIR(st.st_mode)) return EntryKind::kDir;
  if (S_ISREG(st.st_mode)) return EntryKind::kFile;
  if (S_ISLNK(st.st_mode)) return EntryKind::kLink;
  return EntryKind::kOther;
}

bool is_own_file(int dirfd, const std::string& name, std::string* why, uint64_t* allocated_bytes) {
  auto no = [&](const char* w) {
    if (why) *why = w;
    return false;
  };
  const bool entry = is_entry_name(name), temp = ends_with(name, ".lkv.tmp");
  if (!entry && !temp) return no("not an LKV1 file name");
  // Only a regular file is opened (a device's open can have effects); O_NOFOLLOW and O_NONBLOCK
  // hold should it be swapped for a link or a FIFO in between.
  switch (entry_kind(dirfd, name)) {
    case EntryKind::kFile: break;
    case EntryKind::kLink: return no("a symbolic link (not followed)");
    case EntryKind::kMissing: return no("gone");
    default: return no("not a regular file");
  }
  int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return no(errno == ELOOP ? "a symbolic link (not followed)" : "cannot be opened");
  struct stat st {};
  LkvPrefix p{};
  ssize_t n = -1;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) n = ::pread(fd, &p, sizeof p, 0);
  ::close(fd);
  if (!S_ISREG(st.st_mode)) return no("not a regular file");
  if (allocated_bytes) *allocated_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
  if (n < 0) return no("cannot be read");
  const bool valid_prefix = n == static_cast<ssize_t>(sizeof p) && std::memcmp(p.magic, kLkvMagic, 8) == 0 &&
                            XXH3_64bits(&p, 40) == p.prefix_xxh3;
  if (valid_prefix) return true;
  if (entry) return no("not an LKV1 file: no valid LKV1 prefix");
  if (!is_temp_name(name)) return no("not a temp file name of the cache");
  if (n == 0) return true;  // created, nothing written yet
  const auto* b = reinterpret_cast<const unsigned char*>(&p);
  if (n == static_cast<ssize_t>(sizeof p) && std::all_of(b, b + sizeof p, [](unsigned char c) { return c == 0; }))
    return true;  // an interrupted write: the prefix is written last
  return no("not an LKV1 temp file: no valid LKV1 prefix");
}

CacheDirCheck check_cache_dir(const std::string& dir) {
  CacheDirCheck c;
  // DIR itself may be a link the user made (~/.cache/larder -> /ssd/larder): it is what they named.
  DirFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.ok()) {
    if (errno == ENOENT) return c;
    c.kind = CacheDirKind::kForeign;
    c.why = errno == ENOTDIR ? "it is not a directory" : strfmt("it cannot be opened: %s", std::strerror(errno));
    return c;
  }
  if (has_marker(fd.get())) {
    c.kind = CacheDirKind::kMarked;
    return c;
  }
  auto names = list_dir(fd.get());
  if (names.is_ok() && names->empty()) {
    c.kind = CacheDirKind::kEmpty;
    return c;
  }
  std::string why;
  if (layout_conforms(fd.get(), &why)) {
    c.kind = CacheDirKind::kLegacy;
    return c;
  }
  c.kind = CacheDirKind::kForeign;
  c.why = "it has no " + std::string(kCacheMarkerName) + " marker and holds " + why;
  return c;
}

Status not_a_cache(const std::string& dir, const CacheDirCheck& c, const char* tag) {
  return invalid_argument(strfmt("[%s] %s is not a larder cache directory: %s; nothing was changed", tag,
                                 dir.c_str(), c.why.c_str()));
}

Status prepare_cache_dir(const std::string& dir) {
  if (dir.empty()) return invalid_argument("[ssd-cache] no directory given");
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return io_error(strfmt("[ssd-cache] cannot create %s: %s", dir.c_str(), std::strerror(errno)));
  }
  const CacheDirCheck c = check_cache_dir(dir);
  switch (c.kind) {
    case CacheDirKind::kMarked:
      return Status::ok();
    case CacheDirKind::kMissing:
      return io_error(strfmt("[ssd-cache] %s vanished while opening it", dir.c_str()));
    case CacheDirKind::kForeign:
      return invalid_argument(strfmt("[ssd-cache] %s is not a larder cache directory: %s. Name a new or empty "
                                     "folder (or an existing larder cache) for --ssd-cache",
                                     dir.c_str(), c.why.c_str()));
    case CacheDirKind::kEmpty:
    case CacheDirKind::kLegacy:
      break;
  }
  DirFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  Status st = fd.ok() ? write_marker(fd.get(), dir) : io_error(strfmt("[ssd-cache] cannot open %s", dir.c_str()));
  // A read-only cache still serves what it holds; `larder cache clear` then needs the layout rule.
  if (!st.is_ok() && !(fd.ok() && has_marker(fd.get()))) log_warn_once("ssd-marker", st.message());
  return Status::ok();
}

}  // namespace larder::memory
