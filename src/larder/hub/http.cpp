#include "larder/hub/http.h"

#include <curl/curl.h>

#include <cctype>
#include <mutex>

namespace larder::hub {

namespace {

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Ctx {
  HttpResponse* resp = nullptr;
  bool keep_body = false;
  const std::function<bool(const HttpResponse&)>* on_headers = nullptr;
  const std::function<bool(const char*, size_t)>* sink = nullptr;
  bool headers_delivered = false;
  bool aborted_by_sink = false;
  bool aborted_by_headers = false;
  CURL* curl = nullptr;
};

// Called once per header line of every response on the redirect chain; a status line starts a
// new response, so only the final one's headers remain.
size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* c = static_cast<Ctx*>(user);
  std::string line(data, size * n);
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.pop_back();
  if (line.rfind("HTTP/", 0) == 0) {
    c->resp->headers.clear();
    const size_t sp = line.find(' ');
    c->resp->status = sp == std::string::npos ? 0 : std::atol(line.c_str() + sp + 1);
    return size * n;
  }
  const size_t colon = line.find(':');
  if (colon == std::string::npos) return size * n;
  std::string name = line.substr(0, colon);
  for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  size_t v = colon + 1;
  while (v < line.size() && line[v] == ' ') ++v;
  c->resp->headers[name] = line.substr(v);
  return size * n;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* c = static_cast<Ctx*>(user);
  const size_t len = size * n;
  if (!c->headers_delivered) {
    c->headers_delivered = true;
    if (c->on_headers && *c->on_headers && !(*c->on_headers)(*c->resp)) {
      c->aborted_by_headers = true;
      return 0;
    }
  }
  if (c->keep_body) {
    if (c->resp->body.size() + len > (64u << 20)) return 0;
    c->resp->body.append(data, len);
    return len;
  }
  if (c->sink && !(*c->sink)(data, len)) {
    c->aborted_by_sink = true;
    return 0;
  }
  return len;
}

CURL* make_handle(const HttpRequest& req, Ctx& ctx, curl_slist** hdrs) {
  global_init();
  CURL* h = curl_easy_init();
  if (!h) return nullptr;
  curl_easy_setopt(h, CURLOPT_URL, req.url.c_str());
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, req.follow_redirects ? 1L : 0L);
  curl_easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L);
  // A stalled connection (under 1 byte/s for 60 s) is a failure to retry, not a hang.
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "larder/0.1.0");
  // The Hub's sizes and hashes are of the raw bytes: no transparent decompression.
  curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, nullptr);
  if (req.method == "HEAD") curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  if (req.range_start > 0) {
    const std::string r = std::to_string(req.range_start) + "-";
    curl_easy_setopt(h, CURLOPT_RANGE, r.c_str());  // copied by curl
  }
  for (const auto& s : req.headers) *hdrs = curl_slist_append(*hdrs, s.c_str());
  *hdrs = curl_slist_append(*hdrs, "Accept-Encoding: identity");
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, *hdrs);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &ctx);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &ctx);
  ctx.curl = h;
  return h;
}

void finish_response(CURL* h, HttpResponse& r) {
  long code = 0;
  if (curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK && code) r.status = code;
  char* eff = nullptr;
  if (curl_easy_getinfo(h, CURLINFO_EFFECTIVE_URL, &eff) == CURLE_OK && eff) r.effective_url = eff;
}

bool retriable(CURLcode c) {
  switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_PARTIAL_FILE:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

}  // namespace

Result<HttpResponse> http_request(const HttpRequest& req) {
  HttpResponse resp;
  Ctx ctx;
  ctx.resp = &resp;
  ctx.keep_body = true;
  curl_slist* hdrs = nullptr;
  CURL* h = make_handle(req, ctx, &hdrs);
  if (!h) return internal_error("[http] curl_easy_init failed");
  const CURLcode rc = curl_easy_perform(h);
  finish_response(h, resp);
  curl_slist_free_all(hdrs);
  curl_easy_cleanup(h);
  if (rc != CURLE_OK) {
    return Status(StatusCode::kUnavailable,
                  strfmt("[http] %s %s: %s", req.method.c_str(), req.url.c_str(), curl_easy_strerror(rc)));
  }
  return resp;
}

FetchResult http_fetch(const HttpRequest& req, const std::function<bool(const HttpResponse&)>& on_headers,
                       const std::function<bool(const char*, size_t)>& sink) {
  FetchResult out;
  Ctx ctx;
  ctx.resp = &out.response;
  ctx.on_headers = &on_headers;
  ctx.sink = &sink;
  curl_slist* hdrs = nullptr;
  CURL* h = make_handle(req, ctx, &hdrs);
  if (!h) {
    out.error = {false, "curl_easy_init failed"};
    return out;
  }
  const CURLcode rc = curl_easy_perform(h);
  finish_response(h, out.response);
  curl_slist_free_all(hdrs);
  curl_easy_cleanup(h);
  // An empty body never reaches on_body: deliver the headers now.
  if (rc == CURLE_OK && !ctx.headers_delivered && on_headers) {
    if (!on_headers(out.response)) ctx.aborted_by_headers = true;
  }
  out.aborted_by_sink = ctx.aborted_by_sink;
  if (rc == CURLE_OK && !ctx.aborted_by_headers) {
    out.ok = true;
  } else if (ctx.aborted_by_headers) {
    out.error = {false, strfmt("HTTP %ld", out.response.status)};
  } else if (!ctx.aborted_by_sink) {
    out.error = {retriable(rc), curl_easy_strerror(rc)};
  }
  return out;
}

std::string url_escape(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string o;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      o += static_cast<char>(c);
    } else {
      o += '%';
      o += hex[c >> 4];
      o += hex[c & 15];
    }
  }
  return o;
}

}  // namespace larder::hub
