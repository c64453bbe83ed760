// Sampler: exact processor arithmetic (HF / OpenAI / mlx-lm definitions), filter mass
// properties, determinism of the counter-based RNG, and temperature sampling frequencies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "larder/runtime/sampler.h"

namespace larder::runtime {
namespace {

std::vector<float> randn(size_t n, uint64_t seed, float scale = 2.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<double> softmax(const std::vector<float>& l, double temp = 1.0) {
  double mx = *std::max_element(l.begin(), l.end()), z = 0;
  std::vector<double> p(l.size());
  for (size_t i = 0; i < l.size(); ++i) z += (p[i] = std::exp((l[i] - mx) / temp));
  for (double& x : p) x /= z;
  return p;
}

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  for (uint64_t s = 0; s < 20; ++s) {
    auto l = randn(500, s);
    const int32_t want = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    Sampler sm({});
    EXPECT_EQ(sm.sample(l.data(), 500, {}), want);
  }
  std::vector<float> tie = {1, 3, 0, 3};
  Sampler sm({});
  EXPECT_EQ(sm.sample(tie.data(), 4, {}), 1);
}

TEST(Sampler, NanLogitsNeverDrawnNorCrash) {
  std::vector<float> base(1000, 0.0f);
  for (size_t i = 0; i < base.size(); i += 3) base[i] = NAN;
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 3;
  Sampler s(p);
  for (int i = 0; i < 200; ++i) {
    auto l = base;
    const int32_t t = s.sample(l.data(), 1000, {});
    EXPECT_NE(t % 3, 0) << t;
  }
  std::vector<float> all(10, NAN);
  EXPECT_GE(Sampler(p).sample(all.data(), 10, {}), 0);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  std::vector<float> l = {2.0f, -2.0f, 1.0f, 0.5f};
  s.process(l.data(), 4, {0, 1, 0});  // token 0 twice: penalized once (a set, as in HF)
  EXPECT_EQ(l, (std::vector<float>{1.0f, -4.0f, 1.0f, 0.5f}));
}

TEST(Sampler, PresenceOnceFrequencyPerOccurrence) {
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p);
  std::vector<float> l = {2.0f, -2.0f, 1.0f, 0.5f};
  s.process(l.data(), 4, {0, 1, 0, 0});
  // token 0: 3 occurrences ⇒ −0.5 − 3·0.25; token 1: one ⇒ −0.5 − 0.25
  EXPECT_FLOAT_EQ(l[0], 2.0f - 0.5f - 0.75f);
  EXPECT_FLOAT_EQ(l[1], -2.0f - 0.5f - 0.25f);
  EXPECT_EQ(l[2], 1.0f);
  EXPECT_EQ(l[3], 0.5f);
}

TEST(Sampler, PenaltyWindows) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.repetition_context_size = 2;
  p.frequency_penalty = 1.0f;
  p.frequency_context_size = 3;
  Sampler s(p);
  std::vector<float> l = {4, 4, 4, 4};
  s.process(l.data(), 4, {0, 1, 2, 2, 3});
  // repetition window {2, 3}; frequency window {2, 2, 3}
  EXPECT_EQ(l, (std::vector<float>{4, 4, 4.0f / 2 - 2, 4.0f / 2 - 1}));
  SamplingParams all = p;
  all.repetition_context_size = 0;  // whole history
  all.frequency_penalty = 0;
  std::vector<float> m = {4, 4, 4, 4};
  Sampler(all).process(m.data(), 4, {0, 1, 2, 2, 3});
  EXPECT_EQ(m, (std::vector<float>{2, 2, 2, 2}));
}

TEST(Sampler, LogitBiasAddedOutOfRangeIgnored) {
  SamplingParams p;
  p.logit_bias = {{1, 10.0f}, {3, -5.0f}, {99, 1.0f}, {-4, 1.0f}};
  Sampler s(p);
  std::vector<float> l = {1, 2, 3, 4};
  s.process(l.data(), 4, {});
  EXPECT_EQ(l, (std::vector<float>{1, 12, 3, -1}));
  Sampler g(p);
  std::vector<float> l2 = {1, 2, 3, 4};
  EXPECT_EQ(g.sample(l2.data(), 4, {}), 1);  // bias decides the greedy pick
}

