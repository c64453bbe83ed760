// api.cpp — shared response side of the API surfaces: error bodies, ids, and ResponseWriter
// (events → OpenAI chat/completions and Anthropic bodies and stream frames). The request
// parsers live in api_chat.cpp, api_completions.cpp and api_messages.cpp; llama-server's
// native shapes in api_native.cpp.
#include "larder/server/api.h"

#include "larder/server/api_fields.h"

namespace larder::server {

using namespace fields;


std::string random_id(const std::string& prefix) {
  static const char kAlphabet[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  thread_local std::mt19937_64 rng(random_seed());
  std::string s = prefix;
  for (int i = 0; i < 24; ++i) s += kAlphabet[rng() % 62];
  return s;
}

const char* openai_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 500: return "server_error";
    case 503: return "unavailable_error";
    default: return "invalid_request_error";
  }
}

ordered_json openai_error_body(const ApiError& e) {
  ordered_json err = {{"message", e.message}, {"type", openai_error_type(e.status)}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return {{"error", err}};
}

ordered_json anthropic_error_body(const ApiError& e) {
  const char* type = "invalid_request_error";
  switch (e.status) {
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 500: type = "api_error"; break;
    case 503: case 529: type = "overloaded_error"; break;
    default: break;
  }
  return {{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}};
}

int64_t longest_token_bytes(const runtime::LoadedModel& m) {
  const int64_t V = m.model->info().vocab;
  int64_t longest = 0;
  for (int64_t id = 0; id < V; ++id)
    longest = std::max<int64_t>(longest, static_cast<int64_t>(m.tokenizer->decode({static_cast<int32_t>(id)}, false).size()));
  return longest;
}

// ---- responses --------------------------------------------------------------------------------

ResponseWriter::ResponseWriter(const ServedModel& sm, const ParsedRequest& pr, Surface surface)
    : sm_(sm), pr_(pr), surface_(surface) {
  if (pr.split_reasoning && surface != Surface::kCompletions) splitter_.emplace(pr.reasoning_start_inside);
  if (pr.tool_style != runtime::ToolCallStyle::kNone && surface != Surface::kCompletions) tool_parser_.emplace(pr.tool_style);
}

ResponseWriter::Pieces ResponseWriter::process(const std::string& text, bool final) {
  Pieces o;
  if (splitter_) {
    runtime::ReasoningSplitter::Out r = splitter_->push(text);
    if (final) {
      auto f = splitter_->flush();
      r.content += f.content;
      r.reasoning += f.reasoning;
    }
    o.content = std::move(r.content);
    // Anthropic returns reasoning only when the request enabled thinking (server-api.md §8.2).
    if (surface_ != Surface::kMessages || pr_.thinking_requested) o.reasoning = std::move(r.reasoning);
  } else {
    o.content = text;
  }
  if (tool_parser_) {
    std::string c = tool_parser_->push(o.content);
    if (final) c += tool_parser_->flush();
    o.content = std::move(c);
    o.calls = tool_parser_->take_calls();
    for (const auto& call : o.calls) {
      calls_.push_back(call);
      call_ids_.push_back(random_id(surface_ == Surface::kMessages ? "toolu_" : "call_"));
    }
  }
  return o;
}

ordered_json ResponseWriter::tool_calls_json() const {
  ordered_json a = ordered_json::array();
  for (size_t i = 0; i < calls_.size(); ++i) {
    a.push_back({{"id", call_ids_[i]}, {"type", "function"},
                 {"function", {{"name", calls_[i].name}, {"arguments", calls_[i].arguments.dump()}}}});
  }
  return a;
}

std::string ResponseWriter::finish_reason() const {
  if (!calls_.empty() && outcome_.finish != Finish::kLength) return surface_ == Surface::kMessages ? "tool_use" : "tool_calls";
  switch (outcome_.finish) {
    case Finish::kLength: return surface_ == Surface::kMessages ? "max_tokens" : "length";
    case Finish::kStop:
      if (surface_ == Surface::kMessages) return outcome_.matched_stop.empty() ? "end_turn" : "stop_sequence";
      return "stop";
    default: return surface_ == Surface::kMessages ? "end_turn" : "stop";
  }
}

ordered_json ResponseWriter::usage_json() const {
  const Outcome& o = outcome_;
  ordered_json ext = {{"cache", {{"tier", o.cache_tier}, {"reason", o.cache_reason}}},
                      {"timings",
                       {{"queue_ms", o.queue_ms}, {"prefill_ms", o.prefill_ms}, {"ttft_ms", o.ttft_ms},
                        {"decode_ms", o.decode_ms},
                        {"prefill_tps", o.prefill_ms > 0 ? (o.prompt_tokens - o.cached_tokens) / (o.prefill_ms / 1e3) : 0.0},
                        {"decode_tps", o.decode_ms > 0 && o.completion_tokens > 1
                                           ? (o.completion_tokens - 1) / (o.decode_ms / 1e3) : 0.0}}}};
  if (surface_ == Surface::kMessages) {
    return {{"input_tokens", o.prompt_tokens - o.cached_tokens},
            {"output_tokens", o.completion_tokens},
            {"cache_read_input_tokens", o.cached_tokens},
            {"cache_creation_input_tokens", 0}};
  }
  return {{"prompt_tokens", o.prompt_tokens},
          {"completion_tokens", o.completion_tokens},
          {"total_tokens", o.prompt_tokens + o.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", o.cached_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", 0}}},
          {"larder", ext}};
}

