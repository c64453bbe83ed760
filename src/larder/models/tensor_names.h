// tensor_names.h — an architecture's tensor-name table.
//
// Architecture code binds tensors by canonical Hugging Face names ("model.layers.3.mlp.up_proj.
// weight"). Each architecture file owns the table that maps them to the names a file actually
// holds: llama.cpp's GGUF names ("blk.3.ffn_up.weight" — which GGUF name a role gets is a per-
// architecture convention of llama.cpp's converter, e.g. `ffn_norm` is Llama's post-attention
// norm but Gemma's pre-feedforward norm), and the prefix under which a multimodal checkpoint
// keeps its text tower ("language_model.model.layers.3...").
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace larder::models {

struct TensorNames {
  // Whole names outside the layers: {HF, GGUF}.
  std::vector<std::pair<std::string, std::string>> globals;
  // Name fragments after "model.layers.N." → after "blk.N.": {HF, GGUF}.
  std::vector<std::pair<std::string, std::string>> layer;
  // HF checkpoints: a canonical name starting with `hf_strip` is stored as hf_add + the rest
  // (e.g. strip "" add "language_model." for a multimodal Gemma 3 text tower). Both empty: as is.
  std::string hf_strip, hf_add;

  // The GGUF name of a canonical HF name, "" if the table has none.
  std::string gguf(const std::string& hf) const;
  // The name inside an HF checkpoint.
  std::string hf_file(const std::string& hf) const;
  // The file name of the layer prefix ("model.layers." / "blk."), for leftover checks.
  std::string layer_prefix(bool gguf) const;
};

}  // namespace larder::models
