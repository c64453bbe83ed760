// speculative.h — speculative decoding (issue 44): drafters and the rule for when it is exact.
//
// A drafter proposes up to k tokens to follow the sequence; the driver (runtime::generate, the
// server's engine) forwards the last kept token and the k drafted ones in one forward (k + 1
// rows), runs the ordinary DecodeStep on each row in order, keeps the draft while the step picks
// it, keeps the first differing pick as the next token, and trims the KV back to what was kept.
// One driver for every draft source; the sources:
//   - NgramDrafter (prompt lookup): what followed the most recent earlier occurrence of the
//     sequence's last n tokens (n from ngram_max down to ngram_min) in the prompt + the output so
//     far — free to make, and right whenever the output repeats its input (quoting, rewriting).
//   - DraftModelDrafter: a smaller model with the same vocabulary decodes k tokens greedily from
//     its own state, kept beside the target's for the sequence's life.
//
// Why the output does not change: every row is picked by the same DecodeStep as plain decoding,
// with the same history, grammar state (the matcher advances only over kept tokens) and draw
// number (the sampler is counter-based), so a pick equals the plain pick whenever the row's
// logits equal plain decoding's — which holds when the forward is batch-invariant (a row's logits
// do not depend on how many rows the call has: kernels/batch_invariance.h). So it is exact for
// sampled requests too, not only greedy ones; they merely accept less. The draft itself never
// needs to be right, only cheap: a wrong draft costs time, never output.
//
// Only for states whose every layer is plain KV: a rejected draft is undone by trimming, a length
// change there; a ring or a recurrent state cannot be trimmed back exactly
// (speculation_possible says no and the driver decodes plainly).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "larder/core/status.h"
#include "larder/memory/sequence_state.h"
#include "larder/models/model.h"

namespace larder::runtime {

struct LoadedModel;

struct SpecOptions {
  int draft_max = 0;  // tokens drafted at most per step; 0: speculation off
  // A draft shorter than this is not verified (llama.cpp's --draft-min): the verify rows would
  // cost more than they save. The adaptive length never goes below it.
  int draft_min = 0;
  int ngram_min = 1, ngram_max = 3;
  // Draft with this model (DraftModelDrafter) instead of prompt lookup. Not owned; it must
  // outlive every drafter made from these options, and its vocabulary must be the target's
  // (check_draft_vocab).
  models::Model* draft_model = nullptr;
  int64_t target_vocab = 0;  // with draft_model: the target's logits width (drafts stay under it)
  // What drafting one token costs, in target decode steps (a draft model: its weight bytes over
  // the target's; prompt lookup: ~0). A step that drafts k and has a taken gains a tokens for
  // k·cost extra, so below an acceptance rate of `cost` drafting loses: the pause threshold is
  // max(0.2, cost).
  double draft_cost = 0;
};

// The state can roll a rejected draft back exactly: every layer is plain KV (no ring, no
// recurrent state, no attachment).
bool speculation_possible(const memory::SequenceState& state);

// Whether verifying k + 1 rows in one forward gives every row exactly the logits a one-row decode
// gives it on the running kernels: every weight format of `model` is batch-invariant in
// kernels::active_decode_mode(). When it is not, `*why` (optional) names the first format that
// is not and the reason. The rule for speculation on by default (`--spec auto`): this and
// speculation_possible of the sequence's state.
bool speculation_exact(const models::Model& model, std::string* why = nullptr);

// Whether `draft` can draft for `target`: the same number of tokens, the same token texts and the
// same special tokens (each id special in both or neither). The error names the first token that
// differs.
Status check_draft_vocab(const LoadedModel& target, const LoadedModel& draft);

// A source of drafts with the adaptive length policy every source shares: the draft length
// follows the acceptance rate (all taken: twice as long, up to draft_max; otherwise one past what
// was taken), and when the recent rate falls under what a drafted token costs (at least a fifth:
// SpecOptions::draft_cost) drafting pauses for a number of steps that doubles each time
// (16 .. 256), so a sequence that gains nothing loses almost nothing.
class Drafter {
 public:
  explicit Drafter(SpecOptions o);
  virtual ~Drafter() = default;

  // Up to min(k(), limit) tokens to verify after `history` (whose last token is the one about to
  // be forwarded); empty when the source has nothing, while paused, when limit <= 0, or when the
  // source has fewer than draft_min.
  std::vector<int32_t> draft(const std::vector<int32_t>& history, int64_t limit);
  // The result of verifying a draft: `drafted` tokens, the first `accepted` of them picked.
  void feedback(int drafted, int accepted);
  // The sequence's prompt is in (called once, right after the target's prefill, so that a draft
  // model's own prefill counts as prefill and not inside the first decode step). Optional.
  virtual void prefill(const std::vector<int32_t>& /*history*/) {}

  int k() const { return k_; }  // the current draft length
  bool paused() const { return pause_ > 0; }
  int64_t drafted() const { return drafted_; }
  int64_t accepted() const { return accepted_; }

 protected:
  // Up to `want` (>= 1) tokens to follow `history`.
  virtual std::vector<int32_t> propose(const std::vector<int32_t>& history, int64_t want) = 0;
  const SpecOptions& options() const { return o_; }

 private:
  SpecOptions o_;
  int k_ = 0;
  // Acceptance rate over recent drafts (exponential average). Under kMinRate a draft costs more
  // rows than it saves: drafting pauses for pause_ steps, a pause twice as long each time.
  double rate_ = 0.5, min_rate_ = 0.2;
  int pause_ = 0, next_pause_ = 16;
  int64_t drafted_ = 0, accepted_ = 0;
};

class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(SpecOptions o);

 private:
  std::vector<int32_t> propose(const std::vector<int32_t>& history, int64_t want) override;
};

// Greedy drafts from a draft model over its own SequenceState, kept for the sequence's life: each
// draft first trims that state back to the longest prefix it shares with the history (what the
// target rejected goes) and forwards what the history added since (the prompt, on the first
// draft; afterwards the accepted tokens and the target's own pick, one or two tokens), then k
// one-token forwards. Its own state rather than the KV store: the store is keyed by the target's
// identity, and within a sequence the state is already the longest reusable prefix — across
// requests a conversation's draft prompt is prefilled again (a third of the target's prefill for
// the 0.5B/1.5B pair). A failed draft forward (its context full, a token past its vocabulary)
// stops drafting for the sequence — the target decodes plainly, the output is the same.
class DraftModelDrafter final : public Drafter {
 public:
  // max_tokens: the sequence's context (the draft never holds more).
  DraftModelDrafter(SpecOptions o, int64_t max_tokens);

  const std::string& error() const { return error_; }  // why drafting stopped ("" while it runs)
  // Forwards all of the history but its last token (the first draft forwards that one).
  void prefill(const std::vector<int32_t>& history) override;

 private:
  // Trims the state to what it shares with history[0, upto) and forwards the rest of it.
  bool catch_up(const std::vector<int32_t>& history, int64_t upto);
  std::vector<int32_t> propose(const std::vector<int32_t>& history, int64_t want) override;
  models::Model& m_;
  memory::SequenceState state_;
  std::vector<int32_t> fed_;   // the tokens state_ holds
  std::vector<float> logits_;  // [draft vocab]
  std::string error_;
};

// The drafter `o` asks for, for a sequence whose target state is `state` with context `ctx`; null
// when speculation is off (draft_max 0) or the state cannot be trimmed back.
std::unique_ptr<Drafter> make_drafter(const SpecOptions& o, const memory::SequenceState& state, int64_t ctx);

}  // namespace larder::runtime
