// logits.cpp — reference argmax, sum_exp and select_at_least over one row of logits (ops.h).
#include <cmath>

#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels::ref {

int64_t argmax(const float* x, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) continue;
    if (best < 0 || x[i] > x[best]) best = i;
  }
  return best < 0 ? 0 : best;
}

double sum_exp(const float* x, int64_t n, float shift, float scale) {
  double z = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!(x[i] > -INFINITY)) continue;  // NaN, −∞
    z += std::exp((static_cast<double>(x[i]) - shift) * scale);
  }
  return z;
}

int64_t select_at_least(const float* x, int64_t n, float t, int32_t* out) {
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] >= t) out[k++] = static_cast<int32_t>(i);
  return k;
}

}  // namespace larder::kernels::ref
