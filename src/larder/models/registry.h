// registry.h — architecture name (HF model_type / GGUF general.architecture) → loader.
//
// An explicit table rather than self-registering statics: objects in a static library that
// nothing references are dropped by the linker, which would silently unregister a model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "larder/formats/model_files.h"
#include "larder/models/config.h"
#include "larder/models/model.h"

namespace larder::models {

using ArchLoader = Result<std::unique_ptr<Model>> (*)(const formats::ModelFiles& files, ModelConfig config);
// An architecture that reads its hyper-parameters its own way (defaults, nested text_config).
using ArchConfig = Result<ModelConfig> (*)(const formats::ModelFiles& files);

struct ArchEntry {
  const char* name;
  ArchLoader load;
  ArchConfig config = nullptr;  // null: config_from_files
};

// Defined in the architecture files.
Result<std::unique_ptr<Model>> load_llama(const formats::ModelFiles& files, ModelConfig config);
Result<std::unique_ptr<Model>> load_qwen2(const formats::ModelFiles& files, ModelConfig config);
Result<std::unique_ptr<Model>> load_qwen3(const formats::ModelFiles& files, ModelConfig config);
Result<std::unique_ptr<Model>> load_qwen3_moe(const formats::ModelFiles& files, ModelConfig config);
Result<ModelConfig> qwen3_moe_config(const formats::ModelFiles& files);
Result<std::unique_ptr<Model>> load_gemma3(const formats::ModelFiles& files, ModelConfig config);
Result<ModelConfig> gemma3_config(const formats::ModelFiles& files);
Result<std::unique_ptr<Model>> load_gemma4(const formats::ModelFiles& files, ModelConfig config);
Result<ModelConfig> gemma4_config(const formats::ModelFiles& files);
Result<std::unique_ptr<Model>> load_qwen3_5(const formats::ModelFiles& files, ModelConfig config);
Result<ModelConfig> qwen3_5_config(const formats::ModelFiles& files);
Result<std::unique_ptr<Model>> load_gpt_oss(const formats::ModelFiles& files, ModelConfig config);
Result<ModelConfig> gpt_oss_config(const formats::ModelFiles& files);

const ArchEntry* find_architecture(const std::string& name);
std::vector<std::string> supported_architectures();

}  // namespace larder::models
