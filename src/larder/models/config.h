// config.h — architecture hyper-parameters, from a Hugging Face config.json or GGUF metadata.
//
// One struct for the whole decoder-only family; architecture files set defaults and flags that
// the source leaves implicit (e.g. whether embeddings are tied when the config does not say).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "larder/core/status.h"
#include "larder/formats/gguf.h"
#include "larder/formats/model_files.h"

namespace larder::models {

struct RopeScaling {
  std::string type;  // "" or "default": none; "llama3"; "linear"; "yarn"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
  // yarn (gpt-oss; transformers `_compute_yarn_parameters`, mlx-lm `YarnRoPE`): the correction
  // range from beta_fast / beta_slow rotations, floored/ceiled unless `truncate` is false
  // (transformers' key; mlx-lm and llama.cpp always truncate), and the attention factor:
  // `attention_factor` if given, else 0.1·mscale·ln(factor) + 1 over the same with mscale_all_dim
  // (both given), else 0.1·ln(factor) + 1.
  double beta_fast = 32.0, beta_slow = 1.0;
  bool truncate = true;
  std::optional<double> attention_factor, mscale, mscale_all_dim;
};

// MLX affine group quantization (quantization.md §2, §3): config.json's `quantization` block
// (or its `quantization_config` twin). Which modules are quantized is resolved per module path
// by the weight binder (models/weights.h, §3.2): an entry here decides; otherwise a module is
// quantized with the top-level parameters iff the checkpoint holds `<module>.scales`.
// The block's `mode` (mlx.core.quantize's): "affine" (codes + scales/biases), or one of the
// microscaling float modes (kernels/microscaling.h), each with its one (bits, group_size):
// "mxfp4" (4, 32), "nvfp4" (4, 16), "mxfp8" (8, 32) — U8 scales and no biases.
// `quantization_config: {"quant_method": "mxfp4", ...}` (OpenAI's gpt-oss checkpoints) reads as a
// top-level mxfp4 block, as mlx-lm reads it; every other quant_method is refused.
enum class QuantMode { kAffine, kMxfp4, kNvfp4, kMxfp8 };
const char* quant_mode_name(QuantMode m);  // "affine", "mxfp4", ...
// The mode of a name, or nullopt.
std::optional<QuantMode> quant_mode_from_name(std::string_view name);
// mlx's default (group_size, bits) of a mode (nn.quantize's _defaults_for_mode).
int quant_mode_default_bits(QuantMode m);
int quant_mode_default_group(QuantMode m);

struct AffineParams {
  int bits = 4;         // affine: 2, 3, 4, 5, 6, 8
  int group_size = 64;  // affine: 32, 64, 128
  QuantMode mode = QuantMode::kAffine;
  bool operator==(const AffineParams&) const = default;
};

struct QuantizationConfig {
  bool present = false;  // the config has a quantization block
  // OpenAI's form names its method instead of giving bits ("mxfp4": gpt-oss, the experts only).
  bool openai_mxfp4 = false;
  AffineParams global;
  // Per-module overrides by module path ("model.layers.0.mlp.down_proj"): params, or nullopt
  // for `false` (left unquantized). `true` is stored as the top-level params.
  std::map<std::string, std::optional<AffineParams>> modules;
};

// Parses the block of an HF/MLX config.json (null-safe: no block → present = false). Errors
// (unsupported mode, bits, group size, quant_method; malformed entries) name the file and key.
Result<QuantizationConfig> quantization_from_config(const nlohmann::ordered_json& config, const std::string& src);

// A routed mixture-of-experts FFN (families read their own keys into it: Qwen3-MoE's
// num_experts / num_experts_per_tok / moe_intermediate_size / norm_topk_prob and which layers stay
// dense, GGUF's expert_count / expert_used_count / expert_feed_forward_length). n_experts == 0:
// every layer dense.
struct MoeConfig {
  int64_t n_experts = 0, n_used = 0, ffn = 0;
  bool norm_topk_prob = false;
  std::vector<bool> routed;  // per layer: routed experts (else the dense MLP of ModelConfig::ffn)
};

struct ModelConfig {
  std::string architecture;
  std::string source;  // config.json path or .gguf path (for messages)
  bool from_gguf = false;
  int64_t n_layers = 0, hidden = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  int64_t max_context = 0;
  double rms_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t rope_dim = 0;  // dims rotated per head (== head_dim unless partial rotary)
  RopeScaling rope_scaling;
  std::optional<bool> tied_embeddings;  // unset: the architecture's default (or GGUF: tensor presence)
  bool attention_bias = false;
  bool mlp_bias = false;
  std::vector<int32_t> eos_ids;
  std::optional<int32_t> bos_id;
  QuantizationConfig quantization;  // HF/MLX only; GGUF block types are tensor dtypes instead
  MoeConfig moe;
};

// Architecture name alone (model_type or general.architecture), for the registry.
Result<std::string> architecture_of(const formats::ModelFiles& files);

// Parses the hyper-parameters common to the Llama-style family. Missing required keys, non-positive
// sizes and inconsistent heads (n_heads % n_kv_heads) are errors naming the file and key.
Result<ModelConfig> config_from_hf(const formats::ModelFiles& files);
// The same over a given JSON object (an architecture's view of config.json: e.g. Gemma 3's
// text_config with the family's defaults filled in). eos ids are still read from `files`'
// generation_config; model_type from files.config.
Result<ModelConfig> config_from_hf_json(const formats::ModelFiles& files, const nlohmann::ordered_json& j);
Result<ModelConfig> config_from_gguf(const formats::GgufFile& g);
Result<ModelConfig> config_from_files(const formats::ModelFiles& files);

// Routed experts on every layer from GGUF metadata (c->moe): <arch>.expert_count and
// expert_used_count, required with 1 <= used <= count, and expert_feed_forward_length, which
// where absent is feed_forward_length itself (kWhole: gpt-oss's is each expert's) or that split
// over the experts a token uses (kPerUsed: llama.cpp's qwen3moe fallback).
enum class ExpertFfnDefault { kWhole, kPerUsed };
Status moe_from_gguf(const formats::GgufFile& g, ExpertFfnDefault ffn_default, ModelConfig* c);

}  // namespace larder::models
