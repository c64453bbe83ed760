#include "larder/memory/store/cache_admin.h"

#include <sys/stat.h>

#include <chrono>
#include <filesystem>

#include "larder/memory/store/lkv_format.h"

namespace larder::memory {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// DIR/<identity>/<ns>/<file>: the layout of §7.1, two levels deep.
template <typename F>
Status for_each_file(const std::string& dir, F&& f) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return not_found(strfmt("[cache] %s: not a directory", dir.c_str()));
  for (fs::directory_iterator id(dir, ec), end; !ec && id != end; id.increment(ec)) {
    if (!id->is_directory(ec)) continue;
    std::error_code e2;
    for (fs::directory_iterator ns(id->path(), e2); !e2 && ns != end; ns.increment(e2)) {
      if (!ns->is_directory(e2)) continue;
      std::error_code e3;
      for (fs::directory_iterator it(ns->path(), e3); !e3 && it != end; it.increment(e3)) {
        const std::string name = it->path().filename().string();
        if (ends_with(name, ".lkv") || ends_with(name, ".lkv.tmp"))
          f(it->path().string(), id->path().filename().string(), ends_with(name, ".tmp"));
      }
    }
  }
  if (ec) return io_error(strfmt("[cache] %s: %s", dir.c_str(), ec.message().c_str()));
  return Status::ok();
}

}  // namespace

Result<std::vector<CacheFileInfo>> cache_ls(const std::string& dir) {
  std::vector<CacheFileInfo> out;
  LARDER_RETURN_IF_ERROR(for_each_file(dir, [&](const std::string& path, const std::string& idd, bool tmp) {
    CacheFileInfo c;
    c.path = path;
    c.identity_dir = idd;
    c.temp = tmp;
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      c.file_bytes = static_cast<uint64_t>(st.st_size);
      c.allocated_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
    }
    if (!tmp) {
      Result<LkvInfo> info = read_lkv_info(path, nullptr);
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
  }));
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
  std::error_code ec;
  if (fs::is_regular_file(dir_or_file, ec)) {
    one(dir_or_file);
    return out;
  }
  LARDER_RETURN_IF_ERROR(for_each_file(dir_or_file, [&](const std::string& path, const std::string&, bool tmp) {
    if (!tmp) one(path);
  }));
  return out;
}

Result<ClearReport> cache_clear(const std::string& dir, const std::optional<std::string>& identity_id) {
  ClearReport rep;
  std::vector<std::string> victims;
  LARDER_RETURN_IF_ERROR(for_each_file(dir, [&](const std::string& path, const std::string& idd, bool) {
    if (!identity_id || *identity_id == idd) victims.push_back(path);
  }));
  for (const std::string& p : victims) {
    struct stat st {};
    const uint64_t b = ::stat(p.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
    std::error_code ec;
    if (fs::remove(p, ec)) {
      ++rep.files_removed;
      rep.bytes_removed += b;
    } else {
      rep.errors.push_back(strfmt("%s: %s", p.c_str(), ec.message().c_str()));
    }
  }
  // Remove now-empty ns and identity directories (fs::remove only removes empty ones).
  std::error_code ec;
  for (fs::directory_iterator id(dir, ec), end; !ec && id != end; id.increment(ec)) {
    if (identity_id && id->path().filename() != *identity_id) continue;
    if (!id->is_directory(ec)) continue;
    std::error_code e2;
    std::vector<fs::path> subs;
    for (fs::directory_iterator ns(id->path(), e2); !e2 && ns != end; ns.increment(e2)) subs.push_back(ns->path());
    for (const auto& s : subs) fs::remove(s, e2);
    fs::remove(id->path(), e2);
  }
  return rep;
}

}  // namespace larder::memory
