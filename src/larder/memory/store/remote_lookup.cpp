#include "larder/memory/store/remote_lookup.h"

namespace larder::memory {

bool RemoteLookup::ready() const {
  std::lock_guard<std::mutex> l(mu_);
  return ready_;
}

void RemoteLookup::wait() const {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return ready_ || cancelled_; });
}

void RemoteLookup::cancel() {
  // Taking mu_ waits out an on_ready call in progress; afterwards none starts.
  std::lock_guard<std::mutex> l(mu_);
  cancelled_ = true;
  on_ready_ = nullptr;
  cv_.notify_all();
}

bool RemoteLookup::cancelled() const {
  std::lock_guard<std::mutex> l(mu_);
  return cancelled_;
}

void RemoteLookup::complete(RemoteFetch r) {
  std::lock_guard<std::mutex> l(mu_);
  if (cancelled_) return;  // nobody reads it: the entry (and its rows) are released here
  result_ = std::move(r);
  ready_ = true;
  cv_.notify_all();
  if (on_ready_) on_ready_();
}

RemoteLookups::RemoteLookups(RemoteTier* remote) : remote_(remote), thread_([this] { run(); }) {}

RemoteLookups::~RemoteLookups() {
  std::deque<std::shared_ptr<RemoteLookup>> left;
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    left.swap(q_);
  }
  cv_.notify_all();
  for (auto& j : left) j->cancel();
  if (thread_.joinable()) thread_.join();  // the job in flight ends within the tier's timeouts
}

std::shared_ptr<RemoteLookup> RemoteLookups::start(std::span<const TokenId> prompt, const std::string& ns,
                                                   int64_t longer_than, std::function<void()> on_ready) {
  auto job = std::make_shared<RemoteLookup>(std::vector<TokenId>(prompt.begin(), prompt.end()), ns, longer_than,
                                            std::move(on_ready));
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) {
      job->cancel();
      return job;
    }
    q_.push_back(job);
  }
  cv_.notify_one();
  return job;
}

size_t RemoteLookups::in_queue() const {
  std::lock_guard<std::mutex> l(mu_);
  return q_.size() + busy_;
}

void RemoteLookups::run() {
  for (;;) {
    std::shared_ptr<RemoteLookup> job;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !q_.empty(); });
      if (stop_) return;
      job = std::move(q_.front());
      q_.pop_front();
      busy_ = 1;
    }
    // A job cancelled while queued costs nothing; one cancelled in flight is dropped by complete.
    if (!job->cancelled()) job->complete(remote_->fetch(job->prompt(), job->ns(), job->longer_than()));
    std::lock_guard<std::mutex> l(mu_);
    busy_ = 0;
  }
}

}  // namespace larder::memory
