// text_stream.h — generated token ids to the text a client may see, one token at a time:
//   ids → incremental detokenizer (whole UTF-8 characters only) → stop-string matcher (text that
//   could begin a stop string is held back; nothing of a stop string is ever released).
// Shared by `larder generate` and the server, so both release exactly the same text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "larder/runtime/stop.h"
#include "larder/tokenizer/tokenizer.h"

namespace larder::runtime {

class TextStream {
 public:
  // skip_special: special tokens (e.g. an end-of-turn marker that is not an EOS) produce no text.
  // Otherwise their text is released as it is and the stop matcher never sees it: a stop string
  // matches neither a marker nor across one (a client's stop is about what the model says, not
  // the format's framing). body_open (harmony's <|message|>) narrows matching to the text between
  // that marker and the next special token — message bodies, never the headers
  // (`commentary to=functions.x`) between the markers.
  TextStream(const tokenizer::Tokenizer& tok, std::vector<std::string> stops, bool skip_special = true,
             std::optional<int32_t> body_open = std::nullopt)
      : tok_(&tok), decoder_(tok, skip_special), stops_(std::move(stops)), skip_special_(skip_special),
        body_open_(body_open), in_body_(!body_open) {}

  // The text safe to release after `id`. Once stopped() is true, later calls return "".
  std::string push(int32_t id) {
    if (stops_.matched()) return {};
    std::string piece = decoder_.push(id);
    if (skip_special_ || !tok_->is_special(id)) return in_body_ ? stops_.push(piece) : piece;
    // A marker: the decoder releases it with whatever text it still held before it. That text is
    // matched (a stop inside it still counts); what is held back for a partial match is released,
    // since nothing after the marker can complete it.
    const std::string marker = tok_->token_bytes(id);
    const bool ends_with_marker =
        piece.size() >= marker.size() && piece.compare(piece.size() - marker.size(), marker.size(), marker) == 0;
    const size_t before = ends_with_marker ? piece.size() - marker.size() : piece.size();
    std::string out = piece.substr(0, before);
    if (in_body_) {
      out = stops_.push(out);
      if (stops_.matched()) return out;
      out += stops_.flush();
    }
    out.append(piece, before, std::string::npos);
    in_body_ = !body_open_ || id == *body_open_;
    return out;
  }
  // End of generation (EOS, length, cancel): what is still held back, unless a stop matched.
  std::string finish() {
    if (stops_.matched()) return {};
    std::string tail = decoder_.flush();
    if (!in_body_) return stops_.flush() + tail;
    std::string s = stops_.push(tail);
    if (stops_.matched()) return s;
    return s + stops_.flush();
  }
  bool stopped() const { return stops_.matched(); }
  const std::string& matched_stop() const { return stops_.matched_string(); }

 private:
  const tokenizer::Tokenizer* tok_;
  tokenizer::StreamDecoder decoder_;
  StopMatcher stops_;
  bool skip_special_;
  std::optional<int32_t> body_open_;
  bool in_body_;
};

}  // namespace larder::runtime
