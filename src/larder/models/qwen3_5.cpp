// qwen3_5.cpp — the Qwen3.5 model file (dense): HF `qwen3_5_text`, the text tower of multimodal
// `qwen3_5` checkpoints, MLX-quantized checkpoints and llama.cpp's GGUF `qwen35`
// (model-families.md §4; oracle: mlx-lm `qwen3_5.py`).
//
//   per layer: x += mixer(input_norm(x));  x += mlp(post_attention_norm(x))   mlp = SwiGLU
//   mixer = gated DeltaNet (blocks/gated_delta.h; state: conv window + f32 matrix) on most layers,
//           gated full attention on layer i iff (i+1) % full_attention_interval == 0 (or as
//           `layer_types` says): q_proj emits [query | gate] per head, q/k RMSNorm per head,
//           partial RoPE (partial_rotary_factor of head_dim, NeoX pairing), o_proj(attn ⊙ σ(gate)).
//
// Source-specific details:
// - Norm gains (input, post-attention, final, q/k norms) are stored as γ − 1 in HF checkpoints;
//   mlx-lm's own saves (and MLX-quantized checkpoints) store γ. mlx-lm tells them apart by the
//   depthwise conv weight — [C, 1, K] as HF stores it, [C, K, 1] once mlx-lm has sanitized — and
//   so does this file. The gated norm of the DeltaNet output is stored as γ in both.
// - Multimodal checkpoints keep the text tower under `model.language_model.` (HF) or
//   `language_model.model.` (mlx-lm), lm_head beside it; vision and MTP tensors are ignored.
// - mrope: text-only positions are equal along its three sections, so it is plain RoPE here.
// - GGUF (llama.cpp's converter): gains stored as γ (it adds the 1, except to the gated norm),
//   A stored as −exp(A_log) (`ssm_a`), conv1d as [C, K], and every per-value-head tensor
//   reordered from grouped-by-key-head to tiled order (GatedDeltaDims::tiled_v_heads).
// - The MoE variant (HF `qwen3_5_moe` / `qwen3_5_moe_text`, MLX-quantized; oracle mlx-lm
//   `qwen3_5_moe.py` over qwen3_next's sparse block): with num_experts > 0 every layer's FFN is
//   routed experts (softmax → top k → renormalised unless norm_topk_prob is false, mlx-lm's default
//   true) plus a shared expert of shared_expert_intermediate_size scaled by σ(shared_expert_gate·x)
//   (blocks/moe_block.h). Experts as HF fuses them (experts.gate_up_proj [E, 2·I, H] +
//   experts.down_proj), per expert, or stacked switch_mlp (MLX); GGUF `qwen35moe` (ffn_*_exps,
//   ffn_{gate,up,down}_shexp, ffn_gate_inp_shexp [hidden]).
// - Qwen3-Next (HF `qwen3_next`, MLX-quantized, GGUF `qwen3next`; oracle mlx-lm `qwen3_next.py`,
//   whose attention, MLP, gated norm and sparse block qwen3_5.py imports) is this graph with:
//   the DeltaNet input projections fused per key head (in_proj_qkvz, in_proj_ba:
//   blocks/gated_delta.h), the layer's FFN routed iff num_experts > 0, the layer is not in
//   mlp_only_layers and (l + 1) % decoder_sparse_step == 0 (else a dense MLP of intermediate_size,
//   as qwen3_moe), RoPE keys at the top level (rope_theta, partial_rotary_factor). Absent
//   norm_topk_prob is true, transformers' Qwen3NextConfig default (mlx-lm's ModelArgs says false;
//   Qwen's configs write true). Its GGUF (convert_hf_to_gguf Qwen3NextModel) splits in_proj_qkvz
//   into attn_qkv + attn_gate (older files: one `ssm_in` = in_proj_qkvz), keeps `ssm_ba` fused and
//   the value heads grouped (no tiling; llama.cpp broadcasts key head h / (H_v/H_k)), gains + 1 and
//   ssm_a as for qwen35; every layer routed and renormalised.
// - GGUF (both): the layer pattern from attention.recurrent_layers where the file has it, else
//   full_attention_interval; multi-token-prediction blocks (nextn_predict_layers, the last
//   blocks) are skipped: not part of the forward.
#include <cmath>

