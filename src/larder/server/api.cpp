// api.cpp — what the API surfaces share that is not a response writer: error bodies, ids, the
// longest token. Each surface's request parser and response writer live in its own file
// (api_chat.cpp, api_completions.cpp, api_messages.cpp; llama-server's native shapes in
// api_native.cpp, Ollama's in api_ollama.cpp); the writers' common part in response_writer.cpp.
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

}  // namespace larder::server
