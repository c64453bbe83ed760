// convert.h — `larder quantize`: an HF checkpoint directory (bf16/f16/f32 safetensors, single
// or sharded) -> an MLX quantized checkpoint that mlx-lm and larder load unchanged: affine, or the
// microscaling float modes mxfp4 / nvfp4 / mxfp8 (quant/microscaling.h), globally or per module.
//
// What is quantized (as mlx-lm does for the Llama family): every 2-D `<module>.weight` — the
// q/k/v/o/gate/up/down projections, lm_head and embed_tokens — whose last dimension is a multiple
// of the group size. Norms, additive biases and other tensors pass through byte for byte (source
// dtype). Modules matching --keep stay in the source dtype and get `false` in the config; modules
// with a non-divisible last dim stay unquantized without a config entry. Like mlx-lm's sanitize,
// `*.rotary_emb.inv_freq` is dropped and so is `lm_head.weight` when tie_word_embeddings is true.
//
// Output: model.safetensors (or model-0000i-of-0000N.safetensors + model.safetensors.index.json),
// tensors in sorted name order, metadata {"format": "mlx"}; config.json = the source config with
// `quantization` and `quantization_config` = {group_size, bits, mode, <module>: {bits, group_size,
// mode} for every quantized module, <module>: false for kept ones} — every entry names its mode,
// because mlx-lm hands an entry to the module's to_quantized(**entry), whose mode defaults to
// affine — top-level keys sorted,
// indent 4; tokenizer / template / generation files copied. Everything is written into a fresh
// `<dst>.partial-XXXXXX` directory next to DST and renamed onto DST at the end; a failed run
// removes it. DST must not exist.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "larder/core/status.h"
#include "larder/models/config.h"
#include "larder/quant/rotate.h"
#include "larder/quant/sensitivity.h"

namespace larder::quant {

// One entry of a user's quantization plan (--plan FILE, read_quant_plan): modules matching
// `pattern` (exact path, dotted suffix or fnmatch glob, as --keep) get `params`, or stay in the
// source dtype (nullopt, `false` in the file). The first matching entry decides.
struct PlanEntry {
  std::string pattern;
  std::optional<models::AffineParams> params;
};

struct ConvertOptions {
  int bits = 4;
  int group_size = 64;
  // The mode of every quantized module without a plan entry (affine, or a microscaling float
  // mode, quant/microscaling.h; bits and group_size must then be the mode's).
  models::QuantMode mode = models::QuantMode::kAffine;
  std::vector<PlanEntry> plan;
  std::vector<std::string> keep;           // module paths (exact, dotted suffix, or fnmatch glob)
  std::map<std::string, int> module_bits;  // per-module width overrides (mixed precision)
  uint64_t max_shard_bytes = 5ull << 30;   // greedy shards; one tensor never spans two
  int threads = 0;                         // 0: hardware concurrency
  // Mixed precision (target_bpw > 0): the per-block linears (q/k/v/o/gate/up/down of every
  // layer) get widths from allocate_bits() (allocator.h) over `candidate_bits`; embed_tokens /
  // lm_head keep `bits`. Sensitivities are, by default, the calibration KL of design §4
  // (sensitivity.h); `weight_proxy` uses the cheap relative weight error
  // ||W - deq(quant_b(W))||^2 / ||W||^2 instead (reference "weight-error-proxy"). The table is
  // written to DST/sensitivity.json; `reuse_sensitivity` names an earlier one to use as is (it
  // must match this run's calibration, group size, modules and candidates).
  double target_bpw = 0;
  std::vector<int> candidate_bits = {2, 3, 4, 6, 8};
  bool weight_proxy = false;
  // Calibration KL measured per module and width (kKl, the reference) or per module, scaled to the
  // widths by the module's output error (kFast; sensitivity.h).
  SensitivityMethod sensitivity_method = SensitivityMethod::kKl;
  // Boundary protection of the allocator (§5): the first and last `protect_blocks` blocks weigh
  // x100 in the greedy race; 0 turns it off (small models, where 1 block each side is a large
  // share of the network).
  int protect_blocks = 1;
  CalibrationOptions calibration;
  std::string reuse_sensitivity;
  // --rotate: fold the norms and a randomized Hadamard rotation into the weights first
  // (rotate.h, design §6); everything after (sensitivity, quantization) sees the rotated model.
  // The rotated full-precision copy lives inside the partial output directory until the end.
  bool rotate = false;
  RotateOptions rotation;
  // Progress: (modules done, modules total, current module) — called before each module.
  std::function<void(size_t, size_t, const std::string&)> progress;
};

struct ConvertReport {
  size_t n_quantized = 0, n_kept = 0, n_passthrough = 0, n_shards = 0;
  uint64_t quantized_params = 0, total_params = 0, out_bytes = 0;
  double nominal_bpw = 0;  // sum bits*params / sum params over quantized modules
  double stored_bpw = 0;   // nominal + 32 / group_size (16-bit scale + bias per group), quantized modules
  double seconds = 0;
  double allocated_bpw = 0;  // mixed precision: the allocator's nominal bpw over the probed modules
  double sensitivity_seconds = 0;
  int64_t sensitivity_forwards = 0;  // calibration forwards run (0 for the proxy or a reused table)
  bool sensitivity_reused = false;
  bool rotated = false;
  RotateReport rotation;
};

// Module path -> whether its weight would be quantized (2-D float `.weight`, divisible last dim),
// and its [rows, cols]. Listed in sorted order. Used by the allocator's sensitivity proxy.
struct ModuleInfo {
  std::string path;
  int64_t rows = 0, cols = 0;
};

Result<ConvertReport> quantize_checkpoint(const std::string& src_dir, const std::string& dst_dir,
                                          const ConvertOptions& opts);

// Does `module` match a --keep entry?
bool keep_matches(const std::vector<std::string>& keep, const std::string& module);

// A plan file: a JSON object {pattern: false | true | {"mode", "bits", "group_size"}} in priority
// order. In an object, a missing mode is `defaults`' mode; missing bits / group_size are the
// defaults' when the mode is theirs, else that mode's own (mlx's _defaults_for_mode). `true` is
// `defaults`. Errors name the file and the entry.
Result<std::vector<PlanEntry>> read_quant_plan(const std::string& path, const models::AffineParams& defaults);

// Whether `p` is a quantization larder writes and mlx-lm reads (affine: bits 2–8 and group
// 32/64/128; a microscaling mode: its one (bits, group)), for a matrix of `cols` columns.
Status check_quant_params(const models::AffineParams& p, int64_t cols);

}  // namespace larder::quant
