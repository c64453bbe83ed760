// weights.h — binding a model's tensors by Hugging Face name, with shape validation.
//
// Architecture code asks for tensors by their canonical HF name ("model.layers.3.self_attn.q_proj.
// weight") and the shape the config implies; the architecture's TensorNames table translates it
// to the name the file holds (llama.cpp's "blk.3.attn_q.weight" in a GGUF, a text tower's prefix
// in a multimodal checkpoint). Matrices come back as kernels::WeightView into the mapping (no copy);
// 1-D parameters (norm gains, biases: O(hidden) bytes) are converted to f32 once, because every
// kernel consumes them as f32 and they are a rounding error of the model's size.
//
// MLX affine checkpoints (config.json `quantization` block, quantization.md §2–3): a quantized
// module P stores `P.weight` as U32 packed codes [rows, cols·bits/32] and `P.scales`/`P.biases`
// [rows, cols/group_size] (F32/F16/BF16). matrix("P.weight", rows, cols) resolves P's bits and
// group size (§3.2), validates all three tensors and returns an affine WeightView over them.
// The microscaling modes (`mode` "mxfp4" / "nvfp4" / "mxfp8" in the block or a module's entry;
// kernels/microscaling.h) store `P.weight` as U32 codes and `P.scales` U8 [rows, cols/group], no
// biases: the view's dtype is then kMlxMXFP4 / kMlxNVFP4 / kMlxMXFP8 with the scales beside it.
// GGUF MXFP4 tensors (gpt-oss's experts) bind like any GGUF block type: dtype kMXFP4; OpenAI's
// `*_blocks`/`*_scales` experts as kMlxMXFP4 (mxfp4_block_experts).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "larder/core/status.h"
#include "larder/formats/model_files.h"
#include "larder/kernels/ops.h"
#include "larder/models/adapter.h"
#include "larder/models/blocks/projection.h"
#include "larder/models/config.h"
#include "larder/models/tensor_names.h"

namespace larder::models {

class WeightBinder {
 public:
  // `names` must outlive the binder.
  WeightBinder(const formats::ModelFiles& files, const TensorNames& names);

  bool has(const std::string& hf_name) const;
  // A [rows, cols] matrix (logical shape) in any format the active kernel table can execute:
  // plain, GGUF block, or MLX affine (then `<module>.scales`/`.biases` are bound with it).
  Result<kernels::WeightView> matrix(const std::string& hf_name, int64_t rows, int64_t cols, const char* why);
  // A dense projection (blocks/projection.h): `<module>.weight` bound as matrix(), with
  // `<module>.bias` when `bias` is set, registered in the binder's projection table (its id is the
  // table index; the model publishes the table as Model::projections()).
  struct ProjectionSpec {
    std::string module;  // canonical HF module name, "model.layers.3.self_attn.q_proj"
    int64_t out = 0, in = 0;
    const char* why = "";         // what the shape means, for errors ("hidden_size x intermediate_size")
    bool bias = false;
    const char* bias_why = "";    // what the bias length means
  };
  Result<Projection> projection(const ProjectionSpec& spec);
  // A projection over a matrix bound already under another name (a tied lm_head over the token
  // embedding), registered as `name`.
  Projection projection_over(const std::string& name, const kernels::WeightView& w);
  const std::vector<ProjectionInfo>& projections() const { return projections_; }

