// mlp.h — the gated MLP: down(act(gate(x)) * up(x)), act = SiLU (SwiGLU: Llama, Qwen) or
// tanh-approximated GELU (GeGLU: Gemma).
#pragma once

#include <string>
#include <vector>

#include "larder/kernels/ops.h"
#include "larder/models/adapter.h"
#include "larder/models/blocks/projection.h"
#include "larder/models/config.h"
#include "larder/models/weights.h"

namespace larder::models {

// kSwigluOai: gpt-oss's clamped SwiGLU, routed experts only (blocks/moe_block.h).
enum class Activation : uint8_t { kSilu, kGeluTanh, kSwigluOai };

struct MlpWeights {
  Activation act = Activation::kSilu;
  Projection gate, up, down;  // [ffn, hidden], [ffn, hidden], [hidden, ffn]; biases with config mlp_bias
};

struct MlpScratch {
  std::vector<float> g, u;
};

// prefix: "model.layers.N.mlp."
Status bind_mlp(WeightBinder& b, const std::string& prefix, const ModelConfig& c, Activation act, MlpWeights* out);
// out[n, hidden] = mlp(h[n, hidden]); `adapters`: the rows' adapter deltas (LayerBatch::adapters).
void mlp_block(const MlpWeights& w, const float* h, int64_t n, MlpScratch& s, float* out, AdapterRows adapters = {});

}  // namespace larder::models
