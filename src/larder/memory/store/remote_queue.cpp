#include "larder/memory/store/remote_queue.h"

#include "larder/memory/store/identity.h"

namespace larder::memory {

namespace {
constexpr size_t kRemembered = 8192;  // ids of written entries kept
}  // namespace

RemoteWriteQueue::RemoteWriteQueue(RemoteTier* remote, RemoteQueueConfig cfg)
    : cfg_(cfg),
      q_({.cap_bytes = cfg.cap_bytes, .busy_bytes_per_s = cfg.busy_bytes_per_s, .remember = kRemembered},
         // Paced per pipelined batch of values, so a long prompt's many chunks spread over time
         // rather than arriving as one burst while rows decode.
         [remote](const Entry& e, const std::function<bool(uint64_t)>& after_batch) {
           return remote->store(e, after_batch);
         }) {}

void RemoteWriteQueue::offer(std::shared_ptr<const Entry> entry, bool spill) {
  if (!entry) return;
  WriteQueue::Offer how;
  how.key = entry_id(entry->ns, entry->tokens);
  if (spill) how.skip_if_written_within = cfg_.recheck_after;
  q_.offer(std::move(entry), how);
}

bool RemoteWriteQueue::written(const Entry& entry) const { return q_.remembered(entry_id(entry.ns, entry.tokens)); }

}  // namespace larder::memory
