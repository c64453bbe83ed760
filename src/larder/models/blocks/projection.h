// projection.h — the one linear layer every family runs through: y = x·Wᵀ + bias, plus the
// low-rank deltas of the adapters the rows carry (adapter.h). Every dense projection of every
// family (q/k/v/o, gate/up/down, the DeltaNet's in/out projections, Gemma 4's per-layer-input
// projections, a router gate, lm_head) is a Projection, bound once by WeightBinder::projection;
// routed experts are not (kernels/moe.h's grouped matmul runs them).
//
// What it adds around kernels::matmul, in one place:
// - bias: added after the matmul, as the blocks always did (same kernels, same order: the logits
//   are bit-identical to the direct calls it replaced);
// - profiling: under LARDER_PROFILE / `larder bench --profile` the matmul's row in the table is
//   split by projection ("matmul Q4_K 2048x2048 [self_attn.q_proj]"; layers aggregated), and the
//   adapter deltas get a row of their own; off, it costs the one relaxed load every op pays;
// - adapters: per call, per row (AdapterRows), y_row += scale · B(A x_row) after the bias. Rows
//   without an adapter are untouched, so they equal the base bit for bit.
//
// Usage (a family):
//   Projection q;                                   // in the layer's weights struct
//   LARDER_ASSIGN_OR_RETURN(q, b.projection({.module = p + "q_proj", .out = q_dim, .in = c.hidden,
//                                             .why = "num_attention_heads*head_dim x hidden_size",
//                                             .bias = c.attention_bias}));
//   q.apply(x, rows, y, batch.adapters);            // y[rows, out] (batch: the LayerBatch)
//   const Projection* ps[] = {&q, &k, &v};          // one input, one pool job (matmul_multi)
//   float* ys[] = {yq, yk, yv};
//   apply_group(ps, ys, 3, x, rows, batch.adapters);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "larder/kernels/ops.h"
#include "larder/models/adapter.h"

namespace larder::models {

class WeightBinder;

class Projection {
 public:
  Projection() = default;
  // A projection over a caller's matrix, with id `id` (tests, tools). Models bind theirs through
  // WeightBinder::projection, which also registers them in the model's projection table.
  static Projection over(std::string name, int id, const kernels::WeightView& w, std::vector<float> bias = {});

  const kernels::WeightView& weight() const { return w_; }
  const std::vector<float>& bias() const { return bias_; }  // [out] or empty
  // The canonical HF module name ("model.layers.3.self_attn.q_proj", "lm_head"): stable across
  // file formats (a GGUF's blk.3.attn_q is bound under the same name).
  const std::string& name() const { return name_; }
  // Its index in the model's projection table (Model::projections()); adapters index by it.
  int id() const { return id_; }
  int64_t out() const { return w_.rows; }
  int64_t in() const { return w_.cols; }
  bool bound() const { return id_ >= 0; }

  // y[n, out] = x[n, in]·Wᵀ + bias, then every run's delta on its rows.
  void apply(const float* x, int64_t n, float* y, AdapterRows adapters = {}) const;

 private:
  friend class WeightBinder;
  kernels::WeightView w_;
  std::vector<float> bias_;
  std::string name_;
  std::string label_;  // the profile label: name_ without "…layers.N." ("self_attn.q_proj")
  int id_ = -1;
};

// Projections of one input (q/k/v; gate/up; the DeltaNet's four in-projections): one
// kernels::matmul_multi — one activation quantization, one pool job — then each one's bias and
// deltas. ys[i] is [n, ps[i]->out()]; count <= kernels::kMaxMultiMatmul.
void apply_group(const Projection* const* ps, float* const* ys, int count, const float* x, int64_t n,
                 AdapterRows adapters = {});

// y[n, p.out()] += the deltas `adapters` hold for p, row by row. apply() calls the fast form
// (kernels::lora_delta per adapter's rows on the calling thread — no pool job for a decode batch —
// prefill rows split across the pool; a row's bits never depend on the other rows); the
// reference is scalar with double accumulation, the tests' oracle.
void add_deltas(const Projection& p, const float* x, int64_t n, float* y, AdapterRows adapters);
void add_deltas_ref(const Projection& p, const float* x, int64_t n, float* y, AdapterRows adapters);

// The profile label of a module name: what follows "layers.N." ("self_attn.q_proj"), else the name.
std::string projection_label(const std::string& name);

}  // namespace larder::models
