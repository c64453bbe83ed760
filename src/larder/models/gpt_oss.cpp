// gpt_oss.cpp — the gpt_oss model file (OpenAI gpt-oss-20b / 120b; GGUF `gpt-oss`). Oracles:
// mlx-lm `gpt_oss.py`, transformers `modeling_gpt_oss.py`, llama.cpp `src/models/openai-moe.cpp`.
//   per layer: x += o(attn(rmsnorm(x)))  — q/k/v/o with biases, NeoX RoPE with yarn scaling,
//                                          attention sinks (a learned logit per head in the softmax
//                                          denominator), sliding-window (layer_types) or full;
//              x += moe(rmsnorm(x))      — router with a bias, top-k of the logits then softmax over
//                                          the k, experts with biases and the clamped SwiGLU
//                                          (blocks/moe_block.h Activation::kSwigluOai)
//
// Source-specific details:
// - config.json: num_local_experts, num_experts_per_tok (or the original `experts_per_token`) and
//   sliding_window are required; layer_types defaults to transformers' (even layers sliding, odd
//   full); intermediate_size is each expert's; swiglu_limit (7.0) is read, alpha is the fixed
//   1.702 of both references. yarn per rope_scaling (models/blocks/rope.h), including its
//   attention factor on the softmax scale.
// - Experts: mlx-lm's layout (its sanitize splits HF's interleaved gate_up_proj) — stacked
//   mlp.experts.{gate,up,down}_proj.{weight,bias}, also MLX affine-quantized — bound in place;
//   transformers' dequantized layout — mlp.experts.gate_up_proj [E, hidden, 2·ffn] with gate and up
//   interleaved along the last axis (gate = [..., ::2], up = [..., 1::2]) and down_proj
//   [E, ffn, hidden], i.e. in × out — cannot be viewed as [out, in] rows, so it is transposed once
//   at load into an f32 copy (MoeWeights::owned_f32; use the MLX or GGUF layout for large models).
// - MXFP4 experts: GGUF type MXFP4 and MLX `mode: "mxfp4"` stacked experts bind like any weight
//   format (WeightBinder::experts). OpenAI's HF layout (openai/gpt-oss-*: `experts.*_proj_blocks` /
//   `_scales`, quantization_config.quant_method "mxfp4") holds MLX mxfp4's bytes with gate and up
//   rows interleaved: bound in place by bind_moe (WeightBinder::mxfp4_block_experts, gate/up run
//   fused as MoeWeights::gate_up).
// - GGUF (llama.cpp): layer l is sliding iff l is even (its set_swa_pattern(2)), window
//   `attention.sliding_window`; expert_count / expert_used_count / expert_feed_forward_length;
//   sinks `attn_sinks.weight`, the FFN norm `post_attention_norm`, biases `*.bias` beside each
//   weight; rope scaling yarn with `rope.scaling.factor` / `original_context_length`.
#include <cmath>

#include "larder/models/blocks/moe_block.h"
#include "larder/models/blocks/rope.h"
#include "larder/models/registry.h"
#include "larder/models/transformer.h"

