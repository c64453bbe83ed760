// api.h — request handling: API bodies (OpenAI chat/completions, Anthropic messages) to
// GenRequests, engine events to response bodies and stream events. No sockets here: the
// transport (http_server.cpp) moves bytes; this file decides what they say.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "larder/runtime/loaded_model.h"
#include "larder/runtime/reasoning.h"
#include "larder/runtime/tool_calls.h"
#include "larder/server/request.h"

namespace larder::server {

using ordered_json = nlohmann::ordered_json;

enum class Surface { kChat, kCompletions, kMessages };

// A client mistake (4xx) or a server condition, in the surface's error shape.
struct ApiError {
  ApiError(int s, std::string m, std::string p = {}, std::string c = {})
      : status(s), message(std::move(m)), param(std::move(p)), code(std::move(c)) {}
  int status = 400;
  std::string message;
  std::string param;  // the offending field ("" = null)
  std::string code;   // e.g. "context_length_exceeded" ("" = null)
};

ordered_json openai_error_body(const ApiError& e);
ordered_json anthropic_error_body(const ApiError& e);
const char* openai_error_type(int status);

// Server-wide defaults a request starts from (flags over generation_config.json over built-ins,
// server-api.md §3).
struct ApiDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  std::optional<int64_t> max_tokens;  // --max-tokens (default runtime::kDefaultMaxTokens); none = context end
};

struct ServedModel {
  const runtime::LoadedModel* m = nullptr;
  std::string id;            // the served model id
  std::string fingerprint;   // system_fingerprint
  std::string ns_base;       // KV namespace without a salt
  int64_t ctx = 0;           // context limit per sequence
  // The longest text any one token decodes to: a prompt longer than ctx × this cannot fit, and
  // is refused before tokenizing (0: no such bound).
  int64_t max_token_bytes = 0;
  ApiDefaults defaults;
};

// A parsed generation request and how to answer it.
struct ParsedRequest {
  GenRequest gen;
  std::vector<GenRequest> more;  // choices 1.. (n > 1, or a list of prompts); non-stream only
  bool stream = false;
  bool include_usage = false;      // stream_options.include_usage
  bool logprobs = false;
  int top_logprobs = 0;
  std::string response_id;
  int64_t created = 0;
  // Reasoning models (the vocabulary has <think>/</think>): split the output into reasoning and
  // answer; the prompt may already have opened the tag.
  bool split_reasoning = false;
  bool reasoning_start_inside = false;
  bool thinking_requested = false;  // Anthropic `thinking: enabled`: return a thinking block
  runtime::ToolCallStyle tool_style = runtime::ToolCallStyle::kNone;  // tools offered: parse calls
  std::vector<std::string> warnings;  // sent as `Warning: 299 larder "<text>"` headers
};

// Throws ApiError on invalid input.
ParsedRequest parse_chat(const ServedModel& sm, const ordered_json& body);
ParsedRequest parse_completion(const ServedModel& sm, const ordered_json& body);
ParsedRequest parse_messages(const ServedModel& sm, const ordered_json& body);

// The longest decoded token of the model (for ServedModel::max_token_bytes).
int64_t longest_token_bytes(const runtime::LoadedModel& m);

// POST /apply-template: the chat prompt the template renders for body.messages (with tools and
// chat_template_kwargs), as text. Throws ApiError.
std::string render_chat_prompt(const ServedModel& sm, const ordered_json& body);

// Accumulates one request's events into the response (non-stream) or into stream chunks.
class ResponseWriter {
 public:
  ResponseWriter(const ServedModel& sm, const ParsedRequest& pr, Surface surface);
  // Streaming: the SSE frames to send for this event (may be empty). Call in event order.
  std::string stream_frames(const Event& e);
  // The opening frames (role chunk / message_start) — sent once, after admission is known.
  std::string stream_open();
  // Non-stream: feed every event, then body().
  void add(const Event& e);
  ordered_json body() const;
  // For logs.
  const Outcome& outcome() const { return outcome_; }
  const std::string& text() const { return text_; }
  void set_index(int i) { index_ = i; }  // the choice index this writer answers
  // One of several choices streamed together (n > 1, prompt lists): this writer's frames end
  // with its finish chunk; the caller sends the merged usage and the one [DONE].
  void set_part_of_many() { part_of_many_ = true; }
  // The usage chunk of a multi-choice stream, from the merged outcome (stream_options.include_usage).
  std::string usage_frame(const Outcome& total);

 private:
  ordered_json usage_json() const;
  bool part_of_many_ = false;
  struct Pieces {
    std::string content, reasoning;
    std::vector<runtime::ToolCall> calls;  // completed by this piece
  };
  // The text pipeline after the engine's stop matcher: reasoning splitter → tool-call parser.
  Pieces process(const std::string& text, bool final);
  ordered_json tool_calls_json() const;
  std::string anthropic_block(const char* type);  // frames that make `type` the open block
  ordered_json logprobs_json(const std::vector<TokenInfo>& toks) const;
  ordered_json chunk(ordered_json choice_fields) const;
  std::string finish_reason() const;
  const ServedModel& sm_;
  const ParsedRequest& pr_;
  Surface surface_;
  std::string text_, reasoning_;
  std::vector<TokenInfo> tokens_;
  std::optional<runtime::ReasoningSplitter> splitter_;
  std::optional<runtime::ToolCallParser> tool_parser_;
  std::vector<runtime::ToolCall> calls_;
  std::vector<std::string> call_ids_;
  int block_index_ = -1;
  std::string block_type_;
  Outcome outcome_;
  bool opened_ = false;
  mutable int64_t lp_offset_ = 0;
  int index_ = 0;  // text_offset of the next token (characters)
};

// A random id: prefix + 24 base62 characters.
std::string random_id(const std::string& prefix);

}  // namespace larder::server
