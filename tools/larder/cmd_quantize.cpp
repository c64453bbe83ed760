// larder quantize SRC DST: MLX affine checkpoint from an HF directory (see quant/convert.h).
#include <cstdio>
#include <sstream>

#include "larder/quant/convert.h"
#include "larder/core/progress.h"
#include "model_arg.h"
#include "validators.h"
#include "verbs.h"

namespace larder::cli {

VerbMain add_quantize(CLI::App& app) {
  struct Opts {
    std::string src, dst, keep, candidates = "2,3,4,6,8", sensitivity = "kl", calibration, reuse;
    int64_t calib_len = 256, calib_n = 8;
    double target_bpw = 0;
    int bits = 4, group = 64, threads = 0, protect_blocks = 1;
    bool rotate = false, no_r2 = false;
    uint64_t rotation_seed = 42;
    double max_shard_mb = 5 * 1024.0;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("quantize", "write an MLX affine-quantized checkpoint (mlx-lm compatible)");
  cmd->add_option("src", o->src, "source Hugging Face directory (bf16/f16/f32 safetensors) or its repo id in the local Hugging Face cache")->required();
  cmd->add_option("dst", o->dst, "output directory (must not exist)")->required();
  cmd->add_option("--bits", o->bits, "bits per weight: 2, 3, 4, 5, 6 or 8")->capture_default_str();
  cmd->add_option("--group-size", o->group, "group size: 32, 64 or 128")->capture_default_str();
  cmd->add_option("--keep", o->keep, "comma-separated modules left unquantized (path, dotted suffix e.g. lm_head, or glob)");
  cmd->add_option("--target-bpw", o->target_bpw,
                  "mixed precision: nominal bits per weight over the block linears (embed_tokens / lm_head keep --bits)");
  cmd->add_option("--sensitivity", o->sensitivity,
                  "kl: calibration KL of each module quantized alone (design §4); proxy: relative weight error (fast, "
                  "ignores how the model uses the module)")
      ->check(CLI::IsMember({"kl", "proxy"}))
      ->capture_default_str();
  cmd->add_option("--calibration", o->calibration, "calibration text: a .jsonl file (\"text\" or \"messages\" per line) or plain text (default: built-in multi-domain corpus)");
  cmd->add_option("--calibration-length", o->calib_len, "tokens per calibration sample")->capture_default_str();
  cmd->add_option("--calibration-samples", o->calib_n, "calibration samples")->capture_default_str();
  cmd->add_option("--protect-blocks", o->protect_blocks,
                  "allocator: the first and last N blocks are favoured (x100 sensitivity); 0 turns it off")
      ->check(at_least(0))
      ->capture_default_str();
  cmd->add_option("--reuse-sensitivity", o->reuse, "sensitivity.json of an earlier run with the same calibration to use instead of measuring");
  cmd->add_option("--candidate-bits", o->candidates, "widths the allocator may choose (with --target-bpw)")
      ->capture_default_str();
  cmd->add_flag("--rotate", o->rotate,
                "fold the RMSNorm gains and a randomized Hadamard rotation (R1 on the residual stream, R2 per head "
                "between v and o) into the weights before quantizing: same function, fewer outliers (helps at 3 bits)");
  cmd->add_option("--rotation-seed", o->rotation_seed, "seed of the rotation's random signs")->capture_default_str();
  cmd->add_flag("--no-r2", o->no_r2, "with --rotate: residual rotation R1 only");
  cmd->add_option("--max-shard-mb", o->max_shard_mb, "largest shard in MiB")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "threads (0: all cores)");
  return [o]() {
    auto located = resolve_model(o->src);
    if (!located.is_ok()) return report(located.status());
    o->src = located->path;
    quant::ConvertOptions opts;
    opts.bits = o->bits;
    opts.group_size = o->group;
    opts.threads = o->threads;
    opts.max_shard_bytes = static_cast<uint64_t>(o->max_shard_mb * 1048576.0);
    opts.target_bpw = o->target_bpw;
    opts.weight_proxy = o->sensitivity == "proxy";
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
    if (o->target_bpw > 0) {
      opts.candidate_bits.clear();
      std::stringstream cs(o->candidates);
      for (std::string k; std::getline(cs, k, ',');) {
        try {
          if (!k.empty()) opts.candidate_bits.push_back(std::stoi(k));
        } catch (const std::exception&) {
          return report(invalid_argument("[quantize] --candidate-bits: '" + k + "' is not a number"));
        }
      }
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
                 rep.nominal_bpw, rep.stored_bpw, o->group);
    if (rep.rotated)
      std::fprintf(stderr, "rotation: R1 %s, R2 %s, seed %llu%s (%.1f s)\n", rep.rotation.r1_construction.c_str(),
                   rep.rotation.r2_construction.c_str(), static_cast<unsigned long long>(o->rotation_seed),
                   rep.rotation.untied ? ", tied lm_head untied" : "", rep.rotation.seconds);
    if (o->target_bpw > 0) {
      std::fprintf(stderr, "mixed precision: target %.3f, allocated %.3f nominal over the block linears; sensitivity: %s",
                   o->target_bpw, rep.allocated_bpw,
                   opts.weight_proxy ? "weight-error proxy" : rep.sensitivity_reused ? "reused" : "calibration KL");
      if (!opts.weight_proxy && !rep.sensitivity_reused)
        std::fprintf(stderr, " (%lld forwards, %.1f s)", static_cast<long long>(rep.sensitivity_forwards), rep.sensitivity_seconds);
      std::fprintf(stderr, "; table in %s/sensitivity.json\n", o->dst.c_str());
    }
    return 0;
  };
}

}  // namespace larder::cli
