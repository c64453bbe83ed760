// stop.h — stop strings over streamed, decoded text.
//
// push() takes the next decoded piece and returns the text that is safe to emit now: text that
// could still turn out to be the beginning of a stop string is held back until the next pieces
// decide it. Once a stop string appears, the text before it is returned, matched() turns true,
// and everything after (including the stop string) is dropped. flush() at the end of the stream
// releases what is still held (nothing after a match).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace larder::runtime {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);  // empty strings are ignored

  std::string push(std::string_view piece);
  std::string flush();
  bool matched() const { return matched_; }
  // The stop string that matched (the earliest in the text; the longest among those starting at
  // the same position). Empty before a match.
  const std::string& matched_string() const { return matched_string_; }
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool matched_ = false;
  std::string matched_string_;
};

}  // namespace larder::runtime
