#include "larder/memory/store/spill_queue.h"

namespace larder::memory {

SpillQueue::SpillQueue(SsdTier* ssd, size_t cap_bytes, bool scan_first)
    : q_({.cap_bytes = cap_bytes, .idle_gate = true},
         [ssd](const Entry& e, const std::function<bool(uint64_t)>&) { return ssd && ssd->store(e); },
         [ssd, scan_first] {
           if (scan_first && ssd) ssd->scan();
         }) {}

}  // namespace larder::memory
