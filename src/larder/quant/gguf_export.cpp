// gguf_export.cpp — see gguf_export.h.
#include "larder/quant/gguf_export.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <nlohmann/json.hpp>

#include "larder/formats/gguf.h"
#include "larder/formats/gguf_writer.h"
#include "larder/formats/model_files.h"
#include "larder/kernels/dispatch.h"
#include "larder/models/llama.h"
#include "larder/models/registry.h"
#include "larder/models/tensor_names.h"
#include "larder/quant/gguf_quants.h"
#include "larder/quant/allocator.h"
#include "larder/quant/checkpoint_io.h"
#include "larder/quant/imatrix.h"
#include "larder/tokenizer/tokenizer.h"
#include "larder/quant/parallel_rows.h"

namespace larder::quant {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

namespace {

// llama_ftype as llama.cpp numbers it (general.file_type).
int ftype_of(const std::string& type) {
  static const std::map<std::string, int> m = {
      {"F32", 0},     {"F16", 1},     {"Q4_0", 2},    {"Q4_1", 3},     {"Q8_0", 7},    {"Q5_0", 8},
      {"Q5_1", 9},    {"Q2_K", 10},   {"Q3_K", 11},   {"Q3_K_M", 12},  {"Q4_K", 14},   {"Q4_K_M", 15},
      {"Q5_K", 16},   {"Q5_K_M", 17}, {"Q6_K", 18},   {"IQ4_NL", 25},  {"IQ4_XS", 30}, {"BF16", 32}};
  auto it = m.find(type);
  return it == m.end() ? 0 : it->second;
}

// Block index of "blk.N.…", or -1.
int layer_of(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  return std::atoi(name.c_str() + 4);
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third between.
bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

struct Entry {
  std::string name;                   // GGUF name
  const formats::TensorInfo* src;     // source tensor
  std::vector<int64_t> shape;         // outermost first
  DType out = DType::kF32;
  int permute_heads = 0;              // llama Q/K: HF rotate-half rows → interleaved, per head
};

// Source tensor rows [r0, r1) as f32.
void rows_f32(const formats::TensorInfo& t, int64_t r0, int64_t r1, int64_t cols, float* out) {
  if (t.dtype == DType::kF32 || t.dtype == DType::kF16 || t.dtype == DType::kBF16) {
    const size_t esz = t.dtype == DType::kF32 ? 4 : 2;
    const uint8_t* p = t.data + static_cast<size_t>(r0 * cols) * esz;
    const size_t n = static_cast<size_t>((r1 - r0) * cols);
    for (size_t i = 0; i < n; ++i) {
      if (t.dtype == DType::kF32) {
        std::memcpy(out + i, p + 4 * i, 4);
      } else {
        uint16_t v;
        std::memcpy(&v, p + 2 * i, 2);
        out[i] = t.dtype == DType::kF16 ? f16_to_f32(v) : bf16_to_f32(v);
      }
    }
    return;
  }
  kernels::WeightView w;
  w.dtype = t.dtype;
  w.rows = t.numel() / cols;
  w.cols = cols;
  w.data = t.data;
  const auto deq = kernels::ref_table().dequant_row[static_cast<size_t>(t.dtype)];
  for (int64_t r = r0; r < r1; ++r) deq(w, r, out + (r - r0) * cols);
}

// ------------------------------------------------------------------ HF → GGUF metadata

std::string bpe_pre_name(const ordered_json& tj) {
  const ordered_json& pre = tj.contains("pre_tokenizer") ? tj["pre_tokenizer"] : ordered_json();
  const std::string dump = pre.dump();
  if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers")) {
    const auto& ps = pre["pretokenizers"];
    if (ps.size() == 2 && ps[0].value("type", "") == "Digits" && ps[0].value("individual_digits", false) &&
        ps[1].value("type", "") == "ByteLevel")
      return "smollm";
    if (!ps.empty() && ps[0].value("type", "") == "Split") {
      const std::string re = ps[0].contains("pattern") ? ps[0]["pattern"].value("Regex", "") : "";
      if (contains(re, "\\p{N}{1,3}") && contains(re, "(?i:'s|'t|'re|'ve|'m|'ll|'d)")) return "llama-bpe";
      if (contains(re, "\\p{N}|") && contains(re, "(?i:'s|'t|'re|'ve|'m|'ll|'d)")) return "qwen2";
    }
  }
  return "";
}

Status add_tokenizer(const formats::ModelFiles& f, formats::GgufWriter& w) {
  if (f.tokenizer_json_path.empty()) return invalid_argument("[gguf] " + f.path + ": no tokenizer.json to convert");
  LARDER_ASSIGN_OR_RETURN(ordered_json tj, formats::read_json_file(f.tokenizer_json_path));
  const ordered_json& model = tj["model"];
  if (!model.is_object() || model.value("type", "") != "BPE" || model.value("byte_fallback", false))
    return unsupported("[gguf] " + f.tokenizer_json_path +
                       ": only byte-level BPE vocabularies (Llama 3, Qwen, SmolLM2) are converted to GGUF");
  const std::string pre = bpe_pre_name(tj);
  if (pre.empty())
    return unsupported("[gguf] " + f.tokenizer_json_path + ": pre-tokenizer " + tj["pre_tokenizer"].dump().substr(0, 200) +
                       " is not one llama.cpp names (smollm, llama-bpe, qwen2)");
  std::vector<std::string> tokens;
  std::vector<int64_t> types;
  for (const auto& [tok, id_j] : model["vocab"].items()) {
    const int64_t id = id_j.get<int64_t>();
    if (id < 0 || id > 10'000'000) return invalid_argument("[gguf] tokenizer.json: bad token id");
    if (static_cast<size_t>(id) >= tokens.size()) tokens.resize(static_cast<size_t>(id) + 1), types.resize(tokens.size(), 0);
    tokens[static_cast<size_t>(id)] = tok;
    types[static_cast<size_t>(id)] = 1;  // normal
  }
  if (tj.contains("added_tokens"))
    for (const auto& a : tj["added_tokens"]) {
      const int64_t id = a.value("id", int64_t{-1});
      if (id < 0 || id > 10'000'000) continue;
      if (static_cast<size_t>(id) >= tokens.size()) tokens.resize(static_cast<size_t>(id) + 1), types.resize(tokens.size(), 0);
      tokens[static_cast<size_t>(id)] = a.value("content", "");
      types[static_cast<size_t>(id)] = a.value("special", false) ? 3 : 4;  // control : user-defined
    }
  // The model's vocab_size may exceed the tokenizer's (padding rows): llama.cpp pads with
  // [PAD<i>] tokens of type unused... convert_hf_to_gguf names them "[PAD<i>]" as user-defined.
  const int64_t vocab = f.config.value("vocab_size", static_cast<int64_t>(tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i)
    if (types[i] == 0) tokens[i] = "[PAD" + std::to_string(i) + "]", types[i] = 4;
  while (static_cast<int64_t>(tokens.size()) < vocab)
    tokens.push_back("[PAD" + std::to_string(tokens.size()) + "]"), types.push_back(4);
  std::vector<std::string> merges;
  for (const auto& m : model["merges"]) {
    if (m.is_string())
      merges.push_back(m.get<std::string>());
    else if (m.is_array() && m.size() == 2)
      merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  w.set_strings("tokenizer.ggml.tokens", tokens);
  w.set_i32s("tokenizer.ggml.token_type", types);
  w.set_strings("tokenizer.ggml.merges", merges);
  // Special ids: tokenizer_config's token strings, else config.json's ids.
  auto id_of = [&](const char* key) -> int64_t {
    const ordered_json& tc = f.tokenizer_config;
    if (tc.is_object() && tc.contains(key)) {
      std::string s;
      if (tc[key].is_string()) s = tc[key].get<std::string>();
      else if (tc[key].is_object()) s = tc[key].value("content", "");
      for (size_t i = 0; i < tokens.size(); ++i)
        if (!s.empty() && tokens[i] == s) return static_cast<int64_t>(i);
    }
    return -1;
  };
  struct Special {
    const char* tc_key;
    const char* cfg_key;
    const char* gguf_key;
  };
  for (const Special& s : {Special{"bos_token", "bos_token_id", "tokenizer.ggml.bos_token_id"},
                           Special{"eos_token", "eos_token_id", "tokenizer.ggml.eos_token_id"},
                           Special{"unk_token", "", "tokenizer.ggml.unknown_token_id"},
                           Special{"pad_token", "pad_token_id", "tokenizer.ggml.padding_token_id"}}) {
    int64_t id = id_of(s.tc_key);
    if (id < 0 && *s.cfg_key && f.config.contains(s.cfg_key)) {
      const auto& v = f.config[s.cfg_key];
      if (v.is_number_integer()) id = v.get<int64_t>();
      else if (v.is_array() && !v.empty() && v[0].is_number_integer()) id = v[0].get<int64_t>();
    }
    if (id >= 0) w.set_u32(s.gguf_key, static_cast<uint32_t>(id));
  }
  const ordered_json& tc = f.tokenizer_config;
  w.set_bool("tokenizer.ggml.add_bos_token", tc.is_object() && tc.value("add_bos_token", false));
  if (tc.is_object() && tc.contains("add_eos_token")) w.set_bool("tokenizer.ggml.add_eos_token", tc.value("add_eos_token", false));
  if (f.has_chat_template()) w.set_string("tokenizer.chat_template", f.chat_template);
  return Status::ok();
}

Result<std::string> hf_metadata(const formats::ModelFiles& f, formats::GgufWriter& w, bool* tied, int* n_layer) {
  const ordered_json& c = f.config;
  const std::string mt = c.value("model_type", "");
  if (mt != "llama" && mt != "qwen2" && mt != "qwen3")
    return unsupported("[gguf] " + f.path + ": model_type '" + mt +
                       "' is not converted from Hugging Face files to GGUF (llama, qwen2, qwen3 are; a GGUF of any "
                       "architecture larder runs can be requantized)");
  if (c.contains("rope_scaling") && !c["rope_scaling"].is_null())
    return unsupported("[gguf] " + f.path + ": rope_scaling " + c["rope_scaling"].dump() +
                       " is not converted to GGUF yet (llama.cpp needs a rope_freqs tensor for it)");
  const std::string& a = mt;
  auto need = [&](const char* k) -> Result<int64_t> {
    if (!c.contains(k) || !c[k].is_number_integer()) return invalid_argument("[gguf] config.json: missing integer " + std::string(k));
    return c[k].get<int64_t>();
  };
  LARDER_ASSIGN_OR_RETURN(const int64_t layers, need("num_hidden_layers"));
  LARDER_ASSIGN_OR_RETURN(const int64_t hidden, need("hidden_size"));
  LARDER_ASSIGN_OR_RETURN(const int64_t ffn, need("intermediate_size"));
  LARDER_ASSIGN_OR_RETURN(const int64_t heads, need("num_attention_heads"));
  const int64_t kv_heads = c.value("num_key_value_heads", heads);
  const int64_t head_dim = c.contains("head_dim") && c["head_dim"].is_number_integer() ? c["head_dim"].get<int64_t>() : hidden / heads;
  *n_layer = static_cast<int>(layers);
  *tied = c.value("tie_word_embeddings", false) || f.hf_tensors->find("lm_head.weight") == nullptr;
  w.set_string("general.architecture", a);
  w.set_string("general.type", "model");
  w.set_string("general.name", fs::path(f.path).filename().string());
  w.set_u32(a + ".block_count", static_cast<uint32_t>(layers));
  w.set_u32(a + ".context_length", static_cast<uint32_t>(c.value("max_position_embeddings", int64_t{4096})));
  w.set_u32(a + ".embedding_length", static_cast<uint32_t>(hidden));
  w.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(ffn));
  w.set_u32(a + ".attention.head_count", static_cast<uint32_t>(heads));
  w.set_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(kv_heads));
  w.set_f32(a + ".rope.freq_base", static_cast<float>(c.value("rope_theta", 10000.0)));
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(c.value("rms_norm_eps", 1e-6)));
  if (head_dim * heads != hidden || mt == "qwen3") {
    w.set_u32(a + ".attention.key_length", static_cast<uint32_t>(head_dim));
    w.set_u32(a + ".attention.value_length", static_cast<uint32_t>(head_dim));
  }
  if (mt == "llama") {
    w.set_u32(a + ".vocab_size", static_cast<uint32_t>(c.value("vocab_size", int64_t{0})));
    w.set_u32(a + ".rope.dimension_count", static_cast<uint32_t>(head_dim));
  }
  LARDER_RETURN_IF_ERROR(add_tokenizer(f, w));
  return a;
}


// Everything the KL allocation reads (export_gguf's state at that point).
struct AllocInput {
  const formats::ModelFiles& f;
  const std::vector<Entry>& entries;
  const std::map<std::string, std::vector<float>>& importance;
  const CalibrationSet& calib;
  const GgufExportOptions& opts;
  const formats::GgufWriter& w;  // metadata set, no tensors yet
};

// deq(quant_t(rows of src)) as f32, with the tensor's importance weights when there are any.
Status fake_quant_gguf(DType t, const formats::TensorInfo& src, const float* imatrix, float* out) {
  const int64_t rows = src.dim(0), cols = src.dim(1);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  parallel_rows(rows, 0, 64, [&](int, int64_t r0, int64_t r1) { rows_f32(src, r0, r1, cols, x.data() + r0 * cols); });
  const uint64_t row_bytes = dtype_bytes(t, static_cast<uint64_t>(cols));
  std::vector<uint8_t> q(static_cast<size_t>(rows) * row_bytes);
  std::vector<Status> sts(static_cast<size_t>(resolve_threads(0)));
  parallel_rows(rows, 0, 16, [&](int part, int64_t r0, int64_t r1) {
    sts[static_cast<size_t>(part)] = quantize_gguf_rows(t, x.data() + r0 * cols, r1 - r0, cols, imatrix, q.data() + r0 * row_bytes);
  });
  for (const Status& s : sts) LARDER_RETURN_IF_ERROR(s);
  kernels::WeightView v;
  v.dtype = t;
  v.rows = rows;
  v.cols = cols;
  v.data = q.data();
  parallel_rows(rows, 0, 64, [&](int, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) kernels::dequant_row(v, r, out + r * cols);
  });
  return Status::ok();
}

