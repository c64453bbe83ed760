// llama.cpp — the llama model file: Llama 1/2/3/3.1/3.2 (GQA, llama3 rope scaling, tied or
// untied embeddings, optional attention/mlp bias) and Mistral (same graph); the graph that the
// qwen2/qwen3 files are variants of (llama.h).
//
// Source-specific details:
// - HF checkpoints rotate pairs (i, i + d/2); llama.cpp's convert_hf_to_gguf permutes the Q/K
//   rows of llama models back to Meta's interleaved layout, so GGUF llama pairs (2i, 2i+1).
//   llama2.c-trained models (stories*) are interleaved natively and converted unpermuted.
// - HF LlamaConfig's default is tie_word_embeddings = false (Llama 3.2 1B/3B set it true).
// - Mistral v0.1's `sliding_window: 4096` is not applied (mlx-lm's llama graph ignores it too);
//   results differ from HF only past 4096 tokens. Later Mistrals set it to null.
#include "larder/models/llama.h"

#include <cmath>

#include "larder/models/blocks/moe_block.h"
#include "larder/models/blocks/rope.h"
#include "larder/models/registry.h"
#include "larder/models/transformer.h"

namespace larder::models {

namespace {

// HF names → llama.cpp's GGUF names for this graph. Here `post_attention_layernorm` is the norm
// in front of the MLP (GGUF `ffn_norm`); in Gemma the same HF name is something else.
const TensorNames& llama_names() {
  static const TensorNames n{
      {{"model.embed_tokens.weight", "token_embd.weight"},
       {"model.norm.weight", "output_norm.weight"},
       {"lm_head.weight", "output.weight"}},
      {{"self_attn.q_proj.", "attn_q."},
       {"self_attn.k_proj.", "attn_k."},
       {"self_attn.v_proj.", "attn_v."},
       {"self_attn.o_proj.", "attn_output."},
       {"self_attn.q_norm.", "attn_q_norm."},
       {"self_attn.k_norm.", "attn_k_norm."},
       {"input_layernorm.", "attn_norm."},
       {"post_attention_layernorm.", "ffn_norm."},
       {"mlp.gate_proj.", "ffn_gate."},
       {"mlp.up_proj.", "ffn_up."},
       {"mlp.down_proj.", "ffn_down."},
       // Routed experts (qwen3moe): the router, and the experts stacked [E, rows, cols].
       {"mlp.gate.", "ffn_gate_inp."},
       {"mlp.switch_mlp.gate_proj.", "ffn_gate_exps."},
       {"mlp.switch_mlp.up_proj.", "ffn_up_exps."},
       {"mlp.switch_mlp.down_proj.", "ffn_down_exps."}},
      "",
      ""};
  return n;
}

}  // namespace

const TensorNames& llama_tensor_names() { return llama_names(); }

namespace {

struct Layer {
  RmsNorm attn_norm, ffn_norm;
  AttentionWeights attn;
  MlpWeights mlp;  // FfnKind::kDense
  MoeWeights moe;  // FfnKind::kRoutedExperts
};

class LlamaModel final : public Transformer {
 public:
  LlamaModel(ModelConfig c, const LlamaVariant& v) : Transformer(std::move(c)), variant_(v) {}
  Status bind(const formats::ModelFiles& files);

