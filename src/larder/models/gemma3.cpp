// gemma3.cpp — the Gemma 3 model file: HF `gemma3_text`, the text tower of multimodal `gemma3`
// checkpoints, and GGUF `gemma3` (model-families.md §2).
//
//   x = embed(tokens) · √hidden
//   per layer: x += post_attention_norm(attn(input_norm(x)))
//              x += post_feedforward_norm(mlp(pre_feedforward_norm(x)))     mlp = GeGLU (tanh GELU)
//   logits = embed(final_norm(x))                                             tied embeddings
//            (a checkpoint's own lm_head.weight is used when it has one: Transformer::bind_head)
// Layers are sliding-window (a ring of the window, RoPE base rope_local_base_freq, never scaled)
// or global (plain KV, rope_theta with rope_scaling), by `layer_types` or else
// `sliding_window_pattern` (layer i global iff (i+1) % pattern == 0). q and k are RMS-normed per
// head before RoPE; the softmax scale is query_pre_attn_scalar^-0.5.
//
// Source-specific details:
// - RMSNorm gains are (1 + w) in HF checkpoints (computed once here, in f32 as transformers does).
//   llama.cpp's converter writes `w + 1` into the GGUF (every *norm.weight, q/k norms included)
//   and runs a plain RMSNorm, so GGUF gains are used as stored.
// - Embedding scale: mlx-lm and transformers round √hidden to bf16 (the weight dtype of every
//   released checkpoint: 640 → 25.25); llama.cpp multiplies by f32 sqrtf(hidden). Each source
//   follows its own reference.
// - GGUF has no key for query_pre_attn_scalar or rope_local_base_freq: llama.cpp uses
//   1/√head_dim (1/√(hidden/heads) on the 62-layer 27B) and base 10000; so does this file.
// - RoPE pairs (i, i + d/2) in both sources (llama.cpp: NeoX rope for gemma3).
#include <cmath>

#include "larder/core/dtype.h"
#include "larder/models/blocks/rope.h"
#include "larder/models/blocks/sandwich.h"
#include "larder/models/hf_conventions.h"
#include "larder/models/registry.h"
#include "larder/models/transformer.h"

