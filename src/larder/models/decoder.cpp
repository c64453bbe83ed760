#include "larder/models/decoder.h"

#include <cstring>
#include <vector>

#include "larder/core/log.h"
#include "larder/models/blocks/attention.h"
#include "larder/models/blocks/mlp.h"
#include "larder/models/blocks/norm.h"
#include "larder/models/blocks/rope.h"
#include "larder/models/weights.h"

namespace larder::models {

namespace {

struct Layer {
  RmsNorm attn_norm, ffn_norm;
  AttentionWeights attn;
  MlpWeights mlp;
};

class DecoderModel final : public Model {
 public:
  DecoderModel(ModelConfig c, const DecoderSpec& spec) : cfg_(std::move(c)), spec_(spec) {}

  Status bind(const formats::ModelFiles& files);

  const ModelInfo& info() const override { return info_; }
  memory::KvLayout kv_layout() const override {
    return {static_cast<int>(cfg_.n_layers), static_cast<int>(cfg_.n_kv_heads), static_cast<int>(cfg_.head_dim)};
  }
  Status forward_batch(std::span<const BatchItem> items) override;

 private:
  ModelConfig cfg_;
  DecoderSpec spec_;
  ModelInfo info_;
  AttentionOptions attn_opt_;
  std::vector<float> inv_freq_;
  kernels::WeightView embed_, lm_head_;
  RmsNorm final_norm_;
  std::vector<Layer> layers_;
  // Scratch, grown to the largest chunk seen (forward is single-threaded per model: the engine
  // thread owns it, system.md §4).
  std::vector<float> x_, h_, o_;
  std::vector<int64_t> positions_;
  std::vector<AttentionSeq> seqs_;
  std::vector<float> logits_buf_;
  std::vector<int64_t> logit_rows_;  // rows whose logits are wanted, in item order
  AttentionScratch attn_s_;
  MlpScratch mlp_s_;
};

// A per-layer tensor that the graph does not use means the config describes a different model
// than the weights (e.g. q/k/v biases with attention_bias unset): running without it would be
// silently wrong, so it is an error (mlx-lm's strict load refuses it too). Other leftovers
// (e.g. a vision tower, tied lm_head copies, precomputed rotary tables) are only reported.
Status check_unbound(const WeightBinder& b, const formats::ModelFiles& files, bool tied) {
  std::vector<std::string> ignored;
  for (const std::string& name : b.unbound()) {
    auto ends_with = [&](const char* s) {
      const size_t n = std::char_traits<char>::length(s);
      return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
    };
    if (ends_with("rotary_emb.inv_freq") || name == "rope_freqs.weight") continue;
    if (tied && (name == "lm_head.weight" || name == "output.weight")) continue;
    if (name.rfind("model.layers.", 0) == 0 || name.rfind("blk.", 0) == 0) {
      return invalid_argument(strfmt("[model] %s: tensor '%s' is not used by the graph config.json/metadata describes "
                                     "(check attention_bias, mlp_bias, model_type)",
                                     files.path.c_str(), name.c_str()));
    }
    ignored.push_back(name);
  }
  if (!ignored.empty()) {
    LARDER_LOG_WARN("[model] %s: ignoring %zu tensor(s) the architecture does not use, e.g. '%s'", files.path.c_str(),
                    ignored.size(), ignored.front().c_str());
  }
  return Status::ok();
}

Status DecoderModel::bind(const formats::ModelFiles& files) {
  WeightBinder b(files);
  const ModelConfig& c = cfg_;
  const float eps = static_cast<float>(c.rms_eps);
  const bool tied = c.tied_embeddings.value_or(spec_.default_tied);
  LARDER_ASSIGN_OR_RETURN(embed_, b.matrix("model.embed_tokens.weight", c.vocab, c.hidden, "vocab_size x hidden_size"));
  if (tied) {
    lm_head_ = embed_;
  } else {
    LARDER_ASSIGN_OR_RETURN(lm_head_, b.matrix("lm_head.weight", c.vocab, c.hidden, "vocab_size x hidden_size; "
                                                                                     "tie_word_embeddings is false"));
  }
  LARDER_ASSIGN_OR_RETURN(final_norm_.weight, b.vector("model.norm.weight", c.hidden, "hidden_size"));
  final_norm_.eps = eps;
  attn_opt_.qkv_bias = spec_.qkv_bias;
  attn_opt_.qk_norm = spec_.qk_norm;
  attn_opt_.pairing = c.from_gguf ? spec_.gguf_pairing : spec_.hf_pairing;
  layers_.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = strfmt("model.layers.%lld.", static_cast<long long>(l));
    Layer& L = layers_[static_cast<size_t>(l)];
    LARDER_ASSIGN_OR_RETURN(L.attn_norm.weight, b.vector(p + "input_layernorm.weight", c.hidden, "hidden_size"));
    LARDER_ASSIGN_OR_RETURN(L.ffn_norm.weight, b.vector(p + "post_attention_layernorm.weight", c.hidden, "hidden_size"));
    L.attn_norm.eps = L.ffn_norm.eps = eps;
    LARDER_RETURN_IF_ERROR(bind_attention(b, p + "self_attn.", c, attn_opt_, &L.attn));
    LARDER_RETURN_IF_ERROR(bind_mlp(b, p + "mlp.", c, &L.mlp));
  }
  LARDER_RETURN_IF_ERROR(check_unbound(b, files, tied));
  inv_freq_ = rope_inv_freq(c);
  // Llama 3 GGUFs carry the llama3 frequency scaling as a tensor of per-pair divisors instead of
  // metadata (llama.cpp's `rope_freqs.weight`, [rope_dim/2]).
  if (files.gguf) {
    if (const formats::TensorInfo* rf = files.gguf->tensors().find("rope_freqs.weight")) {
      if (rf->dtype != DType::kF32 || rf->numel() != c.rope_dim / 2)
        return invalid_argument(strfmt("[model] %s: tensor 'rope_freqs.weight' is %s %s, expected F32 [%lld]",
                                       files.path.c_str(), dtype_name(rf->dtype), rf->shape_str().c_str(),
                                       (long long)(c.rope_dim / 2)));
      const float* f = reinterpret_cast<const float*>(rf->data);
      for (size_t i = 0; i < inv_freq_.size(); ++i) inv_freq_[i] /= f[i];
    }
  }

