// eval.cpp — perplexity, KL divergence and generation sanity (see eval.h).
#include "larder/runtime/eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "larder/memory/kv_cache.h"
#include "larder/runtime/generate.h"
#include "larder/runtime/loaded_model.h"
#include "larder/tokenizer/tokenizer.h"

namespace larder::runtime {

namespace {

using Clock = std::chrono::steady_clock;

// Rows per forward: bounds the [rows, vocab] logits buffer and the model's scratch whatever
// n_ctx is, at the prefill chunk size the CPU path is tuned for.
constexpr int64_t kRowsPerForward = 512;

double logsumexp(const float* x, int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(x[i]));
  if (!std::isfinite(m)) return m;  // all −inf (or a +inf logit): nothing finite to normalize
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(x[i]) - m);
  return m + std::log(s);
}

double kl_with_lse(const float* r, double lse_r, const float* c, double lse_c, int64_t vocab) {
  double kl = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const double lr = static_cast<double>(r[i]) - lse_r;
    const double pr = std::exp(lr);
    // p log p → 0 as p → 0: skipping these terms is what keeps −1e30-style masked logits (and
    // their huge log-ratios) from turning into 0 · ∞.
    if (pr == 0) continue;
    kl += pr * (lr - (static_cast<double>(c[i]) - lse_c));
  }
  // Equal distributions can sum to −1e-17-ish through rounding; KL is never negative.
  return kl > 0 ? kl : 0.0;
}

// Everything one scored position contributes, from its two logit rows.
struct PosStat {
  double nll = 0, p = 0;
  int32_t top = 0;
};

PosStat pos_stat(const float* logits, int64_t vocab, int32_t target, double* lse_out) {
  const double lse = logsumexp(logits, vocab);
  if (lse_out) *lse_out = lse;
  PosStat s;
  const double lp = static_cast<double>(logits[target]) - lse;
  s.nll = -lp;
  s.p = std::exp(lp);
  s.top = argmax_logits(logits, vocab);
  return s;
}

Status check_chunks(const models::Model& model, const std::vector<std::vector<int32_t>>& chunks, const char* who) {
  if (chunks.empty()) return invalid_argument("[eval] no chunks to evaluate");
  const int64_t n = static_cast<int64_t>(chunks[0].size());
  if (n < 2) return invalid_argument(strfmt("[eval] chunk length %lld is below 2", static_cast<long long>(n)));
  for (const auto& c : chunks) {
    if (static_cast<int64_t>(c.size()) != n) {
      return invalid_argument(strfmt("[eval] chunks differ in length (%zu vs %lld)", c.size(), static_cast<long long>(n)));
    }
  }
  const auto& info = model.info();
  if (info.max_context > 0 && n > info.max_context) {
    return invalid_argument(strfmt("[eval] context %lld exceeds the %s model's context of %lld tokens",
                                   static_cast<long long>(n), who, static_cast<long long>(info.max_context)));
  }
  return Status::ok();
}

// Runs one chunk through `model` from an empty `cache` and calls on_rows(row0, rows, logits) for
// the logits of positions [first, n−1) in pieces. The last token is never forwarded: nothing
// scores its prediction.
template <typename OnRows>
Status forward_chunk(models::Model& model, memory::SequenceState& cache, const std::vector<int32_t>& chunk,
                     std::vector<float>& buf, std::span<const models::AdapterUse> adapters, OnRows&& on_rows) {
  const int64_t n = static_cast<int64_t>(chunk.size());
  const int64_t first = eval_first_scored(n);
  const int64_t vocab = model.info().vocab;
  LARDER_RETURN_IF_ERROR(cache.trim(0));
  // The unscored first half only builds context: last-token logits are the cheapest output.
  for (int64_t p = 0; p < first; p += kRowsPerForward) {
    const int64_t rows = std::min(kRowsPerForward, first - p);
    LARDER_RETURN_IF_ERROR(model.forward(chunk.data() + p, rows, cache, buf.data(), false, adapters));
  }
  for (int64_t p = first; p < n - 1; p += kRowsPerForward) {
    const int64_t rows = std::min(kRowsPerForward, n - 1 - p);
    buf.resize(static_cast<size_t>(rows * vocab));
    LARDER_RETURN_IF_ERROR(model.forward(chunk.data() + p, rows, cache, buf.data(), true, adapters));
    LARDER_RETURN_IF_ERROR(on_rows(p, rows, buf.data()));
  }
  return Status::ok();
}

