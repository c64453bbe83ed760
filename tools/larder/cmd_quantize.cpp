// larder quantize SRC DST: MLX affine checkpoint from an HF directory (see quant/convert.h), or
// with --format gguf a GGUF file from an HF directory or a GGUF (quant/gguf_export.h).
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "larder/quant/convert.h"
#include "larder/quant/gguf_export.h"
#include "larder/quant/lora_merge.h"
#include <unistd.h>
#include "larder/core/progress.h"
#include "generation_setup.h"
#include "model_arg.h"
#include "validators.h"
#include "verbs.h"

namespace larder::cli {

namespace {

struct Opts {
  std::string format = "mlx", gguf_type = "Q4_K_M", imatrix, imatrix_out;
  bool calibrate = false;
  std::string mode = "affine", plan;
  std::string src, dst, keep, candidates = "2,3,4,6,8", sensitivity = "kl", calibration, reuse, target_size, sensitivity_out;
  int64_t calib_len = 256, calib_n = 8;
  double target_bpw = 0;
  int bits = 4, group = 64, threads = 0, protect_blocks = 1;
  bool rotate = false, no_r2 = false;
  uint64_t rotation_seed = 42;
  double max_shard_mb = 5 * 1024.0;
  std::vector<std::string> lora;  // --lora PATH[:SCALE]: merged into the base first (issue 45 item 4)
};
// "2,3,4" -> {2, 3, 4}.
Result<std::vector<int>> parse_candidates(const std::string& list) {
  std::vector<int> out;
  std::stringstream cs(list);
  for (std::string k; std::getline(cs, k, ',');) {
    try {
      size_t used = 0;
      if (!k.empty()) out.push_back(std::stoi(k, &used));
      if (!k.empty() && used != k.size()) throw std::invalid_argument(k);
    } catch (const std::exception&) {
      return invalid_argument("[quantize] --candidate-bits: '" + k + "' is not a number");
    }
  }
  if (out.empty()) return invalid_argument("[quantize] --candidate-bits: no width given");
  return out;
}

// --target-size: bytes, or a number with K/M/G (KiB, MiB, GiB).
Result<uint64_t> parse_size(const std::string& s) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = s.substr(used);
  const double mult = unit.empty() ? 1 : unit == "K" || unit == "KiB" ? 1024.0 : unit == "M" || unit == "MiB" ? 1048576.0
                    : unit == "G" || unit == "GiB" ? 1073741824.0 : -1;
  if (used == 0 || mult < 0 || !(v > 0))
    return invalid_argument("[quantize] --target-size '" + s + "': expected a positive size in bytes, or with K, M or G (KiB, MiB, GiB)");
  return static_cast<uint64_t>(v * mult);
}

// --format gguf (quant/gguf_export.h): options that only shape MLX output are refused by name.
int quantize_gguf(const Opts& o, const CLI::App& cmd) {
  for (const char* flag :
       {"--bits", "--group-size", "--mode", "--plan", "--keep", "--rotate", "--rotation-seed", "--no-r2", "--max-shard-mb"})
    if (cmd.count(flag) > 0)
      return report(invalid_argument(std::string("[quantize] ") + flag + " does not apply to --format gguf (yet)"));
  const bool allocating = o.target_bpw > 0 || !o.target_size.empty();
  if (!allocating)
    for (const char* flag : {"--sensitivity", "--protect-blocks", "--candidate-bits", "--sensitivity-out", "--reuse-sensitivity"})
      if (cmd.count(flag) > 0)
        return report(invalid_argument(std::string("[quantize] ") + flag + " needs --target-bpw or --target-size"));
  if (!o.calibrate && !allocating)
    for (const char* flag : {"--calibration", "--calibration-length", "--calibration-samples", "--imatrix-out"})
      if (cmd.count(flag) > 0)
        return report(invalid_argument(std::string("[quantize] ") + flag +
                                       " needs --calibrate, --target-bpw or --target-size with --format gguf"));
  if (o.sensitivity == "proxy")
    return report(invalid_argument("[quantize] --sensitivity proxy does not apply to --format gguf (kl or fast)"));
  std::error_code ec;
  if (std::filesystem::exists(o.dst, ec))
    return report(invalid_argument("[quantize] " + o.dst + " exists; give a new file name"));
  quant::GgufExportOptions opts;
  opts.type = o.gguf_type;
  opts.imatrix_file = o.imatrix;
  opts.imatrix_out = o.imatrix_out;
  opts.calibrate = o.calibrate;
  opts.calibration.file = o.calibration;
  opts.calibration.seq_len = o.calib_len;
  opts.calibration.n_samples = o.calib_n;
  if (allocating) {
    opts.target_bpw = o.target_bpw;
    if (!o.target_size.empty()) {
      auto b = parse_size(o.target_size);
      if (!b) return report(b.status());
      opts.target_bytes = b.value();
    }
    // GGUF default: fast sensitivities over every K-quant width (--candidate-bits narrows them).
    opts.sensitivity_method = cmd.count("--sensitivity") > 0 && o.sensitivity == "kl" ? quant::SensitivityMethod::kKl
                                                                                       : quant::SensitivityMethod::kFast;
    if (cmd.count("--candidate-bits") > 0) {
      auto c = parse_candidates(o.candidates);
      if (!c) return report(c.status());
      opts.candidate_bits = c.value();
    }
    if (cmd.count("--protect-blocks") > 0) opts.protect_blocks = o.protect_blocks;  // else GGUF's default, 0
    opts.sensitivity_out = o.sensitivity_out;
    opts.reuse_sensitivity = o.reuse;
  }
  auto steps = std::make_shared<ProgressSteps>("quantize");
  opts.progress = [steps](size_t i, size_t n, const std::string& m) { steps->step(i, n, m); };
  auto r = quant::export_gguf(o.src, o.dst, opts);
  steps->finish(r ? "" : "stopped");
  if (!r) return report(r.status());
  const auto& rep = r.value();
  std::string types;
  for (const auto& [t, n] : rep.type_counts) types += (types.empty() ? "" : ", ") + std::to_string(n) + " " + t;
  std::fprintf(stderr, "wrote %s: %s, %zu tensors (%s; %zu fell back to a smaller block), %.2f MiB, %.3f bits per weight, %.1f s\n",
               o.dst.c_str(), rep.architecture.c_str(), rep.n_tensors, types.c_str(), rep.n_fallback,
               rep.out_bytes / 1048576.0, rep.bpw, rep.seconds);
  if (allocating)
    std::fprintf(stderr, "KL allocation: block weights %.3f bits per weight stored (budget %.3f); sensitivity %s, %lld forwards, %.1f s\n",
                 rep.block_bpw, rep.block_target_bpw, opts.sensitivity_method == quant::SensitivityMethod::kFast ? "fast" : "kl",
                 static_cast<long long>(rep.sensitivity_forwards), rep.sensitivity_seconds);
  if (rep.imatrix_tensors > 0)
    std::fprintf(stderr, "importance matrix: %zu tensors weighted%s\n", rep.imatrix_tensors,
                 o.calibrate ? strfmt(" (computed in %.1f s)", rep.imatrix_seconds).c_str() : "");
  return 0;
}

}  // namespace