  // A layer's routed experts: n_experts matrices [rows, cols] of one format, one WeightView each
  // (kernels::ExpertsView over the result), bound in place from whichever layout the file holds.
  struct ExpertsSpec {
    // A canonical HF name of one tensor [n_experts, parts·rows, cols]: MLX `switch_mlp.*.weight`
    // (quantized: U32 codes [E, rows, packed] and `.scales`/`.biases` [E, rows, cols/group_size]);
    // through the TensorNames table a GGUF's `blk.N.ffn_*_exps.weight` (ggml ne [cols, rows, E], any
    // block format); Gemma 4's HF `experts.gate_up_proj` (parts 2). Expert e is the e-th slab.
    std::string stacked;
    // Used where the file has no `stacked` tensor: the name of each expert's own matrix, "{i}" where
    // the index goes (HF: "model.layers.3.mlp.experts.{i}.gate_proj.weight"), each bound as matrix().
    // Empty where the format has no such layout.
    std::string per_expert;
    int n_experts = 0;
    int64_t rows = 0, cols = 0;
    // Matrices fused along rows: the tensor holds `parts` matrices per expert, [parts·rows, cols],
    // and this binds rows [part·rows, (part+1)·rows) of each (Gemma 4's gate_up_proj: gate = part
    // 0, up = part 1).
    int part = 0, parts = 1;
  };
  Result<std::vector<kernels::WeightView>> experts(const ExpertsSpec& spec, const char* why);
  // OpenAI's MXFP4 experts (gpt-oss on Hugging Face; config `quantization_config.quant_method`
  // "mxfp4"): `<module>_blocks` U8 [E, rows, cols/32, 16] — e2m1 codes two per byte, element 2j in
  // the low nibble of byte j — and `<module>_scales` U8 [E, rows, cols/32], e8m0 with bias 127. These
  // are the bytes of MLX's mode "mxfp4" (mlx-lm's sanitize only views the blocks as uint32 and
  // flattens the last two axes), so each expert binds in place as a kMlxMXFP4 view of all `rows`
  // (`module` is e.g. "model.layers.3.mlp.experts.gate_up_proj"; spec.part/parts unused). Any row
  // order the file has is the caller's to undo (gpt-oss interleaves gate and up rows: moe_block's
  // MoeWeights::gate_up).
  Result<std::vector<kernels::WeightView>> mxfp4_block_experts(const std::string& module, int n_experts,
                                                               int64_t rows, int64_t cols, const char* why);
  // A [len] vector in F32/F16/BF16, converted to f32.
  Result<std::vector<float>> vector(const std::string& hf_name, int64_t len, const char* why);
  // A small tensor of logical shape `shape` in F32/F16/BF16, converted to f32 (row-major). The
  // file's shape may differ by dimensions of size 1 (a depthwise conv weight is [C, 1, K] in HF,
  // [C, K, 1] in mlx-lm's saves, [C, K] in a GGUF: the same bytes).
  Result<std::vector<float>> small_f32(const std::string& hf_name, std::vector<int64_t> shape, const char* why);

  // Tensors of the file that nothing bound (file names, in file order).
  std::vector<std::string> unbound() const;
  // Marks the file's tensors whose names start with `file_prefix` as deliberately unused, so they
  // are not reported as unbound (a GGUF's multi-token-prediction blocks past the trunk, "blk.48.").
  void ignore_prefix(const std::string& file_prefix);
  // The file's name of a canonical HF name ("" when a GGUF table has no mapping).
  std::string file_name(const std::string& hf_name) const;
  const TensorNames& names() const { return names_; }

  // Distinct dtypes of the bound matrices ("BF16", "Q4_0+F32"), and the bound element count.
  std::string weight_dtypes() const;
  int64_t n_params() const { return n_params_; }

 private:
  Result<const formats::TensorInfo*> find(const std::string& hf_name);
  Result<std::vector<float>> to_f32(const formats::TensorInfo& t, int64_t len);
  std::string file_of(const formats::TensorInfo& t) const;
  // The affine parameters of module `module` (hf_name without ".weight", `cols` input features),
  // or nullopt: plain (quantization.md §3.2, with mlx-lm's shape inference for modules without
  // an entry).
  Result<std::optional<AffineParams>> affine_params(const std::string& module, int64_t cols) const;
  // The U8 scales tensor of a microscaling-mode module, checked to be [lead..., cols/group_size].
  Result<const formats::TensorInfo*> mx_scales(const std::string& module, const AffineParams& q,
                                               const std::vector<int64_t>& lead, int64_t cols);
  Result<kernels::WeightView> affine_matrix(const formats::TensorInfo& t, const std::string& module,
                                            const AffineParams& q, int64_t rows, int64_t cols, const char* why);

  const formats::ModelFiles& files_;
  const TensorNames& names_;
  Result<QuantizationConfig> quant_;
  std::vector<ProjectionInfo> projections_;
  std::set<std::string> bound_;  // file tensor names
  std::set<std::string> dtypes_;
  int64_t n_params_ = 0;
};

}  // namespace larder::models
