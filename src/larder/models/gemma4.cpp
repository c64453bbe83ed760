// gemma4.cpp — the Gemma 4 model file (dense): HF `gemma4_text` and the text tower of multimodal
// `gemma4` checkpoints. Reference: mlx-lm models/gemma4_text.py, transformers models/gemma4.
//
//   x = embed(tokens) · √hidden                         (rounded to the embedding's dtype)
//   ple = per-layer inputs (below), when hidden_size_per_layer_input > 0
//   per layer l: x += post_attention_norm(attn_l(input_norm(x)))
//                x += post_feedforward_norm(mlp_l(pre_feedforward_norm(x)))      GeGLU (tanh GELU)
//                  (enable_moe_block, 26B-A4B: the FFN is a dense MLP and routed experts in
//                   parallel from the same residual, x += post_feedforward_norm(
//                   post_feedforward_norm_1(mlp_l(pre_feedforward_norm(x))) +
//                   post_feedforward_norm_2(experts_l(x))), blocks/moe_block.h: the router reads
//                   rmsnorm(x)·scale·hidden^-0.5, top k of its logits, softmax over the k, times
//                   per_expert_scale; the GeGLU experts read pre_feedforward_norm_2(x))
//                x += post_per_layer_input_norm(proj_l(gelu(gate_l(x)) · ple[l]))   (with ple)
//                x *= layer_scalar_l
//   logits = 30 · tanh(embed(final_norm(x)) / 30)        (final_logit_softcapping; tied)
//
// What differs from Gemma 3, per layer — and where the LayerSpec carries it:
// - head_dim per layer kind: global layers use global_head_dim (LayerSpec::head_dim), and with
//   attention_k_eq_v their KV heads are num_global_key_value_heads (LayerSpec::n_kv_heads). The
//   plain KvCache holds only global layers and rings are per layer, so the shapes never mix.
// - attention_k_eq_v: global layers have no v_proj, values are the raw key projection
//   (LayerSpec::k_eq_v), then v-normed.
// - v_norm: values are RMS-normed per head without a gain (LayerNorms::v); q/k norms as Gemma 3.
// - softmax scale 1 (no query_pre_attn_scalar): the q/k norms fix the logits' scale.
// - KV sharing: the last num_kv_shared_layers layers project no K/V; each attends over the K/V of
//   the last non-shared layer of its own kind (LayerSpec::kv_source) and owns no state slot, and
//   with use_double_wide_mlp their MLP is twice as wide.
// - RoPE per kind from rope_parameters: sliding layers "default" (theta 10k, all dims), global
//   layers "proportional": the first partial_rotary_factor of the pairs (i, i + head_dim/2)
//   rotate with theta^(-2i/head_dim)/factor, the rest are left alone — a full-width rope whose
//   table is zero past the rotated pairs (rope table 0 = global, 1 = sliding).
// - Norm gains are plain w (Gemma 3 stores w − 1): mlx-lm's nn.RMSNorm, transformers'
//   Gemma4RMSNorm.
// - Per-layer embeddings (E2B/E4B): embed_tokens_per_layer(token) · √P plus
//   rmsnorm(per_layer_model_projection(x) / √hidden) per layer, times 2^-0.5; each layer gates it
//   in after its MLP. layer_scalar multiplies every layer's output.
// GGUF `gemma4` (llama.cpp's converter, conversion/gemma.py Gemma4Model): tensor names below;
// gains as stored (no +1, unlike Gemma 3); key_length / key_length_swa are the global / sliding
// head dims; head_count_kv and feed_forward_length may be per-layer arrays (global KV heads;
// double-wide MLPs of shared layers); sliding_window_pattern is a bool per layer (true =
// sliding); shared_kv_layers; embedding_length_per_layer_input; rope.freq_base (global) /
// freq_base_swa (sliding). Proportional RoPE is the `rope_freqs` tensor [global_head_dim/2]:
// llama.cpp rotates pair i by theta^(-2i/d) / rope_freqs[i] (1e30 for the unrotated pairs), and so
// does this file; the converter drops rope_parameters.factor, so a GGUF cannot carry it. The
// embedding scales are f32 √hidden and √P as llama.cpp computes them.
// GGUF mixture of experts (26B-A4B): expert_count / expert_used_count /
// expert_feed_forward_length; router ffn_gate_inp.weight with its input gain ffn_gate_inp.scale
// (router.scale as stored: llama.cpp forms rmsnorm(x) · hidden^-½ · scale), per_expert_scale as
// ffn_down_exps.scale, experts ffn_gate_up_exps (gate rows first, as HF's gate_up_proj) or
// ffn_gate_exps + ffn_up_exps, ffn_down_exps; pre_ffw_norm_2, post_ffw_norm_1, post_ffw_norm_2.
// llama.cpp's softmax over all experts then renormalising over the k equals the softmax over the
// k (RouteOrder::kTopKThenSoftmax).
// Refused, naming the feature: bidirectional attention, attention biases, a GGUF where only some
// layers have experts.
#include <algorithm>
#include <cmath>
#include <optional>

#include "larder/core/dtype.h"
#include "larder/formats/gguf.h"
#include "larder/models/blocks/moe_block.h"
#include "larder/models/blocks/rope.h"
#include "larder/models/blocks/sandwich.h"
#include "larder/models/hf_conventions.h"
#include "larder/models/registry.h"
#include "larder/models/transformer.h"

