// mmap_file.h — read-only file mappings with RAII ownership.
//
// Weights are never copied at load: tensors are views into these mappings, so opening a model
// costs a few syscalls whatever its size, and the weights stay shared with the page cache
// (several processes serving one model share one copy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "larder/core/status.h"

namespace larder {

class MappedFile {
 public:
  // Maps the whole file read-only. An empty file maps to size 0 with a null data pointer.
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  std::string_view view() const { return {reinterpret_cast<const char*>(data_), size_}; }
  // Hint the kernel to read a range ahead (e.g. before a full pass over the weights).
  void advise_willneed(size_t offset, size_t length) const;

 private:
  MappedFile() = default;
  std::string path_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Reads a whole (small) file, e.g. config.json. Errors name the path.
Result<std::string> read_text_file(const std::string& path);
bool file_exists(const std::string& path);
bool is_directory(const std::string& path);

}  // namespace larder
