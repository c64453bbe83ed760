// http_server.h — the transport: cpp-httplib routes, authentication, CORS, host check, body
// limit, SSE framing and disconnect detection. Request meaning lives in api.h, scheduling in
// engine.h; this file only moves bytes between sockets and those two.
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
  std::vector<std::string> cors;       // allowed origins ("*", exact, or "scheme://host:*"); empty: CORS off
  size_t body_limit = 32u << 20;       // 413 beyond
  int threads = 32;                    // connection threads (streams hold one each)
};

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
