// remote_queue.h — the remote tier's own write queue and writer thread (issue 46).
//
// Why not the SSD write-behind queue: that queue starts an item only while the engine is idle
// and is fed only after an idle debounce (kv-store.md §8.1–8.2), so a replica that stays busy
// — the normal state of a replica under load — never published its sessions' KV to the shared
// tier, and the other replicas prefilled them again. Here every RAM put is offered at once
// (`publish`, from the engine thread: a reference to the immutable entry, no copy, no I/O) and
// the writer drains continuously, busy or not.
//
// Bounds: queue bytes = Σ entry bytes of queued items (the entries are shared with RAM, so this
// mostly counts references, but a queued entry that RAM evicts stays alive until written).
// Over the cap the oldest queued items are dropped (counted: larder_kv_remote_queue_total
// {outcome="dropped"}); the in-flight item and the just-offered one never are. A dropped entry
// is a future remote miss, never a wrong result.
//
// Budget: while the engine is busy the writer is paced to `busy_bytes_per_s` (a token bucket
// charged after each pipelined batch of values), so encoding and sending multi-megabyte values
// take a bounded share of a core and of memory bandwidth from decode; idle, it is unpaced. The
// engine thread never waits on the writer: `publish` and `set_busy` only take the queue mutex,
// which the writer never holds across I/O. Every command has the tier's timeout, so a slow or
// dead Redis stalls only this thread (items then fail fast during the reconnect backoff).
//
// Entries already written are remembered (a bounded set of their ids with the time they were
// written or found present). What is remembered is only a hint, because Redis forgets on its
// own (maxmemory eviction, FLUSHALL, a restart without persistence), and this replica, which
// still holds the entry, is the one that can refill the shared tier:
//   - a put is always offered, written before or not; the writer then learns what Redis still
//     has with one EXISTS round trip (on its own thread) and re-sends only the missing chunks;
//   - a spill (an entry leaving RAM: its last chance to reach Redis from here) is skipped only
//     when its write is younger than `recheck_after`, else verified the same way;
//   - pressure relief (`written`, on the engine thread, no I/O) trusts the memory as it is.
// The same entry offered while it is still queued is queued once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "larder/memory/store/ram_tier.h"
#include "larder/memory/store/remote_tier.h"

namespace larder::memory {

struct RemoteQueueConfig {
  size_t cap_bytes = 1ull << 30;              // --kv-remote-queue
  uint64_t busy_bytes_per_s = 128ull << 20;   // --kv-remote-write-mibps while busy (0 = unpaced)
  // A spill trusts a remembered write this recent; an older one is verified (one EXISTS).
  std::chrono::milliseconds recheck_after{60000};
};

struct RemoteQueueStats {
  size_t queued_items = 0, queued_bytes = 0;
  uint64_t written = 0, failed = 0, dropped = 0;  // entries
  uint64_t skipped = 0;   // a spill of an entry written recently, or an offer of one still queued
  double paced_s = 0;     // time the writer waited for the busy budget
  bool in_flight = false;
};

class RemoteWriteQueue final : public SpillSink {
 public:
  // Starts the writer thread; `remote` must outlive the queue.
  RemoteWriteQueue(RemoteTier* remote, RemoteQueueConfig cfg);
  // Stops after the in-flight item; queued items are dropped (flush drains first).
  ~RemoteWriteQueue() override;

  // Offers an entry for writing (engine thread; never blocks on I/O), even one written before.
  void publish(std::shared_ptr<const Entry> entry) { offer(std::move(entry), false); }
  // SpillSink: an entry leaving RAM — skipped when written less than recheck_after ago.
  void spill(std::shared_ptr<const Entry> entry) override { offer(std::move(entry), true); }
  // True when this entry (same ns and tokens) was written (or found present) by this queue.
  bool written(const Entry& entry) const;
  void set_busy(bool busy);
  // Blocks until nothing is queued or in flight, unpaced, or until `limit` passes; true when
  // drained. Each item is bounded by the tier's timeouts, so a dead Redis drains fast.
  bool drain(std::chrono::milliseconds limit);
  RemoteQueueStats stats() const;

 private:
  struct Item {
    std::shared_ptr<const Entry> entry;
    std::string id;
    size_t bytes = 0;
  };
  void offer(std::shared_ptr<const Entry> entry, bool skip_recent);
  void run();
  void remember(const std::string& id);  // mu_ held
  // Waits (mu_ held through `lock`) until the busy budget allows the next batch; returns early
  // when the engine goes idle, a drain starts, or the queue stops.
  void pace(std::unique_lock<std::mutex>& lock, uint64_t bytes);

  RemoteTier* remote_;
  RemoteQueueConfig cfg_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> q_;
  size_t bytes_ = 0;
  bool busy_ = false, stop_ = false, in_flight_ = false;
  int draining_ = 0;
  std::chrono::steady_clock::time_point budget_at_{};  // the token bucket's "paid until"
  std::deque<std::string> done_order_;
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> done_;  // id → written at
  RemoteQueueStats st_;
  std::thread thread_;
};

}  // namespace larder::memory
