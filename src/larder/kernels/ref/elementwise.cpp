// elementwise.cpp — reference rmsnorm, rope, softmax, silu·mul, gelu_tanh·mul, swiglu_oai, add,
// f32 → f16.
#include <algorithm>
#include <cmath>
#include <vector>

#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels::ref {

void rmsnorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * dim;
    float* ot = out + t * dim;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xt[i]) * xt[i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(dim) + static_cast<double>(eps));
    // HF order: normalize, round to the activation dtype (f32 here), then scale by the weight.
    for (int64_t i = 0; i < dim; ++i) ot[i] = static_cast<float>(xt[i] * inv) * weight[i];
  }
}

void rope_angles(const int64_t* positions, int64_t n, const float* inv_freq, int half, double* cs) {
  for (int64_t t = 0; t < n; ++t, cs += 2 * half) {
    const double pos = static_cast<double>(positions[t]);
    for (int i = 0; i < half; ++i) {
      const double theta = pos * static_cast<double>(inv_freq[i]);
      cs[2 * i] = std::cos(theta);
      cs[2 * i + 1] = std::sin(theta);
    }
  }
}

void rope_rotate(float* x, int64_t n, int n_heads, int head_dim, int rot_dim, const double* cs, RopePairing pairing) {
  const int half = rot_dim / 2;
  for (int64_t t = 0; t < n; ++t, cs += 2 * half) {
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const double c = cs[2 * i], s = cs[2 * i + 1];
        // The pair (a, b) rotates as the complex number a + ib times e^{iθ}.
        const int ia = pairing == RopePairing::kHalf ? i : 2 * i;
        const int ib = pairing == RopePairing::kHalf ? i + half : 2 * i + 1;
        const double a = v[ia], b = v[ib];
        v[ia] = static_cast<float>(a * c - b * s);
        v[ib] = static_cast<float>(a * s + b * c);
      }
    }
  }
}

void rope(float* x, int64_t n, int n_heads, int head_dim, int rot_dim, const int64_t* positions,
          const float* inv_freq, RopePairing pairing) {
  const int half = rot_dim / 2;
  std::vector<double> cs(static_cast<size_t>(2 * half));  // cos, sin per pair: shared by every head
  for (int64_t t = 0; t < n; ++t) {
    rope_angles(positions + t, 1, inv_freq, half, cs.data());
    rope_rotate(x + t * n_heads * head_dim, 1, n_heads, head_dim, rot_dim, cs.data(), pairing);
  }
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(std::exp(static_cast<double>(x[i]) - mx) / sum);
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) {
  const double c = std::sqrt(2.0 / M_PI);
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(0.5 * g * (1.0 + std::tanh(c * (g + 0.044715 * g * g * g))) * up[i]);
  }
}

// In f32, unlike its neighbours: this is the formula gpt-oss's reference (mlx-lm) evaluates, and
// the one the model's fixtures were made with.
void swiglu_oai(const float* gate, const float* up, float* out, int64_t n, float alpha, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::clamp(up[i], -limit, limit);
    out[i] = (u + 1.0f) * (g / (1.0f + std::exp(-alpha * g)));
  }
}

void add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void to_f16(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_f16(x[i]);
}

}  // namespace larder::kernels::ref
