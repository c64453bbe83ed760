#include "larder/models/registry.h"

namespace larder::models {

namespace {
// Adding an architecture: its file under models/ plus one line here.
constexpr ArchEntry kArchitectures[] = {
    {"llama", load_llama},
    {"mistral", load_llama},  // same graph as llama (mlx-lm maps it to llama too)
    {"qwen2", load_qwen2},
    {"qwen3", load_qwen3},
    {"qwen3_moe", load_qwen3_moe, qwen3_moe_config},
    {"qwen3moe", load_qwen3_moe, qwen3_moe_config},  // GGUF (llama.cpp's name)
    {"gemma3_text", load_gemma3, gemma3_config},
    {"gemma3", load_gemma3, gemma3_config},  // multimodal HF config (text tower) and GGUF `gemma3`
    {"gemma4_text", load_gemma4, gemma4_config},
    {"gemma4", load_gemma4, gemma4_config},  // multimodal HF config (text tower) and GGUF `gemma4`
    {"qwen3_5_text", load_qwen3_5, qwen3_5_config},
    {"qwen3_5", load_qwen3_5, qwen3_5_config},  // multimodal HF config (text tower)
    {"qwen35", load_qwen3_5, qwen3_5_config},   // GGUF (llama.cpp's name)
    {"qwen3_5_moe_text", load_qwen3_5, qwen3_5_config},  // the MoE variant (routed + shared experts)
    {"qwen3_5_moe", load_qwen3_5, qwen3_5_config},
    {"qwen35moe", load_qwen3_5, qwen3_5_config},  // GGUF (llama.cpp's name)
    {"qwen3_next", load_qwen3_5, qwen3_5_config},  // Qwen3-Next: the qwen3_5 graph, fused DeltaNet inputs
    {"qwen3next", load_qwen3_5, qwen3_5_config},   // GGUF (llama.cpp's name)
    {"gpt_oss", load_gpt_oss, gpt_oss_config},
    {"gpt-oss", load_gpt_oss, gpt_oss_config},  // GGUF (llama.cpp's name)
};
}  // namespace

const ArchEntry* find_architecture(const std::string& name) {
  for (const ArchEntry& e : kArchitectures)
    if (name == e.name) return &e;
  return nullptr;
}

std::vector<std::string> supported_architectures() {
  std::vector<std::string> v;
  for (const ArchEntry& e : kArchitectures) v.emplace_back(e.name);
  return v;
}

Result<std::unique_ptr<Model>> Model::load(const formats::ModelFiles& files) {
  if (!files.has_weights())
    return invalid_argument(strfmt("[model] %s: opened without weights", files.path.c_str()));
  LARDER_ASSIGN_OR_RETURN(std::string arch, architecture_of(files));
  const ArchEntry* e = find_architecture(arch);
  if (!e) {
    std::string list;
    for (const auto& s : supported_architectures()) list += (list.empty() ? "" : ", ") + s;
    return unsupported(strfmt("[model] %s: architecture '%s' is not supported (supported: %s)", files.path.c_str(),
                              arch.c_str(), list.c_str()));
  }
  LARDER_ASSIGN_OR_RETURN(ModelConfig cfg, e->config ? e->config(files) : config_from_files(files));
  return e->load(files, std::move(cfg));
}

}  // namespace larder::models
