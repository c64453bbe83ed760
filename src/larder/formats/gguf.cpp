#include "larder/formats/gguf.h"

#include <algorithm>
#include <cstring>

namespace larder::formats {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
// Sanity caps: far above any real file, low enough that a lying count cannot make us allocate
// gigabytes before the bounds checks catch it.
constexpr uint64_t kMaxTensors = 1u << 20;
constexpr uint64_t kMaxKv = 1u << 20;
constexpr uint32_t kMaxDims = 8;

class Reader {
 public:
  Reader(const uint8_t* p, size_t n, const std::string& path) : p_(p), n_(n), path_(path) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return n_ - pos_; }

  Status need(size_t k, const char* what) {
    if (k > remaining()) {
      return corrupt(strfmt("[gguf] %s: truncated while reading %s at byte %zu (need %zu bytes, %zu left)",
                            path_.c_str(), what, pos_, k, remaining()));
    }
    return Status::ok();
  }
  template <typename T>
  Status read(T* out, const char* what) {
    LARDER_RETURN_IF_ERROR(need(sizeof(T), what));
    std::memcpy(out, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::ok();
  }
  Status read_string(std::string* out, const char* what) {
    uint64_t len = 0;
    LARDER_RETURN_IF_ERROR(read(&len, what));
    LARDER_RETURN_IF_ERROR(need(len, what));
    out->assign(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return Status::ok();
  }
  Status skip(size_t k, const char* what) {
    LARDER_RETURN_IF_ERROR(need(k, what));
    pos_ += k;
    return Status::ok();
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& path_;
};

size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    default: return 0;
  }
}

Status read_scalar(Reader& r, GgufType t, int64_t* i, double* f, const char* what) {
  switch (t) {
    case GgufType::kU8: { uint8_t v; LARDER_RETURN_IF_ERROR(r.read(&v, what)); *i = v; return Status::ok(); }
    case GgufType::kI8: { int8_t v; LARDER_RETURN_IF_ERROR(r.read(&v, what)); *i = v; return Status::ok(); }
    case GgufType::kBool: { uint8_t v; LARDER_RETURN_IF_ERROR(r.read(&v, what)); *i = v != 0; return Status::ok(); }
    case GgufType::kU16: { uint16_t v; LARDER_RETURN_IF_ERROR(r.read(&v, what)); *i = v; return Status::ok(); }
    case GgufType::kI16: { int16_t v; LARDER_RETURN_IF_ERROR(r.read(&v, what)); *i = v; return Status::ok(); }
    case GgufType::kU32: { uint32_t v; LARDER_RETURN_IF_ERROR(r.read(&v, what)); *i = v; return Status::ok(); }
    case GgufType::kI32: { int32_t v; LARDER_RETURN_IF_ERROR(r.read(&v, what)); *i = v; return Status::ok(); }
    case GgufType::kU64: { uint64_t v; LARDER_RETURN_IF_ERROR(r.read(&v, what)); *i = static_cast<int64_t>(v); return Status::ok(); }
    case GgufType::kI64: { int64_t v; LARDER_RETURN_IF_ERROR(r.read(&v, what)); *i = v; return Status::ok(); }
    case GgufType::kF32: { float v; LARDER_RETURN_IF_ERROR(r.read(&v, what)); *f = v; return Status::ok(); }
    case GgufType::kF64: { double v; LARDER_RETURN_IF_ERROR(r.read(&v, what)); *f = v; return Status::ok(); }
    default: return corrupt("[gguf] bad scalar type");
  }
}

Status read_value(Reader& r, GgufType t, GgufValue* out, const std::string& key, const std::string& path,
                  int depth) {
  out->type = t;
  if (t == GgufType::kString) return r.read_string(&out->s, key.c_str());
  if (t == GgufType::kArray) {
    uint32_t et = 0;
    uint64_t count = 0;
    LARDER_RETURN_IF_ERROR(r.read(&et, key.c_str()));
    LARDER_RETURN_IF_ERROR(r.read(&count, key.c_str()));
    out->array_type = static_cast<GgufType>(et);
    if (et > 12) {
      return corrupt(strfmt("[gguf] %s: key '%s' has array element type %u (valid: 0..12)", path.c_str(),
                            key.c_str(), et));
    }
    if (out->array_type == GgufType::kString) {
      // Each string costs at least its 8-byte length.
      if (count > r.remaining() / 8) {
        return corrupt(strfmt("[gguf] %s: key '%s' claims %llu strings but only %zu bytes remain",
                              path.c_str(), key.c_str(), static_cast<unsigned long long>(count), r.remaining()));
      }
      out->strs.resize(count);
      for (auto& s : out->strs) LARDER_RETURN_IF_ERROR(r.read_string(&s, key.c_str()));
    } else if (out->array_type == GgufType::kArray) {
      if (depth > 2) return corrupt(strfmt("[gguf] %s: key '%s' nests arrays too deeply", path.c_str(), key.c_str()));
      for (uint64_t k = 0; k < count; ++k) {
        GgufValue skip;  // nested arrays are parsed (to advance) and dropped
        LARDER_RETURN_IF_ERROR(read_value(r, GgufType::kArray, &skip, key, path, depth + 1));
      }
    } else {
      size_t es = scalar_size(out->array_type);
      if (count > r.remaining() / es) {
        return corrupt(strfmt("[gguf] %s: key '%s' claims %llu elements but only %zu bytes remain",
                              path.c_str(), key.c_str(), static_cast<unsigned long long>(count), r.remaining()));
      }
      bool is_float = out->array_type == GgufType::kF32 || out->array_type == GgufType::kF64;
      if (is_float) out->floats.resize(count); else out->ints.resize(count);
      for (uint64_t k = 0; k < count; ++k) {
        int64_t iv = 0;
        double fv = 0;
        LARDER_RETURN_IF_ERROR(read_scalar(r, out->array_type, &iv, &fv, key.c_str()));
        if (is_float) out->floats[k] = fv; else out->ints[k] = iv;
      }
    }
    return Status::ok();
  }
  if (static_cast<uint32_t>(t) > 12) {
    return corrupt(strfmt("[gguf] %s: key '%s' has value type %u (valid: 0..12)", path.c_str(), key.c_str(),
                          static_cast<unsigned>(t)));
  }
  return read_scalar(r, t, &out->i, &out->f, key.c_str());
}

}  // namespace

