// model.h — the interface every architecture implements, and the one way to load a model.
//
// A Model holds weights (views into the mapped files) and scratch buffers; it keeps no state
// across requests: a sequence's state is a memory::SequenceState with one slot per layer, made by
// new_state() and owned by the caller (runtime/, server/, the KV store).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "larder/core/status.h"
#include "larder/formats/model_files.h"
#include "larder/memory/sequence_state.h"
#include "larder/models/adapter.h"
#include "larder/models/layer_spec.h"

namespace larder::models {

struct ModelInfo {
  std::string architecture;  // HF model_type / GGUF general.architecture ("llama", "qwen3", ...)
  int64_t n_layers = 0, hidden = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  int64_t max_context = 0;
  double rope_theta = 0;
  int64_t sliding_window = 0;  // 0: no sliding-window layers
  bool tied_embeddings = false;
  std::string weight_dtypes;  // e.g. "BF16" or "Q4_0+F32" (distinct dtypes of the bound matrices)
  int64_t n_params = 0;
  // Routed experts (0: a dense model): E and k, and the bytes of every MoE layer's experts — all
  // of them (what the mapping holds) and the k of E a token reads (what a decode step streams).
  int64_t n_experts = 0, n_experts_used = 0;
  uint64_t expert_bytes = 0, active_expert_bytes = 0;
  std::vector<int32_t> eos_ids;
  std::optional<int32_t> bos_id;
};

// One sequence's part of a batched forward (continuous batching, server-api.md / system.md §4):
// its new tokens, its state, and where its logits go (last token only, or every token).
struct BatchItem {
  const int32_t* tokens = nullptr;
  int64_t n = 0;
  memory::SequenceState* state = nullptr;
  float* logits = nullptr;  // [vocab] or, with logits_all, [n, vocab]
  bool logits_all = false;
  // Low-rank adapters on this sequence's rows (issue 45): every projection adds their deltas
  // (blocks/projection.h); other items of the batch are unaffected. Empty: the base model.
  std::span<const AdapterUse> adapters = {};
};

class Model {
 public:
  virtual ~Model() = default;

  // Reads the hyper-parameters (config.json or GGUF metadata), picks the architecture from the
  // registry and validates every tensor it needs: present, dtype executable by the active kernel
  // table, shape equal to what the config implies. Errors name the file, tensor, expected and
  // actual values.
  static Result<std::unique_ptr<Model>> load(const formats::ModelFiles& files);

  virtual const ModelInfo& info() const = 0;
  // The layers, in order, and the per-sequence state they need (one slot per layer).
  virtual std::span<const LayerSpec> layers() const = 0;
  virtual const memory::StateSchema& state_schema() const = 0;
  // The dtype the plain layers' KV rows are stored in from now on (f32 — the default of a loaded
  // Model — f16 or q8_0; kernels/ops.h). States made before keep theirs and are refused by
  // forward (a state of another schema). unsupported when the model's head size cannot hold it
  // (q8_0 needs head_dim % 32 == 0), with the reason.
  virtual Status set_kv_dtype(DType dt) = 0;
  // Every projection the forward runs, indexed by Projection::id (what an adapter's deltas are
  // indexed by): its canonical HF module name and shape.
  virtual std::span<const ProjectionInfo> projections() const = 0;
  // Lets forward run up to n positions when n is past the trained context (info().max_context
  // grows to n; no-op otherwise), as llama.cpp runs n_ctx > n_ctx_train with a warning. For speed
  // measurements (`larder bench -d`): what the model computes past its trained context is not
  // meaningful.
  virtual void extend_context(int64_t n) = 0;
  // A fresh sequence state for up to max_tokens tokens (sliding layers hold their window only).
  memory::SequenceState new_state(int64_t max_tokens) const { return memory::SequenceState(state_schema(), max_tokens); }

  // Runs tokens[0..n) at positions state.length() .. state.length()+n-1, adds them to every
  // layer's state, and writes logits for the last token only (logits_all = false → out[vocab]) or
  // for every token (out[n, vocab]). Fails cleanly (state untouched) on token ids outside the
  // vocab, a state of another model's schema, or a sequence longer than the context / the
  // state's capacity.
  // `adapters`: the sequence's low-rank adapters (BatchItem::adapters; empty: the base model).
  Status forward(const int32_t* tokens, int64_t n, memory::SequenceState& state, float* logits, bool logits_all,
                 std::span<const AdapterUse> adapters = {}) {
    const BatchItem one{tokens, n, &state, logits, logits_all, adapters};
    return forward_batch(std::span<const BatchItem>(&one, 1));
  }

  // Several sequences in one forward: every weight matrix is streamed once for all their rows
  // (the point of batching on a bandwidth-bound decode), attention runs per sequence over its
  // own state. Each item's result equals its forward() alone up to floating-point summation
  // order inside the matmul kernels (the row count changes which kernel path runs). Every item
  // is validated before any state is touched; on error no state changes. States must be
  // distinct objects.
  virtual Status forward_batch(std::span<const BatchItem> items) = 0;
};

}  // namespace larder::models
