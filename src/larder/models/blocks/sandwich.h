// sandwich.h — the Gemma-family residual block: attention and MLP each sit between a norm of
// their input and a norm of their output, and only the normed output is added to the residual
// (x += post(attn(pre(x))); x += post(mlp(pre(x)))). Llama norms only the inputs, so this is the
// Gemma 3 / Gemma 4 composition, written once: the four norms' names and binding, and the two
// residual steps. What differs per family stays in its file: Gemma 3's HF gains are stored as
// w and applied as (1 + w) (`NormGain::kOnePlus`), Gemma 4's are applied as stored; Gemma 4 adds
// per-layer embeddings and a layer scalar after the block.
#pragma once

#include <string>

#include "larder/core/status.h"
#include "larder/kernels/ops.h"
#include "larder/models/blocks/norm.h"
#include "larder/models/hf_conventions.h"
#include "larder/models/weights.h"

namespace larder::models {

struct SandwichNorms {
  RmsNorm input, post_attn, pre_ffn, post_ffn;  // input_layernorm, post_attention_layernorm, …

  // Binds `<prefix>{input,post_attention,pre_feedforward,post_feedforward}_layernorm.weight`
  // ([hidden] each), stored as `gain` says (a Gemma 3 HF checkpoint: γ − 1; its GGUF: γ).
  Status bind(WeightBinder& b, const std::string& prefix, int64_t hidden, float eps, NormGain gain) {
    struct { RmsNorm* norm; const char* name; } norms[] = {{&input, "input_layernorm.weight"},
                                                           {&post_attn, "post_attention_layernorm.weight"},
                                                           {&pre_ffn, "pre_feedforward_layernorm.weight"},
                                                           {&post_ffn, "post_feedforward_layernorm.weight"}};
    for (auto& n : norms) {
      LARDER_ASSIGN_OR_RETURN(n.norm->weight, b.vector(prefix + n.name, hidden, "hidden_size"));
      apply_gain(n.norm->weight, gain);
      n.norm->eps = eps;
    }
    return Status::ok();
  }

  // x [rows, hidden] is the residual (updated in place); h and o are [rows, hidden] scratch.
  // attn(in, out) and mlp(in, out) write [rows, hidden] from a normed input.
  template <class Attn, class Mlp>
  void forward(float* x, int64_t rows, int64_t hidden, float* h, float* o, Attn&& attn, Mlp&& mlp) const {
    const int64_t n = rows * hidden;
    input.apply(x, rows, h);
    attn(h, o);
    post_attn.apply(o, rows, o);
    kernels::add(x, o, x, n);
    pre_ffn.apply(x, rows, h);
    mlp(h, o);
    post_ffn.apply(o, rows, o);
    kernels::add(x, o, x, n);
  }
};

}  // namespace larder::models