namespace larder::models {

namespace {

using nlohmann::ordered_json;

// HF → llama.cpp GGUF names (gguf-py TensorNameMap for MODEL_ARCH.GEMMA4). The Gemma 3 roles
// (post_attention_layernorm is the attention output's norm, ffn_norm the MLP's input norm) plus
// per-layer embeddings, the layer scalar and the proportional-RoPE factors ("rope_freqs" has no HF
// tensor: only the GGUF path binds it).
TensorNames gemma4_names() {
  return TensorNames{{{"model.embed_tokens.weight", "token_embd.weight"},
                      {"model.norm.weight", "output_norm.weight"},
                      {"lm_head.weight", "output.weight"},
                      {"model.embed_tokens_per_layer.weight", "per_layer_token_embd.weight"},
                      {"model.per_layer_model_projection.weight", "per_layer_model_proj.weight"},
                      {"model.per_layer_projection_norm.weight", "per_layer_proj_norm.weight"},
                      {"rope_freqs", "rope_freqs.weight"}},
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
                      {"mlp.down_proj.", "ffn_down."},
                      {"per_layer_input_gate.", "inp_gate."},
                      {"per_layer_projection.", "proj."},
                      {"post_per_layer_input_norm.", "post_norm."},
                      {"layer_scalar", "layer_output_scale.weight"},
                      // enable_moe_block (26B-A4B)
                      {"router.proj.", "ffn_gate_inp."},
                      {"router.scale", "ffn_gate_inp.scale"},
                      {"router.per_expert_scale", "ffn_down_exps.scale"},
                      {"experts.gate_up_proj", "ffn_gate_up_exps.weight"},
                      {"experts.down_proj", "ffn_down_exps.weight"},
                      {"experts.switch_glu.gate_proj.", "ffn_gate_exps."},
                      {"experts.switch_glu.up_proj.", "ffn_up_exps."},
                      {"experts.switch_glu.down_proj.", "ffn_down_exps."},
                      {"pre_feedforward_layernorm_2.", "pre_ffw_norm_2."},
                      {"post_feedforward_layernorm_1.", "post_ffw_norm_1."},
                      {"post_feedforward_layernorm_2.", "post_ffw_norm_2."}},
                     "",
                     ""};
}

// Gemma4TextConfig's defaults (transformers, which writes released configs and omits keys equal
// to these; mlx-lm's dataclass differs on num_kv_shared_layers, use_double_wide_mlp and
// final_logit_softcapping, which released configs state explicitly).
ordered_json gemma4_defaults() {
  return {{"vocab_size", 262144},
          {"hidden_size", 2304},
          {"intermediate_size", 9216},
          {"num_hidden_layers", 30},
          {"num_attention_heads", 8},
          {"num_key_value_heads", 4},
          {"head_dim", 256},
          {"global_head_dim", 512},
          {"hidden_activation", "gelu_pytorch_tanh"},
          {"max_position_embeddings", 131072},
          {"rms_norm_eps", 1e-6},
          {"tie_word_embeddings", true},
          {"sliding_window", 512},
          {"vocab_size_per_layer_input", 262144},
          {"hidden_size_per_layer_input", 256},
          {"attention_k_eq_v", false},
          {"num_kv_shared_layers", 0},
          {"enable_moe_block", false},
          {"use_double_wide_mlp", false},
          {"rope_parameters",
           {{"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
            {"full_attention",
             {{"rope_type", "proportional"}, {"partial_rotary_factor", 0.25}, {"rope_theta", 1000000.0}}}}}};
}

// The text model's config (hf_conventions.h: text_config nesting) over the defaults; a null
// final_logit_softcapping turns capping off and a null num_global_key_value_heads means "as
// num_key_value_heads", so those nulls are values.
ordered_json text_config(const formats::ModelFiles& files) {
  return hf_text_config(files, gemma4_defaults(), {"final_logit_softcapping", "num_global_key_value_heads"});
}

struct RopeKind {
  std::string type = "default";
  double theta = 10000.0, partial = 1.0, factor = 1.0;
};

struct Gemma4Params {
  std::vector<bool> sliding;
  int64_t window = 0, global_head_dim = 0, global_kv_heads = 0, n_shared = 0;
  int64_t ple_dim = 0, ple_vocab = 0;
  bool k_eq_v = false, double_wide = false;
  ExpertDims moe;  // enable_moe_block: every layer (n_experts > 0)
  float softcap = 0;
  RopeKind rope_full, rope_sliding;
};

// A GGUF metadata value that is an integer or a per-layer integer array: layer l's value.
std::optional<int64_t> per_layer_int(const formats::GgufFile& g, const std::string& key, int64_t l) {
  const formats::GgufValue* v = g.find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_array()) return g.get_int(key);
  if (l < 0 || l >= static_cast<int64_t>(v->ints.size())) return std::nullopt;
  return v->ints[static_cast<size_t>(l)];
}

// GGUF metadata as llama.cpp's converter writes it (see the header). The shared GGUF parser has
// already read the sliding layers' shape into `c` (gemma4_config).
// A KV-shared layer reads the last non-shared layer of its kind (sliding or global): that kind
// must have one. Checked for both sources of the parameters (GGUF metadata, config.json).
Status check_kv_sharing(const Gemma4Params& p, int64_t n_layers, const char* src) {
  const int64_t first_shared = n_layers - p.n_shared;
  for (int64_t l = first_shared; l < n_layers; ++l) {
    bool found = false;
    for (int64_t i = 0; i < first_shared; ++i) found |= p.sliding[static_cast<size_t>(i)] == p.sliding[static_cast<size_t>(l)];
    if (!found)
      return invalid_argument(strfmt("[config] %s: KV-shared layer %lld has no earlier layer of its type to share", src,
                                     (long long)l));
  }
  return Status::ok();
}

Result<Gemma4Params> gguf_params(const formats::GgufFile& g, const ModelConfig& c) {
  const char* src = c.source.c_str();
  const std::string a = c.architecture + ".";
  Gemma4Params p;
  int64_t routed = 0;
  for (int64_t l = 0; l < c.n_layers; ++l)
    routed += g.tensors().find(strfmt("blk.%lld.ffn_gate_inp.weight", (long long)l)) != nullptr;
  if (routed > 0) {
    if (routed != c.n_layers)
      return unsupported(strfmt("[config] %s: GGUF gemma4 with experts on %lld of %lld layers is not supported "
                                "(every layer or none)",
                                src, (long long)routed, (long long)c.n_layers));
    const auto E = g.get_int(a + "expert_count");
    const auto k = g.get_int(a + "expert_used_count");
    const auto ffn = per_layer_int(g, a + "expert_feed_forward_length", 0);
    if (!E || !k || !ffn || *E < 1 || *E > 65536 || *k < 1 || *k > *E || *ffn < 1 || *ffn > (int64_t{1} << 30))
      return invalid_argument(strfmt("[config] %s: GGUF gemma4 with experts needs %sexpert_count >= 1, 1 <= "
                                     "%sexpert_used_count <= expert_count and %sexpert_feed_forward_length >= 1",
                                     src, a.c_str(), a.c_str(), a.c_str()));
    for (int64_t l = 1; l < c.n_layers; ++l)
      if (per_layer_int(g, a + "expert_feed_forward_length", l) != ffn)
        return unsupported(strfmt("[config] %s: per-layer expert_feed_forward_length is not supported", src));
    p.moe.n_experts = static_cast<int>(*E);
    p.moe.k = static_cast<int>(*k);
    p.moe.ffn = *ffn;
  }
  const formats::GgufValue* pat = g.find(a + "attention.sliding_window_pattern");
  if (pat == nullptr || !pat->is_array() || static_cast<int64_t>(pat->ints.size()) != c.n_layers)
    return invalid_argument(strfmt("[config] %s: GGUF gemma4 needs %sattention.sliding_window_pattern with one bool "
                                   "per layer (%lld)",
                                   src, a.c_str(), (long long)c.n_layers));
  for (int64_t v : pat->ints) p.sliding.push_back(v != 0);
  p.window = g.get_int(a + "attention.sliding_window").value_or(0);
  p.global_head_dim = g.get_int(a + "attention.key_length").value_or(0);
  p.n_shared = g.get_int(a + "attention.shared_kv_layers").value_or(0);
  p.ple_dim = g.get_int(a + "embedding_length_per_layer_input").value_or(0);
  p.softcap = static_cast<float>(g.get_float(a + "final_logit_softcapping").value_or(0.0));
  if (p.ple_dim > 0) {
    const formats::TensorInfo* t = g.tensors().find("per_layer_token_embd.weight");
    p.ple_vocab = t != nullptr && t->rank() == 2 ? t->dim(0) : 0;
  }
  int64_t first_global = -1;
  for (int64_t l = 0; l < c.n_layers && first_global < 0; ++l)
    if (!p.sliding[static_cast<size_t>(l)]) first_global = l;
  p.global_kv_heads = first_global >= 0 ? per_layer_int(g, a + "attention.head_count_kv", first_global).value_or(0)
                                        : c.n_kv_heads;
  // k_eq_v: a global layer that projects K/V but has no V (llama.cpp uses K as V then).
  p.k_eq_v = first_global >= 0 && first_global < c.n_layers - p.n_shared &&
             g.tensors().find(strfmt("blk.%lld.attn_v.weight", (long long)first_global)) == nullptr;
  // Per-layer feed_forward_length: the converter doubles the shared layers' (use_double_wide_mlp)
  // and nothing else; refuse any other pattern rather than guess.
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const int64_t f = per_layer_int(g, a + "feed_forward_length", l).value_or(-1);
    const bool shared = l >= c.n_layers - p.n_shared;
    if (f == c.ffn) continue;
    if (shared && f == 2 * c.ffn) {
      p.double_wide = true;
      continue;
    }
    return unsupported(strfmt("[config] %s: per-layer feed_forward_length %lld at layer %lld (base %lld) is not "
                              "supported (only double-wide KV-shared layers)",
                              src, (long long)f, (long long)l, (long long)c.ffn));
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const int64_t kv = per_layer_int(g, a + "attention.head_count_kv", l).value_or(0);
    if (kv != (p.sliding[static_cast<size_t>(l)] ? c.n_kv_heads : p.global_kv_heads))
      return unsupported(strfmt("[config] %s: attention.head_count_kv differs between layers of one kind", src));
  }
  if (c.rope_scaling.type != "")
    return unsupported(strfmt("[config] %s: GGUF gemma4 with rope scaling '%s' is not supported", src,
                              c.rope_scaling.type.c_str()));
  p.rope_full.type = "gguf";  // the table comes from rope_freqs (bind)
  p.rope_full.theta = c.rope_theta;
  p.rope_sliding.theta = g.get_float(a + "rope.freq_base_swa").value_or(10000.0);
  const int64_t rot = g.get_int(a + "rope.dimension_count").value_or(p.global_head_dim);
  const int64_t rot_swa = g.get_int(a + "rope.dimension_count_swa").value_or(c.head_dim);
  if (rot != p.global_head_dim || rot_swa != c.head_dim)
    return unsupported(strfmt("[config] %s: rope.dimension_count %lld / _swa %lld differ from the head dims %lld / "
                              "%lld (partial rotation is expressed by rope_freqs)",
                              src, (long long)rot, (long long)rot_swa, (long long)p.global_head_dim,
                              (long long)c.head_dim));
  if (!(p.window >= 1) || p.global_head_dim % 2 != 0 || p.global_head_dim < 2 || p.global_kv_heads < 1 ||
      c.n_heads % p.global_kv_heads != 0 || p.n_shared < 0 || p.n_shared >= c.n_layers || p.ple_dim < 0 ||
      !(p.rope_sliding.theta > 0) || !(p.rope_full.theta > 0))
    return invalid_argument(strfmt("[config] %s: GGUF gemma4 sliding_window, key_length, head_count_kv, "
                                   "shared_kv_layers, embedding_length_per_layer_input or rope.freq_base out of range",
                                   src));
  if (p.ple_dim > 0 && p.ple_vocab < c.vocab)
    return invalid_argument(strfmt("[config] %s: per_layer_token_embd.weight has %lld rows for vocab %lld", src,
                                   (long long)p.ple_vocab, (long long)c.vocab));
  LARDER_RETURN_IF_ERROR(check_kv_sharing(p, c.n_layers, src));
  return p;
}

