#include "larder/memory/store/spill_queue.h"

namespace larder::memory {

SpillQueue::SpillQueue(SsdTier* ssd, size_t cap_bytes, bool scan_first) : ssd_(ssd), cap_(cap_bytes) {
  thread_ = std::thread([this, scan_first] { run(scan_first); });
}

SpillQueue::~SpillQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  st_.dropped += q_.size();
  q_.clear();
  bytes_ = 0;
}

void SpillQueue::enqueue(Item item) {
  std::deque<Item> victims;  // released outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    bytes_ += item.bytes;
    q_.push_back(std::move(item));
    auto drop_oldest = [&](bool snapshots) {
      // Never the just-enqueued item (the last one): the soft cap of one item.
      for (size_t i = 0; i + 1 < q_.size(); ++i) {
        if (q_[i].snapshot == snapshots) {
          bytes_ -= q_[i].bytes;
          victims.push_back(std::move(q_[i]));
          q_.erase(q_.begin() + static_cast<long>(i));
          ++st_.dropped;
          return true;
        }
      }
      return false;
    };
    while (bytes_ > cap_ && (drop_oldest(true) || drop_oldest(false))) {
    }
  }
  cv_.notify_all();
}

void SpillQueue::spill(std::shared_ptr<const Entry> entry) {
  const size_t b = entry->bytes(Backing::kAnon) + entry->bytes(Backing::kMapped);
  enqueue({std::move(entry), b, false});
}

bool SpillQueue::snapshot(std::shared_ptr<const Entry> entry) {
  const size_t b = entry->bytes(Backing::kAnon) + entry->bytes(Backing::kMapped);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes_ + b > cap_ / 4 * 3 && !q_.empty()) {  // §11.8: defer above 75 %
      ++st_.snapshots_refused;
      return false;
    }
  }
  enqueue({std::move(entry), b, true});
  return true;
}

void SpillQueue::set_busy(bool busy) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = busy;
  }
  cv_.notify_all();
}

void SpillQueue::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  draining_ = true;
  cv_.notify_all();
  cv_.wait(lock, [&] { return q_.empty() && !in_flight_; });
  draining_ = false;
}

QueueStats SpillQueue::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  QueueStats s = st_;
  s.queued_items = q_.size();
  s.queued_bytes = bytes_;
  s.in_flight = in_flight_;
  return s;
}

void SpillQueue::run(bool scan_first) {
  if (scan_first && ssd_) ssd_->scan();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (!q_.empty() && (!busy_ || draining_)); });
    if (stop_) return;
    Item item = std::move(q_.front());
    q_.pop_front();
    bytes_ -= item.bytes;
    in_flight_ = true;
    lock.unlock();
    const bool ok = ssd_ && ssd_->store(*item.entry);
    item.entry.reset();  // settle: release the views before reporting completion
    lock.lock();
    in_flight_ = false;
    if (ok) ++st_.written; else ++st_.failed;
    cv_.notify_all();
  }
}

}  // namespace larder::memory
