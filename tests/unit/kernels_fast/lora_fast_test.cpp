// kernels::lora_delta (u = B·(A·x), kernels/lora.h): the AVX2 and AVX-512 tiers against the scalar
// reference over random shapes, ranks and row counts (widths off multiples of 16, ranks 1–70, the
// tiles' row and column tails), F32, BF16 and F16 factors.
//
// Bounds: lora.h fixes one summation order and every tier follows it, so the tiers equal
// ref::lora_delta bit for bit; the reference itself is checked against a double-accumulation
// oracle within f32 rounding ((in + rank + 4) · 2^-24 of the absolute terms), and a row computed
// alone equals the same row in a batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "larder/core/cpuid.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/lora.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels {
namespace {

using DeltaFn = void (*)(const LoraFactors&, const float* const*, int64_t, float*, float* const*);

struct Case {
  int64_t in, out, rank, nx;
  DType dtype;
  std::vector<uint8_t> a, b;  // raw elements: A [rank, in], B [out, rank]
  std::vector<float> af, bf;  // their values
  std::vector<float> x;       // [nx, in]
  OwnedLoraFactors f;
};

Case make_case(std::mt19937& g, int64_t in, int64_t out, int64_t rank, int64_t nx, DType dt) {
  Case c{in, out, rank, nx, dt, {}, {}, {}, {}, {}, {}};
  std::normal_distribution<float> nd(0.0f, 0.5f);
  const size_t es = dt == DType::kF32 ? 4 : 2;
  auto fill = [&](int64_t n, std::vector<uint8_t>& raw, std::vector<float>& val) {
    raw.resize(static_cast<size_t>(n) * es);
    val.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      float v = nd(g);
      if (dt == DType::kF32) {
        std::memcpy(&raw[static_cast<size_t>(i) * 4], &v, 4);
      } else {
        const uint16_t h = dt == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
        std::memcpy(&raw[static_cast<size_t>(i) * 2], &h, 2);
        v = dt == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
      val[static_cast<size_t>(i)] = v;
    }
  };
  fill(rank * in, c.a, c.af);
  fill(out * rank, c.b, c.bf);
  c.x.resize(static_cast<size_t>(nx * in));
  for (float& v : c.x) v = nd(g);
  c.f = own_lora_factors(dt, c.a.data(), c.b.data(), rank, in, out);
  return c;
}

std::vector<float> run(DeltaFn fn, const Case& c, const float* const* xs, int64_t nx) {
  std::vector<float> u(static_cast<size_t>(nx * c.out), -1.0f), t(static_cast<size_t>(nx * c.rank));
  std::vector<float*> us;
  for (int64_t i = 0; i < nx; ++i) us.push_back(u.data() + i * c.out);
  fn(c.f.view, xs, nx, t.data(), us.data());
  return u;
}

std::vector<const float*> rows(const Case& c) {
  std::vector<const float*> xs;
  for (int64_t i = 0; i < c.nx; ++i) xs.push_back(c.x.data() + i * c.in);
  return xs;
}

std::vector<Case> random_cases() {
  std::mt19937 g(45);
  std::uniform_int_distribution<int64_t> width(1, 300), rank(1, 70), nx(1, 20);
  std::vector<Case> cases;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    // Fixed edges: exact multiples of 16, one below/above, rank 1, a decode-sized SmolLM2 shape.
    cases.push_back(make_case(g, 16, 16, 1, 1, dt));
    cases.push_back(make_case(g, 15, 17, 3, 5, dt));
    cases.push_back(make_case(g, 576, 1536, 16, 2, dt));
    for (int i = 0; i < 14; ++i) cases.push_back(make_case(g, width(g), width(g), rank(g), nx(g), dt));
  }
  return cases;
}

