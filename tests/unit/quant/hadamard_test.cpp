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
#include <string>

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

void expect_hadamard(int m) {
  const std::vector<int8_t>& h = hadamard_base(m);
  ASSERT_EQ(h.size(), static_cast<size_t>(m * m));
  for (int8_t v : h) ASSERT_TRUE(v == 1 || v == -1) << "H_" << m;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < m; ++j) {
      int dot = 0;
      for (int k = 0; k < m; ++k) dot += h[static_cast<size_t>(i * m + k)] * h[static_cast<size_t>(j * m + k)];
      ASSERT_EQ(dot, i == j ? m : 0) << "H_" << m << " (" << hadamard_base_construction(m) << ") rows " << i << "," << j;
    }
}

TEST(Hadamard, BasesAreHadamardMatrices) {
  // Every base larder can build up to 256 (prime Paley I/II, and over GF(p^k): 52 from q = 25,
  // 100 from 49, 244 from 243), plus the prime-power bases released sizes use beyond it
  // (340 from 169 = 13^2, 344 from 343 = 7^3, Qwen2.5-3B's intermediate) and H_924.
  int built = 0;
  for (int m = 1; m <= 256; ++m) {
    const std::string how = hadamard_base_construction(m);
    if (how.empty()) continue;
    ++built;
    expect_hadamard(m);
  }
  EXPECT_EQ(built, 41);  // 1 and 40 of the 64 multiples of 4
  for (int m : {340, 344, 924}) expect_hadamard(m);
  EXPECT_EQ(hadamard_base_construction(52), "Paley II, q = 25 = 5^2");
  EXPECT_EQ(hadamard_base_construction(100), "Paley II, q = 49 = 7^2");
  EXPECT_EQ(hadamard_base_construction(244), "Paley I, q = 243 = 3^5");
  EXPECT_EQ(hadamard_base_construction(340), "Paley II, q = 169 = 13^2");
  EXPECT_EQ(hadamard_base_construction(344), "Paley I, q = 343 = 7^3");
  EXPECT_EQ(hadamard_base_construction(164), "Paley I, q = 163");  // prime before prime power
  for (int m : {3, 6, 10, 92})  // odd, ≡ 2 mod 4, and 92 = 4·23 (no Paley q: 91, 45)
    EXPECT_EQ(hadamard_base_construction(m), "") << m;
}

// The bases rotated checkpoints were written with before general Paley constructions existed
// must not change: an independent Legendre-symbol Paley I of 11 and 19, Paley II of 13.
TEST(Hadamard, LongStandingBasesUnchanged) {
  auto legendre = [](int a, int q) {
    a = ((a % q) + q) % q;
    if (a == 0) return 0;
    for (int x = 1; x < q; ++x)
      if (x * x % q == a) return 1;
    return -1;
  };
  for (int q : {11, 19}) {
    const int n = q + 1;
    const std::vector<int8_t>& h = hadamard_base(n);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        int want = i == 0 ? (j == 0 ? 0 : 1) : j == 0 ? -1 : legendre((j - 1) - (i - 1), q);
        if (i == j) want += 1;
        ASSERT_EQ(h[static_cast<size_t>(i * n + j)], want) << "H_" << n << " " << i << "," << j;
      }
  }
  const std::vector<int8_t>& h28 = hadamard_base(28);
  EXPECT_EQ(hadamard_base_construction(28), "Paley II, q = 13");
  // C[1][2] = χ(1) = +1 → block +[[1, 1], [1, -1]] at rows 2..3, columns 4..5; C[0][0] = 0.
  EXPECT_EQ(h28[2 * 28 + 4], 1);
  EXPECT_EQ(h28[3 * 28 + 5], -1);
  EXPECT_EQ(h28[0], 1);
  EXPECT_EQ(h28[1], -1);
  EXPECT_EQ(h28[28 + 1], -1);
}

