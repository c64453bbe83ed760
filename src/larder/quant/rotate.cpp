// rotate.cpp — see rotate.h. Fold table: design/quantization.md §6.4 (Llama family).
#include "larder/quant/rotate.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "larder/formats/model_files.h"
#include "larder/formats/safetensors.h"
#include "larder/quant/checkpoint_io.h"
#include "larder/quant/hadamard.h"
#include "larder/quant/parallel_rows.h"

namespace larder::quant {

namespace {

using nlohmann::ordered_json;

const char* const kDeviations[] = {"no-embedding-mean-centering", "no-R4-downproj-input-fold", "no-R3",
                                   "no-quarot-R2", "gamma-kept-in-module-as-ones", "fold-precision-f32"};
// Qwen3.5 (the seed's planQwen35Fold): R1 + γ only. The attention output gate (o_proj(attn ⊙ σ(g)))
// and the DeltaNet's gated norm act elementwise in head space, which no per-head rotation commutes
// with; the MTP head (mtp.*) is a second model over the same stream that larder does not run.
const char* const kQwen35Deviations[] = {"no-embedding-mean-centering", "no-R4-downproj-input-fold", "no-R3",
                                         "no-R2-output-gate",           "gamma-kept-in-module-as-zeros",
                                         "fold-precision-f32",          "mtp-dropped"};

bool is_float(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

const char* torch_dtype_name(DType t) {
  return t == DType::kF32 ? "float32" : t == DType::kF16 ? "float16" : "bfloat16";
}

enum class Fold {
  kCopy,        // untouched (cast to the output dtype)
  kOnes,        // a norm gain after its γ was folded into the consumers
  kZeros,       // the same for a gain stored as γ − 1 (Qwen3.5's HF checkpoints: the norm computes 1 + w)
  kEmbed,       // E·R1
  kReader,      // W·diag(γ)·R1 (q, k, gate, up, lm_head)
  kV,           // reader, then R2ᵀ·W_h per head on the output rows
  kVBias,       // b_h·R2 per head
  kO,           // W_h·R2 per head input block, then R1ᵀ·W
  kWriter,      // R1ᵀ·W (down_proj); per expert for a stacked [E, H, I] tensor
  kWriterBias,  // b·R1 (o_proj, down_proj biases)
};

struct OutTensor {
  std::string name;
  DType dtype = DType::kUnknown;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  Fold fold = Fold::kCopy;
  const formats::TensorInfo* src = nullptr;
  const formats::TensorInfo* gamma = nullptr;
  bool gamma_one_plus = false;  // the gain applied is 1 + the stored value
  int64_t layer = -1;
};

struct Plan {
  formats::TensorSet ts;
  ordered_json config;
  std::vector<OutTensor> outs;
  Rotation r1;
  std::vector<Rotation> r2;  // per layer; identities when R2 is off
  RotateReport report;
  uint64_t total_params = 0;
  std::string order = "untie, gamma-fold, R1, R2";
};

const ordered_json* jfind(const ordered_json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

Status read_int(const ordered_json& j, const char* key, const std::string& src, int64_t* out, bool required) {
  const ordered_json* v = jfind(j, key);
  if (!v) {
    if (required) return invalid_argument(strfmt("[rotate] %s: missing required key '%s'", src.c_str(), key));
    return Status::ok();
  }
  if (!v->is_number_integer() || v->get<int64_t>() <= 0)
    return invalid_argument(strfmt("[rotate] %s: key '%s' must be a positive integer, got %s", src.c_str(), key,
                                   v->dump().c_str()));
  *out = v->get<int64_t>();
  return Status::ok();
}

bool read_bool(const ordered_json& j, const char* key) {
  const ordered_json* v = jfind(j, key);
  return v && v->is_boolean() && v->get<bool>();
}

void load_f32(const formats::TensorInfo& t, float* out) {
  const int64_t n = t.numel();
  if (t.dtype == DType::kF32) {
    std::memcpy(out, t.data, static_cast<size_t>(n) * 4);
  } else if (t.dtype == DType::kBF16) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(t.data);
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
  } else {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(t.data);
    for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
  }
}

void store(const float* in, int64_t n, DType dt, uint8_t* out) {
  if (dt == DType::kF32) {
    std::memcpy(out, in, static_cast<size_t>(n) * 4);
  } else if (dt == DType::kBF16) {
    uint16_t* p = reinterpret_cast<uint16_t*>(out);
    for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(in[i]);
  } else {
    uint16_t* p = reinterpret_cast<uint16_t*>(out);
    for (int64_t i = 0; i < n; ++i) p[i] = f32_to_f16(in[i]);
  }
}

// Every row of a [rows, cols] matrix, split into cols / n chunks, each chunk ← chunk·R.
void rotate_rows(float* a, int64_t rows, int64_t cols, const Rotation& r, int threads) {
  if (r.identity()) return;
  const int64_t n = r.size();
  parallel_rows(rows, threads, 8, [&](int, int64_t r0, int64_t r1) {
    std::vector<float> scratch(static_cast<size_t>(n));
    for (int64_t i = r0; i < r1; ++i)
      for (int64_t c = 0; c < cols; c += n) r.rowT(a + i * cols + c, scratch.data());
  });
}

void transpose(const float* a, int64_t rows, int64_t cols, float* b, int threads) {
  constexpr int64_t kB = 32;
  const int64_t nblk = (rows + kB - 1) / kB;
  parallel_rows(nblk, threads, 8, [&](int, int64_t b0, int64_t b1) {
    for (int64_t i0 = b0 * kB; i0 < std::min(rows, b1 * kB); i0 += kB)
      for (int64_t j0 = 0; j0 < cols; j0 += kB)
        for (int64_t i = i0; i < std::min(rows, i0 + kB); ++i)
          for (int64_t j = j0; j < std::min(cols, j0 + kB); ++j) b[j * rows + i] = a[i * cols + j];
  });
}

// W ← Rᵀ·W (R acting on the output index): transpose, x·R per row, transpose back. `chunks`
// rotations of size r.size() side by side along the rows (per head for R2).
void rotate_out_rows(float* w, int64_t rows, int64_t cols, const Rotation& r, int threads, std::vector<float>* tbuf) {
  if (r.identity()) return;
  tbuf->resize(static_cast<size_t>(rows * cols));
  transpose(w, rows, cols, tbuf->data(), threads);
  rotate_rows(tbuf->data(), cols, rows, r, threads);
  transpose(tbuf->data(), cols, rows, w, threads);
}

bool parse_layer(const std::string& name, int64_t* layer, std::string* rest) {
  static const std::string kPre = "model.layers.";
  if (name.compare(0, kPre.size(), kPre) != 0) return false;
  size_t i = kPre.size(), j = i;
  while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j >= name.size() || name[j] != '.') return false;
  *layer = std::stoll(name.substr(i, j - i));
  *rest = name.substr(j + 1);
  return true;
}

// "[hadamard] size 44 is not supported: ..." → "size 44 is not supported: ...", for nesting in a
// "[rotate]" message that names the config key.
std::string inner(const Status& st) {
  const std::string& m = st.message();
  return m.rfind("[hadamard] ", 0) == 0 ? m.substr(11) : m;
}

bool ends_with(const std::string& s, const char* suf) {
  const size_t n = std::strlen(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

bool is_float_tensor(const formats::TensorInfo& t) { return is_float(t.dtype); }

// A tensor a fold reads: it must exist, be F32/F16/BF16 and pass `shape_ok` (which says what
// shape was expected when it does not).
Result<const formats::TensorInfo*> need_tensor(const formats::TensorSet& ts, const std::string& src_dir,
                                               const std::string& name,
                                               const std::function<std::string(const formats::TensorInfo&)>& shape_ok) {
  const formats::TensorInfo* t = ts.find(name);
  if (!t) return not_found(strfmt("[rotate] %s: missing tensor '%s'", src_dir.c_str(), name.c_str()));
  if (!is_float_tensor(*t))
    return unsupported(strfmt("[rotate] %s: tensor '%s' is %s; the fold needs F32, F16 or BF16", src_dir.c_str(),
                              name.c_str(), dtype_name(t->dtype)));
  const std::string want = shape_ok(*t);
  if (!want.empty())
    return invalid_argument(strfmt("[rotate] %s: tensor '%s' has shape %s, config.json implies %s", src_dir.c_str(),
                                   name.c_str(), t->shape_str().c_str(), want.c_str()));
  return t;
}

std::function<std::string(const formats::TensorInfo&)> exact_shape(std::vector<int64_t> shape) {
  return [shape](const formats::TensorInfo& t) {
    if (t.shape == shape) return std::string();
    formats::TensorInfo want;
    want.shape = shape;
    return want.shape_str();
  };
}

void add_out(Plan* p, const RotateOptions& opts, const std::string& name, const formats::TensorInfo* src, Fold f,
             const formats::TensorInfo* gamma, int64_t layer, bool gamma_one_plus = false) {
  OutTensor o;
  o.name = name;
  o.dtype = opts.out_dtype != DType::kUnknown && is_float(src->dtype) ? opts.out_dtype : src->dtype;
  o.shape = src->shape;
  o.nbytes = dtype_bytes(o.dtype, static_cast<uint64_t>(src->numel()));
  o.fold = f;
  o.src = src;
  o.gamma = gamma;
  o.gamma_one_plus = gamma_one_plus;
  o.layer = layer;
  p->outs.push_back(std::move(o));
}

void add_verbatim(Plan* p, const formats::TensorInfo& t) {
  OutTensor o;
  o.name = t.name;
  o.dtype = t.dtype;
  o.shape = t.shape;
  o.nbytes = t.nbytes;
  o.src = &t;
  p->outs.push_back(std::move(o));
}

bool starts_with(const std::string& s, const std::string& pre) { return s.compare(0, pre.size(), pre) == 0; }

bool is_qwen35_type(const std::string& mt) {
  return mt == "qwen3_5" || mt == "qwen3_5_text" || mt == "qwen3_5_moe" || mt == "qwen3_5_moe_text";
}

Result<Plan> make_qwen35_plan(const std::string& src_dir, const RotateOptions& opts, Plan p);

// Outputs in sorted name order (the writer's order), their parameter count, and the report.
void finish_plan(Plan* p, int64_t hidden, int64_t head_dim, std::string r2_construction, bool untied,
                 std::vector<std::string> deviations) {
  std::sort(p->outs.begin(), p->outs.end(), [](const OutTensor& a, const OutTensor& b) { return a.name < b.name; });
  for (const OutTensor& o : p->outs) p->total_params += static_cast<uint64_t>(o.src->numel());
  RotateReport& rep = p->report;
  rep.hidden = hidden;
  rep.head_dim = head_dim;
  rep.r1_construction = p->r1.construction();
  rep.r2_construction = std::move(r2_construction);
  rep.untied = untied;
  rep.deviations = std::move(deviations);
}

Result<Plan> make_plan(const std::string& src_dir, const RotateOptions& opts) {
  Plan p;
  const std::string cfg_path = src_dir + "/config.json";
  auto cfg_r = formats::read_json_file(cfg_path);
  if (!cfg_r) return cfg_r.status();
  p.config = std::move(cfg_r).value();
  const ordered_json& c = p.config;
  if (!c.is_object()) return invalid_argument("[rotate] " + cfg_path + " is not a JSON object");
  if (jfind(c, "quantization") || jfind(c, "quantization_config"))
    return unsupported("[rotate] " + cfg_path +
                       " has a quantization block: the rotation fold needs full-precision weights (rotate the "
                       "bf16/f16/f32 original, then quantize)");
  const ordered_json* mtj = jfind(c, "model_type");
  const std::string mt = mtj && mtj->is_string() ? mtj->get<std::string>() : std::string();
  if (opts.out_dtype != DType::kUnknown && !is_float(opts.out_dtype))
    return invalid_argument(strfmt("[rotate] output dtype %s is not supported (F32, F16, BF16)", dtype_name(opts.out_dtype)));
  if (is_qwen35_type(mt)) return make_qwen35_plan(src_dir, opts, std::move(p));
  if (mt != "llama" && mt != "mistral" && mt != "qwen2" && mt != "qwen3")
    return unsupported("[rotate] " + cfg_path + ": model_type '" + mt +
                       "' has no fold plan (supported: llama, mistral, qwen2, qwen3, qwen3_5, qwen3_5_moe)");

  int64_t H = 0, L = 0, nh = 0, nkv = 0, hd = 0, I = 0, V = 0;
  LARDER_RETURN_IF_ERROR(read_int(c, "hidden_size", cfg_path, &H, true));
  LARDER_RETURN_IF_ERROR(read_int(c, "num_hidden_layers", cfg_path, &L, true));
  LARDER_RETURN_IF_ERROR(read_int(c, "num_attention_heads", cfg_path, &nh, true));
  nkv = nh;
  LARDER_RETURN_IF_ERROR(read_int(c, "num_key_value_heads", cfg_path, &nkv, false));
  hd = H / nh;
  LARDER_RETURN_IF_ERROR(read_int(c, "head_dim", cfg_path, &hd, false));
  LARDER_RETURN_IF_ERROR(read_int(c, "intermediate_size", cfg_path, &I, true));
  LARDER_RETURN_IF_ERROR(read_int(c, "vocab_size", cfg_path, &V, true));
  const bool tied = read_bool(c, "tie_word_embeddings");
  const bool attn_bias = read_bool(c, "attention_bias"), mlp_bias = read_bool(c, "mlp_bias");
  const bool qkv_bias = attn_bias || mt == "qwen2";

  const bool r1_on = opts.r1, r2_on = opts.r1 && opts.r2;
  if (r1_on) {
    auto r = Rotation::make(H, opts.seed, 0);
    if (!r)
      return unsupported(strfmt("[rotate] %s: hidden_size %lld cannot be rotated: %s", cfg_path.c_str(),
                                static_cast<long long>(H), inner(r.status()).c_str()));
    p.r1 = std::move(r).value();
  }
  p.r2.resize(static_cast<size_t>(L));
  if (r2_on) {
    for (int64_t l = 0; l < L; ++l) {
      auto r = Rotation::make(hd, opts.seed, static_cast<uint64_t>(l) + 1);
      if (!r)
        return unsupported(strfmt("[rotate] %s: head_dim %lld cannot be rotated (R2): %s; run without R2",
                                  cfg_path.c_str(), static_cast<long long>(hd), inner(r.status()).c_str()));
      p.r2[static_cast<size_t>(l)] = std::move(r).value();
    }
  }

  auto ts_r = formats::open_safetensors_dir(src_dir);
  if (!ts_r) return ts_r.status();
  p.ts = std::move(ts_r).value();
  const formats::TensorSet& ts = p.ts;

  // Every tensor a fold reads must exist with the shape the config implies.
  auto need = [&](const std::string& name, std::vector<int64_t> shape) {
    return need_tensor(ts, src_dir, name, exact_shape(std::move(shape)));
  };
  auto add = [&](const std::string& name, const formats::TensorInfo* src, Fold f, const formats::TensorInfo* gamma,
                 int64_t layer) { add_out(&p, opts, name, src, f, gamma, layer); };

  LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* embed, need("model.embed_tokens.weight", {V, H}));
  LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* fnorm, need("model.norm.weight", {H}));
  const formats::TensorInfo* head = embed;  // tied: the clone of the embedding becomes the head
  if (!tied) {
    LARDER_ASSIGN_OR_RETURN(head, need("lm_head.weight", {V, H}));
  }
  add("model.embed_tokens.weight", embed, Fold::kEmbed, nullptr, -1);
  add("model.norm.weight", fnorm, Fold::kOnes, nullptr, -1);
  add("lm_head.weight", head, Fold::kReader, fnorm, -1);

  std::set<std::string> handled = {"model.embed_tokens.weight", "model.norm.weight"};
  if (!tied) handled.insert("lm_head.weight");
  for (int64_t l = 0; l < L; ++l) {
    const std::string pre = strfmt("model.layers.%lld.", static_cast<long long>(l));
    auto want = [&](const std::string& rest, std::vector<int64_t> shape) -> Result<const formats::TensorInfo*> {
      handled.insert(pre + rest);
      return need(pre + rest, std::move(shape));
    };
    LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* g_in, want("input_layernorm.weight", {H}));
    LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* g_post, want("post_attention_layernorm.weight", {H}));
    LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* q, want("self_attn.q_proj.weight", {nh * hd, H}));
    LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* k, want("self_attn.k_proj.weight", {nkv * hd, H}));
    LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* v, want("self_attn.v_proj.weight", {nkv * hd, H}));
    LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* o, want("self_attn.o_proj.weight", {H, nh * hd}));
    LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* gate, want("mlp.gate_proj.weight", {I, H}));
    LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* up, want("mlp.up_proj.weight", {I, H}));
    LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* down, want("mlp.down_proj.weight", {H, I}));
    add(pre + "input_layernorm.weight", g_in, Fold::kOnes, nullptr, l);
    add(pre + "post_attention_layernorm.weight", g_post, Fold::kOnes, nullptr, l);
    add(pre + "self_attn.q_proj.weight", q, Fold::kReader, g_in, l);
    add(pre + "self_attn.k_proj.weight", k, Fold::kReader, g_in, l);
    add(pre + "self_attn.v_proj.weight", v, Fold::kV, g_in, l);
    add(pre + "self_attn.o_proj.weight", o, Fold::kO, nullptr, l);
    add(pre + "mlp.gate_proj.weight", gate, Fold::kReader, g_post, l);
    add(pre + "mlp.up_proj.weight", up, Fold::kReader, g_post, l);
    add(pre + "mlp.down_proj.weight", down, Fold::kWriter, nullptr, l);
    // Biases: the ones the config requires must be there; any present one is folded by its role
    // (q/k and gate/up biases live in spaces no rotation touches).
    struct B { const char* rest; int64_t n; bool required; Fold fold; };
    const B biases[] = {{"self_attn.q_proj.bias", nh * hd, qkv_bias, Fold::kCopy},
                        {"self_attn.k_proj.bias", nkv * hd, qkv_bias, Fold::kCopy},
                        {"self_attn.v_proj.bias", nkv * hd, qkv_bias, Fold::kVBias},
                        {"self_attn.o_proj.bias", H, attn_bias, Fold::kWriterBias},
                        {"mlp.gate_proj.bias", I, mlp_bias, Fold::kCopy},
                        {"mlp.up_proj.bias", I, mlp_bias, Fold::kCopy},
                        {"mlp.down_proj.bias", H, mlp_bias, Fold::kWriterBias},
                        {"self_attn.q_norm.weight", hd, mt == "qwen3", Fold::kCopy},
                        {"self_attn.k_norm.weight", hd, mt == "qwen3", Fold::kCopy}};
    for (const B& b : biases) {
      if (!b.required && !ts.find(pre + b.rest)) continue;
      LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* t, want(b.rest, {b.n}));
      add(pre + b.rest, t, b.fold, nullptr, l);
    }
  }
  // Anything else would be passed through unrotated into a rotated residual stream — silently
  // wrong — so only tensors known to be outside it are allowed.
  for (const formats::TensorInfo& t : ts.tensors()) {
    if (handled.count(t.name)) continue;
    if (ends_with(t.name, "rotary_emb.inv_freq")) {
      if (!safetensors_dtype_name(t.dtype))
        return unsupported(strfmt("[rotate] tensor '%s' has dtype %s, which cannot be written", t.name.c_str(), dtype_name(t.dtype)));
      add_verbatim(&p, t);  // a precomputed table
      continue;
    }
    if (tied && t.name == "lm_head.weight") continue;  // a stray copy: the folded clone replaces it
    int64_t layer = -1;
    std::string rest;
    if (parse_layer(t.name, &layer, &rest) && layer >= L)
      return invalid_argument(strfmt("[rotate] %s: tensor '%s' belongs to layer %lld but num_hidden_layers is %lld",
                                     src_dir.c_str(), t.name.c_str(), static_cast<long long>(layer), static_cast<long long>(L)));
    return unsupported(strfmt("[rotate] %s: tensor '%s' has no fold rule for model_type %s (check attention_bias, "
                              "mlp_bias); refusing rather than writing a model that computes something else",
                              src_dir.c_str(), t.name.c_str(), mt.c_str()));
  }
  finish_plan(&p, H, hd, r2_on && L > 0 ? p.r2.front().construction() : "none", tied,
              std::vector<std::string>(std::begin(kDeviations), std::end(kDeviations)));
  return p;
}

