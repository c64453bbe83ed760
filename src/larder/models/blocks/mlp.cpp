#include "larder/models/blocks/mlp.h"

namespace larder::models {

Status bind_mlp(WeightBinder& b, const std::string& p, const ModelConfig& c, Activation act, MlpWeights* w) {
  w->act = act;
  const char* why = "intermediate_size x hidden_size";
  LARDER_ASSIGN_OR_RETURN(w->gate, b.projection({.module = p + "gate_proj", .out = c.ffn, .in = c.hidden, .why = why,
                                                 .bias = c.mlp_bias, .bias_why = "intermediate_size"}));
  LARDER_ASSIGN_OR_RETURN(w->up, b.projection({.module = p + "up_proj", .out = c.ffn, .in = c.hidden, .why = why,
                                               .bias = c.mlp_bias, .bias_why = "intermediate_size"}));
  LARDER_ASSIGN_OR_RETURN(w->down, b.projection({.module = p + "down_proj",
                                                 .out = c.hidden,
                                                 .in = c.ffn,
                                                 .why = "hidden_size x intermediate_size",
                                                 .bias = c.mlp_bias,
                                                 .bias_why = "hidden_size"}));
  return Status::ok();
}

void mlp_block(const MlpWeights& w, const float* h, int64_t n, MlpScratch& s, float* out, AdapterRows adapters) {
  const int64_t ffn = w.gate.out();
  s.g.resize(static_cast<size_t>(n * ffn));
  s.u.resize(static_cast<size_t>(n * ffn));
  // gate and up read the same activations: one group (one quantization, one pool job).
  const Projection* ps[2] = {&w.gate, &w.up};
  float* const ys[2] = {s.g.data(), s.u.data()};
  apply_group(ps, ys, 2, h, n, adapters);
  switch (w.act) {
    case Activation::kSilu: kernels::silu_mul(s.g.data(), s.u.data(), s.g.data(), n * ffn); break;
    case Activation::kGeluTanh: kernels::gelu_tanh_mul(s.g.data(), s.u.data(), s.g.data(), n * ffn); break;
    case Activation::kSwigluOai: LARDER_CHECK(false && "kSwigluOai is a routed-experts activation"); break;
  }
  w.down.apply(s.g.data(), n, out, adapters);
}

}  // namespace larder::models
