#include "larder/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "larder/kernels/ops.h"

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

namespace {

// The ids of a row of logits in ranking order — logit descending, lower id first on ties (a
// total order, so results never depend on the sort implementation) — produced lazily: the
// filters stop after a few to a few hundred ids, and ranking the whole vocabulary (49k–262k ids)
// cost 0.7–4.4 ms per token. Ids are selected in bands below the maximum, one vectorised pass
// each (the first band: within 8 of it, e^-8 of the top weight; then 16, 32, 64, everything),
// and each band is ranked only as far as it is consumed, in chunks growing 4× (partition, then
// sort the chunk). NaN logits are never produced; −∞ ones only by the last band.
class Ranking {
 public:
  Ranking(const float* logits, int64_t vocab, float mx) : l_(logits), vocab_(vocab), mx_(mx) {}

  // The next id, or -1 after the last.
  int32_t next() {
    while (pos_ == ranked_.size()) {
      if (pending_.empty() && !widen()) return -1;
      rank_chunk();
    }
    return ranked_[pos_++];
  }

 private:
  bool before(int32_t a, int32_t b) const { return l_[a] != l_[b] ? l_[a] > l_[b] : a < b; }

  // Selects the next band into pending_; false once everything was selected.
  bool widen() {
    while (reach_ != INFINITY) {
      const float upper = mx_ - reach_;  // ids at or above it came with earlier bands
      const bool first = reach_ == 0;
      reach_ = first ? 8.0f : reach_ >= 64.0f ? INFINITY : 2 * reach_;
      // Uninitialized room for a whole row (a zero-filled vector cost ~20 µs at 262k ids).
      if (!sel_) sel_.reset(new int32_t[static_cast<size_t>(vocab_)]);
      const float lower = reach_ == INFINITY ? -INFINITY : mx_ - reach_;
      const int64_t k = kernels::select_at_least(l_, vocab_, lower, sel_.get());
      pending_.assign(sel_.get(), sel_.get() + k);
      if (!first) std::erase_if(pending_, [&](int32_t i) { return l_[i] >= upper; });
      if (!pending_.empty()) {
        chunk_ = 64;
        return true;
      }
    }
    return false;
  }

  void rank_chunk() {
    ranked_.clear();
    pos_ = 0;
    const auto cmp = [this](int32_t a, int32_t b) { return before(a, b); };
    if (pending_.size() > chunk_) {
      std::nth_element(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(chunk_), pending_.end(), cmp);
      ranked_.assign(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(chunk_));
      pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(chunk_));
      chunk_ *= 4;
    } else {
      ranked_.swap(pending_);  // ranked_ was cleared above, so pending_ is now empty
    }
    std::sort(ranked_.begin(), ranked_.end(), cmp);
  }

  const float* l_;
  int64_t vocab_;
  float mx_;
  float reach_ = 0;               // selected so far: every id with logit >= mx − reach
  std::vector<int32_t> ranked_;   // the current chunk, ranked; ids before pos_ were produced
  size_t pos_ = 0;
  std::vector<int32_t> pending_;  // selected, below every ranked id, not yet ranked
  size_t chunk_ = 64;
  std::unique_ptr<int32_t[]> sel_;  // select_at_least's output
};

}  // namespace

std::vector<int32_t> Sampler::candidates(const float* logits, int64_t vocab) const {
  const int32_t top = static_cast<int32_t>(kernels::argmax(logits, vocab));
  const float mxf = logits[top];
  if (!std::isfinite(mxf)) return {top};  // every logit NaN/−∞, or a +∞: nothing else can be drawn
  const double mx = mxf;
  // Probabilities at temperature 1, normalized over the whole vocabulary.
  const double z = kernels::sum_exp(logits, vocab, mxf, 1.0f);
  const bool use_top_p = p_.top_p > 0.0f && p_.top_p < 1.0f, use_min_p = p_.min_p > 0.0f;
  const size_t limit = p_.top_k > 0 && p_.top_k < vocab ? static_cast<size_t>(p_.top_k) : static_cast<size_t>(vocab);
  // The kept set is the shortest of the filters' prefixes: walk the ranking and stop at the first
  // cut — top_k's count, min_p's first token below min_p·p_max, or top_p's token that brings the
  // mass to top_p (kept). The top token is always kept.
  const double min_p_thr = static_cast<double>(p_.min_p) / z;  // p_max = e^0 / z
  std::vector<int32_t> keep;
  Ranking ranking(logits, vocab, mxf);
  double cum = 0;
  for (int32_t id; keep.size() < limit && (id = ranking.next()) >= 0;) {
    const double p = std::exp(static_cast<double>(logits[id]) - mx) / z;
    if (use_min_p && p < min_p_thr && !keep.empty()) break;
    keep.push_back(id);
    cum += p;
    if (use_top_p && cum >= static_cast<double>(p_.top_p)) break;
  }
  return keep;
}

int32_t Sampler::sample_at(float* logits, int64_t vocab, const std::vector<int32_t>& history, uint64_t step) const {
  process(logits, vocab, history);
  return pick(logits, vocab, step);
}

