// norm.h — RMSNorm with its gain held in f32 (see weights.h for why 1-D params are converted).
#pragma once

#include <vector>

#include "larder/kernels/ops.h"

namespace larder::models {

struct RmsNorm {
  std::vector<float> weight;
  float eps = 1e-6f;
  int64_t dim() const { return static_cast<int64_t>(weight.size()); }
  // out[n, dim] (may alias x).
  void apply(const float* x, int64_t n, float* out) const {
    kernels::rmsnorm(x, weight.data(), n, dim(), eps, out);
  }
};

}  // namespace larder::models
