// fit.h — "will it fit?" before any weight is read: the memory a model needs at a context and
// parallelism, against the memory this process may use, so a context that does not fit is a
// message up front instead of the OOM killer halfway through a prompt.
//
// The estimate (bytes):
//   weights    every tensor of the files (mapped; the first forward pages them in): a mixture of
//              experts counts every expert, since a run touches them all over time; what one
//              decode token reads (the k of E experts it is routed to) is `weights_per_token`. An untied
//              embedding table is read only at the rows of the tokens seen, so a model whose
//              untied embedding is most of its size measures less (tests/fit: the 64-wide test
//              model with a 128k vocabulary, +11 %); real models are within a few %.
//   kv         parallel × (ctx × the plain layers' K/V row bytes + the fixed state: sliding-window
//              rings at their window, recurrent states), from the model's StateSchema (so Gemma's
//              rings and Gemma 4's KV-sharing layers are counted as what they hold), the plain
//              rows in the schema's KV dtype (4 bytes per element for f32, 2 for f16, 34/32 q8_0)
//   scratch    one forward of min(ctx, prefill_rows) tokens: residual/attention/MLP activations
//              and the logits (models/decoder.cpp, blocks/*.cpp)
//   runtime    the process itself (binary, libraries, threads, allocator; ~20 MiB measured with
//              a 1 MB model) plus the tokenizer (~100 bytes per vocabulary entry, measured on
//              32k-128k vocabularies)
//   kv store   the RAM tier's cap (--prompt-cache), a ceiling reached only over time
// Available: /proc/meminfo MemAvailable, lowered to the cgroup's memory.max - memory.current
// when a limit is set; LARDER_MEMORY_LIMIT (bytes, or with K/M/G suffix) overrides both.
#pragma once

#include <cstdint>
#include <string>

#include "larder/core/status.h"
#include "larder/models/model.h"

namespace larder::runtime {

struct FitRequest {
  int64_t ctx = 4096;         // tokens per sequence
  int64_t parallel = 1;       // sequences held at once
  int64_t prefill_rows = 512;  // tokens per forward (prefill chunk / server step)
  uint64_t kv_store_ram_cap = 0;
};

struct FitEstimate {
  uint64_t weights = 0, kv = 0, scratch = 0, runtime = 0, kv_store_cap = 0;
  // Mixtures of experts: the bytes of all routed experts (part of `weights`), and the weight bytes
  // one decode token reads — `weights` less the experts it is not routed to (k of E per layer).
  uint64_t expert_bytes = 0, weights_per_token = 0;
  uint64_t kv_per_token = 0;  // one sequence, the layers whose state grows per token
  uint64_t kv_fixed = 0;      // one sequence, the layers whose state does not (rings, recurrent)
  DType kv_dtype = DType::kF32;  // of the plain KV rows (the model's StateSchema; the CLI's default is f16)
  uint64_t fixed() const { return weights + scratch + runtime; }  // everything but the KV
  uint64_t total() const { return weights + kv + scratch + runtime; }  // without the store's cap
};

FitEstimate estimate_fit(const models::Model& model, uint64_t weight_bytes, const FitRequest& req);

struct MemoryAvailable {
  uint64_t bytes = 0;
  std::string source;  // "MemAvailable", "cgroup memory.max", "LARDER_MEMORY_LIMIT"
};
MemoryAvailable available_memory();

// "8G", "512M", "1048576" (K/M/G/T are powers of 1024) -> bytes; 0 when malformed.
uint64_t parse_bytes(const std::string& s);

// The verdict: ok (possibly with the KV store's cap lowered to fit), or a resource_exhausted
// Status that says what would fit (a smaller --ctx, or fewer --parallel).
struct FitVerdict {
  Status status;                 // ok or resource_exhausted with the advice
  uint64_t kv_store_cap = 0;     // the cap to use (<= requested)
  std::string note;              // set when the cap was lowered
};
FitVerdict check_fit(const FitEstimate& est, const FitRequest& req, const MemoryAvailable& avail);

// estimate_fit + available_memory + check_fit: the check a verb runs after mapping a model and
// before its first forward.
FitVerdict check_model_fit(const models::Model& model, uint64_t weight_bytes, const FitRequest& req);

// Human-readable table of the estimate (for `larder info`).
std::string describe_fit(const FitEstimate& est, const FitRequest& req, const MemoryAvailable& avail);

}  // namespace larder::runtime
