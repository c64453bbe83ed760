// sequence.h — one generation's life against the Layer-0 KV store (kv-store.md §10):
//
//   take from the store → chunked prefill (split at each boundary checkpoint) → decode → put
//
// Written once here and driven by two schedulers: the server's engine thread (continuous
// batching: it asks for one prefill slice per step and forwards it in a batch with other
// sequences) and the CLI's synchronous loop (runtime::generate: one sequence, model.forward).
// Before this file, each of them (and each CLI verb) took, trimmed, prefilled and put on its own,
// and none captured a checkpoint, so on a sliding-window model (a wrapped ring cannot be trimmed
// back) the next turn of a chat whose reply re-tokenized differently reused nothing.
//
// What a Sequence does not do: sample, detokenize, match stops, time. Sampling through the
// finish reason is one DecodeStep per sequence (decode_step.h), shared by both drivers; events,
// callbacks and timing differ per caller and do not touch the store.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "larder/core/status.h"
#include "larder/memory/sequence_state.h"
#include "larder/memory/store/kv_store.h"
#include "larder/models/model.h"

namespace larder::runtime {

struct SequenceOptions {
  memory::KvStore* store = nullptr;  // null: no store (every prompt is prefilled in full)
  std::string ns;                    // KV store namespace (model identity + adapters + salt)
  int64_t ctx = 0;                   // per-sequence context limit in tokens (0: the model's)
  // Token offsets where the chat's messages end (the template's turn ends, ascending; from
  // runtime::chat_message_ends). For state that cannot be trimmed back, each one past the store's
  // hit becomes a checkpoint, as the prompt end does (kv-store.md §11.3): a template that renders
  // the previous answer differently from how it was generated (Qwen3.5's <think> prefix) still
  // shares every earlier message with the next turn.
  std::vector<int64_t> message_ends;
};

class Sequence {
 public:
  // Takes the longest usable prefix of `prompt` from the store (or starts from an empty state).
  // The state never covers the whole prompt: the last prompt token is always forwarded, for its
  // logits. Never fails because of the store: an unusable hit is logged and prefilled in full.
  static Sequence start(const models::Model& model, std::vector<int32_t> prompt, SequenceOptions opts);
  // The same from a take the caller already made on opts.store (the server's engine: begin_take,
  // then complete_take once its remote lookup is ready, kv_store.h).
  static Sequence start(const models::Model& model, std::vector<int32_t> prompt, SequenceOptions opts,
                        memory::TakeResult taken);
  // The same over a state the caller already holds (a prefix of `prompt`, no store). Errors: the
  // state is longer than the prompt, or a fully covered prompt cannot be trimmed back by one.
  static Result<Sequence> adopt(std::vector<int32_t> prompt, memory::SequenceState state, int64_t ctx);

  Sequence(Sequence&&) = default;
  Sequence& operator=(Sequence&&) = default;

  // What the store reused and why (kv-store.md §11.6): tier "none" and reason "store_off"
  // without a store.
  const memory::CacheReport& cache_report() const { return report_; }
  const char* cache_tier() const;
  const std::string& cache_reason() const { return report_.reason; }
  int64_t cached_tokens() const { return cached_; }

  const std::vector<int32_t>& prompt() const { return prompt_; }
  int64_t prompt_size() const { return static_cast<int64_t>(prompt_.size()); }
  // prompt + every token accepted by decode_accept (the sampler's history).
  const std::vector<int32_t>& history() const { return history_; }
  memory::SequenceState& state() { return state_; }
  const memory::SequenceState& state() const { return state_; }
  int64_t ctx() const { return ctx_; }

  // --- prefill ---
  bool prefilling() const { return prefilled_ < prompt_size(); }
  int64_t prefilled() const { return prefilled_; }
  // The next prompt slice to forward, at most max_tokens long. A slice never crosses a
  // checkpoint offset: the exact state at the boundary must exist to be captured (§11.3).
  std::span<const int32_t> next_prefill(int64_t max_tokens) const;
  // The slice of n tokens went through a forward pass. At a checkpoint offset, a checkpoint
  // entry goes into the store (its failure is logged: it only costs a future hit).
  void prefill_done(int64_t n);

  // --- decode ---
  // A sampled (non-EOS) token the caller keeps: it enters the history and will be forwarded
  // (the state absorbs it at the next forward, if there is one).
  void decode_accept(int32_t token) { history_.push_back(token); }
  // Another token fits the context after the ones already forwarded (the sequence's limit and
  // the state's, which a caller's adopted state may set lower).
  bool has_room() const { return state_.length() + 1 <= std::min(ctx_, state_.max_tokens()); }

  // --- end ---
  // Puts what was actually forwarded (history[0, state.length())) into the store: after EOS,
  // a stop string, the length limit or a cancellation. `failed` (a forward error: the state may
  // be half-updated) disposes instead. A no-op without a store or after the first call. A put
  // failure is returned for the caller to log; the sequence is finished either way.
  Status finish(bool failed = false);
  bool finished() const { return finished_; }

  // Where the prompt-end checkpoint is captured (0: none planned) — for tests and logs.
  int64_t checkpoint_at() const { return checkpoints_.empty() ? 0 : checkpoints_.back(); }
  // Every planned checkpoint offset, ascending: the message ends past the hit, then the prompt end.
  const std::vector<int64_t>& checkpoints() const { return checkpoints_; }

 private:
  Sequence(std::vector<int32_t> prompt, memory::SequenceState state, int64_t ctx)
      : prompt_(std::move(prompt)), state_(std::move(state)), ctx_(ctx) {}
  void plan_checkpoints(const std::vector<int64_t>& message_ends);

  std::vector<int32_t> prompt_, history_;
  memory::SequenceState state_;
  int64_t ctx_ = 0;
  memory::KvStore* store_ = nullptr;
  std::string ns_;
  memory::CacheReport report_;
  int64_t cached_ = 0, prefilled_ = 0;
  std::vector<int64_t> checkpoints_;  // ascending, all past cached_
  size_t next_checkpoint_ = 0;        // the first of checkpoints_ not reached yet
  bool finished_ = false;
};

}  // namespace larder::runtime