int32_t Sampler::pick(const float* logits, int64_t vocab, uint64_t step) const {
  if (!(p_.temperature > 0.0f)) return static_cast<int32_t>(kernels::argmax(logits, vocab));
  const bool filtered = (p_.top_k > 0 && p_.top_k < vocab) || (p_.top_p > 0.0f && p_.top_p < 1.0f) || p_.min_p > 0.0f;
  if (!filtered) {
    // No filter: draw over the whole vocabulary in id order — the same distribution as the
    // ranked walk below, without ranking the vocabulary. The weights are summed in blocks (one
    // vectorised pass each); only the block the draw lands in is walked token by token.
    const int32_t top = static_cast<int32_t>(kernels::argmax(logits, vocab));
    const float mx = logits[top];
    if (!std::isfinite(mx)) return top;
    const float inv_t = 1.0f / p_.temperature;
    constexpr int64_t kBlock = 2048;
    const int64_t nb = (vocab + kBlock - 1) / kBlock;
    std::vector<double> block(static_cast<size_t>(nb));
    double z = 0;
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t i0 = b * kBlock;
      z += (block[static_cast<size_t>(b)] = kernels::sum_exp(logits + i0, std::min(kBlock, vocab - i0), mx, inv_t));
    }
    const double u = counter_uniform(p_.seed, step) * z;
    double cum = 0;
    int64_t b = 0;
    while (b + 1 < nb && cum + block[static_cast<size_t>(b)] <= u) cum += block[static_cast<size_t>(b++)];
    int64_t last = -1;
    for (int64_t i = b * kBlock, e = std::min(vocab, i + kBlock); i < e; ++i) {
      if (!(logits[i] > -INFINITY)) continue;  // NaN, −∞ (masked): weight exactly 0
      cum += std::exp(static_cast<double>((logits[i] - mx) * inv_t));
      last = i;
      if (u < cum) return static_cast<int32_t>(i);
    }
    // u past the block's last weight: its sum came from the vectorised exp, the walk from std::exp.
    return static_cast<int32_t>(last >= 0 ? last : top);
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

TokenLogprobs Sampler::post_sampling_probs(const float* logits, int64_t vocab, int32_t id, int k) const {
  TokenLogprobs r;
  r.id = id;
  r.linear = true;
  k = static_cast<int>(std::min<int64_t>(std::max(k, 0), vocab));
  const int32_t top = static_cast<int32_t>(kernels::argmax(logits, vocab));
  const float mxf = logits[top];
  if (!(p_.temperature > 0.0f) || !std::isfinite(mxf)) {
    // pick() takes the argmax: one candidate, certain.
    r.logprob = id == top ? 1.0f : 0.0f;
    if (k > 0) r.top.emplace_back(top, 1.0f);
    return r;
  }
  // The weights pick() draws with: exp((logit − max) / temperature) over the candidates.
  const double mx = mxf, t = p_.temperature;
  auto weight = [&](int32_t i) {
    const double l = std::isnan(logits[i]) ? -INFINITY : static_cast<double>(logits[i]);
    return std::exp((l - mx) / t);
  };
  const bool filtered = (p_.top_k > 0 && p_.top_k < vocab) || (p_.top_p > 0.0f && p_.top_p < 1.0f) || p_.min_p > 0.0f;
  if (!filtered) {  // every token is a candidate: rank only the k reported
    const double z = kernels::sum_exp(logits, vocab, mxf, 1.0f / p_.temperature);
    r.logprob = id >= 0 && id < vocab ? static_cast<float>(weight(id) / z) : 0.0f;
    Ranking ranking(logits, vocab, mxf);
    for (int32_t i; r.top.size() < static_cast<size_t>(k) && (i = ranking.next()) >= 0;) {
      const double p = weight(i) / z;
      if (!(p > 0)) break;  // masked or underflowed: no more candidates with mass
      r.top.emplace_back(i, static_cast<float>(p));
    }
    return r;
  }
  const std::vector<int32_t> cand = candidates(logits, vocab);
  std::vector<double> w(cand.size());
  double z = 0;
  for (size_t i = 0; i < cand.size(); ++i) z += (w[i] = weight(cand[i]));
  r.logprob = 0;
  for (size_t i = 0; i < cand.size(); ++i) {
    if (cand[i] == id) r.logprob = static_cast<float>(w[i] / z);
    if (r.top.size() < static_cast<size_t>(k) && w[i] > 0) r.top.emplace_back(cand[i], static_cast<float>(w[i] / z));
  }
  return r;
}

TokenLogprobs token_logprobs(const float* x, int64_t vocab, int32_t id, int k) {
  // log p_i = x_i - (max + log Σ exp(x_j - max)).
  const float mxf = x[kernels::argmax(x, vocab)];
  const double lse = std::isfinite(mxf) ? mxf + std::log(kernels::sum_exp(x, vocab, mxf, 1.0f)) : 0.0;
  auto lp = [&](int64_t i) { return std::isnan(x[i]) ? -INFINITY : static_cast<float>(x[i] - lse); };
  TokenLogprobs r;
  r.id = id;
  r.logprob = (id >= 0 && id < vocab) ? lp(id) : -INFINITY;
  k = static_cast<int>(std::min<int64_t>(std::max(k, 0), vocab));
  if (k > 0 && std::isfinite(mxf)) {
    Ranking ranking(x, vocab, mxf);
    for (int32_t t; r.top.size() < static_cast<size_t>(k) && (t = ranking.next()) >= 0;) {
      const float l = lp(t);
      if (l == -INFINITY) break;  // a masked token (constrained decoding) is no alternative
      r.top.emplace_back(t, l);
    }
  }
  return r;
}

int32_t Sampler::sample(float* logits, int64_t vocab, const std::vector<int32_t>& history) {
  return sample_at(logits, vocab, history, step_++);
}

}  // namespace larder::runtime