namespace larder::models {

namespace {

using nlohmann::ordered_json;

// HF → llama.cpp GGUF names. Unlike Llama, HF `post_attention_layernorm` is the norm on the
// attention output (GGUF `post_attention_norm`), and the MLP's input norm is
// `pre_feedforward_layernorm` (GGUF `ffn_norm`).
TensorNames gemma3_names() {
  return TensorNames{{{"model.embed_tokens.weight", "token_embd.weight"},
                      {"model.norm.weight", "output_norm.weight"},
                      {"lm_head.weight", "output.weight"}},
                     {{"self_attn.q_proj.", "attn_q."},
                      {"self_attn.k_proj.", "attn_k."},
                      {"self_attn.v_proj.", "attn_v."},
                      {"self_attn.o_proj.", "attn_output."},
                      {"self_attn.q_norm.", "attn_q_norm."},
                      {"self_attn.k_norm.", "attn_k_norm."},
                      {"input_layernorm.", "attn_norm."},
                      {"post_attention_layernorm.", "post_attention_norm."},
                      {"pre_feedforward_layernorm.", "ffn_norm."},
                      {"post_feedforward_layernorm.", "post_ffw_norm."},
                      {"mlp.gate_proj.", "ffn_gate."},
                      {"mlp.up_proj.", "ffn_up."},
                      {"mlp.down_proj.", "ffn_down."}},
                     "",
                     ""};
}

// Gemma3TextConfig's defaults (transformers): released configs, and above all the text_config
// of multimodal checkpoints, omit keys equal to them.
ordered_json gemma3_defaults() {
  return {{"vocab_size", 262208},        {"hidden_size", 2304},           {"intermediate_size", 9216},
          {"num_hidden_layers", 26},     {"num_attention_heads", 8},      {"num_key_value_heads", 4},
          {"head_dim", 256},             {"rms_norm_eps", 1e-6},          {"rope_theta", 1000000.0},
          {"max_position_embeddings", 131072}, {"query_pre_attn_scalar", 256}, {"sliding_window", 4096},
          {"rope_local_base_freq", 10000.0}, {"sliding_window_pattern", 6}, {"tie_word_embeddings", true},
          {"hidden_activation", "gelu_pytorch_tanh"}};
}

// The text model's config object (hf_conventions.h: text_config nesting) over the defaults.
ordered_json text_config(const formats::ModelFiles& files) {
  ordered_json j = hf_text_config(files, gemma3_defaults());
  // transformers >= 5 keeps RoPE per layer type: the global layers' entry is the model's
  // rope_theta / rope_scaling (the sliding entry is read by hf_params).
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
      j["rope_parameters"].contains("full_attention")) {
    const ordered_json full = j["rope_parameters"]["full_attention"];
    if (full.contains("rope_theta")) j["rope_theta"] = full["rope_theta"];
    j["rope_scaling"] = full;
    j.erase("rope_parameters");
  }
  return j;
}

struct Gemma3Params {
  std::vector<bool> sliding;  // per layer
  int64_t window = 0;
  double local_base = 10000.0;
  double attn_scale = 0;
};

Result<Gemma3Params> hf_params(const formats::ModelFiles& files, const ModelConfig& c) {
  const ordered_json j = text_config(files);
  const char* src = c.source.c_str();
  Gemma3Params p;
  auto num = [&](const char* k, double* out) -> Status {
    if (!j.contains(k) || j[k].is_null()) return Status::ok();
    if (!j[k].is_number()) return invalid_argument(strfmt("[config] %s: '%s' must be a number", src, k));
    *out = j[k].get<double>();
    return Status::ok();
  };
  double window = 0, pattern = 6, qpas = 256;
  LARDER_RETURN_IF_ERROR(num("sliding_window", &window));
  LARDER_RETURN_IF_ERROR(num("sliding_window_pattern", &pattern));
  LARDER_RETURN_IF_ERROR(num("query_pre_attn_scalar", &qpas));
  LARDER_RETURN_IF_ERROR(num("rope_local_base_freq", &p.local_base));
  // transformers >= 5: per-layer-type rope parameters.
  const ordered_json& top = files.config.contains("text_config") ? files.config["text_config"] : files.config;
  if (top.contains("rope_parameters") && top["rope_parameters"].is_object() &&
      top["rope_parameters"].contains("sliding_attention")) {
    const ordered_json& s = top["rope_parameters"]["sliding_attention"];
    if (s.contains("rope_theta") && s["rope_theta"].is_number()) p.local_base = s["rope_theta"].get<double>();
  }
  for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    if (j.contains(k) && !j[k].is_null())
      return unsupported(strfmt("[config] %s: '%s' is set; Gemma 3 has no soft-capping (is this Gemma 2?)", src, k));
  }
  if (j.contains("hidden_activation") && j["hidden_activation"] != "gelu_pytorch_tanh")
    return unsupported(strfmt("[config] %s: hidden_activation %s is not supported (gelu_pytorch_tanh)", src,
                              j["hidden_activation"].dump().c_str()));
  if (!(window >= 1) || !(qpas > 0) || !(p.local_base > 0))
    return invalid_argument(strfmt("[config] %s: sliding_window, query_pre_attn_scalar and rope_local_base_freq must be "
                                   "positive",
                                   src));
  p.window = static_cast<int64_t>(window);
  p.attn_scale = 1.0 / std::sqrt(qpas);
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    const ordered_json& lt = j["layer_types"];
    if (static_cast<int64_t>(lt.size()) != c.n_layers)
      return invalid_argument(strfmt("[config] %s: layer_types has %zu entries for %lld layers", src, lt.size(),
                                     (long long)c.n_layers));
    for (const auto& t : lt) {
      if (t == "sliding_attention") p.sliding.push_back(true);
      else if (t == "full_attention") p.sliding.push_back(false);
      else return unsupported(strfmt("[config] %s: layer type %s is not supported", src, t.dump().c_str()));
    }
  } else {
    const int64_t pat = static_cast<int64_t>(pattern);
    if (pat < 1) return invalid_argument(strfmt("[config] %s: sliding_window_pattern must be >= 1", src));
    for (int64_t i = 0; i < c.n_layers; ++i) p.sliding.push_back((i + 1) % pat != 0);
  }
  return p;
}

Gemma3Params gguf_params(const formats::GgufFile& g, const ModelConfig& c) {
  Gemma3Params p;
  const std::string a = c.architecture;
  p.window = g.get_int(a + ".attention.sliding_window").value_or(512);
  const int64_t pat = g.get_int(a + ".attention.sliding_window_pattern").value_or(6);
  for (int64_t i = 0; i < c.n_layers; ++i) p.sliding.push_back(pat > 0 && (i + 1) % pat != 0);
  p.local_base = 10000.0;
  const double d = c.n_layers == 62 ? static_cast<double>(c.hidden) / static_cast<double>(c.n_heads)
                                    : static_cast<double>(c.head_dim);
  p.attn_scale = 1.0 / std::sqrt(d);
  return p;
}

struct Layer {
  SandwichNorms norms;
  AttentionWeights attn;
  MlpWeights mlp;
};

