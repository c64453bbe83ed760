// api_chat.cpp — OpenAI chat completions request parser (messages, tools, response_format, n) and
// POST /apply-template; responses are written by ResponseWriter (api.cpp).
#include "larder/server/api_constraints.h"
#include "larder/server/api_fields.h"
#include "larder/server/response_writer.h"

namespace larder::server {

using namespace fields;

ParsedRequest parse_chat(const ServedModel& sm, const ordered_json& b) {
  ParsedRequest pr = start(b, "chatcmpl-", "/v1/chat/completions");
  refuse_unsupported(b);
  const ordered_json* msgs = get(b, "messages");
  if (!msgs) bad("messages is required", "messages");
  if (!msgs->is_array()) bad("messages must be an array", "messages");
  if (msgs->empty()) bad("messages must not be empty", "messages");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ordered_json& m = (*msgs)[i];
    const std::string where = strfmt("messages[%zu]", i);
    if (!m.is_object()) bad(where + " must be an object", "messages");
    if (!m.contains("role") || !m["role"].is_string()) bad(where + ".role must be a string", "messages");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      bad(strfmt("%s.role '%s' is not one of system, developer, user, assistant, tool", where.c_str(), role.c_str()),
          "messages");
    }
    ordered_json msg = {{"role", role}};
    const bool has_calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
    if (!m.contains("content") && !(role == "assistant" && has_calls)) bad(where + ".content is required", "messages");
    msg["content"] = text_of_content(m.contains("content") ? m["content"] : ordered_json(), where.c_str(),
                                     role == "assistant");
    if (has_calls) {
      if (!m["tool_calls"].is_array()) bad(where + ".tool_calls must be an array", "messages");
      ordered_json calls = ordered_json::array();
      for (const auto& c : m["tool_calls"]) {
        if (!c.is_object()) bad(where + ".tool_calls entries must be objects", "messages");
        ordered_json call = c;
        if (c.contains("function") && c["function"].is_object() && c["function"].contains("arguments") &&
            c["function"]["arguments"].is_string()) {
          // Templates expect the arguments as an object (they tojson it themselves).
          ordered_json parsed;
          if (!parse_json_linear(c["function"]["arguments"].get_ref<const std::string&>(), kMaxJsonDepth, &parsed))
            call["function"]["arguments"] = std::move(parsed);
        }
        calls.push_back(call);
      }
      msg["tool_calls"] = calls;
    }
    for (const char* k : {"name", "tool_call_id", "reasoning_content", "reasoning"}) {
      if (m.contains(k) && !m[k].is_null()) msg[k] = m[k];
    }
    out.push_back(std::move(msg));
  }
  // The conversation rules llama-server enforces (clients written against it rely on the 400).
  if (out.size() >= 2 && out[out.size() - 1]["role"] == "assistant" && out[out.size() - 2]["role"] == "assistant")
    bad("cannot have 2 or more assistant messages at the end of the list", "messages");
  // A final assistant message is continued, as llama-server does by default (prefill_assistant)
  // and vLLM does with continue_final_message; `continue_final_message: false` opts out.
  bool continue_final = false;
  {
    const bool agp = boolean(b, "add_generation_prompt").value_or(true);
    const std::optional<bool> cont = boolean(b, "continue_final_message");
    const bool last_assistant_text = out.back()["role"] == "assistant" && out.back()["content"].is_string() &&
                                     !out.back().contains("tool_calls");
    if (agp && cont.value_or(false) && get(b, "add_generation_prompt"))
      bad("add_generation_prompt and continue_final_message cannot both be true", "continue_final_message");
    continue_final = cont.value_or(last_assistant_text);
    if (continue_final && !last_assistant_text)
      bad("continue_final_message needs the last message to be an assistant message with text content",
          "continue_final_message");
    if (!agp && !continue_final)
      bad("add_generation_prompt: false is not supported on this route (use /apply-template)", "add_generation_prompt");
  }
  ordered_json tools = function_tools(b);
  const constraints::ToolChoice choice = constraints::openai_tool_choice(b, tools);
  if (choice.mode == constraints::ToolChoice::Mode::kNone) tools = ordered_json();
  ordered_json extra = template_kwargs(b);
  if (auto effort = string_field(b, "reasoning_effort"); effort && !extra.contains("enable_thinking"))
    extra["enable_thinking"] = *effort != "none";
  // response_format is enforced by constrained decoding; the model is also told the schema in a
  // system instruction (server-api.md §4.5), so it means to write what the grammar allows.
  const std::string instruction = constraints::apply_response_format(sm, b, pr);
  if (!instruction.empty()) {
    if (!out.empty() && out[0]["role"] == "system") {
      out[0]["content"] = out[0]["content"].get<std::string>() + "\n\n" + instruction;
    } else {
      out.insert(out.begin(), ordered_json{{"role", "system"}, {"content", instruction}});
    }
  }
  constraints::apply_native_fields(sm, b, pr);

  pr.tool_style = tool_style_for(sm, tools);
  pr.tools = tools;
  pr.gen.sampling = sampling(sm, b, true);
  // Thinking-aware default temperature: with no explicit temperature and thinking turned off,
  // cap the default at 0.7 (server-api.md §3).
  if (!get(b, "temperature") && extra.contains("enable_thinking") && extra["enable_thinking"] == false)
    pr.gen.sampling.temperature = std::min(pr.gen.sampling.temperature, 0.7f);
  pr.gen.stops = stops(b, "stop");
  pr.logprobs = boolean(b, "logprobs").value_or(false);
  const auto top = integer(b, "top_logprobs", 0, 20);
  pr.top_logprobs = static_cast<int>(top.value_or(0));
  pr.gen.top_logprobs = pr.logprobs ? pr.top_logprobs : -1;
  if (const ordered_json* so = get(b, "stream_options")) {
    if (!so->is_object()) bad("stream_options must be an object", "stream_options");
    pr.include_usage = boolean(*so, "include_usage").value_or(false);
  }
  std::optional<int64_t> max = integer(b, "max_completion_tokens", 1, INT64_MAX);
  if (!max) max = max_tokens_field(b, "max_tokens");
  if (!max) max = sm.defaults.max_tokens;
  apply_adapters(sm, b, pr.gen);
  check_chat_bytes(sm, out, tools, Surface::kChat);
  encode_with_template(sm, out, tools, extra, pr, continue_final);
  constraints::apply_tool_choice(sm, tools, choice, pr, "tool_choice");  // knows the rendered prompt
  fit_context(sm, pr, max, Surface::kChat, "messages");
  add_choices(pr, {}, static_cast<int>(integer(b, "n", 1, 64).value_or(1)));
  return pr;
}

