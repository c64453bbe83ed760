// rotate.h — offline rotation folding of a Llama-family HF checkpoint (design/quantization.md §6):
// untie → γ-fold → R1 (randomized Hadamard on the residual stream) → R2 (per-head, v/o), written
// as a new full-precision HF checkpoint that computes the same function. `larder quantize
// --rotate` runs it before quantizing; on its own it is exact up to f32 rounding (and the final
// cast to the output dtype).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "larder/core/dtype.h"
#include "larder/core/status.h"

namespace larder::quant {

struct RotateOptions {
  uint64_t seed = 42;
  bool r1 = true;  // false: γ-fold only (R2 is then skipped too)
  bool r2 = true;  // per-head v/o rotation (Llama family: llama, mistral, qwen2, qwen3)
  DType out_dtype = DType::kUnknown;  // kUnknown: each tensor keeps its source dtype; kF32 for exactness tests
  int threads = 0;                    // 0: hardware concurrency
  uint64_t max_shard_bytes = 5ull << 30;  // greedy shards; one tensor never spans two
  std::function<void(size_t done, size_t total, const std::string& tensor)> progress;
};

struct RotateReport {
  int64_t hidden = 0, head_dim = 0;
  std::string r1_construction, r2_construction;  // e.g. "H_12 (x) H_256" / "H_64"; "none" when off
  bool untied = false;                           // the source was tied; the output has its own lm_head
  std::vector<std::string> deviations;           // §6.6 strings
  double seconds = 0;
};

// src_dir: an HF checkpoint (bf16/f16/f32 safetensors; model_type llama, mistral, qwen2, qwen3, or
// Qwen3.5 — qwen3_5[_text], qwen3_5_moe[_text], HF layout — with the seed's plan: R1 + γ, no R2).
// Writes a full HF checkpoint dir at dst_dir (must not exist; atomic via publish_directory):
// config.json (tie_word_embeddings false; torch_dtype follows out_dtype; a "larder_rotation"
// object with seed, constructions and deviations), the folded tensors in sorted name order, and
// the aux files. One output tensor is materialized at a time (in f32, plus a transpose buffer for
// writers). Refuses a quantized source, an unknown model_type, an unsupported hidden size or
// head_dim, a missing or unexpected tensor; a refusal leaves nothing behind.
Result<RotateReport> rotate_checkpoint(const std::string& src_dir, const std::string& dst_dir,
                                       const RotateOptions& opts);

}  // namespace larder::quant
