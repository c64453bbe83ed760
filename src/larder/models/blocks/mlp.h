// mlp.h — the gated SiLU MLP (SwiGLU) of the Llama family: down(silu(gate(x)) * up(x)).
#pragma once

#include <string>
#include <vector>

#include "larder/kernels/ops.h"
#include "larder/models/config.h"
#include "larder/models/weights.h"

namespace larder::models {

struct MlpWeights {
  kernels::WeightView gate, up, down;      // [ffn, hidden], [ffn, hidden], [hidden, ffn]
  std::vector<float> gate_b, up_b, down_b;  // only with config mlp_bias
};

struct MlpScratch {
  std::vector<float> g, u;
};

// prefix: "model.layers.N.mlp."
Status bind_mlp(WeightBinder& b, const std::string& prefix, const ModelConfig& c, MlpWeights* out);
// out[n, hidden] = mlp(h[n, hidden]).
void mlp_block(const MlpWeights& w, const float* h, int64_t n, MlpScratch& s, float* out);

// y[n, dim] += bias[dim] per row (no-op for an empty bias).
void add_bias(float* y, int64_t n, const std::vector<float>& bias);

}  // namespace larder::models