namespace larder::models {

namespace {

using nlohmann::ordered_json;

const TensorNames& gpt_oss_names() {
  static const TensorNames n{
      {{"model.embed_tokens.weight", "token_embd.weight"},
       {"model.norm.weight", "output_norm.weight"},
       {"lm_head.weight", "output.weight"}},
      {{"self_attn.q_proj.", "attn_q."},
       {"self_attn.k_proj.", "attn_k."},
       {"self_attn.v_proj.", "attn_v."},
       {"self_attn.o_proj.", "attn_output."},
       {"self_attn.sinks", "attn_sinks.weight"},
       {"input_layernorm.", "attn_norm."},
       {"post_attention_layernorm.", "post_attention_norm."},
       {"mlp.router.", "ffn_gate_inp."},
       {"mlp.experts.gate_proj.", "ffn_gate_exps."},
       {"mlp.experts.up_proj.", "ffn_up_exps."},
       {"mlp.experts.down_proj.", "ffn_down_exps."}},
      "",
      ""};
  return n;
}

// What gpt-oss adds to the shared hyper-parameters.
struct GptOssParams {
  std::vector<bool> sliding;  // per layer
  int64_t window = 0;
  float swiglu_limit = 7.0f;
};

Result<GptOssParams> gpt_oss_params(const formats::ModelFiles& files, const ModelConfig& c) {
  GptOssParams p;
  const char* src = c.source.c_str();
  if (files.gguf) {
    const std::string a = c.architecture + ".";
    const auto w = files.gguf->get_int(a + "attention.sliding_window");
    if (!w || *w < 1)
      return invalid_argument(strfmt("[config] %s: GGUF metadata '%sattention.sliding_window' must be present and >= 1",
                                     src, a.c_str()));
    p.window = *w;
    for (int64_t l = 0; l < c.n_layers; ++l) p.sliding.push_back(l % 2 == 0);
    return p;
  }
  const ordered_json& j = files.config;
  if (!j.contains("sliding_window") || !j["sliding_window"].is_number_integer() || j["sliding_window"].get<int64_t>() < 1)
    return invalid_argument(strfmt("[config] %s: 'sliding_window' must be a positive integer", src));
  p.window = j["sliding_window"].get<int64_t>();
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const ordered_json& lt = j["layer_types"];
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.n_layers)
      return invalid_argument(strfmt("[config] %s: 'layer_types' must list num_hidden_layers = %lld entries", src,
                                     (long long)c.n_layers));
    for (const auto& t : lt) {
      if (t == "sliding_attention") p.sliding.push_back(true);
      else if (t == "full_attention") p.sliding.push_back(false);
      else return unsupported(strfmt("[config] %s: layer type %s is not supported (sliding_attention, full_attention)",
                                     src, t.dump().c_str()));
    }
  } else {
    for (int64_t l = 0; l < c.n_layers; ++l) p.sliding.push_back((l + 1) % 2 != 0);
  }
  if (j.contains("swiglu_limit") && !j["swiglu_limit"].is_null()) {
    if (!j["swiglu_limit"].is_number() || !(j["swiglu_limit"].get<double>() > 0))
      return invalid_argument(strfmt("[config] %s: 'swiglu_limit' must be a positive number", src));
    p.swiglu_limit = j["swiglu_limit"].get<float>();
  }
  return p;
}

Status hf_moe(const ordered_json& j, ModelConfig* c) {
  const char* src = c->source.c_str();
  MoeConfig& m = c->moe;
  auto get = [&](const char* k, int64_t* out) -> bool {
    if (!j.contains(k) || !j[k].is_number_integer()) return false;
    *out = j[k].get<int64_t>();
    return true;
  };
  if (!get("num_local_experts", &m.n_experts) || m.n_experts < 1 || m.n_experts > (int64_t{1} << 20))
    return invalid_argument(strfmt("[config] %s: 'num_local_experts' must be a positive integer", src));
  if ((!get("num_experts_per_tok", &m.n_used) && !get("experts_per_token", &m.n_used)) || m.n_used < 1 ||
      m.n_used > m.n_experts)
    return invalid_argument(strfmt("[config] %s: 'num_experts_per_tok' must be in [1, num_local_experts = %lld]", src,
                                   (long long)m.n_experts));
  m.ffn = c->ffn;  // intermediate_size is each expert's
  m.routed.assign(static_cast<size_t>(c->n_layers), true);
  return Status::ok();
}

struct Layer {
  RmsNorm attn_norm, ffn_norm;
  AttentionWeights attn;
  MoeWeights moe;
};

class GptOssModel final : public Transformer {
 public:
  explicit GptOssModel(ModelConfig c) : Transformer(std::move(c)) {}
  Status bind(const formats::ModelFiles& files);

 private:
  void layer_forward(int l, const LayerBatch& b) override;
  Status hf_experts(WeightBinder& b, const std::string& p, const ExpertDims& d, MoeWeights* w);
  std::vector<Layer> layers_;
  MoeScratch moe_s_;
};

