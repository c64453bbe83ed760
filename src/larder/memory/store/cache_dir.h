// cache_dir.h — what makes a folder a larder cache and a file the cache's own: the rules the SSD
// tier and `larder cache` both apply before they delete anything (docs/kv-store-format.md,
// "Directory layout" and "What larder deletes").
//
// A folder is a larder cache when it holds the marker file `.larder-cache` (written by the tier
// when it creates or adopts the folder), or — a cache written before the marker existed — when
// everything in it has the cache's layout: identity folders, namespace folders, LKV1 files.
// A file is the cache's own when it is a regular file (never reached through a link) in a real
// namespace folder of a real identity folder, named *.lkv with a valid LKV1 prefix (magic and
// prefix checksum), or named <entry-id>.lkv.tmp and either empty, still zero where the prefix
// goes (the writer fills offset 0 last), or with a valid prefix. Nothing else is ever deleted.
//
// Directories are opened with O_NOFOLLOW | O_DIRECTORY and files are judged and unlinked relative
// to their directory's descriptor, so a folder swapped for a link is never followed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "larder/core/status.h"

namespace larder::memory {

inline constexpr char kCacheMarkerName[] = ".larder-cache";

bool is_identity_dir_name(std::string_view name);  // 32 lowercase hex digits (an identity id)
bool is_ns_dir_name(std::string_view name);        // what ns_dir_name() makes: [a-z0-9_-]{1,64}
bool is_entry_name(std::string_view name);         // *.lkv
bool is_temp_name(std::string_view name);          // <32 hex>.lkv.tmp (the writer's temp file)

// An open directory descriptor (closed on destruction).
class DirFd {
 public:
  DirFd() = default;
  explicit DirFd(int fd) : fd_(fd) {}
  DirFd(DirFd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  DirFd& operator=(DirFd&& o) noexcept;
  DirFd(const DirFd&) = delete;
  DirFd& operator=(const DirFd&) = delete;
  ~DirFd();
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// `name` inside `parent` as a directory, never through a symbolic link (ELOOP / ENOTDIR then).
// parent = AT_FDCWD with an absolute or relative path opens that path (its last component is not
// followed either).
DirFd open_dir_at(int parent, const std::string& name);

// The entries of a directory (not "." and ".."), sorted; d_type is not trusted (fstatat decides).
Result<std::vector<std::string>> list_dir(int dirfd);

// The kind of an entry, never following a link.
enum class EntryKind { kMissing, kDir, kFile, kLink, kOther };
EntryKind entry_kind(int dirfd, const std::string& name, uint64_t* allocated_bytes = nullptr);

// Whether the file `name` in `dirfd` is one the tier wrote (rules above). When it is not, *why says
// why (for the reports). `allocated_bytes` receives st_blocks × 512.
bool is_own_file(int dirfd, const std::string& name, std::string* why, uint64_t* allocated_bytes = nullptr);

// The standing of a folder.
enum class CacheDirKind {
  kMissing,  // does not exist
  kEmpty,    // exists and is empty
  kMarked,   // holds the marker
  kLegacy,   // no marker, but everything in it has the cache's layout
  kForeign,  // anything else: not a larder cache (why names the first foreign entry)
};
struct CacheDirCheck {
  CacheDirKind kind = CacheDirKind::kMissing;
  std::string why;
};
CacheDirCheck check_cache_dir(const std::string& dir);

// The refusal for a foreign folder, naming what was found ("`what` ... nothing was changed").
Status not_a_cache(const std::string& dir, const CacheDirCheck& c, const char* tag);

// For the tier: creates DIR (0700) when missing, writes the marker into a new, empty or legacy
// cache, and refuses a folder that is not a larder cache (it may hold anything; the tier would
// otherwise mix its files with them).
Status prepare_cache_dir(const std::string& dir);

}  // namespace larder::memory
