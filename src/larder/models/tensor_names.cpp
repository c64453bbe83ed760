#include "larder/models/tensor_names.h"

#include <cstring>

namespace larder::models {

namespace {
bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
constexpr const char* kHfLayers = "model.layers.";
}  // namespace

std::string TensorNames::gguf(const std::string& hf) const {
  for (const auto& [from, to] : globals)
    if (hf == from) return to;
  if (!starts_with(hf, kHfLayers)) return "";
  const size_t a = std::strlen(kHfLayers);
  const size_t dot = hf.find('.', a);
  if (dot == std::string::npos) return "";
  const std::string n = hf.substr(a, dot - a);
  const std::string rest = hf.substr(dot + 1);
  for (const auto& [from, to] : layer) {
    if (starts_with(rest, from)) return "blk." + n + "." + to + rest.substr(from.size());
  }
  return "";
}

std::string TensorNames::hf_file(const std::string& hf) const {
  if ((hf_strip.empty() && hf_add.empty()) || !starts_with(hf, hf_strip)) return hf;
  return hf_add + hf.substr(hf_strip.size());
}

std::string TensorNames::layer_prefix(bool gguf) const { return gguf ? "blk." : hf_file(kHfLayers); }

}  // namespace larder::models
