#include "larder/runtime/stop.h"

#include <algorithm>

namespace larder::runtime {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::push(std::string_view piece) {
  if (matched_) return "";
  pending_.append(piece);
  // Earliest occurrence of any stop string in the pending text.
  size_t best = std::string::npos;
  for (const auto& s : stops_) {
    const size_t at = pending_.find(s);
    if (at == std::string::npos) continue;
    if (at < best || (at == best && s.size() > matched_string_.size())) {
      best = at;
      matched_string_ = s;
    }
  }
  if (best != std::string::npos) {
    matched_ = true;
    std::string out = pending_.substr(0, best);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string. (A full stop
  // string would have been found above.) Only the last max_len − 1 bytes can qualify, and text
  // before them can never become part of a match, so it is released now.
  size_t hold = 0;
  for (const auto& s : stops_) {
    const size_t max_l = std::min(pending_.size(), s.size() - 1);
    for (size_t l = max_l; l > hold; --l) {
      if (pending_.compare(pending_.size() - l, l, s, 0, l) == 0) {
        hold = l;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  if (matched_) return "";
  std::string out = std::move(pending_);
  pending_.clear();
  return out;
}

}  // namespace larder::runtime