TEST(Sampler, TopKKeepsTheKLargest) {
  auto l = randn(300, 7);
  SamplingParams p;
  p.temperature = 1;
  p.top_k = 17;
  auto c = Sampler(p).candidates(l.data(), 300);
  ASSERT_EQ(c.size(), 17u);
  std::vector<float> sorted = l;
  std::sort(sorted.rbegin(), sorted.rend());
  for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(l[c[i]], sorted[i]);
}

TEST(Sampler, TopPIsTheSmallestSetWithMassAtLeastP) {
  auto l = randn(300, 8);
  const auto prob = softmax(l);
  for (float top_p : {0.05f, 0.3f, 0.9f, 0.999f}) {
    SamplingParams p;
    p.temperature = 1;
    p.top_p = top_p;
    auto c = Sampler(p).candidates(l.data(), 300);
    double mass = 0, min_in = 1;
    for (int32_t t : c) {
      mass += prob[t];
      min_in = std::min(min_in, prob[t]);
    }
    EXPECT_GE(mass, top_p - 1e-9);
    EXPECT_LT(mass - prob[c.back()], top_p);  // dropping the last one falls short
    for (int32_t t = 0; t < 300; ++t) {
      if (std::find(c.begin(), c.end(), t) == c.end()) {
        EXPECT_LE(prob[t], min_in);
      }
    }
  }
}

TEST(Sampler, MinPKeepsTokensAboveFractionOfMax) {
  auto l = randn(300, 9);
  const auto prob = softmax(l);
  const double pmax = *std::max_element(prob.begin(), prob.end());
  SamplingParams p;
  p.temperature = 1;
  p.min_p = 0.05f;
  auto c = Sampler(p).candidates(l.data(), 300);
  for (int32_t t = 0; t < 300; ++t) {
    const bool in = std::find(c.begin(), c.end(), t) != c.end();
    EXPECT_EQ(in, prob[t] >= 0.05 * pmax) << t;
  }
}

TEST(Sampler, FiltersCombineAsTheStrictest) {
  auto l = randn(300, 10);
  SamplingParams a, b, c, all;
  a.top_k = 40;
  b.top_p = 0.6f;
  c.min_p = 0.02f;
  all.top_k = 40;
  all.top_p = 0.6f;
  all.min_p = 0.02f;
  const size_t n = std::min({Sampler(a).candidates(l.data(), 300).size(), Sampler(b).candidates(l.data(), 300).size(),
                             Sampler(c).candidates(l.data(), 300).size()});
  EXPECT_EQ(Sampler(all).candidates(l.data(), 300).size(), n);
}

TEST(Sampler, SameSeedSameTokensIndependentOfOrder) {
  auto base = randn(200, 11, 1.0f);
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.seed = 1234;
  std::vector<int32_t> a, b;
  Sampler s1(p), s2(p);
  for (int i = 0; i < 100; ++i) {
    auto l1 = base, l2 = base;
    a.push_back(s1.sample(l1.data(), 200, {}));
    b.push_back(s2.sample(l2.data(), 200, {}));
  }
  EXPECT_EQ(a, b);
  // Step 57 drawn alone (e.g. another batch layout, or a resumed request) gives the same token.
  auto l = base;
  EXPECT_EQ(Sampler(p).sample_at(l.data(), 200, {}, 57), a[57]);
  // Another seed gives another sequence.
  p.seed = 1235;
  Sampler s3(p);
  std::vector<int32_t> c;
  for (int i = 0; i < 100; ++i) {
    auto l3 = base;
    c.push_back(s3.sample(l3.data(), 200, {}));
  }
  EXPECT_NE(a, c);
}

