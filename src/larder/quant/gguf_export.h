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
  // Per-tensor type overrides (GGUF name → type), applied after the recipe (the allocator's plan).
  std::map<std::string, DType> overrides;
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
};

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
