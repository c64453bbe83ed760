#include "larder/formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

namespace larder::formats {

using nlohmann::json;

DType dtype_from_safetensors(const std::string& s) {
  static const std::map<std::string, DType> kMap = {
      {"F32", DType::kF32}, {"F16", DType::kF16}, {"BF16", DType::kBF16}, {"I8", DType::kI8},
      {"U8", DType::kU8},   {"I16", DType::kI16}, {"I32", DType::kI32},   {"U32", DType::kU32},
      {"I64", DType::kI64}, {"F64", DType::kF64}, {"BOOL", DType::kBool},
  };
  auto it = kMap.find(s);
  return it == kMap.end() ? DType::kUnknown : it->second;
}

Status read_safetensors(const std::string& path, TensorSet* out, std::map<std::string, std::string>* metadata,
                        MapMode mode) {
  LARDER_ASSIGN_OR_RETURN(auto mapped, MappedFile::open(path, mode));
  const size_t size = mapped->size();
  if (size < 8) {
    return corrupt(strfmt("[safetensors] %s: file is %zu bytes, too short for the 8-byte header length", path.c_str(), size));
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, mapped->data(), 8);
  if (header_len > size - 8) {
    return corrupt(strfmt("[safetensors] %s: header length %llu exceeds file size %zu (truncated or not safetensors)",
                          path.c_str(), static_cast<unsigned long long>(header_len), size));
  }
  const char* hp = reinterpret_cast<const char*>(mapped->data() + 8);
  json header = json::parse(hp, hp + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return corrupt(strfmt("[safetensors] %s: header is not a JSON object", path.c_str()));
  }
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size - data_start;
  const std::string* interned = out->intern_path(path);

  struct Range {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  std::vector<TensorInfo> infos;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      if (metadata && e.is_object()) {
        for (auto m = e.begin(); m != e.end(); ++m) {
          if (m.value().is_string()) (*metadata)[m.key()] = m.value().get<std::string>();
        }
      }
      continue;
    }
    auto bad = [&](const std::string& why) {
      return corrupt(strfmt("[safetensors] %s: tensor '%s': %s", path.c_str(), name.c_str(), why.c_str()));
    };
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets")) {
      return bad("entry must have dtype, shape and data_offsets");
    }
    if (!e["dtype"].is_string()) return bad("dtype is not a string");
    TensorInfo info;
    info.name = name;
    info.file = interned;
    std::string dt = e["dtype"].get<std::string>();
    info.dtype = dtype_from_safetensors(dt);
    if (info.dtype == DType::kUnknown) {
      return unsupported(strfmt("[safetensors] %s: tensor '%s' has dtype %s, which larder does not support",
                                path.c_str(), name.c_str(), dt.c_str()));
    }
    const json& shape = e["shape"];
    if (!shape.is_array() || shape.size() > 8) return bad("shape must be an array of at most 8 dims");
    uint64_t numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned()) return bad("shape has a non-integer or negative dimension");
      uint64_t v = d.get<uint64_t>();
      // kMaxTensorElements keeps numel × element size from wrapping (2^62 elements of F32 made 0 bytes).
      if (v > (1ull << 40) || (v && numel > kMaxTensorElements / v)) return bad("shape is implausibly large");
      numel *= v;
      info.shape.push_back(static_cast<int64_t>(v));
    }
    const json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return bad("data_offsets must be two non-negative integers");
    }
    uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en) return bad(strfmt("data_offsets [%llu, %llu] are reversed", (unsigned long long)b, (unsigned long long)en));
    if (en > data_size) {
      return bad(strfmt("byte range %llu..%llu exceeds data size %llu (file truncated or header lies)",
                        (unsigned long long)b, (unsigned long long)en, (unsigned long long)data_size));
    }
    uint64_t expect = dtype_bytes(info.dtype, numel);
    if (en - b != expect) {
      return bad(strfmt("%s %s needs %llu bytes but data_offsets span %llu", dtype_name(info.dtype),
                        info.shape_str().c_str(), (unsigned long long)expect, (unsigned long long)(en - b)));
    }
    info.nbytes = expect;
    info.data = mapped->data() + data_start + b;
    ranges.push_back({b, en, name});
    infos.push_back(std::move(info));
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return corrupt(strfmt("[safetensors] %s: tensors '%s' and '%s' overlap", path.c_str(),
                            ranges[i - 1].name.c_str(), ranges[i].name.c_str()));
    }
  }
  for (auto& info : infos) LARDER_RETURN_IF_ERROR(out->add(std::move(info)));
  out->add_file(std::move(mapped));
  return Status::ok();
}

Result<TensorSet> open_safetensors_dir(const std::string& dir, MapMode mode) {
  TensorSet set;
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (file_exists(index_path)) {
    LARDER_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path));
    json index = json::parse(text, nullptr, false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return corrupt(strfmt("[safetensors] %s: not a valid index (needs a \"weight_map\" object)", index_path.c_str()));
    }
    std::set<std::string> shards;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        return corrupt(strfmt("[safetensors] %s: weight_map entry '%s' is not a file name", index_path.c_str(),
                              it.key().c_str()));
      }
      std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos) {
        return corrupt(strfmt("[safetensors] %s: shard name '%s' must be a plain file name", index_path.c_str(),
                              shard.c_str()));
      }
      shards.insert(shard);
    }
    for (const auto& shard : shards) LARDER_RETURN_IF_ERROR(read_safetensors(dir + "/" + shard, &set, nullptr, mode));
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      const TensorInfo* t = set.find(it.key());
      std::string shard = it.value().get<std::string>();
      if (!t || *t->file != dir + "/" + shard) {
        return corrupt(strfmt("[safetensors] %s: index says tensor '%s' is in %s, but it is not there",
                              index_path.c_str(), it.key().c_str(), shard.c_str()));
      }
    }
    return set;
  }
  if (file_exists(single)) {
    LARDER_RETURN_IF_ERROR(read_safetensors(single, &set, nullptr, mode));
    return set;
  }
  return not_found(strfmt("[safetensors] %s: no model.safetensors or model.safetensors.index.json", dir.c_str()));
}

}  // namespace larder::formats
