// Reference rmsnorm, rope, softmax, silu_mul, gelu_tanh_mul, swiglu_oai, add against closed forms and hand-derived values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>

#include "larder/kernels/dispatch.h"
#include "larder/kernels/ref/ref_ops.h"
#include "test_util.h"

namespace larder::kernels {
namespace {

using testing::randn;

TEST(RefRmsNorm, HandDerived) {
  // x = [3, 4]: mean(x²) = 12.5, so out = x / sqrt(12.5 + eps) * w.
  const float x[2] = {3, 4}, w[2] = {1, 2};
  float out[2];
  ref::rmsnorm(x, w, 1, 2, 0.0f, out);
  EXPECT_FLOAT_EQ(out[0], 3.0f / std::sqrt(12.5f));
  EXPECT_FLOAT_EQ(out[1], 8.0f / std::sqrt(12.5f));
}

TEST(RefRmsNorm, RandomRaggedRowsInPlace) {
  std::mt19937_64 rng(1);
  for (int64_t dim : {1, 7, 64, 173}) {
    for (int64_t n : {1, 3, 9}) {
      auto x = randn(static_cast<size_t>(n * dim), rng, 3.0f);
      auto w = randn(static_cast<size_t>(dim), rng);
      auto y = x;
      ref::rmsnorm(y.data(), w.data(), n, dim, 1e-5f, y.data());  // aliasing allowed
      for (int64_t t = 0; t < n; ++t) {
        double ss = 0;
        for (int64_t i = 0; i < dim; ++i) ss += double(x[t * dim + i]) * x[t * dim + i];
        const double r = 1.0 / std::sqrt(ss / dim + 1e-5);
        for (int64_t i = 0; i < dim; ++i)
          EXPECT_NEAR(y[t * dim + i], x[t * dim + i] * r * w[i], 1e-6 * (1 + std::abs(x[t * dim + i] * r * w[i])));
      }
    }
  }
}

TEST(RefRope, QuarterTurn) {
  // inv_freq = π/2 and position 1: (a, b) → (−b, a) for the single pair.
  const float inv_freq[1] = {static_cast<float>(M_PI / 2)};
  const int64_t pos[1] = {1};
  float half[2] = {1.0f, 2.0f};
  ref::rope(half, 1, 1, 2, 2, pos, inv_freq, RopePairing::kHalf);
  EXPECT_NEAR(half[0], -2.0f, 1e-6);
  EXPECT_NEAR(half[1], 1.0f, 1e-6);
}

TEST(RefRope, ClosedFormBothPairings) {
  std::mt19937_64 rng(2);
  const int n_heads = 3, head_dim = 12, rot_dim = 8, n = 4;
  std::vector<float> inv_freq(rot_dim / 2);
  for (int i = 0; i < rot_dim / 2; ++i) inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / rot_dim));
  const int64_t pos[n] = {0, 5, 17, 1000};
  for (RopePairing pr : {RopePairing::kHalf, RopePairing::kInterleaved}) {
    auto x = randn(n * n_heads * head_dim, rng);
    auto y = x;
    ref::rope(y.data(), n, n_heads, head_dim, rot_dim, pos, inv_freq.data(), pr);
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < n_heads; ++h) {
        const float* a = x.data() + (t * n_heads + h) * head_dim;
        const float* b = y.data() + (t * n_heads + h) * head_dim;
        for (int i = 0; i < rot_dim / 2; ++i) {
          const int i0 = pr == RopePairing::kHalf ? i : 2 * i;
          const int i1 = pr == RopePairing::kHalf ? i + rot_dim / 2 : 2 * i + 1;
          const double th = double(pos[t]) * inv_freq[i];
          EXPECT_NEAR(b[i0], a[i0] * std::cos(th) - a[i1] * std::sin(th), 1e-5);
          EXPECT_NEAR(b[i1], a[i0] * std::sin(th) + a[i1] * std::cos(th), 1e-5);
        }
        for (int i = rot_dim; i < head_dim; ++i) EXPECT_EQ(b[i], a[i]) << "dims past rot_dim must not move";
      }
    }
  }
}

// The llama.cpp converter's Q/K permutation relates the two pairings: permuting a head's dims
// from half to interleaved order (dim i → 2i, i + d/2 → 2i+1) commutes with rope.
TEST(RefRope, PairingsRelatedByPermutation) {
  std::mt19937_64 rng(3);
  const int d = 16;
  std::vector<float> inv_freq(d / 2);
  for (int i = 0; i < d / 2; ++i) inv_freq[i] = 0.1f * (i + 1);
  auto x = randn(d, rng);
  std::vector<float> p(d);
  for (int i = 0; i < d / 2; ++i) {
    p[2 * i] = x[i];
    p[2 * i + 1] = x[i + d / 2];
  }
  const int64_t pos[1] = {9};
  ref::rope(x.data(), 1, 1, d, d, pos, inv_freq.data(), RopePairing::kHalf);
  ref::rope(p.data(), 1, 1, d, d, pos, inv_freq.data(), RopePairing::kInterleaved);
  for (int i = 0; i < d / 2; ++i) {
    EXPECT_EQ(p[2 * i], x[i]);
    EXPECT_EQ(p[2 * i + 1], x[i + d / 2]);
  }
}

