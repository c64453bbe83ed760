// AVX2 elementwise ops (rmsnorm, rope, silu·mul, gelu_tanh·mul — also AVX-512 —, add) vs the scalar reference over random shapes,
// ragged lengths and extreme values, at 1–3 pool threads (the ops split rows/elements over the pool).
//
// Bounds: rope and add do the reference's arithmetic (rope: the same double sin/cos and rotation,
// computed once per token instead of per head) — bit-identical. silu·mul uses an f32 8-lane exp
// (≤ ~1 ulp) and f32 divide/multiply where the reference works in double: a few f32 ulps, checked
// as 8e-7 relative plus 1e-35 absolute (for g << 0 both are ~0). rmsnorm sums squares in f32 (the
// reference in double): relative error ~dim·2^-24 worst case on the sum, ~1e-7 typical; checked at
// 4e-6 relative to the row's largest output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "larder/core/cpuid.h"
#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels {
namespace {

std::vector<float> randv(std::mt19937& rng, int64_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

class ElementwiseAvx2 : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { default_pool().set_threads(GetParam()); }
  void TearDown() override { default_pool().set_threads(2); }
};

TEST_P(ElementwiseAvx2, SiluMulMatchesReference) {
  std::mt19937 rng(1);
  for (int64_t n : {1, 7, 8, 9, 33, 1000, 4097, 70001}) {
    for (float scale : {0.5f, 4.0f, 40.0f}) {
      auto g = randv(rng, n, scale), u = randv(rng, n, 1.0f);
      if (n > 20) {  // the clamp edges of exp and the overflow side of g / (1 + e^-g)
        g[0] = -100.0f, g[1] = 100.0f, g[2] = -87.5f, g[3] = 88.5f, g[4] = 0.0f, g[5] = -1e-30f;
      }
      std::vector<float> want(g.size()), got(g.size());
      ref::silu_mul(g.data(), u.data(), want.data(), n);
      cpu::avx2::silu_mul(g.data(), u.data(), got.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const float tol = 8e-7f * std::abs(want[i]) + 1e-35f;  // g << 0: both ~0 (e^-g clamps at e^88.3)
        ASSERT_LE(std::abs(got[i] - want[i]), tol) << "n " << n << " i " << i << " g " << g[i] << " u " << u[i];
      }
    }
  }
}

// gelu_tanh·mul, AVX2 and (where the CPU has the tier) AVX-512, vs the double tanh reference. The
// fast form g·u/(1 + e^(−2z)) rounds z in f32 and its exp amplifies that by |2z|, which only
// matters where the result is tiny next to g·u (g ≪ 0); so the bound is 8e-7 relative to the
// result plus 2e-7·|g·u| plus 1e-35.
TEST_P(ElementwiseAvx2, GeluTanhMulMatchesReference) {
  using Fn = void (*)(const float*, const float*, float*, int64_t);
  std::vector<std::pair<const char*, Fn>> tiers = {{"avx2", cpu::avx2::gelu_tanh_mul}};
  if (cpu_features().has_avx512_tier()) tiers.push_back({"avx512", cpu::avx512::gelu_tanh_mul});
  std::mt19937 rng(5);
  for (const auto& [tier, fn] : tiers) {
    for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 33, 1000, 4097, 70001}) {
      for (float scale : {0.5f, 3.0f, 30.0f}) {
        auto g = randv(rng, n, scale), u = randv(rng, n, 1.0f);
        if (n > 20) {  // exp's clamp edges (2z = ±88), the saturated sides, zero, a denormal
          g[0] = -100.0f, g[1] = 100.0f, g[2] = -7.5f, g[3] = 7.5f, g[4] = 0.0f, g[5] = -1e-30f, g[6] = -3000.0f;
        }
        std::vector<float> want(g.size()), got(g.size()), inplace = g;
        ref::gelu_tanh_mul(g.data(), u.data(), want.data(), n);
        fn(g.data(), u.data(), got.data(), n);
        fn(inplace.data(), u.data(), inplace.data(), n);  // out may alias gate
        for (int64_t i = 0; i < n; ++i) {
          const float tol = 8e-7f * std::abs(want[i]) + 2e-7f * std::abs(g[i] * u[i]) + 1e-35f;
          ASSERT_LE(std::abs(got[i] - want[i]), tol) << tier << " n " << n << " i " << i << " g " << g[i];
          ASSERT_EQ(inplace[i], got[i]) << tier;
        }
      }
    }
  }
}