#include "larder/formats/gguf.h"
#include "larder/models/blocks/gated_delta.h"
#include "larder/models/blocks/rope.h"
#include "larder/models/hf_conventions.h"
#include "larder/models/registry.h"
#include "larder/models/transformer.h"

namespace larder::models {

namespace {

using nlohmann::ordered_json;

// mlx-lm's TextModelArgs defaults: configs may omit keys equal to them.
ordered_json qwen3_5_defaults() {
  return {{"hidden_size", 4096},
          {"intermediate_size", 14336},
          {"num_hidden_layers", 32},
          {"num_attention_heads", 32},
          {"rms_norm_eps", 1e-6},
          {"vocab_size", 151936},
          {"num_key_value_heads", 8},
          {"max_position_embeddings", 131072},
          {"linear_num_value_heads", 64},
          {"linear_num_key_heads", 16},
          {"linear_key_head_dim", 192},
          {"linear_value_head_dim", 128},
          {"linear_conv_kernel_dim", 4},
          {"tie_word_embeddings", false},
          {"attention_bias", false},
          {"full_attention_interval", 4},
          {"rope_parameters",
           {{"type", "default"}, {"mrope_section", {11, 11, 10}}, {"rope_theta", 100000}, {"partial_rotary_factor", 0.25}}}};
}

// Qwen3-Next: the optional keys of mlx-lm's ModelArgs and transformers' Qwen3NextConfig (both
// require the shapes; norm_topk_prob is resolved in hf_params).
ordered_json qwen3_next_defaults() {
  return {{"tie_word_embeddings", false},
          {"attention_bias", false},
          {"full_attention_interval", 4},
          {"decoder_sparse_step", 1},
          {"rms_norm_eps", 1e-6},
          {"partial_rotary_factor", 0.25}};
}

bool is_qwen3_next(const std::string& arch) { return arch == "qwen3_next" || arch == "qwen3next"; }

// The text config with RoPE's partial factor lifted out of rope_parameters (where Qwen3.5 and
// transformers 5 keep it) for the shared parser; the mrope keys are dropped (plain RoPE for text,
// see above).
ordered_json text_config(const formats::ModelFiles& files, bool next) {
  ordered_json j = hf_text_config(files, next ? qwen3_next_defaults() : qwen3_5_defaults());
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    ordered_json& rp = j["rope_parameters"];
    if (!j.contains("partial_rotary_factor"))
      j["partial_rotary_factor"] = rp.contains("partial_rotary_factor") ? rp["partial_rotary_factor"] : ordered_json(0.25);
    for (const char* k : {"mrope_section", "mrope_interleaved", "partial_rotary_factor"}) rp.erase(k);
  }
  return j;
}

TensorNames qwen3_5_names() {
  return TensorNames{{{"model.embed_tokens.weight", "token_embd.weight"},
                      {"model.norm.weight", "output_norm.weight"},
                      {"lm_head.weight", "output.weight"}},
                     {{"self_attn.q_proj.", "attn_q."},
                      {"self_attn.k_proj.", "attn_k."},
                      {"self_attn.v_proj.", "attn_v."},
                      {"self_attn.o_proj.", "attn_output."},
                      {"self_attn.q_norm.", "attn_q_norm."},
                      {"self_attn.k_norm.", "attn_k_norm."},
                      {"linear_attn.in_proj_qkv.", "attn_qkv."},
                      {"linear_attn.in_proj_z.", "attn_gate."},
                      {"linear_attn.in_proj_qkvz.", "ssm_in."},  // qwen3next, older converters
                      {"linear_attn.in_proj_ba.", "ssm_ba."},    // qwen3next
                      {"linear_attn.in_proj_b.", "ssm_beta."},
                      {"linear_attn.in_proj_a.", "ssm_alpha."},
                      {"linear_attn.conv1d.", "ssm_conv1d."},
                      {"linear_attn.dt_bias", "ssm_dt.bias"},
                      {"linear_attn.A_log", "ssm_a"},
                      {"linear_attn.norm.", "ssm_norm."},
                      {"linear_attn.out_proj.", "ssm_out."},
                      {"input_layernorm.", "attn_norm."},
                      {"post_attention_layernorm.", "post_attention_norm."},
                      {"mlp.gate_proj.", "ffn_gate."},
                      {"mlp.up_proj.", "ffn_up."},
                      {"mlp.down_proj.", "ffn_down."},
                      // the MoE variant (qwen35moe): router, stacked experts, shared expert and its gate
                      {"mlp.gate.", "ffn_gate_inp."},
                      {"mlp.switch_mlp.gate_proj.", "ffn_gate_exps."},
                      {"mlp.switch_mlp.up_proj.", "ffn_up_exps."},
                      {"mlp.switch_mlp.down_proj.", "ffn_down_exps."},
                      {"mlp.shared_expert.gate_proj.", "ffn_gate_shexp."},
                      {"mlp.shared_expert.up_proj.", "ffn_up_shexp."},
                      {"mlp.shared_expert.down_proj.", "ffn_down_shexp."},
                      {"mlp.shared_expert_gate.", "ffn_gate_inp_shexp."}},
                     "",
                     ""};
}

struct Qwen35Params {
  std::vector<bool> full;  // per layer: full attention (else gated DeltaNet)
  GatedDeltaDims delta;
  ExpertDims experts;          // n_experts > 0: routed experts + a shared expert on the `routed` layers
  std::vector<bool> routed;    // per layer (Qwen3.5: all; Qwen3-Next: decoder_sparse_step, mlp_only_layers)
  bool norm_topk_prob = true;  // mlx-lm's qwen3_5 TextModelArgs default, transformers' qwen3_next one
};

Result<Qwen35Params> hf_params(const ordered_json& j, const ModelConfig& c, bool next) {
  const char* src = c.source.c_str();
  Qwen35Params p;
  auto get_int = [&](const char* k, int* out) -> Status {
    if (!j.contains(k) || !j[k].is_number_integer() || j[k].get<int64_t>() <= 0)
      return invalid_argument(strfmt("[config] %s: '%s' must be a positive integer", src, k));
    *out = j[k].get<int>();
    return Status::ok();
  };
  LARDER_RETURN_IF_ERROR(get_int("linear_num_key_heads", &p.delta.n_k_heads));
  LARDER_RETURN_IF_ERROR(get_int("linear_num_value_heads", &p.delta.n_v_heads));
  LARDER_RETURN_IF_ERROR(get_int("linear_key_head_dim", &p.delta.d_k));
  LARDER_RETURN_IF_ERROR(get_int("linear_value_head_dim", &p.delta.d_v));
  LARDER_RETURN_IF_ERROR(get_int("linear_conv_kernel_dim", &p.delta.conv_kernel));
  if (p.delta.n_v_heads % p.delta.n_k_heads != 0)
    return invalid_argument(strfmt("[config] %s: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d",
                                   src, p.delta.n_v_heads, p.delta.n_k_heads));
  if (j.contains("num_experts") && !j["num_experts"].is_null()) {
    if (!j["num_experts"].is_number_integer() || j["num_experts"].get<int64_t>() < 0)
      return invalid_argument(strfmt("[config] %s: 'num_experts' must be a non-negative integer", src));
    p.experts.n_experts = j["num_experts"].get<int>();
  }
  if (p.experts.n_experts > 0) {
    int shared = 0, ffn = 0;
    LARDER_RETURN_IF_ERROR(get_int("num_experts_per_tok", &p.experts.k));
    LARDER_RETURN_IF_ERROR(get_int("moe_intermediate_size", &ffn));
    LARDER_RETURN_IF_ERROR(get_int("shared_expert_intermediate_size", &shared));
    p.experts.ffn = ffn;
    p.experts.shared_ffn = shared;
    if (p.experts.k > p.experts.n_experts)
      return invalid_argument(strfmt("[config] %s: num_experts_per_tok %d must be in [1, num_experts = %d]", src,
                                     p.experts.k, p.experts.n_experts));
    if (j.contains("norm_topk_prob") && !j["norm_topk_prob"].is_null()) {
      if (!j["norm_topk_prob"].is_boolean())
        return invalid_argument(strfmt("[config] %s: 'norm_topk_prob' must be true or false", src));
      p.norm_topk_prob = j["norm_topk_prob"].get<bool>();
    }
  }
  p.routed.assign(static_cast<size_t>(c.n_layers), p.experts.n_experts > 0);
  if (next && p.experts.n_experts > 0) {  // mlx-lm Qwen3NextDecoderLayer
    int step = 1;
    LARDER_RETURN_IF_ERROR(get_int("decoder_sparse_step", &step));
    for (int64_t l = 0; l < c.n_layers; ++l) p.routed[static_cast<size_t>(l)] = (l + 1) % step == 0;
    if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
      const ordered_json& d = j["mlp_only_layers"];
      if (!d.is_array())
        return invalid_argument(strfmt("[config] %s: 'mlp_only_layers' must be a list of layer indices", src));
      for (const auto& e : d) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= c.n_layers)
          return invalid_argument(strfmt("[config] %s: mlp_only_layers entry %s is not a layer index in [0, %lld)", src,
                                         e.dump().c_str(), (long long)c.n_layers));
        p.routed[static_cast<size_t>(e.get<int64_t>())] = false;
      }
    }
  }
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    const ordered_json& lt = j["layer_types"];
    if (static_cast<int64_t>(lt.size()) != c.n_layers)
      return invalid_argument(strfmt("[config] %s: layer_types has %zu entries for %lld layers", src, lt.size(),
                                     (long long)c.n_layers));
    for (const auto& t : lt) {
      if (t == "full_attention") p.full.push_back(true);
      else if (t == "linear_attention") p.full.push_back(false);
      else return unsupported(strfmt("[config] %s: layer type %s is not supported", src, t.dump().c_str()));
    }
  } else {
    int interval = 4;
    LARDER_RETURN_IF_ERROR(get_int("full_attention_interval", &interval));
    for (int64_t i = 0; i < c.n_layers; ++i) p.full.push_back((i + 1) % interval == 0);
  }
  return p;
}

