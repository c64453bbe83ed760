#include "larder/runtime/reasoning.h"

#include <algorithm>

namespace larder::runtime {

namespace {
// Length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}
}  // namespace

void ReasoningSplitter::emit(Out& o, std::string_view s) {
  if (inside_) {
    o.reasoning.append(s);
    return;
  }
  if (after_close_) {
    const size_t k = s.find_first_not_of("\r\n");
    if (k == std::string_view::npos) return;  // still only newlines: keep stripping
    s.remove_prefix(k);
    after_close_ = false;
  }
  o.content.append(s);
}

ReasoningSplitter::Out ReasoningSplitter::push(std::string_view text) {
  Out o;
  pending_.append(text);
  for (;;) {
    const std::string& tag = inside_ ? close_ : open_;
    const size_t at = pending_.find(tag);
    if (at == std::string::npos) break;
    emit(o, std::string_view(pending_).substr(0, at));
    pending_.erase(0, at + tag.size());
    if (inside_) after_close_ = true;
    inside_ = !inside_;
  }
  const size_t hold = partial_tag_suffix(pending_, inside_ ? close_ : open_);
  emit(o, std::string_view(pending_).substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  return o;
}

ReasoningSplitter::Out ReasoningSplitter::flush() {
  Out o;
  emit(o, pending_);
  pending_.clear();
  return o;
}

}  // namespace larder::runtime
