#include "larder/runtime/model_locator.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

namespace larder::runtime {

namespace fs = std::filesystem;

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// "model-Q4_K_M-00001-of-00003" → "model-Q4_K_M" (and the shard number in *shard).
std::string strip_shard(const std::string& stem, int* shard = nullptr) {
  static const std::regex re("^(.*)-([0-9]{5})-of-[0-9]{5}$");
  std::smatch m;
  if (std::regex_match(stem, m, re)) {
    if (shard) *shard = std::stoi(m[2].str());
    return m[1].str();
  }
  if (shard) *shard = 0;
  return stem;
}

// Refuses what is not a regular file or a directory before anything opens it: opening a FIFO
// blocks until a writer appears, a device reads forever.
Status check_file_type(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);  // follows symlinks (HF snapshots are symlinks)
  if (ec) return not_found(strfmt("[model] %s: %s", path.c_str(), ec.message().c_str()));
  const char* what = nullptr;
  switch (st.type()) {
    case fs::file_type::regular:
    case fs::file_type::directory: return Status::ok();
    case fs::file_type::fifo: what = "a FIFO (named pipe)"; break;
    case fs::file_type::character: what = "a character device"; break;
    case fs::file_type::block: what = "a block device"; break;
    case fs::file_type::socket: what = "a socket"; break;
    default: what = "not a regular file or directory"; break;
  }
  return invalid_argument(strfmt("[model] %s is %s, not a model file or folder", path.c_str(), what));
}

bool is_regular(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

bool has_safetensors(const fs::path& dir) {
  std::error_code ec;
  if (is_regular(dir / "model.safetensors") || is_regular(dir / "model.safetensors.index.json")) return true;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") return true;
  }
  return false;
}

std::string size_str(const std::string& path) {
  std::error_code ec;
  const auto n = fs::file_size(path, ec);
  if (ec) return "?";
  if (n >= (1ull << 30)) return strfmt("%.1f GiB", n / double(1ull << 30));
  return strfmt("%.0f MiB", n / double(1ull << 20));
}

std::string listing(const std::vector<std::string>& files) {
  std::string s;
  for (const std::string& f : files) s += strfmt("\n  %s  (%s)", fs::path(f).filename().c_str(), size_str(f).c_str());
  return s;
}

// Does `selector` name this GGUF? The exact file name, or the quantization as a whole
// component of the name: Q4_K matches "x-Q4_K.gguf" but not "x-Q4_K_M.gguf"; case-insensitive.
bool selects(const std::string& file, const std::string& selector) {
  const std::string name = fs::path(file).filename().string();
  if (name == selector || name == selector + ".gguf") return true;
  const std::string stem = upper(strip_shard(fs::path(file).stem().string()));
  const std::string sel = upper(selector);
  if (sel.empty()) return false;
  for (size_t pos = stem.find(sel); pos != std::string::npos; pos = stem.find(sel, pos + 1)) {
    const size_t end = pos + sel.size();
    const bool left = pos == 0 || stem[pos - 1] == '-' || stem[pos - 1] == '.' || stem[pos - 1] == '_';
    const bool right = end == stem.size() || stem[end] == '-' || stem[end] == '.';
    if (left && right) return true;
  }
  return false;
}