Result<Gemma4Params> hf_params(const ordered_json& j, const ModelConfig& c) {
  const char* src = c.source.c_str();
  Gemma4Params p;
  auto flag = [&](const char* k) { return j.contains(k) && j[k].is_boolean() && j[k].get<bool>(); };
  auto integer = [&](const char* k, int64_t dflt, int64_t* out) -> Status {
    *out = dflt;
    if (!j.contains(k) || j[k].is_null()) return Status::ok();
    if (!j[k].is_number_integer()) return invalid_argument(strfmt("[config] %s: '%s' must be an integer", src, k));
    *out = j[k].get<int64_t>();
    return Status::ok();
  };
  if (flag("enable_moe_block")) {
    // mlx-lm reads these three only with enable_moe_block (Optional, no default): required.
    int64_t E = 0, k = 0;
    LARDER_RETURN_IF_ERROR(integer("num_experts", 0, &E));
    LARDER_RETURN_IF_ERROR(integer("top_k_experts", 0, &k));
    LARDER_RETURN_IF_ERROR(integer("moe_intermediate_size", 0, &p.moe.ffn));
    if (!(E >= 1 && E <= 65536) || !(k >= 1 && k <= E) || p.moe.ffn < 1)
      return invalid_argument(strfmt("[config] %s: enable_moe_block needs num_experts >= 1, 1 <= top_k_experts <= "
                                     "num_experts and moe_intermediate_size >= 1 (got %lld, %lld, %lld)",
                                     src, (long long)E, (long long)k, (long long)p.moe.ffn));
    p.moe.n_experts = static_cast<int>(E);
    p.moe.k = static_cast<int>(k);
  }
  if (j.contains("use_bidirectional_attention") && !j["use_bidirectional_attention"].is_null())
    return unsupported(strfmt("[config] %s: use_bidirectional_attention %s is not supported (causal text only)", src,
                              j["use_bidirectional_attention"].dump().c_str()));
  if (c.attention_bias) return unsupported(strfmt("[config] %s: attention_bias is not supported for Gemma 4", src));
  if (j.contains("hidden_activation") && j["hidden_activation"] != "gelu_pytorch_tanh")
    return unsupported(strfmt("[config] %s: hidden_activation %s is not supported (gelu_pytorch_tanh)", src,
                              j["hidden_activation"].dump().c_str()));
  LARDER_RETURN_IF_ERROR(integer("sliding_window", 512, &p.window));
  LARDER_RETURN_IF_ERROR(integer("global_head_dim", c.head_dim, &p.global_head_dim));
  if (p.global_head_dim == 0) p.global_head_dim = c.head_dim;  // mlx-lm: a falsy global_head_dim means head_dim
  LARDER_RETURN_IF_ERROR(integer("num_global_key_value_heads", c.n_kv_heads, &p.global_kv_heads));
  LARDER_RETURN_IF_ERROR(integer("num_kv_shared_layers", 0, &p.n_shared));
  LARDER_RETURN_IF_ERROR(integer("hidden_size_per_layer_input", 0, &p.ple_dim));
  LARDER_RETURN_IF_ERROR(integer("vocab_size_per_layer_input", c.vocab, &p.ple_vocab));
  p.k_eq_v = flag("attention_k_eq_v");
  if (!p.k_eq_v) p.global_kv_heads = c.n_kv_heads;
  p.double_wide = flag("use_double_wide_mlp");
  if (j.contains("final_logit_softcapping") && j["final_logit_softcapping"].is_number())
    p.softcap = j["final_logit_softcapping"].get<float>();
  if (!(p.window >= 1) || p.global_head_dim % 2 != 0 || p.global_head_dim < 2 || p.global_kv_heads < 1 ||
      c.n_heads % p.global_kv_heads != 0 || p.n_shared < 0 || p.n_shared >= c.n_layers || p.ple_dim < 0)
    return invalid_argument(strfmt("[config] %s: sliding_window, global_head_dim, num_global_key_value_heads, "
                                   "num_kv_shared_layers or hidden_size_per_layer_input out of range",
                                   src));
  if (p.ple_dim > 0 && p.ple_vocab < c.vocab)
    return unsupported(strfmt("[config] %s: vocab_size_per_layer_input %lld < vocab_size %lld is not supported", src,
                              (long long)p.ple_vocab, (long long)c.vocab));

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
  } else if (j.contains("sliding_window_pattern") && j["sliding_window_pattern"].is_number_integer()) {
    const int64_t pat = j["sliding_window_pattern"].get<int64_t>();
    if (pat < 1) return invalid_argument(strfmt("[config] %s: sliding_window_pattern must be >= 1", src));
    for (int64_t i = 0; i < c.n_layers; ++i) p.sliding.push_back((i + 1) % pat != 0);
  } else {
    // transformers and mlx-lm disagree on the default pattern (6 vs 5): refuse to guess.
    return invalid_argument(strfmt("[config] %s: Gemma 4 config without layer_types or sliding_window_pattern", src));
  }

  const ordered_json& rp = j["rope_parameters"];
  for (auto [key, out] : {std::pair{"full_attention", &p.rope_full}, std::pair{"sliding_attention", &p.rope_sliding}}) {
    if (!rp.is_object() || !rp.contains(key) || !rp[key].is_object())
      return invalid_argument(strfmt("[config] %s: rope_parameters.%s is missing", src, key));
    const ordered_json& r = rp[key];
    if (r.contains("rope_type") && r["rope_type"].is_string()) out->type = r["rope_type"].get<std::string>();
    if (r.contains("rope_theta") && r["rope_theta"].is_number()) out->theta = r["rope_theta"].get<double>();
    if (r.contains("partial_rotary_factor") && r["partial_rotary_factor"].is_number())
      out->partial = r["partial_rotary_factor"].get<double>();
    if (r.contains("factor") && r["factor"].is_number()) out->factor = r["factor"].get<double>();
    if (out->type != "default" && out->type != "proportional")
      return unsupported(strfmt("[config] %s: rope_parameters.%s rope_type '%s' is not supported (default, "
                                "proportional)",
                                src, key, out->type.c_str()));
    if (out->type == "default" && out->partial != 1.0)
      return unsupported(strfmt("[config] %s: rope_parameters.%s: partial_rotary_factor with rope_type default", src,
                                key));
    if (!(out->theta > 0) || !(out->factor > 0) || !(out->partial > 0 && out->partial <= 1))
      return invalid_argument(strfmt("[config] %s: rope_parameters.%s out of range", src, key));
  }
  LARDER_RETURN_IF_ERROR(check_kv_sharing(p, c.n_layers, src));
  return p;
}