TEST_P(ElementwiseAvx2, AddIsExact) {
  std::mt19937 rng(2);
  for (int64_t n : {1, 5, 8, 100, 65537}) {
    auto a = randv(rng, n, 3.0f), b = randv(rng, n, 3.0f);
    std::vector<float> want(a.size()), got(a.size());
    ref::add(a.data(), b.data(), want.data(), n);
    cpu::avx2::add(a.data(), b.data(), got.data(), n);
    ASSERT_EQ(got, want) << n;
  }
}

// The f16 KV cache's row writes: F16C against the scalar converter, over random magnitudes from
// f16 subnormals to past its range, ties (an f32 exactly halfway between two halves), ±0, ±inf,
// overflow to inf, and NaN (which need only stay a NaN).
TEST_P(ElementwiseAvx2, ToF16IsBitIdentical) {
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> ex(-30.0f, 17.0f);
  for (int64_t n : {1, 7, 8, 9, 100, 4099}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = (rng() & 1 ? -1.0f : 1.0f) * std::exp2(ex(rng));
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, 65504.0f, 65520.0f, 70000.0f, -1e9f,
                              1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 5.96e-8f, 2.98e-8f, 1e-10f, 6.1e-5f};
    for (size_t i = 0; i < std::size(specials) && i < x.size(); ++i) x[i] = specials[i];
    if (n > 20) x[20] = NAN;
    std::vector<uint16_t> want(x.size()), got(x.size());
    ref::to_f16(x.data(), n, want.data());
    cpu::avx2::to_f16(x.data(), n, got.data());
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(x[i])) {
        ASSERT_EQ(got[i] & 0x7c00, 0x7c00) << i;
        ASSERT_NE(got[i] & 0x03ff, 0) << i;
        continue;
      }
      ASSERT_EQ(got[i], want[i]) << "n " << n << " i " << i << " x " << x[i];
    }
  }
}

TEST_P(ElementwiseAvx2, RmsnormMatchesReference) {
  std::mt19937 rng(3);
  for (int64_t dim : {1, 7, 8, 31, 64, 100, 2048, 5120}) {
    for (int64_t n : {1, 3, 40}) {
      auto x = randv(rng, n * dim, 2.0f), w = randv(rng, dim, 1.0f);
      x[0] = 1e4f;  // a massive activation
      std::vector<float> want(x.size()), got(x.size()), inplace = x;
      ref::rmsnorm(x.data(), w.data(), n, dim, 1e-5f, want.data());
      cpu::avx2::rmsnorm(x.data(), w.data(), n, dim, 1e-5f, got.data());
      cpu::avx2::rmsnorm(inplace.data(), w.data(), n, dim, 1e-5f, inplace.data());  // out may alias x
      for (int64_t t = 0; t < n; ++t) {
        float mx = 0;
        for (int64_t i = 0; i < dim; ++i) mx = std::max(mx, std::abs(want[t * dim + i]));
        for (int64_t i = 0; i < dim; ++i) {
          ASSERT_LE(std::abs(got[t * dim + i] - want[t * dim + i]), 4e-6f * mx) << "dim " << dim << " t " << t << " i " << i;
          ASSERT_EQ(inplace[t * dim + i], got[t * dim + i]);
        }
      }
    }
  }
}

