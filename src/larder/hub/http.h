// http.h — the HTTP client `larder pull` needs, on libcurl (TLS, proxies, redirects and
// HTTP/2 are curl's job, not ours).
//
// Two calls: `request` for small answers kept in memory (API JSON, HEAD metadata) and `fetch`
// for bodies streamed to a sink (file downloads, with an optional Range start). Headers are
// those of the final response, with lower-case names.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "larder/core/status.h"

namespace larder::hub {

struct HttpRequest {
  std::string method = "GET";  // GET or HEAD
  std::string url;
  std::vector<std::string> headers;  // "Name: value"
  bool follow_redirects = true;
  uint64_t range_start = 0;  // > 0: "Range: bytes=N-"
};

struct HttpResponse {
  long status = 0;
  std::map<std::string, std::string> headers;  // final response's, lower-case names
  std::string body;                            // request() only
  std::string effective_url;                   // after redirects

  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// A failed transfer (connection lost, timeout): `retriable` when trying again may succeed.
struct TransferError {
  bool retriable = false;
  std::string message;
};

// Small request, body kept in memory (capped at 64 MiB). Transport failures are errors;
// any HTTP status is a response.
Result<HttpResponse> http_request(const HttpRequest& req);

// Streams the body to `sink` (return false to abort, e.g. disk full). `on_headers` sees the
// final response's status and headers before the first body byte; returning false aborts
// (e.g. an error status). Returns the response (without body) or the transfer error.
struct FetchResult {
  HttpResponse response;
  bool ok = false;
  bool aborted_by_sink = false;
  TransferError error;
};
FetchResult http_fetch(const HttpRequest& req, const std::function<bool(const HttpResponse&)>& on_headers,
                       const std::function<bool(const char*, size_t)>& sink);

// Percent-encodes one path segment or query value (RFC 3986 unreserved kept).
std::string url_escape(const std::string& s);

}  // namespace larder::hub