// inv_freq[head_dim/2] of one layer kind. "default": theta^(-2i/d) for every pair. "proportional":
// the first floor(partial·d/2) pairs get theta^(-2i/d)/factor, the others 0 (not rotated).
std::vector<float> rope_table(const RopeKind& r, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  const int64_t rotated = r.type == "proportional" ? static_cast<int64_t>(r.partial * static_cast<double>(head_dim)) / 2 : half;
  std::vector<float> t(static_cast<size_t>(half), 0.0f);
  for (int64_t i = 0; i < rotated; ++i) {
    double inv = 1.0 / std::pow(r.theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
    if (r.type == "proportional") inv /= r.factor;
    t[static_cast<size_t>(i)] = static_cast<float>(inv);
  }
  return t;
}

struct Layer {
  SandwichNorms norms;
  AttentionWeights attn;
  MlpWeights mlp;
  // Per-layer embeddings (ple_dim > 0).
  Projection ple_gate, ple_proj;  // [P, hidden], [hidden, P]
  RmsNorm ple_norm;               // post_per_layer_input_norm
  float scalar = 1.0f;                     // layer_scalar
  // enable_moe_block: the routed experts (their router and input norms inside) and the norms of
  // the two branches' outputs.
  MoeWeights moe;
  RmsNorm post_ffn_dense, post_ffn_experts;  // post_feedforward_layernorm_1, _2
};

class Gemma4Model final : public Transformer {
 public:
  explicit Gemma4Model(ModelConfig c) : Transformer(std::move(c)) {}
  Status bind(const formats::ModelFiles& files);

 private:
  Status bind_experts(WeightBinder& b, const std::string& p, float eps, Layer* Ly);
  void begin_batch(const LayerBatch& b) override;
  void layer_forward(int l, const LayerBatch& b) override;

  Gemma4Params gp_;
  std::vector<Layer> layers_;
  std::vector<bool> has_readers_;         // a ring source layer some KV-shared layer reads
  std::vector<std::vector<KvKeep>> keep_;  // per source layer
  // Per-layer embeddings.
  kernels::WeightView ple_embed_;  // [Vp, L·P]
  Projection ple_model_proj_;      // [L·P, hidden]
  RmsNorm ple_proj_norm_;          // [P]
  float ple_embed_scale_ = 1.0f;
  std::vector<float> ple_;       // [rows, L, P] this forward's per-layer inputs
  std::vector<float> ple_tmp_;   // [rows, L·P]
  std::vector<float> gate_, gin_;  // [rows, P]
  MoeScratch moe_s_;
  std::vector<float> moe_out_;  // [rows, hidden]
};

float round_to(DType dt, float v) {
  if (dt == DType::kBF16) return bf16_to_f32(f32_to_bf16(v));
  if (dt == DType::kF16) return f16_to_f32(f32_to_f16(v));
  return v;
}

Status Gemma4Model::bind(const formats::ModelFiles& files) {
  const ModelConfig& c = cfg_;
  const bool gguf = c.from_gguf;
  if (gguf) {
    LARDER_ASSIGN_OR_RETURN(gp_, gguf_params(*files.gguf, c));
  } else {
    LARDER_ASSIGN_OR_RETURN(gp_, hf_params(text_config(files), c));
  }
  TensorNames names = gemma4_names();
  use_text_tower_prefix(files, &names);  // multimodal HF text towers keep their prefix
  WeightBinder b(files, names);
  LARDER_ASSIGN_OR_RETURN(const bool tied, bind_head(b, /*family_default=*/true));
  // mlx-lm rounds √hidden to the embedding's dtype; llama.cpp uses f32 sqrtf.
  embed_scale_ = gguf ? std::sqrt(static_cast<float>(c.hidden))
                      : round_to(embed_.dtype, static_cast<float>(std::sqrt(static_cast<double>(c.hidden))));
  logit_softcap_ = gp_.softcap;
  attn_opt_.pairing = kernels::RopePairing::kHalf;
  const float eps = static_cast<float>(c.rms_eps);
  rope_tables_ = {gguf ? std::vector<float>{} : rope_table(gp_.rope_full, gp_.global_head_dim),
                  rope_table(gp_.rope_sliding, c.head_dim)};
  if (gguf && std::find(gp_.sliding.begin(), gp_.sliding.end(), false) != gp_.sliding.end()) {
    // Global layers: theta^(-2i/d) divided by the file's per-pair factors (llama.cpp's freq_factors).
    const int64_t half = gp_.global_head_dim / 2;
    LARDER_ASSIGN_OR_RETURN(std::vector<float> ff, b.vector("rope_freqs", half, "global key_length / 2"));
    std::vector<float>& t = rope_tables_[0];
    t.resize(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) {
      const double f = ff[static_cast<size_t>(i)];
      if (!(f > 0))
        return invalid_argument(strfmt("[model] %s: rope_freqs.weight[%lld] = %g must be positive", files.path.c_str(),
                                       (long long)i, f));
      t[static_cast<size_t>(i)] = static_cast<float>(
          std::pow(gp_.rope_full.theta, -static_cast<double>(2 * i) / static_cast<double>(gp_.global_head_dim)) / f);
    }
  }

  const int64_t L = c.n_layers, P = gp_.ple_dim;
  if (P > 0) {
    LARDER_ASSIGN_OR_RETURN(ple_embed_, b.matrix("model.embed_tokens_per_layer.weight", gp_.ple_vocab, L * P,
                                                 "vocab_size_per_layer_input x num_hidden_layers*hidden_size_per_layer_input"));
    LARDER_ASSIGN_OR_RETURN(ple_model_proj_,
                            b.projection({.module = "model.per_layer_model_projection",
                                          .out = L * P,
                                          .in = c.hidden,
                                          .why = "num_hidden_layers*hidden_size_per_layer_input x hidden_size"}));
    LARDER_ASSIGN_OR_RETURN(ple_proj_norm_.weight,
                            b.vector("model.per_layer_projection_norm.weight", P, "hidden_size_per_layer_input"));
    ple_proj_norm_.eps = eps;
    ple_embed_scale_ = gguf ? std::sqrt(static_cast<float>(P))
                            : round_to(ple_embed_.dtype, static_cast<float>(std::sqrt(static_cast<double>(P))));
  }

  const int64_t first_shared = L - gp_.n_shared;
  layers_.resize(static_cast<size_t>(L));
  has_readers_.assign(static_cast<size_t>(L), false);
  keep_.assign(static_cast<size_t>(L), {});
  specs_.clear();
  for (int64_t l = 0; l < L; ++l) {
    const bool sliding = gp_.sliding[static_cast<size_t>(l)];
    LayerSpec spec;
    spec.kind = sliding ? LayerKind::kSliding : LayerKind::kFull;
    spec.window = sliding ? gp_.window : 0;
    spec.n_heads = static_cast<int>(c.n_heads);
    spec.n_kv_heads = static_cast<int>(sliding ? c.n_kv_heads : gp_.global_kv_heads);
    spec.head_dim = static_cast<int>(sliding ? c.head_dim : gp_.global_head_dim);
    spec.rope_dim = spec.head_dim;  // partial rotation lives in the table (zeros)
    spec.rope = sliding ? 1 : 0;
    spec.attn_scale = 1.0f;
    spec.norms = {.qk = true, .post_attn = true, .post_ffn = true, .v = true};
    spec.k_eq_v = gp_.k_eq_v && !sliding;
    if (gp_.moe.n_experts > 0) {
      spec.ffn = FfnKind::kRoutedExperts;  // (next to the dense MLP: layer_forward)
      spec.experts = gp_.moe;
    }
    if (l >= first_shared) {
      for (int64_t i = first_shared - 1; i >= 0; --i)
        if (gp_.sliding[static_cast<size_t>(i)] == sliding) {
          spec.kv_source = static_cast<int>(i);
          break;
        }
      has_readers_[static_cast<size_t>(spec.kv_source)] = sliding;  // plain sources are read in place
    }
    declare_state(spec);
    specs_.push_back(spec);

    const std::string p = strfmt("model.layers.%lld.", static_cast<long long>(l));
    Layer& Ly = layers_[static_cast<size_t>(l)];
    LARDER_RETURN_IF_ERROR(Ly.norms.bind(b, p, c.hidden, eps, NormGain::kAsStored));
    LARDER_RETURN_IF_ERROR(bind_attention(b, p + "self_attn.", spec, c, attn_opt_, &Ly.attn));
    if (spec.kv_source >= 0) {
      // Some checkpoints still carry the K/V tensors of shared layers; the reference drops them.
      const int64_t kv_dim = int64_t{spec.n_kv_heads} * spec.head_dim;
      for (const char* m : {"self_attn.k_proj.weight", "self_attn.v_proj.weight"})
        if (b.has(p + m)) LARDER_RETURN_IF_ERROR(b.matrix(p + m, kv_dim, c.hidden, "unused (KV-shared layer)").status());
      for (const char* m : {"self_attn.k_norm.weight", "self_attn.v_norm.weight"})
        if (b.has(p + m)) LARDER_RETURN_IF_ERROR(b.vector(p + m, spec.head_dim, "unused (KV-shared layer)").status());
    }
    ModelConfig mc = c;
    if (gp_.double_wide && spec.kv_source >= 0) mc.ffn = 2 * c.ffn;
    LARDER_RETURN_IF_ERROR(bind_mlp(b, p + "mlp.", mc, Activation::kGeluTanh, &Ly.mlp));
    if (spec.ffn == FfnKind::kRoutedExperts) LARDER_RETURN_IF_ERROR(bind_experts(b, p, eps, &Ly));
    if (P > 0) {
      LARDER_ASSIGN_OR_RETURN(Ly.ple_gate, b.projection({.module = p + "per_layer_input_gate",
                                                         .out = P,
                                                         .in = c.hidden,
                                                         .why = "hidden_size_per_layer_input x hidden_size"}));
      LARDER_ASSIGN_OR_RETURN(Ly.ple_proj, b.projection({.module = p + "per_layer_projection",
                                                         .out = c.hidden,
                                                         .in = P,
                                                         .why = "hidden_size x hidden_size_per_layer_input"}));
      LARDER_ASSIGN_OR_RETURN(Ly.ple_norm.weight, b.vector(p + "post_per_layer_input_norm.weight", c.hidden, "hidden_size"));
      Ly.ple_norm.eps = eps;
    }
    if (b.has(p + "layer_scalar")) {
      LARDER_ASSIGN_OR_RETURN(std::vector<float> s, b.vector(p + "layer_scalar", 1, "1"));
      Ly.scalar = s[0];
    }
  }
  return finish_bind(files, b, tied);
}

// The routed-experts half of a MoE layer (`p` = "model.layers.N."): router.{proj.weight, scale,
// per_expert_scale}, experts fused (HF experts.gate_up_proj / down_proj) or stacked (MLX
// experts.switch_glu.*), pre_feedforward_layernorm_2 and post_feedforward_layernorm_{1,2}.
Status Gemma4Model::bind_experts(WeightBinder& b, const std::string& p, float eps, Layer* Ly) {
  const int64_t d = cfg_.hidden;
  kernels::RouteParams route;
  route.order = kernels::RouteOrder::kTopKThenSoftmax;
  route.select = kernels::RouteSelect::kLastK;
  MoeWeights& w = Ly->moe;
  LARDER_RETURN_IF_ERROR(bind_moe(b, p, gp_.moe, d, route, Activation::kGeluTanh, &w,
                                  {.router = "router.proj", .stacked = "experts.switch_glu."}));
  // mlx-lm: rms_norm(x, scale · hidden^-0.5): the gain's product in f32, as mlx forms it.
  LARDER_ASSIGN_OR_RETURN(w.router_norm.weight, b.vector(p + "router.scale", d, "hidden_size"));
  const float root = static_cast<float>(std::pow(static_cast<double>(d), -0.5));
  for (float& g : w.router_norm.weight) g *= root;
  w.router_norm.eps = eps;
  LARDER_ASSIGN_OR_RETURN(w.expert_norm.weight, b.vector(p + "pre_feedforward_layernorm_2.weight", d, "hidden_size"));
  w.expert_norm.eps = eps;
  LARDER_ASSIGN_OR_RETURN(w.expert_scale_f32, b.vector(p + "router.per_expert_scale", gp_.moe.n_experts, "num_experts"));
  w.route.expert_scale = w.expert_scale_f32.data();
  LARDER_ASSIGN_OR_RETURN(Ly->post_ffn_dense.weight,
                          b.vector(p + "post_feedforward_layernorm_1.weight", d, "hidden_size"));
  LARDER_ASSIGN_OR_RETURN(Ly->post_ffn_experts.weight,
                          b.vector(p + "post_feedforward_layernorm_2.weight", d, "hidden_size"));
  Ly->post_ffn_dense.eps = Ly->post_ffn_experts.eps = eps;
  count_experts(w);
  return Status::ok();
}

void Gemma4Model::begin_batch(const LayerBatch& b) {
  const int64_t P = gp_.ple_dim;
  if (P == 0) return;
  const int64_t L = cfg_.n_layers, rows = b.rows, LP = L * P;
  ple_.resize(static_cast<size_t>(rows * LP));
  ple_tmp_.resize(static_cast<size_t>(rows * LP));
  // Projection of the scaled embeddings, / √hidden, RMS-normed per layer group of P.
  ple_model_proj_.apply(b.x, rows, ple_.data(), b.adapters);
  const float proj_scale = 1.0f / std::sqrt(static_cast<float>(cfg_.hidden));
  for (int64_t i = 0; i < rows * LP; ++i) ple_[static_cast<size_t>(i)] *= proj_scale;
  ple_proj_norm_.apply(ple_.data(), rows * L, ple_.data());
  // Plus the token's own per-layer embedding · √P, all · 2^-0.5.
  const float mix = static_cast<float>(1.0 / std::sqrt(2.0));
  for (int64_t r = 0; r < rows; ++r) {
    float* e = ple_tmp_.data() + r * LP;
    kernels::dequant_row(ple_embed_, b.tokens[r], e);
    float* o = ple_.data() + r * LP;
    for (int64_t i = 0; i < LP; ++i) o[i] = (o[i] + e[i] * ple_embed_scale_) * mix;
  }
}

void Gemma4Model::layer_forward(int l, const LayerBatch& b) {
  const Layer& Ly = layers_[static_cast<size_t>(l)];
  const LayerSpec& spec = specs_[static_cast<size_t>(l)];
  const int64_t d = cfg_.hidden, n = b.rows * d;
  std::vector<KvKeep>* keep = spec.kv_source >= 0          ? &keep_[static_cast<size_t>(spec.kv_source)]
                              : has_readers_[static_cast<size_t>(l)] ? &keep_[static_cast<size_t>(l)]
                                                                     : nullptr;
  Ly.norms.forward(
      b.x, b.rows, d, b.h, b.o,
      [&](const float* in, float* out) { attend(l, Ly.attn, b, in, out, keep); },
      [&](const float* in, float* out) {
        mlp_block(Ly.mlp, in, b.rows, mlp_s_, out, b.adapters);
        if (spec.ffn != FfnKind::kRoutedExperts) return;
        // The experts branch reads the residual itself (b.x, attention already added), not `in`.
        Ly.post_ffn_dense.apply(out, b.rows, out);
        moe_out_.resize(static_cast<size_t>(n));
        moe_block(Ly.moe, b.x, b.rows, moe_s_, moe_out_.data(), b.adapters);
        Ly.post_ffn_experts.apply(moe_out_.data(), b.rows, moe_out_.data());
        kernels::add(out, moe_out_.data(), out, n);
      });
  const int64_t P = gp_.ple_dim;
  if (P > 0) {
    gate_.resize(static_cast<size_t>(b.rows * P));
    gin_.resize(static_cast<size_t>(b.rows * P));
    Ly.ple_gate.apply(b.x, b.rows, gate_.data(), b.adapters);
    const int64_t LP = cfg_.n_layers * P;
    for (int64_t r = 0; r < b.rows; ++r)
      std::copy_n(ple_.data() + r * LP + int64_t{l} * P, P, gin_.data() + r * P);
    kernels::gelu_tanh_mul(gate_.data(), gin_.data(), gate_.data(), b.rows * P);
    Ly.ple_proj.apply(gate_.data(), b.rows, b.o, b.adapters);
    Ly.ple_norm.apply(b.o, b.rows, b.o);
    kernels::add(b.x, b.o, b.x, n);
  }
  if (Ly.scalar != 1.0f)
    for (int64_t i = 0; i < n; ++i) b.x[i] *= Ly.scalar;
}

}  // namespace

