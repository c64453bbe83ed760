#include "larder/memory/store/remote_queue.h"

#include "larder/memory/store/identity.h"

namespace larder::memory {

namespace {
constexpr size_t kRemembered = 8192;  // ids of written entries kept (a spill after them is free)

size_t entry_bytes(const Entry& e) { return e.bytes(Backing::kAnon) + e.bytes(Backing::kMapped); }
}  // namespace

RemoteWriteQueue::RemoteWriteQueue(RemoteTier* remote, RemoteQueueConfig cfg) : remote_(remote), cfg_(cfg) {
  thread_ = std::thread([this] { run(); });
}

RemoteWriteQueue::~RemoteWriteQueue() {
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

void RemoteWriteQueue::offer(std::shared_ptr<const Entry> entry, bool skip_recent) {
  if (!entry) return;
  Item item;
  item.id = entry_id(entry->ns, entry->tokens);
  item.bytes = entry_bytes(*entry);
  item.entry = std::move(entry);
  std::deque<Item> victims;  // released outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (skip_recent) {
      const auto it = done_.find(item.id);
      if (it != done_.end() && std::chrono::steady_clock::now() - it->second < cfg_.recheck_after) {
        ++st_.skipped;
        return;
      }
    }
    // The same entry queued twice (a spill right after its put): one write serves both.
    for (const Item& q : q_) {
      if (q.id == item.id) {
        ++st_.skipped;
        return;
      }
    }
    bytes_ += item.bytes;
    q_.push_back(std::move(item));
    // Oldest first, never the just-offered item: the queue never exceeds cap + one item.
    while (bytes_ > cfg_.cap_bytes && q_.size() > 1) {
      bytes_ -= q_.front().bytes;
      victims.push_back(std::move(q_.front()));
      q_.pop_front();
      ++st_.dropped;
    }
  }
  cv_.notify_all();
}

bool RemoteWriteQueue::written(const Entry& entry) const {
  const std::string id = entry_id(entry.ns, entry.tokens);
  std::lock_guard<std::mutex> lock(mu_);
  return done_.count(id) > 0;
}

void RemoteWriteQueue::set_busy(bool busy) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_ == busy) return;
    busy_ = busy;
  }
  cv_.notify_all();
}

bool RemoteWriteQueue::drain(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mu_);
  ++draining_;
  cv_.notify_all();
  const bool ok = cv_.wait_for(lock, limit, [&] { return q_.empty() && !in_flight_; });
  --draining_;
  return ok;
}

RemoteQueueStats RemoteWriteQueue::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  RemoteQueueStats s = st_;
  s.queued_items = q_.size();
  s.queued_bytes = bytes_;
  s.in_flight = in_flight_;
  return s;
}

void RemoteWriteQueue::remember(const std::string& id) {
  const auto now = std::chrono::steady_clock::now();
  const auto [it, fresh] = done_.try_emplace(id, now);
  if (!fresh) {
    it->second = now;  // verified again
    return;
  }
  done_order_.push_back(id);
  if (done_order_.size() > kRemembered) {
    done_.erase(done_order_.front());
    done_order_.pop_front();
  }
}

void RemoteWriteQueue::pace(std::unique_lock<std::mutex>& lock, uint64_t bytes) {
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

void RemoteWriteQueue::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !q_.empty(); });
    if (stop_) return;
    Item item = std::move(q_.front());
    q_.pop_front();
    bytes_ -= item.bytes;
    in_flight_ = true;
    lock.unlock();
    // Paced per pipelined batch of values, so a long prompt's many chunks spread over time
    // rather than arriving as one burst while rows decode.
    const bool ok = remote_->store(*item.entry, [&](uint64_t batch_bytes) {
      std::unique_lock<std::mutex> l(mu_);
      pace(l, batch_bytes);
      return !stop_;
    });
    item.entry.reset();  // release the views before reporting completion
    lock.lock();
    in_flight_ = false;
    if (ok) {
      ++st_.written;
      remember(item.id);
    } else {
      ++st_.failed;
    }
    cv_.notify_all();
  }
}

}  // namespace larder::memory