TEST(LoraPacking, AccessorsReadTheFactorsBack) {
  for (const Case& c : random_cases()) {
    for (int64_t k = 0; k < c.rank; ++k)
      for (int64_t j = 0; j < c.in; ++j) ASSERT_EQ(c.f.view.a_at(k, j), c.af[static_cast<size_t>(k * c.in + j)]);
    for (int64_t o = 0; o < c.out; ++o)
      for (int64_t k = 0; k < c.rank; ++k) ASSERT_EQ(c.f.view.b_at(o, k), c.bf[static_cast<size_t>(o * c.rank + k)]);
  }
  // mlx-lm's lora_b comes rank-major ([rank, out]): the same panels.
  std::mt19937 g(1);
  Case c = make_case(g, 40, 37, 5, 1, DType::kF32);
  std::vector<float> bt(static_cast<size_t>(c.rank * c.out));
  for (int64_t o = 0; o < c.out; ++o)
    for (int64_t k = 0; k < c.rank; ++k) bt[static_cast<size_t>(k * c.out + o)] = c.bf[static_cast<size_t>(o * c.rank + k)];
  std::vector<uint8_t> packed(static_cast<size_t>(lora_panel_elems(c.rank, c.out)) * 4);
  pack_lora_b(DType::kF32, bt.data(), /*rank_major=*/true, c.rank, c.out, packed.data());
  EXPECT_EQ(packed, c.f.bp);
}

TEST(LoraReference, WithinRoundingOfDoubleAccumulation) {
  for (const Case& c : random_cases()) {
    const auto xs = rows(c);
    const std::vector<float> u = run(ref::lora_delta, c, xs.data(), c.nx);
    for (int64_t i = 0; i < c.nx; ++i) {
      std::vector<double> t(static_cast<size_t>(c.rank)), ta(static_cast<size_t>(c.rank));
      for (int64_t k = 0; k < c.rank; ++k)
        for (int64_t j = 0; j < c.in; ++j) {
          const double p = static_cast<double>(c.af[static_cast<size_t>(k * c.in + j)]) * c.x[static_cast<size_t>(i * c.in + j)];
          t[static_cast<size_t>(k)] += p;
          ta[static_cast<size_t>(k)] += std::abs(p);
        }
      for (int64_t o = 0; o < c.out; ++o) {
        double want = 0, S = 0;
        for (int64_t k = 0; k < c.rank; ++k) {
          const double b = c.bf[static_cast<size_t>(o * c.rank + k)];
          want += b * t[static_cast<size_t>(k)];
          S += std::abs(b) * ta[static_cast<size_t>(k)];
        }
        const double tol = static_cast<double>(c.in + c.rank + 4) * std::ldexp(1.0, -24) * S;
        ASSERT_LE(std::abs(u[static_cast<size_t>(i * c.out + o)] - want), tol)
            << dtype_name(c.dtype) << " " << c.out << "x" << c.in << " rank " << c.rank << " row " << i << " out " << o;
      }
    }
  }
}

void expect_tier_equals_reference(DeltaFn fn, const char* tier) {
  for (const Case& c : random_cases()) {
    const auto xs = rows(c);
    const std::vector<float> want = run(ref::lora_delta, c, xs.data(), c.nx);
    const std::vector<float> got = run(fn, c, xs.data(), c.nx);
    const std::string what = std::string(tier) + " " + dtype_name(c.dtype) + " " + std::to_string(c.out) + "x" +
                             std::to_string(c.in) + " rank " + std::to_string(c.rank) + " rows " + std::to_string(c.nx);
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << what;
    // Each row alone: the same bits as in the batch.
    for (int64_t i = 0; i < c.nx; ++i) {
      const std::vector<float> one = run(fn, c, &xs[static_cast<size_t>(i)], 1);
      ASSERT_EQ(0, std::memcmp(one.data(), got.data() + i * c.out, one.size() * sizeof(float))) << what << " row " << i;
    }
  }
}

TEST(LoraFast, Avx2EqualsReference) { expect_tier_equals_reference(cpu::avx2::lora_delta, "avx2"); }

TEST(LoraFast, Avx512EqualsReference) {
  if (!cpu_features().has_avx512_tier()) GTEST_SKIP() << "no AVX-512 tier on this CPU";
  expect_tier_equals_reference(cpu::avx512::lora_delta, "avx512");
}

}  // namespace
}  // namespace larder::kernels