// transformers' dequantized experts, [E, in, out] with gate/up interleaved along `out`: transposed
// into [out, in] rows of an f32 copy (gate, up, down one after another) that the views read.
Status GptOssModel::hf_experts(WeightBinder& b, const std::string& p, const ExpertDims& d, MoeWeights* w) {
  const int64_t E = d.n_experts, I = d.ffn, H = cfg_.hidden;
  LARDER_ASSIGN_OR_RETURN(const std::vector<float> gu,
                          b.small_f32(p + "experts.gate_up_proj", {E, H, 2 * I},
                                      "num_local_experts x hidden_size x 2*intermediate_size"));
  LARDER_ASSIGN_OR_RETURN(const std::vector<float> gub, b.small_f32(p + "experts.gate_up_proj_bias", {E, 2 * I},
                                                                   "num_local_experts x 2*intermediate_size"));
  LARDER_ASSIGN_OR_RETURN(const std::vector<float> dn, b.small_f32(p + "experts.down_proj", {E, I, H},
                                                                  "num_local_experts x intermediate_size x hidden_size"));
  LARDER_ASSIGN_OR_RETURN(w->down_bias, b.small_f32(p + "experts.down_proj_bias", {E, H}, "num_local_experts x hidden_size"));
  const int64_t m = I * H;  // elements of one expert's matrix
  w->owned_f32.assign(static_cast<size_t>(3 * E * m), 0.0f);
  float* const gate = w->owned_f32.data();
  float* const up = gate + E * m;
  float* const down = up + E * m;
  w->gate_bias.resize(static_cast<size_t>(E * I));
  w->up_bias.resize(static_cast<size_t>(E * I));
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t h = 0; h < H; ++h) {
      const float* src = gu.data() + (e * H + h) * 2 * I;
      for (int64_t i = 0; i < I; ++i) {
        gate[e * m + i * H + h] = src[2 * i];
        up[e * m + i * H + h] = src[2 * i + 1];
      }
    }
    for (int64_t i = 0; i < I; ++i) {
      w->gate_bias[static_cast<size_t>(e * I + i)] = gub[static_cast<size_t>(e * 2 * I + 2 * i)];
      w->up_bias[static_cast<size_t>(e * I + i)] = gub[static_cast<size_t>(e * 2 * I + 2 * i + 1)];
      for (int64_t h = 0; h < H; ++h) down[e * m + h * I + i] = dn[static_cast<size_t>((e * I + i) * H + h)];
    }
  }
  auto views = [&](float* base, int64_t rows, int64_t cols, std::vector<kernels::WeightView>* out) {
    out->resize(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      kernels::WeightView& v = (*out)[static_cast<size_t>(e)];
      v.dtype = DType::kF32;
      v.rows = rows;
      v.cols = cols;
      v.data = reinterpret_cast<const uint8_t*>(base + e * m);
    }
  };
  views(gate, I, H, &w->gate);
  views(up, I, H, &w->up);
  views(down, H, I, &w->down);
  return Status::ok();
}

