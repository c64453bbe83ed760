// api_ollama.h — Ollama's native API (/api/chat, /api/generate, /api/tags, /api/show, /api/ps,
// /api/version), so tools that only speak Ollama (editor plugins, Open WebUI, the `ollama`
// client libraries) work against `larder serve`. Requests become the same GenRequests as the
// OpenAI surfaces (same template encoding, sampling, stops, context fitting, tool-call parsing);
// answers are Ollama's shapes: NDJSON lines (one JSON object per line, streaming by default),
// durations in nanoseconds, created_at in RFC 3339, errors as {"error": "..."}.
// docs/server-api.md "Ollama API" lists what is honoured, accepted and refused.
#pragma once

#include <optional>
#include <string>

#include "larder/server/api.h"

namespace larder::server {

enum class OllamaKind { kChat, kGenerate };

// Throws ApiError (400 naming the field, 404 for another model name).
ParsedRequest parse_ollama_chat(const ServedModel& sm, const ordered_json& body);
ParsedRequest parse_ollama_generate(const ServedModel& sm, const ordered_json& body);

// An empty prompt (generate) or an empty message list (chat) only asks Ollama to load the
// model: the answer is one done object with done_reason "load" ("unload" for keep_alive 0).
// Returns it when `body` is such a request (after the model name is checked), else nullopt.
std::optional<ordered_json> ollama_load_only(const ServedModel& sm, const ordered_json& body, OllamaKind kind);

// Engine events → Ollama objects. Text passes the same reasoning splitter and tool-call parser as
// the OpenAI chat surface (/api/chat only).
class OllamaWriter {
 public:
  OllamaWriter(const ServedModel& sm, const ParsedRequest& pr, OllamaKind kind);
  // Streaming: the NDJSON lines for this event ("" when it carries nothing to say).
  std::string stream_lines(const Event& e);
  // Non-stream: feed every event, then body().
  void add(const Event& e);
  ordered_json body() const;
  const Outcome& outcome() const { return outcome_; }

 private:
  struct Piece {
    std::string content, thinking;
    std::vector<runtime::ToolCall> calls;
  };
  Piece process(const std::string& text, bool final);
  ordered_json head() const;                                 // model, created_at
  ordered_json message(const Piece& p) const;                // chat: the message object
  void finish_fields(ordered_json& j) const;                 // done_reason and the counters
  const ServedModel& sm_;
  const ParsedRequest& pr_;
  OllamaKind kind_;
  std::optional<runtime::ReasoningSplitter> splitter_;
  std::optional<runtime::ToolCallParser> tool_parser_;
  Piece all_;
  std::vector<TokenInfo> all_logprob_tokens_;  // non-stream logprobs
  bool any_calls_ = false;
  Outcome outcome_;
};

// GET /api/tags, GET /api/ps: the served model as Ollama lists it. POST /api/show: its details
// (throws ApiError 404 for another name). GET /api/version.
ordered_json ollama_tags(const ServedModel& sm);
ordered_json ollama_ps(const ServedModel& sm);
ordered_json ollama_show(const ServedModel& sm, const ordered_json& body);
ordered_json ollama_version();

// RFC 3339 UTC with microseconds (Ollama's created_at / modified_at).
std::string rfc3339_now();

}  // namespace larder::server
