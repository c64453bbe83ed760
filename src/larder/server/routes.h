// routes.h — the one route table of `larder serve`. The transport dispatches from it (which
// worker pool), the request policy reads it (admin routes, which need the model), GET / and
// GET /v1 list it, and tests/server/docs_test.py checks docs/server-api.md against it.
#pragma once

#include <string>
#include <vector>

namespace larder::server {

enum class RouteId {
  kChat, kCompletions, kMessages, kCountTokens,                       // generation APIs
  kNativeCompletion, kApplyTemplate, kProps, kTokenize, kDetokenize,  // llama-server native
  kModels, kModel, kHealth, kMetrics, kStats, kIndex, kIndexV1,        // information
  kKvLookup,                                                          // for a router (cluster)
  kLoraList, kLoraSet,                                                // llama-server /lora-adapters
  kAdminFlush, kAdminClear,                                           // admin
  kWebAsset,                                                          // the chat page's files (webui.h)
  kOllamaChat, kOllamaGenerate, kOllamaTags, kOllamaShow, kOllamaPs,  // Ollama native (api_ollama.h)
  kOllamaVersion, kOllamaEmbed, kOllamaPull,
};

struct Route {
  RouteId id;
  const char* method;
  const char* path;                  // canonical path; "{id}" matches the rest of the path
  std::vector<const char*> aliases;  // other paths answering the same (e.g. without /v1)
  bool control;                      // cheap: runs on the control workers, never waits on the engine
  bool admin;                        // never answers a browser origin
  const char* summary;
};

const std::vector<Route>& route_table();

// The route answering (method, path), or nullptr; *path_known is set when some route has this
// path under another method (405 rather than 404). `capture` receives the "{id}" part.
const Route* match_route(const std::string& method, const std::string& path, bool* path_known, std::string* capture);

}  // namespace larder::server
