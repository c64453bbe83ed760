// Hadamard rotations (design/quantization.md §6.7, TV-15): the Paley bases are Hadamard
// matrices, rowT equals an explicit dense x·diag(s)·Mᵀ built here in double from a Sylvester
// recursion of our own and the checked base, norms are preserved, and bad sizes are refused.
//
// Bound for rowT vs the dense double product: rowT does log2(p) butterfly levels plus an m-term
// mix in f32, each adding at most one rounding of the running magnitude; relative to ‖x‖ the error
// stays below ~(log2 n + m)·2^-24·√n-ish for these sizes — 1e-5·‖x‖ per element holds with a
// wide margin and still catches any wrong sign, index or scale (those are O(1)).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "larder/quant/hadamard.h"

namespace larder::quant {
namespace {

// (H_m ⊗ H_p)[i][j] with H_p by the Sylvester recursion, written independently of the FWHT.
double kron_entry(int m, int64_t p, int64_t i, int64_t j) {
  const std::vector<int8_t>& hm = hadamard_base(m);
  const int64_t a = i / p, b = i % p, a2 = j / p, b2 = j % p;
  // Sylvester natural order: H_p[b][b2] = (-1)^popcount(b & b2).
  const double hp = (__builtin_popcountll(static_cast<uint64_t>(b & b2)) & 1) ? -1.0 : 1.0;
  return hm[static_cast<size_t>(a * m + a2)] * hp;
}

TEST(Hadamard, BasesAreHadamardMatrices) {
  for (int m : {1, 12, 20, 28}) {
    const std::vector<int8_t>& h = hadamard_base(m);
    ASSERT_EQ(h.size(), static_cast<size_t>(m * m));
    for (int8_t v : h) ASSERT_TRUE(v == 1 || v == -1) << "H_" << m;
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < m; ++j) {
        int dot = 0;
        for (int k = 0; k < m; ++k) dot += h[static_cast<size_t>(i * m + k)] * h[static_cast<size_t>(j * m + k)];
        ASSERT_EQ(dot, i == j ? m : 0) << "H_" << m << " rows " << i << "," << j;
      }
  }
}

TEST(Hadamard, KroneckerSizesAreHadamard) {
  for (int64_t n : {int64_t{8}, int64_t{48}, int64_t{160}, int64_t{56}, int64_t{96}}) {
    int m = 0;
    int64_t p = 0;
    ASSERT_TRUE(hadamard_factor(n, &m, &p).is_ok()) << n;
    ASSERT_EQ(m * p, n);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int64_t k = 0; k < n; ++k) dot += kron_entry(m, p, i, k) * kron_entry(m, p, j, k);
        ASSERT_EQ(dot, i == j ? static_cast<double>(n) : 0.0) << "n " << n << " rows " << i << "," << j;
      }
  }
}

TEST(Hadamard, RowTMatchesDenseProduct) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t n : {int64_t{8}, int64_t{64}, int64_t{12 * 4}, int64_t{20 * 8}, int64_t{28 * 2}, int64_t{2048}, int64_t{12}}) {
    auto r = Rotation::make(n, 1234, 3);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    const Rotation& R = r.value();
    int m = 0;
    int64_t p = 0;
    ASSERT_TRUE(hadamard_factor(n, &m, &p).is_ok());
    ASSERT_EQ(R.base(), m);
    const std::vector<float> s = rotation_signs(1234, 3, n);
    ASSERT_EQ(R.signs(), s);
    const double scale = 1.0 / std::sqrt(static_cast<double>(n));
    for (int trial = 0; trial < 3; ++trial) {
      std::vector<float> x(static_cast<size_t>(n)), y, scratch(static_cast<size_t>(n));
      for (float& v : x) v = nd(rng);
      y = x;
      R.rowT(y.data(), scratch.data());
      double nx = 0, ny = 0, max_err = 0;
      for (int64_t j = 0; j < n; ++j) {
        // (x·R)_j = Σ_i x_i s_i M[j][i], R = diag(s)·Mᵀ.
        double want = 0;
        for (int64_t i = 0; i < n; ++i)
          want += static_cast<double>(x[static_cast<size_t>(i)]) * s[static_cast<size_t>(i)] * kron_entry(m, p, j, i) * scale;
        max_err = std::max(max_err, std::abs(want - y[static_cast<size_t>(j)]));
        nx += static_cast<double>(x[static_cast<size_t>(j)]) * x[static_cast<size_t>(j)];
        ny += static_cast<double>(y[static_cast<size_t>(j)]) * y[static_cast<size_t>(j)];
      }
      EXPECT_LE(max_err, 1e-5 * std::sqrt(nx)) << "n " << n;
      EXPECT_NEAR(std::sqrt(ny), std::sqrt(nx), 1e-5 * std::sqrt(nx)) << "n " << n << ": rotation is not orthogonal";
    }
  }
}

