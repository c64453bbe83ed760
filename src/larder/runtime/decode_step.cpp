#include "larder/runtime/decode_step.h"

#include <algorithm>

#include "larder/core/status.h"
#include "larder/runtime/tool_grammar.h"

namespace larder::runtime {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kEos: return "eos";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "?";
}

DecodeStep::DecodeStep(DecodeOptions opts, const tokenizer::Tokenizer* tok)
    : opts_(std::move(opts)), sampler_(opts_.sampling) {
  if (opts_.constraint) matcher_.emplace(opts_.constraint);
  // With special tokens shown (harmony), stop strings match message bodies only: the text after
  // <|message|> up to the next marker (runtime/harmony.h).
  if (tok) {
    std::optional<int32_t> body_open;
    if (opts_.special_text)
      if (std::optional<HarmonyTokens> h = harmony_tokens(*tok)) body_open = h->message;
    text_.emplace(*tok, opts_.stops, /*skip_special=*/!opts_.special_text, body_open);
  }
}

int32_t DecodeStep::pick(float* logits, int64_t vocab, const std::vector<int32_t>& history) {
  if (opts_.top_logprobs >= 0 && opts_.logprobs_of == LogprobsOf::kModel) model_logits_.assign(logits, logits + vocab);
  sampler_.process(logits, vocab, history);
  if (matcher_) matcher_->mask(logits, vocab);
  return sampler_.pick(logits, vocab, static_cast<uint64_t>(generated_));
}

Accepted DecodeStep::accept(int32_t id, Sequence& seq, const float* logits, int64_t vocab) {
  Accepted a;
  a.id = id;
  if (std::find(opts_.eos_ids.begin(), opts_.eos_ids.end(), id) != opts_.eos_ids.end()) {
    a.finish = FinishReason::kEos;
    return a;
  }
  if (matcher_) {
    if (!matcher_->accept(id)) {
      // Only when the mask left nothing to pick (a grammar with no continuation): never expected.
      a.finish = FinishReason::kError;
      a.error = strfmt("constrained decoding reached a dead end at token %d", id);
      return a;
    }
    // The grammar's own end token (an EOS id the grammar allows where it is complete) with EOS
    // not stopping (--ignore-eos): nothing may follow it, so the output ends as at an EOS.
    if (matcher_->terminated()) {
      a.finish = FinishReason::kEos;
      return a;
    }
  }
  if (opts_.top_logprobs >= 0 && logits) {
    switch (opts_.logprobs_of) {
      case LogprobsOf::kPostSampling:
        a.logprobs = sampler_.post_sampling_probs(logits, vocab, id, opts_.top_logprobs);
        break;
      case LogprobsOf::kModel:
        a.logprobs = token_logprobs(model_logits_.data(), vocab, id, opts_.top_logprobs);
        break;
      case LogprobsOf::kProcessed:
        a.logprobs = token_logprobs(logits, vocab, id, opts_.top_logprobs);
        break;
    }
  }
  seq.decode_accept(id);
  ++generated_;
  a.kept = true;
  if (text_) {
    a.text = text_->push(id);
    if (text_->stopped()) {
      a.finish = FinishReason::kStop;
      return a;
    }
  }
  // Another token needs a forward of this one: the budget and the context must both allow it.
  if (generated_ >= opts_.max_new_tokens || !seq.has_room()) a.finish = FinishReason::kLength;
  return a;
}

std::string DecodeStep::flush(FinishReason* why) {
  if (!text_ || text_->stopped()) return {};
  std::string tail = text_->finish();
  if (text_->stopped() && why) *why = FinishReason::kStop;
  return tail;
}

}  // namespace larder::runtime
