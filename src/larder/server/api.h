// api.h — request handling: API bodies (OpenAI chat/completions, Anthropic messages) to
// GenRequests, engine events to response bodies and stream events. No sockets here: the
// transport (http_server.cpp) moves bytes; this file decides what they say.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "larder/runtime/loaded_model.h"
#include "larder/runtime/reasoning.h"
#include "larder/runtime/tool_calls.h"
#include "larder/server/loras.h"
#include "larder/server/request.h"

namespace larder::server {

using ordered_json = nlohmann::ordered_json;

// The JSON nesting limit of request bodies (400 beyond, before parsing).
constexpr int kMaxJsonDepth = 128;

// Parses JSON from a client (a request body, a tool call's arguments string) in time linear in
// its size. nlohmann's ordered_json keeps an object's keys in a vector and its parser finds each
// key by scanning it, which is quadratic in the keys: one body of 80k keys (1 MB) took 12 s.
// This parser indexes the keys of large objects in a hash map while it builds them. Key order is
// kept (tool schemas reach the chat template's tojson, which must match jinja2), and so are
// nlohmann's duplicate-key semantics: the last value wins, at the first occurrence's position.
// Nesting deeper than max_depth stops the parse. Returns the error message, or nullopt.
std::optional<std::string> parse_json_linear(std::string_view text, int max_depth, ordered_json* out);

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

// An error message as a client may see it: library exceptions (xgrammar's) carry the build
// machine's source paths and lines ("[12:00:00] /…/json_schema_converter.cc:3562: "), which are
// cut here, where every error body is made.
std::string public_error_message(std::string message);
ordered_json openai_error_body(const ApiError& e);
ordered_json anthropic_error_body(const ApiError& e);
const char* openai_error_type(int status);

// Server-wide defaults a request starts from (flags over generation_config.json over built-ins,
// server-api.md §3).
struct ApiDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  std::optional<int64_t> max_tokens;  // --max-tokens (default runtime::kDefaultMaxTokens); none = context end
  // --seed: the seed of every request that gives none (llama-server's -s), so those repeat;
  // none = a random seed per request.
  std::optional<uint64_t> seed;
};

struct ServedModel {
  const runtime::LoadedModel* m = nullptr;
  std::string id;            // the served model id
  std::string fingerprint;   // system_fingerprint
  std::string ns_base;       // KV namespace without a salt or adapters
  std::shared_ptr<LoraTable> loras;  // --lora adapters (null or empty: none; loras.h)
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
  // The template speaks harmony (gpt-oss, runtime/harmony.h): the output's channels are the
  // reasoning, the answer and the tool calls (the splitter and the tool-call parser stand aside).
  bool harmony = false;
  runtime::ToolCallStyle tool_style = runtime::ToolCallStyle::kNone;  // tools offered: parse calls
  ordered_json tools;  // the tools offered (OpenAI shape): parameter types for XML-style calls
  std::string constraint_source;      // what set gen.constraint ("response_format json_schema", ...)
  std::vector<std::string> warnings;  // sent as `Warning: 299 larder "<text>"` headers
};

// Throws ApiError on invalid input.
ParsedRequest parse_chat(const ServedModel& sm, const ordered_json& body);
// llama_server: llama-server's /completion (api_native.h), whose logit_bias also takes text keys.
ParsedRequest parse_completion(const ServedModel& sm, const ordered_json& body, bool llama_server = false);
// count_only (/v1/messages/count_tokens): a prompt longer than the context is counted, not
// refused — but one the byte bound refuses is never tokenized.
ParsedRequest parse_messages(const ServedModel& sm, const ordered_json& body, bool count_only = false);

// POST /v1/kv/lookup: the prompt a generation request would run, as token ids, and its KV
// namespace. One of `prompt` (as /v1/completions takes it), `messages` (as /v1/chat/completions
// renders them, with tools and chat_template_kwargs) or `tokens` (ids); `model` optional (404
// when it names another); `cache_salt` as on the generation routes. Throws ApiError.
struct KvLookupRequest {
  std::vector<int32_t> prompt;
  std::string ns;
  std::string form;  // "prompt" | "messages" | "tokens"
};
KvLookupRequest parse_kv_lookup(const ServedModel& sm, const ordered_json& body);

// The longest decoded token of the model (for ServedModel::max_token_bytes).
int64_t longest_token_bytes(const runtime::LoadedModel& m);

// POST /apply-template: the chat prompt the template renders for body.messages (with tools and
// chat_template_kwargs), as text. Throws ApiError.
std::string render_chat_prompt(const ServedModel& sm, const ordered_json& body);

// Engine events → a surface's response body or stream frames: ResponseWriter and
// make_response_writer() in response_writer.h.
class ResponseWriter;

// A random id: prefix + 24 base62 characters.
std::string random_id(const std::string& prefix);

}  // namespace larder::server