// <rope(q, m), rope(k, n)> depends only on m − n: the property attention relies on.
TEST(RefRope, RelativePosition) {
  std::mt19937_64 rng(4);
  const int d = 8;
  const float inv_freq[4] = {1.0f, 0.3f, 0.05f, 0.001f};
  auto q = randn(d, rng), k = randn(d, rng);
  auto dot_at = [&](int64_t m, int64_t n) {
    auto a = q, b = k;
    ref::rope(a.data(), 1, 1, d, d, &m, inv_freq, RopePairing::kHalf);
    ref::rope(b.data(), 1, 1, d, d, &n, inv_freq, RopePairing::kHalf);
    double s = 0;
    for (int i = 0; i < d; ++i) s += double(a[i]) * b[i];
    return s;
  };
  EXPECT_NEAR(dot_at(7, 3), dot_at(104, 100), 1e-5);
  EXPECT_NEAR(dot_at(3, 3), dot_at(0, 0), 1e-5);
}

TEST(RefSoftmax, KnownValuesAndStability) {
  float a[2] = {0.0f, static_cast<float>(std::log(3.0))};
  ref::softmax(a, 2);
  EXPECT_NEAR(a[0], 0.25f, 1e-7);
  EXPECT_NEAR(a[1], 0.75f, 1e-7);
  float b[3] = {1000.0f, 1000.0f, -1000.0f};  // would overflow exp without the max shift
  ref::softmax(b, 3);
  EXPECT_FLOAT_EQ(b[0], 0.5f);
  EXPECT_FLOAT_EQ(b[1], 0.5f);
  EXPECT_EQ(b[2], 0.0f);
  std::mt19937_64 rng(5);
  auto x = randn(1001, rng, 10.0f);
  auto y = x;
  for (float& v : y) v += 123.0f;  // shift invariance
  ref::softmax(x.data(), 1001);
  ref::softmax(y.data(), 1001);
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    s += x[i];
    EXPECT_NEAR(x[i], y[i], 1e-6);
  }
  EXPECT_NEAR(s, 1.0, 1e-5);
}

