// gguf_writer.h — GGUF v3 writer (ggml's docs/gguf.md), the counterpart of gguf.h's reader:
// metadata key/values (held as the reader's GgufValue, so a file's metadata copies through
// unchanged), tensor infos, then tensor data, each tensor's offset aligned to
// `general.alignment` (32 unless set) and zero-padded, as llama.cpp's loader requires.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "larder/core/status.h"
#include "larder/formats/gguf.h"

namespace larder::formats {

// The ggml type id of a DType (the inverse of GgufFile::dtype_from_ggml), or -1.
int ggml_type_id(DType t);

class GgufWriter {
 public:
  // Replaces an existing key in place (keeping its position), else appends.
  void set(const std::string& key, GgufValue v);
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, std::string v);
  void set_strings(const std::string& key, std::vector<std::string> v);
  void set_i32s(const std::string& key, std::vector<int64_t> v);
  void set_f32s(const std::string& key, std::vector<double> v);
  bool has(const std::string& key) const;
  void erase(const std::string& key);

  // `shape` outermost first, as TensorInfo holds it ([rows, cols]); written innermost first.
  Status add_tensor(const std::string& name, DType t, const std::vector<int64_t>& shape);

  // Returns tensor `index`'s bytes (dtype_bytes of its shape), valid until the next call;
  // called once per tensor in add order.
  using Producer = std::function<Result<const void*>(size_t index)>;
  // Writes `path` (created/truncated, fsynced). Returns the bytes written.
  Result<uint64_t> write(const std::string& path, const Producer& produce) const;

  uint64_t tensor_bytes(size_t index) const { return tensors_[index].nbytes; }
  // Bytes before the first tensor's data (metadata, tensor infos, alignment padding): what
  // write() puts there. It does not depend on the tensors' types.
  uint64_t header_bytes() const { return header().size(); }
  size_t n_tensors() const { return tensors_.size(); }

 private:
  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t nbytes;
  };
  uint32_t alignment() const;
  std::string header() const;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace larder::formats
