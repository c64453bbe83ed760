// The logits-row ops (kernels::argmax, sum_exp, select_at_least: the sampler's per-token passes)
// of every fast tier against the scalar reference over random lengths (ragged tails around the
// 8/16/32/64-float steps) and rows with ties, NaN, −∞ and all-masked rows.
//
// Bounds: argmax and select_at_least are exact. sum_exp evaluates e^x with the tiers' f32 exp
// (≤ ~1 ulp) of an f32 (x − shift)·scale where the reference works in double: an argument of
// magnitude a carries ~a·2^-24 relative error, so terms that matter (a ≤ ~20) are within ~1.2e-6;
// summed in double lanes: checked at 2e-6 relative.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "larder/core/cpuid.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels {
namespace {

using ArgmaxFn = int64_t (*)(const float*, int64_t);
using SumExpFn = double (*)(const float*, int64_t, float, float);

struct Tier {
  const char* name;
  ArgmaxFn argmax;
  SumExpFn sum_exp;
};

std::vector<Tier> tiers() {
  std::vector<Tier> t = {{"avx2", cpu::avx2::argmax, cpu::avx2::sum_exp}};
  if (cpu_features().has_avx512_tier()) t.push_back({"avx512", cpu::avx512::argmax, cpu::avx512::sum_exp});
  return t;
}

// A row of `kind`: 0 normal logits; 1 few distinct values (many ties); 2 with NaN and −∞ mixed
// in; 3 all −∞ but a few; 4 all NaN; 5 all −∞.
std::vector<float> row(std::mt19937& rng, int64_t n, int kind) {
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::uniform_int_distribution<int> u(0, 9);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    switch (kind) {
      case 0: x = d(rng); break;
      case 1: x = static_cast<float>(u(rng) % 3); break;
      case 2: x = u(rng) == 0 ? NAN : u(rng) == 1 ? -INFINITY : d(rng); break;
      case 3: x = u(rng) == 0 ? d(rng) : -INFINITY; break;
      case 4: x = NAN; break;
      default: x = -INFINITY; break;
    }
  }
  return v;
}

const std::vector<int64_t> kLengths = {1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 1000, 4097, 49152, 70001};

TEST(FastLogits, ArgmaxMatchesReference) {
  std::mt19937 rng(11);
  for (const Tier& t : tiers()) {
    for (int64_t n : kLengths) {
      for (int kind = 0; kind < 6; ++kind) {
        std::vector<float> v = row(rng, n, kind);
        ASSERT_EQ(t.argmax(v.data(), n), ref::argmax(v.data(), n)) << t.name << " n " << n << " kind " << kind;
        // The maximum in the ragged tail, and tied with an earlier one: the lowest index wins.
        if (kind == 0 && n > 2) {
          v[static_cast<size_t>(n - 1)] = 100.0f;
          ASSERT_EQ(t.argmax(v.data(), n), n - 1) << t.name << " n " << n;
          v[static_cast<size_t>(n / 2)] = 100.0f;
          ASSERT_EQ(t.argmax(v.data(), n), n / 2) << t.name << " n " << n;
        }
      }
    }
  }
  // The reference's own contract: NaN never wins, even at index 0; all-NaN rows give 0.
  const std::vector<float> nan_first = {NAN, -5.0f, -1.0f, -1.0f};
  EXPECT_EQ(ref::argmax(nan_first.data(), 4), 2);
  const std::vector<float> all_nan = {NAN, NAN};
  EXPECT_EQ(ref::argmax(all_nan.data(), 2), 0);
  const std::vector<float> masked = {-INFINITY, -INFINITY, -INFINITY};
  EXPECT_EQ(ref::argmax(masked.data(), 3), 0);
}

TEST(FastLogits, SumExpMatchesReference) {
  std::mt19937 rng(12);
  for (const Tier& t : tiers()) {
    for (int64_t n : kLengths) {
      for (int kind : {0, 1, 2, 3}) {
        const std::vector<float> v = row(rng, n, kind);
        const int64_t top = ref::argmax(v.data(), n);
        if (!std::isfinite(v[static_cast<size_t>(top)])) continue;
        for (float scale : {1.0f, 1.0f / 0.7f, 1.0f / 1.5f, 20.0f}) {
          const double want = ref::sum_exp(v.data(), n, v[static_cast<size_t>(top)], scale);
          const double got = t.sum_exp(v.data(), n, v[static_cast<size_t>(top)], scale);
          ASSERT_GE(want, 1.0);  // the maximum's own term
          ASSERT_NEAR(got, want, 2e-6 * want) << t.name << " n " << n << " kind " << kind << " scale " << scale;
        }
      }
    }
  }
  // NaN and −∞ add exactly nothing: a row of one 0 among them sums to e^0 = 1.
  for (const Tier& t : tiers()) {
    std::vector<float> v(37, -INFINITY);
    v[3] = NAN;
    v[20] = 0.0f;
    EXPECT_EQ(t.sum_exp(v.data(), 37, 0.0f, 1.0f), 1.0) << t.name;
    v[20] = -INFINITY;  // a fully masked block of the sampler's blockwise draw weighs exactly 0
    EXPECT_EQ(t.sum_exp(v.data(), 37, 0.0f, 1.0f), 0.0) << t.name;
  }
}

TEST(FastLogits, SelectAtLeastMatchesReference) {
  std::mt19937 rng(13);
  for (int64_t n : kLengths) {
    for (int kind = 0; kind < 6; ++kind) {
      const std::vector<float> v = row(rng, n, kind);
      for (float t : {-INFINITY, -3.0f, 0.0f, 1.0f, 2.0f, 6.0f, 50.0f}) {
        std::vector<int32_t> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
        const int64_t kw = ref::select_at_least(v.data(), n, t, want.data());
        const int64_t kg = cpu::avx2::select_at_least(v.data(), n, t, got.data());
        ASSERT_EQ(kg, kw) << "n " << n << " kind " << kind << " t " << t;
        for (int64_t i = 0; i < kw; ++i) ASSERT_EQ(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)]) << i;
        for (int64_t i = 0; i < kw; ++i) ASSERT_GE(v[static_cast<size_t>(want[static_cast<size_t>(i)])], t);  // the definition
      }
    }
  }
}

}  // namespace
}  // namespace larder::kernels