// A folder (a plain directory or a cache snapshot) → the directory or GGUF file to load.
// `what` names the folder in messages (the path, or "REPO (in the Hugging Face cache)").
Result<LocatedModel> resolve_folder(const fs::path& dir, const std::string& selector, const std::string& what,
                                    const std::string& how_to_select, std::string id) {
  std::error_code ec;
  const std::vector<std::string> ggufs = gguf_files_in(dir.string());
  const bool hf = is_regular(dir / "config.json") && has_safetensors(dir);
  if (selector.empty()) {
    if (hf || ggufs.empty()) {
      if (ggufs.empty() && !hf && !is_regular(dir / "config.json") && !is_regular(dir / "tokenizer.json")) {
        return not_found(strfmt("[model] %s: not a model folder: no config.json (a Hugging Face model directory) "
                                "and no .gguf file",
                                what.c_str()));
      }
      if (id.empty()) {  // a plain directory is served as its name
        const fs::path p = dir.lexically_normal();
        id = p.filename().empty() ? p.parent_path().filename().string() : p.filename().string();
      }
      return LocatedModel{dir.string(), id, {}};  // the loader names anything else that is missing
    }
    if (ggufs.size() == 1) {
      const std::string name = fs::path(ggufs[0]).filename().string();
      return LocatedModel{ggufs[0], id.empty() ? fs::path(ggufs[0]).stem().string() : id,
                          strfmt("using %s (the only GGUF file in %s)", name.c_str(), what.c_str())};
    }
    return invalid_argument(strfmt("[model] %s holds %zu GGUF files; choose one with %s:%s", what.c_str(), ggufs.size(),
                                   how_to_select.c_str(), listing(ggufs).c_str()));
  }
  std::vector<std::string> picked;
  for (const std::string& g : ggufs)
    if (selects(g, selector)) picked.push_back(g);
  if (picked.size() == 1) {
    const std::string name = fs::path(picked[0]).filename().string();
    return LocatedModel{picked[0], id.empty() ? fs::path(picked[0]).stem().string() : id + ":" + selector,
                        strfmt("using %s (matches %s in %s)", name.c_str(), selector.c_str(), what.c_str())};
  }
  if (ggufs.empty()) {
    return not_found(strfmt("[model] %s has no GGUF file to pick %s from", what.c_str(), selector.c_str()));
  }
  if (picked.empty()) {
    return not_found(strfmt("[model] no GGUF file in %s matches %s; there are:%s", what.c_str(), selector.c_str(),
                            listing(ggufs).c_str()));
  }
  return invalid_argument(strfmt("[model] %zu GGUF files in %s match %s; give the whole file name:%s", picked.size(),
                                 what.c_str(), selector.c_str(), listing(picked).c_str()));
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

bool repo_like(const std::string& s) {
  const size_t slash = s.find('/');
  return slash != std::string::npos && slash > 0 && slash + 1 < s.size() && s.find('/', slash + 1) == std::string::npos &&
         s[0] != '.' && s[0] != '~' && !ends_with(s, ".gguf");
}

std::string how_to_get(const std::string& repo) {
  return strfmt("nothing is downloaded when a model is opened: fetch it first with `larder pull %s` "
                "(`larder pull %s:Q4_K_M` for one GGUF), or pass a model directory / .gguf file",
                repo.c_str(), repo.c_str());
}

Result<LocatedModel> from_hub(const std::string& repo, const std::string& selector) {
  const std::string hub = hf_hub_cache_dir();
  std::string dir = "models--" + repo;
  dir.replace(dir.find('/'), 1, "--");
  const fs::path repo_dir = fs::path(hub) / dir;
  std::error_code ec;
  if (!fs::is_directory(repo_dir, ec)) {
    return not_found(strfmt("[model] %s is not in the local Hugging Face cache %s; %s", repo.c_str(), hub.c_str(),
                            how_to_get(repo).c_str()));
  }
  const std::string snap = snapshot_of(repo_dir);
  if (snap.empty()) {
    return not_found(strfmt("[model] %s: the Hugging Face cache entry %s has no snapshot (incomplete download?)",
                            repo.c_str(), repo_dir.string().c_str()));
  }
  const std::string what = strfmt("%s (in the Hugging Face cache, %s)", repo.c_str(), snap.c_str());
  return resolve_folder(snap, selector, what, repo + ":QUANT (-hf " + repo + ":QUANT)", repo);
}

// Splits "base:SELECTOR" at the last ':' (a selector never holds '/').
bool split_selector(const std::string& spec, std::string* base, std::string* selector) {
  const size_t c = spec.rfind(':');
  if (c == std::string::npos || c == 0 || c + 1 == spec.size()) return false;
  if (spec.find('/', c) != std::string::npos) return false;
  *base = spec.substr(0, c);
  *selector = spec.substr(c + 1);
  return true;
}

const char* kNoDefault =
    "download one first, e.g. `larder pull mlx-community/Llama-3.2-1B-Instruct-4bit` "
    "(or pass a model directory / .gguf file)";

}  // namespace