VerbMain add_quantize(CLI::App& app) {

  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("quantize", "write an MLX affine-quantized checkpoint (mlx-lm compatible)");
  cmd->add_option("src", o->src, "source Hugging Face directory (bf16/f16/f32 safetensors) or its repo id in the local Hugging Face cache")->required();
  cmd->add_option("dst", o->dst, "output directory (must not exist); with --format gguf the .gguf file")->required();
  cmd->add_option("--format", o->format, "mlx: an MLX affine checkpoint directory; gguf: one GGUF file llama.cpp loads")
      ->check(CLI::IsMember({"mlx", "gguf"}))
      ->capture_default_str();
  cmd->add_option("--type", o->gguf_type,
                  "--format gguf: a type for every weight (F32, F16, BF16, Q8_0, Q6_K, Q5_K, Q4_K, Q3_K, Q2_K, IQ4_XS, "
                  "IQ4_NL, Q5_1, Q5_0, Q4_1, Q4_0) or a llama.cpp recipe (Q5_K_M, Q4_K_M, Q3_K_M)")
      ->capture_default_str();
  cmd->add_option("--imatrix", o->imatrix,
                  "--format gguf: importance matrix file (llama-imatrix's imatrix.gguf or legacy .dat) weighting the "
                  "K-quant / IQ4 / Q6_K quantizers' error");
  cmd->add_flag("--calibrate", o->calibrate,
                "--format gguf: compute the importance matrix from the calibration text (--calibration, "
                "--calibration-length, --calibration-samples) through the source model");
  cmd->add_option("--imatrix-out", o->imatrix_out, "with --calibrate: also write the matrix in llama-imatrix's GGUF format");
  cmd->add_option("--mode", o->mode,
                  "MLX quantization mode: affine (codes + scale and bias per group), or the microscaling floats mxfp4 "
                  "(e2m1, e8m0 scale per 32), nvfp4 (e2m1, e4m3 scale per 16), mxfp8 (e4m3, e8m0 scale per 32)")
      ->check(CLI::IsMember({"affine", "mxfp4", "nvfp4", "mxfp8"}))
      ->capture_default_str();
  cmd->add_option("--plan", o->plan,
                  "JSON file of per-module quantization: {\"<module path, suffix or glob>\": false | "
                  "{\"mode\": ..., \"bits\": ..., \"group_size\": ...}}, first match wins (missing keys: --mode's, "
                  "or that mode's defaults)");
  cmd->add_option("--bits", o->bits, "affine bits per weight: 2, 3, 4, 5, 6 or 8 (other modes: theirs)")->capture_default_str();
  cmd->add_option("--group-size", o->group, "affine group size: 32, 64 or 128 (other modes: theirs)")->capture_default_str();
  cmd->add_option("--keep", o->keep, "comma-separated modules left unquantized (path, dotted suffix e.g. lm_head, or glob)");
  cmd->add_option("--target-bpw", o->target_bpw,
                  "mixed precision: nominal bits per weight over the block linears (embed_tokens / lm_head keep --bits); "
                  "with --format gguf: bits per weight of the tensor data over all tensors (as llama-quantize reports), "
                  "the block weights' types allocated by calibration KL");
  cmd->add_option("--target-size", o->target_size,
                  "--format gguf: largest file size (bytes, or with K/M/G): the block weights' GGUF types are allocated "
                  "by calibration KL to fill it (--target-bpw: tensor bits per weight over all tensors instead)");
  cmd->add_option("--sensitivity-out", o->sensitivity_out,
                  "--format gguf with a target: write the sensitivity table and the chosen types as JSON here");
  cmd->add_option("--sensitivity", o->sensitivity,
                  "kl: calibration KL of each module quantized alone at each width (design §4; the reference, one "
                  "forward per module and width); fast: that KL at one width per module, scaled to the others by the "
                  "module's output error on its calibration inputs (one forward per module); proxy: relative weight "
                  "error (no forward, ignores how the model uses the module). --format gguf: fast unless kl is given")
      ->check(CLI::IsMember({"kl", "fast", "proxy"}))
      ->capture_default_str();
  cmd->add_option("--calibration", o->calibration, "calibration text: a .jsonl file (\"text\" or \"messages\" per line) or plain text (default: built-in multi-domain corpus)");
  cmd->add_option("--calibration-length", o->calib_len, "tokens per calibration sample")->capture_default_str();
  cmd->add_option("--calibration-samples", o->calib_n, "calibration samples")->capture_default_str();
  cmd->add_option("--protect-blocks", o->protect_blocks,
                  "allocator: the first and last N blocks are favoured (x100 sensitivity); 0 turns it off "
                  "(default: 1; with --format gguf 0, as its sensitivities are measured through the written types)")
      ->check(at_least(0));
  cmd->add_option("--reuse-sensitivity", o->reuse,
                  "sensitivity.json (--format gguf: --sensitivity-out) of an earlier run with the same calibration to use "
                  "instead of measuring");
  cmd->add_option("--candidate-bits", o->candidates,
                  "widths the allocator may choose (with --target-bpw; --format gguf: 2..6 the K-quant of that width, 8 "
                  "Q8_0, default 2,3,4,5,6,8)")
      ->capture_default_str();
  cmd->add_flag("--rotate", o->rotate,
                "fold the RMSNorm gains and a randomized Hadamard rotation (R1 on the residual stream, R2 per head "
                "between v and o) into the weights before quantizing: same function, fewer outliers (helps at 3 bits)");
  cmd->add_option("--rotation-seed", o->rotation_seed, "seed of the rotation's random signs")->capture_default_str();
  cmd->add_flag("--no-r2", o->no_r2, "with --rotate: residual rotation R1 only");
  cmd->add_option("--max-shard-mb", o->max_shard_mb, "largest shard in MiB")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "threads (0: all cores)");
  cmd->add_option("--lora", o->lora,
                  "LoRA adapter PATH[:SCALE] (PEFT or mlx-lm directory, or a GGUF LoRA in HF row order) merged into the weights before quantizing "
                  "(W + scale·B·A with the adapter's alpha/rank scaling); repeatable; HF sources only")
      ->allow_extra_args(false);
  return [o, cmd]() {
    auto located = resolve_model(o->src);
    if (!located.is_ok()) return report(located.status());
    o->src = located->path;
    // --lora: a merged full-precision copy next to DST is the source of everything below; it is
    // removed however the run ends.
    std::string merged;
    struct RemoveMerged {
      std::string* dir;
      ~RemoveMerged() {
        std::error_code ec;
        if (!dir->empty()) std::filesystem::remove_all(*dir, ec);
      }
    } remove_merged{&merged};
    if (!o->lora.empty()) {
      std::error_code ec;
      if (std::filesystem::exists(o->dst, ec))
        return report(invalid_argument("[quantize] " + o->dst + " exists; give a new name"));
      std::vector<models::LoraUse> uses;
      for (const std::string& spec : o->lora) {
        auto sp = models::parse_lora_spec(spec, /*named=*/false);
        if (!sp.is_ok()) return report(Status(sp.status().code(), "--lora " + spec + ": " + sp.status().message()));
        auto a = models::LoraAdapter::load(sp->path);
        if (!a.is_ok()) return report(Status(a.status().code(), "--lora " + spec + ": " + a.status().message()));
        uses.push_back({a.value(), sp->scale});
      }
      std::string dst = o->dst;
      while (!dst.empty() && dst.back() == '/') dst.pop_back();
      const std::string target = dst + strfmt(".lora-merge-%d", static_cast<int>(::getpid()));
      std::vector<std::string> warnings;
      auto r = quant::merge_lora_checkpoint(o->src, target, uses, &warnings);
      for (const std::string& w : warnings) std::fprintf(stderr, "larder: --lora: %s\n", w.c_str());
      if (!r.is_ok()) return report(r.status());
      merged = target;
      std::fprintf(stderr, "merged %zu adapter(s) into %zu projection weights\n", uses.size(), r->merged_tensors);
      o->src = merged;
    }
    if (o->format == "gguf") return quantize_gguf(*o, *cmd);
    if (cmd->count("--type") > 0) return report(invalid_argument("[quantize] --type applies to --format gguf"));
    quant::ConvertOptions opts;
    opts.mode = models::quant_mode_from_name(o->mode).value_or(models::QuantMode::kAffine);
    opts.bits = o->bits;
    opts.group_size = o->group;
    if (opts.mode != models::QuantMode::kAffine) {
      // A microscaling mode has one layout: --bits / --group-size default to it (and must match it).
      if (cmd->count("--bits") == 0) opts.bits = models::quant_mode_default_bits(opts.mode);
      if (cmd->count("--group-size") == 0) opts.group_size = models::quant_mode_default_group(opts.mode);
    }
    if (!o->plan.empty()) {
      auto plan = quant::read_quant_plan(o->plan, {opts.bits, opts.group_size, opts.mode});
      if (!plan) return report(plan.status());
      opts.plan = std::move(plan).value();
    }
    opts.threads = o->threads;
    opts.max_shard_bytes = static_cast<uint64_t>(o->max_shard_mb * 1048576.0);
    opts.target_bpw = o->target_bpw;
    opts.weight_proxy = o->sensitivity == "proxy";
    opts.sensitivity_method = o->sensitivity == "fast" ? quant::SensitivityMethod::kFast : quant::SensitivityMethod::kKl;
    opts.protect_blocks = o->protect_blocks;
    opts.rotate = o->rotate;
    opts.rotation.seed = o->rotation_seed;
    opts.rotation.r2 = !o->no_r2;
    opts.rotation.threads = o->threads;
    if (!o->rotate && (o->no_r2 || o->rotation_seed != 42))
      return report(invalid_argument("[quantize] --rotation-seed / --no-r2 only apply with --rotate"));
    opts.calibration.file = o->calibration;
    opts.calibration.seq_len = o->calib_len;
    opts.calibration.n_samples = o->calib_n;
    opts.reuse_sensitivity = o->reuse;
    if (o->target_bpw <= 0 && (!o->calibration.empty() || !o->reuse.empty()))
      return report(invalid_argument("[quantize] --calibration / --reuse-sensitivity only apply with --target-bpw"));
    if (!o->target_size.empty() || !o->sensitivity_out.empty())
      return report(invalid_argument("[quantize] --target-size / --sensitivity-out apply to --format gguf"));
    if (o->target_bpw > 0) {
      auto c = parse_candidates(o->candidates);
      if (!c) return report(c.status());
      opts.candidate_bits = c.value();
    }
    std::stringstream ss(o->keep);
    for (std::string k; std::getline(ss, k, ',');)
      if (!k.empty()) opts.keep.push_back(k);
    // One bar per phase (rotation, sensitivity probes, quantizing tensors); plain lines off a TTY.
    auto rot = std::make_shared<ProgressSteps>("rotate");
    auto steps = std::make_shared<ProgressSteps>("quantize");
    opts.rotation.progress = [rot](size_t i, size_t n, const std::string& t) { rot->step(i, n, t); };
    opts.progress = [steps](size_t i, size_t n, const std::string& m) { steps->step(i, n, m); };
    auto r = quant::quantize_checkpoint(o->src, o->dst, opts);
    rot->finish(r ? "" : "stopped");
    steps->finish(r ? "" : "stopped");
    if (!r) return report(r.status());
    const auto& rep = r.value();
    std::fprintf(stderr,
                 "quantized %zu modules (%zu kept, %zu tensors passed through) into %zu shard(s), %.2f MiB, %.1f s\n"
                 "bits per weight over quantized modules: nominal %.3f, stored %.3f (group %d)\n",
                 rep.n_quantized, rep.n_kept, rep.n_passthrough, rep.n_shards, rep.out_bytes / 1048576.0, rep.seconds,
                 rep.nominal_bpw, rep.stored_bpw, opts.group_size);
    if (rep.rotated)
      std::fprintf(stderr, "rotation: R1 %s, R2 %s, seed %llu%s (%.1f s)\n", rep.rotation.r1_construction.c_str(),
                   rep.rotation.r2_construction.c_str(), static_cast<unsigned long long>(o->rotation_seed),
                   rep.rotation.untied ? ", tied lm_head untied" : "", rep.rotation.seconds);
    if (o->target_bpw > 0) {
      std::fprintf(stderr, "mixed precision: target %.3f, allocated %.3f nominal over the block linears; sensitivity: %s",
                   o->target_bpw, rep.allocated_bpw,
                   opts.weight_proxy ? "weight-error proxy" : rep.sensitivity_reused ? "reused"
                   : o->sensitivity == "fast" ? "calibration KL, fast" : "calibration KL");
      if (!opts.weight_proxy && !rep.sensitivity_reused)
        std::fprintf(stderr, " (%lld forwards, %.1f s)", static_cast<long long>(rep.sensitivity_forwards), rep.sensitivity_seconds);
      std::fprintf(stderr, "; table in %s/sensitivity.json\n", o->dst.c_str());
    }
    return 0;
  };
}

}  // namespace larder::cli