Result<ModelConfig> gemma4_config(const formats::ModelFiles& files) {
  if (files.gguf) {
    // key_length is the global layers' head dim; the shared fields describe the sliding layers
    // (as for HF): head_dim = key_length_swa, n_kv_heads = the first sliding layer's.
    const formats::GgufFile& g = *files.gguf;
    LARDER_ASSIGN_OR_RETURN(ModelConfig c, config_from_gguf(g));
    const std::string a = c.architecture + ".";
    auto swa = g.get_int(a + "attention.key_length_swa");
    if (!swa || *swa < 2 || *swa % 2 != 0)
      return invalid_argument(strfmt("[config] %s: GGUF gemma4 needs an even %sattention.key_length_swa", c.source.c_str(),
                                     a.c_str()));
    c.head_dim = *swa;
    c.rope_dim = *swa;
    if (const formats::GgufValue* pat = g.find(a + "attention.sliding_window_pattern"); pat && pat->is_array())
      for (size_t l = 0; l < pat->ints.size(); ++l)
        if (pat->ints[l] != 0) {
          c.n_kv_heads = per_layer_int(g, a + "attention.head_count_kv", static_cast<int64_t>(l)).value_or(c.n_kv_heads);
          break;
        }
    return c;
  }
  // The shared parser sees the sliding layers' shape; per-kind RoPE and the global layers' shape
  // are this file's (hf_params).
  ordered_json j = text_config(files);
  if (j["rope_parameters"].is_object() && j["rope_parameters"].contains("full_attention") &&
      j["rope_parameters"]["full_attention"].contains("rope_theta"))
    j["rope_theta"] = j["rope_parameters"]["full_attention"]["rope_theta"];
  for (const char* k : {"rope_parameters", "rope_scaling", "partial_rotary_factor"}) j.erase(k);
  return config_from_hf_json(files, j);
}

Result<std::unique_ptr<Model>> load_gemma4(const formats::ModelFiles& files, ModelConfig config) {
  auto m = std::make_unique<Gemma4Model>(std::move(config));
  LARDER_RETURN_IF_ERROR(m->bind(files));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace larder::models
