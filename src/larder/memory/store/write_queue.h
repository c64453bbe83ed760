// write_queue.h — the one serial, byte-capped write queue and its writer thread, behind both the
// SSD write-behind (spill_queue.h, kv-store.md §8.1, §11.8) and the remote tier's publishing
// (remote_queue.h). Each tier supplies its writer callback and its policy; the queue owns the
// bounds, the thread, the locking and the counters.
//
// Producers (engine thread) offer references to immutable entries; the writer thread hands them,
// oldest first, to the callback. An item's "views" are released by dropping the reference on
// every settle path (written, failed, dropped).
//
// Bounds: queue bytes = Σ entry bytes of queued items. Over the cap, queued snapshots are dropped
// first (oldest first), then the other items (oldest first); a dropped item is a future miss,
// never a wrong result. The in-flight item is never dropped and the just-offered one is never its
// own victim, so the queue never exceeds cap + one item. Snapshots are refused above 75 % of the
// cap so they cannot crowd out spills.
//
// When the writer may work, per tier:
//   - idle_gate: it starts an item only while the engine is not busy (set_busy) or a drain runs;
//     granularity is one item (§8.1: writing during decode steals bandwidth and, on a 2-core
//     machine, a core);
//   - busy_bytes_per_s: while busy it keeps to a byte budget, a token bucket charged after each
//     batch the callback reports; idle or draining, it is unpaced.
//
// Keys: an item offered with a key is queued once (an offer of a key still queued is skipped).
// With `remember` > 0 the keys of items written are kept (the newest `remember`, with the time of
// the write) so an offer may be skipped when its key was written recently (`skip_if_written_within`).
//
// Locking: one mutex + condition variable guard the deque, counters and flags. The engine thread
// only ever takes the mutex briefly; the writer never holds it across the callback's I/O (pacing
// waits on the condition variable, the mutex released).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "larder/memory/store/entry.h"

namespace larder::memory {

struct WriteQueueConfig {
  size_t cap_bytes = 1ull << 30;
  bool idle_gate = false;         // start items only while idle or draining
  uint64_t busy_bytes_per_s = 0;  // pace while busy (0 = unpaced)
  size_t remember = 0;            // keys of written items kept
};

struct QueueStats {
  size_t queued_items = 0;
  size_t queued_bytes = 0;
  uint64_t written = 0, failed = 0, dropped = 0;  // items
  uint64_t snapshots_refused = 0;
  uint64_t skipped = 0;  // offers not queued: the key is queued, or was written recently
  double paced_s = 0;    // time the writer waited for the busy budget
  bool in_flight = false;
};

class WriteQueue {
 public:
  // Writes one entry. Calls after_batch(bytes sent) after each batch it sends (pacing) and stops,
  // failing, when that returns false (shutdown).
  using Writer = std::function<bool(const Entry&, const std::function<bool(uint64_t)>& after_batch)>;

  // Starts the writer thread, which runs `first` (if any) before taking items.
  WriteQueue(WriteQueueConfig cfg, Writer write, std::function<void()> first = {});
  // Stops the writer after the in-flight item; queued items are dropped (drain first to keep them).
  ~WriteQueue();
  WriteQueue(const WriteQueue&) = delete;
  WriteQueue& operator=(const WriteQueue&) = delete;

  struct Offer {
    std::string key;   // empty: no de-duplication
    bool snapshot = false;
    std::optional<std::chrono::steady_clock::duration> skip_if_written_within;
  };
  enum class Offered { kQueued, kSkipped, kRefused };  // refused: a snapshot above 75 %
  // Engine thread; never blocks on I/O.
  Offered offer(std::shared_ptr<const Entry> entry, const Offer& how);
  // True when an item with this key was written (among the remembered ones).
  bool remembered(const std::string& key) const;

  void set_busy(bool busy);
  // Blocks until nothing is queued or in flight; the idle gate and the pacing are lifted while
  // waiting (a drain is a request to write now). The bounded form returns false at `limit`.
  void drain();
  bool drain_for(std::chrono::milliseconds limit);
  QueueStats stats() const;
  size_t cap_bytes() const { return cfg_.cap_bytes; }

 private:
  struct Item {
    std::shared_ptr<const Entry> entry;
    std::string key;
    size_t bytes = 0;
    bool snapshot = false;
  };
  void run(const std::function<void()>& first);
  void remember(const std::string& key);  // mu_ held
  // Waits (mu_ held through `lock`) until the busy budget allows the next batch; returns early
  // when the engine goes idle, a drain starts, or the queue stops.
  void pace(std::unique_lock<std::mutex>& lock, uint64_t bytes);

  const WriteQueueConfig cfg_;
  const Writer write_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> q_;
  size_t bytes_ = 0;
  bool busy_ = false, stop_ = false, in_flight_ = false;
  int draining_ = 0;
  std::chrono::steady_clock::time_point budget_at_{};  // the token bucket's "paid until"
  std::deque<std::string> written_order_;
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> written_;  // key → written at
  QueueStats st_;
  std::thread thread_;
};

}  // namespace larder::memory
