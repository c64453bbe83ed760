// gated_delta.cpp — reference Gated DeltaNet kernels (contracts in kernels/gated_delta.h).
//
// Plain loops; dot products and small sums in double, results rounded to f32 once. The recurrent
// form rounds its state to f32 after every token, like every tier (the state is f32 between tokens);
// the chunked form keeps its working values in double and rounds the state once per chunk.
#include <algorithm>
#include <cmath>
#include <vector>

#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels::ref {

namespace {
double silu(double x) { return x / (1.0 + std::exp(-x)); }
// Value head h reads key head h / (H_v / H_k) (mlx-lm's mx.repeat along the head axis).
int key_head(const GatedDeltaShape& s, int h) { return h / (s.n_v_heads / s.n_k_heads); }
int64_t qk_stride(const GatedDeltaInputs& in, const GatedDeltaShape& s) {
  return in.qkv_stride ? in.qkv_stride : static_cast<int64_t>(s.n_k_heads) * s.d_k;
}
int64_t v_stride(const GatedDeltaInputs& in, const GatedDeltaShape& s) {
  return in.qkv_stride ? in.qkv_stride : static_cast<int64_t>(s.n_v_heads) * s.d_v;
}
double dot(const float* a, const float* b, int n) {
  double acc = 0;
  for (int i = 0; i < n; ++i) acc += static_cast<double>(a[i]) * b[i];
  return acc;
}
}  // namespace

void causal_conv1d(const float* x, int64_t n, const CausalConv1dParams& p, float* state, float* out) {
  const int64_t C = p.channels;
  const int K = p.kernel, keep = K - 1;
  // Row r of in = state ++ x.
  auto in = [&](int64_t r, int64_t c) { return r < keep ? state[r * C + c] : x[(r - keep) * C + c]; };
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      double acc = p.bias ? static_cast<double>(p.bias[c]) : 0.0;
      for (int j = 0; j < K; ++j) acc += static_cast<double>(p.weight[c * K + j]) * in(t + j, c);
      const float conv = static_cast<float>(acc);
      out[t * C + c] = p.silu ? static_cast<float>(silu(conv)) : conv;
    }
  }
  // The new state: the last K−1 rows of in (rows n .. n+K−2).
  std::vector<float> next(static_cast<size_t>(keep * C));
  for (int r = 0; r < keep; ++r)
    for (int64_t c = 0; c < C; ++c) next[static_cast<size_t>(r * C + c)] = in(n + r, c);
  std::copy(next.begin(), next.end(), state);
}

void l2norm_heads(float* x, int64_t n, const L2NormParams& p) {
  for (int64_t t = 0; t < n; ++t) {
    for (int h = 0; h < p.heads; ++h) {
      float* v = x + t * p.stride + static_cast<int64_t>(h) * p.dim;
      const double f = static_cast<double>(p.scale) / std::sqrt(dot(v, v, p.dim) + static_cast<double>(p.eps));
      for (int i = 0; i < p.dim; ++i) v[i] = static_cast<float>(v[i] * f);
    }
  }
}

void gated_delta_gates(const float* a, const float* b, int64_t n, const GatedDeltaGateParams& p, float* log_g,
                       float* beta) {
  for (int64_t t = 0; t < n; ++t) {
    for (int h = 0; h < p.n_v_heads; ++h) {
      const int64_t i = t * p.n_v_heads + h;
      const double u = static_cast<double>(a[i]) + p.dt_bias[h];
      const double softplus = u > 0 ? u + std::log1p(std::exp(-u)) : std::log1p(std::exp(u));
      log_g[i] = static_cast<float>(-std::exp(static_cast<double>(p.a_log[h])) * softplus);
      beta[i] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(b[i]))));
    }
  }
}

void gated_delta_recurrent(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state, float* y) {
  const int dk = s.d_k, dv = s.d_v;
  const int64_t qks = qk_stride(in, s), vs = v_stride(in, s);
  for (int64_t t = 0; t < in.n; ++t) {
    for (int h = 0; h < s.n_v_heads; ++h) {
      const int hk = key_head(s, h);
      const float* q = in.q + t * qks + static_cast<int64_t>(hk) * dk;
      const float* k = in.k + t * qks + static_cast<int64_t>(hk) * dk;
      const float* v = in.v + t * vs + static_cast<int64_t>(h) * dv;
      const int64_t gi = t * s.n_v_heads + h;
      const float g = static_cast<float>(std::exp(static_cast<double>(in.log_g[gi])));
      const double beta = in.beta[gi];
      float* yt = y + (t * s.n_v_heads + h) * dv;
      for (int r = 0; r < dv; ++r) {
        float* row = state + (static_cast<int64_t>(h) * dv + r) * dk;
        for (int j = 0; j < dk; ++j) row[j] *= g;
        const float delta = static_cast<float>((v[r] - dot(row, k, dk)) * beta);
        for (int j = 0; j < dk; ++j)
          row[j] = static_cast<float>(row[j] + static_cast<double>(k[j]) * static_cast<double>(delta));
        yt[r] = static_cast<float>(dot(row, q, dk));
      }
    }
  }
}

