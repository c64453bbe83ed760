#include "larder/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

namespace larder::runtime {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The last `window` tokens of history (all of it for window <= 0).
std::pair<size_t, size_t> window_range(const std::vector<int32_t>& h, int window) {
  if (window <= 0 || static_cast<size_t>(window) >= h.size()) return {0, h.size()};
  return {h.size() - static_cast<size_t>(window), h.size()};
}

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

}  // namespace

double counter_uniform(uint64_t seed, uint64_t step) {
  // Two rounds so that nearby (seed, step) pairs decorrelate; 53 random bits → [0, 1).
  const uint64_t x = splitmix64(splitmix64(seed) ^ (step * 0xd1b54a32d192ed03ull + 0x8cb92ba72f3d8dd7ull));
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

void Sampler::process(float* logits, int64_t vocab, const std::vector<int32_t>& history) const {
  for (const auto& [id, b] : p_.logit_bias)
    if (id >= 0 && id < vocab) logits[id] += b;
  auto in_vocab = [&](int32_t t) { return t >= 0 && t < vocab; };
  if (p_.repetition_penalty != 1.0f) {
    auto [a, e] = window_range(history, p_.repetition_context_size);
    std::unordered_set<int32_t> seen;
    for (size_t i = a; i < e; ++i) {
      const int32_t t = history[i];
      if (!in_vocab(t) || !seen.insert(t).second) continue;
      float& l = logits[t];
      l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
    }
  }
  if (p_.presence_penalty != 0.0f) {
    auto [a, e] = window_range(history, p_.presence_context_size);
    std::unordered_set<int32_t> seen;
    for (size_t i = a; i < e; ++i)
      if (in_vocab(history[i]) && seen.insert(history[i]).second) logits[history[i]] -= p_.presence_penalty;
  }
  if (p_.frequency_penalty != 0.0f) {
    auto [a, e] = window_range(history, p_.frequency_context_size);
    std::unordered_map<int32_t, int> count;
    for (size_t i = a; i < e; ++i)
      if (in_vocab(history[i])) ++count[history[i]];
    for (const auto& [t, c] : count) logits[t] -= p_.frequency_penalty * static_cast<float>(c);
  }
}

std::vector<int32_t> Sampler::candidates(const float* logits, int64_t vocab) const {
  // Rank by logit (descending), lower id first on ties: a total order, so results never depend
  // on the sort implementation. NaN ranks as −inf (a NaN in a comparator breaks std::sort).
  auto key = [&](int32_t i) { return std::isnan(logits[i]) ? -INFINITY : logits[i]; };
  auto before = [&](int32_t a, int32_t b) {
    const float ka = key(a), kb = key(b);
    return ka != kb ? ka > kb : a < b;
  };
  // Probabilities at temperature 1, in double, normalized over the whole vocabulary.
  double mx = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, static_cast<double>(key(static_cast<int32_t>(i))));
  double z = 0;
  for (int64_t i = 0; i < vocab; ++i) z += std::exp(static_cast<double>(key(static_cast<int32_t>(i))) - mx);

  const size_t V = static_cast<size_t>(vocab);
  const bool use_top_p = p_.top_p > 0.0f && p_.top_p < 1.0f, use_min_p = p_.min_p > 0.0f;
  const bool k_limited = p_.top_k > 0 && static_cast<size_t>(p_.top_k) < V;
  // The filters keep prefixes of one ranking, so only that prefix needs sorting: start with the
  // top-k (or 256) tokens and widen only while a filter is still unresolved at the prefix's end.
  // Sorting a 150k vocabulary every step cost ~8 ms; the prefix costs ~0.3 ms.
  size_t k = k_limited ? static_cast<size_t>(p_.top_k) : (use_top_p || use_min_p ? std::min<size_t>(V, 256) : V);
  std::vector<int32_t> order(V);
  for (;;) {
    for (size_t i = 0; i < V; ++i) order[i] = static_cast<int32_t>(i);
    if (k < V) std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), before);
    std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), before);
    std::vector<double> prob(k);
    for (size_t i = 0; i < k; ++i) prob[i] = std::exp(static_cast<double>(key(order[i])) - mx) / z;
    size_t keep = k;
    bool unresolved = false;
    if (use_top_p) {
      double cum = 0;
      size_t n = 0;
      while (n < k) {
        cum += prob[n++];
        if (cum >= static_cast<double>(p_.top_p)) break;
      }
      if (cum < static_cast<double>(p_.top_p)) unresolved = true;
      keep = std::min(keep, n);
    }
    if (use_min_p) {
      const double thr = static_cast<double>(p_.min_p) * prob[0];
      size_t n = 0;
      while (n < k && prob[n] >= thr) ++n;
      if (n == k) unresolved = true;
      keep = std::min(keep, std::max<size_t>(n, 1));
    }
    if (unresolved && keep == k && k < V && !k_limited) {
      k = std::min(V, k * 4);
      continue;
    }
    keep = std::max<size_t>(keep, 1);
    order.resize(keep);
    return order;
  }
}