// Every hidden and intermediate (and MoE expert) size of the released checkpoints of the families
// larder runs, from their config.json files: each must be rotatable, with a small base (two
// exceptions: Qwen2.5-3B's intermediate 11008 = 43·2^8 needs H_344, Qwen2.5-72B's 29568 = 231·2^7
// H_924 — offline folds, and only R4 would rotate intermediate sizes).
TEST(Hadamard, EveryReleasedSizeIsCovered) {
  struct Size { const char* model; int64_t n; };
  const Size sizes[] = {
      {"SmolLM2-135M hidden", 576},        {"SmolLM2-135M intermediate", 1536},
      {"SmolLM2-360M hidden", 960},        {"SmolLM2-360M intermediate", 2560},
      {"SmolLM2-1.7B hidden", 2048},       {"SmolLM2-1.7B intermediate", 8192},
      {"Llama-3.2-1B intermediate", 8192}, {"Llama-3.2-3B hidden", 3072},
      {"Llama-3.1-8B hidden", 4096},       {"Llama-3.1-8B intermediate", 14336},
      {"Llama-3.1-70B hidden", 8192},      {"Llama-3.1-70B intermediate", 28672},
      {"Llama-3.1-405B hidden", 16384},    {"Llama-3.1-405B intermediate", 53248},
      {"Qwen2.5-0.5B hidden", 896},        {"Qwen2.5-0.5B intermediate", 4864},
      {"Qwen2.5-1.5B hidden", 1536},       {"Qwen2.5-1.5B intermediate", 8960},
      {"Qwen2.5-3B hidden", 2048},         {"Qwen2.5-3B intermediate", 11008},
      {"Qwen2.5-7B hidden", 3584},         {"Qwen2.5-7B intermediate", 18944},
      {"Qwen2.5-14B hidden", 5120},        {"Qwen2.5-14B intermediate", 13824},
      {"Qwen2.5-32B intermediate", 27648}, {"Qwen2.5-72B intermediate", 29568},
      {"Qwen3-0.6B hidden", 1024},         {"Qwen3-0.6B intermediate", 3072},
      {"Qwen3-1.7B intermediate", 6144},   {"Qwen3-4B hidden", 2560},
      {"Qwen3-4B intermediate", 9728},     {"Qwen3-8B intermediate", 12288},
      {"Qwen3-14B intermediate", 17408},   {"Qwen3-32B intermediate", 25600},
      {"Qwen3-30B-A3B expert", 768},       {"Qwen3-235B-A22B expert", 1536},
      {"Qwen3.5-0.8B intermediate", 3584}, {"Qwen3.5-27B intermediate", 17408},
      {"Qwen3.5-35B-A3B expert", 512},     {"Qwen3-Next-80B-A3B expert", 512},
      {"gemma-3-270m hidden", 640},        {"gemma-3-270m intermediate", 2048},
      {"gemma-3-1b hidden", 1152},         {"gemma-3-1b intermediate", 6912},
      {"gemma-3-4b hidden", 2560},         {"gemma-3-4b intermediate", 10240},
      {"gemma-3-12b hidden", 3840},        {"gemma-3-12b intermediate", 15360},
      {"gemma-3-27b hidden", 5376},        {"gemma-3-27b intermediate", 21504},
      {"gemma-4-26B-A4B hidden", 2816},    {"gemma-4-26B-A4B intermediate", 2112},
      {"gemma-4-26B-A4B expert", 704},     {"gpt-oss hidden", 2880},
  };
  for (const Size& s : sizes) {
    int m = 0;
    int64_t p = 0;
    const Status st = hadamard_factor(s.n, &m, &p);
    ASSERT_TRUE(st.is_ok()) << s.model << " " << s.n << ": " << st.to_string();
    EXPECT_EQ(static_cast<int64_t>(m) * p, s.n);
    const int64_t big = s.n == 29568 ? 924 : s.n == 11008 ? 344 : 180;
    EXPECT_LE(m, big) << s.model;
    EXPECT_FALSE(hadamard_base_construction(m).empty());
  }
  int m = 0;
  int64_t p = 0;
  ASSERT_TRUE(hadamard_factor(576, &m, &p).is_ok());
  EXPECT_EQ(m, 36);  // Paley II of 17
  ASSERT_TRUE(hadamard_factor(29568, &m, &p).is_ok());
  EXPECT_EQ(m, 924);  // 231·4: Paley II of 461 (the smallest base of the largest odd part here)
}

TEST(Hadamard, KroneckerSizesAreHadamard) {
  for (int64_t n : {int64_t{8}, int64_t{48}, int64_t{160}, int64_t{56}, int64_t{96}, int64_t{72}, int64_t{104}}) {
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
  for (int64_t n : {int64_t{8}, int64_t{64}, int64_t{12 * 4}, int64_t{20 * 8}, int64_t{28 * 2}, int64_t{2048}, int64_t{12},
                    int64_t{576}, int64_t{52 * 2}, int64_t{100}, int64_t{44}}) {
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
  for (int64_t n : {int64_t{6}, int64_t{0}, int64_t{-8}, int64_t{92}, int64_t{184}, int64_t{3 * 3}}) {
    auto r = Rotation::make(n, 42, 0);
    ASSERT_FALSE(r.is_ok()) << n;
    EXPECT_NE(r.status().message().find("[hadamard] size " + std::to_string(n)), std::string::npos)
        << r.status().message();
  }
  // The refusal names the odd part and the nearest sizes that work.
  const std::string msg = Rotation::make(92, 42, 0).status().message();
  EXPECT_NE(msg.find("m*2^k"), std::string::npos) << msg;
  EXPECT_NE(msg.find("92 = 23*2^k"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nearest rotatable sizes are 88 and 96"), std::string::npos) << msg;
  for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{12}, int64_t{20}, int64_t{28}, int64_t{5120}, int64_t{3584},
                    int64_t{44}, int64_t{36}, int64_t{368}, int64_t{23 * 1024}})
    EXPECT_TRUE(Rotation::make(n, 42, 0).is_ok()) << n;
}

TEST(Hadamard, ConstructionNames) {
  EXPECT_EQ(Rotation::make(64, 1, 0).value().construction(), "H_64");
  EXPECT_EQ(Rotation::make(12, 1, 0).value().construction(), "H_12");
  EXPECT_EQ(Rotation::make(3072, 1, 0).value().construction(), "H_12 (x) H_256");
  EXPECT_EQ(Rotation::make(576, 1, 0).value().construction(), "H_36 (x) H_16");
  EXPECT_EQ(Rotation().construction(), "none");
}

}  // namespace
}  // namespace larder::quant
