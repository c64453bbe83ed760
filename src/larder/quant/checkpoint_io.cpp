// checkpoint_io.cpp — see checkpoint_io.h.
#include "larder/quant/checkpoint_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace larder::quant {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kI16: return "I16";
    case DType::kI32: return "I32";
    case DType::kU32: return "U32";
    case DType::kI64: return "I64";
    case DType::kF64: return "F64";
    case DType::kBool: return "BOOL";
    default: return nullptr;
  }
}

Status write_fd_all(int fd, const void* data, size_t n, const std::string& path) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, 1u << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return io_error(strfmt("[checkpoint] writing %s: %s", path.c_str(), std::strerror(errno)));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::ok();
}

Status write_text_file(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(strfmt("[checkpoint] cannot create %s: %s", path.c_str(), std::strerror(errno)));
  Status st = write_fd_all(fd, text.data(), text.size(), path);
  if (st && ::fsync(fd) != 0) st = io_error(strfmt("[checkpoint] fsync %s: %s", path.c_str(), std::strerror(errno)));
  ::close(fd);
  return st;
}

Status write_config_json(const std::string& path, const ordered_json& cfg) {
  std::vector<std::string> keys;
  for (auto it = cfg.begin(); it != cfg.end(); ++it) keys.push_back(it.key());
  std::sort(keys.begin(), keys.end());
  ordered_json sorted = ordered_json::object();
  for (const std::string& k : keys) sorted[k] = cfg[k];
  return write_text_file(path, sorted.dump(4) + "\n");
}

bool is_aux_file(const std::string& name) {
  static const char* kNames[] = {"tokenizer.json", "tokenizer_config.json", "tokenizer.model", "spiece.model",
                                 "chat_template.jinja", "chat_template.json", "generation_config.json",
                                 "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
                                 "kv_config.json", "README.md"};
  for (const char* n : kNames)
    if (name == n) return true;
  return name.size() > 6 && name.compare(name.size() - 6, 6, ".model") == 0;
}

Status copy_aux_files(const std::string& src_dir, const std::string& dst_dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(src_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || !is_aux_file(name)) continue;
    fs::copy_file(e.path(), fs::path(dst_dir) / name, ec);
    if (ec) return io_error("[checkpoint] copying " + e.path().string() + ": " + ec.message());
  }
  if (ec) return io_error("[checkpoint] listing " + src_dir + ": " + ec.message());
  return Status::ok();
}

namespace {

Status write_one_shard(const std::string& path, const std::vector<ShardEntry>& entries, size_t first, size_t last,
                       const ordered_json& metadata, const TensorProducer& produce) {
  ordered_json header = ordered_json::object();
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  uint64_t off = 0;
  for (size_t i = first; i < last; ++i) {
    const ShardEntry& e = entries[i];
    const char* dn = safetensors_dtype_name(e.dtype);
    if (!dn) return unsupported(strfmt("[checkpoint] tensor '%s' has dtype %s, which safetensors cannot carry", e.name.c_str(), dtype_name(e.dtype)));
    header[e.name] = {{"dtype", dn}, {"shape", e.shape}, {"data_offsets", {off, off + e.nbytes}}};
    off += e.nbytes;
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(strfmt("[checkpoint] cannot create %s: %s", path.c_str(), std::strerror(errno)));
  auto fail = [&](Status s) {
    ::close(fd);
    return s;
  };
  const uint64_t hlen = h.size();
  if (Status s = write_fd_all(fd, &hlen, 8, path); !s) return fail(s);
  if (Status s = write_fd_all(fd, h.data(), h.size(), path); !s) return fail(s);
  for (size_t i = first; i < last; ++i) {
    auto data = produce(i);
    if (!data) return fail(data.status());
    if (Status s = write_fd_all(fd, data.value(), entries[i].nbytes, path); !s) return fail(s);
  }
  if (::fsync(fd) != 0) return fail(io_error(strfmt("[checkpoint] fsync %s: %s", path.c_str(), std::strerror(errno))));
  // Written pages are cached in small folios (4 KiB mappings); dropped, the first load reads the
  // weights back in 2 MiB folios (as hub/pull.cpp does for a download).
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return Status::ok();
}

}  // namespace

Result<ShardsWritten> write_safetensors_shards(const std::string& dir, const std::vector<ShardEntry>& entries,
                                               uint64_t max_shard_bytes, const ordered_json& metadata,
                                               uint64_t total_parameters, const TensorProducer& produce) {
  std::vector<std::pair<size_t, size_t>> shards;  // [first, last) entry ranges
  uint64_t cur = 0;
  ShardsWritten out;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (shards.empty() || (cur > 0 && cur + entries[i].nbytes > max_shard_bytes)) {
      shards.push_back({i, i});
      cur = 0;
    }
    shards.back().second = i + 1;
    cur += entries[i].nbytes;
    out.total_bytes += entries[i].nbytes;
  }
  if (shards.empty()) shards.push_back({0, 0});
  out.n_shards = shards.size();
  out.file_of.resize(entries.size());
  ordered_json weight_map = ordered_json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string fname = shards.size() == 1 ? std::string("model.safetensors")
                                                 : strfmt("model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    if (Status st = write_one_shard(dir + "/" + fname, entries, shards[s].first, shards[s].second, metadata, produce); !st)
      return st;
    for (size_t i = shards[s].first; i < shards[s].second; ++i) {
      out.file_of[i] = fname;
      weight_map[entries[i].name] = fname;
    }
  }
  if (shards.size() > 1) {
    ordered_json idx;
    idx["metadata"] = {{"total_size", out.total_bytes}, {"total_parameters", total_parameters}};
    idx["weight_map"] = weight_map;
    if (Status st = write_text_file(dir + "/model.safetensors.index.json", idx.dump(4) + "\n"); !st) return st;
  }
  return out;
}

Status publish_directory(const std::string& dst_in, const std::string& what,
                         const std::function<Status(const std::string& tmp_dir)>& fill) {
  struct stat sb;
  std::string dst = dst_in;
  while (dst.size() > 1 && dst.back() == '/') dst.pop_back();
  if (::lstat(dst.c_str(), &sb) == 0)
    return invalid_argument(what + " output " + dst + " already exists; refusing to overwrite it");
  std::string tmpl = dst + ".partial-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr)
    return io_error(what + " cannot create a temporary directory next to " + dst + ": " + std::strerror(errno));
  const std::string tmp(buf.data());
  ::chmod(tmp.c_str(), 0755);
  std::error_code ec;
  if (Status st = fill(tmp); !st) {
    fs::remove_all(tmp, ec);
    return st;
  }
  if (::lstat(dst.c_str(), &sb) == 0) {
    fs::remove_all(tmp, ec);
    return invalid_argument(what + " output " + dst + " appeared while writing it; refusing to overwrite it");
  }
  if (::rename(tmp.c_str(), dst.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    fs::remove_all(tmp, ec);
    return io_error(what + " cannot rename " + tmp + " to " + dst + ": " + err);
  }
  return Status::ok();
}

}  // namespace larder::quant
