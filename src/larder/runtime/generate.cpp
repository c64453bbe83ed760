#include "larder/runtime/generate.h"

#include <algorithm>
#include <chrono>

namespace larder::runtime {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kEos: return "eos";
    case FinishReason::kLength: return "length";
    case FinishReason::kCallback: return "callback";
  }
  return "?";
}

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Result<GenerateStats> generate(models::Model& model, Sequence& seq, const GenerateOptions& opts,
                               const TokenCallback& on_token) {
  const int64_t P = seq.prompt_size();
  const int64_t V = model.info().vocab;
  memory::SequenceState& cache = seq.state();
  const int64_t limit = std::min({model.info().max_context, cache.max_tokens(), seq.ctx()});
  if (P == 0) return invalid_argument("[generate] empty prompt");
  if (P > limit)
    return invalid_argument(strfmt("[generate] prompt of %lld tokens exceeds the context of %lld tokens",
                                   (long long)P, (long long)limit));
  if (opts.prefill_chunk <= 0) return invalid_argument("[generate] prefill_chunk must be positive");

  GenerateStats st;
  st.cached_tokens = seq.cached_tokens();
  std::vector<float> logits(static_cast<size_t>(V));

  const auto t0 = std::chrono::steady_clock::now();
  while (seq.prefilling()) {
    const std::span<const int32_t> slice = seq.next_prefill(opts.prefill_chunk);
    const int64_t n = static_cast<int64_t>(slice.size());
    LARDER_RETURN_IF_ERROR(model.forward(slice.data(), n, cache, logits.data(), false));
    seq.prefill_done(n);
    st.prompt_tokens += n;
  }
  st.prefill_seconds = seconds_since(t0);

  const auto t1 = std::chrono::steady_clock::now();
  Sampler sampler(opts.sampling);
  st.finish_reason = FinishReason::kLength;
  for (int64_t i = 0; i < opts.max_new_tokens; ++i) {
    const int32_t tok = sampler.sample_at(logits.data(), V, seq.history(), static_cast<uint64_t>(i));
    if (std::find(opts.eos_ids.begin(), opts.eos_ids.end(), tok) != opts.eos_ids.end()) {
      st.finish_reason = FinishReason::kEos;
      break;
    }
    seq.decode_accept(tok);
    st.tokens.push_back(tok);
    ++st.generated_tokens;
    const bool go_on = on_token ? on_token(tok) : true;
    if (!go_on) {
      st.finish_reason = FinishReason::kCallback;
      break;
    }
    // Forward the token only if another one may follow: the budget and the context allow it.
    if (i + 1 == opts.max_new_tokens || cache.length() + 1 > limit) break;
    LARDER_RETURN_IF_ERROR(model.forward(&tok, 1, cache, logits.data(), false));
  }
  st.decode_seconds = seconds_since(t1);
  return st;
}

Result<GenerateStats> generate(models::Model& model, memory::SequenceState& cache, const std::vector<int32_t>& prompt,
                               const GenerateOptions& opts, const TokenCallback& on_token) {
  if (prompt.empty()) return invalid_argument("[generate] empty prompt");
  if (cache.length() > static_cast<int64_t>(prompt.size()))
    return invalid_argument(strfmt("[generate] the cache holds %lld tokens but the prompt has only %zu",
                                   (long long)cache.length(), prompt.size()));
  // The caller keeps its state: it is lent to a store-less Sequence and handed back after.
  Result<Sequence> adopted = Sequence::adopt(prompt, std::move(cache), 0);
  if (!adopted.is_ok()) return adopted.status();  // only a failed trim of a fully cached prompt
  Sequence& seq = *adopted;
  Result<GenerateStats> r = generate(model, seq, opts, on_token);
  cache = std::move(seq.state());
  return r;
}

}  // namespace larder::runtime
