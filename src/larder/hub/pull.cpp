#include "larder/hub/pull.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "larder/core/progress.h"
#include "larder/hub/digest.h"
#include "larder/hub/hf_cache.h"
#include "larder/hub/http.h"
#include "larder/runtime/model_locator.h"

namespace larder::hub {

namespace fs = std::filesystem;

namespace {

std::string env_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool env_true(const char* name) {
  std::string v = env_str(name);
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

// What the environment says about the Hub; built once per pull.
struct Hub {
  std::string endpoint;
  std::string token;
  std::string cache;

  std::vector<std::string> headers() const {
    std::vector<std::string> h;
    if (!token.empty()) h.push_back("Authorization: Bearer " + token);
    return h;
  }
};

Hub hub_from_env() {
  Hub h;
  h.endpoint = env_str("HF_ENDPOINT");
  if (h.endpoint.empty()) h.endpoint = "https://huggingface.co";
  while (!h.endpoint.empty() && h.endpoint.back() == '/') h.endpoint.pop_back();
  h.token = env_str("HF_TOKEN");
  if (h.token.empty()) h.token = env_str("HUGGING_FACE_HUB_TOKEN");
  if (h.token.empty()) {
    // The token `huggingface-cli login` stored.
    std::string path = env_str("HF_TOKEN_PATH");
    if (path.empty()) {
      std::string home = env_str("HF_HOME");
      if (home.empty()) home = env_str("HOME") + "/.cache/huggingface";
      path = home + "/token";
    }
    std::ifstream in(path);
    std::getline(in, h.token);
    while (!h.token.empty() && std::isspace(static_cast<unsigned char>(h.token.back()))) h.token.pop_back();
  }
  h.cache = runtime::hf_hub_cache_dir();
  return h;
}

// Turns a Hub error answer into a message that says what to do.
Status hub_error(const Hub& hub, const HttpResponse& r, const std::string& repo, const std::string& what) {
  const std::string code = r.header("x-error-code");
  std::string msg = r.header("x-error-message");
  const std::string tail = msg.empty() ? "" : " (the Hub says: " + msg + ")";
  switch (r.status) {
    case 401:
      if (!hub.token.empty()) {
        return Status(StatusCode::kUnavailable,
                      strfmt("[pull] %s: 401 Unauthorized: the Hub at %s refused the token in HF_TOKEN; check that it is "
                             "valid and has read access%s",
                             repo.c_str(), hub.endpoint.c_str(), tail.c_str()));
      }
      return Status(StatusCode::kUnavailable,
                    strfmt("[pull] %s: 401 Unauthorized: the repository is private or gated (or does not exist); set "
                           "HF_TOKEN to a Hugging Face access token with read access and try again%s",
                           repo.c_str(), tail.c_str()));
    case 403:
      return Status(StatusCode::kUnavailable,
                    strfmt("[pull] %s: 403 Forbidden: this token has no access to the repository; if it is gated, "
                           "accept its terms at %s/%s with the account the token belongs to%s",
                           repo.c_str(), hub.endpoint.c_str(), repo.c_str(), tail.c_str()));
    case 404:
      if (code == "RevisionNotFound") {
        return not_found(strfmt("[pull] %s: %s: revision not found (404)%s", repo.c_str(), what.c_str(), tail.c_str()));
      }
      if (code == "EntryNotFound") {
        return not_found(strfmt("[pull] %s: %s: file not found (404)%s", repo.c_str(), what.c_str(), tail.c_str()));
      }
      return not_found(strfmt("[pull] %s: 404 Not Found: no such model repository on %s (check the spelling: ORG/NAME)%s",
                              repo.c_str(), hub.endpoint.c_str(), tail.c_str()));
    case 429:
      return Status(StatusCode::kUnavailable,
                    strfmt("[pull] %s: 429 Too Many Requests: the Hub is rate-limiting; wait a minute%s%s", repo.c_str(),
                           hub.token.empty() ? " or set HF_TOKEN" : "", tail.c_str()));
    default:
      return Status(StatusCode::kUnavailable,
                    strfmt("[pull] %s: %s: HTTP %ld from the Hub%s", repo.c_str(), what.c_str(), r.status, tail.c_str()));
  }
}

struct Sibling {
  std::string name;
  uint64_t size = 0;
  std::string lfs_sha256;
};

struct RepoInfo {
  std::string commit;
  std::vector<Sibling> files;
};

std::string quote_path(const std::string& path) {  // each segment escaped, '/' kept
  std::string out, seg;
  for (char c : path + "/") {
    if (c == '/') {
      if (!out.empty()) out += '/';
      out += url_escape(seg);
      seg.clear();
    } else {
      seg += c;
    }
  }
  return out;
}

Result<RepoInfo> fetch_repo_info(const Hub& hub, const std::string& repo, const std::string& revision) {
  HttpRequest req;
  req.url = hub.endpoint + "/api/models/" + repo + "/revision/" + url_escape(revision) + "?blobs=true";
  req.headers = hub.headers();
  auto r = http_request(req);
  if (!r) {
    return Status(StatusCode::kUnavailable,
                  strfmt("[pull] cannot reach the Hub at %s: %s (set HF_ENDPOINT for a mirror)", hub.endpoint.c_str(),
                         r.status().message().c_str()));
  }
  if (r->status != 200) return hub_error(hub, *r, repo, "revision " + revision);
  RepoInfo info;
  try {
    const auto j = nlohmann::json::parse(r->body);
    info.commit = j.value("sha", "");
    for (const auto& s : j.value("siblings", nlohmann::json::array())) {
      Sibling f;
      f.name = s.value("rfilename", "");
      if (s.contains("size") && s["size"].is_number_unsigned()) f.size = s["size"].get<uint64_t>();
      if (s.contains("lfs") && s["lfs"].is_object()) {
        f.lfs_sha256 = s["lfs"].value("sha256", "");
        if (s["lfs"].contains("size")) f.size = s["lfs"]["size"].get<uint64_t>();
      }
      if (!f.name.empty()) info.files.push_back(std::move(f));
    }
  } catch (const std::exception& e) {
    return corrupt(strfmt("[pull] %s: the Hub's answer for %s is not the expected JSON: %s", repo.c_str(),
                          req.url.c_str(), e.what()));
  }
  if (info.commit.size() != 40) {
    return corrupt(strfmt("[pull] %s: the Hub's answer has no commit sha for revision %s", repo.c_str(),
                          revision.c_str()));
  }
  return info;
}

// ---- choosing files ----------------------------------------------------------------------

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

const std::regex& shard_re() {
  static const std::regex re("-(\\d{5})-of-(\\d{5})\\.gguf$");
  return re;
}

// "dir/model-Q4_K_M-00001-of-00002.gguf" -> "dir/model-Q4_K_M.gguf": one entry per model.
std::string gguf_group(const std::string& name) { return std::regex_replace(name, shard_re(), ".gguf"); }

bool is_model_gguf(const std::string& name) {
  return ends_with(lower(name), ".gguf") && lower(name).find("mmproj") == std::string::npos;
}

bool is_hf_checkpoint_file(const std::string& name) {
  if (name.find('/') != std::string::npos) return false;
  static const char* kNames[] = {"tokenizer.model", "merges.txt", "vocab.txt", "chat_template.jinja"};
  for (const char* n : kNames) {
    if (name == n) return true;
  }
  return ends_with(name, ".json") || ends_with(name, ".safetensors") || ends_with(name, ".tiktoken");
}

struct GgufChoice {
  std::string group;
  std::string quant;
  std::vector<std::string> files;
  uint64_t size = 0;
};

std::vector<GgufChoice> gguf_choices(const RepoInfo& info) {
  std::map<std::string, GgufChoice> groups;
  for (const auto& f : info.files) {
    if (!is_model_gguf(f.name)) continue;
    auto& g = groups[gguf_group(f.name)];
    g.group = gguf_group(f.name);
    g.quant = gguf_quant_of(f.name);
    g.files.push_back(f.name);
    g.size += f.size;
  }
  std::vector<GgufChoice> out;
  for (auto& [k, g] : groups) {
    std::sort(g.files.begin(), g.files.end());
    out.push_back(std::move(g));
  }
  return out;
}

std::string describe_choices(const std::vector<GgufChoice>& cs) {
  std::string s;
  for (const auto& c : cs) {
    s += strfmt("\n  %-10s %10s  %s%s", c.quant.empty() ? "?" : c.quant.c_str(),
                Progress::format_bytes(static_cast<double>(c.size)).c_str(), c.group.c_str(),
                c.files.size() > 1 ? strfmt(" (%zu shards)", c.files.size()).c_str() : "");
  }
  return s;
}

Result<std::vector<std::string>> ask_choice(const std::string& repo, const std::vector<GgufChoice>& cs,
                                            const std::string& why, bool interactive) {
  if (!interactive) {
    return invalid_argument(strfmt("[pull] %s: %s; name one as %s:QUANT or %s:FILE. Available:%s", repo.c_str(),
                                   why.c_str(), repo.c_str(), repo.c_str(), describe_choices(cs).c_str()));
  }
  std::fprintf(stderr, "%s: %s. Which one?", repo.c_str(), why.c_str());
  for (size_t i = 0; i < cs.size(); ++i) {
    std::fprintf(stderr, "\n  [%zu] %-10s %10s  %s", i + 1, cs[i].quant.c_str(),
                 Progress::format_bytes(static_cast<double>(cs[i].size)).c_str(), cs[i].group.c_str());
  }
  std::fprintf(stderr, "\nnumber: ");
  std::string line;
  if (!std::getline(std::cin, line)) return Status(StatusCode::kCancelled, "[pull] no choice made");
  const long n = std::atol(line.c_str());
  if (n < 1 || static_cast<size_t>(n) > cs.size()) {
    return invalid_argument(strfmt("[pull] '%s' is not one of the numbers 1..%zu", line.c_str(), cs.size()));
  }
  return cs[n - 1].files;
}

Result<std::vector<std::string>> choose_files(const std::string& repo, const RepoInfo& info, const std::string& sel,
                                              bool interactive) {
  const auto choices = gguf_choices(info);
  if (!sel.empty()) {
    for (const auto& f : info.files) {
      if (f.name != sel) continue;
      for (const auto& c : choices) {
        if (c.group == gguf_group(sel)) return c.files;  // a shard: all of its model's shards
      }
      return std::vector<std::string>{sel};
    }
    std::vector<GgufChoice> hits;
    for (const auto& c : choices) {
      bool hit = lower(c.quant) == lower(sel);
      // Some repos keep each quantization in a folder named after it.
      for (const auto& part : fs::path(c.group).parent_path()) hit = hit || lower(part.string()) == lower(sel);
      if (hit) hits.push_back(c);
    }
    if (hits.size() == 1) return hits[0].files;
    if (hits.size() > 1) return ask_choice(repo, hits, "several models have quantization " + sel, interactive);
    if (choices.empty()) {
      return not_found(strfmt("[pull] %s has no file '%s' (and no GGUF files to pick a quantization from)", repo.c_str(),
                              sel.c_str()));
    }
    return not_found(strfmt("[pull] %s has no file or GGUF quantization '%s'. Available:%s", repo.c_str(), sel.c_str(),
                            describe_choices(choices).c_str()));
  }
  bool has_config = false, has_safetensors = false;
  for (const auto& f : info.files) {
    has_config = has_config || f.name == "config.json";
    has_safetensors = has_safetensors || (f.name.find('/') == std::string::npos && ends_with(f.name, ".safetensors"));
  }
  if (has_config && has_safetensors) {
    std::vector<std::string> out;
    for (const auto& f : info.files) {
      if (is_hf_checkpoint_file(f.name)) out.push_back(f.name);
    }
    return out;
  }
  if (choices.size() == 1) return choices[0].files;
  if (choices.empty()) {
    return unsupported(strfmt("[pull] %s has neither a safetensors checkpoint (config.json + *.safetensors) nor a GGUF "
                              "file; larder cannot run it",
                              repo.c_str()));
  }
  // llama.cpp's `-hf repo` default: Q4_K_M when the repo has it.
  std::vector<GgufChoice> q4km;
  for (const auto& c : choices) {
    if (lower(c.quant) == "q4_k_m") q4km.push_back(c);
  }
  if (q4km.size() == 1) {
    std::fprintf(stderr, "%s: %zu quantizations; taking Q4_K_M (name another as %s:QUANT, list them with --list)\n",
                 repo.c_str(), choices.size(), repo.c_str());
    return q4km[0].files;
  }
  return ask_choice(repo, choices, strfmt("%zu GGUF models in the repository", choices.size()), interactive);
}

// ---- one file ----------------------------------------------------------------------------

struct FileMeta {
  std::string etag;
  uint64_t size = 0;
  bool size_known = false;
  std::string commit;
};

std::string normalize_etag(std::string e) {
  if (e.rfind("W/", 0) == 0) e = e.substr(2);
  e.erase(std::remove(e.begin(), e.end(), '"'), e.end());
  return e;
}

std::string origin_of(const std::string& url) {  // "https://host:port"
  const size_t p = url.find("://");
  const size_t slash = p == std::string::npos ? std::string::npos : url.find('/', p + 3);
  return slash == std::string::npos ? url : url.substr(0, slash);
}

Result<FileMeta> head_file(const Hub& hub, const std::string& repo, const std::string& commit, const std::string& file) {
  HttpRequest req;
  req.method = "HEAD";
  req.url = hub.endpoint + "/" + repo + "/resolve/" + commit + "/" + quote_path(file);
  req.headers = hub.headers();
  // Redirects on the Hub's own origin (a renamed repo) are followed; one to another origin goes to
  // the CDN, and the metadata is in the redirect's own headers (as huggingface_hub reads it).
  req.follow_redirects = false;
  for (int hop = 0; hop < 10; ++hop) {
    auto r = http_request(req);
    if (!r) return Status(StatusCode::kUnavailable, "[pull] " + r.status().message());
    const bool redirect = r->status >= 300 && r->status < 400;
    const std::string loc = r->header("location");
    if (redirect && !loc.empty() && (loc[0] == '/' || origin_of(loc) == origin_of(req.url))) {
      req.url = loc[0] == '/' ? origin_of(req.url) + loc : loc;
      continue;
    }
    if (!redirect && r->status != 200) return hub_error(hub, *r, repo, file);
    FileMeta m;
    m.etag = normalize_etag(r->header("x-linked-etag"));
    if (m.etag.empty()) m.etag = normalize_etag(r->header("etag"));
    std::string size = r->header("x-linked-size");
    if (size.empty() && !redirect) size = r->header("content-length");
    if (!size.empty()) m.size = std::strtoull(size.c_str(), nullptr, 10), m.size_known = true;
    m.commit = r->header("x-repo-commit");
    if (m.etag.empty() || m.etag.find('/') != std::string::npos || m.etag == "." || m.etag == "..") {
      return corrupt(strfmt("[pull] %s: %s: the Hub sent no usable ETag, so the file cannot be cached or verified",
                            repo.c_str(), file.c_str()));
    }
    return m;
  }
  return Status(StatusCode::kUnavailable, strfmt("[pull] %s: %s: too many redirects", repo.c_str(), file.c_str()));
}

bool is_hex(const std::string& s, size_t n) {
  return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

uint64_t file_size_or_zero(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

bool disk_full_errno(int e) { return e == ENOSPC || e == EFBIG || e == EDQUOT; }

class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return;
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      std::fprintf(stderr, "waiting for another download of the same file (%s)\n", path.c_str());
      ::flock(fd_, LOCK_EX);
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  int fd_ = -1;
};

// Downloads into blob + ".incomplete", resuming, then verifies and renames.
Status fetch_blob(const Hub& hub, const PullOptions& opts, const std::string& repo, const std::string& url,
                  const std::string& blob, const FileMeta& meta, const std::string& label, uint64_t* fetched) {
  const std::string inc = blob + ".incomplete";
  const bool sha256 = is_hex(meta.etag, 64), gitsha = is_hex(meta.etag, 40);
  for (int pass = 0; pass < 2; ++pass) {
    std::unique_ptr<Digest> digest;
    uint64_t have = 0;
    bool complete = false;
    for (int attempt = 1; !complete; ++attempt) {
      have = file_size_or_zero(inc);
      if (meta.size_known && have > meta.size) have = 0;
      const int fd = ::open(inc.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) return io_error(strfmt("[pull] cannot create %s: %s", inc.c_str(), std::strerror(errno)));
      if (::ftruncate(fd, static_cast<off_t>(have)) != 0 || ::lseek(fd, static_cast<off_t>(have), SEEK_SET) < 0) {
        ::close(fd);
        return io_error(strfmt("[pull] %s: %s", inc.c_str(), std::strerror(errno)));
      }
      digest = std::make_unique<Digest>(sha256 ? Digest::Kind::kSha256 : Digest::Kind::kGitBlobSha1, meta.size);
      if (have > 0) {
        if (auto st = digest_file_prefix(inc, have, *digest); !st) {
          ::close(fd);
          return st;
        }
      }
      if (meta.size_known && have == meta.size) {
        ::close(fd);
        complete = true;
        break;
      }
      if (have > 0) {
        std::fprintf(stderr, "%s: resuming at %s\n", label.c_str(), Progress::format_bytes(static_cast<double>(have)).c_str());
      }
      Progress progress(label, meta.size_known ? meta.size : 0, Progress::Unit::kBytes, have);
      int write_errno = 0;
      Status header_error;
      uint64_t pos = have;
      HttpRequest req;
      req.url = url;
      req.headers = hub.headers();
      req.range_start = have;
      auto on_headers = [&](const HttpResponse& r) {
        if (r.status == 206) {
          const std::string cr = r.header("content-range");  // "bytes START-END/TOTAL"
          const uint64_t start = cr.rfind("bytes ", 0) == 0 ? std::strtoull(cr.c_str() + 6, nullptr, 10) : UINT64_MAX;
          if (start == pos) return true;
          header_error = corrupt(strfmt("[pull] %s: asked for bytes from %llu, the server sent '%s'", label.c_str(),
                                        static_cast<unsigned long long>(pos), cr.c_str()));
          return false;
        }
        if (r.status == 200) {
          if (pos > 0) {  // the server ignored the Range: start over
            if (::ftruncate(fd, 0) != 0 || ::lseek(fd, 0, SEEK_SET) < 0) {
              write_errno = errno;
              return false;
            }
            pos = 0;
            digest = std::make_unique<Digest>(sha256 ? Digest::Kind::kSha256 : Digest::Kind::kGitBlobSha1, meta.size);
          }
          return true;
        }
        header_error = hub_error(hub, r, repo, label);
        return false;
      };
      auto sink = [&](const char* data, size_t n) {
        size_t off = 0;
        while (off < n) {
          const ssize_t w = ::write(fd, data + off, n - off);
          if (w < 0) {
            if (errno == EINTR) continue;
            write_errno = errno;
            return false;
          }
          off += static_cast<size_t>(w);
        }
        digest->update(data, n);
        pos += n;
        *fetched += n;
        progress.update(pos);
        return true;
      };
      FetchResult fr = http_fetch(req, on_headers, sink);
      ::close(fd);
      if (fr.ok) {
        progress.finish();
        have = pos;
        complete = true;
        break;
      }
      if (write_errno) {
        progress.finish(std::strerror(write_errno));
        if (disk_full_errno(write_errno)) {
          return Status(StatusCode::kResourceExhausted,
                        strfmt("[pull] %s: the disk is full (%s) after %s of %s; free space in %s and run the same "
                               "command again to resume (the partial download stays as %s)",
                               label.c_str(), std::strerror(write_errno),
                               Progress::format_bytes(static_cast<double>(pos)).c_str(),
                               Progress::format_bytes(static_cast<double>(meta.size)).c_str(), hub.cache.c_str(),
                               fs::path(inc).filename().c_str()));
        }
        return io_error(strfmt("[pull] %s: cannot write %s: %s", label.c_str(), inc.c_str(), std::strerror(write_errno)));
      }
      if (!header_error.is_ok()) {
        progress.finish("error");
        return header_error;
      }
      progress.finish(fr.error.message);
      if (!fr.error.retriable || attempt >= opts.max_attempts) {
        return Status(StatusCode::kUnavailable,
                      strfmt("[pull] %s: download failed after %d attempt(s): %s; run the same command again to resume "
                             "from %s",
                             label.c_str(), attempt, fr.error.message.c_str(),
                             Progress::format_bytes(static_cast<double>(pos)).c_str()));
      }
      std::fprintf(stderr, "%s: connection lost (%s); resuming (attempt %d of %d)\n", label.c_str(),
                   fr.error.message.c_str(), attempt + 1, opts.max_attempts);
      std::this_thread::sleep_for(std::chrono::milliseconds(250 * attempt));
    }
    const uint64_t got = file_size_or_zero(inc);
    const std::string hash = (sha256 || gitsha) ? digest->hex() : std::string();
    std::string problem;
    if (meta.size_known && got != meta.size) {
      problem = strfmt("%llu bytes instead of %llu", static_cast<unsigned long long>(got),
                       static_cast<unsigned long long>(meta.size));
    } else if ((sha256 || gitsha) && hash != meta.etag) {
      problem = strfmt("%s %s instead of %s", sha256 ? "sha256" : "git blob sha1", hash.c_str(), meta.etag.c_str());
    }
    if (problem.empty()) {
      const int fd = ::open(inc.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        ::fsync(fd);
        // The written pages sit in the page cache in folios no larger than one write, which map
        // with 4 KiB pages; dropped now, the first load reads the file back in 2 MiB folios
        // (core/mmap_file.h regroup_page_cache, which would otherwise do this at that load).
        ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        ::close(fd);
      }
      std::error_code ec;
      fs::rename(inc, blob, ec);
      if (ec) return io_error(strfmt("[pull] cannot rename %s: %s", inc.c_str(), ec.message().c_str()));
      return Status::ok();
    }
    std::error_code ec;
    fs::remove(inc, ec);
    if (pass == 0) {
      std::fprintf(stderr, "%s: downloaded content does not verify (%s); removed it, fetching again\n", label.c_str(),
                   problem.c_str());
      continue;
    }
    return corrupt(strfmt("[pull] %s: downloaded content does not verify twice (%s); nothing was kept. The mirror at %s "
                          "may be serving a broken file",
                          label.c_str(), problem.c_str(), hub.endpoint.c_str()));
  }
  return internal_error("[pull] unreachable");
}

}  // namespace

std::string gguf_quant_of(const std::string& filename) {
  std::string stem = fs::path(std::regex_replace(filename, shard_re(), ".gguf")).filename().string();
  if (ends_with(lower(stem), ".gguf")) stem.resize(stem.size() - 5);
  static const std::regex re("(?:^|[-._])((?:I?Q[0-9](?:_[A-Za-z0-9]+)*)|(?:TQ[0-9]_[0-9])|(?:MXFP4(?:_[A-Za-z0-9]+)*)|"
                             "BF16|FP16|F16|F32)(?=$|[-.])",
                             std::regex::icase);
  std::string found;
  for (auto it = std::sregex_iterator(stem.begin(), stem.end(), re); it != std::sregex_iterator(); ++it) {
    found = (*it)[1].str();
  }
  for (auto& c : found) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return found;
}

Result<PullResult> pull_model(const PullOptions& opts) {
  const Hub hub = hub_from_env();
  std::string repo = opts.spec, sel;
  if (const size_t colon = repo.find(':'); colon != std::string::npos) {
    sel = repo.substr(colon + 1);
    repo.resize(colon);
  }
  if (auto st = validate_repo_id(repo); !st) return st;
  if (env_true("HF_HUB_OFFLINE")) {
    return Status(StatusCode::kUnavailable, "[pull] HF_HUB_OFFLINE is set: not contacting the Hub (unset it to download)");
  }
  auto info = fetch_repo_info(hub, repo, opts.revision);
  if (!info) return info.status();

  if (opts.list_only) {
    const auto choices = gguf_choices(*info);
    std::printf("%s @ %s (%s)\n", repo.c_str(), opts.revision.c_str(), info->commit.c_str());
    if (!choices.empty()) std::printf("GGUF quantizations:%s\n", describe_choices(choices).c_str());
    std::printf("files:\n");
    for (const auto& f : info->files) {
      std::printf("  %10s  %s\n", Progress::format_bytes(static_cast<double>(f.size)).c_str(), f.name.c_str());
    }
    PullResult r;
    r.repo_id = repo;
    r.commit = info->commit;
    return r;
  }

  auto files = choose_files(repo, *info, sel, opts.interactive);
  if (!files) return files.status();
  // config.json last: the snapshot looks loadable to model locators only once everything else is in.
  std::stable_partition(files->begin(), files->end(), [](const std::string& f) { return f != "config.json"; });

  const fs::path repo_dir = fs::path(hub.cache) / repo_folder_name(repo);
  const fs::path blobs = repo_dir / "blobs";
  std::error_code ec;
  fs::create_directories(blobs, ec);
  if (ec) return io_error(strfmt("[pull] cannot create %s: %s", blobs.c_str(), ec.message().c_str()));

  PullResult res;
  res.repo_id = repo;
  res.commit = info->commit;
  res.snapshot_dir = (repo_dir / "snapshots" / info->commit).string();

  // Metadata of every file first, so the space check covers the whole pull.
  std::vector<FileMeta> metas;
  uint64_t need = 0;
  for (const auto& f : *files) {
    auto m = head_file(hub, repo, info->commit, f);
    if (!m) return m.status();
    if (!m->commit.empty() && m->commit != info->commit) {
      return corrupt(strfmt("[pull] %s: %s resolved to commit %s, the revision to %s", repo.c_str(), f.c_str(),
                            m->commit.c_str(), info->commit.c_str()));
    }
    for (const auto& s : info->files) {  // the listing and the file's own headers must agree
      if (s.name == f && !s.lfs_sha256.empty() && s.lfs_sha256 != m->etag) {
        return corrupt(strfmt("[pull] %s: %s: the listing says sha256 %s, the file's etag is %s", repo.c_str(),
                              f.c_str(), s.lfs_sha256.c_str(), m->etag.c_str()));
      }
    }
    const std::string blob = (blobs / m->etag).string();
    if (!fs::exists(blob, ec)) {
      const uint64_t partial = file_size_or_zero(blob + ".incomplete");
      if (m->size > partial) need += m->size - partial;
    }
    metas.push_back(*m);
  }
  struct statvfs vfs{};
  if (::statvfs(blobs.c_str(), &vfs) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (need > free_bytes) {
      return Status(StatusCode::kResourceExhausted,
                    strfmt("[pull] %s needs %s more in %s, only %s is free; free space or point HF_HUB_CACHE at a "
                           "larger disk",
                           repo.c_str(), Progress::format_bytes(static_cast<double>(need)).c_str(), hub.cache.c_str(),
                           Progress::format_bytes(static_cast<double>(free_bytes)).c_str()));
    }
  }

  for (size_t i = 0; i < files->size(); ++i) {
    const std::string& f = (*files)[i];
    const FileMeta& m = metas[i];
    const std::string blob = (blobs / m.etag).string();
    const std::string label = strfmt("[%zu/%zu] %s", i + 1, files->size(), f.c_str());
    {
      FileLock lock((fs::path(hub.cache) / ".locks" / repo_folder_name(repo) / (m.etag + ".lock")).string());
      if (fs::exists(blob, ec) && (!m.size_known || file_size_or_zero(blob) == m.size)) {
        res.reused_bytes += file_size_or_zero(blob);
        std::fprintf(stderr, "%s: already in the cache\n", label.c_str());
      } else {
        const std::string url = hub.endpoint + "/" + repo + "/resolve/" + info->commit + "/" + quote_path(f);
        if (auto st = fetch_blob(hub, opts, repo, url, blob, m, label, &res.downloaded_bytes); !st) return st;
      }
    }
    if (auto st = link_snapshot_file(repo_dir.string(), info->commit, f, m.etag); !st) return st;
    res.files.push_back(f);
  }
  if (opts.revision != info->commit) {
    if (auto st = write_ref(repo_dir.string(), opts.revision, info->commit); !st) return st;
  }
  res.model_path = res.snapshot_dir;
  std::vector<std::string> ggufs;
  for (const auto& f : res.files) {
    if (is_model_gguf(f)) ggufs.push_back(f);
  }
  std::sort(ggufs.begin(), ggufs.end());
  if (!ggufs.empty() && std::find(res.files.begin(), res.files.end(), "config.json") == res.files.end()) {
    res.model_path = (fs::path(res.snapshot_dir) / ggufs.front()).string();
  }
  return res;
}

}  // namespace larder::hub