class Gemma3Model final : public Transformer {
 public:
  explicit Gemma3Model(ModelConfig c) : Transformer(std::move(c)) {}
  Status bind(const formats::ModelFiles& files);

 private:
  void layer_forward(int l, const LayerBatch& b) override;
  std::vector<Layer> layers_;
};

Status Gemma3Model::bind(const formats::ModelFiles& files) {
  const ModelConfig& c = cfg_;
  const bool gguf = c.from_gguf;
  Gemma3Params gp;
  if (gguf) {
    gp = gguf_params(*files.gguf, c);
  } else {
    LARDER_ASSIGN_OR_RETURN(gp, hf_params(files, c));
  }
  TensorNames names = gemma3_names();
  use_text_tower_prefix(files, &names);  // multimodal checkpoints keep the text tower under a prefix
  // HF stores (gain − 1); llama.cpp's converter writes the gain.
  const NormGain gain = gguf ? NormGain::kAsStored : NormGain::kOnePlus;
  WeightBinder b(files, names);
  LARDER_ASSIGN_OR_RETURN(const bool tied, bind_head(b, /*family_default=*/true));
  apply_gain(final_norm_.weight, gain);
  embed_scale_ = gguf ? std::sqrt(static_cast<float>(c.hidden))
                      : bf16_to_f32(f32_to_bf16(static_cast<float>(std::sqrt(static_cast<double>(c.hidden)))));
  attn_opt_.pairing = kernels::RopePairing::kHalf;
  const float eps = static_cast<float>(c.rms_eps);

  // RoPE tables: 0 = global (rope_theta, rope_scaling), 1 = local (sliding layers, unscaled).
  ModelConfig local = c;
  local.rope_theta = gp.local_base;
  local.rope_scaling = RopeScaling{};
  // yarn's attention factor is applied by the families whose reference uses it (llama, gpt_oss).
  if (c.rope_scaling.type == "yarn")
    return unsupported(strfmt("[model] %s: rope_scaling type 'yarn' is not supported for this architecture",
                              c.source.c_str()));
  rope_tables_ = {rope_inv_freq(c), rope_inv_freq(local)};

  layers_.resize(static_cast<size_t>(c.n_layers));
  specs_.clear();
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerSpec spec;
    const bool sliding = gp.sliding[static_cast<size_t>(l)];
    spec.kind = sliding ? LayerKind::kSliding : LayerKind::kFull;
    spec.window = sliding ? gp.window : 0;
    spec.n_heads = static_cast<int>(c.n_heads);
    spec.n_kv_heads = static_cast<int>(c.n_kv_heads);
    spec.head_dim = static_cast<int>(c.head_dim);
    spec.rope_dim = static_cast<int>(c.rope_dim);
    spec.rope = sliding ? 1 : 0;
    spec.attn_scale = static_cast<float>(gp.attn_scale);
    spec.norms = {.qk = true, .post_attn = true, .post_ffn = true};
    declare_state(spec);
    specs_.push_back(spec);

    const std::string p = strfmt("model.layers.%lld.", static_cast<long long>(l));
    Layer& L = layers_[static_cast<size_t>(l)];
    LARDER_RETURN_IF_ERROR(L.norms.bind(b, p, c.hidden, eps, gain));
    LARDER_RETURN_IF_ERROR(bind_attention(b, p + "self_attn.", spec, c, attn_opt_, &L.attn));
    apply_gain(L.attn.q_norm.weight, gain);
    apply_gain(L.attn.k_norm.weight, gain);
    LARDER_RETURN_IF_ERROR(bind_mlp(b, p + "mlp.", c, Activation::kGeluTanh, &L.mlp));
  }
  return finish_bind(files, b, tied);
}

void Gemma3Model::layer_forward(int l, const LayerBatch& b) {
  const Layer& L = layers_[static_cast<size_t>(l)];
  L.norms.forward(
      b.x, b.rows, cfg_.hidden, b.h, b.o,
      [&](const float* in, float* out) { attend(l, L.attn, b, in, out); },
      [&](const float* in, float* out) { mlp_block(L.mlp, in, b.rows, mlp_s_, out, b.adapters); });
}

}  // namespace

Result<ModelConfig> gemma3_config(const formats::ModelFiles& files) {
  if (files.gguf) return config_from_gguf(*files.gguf);
  return config_from_hf_json(files, text_config(files));
}

Result<std::unique_ptr<Model>> load_gemma3(const formats::ModelFiles& files, ModelConfig config) {
  auto m = std::make_unique<Gemma3Model>(std::move(config));
  LARDER_RETURN_IF_ERROR(m->bind(files));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace larder::models
