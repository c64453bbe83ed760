// The LoRA low-rank product in the order kernels/lora.h fixes, written out in scalar code: the
// fast tiers must reproduce these bits (f32 arithmetic and explicit fma, not this folder's usual
// double accumulation: here the order is the contract, and the models layer's add_deltas_ref keeps
// the double-precision oracle).
#include <cmath>

#include "larder/kernels/lora.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels::ref {

void lora_delta(const LoraFactors& f, const float* const* xs, int64_t nx, float* t, float* const* us) {
  const int64_t in16 = f.in & ~int64_t{15};
  for (int64_t i = 0; i < nx; ++i) {
    const float* x = xs[i];
    float* ti = t + i * f.rank;
    for (int64_t k = 0; k < f.rank; ++k) {
      float s[16] = {};
      for (int64_t c = 0; c < in16; ++c) s[c % 16] = std::fma(f.a_at(k, c), x[c], s[c % 16]);
      for (int l = 0; l < 8; ++l) s[l] = s[l] + s[l + 8];
      for (int l = 0; l < 4; ++l) s[l] = s[l] + s[l + 4];
      for (int l = 0; l < 2; ++l) s[l] = s[l] + s[l + 2];
      float v = s[0] + s[1];
      for (int64_t c = in16; c < f.in; ++c) v = std::fma(f.a_at(k, c), x[c], v);
      ti[k] = v;
    }
    for (int64_t o = 0; o < f.out; ++o) {
      float u = 0.0f;
      for (int64_t k = 0; k < f.rank; ++k) u = std::fma(ti[k], f.b_at(o, k), u);
      us[i][o] = u;
    }
  }
}

}  // namespace larder::kernels::ref
