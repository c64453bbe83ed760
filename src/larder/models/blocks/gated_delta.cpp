#include "larder/models/blocks/gated_delta.h"

#include <cmath>
#include <cstring>

#include "larder/kernels/gated_delta.h"

namespace larder::models {

Status bind_gated_delta(WeightBinder& b, const std::string& p, const LayerSpec& spec, int64_t hidden, float eps,
                        bool a_log_is_a, GatedDeltaWeights* w) {
  const GatedDeltaDims& d = spec.delta;
  const int64_t C = d.conv_dim();
  w->fused_qkvz = b.has(p + "in_proj_qkvz.weight");
  w->fused_ba = b.has(p + "in_proj_ba.weight");
  if (w->fused_qkvz) {
    LARDER_ASSIGN_OR_RETURN(w->qkvz, b.projection({.module = p + "in_proj_qkvz",
                                                   .out = C + d.value_dim(),
                                                   .in = hidden,
                                                   .why = "2*linear_num_key_heads*linear_key_head_dim + "
                                                          "2*linear_num_value_heads*linear_value_head_dim x hidden_size"}));
  } else {
    LARDER_ASSIGN_OR_RETURN(w->qkv, b.projection({.module = p + "in_proj_qkv",
                                                  .out = C,
                                                  .in = hidden,
                                                  .why = "2*linear_num_key_heads*linear_key_head_dim + "
                                                         "linear_num_value_heads*linear_value_head_dim x hidden_size"}));
    LARDER_ASSIGN_OR_RETURN(w->z, b.projection({.module = p + "in_proj_z",
                                                .out = d.value_dim(),
                                                .in = hidden,
                                                .why = "linear_num_value_heads*linear_value_head_dim x hidden_size"}));
  }
  if (w->fused_ba) {
    LARDER_ASSIGN_OR_RETURN(w->ba, b.projection({.module = p + "in_proj_ba", .out = 2 * int64_t{d.n_v_heads}, .in = hidden,
                                                 .why = "2*linear_num_value_heads x hidden_size"}));
  } else {
    LARDER_ASSIGN_OR_RETURN(w->b, b.projection({.module = p + "in_proj_b", .out = d.n_v_heads, .in = hidden,
                                                .why = "linear_num_value_heads x hidden_size"}));
    LARDER_ASSIGN_OR_RETURN(w->a, b.projection({.module = p + "in_proj_a", .out = d.n_v_heads, .in = hidden,
                                                .why = "linear_num_value_heads x hidden_size"}));
  }
  LARDER_ASSIGN_OR_RETURN(w->out, b.projection({.module = p + "out_proj",
                                                .out = hidden,
                                                .in = d.value_dim(),
                                                .why = "hidden_size x linear_num_value_heads*linear_value_head_dim"}));
  LARDER_ASSIGN_OR_RETURN(w->conv, b.small_f32(p + "conv1d.weight", {C, 1, d.conv_kernel},
                                               "conv channels x 1 x linear_conv_kernel_dim"));
  LARDER_ASSIGN_OR_RETURN(w->a_log, b.vector(p + "A_log", d.n_v_heads, "linear_num_value_heads"));
  if (a_log_is_a)
    for (float& x : w->a_log) x = std::log(-x);
  LARDER_ASSIGN_OR_RETURN(w->dt_bias, b.vector(p + "dt_bias", d.n_v_heads, "linear_num_value_heads"));
  LARDER_ASSIGN_OR_RETURN(w->norm, b.vector(p + "norm.weight", d.d_v, "linear_value_head_dim"));
  w->eps = eps;
  return Status::ok();
}

namespace {

// Qwen3-Next's per-key-head groups → the qkv / z / b / a layout of the split projections (grouped
// value-head order is kept: value head g·r + j is the j-th of key head g's group).
void split_fused(const GatedDeltaWeights& w, const GatedDeltaDims& d, int64_t rows, GatedDeltaScratch& s) {
  const int64_t C = d.conv_dim(), V = d.value_dim(), Hv = d.n_v_heads, Hk = d.n_k_heads;
  const int64_t r = Hv / Hk, dk = d.d_k, gv = r * d.d_v, kd = d.key_dim();
  const size_t fk = static_cast<size_t>(dk) * sizeof(float), fv = static_cast<size_t>(gv) * sizeof(float);
  if (w.fused_qkvz) {
    const int64_t group = 2 * dk + 2 * gv;
    for (int64_t row = 0; row < rows; ++row) {
      const float* src = s.qkvz.data() + row * (C + V);
      float* qkv = s.qkv.data() + row * C;
      float* z = s.z.data() + row * V;
      for (int64_t g = 0; g < Hk; ++g) {
        const float* gs = src + g * group;
        std::memcpy(qkv + g * dk, gs, fk);
        std::memcpy(qkv + kd + g * dk, gs + dk, fk);
        std::memcpy(qkv + 2 * kd + g * gv, gs + 2 * dk, fv);
        std::memcpy(z + g * gv, gs + 2 * dk + gv, fv);
      }
    }
  }
  if (w.fused_ba) {
    for (int64_t row = 0; row < rows; ++row) {
      const float* src = s.ba.data() + row * 2 * Hv;
      for (int64_t g = 0; g < Hk; ++g)
        for (int64_t j = 0; j < r; ++j) {
          s.b[static_cast<size_t>(row * Hv + g * r + j)] = src[g * 2 * r + j];
          s.a[static_cast<size_t>(row * Hv + g * r + j)] = src[g * 2 * r + r + j];
        }
    }
  }
}

}  // namespace

void gated_delta_block(const GatedDeltaCall& call, GatedDeltaScratch& s, float* out) {
  const LayerSpec& spec = *call.spec;
  const GatedDeltaWeights& w = *call.w;
  const GatedDeltaDims& d = spec.delta;
  const int64_t rows = call.rows, C = d.conv_dim(), V = d.value_dim(), Hv = d.n_v_heads;
  s.qkv.resize(static_cast<size_t>(rows * C));
  s.conv.resize(static_cast<size_t>(rows * C));
  s.z.resize(static_cast<size_t>(rows * V));
  s.a.resize(static_cast<size_t>(rows * Hv));
  s.b.resize(static_cast<size_t>(rows * Hv));
  s.log_g.resize(static_cast<size_t>(rows * Hv));
  s.beta.resize(static_cast<size_t>(rows * Hv));
  s.y.resize(static_cast<size_t>(rows * V));
  {  // the input projections of the same activations: one job
    const Projection* ps[4];
    float* ys[4];
    int n = 0;
    auto add = [&](const Projection& p, std::vector<float>& y) { ps[n] = &p, ys[n] = y.data(), ++n; };
    if (w.fused_qkvz) {
      s.qkvz.resize(static_cast<size_t>(rows * (C + V)));
      add(w.qkvz, s.qkvz);
    } else {
      add(w.qkv, s.qkv);
      add(w.z, s.z);
    }
    if (w.fused_ba) {
      s.ba.resize(static_cast<size_t>(rows * 2 * Hv));
      add(w.ba, s.ba);
    } else {
      add(w.b, s.b);
      add(w.a, s.a);
    }
    apply_group(ps, ys, n, call.h, rows, call.adapters);
  }
  split_fused(w, d, rows, s);
  kernels::CausalConv1dParams cp;
  cp.channels = C;
  cp.kernel = d.conv_kernel;
  cp.weight = w.conv.data();
  cp.silu = true;
  const kernels::GatedDeltaShape shape{d.n_k_heads, d.n_v_heads, d.d_k, d.d_v};
  // Per-row ops run over the whole batch; the conv and the recurrence per sequence on its state.
  for (const AttentionSeq& sq : call.seqs) {
    memory::RecurrentState* rs = sq.state->recurrent(call.layer);
    LARDER_DCHECK(rs != nullptr && rs->offset() == sq.state->length(), "recurrent slot out of step");
    kernels::causal_conv1d(s.qkv.data() + sq.row0 * C, sq.n, cp, rs->conv_mut(), s.conv.data() + sq.row0 * C);
  }
  const float dk_scale = 1.0f / std::sqrt(static_cast<float>(d.d_k));
  kernels::l2norm_heads(s.conv.data(), rows, {.heads = d.n_k_heads, .dim = d.d_k, .stride = C, .scale = dk_scale});
  kernels::l2norm_heads(s.conv.data() + d.key_dim(), rows, {.heads = d.n_k_heads, .dim = d.d_k, .stride = C});
  kernels::gated_delta_gates(s.a.data(), s.b.data(), rows, {static_cast<int>(Hv), w.a_log.data(), w.dt_bias.data()}, s.log_g.data(),
                             s.beta.data());
  // The kernel pairs value head h with key head h / (H_v/H_k). A tiled layout pairs it with key
  // head h % H_k: give the kernel one key head per value head instead (q and k copied per value
  // head, v after them; a few KiB per token beside the state update's d_k·d_v per head).
  const bool expand = d.tiled_v_heads && d.n_v_heads != d.n_k_heads;
  const float* base = s.conv.data();
  int64_t stride = C, k_off = d.key_dim(), v_off = 2 * d.key_dim();
  kernels::GatedDeltaShape kshape = shape;
  if (expand) {
    const int64_t qk = int64_t{Hv} * d.d_k;
    stride = 2 * qk + V;
    k_off = qk;
    v_off = 2 * qk;
    kshape.n_k_heads = d.n_v_heads;
    s.tiled.resize(static_cast<size_t>(rows * stride));
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = s.conv.data() + r * C;
      float* dst = s.tiled.data() + r * stride;
      for (int part = 0; part < 2; ++part)
        for (int h = 0; h < Hv; ++h)
          std::memcpy(dst + part * qk + int64_t{h} * d.d_k, src + part * d.key_dim() + int64_t{h % d.n_k_heads} * d.d_k,
                      static_cast<size_t>(d.d_k) * sizeof(float));
      std::memcpy(dst + 2 * qk, src + 2 * d.key_dim(), static_cast<size_t>(V) * sizeof(float));
    }
    base = s.tiled.data();
  }
  for (const AttentionSeq& sq : call.seqs) {
    memory::RecurrentState* rs = sq.state->recurrent(call.layer);
    const float* row = base + sq.row0 * stride;
    kernels::GatedDeltaInputs in;
    in.q = row;
    in.k = row + k_off;
    in.v = row + v_off;
    in.qkv_stride = stride;
    in.log_g = s.log_g.data() + sq.row0 * Hv;
    in.beta = s.beta.data() + sq.row0 * Hv;
    in.n = sq.n;
    in.pos0 = rs->offset();
    kernels::gated_delta_recurrent(in, kshape, rs->matrix_mut(), s.y.data() + sq.row0 * V);
    rs->advance(sq.n);
  }
  kernels::rmsnorm_gated(s.y.data(), s.z.data(), w.norm.data(), rows * Hv, d.d_v, w.eps, s.y.data());
  w.out.apply(s.y.data(), rows, out, call.adapters);
}

}  // namespace larder::models