 private:
  void layer_forward(int l, const LayerBatch& b) override;
  LlamaVariant variant_;
  std::vector<Layer> layers_;
  MoeScratch moe_s_;
};

Status LlamaModel::bind(const formats::ModelFiles& files) {
  WeightBinder b(files, llama_names());
  const ModelConfig& c = cfg_;
  const float eps = static_cast<float>(c.rms_eps);
  LARDER_ASSIGN_OR_RETURN(const bool tied, bind_head(b, variant_.default_tied));
  attn_opt_.qkv_bias = variant_.qkv_bias;
  attn_opt_.pairing = c.from_gguf ? variant_.gguf_pairing : variant_.hf_pairing;
  LayerSpec spec;
  spec.kind = LayerKind::kFull;
  spec.n_heads = static_cast<int>(c.n_heads);
  spec.n_kv_heads = static_cast<int>(c.n_kv_heads);
  spec.head_dim = static_cast<int>(c.head_dim);
  spec.rope_dim = static_cast<int>(c.rope_dim);
  spec.rope = 0;
  // yarn scales q and k by its attention factor (mlx-lm's YarnRoPE): the scores by its square.
  const double af = rope_attention_factor(c);
  spec.attn_scale = static_cast<float>(af * af / std::sqrt(static_cast<double>(c.head_dim)));
  spec.norms.qk = variant_.qk_norm;
  declare_state(spec);
  kernels::RouteParams route;
  route.order = variant_.route_order;
  route.select = variant_.route_select;
  route.renormalize = c.moe.norm_topk_prob;
  specs_.clear();
  layers_.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = strfmt("model.layers.%lld.", static_cast<long long>(l));
    Layer& L = layers_[static_cast<size_t>(l)];
    const bool routed = c.moe.n_experts > 0 && c.moe.routed[static_cast<size_t>(l)];
    spec.ffn = routed ? FfnKind::kRoutedExperts : FfnKind::kDense;
    spec.experts = routed ? ExpertDims{static_cast<int>(c.moe.n_experts), static_cast<int>(c.moe.n_used), c.moe.ffn}
                          : ExpertDims{};
    specs_.push_back(spec);
    LARDER_ASSIGN_OR_RETURN(L.attn_norm.weight, b.vector(p + "input_layernorm.weight", c.hidden, "hidden_size"));
    LARDER_ASSIGN_OR_RETURN(L.ffn_norm.weight, b.vector(p + "post_attention_layernorm.weight", c.hidden, "hidden_size"));
    L.attn_norm.eps = L.ffn_norm.eps = eps;
    LARDER_RETURN_IF_ERROR(bind_attention(b, p + "self_attn.", spec, c, attn_opt_, &L.attn));
    if (routed) {
      LARDER_RETURN_IF_ERROR(bind_moe(b, p + "mlp.", spec.experts, c.hidden, route, Activation::kSilu, &L.moe));
      count_experts(L.moe);
    } else {
      LARDER_RETURN_IF_ERROR(bind_mlp(b, p + "mlp.", c, Activation::kSilu, &L.mlp));
    }
  }
  std::vector<float> inv_freq = rope_inv_freq(c);
  // Llama 3 GGUFs carry the llama3 frequency scaling as a tensor of per-pair divisors instead of
  // metadata (llama.cpp's `rope_freqs.weight`, [rope_dim/2]).
  if (files.gguf) {
    if (const formats::TensorInfo* rf = files.gguf->tensors().find("rope_freqs.weight")) {
      if (rf->dtype != DType::kF32 || rf->numel() != c.rope_dim / 2)
        return invalid_argument(strfmt("[model] %s: tensor 'rope_freqs.weight' is %s %s, expected F32 [%lld]",
                                       files.path.c_str(), dtype_name(rf->dtype), rf->shape_str().c_str(),
                                       (long long)(c.rope_dim / 2)));
      const float* f = reinterpret_cast<const float*>(rf->data);
      for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] /= f[i];
    }
  }
  rope_tables_ = {std::move(inv_freq)};
  return finish_bind(files, b, tied);
}

void LlamaModel::layer_forward(int l, const LayerBatch& b) {
  const Layer& L = layers_[static_cast<size_t>(l)];
  const LayerSpec& spec = specs_[static_cast<size_t>(l)];
  const int64_t n = b.rows * cfg_.hidden;
  L.attn_norm.apply(b.x, b.rows, b.h);
  attend(l, L.attn, b, b.h, b.o);
  kernels::add(b.x, b.o, b.x, n);
  L.ffn_norm.apply(b.x, b.rows, b.h);
  if (spec.ffn == FfnKind::kRoutedExperts) moe_block(L.moe, b.h, b.rows, moe_s_, b.o, b.adapters);
  else mlp_block(L.mlp, b.h, b.rows, mlp_s_, b.o, b.adapters);
  kernels::add(b.x, b.o, b.x, n);
}

}  // namespace

Result<std::unique_ptr<Model>> make_llama_family(const formats::ModelFiles& files, ModelConfig config,
                                                 const LlamaVariant& variant) {
  auto m = std::make_unique<LlamaModel>(std::move(config), variant);
  LARDER_RETURN_IF_ERROR(m->bind(files));
  return std::unique_ptr<Model>(std::move(m));
}

Result<std::unique_ptr<Model>> load_llama(const formats::ModelFiles& files, ModelConfig config) {
  LlamaVariant v;
  v.default_tied = false;
  v.hf_pairing = kernels::RopePairing::kHalf;
  v.gguf_pairing = kernels::RopePairing::kInterleaved;
  return make_llama_family(files, std::move(config), v);
}

}  // namespace larder::models