struct Moments {
  double sum = 0, sum2 = 0;
  int64_t n = 0;
  void add(double x) {
    sum += x;
    sum2 += x * x;
    ++n;
  }
  double mean() const { return n ? sum / static_cast<double>(n) : 0.0; }
  // Standard error of the mean with the N − 1 (sample) variance, as llama.cpp reports it.
  double se() const {
    if (n < 2) return 0;
    const double m = mean();
    const double var = std::max(0.0, sum2 / static_cast<double>(n) - m * m);
    return std::sqrt(var / static_cast<double>(n - 1));
  }
};

PplResult ppl_from(const Moments& nll, int64_t n_chunks) {
  PplResult r;
  r.n_tokens = nll.n;
  r.n_chunks = n_chunks;
  r.mean_nll = nll.mean();
  r.nll_se = nll.se();
  r.ppl = std::exp(r.mean_nll);
  r.ppl_err = r.ppl * r.nll_se;
  return r;
}

}  // namespace

double kl_divergence_logits(const float* ref_logits, const float* cand_logits, int64_t vocab) {
  return kl_with_lse(ref_logits, logsumexp(ref_logits, vocab), cand_logits, logsumexp(cand_logits, vocab), vocab);
}

double token_nll(const float* logits, int64_t vocab, int32_t target) {
  return -(static_cast<double>(logits[target]) - logsumexp(logits, vocab));
}

double token_prob(const float* logits, int64_t vocab, int32_t target) {
  return std::exp(static_cast<double>(logits[target]) - logsumexp(logits, vocab));
}

int32_t argmax_logits(const float* logits, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

std::optional<int32_t> added_bos(const tokenizer::Tokenizer& tok) {
  // Whether encoding with special tokens puts BOS first decides it, not the mere presence of a
  // BOS id (llama.cpp reads add_bos the same way).
  if (const auto bos = tok.bos_id()) {
    const auto with = tok.encode("a", true), without = tok.encode("a", false);
    if (with.size() > without.size() && !with.empty() && with.front() == *bos) return bos;
  }
  return std::nullopt;
}

EvalStream make_eval_stream(const tokenizer::Tokenizer& tok, const std::string& text) {
  EvalStream s;
  // BOS prepended rather than encode(text, true): nothing else a tokenizer may add (an EOS at
  // the very end) changes the chunks.
  s.bos = added_bos(tok);
  if (s.bos) s.ids.push_back(*s.bos);
  const std::vector<int32_t> text_ids = tok.encode(text, /*add_special=*/false);
  s.ids.insert(s.ids.end(), text_ids.begin(), text_ids.end());
  return s;
}

Result<std::vector<std::vector<int32_t>>> make_eval_chunks(const std::vector<int32_t>& stream, int64_t n_ctx,
                                                           int64_t max_chunks, std::optional<int32_t> bos) {
  if (n_ctx < 2) {
    return invalid_argument(strfmt("[eval] context %lld is too small: scoring needs at least 2 tokens per chunk",
                                   static_cast<long long>(n_ctx)));
  }
  const int64_t total = static_cast<int64_t>(stream.size());
  if (total < n_ctx) {
    return invalid_argument(strfmt("[eval] the text is %lld tokens, shorter than one chunk of %lld (use a longer "
                                   "text or a smaller --ctx)",
                                   static_cast<long long>(total), static_cast<long long>(n_ctx)));
  }
  int64_t n = total / n_ctx;
  if (max_chunks > 0) n = std::min(n, max_chunks);
  std::vector<std::vector<int32_t>> chunks(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    chunks[i].assign(stream.begin() + i * n_ctx, stream.begin() + (i + 1) * n_ctx);
    if (bos) chunks[i][0] = *bos;
  }
  return chunks;
}

double sorted_percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + frac * (sorted[hi] - sorted[lo]);
}

Result<PplResult> eval_perplexity(models::Model& model, const std::vector<std::vector<int32_t>>& chunks,
                                  const EvalProgressFn& progress, std::span<const models::AdapterUse> adapters) {
  LARDER_RETURN_IF_ERROR(check_chunks(model, chunks, "evaluated"));
  const int64_t n = static_cast<int64_t>(chunks[0].size());
  const int64_t vocab = model.info().vocab;
  memory::SequenceState cache = model.new_state(n);
  std::vector<float> buf(static_cast<size_t>(vocab));
  Moments nll;
  const auto t0 = Clock::now();
  for (size_t c = 0; c < chunks.size(); ++c) {
    const auto& chunk = chunks[c];
    LARDER_RETURN_IF_ERROR(forward_chunk(model, cache, chunk, buf, adapters, [&](int64_t row0, int64_t rows, const float* lg) {
      for (int64_t r = 0; r < rows; ++r) {
        nll.add(token_nll(lg + r * vocab, vocab, chunk[static_cast<size_t>(row0 + r + 1)]));
      }
      return Status::ok();
    }));
    if (progress) {
      EvalProgress p;
      p.chunk = static_cast<int64_t>(c + 1);
      p.n_chunks = static_cast<int64_t>(chunks.size());
      p.ppl = std::exp(nll.mean());
      p.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      progress(p);
    }
  }
  return ppl_from(nll, static_cast<int64_t>(chunks.size()));
}

