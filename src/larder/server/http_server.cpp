#include "larder/server/http_server.h"

#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <regex>

#include "larder/core/cpuid.h"
#include "larder/core/log.h"

namespace larder::server {

using Clock = std::chrono::steady_clock;

namespace {

enum State { kLoading, kReady, kDraining };

bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

bool is_loopback(const std::string& host) { return host == "127.0.0.1" || host == "localhost" || host == "::1"; }

// "scheme://host:*" matches any port of that scheme and host; "*" anything; else exact.
bool origin_allowed(const std::vector<std::string>& allowed, const std::string& origin) {
  for (const std::string& a : allowed) {
    if (a == "*" || a == origin) return true;
    if (a.size() > 2 && a.compare(a.size() - 2, 2, ":*") == 0) {
      const std::string base = a.substr(0, a.size() - 2);
      if (origin == base || (origin.rfind(base + ":", 0) == 0 && origin.size() > base.size() + 1)) return true;
    }
    if (a.size() > 1 && a.back() == '*' && origin.rfind(a.substr(0, a.size() - 1), 0) == 0) return true;
  }
  return false;
}

bool anthropic_route(const std::string& path) { return path.rfind("/v1/messages", 0) == 0; }

void send_json(httplib::Response& res, int status, const ordered_json& j) {
  res.status = status;
  res.set_content(j.dump(-1, ' ', false, ordered_json::error_handler_t::replace), "application/json");
}

void send_error(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  send_json(res, e.status, anthropic_route(req.path) ? anthropic_error_body(e) : openai_error_body(e));
}

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::kStop: return "stop";
    case Finish::kLength: return "length";
    case Finish::kEos: return "eos";
    case Finish::kCancelled: return "cancelled";
    case Finish::kError: return "error";
    default: return "none";
  }
}

// Paths and the methods they answer (for 405 vs 404).
const std::vector<std::pair<std::regex, std::string>>& known_routes() {
  static const std::vector<std::pair<std::regex, std::string>> r = {
      {std::regex("/(v1/)?chat/completions"), "POST"}, {std::regex("/(v1/)?completions"), "POST"},
      {std::regex("/v1/messages(/count_tokens)?"), "POST"}, {std::regex("/(v1/)?models(/.*)?"), "GET"},
      {std::regex("/health"), "GET"}, {std::regex("/metrics"), "GET"}, {std::regex("/stats"), "GET"},
      {std::regex("/v1"), "GET"}, {std::regex("/(tokenize|detokenize)"), "POST"},
      {std::regex("/admin/kv/(flush|clear)"), "POST"}};
  return r;
}

}  // namespace

struct HttpServer::Impl {
  HttpConfig cfg;
  Metrics& metrics;
  httplib::Server svr;
  std::atomic<int> state{kLoading};
  std::atomic<const ServedModel*> sm{nullptr};
  std::atomic<Engine*> engine{nullptr};
  socket_t listen_fd = INVALID_SOCKET;  // recorded by the socket-options hook, for the backlog

  Impl(HttpConfig c, Metrics& m) : cfg(std::move(c)), metrics(m) {}

  void log_request(const std::string& id, const std::string& route, int status, const Outcome* o, double secs) {
    if (o) {
      std::fprintf(stderr,
                   "larder: %s %s %d prompt=%lld cached=%lld completion=%lld queue=%.0fms ttft=%.0fms "
                   "decode=%.1ftok/s cache=%s(%s) finish=%s total=%.0fms\n",
                   id.c_str(), route.c_str(), status, (long long)o->prompt_tokens, (long long)o->cached_tokens,
                   (long long)o->completion_tokens, o->queue_ms, o->ttft_ms,
                   o->decode_ms > 0 && o->completion_tokens > 1 ? (o->completion_tokens - 1) / (o->decode_ms / 1e3) : 0.0,
                   o->cache_tier.c_str(), o->cache_reason.c_str(), finish_name(o->finish), secs * 1e3);
    }
  }