std::string render_chat_prompt(const ServedModel& sm, const ordered_json& b) {
  if (!sm.m->chat_template) bad("this model has no chat template", "messages");
  runtime::ChatEncodeOptions o;
  o.tools = function_tools(b);
  o.extra = template_kwargs(b);
  if (auto agp = boolean(b, "add_generation_prompt")) o.add_generation_prompt = *agp;
  check_chat_bytes(sm, b["messages"], o.tools, Surface::kChat);
  std::string rendered;
  auto ids = runtime::encode_chat_json(*sm.m, b["messages"], o, &rendered);
  if (!ids.is_ok()) bad(ids.status().message(), "messages");
  return rendered;
}

// ---- response ------------------------------------------------------------------------------

namespace {

// chat.completion / chat.completion.chunk: a role chunk, content and reasoning_content deltas,
// tool calls as a header delta (id, name) then the arguments, matched by index.
class ChatWriter final : public OpenAiWriter {
 public:
  ChatWriter(const ServedModel& sm, const ParsedRequest& pr)
      : OpenAiWriter(sm, pr, /*text_pipeline=*/true, "chat.completion", "chat.completion.chunk") {}

  ordered_json body() const override {
    ordered_json msg = {{"role", "assistant"}, {"content", text_}, {"refusal", nullptr}};
    if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
    if (!calls_.empty()) {
      ordered_json calls = ordered_json::array();
      for (size_t i = 0; i < calls_.size(); ++i) {
        calls.push_back({{"id", call_ids_[i]}, {"type", "function"},
                         {"function", {{"name", calls_[i].name}, {"arguments", calls_[i].arguments.dump()}}}});
      }
      msg["tool_calls"] = calls;
      if (text_.empty()) msg["content"] = nullptr;  // OpenAI: null content when there are only calls
    }
    ordered_json choice = {{"index", index_}, {"message", msg},
                           {"logprobs", pr_.logprobs ? logprobs_json(tokens_) : ordered_json()},
                           {"finish_reason", finish_reason()}};
    return body_with(std::move(choice));
  }