TEST(Sampler, CounterUniformIsUniform) {
  const int n = 100000, bins = 10;
  std::vector<int> h(bins);
  double mean = 0;
  for (int i = 0; i < n; ++i) {
    const double u = counter_uniform(99, static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    mean += u;
    ++h[static_cast<int>(u * bins)];
  }
  EXPECT_NEAR(mean / n, 0.5, 0.005);
  double chi2 = 0;
  for (int c : h) chi2 += (c - n / bins) * (c - n / bins) / double(n / bins);
  EXPECT_LT(chi2, 27.9);  // df 9, p = 0.001
}

// Frequencies of temperature sampling over 20000 steps match softmax(logits / T) restricted to
// the candidates. Pearson chi-square with df = k − 1; the bound is the p = 0.001 quantile. The
// seed is fixed, so this is deterministic; the bound says a correct sampler passes for almost
// every seed and a wrong temperature or renormalization fails by orders of magnitude.
double chi_square(const SamplingParams& p, const std::vector<float>& logits, const std::vector<double>& expect,
                  int n, std::vector<int>* counts_out = nullptr) {
  std::vector<int> counts(logits.size());
  Sampler s(p);
  for (int i = 0; i < n; ++i) {
    auto l = logits;
    ++counts[static_cast<size_t>(s.sample(l.data(), static_cast<int64_t>(l.size()), {}))];
  }
  double chi2 = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (expect[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " is outside the candidate set";
      continue;
    }
    const double e = expect[i] * n;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  if (counts_out) *counts_out = counts;
  return chi2;
}

TEST(Sampler, TemperatureFrequencies) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 42;
  EXPECT_LT(chi_square(p, logits, softmax(logits, 0.7), 20000), 18.47);  // df 4
  // A wrong temperature is detected: the T = 0.7 counts are far from the T = 1 distribution.
  EXPECT_GT(chi_square(p, logits, softmax(logits, 1.0), 20000), 200.0);
  // top_k = 3 keeps tokens {1, 4, 0} and renormalizes among them.
  p.top_k = 3;
  p.seed = 43;
  auto e = softmax(logits, 0.7);
  e[2] = e[3] = 0;
  const double z = e[0] + e[1] + e[4];
  for (double& x : e) x /= z;
  EXPECT_LT(chi_square(p, logits, e, 20000), 13.82);  // df 2
}

}  // namespace
}  // namespace larder::runtime

namespace larder::runtime {
namespace {

// candidates() ranks only the prefix the filters keep, widening it while a filter is unresolved;
// on a large, flat vocabulary (filters keep thousands of tokens) it must equal a brute-force
// full sort.
TEST(Sampler, PrefixRankingEqualsFullSortOnLargeFlatVocab) {
  const int64_t V = 5000;
  std::vector<float> l(V);
  uint32_t s = 7;
  for (auto& x : l) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / 16777216.0f * 0.5f;  // flat: probabilities within e^0.5
  }
  std::vector<int32_t> ranked(V);
  for (int64_t i = 0; i < V; ++i) ranked[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::sort(ranked.begin(), ranked.end(), [&](int32_t a, int32_t b) { return l[a] != l[b] ? l[a] > l[b] : a < b; });
  double mx = l[ranked[0]], z = 0;
  for (float x : l) z += std::exp(static_cast<double>(x) - mx);
  for (float top_p : {0.3f, 0.9f, 0.999f}) {
    SamplingParams p;
    p.temperature = 1;
    p.top_p = top_p;
    size_t n = 0;
    double cum = 0;
    while (n < ranked.size()) {
      cum += std::exp(static_cast<double>(l[ranked[n++]]) - mx) / z;
      if (cum >= top_p) break;
    }
    const auto c = Sampler(p).candidates(l.data(), V);
    ASSERT_EQ(c.size(), n) << "top_p " << top_p;
    EXPECT_TRUE(std::equal(c.begin(), c.end(), ranked.begin())) << "top_p " << top_p;
  }
  SamplingParams mp;
  mp.temperature = 1;
  mp.min_p = 0.7f;  // keeps tokens within ln(1/0.7) ≈ 0.36 of the max: most of them
  const auto c = Sampler(mp).candidates(l.data(), V);
  size_t n = 0;
  while (n < ranked.size() && std::exp(static_cast<double>(l[ranked[n]]) - mx) >= 0.7) ++n;
  EXPECT_GT(n, 1000u);
  ASSERT_EQ(c.size(), n);
  EXPECT_TRUE(std::equal(c.begin(), c.end(), ranked.begin()));
}

}  // namespace
}  // namespace larder::runtime

