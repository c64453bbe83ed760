#include "larder/runtime/generate.h"

#include <algorithm>
#include <chrono>
#include <optional>

namespace larder::runtime {

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

  std::unique_ptr<Drafter> drafter = make_drafter(opts.spec, cache, limit);
  const auto t0 = std::chrono::steady_clock::now();
  while (seq.prefilling()) {
    const std::span<const int32_t> slice = seq.next_prefill(opts.prefill_chunk);
    const int64_t n = static_cast<int64_t>(slice.size());
    LARDER_RETURN_IF_ERROR(model.forward(slice.data(), n, cache, logits.data(), false, opts.adapters));
    seq.prefill_done(n);
    st.prompt_tokens += n;
  }
  if (drafter && opts.max_new_tokens > 0) drafter->prefill(seq.history());  // a draft model's prompt
  st.prefill_seconds = seconds_since(t0);

  const auto t1 = std::chrono::steady_clock::now();
  st.finish_reason = FinishReason::kLength;
  if (opts.max_new_tokens <= 0) {
    st.decode_seconds = seconds_since(t1);
    return st;
  }
  DecodeStep step(opts, opts.tokenizer);
  auto show = [&](const std::string& text) {
    if (!text.empty() && opts.on_text) opts.on_text(text);
  };
  // One picked token's effect on the caller: its text, the callback; why decoding ends (kNone: go on).
  auto deliver = [&](const Accepted& a) {
    show(a.text);
    FinishReason why = a.finish;
    if (a.kept) {
      st.tokens.push_back(a.id);
      ++st.generated_tokens;
      if (on_token && !on_token(a.id) && why == FinishReason::kNone) why = FinishReason::kCancelled;
    }
    return why;
  };
  std::vector<float> rows;  // the verify forward's logits, [k + 1, V]
  std::vector<int32_t> batch;

  Accepted a = step.step(logits.data(), V, seq);
  if (a.finish == FinishReason::kError) return internal_error("[generate] " + a.error);
  FinishReason why = deliver(a);
  while (why == FinishReason::kNone) {
    // a.id is kept and not yet forwarded: the state holds history minus it.
    std::vector<int32_t> draft;
    if (drafter) {
      // The verify rows must fit the context with room for one more token after them, so every
      // row's accept sees the length check plain decoding would; and drafting past the token
      // budget is wasted.
      const int64_t room = std::min(limit - cache.length() - 2, opts.max_new_tokens - step.generated() - 1);
      draft = drafter->draft(seq.history(), room);
    }
    if (draft.empty()) {
      ++st.decode_forwards;
      const auto f0 = std::chrono::steady_clock::now();
      LARDER_RETURN_IF_ERROR(model.forward(&a.id, 1, cache, logits.data(), false, opts.adapters));
      if (drafter) drafter->cost().forward(1, seconds_since(f0));
      a = step.step(logits.data(), V, seq);
      if (a.finish == FinishReason::kError) return internal_error("[generate] " + a.error);
      why = deliver(a);
      continue;
    }
    const int d = static_cast<int>(draft.size());
    batch.assign(1, a.id);
    batch.insert(batch.end(), draft.begin(), draft.end());
    rows.resize(static_cast<size_t>(d + 1) * static_cast<size_t>(V));
    const int64_t L = cache.length();
    ++st.decode_forwards;
    st.verify_rows += d + 1;
    const auto f0 = std::chrono::steady_clock::now();
    LARDER_RETURN_IF_ERROR(model.forward(batch.data(), d + 1, cache, rows.data(), true, opts.adapters));
    drafter->cost().forward(d + 1, seconds_since(f0));
    // Row i predicts the token after batch[i]; keep the draft while the step picks it.
    int matched = 0, forwarded = 0;
    for (int i = 0; i <= d; ++i) {
      a = step.step(rows.data() + static_cast<size_t>(i) * static_cast<size_t>(V), V, seq);
      if (a.finish == FinishReason::kError) {
        (void)cache.trim(L + 1 + forwarded);
        return internal_error("[generate] " + a.error);
      }
      const bool hit = i < d && a.kept && a.id == draft[static_cast<size_t>(i)];
      matched += hit;
      why = deliver(a);
      if (!hit || why != FinishReason::kNone) break;
      ++forwarded;  // draft[i] is kept and its row is in the state: the next row is valid
    }
    // What plain decoding would hold: every kept token but the last one.
    LARDER_RETURN_IF_ERROR(cache.trim(L + 1 + forwarded));
    drafter->feedback(d, matched);
  }
  st.finish_reason = why;
  if (drafter) {
    st.drafted_tokens = drafter->drafted();
    st.accepted_tokens = drafter->accepted();
  }
  show(step.flush(&st.finish_reason));
  st.matched_stop = step.matched_stop();
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
