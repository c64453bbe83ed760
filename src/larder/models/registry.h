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

struct ArchEntry {
  const char* name;
  ArchLoader load;
};

// Defined in the architecture files.
Result<std::unique_ptr<Model>> load_llama(const formats::ModelFiles& files, ModelConfig config);
Result<std::unique_ptr<Model>> load_qwen2(const formats::ModelFiles& files, ModelConfig config);
Result<std::unique_ptr<Model>> load_qwen3(const formats::ModelFiles& files, ModelConfig config);

const ArchEntry* find_architecture(const std::string& name);
std::vector<std::string> supported_architectures();

}  // namespace larder::models
