// rotate.cpp — see rotate.h. Fold table: design/quantization.md §6.4 (Llama family).
#include "larder/quant/rotate.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
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

bool is_float(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

const char* torch_dtype_name(DType t) {
  return t == DType::kF32 ? "float32" : t == DType::kF16 ? "float16" : "bfloat16";
}

enum class Fold {
  kCopy,        // untouched (cast to the output dtype)
  kOnes,        // a norm gain after its γ was folded into the consumers
  kEmbed,       // E·R1
  kReader,      // W·diag(γ)·R1 (q, k, gate, up, lm_head)
  kV,           // reader, then R2ᵀ·W_h per head on the output rows
  kVBias,       // b_h·R2 per head
  kO,           // W_h·R2 per head input block, then R1ᵀ·W
  kWriter,      // R1ᵀ·W (down_proj)
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
  if (mt != "llama" && mt != "mistral" && mt != "qwen2" && mt != "qwen3")
    return unsupported("[rotate] " + cfg_path + ": model_type '" + mt +
                       "' has no fold plan (supported: llama, mistral, qwen2, qwen3)");
  if (opts.out_dtype != DType::kUnknown && !is_float(opts.out_dtype))
    return invalid_argument(strfmt("[rotate] output dtype %s is not supported (F32, F16, BF16)", dtype_name(opts.out_dtype)));

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
  auto need = [&](const std::string& name, std::vector<int64_t> shape) -> Result<const formats::TensorInfo*> {
    const formats::TensorInfo* t = ts.find(name);
    if (!t) return not_found(strfmt("[rotate] %s: missing tensor '%s'", src_dir.c_str(), name.c_str()));
    if (!is_float(t->dtype))
      return unsupported(strfmt("[rotate] %s: tensor '%s' is %s; the fold needs F32, F16 or BF16", src_dir.c_str(),
                                name.c_str(), dtype_name(t->dtype)));
    if (t->shape != shape) {
      formats::TensorInfo want;
      want.shape = shape;
      return invalid_argument(strfmt("[rotate] %s: tensor '%s' has shape %s, config.json implies %s", src_dir.c_str(),
                                     name.c_str(), t->shape_str().c_str(), want.shape_str().c_str()));
    }
    return t;
  };
  auto out_dtype = [&](DType src) { return opts.out_dtype != DType::kUnknown && is_float(src) ? opts.out_dtype : src; };
  auto add = [&](const std::string& name, const formats::TensorInfo* src, Fold f, const formats::TensorInfo* gamma,
                 int64_t layer) {
    OutTensor o;
    o.name = name;
    o.dtype = out_dtype(src->dtype);
    o.shape = src->shape;
    o.nbytes = dtype_bytes(o.dtype, static_cast<uint64_t>(src->numel()));
    o.fold = f;
    o.src = src;
    o.gamma = gamma;
    o.layer = layer;
    p.outs.push_back(std::move(o));
  };

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
      OutTensor o;
      o.name = t.name;
      o.dtype = t.dtype;  // a precomputed table: verbatim
      o.shape = t.shape;
      o.nbytes = t.nbytes;
      o.src = &t;
      p.outs.push_back(std::move(o));
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
  std::sort(p.outs.begin(), p.outs.end(), [](const OutTensor& a, const OutTensor& b) { return a.name < b.name; });
  for (const OutTensor& o : p.outs) p.total_params += static_cast<uint64_t>(o.src->numel());

  RotateReport& rep = p.report;
  rep.hidden = H;
  rep.head_dim = hd;
  rep.r1_construction = p.r1.construction();
  rep.r2_construction = r2_on && L > 0 ? p.r2.front().construction() : "none";
  rep.untied = tied;
  for (const char* d : kDeviations) rep.deviations.emplace_back(d);
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
    const int64_t rows = s.rank() == 2 ? s.dim(0) : 1, cols = n / rows;
    f_.resize(static_cast<size_t>(n));
    float* w = f_.data();
    if (t.fold == Fold::kOnes) {
      std::fill(f_.begin(), f_.end(), 1.0f);
    } else {
      load_f32(s, w);
    }
    const Rotation& r2 = t.layer >= 0 ? p_.r2[static_cast<size_t>(t.layer)] : kIdentity;
    switch (t.fold) {
      case Fold::kCopy:
      case Fold::kOnes:
        break;
      case Fold::kEmbed:
      case Fold::kWriterBias:
        rotate_rows(w, rows, cols, p_.r1, threads_);
        break;
      case Fold::kReader:
      case Fold::kV:
        fold_gamma(w, rows, cols, *t.gamma);
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
        rotate_out_rows(w, rows, cols, p_.r1, threads_, &tbuf_);
        break;
    }
    if (t.dtype == DType::kF32) return static_cast<const void*>(w);
    out_.resize(t.nbytes);
    store(w, n, t.dtype, out_.data());
    return static_cast<const void*>(out_.data());
  }

 private:
  void fold_gamma(float* w, int64_t rows, int64_t cols, const formats::TensorInfo& gamma) {
    g_.resize(static_cast<size_t>(cols));
    load_f32(gamma, g_.data());
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
  if (opts.out_dtype != DType::kUnknown) {
    cfg["torch_dtype"] = torch_dtype_name(opts.out_dtype);
    if (cfg.contains("dtype")) cfg["dtype"] = torch_dtype_name(opts.out_dtype);
  }
  ordered_json rot = ordered_json::object();
  rot["seed"] = opts.seed;
  rot["order"] = "untie, gamma-fold, R1, R2";
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
