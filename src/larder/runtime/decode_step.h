// decode_step.h — one decode step of one sequence, written once for every driver: the server's
// engine (one forward_batch, then a step per row) and runtime::generate (the CLI's `generate` and
// `chat`, eval's greedy check).
//
//   pick:   logits → sampler processors (logit_bias, penalties) → grammar mask → sampler pick
//   accept: EOS → grammar advance (a dead end is an error, the grammar's own end stops) → the
//           token enters the sequence → its text (UTF-8-safe, stop strings held back) → length
//           (max_new_tokens, the context) → finish reason, and the logprobs the caller asked for
//
// Before this file the two drivers each had their own copy, and they had parted: `generate`
// had no grammar, no logprobs and no stop-string finish of its own (the CLI cut the loop from
// its callback), and the two length checks read different limits. What the step does not do:
// forward, batch, time, or send anything — those belong to the driver.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "larder/runtime/grammar.h"
#include "larder/runtime/sampler.h"
#include "larder/runtime/sequence.h"
#include "larder/runtime/text_stream.h"
#include "larder/tokenizer/tokenizer.h"

namespace larder::runtime {

// Why a generation ended. kNone: it has not.
enum class FinishReason {
  kNone,
  kStop,       // a stop string matched (its text and what follows are never released)
  kLength,     // max_new_tokens kept, or the context (model or cache) is full
  kEos,        // an EOS id was picked, or the grammar reached its end (neither is kept)
  kCancelled,  // the driver stopped it (a callback said stop, Ctrl-C, the client left)
  kError,      // a forward failure, or a grammar with no continuation
};
const char* finish_reason_name(FinishReason r);  // "none", "stop", "length", "eos", "cancelled", "error"

// Which distribution reported logprobs describe: the processed one (after biases, penalties and
// the grammar mask: OpenAI routes, server-api.md §4.4), the model's own logits (llama-server's
// n_probs), or the sampler's after its filters and temperature (post_sampling_probs).
enum class LogprobsOf { kProcessed, kModel, kPostSampling };

// What one sequence's decoding is asked to do.
struct DecodeOptions {
  SamplingParams sampling;
  int64_t max_new_tokens = 256;    // tokens kept at most
  std::vector<int32_t> eos_ids;    // empty: never stop on EOS (--ignore-eos)
  std::vector<std::string> stops;  // stop strings (matched only when the step has a tokenizer)
  // Special tokens decode to their text instead of nothing: an output format made of them
  // (harmony's <|channel|>…<|message|>) is parsed after the stop matcher, which then matches
  // stop strings in message bodies only (text_stream.h).
  bool special_text = false;
  // Constrained decoding (grammar.h): masks every pick, advances over every kept token. Null:
  // unconstrained.
  std::shared_ptr<const Constraint> constraint;
  int top_logprobs = -1;  // -1: none; else that many alternatives per kept token
  LogprobsOf logprobs_of = LogprobsOf::kProcessed;
};

// What a picked token did.
struct Accepted {
  int32_t id = 0;
  bool kept = false;  // it entered the sequence (EOS, a grammar end and a dead end do not)
  FinishReason finish = FinishReason::kNone;  // kNone: go on (forward `id`)
  std::string text;   // the text this token releases (empty without a tokenizer, or held back)
  TokenLogprobs logprobs;  // of a kept token, when DecodeOptions::top_logprobs >= 0
  std::string error;  // kError: why
};

class DecodeStep {
 public:
  // `tok`: detokenize and match stop strings (null: ids only — no text, no stop strings). It
  // must outlive the step.
  DecodeStep(DecodeOptions opts, const tokenizer::Tokenizer* tok);
  DecodeStep(DecodeStep&&) = default;

  // Processes the row in place (logit_bias and penalties over `history`, then the grammar mask —
  // after the processors, so a bias never revives a masked token) and picks a token with the
  // sampler's draw number generated() (counter-based: batching and resuming change nothing).
  int32_t pick(float* logits, int64_t vocab, const std::vector<int32_t>& history);

  // Applies a picked token to `seq` (see the file comment). `logits`/`vocab`: the row pick()
  // processed, read for logprobs only (may be null when none were asked for).
  Accepted accept(int32_t id, Sequence& seq, const float* logits, int64_t vocab);

  // pick + accept, the whole step.
  Accepted step(float* logits, int64_t vocab, Sequence& seq) {
    const int32_t id = pick(logits, vocab, seq.history());
    return accept(id, seq, logits, vocab);
  }

  // The end of the text stream for a generation that ended for `*why` (EOS, length, a
  // cancellation): what is still held back. When that tail completes a stop string, *why becomes
  // kStop and the text before the stop is returned. "" after a stop string matched.
  std::string flush(FinishReason* why);

  int64_t generated() const { return generated_; }  // tokens kept so far
  bool stopped() const { return text_ && text_->stopped(); }
  std::string matched_stop() const { return text_ ? text_->matched_stop() : std::string(); }
  const DecodeOptions& options() const { return opts_; }

 private:
  DecodeOptions opts_;
  Sampler sampler_;
  std::optional<ConstraintMatcher> matcher_;
  std::optional<TextStream> text_;
  // LogprobsOf::kModel: the row before processing, copied per pick into one buffer kept for the
  // sequence's life.
  std::vector<float> model_logits_;
  int64_t generated_ = 0;
};

}  // namespace larder::runtime
