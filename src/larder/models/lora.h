// lora.h — LoRA adapters (issue 45): PEFT directories, mlx-lm adapters and llama.cpp GGUF LoRA
// files loaded into one in-memory form, validated against a base model.
//
// Every format becomes, per adapted projection (layer index, module kind):
//   A [rank × in], B [out × rank] (kernels::LoraFactors: B in output panels), scale
// so that the projection's output row gains scale · B (A x) — the per-row hook of the single
// projection type every linear layer runs through. `scale` is the adapter's own factor (PEFT
// lora_alpha / r, or lora_alpha / √r with rsLoRA, per-module rank/alpha patterns applied;
// mlx-lm's `scale`; GGUF adapter.lora.alpha / r, or 1 without alpha, as llama.cpp does); a
// request's scale multiplies it.
//
// Orientation per format (all converted to the one above once, at load):
//   PEFT   `…<module>.lora_A.weight` [r, in], `…lora_B.weight` [out, r]     (torch nn.Linear)
//   mlx-lm `…<module>.lora_a` [in, r], `…lora_b` [r, out]                  (x @ lora_a @ lora_b)
//   GGUF   `blk.N.<name>.weight.lora_a` ne [in, r], `.lora_b` ne [r, out]  (shape [r, in], [out, r])
// The factors keep the file's dtype (F32, BF16 or F16; a pair of two different dtypes becomes
// f32): A stays in the mapping where the file has it as [r, in] (PEFT, GGUF), mlx-lm's is
// transposed into memory the adapter owns; B is always re-laid into output panels there (what
// makes the forward's second product a streaming multiply-add, kernels/lora.h). Nothing is
// widened in RAM: a 16-bit adapter costs its file's bytes.
//
// Row order: A/B are in the order of the file they came from. llama.cpp's converter permutes
// rows of some projections (Llama Q/K for its interleaved RoPE, Qwen3.5's DeltaNet value heads)
// in the base GGUF and in a GGUF LoRA alike, so a GGUF adapter matches a GGUF base and a
// PEFT/mlx adapter an HF/MLX base; validate() refuses the mixed pairs where the orders differ.
//
// Use (runtime/adapters.h does this for the CLI and the server):
//   auto base = BaseProjections::from_files(files);            // once per model (headers only)
//   auto ad = LoraAdapter::load("adapters/pirate");             // PEFT dir, mlx-lm dir or .gguf
//   std::vector<std::string> warnings;
//   Status st = ad.value()->validate(base.value(), &warnings);  // errors name the projection
//   auto bound = bind_lora(ad.value(), model.projections());    // deltas by projection id
//   auto fwd = forward_adapter_uses({{ad.value(), 0.8f}, ...}, {bound.value()});  // canonical order
//   BatchItem{..., .adapters = fwd.value()}                      // the rows of one request
//   runtime::lora_namespace(uses) → the request's KV namespace
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "larder/core/status.h"
#include "larder/formats/model_files.h"
#include "larder/models/adapter.h"

namespace larder::models {

// The projections an adapter may target. Attention (q/k/v/o), gated MLP (gate/up/down) and the
// Gated DeltaNet mixer of hybrid Qwen3.5 layers (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a,
// out_proj). Embeddings, lm_head and routed experts are not projections of this kind and are
// refused by name.
enum class LoraModule : uint8_t {
  kQ, kK, kV, kO,
  kGate, kUp, kDown,
  kDeltaQkv, kDeltaZ, kDeltaB, kDeltaA, kDeltaOut,
};
inline constexpr int kLoraModuleCount = 12;

// The module's path inside an HF layer ("self_attn.q_proj"), and its GGUF fragment ("attn_q").
std::string_view lora_module_hf(LoraModule m);
std::string_view lora_module_gguf(LoraModule m);
// "layers.3.self_attn.q_proj": how errors name a projection.
std::string lora_projection_name(int layer, LoraModule m);

enum class LoraFormat : uint8_t { kPeft, kMlx, kGguf };
const char* lora_format_name(LoraFormat f);

// Row/column order of the file a base or an adapter comes from (see the header comment).
enum class WeightOrder : uint8_t { kHf, kGguf };

// One adapted projection. a/b point into the adapter (its mapping or its own buffers) and live
// as long as it does.
struct LoraProjection {
  int layer = 0;
  LoraModule module = LoraModule::kQ;
  int64_t rank = 0, in = 0, out = 0;
  kernels::LoraFactors f;    // A and B as the forward reads them (f.a_at / f.b_at: values as f32)
  float scale = 1.0f;        // the adapter's own factor; the request's scale multiplies it
  std::string source;        // the tensor name in the file (lora_A / lora_a), for messages
};

// What validation compares an adapter with: the base model's architecture, names and, per
// (layer, module), the projection's [out, in].
struct BaseProjections {
  std::string path;          // the model directory / .gguf (messages)
  std::string architecture;  // HF model_type or GGUF general.architecture
  std::vector<std::string> names;  // what the base calls itself: HF repo id from the path or
                                   // `_name_or_path`, GGUF general.name / basename
  WeightOrder order = WeightOrder::kHf;
  int n_layers = 0;
  struct Shape {
    int64_t out = 0, in = 0;
  };
  // [layer * kLoraModuleCount + module]; out == 0: the layer has no such projection.
  std::vector<Shape> shapes;