  info_.architecture = c.architecture;
  info_.n_layers = c.n_layers;
  info_.hidden = c.hidden;
  info_.n_heads = c.n_heads;
  info_.n_kv_heads = c.n_kv_heads;
  info_.head_dim = c.head_dim;
  info_.ffn = c.ffn;
  info_.vocab = c.vocab;
  info_.max_context = c.max_context;
  info_.rope_theta = c.rope_theta;
  info_.tied_embeddings = tied;
  info_.weight_dtypes = b.weight_dtypes();
  info_.n_params = b.n_params();
  info_.eos_ids = c.eos_ids;
  info_.bos_id = c.bos_id;
  return Status::ok();
}

Status DecoderModel::forward_batch(std::span<const BatchItem> items) {
  const ModelConfig& c = cfg_;
  if (items.empty()) return invalid_argument("[model] forward needs at least one sequence");
  // Validate everything before touching any cache, so a bad item fails the call cleanly.
  int64_t rows = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& it = items[i];
    if (it.cache == nullptr || it.logits == nullptr) return invalid_argument("[model] forward item without cache or logits");
    for (size_t j = 0; j < i; ++j) {
      if (items[j].cache == it.cache) return invalid_argument("[model] forward_batch: two items share one KV cache");
    }
    const int64_t n = it.n;
    if (n <= 0) return invalid_argument(strfmt("[model] forward needs at least one token, got %lld", (long long)n));
    if (!(it.cache->layout() == kv_layout()))
      return invalid_argument("[model] KV cache layout does not match the model (layers, kv heads, head_dim)");
    const int64_t pos0 = it.cache->length();
    if (pos0 + n > c.max_context) {
      return invalid_argument(strfmt("[model] sequence of %lld tokens (%lld cached + %lld new) exceeds the model "
                                     "context of %lld tokens",
                                     (long long)(pos0 + n), (long long)pos0, (long long)n, (long long)c.max_context));
    }
    for (int64_t t = 0; t < n; ++t) {
      if (it.tokens[t] < 0 || it.tokens[t] >= c.vocab)
        return invalid_argument(strfmt("[model] token id %d at index %lld is outside the vocabulary [0, %lld)",
                                       it.tokens[t], (long long)t, (long long)c.vocab));
    }
    rows += n;
  }
  // reserve() only grows storage (lengths are unchanged until advance), so a later item failing
  // here still leaves every cache's contents as they were.
  for (const BatchItem& it : items) LARDER_RETURN_IF_ERROR(it.cache->reserve(it.n));

