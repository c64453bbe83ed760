#include "larder/models/hf_conventions.h"

#include <cstring>

namespace larder::models {

using nlohmann::ordered_json;

ordered_json hf_text_config(const formats::ModelFiles& files, ordered_json j,
                            std::initializer_list<const char*> null_overrides) {
  const ordered_json& top = files.config;
  const bool multimodal = top.contains("text_config") && top["text_config"].is_object();
  const ordered_json& src = multimodal ? top["text_config"] : top;
  auto null_is_value = [&](const std::string& k) {
    for (const char* n : null_overrides)
      if (k == n) return true;
    return false;
  };
  for (auto it = src.begin(); it != src.end(); ++it)
    if (!it.value().is_null() || null_is_value(it.key())) j[it.key()] = it.value();
  if (multimodal) {
    if (top.contains("vocab_size") && top["vocab_size"].is_number_integer() && !src.contains("vocab_size"))
      j["vocab_size"] = top["vocab_size"];
    for (const char* k : {"eos_token_id", "bos_token_id"})
      if (top.contains(k) && !src.contains(k)) j[k] = top[k];
  }
  return j;
}

void use_text_tower_prefix(const formats::ModelFiles& files, TensorNames* names, const std::string& probe) {
  if (files.gguf) return;
  constexpr const char* kModel = "model.";
  if (files.tensors().find("language_model." + probe)) {
    names->hf_strip.clear();
    names->hf_add = "language_model.";
  } else if (probe.rfind(kModel, 0) == 0 &&
             files.tensors().find("model.language_model." + probe.substr(std::strlen(kModel)))) {
    names->hf_strip = kModel;
    names->hf_add = "model.language_model.";
  }
}

void apply_gain(std::vector<float>& w, NormGain g) {
  if (g != NormGain::kOnePlus) return;
  for (float& x : w) x += 1.0f;
}

}  // namespace larder::models
