// MoE routing (kernels/moe.h route_topk, ref/moe.cpp) against mlx-lm's own routing code in each
// family's module (fixture tests/ref/moe_route_reference.py): ids exactly (mlx's argpartition
// order, ties included), weights within a few f32 ulps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "larder/kernels/moe.h"
#include "larder/kernels/ref/ref_ops.h"
#include "test_util.h"

namespace larder::kernels {
namespace {

using testing::read_bytes;

template <class T>
std::vector<T> read_vec(const std::string& path) {
  const std::vector<uint8_t> b = read_bytes(path, "moe_route_ref");
  std::vector<T> v(b.size() / sizeof(T));
  if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

RouteParams family_params(const std::string& family, int E, int k, bool norm) {
  RouteParams p;
  p.n_experts = E;
  p.k = k;
  if (family == "qwen3_moe" || family == "qwen3_next") {
    p.order = RouteOrder::kSoftmaxThenTopK;
    p.renormalize = norm;
  } else if (family == "gemma4" || family == "gpt_oss") {
    p.order = RouteOrder::kTopKThenSoftmax;
  } else if (family == "mixtral") {
    p.order = RouteOrder::kTopKThenSoftmax;
    p.select = RouteSelect::kFirstKOfNegated;
  } else {
    ADD_FAILURE() << "unknown family " << family;
  }
  return p;
}

// Weights: mlx computes the softmax in f32 with its own exp and sum order, the reference in
// double rounded once, so they differ by mlx's rounding: a few ulps of the largest weight
// (softmax outputs are <= 1). Measured <= 1.2e-7 absolute over the cases; 1e-6 is ~8x that, and
// a wrong order (softmax before vs after top-k), a missing renormalisation or scale moves weights by
// 1e-2 or more.
constexpr double kWeightTol = 1e-6;

TEST(MoeRoute, MatchesMlxLm) {
  const std::string dir = std::string(LARDER_TEST_DATA_DIR) + "/moe_route/";
  std::ifstream f(dir + "index.json");
  ASSERT_TRUE(f.good()) << "fixture moe_route_ref did not run";
  int n_cases = 0;
  double worst = 0;
  for (const auto& c : nlohmann::json::parse(f)) {
    const std::string stem = c["stem"];
    const int64_t n = c["n"];
    const int E = c["experts"], k = c["k"];
    SCOPED_TRACE(stem);
    RouteParams p = family_params(c["family"], E, k, c["norm_topk_prob"]);
    std::vector<float> scale;
    if (c["scale"]) {
      scale = read_vec<float>(dir + stem + ".scale");
      p.expert_scale = scale.data();
    }
    const auto logits = read_vec<float>(dir + stem + ".logits");
    const auto want_ids = read_vec<int32_t>(dir + stem + ".ids");
    const auto want_w = read_vec<float>(dir + stem + ".weights");
    ASSERT_EQ(logits.size(), static_cast<size_t>(n * E));
    ASSERT_EQ(want_ids.size(), static_cast<size_t>(n * k));
    std::vector<int32_t> ids(static_cast<size_t>(n * k), -1);
    std::vector<float> w(static_cast<size_t>(n * k), NAN);
    route_topk(logits.data(), n, p, ids.data(), w.data());
    EXPECT_EQ(ids, want_ids);
    for (size_t i = 0; i < w.size(); ++i) {
      const double d = std::fabs(static_cast<double>(w[i]) - want_w[i]);
      worst = std::max(worst, d);
      EXPECT_LE(d, kWeightTol) << "pair " << i << ": " << w[i] << " vs " << want_w[i];
    }
    ++n_cases;
  }
  EXPECT_GE(n_cases, 30);
  std::printf("moe route: %d cases, weights max |diff| %.3g\n", n_cases, worst);
}

// Properties that hold whatever mlx does: the ids are the k largest (a tie at the boundary goes to
// the lower index with kLastK's comparator), distinct, and the weights of softmax-then-renormalise
// and top-k-then-softmax sum to 1 before any scale.
TEST(MoeRoute, TopKProperties) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    const int E = 2 + static_cast<int>(rng() % 200), k = 1 + static_cast<int>(rng() % std::min(E, 12));
    const int64_t n = 1 + static_cast<int64_t>(rng() % 5);
    std::vector<float> logits = testing::randn(static_cast<size_t>(n * E), rng);
    if (trial % 3 == 0)
      for (float& v : logits) v = std::round(v);  // many ties
    for (RouteOrder order : {RouteOrder::kSoftmaxThenTopK, RouteOrder::kTopKThenSoftmax})
      for (RouteSelect sel : {RouteSelect::kLastK, RouteSelect::kFirstKOfNegated}) {
        RouteParams p{E, k, order, sel, true, nullptr};
        std::vector<int32_t> ids(static_cast<size_t>(n * k));
        std::vector<float> w(static_cast<size_t>(n * k));
        route_topk(logits.data(), n, p, ids.data(), w.data());
        for (int64_t t = 0; t < n; ++t) {
          const float* v = logits.data() + t * E;
          std::vector<bool> chosen(static_cast<size_t>(E), false);
          double sum = 0;
          float min_chosen = INFINITY;
          for (int j = 0; j < k; ++j) {
            const int32_t id = ids[static_cast<size_t>(t * k + j)];
            ASSERT_TRUE(id >= 0 && id < E);
            ASSERT_FALSE(chosen[static_cast<size_t>(id)]) << "id " << id << " twice";
            chosen[static_cast<size_t>(id)] = true;
            min_chosen = std::min(min_chosen, v[id]);
            sum += w[static_cast<size_t>(t * k + j)];
          }
          for (int e = 0; e < E; ++e)
            if (!chosen[static_cast<size_t>(e)]) {
              EXPECT_LE(v[e], min_chosen) << "unselected " << e << " larger";
            }
          EXPECT_NEAR(sum, 1.0, 1e-6);
        }
      }
  }
}

// NaN and infinite logits (a diverged model) still give k distinct, in-range experts; a NaN
// ranks below every number, so finite logits are chosen first.
TEST(MoeRoute, NanAndInfLogits) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int E = 4 + static_cast<int>(rng() % 60), k = 1 + static_cast<int>(rng() % std::min(E, 8));
    std::vector<float> logits = testing::randn(static_cast<size_t>(E), rng);
    int finite = E;
    for (float& v : logits) {
      const int r = static_cast<int>(rng() % 4);
      if (r == 0) v = NAN, --finite;
      else if (r == 1 && trial % 2) v = (rng() & 1) ? INFINITY : -INFINITY;
    }
    for (RouteOrder order : {RouteOrder::kSoftmaxThenTopK, RouteOrder::kTopKThenSoftmax})
      for (RouteSelect sel : {RouteSelect::kLastK, RouteSelect::kFirstKOfNegated}) {
        RouteParams p{E, k, order, sel, false, nullptr};
        std::vector<int32_t> ids(static_cast<size_t>(k), -1);
        std::vector<float> w(static_cast<size_t>(k));
        route_topk(logits.data(), 1, p, ids.data(), w.data());
        std::vector<bool> seen(static_cast<size_t>(E), false);
        int nan_ids = 0;
        for (int32_t id : ids) {
          ASSERT_TRUE(id >= 0 && id < E) << id;
          ASSERT_FALSE(seen[static_cast<size_t>(id)]);
          seen[static_cast<size_t>(id)] = true;
          nan_ids += std::isnan(logits[static_cast<size_t>(id)]);
        }
        if (order == RouteOrder::kTopKThenSoftmax) {  // softmax-first turns every weight NaN once one is
          EXPECT_EQ(nan_ids, std::max(0, k - finite)) << "E " << E << " k " << k;
        }
      }
  }
}

}  // namespace
}  // namespace larder::kernels