  const int64_t d = c.hidden;
  x_.resize(static_cast<size_t>(rows * d));
  h_.resize(static_cast<size_t>(rows * d));
  o_.resize(static_cast<size_t>(rows * d));
  positions_.resize(static_cast<size_t>(rows));
  seqs_.clear();
  logit_rows_.clear();
  int64_t r = 0;
  for (const BatchItem& it : items) {
    const int64_t pos0 = it.cache->length();
    seqs_.push_back({r, it.n, it.cache});
    for (int64_t t = 0; t < it.n; ++t, ++r) {
      kernels::dequant_row(embed_, it.tokens[t], x_.data() + r * d);
      positions_[static_cast<size_t>(r)] = pos0 + t;
      if (it.logits_all || t == it.n - 1) logit_rows_.push_back(r);
    }
  }
  const AttentionContext actx{&cfg_, &attn_opt_, inv_freq_.data()};
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const Layer& L = layers_[static_cast<size_t>(l)];
    L.attn_norm.apply(x_.data(), rows, h_.data());
    attention_block(actx, L.attn, h_.data(), rows, positions_.data(), static_cast<int>(l), seqs_, attn_s_, o_.data());
    kernels::add(x_.data(), o_.data(), x_.data(), rows * d);
    L.ffn_norm.apply(x_.data(), rows, h_.data());
    mlp_block(L.mlp, h_.data(), rows, mlp_s_, o_.data());
    kernels::add(x_.data(), o_.data(), x_.data(), rows * d);
  }
  for (const BatchItem& it : items) it.cache->advance(it.n);

  // The lm_head is the largest matrix: gather every wanted row and run it once.
  const int64_t lrows = static_cast<int64_t>(logit_rows_.size());
  for (int64_t i = 0; i < lrows; ++i) {
    std::memcpy(o_.data() + i * d, x_.data() + logit_rows_[static_cast<size_t>(i)] * d,
                static_cast<size_t>(d) * sizeof(float));
  }
  final_norm_.apply(o_.data(), lrows, h_.data());
  const int64_t V = c.vocab;
  if (items.size() == 1) {  // the common single-sequence case writes straight into the caller's buffer
    kernels::matmul(lm_head_, h_.data(), lrows, items[0].logits);
    return Status::ok();
  }
  logits_buf_.resize(static_cast<size_t>(lrows * V));
  kernels::matmul(lm_head_, h_.data(), lrows, logits_buf_.data());
  int64_t at = 0;
  for (const BatchItem& it : items) {
    const int64_t k = it.logits_all ? it.n : 1;
    std::memcpy(it.logits, logits_buf_.data() + at * V, static_cast<size_t>(k * V) * sizeof(float));
    at += k;
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Model>> make_decoder(const formats::ModelFiles& files, ModelConfig config,
                                            const DecoderSpec& spec) {
  auto m = std::make_unique<DecoderModel>(std::move(config), spec);
  LARDER_RETURN_IF_ERROR(m->bind(files));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace larder::models
