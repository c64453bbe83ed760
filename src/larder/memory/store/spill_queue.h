// spill_queue.h — the one serial, byte-capped write-behind queue and its writer thread
// (kv-store.md §8.1, §11.8).
//
// Producers (engine thread): eviction spills (`spill`, via SpillSink) and write-behind
// snapshots (`snapshot`). One consumer: the SSD writer thread, which first runs the startup scan
// and then drains the queue into SsdTier::store. (The remote tier has its own queue that drains
// while the engine is busy too: remote_queue.h.) Items are references to immutable entries, so
// "views" are released by dropping the reference on every settle path (written, failed, dropped).
//
// Bounds: queue bytes = Σ entry bytes of queued items. Over the cap, queued snapshots are dropped
// first (oldest first; their keys stay dirty and are retried), then queued spills (oldest
// first; a dropped spill is a future miss, never a wrong result). The in-flight item is never
// dropped and the just-enqueued item is never its own victim, so the queue never exceeds
// cap + one item. Snapshots are refused above 75 % of the cap so they cannot crowd out spills.
//
// Idle gate: the writer only starts an item while the engine is not busy (set_busy), because
// writing during decode steals bandwidth and, on a 2-core machine, a core (§8.1). Granularity is
// one file: an item already being written finishes.
//
// All synchronization is internal: one mutex + condition variable guard the deque, counters
// and flags.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "larder/memory/store/ram_tier.h"
#include "larder/memory/store/ssd_tier.h"

namespace larder::memory {

struct QueueStats {
  size_t queued_items = 0;
  size_t queued_bytes = 0;
  uint64_t written = 0, failed = 0, dropped = 0;
  uint64_t snapshots_refused = 0;
  bool in_flight = false;
};

class SpillQueue final : public SpillSink {
 public:
  // Starts the writer thread. With scan_first, it runs ssd->scan() before draining.
  SpillQueue(SsdTier* ssd, size_t cap_bytes, bool scan_first);
  // Stops the writer after the in-flight item; queued items are dropped (call flush first for
  // durability — the store facade's flush does).
  ~SpillQueue() override;

  void spill(std::shared_ptr<const Entry> entry) override;
  // false when refused (queue above 75 % of its cap): the caller keeps the key dirty.
  bool snapshot(std::shared_ptr<const Entry> entry);

  void set_busy(bool busy);
  // Blocks until nothing is queued or in flight. The idle gate is lifted while waiting (a flush
  // is a request to write now).
  void drain();
  QueueStats stats() const;
  size_t cap_bytes() const { return cap_; }

 private:
  struct Item {
    std::shared_ptr<const Entry> entry;
    size_t bytes = 0;
    bool snapshot = false;
  };
  void enqueue(Item item);
  void run(bool scan_first);

  SsdTier* ssd_;
  size_t cap_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> q_;
  size_t bytes_ = 0;
  bool busy_ = false, draining_ = false, stop_ = false, in_flight_ = false;
  QueueStats st_;
  std::thread thread_;
};

}  // namespace larder::memory