// llama.cpp's `qwen35` / `qwen3next` metadata (convert_hf_to_gguf: Qwen3_5TextModel,
// Qwen3NextModel): the DeltaNet shapes as its ssm.* keys, the layer pattern as
// attention.recurrent_layers or full_attention_interval.
Result<Qwen35Params> gguf_params(const formats::GgufFile& g, const ModelConfig& c, bool next) {
  const std::string a = c.architecture + ".";
  const char* src = c.source.c_str();
  Qwen35Params p;
  auto need = [&](const char* key, int* out) -> Status {
    const auto v = g.get_int(a + key);
    if (!v || *v <= 0 || *v > (int64_t{1} << 30))
      return invalid_argument(strfmt("[config] %s: GGUF metadata '%s%s' is missing or not a positive integer", src,
                                     a.c_str(), key));
    *out = static_cast<int>(*v);
    return Status::ok();
  };
  int inner = 0;
  LARDER_RETURN_IF_ERROR(need("ssm.conv_kernel", &p.delta.conv_kernel));
  LARDER_RETURN_IF_ERROR(need("ssm.state_size", &p.delta.d_k));
  LARDER_RETURN_IF_ERROR(need("ssm.group_count", &p.delta.n_k_heads));
  LARDER_RETURN_IF_ERROR(need("ssm.time_step_rank", &p.delta.n_v_heads));
  LARDER_RETURN_IF_ERROR(need("ssm.inner_size", &inner));
  if (p.delta.n_v_heads % p.delta.n_k_heads != 0 || inner % p.delta.n_v_heads != 0)
    return invalid_argument(strfmt("[config] %s: GGUF ssm.time_step_rank %d must be a multiple of ssm.group_count %d "
                                   "and divide ssm.inner_size %d",
                                   src, p.delta.n_v_heads, p.delta.n_k_heads, inner));
  p.delta.d_v = inner / p.delta.n_v_heads;
  // qwen35: the converter's grouped → tiled value-head reorder; qwen3next keeps HF's grouped order.
  p.delta.tiled_v_heads = !next;
  // qwen35moe, qwen3next: every layer routed, renormalised (llama.cpp's graphs pass norm_w = true),
  // with the shared expert.
  if (const auto E = g.get_int(a + "expert_count"); E && *E > 0) {
    const auto k = g.get_int(a + "expert_used_count");
    if (!k || *k < 1 || *k > *E || *E > (int64_t{1} << 20))
      return invalid_argument(strfmt("[config] %s: GGUF metadata '%sexpert_used_count' must be in [1, "
                                     "expert_count = %lld]",
                                     src, a.c_str(), (long long)*E));
    p.experts.n_experts = static_cast<int>(*E);
    p.experts.k = static_cast<int>(*k);
    p.experts.ffn = g.get_int(a + "expert_feed_forward_length").value_or(c.ffn / *k);
    p.experts.shared_ffn = g.get_int(a + "expert_shared_feed_forward_length").value_or(c.ffn);
    if (p.experts.ffn < 1 || p.experts.shared_ffn < 1)
      return invalid_argument(strfmt("[config] %s: GGUF expert feed-forward lengths must be positive", src));
    p.norm_topk_prob = true;
  }
  p.routed.assign(static_cast<size_t>(c.n_layers), p.experts.n_experts > 0);
  // The converter writes attention.recurrent_layers (a bool per layer) when the config has
  // layer_types; llama.cpp's loader takes it before full_attention_interval.
  // With multi-token-prediction blocks the list covers them too (block_count; see qwen3_5_config).
  if (const formats::GgufValue* rl = g.find(a + "attention.recurrent_layers"); rl != nullptr) {
    const int64_t all = c.n_layers + g.get_int(a + "nextn_predict_layers").value_or(0);
    if (!rl->is_array() || static_cast<int64_t>(rl->ints.size()) != all)
      return invalid_argument(strfmt("[config] %s: GGUF %sattention.recurrent_layers must hold one bool per block (%lld)",
                                     src, a.c_str(), (long long)all));
    for (int64_t l = 0; l < c.n_layers; ++l) p.full.push_back(rl->ints[static_cast<size_t>(l)] == 0);
    return p;
  }
  const int64_t interval = g.get_int(a + "full_attention_interval").value_or(4);
  if (interval < 1) return invalid_argument(strfmt("[config] %s: GGUF full_attention_interval must be >= 1", src));
  for (int64_t i = 0; i < c.n_layers; ++i) p.full.push_back((i + 1) % interval == 0);
  return p;
}

