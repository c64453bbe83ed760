// model_files.h — resolve a MODEL argument (HF checkpoint directory or .gguf file) into its
// parsed parts: config, generation config, tokenizer files, chat template, mapped tensors.
//
// Only headers and small JSON files are read here; tensor data stays in the mappings, so opening
// a model of any size costs milliseconds.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "larder/core/mmap_file.h"
#include "larder/core/status.h"
#include "larder/formats/gguf.h"
#include "larder/formats/tensor.h"

namespace larder::formats {

enum class ModelSource { kHfDir, kGguf };

struct ModelFiles {
  ModelSource source = ModelSource::kHfDir;
  std::string path;                       // the directory or the .gguf file
  nlohmann::ordered_json config;          // config.json (HF); null for GGUF
  nlohmann::ordered_json generation_config;  // generation_config.json if present, else null
  nlohmann::ordered_json tokenizer_config;   // tokenizer_config.json if present, else null
  std::string tokenizer_json_path;        // HF: <dir>/tokenizer.json if present
  std::string chat_template;              // chat_template.jinja > tokenizer_config.chat_template > GGUF tokenizer.chat_template
  std::string chat_template_source;       // where it came from, for messages ("chat_template.jinja", ...); "" if none
  std::shared_ptr<GgufFile> gguf;         // GGUF source (metadata + tensors)
  std::shared_ptr<TensorSet> hf_tensors;  // HF source

  bool has_weights() const { return gguf != nullptr || hf_tensors != nullptr; }
  const TensorSet& tensors() const { return gguf ? gguf->tensors() : *hf_tensors; }
  bool has_chat_template() const { return !chat_template.empty(); }
};

struct OpenOptions {
  bool weights = true;  // false: tokenizer/config only (e.g. `larder tokenize` on a tokenizer-only dir)
  MapMode map_mode = MapMode::kMap;  // kCopy: weights read into huge pages (`--no-mmap`)
};

Result<ModelFiles> open_model_files(const std::string& path, const OpenOptions& opts = {});

// Reads and parses a JSON file; errors name the file and the parse position.
Result<nlohmann::ordered_json> read_json_file(const std::string& path);

}  // namespace larder::formats