namespace larder::runtime {
namespace {

// The definition candidates() must equal: rank every non-NaN id (logit descending, lower id on
// ties), probabilities in double over the whole row, then top_k's count, min_p's first token
// below min_p·p_max and top_p's token reaching the mass, whichever comes first (the top token
// always kept).
std::vector<int32_t> candidates_by_full_sort(const std::vector<float>& l, const SamplingParams& p) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < l.size(); ++i)
    if (!std::isnan(l[i])) ids.push_back(static_cast<int32_t>(i));
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] != l[b] ? l[a] > l[b] : a < b; });
  const double mx = l[ids[0]];
  double z = 0;
  for (int32_t i : ids) z += std::exp(static_cast<double>(l[i]) - mx);
  const size_t limit = p.top_k > 0 && static_cast<size_t>(p.top_k) < l.size() ? static_cast<size_t>(p.top_k) : l.size();
  std::vector<int32_t> keep;
  double cum = 0;
  for (size_t n = 0; n < ids.size() && keep.size() < limit; ++n) {
    const double q = std::exp(static_cast<double>(l[ids[n]]) - mx) / z;
    if (p.min_p > 0 && q < p.min_p / z && !keep.empty()) break;
    keep.push_back(ids[n]);
    cum += q;
    if (p.top_p > 0 && p.top_p < 1 && cum >= p.top_p) break;
  }
  return keep;
}

// candidates() ranks lazily (bands below the maximum, chunks within a band, kernels::select and
// sum_exp): over rows shaped like real logits (a peaked head over a wide tail), flat rows where
// the filters reach deep, rows of ties, rows with masked (−∞) and NaN tokens, and vocabularies
// from 1 to 152k, it must return exactly the full sort's set, in order.
TEST(Sampler, CandidatesEqualTheFullSortDefinition) {
  std::mt19937_64 rng(99);
  const std::vector<SamplingParams> filters = [] {
    std::vector<SamplingParams> v;
    for (int k : {0, 1, 5, 40, 100000})
      for (float tp : {1.0f, 0.5f, 0.9f, 0.95f, 0.999f})
        for (float mp : {0.0f, 0.05f, 0.5f}) {
          SamplingParams p;
          p.temperature = 0.8f;
          p.top_k = k, p.top_p = tp, p.min_p = mp;
          if (k == 0 && tp == 1.0f && mp == 0.0f) continue;  // unfiltered: pick() never ranks
          v.push_back(p);
        }
    return v;
  }();
  int checked = 0;
  for (int64_t V : {1, 3, 70, 1000, 5000, 49152, 151936}) {
    for (int shape = 0; shape < 5; ++shape) {
      std::normal_distribution<float> d(0.0f, shape == 1 ? 0.3f : 2.5f);
      std::vector<float> l(static_cast<size_t>(V));
      for (float& x : l) x = d(rng);
      if (shape == 0)  // a peaked head: a few tokens 5–15 above the bulk
        for (int i = 0; i < 12; ++i) l[rng() % static_cast<uint64_t>(V)] += 5.0f + static_cast<float>(rng() % 10);
      if (shape == 2)
        for (float& x : l) x = static_cast<float>(static_cast<int>(x));  // ties everywhere
      if (shape == 3)  // constrained decoding: most tokens masked
        for (float& x : l) x = rng() % 8 == 0 ? x : -INFINITY;
      if (shape == 4)
        for (float& x : l) x = rng() % 50 == 0 ? NAN : x;
      if (std::all_of(l.begin(), l.end(), [](float x) { return !std::isfinite(x); })) l[0] = 0.0f;
      for (const SamplingParams& p : filters) {
        // A few filter sets per row on the large vocabularies (the reference sorts the row).
        if (V > 5000 && rng() % 6 != 0) continue;
        const auto want = candidates_by_full_sort(l, p);
        const auto got = Sampler(p).candidates(l.data(), V);
        ASSERT_EQ(got, want) << "V " << V << " shape " << shape << " top_k " << p.top_k << " top_p " << p.top_p
                             << " min_p " << p.min_p;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 300);
}

// token_logprobs' alternatives are the full sort's first k (masked tokens excluded), with
// log-probabilities of the whole row.
TEST(Sampler, LogprobAlternativesEqualTheFullSort) {
  std::mt19937_64 rng(5);
  for (int64_t V : {10, 3000, 49152}) {
    std::normal_distribution<float> d(0.0f, 2.0f);
    std::vector<float> l(static_cast<size_t>(V));
    for (float& x : l) x = d(rng);
    for (size_t i = 0; i < l.size(); i += 7) l[i] = -INFINITY;
    std::vector<int32_t> ids;
    double mx = -INFINITY, z = 0;
    for (size_t i = 0; i < l.size(); ++i) {
      if (l[i] > -INFINITY) ids.push_back(static_cast<int32_t>(i));
      mx = std::max(mx, static_cast<double>(l[i]));
    }
    for (float x : l) z += std::exp(static_cast<double>(x) - mx);
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] != l[b] ? l[a] > l[b] : a < b; });
    for (int k : {0, 1, 5, 20}) {
      const TokenLogprobs r = token_logprobs(l.data(), V, ids[3], k);
      EXPECT_NEAR(r.logprob, l[ids[3]] - mx - std::log(z), 1e-5);
      ASSERT_EQ(r.top.size(), std::min<size_t>(static_cast<size_t>(k), ids.size())) << "V " << V << " k " << k;
      for (size_t i = 0; i < r.top.size(); ++i) {
        EXPECT_EQ(r.top[i].first, ids[i]) << "V " << V << " k " << k << " i " << i;
        EXPECT_NEAR(r.top[i].second, l[ids[i]] - mx - std::log(z), 1e-5);
      }
    }
  }
}

