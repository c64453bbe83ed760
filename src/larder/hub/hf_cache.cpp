#include "larder/hub/hf_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>

namespace larder::hub {

namespace fs = std::filesystem;

Status validate_repo_id(const std::string& id) {
  const size_t slash = id.find('/');
  bool ok = slash != std::string::npos && slash > 0 && slash + 1 < id.size() && id.find('/', slash + 1) == std::string::npos &&
            id.size() <= 96 && id.find("--") == std::string::npos && id.find("..") == std::string::npos;
  for (char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '/')) ok = false;
  }
  if (ok && (id[0] == '.' || id[0] == '-' || id[slash + 1] == '.' || id[slash + 1] == '-')) ok = false;
  if (!ok) {
    return invalid_argument(strfmt("[hub] '%s' is not a Hugging Face repo id: expected ORG/NAME of letters, digits, "
                                   "'-', '_' and '.' (e.g. bartowski/SmolLM2-135M-Instruct-GGUF)",
                                   id.c_str()));
  }
  return Status::ok();
}

std::string repo_folder_name(const std::string& repo_id) {
  std::string s = "models--" + repo_id;
  const size_t p = s.find('/');
  if (p != std::string::npos) s.replace(p, 1, "--");
  return s;
}

std::string repo_id_from_folder(const std::string& folder) {
  if (folder.rfind("models--", 0) != 0) return {};
  std::string s = folder.substr(8);
  const size_t p = s.find("--");
  if (p == std::string::npos) return s;  // a repo without an org (e.g. "gpt2")
  s.replace(p, 2, "/");
  return s;
}

std::vector<CachedRepo> scan_cache(const std::string& hub_dir) {
  std::vector<CachedRepo> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(hub_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("models--", 0) != 0 || !e.is_directory(ec) || e.is_symlink(ec)) continue;
    CachedRepo r;
    r.repo_id = repo_id_from_folder(name);
    r.dir = e.path().string();
    for (const auto& ref : fs::recursive_directory_iterator(e.path() / "refs", ec)) {
      if (!ref.is_regular_file(ec)) continue;
      std::ifstream in(ref.path());
      std::string commit;
      std::getline(in, commit);
      r.refs[ref.path().lexically_relative(e.path() / "refs").string()] = commit;
    }
    for (const auto& b : fs::directory_iterator(e.path() / "blobs", ec)) {
      if (!b.is_regular_file(ec)) continue;
      const uint64_t sz = b.file_size(ec);
      (b.path().extension() == ".incomplete" ? r.incomplete_bytes : r.blob_bytes) += sz;
    }
    for (const auto& s : fs::directory_iterator(e.path() / "snapshots", ec)) {
      if (!s.is_directory(ec)) continue;
      CachedSnapshot snap;
      snap.commit = s.path().filename().string();
      snap.dir = s.path().string();
      for (const auto& f : fs::recursive_directory_iterator(s.path(), ec)) {
        if (f.is_directory(ec)) continue;
        const std::string rel = f.path().lexically_relative(s.path()).string();
        (fs::exists(f.path(), ec) ? snap.files : snap.broken).push_back(rel);
      }
      std::sort(snap.files.begin(), snap.files.end());
      r.snapshots.push_back(std::move(snap));
    }
    out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(), [](const CachedRepo& a, const CachedRepo& b) { return a.repo_id < b.repo_id; });
  return out;
}

Status write_ref(const std::string& repo_dir, const std::string& revision, const std::string& commit) {
  const fs::path ref = fs::path(repo_dir) / "refs" / revision;
  std::error_code ec;
  {
    std::ifstream in(ref);
    std::string cur;
    if (in && std::getline(in, cur) && cur == commit) return Status::ok();
  }
  fs::create_directories(ref.parent_path(), ec);
  const fs::path tmp = ref.string() + ".larder.tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << commit;  // no newline, as huggingface_hub writes it
    if (!out) return io_error(strfmt("[hub] cannot write %s", tmp.c_str()));
  }
  fs::rename(tmp, ref, ec);
  if (ec) return io_error(strfmt("[hub] cannot write %s: %s", ref.c_str(), ec.message().c_str()));
  return Status::ok();
}

Status link_snapshot_file(const std::string& repo_dir, const std::string& commit, const std::string& file,
                          const std::string& etag) {
  const fs::path dst = fs::path(repo_dir) / "snapshots" / commit / file;
  std::error_code ec;
  fs::create_directories(dst.parent_path(), ec);
  std::string target = "../../blobs/" + etag;
  for (char c : file) {
    if (c == '/') target = "../" + target;
  }
  fs::remove(dst, ec);
  fs::create_symlink(target, dst, ec);
  if (ec) return io_error(strfmt("[hub] cannot link %s: %s", dst.c_str(), ec.message().c_str()));
  return Status::ok();
}

Result<uint64_t> remove_cached_repo(const std::string& hub_dir, const std::string& repo_id) {
  if (auto st = validate_repo_id(repo_id); !st) return st;
  const fs::path dir = fs::path(hub_dir) / repo_folder_name(repo_id);
  std::error_code ec;
  if (fs::is_symlink(dir, ec) || !fs::is_directory(dir, ec)) {
    return not_found(strfmt("[hub] %s is not in the Hugging Face cache %s", repo_id.c_str(), hub_dir.c_str()));
  }
  // A download in progress holds its blob's lock: refuse rather than pull files from under it.
  const fs::path locks = fs::path(hub_dir) / ".locks" / repo_folder_name(repo_id);
  for (const auto& l : fs::directory_iterator(locks, ec)) {
    const int fd = ::open(l.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    const bool busy = ::flock(fd, LOCK_EX | LOCK_NB) != 0;
    ::close(fd);
    if (busy) {
      return Status(StatusCode::kUnavailable,
                    strfmt("[hub] %s is being downloaded right now (%s is locked); try again when it is done",
                           repo_id.c_str(), l.path().c_str()));
    }
  }
  uint64_t freed = 0;
  for (const auto& b : fs::recursive_directory_iterator(dir, ec)) {
    if (b.is_regular_file(ec) && !b.is_symlink(ec)) freed += b.file_size(ec);
  }
  fs::remove_all(dir, ec);
  if (ec) return io_error(strfmt("[hub] cannot remove %s: %s", dir.c_str(), ec.message().c_str()));
  fs::remove_all(locks, ec);
  return freed;
}

}  // namespace larder::hub
