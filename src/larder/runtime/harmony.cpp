#include "larder/runtime/harmony.h"

#include <algorithm>
#include <array>

namespace larder::runtime {

namespace {
constexpr std::string_view kMessage = "<|message|>", kChannel = "<|channel|>", kStart = "<|start|>";
// What ends a message body: the three end markers, or a new header starting without one.
constexpr std::array<std::string_view, 5> kBodyEnds = {"<|end|>", "<|call|>", "<|return|>", kStart, kChannel};
// A header is a role, a channel, a recipient and a content type: a few dozen bytes. Text that
// runs longer without <|message|> is not harmony (a model answering plainly): it is content.
constexpr size_t kMaxHeader = 256;

size_t partial_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

// The word after `key` in a header (up to whitespace or the next marker), empty if absent.
std::string header_word(std::string_view header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string_view::npos) return {};
  std::string_view rest = header.substr(at + key.size());
  const size_t a = rest.find_first_not_of(" \t\r\n");
  if (a == std::string_view::npos) return {};
  rest.remove_prefix(a);
  return std::string(rest.substr(0, rest.find_first_of(" \t\r\n<")));
}

std::string_view trim(std::string_view s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string_view::npos) return {};
  return s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
}
}  // namespace

void HarmonyParser::begin_message(std::string_view header) {
  in_header_ = false;
  recipient_ = header_word(header, "to=");
  body_.clear();
  if (!recipient_.empty()) channel_ = Channel::kCall;  // a call is one on any channel it names a recipient on
  else if (header_word(header, kChannel) == "analysis") channel_ = Channel::kReasoning;
  else channel_ = Channel::kContent;  // final, and commentary preambles, which the user sees
}

void HarmonyParser::emit(Out& o, std::string_view s) {
  switch (channel_) {
    case Channel::kContent: o.content.append(s); break;
    case Channel::kReasoning: o.reasoning.append(s); break;
    case Channel::kCall: body_.append(s); break;
  }
}

void HarmonyParser::end_message(Out& o) {
  if (channel_ == Channel::kCall) {
    ToolCall c;
    constexpr std::string_view kFunctions = "functions.";
    c.name = recipient_.rfind(kFunctions, 0) == 0 ? recipient_.substr(kFunctions.size()) : recipient_;
    const std::string_view body = trim(body_);
    c.arguments = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (c.arguments.is_discarded()) c.arguments = std::string(body);  // as the tagged styles keep it
    if (body.empty()) c.arguments = nlohmann::ordered_json::object();
    o.calls.push_back(std::move(c));
    ++total_;
  }
  body_.clear();
  recipient_.clear();
  channel_ = Channel::kContent;
  in_header_ = true;
}

HarmonyParser::Out HarmonyParser::push(std::string_view text) {
  Out o;
  pending_.append(text);
  for (;;) {
    if (in_header_) {
      // A header is <|message|> starting within kMaxHeader bytes, decided on those bytes alone
      // (however the text was cut into pieces): the search stops where such a marker would end.
      const size_t at = std::string_view(pending_).substr(0, kMaxHeader + kMessage.size()).find(kMessage);
      if (at == std::string::npos) {
        if (pending_.size() < kMaxHeader + kMessage.size()) break;
        in_header_ = false;  // no header after all: plain text
        channel_ = Channel::kContent;
        // The marker that opened it is text too: left in place it would reopen the header at
        // once, and the loop would never end.
        for (std::string_view m : {kStart, kChannel}) {
          if (pending_.rfind(m, 0) == 0) {
            emit(o, m);
            pending_.erase(0, m.size());
            break;
          }
        }
        continue;
      }
      begin_message(std::string_view(pending_).substr(0, at));
      pending_.erase(0, at + kMessage.size());
      continue;
    }
    size_t end = std::string::npos;
    std::string_view marker;
    for (std::string_view m : kBodyEnds) {
      const size_t at = pending_.find(m);
      if (at < end) end = at, marker = m;
    }
    if (end == std::string::npos) break;
    emit(o, std::string_view(pending_).substr(0, end));
    end_message(o);
    // A header that opens without an end marker before it belongs to the next message.
    const bool opens_header = marker == kStart || marker == kChannel;
    pending_.erase(0, end + (opens_header ? 0 : marker.size()));
  }
  if (!in_header_) {
    size_t hold = 0;
    for (std::string_view m : kBodyEnds) hold = std::max(hold, partial_suffix(pending_, m));
    emit(o, std::string_view(pending_).substr(0, pending_.size() - hold));
    pending_.erase(0, pending_.size() - hold);
  }
  return o;
}

HarmonyParser::Out HarmonyParser::flush() {
  Out o;
  if (in_header_) {
    // An unfinished header is dropped; text that never was one (no marker in it) is the answer.
    if (pending_.find("<|") == std::string::npos) o.content = std::move(pending_);
  } else {
    emit(o, pending_);
    end_message(o);
  }
  pending_.clear();
  return o;
}

}  // namespace larder::runtime
