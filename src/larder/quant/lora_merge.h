// lora_merge.h — `larder quantize SRC OUT --lora PATH[:SCALE]` (issue 45 item 4): the adapters
// merged into a full-precision copy of the base before it is quantized, so a merged checkpoint
// needs no adapter at run time.
//
// Each adapted projection's weight becomes W' = W + Σ s·B·A over the adapters in canonical order
// (models::canonical_lora_uses, the order the run-time hook sums them in), with s = the request's
// scale × the adapter's own factor as an f32 product — exactly the factor the run-time path
// applies (PEFT lora_alpha / r or / √r under rsLoRA with its rank/alpha patterns, mlx-lm's
// `scale`, GGUF alpha / r). The sum is taken in double and rounded to f32 once, so W' is the
// exact merge to within one f32 rounding; it is written as F32 (a bf16/f16 base's other tensors
// stay as stored). The run-time path computes x·Wᵀ + s·B(A x) in f32 instead, so logits of the
// merged model differ from the adapter's at run time by f32 rounding only.
//
// The source is an HF safetensors directory; adapters are validated against it first
// (LoraAdapter::validate: shapes, modules, row order — a GGUF LoRA is refused where llama.cpp
// permuted its rows, e.g. llama's Q/K, and merges like the PEFT form elsewhere).
#pragma once

#include <span>
#include <string>

#include "larder/core/status.h"
#include "larder/models/lora.h"

namespace larder::quant {

struct LoraMergeReport {
  size_t merged_tensors = 0;  // projection weights rewritten
  size_t copied_tensors = 0;  // everything else, byte for byte
};

// Writes DST (must not exist; published atomically like quantize's outputs): SRC's safetensors
// with the adapters merged, config.json and the tokenizer/template files copied. Warnings of the
// validation (a base model name that differs) are appended to `warnings`.
Result<LoraMergeReport> merge_lora_checkpoint(const std::string& src_dir, const std::string& dst_dir,
                                              std::span<const models::LoraUse> uses,
                                              std::vector<std::string>* warnings);

}  // namespace larder::quant
