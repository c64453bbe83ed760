#include "larder/server/http_server.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <initializer_list>
#include <optional>
#include <mutex>

#include "larder/core/cpuid.h"
#include "larder/core/log.h"
#include "larder/memory/store/remote_tier.h"
#include "larder/server/response_writer.h"
#include "larder/server/api_constraints.h"
#include "larder/server/api_fields.h"
#include "larder/server/api_native.h"
#include "larder/server/api_ollama.h"
#include "larder/server/routes.h"
#include "larder/server/transport.h"
#include "larder/server/webui.h"

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

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool is_loopback_bind(const std::string& host) { return host == "127.0.0.1" || host == "localhost" || host == "::1"; }
bool is_loopback_name(const std::string& h) { return h == "localhost" || h == "127.0.0.1" || h == "[::1]"; }

// "host[:port]" → lower-case host (IPv6 keeps its brackets) and port ("" when absent).
void split_host_port(const std::string& hp, std::string* host, std::string* port) {
  std::string h = hp, p;
  if (!h.empty() && h[0] == '[') {
    const size_t close = h.find(']');
    if (close != std::string::npos) {
      if (close + 1 < h.size() && h[close + 1] == ':') p = h.substr(close + 2);
      h = h.substr(0, close + 1);
    }
  } else if (const size_t c = h.rfind(':'); c != std::string::npos && h.find(':') == c) {
    p = h.substr(c + 1);
    h = h.substr(0, c);
  }
  *host = lower(h);
  *port = p;
}

// A browser origin "scheme://host[:port]", parsed; invalid for "null" and anything else.
struct Origin {
  bool valid = false;
  std::string scheme, host, port;
};

Origin parse_origin(const std::string& s) {
  Origin o;
  const size_t sep = s.find("://");
  if (sep == std::string::npos) return o;
  o.scheme = lower(s.substr(0, sep));
  const std::string rest = s.substr(sep + 3);
  if (rest.empty() || rest.find('/') != std::string::npos) return o;
  split_host_port(rest, &o.host, &o.port);
  if (o.port.empty()) o.port = o.scheme == "https" ? "443" : o.scheme == "http" ? "80" : "";
  o.valid = !o.host.empty() && (o.scheme == "http" || o.scheme == "https");
  return o;
}

// One --cors entry. Forms: "*", "localhost", "scheme://host[:port|:*]", "scheme://*.domain[:port|:*]".
bool pattern_matches(const std::string& pat, const Origin& o) {
  if (!o.valid) return false;
  if (pat == "*") return true;
  if (pat == "localhost") return is_loopback_name(o.host);
  const Origin p = parse_origin(pat);
  if (!p.valid || p.scheme != o.scheme) return false;
  const std::string raw_port = pat.substr(pat.find("://") + 3);
  const bool any_port = raw_port.size() >= 2 && raw_port.compare(raw_port.size() - 2, 2, ":*") == 0;
  std::string phost = p.host;
  if (any_port) {
    std::string unused;
    split_host_port(raw_port.substr(0, raw_port.size() - 2), &phost, &unused);
  } else if (p.port != o.port) {
    return false;
  }
  if (phost.rfind("*.", 0) == 0) {  // subdomains of the domain, label boundary enforced
    const std::string dom = phost.substr(1);  // ".domain"
    return o.host.size() > dom.size() && o.host.compare(o.host.size() - dom.size(), dom.size(), dom) == 0;
  }
  return phost == o.host;
}

// x-request-id is echoed only when it is a short run of visible ASCII (no space, no control or
// non-ASCII bytes); anything else gets the generated id instead.
std::string response_request_id(const HttpRequest& req, const std::string& generated) {
  if (!req.has_header("x-request-id")) return generated;
  const std::string v = req.header("x-request-id");
  if (v.empty() || v.size() > 128) return generated;
  for (unsigned char c : v)
    if (c <= 0x20 || c >= 0x7f) return generated;
  return v;
}

// A header list a browser preflight asks for (Access-Control-Request-Headers): tokens separated
// by commas and blanks, echoed back only in that form.
bool is_header_list(const std::string& v) {
  for (unsigned char c : v)
    if (!(std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == ',' || c == ' ' || c == '\t')) return false;
  return true;
}

bool anthropic_route(const std::string& path) { return path.rfind("/v1/messages", 0) == 0; }
bool ollama_route(const std::string& path) { return path.rfind("/api/", 0) == 0; }

void send_json(HttpResponse& res, int status, const ordered_json& j) {
  res.status = status;
  res.set_content(j.dump(-1, ' ', false, ordered_json::error_handler_t::replace), "application/json");
}

void send_error(const HttpRequest& req, HttpResponse& res, const ApiError& e) {
  if ((e.status == 429 || e.status == 503) && !res.has_header("Retry-After")) res.set_header("Retry-After", "1");
  send_json(res, e.status, anthropic_route(req.path) ? anthropic_error_body(e)
                           : ollama_route(req.path)  ? ordered_json{{"error", public_error_message(e.message)}}  // Ollama's shape
                                                     : openai_error_body(e));
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (int k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    i += n;
  }
  return true;
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

std::string utc_timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const long ms = static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return strfmt("%s.%03ldZ", buf, ms);
}

}  // namespace

// One request's log line, filled in as the request goes (the generation route finishes it when
// its stream ends).
struct LogEntry : std::enable_shared_from_this<LogEntry> {
  std::string method, path, route, ip, request_id, error;
  int status = 0;
  bool has_outcome = false;
  Outcome outcome;
  Clock::time_point t0 = Clock::now();
};

Status check_cors_patterns(const std::vector<std::string>& patterns) {
  for (const std::string& p : patterns) {
    if (p == "*" || p == "localhost") continue;
    const Origin o = parse_origin(p);
    const std::string rest = p.find("://") == std::string::npos ? "" : p.substr(p.find("://") + 3);
    const std::string host_part = rest.size() >= 2 && rest.compare(rest.size() - 2, 2, ":*") == 0 ? rest.substr(0, rest.size() - 2) : rest;
    const size_t star = host_part.find('*');
    const bool star_ok = star == std::string::npos || (star == 0 && host_part.size() > 2 && host_part[1] == '.' &&
                                                       host_part.find('*', 1) == std::string::npos);
    if (!o.valid && !(star_ok && star == 0)) {
      return invalid_argument(strfmt("[serve] --cors '%s' is not an origin: use scheme://host[:port], "
                                     "scheme://host:* (any port), scheme://*.domain (subdomains), localhost or *",
                                     p.c_str()));
    }
    if (!star_ok) {
      return invalid_argument(strfmt("[serve] --cors '%s': '*' is allowed only as the port (':*') or as the first "
                                     "label ('*.example.com'); a prefix pattern would also match other domains",
                                     p.c_str()));
    }
  }
  return Status::ok();
}

