#include "larder/memory/store/lkv_format.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <xxhash.h>

#include "larder/core/log.h"
#include "larder/core/mmap_file.h"

namespace larder::memory {

// ---- I/O layer ----------------------------------------------------------------------------

int IoLayer::open(const char* path, int flags, mode_t mode) {
  int fd = ::open(path, flags, mode);
  return fd < 0 ? -errno : fd;
}
ssize_t IoLayer::pwrite(int fd, const void* buf, size_t n, off_t off) {
  ssize_t r = ::pwrite(fd, buf, n, off);
  return r < 0 ? -errno : r;
}
int IoLayer::ftruncate(int fd, off_t size) { return ::ftruncate(fd, size) < 0 ? -errno : 0; }
int IoLayer::fdatasync(int fd) { return ::fdatasync(fd) < 0 ? -errno : 0; }
int IoLayer::close(int fd) { return ::close(fd) < 0 ? -errno : 0; }
int IoLayer::rename(const char* from, const char* to) { return ::rename(from, to) < 0 ? -errno : 0; }
int IoLayer::fsync_dir(const char* dir) {
  int fd = ::open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int r = ::fsync(fd) < 0 ? -errno : 0;
  ::close(fd);
  return r;
}
int IoLayer::unlink(const char* path) { return ::unlink(path) < 0 ? -errno : 0; }

IoLayer& posix_io() {
  static IoLayer io;
  return io;
}

const char* write_failure_name(WriteFailure f) {
  switch (f) {
    case WriteFailure::kNone: return "none";
    case WriteFailure::kOpen: return "open";
    case WriteFailure::kWrite: return "write";
    case WriteFailure::kNoSpace: return "no_space";
    case WriteFailure::kSync: return "sync";
    case WriteFailure::kRename: return "rename";
    case WriteFailure::kDrift: return "drift";
  }
  return "unknown";
}

namespace {

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string checksum_hex(uint64_t v) { return hex64(v); }
const std::string kPlaceholder(16, '0');

Result<uint64_t> parse_hex64(const nlohmann::json& j) {
  if (!j.is_string()) return corrupt("[lkv] checksum is not a string");
  const std::string s = j.get<std::string>();
  if (s.size() != 16) return corrupt("[lkv] checksum is not 16 hex digits");
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return corrupt("[lkv] checksum is not lowercase hex");
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return v;
}

Result<DType> parse_dtype(const std::string& s) {
  for (int i = 0; i < static_cast<int>(DType::kUnknown); ++i) {
    if (s == dtype_name(static_cast<DType>(i))) return static_cast<DType>(i);
  }
  return corrupt(strfmt("[lkv] unknown dtype '%s'", s.c_str()));
}

nlohmann::json identity_json(const StoreIdentity& id) {
  return {{"weights_id", id.weights_id}, {"config_fp", id.config_fp}, {"kv_scheme", id.kv_scheme},
          {"tokenizer_fp", id.tokenizer_fp}, {"numerics_id", id.numerics_id}, {"model_label", id.model_label}};
}

StoreIdentity identity_from_json(const nlohmann::json& j) {
  StoreIdentity id;
  id.weights_id = j.at("weights_id").get<std::string>();
  id.config_fp = j.at("config_fp").get<std::string>();
  id.kv_scheme = j.at("kv_scheme").get<std::string>();
  id.tokenizer_fp = j.at("tokenizer_fp").get<std::string>();
  id.numerics_id = j.at("numerics_id").get<std::string>();
  id.model_label = j.value("model_label", "");
  return id;
}

// A tensor to write: contiguous chunks, planned offset, and where its JSON record lives.
struct Planned {
  std::vector<std::pair<const uint8_t*, size_t>> chunks;
  size_t bytes = 0;
  nlohmann::json* meta = nullptr;  // the {"off","bytes","xxh3",...} object in the header
};

struct Plan {
  nlohmann::json header;
  std::vector<Planned> tensors;  // [0] is the token section
  std::vector<uint32_t> token_bytes;
  uint64_t data_offset = 0;
  uint64_t file_size = 0;
  std::string header_text;
};

nlohmann::json tensor_json(const std::string& name, DType dtype, const std::vector<int64_t>& shape, size_t bytes) {
  return {{"name", name}, {"off", 0}, {"bytes", bytes}, {"shape", shape}, {"dtype", dtype_name(dtype)},
          {"xxh3", kPlaceholder}};
}

// Builds the header with placeholder checksums and assigns every tensor its aligned offset.
// The offsets are part of the header, whose length decides the data offset: iterate to a fixed
// point (offsets only grow, so it converges in a couple of rounds).
Status plan_file(const Entry& e, const StoreIdentity& identity, Plan* plan) {
  nlohmann::json& h = plan->header;
  const int64_t n = static_cast<int64_t>(e.tokens.size());
  h["format_version"] = kLkvVersion;
  h["created_ms"] = e.created_ms != 0 ? e.created_ms
                                      : std::chrono::duration_cast<std::chrono::milliseconds>(
                                            std::chrono::system_clock::now().time_since_epoch()).count();
  h["align"] = kLkvAlign;
  h["identity"] = identity_json(identity);
  h["ns_id"] = e.ns;
  h["n_tokens"] = n;
  h["tokens"] = {{"off", 0}, {"bytes", n * 4}, {"xxh3", kPlaceholder}};
  h["floor"] = e.floor;
  h["trimmable"] = e.trimmable;
  h["label"] = e.label;
  h["signature"] = e.signature;
  h["layers"] = nlohmann::json::array();
  h["attachments"] = nlohmann::json::array();
  plan->token_bytes.assign(e.tokens.begin(), e.tokens.end());

  // Tensor records are addressed by JSON pointer after the header is complete (pointers into a
  // growing json array would dangle).
  struct Pending {
    std::vector<std::pair<const uint8_t*, size_t>> chunks;
    size_t bytes;
    nlohmann::json::json_pointer where;
  };
  std::vector<Pending> pend;
  pend.push_back({{{reinterpret_cast<const uint8_t*>(plan->token_bytes.data()), plan->token_bytes.size() * 4}},
                  plan->token_bytes.size() * 4, nlohmann::json::json_pointer("/tokens")});
  size_t li = 0;
  if (e.kv) {
    const KvLayout& L = e.kv->layout();
    const size_t row_bytes = static_cast<size_t>(L.row_bytes());
    std::vector<KvSpan> spans;
    for (int l = 0; l < L.n_layers; ++l, ++li) {
      nlohmann::json layer = {{"kind", "plain_kv"}, {"offset", n}, {"n_kv_heads", L.n_kv_heads},
                              {"head_dim", L.head_dim}, {"floor", 0}, {"tensors", nlohmann::json::array()}};
      const size_t bytes = static_cast<size_t>(n) * row_bytes;
      // The tensors' dtype records the KV dtype (F32 / F16 / Q8_0); the entry's signature says it
      // again ("plain_kv:f16:..."), and both are checked at restore.
      layer["tensors"].push_back(tensor_json("k", L.dtype, {n, L.n_kv_heads, L.head_dim}, bytes));
      layer["tensors"].push_back(tensor_json("v", L.dtype, {n, L.n_kv_heads, L.head_dim}, bytes));
      h["layers"].push_back(layer);
      spans.clear();
      e.kv->prefix_spans(l, n, &spans);
      Pending pk{{}, bytes, nlohmann::json::json_pointer(strfmt("/layers/%zu/tensors/0", li))};
      Pending pv{{}, bytes, nlohmann::json::json_pointer(strfmt("/layers/%zu/tensors/1", li))};
      for (const KvSpan& s : spans) {
        pk.chunks.push_back({static_cast<const uint8_t*>(s.k), static_cast<size_t>(s.len) * row_bytes});
        pv.chunks.push_back({static_cast<const uint8_t*>(s.v), static_cast<size_t>(s.len) * row_bytes});
      }
      pend.push_back(std::move(pk));
      pend.push_back(std::move(pv));
    }
  }
  for (const auto& ls : e.layers) {
    nlohmann::json layer = {{"kind", state_kind_name(ls->kind())}, {"offset", ls->offset()},
                            {"floor", ls->min_reusable_offset()}, {"params", ls->params()},
                            {"signature", ls->signature()}, {"tensors", nlohmann::json::array()}};
    const std::vector<StateTensor> ts = ls->tensors();
    for (size_t t = 0; t < ts.size(); ++t) {
      layer["tensors"].push_back(tensor_json(ts[t].name, ts[t].dtype, ts[t].shape, ts[t].bytes));
      pend.push_back({{{ts[t].data, ts[t].bytes}}, ts[t].bytes,
                      nlohmann::json::json_pointer(strfmt("/layers/%zu/tensors/%zu", li, t))});
    }
    h["layers"].push_back(layer);
    ++li;
  }
  for (size_t a = 0; a < e.attachments.size(); ++a) {
    const Attachment& at = e.attachments[a];
    nlohmann::json aj = {{"schema", at.schema}, {"metadata", at.metadata}, {"tensors", nlohmann::json::array()}};
    for (size_t t = 0; t < at.tensors.size(); ++t) {
      const StateTensor& ts = at.tensors[t];
      aj["tensors"].push_back(tensor_json(ts.name, ts.dtype, ts.shape, ts.bytes));
      pend.push_back({{{ts.data, ts.bytes}}, ts.bytes,
                      nlohmann::json::json_pointer(strfmt("/attachments/%zu/tensors/%zu", a, t))});
    }
    h["attachments"].push_back(aj);
  }

  uint64_t data_offset = kLkvAlign;
  for (int round = 0; round < 16; ++round) {
    uint64_t off = data_offset;
    for (Pending& p : pend) {
      h[p.where]["off"] = off;
      off = align_up(off + p.bytes, kLkvAlign);
    }
    plan->header_text = h.dump();
    const uint64_t need = align_up(sizeof(LkvPrefix) + plan->header_text.size(), kLkvAlign);
    if (need == data_offset) {
      // Declared size ends at the last tensor's last byte (no trailing padding).
      uint64_t end = data_offset;
      for (Pending& p : pend) end = h[p.where]["off"].get<uint64_t>() + p.bytes;
      plan->data_offset = data_offset;
      plan->file_size = end;
      plan->tensors.clear();
      for (Pending& p : pend) plan->tensors.push_back({std::move(p.chunks), p.bytes, &h[p.where]});
      return Status::ok();
    }
    data_offset = need;
  }
  return internal_error("[lkv] header layout did not converge");
}

Status fail(WriteFailure cls, WriteFailure* out, const std::string& msg) {
  if (out) *out = cls;
  return io_error(msg);
}

std::string dirname_of(const std::string& p) {
  const size_t s = p.rfind('/');
  return s == std::string::npos ? "." : (s == 0 ? "/" : p.substr(0, s));
}

}  // namespace

Status write_lkv(const std::string& final_path, const Entry& e, const StoreIdentity& identity, IoLayer& io,
                 WriteFailure* failure) {
  if (failure) *failure = WriteFailure::kNone;
  // §7.3 step 1: plan; nothing is materialized.
  Plan plan;
  LARDER_RETURN_IF_ERROR(plan_file(e, identity, &plan));
  const size_t planned_header = plan.header_text.size();

  // Step 2: exclusive temp file, 0600 (KV files are derived from prompt content, §7.1).
  const std::string tmp = final_path + ".tmp";
  int fd = io.open(tmp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd == -EEXIST) {  // a leftover of an interrupted write of this same entry: ours to reap
    io.unlink(tmp.c_str());
    fd = io.open(tmp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  }
  if (fd < 0) {
    return fail(fd == -ENOSPC ? WriteFailure::kNoSpace : WriteFailure::kOpen, failure,
                strfmt("[lkv] %s: cannot create: %s", tmp.c_str(), std::strerror(-fd)));
  }
  auto abort_write = [&](WriteFailure cls, const std::string& msg) {
    io.close(fd);
    io.unlink(tmp.c_str());
    return fail(cls, failure, msg);
  };
  auto write_all = [&](const uint8_t* p, size_t n, uint64_t off) -> int {
    while (n > 0) {
      ssize_t w = io.pwrite(fd, p, n, static_cast<off_t>(off));
      if (w == -EINTR) continue;
      if (w < 0) return static_cast<int>(w);
      if (w == 0) return -EIO;
      p += w;
      n -= static_cast<size_t>(w);
      off += static_cast<uint64_t>(w);
    }
    return 0;
  };

  // Step 3: each tensor: checksum its contiguous chunks, positional write.
  XXH3_state_t* st = XXH3_createState();
  for (Planned& t : plan.tensors) {
    size_t total = 0;
    for (auto& c : t.chunks) total += c.second;
    if (total != t.bytes) {  // byte-length drift is a bug: never publish a short tensor
      XXH3_freeState(st);
      LARDER_LOG_ERROR("[lkv] byte-length drift in %s: planned %zu, have %zu", tmp.c_str(), t.bytes, total);
      return abort_write(WriteFailure::kDrift, "[lkv] byte-length drift");
    }
    XXH3_64bits_reset(st);
    uint64_t off = (*t.meta)["off"].get<uint64_t>();
    for (auto& c : t.chunks) {
      XXH3_64bits_update(st, c.first, c.second);
      int r = write_all(c.first, c.second, off);
      if (r < 0) {
        XXH3_freeState(st);
        return abort_write(r == -ENOSPC ? WriteFailure::kNoSpace : WriteFailure::kWrite,
                           strfmt("[lkv] %s: write failed: %s", tmp.c_str(), std::strerror(-r)));
      }
      off += c.second;
    }
    (*t.meta)["xxh3"] = checksum_hex(XXH3_64bits_digest(st));
  }
  XXH3_freeState(st);

  // Step 4: prefix + header at offset 0; the real checksums have the placeholders' width.
  const std::string text = plan.header.dump();
  if (text.size() != planned_header) {
    return abort_write(WriteFailure::kDrift, "[lkv] header length changed after hashing");
  }
  LkvPrefix pre{};
  std::memcpy(pre.magic, kLkvMagic, 8);
  pre.version = kLkvVersion;
  pre.header_len = static_cast<uint32_t>(text.size());
  pre.data_offset = plan.data_offset;
  pre.file_size = plan.file_size;
  pre.header_xxh3 = XXH3_64bits(text.data(), text.size());
  pre.prefix_xxh3 = XXH3_64bits(&pre, 40);
  std::vector<uint8_t> head(plan.data_offset, 0);
  std::memcpy(head.data(), &pre, sizeof pre);
  std::memcpy(head.data() + sizeof pre, text.data(), text.size());
  if (int r = write_all(head.data(), head.size(), 0); r < 0) {
    return abort_write(r == -ENOSPC ? WriteFailure::kNoSpace : WriteFailure::kWrite,
                       strfmt("[lkv] %s: header write failed: %s", tmp.c_str(), std::strerror(-r)));
  }
  if (int r = io.ftruncate(fd, static_cast<off_t>(plan.file_size)); r < 0) {
    return abort_write(r == -ENOSPC ? WriteFailure::kNoSpace : WriteFailure::kWrite,
                       strfmt("[lkv] %s: truncate failed: %s", tmp.c_str(), std::strerror(-r)));
  }
  // Step 5: fdatasync → rename → fsync(dir). Only then is the entry durable.
  if (int r = io.fdatasync(fd); r < 0) {
    return abort_write(r == -ENOSPC ? WriteFailure::kNoSpace : WriteFailure::kSync,
                       strfmt("[lkv] %s: fdatasync failed: %s", tmp.c_str(), std::strerror(-r)));
  }
  if (int r = io.close(fd); r < 0) {
    io.unlink(tmp.c_str());
    return fail(WriteFailure::kSync, failure, strfmt("[lkv] %s: close failed: %s", tmp.c_str(), std::strerror(-r)));
  }
  if (int r = io.rename(tmp.c_str(), final_path.c_str()); r < 0) {
    io.unlink(tmp.c_str());
    return fail(WriteFailure::kRename, failure,
                strfmt("[lkv] %s: rename failed: %s", final_path.c_str(), std::strerror(-r)));
  }
  if (int r = io.fsync_dir(dirname_of(final_path).c_str()); r < 0) {
    // The rename happened but may not survive a power cut: report failure (the file itself is
    // complete and valid, so leaving it is safe; a later scan indexes it).
    return fail(WriteFailure::kSync, failure,
                strfmt("[lkv] %s: directory fsync failed: %s", final_path.c_str(), std::strerror(-r)));
  }
  return Status::ok();
}

// ---- reader -------------------------------------------------------------------------------

namespace {

Status pread_all(int fd, void* buf, size_t n, uint64_t off, const std::string& path) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return io_error(strfmt("[lkv] %s: read failed: %s", path.c_str(), std::strerror(errno)));
    if (r == 0) return corrupt(strfmt("[lkv] %s: truncated", path.c_str()));
    p += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return Status::ok();
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

Result<LkvInfo> read_lkv_info(const std::string& path, const StoreIdentity* expected, LkvKey* key) {
  return read_lkv_info_at(AT_FDCWD, path, path, expected, key, /*follow=*/true);
}

Result<LkvInfo> read_lkv_info_at(int dirfd, const std::string& name, const std::string& path,
                                 const StoreIdentity* expected, LkvKey* key, bool follow) {
  // The type is checked before opening and the open never blocks: a FIFO (or a device) named
  // *.lkv would otherwise block open() forever and with it the scan and everything that waits
  // for it. O_NONBLOCK means nothing for a regular file's reads.
  struct stat st {};
  if (::fstatat(dirfd, name.c_str(), &st, follow ? 0 : AT_SYMLINK_NOFOLLOW) != 0)
    return io_error(strfmt("[lkv] %s: cannot stat: %s", path.c_str(), std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) return corrupt(strfmt("[lkv] %s: not a regular file", path.c_str()));
  Fd f;
  f.fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (follow ? 0 : O_NOFOLLOW));
  if (f.fd < 0) return io_error(strfmt("[lkv] %s: cannot open: %s", path.c_str(), std::strerror(errno)));
  if (::fstat(f.fd, &st) != 0) return io_error(strfmt("[lkv] %s: fstat failed", path.c_str()));
  if (!S_ISREG(st.st_mode)) return corrupt(strfmt("[lkv] %s: not a regular file", path.c_str()));
  LkvInfo info;
  info.file_bytes = static_cast<uint64_t>(st.st_size);
  info.allocated_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
  info.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (info.file_bytes < sizeof(LkvPrefix)) return corrupt(strfmt("[lkv] %s: truncated prefix", path.c_str()));
  LARDER_RETURN_IF_ERROR(pread_all(f.fd, &info.prefix, sizeof info.prefix, 0, path));
  const LkvPrefix& p = info.prefix;
  if (std::memcmp(p.magic, kLkvMagic, 8) != 0) return corrupt(strfmt("[lkv] %s: bad magic", path.c_str()));
  if (XXH3_64bits(&p, 40) != p.prefix_xxh3) return corrupt(strfmt("[lkv] %s: prefix checksum mismatch", path.c_str()));
  if (p.version != kLkvVersion) {
    return incompatible(strfmt("[lkv] %s: format version %u, this build reads %u", path.c_str(), p.version, kLkvVersion));
  }
  // A size mismatch is the verdict, but it is given after the key is read (when the header and
  // token section are intact and inside the file), so the caller can say which prompt lost it.
  Status size_mismatch = Status::ok();
  if (p.file_size != info.file_bytes) {
    size_mismatch = corrupt(strfmt("[lkv] %s: declared size %llu but the file has %llu bytes (truncated or extended)",
                                   path.c_str(), static_cast<unsigned long long>(p.file_size),
                                   static_cast<unsigned long long>(info.file_bytes)));
  }
  const uint64_t limit = std::min<uint64_t>(p.file_size, info.file_bytes);
  if (p.header_len == 0 || p.header_len > kLkvMaxHeader || p.data_offset % kLkvAlign != 0 ||
      p.data_offset < sizeof(LkvPrefix) + p.header_len || p.data_offset > limit) {
    if (!size_mismatch.is_ok()) return size_mismatch;
    return corrupt(strfmt("[lkv] %s: inconsistent header length / data offset", path.c_str()));
  }
  std::string text(p.header_len, '\0');
  LARDER_RETURN_IF_ERROR(pread_all(f.fd, text.data(), text.size(), sizeof(LkvPrefix), path));
  if (XXH3_64bits(text.data(), text.size()) != p.header_xxh3) {
    if (!size_mismatch.is_ok()) return size_mismatch;
    return corrupt(strfmt("[lkv] %s: header checksum mismatch", path.c_str()));
  }
  try {
    info.header = nlohmann::json::parse(text);
    const nlohmann::json& h = info.header;
    if (h.at("format_version").get<uint32_t>() != kLkvVersion) {
      return incompatible(strfmt("[lkv] %s: header format version differs", path.c_str()));
    }
    if (h.at("align").get<uint64_t>() != kLkvAlign) return corrupt(strfmt("[lkv] %s: unexpected align", path.c_str()));
    const StoreIdentity id = identity_from_json(h.at("identity"));
    info.identity_id = identity_id(id);
    if (expected && identity_id(*expected) != info.identity_id) {
      return incompatible(strfmt("[lkv] %s: written by another model or KV scheme (identity %s)", path.c_str(),
                                 info.identity_id.c_str()));
    }
    info.ns = h.at("ns_id").get<std::string>();
    const int64_t n = h.at("n_tokens").get<int64_t>();
    const nlohmann::json& tj = h.at("tokens");
    const uint64_t off = tj.at("off").get<uint64_t>(), bytes = tj.at("bytes").get<uint64_t>();
    if (n <= 0 || bytes != static_cast<uint64_t>(n) * 4 || off != p.data_offset || off + bytes > limit) {
      if (!size_mismatch.is_ok()) return size_mismatch;
      return corrupt(strfmt("[lkv] %s: token section out of bounds", path.c_str()));
    }
    LARDER_ASSIGN_OR_RETURN(uint64_t want, parse_hex64(tj.at("xxh3")));
    info.tokens.resize(static_cast<size_t>(n));
    LARDER_RETURN_IF_ERROR(pread_all(f.fd, info.tokens.data(), bytes, off, path));
    // The token list is the key: it is always verified, whatever the tensor policy.
    if (XXH3_64bits(info.tokens.data(), bytes) != want) {
      if (!size_mismatch.is_ok()) return size_mismatch;
      return corrupt(strfmt("[lkv] %s: token section checksum mismatch", path.c_str()));
    }
    if (key) *key = LkvKey{info.ns, info.tokens};
  } catch (const nlohmann::json::exception& e) {
    if (!size_mismatch.is_ok()) return size_mismatch;
    return corrupt(strfmt("[lkv] %s: malformed header: %s", path.c_str(), e.what()));
  }
  if (!size_mismatch.is_ok()) return size_mismatch;
  return info;
}

namespace {

struct TensorRec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t off, bytes, xxh3;
};

Result<TensorRec> parse_tensor(const nlohmann::json& j, uint64_t file_size, const std::string& path) {
  TensorRec t;
  t.name = j.at("name").get<std::string>();
  LARDER_ASSIGN_OR_RETURN(t.dtype, parse_dtype(j.at("dtype").get<std::string>()));
  t.shape = j.at("shape").get<std::vector<int64_t>>();
  t.off = j.at("off").get<uint64_t>();
  t.bytes = j.at("bytes").get<uint64_t>();
  LARDER_ASSIGN_OR_RETURN(t.xxh3, parse_hex64(j.at("xxh3")));
  uint64_t elems = 1;
  for (int64_t d : t.shape) {
    if (d < 0) return corrupt(strfmt("[lkv] %s: tensor '%s' has a negative dim", path.c_str(), t.name.c_str()));
    elems *= static_cast<uint64_t>(d);
  }
  if (t.off % kLkvAlign != 0 || t.off > file_size || t.bytes > file_size - t.off ||
      dtype_bytes(t.dtype, elems) != t.bytes) {
    return corrupt(strfmt("[lkv] %s: tensor '%s' bounds/shape/dtype inconsistent", path.c_str(), t.name.c_str()));
  }
  return t;
}

struct HeapRows {
  std::vector<std::vector<uint8_t>> k, v;
};

// A view of one tensor's bytes inside the restored file's mapping (the mapping stays alive as
// long as any view of it does).
StateTensor mapped_tensor(const TensorRec& t, const uint8_t* base, const std::shared_ptr<MappedFile>& map) {
  StateTensor v;
  v.name = t.name;
  v.dtype = t.dtype;
  v.shape = t.shape;
  v.data = base + t.off;
  v.bytes = t.bytes;
  v.owner = map;
  v.backing = Backing::kMapped;
  return v;
}

}  // namespace

Result<std::shared_ptr<const Entry>> read_lkv(const std::string& path, const StoreIdentity* expected,
                                              VerifyPolicy verify, RestoreMode mode) {
  LARDER_ASSIGN_OR_RETURN(LkvInfo info, read_lkv_info(path, expected));
  LARDER_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> map, MappedFile::open(path));
  if (map->size() != info.file_bytes) return corrupt(strfmt("[lkv] %s: changed while opening", path.c_str()));
  const uint8_t* base = map->data();
  // Start reading the tensor pages ahead of their first use (§11.2 fault cost); with full
  // verification the checksum pass reads them anyway and leaves them in the page cache.
  if (verify != VerifyPolicy::kFull) map->advise_willneed(info.prefix.data_offset, info.file_bytes);
  const nlohmann::json& h = info.header;
  const int64_t n = static_cast<int64_t>(info.tokens.size());
  auto e = std::make_shared<Entry>();
  e->tokens = std::move(info.tokens);
  e->ns = info.ns;
  size_t kv_tensor_index = 0;
  // Sampled verification rotates its start so repeated restores of one file cover all tensors.
  static std::atomic<uint32_t> rotation{0};
  const uint32_t phase = rotation.fetch_add(1) % 8;
  auto check = [&](const TensorRec& t, bool is_kv) -> Status {
    bool want = verify == VerifyPolicy::kFull;
    if (verify == VerifyPolicy::kSampled) want = !is_kv || (kv_tensor_index % 8 == phase);
    if (is_kv) ++kv_tensor_index;
    if (want && XXH3_64bits(base + t.off, t.bytes) != t.xxh3) {
      return corrupt(strfmt("[lkv] %s: tensor '%s' checksum mismatch", path.c_str(), t.name.c_str()));
    }
    return Status::ok();
  };
  try {
    KvLayout layout;
    std::vector<const uint8_t*> kp, vp;
    std::vector<const LayerState*> lp;
    for (const nlohmann::json& lj : h.at("layers")) {
      LARDER_ASSIGN_OR_RETURN(StateKind kind, parse_state_kind(lj.at("kind").get<std::string>()));
      if (lj.at("offset").get<int64_t>() != n) return corrupt(strfmt("[lkv] %s: layer offset != token count", path.c_str()));
      std::vector<TensorRec> ts;
      for (const nlohmann::json& tj : lj.at("tensors")) {
        LARDER_ASSIGN_OR_RETURN(TensorRec t, parse_tensor(tj, info.file_bytes, path));
        ts.push_back(std::move(t));
      }
      if (kind == StateKind::kPlainKv) {
        if (!lp.empty()) return corrupt(strfmt("[lkv] %s: plain layers must precede other kinds", path.c_str()));
        const int hk = lj.at("n_kv_heads").get<int>(), hd = lj.at("head_dim").get<int>();
        if (ts.size() != 2) return corrupt(strfmt("[lkv] %s: plain layer %d needs k and v", path.c_str(), layout.n_layers));
        // The KV dtype is the tensors' dtype (files written before f16 KV existed say F32, and
        // are read as exactly that); every plain layer must agree, and q8_0 rows must be whole
        // blocks per head.
        const DType dt = ts[0].dtype;
        if (dt != DType::kF32 && dt != DType::kF16 && dt != DType::kQ8_0)
          return corrupt(strfmt("[lkv] %s: plain layer %d has KV dtype %s (f32, f16 or q8_0 expected)", path.c_str(),
                                layout.n_layers, dtype_name(dt)));
        if (layout.n_layers == 0) {
          layout.n_kv_heads = hk;
          layout.head_dim = hd;
          layout.dtype = dt;
        }
        const std::vector<int64_t> shape = {n, hk, hd};
        if (hk != layout.n_kv_heads || hd != layout.head_dim || ts[0].name != "k" || ts[1].name != "v" ||
            ts[0].dtype != layout.dtype || ts[1].dtype != layout.dtype || ts[0].shape != shape ||
            ts[1].shape != shape || (dt == DType::kQ8_0 && hd % 32 != 0) ||
            ts[0].bytes != static_cast<uint64_t>(n * layout.row_bytes()) || ts[1].bytes != ts[0].bytes) {
          return corrupt(strfmt("[lkv] %s: plain layer %d shape/dtype mismatch", path.c_str(), layout.n_layers));
        }
        LARDER_RETURN_IF_ERROR(check(ts[0], true));
        LARDER_RETURN_IF_ERROR(check(ts[1], true));
        kp.push_back(base + ts[0].off);
        vp.push_back(base + ts[1].off);
        ++layout.n_layers;
        continue;
      }
      std::vector<StateTensor> views;
      for (const TensorRec& t : ts) {
        LARDER_RETURN_IF_ERROR(check(t, false));
        StateTensor v = mapped_tensor(t, base, map);
        views.push_back(std::move(v));
      }
      LARDER_ASSIGN_OR_RETURN(std::unique_ptr<LayerState> ls, restore_layer_state(kind, lj.at("params"), views));
      if (ls->offset() != n) return corrupt(strfmt("[lkv] %s: restored layer offset != token count", path.c_str()));
      lp.push_back(ls.get());
      e->layers.emplace_back(std::move(ls));
    }
    for (const nlohmann::json& aj : h.at("attachments")) {
      Attachment a;
      a.schema = aj.at("schema").get<std::string>();
      a.metadata = aj.at("metadata");
      for (const nlohmann::json& tj : aj.at("tensors")) {
        LARDER_ASSIGN_OR_RETURN(TensorRec t, parse_tensor(tj, info.file_bytes, path));
        LARDER_RETURN_IF_ERROR(check(t, false));
        StateTensor v = mapped_tensor(t, base, map);
        a.tensors.push_back(mode == RestoreMode::kCopy ? StateTensor::copy_of(v) : std::move(v));
      }
      e->attachments.push_back(std::move(a));
    }
    if (layout.n_layers > 0) {
      auto seg = std::make_shared<KvSegment>();
      const size_t rows_bytes = static_cast<size_t>(n * layout.row_bytes());
      if (mode == RestoreMode::kMmap) {
        seg->k = kp;
        seg->v = vp;
        seg->backing = Backing::kMapped;
        seg->owner = map;
      } else {
        auto rows = std::make_shared<HeapRows>();
        for (int l = 0; l < layout.n_layers; ++l) {
          rows->k.emplace_back(kp[l], kp[l] + rows_bytes);
          rows->v.emplace_back(vp[l], vp[l] + rows_bytes);
          seg->k.push_back(rows->k.back().data());
          seg->v.push_back(rows->v.back().data());
        }
        seg->owner = rows;
      }
      seg->rows = n;
      seg->bytes = rows_bytes * 2 * static_cast<size_t>(layout.n_layers);
      e->kv = std::make_shared<KvBlock>(layout, std::vector<KvBlock::Piece>{{seg, 0, 0, n}});
    }
    // Recompute what the header claims and refuse any disagreement: a header that lies about
    // trimmability or floor would make the matcher serve a wrong prefix.
    bool trimmable = e->attachments.empty();
    int64_t floor = 0;
    for (const LayerState* l : lp) {
      trimmable = trimmable && l->trimmable();
      floor = std::max(floor, l->min_reusable_offset());
    }
    std::vector<const Attachment*> ap;
    for (const Attachment& a : e->attachments) ap.push_back(&a);
    e->signature = state_signature(layout, lp, ap);
    e->trimmable = trimmable;
    e->floor = floor;
    e->label = h.at("label").get<std::string>();
    e->created_ms = h.at("created_ms").get<int64_t>();
    if (h.at("trimmable").get<bool>() != trimmable || h.at("floor").get<int64_t>() != floor ||
        h.at("signature").get<std::string>() != e->signature) {
      return corrupt(strfmt("[lkv] %s: header trimmability/floor/signature disagree with the states", path.c_str()));
    }
  } catch (const nlohmann::json::exception& ex) {
    return corrupt(strfmt("[lkv] %s: malformed header: %s", path.c_str(), ex.what()));
  }
  return std::shared_ptr<const Entry>(std::move(e));
}

namespace {

// write_lkv's I/O into one memory buffer: the file protocol (temp name, sync, rename) collapses
// to positional writes, so the encoded value is byte-for-byte what a file would hold.
class BufferIo final : public IoLayer {
 public:
  std::string buf;
  int open(const char*, int, mode_t) override { return 3; }
  ssize_t pwrite(int, const void* p, size_t n, off_t off) override {
    const size_t end = static_cast<size_t>(off) + n;
    if (buf.size() < end) buf.resize(end);
    std::memcpy(buf.data() + off, p, n);
    return static_cast<ssize_t>(n);
  }
  int ftruncate(int, off_t size) override {
    buf.resize(static_cast<size_t>(size));
    return 0;
  }
  int fdatasync(int) override { return 0; }
  int close(int) override { return 0; }
  int rename(const char*, const char*) override { return 0; }
  int fsync_dir(const char*) override { return 0; }
  int unlink(const char*) override { return 0; }
};

}  // namespace

Result<std::string> encode_lkv(const Entry& e, const StoreIdentity& identity) {
  BufferIo io;
  LARDER_RETURN_IF_ERROR(write_lkv("remote-value", e, identity, io));
  return std::move(io.buf);
}

Result<std::shared_ptr<const Entry>> decode_lkv(std::string_view bytes, const StoreIdentity* expected,
                                                VerifyPolicy verify, const std::string& what) {
  // The reader works on a file (its checks read through pread and a mapping); an anonymous
  // memory file gives it one without touching a disk. Copy mode: the result owns its rows.
  Fd f;
  f.fd = ::memfd_create("larder-kv-remote", MFD_CLOEXEC);
  if (f.fd < 0) return io_error(strfmt("[lkv] %s: memfd_create failed: %s", what.c_str(), std::strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(f.fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return io_error(strfmt("[lkv] %s: memfd write failed: %s", what.c_str(), std::strerror(errno)));
    done += static_cast<size_t>(w);
  }
  Result<std::shared_ptr<const Entry>> r =
      read_lkv("/proc/self/fd/" + std::to_string(f.fd), expected, verify, RestoreMode::kCopy);
  if (!r.is_ok()) {
    // Name the value, not the transient /proc path.
    std::string msg = r.status().message();
    const std::string tag = "/proc/self/fd/" + std::to_string(f.fd);
    for (size_t p; (p = msg.find(tag)) != std::string::npos;) msg.replace(p, tag.size(), what);
    return Status(r.status().code(), msg);
  }
  return r;
}

Status verify_lkv(const std::string& path) {
  Result<std::shared_ptr<const Entry>> r = read_lkv(path, nullptr, VerifyPolicy::kFull, RestoreMode::kMmap);
  return r.is_ok() ? Status::ok() : r.status();
}

}  // namespace larder::memory
