// qwen3_moe.cpp — the qwen3_moe model file (Qwen3-30B-A3B, Qwen3-235B-A22B; GGUF `qwen3moe`): the
// qwen3 graph (q/k RMSNorm per head, NeoX RoPE) whose FFN is routed experts on the layers the
// config names (oracles: mlx-lm `qwen3_moe.py`, llama.cpp `src/models/qwen3moe.cpp`):
//   p = softmax(router(x)) over E;  the k largest (mlx's argpartition);  with norm_topk_prob the k
//   weights divided by their sum;  out = Σ weight · down(silu(gate(x)) ⊙ up(x)) of the k experts.
//
// Source-specific details:
// - config.json: layer l has experts iff num_experts > 0, l not in mlp_only_layers and
//   (l + 1) % decoder_sparse_step == 0 (else a dense MLP of intermediate_size). num_experts,
//   num_experts_per_tok and moe_intermediate_size are required (mlx-lm requires every key);
//   absent norm_topk_prob / decoder_sparse_step / mlp_only_layers take transformers' defaults
//   (false, 1, []) — Qwen's own configs write them all.
// - Experts: HF checkpoints hold one tensor per expert (mlp.experts.N.{gate,up,down}_proj), mlx-lm's
//   saves and MLX-quantized checkpoints stacked mlp.switch_mlp.*; both bound in place.
// - GGUF (llama.cpp): every layer routed, always renormalised (its graph passes norm_w = true and
//   has no dense-layer path), expert_count / expert_used_count / expert_feed_forward_length
//   (absent: feed_forward_length / expert_used_count, as llama.cpp falls back).
#include "larder/models/llama.h"
#include "larder/models/registry.h"

namespace larder::models {

namespace {

using nlohmann::ordered_json;

Status hf_moe(const ordered_json& j, ModelConfig* c) {
  const char* src = c->source.c_str();
  MoeConfig& m = c->moe;
  auto get_int = [&](const char* k, bool required, int64_t dflt, int64_t* out) -> Status {
    if (!j.contains(k) || j[k].is_null()) {
      if (required) return invalid_argument(strfmt("[config] %s: missing required key '%s'", src, k));
      *out = dflt;
      return Status::ok();
    }
    if (!j[k].is_number_integer() || j[k].get<int64_t>() < 0 || j[k].get<int64_t>() > (int64_t{1} << 30))
      return invalid_argument(strfmt("[config] %s: '%s' must be a non-negative integer, got %s", src, k,
                                     j[k].dump().c_str()));
    *out = j[k].get<int64_t>();
    return Status::ok();
  };
  LARDER_RETURN_IF_ERROR(get_int("num_experts", true, 0, &m.n_experts));
  m.routed.assign(static_cast<size_t>(c->n_layers), false);
  if (m.n_experts == 0) return Status::ok();  // mlx-lm: every layer dense
  int64_t step = 1;
  LARDER_RETURN_IF_ERROR(get_int("num_experts_per_tok", true, 0, &m.n_used));
  LARDER_RETURN_IF_ERROR(get_int("moe_intermediate_size", true, 0, &m.ffn));
  LARDER_RETURN_IF_ERROR(get_int("decoder_sparse_step", false, 1, &step));
  if (m.n_used < 1 || m.n_used > m.n_experts)
    return invalid_argument(strfmt("[config] %s: num_experts_per_tok %lld must be in [1, num_experts = %lld]", src,
                                   (long long)m.n_used, (long long)m.n_experts));
  if (m.ffn < 1) return invalid_argument(strfmt("[config] %s: moe_intermediate_size must be positive", src));
  if (step < 1) return invalid_argument(strfmt("[config] %s: decoder_sparse_step must be >= 1", src));
  if (j.contains("norm_topk_prob") && !j["norm_topk_prob"].is_null()) {
    if (!j["norm_topk_prob"].is_boolean())
      return invalid_argument(strfmt("[config] %s: 'norm_topk_prob' must be true or false", src));
    m.norm_topk_prob = j["norm_topk_prob"].get<bool>();
  }
  for (int64_t l = 0; l < c->n_layers; ++l) m.routed[static_cast<size_t>(l)] = (l + 1) % step == 0;
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    const ordered_json& d = j["mlp_only_layers"];
    if (!d.is_array()) return invalid_argument(strfmt("[config] %s: 'mlp_only_layers' must be a list of layer indices", src));
    for (const auto& e : d) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= c->n_layers)
        return invalid_argument(strfmt("[config] %s: mlp_only_layers entry %s is not a layer index in [0, %lld)", src,
                                       e.dump().c_str(), (long long)c->n_layers));
      m.routed[static_cast<size_t>(e.get<int64_t>())] = false;
    }
  }
  return Status::ok();
}

}  // namespace

Result<ModelConfig> qwen3_moe_config(const formats::ModelFiles& files) {
  if (files.gguf) {
    LARDER_ASSIGN_OR_RETURN(ModelConfig c, config_from_gguf(*files.gguf));
    LARDER_RETURN_IF_ERROR(moe_from_gguf(*files.gguf, ExpertFfnDefault::kPerUsed, &c));
    c.moe.norm_topk_prob = true;
    return c;
  }
  LARDER_ASSIGN_OR_RETURN(ModelConfig c, config_from_hf(files));
  LARDER_RETURN_IF_ERROR(hf_moe(files.config, &c));
  return c;
}

Result<std::unique_ptr<Model>> load_qwen3_moe(const formats::ModelFiles& files, ModelConfig config) {
  LlamaVariant spec;
  spec.qk_norm = true;
  spec.default_tied = false;
  spec.hf_pairing = kernels::RopePairing::kHalf;
  spec.gguf_pairing = kernels::RopePairing::kHalf;
  spec.route_order = kernels::RouteOrder::kSoftmaxThenTopK;
  spec.route_select = kernels::RouteSelect::kLastK;
  return make_llama_family(files, std::move(config), spec);
}

}  // namespace larder::models
