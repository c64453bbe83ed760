// moe.cpp — reference MoE routing and the per-pair expert matmul (contracts in kernels/moe.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "larder/core/status.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels::ref {

namespace {

// out[i] = e^(v[i] − max) / Σ, in double (the reference softmax's arithmetic).
void softmax_double(const float* v, int64_t n, double* out) {
  float mx = v[0];
  for (int64_t i = 1; i < n; ++i) mx = v[i] > mx ? v[i] : mx;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += out[i] = std::exp(static_cast<double>(v[i]) - mx);
  for (int64_t i = 0; i < n; ++i) out[i] /= sum;
}

// The k ids mlx's argpartition hands out (moe.h RouteSelect), in its order: libstdc++'s
// nth_element over 0..E-1 ordered by (value, index) — the comparator of mlx's CPU argpartition.
// NaN ranks as −∞: a NaN in the comparison would break nth_element's strict weak order (undefined
// behaviour, out-of-range reads in practice), and a NaN logit must not crash a request.
void select_topk(const float* v, int E, int k, RouteSelect sel, std::vector<int32_t>& idx, int32_t* ids) {
  idx.resize(static_cast<size_t>(E));
  std::iota(idx.begin(), idx.end(), 0);
  auto key = [v](int32_t i) { return std::isnan(v[i]) ? -INFINITY : v[i]; };
  if (sel == RouteSelect::kLastK) {
    std::nth_element(idx.begin(), idx.begin() + (E - k), idx.end(), [&](int32_t a, int32_t b) {
      const float x = key(a), y = key(b);
      return x < y || (x == y && a < b);
    });
    std::copy(idx.end() - k, idx.end(), ids);
  } else {
    // argpartition(-v, k-1): the same order over the negated values (−0 == 0, as mlx compares).
    std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.end(), [&](int32_t a, int32_t b) {
      const float x = -key(a), y = -key(b);
      return x < y || (x == y && a < b);
    });
    std::copy(idx.begin(), idx.begin() + k, ids);
  }
}

}  // namespace

void route_topk(const float* logits, int64_t n, const RouteParams& p, int32_t* ids, float* weights) {
  const int E = p.n_experts, k = p.k;
  LARDER_CHECK(E > 0 && k > 0 && k <= E, "[kernels] route_topk: k %d of %d experts", k, E);
  std::vector<int32_t> idx;
  std::vector<double> prob(static_cast<size_t>(E));
  std::vector<float> probf(static_cast<size_t>(E));
  std::vector<double> wk(static_cast<size_t>(k));
  std::vector<float> sel(static_cast<size_t>(k));
  for (int64_t t = 0; t < n; ++t) {
    const float* v = logits + t * E;
    int32_t* id = ids + t * k;
    float* wt = weights + t * k;
    if (p.order == RouteOrder::kSoftmaxThenTopK) {
      // mlx selects on the f32 probabilities, so select on them too (ties of rounding included).
      softmax_double(v, E, prob.data());
      for (int e = 0; e < E; ++e) probf[static_cast<size_t>(e)] = static_cast<float>(prob[static_cast<size_t>(e)]);
      select_topk(probf.data(), E, k, p.select, idx, id);
      for (int j = 0; j < k; ++j) wk[static_cast<size_t>(j)] = probf[static_cast<size_t>(id[j])];
    } else {
      select_topk(v, E, k, p.select, idx, id);
      for (int j = 0; j < k; ++j) sel[static_cast<size_t>(j)] = v[id[j]];
      softmax_double(sel.data(), k, wk.data());
    }
    if (p.renormalize) {
      double sum = 0;
      for (int j = 0; j < k; ++j) sum += wk[static_cast<size_t>(j)];
      for (int j = 0; j < k; ++j) wk[static_cast<size_t>(j)] /= sum;
    }
    for (int j = 0; j < k; ++j) {
      wt[j] = static_cast<float>(wk[static_cast<size_t>(j)]);
      if (p.expert_scale != nullptr) wt[j] *= p.expert_scale[id[j]];
    }
  }
}

void matmul_experts(const ExpertsView& w, const float* x, bool x_per_slot, int64_t n, const int32_t* ids, int k,
                    float* y, MatmulFn mm) {
  const int64_t cols = w.experts[0].cols, rows = w.experts[0].rows;
  for (int64_t t = 0; t < n; ++t)
    for (int j = 0; j < k; ++j) {
      const int64_t p = t * k + j;
      const int32_t e = ids[p];
      LARDER_CHECK(e >= 0 && e < w.n_experts, "[kernels] expert id %d of %d", e, w.n_experts);
      mm(w.experts[e], x + (x_per_slot ? p : t) * cols, 1, y + p * rows);
    }
}

}  // namespace larder::kernels::ref
