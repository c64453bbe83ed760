// api_constraints.h — request fields that constrain the output (issue 15, server-api.md §4.5),
// turned into compiled grammars (runtime/grammar.h) on the HTTP worker that parses the request:
//   OpenAI     response_format {json_object | json_schema}, tool_choice none/auto/required/
//              {function}, parallel_tool_calls
//   Anthropic  tool_choice {auto | any | tool | none}, disable_parallel_tool_use
//   llama-server  grammar (GBNF), json_schema
// Internal to server/ (used by api_chat.cpp, api_completions.cpp, api_messages.cpp).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "larder/server/api.h"

namespace larder::server::constraints {

// When a request's grammar compile stops being waited for (issue 47): the compile cannot be
// interrupted, but the request can walk away from it — 499 when the client left, 503 when the
// server drains — and never reaches the engine.
struct CompileAbandon {
  std::function<bool()> client_gone;
  std::function<bool()> draining;
};

// Compiles started on this thread while the scope lives poll `a` as they wait. http_server sets
// one around parsing a request (the parse functions see the body, not the connection, and a
// compile is the only long wait in them); a thread-local keeps their signatures as they are.
class AbandonScope {
 public:
  explicit AbandonScope(CompileAbandon a);
  ~AbandonScope();
  AbandonScope(const AbandonScope&) = delete;
  AbandonScope& operator=(const AbandonScope&) = delete;

 private:
  CompileAbandon a_;
  const CompileAbandon* prev_;
};

// How a request wants tool calls.
struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kNamed };
  Mode mode = Mode::kAuto;
  std::string name;      // kNamed
  bool parallel = true;  // more than one call allowed
};

// OpenAI `tool_choice` + `parallel_tool_calls`; 400 on a bad value or a name not in `tools`.
ToolChoice openai_tool_choice(const ordered_json& body, const ordered_json& tools);
// Anthropic `tool_choice` ({type, name, disable_parallel_tool_use}); tools already in OpenAI shape.
ToolChoice anthropic_tool_choice(const ordered_json& body, const ordered_json& tools);

// The grammar of the tool calls `choice` asks for, in the model family's markup (pr.tool_style, or
// harmony's channel messages when pr.harmony; runtime/tool_grammar.h; a family with no known
// markup gets the Hermes/Qwen `<tool_call>` form when a call is forced, and pr.tool_style is set
// so the parser finds it). kRequired/kNamed: the whole answer is calls, after the reasoning the
// prompt opened (`<think>`) or harmony's analysis messages. kAuto: free text until the family's
// trigger (`<tool_call>`, harmony's `to=functions.NAME` header), then the call is constrained
// (lazy); none for a family without a trigger. Runs after encode_with_template (it reads what the
// rendered prompt opened). Each tool's `parameters` must pass check_json_schema (400 naming the
// tool and the keyword).
void apply_tool_choice(const ServedModel& sm, const ordered_json& tools, const ToolChoice& choice, ParsedRequest& pr,
                       const char* param);

// OpenAI response_format: {type: text | json_object | json_schema}; sets pr.gen.constraint.
// json_object may carry a `schema` (llama-server's extension), enforced like json_schema's.
// Returns the instruction to give the model ("" for text).
std::string apply_response_format(const ServedModel& sm, const ordered_json& body, ParsedRequest& pr);

// Ollama's `format`: "json" (any JSON object) or a JSON schema object; sets pr.gen.constraint.
void apply_ollama_format(const ServedModel& sm, const ordered_json& body, ParsedRequest& pr);

// llama-server's `grammar` (GBNF) and `json_schema` fields; sets pr.gen.constraint.
void apply_native_fields(const ServedModel& sm, const ordered_json& body, ParsedRequest& pr);

}  // namespace larder::server::constraints
