#include "larder/models/transformer.h"

#include <cmath>
#include <cstring>

#include "larder/core/log.h"
#include "larder/core/profile.h"

namespace larder::models {

Status check_unbound(const WeightBinder& b, const formats::ModelFiles& files, bool tied) {
  std::vector<std::string> ignored;
  const std::string layer_prefix = b.names().layer_prefix(files.gguf != nullptr);
  const std::string lm_head = b.file_name("lm_head.weight");
  for (const std::string& name : b.unbound()) {
    auto ends_with = [&](const char* s) {
      const size_t n = std::char_traits<char>::length(s);
      return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
    };
    if (ends_with("rotary_emb.inv_freq") || name == "rope_freqs.weight") continue;
    if (tied && (name == lm_head || name == "lm_head.weight" || name == "output.weight")) continue;
    if (name.rfind(layer_prefix, 0) == 0) {
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

Result<bool> Transformer::bind_head(WeightBinder& b, bool family_default) {
  const ModelConfig& c = cfg_;
  LARDER_ASSIGN_OR_RETURN(embed_, b.matrix("model.embed_tokens.weight", c.vocab, c.hidden, "vocab_size x hidden_size"));
  // A head the checkpoint carries is the one it was trained with: mlx-lm's gemma3_text unties
  // whenever the file has lm_head.weight, whatever the config says, and transformers (5.x,
  // tie_weights) keeps a head that differs from the embedding even under tie_word_embeddings:
  // true. Only without a head does the config (or, when it is silent, the family's default)
  // decide — and then it must say tied.
  const bool has_head = b.has("lm_head.weight");
  if (has_head && c.tied_embeddings.value_or(false)) {
    LARDER_LOG_WARN("[model] %s sets tie_word_embeddings: true, but the checkpoint carries its own '%s': larder uses "
                    "it, as transformers does (set tie_word_embeddings: false to silence this)",
                    c.source.c_str(), b.file_name("lm_head.weight").c_str());
  }
  const bool tied = !has_head && c.tied_embeddings.value_or(family_default);
  if (tied) {
    lm_head_ = b.projection_over("lm_head", embed_);
  } else {
    const char* why = has_head ? "vocab_size x hidden_size"
                      : c.tied_embeddings ? "vocab_size x hidden_size; tie_word_embeddings is false"
                                          : "vocab_size x hidden_size; config.json does not set tie_word_embeddings "
                                            "and this architecture's default is untied";
    LARDER_ASSIGN_OR_RETURN(lm_head_, b.projection({.module = "lm_head", .out = c.vocab, .in = c.hidden, .why = why}));
  }
  LARDER_ASSIGN_OR_RETURN(final_norm_.weight, b.vector("model.norm.weight", c.hidden, "hidden_size"));
  final_norm_.eps = static_cast<float>(c.rms_eps);
  return tied;
}

Status Transformer::finish_bind(const formats::ModelFiles& files, const WeightBinder& b, bool tied) {
  const ModelConfig& c = cfg_;
  LARDER_CHECK(static_cast<int64_t>(specs_.size()) == c.n_layers, "one LayerSpec per layer");
  schema_ = state_schema_of(specs_);
  LARDER_RETURN_IF_ERROR(schema_.validate());
  LARDER_RETURN_IF_ERROR(check_unbound(b, files, tied));
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
  for (const LayerSpec& s : specs_)
    if (s.kind == LayerKind::kSliding) info_.sliding_window = std::max(info_.sliding_window, s.window);
  info_.tied_embeddings = tied;
  info_.weight_dtypes = b.weight_dtypes();
  info_.n_params = b.n_params();
  info_.eos_ids = c.eos_ids;
  info_.bos_id = c.bos_id;
  projections_ = b.projections();
  return Status::ok();
}

void Transformer::count_experts(const MoeWeights& w) {
  info_.n_experts = w.route.n_experts;
  info_.n_experts_used = w.route.k;
  info_.expert_bytes += w.expert_bytes();
  info_.active_expert_bytes += w.active_expert_bytes();
}

void Transformer::attend(int l, const AttentionWeights& w, const LayerBatch& b, const float* in, float* out,
                         std::vector<KvKeep>* keep) {
  const LayerSpec& spec = specs_[static_cast<size_t>(l)];
  attention_block({.spec = &spec,
                   .opt = &attn_opt_,
                   .inv_freq = rope_tables_[static_cast<size_t>(spec.rope)].data(),
                   .w = &w,
                   .layer = l,
                   .h = in,
                   .rows = b.rows,
                   .positions = b.positions,
                   .seqs = b.seqs,
                   .keep = keep,
                   .adapters = b.adapters},
                  attn_s_, out);
}

Status Transformer::set_kv_dtype(DType dt) {
  memory::StateSchema next = schema_;
  next.kv_dtype = dt;
  LARDER_RETURN_IF_ERROR(next.validate());
  schema_ = std::move(next);
  return Status::ok();
}

Status Transformer::check_state(const memory::SequenceState& s) const {
  const bool fits = s.slots.size() == schema_.layers.size() && s.kv.layout() == schema_.plain_layout() &&
                    s.layers.size() == [&] {
                      size_t n = 0;
                      for (const auto& l : schema_.layers) n += l.kind != memory::StateKind::kPlainKv;
                      return n;
                    }();
  if (!fits)
    return invalid_argument(strfmt("[model] sequence state does not match the model's %zu layers (make it with "
                                   "Model::new_state)",
                                   specs_.size()));
  for (size_t i = 0; i < schema_.layers.size(); ++i) {
    const memory::LayerSlot& slot = s.slots[i];
    if (slot.kind != schema_.layers[i].kind ||
        (slot.kind != memory::StateKind::kPlainKv &&
         s.layers[static_cast<size_t>(slot.index)]->kind() != slot.kind))
      return invalid_argument(strfmt("[model] sequence state slot %zu is %s, layer %zu needs %s", i,
                                     memory::state_kind_name(slot.kind), i,
                                     memory::state_kind_name(schema_.layers[i].kind)));
    if (slot.kind == memory::StateKind::kRing) {
      const auto* r = static_cast<const memory::RingState*>(s.layers[static_cast<size_t>(slot.index)].get());
      const memory::LayerStateSpec& want = schema_.layers[i];
      if (r->window() != want.window || r->n_heads() != want.n_kv_heads || r->head_dim() != want.head_dim)
        return invalid_argument(strfmt("[model] sequence state slot %zu is %s, layer %zu needs window %lld", i,
                                       r->signature().c_str(), i, (long long)want.window));
    }
    if (slot.kind == memory::StateKind::kRecurrent) {
      const auto* r = static_cast<const memory::RecurrentState*>(s.layers[static_cast<size_t>(slot.index)].get());
      const memory::LayerStateSpec& want = schema_.layers[i];
      if (r->conv_k() != want.conv_k || r->conv_dim() != want.conv_dim || r->n_heads() != want.n_heads ||
          r->dk() != want.dk || r->dv() != want.dv)
        return invalid_argument(strfmt("[model] sequence state slot %zu is %s, layer %zu needs conv %d x %d and "
                                       "%d heads of %d x %d",
                                       i, r->signature().c_str(), i, want.conv_k, want.conv_dim, want.n_heads,
                                       want.dv, want.dk));
    }
  }
  return s.consistent();
}

Status Transformer::forward_batch(std::span<const BatchItem> items) {
  const ModelConfig& c = cfg_;
  if (items.empty()) return invalid_argument("[model] forward needs at least one sequence");
  // Validate everything before touching any state, so a bad item fails the call cleanly.
  int64_t rows = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& it = items[i];
    if (it.state == nullptr || it.logits == nullptr) return invalid_argument("[model] forward item without state or logits");
    for (size_t j = 0; j < i; ++j) {
      if (items[j].state == it.state) return invalid_argument("[model] forward_batch: two items share one sequence state");
    }
    const int64_t n = it.n;
    if (n <= 0) return invalid_argument(strfmt("[model] forward needs at least one token, got %lld", (long long)n));
    LARDER_RETURN_IF_ERROR(check_state(*it.state));
    const int64_t pos0 = it.state->length();
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
    for (const AdapterUse& a : it.adapters) {
      if (a.adapter == nullptr || a.adapter->deltas.size() > projections_.size())
        return invalid_argument(strfmt("[model] forward item %zu: an adapter %s", i,
                                       a.adapter ? "with more deltas than the model has projections" : "that is null"));
    }
    rows += n;
  }
  // Profiling (core/profile.h): the forward's self time is what no op scope covers — embedding
  // scaling, the K/V copies into the cache, biases, row gathers.
  profile::Scope prof_scope("forward (self: copies, KV write, glue)");
  // reserve() only grows storage (lengths are unchanged until advance), so a later item failing
  // here still leaves every state's contents as they were. Rings need no reservation.
  for (const BatchItem& it : items) LARDER_RETURN_IF_ERROR(it.state->kv.reserve(it.n));

  const int64_t d = c.hidden;
  x_.resize(static_cast<size_t>(rows * d));
  h_.resize(static_cast<size_t>(rows * d));
  o_.resize(static_cast<size_t>(rows * d));
  positions_.resize(static_cast<size_t>(rows));
  tokens_.resize(static_cast<size_t>(rows));
  seqs_.clear();
  logit_rows_.clear();
  adapter_runs_.clear();
  head_runs_.clear();
  int64_t r = 0;
  for (const BatchItem& it : items) {
    const int64_t pos0 = it.state->length();
    seqs_.push_back({r, it.n, it.state});
    // The item's adapters on its rows, and on its rows of the lm_head call (logit rows, in order).
    const int64_t head0 = static_cast<int64_t>(logit_rows_.size()), head_n = it.logits_all ? it.n : 1;
    for (const AdapterUse& a : it.adapters) {
      adapter_runs_.push_back({r, it.n, a.adapter, a.scale});
      head_runs_.push_back({head0, head_n, a.adapter, a.scale});
    }
    for (int64_t t = 0; t < it.n; ++t, ++r) {
      float* xr = x_.data() + r * d;
      kernels::dequant_row(embed_, it.tokens[t], xr);
      if (embed_scale_ != 1.0f)
        for (int64_t i = 0; i < d; ++i) xr[i] *= embed_scale_;
      positions_[static_cast<size_t>(r)] = pos0 + t;
      tokens_[static_cast<size_t>(r)] = it.tokens[t];
      if (it.logits_all || t == it.n - 1) logit_rows_.push_back(r);
    }
  }
  const LayerBatch lb{x_.data(), h_.data(), o_.data(), rows, positions_.data(), tokens_.data(), seqs_, adapter_runs_};
  begin_batch(lb);
  for (int64_t l = 0; l < c.n_layers; ++l) layer_forward(static_cast<int>(l), lb);
  for (const BatchItem& it : items) it.state->kv.advance(it.n);

  // The lm_head is the largest matrix: gather every wanted row and run it once.
  const int64_t lrows = static_cast<int64_t>(logit_rows_.size());
  for (int64_t i = 0; i < lrows; ++i) {
    std::memcpy(o_.data() + i * d, x_.data() + logit_rows_[static_cast<size_t>(i)] * d,
                static_cast<size_t>(d) * sizeof(float));
  }
  final_norm_.apply(o_.data(), lrows, h_.data());
  const int64_t V = c.vocab;
  auto softcap = [&](float* y) {
    if (logit_softcap_ <= 0) return;
    for (int64_t i = 0; i < lrows * V; ++i) y[i] = logit_softcap_ * std::tanh(y[i] / logit_softcap_);
  };
  if (items.size() == 1) {  // the common single-sequence case writes straight into the caller's buffer
    lm_head_.apply(h_.data(), lrows, items[0].logits, head_runs_);
    softcap(items[0].logits);
    return Status::ok();
  }
  logits_buf_.resize(static_cast<size_t>(lrows * V));
  lm_head_.apply(h_.data(), lrows, logits_buf_.data(), head_runs_);
  softcap(logits_buf_.data());
  int64_t at = 0;
  for (const BatchItem& it : items) {
    const int64_t k = it.logits_all ? it.n : 1;
    std::memcpy(it.logits, logits_buf_.data() + at * V, static_cast<size_t>(k * V) * sizeof(float));
    at += k;
  }
  return Status::ok();
}

}  // namespace larder::models