struct HttpServer::Impl {
  HttpConfig cfg;
  Metrics& metrics;
  std::unique_ptr<Transport> transport;
  std::atomic<int> state{kLoading};
  std::atomic<const ServedModel*> sm{nullptr};
  std::atomic<Engine*> engine{nullptr};
  std::mutex log_mu;

  Impl(HttpConfig c, Metrics& m) : cfg(std::move(c)), metrics(m) {}

  // -- one log line per request
  void emit(const LogEntry& e) {
    if (e.path == "/health" && e.status == 200 && log_level() < LogLevel::kDebug) return;
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - e.t0).count();
    std::string line;
    if (cfg.log_json) {
      nlohmann::json j = {{"ts", utc_timestamp()}, {"method", e.method}, {"path", e.path}, {"status", e.status},
                          {"ip", e.ip}, {"ms", std::round(ms * 10) / 10}};
      if (!e.request_id.empty()) j["id"] = e.request_id;
      if (e.has_outcome) {
        const Outcome& o = e.outcome;
        j["prompt_tokens"] = o.prompt_tokens;
        j["cached_tokens"] = o.cached_tokens;
        j["completion_tokens"] = o.completion_tokens;
        j["queue_ms"] = std::round(o.queue_ms);
        j["ttft_ms"] = std::round(o.ttft_ms);
        j["cache"] = o.cache_tier;
        j["cache_reason"] = o.cache_reason;
        j["finish"] = finish_name(o.finish);
        if (o.speculative) {
          j["drafted_tokens"] = o.drafted_tokens;
          j["accepted_tokens"] = o.accepted_tokens;
        }
      }
      if (!e.error.empty()) j["error"] = e.error;
      // ASCII only: C1 controls (a terminal's CSI) and invalid bytes become \u escapes too.
      line = j.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
    } else {
      // Every field that may hold client bytes is escaped (core/log.h), so a path with %0d%0a or
      // an ESC cannot forge a line or drive a terminal; the space-separated fields escape spaces
      // and the quoted error its quotes, so none can pose as another field.
      line = strfmt("%s %s %s %d %.0fms", utc_timestamp().c_str(), log_escape(e.method, " ").c_str(),
                    log_escape(e.path, " ").c_str(), e.status, ms);
      if (!e.request_id.empty()) line += " id=" + log_escape(e.request_id, " ");
      if (e.has_outcome) {
        const Outcome& o = e.outcome;
        line += strfmt(" prompt=%lld cached=%lld completion=%lld queue=%.0fms ttft=%.0fms decode=%.1ftok/s cache=%s(%s) finish=%s",
                       (long long)o.prompt_tokens, (long long)o.cached_tokens, (long long)o.completion_tokens, o.queue_ms,
                       o.ttft_ms,
                       o.decode_ms > 0 && o.completion_tokens > 1 ? (o.completion_tokens - 1) / (o.decode_ms / 1e3) : 0.0,
                       log_escape(o.cache_tier).c_str(), log_escape(o.cache_reason).c_str(), finish_name(o.finish));
        if (o.speculative) line += strfmt(" spec=%lld/%lld", (long long)o.accepted_tokens, (long long)o.drafted_tokens);
      }
      if (!e.error.empty()) line += " error=\"" + log_escape(e.error, "\"") + "\"";
      line = "larder: " + line;
    }
    line += "\n";
    std::lock_guard<std::mutex> l(log_mu);
    std::fwrite(line.data(), 1, line.size(), stderr);
  }

  std::optional<ApiError> parse_body(const HttpRequest& req, ordered_json& out) {
    const int depth = json_nesting_depth(req.body, kMaxJsonDepth);
    if (depth > kMaxJsonDepth)
      return ApiError{400, strfmt("the JSON body nests deeper than %d levels", kMaxJsonDepth)};
    if (parse_json_linear(req.body, kMaxJsonDepth, &out)) return ApiError{400, "invalid JSON body"};
    return std::nullopt;
  }

  // Several choices (n > 1, or a list of prompts): every choice is its own engine request, all
  // submitted at once so they share batches. Non-stream, the body merges their choices; a stream
  // interleaves each choice's chunks (their own index) as they come, then one usage chunk
  // (include_usage) and one [DONE]. llama-server's /completion (native): a JSON array of the
  // results, or their interleaved events with nothing after them.
  void generate_many(const HttpRequest& req, HttpResponse& res, LogEntry& lg, Surface surface,
                     std::shared_ptr<ParsedRequest> pr, const std::string& route, Clock::time_point t0, bool native) {
    const ServedModel* m = sm.load();
    Engine* eng = engine.load();
    std::vector<GenRequest> gens = {pr->gen};
    gens.insert(gens.end(), pr->more.begin(), pr->more.end());
    auto chans = std::make_shared<std::vector<std::shared_ptr<Channel>>>();
    for (const GenRequest& g : gens) {
      auto submitted = eng->submit(g);
      if (!submitted.is_ok()) {
        for (auto& c : *chans) c->cancel();
        const int status = submitted.status().code() == StatusCode::kResourceExhausted ? 429 : 503;
        const ApiError e{status, submitted.status().message() + strfmt(" (this request needs %zu slots)", gens.size())};
        send_error(req, res, e);
        lg.error = e.message;
        metrics.request_done(route, e.status, std::chrono::duration<double>(Clock::now() - t0).count());
        return;
      }
      chans->push_back(*submitted);
    }
    auto writers = std::make_shared<std::vector<std::unique_ptr<ResponseWriter>>>();
    const bool stream = pr->stream;
    for (size_t i = 0; i < gens.size(); ++i) {
      writers->push_back(native ? make_native_writer(*m, *pr) : make_response_writer(*m, *pr, surface));
      writers->back()->set_index(static_cast<int>(i));
      if (stream) writers->back()->set_part_of_many();
    }
    lg.request_id = pr->response_id;
    res.set_header("x-request-id", response_request_id(req, pr->response_id));
    if (stream) {
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");
    }
    res.status = 200;
    res.content_type = stream ? "text/event-stream" : "application/json";
    auto log = lg.shared_from_this();
    res.provider = [this, chans, writers, pr, route, t0, log, stream, native](BodySink& sink) {
      std::vector<bool> done(chans->size(), false);
      size_t left = chans->size();
      auto last_write = Clock::now();
      auto cancel_all = [&] {
        for (auto& c : *chans) c->cancel();
        log->status = 499;
        log->error = "client disconnected";
        metrics.request_done(route, 499, std::chrono::duration<double>(Clock::now() - t0).count());
      };
      while (left > 0) {
        bool any = false;
        for (size_t i = 0; i < chans->size(); ++i) {
          if (done[i]) continue;
          while (auto ev = (*chans)[i]->pop(std::chrono::milliseconds(any ? 0 : 20))) {
            any = true;
            if (ev->held) continue;
            if (stream) {
              const std::string frames = (*writers)[i]->stream_frames(*ev);
              if (!frames.empty()) {
                if (!sink.write(frames.data(), frames.size())) {
                  cancel_all();
                  return false;
                }
                last_write = Clock::now();
              }
            } else {
              (*writers)[i]->add(*ev);
            }
            if (ev->done) {
              done[i] = true;
              --left;
              break;
            }
          }
        }
        if (Clock::now() - last_write > std::chrono::milliseconds(250)) {  // heartbeat + disconnect probe
          const std::string beat = stream ? ": keep-alive\n\n" : " ";
          if (!sink.is_writable() || !sink.write(beat.data(), beat.size())) {
            cancel_all();
            return false;
          }
          last_write = Clock::now();
        }
      }
      ordered_json b = native && !stream ? ordered_json::array({(*writers)[0]->body()}) : (*writers)[0]->body();
      Outcome total = (*writers)[0]->outcome();
      std::string error;
      for (size_t i = 0; i < writers->size(); ++i) {
        const Outcome& o = (*writers)[i]->outcome();
        if (o.finish == Finish::kError || o.finish == Finish::kCancelled) error = o.error.empty() ? "generation failed" : o.error;
        if (i == 0) continue;
        if (native) {
          if (!stream) b.push_back((*writers)[i]->body());  // each result carries its own error
        } else {
          b["choices"].push_back((*writers)[i]->body()["choices"][0]);
        }
        total.prompt_tokens += o.prompt_tokens;
        total.cached_tokens += o.cached_tokens;
        total.completion_tokens += o.completion_tokens;
      }
      // Each streamed choice already sent its finish chunk (or its error event): what is left is
      // the summed usage and the one [DONE]. Non-stream: the merged body, or the error.
      std::string text;
      if (native) {
        if (!stream) text = b.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
      } else if (stream) {
        text = pr->include_usage && error.empty() ? (*writers)[0]->usage_frame(total) : std::string();
        text += "data: [DONE]\n\n";
      } else {
        if (!error.empty()) {
          b = openai_error_body({500, error});
        } else {
          b["usage"]["prompt_tokens"] = total.prompt_tokens;
          b["usage"]["completion_tokens"] = total.completion_tokens;
          b["usage"]["total_tokens"] = total.prompt_tokens + total.completion_tokens;
          b["usage"]["prompt_tokens_details"]["cached_tokens"] = total.cached_tokens;
        }
        text = b.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
      }
      if (!text.empty() && !sink.write(text.data(), text.size())) {
        cancel_all();
        return false;
      }
      const int status = error.empty() ? 200 : 500;
      metrics.request_done(route, status, std::chrono::duration<double>(Clock::now() - t0).count());
      log->status = status;
      log->outcome = total;
      log->has_outcome = true;
      if (!error.empty()) log->error = error;
      sink.done();
      return true;
    };
    res.on_finish = [chans](bool ok) {
      if (!ok)
        for (auto& c : *chans) c->cancel();
    };
  }

  // kNative: llama-server's POST /completion and /completions (request parsed as
  // /v1/completions plus its own fields, answered in its own shape, api_native.h); kOllama*:
  // Ollama's /api/chat and /api/generate (api_ollama.h).
  enum class Shape { kApi, kNative, kOllamaChat, kOllamaGenerate };
  void generate(const HttpRequest& req, HttpResponse& res, LogEntry& lg, Surface surface, Shape shape = Shape::kApi) {
    const auto t0 = Clock::now();
    const bool native = shape == Shape::kNative;
    const bool ollama = shape == Shape::kOllamaChat || shape == Shape::kOllamaGenerate;
    const OllamaKind okind = shape == Shape::kOllamaChat ? OllamaKind::kChat : OllamaKind::kGenerate;
    const std::string route = native ? "/completion"
                              : shape == Shape::kOllamaChat ? "/api/chat"
                              : shape == Shape::kOllamaGenerate ? "/api/generate"
                              : surface == Surface::kChat ? "/v1/chat/completions"
                              : surface == Surface::kCompletions ? "/v1/completions" : "/v1/messages";
    lg.route = route;
    const ServedModel* m = sm.load();
    Engine* eng = engine.load();
    auto fail = [&](const ApiError& e) {
      send_error(req, res, e);
      lg.error = e.message;
      metrics.request_done(route, e.status, std::chrono::duration<double>(Clock::now() - t0).count());
    };
    if (state.load() != kReady || !m || !eng) {
      return fail({503, state.load() == kDraining ? "the server is shutting down" : "the model is loading"});
    }
    ordered_json body;
    if (auto e = parse_body(req, body)) return fail(*e);
    auto pr = std::make_shared<ParsedRequest>();
    try {
      // A grammar compile during the parse stops being waited for when the client leaves or the
      // server drains (api_constraints.h).
      constraints::AbandonScope abandon({req.client_gone, [this] { return state.load() == kDraining; }});
      if (ollama) {
        if (auto loaded = ollama_load_only(*m, body, okind)) return send_json(res, 200, *loaded);
        *pr = okind == OllamaKind::kChat ? parse_ollama_chat(*m, body) : parse_ollama_generate(*m, body);
      } else {
        *pr = surface == Surface::kChat ? parse_chat(*m, body)
              : surface == Surface::kCompletions ? (native ? parse_native_completion(*m, body) : parse_completion(*m, body))
                                                 : parse_messages(*m, body);
      }
    } catch (const ApiError& e) {
      return fail(e);
    } catch (const std::exception& e) {  // e.g. a JSON type error deep in a template value
      return fail({400, std::string("invalid request: ") + e.what()});
    }
    if (!pr->more.empty()) return generate_many(req, res, lg, surface, pr, route, t0, native);
    auto submitted = eng->submit(pr->gen);
    if (!submitted.is_ok()) {
      const int status = submitted.status().code() == StatusCode::kResourceExhausted ? 429 : 503;
      return fail({status, submitted.status().message()});
    }
    std::shared_ptr<Channel> ch = *submitted;
    std::shared_ptr<ResponseWriter> writer = native ? make_native_writer(*m, *pr) : make_response_writer(*m, *pr, surface);
    auto owriter = ollama ? std::make_shared<OllamaWriter>(*m, *pr, okind) : nullptr;
    // Wait briefly for admission so the KV store's verdict can travel as a header
    // (x-larder-cache, kv-store.md §11.6). A request that has to queue longer gets its headers
    // without it (usage.larder.cache carries the same report) — its connection must be watched
    // for a disconnect, which only the content provider below can do.
    auto first = std::make_shared<std::optional<Event>>(ch->pop(std::chrono::milliseconds(250)));
    // Held for memory (engine.h, memory admission): wait for admission or the refusal before any
    // header goes out, so a refusal is a real 503 with Retry-After. The engine bounds the wait
    // (--admit-wait). A client that leaves meanwhile gives its queue place back at once: the
    // connection is watched while the request is held, and a cancelled request leaves the queue
    // (Engine::drop_cancelled; the engine never runs it) instead of being admitted for nobody.
    while (*first && (*first)->held) {
      const auto until = Clock::now() + eng->config().admit_wait + std::chrono::seconds(5);
      std::optional<Event> next;
      while (!(next = ch->pop(std::chrono::milliseconds(100))) && Clock::now() < until) {
        if (req.client_gone && req.client_gone()) {
          ch->cancel();
          return fail({499, "the client disconnected while its request waited for memory"});
        }
      }
      *first = std::move(next);
    }
    if (*first && (*first)->done && (*first)->refuse_status) {
      res.set_header("Retry-After", std::to_string((*first)->retry_after_s));
      return fail({(*first)->refuse_status, (*first)->outcome.error});
    }
    if (*first && (*first)->admitted) {
      const Outcome& o = (*first)->outcome;
      res.set_header("x-larder-cache", strfmt("tier=%s; reused=%lld; reason=%s", o.cache_tier.c_str(),
                                              (long long)o.cached_tokens, o.cache_reason.c_str()));
    }
    lg.request_id = pr->response_id;
    res.set_header("x-request-id", response_request_id(req, pr->response_id));
    // Which template rendered the chat, so a client can tell a ChatML guess from the model's own.
    if (surface != Surface::kCompletions) res.set_header("X-Larder-Chat-Template", m->m->template_choice.header_value());
    for (const std::string& w : pr->warnings) res.set_header("Warning", "299 larder \"" + w + "\"");
    if (pr->stream) {
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");
    }
    const bool stream = pr->stream;
    res.status = 200;
    res.content_type = stream ? (ollama ? "application/x-ndjson" : "text/event-stream") : "application/json";
    auto log = lg.shared_from_this();
    const auto flush_every = std::chrono::milliseconds(cfg.stream_flush_ms);
    res.provider = [this, ch, writer, owriter, pr, stream, route, t0, first, log, m, native, ollama,
                    flush_every](BodySink& sink) {
          auto last_write = Clock::now();
          auto write = [&](const std::string& s) {
            if (s.empty()) return true;
            last_write = Clock::now();
            return sink.write(s.data(), s.size());
          };
          auto disconnected = [&] {
            ch->cancel();
            metrics.request_done(route, 499, std::chrono::duration<double>(Clock::now() - t0).count());
            log->status = 499;
            log->error = "client disconnected";
            return false;
          };
          std::string frames;  // what this pass writes, in one send
          // One event's share of the response: frames for a stream, the body's parts otherwise.
          auto take = [&](const Event& e) {
            if (ollama) {
              if (stream) frames += owriter->stream_frames(e);
              else owriter->add(e);
            } else if (stream) {
              frames += writer->stream_frames(e);
            } else {
              writer->add(e);
            }
          };
          for (;;) {
            std::optional<Event> ev;
            if (*first) {
              ev = std::move(*first);
              first->reset();
            } else {
              ev = ch->pop(std::chrono::milliseconds(100));
            }
            if (ev && ev->held) continue;  // waited for memory after the headers went out: nothing to say
            // Probe the connection whenever nothing was written for a while (queued, a long
            // prefill, or a non-stream body that writes nothing until the end): a closed peer
            // makes the second write fail, so a heartbeat every kProbe finds a vanished client
            // within about 2·kProbe. Streams send an SSE comment, non-stream bodies
            // JSON-insignificant leading whitespace (NDJSON streams too: the spaces lead the next
            // line); clients ignore both. 250 ms, not 1 s: a
            // small model generates a long answer in about a second, and a client that left must
            // free its slot before that, not be noticed only when the answer is complete.
            constexpr auto kProbe = std::chrono::milliseconds(250);
            if (!ev || Clock::now() - last_write > kProbe) {
              if (!sink.is_writable() ||
                  (Clock::now() - last_write > kProbe && !write(stream && !ollama ? ": keep-alive\n\n" : " "))) {
                return disconnected();
              }
              if (!ev) continue;
            }
            // Everything queued behind this event goes out in the same write.
            bool tokens = !ev->tokens.empty();
            take(*ev);
            while (!ev->done) {
              std::optional<Event> more = ch->try_pop();
              if (!more) break;
              if (more->held) continue;
              ev = std::move(more);
              tokens = tokens || !ev->tokens.empty();
              take(*ev);
            }
            if (!write(frames)) return disconnected();
            frames.clear();
            if (!ev->done) {
              // Pace the next pass: tokens that arrive meanwhile wait for it instead of waking
              // this thread one by one. A body that is not streamed waits for its end (or the
              // next probe). The first token after the prompt is never held back: the wait
              // follows only a pass that carried tokens.
              if (!stream) ch->wait_urgent(Clock::now() + kProbe);
              else if (tokens && flush_every.count() > 0) ch->wait_urgent(Clock::now() + flush_every);
              continue;
            }
            const Outcome& o = ev->outcome;
            if (!stream) {
              ordered_json b;
              if (native) {
                b = writer->body();  // an error travels inside llama-server's object
              } else if (ollama) {
                b = owriter->body();
              } else if (o.finish == Finish::kError || o.finish == Finish::kCancelled) {
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
            log->status = status;
            log->outcome = o;
            log->has_outcome = true;
            if (o.finish == Finish::kError || o.finish == Finish::kCancelled) log->error = o.error.empty() ? "generation failed" : o.error;
            sink.done();
            return true;
          }
        };
    res.on_finish = [ch](bool success) {
      if (!success) ch->cancel();
    };
  }

  // -- request policy: everything a request must pass before its route runs. Returns false
  // when it has answered.
  bool admit(const HttpRequest& req, HttpResponse& res, const Route* route, LogEntry& lg) {
    // Host: exactly one, compared case-insensitively (DNS-rebinding guard). A loopback server
    // answers loopback names and --allowed-hosts; other binds check only --allowed-hosts.
    if (req.header_count("host") > 1) {
      send_error(req, res, {400, "more than one Host header"});
      return false;
    }
    const bool check_host = is_loopback_bind(cfg.host) || !cfg.allowed_hosts.empty();
    if (check_host && req.has_header("host")) {
      std::string h, port;
      split_host_port(req.header("host"), &h, &port);
      bool ok = is_loopback_bind(cfg.host) && is_loopback_name(h);
      for (const std::string& a : cfg.allowed_hosts) ok = ok || lower(a) == h || a == "*";
      if (!ok) {
        send_error(req, res, {403, "Host '" + req.header("host") + "' is not allowed" +
                                       (is_loopback_bind(cfg.host) ? " for a loopback server" : "") + " (see --allowed-hosts)"});
        return false;
      }
    }
    // Origin: browsers send it on every cross-origin request and on same-origin POSTs. Only
    // origins allowed by --cors (or the server's own origin) get an answer; admin routes answer
    // no browser at all.
    if (req.has_header("origin")) {
      const std::string origin = req.header("origin");
      const Origin o = parse_origin(origin);
      std::string h, port;
      split_host_port(req.header("host"), &h, &port);
      if (port.empty()) port = "80";
      const bool same_origin = o.valid && o.host == h && o.port == port;
      if (route && route->admin) {
        send_error(req, res, {403, "admin routes do not answer browser requests (Origin: " + origin + ")"});
        return false;
      }
      bool allowed = false, any = false;
      for (const std::string& p : cfg.cors) {
        if (pattern_matches(p, o)) {
          allowed = true;
          any = any || p == "*";
        }
      }
      if (!allowed && !same_origin) {
        send_error(req, res, {403, "cross-origin request from '" + origin + "' is not allowed (see --cors)"});
        return false;
      }
      if (allowed) {
        // "*" answers with a literal * (no credentials, so no cookie ever rides along);
        // listed origins are echoed.
        res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
        res.set_header("Vary", "Origin");
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        std::string hdrs = "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, x-request-id";
        if (req.has_header("access-control-request-headers") && is_header_list(req.header("access-control-request-headers")))
          hdrs += ", " + req.header("access-control-request-headers");
        res.set_header("Access-Control-Allow-Headers", hdrs);
        res.set_header("Access-Control-Expose-Headers", "x-request-id, x-larder-cache, Warning, Retry-After");
        res.set_header("Access-Control-Max-Age", "600");
      }
    }
    if (req.method == "OPTIONS") {  // preflight: never needs a key; 200 as llama-server answers
      res.status = 200;
      res.set_header("Allow", "GET, POST, OPTIONS");
      res.content_type = "text/plain";
      return false;
    }
    // A POST body must be JSON: a browser's "simple" request (text/plain, form encodings) then
    // needs a preflight, which --cors decides.
    if (req.method == "POST" && !req.body.empty()) {
      std::string ct = lower(req.header("content-type"));
      ct = ct.substr(0, ct.find(';'));
      while (!ct.empty() && ct.back() == ' ') ct.pop_back();
      if (ct != "application/json") {
        send_error(req, res, {415, "Content-Type must be application/json (got '" + req.header("content-type") + "')"});
        return false;
      }
    }
    if (!cfg.api_key.empty() && !(route && route->id == RouteId::kHealth) && !serves_page(req, route)) {
      std::string key;
      const std::string auth = req.header("authorization");
      if (auth.rfind("Bearer ", 0) == 0) key = auth.substr(7);
      if (key.empty()) key = req.header("x-api-key");
      if (!constant_time_equal(key, cfg.api_key)) {
        send_error(req, res, {401, key.empty() ? "missing API key (Authorization: Bearer <key> or x-api-key)"
                                               : "invalid API key"});
        metrics.request_done(req.path, 401, 0);
        return false;
      }
    }
    (void)lg;
    return true;
  }

  // The chat page and its files are public like /health: they hold no model output, and the
  // page must load before it can ask for the key that its API calls then carry.
  bool serves_page(const HttpRequest& req, const Route* route) const {
    if (!cfg.webui || !route) return false;
    return route->id == RouteId::kWebAsset || (route->id == RouteId::kIndex && wants_html(req.header("accept")));
  }

  void send_asset(HttpResponse& res, std::string_view name) {
    const WebAsset* a = find_web_asset(name);
    if (!a) return send_json(res, 404, openai_error_body({404, "no such file of the chat page"}));
    for (const auto& [k, v] : web_security_headers()) res.set_header(k, v);
    res.set_content(std::string(a->body), std::string(a->content_type));
  }

  void handle(HttpRequest& req, HttpResponse& res) {
    auto lg = std::make_shared<LogEntry>();
    lg->method = req.method;
    lg->path = req.path;
    lg->ip = req.remote_ip;
    bool path_known = false;
    std::string capture;
    const Route* route = match_route(req.method, req.path, &path_known, &capture);
    if (admit(req, res, route, *lg)) {
      if (route) {
        req.matches = {capture};
        run(*route, req, res, *lg);
      } else if (path_known) {
        send_error(req, res, {405, "method " + req.method + " is not allowed on " + req.path});
      } else {
        send_error(req, res, {404, "unknown route " + req.method + " " + req.path + " (GET / lists the routes)"});
      }
    }
    if (lg->error.empty() && res.status >= 400 && !res.provider) {
      const ordered_json b = ordered_json::parse(res.body, nullptr, false);
      if (b.is_object() && b.contains("error") && b["error"].is_object()) lg->error = b["error"].value("message", "");
      if (b.is_object() && b.contains("error") && b["error"].is_string()) lg->error = b["error"].get<std::string>();
    }
    if (!res.provider) {
      lg->status = res.status;
      emit(*lg);
      return;
    }
    lg->status = res.status;
    auto inner = std::move(res.on_finish);
    res.on_finish = [this, lg, inner](bool ok) {
      if (inner) inner(ok);
      if (!ok && lg->status < 400) {
        lg->status = 499;
        if (lg->error.empty()) lg->error = "client disconnected";
      }
      emit(*lg);
    };
  }

  // Query parameters a route takes: any other, or one given twice, is a 400 naming it.
  static std::optional<ApiError> check_query(const HttpRequest& req, std::initializer_list<const char*> known) {
    std::vector<std::string> seen;
    for (const auto& [name, value] : req.params()) {
      bool ok = false;
      for (const char* k : known) ok = ok || name == k;
      if (!ok) {
        std::string list;
        for (const char* k : known) list += std::string(list.empty() ? "" : ", ") + k;
        return ApiError{400, "unknown query parameter '" + name + "' on " + req.path +
                                 (list.empty() ? " (it takes none)" : " (it takes " + list + ")"), name};
      }
      if (std::find(seen.begin(), seen.end(), name) != seen.end())
        return ApiError{400, "query parameter '" + name + "' is given more than once", name};
      seen.push_back(name);
    }
    return std::nullopt;
  }

  bool gate(const HttpRequest& req, HttpResponse& res) {
    if (state.load() == kLoading || !sm.load()) {
      send_error(req, res, {503, "the model is loading"});
      return false;
    }
    return true;
  }

  // The served model, or (with `lora`) one of its adapters as the model a request names.
  static ordered_json model_object(const ServedModel& m, const ServedLora* lora = nullptr) {
    const auto& info = m.m->model->info();
    ordered_json o{{"id", lora ? lora->name : m.id}, {"object", "model"}, {"created", 0}, {"owned_by", "larder"},
                   {"context_window", m.ctx}, {"quantization", info.weight_dtypes}};
    if (lora) {
      o["parent"] = m.id;
      o["lora"] = {{"path", lora->path}, {"scale", lora->scale}};
    }
    return o;
  }

  void run(const Route& route, const HttpRequest& req, HttpResponse& res, LogEntry& lg) {
    switch (route.id) {
      case RouteId::kChat: return generate(req, res, lg, Surface::kChat);
      case RouteId::kCompletions: return generate(req, res, lg, Surface::kCompletions);
      case RouteId::kMessages: return generate(req, res, lg, Surface::kMessages);
      case RouteId::kNativeCompletion: return generate(req, res, lg, Surface::kCompletions, Shape::kNative);
      case RouteId::kOllamaChat: return generate(req, res, lg, Surface::kChat, Shape::kOllamaChat);
      case RouteId::kOllamaGenerate: return generate(req, res, lg, Surface::kChat, Shape::kOllamaGenerate);
      case RouteId::kOllamaTags:
        if (!gate(req, res)) return;
        return send_json(res, 200, ollama_tags(*sm.load()));
      case RouteId::kOllamaPs:
        if (!gate(req, res)) return;
        return send_json(res, 200, ollama_ps(*sm.load()));
      case RouteId::kOllamaVersion: return send_json(res, 200, ollama_version());
      case RouteId::kOllamaShow: {
        if (!gate(req, res)) return;
        ordered_json body;
        if (auto e = parse_body(req, body)) return send_error(req, res, *e);
        try {
          return send_json(res, 200, ollama_show(*sm.load(), body));
        } catch (const ApiError& e) {
          return send_error(req, res, e);
        }
      }
      case RouteId::kOllamaEmbed:
        return send_error(req, res, {501, "embeddings are not supported by larder yet: it serves text generation only"});
      case RouteId::kOllamaPull:
        return send_error(req, res, {501, "larder serve does not download models: run `larder pull REPO[:QUANT]` "
                                          "(from the Hugging Face Hub), then start larder serve with that model"});
      case RouteId::kCountTokens: {
        if (!gate(req, res)) return;
        ordered_json body;
        if (auto e = parse_body(req, body)) return send_error(req, res, *e);
        try {
          ParsedRequest pr = parse_messages(*sm.load(), body, /*count_only=*/true);
          return send_json(res, 200, {{"input_tokens", pr.gen.prompt.size()}});
        } catch (const ApiError& e) {
          return send_error(req, res, e);
        } catch (const std::exception& e) {
          return send_error(req, res, {400, std::string("invalid request: ") + e.what()});
        }
      }
      case RouteId::kApplyTemplate: {
        if (!gate(req, res)) return;
        ordered_json body;
        if (auto e = parse_body(req, body)) return send_error(req, res, *e);
        if (!body.is_object() || !body.contains("messages") || !body["messages"].is_array())
          return send_error(req, res, {400, "messages must be an array", "messages"});
        try {
          const std::string prompt = render_chat_prompt(*sm.load(), body);
          res.set_header("X-Larder-Chat-Template", sm.load()->m->template_choice.header_value());
          return send_json(res, 200, {{"prompt", prompt}});
        } catch (const ApiError& e) {
          return send_error(req, res, e);
        }
      }
      case RouteId::kProps: {
        if (!gate(req, res)) return;
        const ServedModel& m = *sm.load();
        Engine* e = engine.load();
        ordered_json defaults = {{"n_predict", m.defaults.max_tokens ? ordered_json(*m.defaults.max_tokens) : ordered_json(-1)},
                                 {"temperature", m.defaults.temperature.value_or(0.7f)},
                                 {"top_p", m.defaults.top_p.value_or(1.0f)},
                                 {"top_k", m.defaults.top_k.value_or(0)},
                                 {"min_p", m.defaults.min_p.value_or(0.0f)},
                                 {"seed", m.defaults.seed ? ordered_json(*m.defaults.seed) : ordered_json(-1)}};
        const auto bos = m.m->tokenizer->bos_id();
        const auto eos_ids = m.m->tokenizer->eos_ids();
        return send_json(res, 200,
                         {{"model_alias", m.id}, {"model_path", m.m->files.path},
                          {"default_generation_settings", {{"n_ctx", m.ctx}, {"params", defaults}}},
                          {"total_slots", e ? e->config().parallel : 0},
                          {"chat_template", m.m->template_choice.source},
                          {"bos_token", bos ? m.m->tokenizer->decode({*bos}, false) : ""},
                          {"eos_token", eos_ids.empty() ? "" : m.m->tokenizer->decode({eos_ids[0]}, false)},
                          {"build_info", m.fingerprint}});
      }
      case RouteId::kTokenize: {
        if (!gate(req, res)) return;
        ordered_json b;
        if (auto e = parse_body(req, b)) return send_error(req, res, *e);
        if (!b.is_object()) return send_error(req, res, {400, "the request body must be a JSON object"});
        if (!b.contains("content") || !b["content"].is_string()) return send_error(req, res, {400, "content must be a string", "content"});
        bool add_special = false, with_pieces = false;
        for (auto [name, dst] : {std::pair<const char*, bool*>{"add_special", &add_special}, {"with_pieces", &with_pieces}}) {
          if (b.contains(name) && !b[name].is_null()) {
            if (!b[name].is_boolean()) return send_error(req, res, {400, strfmt("%s must be of type bool", name), name});
            *dst = b[name].get<bool>();
          }
        }
        const std::string& text = b["content"].get_ref<const std::string&>();
        const ServedModel& m = *sm.load();
        try {
          fields::check_prompt_bytes(m, text.size(), Surface::kCompletions, "content");
        } catch (const ApiError& e) {
          return send_error(req, res, e);
        }
        const auto ids = m.m->tokenizer->encode(text, add_special);
        if (!with_pieces) return send_json(res, 200, {{"tokens", ids}});
        ordered_json toks = ordered_json::array();
        for (int32_t id : ids) {
          const std::string piece = m.m->tokenizer->token_bytes(id);
          ordered_json p = piece;
          if (!valid_utf8(piece)) {  // llama-server: bytes for pieces that are not valid UTF-8 alone
            p = ordered_json::array();
            for (unsigned char c : piece) p.push_back(static_cast<int>(c));
          }
          toks.push_back({{"id", id}, {"piece", p}});
        }
        return send_json(res, 200, {{"tokens", toks}});
      }
      case RouteId::kDetokenize: {
        if (!gate(req, res)) return;
        ordered_json b;
        if (auto e = parse_body(req, b)) return send_error(req, res, *e);
        if (!b.is_object()) return send_error(req, res, {400, "the request body must be a JSON object"});
        if (!b.contains("tokens") || !b["tokens"].is_array()) return send_error(req, res, {400, "tokens must be an array of ints", "tokens"});
        const int64_t V = sm.load()->m->model->info().vocab;
        try {
          fields::check_token_count(*sm.load(), b["tokens"].size(), "tokens");
        } catch (const ApiError& e) {
          return send_error(req, res, e);
        }
        std::vector<int32_t> ids;
        for (const auto& t : b["tokens"]) {
          if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= V)
            return send_error(req, res, {400, strfmt("tokens must be ints in [0, %lld)", (long long)V), "tokens"});
          ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
        }
        return send_json(res, 200, {{"content", sm.load()->m->tokenizer->decode(ids, /*skip_special=*/false)}});
      }
      case RouteId::kModels: {
        if (!gate(req, res)) return;
        const ServedModel& m = *sm.load();
        ordered_json data = ordered_json::array({model_object(m)});
        if (m.loras)  // each --lora NAME is a model a request can pick (`model`: NAME)
          for (const ServedLora& a : m.loras->adapters()) data.push_back(model_object(m, &a));
        return send_json(res, 200, {{"object", "list"}, {"data", data}});
      }
      case RouteId::kModel: {
        if (!gate(req, res)) return;
        const ServedModel& m = *sm.load();
        const std::string id = req.matches.empty() ? "" : req.matches[0];
        if (id == m.id) return send_json(res, 200, model_object(m));
        if (const ServedLora* a = m.loras ? m.loras->by_name(id) : nullptr) return send_json(res, 200, model_object(m, a));
        return send_error(req, res, {404, "model '" + id + "' is not served here", "model", "model_not_found"});
      }
      case RouteId::kLoraList: {
        if (!gate(req, res)) return;
        const ServedModel& m = *sm.load();
        ordered_json list = ordered_json::array();
        if (m.loras) {
          const std::vector<float> scales = m.loras->global_scales();
          for (size_t i = 0; i < m.loras->adapters().size(); ++i) {
            const ServedLora& a = m.loras->adapters()[i];
            list.push_back({{"id", i}, {"path", a.path}, {"scale", scales[i]}, {"name", a.name},
                            {"content_hash", a.bound->lora->content_hash()}});
          }
        }
        return send_json(res, 200, list);
      }
      case RouteId::kLoraSet: {
        if (!gate(req, res)) return;
        ordered_json body;
        if (auto e = parse_body(req, body)) return send_error(req, res, *e);
        const ServedModel& m = *sm.load();
        try {
          std::vector<float> scales = fields::lora_scales(m.loras.get(), body, "body");
          if (m.loras) m.loras->set_global_scales(std::move(scales));
        } catch (const ApiError& e) {
          return send_error(req, res, e);
        }
        return send_json(res, 200, {{"success", true}});
      }
      case RouteId::kHealth: {
        // llama-server's shape ({"status"}, 200 / 503, slots_idle / slots_processing as its
        // older releases reported them) plus the load a router balances on.
        const int s = state.load();
        ordered_json j = {{"status", s == kReady ? "ok" : s == kLoading ? "loading" : "draining"}};
        if (Engine* e = engine.load()) {
          const int64_t parallel = e->config().parallel;
          const int64_t running = static_cast<int64_t>(e->active());
          const int64_t free_slots = std::max<int64_t>(0, parallel - running);
          j["slots_idle"] = free_slots;
          j["slots_processing"] = running;
          j["running"] = running;
          j["queued"] = e->queue_depth();
          j["free_slots"] = free_slots;
          j["parallel"] = parallel;
        }
        if (s == kReady) return send_json(res, 200, j);
        res.set_header("Retry-After", "1");
        return send_json(res, 503, j);
      }
      case RouteId::kKvLookup: {
        if (!gate(req, res)) return;
        const ServedModel& m = *sm.load();
        Engine* e = engine.load();
        ordered_json b;
        if (auto err = parse_body(req, b)) return send_error(req, res, *err);
        KvLookupRequest lr;
        try {
          lr = parse_kv_lookup(m, b);
        } catch (const ApiError& err) {
          return send_error(req, res, err);
        } catch (const std::exception& err) {
          return send_error(req, res, {400, std::string("invalid request: ") + err.what()});
        }
        const nlohmann::json local = e->with_store([&lr](memory::KvStore& s) {
          const memory::KvStore::LocalLookup l = s.lookup_local(lr.prompt, lr.ns);
          return nlohmann::json{{"ram", l.ram}, {"ssd", l.ssd}, {"ssd_enabled", l.ssd_enabled}, {"ssd_scanning", l.ssd_scanning}};
        });
        if (!local.is_object() || !local.contains("ram"))
          return send_error(req, res, {503, "the server is shutting down"});
        const int64_t n = static_cast<int64_t>(lr.prompt.size());
        int64_t best = std::max(local["ram"].get<int64_t>(), local["ssd"].get<int64_t>());
        ordered_json j = {{"object", "kv.lookup"}, {"model", m.id}, {"form", lr.form}, {"prompt_tokens", n},
                          {"ram_tokens", local["ram"]},
                          {"ssd_tokens", local["ssd_enabled"].get<bool>() ? ordered_json(local["ssd"]) : ordered_json()},
                          {"ssd_scanning", local["ssd_scanning"]}};
        if (memory::RemoteTier* rt = e->remote_tier()) {
          std::string failure;
          const int64_t r = rt->peek(lr.prompt, lr.ns, &failure);
          j["remote_tokens"] = failure.empty() ? ordered_json(r) : ordered_json();
          j["remote_error"] = failure.empty() ? ordered_json() : ordered_json(failure);
          if (failure.empty()) best = std::max(best, r);
        } else {
          j["remote_tokens"] = nullptr;
          j["remote_error"] = nullptr;
        }
        j["cached_tokens"] = best;
        return send_json(res, 200, j);
      }
      case RouteId::kMetrics: {
        Engine* e = engine.load();
        std::string text = metrics.prometheus(e ? e->queue_depth() : 0, e ? e->active() : 0);
        if (e) {
          const nlohmann::json kv = e->with_store([e](memory::KvStore& s) {
            return nlohmann::json(memory::stats_prometheus(s.stats(), e->config().ns_labels));
          });
          if (kv.is_string()) text += kv.get<std::string>();
        }
        return res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
      }
      case RouteId::kStats: {
        if (!gate(req, res)) return;
        Engine* e = engine.load();
        const ServedModel& m = *sm.load();
        nlohmann::json j;
        j["model"] = {{"id", m.id}, {"path", m.m->files.path}, {"architecture", m.m->model->info().architecture},
                      {"weights", m.m->model->info().weight_dtypes}, {"isa", cpu_features().describe()}};
        j["server"] = {{"context", m.ctx}, {"parallel", e->config().parallel}, {"queue_max", e->config().queue_max},
                       {"queue_depth", e->queue_depth()}, {"active", e->active()},
                       {"kv_budget_bytes", e->config().kv_budget}, {"kv_bytes_per_token", e->config().kv_bytes_per_token},
                       {"kv_reserved_bytes", e->kv_reserved()}, {"admit_wait_ms", e->config().admit_wait.count()},
                       {"resident_bytes", process_resident_bytes()}};
        const Transport::Counters tc = transport->counters();
        j["connections"] = {{"accepted", tc.accepted}, {"refused", tc.refused}, {"evicted", tc.evicted},
                            {"timed_out", tc.timed_out}, {"bad_framing", tc.bad_framing}};
        j["requests"] = metrics.json();
        j["kv_store"] = e->with_store([e](memory::KvStore& s) { return memory::stats_json(s.stats(), e->config().ns_labels); });
        return res.set_content(j.dump(), "application/json");
      }
      case RouteId::kWebAsset:
        if (!cfg.webui) return send_error(req, res, {404, "the chat page is off (serve --no-webui)"});
        return send_asset(res, std::string_view(req.path).substr(std::string_view("/webui/").size()));
      case RouteId::kIndex:
        if (cfg.webui) res.set_header("Vary", "Accept");  // the page or the JSON index, by Accept
        if (serves_page(req, &route)) return send_asset(res, "index.html");
        [[fallthrough]];
      case RouteId::kIndexV1: {
        ordered_json routes = ordered_json::array();
        for (const Route& r : route_table())
          routes.push_back({{"method", r.method}, {"path", r.path}, {"summary", r.summary}});
        const ServedModel* m = sm.load();
        const int s = state.load();
        return send_json(res, 200,
                         {{"name", "larder"},
                          {"status", s == kReady ? "ok" : s == kLoading ? "loading" : "draining"},
                          {"model", m ? ordered_json(m->id) : ordered_json()},
                          {"context", m ? ordered_json(m->ctx) : ordered_json()},
                          {"docs", "docs/server-api.md in the larder repository"},
                          {"routes", routes}});
      }
      case RouteId::kAdminFlush: {
        if (auto e = check_query(req, {})) return send_error(req, res, *e);
        if (!gate(req, res)) return;
        const nlohmann::json r = engine.load()->with_store([](memory::KvStore& s) {
          const memory::FlushReport f = s.flush();
          return nlohmann::json{{"durable", f.durable}, {"ssd_enabled", f.ssd_enabled}, {"written", f.written},
                                {"already", f.already}, {"failed", f.failed}, {"dropped", f.dropped},
                                {"missing", f.missing}, {"not_written", f.not_written}};
        });
        res.status = r.value("durable", false) || !r.value("ssd_enabled", false) ? 200 : 503;
        return res.set_content(r.dump(), "application/json");
      }
      case RouteId::kAdminClear: {
        // A typo must not pass for the default: ?tier=SSD cleared only RAM and said so with 200.
        if (auto e = check_query(req, {"tier"})) return send_error(req, res, *e);
        std::string tier = "ram";
        for (const auto& [name, value] : req.params()) tier = value;  // "tier" (check_query)
        if (tier != "ram" && tier != "ssd")
          return send_error(req, res, {400, "tier must be ram (the default) or ssd, not '" + tier + "'", "tier"});
        if (!gate(req, res)) return;
        const bool ssd = tier == "ssd";
        engine.load()->with_store([ssd](memory::KvStore& s) {
          s.clear(ssd);
          return nlohmann::json();
        });
        return send_json(res, 200, {{"cleared", ssd ? "ram+ssd" : "ram"}});
      }
    }
  }
};

