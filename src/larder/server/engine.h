// engine.h — the scheduler: one engine thread owns the model, the KV store and every running
// sequence, and advances them with continuous batching (system.md §4, server-api.md §12).
//
// Each step:
//   1. admit queued requests while fewer than `parallel` run (cancelled ones are dropped unseen);
//      an admitted request takes its longest cached prefix from the KV store. RAM and SSD answer
//      at once; when the remote tier (Redis) may hold a longer prefix, the request is pending
//      (it holds its slot) while the store's lookup thread fetches, and becomes a running
//      sequence on the first step after the lookup is ready — the engine thread never waits on
//      the network, so the other sequences keep decoding (a client that leaves meanwhile, or a
//      shutdown past its deadline, drops the pending request at once);
//   2. build one batch: every decoding sequence contributes its one new token, then prefilling
//      sequences contribute prompt chunks from what is left of the step's token budget (a
//      quarter of it while any sequence decodes) — so a long prompt is prefilled in slices
//      between decode steps instead of stalling them;
//   3. one Model::forward_batch for the whole batch;
//   4. each row that needs a token runs its decode step (runtime/decode_step.h — the one
//      `larder generate` runs: pick, grammar, EOS, text and stop strings, length, logprobs) and
//      pushes events; finished or cancelled sequences put their KV into the store and free their
//      slot.
// A sequence's tokens depend only on its own prompt, sampling params and seed (counter-based
// RNG): batching changes floating-point summation order in the matmuls, nothing else.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "larder/memory/store/kv_store.h"
#include "larder/runtime/loaded_model.h"
#include "larder/runtime/speculative.h"
#include "larder/runtime/decode_step.h"
#include "larder/server/metrics.h"
#include "larder/server/request.h"