// post_sampling_probs (llama-server's post_sampling_probs): the distribution pick() draws from —
// the full sort's candidates, softmax at the temperature over them — its first k with nonzero
// mass, the sampled token's probability, and for greedy the argmax alone with probability 1.
// The probabilities are those pick() realises: their empirical frequencies match.
TEST(Sampler, PostSamplingProbsAreTheDrawDistribution) {
  std::mt19937_64 rng(17);
  for (int64_t V : {10, 3000, 49152}) {
    std::normal_distribution<float> d(0.0f, 2.0f);
    std::vector<float> l(static_cast<size_t>(V));
    for (float& x : l) x = d(rng);
    for (size_t i = 0; i < l.size(); i += 7) l[i] = -INFINITY;  // masked by a grammar
    for (int k : {0, 1, 3, 20}) {
      for (int f = 0; f < 4; ++f) {
        SamplingParams p;
        p.temperature = f == 3 ? 0.0f : 0.7f;
        p.top_k = f == 1 ? 5 : 0;
        p.top_p = f == 2 ? 0.8f : 1.0f;
        const Sampler s(p);
        std::vector<int32_t> cand = f == 0 || f == 3 ? std::vector<int32_t>{} : candidates_by_full_sort(l, p);
        if (f == 0) {  // unfiltered: every unmasked token, ranked
          for (size_t i = 0; i < l.size(); ++i)
            if (l[i] > -INFINITY) cand.push_back(static_cast<int32_t>(i));
          std::sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) { return l[a] != l[b] ? l[a] > l[b] : a < b; });
        }
        if (f == 3) {
          const int32_t top = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
          const TokenLogprobs r = s.post_sampling_probs(l.data(), V, top, k);
          EXPECT_TRUE(r.linear);
          EXPECT_EQ(r.logprob, 1.0f);
          ASSERT_EQ(r.top.size(), k > 0 ? 1u : 0u);
          if (k > 0) EXPECT_EQ(r.top[0], std::make_pair(top, 1.0f));
          continue;
        }
        double mx = l[cand[0]], z = 0;
        for (int32_t c : cand) z += std::exp((l[c] - mx) / 0.7);
        const int32_t sampled = cand[cand.size() / 2];
        const TokenLogprobs r = s.post_sampling_probs(l.data(), V, sampled, k);
        EXPECT_TRUE(r.linear);
        EXPECT_NEAR(r.logprob, std::exp((l[sampled] - mx) / 0.7) / z, 1e-6) << "V " << V << " f " << f;
        ASSERT_EQ(r.top.size(), std::min<size_t>(static_cast<size_t>(k), cand.size())) << "V " << V << " k " << k;
        for (size_t i = 0; i < r.top.size(); ++i) {
          EXPECT_EQ(r.top[i].first, cand[i]) << "V " << V << " k " << k << " f " << f << " i " << i;
          EXPECT_NEAR(r.top[i].second, std::exp((l[cand[i]] - mx) / 0.7) / z, 1e-6);
        }
        const TokenLogprobs none = s.post_sampling_probs(l.data(), V, 0, 0);  // id 0 is masked
        EXPECT_EQ(none.logprob, 0.0f);
      }
    }
  }
  // Frequencies: pick() over 40000 draws lands on each candidate as often as reported.
  std::vector<float> l = {2.0f, 1.5f, 1.0f, 0.2f, -1.0f, -INFINITY};
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 4;
  p.seed = 11;
  const Sampler s(p);
  const TokenLogprobs r = s.post_sampling_probs(l.data(), 6, 0, 6);
  ASSERT_EQ(r.top.size(), 4u);
  std::vector<int> hits(6, 0);
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++hits[static_cast<size_t>(s.pick(l.data(), 6, static_cast<uint64_t>(i)))];
  for (const auto& [id, prob] : r.top) EXPECT_NEAR(hits[static_cast<size_t>(id)] / double(n), prob, 0.01) << id;
  EXPECT_EQ(hits[4] + hits[5], 0);
}

