// sensitivity.h — per-module quantization sensitivity from calibration text
// (shared/design/quantization.md §4), the input of the mixed-precision allocator (allocator.h).
//
// For every probed module (the per-block linears) and every candidate width b: quantize →
// dequantize that module's weight alone at b (affine, the output's group size), swap it into
// the otherwise unmodified model, run every calibration sample as one full-sequence forward and
// measure KL(reference ‖ modified) of the next-token distributions (runtime/eval.h), averaged over positions and
// then over samples. The reference is the source model itself at its stored precision (the
// "bf16 reference" of §4). The swap is a TensorSet overlay: the model is re-bound over the same
// mapped files with one tensor pointing at an in-memory f32 copy, so no weights are copied.
//
// Cost: probed modules × candidates × samples forwards of seq_len tokens — minutes for small
// models, hours for 1B-class ones at the defaults on 2 cores. SensitivityMethod::kFast below
// runs one forward per module instead of one per module and width; the weight-error proxy
// (convert.h, `--sensitivity proxy`) runs none but ranks modules unlike KL.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "larder/core/status.h"
#include "larder/formats/model_files.h"
#include "larder/quant/allocator.h"
#include "larder/tokenizer/tokenizer.h"

namespace larder::quant {

// The built-in multi-domain calibration corpus (calibration_text.cpp).
const char* builtin_calibration_text();

struct CalibrationOptions {
  std::string file;  // empty: the built-in corpus. *.jsonl (or a file whose lines are JSON objects): one sample per line
                     // with "text", or "messages" flattened as "[role]: content" joined by a blank line; else plain text
  int64_t seq_len = 256;
  int64_t n_samples = 8;
  uint64_t seed = 42;
};

struct CalibrationSet {
  std::vector<std::vector<int32_t>> samples;  // n_samples sequences of seq_len tokens
  std::string source;                         // "builtin" or the file path
  std::string digest;                         // xxh64 of the source bytes, hex
  int64_t stream_tokens = 0;  // BOS included
  int64_t seq_len = 0;
  uint64_t seed = 0;
  std::optional<int32_t> bos;  // the tokenizer's added BOS: the stream's and every sample's first token
};

// Reads the calibration texts (file or built-in).
Result<std::vector<std::string>> read_calibration_texts(const CalibrationOptions& opts, std::string* digest = nullptr);

// Tokenizes without special tokens, concatenates into one stream after the BOS the tokenizer
// adds (runtime::added_bos; none for SmolLM2/Qwen), cuts chunks of seq_len at offsets 0, L, 2L,
// ... while start < total - L, shuffles the starts with a splitmix64-driven Fisher-Yates (seed),
// keeps the first n_samples and overwrites each one's first token with that BOS — the streams
// and chunks of `larder eval` (runtime/eval.h). Error if the stream is shorter than seq_len.
Result<CalibrationSet> load_calibration(const tokenizer::Tokenizer& tok, const CalibrationOptions& opts);

// The start offsets chosen for a stream of `total` tokens (exposed for tests).
std::vector<int64_t> calibration_starts(int64_t total, int64_t seq_len, int64_t n_samples, uint64_t seed);

// How a module's sensitivity is measured.
//  kKl   — the reference: one full forward of the calibration set per module and candidate width,
//          KL(source ‖ module quantized alone) (the cost above).
//  kFast — one calibration forward per module, not per width: a capture forward of the source
//          model records, for every module and width b, the output error the quantized weight
//          would add to that module's matmul on its real calibration inputs,
//          e_m(b) = Σ_tokens ‖x·(W − deq_b(W))ᵀ‖²; then one KL probe per module at a single
//          width p (the rest of the model run once per module) gives its downstream gain, and
//          KL_m(b) ≈ KL_m(p) · e_m(b) / e_m(p) — KL is second order in a small perturbation, so
//          proportional to its squared size along a fixed direction. Exact at b = p; the other
//          widths assume the error's direction is the same at every width. Forwards are batched
//          (several samples per call). modules + 2 forwards of the calibration set instead of
//          modules × widths + 1.
enum class SensitivityMethod { kKl, kFast };

struct SensitivityOptions {
  std::vector<int> candidates = {2, 3, 4, 6, 8};
  int group_size = 64;
  int threads = 0;
  SensitivityMethod method = SensitivityMethod::kKl;
  int probe_bits = 0;  // kFast: the width of each module's one KL probe (0: the lowest candidate)
  // The quantizer whose damage is measured: `out` (w's shape, f32) = deq(quant_bits(w)) for
  // module `module`. Unset: MLX affine at group_size (fake_quantize_affine). GGUF export sets
  // the block type it would write at that width.
  std::function<Status(const std::string& module, const formats::TensorInfo& w, int bits, float* out)> fake_quant;
  // Optional: which quantizer fake_quant applies to `w` at width `bits`. Widths with equal ids
  // quantize identically (GGUF: 2–4 bits are all IQ4_NL on rows 256 does not divide), so their
  // damage is measured once and copied — the same numbers, fewer quantizations and probes.
  // Unset: every width its own quantizer.
  std::function<int64_t(const formats::TensorInfo& w, int bits)> quantizer_id;
  // (probes done, probes total, "module @ b bits").
  std::function<void(size_t, size_t, const std::string&)> progress;
};

struct SensitivityResult {
  std::vector<ModuleSensitivity> table;  // the input modules, kl filled per candidate
  nlohmann::ordered_json report;         // sensitivity.json ("larder-sensitivity-1")
  int64_t forwards = 0;
  double seconds = 0;
};

// `modules`: names (module paths, `<name>.weight` must be a 2-D float tensor) and params; their
// kl maps are ignored and filled in.
Result<SensitivityResult> measure_kl_sensitivity(const formats::ModelFiles& files,
                                                 const std::vector<ModuleSensitivity>& modules,
                                                 const CalibrationSet& calib, const SensitivityOptions& opts);

// A previous sensitivity.json: accepted when its format, method, group size, calibration (digest,
// seq_len, n_samples, seed) and module list match, and it holds every candidate width; errors
// name the mismatch.
Result<std::vector<ModuleSensitivity>> reuse_sensitivity_report(const nlohmann::ordered_json& report,
                                                                const std::vector<ModuleSensitivity>& modules,
                                                                const CalibrationSet& calib, const SensitivityOptions& opts);

}  // namespace larder::quant