TEST_P(ElementwiseAvx2, RopeIsBitIdentical) {
  std::mt19937 rng(4);
  struct C {
    int heads, hd, rot;
    RopePairing pairing;
  };
  for (C c : {C{32, 64, 64, RopePairing::kHalf}, C{8, 128, 64, RopePairing::kHalf}, C{4, 80, 80, RopePairing::kInterleaved},
              C{3, 6, 4, RopePairing::kInterleaved}}) {
    for (int64_t n : {1, 5, 300}) {
      auto x = randv(rng, n * c.heads * c.hd, 1.0f);
      std::vector<int64_t> pos(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = 7 + 3 * t + (t % 5 == 0 ? 100000 : 0);
      std::vector<float> inv(static_cast<size_t>(c.rot / 2));
      for (int i = 0; i < c.rot / 2; ++i) inv[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * i / c.rot);
      auto want = x, got = x;
      ref::rope(want.data(), n, c.heads, c.hd, c.rot, pos.data(), inv.data(), c.pairing);
      cpu::avx2::rope(got.data(), n, c.heads, c.hd, c.rot, pos.data(), inv.data(), c.pairing);
      ASSERT_EQ(got, want) << "heads " << c.heads << " hd " << c.hd << " n " << n;
    }
  }
}

// The fast rope keeps the angle tables of recent (frequencies, positions) across calls (a model's
// layers rotate by the same ones). A table must be reused only for the same angles: the same
// buffers refilled with other positions or frequencies (as a model's scratch is between forwards,
// and a reloaded model's table may land at a freed one's address), and more tables in turn than
// the cache holds, still give the reference's bits.
TEST_P(ElementwiseAvx2, RopeReusesAnglesOnlyForTheSameAngles) {
  std::mt19937 rng(5);
  const int heads = 4, hd = 64, rot = 64;
  const int64_t n = 40;
  std::vector<int64_t> pos(static_cast<size_t>(n));
  std::vector<float> inv(static_cast<size_t>(rot / 2));
  auto check = [&](const char* what) {
    const auto x = randv(rng, n * heads * hd, 1.0f);
    auto want = x, got = x;
    ref::rope(want.data(), n, heads, hd, rot, pos.data(), inv.data(), RopePairing::kHalf);
    cpu::avx2::rope(got.data(), n, heads, hd, rot, pos.data(), inv.data(), RopePairing::kHalf);
    ASSERT_EQ(got, want) << what;
  };
  auto fill = [&](int64_t p0, float base) {
    for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = p0 + t;
    for (int i = 0; i < rot / 2; ++i) inv[static_cast<size_t>(i)] = std::pow(base, -2.0f * i / rot);
  };
  fill(0, 10000.0f);
  check("first");
  check("again (a hit)");
  fill(1, 10000.0f);
  check("same buffers, positions moved by one");
  fill(1, 500000.0f);
  check("same buffers, other frequencies");
  pos[7] = 1000;
  check("one position changed");
  for (int round = 0; round < 2; ++round)
    for (int k = 0; k < 6; ++k) {  // six tables in turn, more than are kept
      fill(100 * k, 10000.0f + 1000.0f * static_cast<float>(k));
      check("tables in turn");
    }
  // A call whose table is too large to keep (computed for that call only), then the kept ones.
  const int64_t long_n = 20000;  // × 128 doubles = 20 MB
  std::vector<int64_t> long_pos(static_cast<size_t>(long_n));
  for (int64_t t = 0; t < long_n; ++t) long_pos[static_cast<size_t>(t)] = t;
  const auto lx = randv(rng, long_n * 2 * 128, 1.0f);
  auto lwant = lx, lgot = lx;
  std::vector<float> inv64(64);
  for (int i = 0; i < 64; ++i) inv64[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * i / 128);
  ref::rope(lwant.data(), long_n, 2, 128, 128, long_pos.data(), inv64.data(), RopePairing::kHalf);
  cpu::avx2::rope(lgot.data(), long_n, 2, 128, 128, long_pos.data(), inv64.data(), RopePairing::kHalf);
  ASSERT_EQ(lgot, lwant) << "a table too large to keep";
  check("after a large call");
}

INSTANTIATE_TEST_SUITE_P(Threads, ElementwiseAvx2, ::testing::Values(1, 2, 3));

}  // namespace
}  // namespace larder::kernels
