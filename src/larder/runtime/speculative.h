// speculative.h — speculative decoding (issue 44): drafters and the rule for when it is exact.
//
// A drafter proposes up to k tokens to follow the sequence; the driver (runtime::generate, the
// server's engine) forwards the last kept token and the k drafted ones in one forward (k + 1
// rows), runs the ordinary DecodeStep on each row in order, keeps the draft while the step picks
// it, keeps the first differing pick as the next token, and trims the KV back to what was kept.
// One driver for every draft source; the sources:
//   - NgramDrafter (prompt lookup): what followed the longest earlier match of the sequence's
//     suffix in the prompt + the output so far — free to make, and right whenever the output
//     repeats its input (quoting, rewriting).
//   - DraftModelDrafter: a smaller model with the same vocabulary decodes k tokens greedily from
//     its own state, kept beside the target's for the sequence's life.
//
// Why the output does not change: every row is picked by the same DecodeStep as plain decoding,
// with the same history, grammar state (the matcher advances only over kept tokens) and draw
// number (the sampler is counter-based), so a pick equals the plain pick whenever the row's
// logits equal plain decoding's — which holds when the forward is batch-invariant (a row's logits
// do not depend on how many rows the call has: kernels/batch_invariance.h). So it is exact for
// sampled requests too, not only greedy ones; they merely accept less. The draft itself never
// needs to be right, only cheap: a wrong draft costs time, never output — and the shared policy
// (Drafter, SpecCost) drafts only where the measured costs and the tracked acceptance say the
// time is won back.
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

// What speculation costs on this machine, measured while it runs, for one (target, draft) pair:
// shared by every drafter of the pair (all of a server's sequences, all of a bench's runs), fed
// by the drivers. A verify of k + 1 rows costs more than one decode step by an amount that depends
// on the model, its formats, the threads and what else is in the batch, and a drafted token costs
// what the draft took to make (a draft model's forward; prompt lookup: a search) — neither can be
// known before it runs. On a machine shared with other work single timings are 2-3x off and the
// load changes within seconds, so the decision rests on ratios of timings taken next to each
// other — what an extra verify row and a drafted token cost relative to a one-row step under the
// same load — each the median of the recent ones (an outlier does not move a median).
// Not thread-safe: one driver thread uses it (the engine's step loop, or one generate call).
class SpecCost {
 public:
  static constexpr int64_t kMaxRows = 64;  // forwards of more rows (prefill) are not recorded
  static constexpr int kWindow = 32;       // recent samples each median is taken over

  // A target forward of `rows` decode/verify rows took `seconds`.
  void forward(int64_t rows, double seconds);
  // Making `tokens` drafted tokens took `seconds` (right after the last forward recorded).
  void drafted(int64_t tokens, double seconds);
  // The recent one-row step in seconds (0 before any forward was measured): the median of the
  // recent forwards, each scaled to one row by the slope.
  double step() const { return step_; }
  // What each row past the first adds to a forward, as a fraction of a one-row step: the median
  // of (t_many / t_one - 1) / (rows - 1) over the recent pairs of consecutive forwards of which
  // one had one row; kPriorSlope until there are a few. (While every step verifies a draft there
  // are no such pairs and the slope stays what it was.)
  double slope() const { return slope_; }
  // A drafted token's cost as a fraction of a one-row step: each draft's time per token over the
  // forward just before it (scaled to one row), the median of the recent drafts; `prior` before
  // any draft was timed.
  double draft_ratio(double prior) const { return dn_ > 0 ? ratio_ : prior; }
  // The expected time of a forward of `rows` rows in seconds: step·(1 + slope·(rows - 1)).
  double forward_time(int64_t rows) const {
    return rows < 1 ? 0 : step_ * (1 + slope_ * static_cast<double>(rows - 1));
  }
  static constexpr double kPriorSlope = 0.15;  // of a step per row: decode streams the weights once

 private:
  double f_[kWindow] = {}, s_[kWindow] = {}, d_[kWindow] = {};  // one-row steps, slopes, draft ratios
  int fn_ = 0, fi_ = 0, sn_ = 0, si_ = 0, dn_ = 0, di_ = 0;       // samples held, next slot
  int64_t last_rows_ = 0;
  double last_seconds_ = 0;
  double step_ = 0, slope_ = kPriorSlope, ratio_ = 0;
};

struct SpecOptions {
  int draft_max = 0;  // tokens drafted at most per step; 0: speculation off
  // A draft shorter than this is not verified (llama.cpp's --draft-min). Never below it.
  int draft_min = 0;
  // Prompt lookup takes the longest earlier match of the history's suffix, at least ngram_min and
  // at most ngram_max tokens long.
  int ngram_min = 1, ngram_max = 32;
  // Draft with this model (DraftModelDrafter) instead of prompt lookup. Not owned; it must
  // outlive every drafter made from these options, and its vocabulary must be the target's
  // (check_draft_vocab).
  models::Model* draft_model = nullptr;
  int64_t target_vocab = 0;  // with draft_model: the target's logits width (drafts stay under it)
  // The prior of what drafting one token costs, in target decode steps, until the first draft is
  // timed (a draft model: its weight bytes over the target's; prompt lookup: 0).
  double draft_cost = 0;
  // A draft model stops a draft at a token it gives less than this probability (a token it is
  // unsure of is rarely the target's pick, and every drafted token costs a draft forward).
  double draft_p_min = 0.5;
  // Draft at the cap every step whatever the costs (LARDER_SPEC_FORCE=1): for tests and benches
  // of the verify path, which must stay exact however much is drafted.
  bool force = false;
  // The measured costs (shared by all drafters made from these options); make_drafter makes one
  // for the drafter alone when null.
  std::shared_ptr<SpecCost> cost;
};

