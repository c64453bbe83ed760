// harmony.h — splits the streamed output of a model that speaks OpenAI's "harmony" format (gpt-oss)
// into reasoning, answer text and tool calls (server-api.md §5.3 "harmony"). The output is a run of
// messages, each a header and a body:
//
//   <|channel|>analysis<|message|>…<|end|>                                        → reasoning
//   <|start|>assistant<|channel|>final<|message|>…<|return|>                       → content
//   <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>
//                                                                                 → a tool call
//
// (the recipient `to=` may also stand before <|channel|>; a commentary message without one is a
// preamble the user sees: content). The prompt ends with `<|start|>assistant`, so the output opens
// with a header. Streaming-safe like ReasoningSplitter: header text never reaches either side, and
// a piece that might begin a marker is held until the next pieces decide it. <|return|> and
// <|call|> end generation as EOS ids, so the last message usually ends at flush().
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "larder/runtime/tool_calls.h"

namespace larder::runtime {

class HarmonyParser {
 public:
  struct Out {
    std::string content, reasoning;
    std::vector<ToolCall> calls;  // completed by this piece
    void append(Out o) {  // o released after this
      content += o.content;
      reasoning += o.reasoning;
      for (ToolCall& c : o.calls) calls.push_back(std::move(c));
    }
  };
  Out push(std::string_view text);
  Out flush();  // end of stream: the open message ends (a tool call's body is parsed now)
  size_t total_calls() const { return total_; }

 private:
  enum class Channel { kContent, kReasoning, kCall };
  void begin_message(std::string_view header);
  void emit(Out& o, std::string_view s);
  void end_message(Out& o);
  bool in_header_ = true;
  Channel channel_ = Channel::kContent;
  std::string recipient_;  // the tool a kCall message addresses
  std::string body_;       // a kCall message's body so far
  std::string pending_;
  size_t total_ = 0;
};

}  // namespace larder::runtime
