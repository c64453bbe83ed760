// attention.cpp — reference causal multi-head attention with GQA over a list of KV spans.
//
// Naive and exact: for each query row, every visible key's score is computed in double, the
// softmax is taken in double, and the weighted sum of V accumulates in double. K/V rows of any
// KV dtype are read through kv_decode (the widening to f32 is exact or one rounding, the same
// one every tier does).
#include <algorithm>
#include <cmath>
#include <vector>

#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels::ref {

void attention(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
               const AttentionParams& p, float* out) {
  const int group = p.n_heads / p.n_kv_heads;
  const int64_t kv_row = static_cast<int64_t>(p.n_kv_heads) * p.head_dim;
  std::vector<double> scores;
  std::vector<double> acc(static_cast<size_t>(p.head_dim));
  std::vector<float> row(static_cast<size_t>(p.head_dim));
  // Head kvh of row j of a span, widened to f32.
  auto head_row = [&](const KvSpanView& sp, const void* base, int64_t j, int kvh) -> const float* {
    const auto* b = static_cast<const uint8_t*>(base) + kv_bytes(sp.dtype, j * kv_row) +
                    kv_bytes(sp.dtype, static_cast<int64_t>(kvh) * p.head_dim);
    kv_decode(sp.dtype, b, p.head_dim, row.data());
    return row.data();
  };
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = q_pos0 + t;
    const int64_t first = p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0;
    for (int h = 0; h < p.n_heads; ++h) {
      const float* qh = q + (t * p.n_heads + h) * p.head_dim;
      const int kvh = h / group;
      scores.assign(static_cast<size_t>(pos + 1 - first), 0.0);
      double mx = -INFINITY;
      for (int s = 0; s < n_spans; ++s) {
        const KvSpanView& sp = spans[s];
        for (int64_t j = 0; j < sp.len; ++j) {
          const int64_t kp = sp.start + j;
          if (kp < first || kp > pos) continue;
          const float* kh = head_row(sp, sp.k, j, kvh);
          double d = 0;
          for (int i = 0; i < p.head_dim; ++i) d += static_cast<double>(qh[i]) * kh[i];
          d *= p.scale;
          scores[static_cast<size_t>(kp - first)] = d;
          mx = d > mx ? d : mx;
        }
      }
      // A sink is one more logit in the softmax with no value row: it only adds to the sum.
      const double sink = p.sinks ? static_cast<double>(p.sinks[h]) : -INFINITY;
      mx = sink > mx ? sink : mx;
      double sum = p.sinks ? std::exp(sink - mx) : 0.0;
      for (double& sc : scores) {
        sc = std::exp(sc - mx);
        sum += sc;
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int s = 0; s < n_spans; ++s) {
        const KvSpanView& sp = spans[s];
        for (int64_t j = 0; j < sp.len; ++j) {
          const int64_t kp = sp.start + j;
          if (kp < first || kp > pos) continue;
          const double wgt = scores[static_cast<size_t>(kp - first)] / sum;
          const float* vh = head_row(sp, sp.v, j, kvh);
          for (int i = 0; i < p.head_dim; ++i) acc[static_cast<size_t>(i)] += wgt * vh[i];
        }
      }
      float* oh = out + (t * p.n_heads + h) * p.head_dim;
      for (int i = 0; i < p.head_dim; ++i) oh[i] = static_cast<float>(acc[static_cast<size_t>(i)]);
    }
  }
}

}  // namespace larder::kernels::ref
