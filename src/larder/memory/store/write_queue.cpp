#include "larder/memory/store/write_queue.h"

#include <algorithm>

namespace larder::memory {

WriteQueue::WriteQueue(WriteQueueConfig cfg, Writer write, std::function<void()> first)
    : cfg_(cfg), write_(std::move(write)) {
  thread_ = std::thread([this, first = std::move(first)] { run(first); });
}

WriteQueue::~WriteQueue() {
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

WriteQueue::Offered WriteQueue::offer(std::shared_ptr<const Entry> entry, const Offer& how) {
  Item item;
  item.bytes = entry->bytes(Backing::kAnon) + entry->bytes(Backing::kMapped);
  item.entry = std::move(entry);
  item.key = how.key;
  item.snapshot = how.snapshot;
  std::deque<Item> victims;  // released outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (item.snapshot && bytes_ + item.bytes > cfg_.cap_bytes / 4 * 3 && !q_.empty()) {  // §11.8
      ++st_.snapshots_refused;
      return Offered::kRefused;
    }
    if (!item.key.empty()) {
      if (how.skip_if_written_within) {
        const auto it = written_.find(item.key);
        if (it != written_.end() && std::chrono::steady_clock::now() - it->second < *how.skip_if_written_within) {
          ++st_.skipped;
          return Offered::kSkipped;
        }
      }
      // Queued already (e.g. a spill right after its put): one write serves both.
      for (const Item& q : q_) {
        if (q.key == item.key) {
          ++st_.skipped;
          return Offered::kSkipped;
        }
      }
    }
    bytes_ += item.bytes;
    q_.push_back(std::move(item));
    auto drop_oldest = [&](bool snapshots) {
      // Never the just-offered item (the last one): the soft cap of one item.
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
    while (bytes_ > cfg_.cap_bytes && (drop_oldest(true) || drop_oldest(false))) {
    }
  }
  cv_.notify_all();
  return Offered::kQueued;
}

bool WriteQueue::remembered(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return written_.count(key) > 0;
}

void WriteQueue::set_busy(bool busy) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_ == busy) return;
    busy_ = busy;
  }
  cv_.notify_all();
}

void WriteQueue::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  ++draining_;
  cv_.notify_all();
  cv_.wait(lock, [&] { return q_.empty() && !in_flight_; });
  --draining_;
}

bool WriteQueue::drain_for(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mu_);
  ++draining_;
  cv_.notify_all();
  const bool ok = cv_.wait_for(lock, limit, [&] { return q_.empty() && !in_flight_; });
  --draining_;
  return ok;
}

QueueStats WriteQueue::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  QueueStats s = st_;
  s.queued_items = q_.size();
  s.queued_bytes = bytes_;
  s.in_flight = in_flight_;
  return s;
}

void WriteQueue::remember(const std::string& key) {
  const auto now = std::chrono::steady_clock::now();
  const auto [it, fresh] = written_.try_emplace(key, now);
  if (!fresh) {
    it->second = now;  // written (or found present) again
    return;
  }
  written_order_.push_back(key);
  if (written_order_.size() > cfg_.remember) {
    written_.erase(written_order_.front());
    written_order_.pop_front();
  }
}

void WriteQueue::pace(std::unique_lock<std::mutex>& lock, uint64_t bytes) {
  if (cfg_.busy_bytes_per_s == 0 || bytes == 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (!busy_ || draining_) {
    budget_at_ = now;  // idle time is free; the bucket does not save up for the next busy spell
    return;
  }
  const auto cost = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(static_cast<double>(bytes) / static_cast<double>(cfg_.busy_bytes_per_s)));
  budget_at_ = std::max(budget_at_, now) + cost;
  if (budget_at_ <= now) return;
  cv_.wait_until(lock, budget_at_, [&] { return stop_ || draining_ > 0 || !busy_; });
  st_.paced_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - now).count();
}

void WriteQueue::run(const std::function<void()>& first) {
  if (first) first();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (!q_.empty() && (!cfg_.idle_gate || !busy_ || draining_ > 0)); });
    if (stop_) return;
    Item item = std::move(q_.front());
    q_.pop_front();
    bytes_ -= item.bytes;
    in_flight_ = true;
    lock.unlock();
    const bool ok = write_(*item.entry, [&](uint64_t batch_bytes) {
      std::unique_lock<std::mutex> l(mu_);
      pace(l, batch_bytes);
      return !stop_;
    });
    item.entry.reset();  // settle: release the views before reporting completion
    lock.lock();
    in_flight_ = false;
    if (ok) {
      ++st_.written;
      if (cfg_.remember > 0 && !item.key.empty()) remember(item.key);
    } else {
      ++st_.failed;
    }
    cv_.notify_all();
  }
}

}  // namespace larder::memory
