// model.h — the interface every architecture implements, and the one way to load a model.
//
// A Model holds weights (views into the mapped files) and scratch buffers; it keeps no state
// across requests: a sequence's state is its KvCache, owned by the caller (runtime/).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "larder/core/status.h"
#include "larder/formats/model_files.h"
#include "larder/memory/kv_cache.h"

namespace larder::models {

struct ModelInfo {
  std::string architecture;  // HF model_type / GGUF general.architecture ("llama", "qwen3", ...)
  int64_t n_layers = 0, hidden = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  int64_t max_context = 0;
  double rope_theta = 0;
  bool tied_embeddings = false;
  std::string weight_dtypes;  // e.g. "BF16" or "Q4_0+F32" (distinct dtypes of the bound matrices)
  int64_t n_params = 0;
  std::vector<int32_t> eos_ids;
  std::optional<int32_t> bos_id;
};

// One sequence's part of a batched forward (continuous batching, server-api.md / system.md §4):
// its new tokens, its cache, and where its logits go (last token only, or every token).
struct BatchItem {
  const int32_t* tokens = nullptr;
  int64_t n = 0;
  memory::KvCache* cache = nullptr;
  float* logits = nullptr;  // [vocab] or, with logits_all, [n, vocab]
  bool logits_all = false;
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
  virtual memory::KvLayout kv_layout() const = 0;

  // Runs tokens[0..n) at positions cache.length() .. cache.length()+n-1, appends their K/V to
  // the cache, and writes logits for the last token only (logits_all = false → out[vocab]) or for
  // every token (out[n, vocab]). Fails cleanly (cache untouched) on token ids outside the vocab
  // or a sequence longer than the context / the cache's capacity.
  Status forward(const int32_t* tokens, int64_t n, memory::KvCache& cache, float* logits, bool logits_all) {
    const BatchItem one{tokens, n, &cache, logits, logits_all};
    return forward_batch(std::span<const BatchItem>(&one, 1));
  }

  // Several sequences in one forward: every weight matrix is streamed once for all their rows
  // (the point of batching on a bandwidth-bound decode), attention runs per sequence over its
  // own cache. Each item's result equals its forward() alone up to floating-point summation
  // order inside the matmul kernels (the row count changes which kernel path runs). Every item
  // is validated before any cache is touched; on error no cache changes. Caches must be
  // distinct objects.
  virtual Status forward_batch(std::span<const BatchItem> items) = 0;
};

}  // namespace larder::models
