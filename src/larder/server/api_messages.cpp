// api_messages.cpp — Anthropic messages request parser (system, content blocks, tool_use /
// tool_result, tools, thinking), shared by POST /v1/messages and /v1/messages/count_tokens.
#include <cctype>

#include "larder/server/api_constraints.h"
#include "larder/server/api_fields.h"
#include "larder/server/response_writer.h"

namespace larder::server {

using namespace fields;

ParsedRequest parse_messages(const ServedModel& sm, const ordered_json& b, bool count_only) {
  ParsedRequest pr = start(b, "msg_", "/v1/messages");
  ordered_json out = ordered_json::array();
  if (const ordered_json* sys = get(b, "system")) {
    std::string text;
    if (sys->is_string()) {
      text = sys->get<std::string>();
    } else if (sys->is_array()) {
      for (const auto& blk : *sys) {
        if (!blk.is_object() || str_in(blk, "type", "system[]", "system") != "text" || !blk.contains("text") ||
            !blk["text"].is_string())
          bad("system must be a string or an array of text blocks", "system");
        if (!text.empty()) text += "\n";
        text += blk["text"].get<std::string>();
      }
    } else {
      bad("system must be a string or an array of text blocks", "system");
    }
    if (!text.empty()) out.push_back({{"role", "system"}, {"content", text}});
  }
  const ordered_json* msgs = get(b, "messages");
  if (!msgs) bad("messages: field required", "messages");
  if (!msgs->is_array()) bad("messages must be an array", "messages");
  if (msgs->empty()) bad("messages must not be empty", "messages");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ordered_json& m = (*msgs)[i];
    const std::string where = strfmt("messages.%zu", i);
    if (!m.is_object()) bad(where + " must be an object", "messages");
    if (!m.contains("role") || !m["role"].is_string()) bad(where + ".role must be a string", "messages");
    const std::string role = m["role"].get<std::string>();
    if (role != "user" && role != "assistant") bad(strfmt("%s.role '%s' must be user or assistant", where.c_str(), role.c_str()), "messages");
    if (!m.contains("content")) bad(where + ".content: field required", "messages");
    const ordered_json& c = m["content"];
    if (c.is_string()) {
      out.push_back({{"role", role}, {"content", c.get<std::string>()}});
      continue;
    }
    if (!c.is_array()) bad(where + ".content must be a string or an array of content blocks", "messages");
    std::string text;
    ordered_json calls = ordered_json::array();
    for (const auto& blk : c) {
      if (!blk.is_object() || !blk.contains("type") || !blk["type"].is_string())
        bad(where + ".content blocks must be objects with a type", "messages");
      const std::string type = blk["type"].get<std::string>();
      if (type == "text") {
        if (!blk.contains("text") || !blk["text"].is_string()) bad(where + " text block needs a string text", "messages");
        text += blk["text"].get<std::string>();
      } else if (type == "image" || type == "document") {
        bad("this model does not accept images (text-only model)", "messages");
      } else if (type == "thinking" || type == "redacted_thinking") {
        // dropped on re-ingest
      } else if (type == "tool_use") {
        const ordered_json input = blk.contains("input") && !blk["input"].is_null() ? blk["input"] : ordered_json::object();
        if (!input.is_object()) bad(where + " tool_use.input must be an object", "messages");
        calls.push_back({{"id", str_in(blk, "id", where + ".tool_use", "messages")}, {"type", "function"},
                         {"function", {{"name", str_in(blk, "name", where + ".tool_use", "messages")}, {"arguments", input}}}});
      } else if (type == "tool_result") {
        std::string rt;
        if (blk.contains("content")) {
          const ordered_json& rc = blk["content"];
          rt = rc.is_string() ? rc.get<std::string>() : text_of_content(rc, where.c_str(), true);
        }
        out.push_back({{"role", "tool"}, {"tool_call_id", str_in(blk, "tool_use_id", where + ".tool_result", "messages")},
                       {"content", rt}});
      } else {
        bad(strfmt("%s has an unknown content block type '%s'", where.c_str(), type.c_str()), "messages");
      }
    }
    if (!text.empty() || !calls.empty()) {
      ordered_json msg = {{"role", role}, {"content", text}};
      if (!calls.empty()) msg["tool_calls"] = calls;
      out.push_back(msg);
    }
  }
  ordered_json tools;
  if (const ordered_json* t = get(b, "tools")) {
    if (!t->is_array()) bad("tools must be an array", "tools");
    tools = ordered_json::array();
    for (size_t i = 0; i < t->size(); ++i) {
      const ordered_json& tool = (*t)[i];
      if (!tool.is_object()) bad(strfmt("tools.%zu must be an object", i), "tools");
      if (!tool.contains("name")) continue;  // server tools (web search, ...) dropped
      if (!tool["name"].is_string()) bad("tools[].name must be a string", "tools");
      const ordered_json schema = tool.contains("input_schema") && !tool["input_schema"].is_null() ? tool["input_schema"]
                                                                                                : ordered_json::object();
      if (!schema.is_object()) bad("tools[].input_schema must be an object", "tools");
      tools.push_back({{"type", "function"},
                       {"function", {{"name", tool["name"]}, {"description", str_in(tool, "description", "tools[]", "tools")},
                                     {"parameters", schema}}}});
    }
  }
  const constraints::ToolChoice choice = constraints::anthropic_tool_choice(b, tools);
  if (choice.mode == constraints::ToolChoice::Mode::kNone) tools = ordered_json();
  ordered_json extra = ordered_json::object();
  if (const ordered_json* th = get(b, "thinking")) {
    if (!th->is_object()) bad("thinking must be an object", "thinking");
    const std::string type = str_in(*th, "type", "thinking", "thinking");
    extra["enable_thinking"] = type == "enabled";
    pr.thinking_requested = type == "enabled";
  }

