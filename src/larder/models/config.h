// config.h — architecture hyper-parameters, from a Hugging Face config.json or GGUF metadata.
//
// One struct for the whole decoder-only family; architecture files set defaults and flags that
// the source leaves implicit (e.g. whether embeddings are tied when the config does not say).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "larder/core/status.h"
#include "larder/formats/gguf.h"
#include "larder/formats/model_files.h"

namespace larder::models {

struct RopeScaling {
  std::string type;  // "" or "default": none; "llama3"; "linear"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
};

struct ModelConfig {
  std::string architecture;
  std::string source;  // config.json path or .gguf path (for messages)
  bool from_gguf = false;
  int64_t n_layers = 0, hidden = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  int64_t max_context = 0;
  double rms_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t rope_dim = 0;  // dims rotated per head (== head_dim unless partial rotary)
  RopeScaling rope_scaling;
  std::optional<bool> tied_embeddings;  // unset: the architecture's default (or GGUF: tensor presence)
  bool attention_bias = false;
  bool mlp_bias = false;
  std::vector<int32_t> eos_ids;
  std::optional<int32_t> bos_id;
};

// Architecture name alone (model_type or general.architecture), for the registry.
Result<std::string> architecture_of(const formats::ModelFiles& files);

// Parses the hyper-parameters common to the Llama-style family. Missing required keys, non-positive
// sizes and inconsistent heads (n_heads % n_kv_heads) are errors naming the file and key.
Result<ModelConfig> config_from_hf(const formats::ModelFiles& files);
Result<ModelConfig> config_from_gguf(const formats::GgufFile& g);
Result<ModelConfig> config_from_files(const formats::ModelFiles& files);

}  // namespace larder::models