 private:
  std::string open_frames() override {
    return sse(chunk({{"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
  }

  std::string delta_frames(const Pieces& parts, const std::vector<TokenInfo>& tokens) override {
    const bool has_text = !parts.content.empty() || !parts.reasoning.empty();
    if (!has_text && (tokens.empty() || !pr_.logprobs)) return {};
    ordered_json delta = ordered_json::object();
    if (!parts.reasoning.empty()) delta["reasoning_content"] = parts.reasoning;
    if (!parts.content.empty()) delta["content"] = parts.content;
    return sse(chunk({{"delta", delta}, {"logprobs", pr_.logprobs ? logprobs_json(tokens) : ordered_json()},
                      {"finish_reason", nullptr}}));
  }

  std::string tool_call_frames(size_t i) override {
    const int idx = static_cast<int>(i);
    ordered_json head = {{"tool_calls", ordered_json::array({{{"index", idx}, {"id", call_ids_[i]}, {"type", "function"},
                                                               {"function", {{"name", calls_[i].name}, {"arguments", ""}}}}})}};
    ordered_json args = {{"tool_calls", ordered_json::array({{{"index", idx},
                                                               {"function", {{"arguments", calls_[i].arguments.dump()}}}}})}};
    return sse(chunk({{"delta", head}, {"logprobs", nullptr}, {"finish_reason", nullptr}})) +
           sse(chunk({{"delta", args}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
  }

  ordered_json final_choice() const override { return {{"delta", ordered_json::object()}}; }

  // Token strings are the exact pieces the output text is made of (leading spaces kept), so they
  // join back into it; `bytes` carries the raw bytes, which matter for a token that holds only
  // part of a UTF-8 character (its `token` string shows U+FFFD when the JSON is written).
  ordered_json logprobs_json(const std::vector<TokenInfo>& toks) const {
    const tokenizer::Tokenizer& tk = *sm_.m->tokenizer;
    ordered_json content = ordered_json::array();
    for (const TokenInfo& t : toks) {
      const std::string s = tk.token_bytes(t.id);
      ordered_json bytes;
      utf8_bytes_json(s, &bytes);
      ordered_json top = ordered_json::array();
      for (const auto& [id, lp] : t.lp.top) {
        const std::string ts = tk.token_bytes(id);
        ordered_json tb;
        utf8_bytes_json(ts, &tb);
        top.push_back({{"token", ts}, {"logprob", lp}, {"bytes", tb}, {"id", id}});
      }
      content.push_back({{"token", s}, {"logprob", t.lp.logprob}, {"bytes", bytes}, {"id", t.id}, {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
};

}  // namespace

std::unique_ptr<ResponseWriter> make_chat_writer(const ServedModel& sm, const ParsedRequest& pr) {
  return std::make_unique<ChatWriter>(sm, pr);
}

}  // namespace larder::server