bool GgufValue::is_int() const {
  switch (type) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kU16: case GgufType::kI16:
    case GgufType::kU32: case GgufType::kI32: case GgufType::kU64: case GgufType::kI64:
    case GgufType::kBool: return true;
    default: return false;
  }
}

size_t GgufValue::array_size() const { return strs.size() + ints.size() + floats.size(); }

DType GgufFile::dtype_from_ggml(uint32_t t) {
  switch (t) {
    case 0: return DType::kF32;
    case 1: return DType::kF16;
    case 2: return DType::kQ4_0;
    case 3: return DType::kQ4_1;
    case 6: return DType::kQ5_0;
    case 7: return DType::kQ5_1;
    case 8: return DType::kQ8_0;
    case 10: return DType::kQ2_K;
    case 11: return DType::kQ3_K;
    case 12: return DType::kQ4_K;
    case 13: return DType::kQ5_K;
    case 14: return DType::kQ6_K;
    case 15: return DType::kQ8_K;
    case 20: return DType::kIQ4_NL;
    case 23: return DType::kIQ4_XS;
    case 39: return DType::kMXFP4;
    case 24: return DType::kI8;
    case 25: return DType::kI16;
    case 26: return DType::kI32;
    case 27: return DType::kI64;
    case 28: return DType::kF64;
    case 30: return DType::kBF16;
    default: return DType::kUnknown;
  }
}

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path, MapMode mode) {
  LARDER_ASSIGN_OR_RETURN(auto mapped, MappedFile::open(path, mode));
  std::unique_ptr<GgufFile> g(new GgufFile());
  g->path_ = path;
  Reader r(mapped->data(), mapped->size(), path);

  uint32_t magic = 0;
  LARDER_RETURN_IF_ERROR(r.read(&magic, "magic"));
  if (magic != kGgufMagic) {
    return corrupt(strfmt("[gguf] %s: not a GGUF file (magic 0x%08x, expected 0x%08x \"GGUF\")", path.c_str(),
                          magic, kGgufMagic));
  }
  LARDER_RETURN_IF_ERROR(r.read(&g->version_, "version"));
  if (g->version_ < 2 || g->version_ > 3) {
    return unsupported(strfmt("[gguf] %s: GGUF version %u is not supported (supported: 2, 3)", path.c_str(),
                              g->version_));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  LARDER_RETURN_IF_ERROR(r.read(&n_tensors, "tensor count"));
  LARDER_RETURN_IF_ERROR(r.read(&n_kv, "metadata count"));
  if (n_tensors > kMaxTensors || n_kv > kMaxKv) {
    return corrupt(strfmt("[gguf] %s: implausible header (%llu tensors, %llu metadata keys)", path.c_str(),
                          static_cast<unsigned long long>(n_tensors), static_cast<unsigned long long>(n_kv)));
  }
  g->kv_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key;
    LARDER_RETURN_IF_ERROR(r.read_string(&key, "metadata key"));
    uint32_t t = 0;
    LARDER_RETURN_IF_ERROR(r.read(&t, key.c_str()));
    GgufValue v;
    LARDER_RETURN_IF_ERROR(read_value(r, static_cast<GgufType>(t), &v, key, path, 0));
    g->kv_.emplace_back(std::move(key), std::move(v));
  }
  if (auto a = g->get_int("general.alignment")) {
    if (*a <= 0 || (*a & (*a - 1)) != 0 || *a > (1 << 20)) {
      return corrupt(strfmt("[gguf] %s: general.alignment %lld is not a power of two", path.c_str(),
                            static_cast<long long>(*a)));
    }
    g->alignment_ = static_cast<uint32_t>(*a);
  }

  struct RawTensor {
    std::string name;
    std::vector<int64_t> shape;
    uint32_t ggml_type;
    uint64_t offset;
  };
  std::vector<RawTensor> raw(n_tensors);
  for (auto& t : raw) {
    LARDER_RETURN_IF_ERROR(r.read_string(&t.name, "tensor name"));
    uint32_t n_dims = 0;
    LARDER_RETURN_IF_ERROR(r.read(&n_dims, t.name.c_str()));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return corrupt(strfmt("[gguf] %s: tensor '%s' has %u dimensions (1..%u allowed)", path.c_str(),
                            t.name.c_str(), n_dims, kMaxDims));
    }
    std::vector<int64_t> ne(n_dims);
    uint64_t elements = 1;
    for (auto& d : ne) {
      uint64_t v = 0;
      LARDER_RETURN_IF_ERROR(r.read(&v, t.name.c_str()));
      if (v == 0 || v > (1ull << 40)) {
        return corrupt(strfmt("[gguf] %s: tensor '%s' has dimension %llu", path.c_str(), t.name.c_str(),
                              static_cast<unsigned long long>(v)));
      }
      // Bounded before multiplying on: a product that overflowed could wrap to a small element
      // count whose few bytes fit in the file, and the shape would then promise far more.
      if (elements > kMaxTensorElements / v) {
        return corrupt(strfmt("[gguf] %s: tensor '%s' has more than %llu elements", path.c_str(), t.name.c_str(),
                              static_cast<unsigned long long>(kMaxTensorElements)));
      }
      elements *= v;
      d = static_cast<int64_t>(v);
    }
    t.shape.assign(ne.rbegin(), ne.rend());  // ggml ne[] is innermost-first
    LARDER_RETURN_IF_ERROR(r.read(&t.ggml_type, t.name.c_str()));
    LARDER_RETURN_IF_ERROR(r.read(&t.offset, t.name.c_str()));
  }
  size_t data_start = (r.pos() + g->alignment_ - 1) / g->alignment_ * g->alignment_;
  // Vocabulary-only files (llama.cpp's ggml-vocab-*.gguf) have no tensors and end right after
  // the metadata, without the alignment padding: nothing to map, so nothing to check.
  if (raw.empty()) data_start = std::min(data_start, mapped->size());
  if (data_start > mapped->size()) {
    return corrupt(strfmt("[gguf] %s: truncated: tensor data would start at byte %zu beyond file size %zu",
                          path.c_str(), data_start, mapped->size()));
  }
  const uint64_t data_size = mapped->size() - data_start;
  const std::string* interned = g->tensors_.intern_path(path);
  for (auto& t : raw) {
    TensorInfo info;
    info.name = std::move(t.name);
    info.shape = std::move(t.shape);
    info.file = interned;
    info.dtype = dtype_from_ggml(t.ggml_type);
    if (info.dtype == DType::kUnknown) {
      return unsupported(strfmt("[gguf] %s: tensor '%s' has ggml type %u, which larder does not support",
                                path.c_str(), info.name.c_str(), t.ggml_type));
    }
    const DTypeInfo& di = dtype_info(info.dtype);
    int64_t n = info.numel();
    if (n <= 0 || n % di.block_elems != 0 || info.shape.back() % di.block_elems != 0) {
      return corrupt(strfmt("[gguf] %s: tensor '%s' shape %s is not a multiple of the %s block size %u",
                            path.c_str(), info.name.c_str(), info.shape_str().c_str(), di.name, di.block_elems));
    }
    info.nbytes = dtype_bytes(info.dtype, static_cast<uint64_t>(n));
    if (t.offset % g->alignment_ != 0) {
      return corrupt(strfmt("[gguf] %s: tensor '%s' offset %llu is not aligned to %u", path.c_str(),
                            info.name.c_str(), static_cast<unsigned long long>(t.offset), g->alignment_));
    }
    if (t.offset > data_size || info.nbytes > data_size - t.offset) {
      return corrupt(strfmt("[gguf] %s: tensor '%s' (%s, %s) byte range %llu..%llu exceeds data size %llu "
                            "(file truncated?)",
                            path.c_str(), info.name.c_str(), di.name, info.shape_str().c_str(),
                            static_cast<unsigned long long>(t.offset),
                            static_cast<unsigned long long>(t.offset + info.nbytes),
                            static_cast<unsigned long long>(data_size)));
    }
    info.data = mapped->data() + data_start + t.offset;
    LARDER_RETURN_IF_ERROR(g->tensors_.add(std::move(info)));
  }
  g->tensors_.add_file(std::move(mapped));
  return g;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  for (const auto& [k, v] : kv_) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v || !v->is_int()) return std::nullopt;
  return v->i;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->is_float()) return v->f;
  if (v->is_int()) return static_cast<double>(v->i);
  return std::nullopt;
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v || !v->is_string()) return std::nullopt;
  return v->s;
}

std::string GgufFile::architecture() const { return get_string("general.architecture").value_or(""); }

}  // namespace larder::formats
