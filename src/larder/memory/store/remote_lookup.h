// remote_lookup.h — the remote tier's lookups off the engine thread (issue 46).
//
// A remote lookup is a network round trip (and, on a hit, megabytes of values to verify and
// decode). Run on the engine thread at admission, it stalled every other sequence's decode step
// for as long as Redis took to answer — up to --kv-remote-timeout-ms for a hung one. Here a
// lookup is a job: the engine starts it (KvStore::begin_take), one lookup thread runs
// RemoteTier::fetch, and the engine picks the result up on a later step (KvStore::complete_take)
// while the other sequences keep decoding.
//
// Bounds: every job ends within the tier's timeouts (connect and every command), so a hung or
// dead Redis delays only the requests that wait on their own lookup, never stuck. Jobs run one at
// a time, in order (they share the read connection anyway); the engine holds at most --parallel
// of them (a pending lookup holds its slot).
//
// Cancellation: cancel() (a client that left, a shutdown past its deadline) drops a job not yet
// started; one in flight finishes its round trip (bounded) and its result is dropped. After
// cancel() returns, the job's on_ready is never called and is not running — so its owner may go
// away. On destruction the thread stops after the job in flight; queued jobs are cancelled.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "larder/memory/store/remote_tier.h"

namespace larder::memory {

class RemoteLookup {
 public:
  RemoteLookup(std::vector<TokenId> prompt, std::string ns, int64_t longer_than, std::function<void()> on_ready)
      : prompt_(std::move(prompt)), ns_(std::move(ns)), longer_than_(longer_than), on_ready_(std::move(on_ready)) {}
  // Any thread, but not while holding a lock that on_ready takes. Once true, result() is final
  // and on_ready has returned (so its owner may go away).
  bool ready() const;
  // Blocks until ready (synchronous callers: KvStore::take). Never called on a cancelled job.
  void wait() const;
  void cancel();
  bool cancelled() const;
  const RemoteFetch& result() const { return result_; }
  std::span<const TokenId> prompt() const { return prompt_; }
  const std::string& ns() const { return ns_; }
  int64_t longer_than() const { return longer_than_; }

 private:
  friend class RemoteLookups;
  // Lookup thread: publishes the result and calls on_ready unless cancelled meanwhile.
  void complete(RemoteFetch r);

  const std::vector<TokenId> prompt_;
  const std::string ns_;
  const int64_t longer_than_;
  // Guards cancelled_, ready_ and the on_ready call: cancel() and ready() wait out a call in
  // progress, so neither can return while on_ready still runs.
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool cancelled_ = false;
  bool ready_ = false;
  std::function<void()> on_ready_;
  RemoteFetch result_;  // written once by the lookup thread, before ready_
};

class RemoteLookups {
 public:
  explicit RemoteLookups(RemoteTier* remote);  // `remote` must outlive this
  ~RemoteLookups();
  RemoteLookups(const RemoteLookups&) = delete;
  RemoteLookups& operator=(const RemoteLookups&) = delete;

  // Queues a lookup of `prompt` for a prefix longer than `longer_than` (what RAM / SSD serve).
  // on_ready (may be empty) runs on the lookup thread once the result is there; it must not
  // block and must not call back into this queue.
  std::shared_ptr<RemoteLookup> start(std::span<const TokenId> prompt, const std::string& ns, int64_t longer_than,
                                      std::function<void()> on_ready);
  size_t in_queue() const;  // started and not yet finished (queued + in flight)

 private:
  void run();

  RemoteTier* remote_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<RemoteLookup>> q_;
  size_t busy_ = 0;  // in flight (0 or 1)
  bool stop_ = false;
  std::thread thread_;  // last: started when everything above exists
};

}  // namespace larder::memory