  void generate(const httplib::Request& req, httplib::Response& res, Surface surface) {
    const auto t0 = Clock::now();
    const std::string route = surface == Surface::kChat ? "/v1/chat/completions"
                              : surface == Surface::kCompletions ? "/v1/completions" : "/v1/messages";
    const ServedModel* m = sm.load();
    Engine* eng = engine.load();
    auto fail = [&](const ApiError& e) {
      send_error(req, res, e);
      metrics.request_done(route, e.status, std::chrono::duration<double>(Clock::now() - t0).count());
    };
    if (state.load() != kReady || !m || !eng) {
      return fail({503, state.load() == kDraining ? "the server is shutting down" : "the model is loading"});
    }
    ordered_json body = ordered_json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) return fail({400, "invalid JSON body"});
    auto pr = std::make_shared<ParsedRequest>();
    try {
      *pr = surface == Surface::kChat ? parse_chat(*m, body)
            : surface == Surface::kCompletions ? parse_completion(*m, body) : parse_messages(*m, body);
    } catch (const ApiError& e) {
      return fail(e);
    } catch (const std::exception& e) {  // e.g. a JSON type error deep in a template value
      return fail({400, std::string("invalid request: ") + e.what()});
    }
    auto submitted = eng->submit(pr->gen);
    if (!submitted.is_ok()) {
      const int status = submitted.status().code() == StatusCode::kResourceExhausted ? 429 : 503;
      return fail({status, submitted.status().message()});
    }
    std::shared_ptr<Channel> ch = *submitted;
    auto writer = std::make_shared<ResponseWriter>(*m, *pr, surface);
    // Wait briefly for admission so the KV store's verdict can travel as a header
    // (x-larder-cache, kv-store.md §11.6). A request that has to queue longer gets its headers
    // without it (usage.larder.cache carries the same report) — its connection must be watched
    // for a disconnect, which only the content provider below can do.
    auto first = std::make_shared<std::optional<Event>>(ch->pop(std::chrono::milliseconds(250)));
    if (*first && (*first)->admitted) {
      const Outcome& o = (*first)->outcome;
      res.set_header("x-larder-cache", strfmt("tier=%s; reused=%lld; reason=%s", o.cache_tier.c_str(),
                                              (long long)o.cached_tokens, o.cache_reason.c_str()));
    }
    const std::string rid = req.has_header("x-request-id") ? req.get_header_value("x-request-id") : pr->response_id;
    res.set_header("x-request-id", rid);
    for (const std::string& w : pr->warnings) res.set_header("Warning", "299 larder \"" + w + "\"");
    if (pr->stream) {
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");
    }
    const bool stream = pr->stream;
    res.status = 200;
    res.set_chunked_content_provider(
        stream ? "text/event-stream" : "application/json",
        [this, ch, writer, pr, stream, route, t0, first](size_t, httplib::DataSink& sink) {
          auto last_write = Clock::now();
          auto write = [&](const std::string& s) {
            if (s.empty()) return true;
            last_write = Clock::now();
            return sink.write(s.data(), s.size());
          };
          for (;;) {
            std::optional<Event> ev;
            if (*first) {
              ev = std::move(*first);
              first->reset();
            } else {
              ev = ch->pop(std::chrono::milliseconds(100));
            }
            // Probe the connection whenever nothing was written for a while (queued, a long
            // prefill, or a non-stream body that writes nothing until the end): a closed peer
            // makes the second write fail, so a heartbeat every kProbe finds a vanished client
            // within about 2·kProbe. Streams send an SSE comment, non-stream bodies
            // JSON-insignificant leading whitespace; clients ignore both. 250 ms, not 1 s: a
            // small model generates a long answer in about a second, and a client that left must
            // free its slot before that, not be noticed only when the answer is complete.
            constexpr auto kProbe = std::chrono::milliseconds(250);
            if (!ev || Clock::now() - last_write > kProbe) {
              if (!sink.is_writable() ||
                  (Clock::now() - last_write > kProbe && !write(stream ? ": keep-alive\n\n" : " "))) {
                ch->cancel();
                metrics.request_done(route, 499, std::chrono::duration<double>(Clock::now() - t0).count());
                return false;
              }
              if (!ev) continue;
            }
            bool ok = true;
            if (stream) {
              ok = write(writer->stream_frames(*ev));
            } else {
              writer->add(*ev);
            }
            if (!ok) {
              ch->cancel();
              metrics.request_done(route, 499, std::chrono::duration<double>(Clock::now() - t0).count());
              return false;
            }
            if (!ev->done) continue;
            const Outcome& o = ev->outcome;
            if (!stream) {
              ordered_json b;
              if (o.finish == Finish::kError || o.finish == Finish::kCancelled) {
                const ApiError e{500, o.error.empty() ? "generation failed" : o.error};
                b = route == "/v1/messages" ? anthropic_error_body(e) : openai_error_body(e);
              } else {
                b = writer->body();
              }
              if (!write(b.dump(-1, ' ', false, ordered_json::error_handler_t::replace))) {
                ch->cancel();
                return false;
              }
            }
            const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
            const int status = o.finish == Finish::kError ? 500 : 200;
            metrics.request_done(route, status, secs);
            log_request(pr->response_id, route, status, &o, secs);
            sink.done();
            return true;
          }
        },
        [ch](bool success) {
          if (!success) ch->cancel();
        });
  }

  void install() {
    svr.new_task_queue = [n = cfg.threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
    svr.set_payload_max_length(cfg.body_limit);
    // SO_REUSEADDR only (a restart may rebind a port in TIME_WAIT). httplib's default also sets
    // SO_REUSEPORT, which would let a second server bind the same port and split its traffic.
    svr.set_socket_options([this](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const char*>(&yes), sizeof(yes));
      listen_fd = sock;
    });
    svr.set_read_timeout(60, 0);
    svr.set_write_timeout(60, 0);
    svr.set_keep_alive_max_count(1000);

    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      // CORS: answer allowed origins only; preflight never needs a key.
      if (!cfg.cors.empty() && req.has_header("Origin")) {
        const std::string origin = req.get_header_value("Origin");
        if (origin_allowed(cfg.cors, origin)) {
          res.set_header("Access-Control-Allow-Origin", origin);
          res.set_header("Vary", "Origin");
          res.set_header("Access-Control-Allow-Credentials", "true");
          res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS, DELETE");
          std::string hdrs = "*";
          if (req.has_header("Access-Control-Request-Headers"))
            hdrs += ", " + req.get_header_value("Access-Control-Request-Headers");
          res.set_header("Access-Control-Allow-Headers", hdrs);
        }
      }
      if (req.method == "OPTIONS") {
        res.status = 204;
        return httplib::Server::HandlerResponse::Handled;
      }
      // DNS-rebinding guard: a loopback server only answers loopback Host names.
      if (is_loopback(cfg.host) && req.has_header("Host")) {
        std::string h = req.get_header_value("Host");
        if (!h.empty() && h[0] == '[') {
          h = h.substr(0, h.find(']') + 1);
        } else if (const size_t c = h.rfind(':'); c != std::string::npos) {
          h = h.substr(0, c);
        }
        if (h != "localhost" && h != "127.0.0.1" && h != "[::1]") {
          send_error(req, res, {403, "Host '" + req.get_header_value("Host") + "' is not allowed for a loopback server"});
          return httplib::Server::HandlerResponse::Handled;
        }
      }
      if (!cfg.api_key.empty() && req.path != "/health") {
        std::string key;
        const std::string auth = req.get_header_value("Authorization");
        if (auth.rfind("Bearer ", 0) == 0) key = auth.substr(7);
        if (key.empty()) key = req.get_header_value("x-api-key");
        if (!constant_time_equal(key, cfg.api_key)) {
          send_error(req, res, {401, key.empty() ? "missing API key (Authorization: Bearer <key> or x-api-key)"
                                                 : "invalid API key"});
          metrics.request_done(req.path, 401, 0);
          return httplib::Server::HandlerResponse::Handled;
        }
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });

    svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (res.status == 404) {
        for (const auto& [re, method] : known_routes()) {
          if (std::regex_match(req.path, re) && method != req.method) {
            send_error(req, res, {405, "method " + req.method + " is not allowed on " + req.path + " (use " + method + ")"});
            return;
          }
        }
        send_error(req, res, {404, "unknown route " + req.method + " " + req.path});
      } else if (res.status == 413) {
        send_error(req, res, {413, "request body too large"});
      } else {
        send_error(req, res, {res.status, "request failed"});
      }
    });
    svr.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      LARDER_LOG_ERROR("[http] %s %s: %s", req.method.c_str(), req.path.c_str(), what.c_str());
      send_error(req, res, {500, what});
    });

    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const int s = state.load();
      if (s == kReady) return send_json(res, 200, {{"status", "ok"}});
      res.set_header("Retry-After", "1");
      send_json(res, 503, {{"status", s == kLoading ? "loading" : "draining"}});
    });
    auto gate = [this](const httplib::Request& req, httplib::Response& res) {
      if (state.load() == kLoading || !sm.load()) {
        send_error(req, res, {503, "the model is loading"});
        return false;
      }
      return true;
    };
    svr.Post(R"(/(v1/)?chat/completions)", [this](const httplib::Request& q, httplib::Response& r) { generate(q, r, Surface::kChat); });
    svr.Post(R"(/(v1/)?completions)", [this](const httplib::Request& q, httplib::Response& r) { generate(q, r, Surface::kCompletions); });
    svr.Post("/v1/messages", [this](const httplib::Request& q, httplib::Response& r) { generate(q, r, Surface::kMessages); });
    svr.Post("/v1/messages/count_tokens", [this, gate](const httplib::Request& req, httplib::Response& res) {
      if (!gate(req, res)) return;
      ordered_json body = ordered_json::parse(req.body, nullptr, false);
      if (body.is_discarded()) return send_error(req, res, {400, "invalid JSON body"});
      ServedModel unlimited = *sm.load();
      unlimited.ctx = INT64_MAX;
      try {
        ParsedRequest pr = parse_messages(unlimited, body);
        send_json(res, 200, {{"input_tokens", pr.gen.prompt.size()}});
      } catch (const ApiError& e) {
        send_error(req, res, e);
      }
    });
    auto model_object = [](const ServedModel& m) {
      const auto& info = m.m->model->info();
      return ordered_json{{"id", m.id}, {"object", "model"}, {"created", 0}, {"owned_by", "larder"},
                          {"context_window", m.ctx}, {"quantization", info.weight_dtypes}};
    };
    svr.Get(R"(/(v1/)?models)", [this, gate, model_object](const httplib::Request& req, httplib::Response& res) {
      if (!gate(req, res)) return;
      send_json(res, 200, {{"object", "list"}, {"data", ordered_json::array({model_object(*sm.load())})}});
    });
    svr.Get(R"(/(v1/)?models/(.+))", [this, gate, model_object](const httplib::Request& req, httplib::Response& res) {
      if (!gate(req, res)) return;
      const std::string id = req.matches[2];
      if (id != sm.load()->id) return send_error(req, res, {404, "model '" + id + "' is not served here", "model", "model_not_found"});
      send_json(res, 200, model_object(*sm.load()));
    });
    svr.Post("/tokenize", [this, gate](const httplib::Request& req, httplib::Response& res) {
      if (!gate(req, res)) return;
      ordered_json b = ordered_json::parse(req.body, nullptr, false);
      if (b.is_discarded() || !b.is_object()) return send_error(req, res, {400, "invalid JSON body"});
      if (!b.contains("content") || !b["content"].is_string()) return send_error(req, res, {400, "content must be a string", "content"});
      bool add_special = false;
      if (b.contains("add_special")) {
        if (!b["add_special"].is_boolean()) return send_error(req, res, {400, "add_special must be of type bool", "add_special"});
        add_special = b["add_special"].get<bool>();
      }
      const auto ids = sm.load()->m->tokenizer->encode(b["content"].get<std::string>(), add_special);
      send_json(res, 200, {{"tokens", ids}});
    });
    svr.Post("/detokenize", [this, gate](const httplib::Request& req, httplib::Response& res) {
      if (!gate(req, res)) return;
      ordered_json b = ordered_json::parse(req.body, nullptr, false);
      if (b.is_discarded() || !b.is_object()) return send_error(req, res, {400, "invalid JSON body"});
      if (!b.contains("tokens") || !b["tokens"].is_array()) return send_error(req, res, {400, "tokens must be an array of ints", "tokens"});
      const int64_t V = sm.load()->m->model->info().vocab;
      std::vector<int32_t> ids;
      for (const auto& t : b["tokens"]) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= V)
          return send_error(req, res, {400, strfmt("tokens must be ints in [0, %lld)", (long long)V), "tokens"});
        ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
      send_json(res, 200, {{"content", sm.load()->m->tokenizer->decode(ids, /*skip_special=*/false)}});
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      Engine* e = engine.load();
      std::string text = metrics.prometheus(e ? e->queue_depth() : 0, e ? e->active() : 0);
      if (e) {
        const nlohmann::json kv = e->with_store([](memory::KvStore& s) { return nlohmann::json(memory::stats_prometheus(s.stats())); });
        if (kv.is_string()) text += kv.get<std::string>();
      }
      res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
    });
    svr.Get("/stats", [this, gate](const httplib::Request& req, httplib::Response& res) {
      if (!gate(req, res)) return;
      Engine* e = engine.load();
      const ServedModel& m = *sm.load();
      nlohmann::json j;
      j["model"] = {{"id", m.id}, {"path", m.m->files.path}, {"architecture", m.m->model->info().architecture},
                    {"weights", m.m->model->info().weight_dtypes}, {"isa", cpu_features().describe()}};
      j["server"] = {{"context", m.ctx}, {"parallel", e->config().parallel}, {"queue_max", e->config().queue_max},
                     {"queue_depth", e->queue_depth()}, {"active", e->active()},
                     {"resident_bytes", process_resident_bytes()}};
      j["requests"] = metrics.json();
      j["kv_store"] = e->with_store([](memory::KvStore& s) { return memory::stats_json(s.stats()); });
      res.set_content(j.dump(), "application/json");
    });
    svr.Get("/v1", [](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200, {{"routes", {"POST /v1/chat/completions", "POST /v1/completions", "POST /v1/messages",
                                       "POST /v1/messages/count_tokens", "GET /v1/models", "GET /health", "GET /metrics",
                                       "GET /stats", "POST /tokenize", "POST /detokenize", "POST /admin/kv/flush",
                                       "POST /admin/kv/clear"}}});
    });
    svr.Post("/admin/kv/flush", [this, gate](const httplib::Request& req, httplib::Response& res) {
      if (!gate(req, res)) return;
      const nlohmann::json r = engine.load()->with_store([](memory::KvStore& s) {
        const memory::FlushReport f = s.flush();
        return nlohmann::json{{"durable", f.durable}, {"ssd_enabled", f.ssd_enabled}, {"written", f.written},
                              {"already", f.already}, {"failed", f.failed}, {"dropped", f.dropped},
                              {"missing", f.missing}, {"not_written", f.not_written}};
      });
      res.status = r.value("durable", false) || !r.value("ssd_enabled", false) ? 200 : 503;
      res.set_content(r.dump(), "application/json");
    });
    svr.Post("/admin/kv/clear", [this, gate](const httplib::Request& req, httplib::Response& res) {
      if (!gate(req, res)) return;
      const bool ssd = req.get_param_value("tier") == "ssd";
      engine.load()->with_store([ssd](memory::KvStore& s) {
        s.clear(ssd);
        return nlohmann::json();
      });
      send_json(res, 200, {{"cleared", ssd ? "ram+ssd" : "ram"}});
    });
  }
};