int32_t Sampler::sample_at(float* logits, int64_t vocab, const std::vector<int32_t>& history, uint64_t step) const {
  process(logits, vocab, history);
  return pick(logits, vocab, step);
}

int32_t Sampler::pick(const float* logits, int64_t vocab, uint64_t step) const {
  if (!(p_.temperature > 0.0f)) return argmax(logits, vocab);
  const bool filtered = (p_.top_k > 0 && p_.top_k < vocab) || (p_.top_p > 0.0f && p_.top_p < 1.0f) || p_.min_p > 0.0f;
  if (!filtered) {
    // No filter: draw over the whole vocabulary in id order — the same distribution as the
    // ranked walk below, without ranking 32k–150k tokens every step.
    double mx = -INFINITY;
    for (int64_t i = 0; i < vocab; ++i)
      if (!std::isnan(logits[i])) mx = std::max(mx, static_cast<double>(logits[i]));
    if (!std::isfinite(mx)) return argmax(logits, vocab);
    const double inv_t = 1.0 / static_cast<double>(p_.temperature);
    double z = 0;
    for (int64_t i = 0; i < vocab; ++i)
      if (!std::isnan(logits[i])) z += std::exp((static_cast<double>(logits[i]) - mx) * inv_t);
    const double u = counter_uniform(p_.seed, step) * z;
    double cum = 0;
    int64_t last = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (std::isnan(logits[i])) continue;
      const double w = std::exp((static_cast<double>(logits[i]) - mx) * inv_t);
      if (w <= 0) continue;
      cum += w;
      last = i;
      if (u < cum) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(last);
  }
  const std::vector<int32_t> cand = candidates(logits, vocab);
  const double mx = logits[cand[0]];
  if (!std::isfinite(mx)) return cand[0];  // degenerate logits (all NaN / -inf): nothing to draw
  std::vector<double> w(cand.size());
  double z = 0;
  for (size_t i = 0; i < cand.size(); ++i) {
    const double l = std::isnan(logits[cand[i]]) ? -INFINITY : static_cast<double>(logits[cand[i]]);
    z += (w[i] = std::exp((l - mx) / static_cast<double>(p_.temperature)));
  }
  const double u = counter_uniform(p_.seed, step) * z;
  double cum = 0;
  for (size_t i = 0; i < cand.size(); ++i) {
    cum += w[i];
    if (u < cum) return cand[i];
  }
  return cand.back();  // u·z rounding past the last cumulative sum
}

TokenLogprobs token_logprobs(const float* x, int64_t vocab, int32_t id, int k) {
  // log p_i = x_i - (max + log Σ exp(x_j - max)), in double.
  double mx = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i)
    if (!std::isnan(x[i]) && x[i] > mx) mx = x[i];
  double z = 0;
  for (int64_t i = 0; i < vocab; ++i)
    if (!std::isnan(x[i])) z += std::exp(static_cast<double>(x[i]) - mx);
  const double lse = mx + std::log(z);
  auto lp = [&](int64_t i) { return std::isnan(x[i]) ? -INFINITY : static_cast<float>(x[i] - lse); };
  TokenLogprobs r;
  r.id = id;
  r.logprob = (id >= 0 && id < vocab) ? lp(id) : -INFINITY;
  k = static_cast<int>(std::min<int64_t>(std::max(k, 0), vocab));
  if (k > 0) {
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    auto key = [&](int32_t i) { return std::isnan(x[i]) ? -INFINITY : x[i]; };
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      const float ka = key(a), kb = key(b);
      return ka != kb ? ka > kb : a < b;
    });
    for (int i = 0; i < k; ++i) {
      const float l = lp(order[static_cast<size_t>(i)]);
      if (l == -INFINITY) break;  // a masked token (constrained decoding) is no alternative
      r.top.emplace_back(order[static_cast<size_t>(i)], l);
    }
  }
  return r;
}

int32_t Sampler::sample(float* logits, int64_t vocab, const std::vector<int32_t>& history) {
  return sample_at(logits, vocab, history, step_++);
}

}  // namespace larder::runtime
