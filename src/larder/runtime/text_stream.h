// text_stream.h — generated token ids to the text a client may see, one token at a time:
//   ids → incremental detokenizer (whole UTF-8 characters only) → stop-string matcher (text that
//   could begin a stop string is held back; nothing of a stop string is ever released).
// Shared by `larder generate` and the server, so both release exactly the same text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "larder/runtime/stop.h"
#include "larder/tokenizer/tokenizer.h"

namespace larder::runtime {

class TextStream {
 public:
  // skip_special: special tokens (e.g. an end-of-turn marker that is not an EOS) produce no text.
  TextStream(const tokenizer::Tokenizer& tok, std::vector<std::string> stops, bool skip_special = true)
      : decoder_(tok, skip_special), stops_(std::move(stops)) {}

  // The text safe to release after `id`. Once stopped() is true, later calls return "".
  std::string push(int32_t id) {
    if (stops_.matched()) return {};
    return stops_.push(decoder_.push(id));
  }
  // End of generation (EOS, length, cancel): what is still held back, unless a stop matched.
  std::string finish() {
    if (stops_.matched()) return {};
    std::string s = stops_.push(decoder_.flush());
    if (stops_.matched()) return s;
    return s + stops_.flush();
  }
  bool stopped() const { return stops_.matched(); }
  const std::string& matched_stop() const { return stops_.matched_string(); }

 private:
  tokenizer::StreamDecoder decoder_;
  StopMatcher stops_;
};

}  // namespace larder::runtime