namespace larder::server {

struct EngineConfig {
  int parallel = 4;             // --parallel: sequences advanced together
  size_t queue_max = 64;        // --queue-max: requests waiting for a slot (429 beyond; 0 = no queue)
  int64_t ctx = 0;              // per-sequence context limit (tokens)
  int64_t step_tokens = 256;    // prefill tokens per step across all prefilling sequences
                                // (step_tokens / 4, at least 32, while any sequence decodes)
  // Idle time before write-behind snapshots go to the SSD writer (kv-store.md §8.2).
  std::chrono::steady_clock::duration writebehind_debounce = std::chrono::seconds(1);
  // --ssd-demote-idle: RAM entries unused this long are spilled to SSD and dropped (0 = off).
  std::chrono::steady_clock::duration demote_idle = std::chrono::seconds(0);
  // --min-free-memory: when the machine's available memory (runtime::available_memory) drops
  // below this, the KV store's least recently used RAM entries are demoted — written to the SSD
  // tier, or dropped without one — until it is above again (kv-store.md §3.4; 0 = off). Checked
  // at most once a second, idle or busy.
  uint64_t min_free_memory = 0;
  // Memory admission (issue 16 item 3): the bytes the running sequences' KV may take together
  // (0 = no limit) and what one token of one sequence takes (runtime/fit.h). A request reserves
  // its prompt + max_tokens (both already fitted to the context) and is admitted only when that
  // fits beside the reservations of the running ones; otherwise it is held, first in line (FIFO:
  // the ones behind it wait too), until enough finish — at most admit_wait, then it is refused
  // with 503 and a Retry-After estimated from the running sequences' remaining tokens. One that
  // could never fit is refused at submit.
  uint64_t kv_budget = 0;
  uint64_t kv_bytes_per_token = 0;
  uint64_t kv_fixed_bytes = 0;  // per sequence whatever its length: sliding-window rings, recurrent state
  std::chrono::milliseconds admit_wait{30000};
  // --spec ngram / --draft MODEL: speculation per sequence (runtime/speculative.h), each sequence
  // its own drafter (prompt lookup, or its own draft-model state): a drafted sequence contributes
  // its last token + the draft as k + 1 rows of the step's forward_batch. draft_max 0: off.
  // Sequences whose state has rings or recurrent layers decode plainly.
  runtime::SpecOptions spec;
  // KV namespace id → label (issue 45, server/loras.h namespace_labels): /stats and /metrics show
  // the store by namespace under these, and a miss that names another namespace names its label.
  memory::NsLabels ns_labels{{"base", "base"}};
};

class Engine {
 public:
  Engine(runtime::LoadedModel& model, std::unique_ptr<memory::KvStore> store, EngineConfig cfg, Metrics& metrics);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Errors: resource_exhausted (queue full → 429), unavailable (draining, or
  // KV larger than the whole budget → 503).
  Result<std::shared_ptr<Channel>> submit(GenRequest req);

  // Stop admitting; let running and queued requests finish until `deadline`, cancel the rest,
  // flush the KV store; returns the flush report. Idempotent.
  memory::FlushReport shutdown(std::chrono::steady_clock::time_point deadline);
  bool draining() const { return draining_.load(); }
  // During shutdown: the deadline is now — running requests end with an error event at the
  // next step (a second Ctrl-C), instead of a cut connection.
  void hurry();

  // Runs fn(store) on the engine thread and waits (admin flush/clear, stats snapshots).
  nlohmann::json with_store(const std::function<nlohmann::json(memory::KvStore&)>& fn);

  size_t queue_depth() const;
  size_t active() const { return active_count_.load(); }
  uint64_t kv_reserved() const { return kv_reserved_.load(); }  // bytes held by running sequences
  const EngineConfig& config() const { return cfg_; }
  // The remote tier (null without --kv-remote). Its peek is thread-safe, so /v1/kv/lookup asks
  // it from the HTTP worker and never holds the engine thread for a network round trip.
  memory::RemoteTier* remote_tier() const { return store_ ? store_->remote() : nullptr; }

 private:
  struct Seq;
  struct Pending;
  void loop();
  void admit(std::deque<std::pair<GenRequest, std::shared_ptr<Channel>>>& incoming);
  // Pending remote lookups: ready ones become running sequences, cancelled ones (or all, on a
  // shutdown past its deadline) are dropped with their slot and reservation.
  void poll_pending(bool shutdown);
  void start_seq(Pending p, memory::TakeResult taken);
  void step();
  void finish(Seq& s, Finish why, std::string error = {});
  // One picked token's effect on its request (first-token timing, held-back tokens, text event);
  // true when it ends the generation (the caller finishes it).
  bool deliver(Seq& s, runtime::Accepted& a);
  // The k + 1 rows of a drafted sequence's verify forward (runtime/speculative.h).
  void verify(Seq& s, int64_t V);
  void run_tasks();
  uint64_t kv_need(const GenRequest& r) const;
  void drop_cancelled();  // with mu_ held: queued requests whose client left leave the queue
  // Called with mu_ held: a refusal for the request first in line that has waited too long.
  Event memory_refusal(const GenRequest& r, uint64_t need, uint64_t reserving) const;

  runtime::LoadedModel& m_;
  std::unique_ptr<memory::KvStore> store_;
  EngineConfig cfg_;
  Metrics& metrics_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<GenRequest, std::shared_ptr<Channel>>> queue_;
  std::deque<std::function<void()>> tasks_;  // run on the engine thread between steps
  bool stop_ = false;
  size_t admitting_ = 0;  // taken from queue_, not yet in active_count_ (guarded by mu_)
  std::atomic<bool> draining_{false};
  std::atomic<size_t> active_count_{0};
  std::atomic<uint64_t> kv_reserved_{0};  // sum of the running sequences' reservations
  double step_ms_ = 0;                    // recent step time (engine thread), for Retry-After
  std::chrono::steady_clock::time_point deadline_{};
  bool flushed_ = false;
  memory::FlushReport flush_report_;

  std::vector<std::unique_ptr<Seq>> seqs_;  // engine thread only
  std::vector<Pending> pending_;            // engine thread only: takes waiting for a remote lookup
  bool lookup_ready_ = false;               // guarded by mu_: some pending lookup became ready
  bool idle_ = false, snapshotted_ = false;
  std::chrono::steady_clock::time_point idle_since_{}, last_demote_{}, last_pressure_check_{};
  void relieve_memory_pressure();  // engine thread; see EngineConfig::min_free_memory
  std::thread thread_;
};

}  // namespace larder::server
