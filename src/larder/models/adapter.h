// adapter.h — what a per-request low-rank adapter (LoRA, issue 45) is to the model layer: a delta
// per projection, and which rows of a forward carry which adapters. Loading adapter files (PEFT,
// mlx-lm, GGUF LoRA) lives above this; here is only the seam every projection applies
// (blocks/projection.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "larder/kernels/lora.h"

namespace larder::models {

// One projection's low-rank update: ΔW = scale · B·A, so y += scale · B(A x) per row that carries
// it. The factors are kernels::LoraFactors — A [rank, in] and B in output panels, in the adapter
// file's dtype (F32, BF16 or F16; never widened in RAM) — owned by whoever loaded the adapter (it
// outlives every forward using it).
struct LowRankDelta {
  kernels::LoraFactors f;  // f.rank 0: the adapter leaves this projection alone
  float scale = 1.0f;      // the adapter's own scale (lora_alpha / r, or / √r under rsLoRA)
  int64_t rank() const { return f.rank; }
};

// One loaded adapter as the model sees it: its delta per projection id, indexed like
// Model::projections() (missing or rank 0 where it does not touch a projection).
struct Adapter {
  std::vector<LowRankDelta> deltas;
  const LowRankDelta* find(int projection_id) const {
    if (projection_id < 0 || static_cast<size_t>(projection_id) >= deltas.size()) return nullptr;
    const LowRankDelta& d = deltas[static_cast<size_t>(projection_id)];
    return d.f.rank > 0 ? &d : nullptr;
  }
};

// A request's use of an adapter (llama-server's per-request `lora` list: id + scale).
struct AdapterUse {
  const Adapter* adapter = nullptr;
  float scale = 1.0f;  // multiplies the adapter's own scale
};

// Rows [row0, row0 + n) of one projection call carry `adapter` at `scale`. Runs may overlap
// (several adapters on one row add up); rows no run covers get the base projection alone, bit for
// bit. A batched forward makes one run per (sequence, adapter), so rows of one call may carry
// different adapters or none.
struct AdapterRun {
  int64_t row0 = 0, n = 0;
  const Adapter* adapter = nullptr;
  float scale = 1.0f;
};
using AdapterRows = std::span<const AdapterRun>;

// One entry of a model's projection table (Model::projections()): what an adapter loader matches
// its modules against. `name` is the canonical Hugging Face module name ("model.layers.3.self_attn.
// q_proj", "lm_head"), the key PEFT and mlx-lm adapters use; out/in are the logical shape.
struct ProjectionInfo {
  std::string name;
  int64_t out = 0, in = 0;
};

}  // namespace larder::models
