// qwen2.cpp — the qwen2 model file: Llama graph with biases on the q/k/v projections
// (none on o_proj). GGUFs from llama.cpp keep NeoX (rotate_half) pairing for qwen2.
#include "larder/models/llama.h"
#include "larder/models/registry.h"

namespace larder::models {

Result<std::unique_ptr<Model>> load_qwen2(const formats::ModelFiles& files, ModelConfig config) {
  LlamaVariant spec;
  spec.qkv_bias = true;
  spec.default_tied = false;
  spec.hf_pairing = kernels::RopePairing::kHalf;
  spec.gguf_pairing = kernels::RopePairing::kHalf;
  return make_llama_family(files, std::move(config), spec);
}

}  // namespace larder::models
