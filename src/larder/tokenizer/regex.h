// regex.h — Oniguruma, the engine HF `tokenizers` itself uses for Split patterns, so \p{L},
// \s, lookahead and (?i:...) behave exactly as in the reference. Compiled once per pattern;
// searching is thread-safe (all match state is per call).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "larder/core/status.h"

namespace larder::tokenizer {

class Regex {
 public:
  static Result<std::shared_ptr<const Regex>> compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-overlapping matches, left to right, as [begin, end) byte offsets into `s` (which must
  // be valid UTF-8). Empty matches are skipped (they never produce a piece).
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;
  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  void* re_ = nullptr;  // regex_t*, owned
  std::string pattern_;
};

}  // namespace larder::tokenizer