void gated_delta_chunked(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state, float* y) {
  const int dk = s.d_k, dv = s.d_v;
  const int64_t qks = qk_stride(in, s), vs = v_stride(in, s);
  std::vector<double> s0(static_cast<size_t>(dv * dk)), L, kk, delta;
  for (int h = 0; h < s.n_v_heads; ++h) {
    const int hk = key_head(s, h);
    float* S = state + static_cast<int64_t>(h) * dv * dk;
    auto q = [&](int64_t t) { return in.q + t * qks + static_cast<int64_t>(hk) * dk; };
    auto k = [&](int64_t t) { return in.k + t * qks + static_cast<int64_t>(hk) * dk; };
    for (int64_t t0 = 0; t0 < in.n;) {
      // This chunk: up to the next multiple of kGatedDeltaChunk in absolute positions.
      const int64_t p0 = in.pos0 + t0;
      const int64_t t1 = std::min(in.n, t0 + (kGatedDeltaChunk - p0 % kGatedDeltaChunk));
      const int64_t m = t1 - t0;
      for (size_t i = 0; i < s0.size(); ++i) s0[i] = S[i];
      L.assign(static_cast<size_t>(m), 0.0);
      double acc_l = 0;
      for (int64_t i = 0; i < m; ++i) L[i] = acc_l += in.log_g[(t0 + i) * s.n_v_heads + h];
      delta.assign(static_cast<size_t>(m * dv), 0.0);
      kk.assign(static_cast<size_t>(m), 0.0);
      for (int64_t i = 0; i < m; ++i) {
        const int64_t t = t0 + i;
        const float* ki = k(t);
        const float* qi = q(t);
        const double beta = in.beta[t * s.n_v_heads + h];
        const double gi = std::exp(L[i]);
        for (int64_t j = 0; j < i; ++j) kk[j] = std::exp(L[i] - L[j]) * dot(ki, k(t0 + j), dk);
        const float* v = in.v + t * vs + static_cast<int64_t>(h) * dv;
        for (int r = 0; r < dv; ++r) {
          const double* s0r = &s0[static_cast<size_t>(r * dk)];
          double kv = 0;
          for (int c = 0; c < dk; ++c) kv += s0r[c] * ki[c];
          kv *= gi;
          for (int64_t j = 0; j < i; ++j) kv += kk[j] * delta[j * dv + r];
          delta[i * dv + r] = (v[r] - kv) * beta;
        }
        // y_i = e^{L_i}·S₀q_i + Σ_{j≤i} e^{L_i−L_j}(q_i·k_j)δ_j
        for (int64_t j = 0; j <= i; ++j) kk[j] = std::exp(L[i] - L[j]) * dot(qi, k(t0 + j), dk);
        float* yt = y + (t * s.n_v_heads + h) * dv;
        for (int r = 0; r < dv; ++r) {
          const double* s0r = &s0[static_cast<size_t>(r * dk)];
          double acc = 0;
          for (int c = 0; c < dk; ++c) acc += s0r[c] * qi[c];
          acc *= gi;
          for (int64_t j = 0; j <= i; ++j) acc += kk[j] * delta[j * dv + r];
          yt[r] = static_cast<float>(acc);
        }
      }
      // S = e^{L_m}·S₀ + Σ_j e^{L_m−L_j} δ_j ⊗ k_j, rounded to f32 once.
      const double gm = std::exp(L[m - 1]);
      for (int64_t j = 0; j < m; ++j) kk[j] = std::exp(L[m - 1] - L[j]);
      for (int r = 0; r < dv; ++r) {
        for (int c = 0; c < dk; ++c) {
          double acc = gm * s0[static_cast<size_t>(r * dk + c)];
          for (int64_t j = 0; j < m; ++j) acc += kk[j] * delta[j * dv + r] * k(t0 + j)[c];
          S[r * dk + c] = static_cast<float>(acc);
        }
      }
      t0 = t1;
    }
  }
}

void rmsnorm_gated(const float* x, const float* z, const float* weight, int64_t rows, int64_t dim, float eps,
                   float* out) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* xt = x + t * dim;
    const float* zt = z + t * dim;
    float* ot = out + t * dim;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xt[i]) * xt[i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(dim) + static_cast<double>(eps));
    // rmsnorm's order (normalize, round to f32, times the weight), then the SiLU gate.
    for (int64_t i = 0; i < dim; ++i) {
      const float normed = static_cast<float>(xt[i] * inv) * weight[i];
      ot[i] = static_cast<float>(normed * silu(zt[i]));
    }
  }
}

}  // namespace larder::kernels::ref
