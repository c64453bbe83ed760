// qwen3.cpp — the qwen3 model file: Llama graph with RMSNorm over head_dim applied to every
// query and key head before RoPE (q_norm / k_norm, eps = rms_norm_eps), explicit head_dim
// (often != hidden/heads), no q/k/v bias unless attention_bias. NeoX pairing in GGUF too.
#include "larder/models/llama.h"
#include "larder/models/registry.h"

namespace larder::models {

Result<std::unique_ptr<Model>> load_qwen3(const formats::ModelFiles& files, ModelConfig config) {
  LlamaVariant spec;
  spec.qk_norm = true;
  spec.default_tied = false;
  spec.hf_pairing = kernels::RopePairing::kHalf;
  spec.gguf_pairing = kernels::RopePairing::kHalf;
  return make_llama_family(files, std::move(config), spec);
}

}  // namespace larder::models
