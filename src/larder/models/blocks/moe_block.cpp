#include "larder/models/blocks/moe_block.h"

#include <algorithm>
#include <cmath>

namespace larder::models {

namespace {
// A matrix's bytes as stored: codes plus, for MLX affine, its scales and biases (MLX microscaling:
// its U8 scales).
uint64_t view_bytes(const kernels::WeightView& w) {
  return static_cast<uint64_t>(w.rows) * (w.row_bytes() + (w.biases ? 2 : 1) * w.scale_row_bytes());
}
}  // namespace

uint64_t MoeWeights::expert_bytes() const {
  uint64_t b = 0;
  for (const auto* set : {&gate, &up, &gate_up, &down})
    for (const kernels::WeightView& w : *set) b += view_bytes(w);
  return b;  // the shared expert is dense weight: read by every token, not counted here
}

uint64_t MoeWeights::active_expert_bytes() const {
  return route.n_experts > 0 ? expert_bytes() / static_cast<uint64_t>(route.n_experts) * static_cast<uint64_t>(route.k)
                             : 0;
}

namespace {
// OpenAI's HF layout of gpt-oss experts (see bind_moe in moe_block.h).
Status bind_openai_mxfp4(WeightBinder& b, const std::string& p, const ExpertDims& d, int64_t hidden, bool biases,
                         MoeWeights* w) {
  const int E = d.n_experts;
  const int64_t I = d.ffn;
  LARDER_ASSIGN_OR_RETURN(w->gate_up, b.mxfp4_block_experts(p + "experts.gate_up_proj", E, 2 * I, hidden,
                                                            "experts of 2*intermediate_size x hidden_size, gate and up "
                                                            "rows interleaved"));
  LARDER_ASSIGN_OR_RETURN(w->down, b.mxfp4_block_experts(p + "experts.down_proj", E, hidden, I,
                                                         "experts of hidden_size x intermediate_size"));
  if (!biases) return Status::ok();
  LARDER_ASSIGN_OR_RETURN(const std::vector<float> gub, b.small_f32(p + "experts.gate_up_proj_bias", {E, 2 * I},
                                                                   "num_experts x 2*intermediate_size"));
  w->gate_bias.resize(static_cast<size_t>(E * I));
  w->up_bias.resize(static_cast<size_t>(E * I));
  for (int64_t r = 0; r < E * I; ++r) {  // gate = [..., ::2], up = [..., 1::2] (mlx-lm's sanitize)
    w->gate_bias[static_cast<size_t>(r)] = gub[static_cast<size_t>(2 * r)];
    w->up_bias[static_cast<size_t>(r)] = gub[static_cast<size_t>(2 * r + 1)];
  }
  LARDER_ASSIGN_OR_RETURN(w->down_bias,
                          b.small_f32(p + "experts.down_proj_bias", {E, hidden}, "num_experts x hidden_size"));
  return Status::ok();
}
}  // namespace

Status bind_moe(WeightBinder& b, const std::string& p, const ExpertDims& d, int64_t hidden,
                const kernels::RouteParams& route, Activation act, MoeWeights* w, const MoeTensorNames& names) {
  w->act = act;
  w->route = route;
  w->route.n_experts = d.n_experts;
  w->route.k = d.k;
  LARDER_ASSIGN_OR_RETURN(w->router, b.projection({.module = p + names.router, .out = d.n_experts, .in = hidden,
                                                    .why = "num_experts x hidden_size", .bias = names.biases,
                                                    .bias_why = "num_experts"}));
  if (names.experts_bound) return Status::ok();
  if (b.has(p + "experts.gate_up_proj_blocks")) return bind_openai_mxfp4(b, p, d, hidden, names.biases, w);
  struct Part {
    const char* proj;
    int64_t rows, cols;
    const char* why;
    std::vector<kernels::WeightView>* out;
  };
  const Part parts[] = {{"gate_proj", d.ffn, hidden, "experts of moe_intermediate_size x hidden_size", &w->gate},
                        {"up_proj", d.ffn, hidden, "experts of moe_intermediate_size x hidden_size", &w->up},
                        {"down_proj", hidden, d.ffn, "experts of hidden_size x moe_intermediate_size", &w->down}};
  // transformers 5 fuses gate and up: experts.gate_up_proj [E, 2·ffn, hidden] (gate first).
  const bool fused = !b.has(p + names.stacked + "gate_proj.weight") && b.has(p + "experts.gate_up_proj");
  for (const Part& part : parts) {
    WeightBinder::ExpertsSpec s;
    s.stacked = p + names.stacked + part.proj + ".weight";
    s.per_expert = p + "experts.{i}." + part.proj + ".weight";
    if (fused) {
      const bool down = part.out == &w->down;
      s.stacked = p + (down ? "experts.down_proj" : "experts.gate_up_proj");
      s.per_expert.clear();
      s.parts = down ? 1 : 2;
      s.part = part.out == &w->up ? 1 : 0;
    }
    s.n_experts = d.n_experts;
    s.rows = part.rows;
    s.cols = part.cols;
    LARDER_ASSIGN_OR_RETURN(*part.out, b.experts(s, part.why));
    if (names.biases) {
      std::vector<float>* bias = part.out == &w->gate ? &w->gate_bias : part.out == &w->up ? &w->up_bias : &w->down_bias;
      LARDER_ASSIGN_OR_RETURN(*bias, b.small_f32(p + names.stacked + part.proj + ".bias", {d.n_experts, part.rows},
                                                 "num_experts x the expert's output size"));
    }
  }
  w->has_shared = d.shared_ffn > 0;
  if (w->has_shared) {
    ModelConfig sc;  // bind_mlp's view: the shared expert's sizes, no biases
    sc.hidden = hidden;
    sc.ffn = d.shared_ffn;
    LARDER_RETURN_IF_ERROR(bind_mlp(b, p + "shared_expert.", sc, act, &w->shared));
    const std::string sg = p + "shared_expert_gate";
    if (b.has(sg + ".scales")) {  // MLX: quantized like the router
      LARDER_ASSIGN_OR_RETURN(w->shared_gate, b.projection({.module = sg, .out = 1, .in = hidden, .why = "1 x hidden_size"}));
    } else {  // one float row, [1, hidden] (HF) or [hidden] (GGUF ffn_gate_inp_shexp)
      LARDER_ASSIGN_OR_RETURN(w->shared_gate_f32, b.small_f32(sg + ".weight", {1, hidden}, "1 x hidden_size"));
      kernels::WeightView v;
      v.dtype = DType::kF32;
      v.rows = 1;
      v.cols = hidden;
      v.data = reinterpret_cast<const uint8_t*>(w->shared_gate_f32.data());
      w->shared_gate = b.projection_over(sg, v);
    }
  }
  return Status::ok();
}

namespace {

// y[slot] += bias[ids[slot]] for every (token, slot) row of y [n·k, dim].
void add_expert_bias(const std::vector<float>& bias, const int32_t* ids, int64_t slots, int64_t dim, float* y) {
  if (bias.empty()) return;
  for (int64_t r = 0; r < slots; ++r) {
    const float* b = bias.data() + static_cast<int64_t>(ids[r]) * dim;
    float* o = y + r * dim;
    for (int64_t c = 0; c < dim; ++c) o[c] += b[c];
  }
}

}  // namespace

void moe_block(const MoeWeights& w, const float* h, int64_t n, MoeScratch& s, float* out, AdapterRows adapters) {
  const int E = w.route.n_experts, k = w.route.k;
  const bool fused = !w.gate_up.empty();
  const int64_t ffn = fused ? w.gate_up[0].rows / 2 : w.gate[0].rows, hidden = w.down[0].rows;
  const int64_t slots = n * k;
  s.logits.resize(static_cast<size_t>(n * E));
  s.ids.resize(static_cast<size_t>(slots));
  s.weights.resize(static_cast<size_t>(slots));
  s.g.resize(static_cast<size_t>(slots * ffn));
  s.u.resize(static_cast<size_t>(slots * ffn));
  s.y.resize(static_cast<size_t>(slots * hidden));
  const float* rin = h;
  if (w.router_norm.dim() > 0) {
    s.router_in.resize(static_cast<size_t>(n * hidden));
    w.router_norm.apply(h, n, s.router_in.data());
    rin = s.router_in.data();
  }
  w.router.apply(rin, n, s.logits.data(), adapters);
  if (w.expert_norm.dim() > 0) {  // after the router: h is the residual, read by both
    s.expert_in.resize(static_cast<size_t>(n * hidden));
    w.expert_norm.apply(h, n, s.expert_in.data());
    h = s.expert_in.data();
  }
  kernels::route_topk(s.logits.data(), n, w.route, s.ids.data(), s.weights.data());
  if (fused) {
    s.gu.resize(static_cast<size_t>(slots * 2 * ffn));
    const kernels::ExpertsView gu{w.gate_up.data(), E};
    kernels::matmul_experts(gu, h, /*x_per_slot=*/false, n, s.ids.data(), k, s.gu.data());
    for (int64_t i = 0; i < slots * ffn; ++i) {  // row 2i → gate i, 2i + 1 → up i
      s.g[static_cast<size_t>(i)] = s.gu[static_cast<size_t>(2 * i)];
      s.u[static_cast<size_t>(i)] = s.gu[static_cast<size_t>(2 * i + 1)];
    }
  } else {
    const kernels::ExpertsView gu[2] = {{w.gate.data(), E}, {w.up.data(), E}};
    float* const ys[2] = {s.g.data(), s.u.data()};
    kernels::matmul_experts_multi(gu, ys, 2, h, /*x_per_slot=*/false, n, s.ids.data(), k);
  }
  add_expert_bias(w.gate_bias, s.ids.data(), slots, ffn, s.g.data());
  add_expert_bias(w.up_bias, s.ids.data(), slots, ffn, s.u.data());
  switch (w.act) {
    case Activation::kSilu: kernels::silu_mul(s.g.data(), s.u.data(), s.g.data(), slots * ffn); break;
    case Activation::kGeluTanh: kernels::gelu_tanh_mul(s.g.data(), s.u.data(), s.g.data(), slots * ffn); break;
    case Activation::kSwigluOai:
      kernels::swiglu_oai(s.g.data(), s.u.data(), s.g.data(), slots * ffn, w.swiglu_alpha, w.swiglu_limit);
      break;
  }
  const kernels::ExpertsView dv{w.down.data(), E};
  kernels::matmul_experts(dv, s.g.data(), /*x_per_slot=*/true, n, s.ids.data(), k, s.y.data());
  add_expert_bias(w.down_bias, s.ids.data(), slots, hidden, s.y.data());
  // Σ_j weight · y in slot order, per row (mlx-lm: (y * scores).sum(-2)).
  for (int64_t t = 0; t < n; ++t) {
    float* o = out + t * hidden;
    const float* wt = s.weights.data() + t * k;
    for (int64_t c = 0; c < hidden; ++c) o[c] = 0.0f;
    for (int j = 0; j < k; ++j) {
      const float* y = s.y.data() + (t * k + j) * hidden;
      for (int64_t c = 0; c < hidden; ++c) o[c] += wt[j] * y[c];
    }
  }
  if (!w.has_shared) return;
  // + σ(shared_gate · h) · shared_mlp(h), added after the routed sum (mlx-lm's order).
  s.shared_y.resize(static_cast<size_t>(n * hidden));
  s.shared_g.resize(static_cast<size_t>(n));
  mlp_block(w.shared, h, n, s.shared, s.shared_y.data(), adapters);
  w.shared_gate.apply(h, n, s.shared_g.data(), adapters);
  for (int64_t t = 0; t < n; ++t) {
    const float g = 1.0f / (1.0f + std::exp(-s.shared_g[static_cast<size_t>(t)]));
    float* o = out + t * hidden;
    const float* y = s.shared_y.data() + t * hidden;
    for (int64_t c = 0; c < hidden; ++c) o[c] += g * y[c];
  }
}

}  // namespace larder::models