std::string hf_hub_cache_dir() {
  const std::string home = env_or("HOME", "/root");
  const std::string hf_home = env_or("HF_HOME", home + "/.cache/huggingface");
  return env_or("HF_HUB_CACHE", hf_home + "/hub");
}

std::vector<std::string> gguf_files_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".gguf" || !is_regular(e.path())) continue;
    if (name.rfind("mmproj", 0) == 0) continue;  // a vision projector, not a language model
    int shard = 0;
    strip_shard(e.path().stem().string(), &shard);
    if (shard > 1) continue;  // a split model is named by its first shard
    out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<LocatedModel> locate_model(const std::string& spec_in, const LocateOptions& opts) {
  std::error_code ec;
  std::string spec = spec_in;
  for (const char* prefix : {"hf.co/", "huggingface.co/", "https://huggingface.co/"}) {
    if (opts.hub_only && spec.rfind(prefix, 0) == 0) spec = spec.substr(std::string(prefix).size());
  }
  if (opts.hub_only) {
    std::string repo = spec, selector;
    split_selector(spec, &repo, &selector);
    if (!repo_like(repo)) {
      return invalid_argument(
          strfmt("[model] -hf takes a Hugging Face repo id ORG/NAME[:QUANT], not %s (give a path as MODEL or -m)",
                 spec.c_str()));
    }
    return from_hub(repo, selector);
  }

  if (!spec.empty()) {
    if (fs::exists(fs::symlink_status(spec, ec)) || fs::exists(spec, ec)) {
      LARDER_RETURN_IF_ERROR(check_file_type(spec));
      fs::path p = fs::path(spec).lexically_normal();
      std::string id = p.filename().string();
      if (id.empty()) id = p.parent_path().filename().string();
      if (fs::is_directory(spec, ec)) return resolve_folder(spec, "", spec, spec + ":QUANT", "");
      if (p.extension() == ".gguf") id = p.stem().string();
      return LocatedModel{spec, id, {}};
    }
    std::string base, selector;
    if (split_selector(spec, &base, &selector)) {
      if (fs::is_directory(base, ec)) {
        LARDER_RETURN_IF_ERROR(check_file_type(base));
        return resolve_folder(base, selector, base, base + ":QUANT", "");
      }
      if (fs::exists(base, ec)) {
        return invalid_argument(strfmt("[model] %s: a :%s selector picks a GGUF file in a folder or a cached repo; "
                                       "%s is a file",
                                       spec.c_str(), selector.c_str(), base.c_str()));
      }
      if (repo_like(base)) return from_hub(base, selector);
    }
    if (repo_like(spec)) return from_hub(spec, "");
    return not_found(strfmt("[model] %s: no such file or directory", spec.c_str()));
  }

  const std::string hub = hf_hub_cache_dir();
  if (!opts.allow_default) return invalid_argument("[model] no model given (a path, a .gguf file or a repo id)");
  // No MODEL: the most recently used loadable snapshot in the cache.
  fs::path best_snap;
  std::string best_id;
  fs::file_time_type best_t{};
  for (const auto& e : fs::directory_iterator(hub, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory(ec) || name.rfind("models--", 0) != 0) continue;
    const std::string snap = snapshot_of(e.path());
    if (snap.empty()) continue;
    if (!is_regular(fs::path(snap) / "config.json") && gguf_files_in(snap).empty()) continue;
    const auto t = fs::last_write_time(snap, ec);
    if (best_snap.empty() || t > best_t) best_snap = snap, best_id = repo_id_of(name), best_t = t;
  }
  if (best_snap.empty()) {
    return not_found(strfmt("[model] no MODEL given and no model in the Hugging Face cache %s; %s", hub.c_str(),
                            kNoDefault));
  }
  return from_hub(best_id, "");
}

}  // namespace larder::runtime