  const Shape* find(int layer, LoraModule m) const;
  // From the base's files (headers only): MLX-quantized matrices' input width from the packed
  // codes and the config's quantization block, GGUF from ggml's ne[].
  static Result<BaseProjections> from_files(const formats::ModelFiles& files);
};

class LoraAdapter {
 public:
  // A PEFT directory (adapter_config.json + adapter_model.safetensors), an mlx-lm adapter
  // directory (adapter_config.json + adapters.safetensors), or a GGUF LoRA file. Reads and
  // checks the files only; validate() checks them against a base.
  static Result<std::shared_ptr<const LoraAdapter>> load(const std::string& path);

  const std::string& path() const { return path_; }
  LoraFormat format() const { return format_; }
  WeightOrder order() const { return format_ == LoraFormat::kGguf ? WeightOrder::kGguf : WeightOrder::kHf; }
  // PEFT base_model_name_or_path / mlx-lm `model` / GGUF general.name-ish; "" if not given.
  const std::string& base_model() const { return base_model_; }
  // GGUF general.architecture; "" for PEFT and mlx-lm (they do not record one).
  const std::string& architecture() const { return architecture_; }

  // Sorted by (layer, module); at most one per pair.
  std::span<const LoraProjection> projections() const { return projections_; }
  const LoraProjection* find(int layer, LoraModule m) const;
  int64_t max_rank() const;

  // 32 hex digits of XXH3-128 over what the adapter computes — every projection's (layer,
  // module, rank, in, out, scale, A, B) as f32 — not over file names or bytes: a renamed or
  // re-saved copy (another format, same values) has the same hash; any changed value a new one.
  const std::string& content_hash() const { return content_hash_; }

  // Checks every projection against the base: the layer and module exist there, A takes the
  // projection's inputs and B gives its outputs, row orders agree. Errors name the projection
  // ("layers.3.self_attn.q_proj: lora_A is 8×1024 but the model's q_proj takes 576 inputs").
  // A differing architecture (where the adapter records one) is an error; a base model name
  // that does not match is a warning, appended to `warnings`.
  Status validate(const BaseProjections& base, std::vector<std::string>* warnings) const;

  LoraAdapter(const LoraAdapter&) = delete;
  LoraAdapter& operator=(const LoraAdapter&) = delete;
  ~LoraAdapter();

 private:
  LoraAdapter();
  friend struct LoraBuilder;

  std::string path_;
  LoraFormat format_ = LoraFormat::kPeft;
  std::string base_model_, architecture_;
  int mlx_num_layers_ = -1;  // mlx-lm num_layers: only the last N layers may be adapted (-1: all)
  std::vector<LoraProjection> projections_;
  std::string content_hash_;
  // Keeps the mapping alive (A points into it where the file's layout is the forward's) and owns
  // converted data (B's panels, transposed or widened A).
  std::shared_ptr<void> mapping_;
  std::vector<std::unique_ptr<uint8_t[]>> owned_;
};

// One adapter as a request uses it.
struct LoraUse {
  std::shared_ptr<const LoraAdapter> adapter;
  float scale = 1.0f;  // the request's scale (llama-server's per-request `lora` list, `PATH:SCALE`)
};

// The canonical form of a request's adapter list: entries with scale 0 (no effect) dropped, the
// rest sorted by (content hash, scale). Summing the deltas commutes in exact arithmetic but not
// in f32, so the projection hook must apply them in this order: then the same set in any order
// computes the same bits, and may share one KV namespace (runtime::lora_namespace).
std::vector<LoraUse> canonical_lora_uses(std::vector<LoraUse> uses);

// An adapter bound to one model: the loaded file (content hash → KV namespace) and the forward's
// form of it — its deltas indexed by the model's projection table (Model::projections()), what
// BatchItem::adapters points at. `adapter`'s matrices point into `lora`, which this keeps alive.
struct BoundLora {
  std::shared_ptr<const LoraAdapter> lora;
  Adapter adapter;
};

// Binds `lora` to a model's projections: each (layer, module) of the adapter to the projection
// named "…layers.N.<module>" (the canonical HF names every format binds under; vision/audio
// towers' layers are not the text model's). Errors name the projection the model lacks or whose
// shape differs — validate() catches these first; this is the check at the seam itself.
Result<std::shared_ptr<const BoundLora>> bind_lora(std::shared_ptr<const LoraAdapter> lora,
                                                   std::span<const ProjectionInfo> projections);

// A request's adapters as the forward takes them: `uses` made canonical (canonical_lora_uses: the
// order the deltas are summed in, so one set in any order gives the same bits), each mapped to its
// bound form in `bound` (matched by the LoraAdapter it holds). internal error for a use whose
// adapter `bound` lacks.
Result<std::vector<AdapterUse>> forward_adapter_uses(std::vector<LoraUse> uses,
                                                     std::span<const std::shared_ptr<const BoundLora>> bound);

// A `--lora` argument: `PATH[:SCALE]` (generate, chat, eval) or `NAME=PATH[:SCALE]` (serve, with
// `named`). SCALE is the text after the last ':' when it is a whole finite number (default 1);
// otherwise the ':' belongs to the path. Errors say which part is wrong.
struct LoraSpec {
  std::string name;  // serve: what requests pick it by (`model`, the `lora` list); "" otherwise
  std::string path;
  float scale = 1.0f;
};
Result<LoraSpec> parse_lora_spec(std::string_view arg, bool named);

}  // namespace larder::models
