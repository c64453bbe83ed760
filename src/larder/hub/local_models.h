// local_models.h — `larder ls`: the models on this machine (Hugging Face cache entries, whoever
// downloaded them, and GGUF files / model directories under extra paths) with architecture,
// quantization, size and whether larder can run them. Reads headers and small JSON files only;
// "can run" binds the weights to the architecture (mapping, no reads of tensor data).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace larder::hub {

struct LocalModel {
  std::string name;  // "org/name" or "org/name:QUANT" for cache entries, else the path
  std::string path;  // the directory or .gguf larder loads
  std::string architecture;
  std::string quant;
  uint64_t size_bytes = 0;
  bool runnable = false;
  std::string why_not;  // when !runnable: the first reason
};

// One model entry from a path (directory or .gguf).
LocalModel describe_model(const std::string& path);

// Every model in the cache `hub_dir`, then those found in `extra_paths` (a .gguf file, a model
// directory, or a directory holding them, one level deep).
std::vector<LocalModel> list_local_models(const std::string& hub_dir, const std::vector<std::string>& extra_paths);

// GGUF general.file_type (llama_ftype) as llama.cpp names it ("Q4_K_M"), or "".
std::string gguf_file_type_name(int64_t ftype);

}  // namespace larder::hub
