// checkpoint_io.h — writing Hugging Face / MLX checkpoint directories: safetensors shards (+ index),
// config.json, the tokenizer/template files that travel with the weights, and the atomic
// publish of the whole directory. Shared by `larder quantize` (convert.cpp) and the rotation
// fold (rotate.cpp), which both stream one tensor at a time into the shards.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "larder/core/status.h"
#include "larder/formats/tensor.h"

namespace larder::quant {

// "F32", "BF16", "U32", ... or nullptr for a dtype safetensors cannot carry.
const char* safetensors_dtype_name(DType t);

// write(2) until done (EINTR retried); errors name `path`.
Status write_fd_all(int fd, const void* data, size_t n, const std::string& path);

// Creates/truncates `path`, writes `text`, fsyncs.
Status write_text_file(const std::string& path, const std::string& text);

// config.json as mlx-lm writes it: top-level keys sorted, indent 4, trailing newline.
Status write_config_json(const std::string& path, const nlohmann::ordered_json& cfg);

// Tokenizer, chat template and generation files that belong next to the weights.
bool is_aux_file(const std::string& name);
Status copy_aux_files(const std::string& src_dir, const std::string& dst_dir);

struct ShardEntry {
  std::string name;
  DType dtype = DType::kUnknown;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
};

// Returns a pointer to entry `index`'s nbytes bytes, valid until the next call. Called exactly
// once per entry, in entry order (so a producer can compute one tensor at a time).
using TensorProducer = std::function<Result<const void*>(size_t index)>;

struct ShardsWritten {
  size_t n_shards = 0;
  uint64_t total_bytes = 0;
  std::vector<std::string> file_of;  // per entry: the shard file it went into
};

// Greedy shards in entry order (a tensor never spans two; a shard exceeds max_shard_bytes only
// when one tensor does): model.safetensors, or model-0000i-of-0000N.safetensors plus
// model.safetensors.index.json. `metadata` becomes each header's __metadata__ (may be null).
// Every file is fsynced.
Result<ShardsWritten> write_safetensors_shards(const std::string& dir, const std::vector<ShardEntry>& entries,
                                               uint64_t max_shard_bytes, const nlohmann::ordered_json& metadata,
                                               uint64_t total_parameters, const TensorProducer& produce);

// Refuses an existing `dst`; runs `fill` on a fresh `<dst>.partial-XXXXXX` directory next to it
// and renames that onto `dst` when it succeeds; removes it on any failure. `what` prefixes the
// messages ("[quantize]", "[rotate]").
Status publish_directory(const std::string& dst, const std::string& what,
                         const std::function<Status(const std::string& tmp_dir)>& fill);

}  // namespace larder::quant