HttpServer::HttpServer(HttpConfig cfg, Metrics& metrics) : impl_(std::make_unique<Impl>(cfg, metrics)), cfg_(cfg) {
  TransportConfig tc;
  tc.host = cfg.host;
  tc.port = cfg.port;
  tc.body_limit = cfg.body_limit;
  tc.work_threads = cfg.threads;
  tc.max_connections = cfg.max_connections;
  tc.max_connections_per_ip = cfg.max_connections_per_ip;
  tc.header_timeout_ms = cfg.header_timeout_ms;
  tc.body_timeout_ms = cfg.body_timeout_ms;
  tc.idle_timeout_ms = cfg.idle_timeout_ms;
  Impl* d = impl_.get();
  impl_->transport = std::make_unique<Transport>(
      tc, [d](HttpRequest& q, HttpResponse& r) { d->handle(q, r); },
      [d](const HttpRequest& q, HttpResponse& r, int status, const std::string& msg) {
        send_error(q, r, {status, msg});
        LogEntry e;
        e.method = q.method.empty() ? "-" : q.method;
        e.path = q.path.empty() ? "-" : q.path;
        e.ip = q.remote_ip;
        e.status = status;
        e.error = msg;
        d->emit(e);
      },
      [](const HttpRequest& q) {
        const Route* r = match_route(q.method, q.path, nullptr, nullptr);
        return !r || r->control;
      });
}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::bind() {
  if (Status st = impl_->transport->bind(); !st.is_ok()) return st;
  cfg_.port = impl_->transport->port();
  return Status::ok();
}

void HttpServer::serve() { impl_->transport->serve(); }
void HttpServer::stop() {
  if (impl_ && impl_->transport) impl_->transport->stop();
}

void HttpServer::set_ready(const ServedModel* sm, Engine* engine) {
  impl_->sm.store(sm);
  impl_->engine.store(engine);
  impl_->state.store(kReady);
}

void HttpServer::set_draining() { impl_->state.store(kDraining); }

}  // namespace larder::server