Result<KlResult> eval_kl(models::Model& base, models::Model& cand, const std::vector<std::vector<int32_t>>& chunks,
                         const EvalProgressFn& progress, std::span<const models::AdapterUse> cand_adapters) {
  LARDER_RETURN_IF_ERROR(check_chunks(base, chunks, "base"));
  LARDER_RETURN_IF_ERROR(check_chunks(cand, chunks, "candidate"));
  const int64_t vocab = base.info().vocab;
  if (cand.info().vocab != vocab) {
    return incompatible(strfmt("[eval] vocabulary sizes differ: base %lld, candidate %lld",
                               static_cast<long long>(vocab), static_cast<long long>(cand.info().vocab)));
  }
  const int64_t n = static_cast<int64_t>(chunks[0].size());
  memory::SequenceState base_cache = base.new_state(n), cand_cache = cand.new_state(n);
  std::vector<float> base_buf(static_cast<size_t>(vocab)), cand_buf(static_cast<size_t>(vocab));
  Moments base_nll, cand_nll, kl, dp;
  std::vector<double> kls;
  int64_t same_top = 0;
  const auto t0 = Clock::now();
  for (size_t c = 0; c < chunks.size(); ++c) {
    const auto& chunk = chunks[c];
    // The base's rows of this chunk, kept until the candidate has produced the same rows.
    std::vector<float> base_rows;
    LARDER_RETURN_IF_ERROR(forward_chunk(base, base_cache, chunk, base_buf, {}, [&](int64_t, int64_t rows, const float* lg) {
      base_rows.insert(base_rows.end(), lg, lg + rows * vocab);
      return Status::ok();
    }));
    const int64_t first = eval_first_scored(n);
    LARDER_RETURN_IF_ERROR(forward_chunk(cand, cand_cache, chunk, cand_buf, cand_adapters, [&](int64_t row0, int64_t rows, const float* lg) {
      for (int64_t r = 0; r < rows; ++r) {
        const int32_t target = chunk[static_cast<size_t>(row0 + r + 1)];
        const float* bl = base_rows.data() + (row0 - first + r) * vocab;
        const float* cl = lg + r * vocab;
        double lse_b = 0, lse_c = 0;
        const PosStat b = pos_stat(bl, vocab, target, &lse_b);
        const PosStat q = pos_stat(cl, vocab, target, &lse_c);
        const double d = kl_with_lse(bl, lse_b, cl, lse_c, vocab);
        base_nll.add(b.nll);
        cand_nll.add(q.nll);
        kl.add(d);
        kls.push_back(d);
        dp.add(q.p - b.p);
        same_top += b.top == q.top;
      }
      return Status::ok();
    }));
    if (progress) {
      EvalProgress p;
      p.chunk = static_cast<int64_t>(c + 1);
      p.n_chunks = static_cast<int64_t>(chunks.size());
      p.ppl = std::exp(base_nll.mean());
      p.cand_ppl = std::exp(cand_nll.mean());
      p.kl_mean = kl.mean();
      p.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      progress(p);
    }
  }
  KlResult r;
  r.n_tokens = kl.n;
  r.n_chunks = static_cast<int64_t>(chunks.size());
  r.mean = kl.mean();
  r.mean_se = kl.se();
  std::sort(kls.begin(), kls.end());
  r.median = sorted_percentile(kls, 50);
  r.p90 = sorted_percentile(kls, 90);
  r.p99 = sorted_percentile(kls, 99);
  r.p999 = sorted_percentile(kls, 99.9);
  r.max = kls.empty() ? 0 : kls.back();
  const double N = static_cast<double>(kl.n);
  r.top1 = N > 0 ? static_cast<double>(same_top) / N : 0;
  r.top1_err = kl.n > 1 ? std::sqrt(r.top1 * (1 - r.top1) / (N - 1)) : 0;
  r.base = ppl_from(base_nll, r.n_chunks);
  r.cand = ppl_from(cand_nll, r.n_chunks);
  r.ln_ppl_ratio = r.cand.mean_nll - r.base.mean_nll;
  r.mean_dp = dp.mean();
  r.rms_dp = kl.n ? std::sqrt(dp.sum2 / N) : 0;
  return r;
}

