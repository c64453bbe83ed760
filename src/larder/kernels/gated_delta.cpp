// gated_delta.cpp — gated_delta.h entry points: thin forwards through the active dispatch table,
// each a core/profile.h scope like the ops.h ones.
#include "larder/kernels/gated_delta.h"

#include "larder/core/profile.h"
#include "larder/core/status.h"
#include "larder/kernels/dispatch.h"

namespace larder::kernels {

namespace {
void check_shape(const GatedDeltaInputs& in, const GatedDeltaShape& s) {
  LARDER_DCHECK(s.n_k_heads > 0 && s.n_v_heads % s.n_k_heads == 0 && s.d_k > 0 && s.d_v > 0,
                "gated delta heads %d/%d dims %d/%d", s.n_k_heads, s.n_v_heads, s.d_k, s.d_v);
  LARDER_DCHECK(in.n >= 0 && in.pos0 >= 0, "gated delta n %lld pos0 %lld", (long long)in.n, (long long)in.pos0);
  (void)in;
  (void)s;
}
}  // namespace

void causal_conv1d(const float* x, int64_t n, const CausalConv1dParams& p, float* state, float* out) {
  LARDER_DCHECK(p.kernel >= 1 && p.channels > 0, "conv1d kernel %d channels %lld", p.kernel, (long long)p.channels);
  profile::Scope scope("causal_conv1d", 0.0);
  active_table().causal_conv1d(x, n, p, state, out);
}

void l2norm_heads(float* x, int64_t n, const L2NormParams& p) {
  LARDER_DCHECK(p.stride >= static_cast<int64_t>(p.heads) * p.dim, "l2norm stride %lld", (long long)p.stride);
  profile::Scope scope("l2norm_heads", 0.0);
  active_table().l2norm_heads(x, n, p);
}

void gated_delta_gates(const float* a, const float* b, int64_t n, const GatedDeltaGateParams& p, float* log_g,
                       float* beta) {
  profile::Scope scope("gated_delta_gates", 0.0);
  active_table().gated_delta_gates(a, b, n, p, log_g, beta);
}

void gated_delta_recurrent(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state, float* y) {
  check_shape(in, s);
  profile::Scope scope("gated_delta_recurrent", 0.0);
  active_table().gated_delta_recurrent(in, s, state, y);
}

void gated_delta_chunked(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state, float* y) {
  check_shape(in, s);
  profile::Scope scope("gated_delta_chunked", 0.0);
  active_table().gated_delta_chunked(in, s, state, y);
}

void rmsnorm_gated(const float* x, const float* z, const float* weight, int64_t rows, int64_t dim, float eps,
                   float* out) {
  profile::Scope scope("rmsnorm_gated", 0.0);
  active_table().rmsnorm_gated(x, z, weight, rows, dim, eps, out);
}

}  // namespace larder::kernels