// The KL allocation of the block weights' types (GgufExportOptions::target_*): sensitivities of
// every block weight at every candidate width, measured with the GGUF quantizer and importance
// matrix it would be written with; widths priced at their type's stored bits; the budget is the
// target minus the fixed tensors (outside the blocks, `rule` types) and the header; the largest
// allocation that fits.
template <typename Rule>
Result<std::map<std::string, DType>> allocate_gguf_types(const AllocInput& in, const Rule& rule, GgufExportReport* rep) {
  const GgufExportOptions& opts = in.opts;
  std::vector<ModuleSensitivity> table;
  std::map<std::string, const Entry*> by_module;  // HF module → entry
  uint64_t fixed_bytes = 0, total_params = 0, block_params = 0;
  const uint64_t align = 32;
  formats::GgufWriter probe = in.w;  // the header's size does not depend on the tensors' types
  for (const Entry& e : in.entries) {
    const int64_t cols = e.shape.back();
    const uint64_t n = static_cast<uint64_t>(e.src->numel());
    total_params += n;
    LARDER_RETURN_IF_ERROR(probe.add_tensor(e.name, DType::kF32, e.shape));
    const bool block = gguf_tensor_quantizable(e.name, e.shape.size()) && layer_of(e.name) >= 0 && e.shape.size() == 2;
    if (!block) {
      const DType t = gguf_tensor_quantizable(e.name, e.shape.size()) ? gguf_fallback_type(rule(e), cols) : DType::kF32;
      fixed_bytes += dtype_bytes(t, n) + align;
      continue;
    }
    const std::string& hf = e.src->name;
    ModuleSensitivity m{hf.substr(0, hf.size() - 7), {}, n, {}};  // strip ".weight"
    for (int b : opts.candidate_bits)
      m.cost[b] = 8.0 * static_cast<double>(dtype_bytes(gguf_width_type(b, cols), static_cast<uint64_t>(cols))) / static_cast<double>(cols);
    block_params += n;
    fixed_bytes += align;  // the padding after the tensor, at most
    by_module[m.name] = &e;
    table.push_back(std::move(m));
  }
  if (table.empty()) return invalid_argument("[gguf] no block weight to allocate");
  const uint64_t header = probe.header_bytes();
  const double budget_bits = opts.target_bytes > 0
                                 ? 8.0 * (static_cast<double>(opts.target_bytes) - static_cast<double>(header + fixed_bytes))
                                 : opts.target_bpw * static_cast<double>(total_params) - 8.0 * static_cast<double>(fixed_bytes);
  const double block_target = budget_bits / static_cast<double>(block_params);
  double lowest = 0;
  for (const auto& m : table) lowest += m.cost.begin()->second * static_cast<double>(m.params);
  lowest /= static_cast<double>(block_params);
  if (!(block_target >= lowest))
    return invalid_argument(strfmt("[gguf] the target leaves %.3f bits per block weight after the tensors outside the blocks "
                                   "and the header; the cheapest candidate width needs %.3f (raise the target or add a lower "
                                   "--candidate-bits)", block_target, lowest));

  // Sensitivities through the quantizer the file is written with.
  const models::TensorNames& names = models::llama_tensor_names();
  SensitivityOptions so;
  so.candidates = opts.candidate_bits;
  so.method = opts.sensitivity_method;
  so.progress = [&](size_t i, size_t n, const std::string& what) {
    if (opts.progress) opts.progress(i, n, "sensitivity: " + what);
  };
  so.fake_quant = [&](const std::string&, const formats::TensorInfo& t, int b, float* out) -> Status {
    auto it = in.importance.find(names.gguf(t.name));
    const float* qw = it == in.importance.end() ? nullptr : it->second.data();
    return fake_quant_gguf(gguf_width_type(b, t.dim(1)), t, qw, out);
  };
  // Widths that write the same type (2–4 → IQ4_NL on rows 256 does not divide) are measured once.
  so.quantizer_id = [](const formats::TensorInfo& t, int b) { return static_cast<int64_t>(gguf_width_type(b, t.dim(1))); };
  SensitivityResult sens;
  if (!opts.reuse_sensitivity.empty()) {
    LARDER_ASSIGN_OR_RETURN(ordered_json prev, formats::read_json_file(opts.reuse_sensitivity));
    auto t = reuse_sensitivity_report(prev, table, in.calib, so);
    if (!t) return Status(t.status().code(), t.status().message() + " (" + opts.reuse_sensitivity + ")");
    sens.table = std::move(t).value();
    prev.erase("allocation");
    sens.report = std::move(prev);
  } else {
    LARDER_ASSIGN_OR_RETURN(sens, measure_kl_sensitivity(in.f, table, in.calib, so));
  }
  rep->sensitivity_forwards = sens.forwards;
  rep->sensitivity_seconds = sens.seconds;
  for (size_t i = 0; i < table.size(); ++i) table[i].kl = sens.table[i].kl;

  // The greedy loop stops at the first allocation reaching its target, which may overshoot by
  // one upgrade: lower the target until the allocation fits the budget.
  AllocatorOptions ao;
  ao.candidates = opts.candidate_bits;
  ao.protect_first_last = opts.protect_blocks > 0;
  ao.n_protect = std::max(1, opts.protect_blocks);
  const double reach = [&] {
    double top = 0;
    for (const auto& m : table) top += m.cost.rbegin()->second * static_cast<double>(m.params);
    return top / static_cast<double>(block_params);
  }();
  double t = std::min(block_target, reach);
  std::optional<AllocationPlan> best;
  for (int iter = 0; iter < 200 && t >= lowest - 1e-9; ++iter) {
    ao.target_bpw = t;
    auto plan = allocate_bits(table, ao);
    if (plan.is_ok() && plan.value().achieved_bpw <= block_target + 1e-12) {
      best = std::move(plan).value();
      break;
    }
    const double over = plan.is_ok() ? plan.value().achieved_bpw - block_target : 0.0;
    t -= std::max(over, 0.002);
  }
  if (!best)
    return invalid_argument(strfmt("[gguf] no allocation fits %.3f bits per block weight (the allocator's per-block floor "
                                   "needs more; raise the target)", block_target));
  rep->block_target_bpw = block_target;
  rep->block_bpw = best->achieved_bpw;
  std::map<std::string, DType> out;
  ordered_json plan_json = ordered_json::object();
  for (const ModuleBits& mb : best->modules) {
    const Entry& e = *by_module.at(mb.name);
    const DType ty = gguf_width_type(mb.bits, e.shape.back());
    out[e.name] = ty;
    plan_json[e.name] = dtype_name(ty);
  }
  if (!opts.sensitivity_out.empty()) {
    ordered_json j = sens.report;
    j["allocation"] = {{"target_bpw", opts.target_bpw}, {"target_bytes", opts.target_bytes}, {"block_target_bpw", block_target},
                       {"block_bpw", best->achieved_bpw}, {"types", plan_json}};
    LARDER_RETURN_IF_ERROR(write_text_file(opts.sensitivity_out, j.dump(2) + "\n"));
  }
  return out;
}
}  // namespace