// Qwen3.5 / Qwen3.5-MoE, HF layout (text-only `qwen3_5_text` or the text tower of a multimodal
// `qwen3_5`): the residual-stream corridors of the seed's planQwen35Fold.
//   readers (x·R1, γ of their norm folded): q/k/v_proj, linear_attn.in_proj_{qkv,z,b,a}, the
//     dense or shared-expert gate/up, the router (mlp.gate), shared_expert_gate, every expert's
//     gate/up (stacked gate_up_proj [E, 2I, H] or one tensor per expert), lm_head;
//   writers (R1ᵀ·W): o_proj, linear_attn.out_proj, down_proj (dense, shared, every expert), and
//     the vision merger's last projection (its output is spliced into the token embeddings);
//   head-space tensors (q/k norms, the DeltaNet's conv, A, dt bias and gated norm) are untouched.
// Gains are stored as γ − 1 in this layout; a folded gain is written as 0 (the norm computes 1 + 0).
Result<Plan> make_qwen35_plan(const std::string& src_dir, const RotateOptions& opts, Plan p) {
  const std::string cfg_path = src_dir + "/config.json";
  const ordered_json* tcj = jfind(p.config, "text_config");
  const ordered_json& tc = tcj && tcj->is_object() ? *tcj : p.config;
  int64_t H = 0, L = 0, V = 0, hd = 0;
  LARDER_RETURN_IF_ERROR(read_int(tc, "hidden_size", cfg_path, &H, true));
  LARDER_RETURN_IF_ERROR(read_int(tc, "num_hidden_layers", cfg_path, &L, true));
  LARDER_RETURN_IF_ERROR(read_int(tc, "vocab_size", cfg_path, &V, true));
  LARDER_RETURN_IF_ERROR(read_int(tc, "head_dim", cfg_path, &hd, false));
  if (opts.r1) {
    auto r = Rotation::make(H, opts.seed, 0);
    if (!r)
      return unsupported(strfmt("[rotate] %s: hidden_size %lld cannot be rotated: %s", cfg_path.c_str(),
                                static_cast<long long>(H), inner(r.status()).c_str()));
    p.r1 = std::move(r).value();
  }
  p.r2.resize(static_cast<size_t>(L));  // identities: R2 is off for this family

  auto ts_r = formats::open_safetensors_dir(src_dir);
  if (!ts_r) return ts_r.status();
  p.ts = std::move(ts_r).value();
  const formats::TensorSet& ts = p.ts;
  const std::string P = ts.find("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
  if (!ts.find(P + "embed_tokens.weight") && ts.find("language_model.model.embed_tokens.weight"))
    return unsupported("[rotate] " + src_dir +
                       " is in mlx-lm's own layout (language_model.model.*, gains stored as γ): rotate the Hugging "
                       "Face checkpoint it was converted from");
  for (const formats::TensorInfo& t : ts.tensors())
    if (ends_with(t.name, "linear_attn.conv1d.weight") && !(t.rank() == 3 && t.dim(1) == 1))
      return unsupported(strfmt("[rotate] %s: '%s' has shape %s, not Hugging Face's [C, 1, K]: this is not an HF "
                                "layout checkpoint (norm gains γ − 1); rotate the HF original",
                                src_dir.c_str(), t.name.c_str(), t.shape_str().c_str()));

  auto reader = [&](const formats::TensorInfo& t) {
    const bool ok = (t.rank() == 2 || t.rank() == 3) && t.shape.back() == H;
    return ok ? std::string() : strfmt("[..., %lld] (a reader of the residual stream)", static_cast<long long>(H));
  };
  auto writer = [&](const formats::TensorInfo& t) {
    const bool ok = (t.rank() == 2 && t.dim(0) == H) || (t.rank() == 3 && t.dim(1) == H);
    return ok ? std::string() : strfmt("[%lld, ...] or [E, %lld, ...] (a writer of the residual stream)",
                                       static_cast<long long>(H), static_cast<long long>(H));
  };
  auto need = [&](const std::string& name, std::function<std::string(const formats::TensorInfo&)> shape_ok) {
    return need_tensor(ts, src_dir, name, shape_ok);
  };

  LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* embed, need(P + "embed_tokens.weight", exact_shape({V, H})));
  LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* fnorm, need(P + "norm.weight", exact_shape({H})));
  const bool tied = ts.find("lm_head.weight") == nullptr;
  const formats::TensorInfo* head = embed;
  if (!tied) {
    LARDER_ASSIGN_OR_RETURN(head, need("lm_head.weight", exact_shape({V, H})));
  }
  add_out(&p, opts, embed->name, embed, Fold::kEmbed, nullptr, -1);
  add_out(&p, opts, fnorm->name, fnorm, Fold::kZeros, nullptr, -1);
  add_out(&p, opts, "lm_head.weight", head, Fold::kReader, fnorm, -1, /*gamma_one_plus=*/true);

  std::vector<const formats::TensorInfo*> g_in(static_cast<size_t>(L)), g_post(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    const std::string pre = P + strfmt("layers.%lld.", static_cast<long long>(l));
    LARDER_ASSIGN_OR_RETURN(g_in[static_cast<size_t>(l)], need(pre + "input_layernorm.weight", exact_shape({H})));
    LARDER_ASSIGN_OR_RETURN(g_post[static_cast<size_t>(l)], need(pre + "post_attention_layernorm.weight", exact_shape({H})));
    if (!ts.find(pre + "self_attn.q_proj.weight") && !ts.find(pre + "linear_attn.in_proj_qkv.weight"))
      return not_found(strfmt("[rotate] %s: layer %lld has neither self_attn.q_proj nor linear_attn.in_proj_qkv",
                              src_dir.c_str(), static_cast<long long>(l)));
  }
  static const std::set<std::string> kReadIn = {
      "self_attn.q_proj.weight",        "self_attn.k_proj.weight",       "self_attn.v_proj.weight",
      "linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight",  "linear_attn.in_proj_b.weight",
      "linear_attn.in_proj_a.weight"};
  static const std::set<std::string> kReadPost = {
      "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.gate.weight", "mlp.shared_expert.gate_proj.weight",
      "mlp.shared_expert.up_proj.weight", "mlp.shared_expert_gate.weight", "mlp.experts.gate_up_proj"};
  static const std::set<std::string> kWrite = {"self_attn.o_proj.weight", "linear_attn.out_proj.weight",
                                               "mlp.down_proj.weight", "mlp.shared_expert.down_proj.weight",
                                               "mlp.experts.down_proj"};
  static const std::set<std::string> kHeadSpace = {"self_attn.q_norm.weight", "self_attn.k_norm.weight",
                                                   "linear_attn.conv1d.weight", "linear_attn.dt_bias",
                                                   "linear_attn.A_log", "linear_attn.norm.weight"};
  // "experts.7.up_proj.weight" → "up_proj.weight" (one tensor per expert), else "".
  auto per_expert = [](const std::string& rest) -> std::string {
    static const std::string kPre = "mlp.experts.";
    if (!starts_with(rest, kPre)) return "";
    size_t i = kPre.size(), j = i;
    while (j < rest.size() && rest[j] >= '0' && rest[j] <= '9') ++j;
    if (j == i || j >= rest.size() || rest[j] != '.') return "";
    return rest.substr(j + 1);
  };

  const std::string layers_pre = P + "layers.";
  size_t dropped_mtp = 0;
  for (const formats::TensorInfo& t : ts.tensors()) {
    const std::string& n = t.name;
    if (n == embed->name || n == fnorm->name || n == "lm_head.weight") continue;
    if (starts_with(n, layers_pre)) {
      size_t i = layers_pre.size(), j = i;
      while (j < n.size() && n[j] >= '0' && n[j] <= '9') ++j;
      if (j == i || j >= n.size() || n[j] != '.')
        return invalid_argument(strfmt("[rotate] %s: cannot parse the layer of tensor '%s'", src_dir.c_str(), n.c_str()));
      const int64_t l = std::stoll(n.substr(i, j - i));
      if (l >= L)
        return invalid_argument(strfmt("[rotate] %s: tensor '%s' belongs to layer %lld but num_hidden_layers is %lld",
                                       src_dir.c_str(), n.c_str(), static_cast<long long>(l), static_cast<long long>(L)));
      const std::string rest = n.substr(j + 1), expert = per_expert(rest);
      const size_t li = static_cast<size_t>(l);
      if (rest == "input_layernorm.weight" || rest == "post_attention_layernorm.weight") {
        add_out(&p, opts, n, &t, Fold::kZeros, nullptr, l);
      } else if (kReadIn.count(rest)) {
        LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* w, need(n, reader));
        add_out(&p, opts, n, w, Fold::kReader, g_in[li], l, true);
      } else if (kReadPost.count(rest) || expert == "gate_proj.weight" || expert == "up_proj.weight") {
        LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* w, need(n, reader));
        add_out(&p, opts, n, w, Fold::kReader, g_post[li], l, true);
      } else if (kWrite.count(rest) || expert == "down_proj.weight") {
        LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* w, need(n, writer));
        add_out(&p, opts, n, w, Fold::kWriter, nullptr, l);
      } else if (kHeadSpace.count(rest)) {
        add_out(&p, opts, n, &t, Fold::kCopy, nullptr, l);
      } else {
        return unsupported(strfmt("[rotate] %s: tensor '%s' has no fold rule for Qwen3.5 (a bias, or a module this "
                                  "plan does not know); refusing rather than writing a model that computes something "
                                  "else",
                                  src_dir.c_str(), n.c_str()));
      }
      continue;
    }
    if (starts_with(n, "mtp.")) {
      ++dropped_mtp;
      continue;
    }
    if (starts_with(n, "model.visual.")) {
      if (n == "model.visual.merger.linear_fc2.weight") {
        LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* w, need(n, writer));
        add_out(&p, opts, n, w, Fold::kWriter, nullptr, -1);
      } else if (n == "model.visual.merger.linear_fc2.bias") {
        LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* b, need(n, exact_shape({H})));
        add_out(&p, opts, n, b, Fold::kWriterBias, nullptr, -1);
      } else if (n.find("merger") != std::string::npos && !starts_with(n, "model.visual.merger.norm.") &&
                 !starts_with(n, "model.visual.merger.linear_fc1.")) {
        return unsupported(strfmt("[rotate] %s: vision tensor '%s' may write into the text model's residual stream "
                                  "and has no fold rule; refusing",
                                  src_dir.c_str(), n.c_str()));
      } else if (is_float(t.dtype)) {
        add_out(&p, opts, n, &t, Fold::kCopy, nullptr, -1);  // inside the vision tower: untouched
      } else {
        add_verbatim(&p, t);
      }
      continue;
    }
    if (ends_with(n, "rotary_emb.inv_freq")) {
      add_verbatim(&p, t);
      continue;
    }
    return unsupported(strfmt("[rotate] %s: tensor '%s' has no fold rule for model_type qwen3_5; refusing rather "
                              "than writing a model that computes something else",
                              src_dir.c_str(), n.c_str()));
  }
  std::vector<std::string> deviations(std::begin(kQwen35Deviations), std::end(kQwen35Deviations));
  if (dropped_mtp == 0) deviations.pop_back();  // "mtp-dropped" is last
  finish_plan(&p, H, hd, "none", tied, std::move(deviations));
  p.order = "untie, gamma-fold, R1";
  return p;
}

