#include "larder/models/lora.h"

#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <regex>
#include <utility>

#include <unistd.h>

#include "larder/formats/gguf.h"
#include "larder/formats/safetensors.h"
#include "larder/models/config.h"
#include "larder/models/registry.h"

namespace larder::models {

namespace {

struct ModuleRow {
  LoraModule m;
  const char* hf;    // path inside "model.layers.N."
  const char* gguf;  // fragment after "blk.N."
};
constexpr ModuleRow kModules[kLoraModuleCount] = {
    {LoraModule::kQ, "self_attn.q_proj", "attn_q"},
    {LoraModule::kK, "self_attn.k_proj", "attn_k"},
    {LoraModule::kV, "self_attn.v_proj", "attn_v"},
    {LoraModule::kO, "self_attn.o_proj", "attn_output"},
    {LoraModule::kGate, "mlp.gate_proj", "ffn_gate"},
    {LoraModule::kUp, "mlp.up_proj", "ffn_up"},
    {LoraModule::kDown, "mlp.down_proj", "ffn_down"},
    {LoraModule::kDeltaQkv, "linear_attn.in_proj_qkv", "attn_qkv"},
    {LoraModule::kDeltaZ, "linear_attn.in_proj_z", "attn_gate"},
    {LoraModule::kDeltaB, "linear_attn.in_proj_b", "ssm_beta"},
    {LoraModule::kDeltaA, "linear_attn.in_proj_a", "ssm_alpha"},
    {LoraModule::kDeltaOut, "linear_attn.out_proj", "ssm_out"},
};

bool ends_with(std::string_view s, std::string_view suf) {
  return s.size() >= suf.size() && s.substr(s.size() - suf.size()) == suf;
}

// A projection named by a tensor: "<anything>layers.N.<module path>" (HF names, incl. the
// prefixes of PEFT — "base_model.model.model." — and of multimodal text towers) or
// "blk.N.<fragment>.weight" (GGUF). `module_name` is the part before the LoRA suffix.
struct ParsedName {
  int layer = -1;
  std::optional<LoraModule> module;
  std::string rel;  // the module path inside the layer ("self_attn.q_proj"), for messages/keys
  bool other_tower = false;  // under a vision/audio tower of a multimodal checkpoint
};

ParsedName parse_layer_module(std::string_view module_name, bool gguf) {
  ParsedName p;
  const std::string_view marker = gguf ? "blk." : "layers.";
  size_t pos = std::string_view::npos;
  // The last "layers.<digits>." (a multimodal prefix may hold "layers" in another sense).
  for (size_t at = module_name.find(marker); at != std::string_view::npos; at = module_name.find(marker, at + 1)) {
    if (at != 0 && module_name[at - 1] != '.') continue;
    size_t d = at + marker.size(), e = d;
    while (e < module_name.size() && std::isdigit(static_cast<unsigned char>(module_name[e]))) ++e;
    if (e > d && e < module_name.size() && module_name[e] == '.' && e - d <= 6) pos = at;
  }
  if (pos == std::string_view::npos) {
    p.rel = std::string(module_name);
    return p;
  }
  // Multimodal checkpoints keep vision/audio towers with layers of the same names beside the
  // text model: those are not the text model's layers.
  const std::string_view prefix = module_name.substr(0, pos);
  for (std::string_view tower : {"vision", "visual", "audio", "image", "encoder", "multi_modal", "mm_"})
    if (prefix.find(tower) != std::string_view::npos) {
      p.rel = std::string(module_name);
      p.other_tower = true;
      return p;
    }
  size_t d = pos + marker.size(), e = d;
  while (std::isdigit(static_cast<unsigned char>(module_name[e]))) ++e;
  p.layer = std::stoi(std::string(module_name.substr(d, e - d)));
  p.rel = std::string(module_name.substr(e + 1));
  std::string_view rel = p.rel;
  if (gguf) {
    if (!ends_with(rel, ".weight")) return p;
    rel.remove_suffix(7);
  }
  for (const ModuleRow& r : kModules)
    if (rel == (gguf ? r.gguf : r.hf)) p.module = r.m;
  return p;
}

// Why a module outside the table is refused, in words a user can act on.
std::string unsupported_module(std::string_view what, const ParsedName& p) {
  const std::string& r = p.rel;
  if (p.other_tower)
    return strfmt("%.*s: outside the text model (a vision/audio tower); larder adapts the text model's projections",
                  static_cast<int>(what.size()), what.data());
  if (p.layer < 0) {
    if (r.find("embed") != std::string::npos || r.find("token_embd") != std::string::npos)
      return strfmt("%.*s: LoRA on the token embedding is not supported (larder applies adapters to the "
                    "projections inside the layers)",
                    static_cast<int>(what.size()), what.data());
    if (r.find("lm_head") != std::string::npos || r.rfind("output", 0) == 0)
      return strfmt("%.*s: LoRA on the output head (lm_head) is not supported (larder applies adapters to the "
                    "projections inside the layers)",
                    static_cast<int>(what.size()), what.data());
    return strfmt("%.*s: not a projection inside a model layer", static_cast<int>(what.size()), what.data());
  }
  if (r.find("experts") != std::string::npos || r.find("switch_mlp") != std::string::npos ||
      r.find("_exps") != std::string::npos)
    return strfmt("%.*s: LoRA on routed experts is not supported yet", static_cast<int>(what.size()), what.data());
  std::string known;
  for (const ModuleRow& m : kModules) known += (known.empty() ? "" : ", ") + std::string(m.hf);
  return strfmt("%.*s: unknown module '%s' in layer %d (larder adapts: %s)", static_cast<int>(what.size()),
                what.data(), r.c_str(), p.layer, known.c_str());
}

}  // namespace

std::string_view lora_module_hf(LoraModule m) { return kModules[static_cast<int>(m)].hf; }
std::string_view lora_module_gguf(LoraModule m) { return kModules[static_cast<int>(m)].gguf; }
std::string lora_projection_name(int layer, LoraModule m) {
  return strfmt("layers.%d.%s", layer, kModules[static_cast<int>(m)].hf);
}
const char* lora_format_name(LoraFormat f) {
  switch (f) {
    case LoraFormat::kPeft: return "PEFT";
    case LoraFormat::kMlx: return "mlx-lm";
    case LoraFormat::kGguf: return "GGUF";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Building an adapter.

struct LoraBuilder {
  std::shared_ptr<LoraAdapter> a;
  std::string where;  // path for messages
  // The file the tensors map (safetensors adapters), and the byte ranges of it whose values were
  // copied into the adapter's own layout: nothing reads those again once loaded (the hash and the
  // forward read the copies), so finish() drops their pages from the process (RSS would otherwise
  // count a packed B twice: the panels and the mapped original).
  const MappedFile* file = nullptr;
  std::vector<std::pair<const uint8_t*, size_t>> copied;

  // The loaders (free functions) fill the adapter's private fields through these.
  std::string& base_model() { return a->base_model_; }
  std::string& architecture() { return a->architecture_; }
  int& mlx_num_layers() { return a->mlx_num_layers_; }
  std::shared_ptr<void>& mapping() { return a->mapping_; }

  // Owned bytes of the adapter (converted or re-laid-out factors).
  uint8_t* own(size_t bytes) {
    a->owned_.push_back(std::make_unique<uint8_t[]>(bytes));
    return a->owned_.back().get();
  }

  // A 2-D tensor's elements [r, c] as `dt` (its own dtype, or F32 widened from a 16-bit one),
  // in that order or transposed ([c, r]).
  static void copy_elems(const formats::TensorInfo& t, DType dt, bool transpose, uint8_t* dst) {
    const int64_t r = t.dim(0), c = t.dim(1);
    const size_t es = dt == DType::kF32 ? 4 : 2;
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) {
        uint8_t* to = dst + static_cast<size_t>(transpose ? j * r + i : i * c + j) * es;
        if (t.dtype == dt) {
          std::memcpy(to, t.data + (i * c + j) * static_cast<int64_t>(es), es);
          continue;
        }
        uint16_t h;  // dt is F32 here: widen
        std::memcpy(&h, t.data + (i * c + j) * 2, 2);
        const float v = t.dtype == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
        std::memcpy(to, &v, 4);
      }
  }

  // A as lora_delta reads it: [rank, in] in `dt`. The mapping itself where the file already has
  // that (no transpose, no widening, f32 4-byte aligned), else a copy the adapter owns.
  const void* a_matrix(const formats::TensorInfo& t, DType dt, bool transpose) {
    if (!transpose && t.dtype == dt && (dt != DType::kF32 || reinterpret_cast<uintptr_t>(t.data) % 4 == 0))
      return t.data;
    uint8_t* buf = own(static_cast<size_t>(t.dim(0) * t.dim(1)) * (dt == DType::kF32 ? 4 : 2));
    copy_elems(t, dt, transpose, buf);
    copied.emplace_back(t.data, static_cast<size_t>(t.dim(0) * t.dim(1)) * (t.dtype == DType::kF32 ? 4 : 2));
    return buf;
  }

  // B in lora_delta's output panels, in `dt`, owned by the adapter; `rank_major`: the tensor is
  // [rank, out] (mlx-lm), else [out, rank].
  const void* b_panels(const formats::TensorInfo& t, DType dt, bool rank_major, int64_t rank, int64_t out) {
    const size_t es = dt == DType::kF32 ? 4 : 2;
    const void* src = t.data;
    std::vector<uint8_t> wide;
    if (t.dtype != dt) {
      wide.resize(static_cast<size_t>(rank * out) * es);
      copy_elems(t, dt, false, wide.data());
      src = wide.data();
    }
    uint8_t* buf = own(static_cast<size_t>(kernels::lora_panel_elems(rank, out)) * es);
    kernels::pack_lora_b(dt, src, rank_major, rank, out, buf);
    copied.emplace_back(t.data, static_cast<size_t>(rank * out) * (t.dtype == DType::kF32 ? 4 : 2));
    return buf;
  }

  Status add(int layer, LoraModule m, const formats::TensorInfo& ta, const formats::TensorInfo& tb, bool transposed,
             int64_t rank, double scale) {
    const std::string name = lora_projection_name(layer, m);
    // transposed (mlx-lm): lora_a [in, r], lora_b [r, out]; else lora_A [r, in], lora_B [out, r].
    if (ta.rank() != 2 || tb.rank() != 2)
      return invalid_argument(strfmt("[lora] %s: %s: lora_A %s and lora_B %s must be matrices", where.c_str(),
                                     name.c_str(), ta.shape_str().c_str(), tb.shape_str().c_str()));
    const int64_t ra = transposed ? ta.dim(1) : ta.dim(0), in = transposed ? ta.dim(0) : ta.dim(1);
    const int64_t rb = transposed ? tb.dim(0) : tb.dim(1), out = transposed ? tb.dim(1) : tb.dim(0);
    if (ra != rb)
      return invalid_argument(strfmt("[lora] %s: %s: lora_A %s and lora_B %s disagree on the rank (%lld vs %lld)",
                                     where.c_str(), name.c_str(), ta.shape_str().c_str(), tb.shape_str().c_str(),
                                     static_cast<long long>(ra), static_cast<long long>(rb)));
    if (rank > 0 && ra != rank)
      return invalid_argument(strfmt("[lora] %s: %s: lora_A %s has rank %lld but the adapter config says r = %lld",
                                     where.c_str(), name.c_str(), ta.shape_str().c_str(), static_cast<long long>(ra),
                                     static_cast<long long>(rank)));
    if (ra <= 0 || in <= 0 || out <= 0)
      return invalid_argument(strfmt("[lora] %s: %s: empty LoRA matrices %s, %s", where.c_str(), name.c_str(),
                                     ta.shape_str().c_str(), tb.shape_str().c_str()));
    if (!std::isfinite(scale))
      return invalid_argument(strfmt("[lora] %s: %s: the scale is not finite", where.c_str(), name.c_str()));
    for (const LoraProjection& p : a->projections_)
      if (p.layer == layer && p.module == m)
        return invalid_argument(strfmt("[lora] %s: %s has two LoRA pairs ('%s' and '%s')", where.c_str(),
                                       name.c_str(), p.source.c_str(), ta.name.c_str()));
    LoraProjection p;
    p.layer = layer;
    p.module = m;
    p.rank = ra;
    p.in = in;
    p.out = out;
    for (const formats::TensorInfo* t : {&ta, &tb})
      if (t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16)
        return unsupported(strfmt("[lora] %s: tensor '%s' is %s; LoRA matrices must be F32, F16 or BF16",
                                  where.c_str(), t->name.c_str(), dtype_name(t->dtype)));
    // Both factors in the file's dtype when they share one (a 16-bit pair is never widened in
    // RAM); a mixed pair in f32.
    const DType dt = ta.dtype == tb.dtype ? ta.dtype : DType::kF32;
    p.f = {dt, a_matrix(ta, dt, transposed), b_panels(tb, dt, transposed, ra, out), ra, in, out};
    p.scale = static_cast<float>(scale);
    p.source = ta.name;
    a->projections_.push_back(std::move(p));
    return Status::ok();
  }

  Result<std::shared_ptr<const LoraAdapter>> finish() {
    if (a->projections_.empty())
      return invalid_argument(strfmt("[lora] %s: the adapter holds no LoRA matrices", where.c_str()));
    std::sort(a->projections_.begin(), a->projections_.end(), [](const LoraProjection& x, const LoraProjection& y) {
      return x.layer != y.layer ? x.layer < y.layer : x.module < y.module;
    });
    XXH3_state_t* s = XXH3_createState();
    XXH3_128bits_reset(s);
    const uint32_t recipe = 1;
    XXH3_128bits_update(s, &recipe, sizeof recipe);
    std::vector<float> va, vb;  // A [rank, in] and B [out, rank] as f32: what the hash has always read
    for (const LoraProjection& p : a->projections_) {
      const int64_t head[5] = {p.layer, static_cast<int64_t>(p.module), p.rank, p.in, p.out};
      XXH3_128bits_update(s, head, sizeof head);
      XXH3_128bits_update(s, &p.scale, sizeof p.scale);
      va.resize(static_cast<size_t>(p.rank * p.in));
      vb.resize(static_cast<size_t>(p.out * p.rank));
      for (int64_t k = 0; k < p.rank; ++k)
        for (int64_t j = 0; j < p.in; ++j) va[static_cast<size_t>(k * p.in + j)] = p.f.a_at(k, j);
      for (int64_t o = 0; o < p.out; ++o)
        for (int64_t k = 0; k < p.rank; ++k) vb[static_cast<size_t>(o * p.rank + k)] = p.f.b_at(o, k);
      XXH3_128bits_update(s, va.data(), va.size() * sizeof(float));
      XXH3_128bits_update(s, vb.data(), vb.size() * sizeof(float));
    }
    const XXH128_hash_t h = XXH3_128bits_digest(s);
    XXH3_freeState(s);
    a->content_hash_ = strfmt("%016llx%016llx", static_cast<unsigned long long>(h.high64),
                              static_cast<unsigned long long>(h.low64));
    if (file && file->data()) {
      // Whole pages inside a copied range only: a page shared with a tensor still read stays.
      const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
      for (const auto& [p, n] : copied) {
        if (p < file->data() || p + n > file->data() + file->size()) continue;
        const size_t off = static_cast<size_t>(p - file->data());
        const size_t begin = (off + page - 1) / page * page, end = (off + n) / page * page;
        if (end > begin) file->release_pages(begin, end - begin);
      }
    }
    return std::shared_ptr<const LoraAdapter>(std::move(a));
  }
};

LoraAdapter::LoraAdapter() = default;
LoraAdapter::~LoraAdapter() = default;

const LoraProjection* LoraAdapter::find(int layer, LoraModule m) const {
  auto it = std::lower_bound(projections_.begin(), projections_.end(), std::make_pair(layer, m),
                             [](const LoraProjection& p, const std::pair<int, LoraModule>& k) {
                               return p.layer != k.first ? p.layer < k.first : p.module < k.second;
                             });
  return it != projections_.end() && it->layer == layer && it->module == m ? &*it : nullptr;
}

int64_t LoraAdapter::max_rank() const {
  int64_t r = 0;
  for (const LoraProjection& p : projections_) r = std::max(r, p.rank);
  return r;
}

namespace {

using json = nlohmann::ordered_json;

// Python-regex-like full match for the simple patterns adapter configs use (std::regex's
// ECMAScript grammar agrees with Python's on them). A malformed pattern is an error.
Result<bool> regex_full_match(const std::string& pattern, const std::string& s, const std::string& where,
                              const char* field) {
  try {
    return std::regex_match(s, std::regex(pattern));
  } catch (const std::regex_error& e) {
    return invalid_argument(strfmt("[lora] %s: %s: '%s' is not a regular expression this loader can read (%s)",
                                   where.c_str(), field, pattern.c_str(), e.what()));
  }
}

// PEFT's rank_pattern / alpha_pattern lookup: the first key (in file order) that is the module's
// full name or matches its end after a '.' (`(.*\.)?(key)$`).
Result<std::optional<double>> pattern_value(const json& patterns, const std::string& module_key,
                                            const std::string& where, const char* field) {
  if (!patterns.is_object()) return std::optional<double>();
  for (auto it = patterns.begin(); it != patterns.end(); ++it) {
    if (!it.value().is_number())
      return invalid_argument(strfmt("[lora] %s: %s['%s'] must be a number", where.c_str(), field, it.key().c_str()));
    bool hit = it.key() == module_key;
    if (!hit) {
      LARDER_ASSIGN_OR_RETURN(hit, regex_full_match("(.*\\.)?(" + it.key() + ")", module_key, where, field));
    }
    if (hit) return std::optional<double>(it.value().get<double>());
  }
  return std::optional<double>();
}

Result<std::shared_ptr<const LoraAdapter>> load_peft(const std::string& dir, LoraBuilder b) {
  const std::string cfg_path = dir + "/adapter_config.json";
  LARDER_ASSIGN_OR_RETURN(json cfg, formats::read_json_file(cfg_path));
  b.where = dir;
  if (!cfg.is_object()) return invalid_argument(strfmt("[lora] %s: not a JSON object", cfg_path.c_str()));
  auto str_field = [&](const char* k) { return cfg.contains(k) && cfg[k].is_string() ? cfg[k].get<std::string>() : ""; };
  auto truthy = [&](const char* k) { return cfg.contains(k) && cfg[k].is_boolean() && cfg[k].get<bool>(); };
  if (const std::string t = str_field("peft_type"); !t.empty() && t != "LORA")
    return unsupported(strfmt("[lora] %s: peft_type '%s' is not supported (only LORA)", cfg_path.c_str(), t.c_str()));
  if (truthy("use_dora"))
    return unsupported(strfmt("[lora] %s: DoRA adapters (use_dora: true) are not supported: their magnitude vectors "
                              "rescale the whole weight, not a low-rank update",
                              cfg_path.c_str()));
  if (truthy("lora_bias"))
    return unsupported(strfmt("[lora] %s: lora_bias: true (a bias on lora_B) is not supported", cfg_path.c_str()));
  if (const std::string bias = str_field("bias"); !bias.empty() && bias != "none")
    return unsupported(strfmt("[lora] %s: bias '%s' (trained bias vectors) is not supported; only \"none\"",
                              cfg_path.c_str(), bias.c_str()));
  if (cfg.contains("modules_to_save") && cfg["modules_to_save"].is_array() && !cfg["modules_to_save"].empty())
    return unsupported(strfmt("[lora] %s: modules_to_save %s replaces whole modules, which an adapter applied per "
                              "request cannot do; merge the adapter into the model instead",
                              cfg_path.c_str(), cfg["modules_to_save"].dump().c_str()));
  if (cfg.contains("layer_replication") && !cfg["layer_replication"].is_null())
    return unsupported(strfmt("[lora] %s: layer_replication changes the model's layers; not supported",
                              cfg_path.c_str()));
  // fan_in_fan_out only says the *base* layer stores its weight transposed (GPT-2's Conv1D);
  // lora_A/lora_B are nn.Linear weights either way, and PEFT forces it off for nn.Linear bases
  // (every architecture larder runs), so it changes nothing here.
  if (!cfg.contains("r") || !cfg["r"].is_number_integer() || cfg["r"].get<int64_t>() <= 0)
    return invalid_argument(strfmt("[lora] %s: 'r' must be a positive integer", cfg_path.c_str()));
  const int64_t r = cfg["r"].get<int64_t>();
  double alpha = 8;  // PEFT's default lora_alpha
  if (cfg.contains("lora_alpha")) {
    if (!cfg["lora_alpha"].is_number())
      return invalid_argument(strfmt("[lora] %s: 'lora_alpha' must be a number", cfg_path.c_str()));
    alpha = cfg["lora_alpha"].get<double>();
  }
  const bool rslora = truthy("use_rslora");
  const json targets = cfg.contains("target_modules") ? cfg["target_modules"] : json();
  b.base_model() = str_field("base_model_name_or_path");

  std::string st_path = dir + "/adapter_model.safetensors";
  if (!file_exists(st_path)) {
    if (file_exists(dir + "/adapter_model.bin"))
      return unsupported(strfmt("[lora] %s: adapter_model.bin (a pickled torch file) is not read; save the adapter "
                                "with safe_serialization=True (adapter_model.safetensors)",
                                dir.c_str()));
    return not_found(strfmt("[lora] %s: no adapter_model.safetensors", dir.c_str()));
  }
  auto ts = std::make_shared<formats::TensorSet>();
  LARDER_RETURN_IF_ERROR(formats::read_safetensors(st_path, ts.get()));
  b.mapping() = ts;
  b.where = st_path;
  if (ts->files().size() == 1) b.file = ts->files()[0].get();

  for (const formats::TensorInfo& t : ts->tensors()) {
    std::string_view n = t.name;
    if (ends_with(n, ".lora_B.weight")) continue;  // taken with its lora_A
    if (ends_with(n, ".lora_magnitude_vector") || n.find("lora_magnitude_vector") != std::string_view::npos)
      return unsupported(strfmt("[lora] %s: '%s' is a DoRA magnitude vector; DoRA adapters are not supported",
                                st_path.c_str(), t.name.c_str()));
    if (n.find("lora_embedding_") != std::string_view::npos)
      return unsupported(strfmt("[lora] %s: '%s': LoRA on the token embedding is not supported", st_path.c_str(),
                                t.name.c_str()));
    if (!ends_with(n, ".lora_A.weight"))
      return unsupported(strfmt("[lora] %s: tensor '%s' is not a LoRA matrix (lora_A.weight / lora_B.weight); "
                                "modules_to_save, biases and other adapter types are not supported",
                                st_path.c_str(), t.name.c_str()));
    const std::string module_name(n.substr(0, n.size() - std::string_view(".lora_A.weight").size()));
    const formats::TensorInfo* tb = ts->find(module_name + ".lora_B.weight");
    if (!tb)
      return invalid_argument(strfmt("[lora] %s: '%s' has no matching '%s.lora_B.weight'", st_path.c_str(),
                                     t.name.c_str(), module_name.c_str()));
    const ParsedName p = parse_layer_module(module_name, false);
    if (!p.module) return unsupported("[lora] " + st_path + ": " + unsupported_module(module_name, p));
    // PEFT matches patterns against the module's name in the base model.
    std::string key = module_name;
    if (key.rfind("base_model.model.", 0) == 0) key = key.substr(17);
    // target_modules: a list (a module matches by its full name or its trailing components), a
    // regular expression over the full name, or "all-linear".
    if (targets.is_array()) {
      bool hit = false;
      for (const json& tgt : targets)
        if (tgt.is_string() && (key == tgt.get<std::string>() || ends_with(key, "." + tgt.get<std::string>())))
          hit = true;
      if (!hit)
        return invalid_argument(strfmt("[lora] %s: '%s' holds LoRA weights for %s, but target_modules %s does not "
                                       "name it",
                                       st_path.c_str(), t.name.c_str(), key.c_str(), targets.dump().c_str()));
    } else if (targets.is_string() && targets.get<std::string>() != "all-linear") {
      LARDER_ASSIGN_OR_RETURN(bool hit, regex_full_match(targets.get<std::string>(), key, cfg_path, "target_modules"));
      if (!hit)
        return invalid_argument(strfmt("[lora] %s: '%s' holds LoRA weights for %s, but the target_modules pattern "
                                       "'%s' does not match it",
                                       st_path.c_str(), t.name.c_str(), key.c_str(),
                                       targets.get<std::string>().c_str()));
    }
    LARDER_ASSIGN_OR_RETURN(std::optional<double> pr, pattern_value(cfg.value("rank_pattern", json()), key, cfg_path,
                                                                    "rank_pattern"));
    LARDER_ASSIGN_OR_RETURN(std::optional<double> pa, pattern_value(cfg.value("alpha_pattern", json()), key, cfg_path,
                                                                    "alpha_pattern"));
    const int64_t rank = pr ? static_cast<int64_t>(*pr) : r;
    const double a = pa ? *pa : alpha;
    if (rank <= 0) return invalid_argument(strfmt("[lora] %s: rank_pattern gives %s rank %lld", cfg_path.c_str(),
                                                  key.c_str(), static_cast<long long>(rank)));
    const double scale = rslora ? a / std::sqrt(static_cast<double>(rank)) : a / static_cast<double>(rank);
    LARDER_RETURN_IF_ERROR(b.add(p.layer, *p.module, t, *tb, /*transposed=*/false, rank, scale));
  }
  // Every lora_B must have been taken with a lora_A.
  for (const formats::TensorInfo& t : ts->tensors()) {
    std::string_view n = t.name;
    if (ends_with(n, ".lora_B.weight") &&
        !ts->find(std::string(n.substr(0, n.size() - std::string_view(".lora_B.weight").size())) + ".lora_A.weight"))
      return invalid_argument(strfmt("[lora] %s: '%s' has no matching lora_A", st_path.c_str(), t.name.c_str()));
  }
  return b.finish();
}

Result<std::shared_ptr<const LoraAdapter>> load_mlx(const std::string& dir, LoraBuilder b) {
  const std::string cfg_path = dir + "/adapter_config.json";
  LARDER_ASSIGN_OR_RETURN(json cfg, formats::read_json_file(cfg_path));
  b.where = dir;
  if (!cfg.is_object()) return invalid_argument(strfmt("[lora] %s: not a JSON object", cfg_path.c_str()));
  const std::string type = cfg.contains("fine_tune_type") && cfg["fine_tune_type"].is_string()
                               ? cfg["fine_tune_type"].get<std::string>()
                               : "lora";
  if (type == "dora")
    return unsupported(strfmt("[lora] %s: DoRA adapters (fine_tune_type: dora) are not supported: their magnitude "
                              "vectors rescale the whole weight, not a low-rank update",
                              cfg_path.c_str()));
  if (type == "full")
    return unsupported(strfmt("[lora] %s: fine_tune_type 'full' is a full fine-tune, not an adapter: load "
                              "adapters.safetensors' weights as a model instead",
                              cfg_path.c_str()));
  if (type != "lora")
    return unsupported(strfmt("[lora] %s: fine_tune_type '%s' is not supported", cfg_path.c_str(), type.c_str()));
  if (!cfg.contains("lora_parameters") || !cfg["lora_parameters"].is_object())
    return invalid_argument(strfmt("[lora] %s: no 'lora_parameters' object", cfg_path.c_str()));
  const json& lp = cfg["lora_parameters"];
  if (!lp.contains("scale"))
    return invalid_argument(strfmt("[lora] %s: lora_parameters has no 'scale'%s", cfg_path.c_str(),
                                   lp.contains("alpha") ? " (mlx-lm's adapters use 'scale', not 'alpha')" : ""));
  if (!lp["scale"].is_number())
    return invalid_argument(strfmt("[lora] %s: lora_parameters.scale must be a number", cfg_path.c_str()));
  if (!lp.contains("rank") || !lp["rank"].is_number_integer() || lp["rank"].get<int64_t>() <= 0)
    return invalid_argument(strfmt("[lora] %s: lora_parameters.rank must be a positive integer", cfg_path.c_str()));
  const double scale = lp["scale"].get<double>();
  const int64_t rank = lp["rank"].get<int64_t>();
  std::vector<std::string> keys;
  if (lp.contains("keys") && lp["keys"].is_array())
    for (const json& k : lp["keys"])
      if (k.is_string()) keys.push_back(k.get<std::string>());
  if (cfg.contains("model") && cfg["model"].is_string()) b.base_model() = cfg["model"].get<std::string>();
  if (cfg.contains("num_layers") && cfg["num_layers"].is_number_integer())
    b.mlx_num_layers() = static_cast<int>(std::max<int64_t>(-1, cfg["num_layers"].get<int64_t>()));

  const std::string st_path = dir + "/adapters.safetensors";
  auto ts = std::make_shared<formats::TensorSet>();
  LARDER_RETURN_IF_ERROR(formats::read_safetensors(st_path, ts.get()));
  b.mapping() = ts;
  b.where = st_path;
  if (ts->files().size() == 1) b.file = ts->files()[0].get();
  for (const formats::TensorInfo& t : ts->tensors()) {
    std::string_view n = t.name;
    if (ends_with(n, ".lora_b")) {
      if (!ts->find(std::string(n.substr(0, n.size() - 7)) + ".lora_a"))
        return invalid_argument(strfmt("[lora] %s: '%s' has no matching lora_a", st_path.c_str(), t.name.c_str()));
      continue;
    }
    if (ends_with(n, ".m"))
      return unsupported(strfmt("[lora] %s: '%s' is a DoRA magnitude vector; DoRA adapters are not supported",
                                st_path.c_str(), t.name.c_str()));
    if (!ends_with(n, ".lora_a"))
      return unsupported(strfmt("[lora] %s: tensor '%s' is not a LoRA matrix (lora_a / lora_b)", st_path.c_str(),
                                t.name.c_str()));
    const std::string module_name(n.substr(0, n.size() - 7));
    const formats::TensorInfo* tb = ts->find(module_name + ".lora_b");
    if (!tb)
      return invalid_argument(strfmt("[lora] %s: '%s' has no matching '%s.lora_b'", st_path.c_str(), t.name.c_str(),
                                     module_name.c_str()));
    const ParsedName p = parse_layer_module(module_name, false);
    if (!p.module) return unsupported("[lora] " + st_path + ": " + unsupported_module(module_name, p));
    if (!keys.empty() && std::find(keys.begin(), keys.end(), p.rel) == keys.end())
      return invalid_argument(strfmt("[lora] %s: '%s' adapts %s, which lora_parameters.keys does not list",
                                     st_path.c_str(), t.name.c_str(), p.rel.c_str()));
    LARDER_RETURN_IF_ERROR(b.add(p.layer, *p.module, t, *tb, /*transposed=*/true, rank, scale));
  }
  return b.finish();
}

Result<std::shared_ptr<const LoraAdapter>> load_gguf(const std::string& path, LoraBuilder b) {
  b.where = path;
  LARDER_ASSIGN_OR_RETURN(std::unique_ptr<formats::GgufFile> g, formats::GgufFile::open(path));
  const std::string type = g->get_string("general.type").value_or("");
  if (type != "adapter")
    return invalid_argument(strfmt("[lora] %s: general.type is '%s', not 'adapter': this GGUF is %s", path.c_str(),
                                   type.c_str(), type.empty() || type == "model" ? "a model, not a LoRA adapter"
                                                                                 : "not a LoRA adapter"));
  const std::string atype = g->get_string("adapter.type").value_or("");
  if (atype != "lora")
    return unsupported(strfmt("[lora] %s: adapter.type '%s' is not supported (only 'lora')", path.c_str(),
                              atype.c_str()));
  if (g->find("adapter.alora.invocation_tokens"))
    return unsupported(strfmt("[lora] %s: activated LoRA (adapter.alora.invocation_tokens) is not supported",
                              path.c_str()));
  b.architecture() = g->architecture();
  if (auto u = g->get_string("general.base_model.0.repo_url")) {
    std::string s = *u;
    for (const char* pre : {"https://huggingface.co/", "http://huggingface.co/"})
      if (s.rfind(pre, 0) == 0) s = s.substr(std::strlen(pre));
    b.base_model() = s;
  } else if (auto nm = g->get_string("general.base_model.0.name")) {
    b.base_model() = *nm;
  }
  // llama.cpp: scale = alpha / rank, or 1 when the file has no alpha (or 0).
  const double alpha = g->get_float("adapter.lora.alpha").value_or(0.0);
  const formats::TensorSet& ts = g->tensors();
  for (const formats::TensorInfo& t : ts.tensors()) {
    std::string_view n = t.name;
    if (ends_with(n, ".lora_b")) {
      if (!ts.find(std::string(n.substr(0, n.size() - 7)) + ".lora_a"))
        return invalid_argument(strfmt("[lora] %s: '%s' has no matching lora_a", path.c_str(), t.name.c_str()));
      continue;
    }
    if (!ends_with(n, ".lora_a")) {
      if (ends_with(n, "_norm.weight"))
        return unsupported(strfmt("[lora] %s: '%s' replaces a norm weight, which larder does not apply (llama.cpp "
                                  "ignores it, changing what the adapter computes)",
                                  path.c_str(), t.name.c_str()));
      return unsupported(strfmt("[lora] %s: tensor '%s' is not a LoRA matrix (.lora_a / .lora_b)", path.c_str(),
                                t.name.c_str()));
    }
    const std::string module_name(n.substr(0, n.size() - 7));
    const formats::TensorInfo* tb = ts.find(module_name + ".lora_b");
    if (!tb)
      return invalid_argument(strfmt("[lora] %s: '%s' has no matching '%s.lora_b'", path.c_str(), t.name.c_str(),
                                     module_name.c_str()));
    const ParsedName p = parse_layer_module(module_name, true);
    if (!p.module) return unsupported("[lora] " + path + ": " + unsupported_module(module_name, p));
    // Shapes (outermost-first): lora_a [r, in], lora_b [out, r]; llama.cpp's rank is lora_b's
    // ne[0], i.e. its last dimension here.
    if (tb->rank() == 2 && t.rank() == 2 && tb->dim(1) != t.dim(0))
      return invalid_argument(strfmt("[lora] %s: %s: lora_a %s and lora_b %s do not chain (lora_a must be [r, in] "
                                     "and lora_b [out, r]: was lora_a written untransposed?)",
                                     path.c_str(), lora_projection_name(p.layer, *p.module).c_str(),
                                     t.shape_str().c_str(), tb->shape_str().c_str()));
    const int64_t r = tb->rank() == 2 ? tb->dim(1) : 0;
    const double scale = alpha != 0 && r > 0 ? alpha / static_cast<double>(r) : 1.0;
    LARDER_RETURN_IF_ERROR(b.add(p.layer, *p.module, t, *tb, /*transposed=*/false, 0, scale));
  }
  b.mapping() = std::shared_ptr<formats::GgufFile>(std::move(g));
  return b.finish();
}

}  // namespace

Result<std::shared_ptr<const LoraAdapter>> LoraAdapter::load(const std::string& path) {
  LoraBuilder b;
  b.a = std::shared_ptr<LoraAdapter>(new LoraAdapter());
  b.a->path_ = path;
  b.where = path;
  if (is_directory(path)) {
    const bool peft = file_exists(path + "/adapter_model.safetensors") || file_exists(path + "/adapter_model.bin");
    const bool mlx = file_exists(path + "/adapters.safetensors");
    if (!file_exists(path + "/adapter_config.json"))
      return not_found(strfmt("[lora] %s: no adapter_config.json (expected a PEFT or mlx-lm adapter directory)",
                              path.c_str()));
    if (peft && mlx)
      return invalid_argument(strfmt("[lora] %s: holds both adapter_model.safetensors (PEFT) and adapters.safetensors "
                                     "(mlx-lm); keep one",
                                     path.c_str()));
    if (peft) {
      b.a->format_ = LoraFormat::kPeft;
      return load_peft(path, std::move(b));
    }
    if (mlx) {
      b.a->format_ = LoraFormat::kMlx;
      return load_mlx(path, std::move(b));
    }
    return not_found(strfmt("[lora] %s: neither adapter_model.safetensors (PEFT) nor adapters.safetensors (mlx-lm)",
                            path.c_str()));
  }
  if (!file_exists(path)) return not_found(strfmt("[lora] %s: no such file or directory", path.c_str()));
  if (ends_with(path, ".safetensors"))
    return invalid_argument(strfmt("[lora] %s: pass the adapter's directory (with adapter_config.json), not the "
                                   "safetensors file",
                                   path.c_str()));
  b.a->format_ = LoraFormat::kGguf;
  return load_gguf(path, std::move(b));
}

// ---------------------------------------------------------------------------------------------
// The base side.

const BaseProjections::Shape* BaseProjections::find(int layer, LoraModule m) const {
  if (layer < 0 || layer >= n_layers) return nullptr;
  const Shape& s = shapes[static_cast<size_t>(layer) * kLoraModuleCount + static_cast<size_t>(m)];
  return s.out > 0 ? &s : nullptr;
}

Result<BaseProjections> BaseProjections::from_files(const formats::ModelFiles& files) {
  if (!files.has_weights())
    return invalid_argument(strfmt("[lora] %s: the base model was opened without weights", files.path.c_str()));
  BaseProjections b;
  b.path = files.path;
  LARDER_ASSIGN_OR_RETURN(b.architecture, architecture_of(files));
  const ArchEntry* e = find_architecture(b.architecture);
  if (!e) return unsupported(strfmt("[lora] %s: architecture '%s' is not supported", files.path.c_str(),
                                    b.architecture.c_str()));
  LARDER_ASSIGN_OR_RETURN(ModelConfig cfg, e->config ? e->config(files) : config_from_files(files));
  b.n_layers = static_cast<int>(cfg.n_layers);
  b.shapes.assign(static_cast<size_t>(b.n_layers) * kLoraModuleCount, Shape{});
  const bool gguf = files.gguf != nullptr;
  b.order = gguf ? WeightOrder::kGguf : WeightOrder::kHf;
  QuantizationConfig quant;
  if (!gguf) {
    LARDER_ASSIGN_OR_RETURN(quant, quantization_from_config(files.config, files.path + "/config.json"));
  }
  // Names the base goes by, for the adapter's base_model_name_or_path.
  if (gguf) {
    for (const char* k : {"general.name", "general.basename", "general.base_model.0.repo_url"})
      if (auto s = files.gguf->get_string(k)) b.names.push_back(*s);
  } else if (files.config.is_object() && files.config.contains("_name_or_path") &&
             files.config["_name_or_path"].is_string()) {
    b.names.push_back(files.config["_name_or_path"].get<std::string>());
  }
  // A Hugging Face cache path names its repo: …/models--Org--Name/snapshots/<rev>.
  if (size_t at = files.path.find("models--"); at != std::string::npos) {
    std::string repo = files.path.substr(at + 8);
    repo = repo.substr(0, repo.find('/'));
    if (size_t d = repo.find("--"); d != std::string::npos) repo = repo.substr(0, d) + "/" + repo.substr(d + 2);
    b.names.push_back(repo);
  }
  b.names.push_back(files.path);

  for (const formats::TensorInfo& t : files.tensors().tensors()) {
    std::string_view n = t.name;
    if (!gguf) {
      if (!ends_with(n, ".weight")) continue;
      n.remove_suffix(7);
    }
    const ParsedName p = parse_layer_module(n, gguf);
    if (!p.module || p.layer < 0 || p.layer >= b.n_layers || t.rank() != 2) continue;
    Shape s{t.dim(0), t.dim(1)};
    if (t.dtype == DType::kU32) {  // MLX affine: packed codes, 32 / bits values per word
      const std::string module(n);
      std::optional<AffineParams> ap = quant.global;
      if (auto it = quant.modules.find(module); it != quant.modules.end()) ap = it->second;
      if (!quant.present || !ap)
        return invalid_argument(strfmt("[lora] %s: '%s' is U32 but the config has no quantization for it",
                                       files.path.c_str(), t.name.c_str()));
      s.in = t.dim(1) * 32 / ap->bits;
    }
    b.shapes[static_cast<size_t>(p.layer) * kLoraModuleCount + static_cast<size_t>(*p.module)] = s;
  }
  return b;
}

namespace {

// Families whose HF and GGUF files agree on the rows and columns of the projection (checked
// against llama.cpp's converters): it permutes Llama's Q/K rows (interleaved RoPE) and reorders
// Qwen3.5's DeltaNet value heads, so an adapter from one side does not fit a base from the other there.
bool same_order_across_formats(const std::string& arch, LoraModule m) {
  if (arch == "qwen2" || arch == "qwen3" || arch == "qwen3moe") return true;
  if (arch == "llama" || arch == "mistral") return m != LoraModule::kQ && m != LoraModule::kK;
  // Attention is written as is; Qwen3-Next's fused DeltaNet inputs are regrouped by the converter.
  if (arch == "gpt-oss" || arch == "qwen3next")
    return m == LoraModule::kQ || m == LoraModule::kK || m == LoraModule::kV || m == LoraModule::kO;
  return false;
}

// Architecture names that denote the same graph, mapped to llama.cpp's GGUF name (HF
// model_type on one side, general.architecture on the other).
std::string arch_family(const std::string& a) {
  if (a == "mistral") return "llama";
  if (a == "gemma3_text") return "gemma3";
  if (a == "gemma4_text") return "gemma4";
  if (a == "qwen3_5" || a == "qwen3_5_text") return "qwen35";
  if (a == "qwen3_5_moe" || a == "qwen3_5_moe_text") return "qwen35moe";
  if (a == "qwen3_moe") return "qwen3moe";
  if (a == "qwen3_next") return "qwen3next";
  if (a == "gpt_oss") return "gpt-oss";
  return a;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Status LoraAdapter::validate(const BaseProjections& base, std::vector<std::string>* warnings) const {
  if (!architecture_.empty() && arch_family(architecture_) != arch_family(base.architecture))
    return incompatible(strfmt("[lora] %s: the adapter is for architecture '%s' but the model %s is '%s'",
                               path_.c_str(), architecture_.c_str(), base.path.c_str(), base.architecture.c_str()));
  if (!base_model_.empty() && warnings) {
    // Compare the last path component case-insensitively: "Qwen/Qwen3-0.6B" matches a local
    // directory "…/qwen3-0.6b" or a GGUF general.name "Qwen3 0.6B" only loosely, so a mismatch is
    // a warning, never an error (shapes decide).
    std::string want = lower(base_model_);
    while (!want.empty() && want.back() == '/') want.pop_back();
    if (size_t s = want.rfind('/'); s != std::string::npos) want = want.substr(s + 1);
    bool hit = false;
    for (const std::string& nm : base.names) hit = hit || lower(nm).find(want) != std::string::npos;
    if (!hit)
      warnings->push_back(strfmt("[lora] %s: the adapter was trained on '%s', but the model is %s", path_.c_str(),
                                 base_model_.c_str(), base.path.c_str()));
  }
  for (const LoraProjection& p : projections_) {
    const std::string name = lora_projection_name(p.layer, p.module);
    const std::string_view mod = lora_module_hf(p.module);
    const std::string_view leaf = mod.substr(mod.find('.') + 1);
    if (p.layer >= base.n_layers)
      return incompatible(strfmt("[lora] %s: %s: the model has %d layers", path_.c_str(), name.c_str(),
                                 base.n_layers));
    if (mlx_num_layers_ >= 0 && p.layer < base.n_layers - mlx_num_layers_)
      return incompatible(strfmt("[lora] %s: %s: adapter_config.json's num_layers %d adapts only the last %d of the "
                                 "model's %d layers",
                                 path_.c_str(), name.c_str(), mlx_num_layers_, mlx_num_layers_, base.n_layers));
    const BaseProjections::Shape* s = base.find(p.layer, p.module);
    if (!s)
      return incompatible(strfmt("[lora] %s: %s: the model has no %.*s in layer %d", path_.c_str(), name.c_str(),
                                 static_cast<int>(leaf.size()), leaf.data(), p.layer));
    if (p.in != s->in)
      return incompatible(strfmt("[lora] %s: %s: lora_A is %lld×%lld but the model's %.*s takes %lld inputs",
                                 path_.c_str(), name.c_str(), static_cast<long long>(p.rank),
                                 static_cast<long long>(p.in), static_cast<int>(leaf.size()), leaf.data(),
                                 static_cast<long long>(s->in)));
    if (p.out != s->out)
      return incompatible(strfmt("[lora] %s: %s: lora_B is %lld×%lld but the model's %.*s gives %lld outputs",
                                 path_.c_str(), name.c_str(), static_cast<long long>(p.out),
                                 static_cast<long long>(p.rank), static_cast<int>(leaf.size()), leaf.data(),
                                 static_cast<long long>(s->out)));
    if (order() != base.order && !same_order_across_formats(arch_family(base.architecture), p.module))
      return unsupported(strfmt("[lora] %s: %s: a %s adapter on a %s model: llama.cpp's converter reorders this "
                                "projection's rows for '%s', so the adapter does not fit; use the adapter in the "
                                "base's format (convert_lora_to_gguf.py for a GGUF base)",
                                path_.c_str(), name.c_str(), lora_format_name(format_),
                                base.order == WeightOrder::kGguf ? "GGUF" : "Hugging Face / MLX",
                                base.architecture.c_str()));
  }
  return Status::ok();
}

std::vector<LoraUse> canonical_lora_uses(std::vector<LoraUse> uses) {
  std::erase_if(uses, [](const LoraUse& u) { return !u.adapter || u.scale == 0.0f; });
  std::stable_sort(uses.begin(), uses.end(), [](const LoraUse& x, const LoraUse& y) {
    const int c = x.adapter->content_hash().compare(y.adapter->content_hash());
    return c != 0 ? c < 0 : x.scale < y.scale;
  });
  return uses;
}

Result<std::shared_ptr<const BoundLora>> bind_lora(std::shared_ptr<const LoraAdapter> lora,
                                                   std::span<const ProjectionInfo> projections) {
  if (!lora) return invalid_argument("[lora] bind: no adapter");
  // (layer, module) → projection id, from the model's own table.
  std::map<std::pair<int, LoraModule>, int> ids;
  for (size_t i = 0; i < projections.size(); ++i) {
    const ParsedName p = parse_layer_module(projections[i].name, false);
    if (p.module && p.layer >= 0) ids.emplace(std::make_pair(p.layer, *p.module), static_cast<int>(i));
  }
  auto bound = std::make_shared<BoundLora>();
  bound->adapter.deltas.assign(projections.size(), LowRankDelta{});
  for (const LoraProjection& lp : lora->projections()) {
    const std::string name = lora_projection_name(lp.layer, lp.module);
    auto it = ids.find({lp.layer, lp.module});
    if (it == ids.end())
      return invalid_argument(strfmt("[lora] %s: %s: the model has no such projection", lora->path().c_str(),
                                     name.c_str()));
    const ProjectionInfo& pi = projections[static_cast<size_t>(it->second)];
    if (pi.out != lp.out || pi.in != lp.in)
      return invalid_argument(strfmt("[lora] %s: %s: the adapter is %lldx%lld (out x in) but the model's %s is "
                                     "%lldx%lld",
                                     lora->path().c_str(), name.c_str(), static_cast<long long>(lp.out),
                                     static_cast<long long>(lp.in), pi.name.c_str(), static_cast<long long>(pi.out),
                                     static_cast<long long>(pi.in)));
    bound->adapter.deltas[static_cast<size_t>(it->second)] = LowRankDelta{lp.f, lp.scale};
  }
  bound->lora = std::move(lora);
  return std::shared_ptr<const BoundLora>(std::move(bound));
}

Result<std::vector<AdapterUse>> forward_adapter_uses(std::vector<LoraUse> uses,
                                                     std::span<const std::shared_ptr<const BoundLora>> bound) {
  std::vector<AdapterUse> out;
  for (const LoraUse& u : canonical_lora_uses(std::move(uses))) {
    const BoundLora* b = nullptr;
    for (const auto& c : bound)
      if (c && c->lora == u.adapter) b = c.get();
    if (!b) return internal_error(strfmt("[lora] %s: the adapter is not bound to this model", u.adapter->path().c_str()));
    out.push_back(AdapterUse{&b->adapter, u.scale});
  }
  return out;
}

Result<LoraSpec> parse_lora_spec(std::string_view arg, bool named) {
  LoraSpec spec;
  const std::string form = named ? "NAME=PATH[:SCALE]" : "PATH[:SCALE]";
  std::string_view rest = arg;
  if (named) {
    const size_t eq = arg.find('=');
    if (eq == std::string_view::npos || eq == 0)
      return invalid_argument(strfmt("--lora '%.*s': expected %s (a name for requests to pick the adapter by)",
                                     static_cast<int>(arg.size()), arg.data(), form.c_str()));
    spec.name = std::string(arg.substr(0, eq));
    for (char c : spec.name)
      if (std::isspace(static_cast<unsigned char>(c)) || std::iscntrl(static_cast<unsigned char>(c)))
        return invalid_argument(strfmt("--lora '%.*s': the name '%s' contains whitespace or control characters",
                                       static_cast<int>(arg.size()), arg.data(), spec.name.c_str()));
    rest = arg.substr(eq + 1);
  }
  if (const size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    const std::string num(rest.substr(colon + 1));
    char* end = nullptr;
    errno = 0;
    const float v = num.empty() ? 0.0f : std::strtof(num.c_str(), &end);
    if (!num.empty() && end == num.c_str() + num.size()) {  // a whole number: it is the scale
      if (!std::isfinite(v) || errno == ERANGE)
        return invalid_argument(strfmt("--lora '%.*s': scale '%s' is not a finite number",
                                       static_cast<int>(arg.size()), arg.data(), num.c_str()));
      spec.scale = v;
      rest = rest.substr(0, colon);
    }
  }
  if (rest.empty())
    return invalid_argument(strfmt("--lora '%.*s': no adapter path (expected %s)", static_cast<int>(arg.size()),
                                   arg.data(), form.c_str()));
  spec.path = std::string(rest);
  return spec;
}

}  // namespace larder::models