  pr.tool_style = tool_style_for(sm, tools);
  pr.tools = tools;
  constraints::apply_native_fields(sm, b, pr);
  runtime::SamplingParams sp = sampling(sm, b, false);
  pr.gen.sampling = sp;
  pr.gen.stops = stops(b, "stop_sequences");
  std::optional<int64_t> max = integer(b, "max_tokens", 1, INT64_MAX);
  if (!max) max = sm.defaults.max_tokens;
  apply_adapters(sm, b, pr.gen);
  // Anthropic's prefill: a final assistant turn is the start of the answer, continued from its
  // last character (the API refuses trailing whitespace there, which would change tokenization).
  const bool prefill = !out.empty() && out.back()["role"] == "assistant" && out.back()["content"].is_string() &&
                       !out.back().contains("tool_calls");
  if (prefill) {
    const std::string& t = out.back()["content"].get_ref<const std::string&>();
    if (!t.empty() && std::isspace(static_cast<unsigned char>(t.back())))
      bad("final assistant content cannot end with trailing whitespace", "messages");
    if (pr.thinking_requested) bad("a final assistant message (prefill) cannot be combined with thinking", "messages");
  }
  check_chat_bytes(sm, out, tools, Surface::kMessages);
  encode_with_template(sm, out, tools, extra, pr, prefill);
  constraints::apply_tool_choice(sm, tools, choice, pr, "tool_choice");  // knows the rendered prompt
  if (!count_only) fit_context(sm, pr, max, Surface::kMessages, "messages");
  return pr;
}

// ---- response ------------------------------------------------------------------------------

namespace {

// Anthropic message: message_start, content blocks opened lazily in the order the model produces
// them (thinking, text, tool_use), message_delta with the stop reason, message_stop.
class MessagesWriter final : public ResponseWriter {
 public:
  MessagesWriter(const ServedModel& sm, const ParsedRequest& pr)
      : ResponseWriter(sm, pr, /*text_pipeline=*/true, "toolu_") {}

  ordered_json body() const override {
    ordered_json content = ordered_json::array();
    if (!reasoning_.empty()) content.push_back({{"type", "thinking"}, {"thinking", reasoning_}, {"signature", ""}});
    if (!text_.empty() || calls_.empty()) content.push_back({{"type", "text"}, {"text", text_}});
    for (size_t i = 0; i < calls_.size(); ++i)
      content.push_back({{"type", "tool_use"}, {"id", call_ids_[i]}, {"name", calls_[i].name}, {"input", calls_[i].arguments}});
    return {{"id", pr_.response_id}, {"type", "message"}, {"role", "assistant"}, {"model", sm_.id},
            {"content", content}, {"stop_reason", stop_reason()}, {"stop_sequence", stop_sequence()},
            {"usage", usage_json()}};
  }

