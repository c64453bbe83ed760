// tool_calls.h — finds tool calls in a model's streamed answer text and takes them out of it
// (server-api.md §4.3, §5.3 "tool-call parser"): content before the markup streams normally,
// only the markup is withheld; markup that does not parse falls back to plain content, so a
// model that merely mentions a tag never loses text.
//
// Styles, by what the model family emits:
//   kTagged    <tool_call>{"name": ..., "arguments": {...}}</tool_call>, repeatable
//              (Qwen2.5/Qwen3, Hermes and most chat templates that declare <tool_call> tokens)
//   kBareJson  the whole answer is {"name": ..., "parameters"|"arguments": {...}} (or a list of
//              them), optionally after <|python_tag|> (Llama 3.1+ JSON tool calling)
//   kTaggedXml <tool_call><function=NAME><parameter=ARG>value</parameter>...</function></tool_call>
//              (Qwen3-Coder, Qwen3.5): each value is raw text; a parameter whose schema says
//              string stays text, an enum/const one is its trimmed text, any other is read as
//              JSON when it parses (42, true, {...}).
//              Either tagged style accepts either body.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace larder::runtime {

struct ToolCall {
  std::string name;
  nlohmann::ordered_json arguments;  // an object (a string that is not JSON stays a string)
};

enum class ToolCallStyle { kNone, kTagged, kBareJson, kTaggedXml };

class ToolCallParser {
 public:
  // tools: the request's tools (OpenAI shape), for the parameter types of XML calls; may be null.
  explicit ToolCallParser(ToolCallStyle style, nlohmann::ordered_json tools = nullptr)
      : style_(style), tools_(std::move(tools)) {}
  // Text safe to release as content now; completed calls are collected (take_calls()).
  std::string push(std::string_view text);
  // End of generation: what is held is parsed if it can be, else released as content.
  std::string flush();
  // Calls completed since the last take, in order.
  std::vector<ToolCall> take_calls();
  size_t total_calls() const { return total_; }

 private:
  bool parse_call(const std::string& body, std::vector<ToolCall>* out) const;
  bool parse_xml_call(std::string_view body, std::vector<ToolCall>* out) const;
  // The request's schema of a function's parameter (null: not declared).
  const nlohmann::ordered_json* param_schema(const std::string& fn, const std::string& param) const;
  ToolCallStyle style_;
  nlohmann::ordered_json tools_;
  std::string pending_;
  bool inside_ = false;     // kTagged: between the tags
  bool decided_ = false;    // kBareJson: whether the answer starts like JSON is known
  bool json_mode_ = false;  // kBareJson: holding everything for a final parse
  std::vector<ToolCall> ready_;
  size_t total_ = 0;
};

}  // namespace larder::runtime