// What a draft competes with in the step that would verify it: `rows` rows already in the forward
// (1 for a lone sequence) and `sequences` sequences sharing its time (each waits for every draft).
struct StepShape {
  int64_t rows = 1;
  int64_t sequences = 1;
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

// A source of drafts with the policy every source shares: draft only what pays. Each step it
// picks the draft length k that maximises the expected tokens per second of the step's sequences,
// from the measured cost ratios (SpecCost: a verify of k + 1 rows and k drafted tokens, relative
// to the one-row step it replaces) and the tracked acceptance — with a per-token acceptance a, a
// draft of k yields 1 + a + … + a^k tokens — and drafts nothing when no k beats plain decoding
// (by a small margin for the noise of the measurements). It starts optimistic (a kind never tried
// is assumed taken 3 times in 4), because a draft not made yields no evidence: a pessimistic start
// would keep a drafter that pays from ever showing it. A sequence whose drafts are not taken
// decodes plainly, except for a one-token probe now and then that keeps the acceptance current:
// after 16 skipped steps, twice as many after each probe that missed (up to 256), the same number
// after one taken, 16 again once drafts pay. The acceptance is tracked per kind of draft (prompt
// lookup: by the length of the match, a 1-token match being far less reliable than a 20-token
// one). The length is further capped: 2 at first (a kind's first draft is a guess), twice as long
// after a draft taken whole (up to draft_max), one past what was taken after a miss.
class Drafter {
 public:
  explicit Drafter(SpecOptions o);
  virtual ~Drafter() = default;

  // Up to min(k(), limit) tokens to verify after `history` (whose last token is the one about to
  // be forwarded); empty when the source has nothing, when no draft pays, when limit <= 0, or
  // when the source has fewer than draft_min.
  std::vector<int32_t> draft(const std::vector<int32_t>& history, int64_t limit, StepShape shape = {});
  // The result of verifying the last draft: `drafted` tokens, the first `accepted` of them picked.
  void feedback(int drafted, int accepted);
  // The sequence's prompt is in (called once, right after the target's prefill, so that a draft
  // model's own prefill counts as prefill and not inside the first decode step). Optional.
  virtual void prefill(const std::vector<int32_t>& /*history*/) {}

  // The cost model's decision alone: the draft length (<= most) worth verifying for a draft of
  // `kind` in a step of `shape`, 0 when none beats plain decoding.
  int plan(int kind, int64_t most, StepShape shape) const;
  SpecCost& cost() { return *o_.cost; }
  double acceptance(int kind) const;  // the tracked per-token acceptance of drafts of `kind`

  int k() const { return k_; }  // the current cap on the draft length
  int64_t drafted() const { return drafted_; }
  int64_t accepted() const { return accepted_; }
  int64_t skipped() const { return skipped_; }  // steps with a draft at hand that did not pay

  static constexpr int kKinds = 5;

 protected:
  struct Proposal {
    std::vector<int32_t> tokens;
    int kind = 0;  // < kKinds
    // Seconds of the proposal that are not the drafted tokens' cost (a draft model catching up on
    // tokens the target decoded while drafting paused).
    double untimed_seconds = 0;
    // What the proposal cost when the source knows it better than the clock around propose()
    // (a simulated source in tests); < 0: the clock's.
    double seconds = -1;
  };
  // Cheap sources (prompt lookup) propose first and the plan sees the proposal's kind and length;
  // dear ones (a draft model) are planned first (kind 0) and asked for the planned length.
  virtual bool cheap() const = 0;
  // Up to `want` (>= 1) tokens to follow `history`.
  virtual Proposal propose(const std::vector<int32_t>& history, int64_t want) = 0;
  const SpecOptions& options() const { return o_; }

 private:
  struct Track {
    double hits = 0, trials = 0;  // decayed counts of drafted positions taken / tested
    int skipped = 0, next_probe = 0;  // 0: the first draft of the kind is a probe (measures)
  };
  static constexpr int kFirstProbe = 16, kMaxProbe = 256;  // steps skipped before a one-token probe
  // `planned`: the plan's length, or 0 when none paid — then a probe of one token when due.
  int decide(int kind, int planned, int64_t most);
  void probed(bool taken);  // the result of the last draft, if it was a probe: when the next one is due
  SpecOptions o_;
  int k_ = 0;
  Track track_[kKinds];
  int last_kind_ = 0;
  bool probing_ = false;  // the last draft was a probe
  int64_t drafted_ = 0, accepted_ = 0, skipped_ = 0;
};

// Prompt lookup: what followed the longest earlier match of the history's suffix (ties: the most
// recent one). The longest match is also the one that continues across accepted tokens: after a
// draft from position p was taken, the match at p extended by those tokens is longer than any
// other. The kind is the match length's bucket (1, 2, 3-4, 5-8, 9+).
class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(SpecOptions o);

 private:
  bool cheap() const override { return true; }
  Proposal propose(const std::vector<int32_t>& history, int64_t want) override;
};

// Greedy drafts from a draft model over its own SequenceState, kept for the sequence's life: each
// draft first trims that state back to the longest prefix it shares with the history (what the
// target rejected goes) and forwards what the history added since (the prompt, on the first
// draft; afterwards the accepted tokens and the target's own pick, one or two tokens), then k
// one-token forwards, stopping early at a token the draft gives less than draft_p_min. Its own state rather than the KV store: the store is keyed by the target's
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
  bool cheap() const override { return false; }
  Proposal propose(const std::vector<int32_t>& history, int64_t want) override;
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