HttpServer::HttpServer(HttpConfig cfg, Metrics& metrics) : impl_(std::make_unique<Impl>(cfg, metrics)), cfg_(cfg) {
  impl_->install();
}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::bind() {
  if (cfg_.port == 0) {
    const int p = impl_->svr.bind_to_any_port(cfg_.host);
    if (p <= 0) return io_error(strfmt("[serve] cannot bind %s (any port)", cfg_.host.c_str()));
    cfg_.port = p;
  } else if (!impl_->svr.bind_to_port(cfg_.host, cfg_.port)) {
    return io_error(strfmt("[serve] cannot listen on %s:%d (port in use, or the address is not local); pick another "
                           "with --port",
                           cfg_.host.c_str(), cfg_.port));
  }
  // cpp-httplib listens with a backlog of 5 (compiled into Debian's library): 16 clients
  // connecting at once while the accept thread is starved overflowed it and got connection
  // resets. Listening again on a listening socket only resizes its backlog (Linux).
  if (impl_->listen_fd != INVALID_SOCKET) ::listen(impl_->listen_fd, SOMAXCONN);
  return Status::ok();
}

void HttpServer::serve() { impl_->svr.listen_after_bind(); }
void HttpServer::stop() {
  if (impl_) impl_->svr.stop();
}

void HttpServer::set_ready(const ServedModel* sm, Engine* engine) {
  impl_->sm.store(sm);
  impl_->engine.store(engine);
  impl_->state.store(kReady);
}

void HttpServer::set_draining() { impl_->state.store(kDraining); }

}  // namespace larder::server
