#include "larder/runtime/sequence.h"

#include <algorithm>
#include <optional>

#include "larder/core/log.h"

namespace larder::runtime {

Sequence Sequence::start(const models::Model& model, std::vector<int32_t> prompt, SequenceOptions opts) {
  memory::TakeResult t;
  if (opts.store) t = opts.store->take(prompt, opts.ns);
  return start(model, std::move(prompt), std::move(opts), std::move(t));
}

Sequence Sequence::start(const models::Model& model, std::vector<int32_t> prompt, SequenceOptions opts,
                         memory::TakeResult t) {
  const int64_t ctx = opts.ctx > 0 ? opts.ctx : model.info().max_context;
  std::optional<memory::SequenceState> state;
  memory::CacheReport report;
  if (opts.store) {
    report = t.report;
    if (t.hit) {
      auto st = std::move(*t.hit).into_state(model.state_schema(), ctx);
      if (st.is_ok()) {
        state.emplace(std::move(*st));
      } else {
        LARDER_LOG_WARN("[sequence] kv store hit not usable, prefilling in full: %s", st.status().message().c_str());
        opts.store->unusable_hit(&report, "state_incompatible", opts.ns);
      }
    }
  }
  if (!state) state.emplace(model.new_state(ctx));
  Sequence s(std::move(prompt), std::move(*state), ctx);
  s.store_ = opts.store;
  s.ns_ = std::move(opts.ns);
  s.report_ = std::move(report);
  if (s.report_.reason.empty()) s.report_.reason = opts.store ? "miss" : "store_off";
  // A take never covers the whole prompt (§2.1); a state that does anyway (a store keyed
  // differently) is cut back by one, or dropped when it cannot be (a wrapped ring).
  const int64_t P = s.prompt_size();
  if (P > 0 && s.state_.length() >= P && !s.state_.trim(P - 1).is_ok()) {
    s.state_ = model.new_state(ctx);
    if (s.store_) s.store_->unusable_hit(&s.report_, "untrimmable_tail", s.ns_);
  }
  s.cached_ = s.prefilled_ = s.state_.length();
  s.history_ = s.prompt_;
  s.plan_checkpoints(opts.message_ends);
  return s;
}

Result<Sequence> Sequence::adopt(std::vector<int32_t> prompt, memory::SequenceState state, int64_t ctx) {
  const int64_t P = static_cast<int64_t>(prompt.size());
  if (state.length() > P) {
    return invalid_argument(strfmt("[generate] the cache holds %lld tokens but the prompt has only %lld",
                                   (long long)state.length(), (long long)P));
  }
  // A fully cached prompt still needs the logits of its last token.
  if (P > 0 && state.length() == P) LARDER_RETURN_IF_ERROR(state.trim(P - 1));
  Sequence s(std::move(prompt), std::move(state), ctx > 0 ? ctx : 0);
  if (s.ctx_ <= 0) s.ctx_ = s.state_.max_tokens();
  s.report_.reason = "store_off";
  s.cached_ = s.prefilled_ = s.state_.length();
  s.history_ = s.prompt_;
  return s;
}

const char* Sequence::cache_tier() const { return cached_ > 0 ? memory::tier_name(report_.tier) : "none"; }

// The checkpoints of kv-store.md §11.3. The prompt end, capped at len(P) − 1 (where this prompt
// and the next turn's rendering agree for templates that re-render the answer as generated): at
// len(P) − 1 it serves both the next turn and an exact repeat (a regenerated answer); the last
// prompt token is forwarded alone after it. Then every message end past the hit: where a
// template renders the answer differently from the generation prompt (Qwen3.5 and Qwen3 without
// thinking open the answer with a <think> block the history drops), the end of the last user
// message is the longest prefix the next turn shares, and without it every turn would prefill
// the whole conversation again (llama.cpp #20225).
//
// Only for states with a non-plain layer (ring, recurrent) or attachments: plain KV trims to any
// prefix, so the full entry put at the end already serves every shorter prompt. A ring that has
// not wrapped at the boundary may still wrap while decoding, which makes the full entry
// untrimmable, so the checkpoint is captured whether the ring has wrapped yet or not.
void Sequence::plan_checkpoints(const std::vector<int64_t>& message_ends) {
  checkpoints_.clear();
  next_checkpoint_ = 0;
  if (!store_ || (state_.layers.empty() && state_.attachments.empty())) return;
  const int64_t at = prompt_size() - 1;
  for (int64_t b : message_ends) {
    // Past the hit (the hit may be that very point), before the prompt end, ascending.
    if (b > prefilled_ && b < at && (checkpoints_.empty() || b > checkpoints_.back())) checkpoints_.push_back(b);
  }
  if (at > prefilled_) checkpoints_.push_back(at);  // at == prefilled_: the hit was that very point
}

std::span<const int32_t> Sequence::next_prefill(int64_t max_tokens) const {
  const int64_t end = next_checkpoint_ < checkpoints_.size() ? checkpoints_[next_checkpoint_] : prompt_size();
  const int64_t n = std::max<int64_t>(0, std::min(max_tokens, end - prefilled_));
  return {prompt_.data() + prefilled_, static_cast<size_t>(n)};
}

void Sequence::prefill_done(int64_t n) {
  prefilled_ += n;
  if (next_checkpoint_ < checkpoints_.size() && prefilled_ == checkpoints_[next_checkpoint_] && store_) {
    const bool prompt_end = next_checkpoint_ + 1 == checkpoints_.size() && prefilled_ == prompt_size() - 1;
    ++next_checkpoint_;
    std::span<const int32_t> boundary(prompt_.data(), static_cast<size_t>(prefilled_));
    Status st = store_->put_boundary(boundary, state_, ns_, prompt_end ? "prompt_end" : "message_end");
    if (!st.is_ok()) LARDER_LOG_WARN("[sequence] boundary checkpoint not kept: %s", st.message().c_str());
  }
}

Status Sequence::finish(bool failed) {
  if (finished_) return Status::ok();
  finished_ = true;
  // Keep what was computed (also for a cancelled request: the next identical one hits). Exactly
  // the tokens the state absorbed: the last sampled token was never forwarded.
  if (!store_ || failed || state_.length() == 0) return Status::ok();
  const int64_t n = std::min<int64_t>(state_.length(), static_cast<int64_t>(history_.size()));
  std::vector<int32_t> forwarded(history_.begin(), history_.begin() + n);
  return store_->put(forwarded, std::move(state_), ns_);
}

}  // namespace larder::runtime
