// config.cpp — hyper-parameters from config.json (HF) and GGUF metadata.
#include "larder/models/config.h"

#include <cmath>
#include <optional>

#include "larder/core/log.h"

namespace larder::models {

using nlohmann::ordered_json;

namespace {

// Key lookup that treats JSON null like absence (HF writes e.g. "head_dim": null).
const ordered_json* jfind(const ordered_json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

Status read_int(const ordered_json& j, const char* key, const std::string& src, bool required, int64_t* out) {
  const ordered_json* v = jfind(j, key);
  if (!v) {
    if (required) return invalid_argument(strfmt("[config] %s: missing required key '%s'", src.c_str(), key));
    return Status::ok();
  }
  if (!v->is_number_integer() && !(v->is_number_float() && std::floor(v->get<double>()) == v->get<double>()))
    return invalid_argument(strfmt("[config] %s: key '%s' must be an integer, got %s", src.c_str(), key, v->dump().c_str()));
  *out = v->is_number_integer() ? v->get<int64_t>() : static_cast<int64_t>(v->get<double>());
  return Status::ok();
}

Status read_double(const ordered_json& j, const char* key, const std::string& src, double* out) {
  const ordered_json* v = jfind(j, key);
  if (!v) return Status::ok();
  if (!v->is_number()) return invalid_argument(strfmt("[config] %s: key '%s' must be a number, got %s", src.c_str(), key, v->dump().c_str()));
  *out = v->get<double>();
  return Status::ok();
}

// eos_token_id: an int or a list of ints; appended without duplicates.
void read_ids(const ordered_json& j, const char* key, std::vector<int32_t>* out) {
  const ordered_json* v = jfind(j, key);
  if (!v) return;
  auto push = [&](const ordered_json& e) {
    if (!e.is_number_integer()) return;
    const int32_t id = e.get<int32_t>();
    for (int32_t x : *out) if (x == id) return;
    out->push_back(id);
  };
  if (v->is_array()) for (const auto& e : *v) push(e);
  else push(*v);
}

Status parse_rope_scaling(const ordered_json& rs, const std::string& src, RopeScaling* out) {
  if (!rs.is_object()) return Status::ok();
  const ordered_json* t = jfind(rs, "rope_type");
  if (!t) t = jfind(rs, "type");
  if (t && t->is_string()) out->type = t->get<std::string>();
  LARDER_RETURN_IF_ERROR(read_double(rs, "factor", src, &out->factor));
  LARDER_RETURN_IF_ERROR(read_double(rs, "low_freq_factor", src, &out->low_freq_factor));
  LARDER_RETURN_IF_ERROR(read_double(rs, "high_freq_factor", src, &out->high_freq_factor));
  LARDER_RETURN_IF_ERROR(read_int(rs, "original_max_position_embeddings", src, false, &out->original_max_position));
  if (out->type == "default") out->type.clear();
  if (!out->type.empty() && out->type != "llama3" && out->type != "linear" && out->type != "yarn")
    return unsupported(strfmt("[config] %s: rope_scaling type '%s' is not supported (supported: llama3, linear, yarn)",
                              src.c_str(), out->type.c_str()));
  if (!(out->factor > 0)) return invalid_argument(strfmt("[config] %s: rope_scaling factor must be > 0", src.c_str()));
  if (out->type == "yarn") {
    // transformers reads beta_fast/beta_slow with `or` (null or 0: the paper's 32 / 1).
    for (auto [key, dst] : {std::pair{"beta_fast", &out->beta_fast}, std::pair{"beta_slow", &out->beta_slow}}) {
      double v = 0;
      LARDER_RETURN_IF_ERROR(read_double(rs, key, src, &v));
      if (v != 0) *dst = v;
    }
    for (auto [key, dst] : {std::pair{"attention_factor", &out->attention_factor}, std::pair{"mscale", &out->mscale},
                            std::pair{"mscale_all_dim", &out->mscale_all_dim}}) {
      if (!jfind(rs, key) || rs[key].is_null()) continue;
      double v = 0;
      LARDER_RETURN_IF_ERROR(read_double(rs, key, src, &v));
      *dst = v;
    }
    if (const ordered_json* t = jfind(rs, "truncate"); t && !t->is_null()) {
      if (!t->is_boolean())
        return invalid_argument(strfmt("[config] %s: rope_scaling 'truncate' must be true or false", src.c_str()));
      out->truncate = t->get<bool>();
    }
    if (!(out->beta_fast > 0) || !(out->beta_slow > 0) || out->original_max_position <= 0)
      return invalid_argument(strfmt("[config] %s: yarn rope_scaling needs beta_fast, beta_slow and "
                                     "original_max_position_embeddings > 0", src.c_str()));
  }
  return Status::ok();
}

// Key names in messages are config.json's; for a GGUF the message says which metadata it came from.
Status validate(const ModelConfig& c) {
  const std::string src = c.from_gguf ? c.source + " (GGUF metadata)" : c.source;
  const char* s = src.c_str();
  struct { const char* name; int64_t v; } pos[] = {
      {"num_hidden_layers", c.n_layers}, {"hidden_size", c.hidden}, {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", c.n_kv_heads}, {"head_dim", c.head_dim}, {"intermediate_size", c.ffn},
      {"vocab_size", c.vocab}, {"max_position_embeddings", c.max_context}};
  for (auto& p : pos)
    if (p.v <= 0) return invalid_argument(strfmt("[config] %s: %s must be positive, got %lld", s, p.name, (long long)p.v));
  if (c.n_heads % c.n_kv_heads != 0)
    return invalid_argument(strfmt("[config] %s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld",
                                   s, (long long)c.n_heads, (long long)c.n_kv_heads));
  if (c.rope_dim <= 0 || c.rope_dim > c.head_dim || c.rope_dim % 2 != 0)
    return invalid_argument(strfmt("[config] %s: rotary dims %lld must be even and in (0, head_dim=%lld]", s,
                                   (long long)c.rope_dim, (long long)c.head_dim));
  if (!(c.rope_theta > 0)) return invalid_argument(strfmt("[config] %s: rope_theta must be > 0", s));
  if (!(c.rms_eps > 0)) return invalid_argument(strfmt("[config] %s: rms_norm_eps must be > 0", s));
  return Status::ok();
}

bool valid_bits(int64_t b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }
bool valid_group(int64_t g) { return g == 32 || g == 64 || g == 128; }

// bits/group_size/mode of one block level (`where` names it in messages). Absent or null keys keep
// *p's values (the caller pre-fills the defaults it wants); a `mode` other than *p's first resets
// bits and group_size to that mode's defaults, as mlx's to_quantized(**params) does; `defaulted`
// says whether bits or group_size had to be taken from defaults.
Status read_affine(const ordered_json& j, const std::string& src, const std::string& where, AffineParams* p,
                   bool* defaulted) {
  if (const ordered_json* m = jfind(j, "mode")) {
    if (!m->is_string())
      return invalid_argument(strfmt("[config] %s: %s 'mode' must be a string, got %s", src.c_str(), where.c_str(),
                                     m->dump().c_str()));
    const std::optional<QuantMode> mode = quant_mode_from_name(m->get<std::string>());
    if (!mode)
      return unsupported(strfmt("[config] %s: %s mode '%s' is not supported (supported: affine, mxfp4, nvfp4, mxfp8)",
                                src.c_str(), where.c_str(), m->get<std::string>().c_str()));
    if (*mode != p->mode) {
      p->mode = *mode;
      p->bits = quant_mode_default_bits(*mode);
      p->group_size = quant_mode_default_group(*mode);
    }
  }
  if (const ordered_json* gs = jfind(j, "global_scale"); gs && !(gs->is_boolean() && !gs->get<bool>()))
    return unsupported(strfmt("[config] %s: %s has 'global_scale' (mlx-lm's per-tensor nvfp4 scale of switch layers), "
                              "which larder does not run",
                              src.c_str(), where.c_str()));
  int64_t bits = p->bits, g = p->group_size;
  if (!jfind(j, "bits") || !jfind(j, "group_size")) *defaulted = true;
  LARDER_RETURN_IF_ERROR(read_int(j, "bits", src, false, &bits));
  LARDER_RETURN_IF_ERROR(read_int(j, "group_size", src, false, &g));
  if (p->mode == QuantMode::kAffine) {
    if (!valid_bits(bits))
      return unsupported(strfmt("[config] %s: %s bits %lld is not supported (supported: 2, 3, 4, 5, 6, 8)", src.c_str(),
                                where.c_str(), (long long)bits));
    if (!valid_group(g))
      return unsupported(strfmt("[config] %s: %s group_size %lld is not supported (supported: 32, 64, 128)",
                                src.c_str(), where.c_str(), (long long)g));
  } else if (bits != quant_mode_default_bits(p->mode) || g != quant_mode_default_group(p->mode)) {
    // Each microscaling mode has one layout (mx.quantize refuses any other).
    return unsupported(strfmt("[config] %s: %s mode '%s' with bits %lld, group_size %lld is not supported (%s is "
                              "bits %d, group_size %d)",
                              src.c_str(), where.c_str(), quant_mode_name(p->mode), (long long)bits, (long long)g,
                              quant_mode_name(p->mode), quant_mode_default_bits(p->mode),
                              quant_mode_default_group(p->mode)));
  }
  p->bits = static_cast<int>(bits);
  p->group_size = static_cast<int>(g);
  return Status::ok();
}

}  // namespace

const char* quant_mode_name(QuantMode m) {
  switch (m) {
    case QuantMode::kMxfp4: return "mxfp4";
    case QuantMode::kNvfp4: return "nvfp4";
    case QuantMode::kMxfp8: return "mxfp8";
    default: return "affine";
  }
}
std::optional<QuantMode> quant_mode_from_name(std::string_view name) {
  for (QuantMode m : {QuantMode::kAffine, QuantMode::kMxfp4, QuantMode::kNvfp4, QuantMode::kMxfp8})
    if (name == quant_mode_name(m)) return m;
  return std::nullopt;
}
int quant_mode_default_bits(QuantMode m) { return m == QuantMode::kMxfp8 ? 8 : 4; }
int quant_mode_default_group(QuantMode m) {
  return m == QuantMode::kAffine ? 64 : m == QuantMode::kNvfp4 ? 16 : 32;
}

Result<QuantizationConfig> quantization_from_config(const ordered_json& config, const std::string& src) {
  QuantizationConfig q;
  const char* key = "quantization";
  const ordered_json* block = jfind(config, key);
  if (!block) {
    key = "quantization_config";
    block = jfind(config, key);
  }
  if (!block) return q;
  if (!block->is_object())
    return invalid_argument(strfmt("[config] %s: '%s' must be an object, got %s", src.c_str(), key, block->dump().c_str()));
  if (const ordered_json* qm = jfind(*block, "quant_method")) {
    // OpenAI's gpt-oss checkpoints: {"quant_method": "mxfp4", "modules_to_not_convert": [...]}.
    // mlx-lm reads it as a top-level mxfp4 block (utils.load_model) and quantizes only the modules
    // whose scales the checkpoint holds, ignoring the list; so does the binder (the experts'
    // `*_blocks`/`*_scales`, WeightBinder::mxfp4_block_experts).
    if (*qm == "mxfp4") {
      q.present = true;
      q.openai_mxfp4 = true;
      q.global = AffineParams{4, 32, QuantMode::kMxfp4};
      return q;
    }
    return unsupported(strfmt("[config] %s: %s.quant_method %s is not supported (larder executes MLX quantized "
                              "checkpoints: a block of bits, group_size, mode \"affine\", \"mxfp4\", \"nvfp4\" or "
                              "\"mxfp8\"; and quant_method \"mxfp4\", OpenAI's gpt-oss experts)",
                              src.c_str(), key, qm->dump().c_str()));
  }
  if (!jfind(*block, "bits") || !jfind(*block, "group_size"))
    return invalid_argument(strfmt("[config] %s: '%s' needs top-level 'bits' and 'group_size'", src.c_str(), key));
  q.present = true;
  bool defaulted = false;
  LARDER_RETURN_IF_ERROR(read_affine(*block, src, std::string("'") + key + "'", &q.global, &defaulted));
  for (auto it = block->begin(); it != block->end(); ++it) {
    const std::string& k = it.key();
    if (k == "bits" || k == "group_size" || k == "mode") continue;
    const std::string where = std::string("'") + key + "." + k + "'";
    const ordered_json& v = it.value();
    if (v.is_boolean()) {
      q.modules[k] = v.get<bool>() ? std::optional<AffineParams>(q.global) : std::nullopt;
    } else if (v.is_object()) {
      // mlx-lm passes the dict as keyword arguments to the module's quantize call, whose defaults
      // are affine / 4 bits / group 64, or the given mode's (quantization.md §3.2) — not the
      // top-level values.
      AffineParams p;
      bool filled = false;
      LARDER_RETURN_IF_ERROR(read_affine(v, src, where, &p, &filled));
      if (filled && p.mode == QuantMode::kAffine)
        LARDER_LOG_WARN("[config] %s: %s lacks bits or group_size; using mlx-lm's defaults (%d bits, group %d)",
                        src.c_str(), where.c_str(), p.bits, p.group_size);
      q.modules[k] = p;
    } else {
      return invalid_argument(strfmt("[config] %s: %s must be true, false or {bits, group_size, mode}, got %s",
                                     src.c_str(), where.c_str(), v.dump().c_str()));
    }
  }
  return q;
}

Result<std::string> architecture_of(const formats::ModelFiles& files) {
  if (files.gguf) {
    std::string a = files.gguf->architecture();
    if (a.empty()) return invalid_argument(strfmt("[config] %s: GGUF has no general.architecture", files.path.c_str()));
    return a;
  }
  const ordered_json* mt = jfind(files.config, "model_type");
  if (!mt || !mt->is_string())
    return invalid_argument(strfmt("[config] %s/config.json: missing 'model_type'", files.path.c_str()));
  return mt->get<std::string>();
}

Result<ModelConfig> config_from_hf(const formats::ModelFiles& files) { return config_from_hf_json(files, files.config); }

Result<ModelConfig> config_from_hf_json(const formats::ModelFiles& files, const ordered_json& j) {
  ModelConfig c;
  c.source = files.path + "/config.json";
  const std::string& src = c.source;
  LARDER_ASSIGN_OR_RETURN(c.architecture, architecture_of(files));
  LARDER_RETURN_IF_ERROR(read_int(j, "num_hidden_layers", src, true, &c.n_layers));
  LARDER_RETURN_IF_ERROR(read_int(j, "hidden_size", src, true, &c.hidden));
  LARDER_RETURN_IF_ERROR(read_int(j, "num_attention_heads", src, true, &c.n_heads));
  c.n_kv_heads = c.n_heads;
  LARDER_RETURN_IF_ERROR(read_int(j, "num_key_value_heads", src, false, &c.n_kv_heads));
  LARDER_RETURN_IF_ERROR(read_int(j, "intermediate_size", src, true, &c.ffn));
  LARDER_RETURN_IF_ERROR(read_int(j, "vocab_size", src, true, &c.vocab));
  c.head_dim = c.n_heads > 0 ? c.hidden / c.n_heads : 0;
  LARDER_RETURN_IF_ERROR(read_int(j, "head_dim", src, false, &c.head_dim));
  c.max_context = 2048;
  LARDER_RETURN_IF_ERROR(read_int(j, "max_position_embeddings", src, false, &c.max_context));
  LARDER_RETURN_IF_ERROR(read_double(j, "rms_norm_eps", src, &c.rms_eps));
  // transformers >= 5 nests rope_theta and the scaling block under "rope_parameters".
  if (const ordered_json* rp = jfind(j, "rope_parameters")) {
    LARDER_RETURN_IF_ERROR(read_double(*rp, "rope_theta", src, &c.rope_theta));
    LARDER_RETURN_IF_ERROR(parse_rope_scaling(*rp, src, &c.rope_scaling));
  }
  LARDER_RETURN_IF_ERROR(read_double(j, "rope_theta", src, &c.rope_theta));
  if (const ordered_json* rs = jfind(j, "rope_scaling")) LARDER_RETURN_IF_ERROR(parse_rope_scaling(*rs, src, &c.rope_scaling));
  double partial = 1.0;
  LARDER_RETURN_IF_ERROR(read_double(j, "partial_rotary_factor", src, &partial));
  c.rope_dim = static_cast<int64_t>(std::lround(static_cast<double>(c.head_dim) * partial));
  if (const ordered_json* t = jfind(j, "tie_word_embeddings"); t && t->is_boolean()) c.tied_embeddings = t->get<bool>();
  if (const ordered_json* b = jfind(j, "attention_bias"); b && b->is_boolean()) c.attention_bias = b->get<bool>();
  if (const ordered_json* b = jfind(j, "mlp_bias"); b && b->is_boolean()) c.mlp_bias = b->get<bool>();
  read_ids(j, "eos_token_id", &c.eos_ids);
  read_ids(files.generation_config, "eos_token_id", &c.eos_ids);
  int64_t bos = -1;
  if (read_int(j, "bos_token_id", src, false, &bos).is_ok() && bos >= 0) c.bos_id = static_cast<int32_t>(bos);
  LARDER_ASSIGN_OR_RETURN(c.quantization, quantization_from_config(j, src));
  LARDER_RETURN_IF_ERROR(validate(c));
  return c;
}

Result<ModelConfig> config_from_gguf(const formats::GgufFile& g) {
  ModelConfig c;
  c.source = g.path();
  c.from_gguf = true;
  c.architecture = g.architecture();
  const std::string a = c.architecture;
  const char* s = c.source.c_str();
  // Some architectures (gemma4, gemma3n) store feed_forward_length / head_count_kv per layer, as
  // an integer array: the shared fields take layer 0's value and the architecture file reads the
  // rest.
  auto int_or_first = [&](const std::string& key) -> std::optional<int64_t> {
    const formats::GgufValue* v = g.find(key);
    if (v != nullptr && v->is_array() && !v->ints.empty()) return v->ints[0];
    return g.get_int(key);
  };
  auto need = [&](const std::string& key, int64_t* out) -> Status {
    auto v = int_or_first(key);
    if (!v) return invalid_argument(strfmt("[config] %s: missing GGUF metadata '%s'", s, key.c_str()));
    *out = *v;
    return Status::ok();
  };
  LARDER_RETURN_IF_ERROR(need(a + ".block_count", &c.n_layers));
  LARDER_RETURN_IF_ERROR(need(a + ".embedding_length", &c.hidden));
  LARDER_RETURN_IF_ERROR(need(a + ".attention.head_count", &c.n_heads));
  LARDER_RETURN_IF_ERROR(need(a + ".feed_forward_length", &c.ffn));
  c.n_kv_heads = int_or_first(a + ".attention.head_count_kv").value_or(c.n_heads);
  c.head_dim = g.get_int(a + ".attention.key_length").value_or(c.n_heads > 0 ? c.hidden / c.n_heads : 0);
  c.rope_dim = g.get_int(a + ".rope.dimension_count").value_or(c.head_dim);
  c.max_context = g.get_int(a + ".context_length").value_or(2048);
  c.rope_theta = g.get_float(a + ".rope.freq_base").value_or(10000.0);
  c.rms_eps = g.get_float(a + ".attention.layer_norm_rms_epsilon").value_or(1e-5);
  if (auto t = g.get_string(a + ".rope.scaling.type"); t && *t != "none") {
    c.rope_scaling.type = *t;
    c.rope_scaling.factor = g.get_float(a + ".rope.scaling.factor").value_or(1.0);
    c.rope_scaling.original_max_position = g.get_int(a + ".rope.scaling.original_context_length").value_or(c.max_context);
    if (c.rope_scaling.type == "yarn") {  // llama.cpp's keys; its defaults 32 / 1, always truncated
      c.rope_scaling.beta_fast = g.get_float(a + ".rope.scaling.yarn_beta_fast").value_or(32.0);
      c.rope_scaling.beta_slow = g.get_float(a + ".rope.scaling.yarn_beta_slow").value_or(1.0);
      if (c.rope_scaling.beta_fast <= 0) c.rope_scaling.beta_fast = 32.0;
      if (c.rope_scaling.beta_slow <= 0) c.rope_scaling.beta_slow = 1.0;
    } else if (c.rope_scaling.type != "linear")
      return unsupported(strfmt("[config] %s: GGUF rope scaling type '%s' is not supported", s, t->c_str()));
  }
  // Vocabulary: explicit key, else the embedding's row count (GGUF shapes are already reversed
  // to outermost-first, so token_embd.weight is [vocab, hidden]).
  if (auto v = g.get_int(a + ".vocab_size")) {
    c.vocab = *v;
  } else if (const auto* te = g.tensors().find("token_embd.weight"); te && te->rank() == 2) {
    c.vocab = te->dim(0);
  } else if (const auto* toks = g.find("tokenizer.ggml.tokens")) {
    c.vocab = static_cast<int64_t>(toks->array_size());
  }
  c.tied_embeddings = g.tensors().find("output.weight") == nullptr;
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    if (auto v = g.get_int(key); v && *v >= 0 && *v < (int64_t{1} << 31)) {
      bool dup = false;
      for (int32_t x : c.eos_ids) dup |= x == *v;
      if (!dup) c.eos_ids.push_back(static_cast<int32_t>(*v));
    }
  }
  if (auto v = g.get_int("tokenizer.ggml.bos_token_id"); v && *v >= 0 && *v < (int64_t{1} << 31))
    c.bos_id = static_cast<int32_t>(*v);
  LARDER_RETURN_IF_ERROR(validate(c));
  return c;
}

Result<ModelConfig> config_from_files(const formats::ModelFiles& files) {
  if (files.gguf) return config_from_gguf(*files.gguf);
  return config_from_hf(files);
}

Status moe_from_gguf(const formats::GgufFile& g, ExpertFfnDefault ffn_default, ModelConfig* c) {
  const std::string a = c->architecture + ".";
  const char* src = c->source.c_str();
  MoeConfig& m = c->moe;
  const auto E = g.get_int(a + "expert_count");
  const auto k = g.get_int(a + "expert_used_count");
  if (!E || !k || *E < 1 || *E > (int64_t{1} << 20) || *k < 1 || *k > *E)
    return invalid_argument(strfmt("[config] %s: GGUF metadata '%sexpert_count' and '%sexpert_used_count' must be "
                                   "present with 1 <= expert_used_count <= expert_count",
                                   src, a.c_str(), a.c_str()));
  m.n_experts = *E;
  m.n_used = *k;
  m.ffn = g.get_int(a + "expert_feed_forward_length")
              .value_or(ffn_default == ExpertFfnDefault::kPerUsed ? c->ffn / m.n_used : c->ffn);
  if (m.ffn < 1) return invalid_argument(strfmt("[config] %s: GGUF expert_feed_forward_length must be positive", src));
  m.routed.assign(static_cast<size_t>(c->n_layers), true);
  return Status::ok();
}

}  // namespace larder::models
