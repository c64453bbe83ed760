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

Result<GenerateStats> generate(models::Model& model, memory::SequenceState& cache, const std::vector<int32_t>& prompt,
                               const GenerateOptions& opts, const TokenCallback& on_token) {
  const int64_t P = static_cast<int64_t>(prompt.size());
  const int64_t V = model.info().vocab;
  const int64_t limit = std::min(model.info().max_context, cache.max_tokens());
  if (P == 0) return invalid_argument("[generate] empty prompt");
  if (cache.length() > P)
    return invalid_argument(strfmt("[generate] the cache holds %lld tokens but the prompt has only %lld",
                                   (long long)cache.length(), (long long)P));
  if (P > limit)
    return invalid_argument(strfmt("[generate] prompt of %lld tokens exceeds the context of %lld tokens",
                                   (long long)P, (long long)limit));
  if (opts.prefill_chunk <= 0) return invalid_argument("[generate] prefill_chunk must be positive");

  GenerateStats st;
  // A fully cached prompt still needs the logits of its last token.
  if (cache.length() == P) LARDER_RETURN_IF_ERROR(cache.trim(P - 1));
  st.cached_tokens = cache.length();
  std::vector<float> logits(static_cast<size_t>(V));

  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t at = cache.length(); at < P;) {
    const int64_t n = std::min(opts.prefill_chunk, P - at);
    LARDER_RETURN_IF_ERROR(model.forward(prompt.data() + at, n, cache, logits.data(), false));
    at += n;
    st.prompt_tokens += n;
  }
  st.prefill_seconds = seconds_since(t0);

  const auto t1 = std::chrono::steady_clock::now();
  Sampler sampler(opts.sampling);
  std::vector<int32_t> history = prompt;
  st.finish_reason = FinishReason::kLength;
  for (int64_t i = 0; i < opts.max_new_tokens; ++i) {
    const int32_t tok = sampler.sample_at(logits.data(), V, history, static_cast<uint64_t>(i));
    if (std::find(opts.eos_ids.begin(), opts.eos_ids.end(), tok) != opts.eos_ids.end()) {
      st.finish_reason = FinishReason::kEos;
      break;
    }
    history.push_back(tok);
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

}  // namespace larder::runtime
