// gguf_writer.cpp — see gguf_writer.h.
#include "larder/formats/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace larder::formats {

int ggml_type_id(DType t) {
  switch (t) {
    case DType::kF32: return 0;
    case DType::kF16: return 1;
    case DType::kQ4_0: return 2;
    case DType::kQ4_1: return 3;
    case DType::kQ5_0: return 6;
    case DType::kQ5_1: return 7;
    case DType::kQ8_0: return 8;
    case DType::kQ2_K: return 10;
    case DType::kQ3_K: return 11;
    case DType::kQ4_K: return 12;
    case DType::kQ5_K: return 13;
    case DType::kQ6_K: return 14;
    case DType::kIQ4_NL: return 20;
    case DType::kIQ4_XS: return 23;
    case DType::kMXFP4: return 39;
    case DType::kI8: return 24;
    case DType::kI16: return 25;
    case DType::kI32: return 26;
    case DType::kBF16: return 30;
    default: return -1;
  }
}

namespace {

void put(std::string& b, const void* p, size_t n) { b.append(static_cast<const char*>(p), n); }
template <typename T>
void put_num(std::string& b, T v) {
  put(b, &v, sizeof(T));
}
void put_str(std::string& b, const std::string& s) {
  put_num<uint64_t>(b, s.size());
  put(b, s.data(), s.size());
}

void put_scalar(std::string& b, GgufType t, const GgufValue& v, size_t i) {
  // Element i of an array, or the scalar itself (i == SIZE_MAX).
  const bool arr = i != SIZE_MAX;
  switch (t) {
    case GgufType::kU8: put_num<uint8_t>(b, static_cast<uint8_t>(arr ? v.ints[i] : v.i)); break;
    case GgufType::kI8: put_num<int8_t>(b, static_cast<int8_t>(arr ? v.ints[i] : v.i)); break;
    case GgufType::kU16: put_num<uint16_t>(b, static_cast<uint16_t>(arr ? v.ints[i] : v.i)); break;
    case GgufType::kI16: put_num<int16_t>(b, static_cast<int16_t>(arr ? v.ints[i] : v.i)); break;
    case GgufType::kU32: put_num<uint32_t>(b, static_cast<uint32_t>(arr ? v.ints[i] : v.i)); break;
    case GgufType::kI32: put_num<int32_t>(b, static_cast<int32_t>(arr ? v.ints[i] : v.i)); break;
    case GgufType::kU64: put_num<uint64_t>(b, static_cast<uint64_t>(arr ? v.ints[i] : v.i)); break;
    case GgufType::kI64: put_num<int64_t>(b, arr ? v.ints[i] : v.i); break;
    case GgufType::kBool: put_num<uint8_t>(b, (arr ? v.ints[i] : v.i) != 0); break;
    case GgufType::kF32: put_num<float>(b, static_cast<float>(arr ? v.floats[i] : v.f)); break;
    case GgufType::kF64: put_num<double>(b, arr ? v.floats[i] : v.f); break;
    case GgufType::kString: put_str(b, arr ? v.strs[i] : v.s); break;
    case GgufType::kArray: break;
  }
}

GgufValue scalar(GgufType t) {
  GgufValue v;
  v.type = t;
  return v;
}

Status write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, 1u << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return io_error(strfmt("[gguf] writing %s: %s", path.c_str(), std::strerror(errno)));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::ok();
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

void GgufWriter::set(const std::string& key, GgufValue v) {
  for (auto& [k, old] : kv_)
    if (k == key) {
      old = std::move(v);
      return;
    }
  kv_.emplace_back(key, std::move(v));
}
void GgufWriter::set_u32(const std::string& key, uint32_t x) {
  GgufValue v = scalar(GgufType::kU32);
  v.i = x;
  set(key, std::move(v));
}
void GgufWriter::set_i32(const std::string& key, int32_t x) {
  GgufValue v = scalar(GgufType::kI32);
  v.i = x;
  set(key, std::move(v));
}
void GgufWriter::set_f32(const std::string& key, float x) {
  GgufValue v = scalar(GgufType::kF32);
  v.f = x;
  set(key, std::move(v));
}
void GgufWriter::set_bool(const std::string& key, bool x) {
  GgufValue v = scalar(GgufType::kBool);
  v.i = x;
  set(key, std::move(v));
}
void GgufWriter::set_string(const std::string& key, std::string x) {
  GgufValue v = scalar(GgufType::kString);
  v.s = std::move(x);
  set(key, std::move(v));
}
void GgufWriter::set_strings(const std::string& key, std::vector<std::string> x) {
  GgufValue v = scalar(GgufType::kArray);
  v.array_type = GgufType::kString;
  v.strs = std::move(x);
  set(key, std::move(v));
}
void GgufWriter::set_i32s(const std::string& key, std::vector<int64_t> x) {
  GgufValue v = scalar(GgufType::kArray);
  v.array_type = GgufType::kI32;
  v.ints = std::move(x);
  set(key, std::move(v));
}
void GgufWriter::set_f32s(const std::string& key, std::vector<double> x) {
  GgufValue v = scalar(GgufType::kArray);
  v.array_type = GgufType::kF32;
  v.floats = std::move(x);
  set(key, std::move(v));
}
bool GgufWriter::has(const std::string& key) const {
  return std::any_of(kv_.begin(), kv_.end(), [&](const auto& p) { return p.first == key; });
}
void GgufWriter::erase(const std::string& key) {
  kv_.erase(std::remove_if(kv_.begin(), kv_.end(), [&](const auto& p) { return p.first == key; }), kv_.end());
}

uint32_t GgufWriter::alignment() const {
  for (const auto& [k, v] : kv_)
    if (k == "general.alignment" && v.is_int() && v.i > 0) return static_cast<uint32_t>(v.i);
  return 32;
}

Status GgufWriter::add_tensor(const std::string& name, DType t, const std::vector<int64_t>& shape) {
  if (ggml_type_id(t) < 0) return unsupported(strfmt("[gguf] cannot write tensor '%s' of type %s", name.c_str(), dtype_name(t)));
  if (shape.empty() || shape.back() % dtype_info(t).block_elems != 0)
    return invalid_argument(strfmt("[gguf] tensor '%s': row length not a multiple of %s's block", name.c_str(), dtype_name(t)));
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  tensors_.push_back({name, t, shape, dtype_bytes(t, n)});
  return Status::ok();
}

std::string GgufWriter::header() const {
  const uint64_t align = alignment();
  std::string head;
  put(head, "GGUF", 4);
  put_num<uint32_t>(head, 3);
  put_num<uint64_t>(head, tensors_.size());
  put_num<uint64_t>(head, kv_.size());
  for (const auto& [k, v] : kv_) {
    put_str(head, k);
    put_num<uint32_t>(head, static_cast<uint32_t>(v.type));
    if (v.is_array()) {
      put_num<uint32_t>(head, static_cast<uint32_t>(v.array_type));
      const size_t n = v.array_size();
      put_num<uint64_t>(head, n);
      for (size_t i = 0; i < n; ++i) put_scalar(head, v.array_type, v, i);
    } else {
      put_scalar(head, v.type, v, SIZE_MAX);
    }
  }
  uint64_t off = 0;
  for (const Tensor& t : tensors_) {
    put_str(head, t.name);
    put_num<uint32_t>(head, static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) put_num<uint64_t>(head, static_cast<uint64_t>(*it));
    put_num<uint32_t>(head, static_cast<uint32_t>(ggml_type_id(t.dtype)));
    put_num<uint64_t>(head, off);
    off = align_up(off + t.nbytes, align);
  }
  head.resize(align_up(head.size(), align), '\0');
  return head;
}

Result<uint64_t> GgufWriter::write(const std::string& path, const Producer& produce) const {
  const uint64_t align = alignment();
  const std::string head = header();

  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(strfmt("[gguf] cannot create %s: %s", path.c_str(), std::strerror(errno)));
  Status st = write_all(fd, head.data(), head.size(), path);
  uint64_t total = head.size();
  static const char zeros[64] = {};
  for (size_t i = 0; st && i < tensors_.size(); ++i) {
    auto data = produce(i);
    if (!data.is_ok()) {
      st = data.status();
      break;
    }
    st = write_all(fd, data.value(), tensors_[i].nbytes, path);
    const uint64_t pad = align_up(tensors_[i].nbytes, align) - tensors_[i].nbytes;
    for (uint64_t p = pad; st && p > 0; p -= std::min<uint64_t>(p, sizeof zeros))
      st = write_all(fd, zeros, std::min<uint64_t>(p, sizeof zeros), path);
    total += tensors_[i].nbytes + pad;
  }
  if (st && ::fsync(fd) != 0) st = io_error(strfmt("[gguf] fsync %s: %s", path.c_str(), std::strerror(errno)));
  ::close(fd);
  if (!st) return st;
  return total;
}

}  // namespace larder::formats