TEST(Hadamard, RotationIsInvertedByItsTranspose) {
  // R·Rᵀ = I ⇒ x = (x·R)·Rᵀ, i.e. x_i = <x·R, e_i·R>: every basis vector goes through rowT, so
  // this checks the whole matrix, non-symmetric bases included.
  for (int64_t n : {int64_t{64}, int64_t{56}, int64_t{96}, int64_t{80}}) {
    auto r = Rotation::make(n, 99, 0);
    ASSERT_TRUE(r.is_ok());
    std::vector<float> x(static_cast<size_t>(n)), y, scratch(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i + 1));
    y = x;
    r.value().rowT(y.data(), scratch.data());
    for (int64_t i = 0; i < n; ++i) {
      std::vector<float> e(static_cast<size_t>(n), 0.0f);
      e[static_cast<size_t>(i)] = 1.0f;
      r.value().rowT(e.data(), scratch.data());
      double dot = 0;
      for (int64_t j = 0; j < n; ++j) dot += static_cast<double>(y[static_cast<size_t>(j)]) * e[static_cast<size_t>(j)];
      EXPECT_NEAR(dot, x[static_cast<size_t>(i)], 1e-5) << "n " << n << " i " << i;
    }
  }
}

TEST(Hadamard, SignsFollowSplitmix64TopBit) {
  // Reference splitmix64 values (the published test vector of the generator seeded with 0:
  // first output 0xe220a8397b1dcdaf), reproduced here as the finalizer of 0.
  EXPECT_EQ(splitmix64(0), 0xe220a8397b1dcdafull);
  const std::vector<float> s = rotation_signs(42, 5, 100);
  for (uint64_t i = 0; i < 100; ++i)
    EXPECT_EQ(s[i], (splitmix64(42ull ^ (5ull << 32) ^ i) >> 63) ? -1.0f : 1.0f);
  int neg = 0;
  for (float v : rotation_signs(42, 0, 4096)) neg += v < 0;
  EXPECT_GT(neg, 1800);
  EXPECT_LT(neg, 2300);
  EXPECT_NE(rotation_signs(42, 0, 64), rotation_signs(43, 0, 64));
  EXPECT_NE(rotation_signs(42, 0, 64), rotation_signs(42, 1, 64));
}

TEST(Hadamard, RefusesUnsupportedSizes) {
  for (int64_t n : {int64_t{44}, int64_t{6}, int64_t{0}, int64_t{-8}, int64_t{36}, int64_t{24 * 3}}) {
    auto r = Rotation::make(n, 42, 0);
    ASSERT_FALSE(r.is_ok()) << n;
    EXPECT_NE(r.status().message().find("[hadamard] size " + std::to_string(n)), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("m*2^k"), std::string::npos);
  }
  for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{12}, int64_t{20}, int64_t{28}, int64_t{5120}, int64_t{3584}})
    EXPECT_TRUE(Rotation::make(n, 42, 0).is_ok()) << n;
}

TEST(Hadamard, ConstructionNames) {
  EXPECT_EQ(Rotation::make(64, 1, 0).value().construction(), "H_64");
  EXPECT_EQ(Rotation::make(12, 1, 0).value().construction(), "H_12");
  EXPECT_EQ(Rotation::make(3072, 1, 0).value().construction(), "H_12 (x) H_256");
  EXPECT_EQ(Rotation().construction(), "none");
}

}  // namespace
}  // namespace larder::quant
