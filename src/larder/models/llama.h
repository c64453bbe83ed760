// llama.h — the Llama graph and the families that are variants of it (qwen2, qwen3, qwen3_moe,
// mistral):
//   per layer: x += attn(rmsnorm(x)); x += ffn(rmsnorm(x))   (pre-norm, full attention)
//   ffn = SwiGLU MLP, or routed SwiGLU experts where ModelConfig::moe says (blocks/moe_block.h)
// A variant file (qwen2.cpp, qwen3.cpp) states its differences in a LlamaVariant and calls
// make_llama_family; the graph, its layer declaration and its tensor-name table live in llama.cpp.
#pragma once

#include <memory>

#include "larder/formats/model_files.h"
#include "larder/kernels/moe.h"
#include "larder/kernels/ops.h"
#include "larder/models/config.h"
#include "larder/models/model.h"

namespace larder::models {

struct LlamaVariant {
  bool qkv_bias = false;       // q/k/v projections carry a bias (qwen2)
  bool qk_norm = false;        // per-head RMSNorm of q and k before RoPE (qwen3)
  bool default_tied = false;   // tie_word_embeddings when config.json does not say (and no lm_head)
  // RoPE pairing for each source. HF checkpoints pair (i, i + d/2) ("rotate_half"). llama.cpp's
  // converter permutes the Q/K rows of `llama` models so the GGUF pairs adjacent dims
  // (interleaved), while it leaves qwen2/qwen3 unpermuted (NeoX pairing).
  kernels::RopePairing hf_pairing = kernels::RopePairing::kHalf;
  kernels::RopePairing gguf_pairing = kernels::RopePairing::kHalf;
  // Layers with routed experts (ModelConfig::moe.routed; qwen3_moe): how the router's logits pick
  // the k experts (renormalisation from the config's norm_topk_prob).
  kernels::RouteOrder route_order = kernels::RouteOrder::kSoftmaxThenTopK;
  kernels::RouteSelect route_select = kernels::RouteSelect::kLastK;
};

// HF → llama.cpp GGUF tensor names of the llama family (llama, qwen2, qwen3); also used by the
// GGUF writer (quant/gguf_export.cpp).
struct TensorNames;
const TensorNames& llama_tensor_names();

Result<std::unique_ptr<Model>> make_llama_family(const formats::ModelFiles& files, ModelConfig config,
                                                 const LlamaVariant& variant);

}  // namespace larder::models
