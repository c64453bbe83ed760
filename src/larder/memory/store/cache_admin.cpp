#include "larder/memory/store/cache_admin.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>

#include "larder/memory/store/cache_dir.h"
#include "larder/memory/store/lkv_format.h"

namespace larder::memory {

namespace {

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// The folder must be a larder cache (cache_dir.h): anything else is refused before it is read.
Status check_is_cache(const std::string& dir) {
  const CacheDirCheck c = check_cache_dir(dir);
  if (c.kind == CacheDirKind::kMissing) return not_found(strfmt("[cache] %s: no such directory", dir.c_str()));
  if (c.kind == CacheDirKind::kForeign) return not_a_cache(dir, c, "cache");
  return Status::ok();
}

// What the walk found at a position of the layout that is not a cache file or folder.
using ForeignFn = std::function<void(const std::string& path, const std::string& why)>;

// DIR/<identity>/<ns>/<file>: the layout of §7.1, two levels deep. Directories are opened
// without following links (a link is reported to `foreign`, never entered); `file` gets every
// entry of a namespace folder with that folder's descriptor, so judging and removing it never
// goes through a link either. `ns_done` runs after each namespace folder, `id_done` after each
// identity folder (with the identity folder's descriptor), for clear's empty-folder pass.
struct Walk {
  std::optional<std::string> identity;  // only this identity folder
  std::function<void(int nsfd, const std::string& name, const std::string& path, const std::string& idd)> file;
  ForeignFn foreign = [](const std::string&, const std::string&) {};
  std::function<void(int idfd, const std::string& ns)> ns_done = [](int, const std::string&) {};
  std::function<void(int dirfd, const std::string& idd)> id_done = [](int, const std::string&) {};
};

Status walk(const std::string& dir, const Walk& w) {
  LARDER_RETURN_IF_ERROR(check_is_cache(dir));
  DirFd top(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!top.ok()) return io_error(strfmt("[cache] %s: %s", dir.c_str(), std::strerror(errno)));
  LARDER_ASSIGN_OR_RETURN(std::vector<std::string> ids, list_dir(top.get()));
  for (const std::string& idd : ids) {
    if (idd == kCacheMarkerName) continue;
    const std::string idpath = dir + "/" + idd;
    const EntryKind k = entry_kind(top.get(), idd);
    if (k == EntryKind::kLink) {
      w.foreign(idpath, "a symbolic link (not followed)");
      continue;
    }
    if (k != EntryKind::kDir || !is_identity_dir_name(idd)) {
      w.foreign(idpath, "not an identity folder of the cache");
      continue;
    }
    if (w.identity && *w.identity != idd) continue;
    DirFd idfd = open_dir_at(top.get(), idd);
    auto nss = idfd.ok() ? list_dir(idfd.get()) : Result<std::vector<std::string>>(io_error("cannot open"));
    if (!nss.is_ok()) {
      w.foreign(idpath, "cannot be read (not entered)");
      continue;
    }
    for (const std::string& ns : *nss) {
      const std::string nspath = idpath + "/" + ns;
      const EntryKind nk = entry_kind(idfd.get(), ns);
      if (nk == EntryKind::kLink) {
        w.foreign(nspath, "a symbolic link (not followed)");
        continue;
      }
      if (nk != EntryKind::kDir || !is_ns_dir_name(ns)) {
        w.foreign(nspath, "not a namespace folder of the cache");
        continue;
      }
      DirFd nsfd = open_dir_at(idfd.get(), ns);
      auto files = nsfd.ok() ? list_dir(nsfd.get()) : Result<std::vector<std::string>>(io_error("cannot open"));
      if (!files.is_ok()) {
        w.foreign(nspath, "cannot be read (not entered)");
        continue;
      }
      for (const std::string& f : *files) w.file(nsfd.get(), f, nspath + "/" + f, idd);
      w.ns_done(idfd.get(), ns);
    }
    w.id_done(top.get(), idd);
  }
  return Status::ok();
}

}  // namespace

Result<std::vector<CacheFileInfo>> cache_ls(const std::string& dir) {
  std::vector<CacheFileInfo> out;
  Walk w;
  w.file = [&](int nsfd, const std::string& name, const std::string& path, const std::string& idd) {
    const bool tmp = ends_with(name, ".lkv.tmp");
    if (!tmp && !ends_with(name, ".lkv")) return;
    CacheFileInfo c;
    c.path = path;
    c.identity_dir = idd;
    c.temp = tmp;
    struct stat st {};
    if (::fstatat(nsfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      c.file_bytes = static_cast<uint64_t>(st.st_size);
      c.allocated_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
    }
    if (S_ISLNK(st.st_mode)) {
      c.status = corrupt("[cache] a symbolic link (not followed)");
    } else if (!tmp) {
      Result<LkvInfo> info = read_lkv_info_at(nsfd, name, path, nullptr, nullptr, /*follow=*/false);
      if (info.is_ok()) {
        c.identity_id = info->identity_id;
        c.ns = info->ns;
        c.n_tokens = static_cast<int64_t>(info->tokens.size());
        c.created_ms = info->header.value("created_ms", int64_t{0});
        c.label = info->header.value("label", "");
        c.trimmable = info->header.value("trimmable", false);
        if (info->header.contains("identity")) c.model_label = info->header["identity"].value("model_label", "");
      } else {
        c.status = info.status();
      }
    } else {
      c.status = Status(StatusCode::kUnavailable, "[cache] interrupted write (removed at the next scan)");
    }
    out.push_back(std::move(c));
  };
  LARDER_RETURN_IF_ERROR(walk(dir, w));
  return out;
}

Result<nlohmann::json> cache_inspect(const std::string& path) {
  LARDER_ASSIGN_OR_RETURN(LkvInfo info, read_lkv_info(path, nullptr));
  nlohmann::json j;
  j["path"] = path;
  j["prefix"] = {{"version", info.prefix.version}, {"header_len", info.prefix.header_len},
                 {"data_offset", info.prefix.data_offset}, {"file_size", info.prefix.file_size},
                 {"header_xxh3", hex64(info.prefix.header_xxh3)}, {"prefix_xxh3", hex64(info.prefix.prefix_xxh3)}};
  j["identity_id"] = info.identity_id;
  j["allocated_bytes"] = info.allocated_bytes;
  j["header"] = info.header;
  return j;
}

Result<std::vector<VerifyReport>> cache_verify(const std::string& dir_or_file) {
  std::vector<VerifyReport> out;
  auto one = [&](const std::string& path) {
    VerifyReport r;
    r.path = path;
    const auto t0 = std::chrono::steady_clock::now();
    r.status = verify_lkv(path);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) r.bytes = static_cast<uint64_t>(st.st_size);
    out.push_back(std::move(r));
  };
  // A file the user names is read where it is; inside a directory, links are never followed.
  struct stat st {};
  if (::stat(dir_or_file.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    one(dir_or_file);
    return out;
  }
  Walk w;
  w.file = [&](int nsfd, const std::string& name, const std::string& path, const std::string&) {
    if (ends_with(name, ".lkv") && entry_kind(nsfd, name) == EntryKind::kFile) one(path);
  };
  LARDER_RETURN_IF_ERROR(walk(dir_or_file, w));
  return out;
}

Result<ClearReport> cache_clear(const std::string& dir, const std::optional<std::string>& identity_id) {
  ClearReport rep;
  Walk w;
  w.identity = identity_id;
  w.foreign = [&](const std::string& path, const std::string& why) { rep.kept.push_back(path + ": " + why); };
  w.file = [&](int nsfd, const std::string& name, const std::string& path, const std::string&) {
    std::string why;
    uint64_t bytes = 0;
    if (!is_own_file(nsfd, name, &why, &bytes)) {
      rep.kept.push_back(path + ": " + why);
      return;
    }
    if (::unlinkat(nsfd, name.c_str(), 0) == 0) {
      ++rep.files_removed;
      rep.bytes_removed += bytes;
    } else {
      rep.errors.push_back(strfmt("%s: %s", path.c_str(), std::strerror(errno)));
    }
  };
  // Only the cache's own folders, and only when empty (rmdir never removes anything in them).
  w.ns_done = [&](int idfd, const std::string& ns) {
    if (::unlinkat(idfd, ns.c_str(), AT_REMOVEDIR) == 0) ++rep.dirs_removed;
  };
  w.id_done = [&](int topfd, const std::string& idd) {
    if (::unlinkat(topfd, idd.c_str(), AT_REMOVEDIR) == 0) ++rep.dirs_removed;
  };
  LARDER_RETURN_IF_ERROR(walk(dir, w));
  return rep;
}

}  // namespace larder::memory