// Computes one output tensor into `f` (f32) and returns its bytes in the output dtype.
class Folder {
 public:
  Folder(const Plan& p, int threads) : p_(p), threads_(threads) {}

  Result<const void*> produce(const OutTensor& t) {
    const formats::TensorInfo& s = *t.src;
    if (t.fold == Fold::kCopy && t.dtype == s.dtype) return static_cast<const void*>(s.data);
    const int64_t n = s.numel();
    // Matrices and stacked [E, R, C] expert tensors alike: rows of the last dimension.
    const int64_t cols = s.rank() >= 2 ? s.shape.back() : n, rows = n / cols;
    f_.resize(static_cast<size_t>(n));
    float* w = f_.data();
    if (t.fold == Fold::kOnes || t.fold == Fold::kZeros) {
      std::fill(f_.begin(), f_.end(), t.fold == Fold::kOnes ? 1.0f : 0.0f);
    } else {
      load_f32(s, w);
    }
    const Rotation& r2 = t.layer >= 0 ? p_.r2[static_cast<size_t>(t.layer)] : kIdentity;
    switch (t.fold) {
      case Fold::kCopy:
      case Fold::kOnes:
      case Fold::kZeros:
        break;
      case Fold::kEmbed:
      case Fold::kWriterBias:
        rotate_rows(w, rows, cols, p_.r1, threads_);
        break;
      case Fold::kReader:
      case Fold::kV:
        fold_gamma(w, rows, cols, *t.gamma, t.gamma_one_plus);
        rotate_rows(w, rows, cols, p_.r1, threads_);
        if (t.fold == Fold::kV) rotate_out_rows(w, rows, cols, r2, threads_, &tbuf_);
        break;
      case Fold::kVBias:
        rotate_rows(w, 1, n, r2, threads_);
        break;
      case Fold::kO:
        rotate_rows(w, rows, cols, r2, threads_);
        rotate_out_rows(w, rows, cols, p_.r1, threads_, &tbuf_);
        break;
      case Fold::kWriter:
        if (s.rank() == 3) {  // [E, H, I]: each expert's output rows
          const int64_t per = s.dim(1) * s.dim(2);
          for (int64_t e = 0; e < s.dim(0); ++e) rotate_out_rows(w + e * per, s.dim(1), s.dim(2), p_.r1, threads_, &tbuf_);
        } else {
          rotate_out_rows(w, rows, cols, p_.r1, threads_, &tbuf_);
        }
        break;
    }
    if (t.dtype == DType::kF32) return static_cast<const void*>(w);
    out_.resize(t.nbytes);
    store(w, n, t.dtype, out_.data());
    return static_cast<const void*>(out_.data());
  }

