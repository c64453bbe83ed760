// generate.h — the synchronous driver of one Sequence (sequence.h) for the CLI and eval: chunked
// prefill with model.forward, then decode until EOS, a stop string, the grammar's end, the token
// budget, the context limit, or the caller says stop. Each decode step is the DecodeStep the
// server's engine runs per row too (decode_step.h), so the CLI and the server pick, accept and
// finish alike; the server drives the same Sequence from its batching engine instead.
//
// Text is optional: with GenerateOptions::tokenizer the released text (UTF-8-safe, stop strings
// held back) goes to on_text; without one only token ids are produced (eval).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "larder/core/status.h"
#include "larder/memory/sequence_state.h"
#include "larder/models/model.h"
#include "larder/runtime/decode_step.h"
#include "larder/runtime/sampler.h"
#include "larder/runtime/sequence.h"
#include "larder/runtime/speculative.h"

namespace larder::runtime {

// The one default length policy (README "Generation length"): a generation stops at EOS, a stop
// string, the context end, or after this many tokens when the request or command line names no
// limit — `larder generate -n`, `larder chat -n`, `larder serve --max-tokens` (the default of
// chat completions, completions and messages requests alike). -1 on the command line lifts it:
// until the context is full (llama.cpp's -n -1). A finite default because a small model that
// loops would otherwise run to the context end (4,058 tokens, 95 s, seen with a 4096 context).
inline constexpr int64_t kDefaultMaxTokens = 2048;
inline constexpr const char* kMaxTokensHelp =
    "tokens to generate at most when a request names no limit; -1 = until the context is full";

// DecodeOptions (sampling, max_new_tokens, eos_ids, stops, constraint, logprobs) plus what only
// the synchronous driver needs.
struct GenerateOptions : DecodeOptions {
  int64_t prefill_chunk = 512;  // tokens per prefill forward (CPU default, system.md §5)
  // Detokenize and match DecodeOptions::stops (null: ids only). Must outlive the call.
  const tokenizer::Tokenizer* tokenizer = nullptr;
  // Each piece of released text as it becomes safe to show, the held-back tail last.
  std::function<void(const std::string&)> on_text;
  // Speculation (speculative.h: prompt lookup, or a draft model): off at draft_max 0, and for
  // states that cannot be trimmed back (rings, recurrent layers) whatever it says.
  SpecOptions spec;
  // The sequence's LoRA adapters in canonical order (models::forward_adapter_uses; empty: the
  // base). They must outlive the call; the Sequence's KV namespace must be theirs
  // (runtime::lora_namespace) so its cache never crosses adapters.
  std::vector<models::AdapterUse> adapters;
};

struct GenerateStats {
  int64_t cached_tokens = 0;     // prompt tokens already in the cache on entry (not recomputed)
  int64_t prompt_tokens = 0;     // prompt tokens forwarded by this call
  int64_t generated_tokens = 0;  // tokens passed to the callback
  double prefill_seconds = 0;
  double decode_seconds = 0;
  FinishReason finish_reason = FinishReason::kLength;
  std::string matched_stop;      // kStop: the stop string
  std::vector<int32_t> tokens;   // the generated tokens (as passed to the callback)
  // Speculation: tokens drafted and verified, and how many of them were picked.
  int64_t drafted_tokens = 0, accepted_tokens = 0;
  int64_t decode_forwards = 0;   // forward calls while decoding
  int64_t verify_rows = 0;       // rows of those that verified a draft (its tokens + 1 each)
};

// Called for every kept token (after on_text got its text); false stops after it (kCancelled).
using TokenCallback = std::function<bool(int32_t token)>;

// Runs `seq` from wherever it stands (a store hit, a checkpoint split) to the end of decoding.
// It does not finish the sequence: the caller calls seq.finish() to put the KV into the store
// (after its own bookkeeping, e.g. interrupted output). Errors: prompt that leaves no room in the
// context, a forward failure, or a grammar dead end (then seq.finish(true) disposes the state).
Result<GenerateStats> generate(models::Model& model, Sequence& seq, const GenerateOptions& opts,
                               const TokenCallback& on_token);

// The state may already hold a prefix of `prompt` (state.length() tokens, e.g. from the KV store);
// only the rest is forwarded. If it holds the whole prompt, the last prompt token is re-forwarded
// for its logits. On return the state holds prompt + every generated token except the last
// sampled one (which was never forwarded). Errors: empty prompt, state longer than the prompt,
// prompt that leaves no room in the context, or a forward failure.
Result<GenerateStats> generate(models::Model& model, memory::SequenceState& cache, const std::vector<int32_t>& prompt,
                               const GenerateOptions& opts, const TokenCallback& on_token);

}  // namespace larder::runtime
