// safetensors.h — reader for Hugging Face safetensors files and sharded checkpoints.
//
// Layout: u64 little-endian header length N, N bytes of JSON
// {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data; offsets are relative to the first data byte. Every entry is validated
// (known dtype, size = shape x element size, range inside the file, no overlaps) before any
// tensor is exposed.
#pragma once

#include <map>
#include <string>

#include "larder/core/mmap_file.h"
#include "larder/core/status.h"
#include "larder/formats/tensor.h"

namespace larder::formats {

// Adds every tensor of one .safetensors file to `out` (mapping it zero-copy, or copying it with
// MapMode::kCopy). `metadata` (optional) receives the "__metadata__" string map (MLX writes
// {"format": "mlx"}).
Status read_safetensors(const std::string& path, TensorSet* out,
                        std::map<std::string, std::string>* metadata = nullptr, MapMode mode = MapMode::kMap);

// A checkpoint directory: model.safetensors, or the shards named by model.safetensors.index.json
// (every tensor the index names must be in the shard it names).
Result<TensorSet> open_safetensors_dir(const std::string& dir, MapMode mode = MapMode::kMap);

DType dtype_from_safetensors(const std::string& name);  // "BF16" -> kBF16, else kUnknown

}  // namespace larder::formats