 private:
  bool keeps_reasoning() const override { return pr_.thinking_requested; }

  ordered_json usage_json() const {
    return {{"input_tokens", outcome_.prompt_tokens - outcome_.cached_tokens},
            {"output_tokens", outcome_.completion_tokens},
            {"cache_read_input_tokens", outcome_.cached_tokens},
            {"cache_creation_input_tokens", 0}};
  }

  std::string stop_reason() const {
    if (!calls_.empty() && outcome_.finish != Finish::kLength) return "tool_use";
    if (outcome_.finish == Finish::kLength) return "max_tokens";
    return outcome_.finish == Finish::kStop && !outcome_.matched_stop.empty() ? "stop_sequence" : "end_turn";
  }

  ordered_json stop_sequence() const {
    return outcome_.matched_stop.empty() ? ordered_json() : ordered_json(outcome_.matched_stop);
  }

  std::string open_frames() override {
    ordered_json usage = usage_json();
    usage["output_tokens"] = 0;
    ordered_json msg = {{"id", pr_.response_id}, {"type", "message"}, {"role", "assistant"}, {"model", sm_.id},
                        {"content", ordered_json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                        {"usage", usage}};
    return sse_event("message_start", {{"type", "message_start"}, {"message", msg}});
  }

  // Frames that make `type` the open block; switching type closes the open one.
  std::string open_block(const char* type) {
    if (block_type_ == type && block_type_ != "tool_use") return {};
    std::string out = close_block();
    ++block_index_;
    block_type_ = type;
    ordered_json block = block_type_ == "thinking" ? ordered_json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                                   : ordered_json{{"type", "text"}, {"text", ""}};
    return out + sse_event("content_block_start",
                           {{"type", "content_block_start"}, {"index", block_index_}, {"content_block", block}});
  }

  std::string close_block() const {
    if (block_index_ < 0) return {};
    return sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", block_index_}});
  }

  std::string block_delta(const ordered_json& delta) const {
    return sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", block_index_}, {"delta", delta}});
  }

  std::string delta_frames(const Pieces& parts, const std::vector<TokenInfo>&) override {
    std::string out;
    if (!parts.reasoning.empty())
      out += open_block("thinking") + block_delta({{"type", "thinking_delta"}, {"thinking", parts.reasoning}});
    if (!parts.content.empty()) out += open_block("text") + block_delta({{"type", "text_delta"}, {"text", parts.content}});
    return out;
  }

  // A tool_use block with its whole input as one input_json_delta.
  std::string tool_call_frames(size_t i) override {
    std::string out = close_block();
    ++block_index_;
    block_type_ = "tool_use";
    out += sse_event("content_block_start",
                     {{"type", "content_block_start"}, {"index", block_index_},
                      {"content_block", {{"type", "tool_use"}, {"id", call_ids_[i]}, {"name", calls_[i].name},
                                         {"input", ordered_json::object()}}}});
    return out + block_delta({{"type", "input_json_delta"}, {"partial_json", calls_[i].arguments.dump()}});
  }

  std::string finish_frames() override {
    std::string out;
    if (block_index_ < 0) out += open_block("text");  // a message always has a content block
    out += close_block();
    out += sse_event("message_delta", {{"type", "message_delta"},
                                       {"delta", {{"stop_reason", stop_reason()}, {"stop_sequence", stop_sequence()}}},
                                       {"usage", {{"output_tokens", outcome_.completion_tokens}}}});
    return out + sse_event("message_stop", {{"type", "message_stop"}});
  }

  std::string error_frames(const std::string& message) override {
    return sse_event("error", {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", message}}}});
  }

  int block_index_ = -1;
  std::string block_type_;
};

}  // namespace

std::unique_ptr<ResponseWriter> make_messages_writer(const ServedModel& sm, const ParsedRequest& pr) {
  return std::make_unique<MessagesWriter>(sm, pr);
}

}  // namespace larder::server
