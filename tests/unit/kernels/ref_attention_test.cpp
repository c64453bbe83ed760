// Reference causal GQA attention vs an independent naive implementation, plus hand-derived
// cases and the span-list contract (a shared prefix span followed by a private tail).
#include <gtest/gtest.h>

#include <cmath>

#include "larder/kernels/ref/ref_ops.h"
#include "test_util.h"

namespace larder::kernels {
namespace {

using testing::randn;

// Naive oracle over whole K/V arrays [T, n_kv, d]: materialize scores, softmax, weighted sum.
std::vector<double> naive(const std::vector<float>& q, int64_t n, int64_t pos0, const std::vector<float>& k,
                          const std::vector<float>& v, const AttentionParams& p) {
  const int64_t kvr = int64_t{p.n_kv_heads} * p.head_dim;
  std::vector<double> out(static_cast<size_t>(n * p.n_heads * p.head_dim), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t qp = pos0 + t;
    for (int h = 0; h < p.n_heads; ++h) {
      const int kvh = h * p.n_kv_heads / p.n_heads;  // GQA: consecutive query heads share a kv head
      std::vector<double> s;
      std::vector<int64_t> idx;
      for (int64_t j = 0; j <= qp; ++j) {
        if (p.window > 0 && j <= qp - p.window) continue;
        double d = 0;
        for (int i = 0; i < p.head_dim; ++i)
          d += double(q[(t * p.n_heads + h) * p.head_dim + i]) * k[j * kvr + kvh * p.head_dim + i];
        s.push_back(d * p.scale);
        idx.push_back(j);
      }
      double mx = p.sinks ? double(p.sinks[h]) : -INFINITY, z = p.sinks ? std::exp(double(p.sinks[h]) - mx) : 0;
      for (double x : s) mx = std::max(mx, x);
      if (p.sinks) z = std::exp(double(p.sinks[h]) - mx);
      for (double& x : s) z += (x = std::exp(x - mx));
      for (size_t a = 0; a < s.size(); ++a)
        for (int i = 0; i < p.head_dim; ++i)
          out[(t * p.n_heads + h) * p.head_dim + i] += s[a] / z * v[idx[a] * kvr + kvh * p.head_dim + i];
    }
  }
  return out;
}

// Splits positions [0, T) into spans at the given cut points.
std::vector<KvSpanView> split(const std::vector<float>& k, const std::vector<float>& v, int64_t T, int64_t kvr,
                              std::vector<int64_t> cuts) {
  std::vector<KvSpanView> sp;
  cuts.push_back(T);
  int64_t at = 0;
  for (int64_t c : cuts) {
    if (c <= at) continue;
    sp.push_back({k.data() + at * kvr, v.data() + at * kvr, at, c - at});
    at = c;
  }
  return sp;
}

TEST(RefAttention, SingleKeyReturnsItsValue) {
  AttentionParams p{1, 1, 4, 0.5f, 0};
  const std::vector<float> q = {1, 2, 3, 4}, k = {4, 3, 2, 1}, v = {-1, 0.5f, 2, 7};
  auto sp = split(k, v, 1, 4, {});
  float out[4];
  ref::attention(q.data(), 1, 0, sp.data(), 1, p, out);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(out[i], v[i]);
}

TEST(RefAttention, EqualScoresAverage) {
  // q ⟂ both keys ⇒ equal scores ⇒ the mean of the values; the future key (pos 2) is masked.
  AttentionParams p{1, 1, 2, 1.0f, 0};
  const std::vector<float> q = {0, 1}, k = {1, 0, -3, 0, 0, 100}, v = {2, 4, 6, 8, 1000, 1000};
  auto sp = split(k, v, 3, 2, {});
  float out[2];
  ref::attention(q.data(), 1, 1, sp.data(), 1, p, out);  // query at position 1 sees keys 0..1
  EXPECT_FLOAT_EQ(out[0], 4.0f);
  EXPECT_FLOAT_EQ(out[1], 6.0f);
}

TEST(RefAttention, MatchesNaiveGqaSpansWindows) {
  std::mt19937_64 rng(21);
  struct Shape { int nh, nkv, d; int64_t pos0, n; int64_t window; };
  const Shape shapes[] = {{4, 4, 8, 0, 9, 0},  {8, 2, 16, 5, 3, 0}, {6, 3, 5, 0, 1, 0},
                          {4, 1, 32, 40, 7, 0}, {2, 1, 8, 10, 6, 4}, {3, 3, 7, 0, 13, 0}};
  for (const Shape& s : shapes) {
    AttentionParams p{s.nh, s.nkv, s.d, static_cast<float>(1.0 / std::sqrt(s.d)), s.window};
    const int64_t T = s.pos0 + s.n, kvr = int64_t{s.nkv} * s.d;
    auto q = randn(static_cast<size_t>(s.n * s.nh * s.d), rng, 2.0f);
    auto k = randn(static_cast<size_t>(T * kvr), rng, 2.0f);
    auto v = randn(static_cast<size_t>(T * kvr), rng);
    const auto want = naive(q, s.n, s.pos0, k, v, p);
    std::vector<float> first;
    for (const auto& cuts : {std::vector<int64_t>{}, std::vector<int64_t>{T / 2}, std::vector<int64_t>{1, T - 1}}) {
      auto sp = split(k, v, T, kvr, cuts);
      std::vector<float> out(want.size(), NAN);
      ref::attention(q.data(), s.n, s.pos0, sp.data(), static_cast<int>(sp.size()), p, out.data());
      for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(out[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << i;
      if (first.empty()) first = out;
      EXPECT_EQ(out, first) << "span boundaries must not change the result";
    }
  }
}

// Attention sinks (gpt-oss): a per-head logit in the softmax denominator with no value row.
// One key of score a and a sink s: the output is v · e^a / (e^a + e^s) — with a == s, v / 2.
TEST(RefAttention, SinkIsALogitWithoutAValue) {
  const float sinks[2] = {0.5f, -30.0f};
  AttentionParams p{2, 1, 2, 1.0f, 0};
  p.sinks = sinks;
  const std::vector<float> q = {0.5f, 0, 0.5f, 0}, k = {1, 0}, v = {4, -2};  // both heads score 0.5
  auto sp = split(k, v, 1, 2, {});
  float out[4];
  ref::attention(q.data(), 1, 0, sp.data(), 1, p, out);
  EXPECT_FLOAT_EQ(out[0], 2.0f);  // head 0: sink == score, half the weight
  EXPECT_FLOAT_EQ(out[1], -1.0f);
  EXPECT_NEAR(out[2], 4.0f, 1e-6f);  // head 1: a sink far below the score takes nothing
}

TEST(RefAttention, SinksMatchNaiveGqaSpansWindows) {
  std::mt19937_64 rng(22);
  struct Shape { int nh, nkv, d; int64_t pos0, n; int64_t window; };
  const Shape shapes[] = {{4, 2, 8, 0, 9, 0}, {4, 1, 16, 20, 7, 0}, {2, 1, 8, 10, 6, 4}};
  for (const Shape& s : shapes) {
    auto sinks = randn(static_cast<size_t>(s.nh), rng, 3.0f);
    AttentionParams p{s.nh, s.nkv, s.d, static_cast<float>(1.0 / std::sqrt(s.d)), s.window};
    p.sinks = sinks.data();
    const int64_t T = s.pos0 + s.n, kvr = int64_t{s.nkv} * s.d;
    auto q = randn(static_cast<size_t>(s.n * s.nh * s.d), rng, 2.0f);
    auto k = randn(static_cast<size_t>(T * kvr), rng, 2.0f);
    auto v = randn(static_cast<size_t>(T * kvr), rng);
    const auto want = naive(q, s.n, s.pos0, k, v, p);
    auto sp = split(k, v, T, kvr, {T / 2});
    std::vector<float> out(want.size(), NAN);
    ref::attention(q.data(), s.n, s.pos0, sp.data(), static_cast<int>(sp.size()), p, out.data());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(out[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << i;
  }
}

}  // namespace
}  // namespace larder::kernels