namespace {
int64_t utf8_chars(const std::string& s) {  // characters started in s (continuation bytes skipped)
  int64_t n = 0;
  for (unsigned char c : s) n += (c >> 6) != 2;
  return n;
}
}  // namespace

// Token strings are the exact pieces the output text is made of (leading spaces kept), so they
// join back into it; `bytes` carries the raw bytes, which matter for a token that holds only
// part of a UTF-8 character (its `token` string then shows U+FFFD). text_offset counts
// characters from the start of the completion.
ordered_json ResponseWriter::logprobs_json(const std::vector<TokenInfo>& toks) const {
  const tokenizer::Tokenizer& tk = *sm_.m->tokenizer;
  auto piece = [&](int32_t id) { return tk.token_bytes(id); };
  // Invalid UTF-8 is replaced by U+FFFD when the JSON is written (error_handler_t::replace).
  auto shown = [](const std::string& p) { return p; };
  if (surface_ == Surface::kCompletions) {  // legacy shape
    ordered_json tokens = ordered_json::array(), lps = ordered_json::array(), tops = ordered_json::array(),
                 offs = ordered_json::array();
    for (const TokenInfo& t : toks) {
      const std::string p = piece(t.id);
      tokens.push_back(shown(p));
      lps.push_back(t.lp.logprob);
      ordered_json top = ordered_json::object();
      for (const auto& [id, lp] : t.lp.top) top[shown(piece(id))] = lp;
      tops.push_back(top);
      offs.push_back(lp_offset_);
      lp_offset_ += utf8_chars(p);
    }
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
  }
  ordered_json content = ordered_json::array();
  for (const TokenInfo& t : toks) {
    const std::string s = piece(t.id);
    ordered_json bytes;
    utf8_bytes_json(s, &bytes);
    ordered_json top = ordered_json::array();
    for (const auto& [id, lp] : t.lp.top) {
      const std::string ts = piece(id);
      ordered_json tb;
      utf8_bytes_json(ts, &tb);
      top.push_back({{"token", shown(ts)}, {"logprob", lp}, {"bytes", tb}, {"id", id}});
    }
    content.push_back({{"token", shown(s)}, {"logprob", t.lp.logprob}, {"bytes", bytes}, {"id", t.id}, {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

ordered_json ResponseWriter::chunk(ordered_json choice) const {
  ordered_json c = {{"id", pr_.response_id},
                    {"object", surface_ == Surface::kChat ? "chat.completion.chunk" : "text_completion"},
                    {"created", pr_.created},
                    {"model", sm_.id},
                    {"system_fingerprint", sm_.fingerprint}};
  choice["index"] = index_;
  c["choices"] = ordered_json::array({choice});
  if (pr_.include_usage) c["usage"] = nullptr;
  return c;
}

namespace {
std::string sse(const ordered_json& j) { return "data: " + j.dump(-1, ' ', false, ordered_json::error_handler_t::replace) + "\n\n"; }
std::string sse_event(const char* type, const ordered_json& j) {
  return std::string("event: ") + type + "\n" + sse(j);
}
}  // namespace

std::string ResponseWriter::stream_open() {
  if (opened_) return {};
  opened_ = true;
  if (surface_ == Surface::kChat) {
    ordered_json choice = {{"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    return sse(chunk(choice));
  }
  if (surface_ == Surface::kMessages) {
    ordered_json usage = {{"input_tokens", outcome_.prompt_tokens - outcome_.cached_tokens},
                          {"output_tokens", 0},
                          {"cache_read_input_tokens", outcome_.cached_tokens},
                          {"cache_creation_input_tokens", 0}};
    ordered_json msg = {{"id", pr_.response_id}, {"type", "message"}, {"role", "assistant"}, {"model", sm_.id},
                        {"content", ordered_json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                        {"usage", usage}};
    return sse_event("message_start", {{"type", "message_start"}, {"message", msg}});
  }
  return {};  // completions: no opening chunk
}

// Content blocks open lazily, in the order the model produces them (a thinking block, then the
// text block); switching type closes the open one.
std::string ResponseWriter::anthropic_block(const char* type) {
  if (block_type_ == type && block_type_ != "tool_use") return {};
  std::string out;
  if (block_index_ >= 0) out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", block_index_}});
  ++block_index_;
  block_type_ = type;
  ordered_json block = block_type_ == "thinking" ? ordered_json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                                 : ordered_json{{"type", "text"}, {"text", ""}};
  return out + sse_event("content_block_start", {{"type", "content_block_start"}, {"index", block_index_}, {"content_block", block}});
}

std::string ResponseWriter::stream_frames(const Event& e) {
  std::string out;
  if (e.admitted) {
    outcome_.prompt_tokens = e.outcome.prompt_tokens;
    outcome_.cached_tokens = e.outcome.cached_tokens;
    return stream_open();
  }
  out += stream_open();
  const size_t calls_before = calls_.size();
  const Pieces parts = surface_ == Surface::kCompletions ? Pieces{e.text, {}, {}} : process(e.text, e.done);
  const bool has_text = !parts.content.empty() || !parts.reasoning.empty();
  if (has_text || (!e.tokens.empty() && pr_.logprobs && surface_ != Surface::kMessages)) {
    if (surface_ == Surface::kChat) {
      ordered_json delta = ordered_json::object();
      if (!parts.reasoning.empty()) delta["reasoning_content"] = parts.reasoning;
      if (!parts.content.empty()) delta["content"] = parts.content;
      ordered_json choice = {{"delta", delta}, {"logprobs", pr_.logprobs ? logprobs_json(e.tokens) : ordered_json()},
                             {"finish_reason", nullptr}};
      out += sse(chunk(choice));
    } else if (surface_ == Surface::kCompletions) {
      ordered_json choice = {{"text", parts.content}, {"logprobs", pr_.logprobs ? logprobs_json(e.tokens) : ordered_json()},
                             {"finish_reason", nullptr}};
      out += sse(chunk(choice));
    } else {
      if (!parts.reasoning.empty()) {
        out += anthropic_block("thinking");
        out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", block_index_},
                                                 {"delta", {{"type", "thinking_delta"}, {"thinking", parts.reasoning}}}});
      }
      if (!parts.content.empty()) {
        out += anthropic_block("text");
        out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", block_index_},
                                                 {"delta", {{"type", "text_delta"}, {"text", parts.content}}}});
      }
    }
  }
  // Completed tool calls: OpenAI sends a header delta (id, name) then the arguments, matched by
  // index; Anthropic a tool_use block with its input as one input_json_delta.
  for (size_t i = calls_before; i < calls_.size(); ++i) {
    const std::string args = calls_[i].arguments.dump();
    if (surface_ == Surface::kChat) {
      const int idx = static_cast<int>(i);
      ordered_json head = {{"tool_calls", ordered_json::array({{{"index", idx}, {"id", call_ids_[i]}, {"type", "function"},
                                                                 {"function", {{"name", calls_[i].name}, {"arguments", ""}}}}})}};
      out += sse(chunk({{"delta", head}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
      ordered_json argd = {{"tool_calls", ordered_json::array({{{"index", idx}, {"function", {{"arguments", args}}}}})}};
      out += sse(chunk({{"delta", argd}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
    } else if (surface_ == Surface::kMessages) {
      if (block_index_ >= 0) out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", block_index_}});
      ++block_index_;
      block_type_ = "tool_use";
      out += sse_event("content_block_start",
                       {{"type", "content_block_start"}, {"index", block_index_},
                        {"content_block", {{"type", "tool_use"}, {"id", call_ids_[i]}, {"name", calls_[i].name},
                                           {"input", ordered_json::object()}}}});
      out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", block_index_},
                                               {"delta", {{"type", "input_json_delta"}, {"partial_json", args}}}});
    }
  }
  if (!e.done) return out;
  outcome_ = e.outcome;
  if (outcome_.finish == Finish::kError || outcome_.finish == Finish::kCancelled) {
    const std::string msg = outcome_.error.empty() ? "generation was cancelled" : outcome_.error;
    if (surface_ == Surface::kMessages) {
      return out + sse_event("error", {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", msg}}}});
    }
    return out + sse({{"error", {{"message", msg}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}}) +
           (part_of_many_ ? "" : "data: [DONE]\n\n");
  }
  if (surface_ == Surface::kMessages) {
    if (block_index_ < 0) out += anthropic_block("text");  // a message always has a content block
    out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", block_index_}});
    ordered_json stop_seq = outcome_.matched_stop.empty() ? ordered_json() : ordered_json(outcome_.matched_stop);
    out += sse_event("message_delta", {{"type", "message_delta"},
                                       {"delta", {{"stop_reason", finish_reason()}, {"stop_sequence", stop_seq}}},
                                       {"usage", {{"output_tokens", outcome_.completion_tokens}}}});
    out += sse_event("message_stop", {{"type", "message_stop"}});
    return out;
  }
  ordered_json choice = surface_ == Surface::kChat
                            ? ordered_json{{"delta", ordered_json::object()}, {"logprobs", nullptr}, {"finish_reason", finish_reason()}}
                            : ordered_json{{"text", ""}, {"logprobs", nullptr}, {"finish_reason", finish_reason()}};
  ordered_json last = chunk(choice);
  if (part_of_many_) return out + sse(last);
  if (pr_.include_usage) {
    out += sse(last);
    ordered_json u = {{"id", pr_.response_id}, {"object", last["object"]}, {"created", pr_.created},
                      {"model", sm_.id}, {"system_fingerprint", sm_.fingerprint},
                      {"choices", ordered_json::array()}, {"usage", usage_json()}};
    out += sse(u);
  } else {
    last["usage"] = usage_json();  // mlx-bun behaviour: usage on the final chunk
    out += sse(last);
  }
  return out + "data: [DONE]\n\n";
}

std::string ResponseWriter::usage_frame(const Outcome& total) {
  outcome_ = total;
  ordered_json u = {{"id", pr_.response_id},
                    {"object", surface_ == Surface::kChat ? "chat.completion.chunk" : "text_completion"},
                    {"created", pr_.created}, {"model", sm_.id}, {"system_fingerprint", sm_.fingerprint},
                    {"choices", ordered_json::array()}, {"usage", usage_json()}};
  return sse(u);
}

void ResponseWriter::add(const Event& e) {
  if (e.admitted) {
    outcome_.prompt_tokens = e.outcome.prompt_tokens;
    outcome_.cached_tokens = e.outcome.cached_tokens;
    return;
  }
  if (surface_ == Surface::kCompletions) {
    text_ += e.text;
  } else {
    const Pieces parts = process(e.text, e.done);
    text_ += parts.content;
    reasoning_ += parts.reasoning;
  }
  tokens_.insert(tokens_.end(), e.tokens.begin(), e.tokens.end());
  if (e.done) outcome_ = e.outcome;
}

ordered_json ResponseWriter::body() const {
  if (surface_ == Surface::kMessages) {
    ordered_json stop_seq = outcome_.matched_stop.empty() ? ordered_json() : ordered_json(outcome_.matched_stop);
    ordered_json content = ordered_json::array();
    if (!reasoning_.empty()) content.push_back({{"type", "thinking"}, {"thinking", reasoning_}, {"signature", ""}});
    if (!text_.empty() || calls_.empty()) content.push_back({{"type", "text"}, {"text", text_}});
    for (size_t i = 0; i < calls_.size(); ++i)
      content.push_back({{"type", "tool_use"}, {"id", call_ids_[i]}, {"name", calls_[i].name}, {"input", calls_[i].arguments}});
    return {{"id", pr_.response_id}, {"type", "message"}, {"role", "assistant"}, {"model", sm_.id},
            {"content", content}, {"stop_reason", finish_reason()}, {"stop_sequence", stop_seq}, {"usage", usage_json()}};
  }
  ordered_json lp = pr_.logprobs ? logprobs_json(tokens_) : ordered_json();
  ordered_json choice;
  if (surface_ == Surface::kChat) {
    ordered_json msg = {{"role", "assistant"}, {"content", text_}, {"refusal", nullptr}};
    if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
    if (!calls_.empty()) {
      msg["tool_calls"] = tool_calls_json();
      if (text_.empty()) msg["content"] = nullptr;  // OpenAI: null content when there are only calls
    }
    choice = {{"index", index_}, {"message", msg}, {"logprobs", lp}, {"finish_reason", finish_reason()}};
  } else {
    choice = {{"index", index_}, {"text", text_}, {"logprobs", lp}, {"finish_reason", finish_reason()}};
  }
  return {{"id", pr_.response_id},
          {"object", surface_ == Surface::kChat ? "chat.completion" : "text_completion"},
          {"created", pr_.created},
          {"model", sm_.id},
          {"system_fingerprint", sm_.fingerprint},
          {"choices", ordered_json::array({choice})},
          {"usage", usage_json()}};
}

}  // namespace larder::server
