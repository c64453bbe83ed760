// fuzz_http — the whole request path of `larder serve` from raw bytes: the transport's HTTP/1.x
// framing (request line, headers, Content-Length, chunked bodies, pipelining, HTTP/1.0,
// Expect: 100-continue; server/transport.cpp), the request policy (Host, Origin/CORS,
// Content-Type, JSON depth, routes; server/http_server.cpp), the route handlers and, for
// generation routes, the engine and the response writers — on stories260K with a small context.
//
// One server is started in-process on a loopback port (port 0); each input is sent on a new
// connection, the write side is shut, and the answer is read until the server closes. The
// server must close every such connection: a connection still open after 10 s is a hang and
// aborts. Coverage feedback reaches the fuzzer from the server's threads (the counters are
// global), so inputs are whole connections' bytes, possibly several pipelined requests.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "fuzz_util.h"
#include "larder/memory/store/identity.h"
#include "larder/memory/store/kv_store.h"
#include "larder/runtime/kv_identity.h"
#include "larder/runtime/loaded_model.h"
#include "larder/server/engine.h"
#include "larder/server/http_server.h"

using namespace larder;

namespace {

[[noreturn]] void die(const char* what, const Status& st) {
  std::fprintf(stderr, "fuzz_http: %s: %s\n", what, st.to_string().c_str());
  std::abort();
}

struct Server {
  std::unique_ptr<runtime::LoadedModel> model;
  server::ServedModel sm;
  server::Metrics metrics;
  std::unique_ptr<server::HttpServer> http;
  std::unique_ptr<server::Engine> engine;
  std::thread loop;
  int port = 0;
};

Server* start() {
  fuzz::quiet();
  auto* s = new Server;  // never destroyed: the process ends with the fuzzer
  auto m = runtime::load_model(fuzz::shared_dir() + "/models/stories260K/stories260K.gguf");
  if (!m.is_ok()) die("load", m.status());
  s->model = std::move(*m);
  runtime::LoadedModel& lm = *s->model;
  lm.grammar = std::make_shared<runtime::GrammarEngine>(*lm.tokenizer, lm.model->info().vocab, lm.defaults.eos_ids,
                                                        8ll << 20);
  s->sm.m = &lm;
  s->sm.id = "stories260K";
  s->sm.fingerprint = "larder-fuzz";
  s->sm.ns_base = memory::namespace_id({});
  s->sm.ctx = 128;
  s->sm.max_token_bytes = server::longest_token_bytes(lm);
  s->sm.defaults.max_tokens = 4;
  server::HttpConfig hc;
  hc.host = "127.0.0.1";
  hc.port = 0;
  hc.cors = {"localhost"};
  hc.body_limit = 1u << 20;
  hc.threads = 4;
  hc.header_timeout_ms = hc.body_timeout_ms = hc.idle_timeout_ms = 5000;
  hc.stream_flush_ms = 0;
  s->http = std::make_unique<server::HttpServer>(hc, s->metrics);
  if (Status st = s->http->bind(); !st.is_ok()) die("bind", st);
  s->port = s->http->port();
  memory::KvStoreConfig kc;
  kc.ram_cap_bytes = 16u << 20;
  auto id = runtime::kv_store_identity(lm);
  if (!id.is_ok()) die("identity", id.status());
  kc.identity = *id;
  kc.signature = runtime::kv_state_signature(lm);
  auto store = memory::KvStore::open(std::move(kc));
  if (!store.is_ok()) die("kv store", store.status());
  server::EngineConfig ec;
  ec.parallel = 2;
  ec.queue_max = 8;
  ec.ctx = s->sm.ctx;
  s->engine = std::make_unique<server::Engine>(lm, std::move(*store), ec, s->metrics);
  s->http->set_ready(&s->sm, s->engine.get());
  s->loop = std::thread([s] { s->http->serve(); });
  return s;
}

}  // namespace

Server* s = nullptr;

// Loading and starting the server run before libFuzzer's per-input timer starts.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  s = start();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) std::abort();
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(s->port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) std::abort();
  // Send and read at once: a large pipelined answer must not block the server's write while we
  // are still writing.
  size_t sent = 0;
  bool shut = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  char buf[65536];
  for (;;) {
    if (!shut && sent == size) {
      ::shutdown(fd, SHUT_WR);
      shut = true;
    }
    pollfd p{fd, static_cast<short>(POLLIN | (shut ? 0 : POLLOUT)), 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      std::fprintf(stderr, "fuzz_http: the server kept the connection open for 10 s after the request ended\n");
      std::abort();
    }
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    if (p.revents & POLLOUT) {
      const ssize_t w = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) sent += static_cast<size_t>(w);
      else if (w < 0 && errno != EAGAIN && errno != EINTR) sent = size;  // the server closed: stop writing
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t r = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) break;
    }
  }
  ::close(fd);
  return 0;
}
