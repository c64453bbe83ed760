#include "larder/runtime/model_locator.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace larder::runtime {

namespace fs = std::filesystem;

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// A snapshot folder holds a loadable model if it has config.json or a .gguf file.
std::string loadable_in(const fs::path& snap) {
  std::error_code ec;
  if (fs::exists(snap / "config.json", ec)) return snap.string();
  for (const auto& e : fs::directory_iterator(snap, ec)) {
    if (e.path().extension() == ".gguf") return e.path().string();
  }
  return {};
}

// The snapshot refs/main names, else the most recently modified snapshot.
std::string snapshot_of(const fs::path& repo_dir) {
  std::error_code ec;
  std::ifstream ref(repo_dir / "refs" / "main");
  std::string rev;
  if (ref && std::getline(ref, rev) && !rev.empty() && fs::is_directory(repo_dir / "snapshots" / rev, ec)) {
    return (repo_dir / "snapshots" / rev).string();
  }
  fs::path best;
  fs::file_time_type best_t{};
  for (const auto& e : fs::directory_iterator(repo_dir / "snapshots", ec)) {
    if (!e.is_directory(ec)) continue;
    const auto t = e.last_write_time(ec);
    if (best.empty() || t > best_t) best = e.path(), best_t = t;
  }
  return best.string();
}

std::string repo_id_of(const std::string& dirname) {  // "models--org--name" → "org/name"
  std::string s = dirname.substr(std::string("models--").size());
  const size_t p = s.find("--");
  if (p != std::string::npos) s.replace(p, 2, "/");
  return s;
}

const char* kHowToGet =
    "download one first, e.g. `huggingface-cli download mlx-community/Llama-3.2-1B-Instruct-4bit` "
    "(or pass a model directory / .gguf file)";

}  // namespace

std::string hf_hub_cache_dir() {
  const std::string home = env_or("HOME", "/root");
  const std::string hf_home = env_or("HF_HOME", home + "/.cache/huggingface");
  return env_or("HF_HUB_CACHE", hf_home + "/hub");
}

Result<LocatedModel> locate_model(const std::string& spec) {
  std::error_code ec;
  const std::string hub = hf_hub_cache_dir();
  if (!spec.empty() && fs::exists(spec, ec)) {
    fs::path p = fs::path(spec).lexically_normal();
    std::string id = p.filename().string();
    if (id.empty()) id = p.parent_path().filename().string();
    if (p.extension() == ".gguf") id = p.stem().string();
    return LocatedModel{spec, id};
  }
  if (!spec.empty()) {
    const size_t slash = spec.find('/');
    const bool repo_like = slash != std::string::npos && slash > 0 && spec.find('/', slash + 1) == std::string::npos &&
                           spec[0] != '.';
    if (!repo_like) return not_found(strfmt("[model] %s: no such file or directory", spec.c_str()));
    std::string dir = "models--" + spec;
    dir.replace(dir.find('/'), 1, "--");
    const fs::path repo = fs::path(hub) / dir;
    if (!fs::is_directory(repo, ec)) {
      return not_found(strfmt("[model] %s is not a file or directory, and not in the Hugging Face cache %s; %s",
                              spec.c_str(), hub.c_str(), kHowToGet));
    }
    const std::string snap = snapshot_of(repo);
    const std::string path = snap.empty() ? std::string() : loadable_in(snap);
    if (path.empty()) {
      return not_found(strfmt("[model] %s: the Hugging Face cache entry %s has no snapshot with config.json or a "
                              ".gguf file (incomplete download?)",
                              spec.c_str(), repo.string().c_str()));
    }
    return LocatedModel{path, spec};
  }
  // No MODEL: the most recently used loadable snapshot in the cache.
  fs::path best_path;
  std::string best_id;
  fs::file_time_type best_t{};
  for (const auto& e : fs::directory_iterator(hub, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory(ec) || name.rfind("models--", 0) != 0) continue;
    const std::string snap = snapshot_of(e.path());
    if (snap.empty()) continue;
    const std::string path = loadable_in(snap);
    if (path.empty()) continue;
    const auto t = fs::last_write_time(snap, ec);
    if (best_path.empty() || t > best_t) best_path = path, best_id = repo_id_of(name), best_t = t;
  }
  if (best_path.empty()) {
    return not_found(strfmt("[model] no MODEL given and no model in the Hugging Face cache %s; %s", hub.c_str(),
                            kHowToGet));
  }
  return LocatedModel{best_path.string(), best_id};
}

}  // namespace larder::runtime
