// Logits of larder against a reference (mlx-lm, transformers, llama.cpp), position by position:
// the largest absolute difference, the largest reference logit (bounds are relative to it), and
// top-1 agreement counted only where the reference's own top-1 leads its runner-up by more than
// a margin — a near-tie may flip on rounding alone and says nothing about the model.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace larder::test {

struct LogitDiff {
  float max_abs = 0, max_ref = 0;
  int top1_mismatch = 0;  // positions whose argmax differs (among those checked)
  int top1_checked = 0;   // positions whose reference margin exceeds margin_min
};

// got, want: [positions, V] row-major.
inline LogitDiff compare_logits(const std::vector<float>& got, const std::vector<float>& want, int64_t V,
                                float margin_min = 0) {
  LogitDiff d;
  const int64_t n = static_cast<int64_t>(want.size()) / V;
  for (int64_t t = 0; t < n; ++t) {
    const float* g = got.data() + t * V;
    const float* w = want.data() + t * V;
    int64_t ag = 0, aw = 0;
    for (int64_t v = 0; v < V; ++v) {
      d.max_abs = std::max(d.max_abs, std::abs(g[v] - w[v]));
      d.max_ref = std::max(d.max_ref, std::abs(w[v]));
      if (g[v] > g[ag]) ag = v;
      if (w[v] > w[aw]) aw = v;
    }
    float second = -INFINITY;
    for (int64_t v = 0; v < V; ++v)
      if (v != aw) second = std::max(second, w[v]);
    if (w[aw] - second > margin_min) {
      ++d.top1_checked;
      d.top1_mismatch += ag != aw;
    }
  }
  return d;
}

}  // namespace larder::test
