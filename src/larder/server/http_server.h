// http_server.h — the request policy and route handlers over the transport (transport.h):
// Host check, CORS and Origin rules, Content-Type, JSON depth, authentication, one log line per
// request, SSE framing and disconnect detection. Request meaning lives in api.h, scheduling in
// engine.h, the route list in routes.h.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "larder/core/status.h"
#include "larder/server/api.h"
#include "larder/server/engine.h"
#include "larder/server/metrics.h"

namespace larder::server {

struct HttpConfig {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;                 // empty: no authentication
  // Allowed browser origins: "*" (any, never "null", no credentials), an exact origin,
  // "scheme://host:*" (any port), "scheme://*.domain" (subdomains), or "localhost" (http(s)
  // origins on localhost, 127.0.0.1 and [::1], any port). Empty: no cross-origin request.
  std::vector<std::string> cors;
  // Host header values accepted besides the loopback names (a loopback bind) — any host when
  // empty on other binds. Compared case-insensitively, without the port.
  std::vector<std::string> allowed_hosts;
  size_t body_limit = 32u << 20;       // 413 beyond
  int threads = 32;                    // generation workers (streams hold one each)
  int max_connections = 1024, max_connections_per_ip = 256;
  int header_timeout_ms = 10000, body_timeout_ms = 30000, idle_timeout_ms = 60000;
  bool log_json = false;               // --log-format json
  bool webui = true;                   // GET / serves the chat page to browsers (--no-webui: off)
  // A stream writes at most once per this many ms once its tokens flow (0: every token as it
  // comes). Tokens made meanwhile go out together in one write. The first token is never held.
  // Why: one wake-up and one send per token cost the server ~70 µs of CPU per token and a
  // Python client as much again, on the cores the model runs on. 25 ms is 40 writes a second,
  // smoother than a reader notices; SmolLM2 streaming ~500 tok/s on 2 cores lost 1.5 % of its
  // decode speed to the stream at 25 ms, 3.9 % at 10 and ~6 % unpaced (bench/RESULTS.md, session 28).
  int stream_flush_ms = 25;
};

// Validates --cors entries; a clear error for patterns that would match more than meant.
Status check_cors_patterns(const std::vector<std::string>& patterns);

class HttpServer {
 public:
  HttpServer(HttpConfig cfg, Metrics& metrics);
  ~HttpServer();

  // Binds the port (fails clearly when it is taken) — before the model loads, so /health can
  // answer 503 "loading" meanwhile.
  Status bind();
  // Serves until stop(); call on its own thread.
  void serve();
  void stop();

  // The model is loaded: generation routes open, /health turns 200.
  void set_ready(const ServedModel* sm, Engine* engine);
  // Shutdown began: /health says draining, new generations get 503.
  void set_draining();
  int port() const { return cfg_.port; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  HttpConfig cfg_;
};

}  // namespace larder::server
