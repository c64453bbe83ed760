// convert.cpp — see convert.h.
#include "larder/quant/convert.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "larder/formats/model_files.h"
#include "larder/formats/safetensors.h"
#include "larder/quant/affine.h"
#include "larder/quant/allocator.h"
#include "larder/quant/checkpoint_io.h"
#include "larder/quant/microscaling.h"
#include "larder/kernels/microscaling.h"
#include "larder/quant/parallel_rows.h"
#include "larder/tokenizer/tokenizer.h"

namespace larder::quant {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

bool keep_matches(const std::vector<std::string>& keep, const std::string& module) {
  for (const std::string& k : keep) {
    if (k.empty()) continue;
    if (module == k) return true;
    if (module.size() > k.size() && module.compare(module.size() - k.size(), k.size(), k) == 0 &&
        module[module.size() - k.size() - 1] == '.')
      return true;
    if (k.find_first_of("*?[") != std::string::npos && ::fnmatch(k.c_str(), module.c_str(), 0) == 0) return true;
  }
  return false;
}

namespace {

bool is_float(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

const PlanEntry* plan_entry(const std::vector<PlanEntry>& plan, const std::string& module) {
  for (const PlanEntry& e : plan)
    if (keep_matches({e.pattern}, module)) return &e;
  return nullptr;
}

// One output tensor: either a source tensor copied verbatim, or one part of a quantized module.
struct OutTensor {
  std::string name;
  DType dtype = DType::kUnknown;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  const formats::TensorInfo* src = nullptr;  // pass-through, or the module's full-precision weight
  int part = -1;                             // -1 pass-through; 0 weight, 1 scales, 2 biases
  int bits = 0;
  std::string module;
  models::AffineParams q;  // the module's quantization (part >= 0)
};

struct QuantCache {
  std::string module;
  std::vector<uint32_t> packed;
  std::vector<uint8_t> scales, biases;
};

DType mx_format(models::QuantMode m) {
  return m == models::QuantMode::kMxfp4 ? DType::kMlxMXFP4 : m == models::QuantMode::kNvfp4 ? DType::kMlxNVFP4 : DType::kMlxMXFP8;
}

Status quantize_module(const OutTensor& t, int threads, QuantCache* c) {
  const formats::TensorInfo& w = *t.src;
  const int64_t rows = w.dim(0), cols = w.dim(1);
  const int group = t.q.group_size;
  const size_t esz = w.dtype == DType::kF32 ? 4 : 2;
  c->module = t.module;
  if (t.q.mode != models::QuantMode::kAffine) {
    // Codes in the U32 words' bytes (mlx packs e2m1 codes little-endian, as these bytes are), U8 scales.
    const DType fmt = mx_format(t.q.mode);
    const int64_t code_bytes = cols * t.q.bits / 8;
    c->packed.assign(static_cast<size_t>(rows * code_bytes / 4), 0u);
    c->scales.assign(static_cast<size_t>(rows * (cols / group)), 0);
    c->biases.clear();
    std::vector<Status> sts(static_cast<size_t>(resolve_threads(threads)));
    parallel_rows(rows, threads, 16, [&](int part, int64_t r0, int64_t r1) {
      sts[static_cast<size_t>(part)] = quantize_microscaling(
          w.data + static_cast<size_t>(r0 * cols) * esz, w.dtype, r1 - r0, cols, fmt,
          reinterpret_cast<uint8_t*>(c->packed.data()) + r0 * code_bytes, c->scales.data() + r0 * (cols / group));
    });
    for (const Status& st : sts)
      if (!st) return st;
    return Status::ok();
  }
  c->packed.assign(static_cast<size_t>(rows * affine_words_per_row(cols, t.bits)), 0u);
  c->scales.assign(static_cast<size_t>(rows * (cols / group)) * esz, 0);
  c->biases.assign(c->scales.size(), 0);
  std::vector<Status> sts(static_cast<size_t>(resolve_threads(threads)));
  parallel_rows(rows, threads, 16, [&](int part, int64_t r0, int64_t r1) {
    const int64_t gpr = cols / group;
    sts[static_cast<size_t>(part)] = quantize_affine(
        w.data + static_cast<size_t>(r0 * cols) * esz, w.dtype, r1 - r0, cols, t.bits, group,
        c->packed.data() + r0 * affine_words_per_row(cols, t.bits), c->scales.data() + static_cast<size_t>(r0 * gpr) * esz,
        c->biases.data() + static_cast<size_t>(r0 * gpr) * esz);
  });
  for (const Status& s : sts)
    if (!s) return s;
  return Status::ok();
}

// Relative quantization error of one module at `bits` (sensitivity proxy), rows split over threads.
Result<double> weight_error(const formats::TensorInfo& w, int bits, int group, int threads) {
  const int64_t rows = w.dim(0), cols = w.dim(1);
  std::vector<float> d(static_cast<size_t>(rows * cols));
  if (Status st = fake_quantize_affine(w.data, w.dtype, rows, cols, bits, group, threads, d.data()); !st) return st;
  double num = 0, den = 0;
  for (int64_t i = 0; i < rows * cols; ++i) {
    const double x = load_float(w.data, w.dtype, i), e = x - d[static_cast<size_t>(i)];
    num += e * e;
    den += x * x;
  }
  return den > 0 ? num / den : 0.0;
}

// Fills table[i].kl for every probed module — the weight-error proxy, a reused report, or calibration
// KL measured on the source model — and returns the sensitivity.json report.
Result<ordered_json> measure_sensitivities(const formats::ModelFiles& files, std::vector<ModuleSensitivity>* table,
                                           const ConvertOptions& opts, ConvertReport* rep) {
  if (opts.weight_proxy) {
    ordered_json layers = ordered_json::array();
    for (size_t i = 0; i < table->size(); ++i) {
      ModuleSensitivity& m = (*table)[i];
      if (opts.progress) opts.progress(i + 1, table->size(), "sensitivity proxy: " + m.name);
      const formats::TensorInfo* w = files.tensors().find(m.name + ".weight");
      ordered_json kl = ordered_json::object();
      for (int b : opts.candidate_bits) {
        auto e = weight_error(*w, b, opts.group_size, opts.threads);
        if (!e) return Status(e.status().code(), e.status().message() + " (module " + m.name + ")");
        m.kl[b] = e.value();
        kl[std::to_string(b)] = e.value();
      }
      layers.push_back({{"name", m.name}, {"params", m.params}, {"kl", kl}});
    }
    return ordered_json{{"format", "larder-sensitivity-1"}, {"reference", "weight-error-proxy"},
                        {"metric", "||W - deq(quant_b(W))||^2 / ||W||^2 (not calibration KL)"},
                        {"group_size", opts.group_size}, {"layers", layers}};
  }
  auto tok = tokenizer::Tokenizer::from_hf_dir(files.path);
  if (!tok) return tok.status();
  auto calib = load_calibration(*tok.value(), opts.calibration);
  if (!calib) return calib.status();
  SensitivityOptions so;
  so.candidates = opts.candidate_bits;
  so.group_size = opts.group_size;
  so.threads = opts.threads;
  so.method = opts.sensitivity_method;
  so.progress = [&](size_t i, size_t n, const std::string& what) {
    if (opts.progress) opts.progress(i, n, "sensitivity: " + what);
  };
  if (!opts.reuse_sensitivity.empty()) {
    auto prev = formats::read_json_file(opts.reuse_sensitivity);
    if (!prev) return prev.status();
    auto t = reuse_sensitivity_report(prev.value(), *table, calib.value(), so);
    if (!t) return Status(t.status().code(), t.status().message() + " (" + opts.reuse_sensitivity + ")");
    *table = std::move(t).value();
    rep->sensitivity_reused = true;
    return std::move(prev).value();
  }
  auto r = measure_kl_sensitivity(files, *table, calib.value(), so);
  if (!r) return r.status();
  *table = std::move(r.value().table);
  rep->sensitivity_seconds = r.value().seconds;
  rep->sensitivity_forwards = r.value().forwards;
  return std::move(r.value().report);
}

Result<ConvertReport> run(const std::string& src_dir, const std::string& tmp, const ConvertOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  ConvertReport rep;
  auto cfg_r = formats::read_json_file(src_dir + "/config.json");
  if (!cfg_r) return cfg_r.status();
  ordered_json cfg = std::move(cfg_r).value();
  if (cfg.contains("quantization") || cfg.contains("quantization_config"))
    return unsupported("[quantize] " + src_dir +
                       "/config.json already has a quantization block; re-quantizing a quantized checkpoint is not supported yet");
  const std::string mt = cfg.value("model_type", std::string());
  if (mt != "llama" && mt != "mistral" && mt != "qwen2" && mt != "qwen3")
    return unsupported("[quantize] model_type '" + mt + "' is not supported (llama, mistral, qwen2, qwen3)");
  const bool tied = cfg.contains("tie_word_embeddings") && cfg["tie_word_embeddings"].is_boolean() &&
                    cfg["tie_word_embeddings"].get<bool>();
  // One opening of the source serves the tensor plan and, for calibration KL, the model.
  auto files_r = formats::open_model_files(src_dir);
  if (!files_r) return files_r.status();
  const formats::ModelFiles& files = files_r.value();
  const formats::TensorSet& ts = files.tensors();

  // Mixed precision: sensitivities of the per-block linears, then the allocator.
  std::map<std::string, int> module_bits = opts.module_bits;
  ordered_json sens_report;
  if (opts.target_bpw > 0) {
    std::vector<ModuleSensitivity> table;
    for (const formats::TensorInfo& t : ts.tensors()) {
      const std::string& n = t.name;
      if (t.rank() != 2 || !is_float(t.dtype) || n.size() <= 7 || n.compare(n.size() - 7, 7, ".weight") != 0) continue;
      const std::string module = n.substr(0, n.size() - 7);
      if (t.dim(1) % opts.group_size != 0 || keep_matches(opts.keep, module) || block_index(module) < 0) continue;
      table.push_back({module, {}, static_cast<uint64_t>(t.numel()), {}});
    }
    auto sens = measure_sensitivities(files, &table, opts, &rep);
    if (!sens) return sens.status();
    sens_report = std::move(sens).value();
    AllocatorOptions ao;
    ao.target_bpw = opts.target_bpw;
    ao.group_size = opts.group_size;
    ao.candidates = opts.candidate_bits;
    ao.protect_first_last = opts.protect_blocks > 0;
    ao.n_protect = std::max(1, opts.protect_blocks);
    auto plan = allocate_bits(table, ao);
    if (!plan) return plan.status();
    rep.allocated_bpw = plan.value().achieved_bpw;
    ordered_json bits = ordered_json::object();
    for (const ModuleBits& m : plan.value().modules) {
      module_bits[m.name] = m.bits;
      bits[m.name] = m.bits;
    }
    sens_report["allocation"] = {{"target_bpw", opts.target_bpw}, {"achieved_bpw", plan.value().achieved_bpw},
                                 {"candidates", plan.value().candidates}, {"bits", bits}};
  }

  // Plan every output tensor.
  std::vector<OutTensor> outs;
  ordered_json block = ordered_json::object();
  block["group_size"] = opts.group_size;
  block["bits"] = opts.bits;
  block["mode"] = models::quant_mode_name(opts.mode);
  std::map<std::string, ordered_json> entries;
  size_t n_modules = 0;
  uint64_t bit_params = 0;
  double overhead_bits = 0;
  for (const formats::TensorInfo& t : ts.tensors()) {
    const std::string& n = t.name;
    if (n.find("rotary_emb.inv_freq") != std::string::npos) continue;
    if (tied && n == "lm_head.weight") continue;
    const char* dn = safetensors_dtype_name(t.dtype);
    if (!dn) return unsupported(strfmt("[quantize] tensor '%s' has dtype %s, which cannot be written", n.c_str(), dtype_name(t.dtype)));
    rep.total_params += static_cast<uint64_t>(t.numel());
    const bool weight2d = t.rank() == 2 && n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0;
    if (!weight2d || !is_float(t.dtype)) {
      outs.push_back({n, t.dtype, t.shape, t.nbytes, &t, -1, 0, {}, {}});
      ++rep.n_passthrough;
      continue;
    }
    const std::string module = n.substr(0, n.size() - 7);
    const int64_t rows = t.dim(0), cols = t.dim(1);
    if (cols % opts.group_size != 0) {  // as mlx-lm: unquantized, no config entry
      outs.push_back({n, t.dtype, t.shape, t.nbytes, &t, -1, 0, {}, {}});
      ++rep.n_passthrough;
      continue;
    }
    if (keep_matches(opts.keep, module)) {
      outs.push_back({n, t.dtype, t.shape, t.nbytes, &t, -1, 0, {}, {}});
      entries[module] = false;
      ++rep.n_kept;
      continue;
    }
    models::AffineParams q{opts.bits, opts.group_size, opts.mode};
    if (auto it = module_bits.find(module); it != module_bits.end()) q.bits = it->second;
    if (const PlanEntry* e = plan_entry(opts.plan, module)) {
      if (!e->params) {  // the plan keeps it
        outs.push_back({n, t.dtype, t.shape, t.nbytes, &t, -1, 0, {}, {}});
        entries[module] = false;
        ++rep.n_kept;
        continue;
      }
      q = *e->params;
      if (cols % q.group_size != 0)
        return invalid_argument(strfmt("[quantize] plan entry '%s' quantizes module %s (%lld columns) at group_size %d, "
                                       "which does not divide them",
                                       e->pattern.c_str(), module.c_str(), (long long)cols, q.group_size));
    }
    if (Status st = check_quant_params(q, cols); !st)
      return Status(st.code(), st.message() + " (module " + module + ")");
    const uint64_t esz = t.dtype == DType::kF32 ? 4 : 2;
    const int64_t words = affine_words_per_row(cols, q.bits), groups = cols / q.group_size;
    const bool affine = q.mode == models::QuantMode::kAffine;
    outs.push_back({module + ".weight", DType::kU32, {rows, words}, static_cast<uint64_t>(rows * words) * 4, &t, 0, q.bits, module, q});
    if (affine) {
      outs.push_back({module + ".scales", t.dtype, {rows, groups}, static_cast<uint64_t>(rows * groups) * esz, &t, 1, q.bits, module, q});
      outs.push_back({module + ".biases", t.dtype, {rows, groups}, static_cast<uint64_t>(rows * groups) * esz, &t, 2, q.bits, module, q});
    } else {
      outs.push_back({module + ".scales", DType::kU8, {rows, groups}, static_cast<uint64_t>(rows * groups), &t, 1, q.bits, module, q});
    }
    entries[module] = {{"bits", q.bits}, {"group_size", q.group_size}, {"mode", models::quant_mode_name(q.mode)}};
    ++rep.n_quantized;
    ++n_modules;
    rep.quantized_params += static_cast<uint64_t>(rows * cols);
    bit_params += static_cast<uint64_t>(q.bits) * static_cast<uint64_t>(rows * cols);
    // Per group: affine a scale and a bias in the source's 16/32-bit dtype, microscaling one byte.
    overhead_bits += static_cast<double>(rows * groups) * (affine ? 2.0 * 8.0 * static_cast<double>(esz) : 8.0);
  }
  if (rep.n_quantized == 0) return invalid_argument("[quantize] no module of " + src_dir + " can be quantized at group size " + std::to_string(opts.group_size));
  // Top-level bits in mixed mode: the smallest allocated width (design §3.1). Not for a
  // microscaling mode, whose top-level bits are the mode's (mlx-lm rebuilds every module without
  // an entry from them).
  if (opts.mode == models::QuantMode::kAffine) {
    int min_bits = 99;
    for (const auto& [m, e] : entries)
      if (e.is_object() && e["mode"] == "affine") min_bits = std::min(min_bits, e["bits"].get<int>());
    if (min_bits != 99) block["bits"] = min_bits;
  }
  for (auto& [m, e] : entries) block[m] = e;
  std::sort(outs.begin(), outs.end(), [](const OutTensor& a, const OutTensor& b) { return a.name < b.name; });

  std::vector<ShardEntry> entries_out;
  entries_out.reserve(outs.size());
  for (const OutTensor& o : outs) entries_out.push_back({o.name, o.dtype, o.shape, o.nbytes});
  QuantCache cache;
  size_t done = 0;
  auto produce = [&](size_t i) -> Result<const void*> {
    const OutTensor& t = outs[i];
    if (t.part < 0) return static_cast<const void*>(t.src->data);
    if (cache.module != t.module) {
      ++done;
      if (opts.progress) opts.progress(done, n_modules, t.module);
      if (Status s = quantize_module(t, opts.threads, &cache); !s)
        return Status(s.code(), s.message() + " (module " + t.module + ")");
    }
    return t.part == 0 ? static_cast<const void*>(cache.packed.data())
         : t.part == 1 ? static_cast<const void*>(cache.scales.data())
                       : static_cast<const void*>(cache.biases.data());
  };
  auto written = write_safetensors_shards(tmp, entries_out, opts.max_shard_bytes, ordered_json{{"format", "mlx"}},
                                          rep.total_params, produce);
  if (!written) return written.status();
  rep.n_shards = written.value().n_shards;
  rep.out_bytes = written.value().total_bytes;

  // config.json: source config + both quantization blocks, top-level keys sorted, indent 4.
  cfg["quantization"] = block;
  cfg["quantization_config"] = block;
  if (Status st = write_config_json(tmp + "/config.json", cfg); !st) return st;
  if (!sens_report.is_null())
    if (Status st = write_text_file(tmp + "/sensitivity.json", sens_report.dump(2) + "\n"); !st) return st;
  if (Status st = copy_aux_files(src_dir, tmp); !st) return st;
  rep.nominal_bpw = static_cast<double>(bit_params) / static_cast<double>(rep.quantized_params);
  rep.stored_bpw = rep.nominal_bpw + overhead_bits / static_cast<double>(rep.quantized_params);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace

Status check_quant_params(const models::AffineParams& p, int64_t cols) {
  if (p.mode == models::QuantMode::kAffine) return check_affine_params(p.bits, p.group_size, cols);
  const int bits = models::quant_mode_default_bits(p.mode), group = models::quant_mode_default_group(p.mode);
  if (p.bits != bits || p.group_size != group)
    return invalid_argument(strfmt("[quantize] mode %s is bits %d, group_size %d (got bits %d, group_size %d)",
                                   models::quant_mode_name(p.mode), bits, group, p.bits, p.group_size));
  if (cols % group != 0)
    return invalid_argument(strfmt("[quantize] %lld columns are not a multiple of mode %s's group_size %d",
                                   (long long)cols, models::quant_mode_name(p.mode), group));
  return Status::ok();
}

Result<std::vector<PlanEntry>> read_quant_plan(const std::string& path, const models::AffineParams& defaults) {
  auto j = formats::read_json_file(path);
  if (!j) return j.status();
  if (!j.value().is_object())
    return invalid_argument("[quantize] plan " + path + ": must be a JSON object {module pattern: false | true | "
                            "{mode, bits, group_size}}");
  std::vector<PlanEntry> plan;
  for (auto it = j.value().begin(); it != j.value().end(); ++it) {
    const ordered_json& v = it.value();
    const std::string where = "[quantize] plan " + path + ": entry '" + it.key() + "'";
    PlanEntry e{it.key(), std::nullopt};
    if (v.is_boolean()) {
      if (v.get<bool>()) e.params = defaults;
    } else if (v.is_object()) {
      models::AffineParams p = defaults;
      for (auto f = v.begin(); f != v.end(); ++f)
        if (f.key() != "mode" && f.key() != "bits" && f.key() != "group_size")
          return invalid_argument(where + " has unknown key '" + f.key() + "' (mode, bits, group_size)");
      if (v.contains("mode")) {
        const auto m = v["mode"].is_string() ? models::quant_mode_from_name(v["mode"].get<std::string>()) : std::nullopt;
        if (!m) return invalid_argument(where + ": mode " + v["mode"].dump() + " is not one of affine, mxfp4, nvfp4, mxfp8");
        if (*m != p.mode) p = {models::quant_mode_default_bits(*m), models::quant_mode_default_group(*m), *m};
      }
      for (const char* k : {"bits", "group_size"}) {
        if (!v.contains(k)) continue;
        if (!v[k].is_number_integer()) return invalid_argument(where + ": '" + k + "' must be an integer, got " + v[k].dump());
        (std::string(k) == "bits" ? p.bits : p.group_size) = v[k].get<int>();
      }
      if (Status st = check_quant_params(p, p.group_size); !st) return Status(st.code(), where + ": " + st.message());
      e.params = p;
    } else {
      return invalid_argument(where + " must be false, true or {mode, bits, group_size}, got " + v.dump());
    }
    plan.push_back(std::move(e));
  }
  return plan;
}

Result<ConvertReport> quantize_checkpoint(const std::string& src_dir, const std::string& dst_dir,
                                          const ConvertOptions& opts) {
  if (Status st = check_quant_params({opts.bits, opts.group_size, opts.mode}, opts.group_size); !st) return st;
  if (opts.target_bpw > 0 && (opts.mode != models::QuantMode::kAffine || !opts.plan.empty()))
    return invalid_argument("[quantize] --target-bpw allocates affine widths; it does not combine with --mode " +
                            std::string(models::quant_mode_name(opts.mode)) + " or --plan");
  struct stat sb;
  if (::stat(src_dir.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode))
    return not_found("[quantize] source " + src_dir + " is not a directory");
  ConvertReport rep;
  Status st = publish_directory(dst_dir, "[quantize]", [&](const std::string& tmp) {
    std::string src = src_dir;
    RotateReport rot;
    if (opts.rotate) {
      // Rotated source next to the output it feeds, so a failed run removes both at once.
      src = tmp + "/.rotated-source";
      auto r = rotate_checkpoint(src_dir, src, opts.rotation);
      if (!r) return r.status();
      rot = std::move(r).value();
    }
    auto r = run(src, tmp, opts);
    if (!r) return r.status();
    rep = std::move(r).value();
    if (opts.rotate) {
      rep.rotated = true;
      rep.rotation = rot;
      std::error_code ec;
      fs::remove_all(src, ec);
      if (ec) return io_error("[quantize] removing the rotated source " + src + ": " + ec.message());
    }
    return Status::ok();
  });
  if (!st) return st;
  return rep;
}

}  // namespace larder::quant
