// spill_queue.h — the SSD tier's write-behind (kv-store.md §8.1, §11.8): the shared write queue
// (write_queue.h) with the SSD tier as its writer and the idle gate.
//
// Producers (engine thread): eviction spills (`spill`, via SpillSink) and write-behind
// snapshots (`snapshot`). The writer thread first runs the startup scan and then drains the
// queue into SsdTier::store, starting an item only while the engine is not busy: writing during
// decode steals bandwidth and, on a 2-core machine, a core (§8.1). Granularity is one file: an
// item already being written finishes. Over the cap, queued snapshots are dropped first (their
// keys stay dirty and are retried), then queued spills; snapshots are refused above 75 % of the
// cap. (The remote tier publishes through its own instance of the queue, busy or not:
// remote_queue.h.)
#pragma once

#include <memory>

#include "larder/memory/store/ram_tier.h"
#include "larder/memory/store/ssd_tier.h"
#include "larder/memory/store/write_queue.h"

namespace larder::memory {

class SpillQueue final : public SpillSink {
 public:
  // Starts the writer thread. With scan_first, it runs ssd->scan() before draining.
  SpillQueue(SsdTier* ssd, size_t cap_bytes, bool scan_first);

  void spill(std::shared_ptr<const Entry> entry) override { q_.offer(std::move(entry), {}); }
  // false when refused (queue above 75 % of its cap): the caller keeps the key dirty.
  bool snapshot(std::shared_ptr<const Entry> entry) {
    WriteQueue::Offer how;
    how.snapshot = true;
    return q_.offer(std::move(entry), how) == WriteQueue::Offered::kQueued;
  }

  void set_busy(bool busy) { q_.set_busy(busy); }
  // Blocks until nothing is queued or in flight; the idle gate is lifted while waiting (a flush
  // is a request to write now).
  void drain() { q_.drain(); }
  QueueStats stats() const { return q_.stats(); }
  size_t cap_bytes() const { return q_.cap_bytes(); }

 private:
  WriteQueue q_;  // last: its destructor stops the writer (queued items are dropped)
};

}  // namespace larder::memory