 private:
  void fold_gamma(float* w, int64_t rows, int64_t cols, const formats::TensorInfo& gamma, bool one_plus) {
    g_.resize(static_cast<size_t>(cols));
    load_f32(gamma, g_.data());
    if (one_plus)
      for (float& g : g_) g += 1.0f;
    parallel_rows(rows, threads_, 8, [&](int, int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i)
        for (int64_t j = 0; j < cols; ++j) w[i * cols + j] *= g_[static_cast<size_t>(j)];
    });
  }

  const Plan& p_;
  int threads_;
  const Rotation kIdentity;
  std::vector<float> f_, tbuf_, g_;
  std::vector<uint8_t> out_;
};

}  // namespace

Result<RotateReport> rotate_checkpoint(const std::string& src_dir, const std::string& dst_dir,
                                       const RotateOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  struct stat sb;
  if (::stat(src_dir.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode))
    return not_found("[rotate] source " + src_dir + " is not a directory");
  if (::lstat(dst_dir.c_str(), &sb) == 0)
    return invalid_argument("[rotate] output " + dst_dir + " already exists; refusing to overwrite it");
  auto plan_r = make_plan(src_dir, opts);
  if (!plan_r) return plan_r.status();
  Plan& plan = plan_r.value();
  const int threads = resolve_threads(opts.threads);

  ordered_json cfg = plan.config;
  cfg["tie_word_embeddings"] = false;
  if (cfg.contains("text_config") && cfg["text_config"].is_object()) cfg["text_config"]["tie_word_embeddings"] = false;
  if (opts.out_dtype != DType::kUnknown) {
    cfg["torch_dtype"] = torch_dtype_name(opts.out_dtype);
    if (cfg.contains("dtype")) cfg["dtype"] = torch_dtype_name(opts.out_dtype);
  }
  ordered_json rot = ordered_json::object();
  rot["seed"] = opts.seed;
  rot["order"] = plan.order;
  rot["r1"] = plan.report.r1_construction;
  rot["r2"] = plan.report.r2_construction;
  rot["signs"] = "splitmix64(seed ^ (lane << 32) ^ i) top bit; R1 lane 0, layer i R2 lane i+1";
  rot["untied"] = plan.report.untied;
  rot["deviations"] = plan.report.deviations;
  cfg["larder_rotation"] = rot;

  std::vector<ShardEntry> entries;
  entries.reserve(plan.outs.size());
  for (const OutTensor& o : plan.outs) entries.push_back({o.name, o.dtype, o.shape, o.nbytes});
  Status st = publish_directory(dst_dir, "[rotate]", [&](const std::string& tmp) -> Status {
    Folder folder(plan, threads);
    auto produce = [&](size_t i) -> Result<const void*> {
      if (opts.progress) opts.progress(i + 1, plan.outs.size(), plan.outs[i].name);
      return folder.produce(plan.outs[i]);
    };
    auto written = write_safetensors_shards(tmp, entries, opts.max_shard_bytes, ordered_json{{"format", "pt"}},
                                            plan.total_params, produce);
    if (!written) return written.status();
    LARDER_RETURN_IF_ERROR(write_config_json(tmp + "/config.json", cfg));
    return copy_aux_files(src_dir, tmp);
  });
  if (!st) return st;
  plan.report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return plan.report;
}

}  // namespace larder::quant
