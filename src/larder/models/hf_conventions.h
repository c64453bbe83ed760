// hf_conventions.h — the Hugging Face checkpoint conventions several families share, written once:
//   - text_config nesting: a multimodal config keeps the text model's keys under `text_config`
//     (Gemma 3, Gemma 4, Qwen3.5), with vocab_size / eos / bos sometimes only at the top level;
//   - the text tower's tensor prefix in multimodal checkpoints: `language_model.model.*`
//     (transformers 4.x, mlx-lm) or `model.language_model.*` (transformers 5);
//   - norm gains stored as γ − 1 (Gemma 3, Qwen3.5 HF weights: the effective gain is 1 + w),
//     while llama.cpp's converters and mlx-lm's own saves store γ.
// Each family file states which of them apply to it (model-families.md §2–§4).
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "larder/formats/model_files.h"
#include "larder/models/tensor_names.h"

namespace larder::models {

// The text model's config object over `defaults`: `text_config` of a multimodal config (its
// vocab_size, eos_token_id and bos_token_id from the top level when only the top level has them),
// else the config itself. Keys set to null keep the default, except those in `null_overrides`
// (where null is a value: e.g. Gemma 4's final_logit_softcapping: null turns capping off).
nlohmann::ordered_json hf_text_config(const formats::ModelFiles& files, nlohmann::ordered_json defaults,
                                      std::initializer_list<const char*> null_overrides = {});

// Points `names` at the text tower of a multimodal HF checkpoint when the file keeps it under a
// prefix (found by `probe`, a canonical name every checkpoint of the family has, e.g.
// "model.embed_tokens.weight"). No-op for GGUF and for text-only checkpoints.
void use_text_tower_prefix(const formats::ModelFiles& files, TensorNames* names,
                           const std::string& probe = "model.embed_tokens.weight");

// How a checkpoint stores an RMSNorm gain γ.
enum class NormGain : uint8_t {
  kAsStored,  // γ (Llama; llama.cpp GGUFs of every family; mlx-lm's sanitized saves)
  kOnePlus,   // γ − 1 (Gemma 3, Qwen3.5 HF layouts): the gain is 1 + w
};
// Turns stored values into the gain RMSNorm multiplies by (f32, once, at load).
void apply_gain(std::vector<float>& w, NormGain g);

}  // namespace larder::models