Status GptOssModel::bind(const formats::ModelFiles& files) {
  WeightBinder b(files, gpt_oss_names());
  const ModelConfig& c = cfg_;
  LARDER_ASSIGN_OR_RETURN(const GptOssParams gp, gpt_oss_params(files, c));
  const float eps = static_cast<float>(c.rms_eps);
  LARDER_ASSIGN_OR_RETURN(const bool tied, bind_head(b, /*family_default=*/false));
  attn_opt_.qkv_bias = true;  // every reference has q/k/v/o biases (o through attention_bias)
  attn_opt_.pairing = kernels::RopePairing::kHalf;  // HF, mlx-lm (traditional=False) and llama.cpp (NEOX)
  const double af = rope_attention_factor(c);
  kernels::RouteParams route;
  route.order = kernels::RouteOrder::kTopKThenSoftmax;
  route.select = kernels::RouteSelect::kLastK;
  MoeTensorNames moe_names;
  moe_names.router = "router";
  moe_names.stacked = "experts.";
  moe_names.biases = true;
  specs_.clear();
  layers_.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = strfmt("model.layers.%lld.", static_cast<long long>(l));
    Layer& L = layers_[static_cast<size_t>(l)];
    LayerSpec spec;
    spec.kind = gp.sliding[static_cast<size_t>(l)] ? LayerKind::kSliding : LayerKind::kFull;
    spec.window = spec.kind == LayerKind::kSliding ? gp.window : 0;
    spec.n_heads = static_cast<int>(c.n_heads);
    spec.n_kv_heads = static_cast<int>(c.n_kv_heads);
    spec.head_dim = static_cast<int>(c.head_dim);
    spec.rope_dim = static_cast<int>(c.rope_dim);
    spec.rope = 0;
    // yarn multiplies q and k by its attention factor (the scores by its square).
    spec.attn_scale = static_cast<float>(af * af / std::sqrt(static_cast<double>(c.head_dim)));
    spec.ffn = FfnKind::kRoutedExperts;
    spec.experts = ExpertDims{static_cast<int>(c.moe.n_experts), static_cast<int>(c.moe.n_used), c.moe.ffn};
    declare_state(spec);
    specs_.push_back(spec);
    LARDER_ASSIGN_OR_RETURN(L.attn_norm.weight, b.vector(p + "input_layernorm.weight", c.hidden, "hidden_size"));
    LARDER_ASSIGN_OR_RETURN(L.ffn_norm.weight, b.vector(p + "post_attention_layernorm.weight", c.hidden, "hidden_size"));
    L.attn_norm.eps = L.ffn_norm.eps = eps;
    LARDER_RETURN_IF_ERROR(bind_attention(b, p + "self_attn.", spec, c, attn_opt_, &L.attn));
    LARDER_ASSIGN_OR_RETURN(L.attn.sinks, b.vector(p + "self_attn.sinks", c.n_heads, "num_attention_heads"));
    const std::string mp = p + "mlp.";
    MoeTensorNames names = moe_names;
    if (!b.has(mp + "experts.gate_proj.weight") && b.has(mp + "experts.gate_up_proj")) {
      LARDER_RETURN_IF_ERROR(hf_experts(b, mp, spec.experts, &L.moe));
      names.experts_bound = true;
    }
    LARDER_RETURN_IF_ERROR(bind_moe(b, mp, spec.experts, c.hidden, route, Activation::kSwigluOai, &L.moe, names));
    L.moe.swiglu_limit = gp.swiglu_limit;
    count_experts(L.moe);
  }
  rope_tables_ = {rope_inv_freq(c)};
  return finish_bind(files, b, tied);
}

void GptOssModel::layer_forward(int l, const LayerBatch& b) {
  const Layer& L = layers_[static_cast<size_t>(l)];
  const int64_t n = b.rows * cfg_.hidden;
  L.attn_norm.apply(b.x, b.rows, b.h);
  attend(l, L.attn, b, b.h, b.o);
  kernels::add(b.x, b.o, b.x, n);
  L.ffn_norm.apply(b.x, b.rows, b.h);
  moe_block(L.moe, b.h, b.rows, moe_s_, b.o, b.adapters);
  kernels::add(b.x, b.o, b.x, n);
}

}  // namespace

Result<ModelConfig> gpt_oss_config(const formats::ModelFiles& files) {
  if (files.gguf) {
    LARDER_ASSIGN_OR_RETURN(ModelConfig c, config_from_gguf(*files.gguf));
    LARDER_RETURN_IF_ERROR(moe_from_gguf(*files.gguf, ExpertFfnDefault::kWhole, &c));
    c.attention_bias = true;
    LARDER_RETURN_IF_ERROR(gpt_oss_params(files, c).status());
    return c;
  }
  LARDER_ASSIGN_OR_RETURN(ModelConfig c, config_from_hf(files));
  // transformers' GptOssConfig defaults attention_bias to true; mlx-lm always has the biases.
  if (!files.config.contains("attention_bias") || files.config["attention_bias"].is_null()) c.attention_bias = true;
  if (!c.attention_bias)
    return unsupported(strfmt("[config] %s: attention_bias false is not a gpt-oss model (its reference has q/k/v/o "
                              "biases)", c.source.c_str()));
  LARDER_RETURN_IF_ERROR(hf_moe(files.config, &c));
  LARDER_RETURN_IF_ERROR(gpt_oss_params(files, c).status());
  return c;
}

Result<std::unique_ptr<Model>> load_gpt_oss(const formats::ModelFiles& files, ModelConfig config) {
  auto m = std::make_unique<GptOssModel>(std::move(config));
  LARDER_RETURN_IF_ERROR(m->bind(files));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace larder::models