struct Layer {
  RmsNorm input_norm, post_attn_norm;
  AttentionWeights attn;     // full-attention layers
  GatedDeltaWeights delta;   // gated-DeltaNet layers
  MlpWeights mlp;            // FfnKind::kDense
  MoeWeights moe;            // FfnKind::kRoutedExperts
};

class Qwen35Model final : public Transformer {
 public:
  explicit Qwen35Model(ModelConfig c) : Transformer(std::move(c)) {}
  Status bind(const formats::ModelFiles& files);

 private:
  void layer_forward(int l, const LayerBatch& b) override;
  std::vector<Layer> layers_;
  GatedDeltaScratch delta_s_;
  MoeScratch moe_s_;
};

// mlx-lm's test (qwen3_5.py sanitize): a depthwise conv weight whose last dimension is not 1 is
// in HF layout, whose norm gains are γ − 1.
NormGain gain_convention(const formats::ModelFiles& files) {
  for (const auto& t : files.tensors().tensors()) {
    const std::string& n = t.name;
    if (n.find("conv1d.weight") != std::string::npos && t.rank() == 3 && t.dim(2) != 1) return NormGain::kOnePlus;
  }
  return NormGain::kAsStored;
}

Status Qwen35Model::bind(const formats::ModelFiles& files) {
  const ModelConfig& c = cfg_;
  const bool gguf = c.from_gguf;
  const bool next = is_qwen3_next(c.architecture);
  Qwen35Params qp;
  if (gguf) {
    LARDER_ASSIGN_OR_RETURN(qp, gguf_params(*files.gguf, c, next));
  } else {
    LARDER_ASSIGN_OR_RETURN(qp, hf_params(text_config(files, next), c, next));
  }
  TensorNames names = qwen3_5_names();
  use_text_tower_prefix(files, &names);
  // llama.cpp's converter adds 1 to every norm but the DeltaNet's gated one, like mlx-lm's sanitize.
  const NormGain gain = gguf ? NormGain::kAsStored : gain_convention(files);
  WeightBinder b(files, names);
  if (gguf) {  // the multi-token-prediction blocks after the trunk are not run (qwen3_5_config)
    const int64_t nextn = files.gguf->get_int(c.architecture + ".nextn_predict_layers").value_or(0);
    for (int64_t l = c.n_layers; l < c.n_layers + nextn; ++l) b.ignore_prefix(strfmt("blk.%lld.", (long long)l));
  }
  LARDER_ASSIGN_OR_RETURN(const bool tied, bind_head(b, /*family_default=*/false));
  apply_gain(final_norm_.weight, gain);
  attn_opt_.pairing = kernels::RopePairing::kHalf;
  // yarn's attention factor is applied by the families whose reference uses it (llama, gpt_oss).
  if (c.rope_scaling.type == "yarn")
    return unsupported(strfmt("[model] %s: rope_scaling type 'yarn' is not supported for this architecture",
                              c.source.c_str()));
  rope_tables_ = {rope_inv_freq(c)};
  const float eps = static_cast<float>(c.rms_eps);

  layers_.resize(static_cast<size_t>(c.n_layers));
  specs_.clear();
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const bool full = qp.full[static_cast<size_t>(l)];
    LayerSpec spec;
    spec.kind = full ? LayerKind::kFull : LayerKind::kGatedDelta;
    if (full) {
      spec.n_heads = static_cast<int>(c.n_heads);
      spec.n_kv_heads = static_cast<int>(c.n_kv_heads);
      spec.head_dim = static_cast<int>(c.head_dim);
      spec.rope_dim = static_cast<int>(c.rope_dim);
      spec.rope = 0;
      spec.attn_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
      spec.norms.qk = true;
      spec.attn_gate = true;
    } else {
      spec.delta = qp.delta;
    }
    if (qp.routed[static_cast<size_t>(l)]) {
      spec.ffn = FfnKind::kRoutedExperts;
      spec.experts = qp.experts;
    }
    declare_state(spec);
    specs_.push_back(spec);

    const std::string p = strfmt("model.layers.%lld.", static_cast<long long>(l));
    Layer& L = layers_[static_cast<size_t>(l)];
    LARDER_ASSIGN_OR_RETURN(L.input_norm.weight, b.vector(p + "input_layernorm.weight", c.hidden, "hidden_size"));
    LARDER_ASSIGN_OR_RETURN(L.post_attn_norm.weight,
                            b.vector(p + "post_attention_layernorm.weight", c.hidden, "hidden_size"));
    apply_gain(L.input_norm.weight, gain);
    apply_gain(L.post_attn_norm.weight, gain);
    L.input_norm.eps = L.post_attn_norm.eps = eps;
    if (full) {
      LARDER_RETURN_IF_ERROR(bind_attention(b, p + "self_attn.", spec, c, attn_opt_, &L.attn));
      apply_gain(L.attn.q_norm.weight, gain);
      apply_gain(L.attn.k_norm.weight, gain);
    } else {
      LARDER_RETURN_IF_ERROR(bind_gated_delta(b, p + "linear_attn.", spec, c.hidden, eps, /*a_log_is_a=*/gguf, &L.delta));
    }
    if (spec.ffn == FfnKind::kRoutedExperts) {
      kernels::RouteParams route;  // qwen3_next's sparse block: softmax, top k, renormalised
      route.order = kernels::RouteOrder::kSoftmaxThenTopK;
      route.select = kernels::RouteSelect::kLastK;
      route.renormalize = qp.norm_topk_prob;
      LARDER_RETURN_IF_ERROR(bind_moe(b, p + "mlp.", spec.experts, c.hidden, route, Activation::kSilu, &L.moe));
      count_experts(L.moe);
    } else {
      LARDER_RETURN_IF_ERROR(bind_mlp(b, p + "mlp.", c, Activation::kSilu, &L.mlp));
    }
  }
  return finish_bind(files, b, tied);
}

