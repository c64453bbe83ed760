// transport.h — larder's own HTTP/1.x connection layer: sockets, request framing, timeouts,
// connection caps and worker threads. It knows nothing about routes or APIs (http_server.cpp
// does); it turns bytes into HttpRequests and HttpResponses back into bytes.
//
// Why our own and not cpp-httplib's server: httplib gives every connection a thread for its
// whole life, so a few dozen slow or idle clients (a header line every few seconds, a lying
// Content-Length, idle keep-alives) took every thread and /health stopped answering; it also
// answered one of several pipelined requests, sent chunked bodies to HTTP/1.0 clients and
// accepted ambiguous framing (two Content-Lengths, Content-Length with Transfer-Encoding).
// Here one event-loop thread reads every connection until a whole request has arrived (with a
// deadline for the header and for the body, and caps per client address and in total); only a
// complete request takes a worker thread, and cheap routes have workers of their own, so
// /health answers whatever the generation routes and slow clients are doing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "larder/core/status.h"

namespace larder::server {

struct HttpRequest {
  std::string method, target, path, query, version;  // version: "HTTP/1.0" or "HTTP/1.1"
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-case, in arrival order
  std::string body;
  std::string remote_ip;
  std::vector<std::string> matches;  // route pattern captures (set by the router)
  // Set by the transport while the request runs: true once the client has closed the connection
  // (a handler that waits before answering — a grammar compile — stops waiting).
  std::function<bool()> client_gone;

  bool has_header(const std::string& lower_name) const;
  std::string header(const std::string& lower_name) const;  // first value, "" if absent
  size_t header_count(const std::string& lower_name) const;
  std::string param(const std::string& name) const;          // query parameter, "" if absent
  std::vector<std::pair<std::string, std::string>> params() const;  // every query parameter, decoded, in order
};

// The writer a streaming response gets. write() fails once the client is gone.
struct BodySink {
  std::function<bool(const char*, size_t)> write;
  std::function<bool()> is_writable;  // false when the peer has closed or errored
  std::function<void()> done;
};

struct HttpResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string content_type = "application/json";
  // Streaming: called until it calls sink.done() (returns true) or returns false (abort).
  std::function<bool(BodySink&)> provider;
  std::function<void(bool ok)> on_finish;  // after the body, ok=false if the client went away

  void set_header(const std::string& name, const std::string& value);
  void set_content(std::string b, std::string type) {
    body = std::move(b);
    content_type = std::move(type);
  }
  bool has_header(const std::string& name) const;
};

struct TransportConfig {
  std::string host = "127.0.0.1";
  int port = 8080;
  size_t body_limit = 32u << 20;  // 413 beyond
  size_t header_limit = 64u << 10;  // 431 beyond
  int work_threads = 32;          // generation and engine routes (a stream holds one)
  int control_threads = 4;        // cheap routes (/health, models, tokenize, errors)
  int max_connections = 1024;     // open connections in total (new ones beyond: 503 + close)
  int max_connections_per_ip = 256;
  int header_timeout_ms = 10000;  // from a request's first byte to the end of its header
  int body_timeout_ms = 30000;    // plus 1 s per MiB of announced body
  int idle_timeout_ms = 60000;    // keep-alive connection with no request in progress
  int write_timeout_ms = 60000;   // a response write that cannot progress this long fails
};

class Transport {
 public:
  using Handler = std::function<void(HttpRequest&, HttpResponse&)>;
  // Fills an error response (status, message) in the right API shape for the request's path.
  using ErrorHandler = std::function<void(const HttpRequest&, HttpResponse&, int status, const std::string& message)>;
  // true: the request runs on the control workers (cheap, never waits on the engine).
  using Classifier = std::function<bool(const HttpRequest&)>;

  Transport(TransportConfig cfg, Handler handler, ErrorHandler error, Classifier is_control);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  Status bind();        // listens (port 0: any free port)
  int port() const;
  void serve();         // runs the event loop until stop(); call on its own thread
  void stop();          // safe before, during or after serve(), from any thread

  struct Counters {
    uint64_t accepted = 0, refused = 0, evicted = 0, timed_out = 0, bad_framing = 0;
  };
  Counters counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Depth of the deepest array/object nesting in a JSON text, counted without parsing (strings
// skipped): refuse deep bodies before a recursive parser, dumper or walker sees them.
int json_nesting_depth(const std::string& text, int stop_at);

}  // namespace larder::server
