// remote_queue.h — the remote tier's publishing (issue 46): the shared write queue
// (write_queue.h) with the remote tier as its writer, fed at every RAM put, draining busy or not.
//
// Why not the SSD write-behind: that one starts an item only while the engine is idle and is
// fed only after an idle debounce (kv-store.md §8.1–8.2), so a replica that stays busy — the
// normal state of a replica under load — would never publish its sessions' KV to the shared
// tier, and the other replicas would prefill them again. Here every RAM put is offered at once
// (`publish`, from the engine thread: a reference to the immutable entry, no copy, no I/O) and
// the writer drains continuously, busy or not.
//
// Bounds: over --kv-remote-queue the oldest queued items are dropped (counted:
// larder_kv_remote_queue_total{outcome="dropped"}); a queued entry that RAM evicts stays alive
// until written or dropped. A dropped entry is a future remote miss, never a wrong result.
//
// Budget: while the engine is busy the writer is paced to `busy_bytes_per_s` (charged after each
// pipelined batch of values), so encoding and sending multi-megabyte values take a bounded share
// of a core and of memory bandwidth from decode; idle, it is unpaced. The engine thread never
// waits on the writer. Every command has the tier's timeout, so a slow or dead Redis stalls only
// the writer (items then fail fast during the reconnect backoff).
//
// Entries written are remembered (the newest 8 192 ids, with the time they were written or found
// present). That is only a hint, because Redis forgets on its own (maxmemory eviction, FLUSHALL,
// a restart without persistence), and this replica, which still holds the entry, is the one that
// can refill the shared tier:
//   - a put is always offered, written before or not; the writer then learns what Redis still
//     has with one EXISTS round trip (on its own thread) and re-sends only the missing chunks;
//   - a spill (an entry leaving RAM: its last chance to reach Redis from here) is skipped only
//     when its write is younger than `recheck_after`, else verified the same way;
//   - pressure relief (`written`, on the engine thread, no I/O) trusts the memory as it is.
// The same entry offered while it is still queued is queued once.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "larder/memory/store/ram_tier.h"
#include "larder/memory/store/remote_tier.h"
#include "larder/memory/store/write_queue.h"

namespace larder::memory {

struct RemoteQueueConfig {
  size_t cap_bytes = 1ull << 30;              // --kv-remote-queue
  uint64_t busy_bytes_per_s = 128ull << 20;   // --kv-remote-write-mibps while busy (0 = unpaced)
  // A spill trusts a remembered write this recent; an older one is verified (one EXISTS).
  std::chrono::milliseconds recheck_after{60000};
};

using RemoteQueueStats = QueueStats;  // skipped: a spill of a recent write, or an entry still queued

class RemoteWriteQueue final : public SpillSink {
 public:
  // Starts the writer thread; `remote` must outlive the queue.
  RemoteWriteQueue(RemoteTier* remote, RemoteQueueConfig cfg);

  // Offers an entry for writing (engine thread; never blocks on I/O), even one written before.
  void publish(std::shared_ptr<const Entry> entry) { offer(std::move(entry), false); }
  // SpillSink: an entry leaving RAM — skipped when written less than recheck_after ago.
  void spill(std::shared_ptr<const Entry> entry) override { offer(std::move(entry), true); }
  // True when this entry (same ns and tokens) was written (or found present) by this queue.
  bool written(const Entry& entry) const;
  void set_busy(bool busy) { q_.set_busy(busy); }
  // Blocks until nothing is queued or in flight, unpaced, or until `limit` passes; true when
  // drained. Each item is bounded by the tier's timeouts, so a dead Redis drains fast.
  bool drain(std::chrono::milliseconds limit) { return q_.drain_for(limit); }
  RemoteQueueStats stats() const { return q_.stats(); }

 private:
  void offer(std::shared_ptr<const Entry> entry, bool spill);

  const RemoteQueueConfig cfg_;
  WriteQueue q_;  // last: its destructor stops the writer (queued items are dropped)
};

}  // namespace larder::memory
