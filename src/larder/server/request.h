// request.h — one generation request as the scheduler sees it, and the channel its results
// travel back on.
//
// The HTTP layer turns an API body into a GenRequest (prompt ids, sampling, limits, stops) and
// submits it; the engine thread runs it and pushes Events into the request's Channel; the HTTP
// thread that owns the connection pops them and writes the response. Text is produced on the
// engine thread (runtime::TextStream), so the stop-string decision and the end of generation
// happen at the same step, and every surface releases the same text.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "larder/models/adapter.h"
#include "larder/runtime/decode_step.h"
#include "larder/runtime/grammar.h"
#include "larder/runtime/sampler.h"

namespace larder::server {

struct GenRequest {
  std::string id;                 // chatcmpl-…/cmpl-…/msg_… (logs)
  std::string route;              // for metrics labels
  std::vector<int32_t> prompt;
  // Where the chat's messages end in `prompt` (chat routes only): boundary checkpoints for state
  // the KV store cannot trim back (runtime::SequenceOptions::message_ends).
  std::vector<int64_t> message_ends;
  runtime::SamplingParams sampling;
  int64_t max_tokens = 0;         // already clamped to what fits the context
  std::vector<std::string> stops;
  bool special_text = false;      // special tokens are text (harmony's channel markers; runtime/decode_step.h)
  int top_logprobs = -1;          // -1: no logprobs; else that many alternatives per token
  // Which distribution they describe: the processed one (OpenAI routes, server-api.md), or, for
  // llama-server's /completion n_probs, the model's own logits (before biases, penalties and
  // grammar) or the sampler's after its filters and temperature (post_sampling_probs).
  using Probs = runtime::LogprobsOf;
  Probs probs = Probs::kProcessed;
  std::string ns;                 // KV store namespace (adapters + cache_salt; runtime::lora_request)
  // LoRA adapters on this request's rows, canonical order (runtime/adapters.h); they point into
  // the server's adapter table, which lives as long as the server. Empty: the base model.
  std::vector<models::AdapterUse> adapters;
  // Constrained decoding (runtime/grammar.h): compiled by the HTTP worker, matched per sequence
  // on the engine thread. Null: unconstrained.
  std::shared_ptr<const runtime::Constraint> constraint;
  std::chrono::steady_clock::time_point arrived = std::chrono::steady_clock::now();
  bool memory_held = false;       // engine: the `held` event was sent (memory admission)
};

// The runtime's finish reasons (runtime/decode_step.h): the engine's decode step decides them.
using Finish = runtime::FinishReason;

struct TokenInfo {  // one generated token, with logprobs when requested
  int32_t id = 0;
  runtime::TokenLogprobs lp;
};

struct Outcome {
  Finish finish = Finish::kNone;
  std::string matched_stop;       // the stop string that ended it (kStop by string)
  std::string error;              // kError
  int64_t prompt_tokens = 0;      // the whole prompt
  int64_t cached_tokens = 0;      // prompt tokens served by the KV store
  int64_t completion_tokens = 0;  // tokens sampled (EOS excluded)
  std::string cache_tier = "none", cache_reason;
  double queue_ms = 0, prefill_ms = 0, ttft_ms = 0, decode_ms = 0;
  // Speculation (--spec): on for this request (the model's state can take a draft back), tokens
  // drafted and verified, and how many of them were picked.
  bool speculative = false;
  int64_t drafted_tokens = 0, accepted_tokens = 0;
};

// What the engine sends: released text (possibly empty when only logprobs are new), the tokens
// whose text it completes, and, last, the outcome.
struct Event {
  bool admitted = false;          // first event: the request got a slot; outcome has prompt/cache counts
  // Memory admission (engine.h): the request is first in line but its KV does not fit beside the
  // running ones; it waits for them (up to --admit-wait). An admitted or refused event follows.
  bool held = false;
  // A refusal before admission (done is set, outcome.error says why and what would fit): the
  // HTTP status (503) and the Retry-After seconds to answer with.
  int refuse_status = 0;
  int retry_after_s = 0;
  std::string text;
  std::vector<TokenInfo> tokens;
  bool done = false;
  Outcome outcome;                // valid when done
};

// Single producer (engine thread), single consumer (the connection's HTTP thread).
//
// A consumer that paces its writes (HttpConfig::stream_flush_ms) waits in wait_urgent() between
// them; token events pushed meanwhile queue without waking it. Waking the consumer once per token
// cost ~70 µs of CPU per token on the 2-core Zen 5 (mostly the context switches, which on a host
// whose cores all run compute threads preempt one of them), plus as much again in the client.
class Channel {
 public:
  void push(Event e) {
    const bool urgent = is_urgent(e);
    bool wake;
    {
      std::lock_guard<std::mutex> l(mu_);
      q_.push_back(std::move(e));
      urgent_ += urgent;
      wake = urgent || !pacing_;
    }
    if (wake) cv_.notify_one();
  }
  // Waits up to `timeout` for the next event.
  std::optional<Event> pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_for(l, timeout, [&] { return !q_.empty(); })) return std::nullopt;
    return take();
  }
  // The next event if one is queued.
  std::optional<Event> try_pop() {
    std::lock_guard<std::mutex> l(mu_);
    if (q_.empty()) return std::nullopt;
    return take();
  }
  // Waits until `until`, or until an event that must not wait is queued (the last event, a
  // memory hold, a refusal, an admission). Ordinary events queue meanwhile without a wake-up.
  void wait_urgent(std::chrono::steady_clock::time_point until) {
    std::unique_lock<std::mutex> l(mu_);
    pacing_ = true;
    cv_.wait_until(l, until, [&] { return urgent_ > 0; });
    pacing_ = false;
  }
  // The consumer is gone (client disconnected) or no longer wants output: the engine drops the
  // request at its next step (or before it starts, if still queued).
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

 private:
  static bool is_urgent(const Event& e) { return e.done || e.held || e.admitted || e.refuse_status != 0; }
  Event take() {
    Event e = std::move(q_.front());
    q_.pop_front();
    urgent_ -= is_urgent(e);
    return e;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> q_;
  int urgent_ = 0;       // urgent events in q_
  bool pacing_ = false;  // the consumer is in wait_urgent
  std::atomic<bool> cancelled_{false};
};

}  // namespace larder::server