TEST(RefSiluMul, ClosedForm) {
  const float g[4] = {0.0f, 1.0f, -2.0f, 30.0f}, u[4] = {5.0f, 2.0f, 3.0f, 0.5f};
  float o[4];
  ref::silu_mul(g, u, o, 4);
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_NEAR(o[1], 2.0 / (1 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(o[2], 3.0 * -2.0 / (1 + std::exp(2.0)), 1e-6);
  EXPECT_NEAR(o[3], 15.0f, 1e-4);  // silu(x) → x for large x
}

// Values of mlx.nn.gelu_approx (= torch gelu(approximate="tanh")) at 0, 1, -2, 3, -0.5, times u.
// mlx evaluates in f32, where 1 + tanh(z) cancels for g < 0 (at g = -2 its value is ~4e-7 off the
// double formula), so the bound is 1e-6 relative: still far below any other formula's distance
// (erf-GELU differs by ~1e-3 at these points).
TEST(RefGeluTanhMul, MatchesMlxGeluApprox) {
  const float g[5] = {0.0f, 1.0f, -2.0f, 3.0f, -0.5f}, u[5] = {5.0f, 2.0f, 3.0f, 0.5f, -1.0f};
  const double gelu[5] = {0.0, 0.8411920070648193, -0.04540228843688965, 2.9963626861572266, -0.1542859971523285};
  float o[5];
  ref::gelu_tanh_mul(g, u, o, 5);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(o[i], gelu[i] * u[i], 1e-6 * std::abs(gelu[i] * u[i]) + 1e-9) << i;
  EXPECT_EQ(ref_table().gelu_tanh_mul, &ref::gelu_tanh_mul);
}

// gpt-oss's clamped SwiGLU against its definition in double: gate is clamped above only, up on
// both sides, at the limit itself and past it (to infinity), and a very negative gate (σ → 0).
TEST(RefSwigluOai, ClosedFormAndClampEdges) {
  constexpr float kAlpha = 1.702f, kLimit = 7.0f;
  const float inf = std::numeric_limits<float>::infinity();
  const float g[] = {0.0f, 1.0f, -2.0f, 10.0f, 7.0f, 3.0f, 3.0f, -50.0f, inf, 1.0f, 6.9999995f};
  const float u[] = {5.0f, 2.0f, -0.5f, 3.0f, 7.0f, 20.0f, -20.0f, 1.0f, 3.0f, -inf, -7.0f};
  constexpr int n = sizeof(g) / sizeof(g[0]);
  float o[n];
  ref::swiglu_oai(g, u, o, n, kAlpha, kLimit);
  for (int i = 0; i < n; ++i) {
    const double gc = std::min<double>(g[i], kLimit), uc = std::clamp<double>(u[i], -kLimit, kLimit);
    const double want = (uc + 1.0) * gc / (1.0 + std::exp(-static_cast<double>(kAlpha) * gc));
    EXPECT_NEAR(o[i], want, 1e-6 * std::abs(want) + 1e-37) << i;
  }
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_EQ(o[3], o[8]);  // gate 10 and +inf both clamp to the limit
  const float g2[2] = {3.0f, 3.0f}, u2[2] = {7.0f, -7.0f};
  float o2[2];
  ref::swiglu_oai(g2, u2, o2, 2, kAlpha, kLimit);
  EXPECT_EQ(o[5], o2[0]);  // up ±20 clamps to ±7
  EXPECT_EQ(o[6], o2[1]);
  EXPECT_EQ(ref_table().swiglu_oai, &ref::swiglu_oai);
}

// ops.h's swiglu_oai (the active table: the tiers have no faster one, so the reference) is the
// reference bit for bit, over random lengths with values at and across ±limit, in place too
// (the MoE block writes over gate).
TEST(SwigluOai, DispatchedMatchesReferenceBitForBit) {
  std::mt19937_64 rng(7);
  for (const float limit : {7.0f, 0.5f}) {
    for (int64_t n : {1, 7, 8, 9, 33, 1000, 4097}) {
      auto g = randn(static_cast<size_t>(n), rng, 2.0f * limit), u = randn(static_cast<size_t>(n), rng, 2.0f * limit);
      const float edges[] = {limit, -limit, std::nextafter(limit, 0.0f), std::nextafter(limit, 2 * limit), 0.0f, -100.0f};
      for (size_t i = 0; i < std::size(edges) && i < g.size(); ++i) g[i] = edges[i], u[u.size() - 1 - i] = edges[i];
      std::vector<float> want(g.size()), got(g.size()), inplace = g;
      ref::swiglu_oai(g.data(), u.data(), want.data(), n, 1.702f, limit);
      swiglu_oai(g.data(), u.data(), got.data(), n, 1.702f, limit);
      swiglu_oai(inplace.data(), u.data(), inplace.data(), n, 1.702f, limit);
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << "limit " << limit << " n " << n;
      ASSERT_EQ(0, std::memcmp(want.data(), inplace.data(), want.size() * sizeof(float))) << "limit " << limit << " n " << n;
    }
  }
}

TEST(RefAdd, Elementwise) {
  const float a[3] = {1, 2, 3}, b[3] = {0.5f, -2, 10};
  float o[3];
  ref::add(a, b, o, 3);
  EXPECT_EQ(o[0], 1.5f);
  EXPECT_EQ(o[1], 0.0f);
  EXPECT_EQ(o[2], 13.0f);
}

TEST(Dispatch, RefTableIsComplete) {
  const KernelTable& t = ref_table();
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    EXPECT_NE(t.matmul[static_cast<int>(d)], nullptr) << dtype_name(d);
    EXPECT_NE(t.dequant_row[static_cast<int>(d)], nullptr) << dtype_name(d);
  }
  EXPECT_NE(t.rmsnorm, nullptr);
  EXPECT_NE(t.rope, nullptr);
  EXPECT_NE(t.softmax, nullptr);
  EXPECT_NE(t.silu_mul, nullptr);
  EXPECT_NE(t.add, nullptr);
  EXPECT_NE(t.attention, nullptr);
}

TEST(Dispatch, UnsupportedFormatsAreReported) {
  WeightView w;
  w.rows = 4;
  w.cols = 256;
  w.dtype = DType::kQ8_K;  // activation-only format: no weight kernel
  EXPECT_FALSE(weight_supported(w));
  w.dtype = DType::kI32;
  EXPECT_FALSE(weight_supported(w));
  w.dtype = DType::kU32;  // MLX affine: not executable yet
  w.bits = 4;
  w.group_size = 64;
  EXPECT_FALSE(weight_supported(w));
  w = WeightView{};
  w.rows = 2;
  w.cols = 33;  // Q8_0 needs whole 32-element blocks per row
  w.dtype = DType::kQ8_0;
  EXPECT_FALSE(weight_supported(w));
  w.cols = 64;
  EXPECT_TRUE(weight_supported(w));
}

TEST(Dispatch, ActiveTableCanBeReplaced) {
  const KernelTable saved = active_table();
  KernelTable t = ref_table();
  static int calls = 0;
  t.add = [](const float* a, const float* b, float* o, int64_t n) {
    ++calls;
    ref::add(a, b, o, n);
  };
  set_active_table(t);
  const float a[1] = {1}, b[1] = {2};
  float o[1];
  add(a, b, o, 1);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(o[0], 3.0f);
  set_active_table(saved);
}

}  // namespace
}  // namespace larder::kernels