void Qwen35Model::layer_forward(int l, const LayerBatch& b) {
  const Layer& L = layers_[static_cast<size_t>(l)];
  const LayerSpec& spec = specs_[static_cast<size_t>(l)];
  const int64_t n = b.rows * cfg_.hidden;
  L.input_norm.apply(b.x, b.rows, b.h);
  if (spec.kind == LayerKind::kGatedDelta) {
    gated_delta_block(
        {.spec = &spec, .w = &L.delta, .layer = l, .h = b.h, .rows = b.rows, .seqs = b.seqs, .adapters = b.adapters},
        delta_s_, b.o);
  } else {
    attend(l, L.attn, b, b.h, b.o);
  }
  kernels::add(b.x, b.o, b.x, n);
  L.post_attn_norm.apply(b.x, b.rows, b.h);
  if (spec.ffn == FfnKind::kRoutedExperts) moe_block(L.moe, b.h, b.rows, moe_s_, b.o, b.adapters);
  else mlp_block(L.mlp, b.h, b.rows, mlp_s_, b.o, b.adapters);
  kernels::add(b.x, b.o, b.x, n);
}

}  // namespace

Result<ModelConfig> qwen3_5_config(const formats::ModelFiles& files) {
  if (files.gguf) {
    // llama.cpp's converter appends the checkpoint's multi-token-prediction block(s) (mtp.*) as
    // the last blocks, counted in block_count and named by nextn_predict_layers (on by default
    // since --no-mtp exists); the trunk is the blocks before them, and they are not run here.
    LARDER_ASSIGN_OR_RETURN(ModelConfig c, config_from_gguf(*files.gguf));
    const int64_t nextn = files.gguf->get_int(c.architecture + ".nextn_predict_layers").value_or(0);
    if (nextn < 0 || nextn >= c.n_layers)
      return invalid_argument(strfmt("[config] %s: GGUF %s.nextn_predict_layers %lld must be in [0, block_count = %lld)",
                                     c.source.c_str(), c.architecture.c_str(), (long long)nextn, (long long)c.n_layers));
    c.n_layers -= nextn;
    return c;
  }
  LARDER_ASSIGN_OR_RETURN(const std::string arch, architecture_of(files));
  return config_from_hf_json(files, text_config(files, is_qwen3_next(arch)));
}

Result<std::unique_ptr<Model>> load_qwen3_5(const formats::ModelFiles& files, ModelConfig config) {
  auto m = std::make_unique<Qwen35Model>(std::move(config));
  LARDER_RETURN_IF_ERROR(m->bind(files));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace larder::models
