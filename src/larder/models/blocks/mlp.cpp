#include "larder/models/blocks/mlp.h"

namespace larder::models {

void add_bias(float* y, int64_t n, const std::vector<float>& bias) {
  if (bias.empty()) return;
  const int64_t d = static_cast<int64_t>(bias.size());
  for (int64_t t = 0; t < n; ++t) kernels::add(y + t * d, bias.data(), y + t * d, d);
}

Status bind_mlp(WeightBinder& b, const std::string& p, const ModelConfig& c, Activation act, MlpWeights* w) {
  w->act = act;
  const char* why = "intermediate_size x hidden_size";
  LARDER_ASSIGN_OR_RETURN(w->gate, b.matrix(p + "gate_proj.weight", c.ffn, c.hidden, why));
  LARDER_ASSIGN_OR_RETURN(w->up, b.matrix(p + "up_proj.weight", c.ffn, c.hidden, why));
  LARDER_ASSIGN_OR_RETURN(w->down, b.matrix(p + "down_proj.weight", c.hidden, c.ffn, "hidden_size x intermediate_size"));
  if (c.mlp_bias) {
    LARDER_ASSIGN_OR_RETURN(w->gate_b, b.vector(p + "gate_proj.bias", c.ffn, "intermediate_size"));
    LARDER_ASSIGN_OR_RETURN(w->up_b, b.vector(p + "up_proj.bias", c.ffn, "intermediate_size"));
    LARDER_ASSIGN_OR_RETURN(w->down_b, b.vector(p + "down_proj.bias", c.hidden, "hidden_size"));
  }
  return Status::ok();
}

void mlp_block(const MlpWeights& w, const float* h, int64_t n, MlpScratch& s, float* out) {
  const int64_t ffn = w.gate.rows;
  s.g.resize(static_cast<size_t>(n * ffn));
  s.u.resize(static_cast<size_t>(n * ffn));
  // gate and up read the same activations: one matmul_multi (one quantization, one pool job).
  const kernels::WeightView ws[2] = {w.gate, w.up};
  float* const ys[2] = {s.g.data(), s.u.data()};
  kernels::matmul_multi(ws, ys, 2, h, n);
  add_bias(s.g.data(), n, w.gate_b);
  add_bias(s.u.data(), n, w.up_b);
  switch (w.act) {
    case Activation::kSilu: kernels::silu_mul(s.g.data(), s.u.data(), s.g.data(), n * ffn); break;
    case Activation::kGeluTanh: kernels::gelu_tanh_mul(s.g.data(), s.u.data(), s.g.data(), n * ffn); break;
  }
  kernels::matmul(w.down, s.g.data(), n, out);
  add_bias(out, n, w.down_b);
}

}  // namespace larder::models
