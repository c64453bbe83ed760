// transformer.h — the decoder stack every architecture shares, over its LayerSpecs:
//   x = embed(tokens) [· embed_scale]
//   per layer l: the architecture's composition over shared blocks (layer_forward)
//   logits = lm_head(final_norm(x))      (lm_head = embed when tied)
// The stack owns what does not depend on the architecture: batch validation, the per-sequence
// state check against the schema, positions, embedding lookup, the final norm and lm_head, the
// scratch buffers, and publishing the new tokens to every state. An architecture file (llama.cpp,
// gemma3.cpp, ...) subclasses it: it parses its own hyper-parameters, declares its layers, binds
// its tensors through its own TensorNames table and composes each layer from blocks/.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "larder/formats/model_files.h"
#include "larder/kernels/ops.h"
#include "larder/models/blocks/attention.h"
#include "larder/models/blocks/mlp.h"
#include "larder/models/blocks/moe_block.h"
#include "larder/models/blocks/norm.h"
#include "larder/models/config.h"
#include "larder/models/model.h"
#include "larder/models/weights.h"

namespace larder::models {

// One layer's view of the batch: the residual stream and two work buffers of [rows, hidden],
// the rows' positions, and which rows belong to which sequence state.
struct LayerBatch {
  float* x;  // residual stream, updated in place
  float* h;
  float* o;
  int64_t rows;
  const int64_t* positions;
  const int32_t* tokens;  // row r's token id
  std::span<const AttentionSeq> seqs;
  AdapterRows adapters;  // the items' adapters as row runs: every projection of the layer takes them
};

class Transformer : public Model {
 public:
  const ModelInfo& info() const override { return info_; }
  std::span<const LayerSpec> layers() const override { return specs_; }
  const memory::StateSchema& state_schema() const override { return schema_; }
  std::span<const ProjectionInfo> projections() const override { return projections_; }
  Status set_kv_dtype(DType dt) override;
  void extend_context(int64_t n) override {
    if (n > cfg_.max_context) cfg_.max_context = info_.max_context = n;
  }
  Status forward_batch(std::span<const BatchItem> items) final;

 protected:
  explicit Transformer(ModelConfig c) : cfg_(std::move(c)) {}

  // Runs layer l over the batch (x in, x out).
  virtual void layer_forward(int l, const LayerBatch& b) = 0;
  // Once per forward, after the embedding and before layer 0 (Gemma 4 computes its per-layer
  // token embeddings here).
  virtual void begin_batch(const LayerBatch&) {}

  // Binds the token embedding, the lm_head (the embedding when tied) and the final norm by
  // canonical names, "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight", and
  // returns whether the embeddings are tied: never when the checkpoint carries a head (it is
  // used, as mlx-lm and transformers do); otherwise as tie_word_embeddings says, or
  // `family_default` when the config does not say (GGUF: output.weight decides, config.cpp).
  Result<bool> bind_head(WeightBinder& b, bool family_default);
  // After the architecture bound everything: derives the state schema from specs_, rejects
  // leftover per-layer tensors (see check_unbound) and fills info_.
  Status finish_bind(const formats::ModelFiles& files, const WeightBinder& b, bool tied);
  // A routed-experts layer, bound: its experts' bytes (all, and the k of E a token reads) and E, k
  // into info_ (`larder info`, the fit estimate).
  void count_experts(const MoeWeights& w);
  // Layer l's self-attention over the batch's rows: attention_block on `in` (normed, [rows,
  // hidden]) into `out` with the layer's spec and RoPE table and attn_opt_; `keep` as
  // AttentionCall::keep (KV sharing).
  void attend(int l, const AttentionWeights& w, const LayerBatch& b, const float* in, float* out,
              std::vector<KvKeep>* keep = nullptr);

  ModelConfig cfg_;
  ModelInfo info_;
  std::vector<LayerSpec> specs_;
  memory::StateSchema schema_;
  std::vector<std::vector<float>> rope_tables_;  // LayerSpec::rope indexes this
  kernels::WeightView embed_;
  Projection lm_head_;  // over embed_ when tied
  float embed_scale_ = 1.0f;  // Gemma multiplies embeddings by √hidden
  float logit_softcap_ = 0;   // > 0: logits = cap · tanh(logits / cap) (Gemma 2/4 final_logit_softcapping)
  RmsNorm final_norm_;
  AttentionOptions attn_opt_;  // set by the architecture's bind
  // Scratch of the layer compositions, grown to the largest batch seen (forward is
  // single-threaded per model: the engine thread owns it, system.md §4).
  AttentionScratch attn_s_;
  MlpScratch mlp_s_;

 private:
  Status check_state(const memory::SequenceState& s) const;
  std::vector<float> x_, h_, o_;
  std::vector<int64_t> positions_;
  std::vector<int32_t> tokens_;
  std::vector<AttentionSeq> seqs_;
  std::vector<float> logits_buf_;
  std::vector<int64_t> logit_rows_;  // rows whose logits are wanted, in item order
  std::vector<ProjectionInfo> projections_;
  std::vector<AdapterRun> adapter_runs_, head_runs_;  // per layer rows; per lm_head rows
};

// A per-layer tensor that the graph does not use means the config describes a different model
// than the weights (e.g. q/k/v biases with attention_bias unset): running without it would be
// silently wrong, so it is an error (mlx-lm's strict load refuses it too). Other leftovers
// (e.g. a vision tower, tied lm_head copies, precomputed rotary tables) are only reported.
Status check_unbound(const WeightBinder& b, const formats::ModelFiles& files, bool tied);

}  // namespace larder::models
