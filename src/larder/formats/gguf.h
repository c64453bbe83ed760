// gguf.h — GGUF v2/v3 reader (ggml's docs/gguf.md): metadata key/values, tensor infos,
// tensor data mapped zero-copy.
//
// Every length, count and offset read from the file is checked against the bytes that remain,
// so a truncated or lying file is a clear error, never an out-of-bounds read.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "larder/core/mmap_file.h"
#include "larder/core/status.h"
#include "larder/formats/tensor.h"

namespace larder::formats {

enum class GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// One metadata value. Scalars fill `i` (all integer types and bool), `f` (floats) or `s`.
// Arrays fill exactly one of `strs`, `ints`, `floats` according to `array_type`
// (nested arrays are skipped: no model metadata uses them).
struct GgufValue {
  GgufType type = GgufType::kU32;
  GgufType array_type = GgufType::kU32;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<std::string> strs;
  std::vector<int64_t> ints;
  std::vector<double> floats;

  bool is_array() const { return type == GgufType::kArray; }
  bool is_int() const;
  bool is_float() const { return type == GgufType::kF32 || type == GgufType::kF64; }
  bool is_string() const { return type == GgufType::kString; }
  size_t array_size() const;
};

class GgufFile {
 public:
  static Result<std::unique_ptr<GgufFile>> open(const std::string& path, MapMode mode = MapMode::kMap);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;

  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;  // also accepts integers
  std::optional<std::string> get_string(std::string_view key) const;
  // "general.architecture" (e.g. "llama"); empty if absent.
  std::string architecture() const;

  const TensorSet& tensors() const { return tensors_; }
  TensorSet& tensors() { return tensors_; }
  // GGUF type id -> DType (kUnknown if larder does not know it).
  static DType dtype_from_ggml(uint32_t ggml_type);

 private:
  GgufFile() = default;
  std::string path_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  TensorSet tensors_;
};

}  // namespace larder::formats
