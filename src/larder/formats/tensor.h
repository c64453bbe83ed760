// tensor.h — a stored tensor: name, dtype, shape and a pointer into a read-only mapping.
//
// Shapes are outermost-first (PyTorch order) everywhere in larder. GGUF stores ggml's ne[]
// innermost-first; the GGUF reader reverses it, so a linear weight is [out_features, in_features]
// whichever file it came from.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "larder/core/dtype.h"
#include "larder/core/mmap_file.h"
#include "larder/core/status.h"

namespace larder::formats {

// No tensor a reader accepts has more elements than this: every product of its dimensions then
// fits in int64 and its bytes (at most 8 per element) in 63 bits. Far above any real tensor.
inline constexpr uint64_t kMaxTensorElements = 1ull << 59;

struct TensorInfo {
  std::string name;
  DType dtype = DType::kUnknown;
  std::vector<int64_t> shape;   // outermost-first
  const uint8_t* data = nullptr;  // inside a MappedFile owned by the TensorSet
  uint64_t nbytes = 0;
  const std::string* file = nullptr;  // path of the file it lives in (for error messages)

  int64_t numel() const;
  int64_t dim(int i) const { return shape[static_cast<size_t>(i < 0 ? i + static_cast<int>(shape.size()) : i)]; }
  int rank() const { return static_cast<int>(shape.size()); }
  std::string shape_str() const;  // "[2048, 512]"
};

// A set of tensors from one or more mapped files (a GGUF file, or safetensors shards).
// Owns the mappings: TensorInfo::data stays valid for the TensorSet's lifetime.
class TensorSet {
 public:
  TensorSet() = default;
  TensorSet(TensorSet&&) = default;
  TensorSet& operator=(TensorSet&&) = default;

  const TensorInfo* find(std::string_view name) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  size_t size() const { return tensors_.size(); }
  uint64_t total_bytes() const;
  const std::vector<std::shared_ptr<MappedFile>>& files() const { return files_; }

  // Building (used by the readers).
  void add_file(std::shared_ptr<MappedFile> f) { files_.push_back(std::move(f)); }
  Status add(TensorInfo t);  // error on duplicate names
  const std::string* intern_path(const std::string& path);

 private:
  std::vector<std::shared_ptr<MappedFile>> files_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::vector<std::unique_ptr<std::string>> paths_;
};

}  // namespace larder::formats
