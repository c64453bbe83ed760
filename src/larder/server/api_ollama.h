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

#include "larder/server/response_writer.h"

namespace larder::server {

enum class OllamaKind { kChat, kGenerate };

// Throws ApiError (400 naming the field, 404 for another model name).
ParsedRequest parse_ollama_chat(const ServedModel& sm, const ordered_json& body);
ParsedRequest parse_ollama_generate(const ServedModel& sm, const ordered_json& body);

// An empty prompt (generate) or an empty message list (chat) only asks Ollama to load the
// model: the answer is one done object with done_reason "load" ("unload" for keep_alive 0).
// Returns it when `body` is such a request (after the model name is checked), else nullopt.
std::optional<ordered_json> ollama_load_only(const ServedModel& sm, const ordered_json& body, OllamaKind kind);

// Engine events → Ollama objects: one JSON object per line when streaming ("frames" of the shared
// ResponseWriter are NDJSON lines here), one object otherwise. Text passes the same reasoning
// splitter and tool-call parser as the OpenAI chat surface (response_writer.h).
class OllamaWriter : public ResponseWriter {
 public:
  OllamaWriter(const ServedModel& sm, const ParsedRequest& pr, OllamaKind kind);
  ordered_json body() const override;

 protected:
  std::string open_frames() override { return {}; }
  std::string delta_frames(const Pieces& parts, const std::vector<TokenInfo>& tokens) override;
  std::string tool_call_frames(size_t i) override;
  std::string finish_frames() override;
  std::string error_frames(const std::string& message) override;

 private:
  ordered_json head() const;  // model, created_at
  ordered_json message(const std::string& content, const std::string& thinking,
                       const std::vector<runtime::ToolCall>& calls) const;
  void finish_fields(ordered_json& j) const;  // done, done_reason and the counters
  OllamaKind kind_;
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