const std::vector<std::string>& sanity_prompts() {
  static const std::vector<std::string> prompts = {
      "Once upon a time",
      "The capital of France is",
      "1, 2, 3, 4,",
      "def fibonacci(n):",
      "The quick brown fox",
      "Question: What is 12 plus 7?\nAnswer:",
  };
  return prompts;
}

namespace {

Result<std::vector<int32_t>> greedy(LoadedModel& m, const std::vector<int32_t>& prompt, int64_t max_new,
                                    const std::vector<int32_t>& eos) {
  const int64_t ctx = m.model->info().max_context;
  const int64_t room = ctx > 0 ? ctx - static_cast<int64_t>(prompt.size()) : max_new;
  if (room <= 0) return std::vector<int32_t>{};
  GenerateOptions go;  // default sampling params: greedy, no penalties
  go.max_new_tokens = std::min(max_new, room);
  go.eos_ids = eos;
  memory::SequenceState cache = m.model->new_state(static_cast<int64_t>(prompt.size()) + go.max_new_tokens + 1);
  LARDER_ASSIGN_OR_RETURN(GenerateStats s, generate(*m.model, cache, prompt, go, [](int32_t) { return true; }));
  return std::move(s.tokens);
}

// A repetition loop shows as the same token over and over at the end; the window is short so a
// loop that starts late in a 64-token continuation still counts.
bool ends_in_repeat(const std::vector<int32_t>& t) {
  if (t.size() < 8) return false;
  const size_t w = std::min<size_t>(t.size(), 16);
  return std::all_of(t.end() - static_cast<std::ptrdiff_t>(w), t.end(), [&](int32_t x) { return x == t.back(); });
}

}  // namespace

bool generation_collapsed(const std::vector<int32_t>& base, const std::vector<int32_t>& cand) {
  // A base that loops the same way is the model's own habit, not damage from quantization.
  if (ends_in_repeat(cand) && !ends_in_repeat(base)) return true;
  return base.size() >= 16 && cand.size() * 4 < base.size();
}

Result<SanityResult> eval_sanity(LoadedModel& base, LoadedModel& cand, int64_t max_new_tokens) {
  if (!base.model || !cand.model) return invalid_argument("[eval] sanity check needs both models' weights");
  SanityResult res;
  res.max_new_tokens = max_new_tokens;
  std::vector<int32_t> eos = base.defaults.eos_ids;
  for (int32_t e : cand.defaults.eos_ids) {
    if (std::find(eos.begin(), eos.end(), e) == eos.end()) eos.push_back(e);
  }
  double prefix_sum = 0;
  for (const std::string& text : sanity_prompts()) {
    SanityPrompt sp;
    sp.prompt = text;
    const std::vector<int32_t> prompt = base.tokenizer->encode(text, /*add_special=*/true);
    if (prompt.empty()) continue;
    LARDER_ASSIGN_OR_RETURN(sp.base_tokens, greedy(base, prompt, max_new_tokens, eos));
    LARDER_ASSIGN_OR_RETURN(sp.cand_tokens, greedy(cand, prompt, max_new_tokens, eos));
    const size_t common = std::min(sp.base_tokens.size(), sp.cand_tokens.size());
    while (sp.identical_prefix < static_cast<int64_t>(common) &&
           sp.base_tokens[sp.identical_prefix] == sp.cand_tokens[sp.identical_prefix]) {
      ++sp.identical_prefix;
    }
    sp.base_text = base.tokenizer->decode(sp.base_tokens, /*skip_special=*/true);
    sp.cand_text = base.tokenizer->decode(sp.cand_tokens, /*skip_special=*/true);
    sp.collapsed = generation_collapsed(sp.base_tokens, sp.cand_tokens);
    res.base_short += sp.base_tokens.size() < 8;
    res.cand_short += sp.cand_tokens.size() < 8;
    res.collapsed += sp.collapsed;
    prefix_sum += static_cast<double>(sp.identical_prefix);
    res.prompts.push_back(std::move(sp));
  }
  if (!res.prompts.empty()) res.mean_identical_prefix = prefix_sum / static_cast<double>(res.prompts.size());
  return res;
}

}  // namespace larder::runtime
