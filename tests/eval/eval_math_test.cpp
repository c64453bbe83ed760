// eval math (runtime/eval.h) against a direct double-precision computation written here from
// the definitions: softmax by explicit normalization (no logsumexp), KL as Σ p log(p/q).
#include "larder/runtime/eval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace larder::runtime {
namespace {

// Probabilities straight from the definition, shifted by the max only so exp does not overflow
// (the shift cancels in the ratio).
std::vector<double> softmax_direct(const std::vector<float>& x) {
  double m = x[0];
  for (float v : x) m = std::max(m, static_cast<double>(v));
  std::vector<double> p(x.size());
  double z = 0;
  for (size_t i = 0; i < x.size(); ++i) z += p[i] = std::exp(static_cast<double>(x[i]) - m);
  for (double& v : p) v /= z;
  return p;
}

double kl_direct(const std::vector<float>& a, const std::vector<float>& b) {
  const auto p = softmax_direct(a), q = softmax_direct(b);
  double kl = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] > 0) kl += p[i] * std::log(p[i] / q[i]);
  }
  return kl;
}

std::vector<float> random_logits(std::mt19937& rng, int64_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = d(rng);
  return x;
}

TEST(EvalMath, KlMatchesDirectOnRandomLogits) {
  std::mt19937 rng(7);
  for (int64_t vocab : {2, 17, 1000, 32000}) {
    for (float scale : {0.1f, 1.0f, 5.0f}) {
      auto a = random_logits(rng, vocab, scale);
      auto b = a;
      std::normal_distribution<float> noise(0.0f, 0.3f);
      for (auto& v : b) v += noise(rng);
      const double want = kl_direct(a, b);
      const double got = kl_divergence_logits(a.data(), b.data(), vocab);
      EXPECT_NEAR(got, want, 1e-9 + 1e-7 * want) << "vocab " << vocab << " scale " << scale;
      EXPECT_GE(got, 0.0);
    }
  }
}

TEST(EvalMath, KlOfIdenticalLogitsIsExactlyZero) {
  std::mt19937 rng(8);
  auto a = random_logits(rng, 5000, 3.0f);
  EXPECT_EQ(kl_divergence_logits(a.data(), a.data(), 5000), 0.0);
  // A constant shift leaves the distribution unchanged.
  auto b = a;
  for (auto& v : b) v += 12.5f;
  EXPECT_NEAR(kl_divergence_logits(a.data(), b.data(), 5000), 0.0, 1e-12);
}

TEST(EvalMath, ExtremeLogitsStayFinite) {
  // ±80 saturates f32 exp; −1e30 is how masked vocab entries look.
  std::vector<float> a = {80.0f, -80.0f, 0.0f, -1e30f, 79.0f, -1e30f};
  std::vector<float> b = {-80.0f, 80.0f, 1.0f, 0.0f, -1e30f, -1e30f};
  const int64_t n = static_cast<int64_t>(a.size());
  const double ab = kl_divergence_logits(a.data(), b.data(), n);
  EXPECT_TRUE(std::isfinite(ab));
  EXPECT_FALSE(std::isnan(ab));
  // Index 4 carries p_a ≈ 0.27 against q_b = exp(−1e30) = 0: the direct form says +inf, the
  // log-domain form a finite ~1e29. Either is acceptable; NaN is not.
  EXPECT_TRUE(std::isinf(ab) || ab > 1e20);

  std::vector<float> c = {80.0f, -80.0f, 0.0f, -1e30f, 79.0f};
  std::vector<float> d = {79.0f, 80.0f, -80.0f, -1e30f, 0.0f};
  const double cd = kl_divergence_logits(c.data(), d.data(), 5);
  EXPECT_NEAR(cd, kl_direct(c, d), 1e-9 * kl_direct(c, d));
  // Masked in ref, finite in cand: the 0 · log(0/q) term is 0, not NaN.
  std::vector<float> e = {1.0f, 2.0f, -1e30f};
  std::vector<float> f = {1.0f, 2.0f, 3.0f};
  const double ef = kl_divergence_logits(e.data(), f.data(), 3);
  EXPECT_NEAR(ef, kl_direct(e, f), 1e-12);
  EXPECT_NEAR(token_nll(c.data(), 5, 1), -std::log(softmax_direct(c)[1]), 1e-9);
  EXPECT_NEAR(token_nll(c.data(), 5, 0), -std::log(softmax_direct(c)[0]), 1e-12);
  EXPECT_TRUE(std::isfinite(token_nll(c.data(), 5, 3)));  // 1e30: huge but finite
  EXPECT_GT(token_nll(c.data(), 5, 3), 1e29);
}