DType gguf_width_type(int bits, int64_t cols) {
  if (cols % 256 == 0) {
    switch (bits) {
      case 2: return DType::kQ2_K;
      case 3: return DType::kQ3_K;
      case 4: return DType::kQ4_K;
      case 5: return DType::kQ5_K;
      case 6: return DType::kQ6_K;
      default: return DType::kQ8_0;
    }
  }
  if (cols % 32 == 0) return bits <= 4 ? DType::kIQ4_NL : bits == 5 ? DType::kQ5_0 : DType::kQ8_0;
  return DType::kF16;
}

bool is_gguf_recipe(const std::string& n) { return n == "Q3_K_M" || n == "Q4_K_M" || n == "Q5_K_M"; }

bool gguf_tensor_quantizable(const std::string& name, size_t rank) {
  if (rank < 2) return false;
  if (name.size() < 6 || name.compare(name.size() - 6, 6, "weight") != 0) return false;
  return !contains(name, "_norm.weight") && !contains(name, "ffn_gate_inp.weight") && !contains(name, "altup") &&
         !contains(name, "laurel") && !contains(name, "per_layer_model_proj") && !contains(name, "ssm_conv1d");
}

DType gguf_recipe_type(const std::string& recipe, const std::string& name, int i_layer, int n_layer, bool tied) {
  const bool output = name == "output.weight" || (tied && name == "token_embd.weight");
  DType base = recipe == "Q3_K_M" ? DType::kQ3_K : recipe == "Q4_K_M" ? DType::kQ4_K : DType::kQ5_K;
  if (output) return DType::kQ6_K;  // (Q8_0 when the row is not a multiple of 256: the caller's fallback rule)
  if (name == "token_embd.weight") return base;
  if (contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight")) {
    if (contains(name, "attn_qkv.weight")) return recipe == "Q3_K_M" ? DType::kQ4_K : recipe == "Q4_K_M" ? DType::kQ5_K : DType::kQ6_K;
    if (recipe == "Q3_K_M") return i_layer < 2 ? DType::kQ5_K : DType::kQ4_K;
    return more_bits(i_layer, n_layer) ? DType::kQ6_K : base;
  }
  if (contains(name, "ffn_down")) {
    if (recipe == "Q3_K_M") return i_layer < n_layer / 16 ? DType::kQ5_K : DType::kQ4_K;
    return more_bits(i_layer, n_layer) ? DType::kQ6_K : base;
  }
  if (contains(name, "attn_output.weight") && recipe == "Q3_K_M") return DType::kQ4_K;
  return base;
}

