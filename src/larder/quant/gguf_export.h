// gguf_export.h — `larder quantize --format gguf`: an HF checkpoint (llama, qwen2, qwen3) or a
// GGUF file of any architecture larder runs → a GGUF that llama.cpp loads.
//
// HF sources get llama.cpp's architecture name, tensor names (the `llama` table of
// models/llama.cpp), hyper-parameter keys (<arch>.block_count, ...), the Q/K row permutation
// convert_hf_to_gguf applies to `llama` (HF rotates pairs (i, i+d/2), GGUF llama (2i, 2i+1)),
// and the BPE vocabulary as tokenizer.ggml.{model=gpt2, pre, tokens, token_type, merges,
// bos/eos/unknown/padding ids, add_bos_token} plus tokenizer.chat_template. Tied embeddings
// write no output.weight (llama.cpp then uses token_embd). GGUF sources keep every metadata key
// (general.file_type updated) and every tensor name; their tensors are dequantized and
// requantized.
//
// Types: a uniform type (`F32`, `F16`, `BF16`, `Q8_0`, `Q6_K` ... `Q2_K`, `IQ4_XS`, `IQ4_NL`,
// `Q4_0` ...) for every 2-D weight, or a llama.cpp recipe `Q3_K_M` / `Q4_K_M` / `Q5_K_M`
// (llama.cpp's per-tensor rules for dense models, gguf_recipe_type()). Either way a row length not
// a multiple of the type's block falls back as llama.cpp does (Q4_K → Q5_0, Q5_K → Q5_1,
// Q6_K → Q8_0, Q2_K/Q3_K → Q4_0, IQ4_XS → IQ4_NL, then F16). Norms, biases and other 1-D
// tensors are F32.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "larder/core/dtype.h"
#include "larder/core/status.h"
#include "larder/quant/sensitivity.h"

namespace larder::quant {

struct GgufExportOptions {
  std::string type = "Q4_K_M";  // uniform type name or recipe
  // Importance matrix (imatrix.h): `imatrix_file` read (llama-imatrix's GGUF or legacy .dat),
  // or with `calibrate` computed from `calibration` through the source model (and written to
  // `imatrix_out` when set). Without either the quantizers take ggml's unweighted paths.
  std::string imatrix_file, imatrix_out;
  bool calibrate = false;
  CalibrationOptions calibration;
  // Per-tensor type overrides (GGUF name → type), applied after the recipe and the allocation.
  std::map<std::string, DType> overrides;
  // KL-allocated mix (HF sources): with target_bpw > 0 (bits per weight of the tensor data over
  // every tensor, as llama-quantize reports it) or target_bytes > 0 (the whole file), the block
  // weights ("blk.*") get, per tensor, the GGUF type of a width chosen by allocate_bits() from
  // their calibration sensitivities (sensitivity.h, measured with the very quantizer and
  // importance matrix the file is written with), each width priced at its type's stored size
  // (gguf_width_type); tensors outside the blocks (token_embd, output) keep `type`'s rule. The
  // importance matrix comes from `calibration` unless `imatrix_file` is given. The result is the
  // largest allocation whose file does not exceed the target.
  double target_bpw = 0;
  uint64_t target_bytes = 0;
  std::vector<int> candidate_bits = {2, 3, 4, 5, 6, 8};
  SensitivityMethod sensitivity_method = SensitivityMethod::kFast;
  // Allocator boundary protection (convert.h), off by default here: the GGUF sensitivities are
  // measured through the very quantizer and imatrix written, so the first/last blocks already weigh
  // what they cost, and a x100 boost only spends the budget on Q8_0 there. On SmolLM2 at the Q3_K_M
  // size it took 12 % of the block bits and pushed ffn_down to Q3_K/Q2_K: KL 0.0834 with it, 0.0526
  // without (bench/RESULTS.md, session 39).
  int protect_blocks = 0;
  std::string sensitivity_out;      // when set: the sensitivity table and the plan as JSON
  std::string reuse_sensitivity;    // an earlier sensitivity_out of the same calibration and widths: used as is
  std::function<void(size_t, size_t, const std::string&)> progress;
};

struct GgufExportReport {
  size_t n_tensors = 0, n_quantized = 0, n_fallback = 0;
  uint64_t out_bytes = 0, quantized_params = 0, total_params = 0;
  double bpw = 0;  // bits per weight over all tensors (file data / params)
  double seconds = 0;
  std::map<std::string, int> type_counts;  // type name → tensors
  std::string architecture;
  size_t imatrix_tensors = 0;  // tensors quantized with importance weights
  double imatrix_seconds = 0;
  // KL allocation: the block weights' stored bits per weight (target and achieved), the
  // sensitivity measurement's forwards and time.
  double block_target_bpw = 0, block_bpw = 0;
  int64_t sensitivity_forwards = 0;
  double sensitivity_seconds = 0;
};

// The type the KL allocator writes at width `bits` for rows of `cols`: 2 Q2_K, 3 Q3_K, 4 Q4_K,
// 5 Q5_K, 6 Q6_K, 8 Q8_0 when 256 divides cols (the K-quant super-block); otherwise, with 32
// dividing cols, 2–4 IQ4_NL (the best 4.5-bit type with 32-blocks; llama.cpp's own fallback for
// Q2_K–Q4_K there is Q4_0/Q5_0), 5 Q5_0, 6 and 8 Q8_0; F16 when not even 32 does.
DType gguf_width_type(int bits, int64_t cols);

// Is `name` a llama.cpp recipe larder implements ("Q4_K_M", ...)?
bool is_gguf_recipe(const std::string& name);

// The type llama.cpp's recipe gives tensor `gguf_name` (before the block-size fallback).
// `i_layer` / `n_layer`: the tensor's block and the block count; `i_attn_v` / `n_attn_v` the
// index of this attn_v among all attn_v tensors; `tied`: token_embd doubles as the output.
DType gguf_recipe_type(const std::string& recipe, const std::string& gguf_name, int i_layer, int n_layer, bool tied);

// llama.cpp's fallback when `cols` is not a multiple of t's block.
DType gguf_fallback_type(DType t, int64_t cols);

// Does llama.cpp quantize this tensor (2-D, name ends in "weight", not a norm)?
bool gguf_tensor_quantizable(const std::string& gguf_name, size_t rank);

Result<GgufExportReport> export_gguf(const std::string& src, const std::string& dst_file, const GgufExportOptions& opts);

}  // namespace larder::quant
