// speculative.h — draft-free speculative decoding (issue 44, first slice): prompt lookup.
//
// The draft is what followed the most recent earlier occurrence of the sequence's last n tokens
// (n from ngram_max down to ngram_min) in the prompt + the tokens generated so far — free to
// make, and right whenever the output repeats its input (quoting, rewriting code, lists). The
// driver forwards the last kept token and the k drafted ones in one forward (k + 1 rows), runs
// the ordinary DecodeStep on each row in order, keeps the draft while the step picks it, keeps the
// first differing pick as the next token, and trims the KV back to what was kept.
//
// Why the output does not change: every row is picked by the same DecodeStep as plain decoding,
// with the same history, grammar state (the matcher advances only over kept tokens) and draw
// number (the sampler is counter-based), so a pick equals the plain pick whenever the row's
// logits equal plain decoding's — which holds when the forward is batch-invariant (a row's logits
// do not depend on how many rows the call has). So it is exact for sampled requests too, not only
// greedy ones; they merely accept less.
//
// Only for states whose every layer is plain KV: a rejected draft is undone by trimming, a length
// change there; a ring or a recurrent state cannot be trimmed back exactly
// (speculation_possible says no and the driver decodes plainly).
#pragma once

#include <cstdint>
#include <vector>

#include "larder/memory/sequence_state.h"

namespace larder::runtime {

struct SpecOptions {
  int draft_max = 0;  // tokens drafted at most per step; 0: speculation off
  int ngram_min = 1, ngram_max = 3;
};

// The state can roll a rejected draft back exactly: every layer is plain KV (no ring, no
// recurrent state, no attachment).
bool speculation_possible(const memory::SequenceState& state);

class NgramDrafter {
 public:
  explicit NgramDrafter(SpecOptions o);

  // Up to min(k(), limit) tokens to verify after `history` (whose last token is the one about to
  // be forwarded); empty when no suffix recurs, while paused, or when limit <= 0.
  std::vector<int32_t> draft(const std::vector<int32_t>& history, int64_t limit);
  // The result of verifying a draft: `drafted` tokens, the first `accepted` of them picked.
  void feedback(int drafted, int accepted);

  int k() const { return k_; }  // the current draft length
  bool paused() const { return pause_ > 0; }
  int64_t drafted() const { return drafted_; }
  int64_t accepted() const { return accepted_; }

 private:
  SpecOptions o_;
  int k_ = 0;
  // Acceptance rate over recent drafts (exponential average). Under kMinRate a draft costs more
  // rows than it saves: drafting pauses for pause_ steps, a pause twice as long each time.
  double rate_ = 0.5;
  int pause_ = 0, next_pause_ = 16;
  int64_t drafted_ = 0, accepted_ = 0;
};

}  // namespace larder::runtime