// Unfiltered temperature sampling sums the weights in blocks (vectorised) and walks one block: the
// same draw as walking the whole row in id order with double weights, except where u·z falls
// within rounding (~1e-7 relative) of a boundary between two tokens; and a masked token is
// never drawn, even when whole blocks are masked.
TEST(Sampler, BlockwiseUnfilteredDrawEqualsTheIdOrderWalk) {
  const int64_t V = 20000;  // ten blocks
  std::mt19937_64 rng(8);
  std::normal_distribution<float> d(0.0f, 1.5f);
  std::vector<float> l(static_cast<size_t>(V));
  for (float& x : l) x = d(rng);
  for (int64_t i = 4096; i < 8192; ++i) l[static_cast<size_t>(i)] = -INFINITY;  // two masked blocks
  SamplingParams p;
  p.temperature = 0.9f;
  p.seed = 3;
  const Sampler s(p);
  double mx = -INFINITY;
  for (float x : l) mx = std::max(mx, static_cast<double>(x));
  int differ = 0;
  const int kDraws = 3000;
  for (int step = 0; step < kDraws; ++step) {
    double z = 0;
    for (float x : l) z += std::exp((x - mx) / p.temperature);
    const double u = counter_uniform(p.seed, static_cast<uint64_t>(step)) * z;
    double cum = 0;
    int32_t want = -1;
    for (int64_t i = 0; i < V && want < 0; ++i)
      if ((cum += std::exp((l[static_cast<size_t>(i)] - mx) / p.temperature)) > u) want = static_cast<int32_t>(i);
    const int32_t got = s.pick(l.data(), V, static_cast<uint64_t>(step));
    ASSERT_TRUE(got < 4096 || got >= 8192) << "masked token " << got << " drawn at step " << step;
    differ += got != want;
  }
  EXPECT_LE(differ, kDraws / 200) << "draws that differ from the id-order walk";
}

}  // namespace
}  // namespace larder::runtime