DType gguf_fallback_type(DType t, int64_t cols) {
  const int64_t be = dtype_info(t).block_elems;
  if (cols % be == 0) return t;
  DType f;
  switch (t) {
    case DType::kIQ4_XS: f = DType::kIQ4_NL; break;
    case DType::kQ2_K: case DType::kQ3_K: f = DType::kQ4_0; break;
    case DType::kQ4_K: f = DType::kQ5_0; break;
    case DType::kQ5_K: f = DType::kQ5_1; break;
    case DType::kQ6_K: f = DType::kQ8_0; break;
    default: f = t; break;
  }
  return cols % dtype_info(f).block_elems == 0 ? f : DType::kF16;
}

Result<GgufExportReport> export_gguf(const std::string& src, const std::string& dst, const GgufExportOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool recipe = is_gguf_recipe(opts.type);
  const DType uniform = recipe ? DType::kUnknown : gguf_type_from_name(opts.type);
  if (!recipe && uniform == DType::kUnknown)
    return invalid_argument("[gguf] --type '" + opts.type +
                            "': expected F32, F16, BF16, Q8_0, Q6_K, Q5_K, Q4_K, Q3_K, Q2_K, IQ4_XS, IQ4_NL, Q5_1, Q5_0, "
                            "Q4_1, Q4_0 or a recipe Q5_K_M, Q4_K_M, Q3_K_M");
  LARDER_ASSIGN_OR_RETURN(formats::ModelFiles f, formats::open_model_files(src));
  formats::GgufWriter w;
  std::vector<Entry> entries;
  bool tied = false;
  int n_layer = 0;
  std::string arch;
  if (f.gguf) {
    for (const auto& [k, v] : f.gguf->metadata()) w.set(k, v);
    arch = f.gguf->architecture();
    if (models::find_architecture(arch) == nullptr)
      return unsupported("[gguf] " + f.path + ": architecture '" + arch +
                         "' is not one larder runs, so its tensors' roles are unknown here; not requantized");
    n_layer = static_cast<int>(f.gguf->get_int(arch + ".block_count").value_or(0));
    tied = f.gguf->tensors().find("output.weight") == nullptr;
    for (const formats::TensorInfo& t : f.gguf->tensors().tensors()) entries.push_back({t.name, &t, t.shape});
  } else {
    LARDER_ASSIGN_OR_RETURN(arch, hf_metadata(f, w, &tied, &n_layer));
    const models::TensorNames& names = models::llama_tensor_names();
    const int64_t heads = f.config.value("num_attention_heads", int64_t{0});
    const int64_t kv_heads = f.config.value("num_key_value_heads", heads);
    std::vector<std::string> sorted;
    for (const formats::TensorInfo& t : f.hf_tensors->tensors()) sorted.push_back(t.name);
    for (const std::string& hf : sorted) {
      const formats::TensorInfo* t = f.hf_tensors->find(hf);
      if (hf.find("rotary_emb.inv_freq") != std::string::npos) continue;
      if (tied && hf == "lm_head.weight") continue;
      const std::string g = names.gguf(hf);
      if (g.empty()) return unsupported("[gguf] " + f.path + ": tensor '" + hf + "' has no llama.cpp name for " + arch);
      if (t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16)
        return unsupported("[gguf] " + hf + ": source dtype " + dtype_name(t->dtype) + " (expected f32/f16/bf16)");
      Entry e{g, t, t->shape};
      if (arch == "llama" && (contains(g, "attn_q.") || contains(g, "attn_k.")))
        e.permute_heads = static_cast<int>(contains(g, "attn_q.") ? heads : kv_heads);
      entries.push_back(std::move(e));
    }
    // llama.cpp's order: token_embd, then blocks in order, then output_norm/output.
    auto key = [](const std::string& n) {
      const int l = layer_of(n);
      const int group = n.rfind("token_embd", 0) == 0 ? 0 : l >= 0 ? 1 : 2;
      return std::make_tuple(group, l, n);
    };
    std::stable_sort(entries.begin(), entries.end(), [&](const Entry& a, const Entry& b) { return key(a.name) < key(b.name); });
  }
  const bool allocating = opts.target_bpw > 0 || opts.target_bytes > 0;
  if (allocating && !f.hf_tensors)
    return unsupported("[gguf] " + f.path + ": --target-bpw / --target-size need a Hugging Face source (the sensitivities "
                       "are measured against the unquantized model); a GGUF source takes a fixed --type");
  if (opts.target_bpw > 0 && opts.target_bytes > 0) return invalid_argument("[gguf] give --target-bpw or --target-size, not both");
  std::map<std::string, std::vector<float>> importance;
  double imatrix_seconds = 0;
  if (!opts.imatrix_file.empty() && opts.calibrate)
    return invalid_argument("[gguf] give an importance matrix file or --calibrate, not both");
  // The calibration set: the importance matrix's (--calibrate) and the allocator's sensitivities.
  std::optional<CalibrationSet> calib;
  if (opts.calibrate || allocating) {
    auto tok = f.gguf ? tokenizer::Tokenizer::from_gguf(*f.gguf) : tokenizer::Tokenizer::from_hf_dir(f.path);
    if (!tok.is_ok()) return tok.status();
    LARDER_ASSIGN_OR_RETURN(CalibrationSet c, load_calibration(*tok.value(), opts.calibration));
    calib = std::move(c);
  }
  if (!opts.imatrix_file.empty()) {
    LARDER_ASSIGN_OR_RETURN(Imatrix im, read_imatrix(opts.imatrix_file));
    importance = im.importances();
    if (!im.datasets.empty()) w.set_string("quantize.imatrix.dataset", im.datasets[0]);
    w.set_string("quantize.imatrix.file", opts.imatrix_file);
    w.set_i32("quantize.imatrix.entries_count", static_cast<int32_t>(importance.size()));
    w.set_i32("quantize.imatrix.chunks_count", static_cast<int32_t>(im.chunk_count));
  } else if (opts.calibrate || allocating) {
    const auto ti = std::chrono::steady_clock::now();
    LARDER_ASSIGN_OR_RETURN(Imatrix im, compute_imatrix(f, *calib, opts.progress));
    if (!opts.imatrix_out.empty()) LARDER_RETURN_IF_ERROR(write_imatrix(opts.imatrix_out, im));
    importance = im.importances();
    w.set_string("quantize.imatrix.file", opts.imatrix_out.empty() ? std::string("(computed by larder)") : opts.imatrix_out);
    w.set_string("quantize.imatrix.dataset", calib->source);
    w.set_i32("quantize.imatrix.entries_count", static_cast<int32_t>(importance.size()));
    w.set_i32("quantize.imatrix.chunks_count", static_cast<int32_t>(im.chunk_count));
    imatrix_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - ti).count();
  }
  w.set_u32("general.quantization_version", 2);
  w.set_u32("general.file_type", static_cast<uint32_t>(ftype_of(opts.type)));

  GgufExportReport rep;
  rep.architecture = arch;
  rep.imatrix_seconds = imatrix_seconds;
  // The type `type` gives a quantizable tensor (recipe or uniform), before overrides.
  auto rule_type = [&](const Entry& e) {
    const int64_t cols = e.shape.back();
    DType t = recipe ? gguf_recipe_type(opts.type, e.name, layer_of(e.name), n_layer, tied) : uniform;
    // llama.cpp: an output tensor whose rows do not fit the K-quant block goes to Q8_0.
    if (recipe && t == DType::kQ6_K && cols % 256 != 0 && (e.name == "output.weight" || (tied && e.name == "token_embd.weight")))
      t = DType::kQ8_0;
    return t;
  };
  std::map<std::string, DType> allocated;
  if (allocating) {
    AllocInput in{f, entries, importance, *calib, opts, w};
    LARDER_ASSIGN_OR_RETURN(allocated, allocate_gguf_types(in, rule_type, &rep));
  }
  for (Entry& e : entries) {
    const int64_t cols = e.shape.back();
    if (!gguf_tensor_quantizable(e.name, e.shape.size())) {
      e.out = DType::kF32;
    } else {
      DType t = rule_type(e);
      if (auto it = allocated.find(e.name); it != allocated.end()) t = it->second;
      if (auto it = opts.overrides.find(e.name); it != opts.overrides.end()) t = it->second;
      const DType fb = gguf_fallback_type(t, cols);
      if (fb != t) ++rep.n_fallback;
      e.out = fb;
      ++rep.n_quantized;
      rep.quantized_params += static_cast<uint64_t>(e.src->numel());
    }
    rep.total_params += static_cast<uint64_t>(e.src->numel());
    rep.type_counts[dtype_name(e.out)]++;
    LARDER_RETURN_IF_ERROR(w.add_tensor(e.name, e.out, e.shape));
  }
  rep.n_tensors = entries.size();

  std::vector<float> f32;
  std::vector<uint8_t> buf;
  auto produce = [&](size_t i) -> Result<const void*> {
    const Entry& e = entries[i];
    if (opts.progress) opts.progress(i, entries.size(), e.name);
    const int64_t cols = e.shape.back();
    const int64_t rows = e.src->numel() / cols;
    // Already in the target type: copied as stored, as llama-quantize does (requantizing a
    // quantized tensor to its own type would only add rounding).
    if (e.src->dtype == e.out && e.permute_heads == 0) return static_cast<const void*>(e.src->data);
    f32.resize(static_cast<size_t>(rows * cols));
    parallel_rows(rows, 0, 64, [&](int, int64_t r0, int64_t r1) { rows_f32(*e.src, r0, r1, cols, f32.data() + r0 * cols); });
    if (e.permute_heads > 0) {
      const int64_t hd = rows / e.permute_heads;
      std::vector<float> tmp(f32);
      for (int64_t hh = 0; hh < e.permute_heads; ++hh)
        for (int64_t j = 0; j < hd / 2; ++j)
          for (int64_t s = 0; s < 2; ++s)
            std::memcpy(&f32[static_cast<size_t>((hh * hd + 2 * j + s) * cols)],
                        &tmp[static_cast<size_t>((hh * hd + s * (hd / 2) + j) * cols)], static_cast<size_t>(cols) * 4);
    }
    const float* qw = nullptr;
    if (!importance.empty() && e.out != DType::kF32 && e.out != DType::kF16 && e.out != DType::kBF16) {
      auto it = importance.find(e.name);
      if (it != importance.end()) {
        if (static_cast<int64_t>(it->second.size()) != cols)
          return invalid_argument("[gguf] importance matrix for " + e.name + " has " + std::to_string(it->second.size()) +
                                  " values for " + std::to_string(cols) + " columns");
        qw = it->second.data();
        ++rep.imatrix_tensors;
      }
    }
    buf.resize(w.tensor_bytes(i));
    const uint64_t row_bytes = dtype_bytes(e.out, static_cast<uint64_t>(cols));
    std::vector<Status> sts(static_cast<size_t>(resolve_threads(0)));
    parallel_rows(rows, 0, 16, [&](int part, int64_t r0, int64_t r1) {
      sts[static_cast<size_t>(part)] =
          quantize_gguf_rows(e.out, f32.data() + r0 * cols, r1 - r0, cols, qw, buf.data() + static_cast<uint64_t>(r0) * row_bytes);
    });
    for (const Status& s : sts) LARDER_RETURN_IF_ERROR(s);
    return static_cast<const void*>(buf.data());
  };
  const std::string tmp = dst + ".partial";
  auto written = w.write(tmp, produce);
  if (!written.is_ok()) {
    std::error_code ec;
    fs::remove(tmp, ec);
    return written.status();
  }
  std::error_code ec;
  fs::rename(tmp, dst, ec);
  if (ec) return io_error("[gguf] renaming " + tmp + " to " + dst + ": " + ec.message());
  rep.out_bytes = written.value();
  rep.bpw = rep.total_params ? 8.0 * static_cast<double>(rep.out_bytes) / static_cast<double>(rep.total_params) : 0;
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace larder::quant