TEST(EvalMath, TokenNllAndProbMatchDirect) {
  std::mt19937 rng(9);
  for (int64_t vocab : {3, 256, 32000}) {
    auto a = random_logits(rng, vocab, 4.0f);
    const auto p = softmax_direct(a);
    for (int32_t t : {0, static_cast<int32_t>(vocab / 2), static_cast<int32_t>(vocab - 1)}) {
      EXPECT_NEAR(token_nll(a.data(), vocab, t), -std::log(p[t]), 1e-9 * (1 + -std::log(p[t])));
      EXPECT_NEAR(token_prob(a.data(), vocab, t), p[t], 1e-12 + 1e-9 * p[t]);
    }
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; ++i) best = a[i] > a[best] ? i : best;
    EXPECT_EQ(argmax_logits(a.data(), vocab), best);
  }
}

TEST(EvalChunks, NonOverlappingWithBosOverwrite) {
  std::vector<int32_t> s(25);
  for (int i = 0; i < 25; ++i) s[i] = 100 + i;
  auto c = make_eval_chunks(s, 8, 0, 1);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  ASSERT_EQ(c->size(), 3u);  // 25 / 8, the partial tail dropped
  for (int k = 0; k < 3; ++k) {
    ASSERT_EQ((*c)[k].size(), 8u);
    EXPECT_EQ((*c)[k][0], 1);
    for (int i = 1; i < 8; ++i) EXPECT_EQ((*c)[k][i], 100 + 8 * k + i);
  }
  auto nobos = make_eval_chunks(s, 8, 2, std::nullopt);
  ASSERT_TRUE(nobos.is_ok());
  ASSERT_EQ(nobos->size(), 2u);
  EXPECT_EQ((*nobos)[1][0], 108);
  EXPECT_EQ(eval_first_scored(512), 256);
  EXPECT_EQ(eval_scored_per_chunk(512), 255);
}

TEST(EvalChunks, ClearErrors) {
  std::vector<int32_t> s(10, 5);
  auto short_stream = make_eval_chunks(s, 11, 0, std::nullopt);
  ASSERT_FALSE(short_stream.is_ok());
  EXPECT_NE(short_stream.status().message().find("[eval]"), std::string::npos);
  EXPECT_NE(short_stream.status().message().find("10 tokens"), std::string::npos);
  auto tiny = make_eval_chunks(s, 1, 0, std::nullopt);
  ASSERT_FALSE(tiny.is_ok());
  EXPECT_NE(tiny.status().message().find("context 1"), std::string::npos);
}

TEST(EvalMath, PercentileIsLinearInterpolation) {
  const std::vector<double> v = {1, 2, 3, 4, 10};
  EXPECT_DOUBLE_EQ(sorted_percentile(v, 50), 3);
  EXPECT_DOUBLE_EQ(sorted_percentile(v, 90), 4 + 0.6 * 6);  // numpy.percentile([1,2,3,4,10], 90)
  EXPECT_DOUBLE_EQ(sorted_percentile(v, 100), 10);
  EXPECT_DOUBLE_EQ(sorted_percentile(v, 0), 1);
}

TEST(EvalSanity, CollapseFlag) {
  std::vector<int32_t> base(40);
  for (int i = 0; i < 40; ++i) base[i] = 10 + i % 7;
  EXPECT_FALSE(generation_collapsed(base, base));
  // Starts fine, then loops on one token for its last 16+.
  std::vector<int32_t> loop(base.begin(), base.begin() + 10);
  loop.insert(loop.end(), 20, 99);
  EXPECT_TRUE(generation_collapsed(base, loop));
  // Looping like the base is not a collapse.
  EXPECT_FALSE(generation_collapsed(loop, loop));
  // EOS far too early: 9 tokens against the base's 40 (under a quarter).
  EXPECT_TRUE(generation_collapsed(base, std::vector<int32_t>(base.begin(), base.begin() + 9)));
  EXPECT_FALSE(generation_collapsed(base, std::vector<int32_t>(base.begin(), base.begin() + 10)));
  // A short base gives no length signal.
  EXPECT_FALSE(generation_collapsed(std::vector<int32_t>(base.begin(), base.begin() + 12), {}));
  // A few repeats at the end are not a loop (the window is the last 16 tokens).
  std::vector<int32_t> seven(base.begin(), base.begin() + 33);
  seven.insert(seven.end(), 7, 99);
  EXPECT_FALSE(generation_collapsed(base, seven));
}

}  // namespace
}  // namespace larder::runtime
