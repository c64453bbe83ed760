#include "larder/server/routes.h"

namespace larder::server {

const std::vector<Route>& route_table() {
  static const std::vector<Route> r = {
      {RouteId::kChat, "POST", "/v1/chat/completions", {"/chat/completions"}, false, false,
       "OpenAI chat completions (stream, tools, logprobs, n)"},
      {RouteId::kCompletions, "POST", "/v1/completions", {}, false, false,
       "OpenAI text completions (prompt string, token ids, or a list of prompts)"},
      {RouteId::kMessages, "POST", "/v1/messages", {}, false, false, "Anthropic messages (stream, tools, thinking)"},
      {RouteId::kCountTokens, "POST", "/v1/messages/count_tokens", {}, true, false, "Anthropic token count of a messages request"},
      // /completions without /v1 is llama-server's native handler, as llama-server routes it.
      {RouteId::kNativeCompletion, "POST", "/completion", {"/completions"}, false, false,
       "llama-server native completion (n_predict, n_probs, prompt lists, stream)"},
      {RouteId::kApplyTemplate, "POST", "/apply-template", {}, true, false, "llama-server: render messages with the chat template"},
      {RouteId::kProps, "GET", "/props", {}, true, false, "llama-server: model, context, chat template, defaults"},
      {RouteId::kTokenize, "POST", "/tokenize", {}, true, false, "text to token ids (with_pieces: {id, piece})"},
      {RouteId::kDetokenize, "POST", "/detokenize", {}, true, false, "token ids to text"},
      {RouteId::kModels, "GET", "/v1/models", {"/models"}, true, false, "the served model (OpenAI list shape)"},
      {RouteId::kModel, "GET", "/v1/models/{id}", {"/models/{id}"}, true, false, "one model by id"},
      {RouteId::kLoraList, "GET", "/lora-adapters", {}, true, false,
       "llama-server: the --lora adapters [{id, path, scale}] (scale: the global one)"},
      {RouteId::kLoraSet, "POST", "/lora-adapters", {}, true, true,
       "llama-server: set the global adapter scales [{id, scale}] (unlisted: 0)"},
      {RouteId::kHealth, "GET", "/health", {}, true, false,
       "200 ok / 503 loading or draining, with the load: running, queued, free slots (never needs a key)"},
      {RouteId::kMetrics, "GET", "/metrics", {}, false, false, "Prometheus metrics"},
      {RouteId::kStats, "GET", "/stats", {}, false, false, "JSON server, request and KV store statistics"},
      {RouteId::kIndex, "GET", "/", {}, true, false,
       "the chat page for a browser (Accept: text/html), else what is served here: the model and these routes"},
      {RouteId::kIndexV1, "GET", "/v1", {}, true, false, "the same, under the OpenAI base URL"},
      {RouteId::kWebAsset, "GET", "/webui/app.js", {"/webui/markdown.js", "/webui/app.css"}, true, false,
       "the chat page's script, Markdown renderer and style (never needs a key)"},
      // Waits for the engine thread (the RAM tier is its own): not a control route.
      {RouteId::kKvLookup, "POST", "/v1/kv/lookup", {}, false, false,
       "how many leading tokens of a prompt this replica holds in RAM, on SSD and in the remote tier (nothing computed)"},
      {RouteId::kAdminFlush, "POST", "/admin/kv/flush", {}, false, true, "write the KV store's RAM entries to the SSD tier"},
      {RouteId::kAdminClear, "POST", "/admin/kv/clear", {}, false, true, "drop the KV store (?tier=ssd: the SSD tier too)"},
      {RouteId::kOllamaChat, "POST", "/api/chat", {}, false, false, "Ollama chat (NDJSON stream by default, tools, options)"},
      {RouteId::kOllamaGenerate, "POST", "/api/generate", {}, false, false, "Ollama generate (prompt, system, raw, options)"},
      {RouteId::kOllamaTags, "GET", "/api/tags", {}, true, false, "Ollama: the served model as a local model list"},
      {RouteId::kOllamaShow, "POST", "/api/show", {}, true, false, "Ollama: details, parameters, template, capabilities"},
      {RouteId::kOllamaPs, "GET", "/api/ps", {}, true, false, "Ollama: the loaded model"},
      {RouteId::kOllamaVersion, "GET", "/api/version", {}, true, false, "Ollama API level these routes follow"},
      {RouteId::kOllamaEmbed, "POST", "/api/embed", {"/api/embeddings"}, true, false, "Ollama embeddings: 501, not supported"},
      {RouteId::kOllamaPull, "POST", "/api/pull", {}, true, false, "Ollama pull: 501, use `larder pull`"},
  };
  return r;
}

namespace {
bool path_matches(const std::string& pattern, const std::string& path, std::string* capture) {
  const size_t brace = pattern.find('{');
  if (brace == std::string::npos) return pattern == path;
  if (path.size() <= brace || path.compare(0, brace, pattern, 0, brace) != 0) return false;
  if (capture) *capture = path.substr(brace);
  return true;
}
}  // namespace

const Route* match_route(const std::string& method, const std::string& path, bool* path_known, std::string* capture) {
  if (path_known) *path_known = false;
  for (const Route& r : route_table()) {
    bool hit = path_matches(r.path, path, capture);
    for (const char* a : r.aliases) hit = hit || path_matches(a, path, capture);
    if (!hit) continue;
    if (method == r.method || (method == "HEAD" && std::string(r.method) == "GET")) return &r;
    if (path_known) *path_known = true;
  }
  return nullptr;
}

}  // namespace larder::server
