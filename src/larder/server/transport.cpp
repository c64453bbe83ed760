#include "larder/server/transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "larder/core/log.h"

namespace larder::server {

using Clock = std::chrono::steady_clock;

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\t')) ++a;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t')) --b;
  return s.substr(a, b - a);
}

// RFC 9110 tchar. (strchr finds the terminating NUL too: c == 0 must be ruled out first.)
bool is_tchar(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c != 0 && std::strchr("!#$%&'*+-.^_`|~", c) != nullptr);
}

std::string percent_decode(const std::string& s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else if (plus_is_space && s[i] == '+') {
      out += ' ';
    } else {
      out += s[i];
    }
  }
  return out;
}

const char* reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

// A connection the event loop owns while it reads a request.
struct Conn {
  int fd = -1;
  std::string ip;
  std::string in;          // bytes received and not yet consumed (pipelined requests stay here)
  Clock::time_point opened, deadline;
  bool in_request = false;  // a request's first byte has arrived
  size_t need_body = 0;     // Content-Length of the request being read (after its header)
  bool header_done = false;
  bool sent_continue = false;
  HttpRequest req;          // the request being read (valid once header_done)
  bool chunked = false;
  uint64_t seq = 0;         // arrival order, for eviction
  // Answered with an error and half-closed: what the client still sends is read and dropped
  // until it closes or a short deadline passes. Closing at once with unread input would make
  // the kernel send a reset, and the client could lose the error response.
  bool lingering = false;
};

// Parse outcome of the bytes buffered so far.
enum class Parse { kNeedMore, kComplete, kError };

struct ParseError {
  int status = 400;
  std::string message;
};

// Worker pool with big stacks: handlers walk client JSON (bounded by the depth limit) and render
// templates; 16 MiB leaves that far from the edge whatever the body under the size limit.
class Pool {
 public:
  Pool(int n, const char* name) : name_(name) {
    for (int i = 0; i < n; ++i) {
      pthread_attr_t attr;
      pthread_attr_init(&attr);
      pthread_attr_setstacksize(&attr, 16u << 20);
      pthread_t t;
      if (pthread_create(&t, &attr, &Pool::trampoline, this) == 0) threads_.push_back(t);
      pthread_attr_destroy(&attr);
    }
  }
  ~Pool() { stop(); }
  void stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_all();
    for (pthread_t t : threads_) pthread_join(t, nullptr);
    threads_.clear();
  }
  // false: the pool is stopping, or every worker is busy and `max_pending` tasks already wait.
  bool post(std::function<void()> fn, size_t max_pending) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return false;
      if (q_.size() >= max_pending && busy_ >= threads_.size()) return false;
      q_.push_back(std::move(fn));
    }
    cv_.notify_one();
    return true;
  }
  size_t size() const { return threads_.size(); }

 private:
  static void* trampoline(void* self) {
    static_cast<Pool*>(self)->run();
    return nullptr;
  }
  void run() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;  // stopping and drained
        fn = std::move(q_.front());
        q_.pop_front();
        ++busy_;
      }
      fn();
      std::lock_guard<std::mutex> l(mu_);
      --busy_;
    }
  }
  const char* name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  std::vector<pthread_t> threads_;
  size_t busy_ = 0;
  bool stop_ = false;
};

}  // namespace

// ---- HttpRequest / HttpResponse ----------------------------------------------------------------

bool HttpRequest::has_header(const std::string& n) const { return header_count(n) > 0; }

std::string HttpRequest::header(const std::string& n) const {
  for (const auto& [k, v] : headers)
    if (k == n) return v;
  return {};
}

size_t HttpRequest::header_count(const std::string& n) const {
  size_t c = 0;
  for (const auto& kv : headers) c += kv.first == n;
  return c;
}

std::vector<std::pair<std::string, std::string>> HttpRequest::params() const {
  std::vector<std::pair<std::string, std::string>> out;
  size_t i = 0;
  while (i < query.size()) {
    size_t amp = query.find('&', i);
    if (amp == std::string::npos) amp = query.size();
    const std::string part = query.substr(i, amp - i);
    if (!part.empty()) {
      const size_t eq = part.find('=');
      out.emplace_back(percent_decode(part.substr(0, eq), true),
                       eq == std::string::npos ? std::string() : percent_decode(part.substr(eq + 1), true));
    }
    i = amp + 1;
  }
  return out;
}

std::string HttpRequest::param(const std::string& name) const {
  size_t i = 0;
  while (i <= query.size()) {
    size_t amp = query.find('&', i);
    if (amp == std::string::npos) amp = query.size();
    const std::string part = query.substr(i, amp - i);
    const size_t eq = part.find('=');
    if (percent_decode(part.substr(0, eq), true) == name)
      return eq == std::string::npos ? std::string() : percent_decode(part.substr(eq + 1), true);
    i = amp + 1;
  }
  return {};
}

void HttpResponse::set_header(const std::string& name, const std::string& value) {
  // Header values never carry CR/LF (response splitting) or other control bytes (NUL, VT, ESC):
  // they are replaced by spaces.
  std::string v = value;
  for (char& c : v)
    if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) c = ' ';
  headers.emplace_back(name, std::move(v));
}

bool HttpResponse::has_header(const std::string& name) const {
  const std::string n = lower(name);
  for (const auto& kv : headers)
    if (lower(kv.first) == n) return true;
  return false;
}

int json_nesting_depth(const std::string& t, int stop_at) {
  int depth = 0, max_depth = 0;
  bool in_str = false;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (in_str) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_str = false;
      }
      continue;
    }
    if (c == '"') {
      in_str = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        max_depth = depth;
        if (max_depth > stop_at) return max_depth;
      }
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
    }
  }
  return max_depth;
}

// ---- the transport -----------------------------------------------------------------------------

struct Transport::Impl {
  TransportConfig cfg;
  Handler handler;
  ErrorHandler error;
  Classifier is_control;
  int listen_fd = -1, epfd = -1, wake_fd = -1;
  std::atomic<bool> stopping{false};
  std::atomic<bool> loop_done{false};
  std::unordered_map<int, std::unique_ptr<Conn>> conns;  // loop thread only: connections being read
  std::atomic<int> open_total{0};
  std::mutex ip_mu;
  std::unordered_map<std::string, int> open_per_ip;
  std::mutex back_mu;
  std::vector<std::unique_ptr<Conn>> returned;  // connections workers hand back for the next request
  std::unique_ptr<Pool> work, control;
  uint64_t next_seq = 0;
  mutable std::mutex counters_mu;
  Counters counters;

  void count(uint64_t Counters::*field) {
    std::lock_guard<std::mutex> l(counters_mu);
    ++(counters.*field);
  }

  // -- socket helpers
  static void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

  // Writes everything or fails (peer gone, or no progress for write_timeout_ms).
  bool write_all(int fd, const char* p, size_t n) {
    auto deadline = Clock::now() + std::chrono::milliseconds(cfg.write_timeout_ms);
    while (n > 0) {
      const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
      if (w > 0) {
        p += w;
        n -= static_cast<size_t>(w);
        deadline = Clock::now() + std::chrono::milliseconds(cfg.write_timeout_ms);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) return false;
        pollfd pf{fd, POLLOUT, 0};
        const int r = ::poll(&pf, 1, static_cast<int>(std::min<long long>(left, 1000)));
        if (r > 0 && (pf.revents & (POLLERR | POLLHUP | POLLNVAL))) return false;
        continue;
      }
      return false;
    }
    return true;
  }

  static bool peer_alive(int fd) {
    pollfd pf{fd, POLLOUT, 0};
    if (::poll(&pf, 1, 0) < 0) return false;
    return (pf.revents & (POLLERR | POLLHUP | POLLNVAL)) == 0;
  }

  // The peer closed (FIN or RST) before its answer began. A client that only half-closes after
  // its request counts as gone too: HTTP clients do not, and one that did could not be told apart.
  static bool peer_closed(int fd) {
    pollfd pf{fd, POLLIN | POLLRDHUP, 0};
    if (::poll(&pf, 1, 0) <= 0) return false;
    return (pf.revents & (POLLRDHUP | POLLERR | POLLHUP | POLLNVAL)) != 0;
  }

  void close_conn(std::unique_ptr<Conn> c) {
    if (!c || c->fd < 0) return;
    ::close(c->fd);
    c->fd = -1;
    open_total.fetch_sub(1);
    std::lock_guard<std::mutex> l(ip_mu);
    auto it = open_per_ip.find(c->ip);
    if (it != open_per_ip.end() && --it->second <= 0) open_per_ip.erase(it);
  }

  // -- request framing (RFC 9112), strict where ambiguity enables request smuggling
  Parse parse_header(Conn& c, ParseError& err) {
    size_t end = c.in.find("\r\n\r\n");
    size_t hdr_len = end == std::string::npos ? std::string::npos : end + 4;
    if (const size_t lf = c.in.find("\n\n"); lf != std::string::npos && (hdr_len == std::string::npos || lf + 2 < hdr_len)) {
      end = lf;
      hdr_len = lf + 2;
    }
    if (hdr_len == std::string::npos) {
      if (c.in.size() > cfg.header_limit) {
        err = {431, "request header too large"};
        return Parse::kError;
      }
      return Parse::kNeedMore;
    }
    if (hdr_len > cfg.header_limit) {
      err = {431, "request header too large"};
      return Parse::kError;
    }
    std::vector<std::string> lines;
    {
      size_t i = 0;
      while (i < end) {
        size_t nl = c.in.find('\n', i);
        if (nl == std::string::npos || nl > end) nl = end;
        std::string line = c.in.substr(i, nl - i);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        lines.push_back(std::move(line));
        i = nl + 1;
      }
    }
    HttpRequest& r = c.req;
    r = HttpRequest{};
    r.remote_ip = c.ip;
    if (lines.empty()) {
      err = {400, "empty request line"};
      return Parse::kError;
    }
    {
      const std::string& rl = lines[0];
      const size_t a = rl.find(' '), b = rl.rfind(' ');
      if (a == std::string::npos || b == a) {
        err = {400, "malformed request line"};
        return Parse::kError;
      }
      r.method = rl.substr(0, a);
      r.target = rl.substr(a + 1, b - a - 1);
      r.version = rl.substr(b + 1);
      if (r.method.empty() || !std::all_of(r.method.begin(), r.method.end(), [](char ch) { return is_tchar(static_cast<unsigned char>(ch)); })) {
        err = {400, "malformed request method"};
        return Parse::kError;
      }
      if (r.version != "HTTP/1.1" && r.version != "HTTP/1.0") {
        if (r.version.rfind("HTTP/", 0) == 0) {
          err = {505, "HTTP version " + r.version.substr(5) + " is not supported (use HTTP/1.1)"};
        } else {
          err = {400, "malformed request line"};
        }
        return Parse::kError;
      }
      // No whitespace or control bytes in the target (RFC 3986: they arrive percent-encoded).
      if (r.target.empty() || !std::all_of(r.target.begin(), r.target.end(), [](char ch) {
            return static_cast<unsigned char>(ch) > 0x20 && static_cast<unsigned char>(ch) != 0x7f;
          })) {
        err = {400, "malformed request target"};
        return Parse::kError;
      }
      // Absolute form (proxies): keep the path.
      if (r.target[0] != '/' && r.target != "*") {
        const size_t scheme = r.target.find("://");
        const size_t slash = scheme == std::string::npos ? std::string::npos : r.target.find('/', scheme + 3);
        r.target = slash == std::string::npos ? "/" : r.target.substr(slash);
      }
      const size_t q = r.target.find('?');
      r.path = percent_decode(r.target.substr(0, q), false);
      if (q != std::string::npos) r.query = r.target.substr(q + 1);
    }
    for (size_t i = 1; i < lines.size(); ++i) {
      const std::string& l = lines[i];
      if (!l.empty() && (l[0] == ' ' || l[0] == '\t')) {
        err = {400, "obsolete header line folding is not accepted"};
        return Parse::kError;
      }
      const size_t colon = l.find(':');
      if (colon == std::string::npos || colon == 0) {
        err = {400, "malformed header line"};
        return Parse::kError;
      }
      for (size_t k = 0; k < colon; ++k)
        if (!is_tchar(static_cast<unsigned char>(l[k]))) {
          err = {400, "malformed header name (no whitespace before the colon)"};
          return Parse::kError;
        }
      // RFC 9110 §5.5: a value holding NUL (or a bare CR) is invalid and dangerous; refuse it.
      if (l.find('\0', colon) != std::string::npos || l.find('\r', colon) != std::string::npos) {
        err = {400, "malformed header value (NUL or CR)"};
        return Parse::kError;
      }
      r.headers.emplace_back(lower(l.substr(0, colon)), trim(l.substr(colon + 1)));
    }
    // Framing. Two Content-Lengths that differ, a non-digit length, or Content-Length together
    // with Transfer-Encoding are the classic smuggling forms: refuse them all.
    std::string cl;
    for (const auto& [k, v] : r.headers) {
      if (k != "content-length") continue;
      if (v.empty() || v.size() > 15 || !std::all_of(v.begin(), v.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
        err = {400, "Content-Length must be a decimal number of bytes"};
        return Parse::kError;
      }
      if (!cl.empty() && cl != v) {
        err = {400, "conflicting Content-Length headers"};
        return Parse::kError;
      }
      cl = v;
    }
    const size_t te_count = r.header_count("transfer-encoding");
    if (te_count > 0) {
      if (!cl.empty()) {
        err = {400, "Content-Length together with Transfer-Encoding is ambiguous"};
        return Parse::kError;
      }
      if (te_count > 1 || lower(r.header("transfer-encoding")) != "chunked" || r.version == "HTTP/1.0") {
        err = {400, "only Transfer-Encoding: chunked is accepted (HTTP/1.1)"};
        return Parse::kError;
      }
      c.chunked = true;
    } else {
      c.chunked = false;
    }
    if (r.version == "HTTP/1.1" && r.header_count("host") != 1) {
      err = {400, r.header_count("host") == 0 ? "missing Host header" : "more than one Host header"};
      return Parse::kError;
    }
    c.need_body = cl.empty() ? 0 : static_cast<size_t>(std::stoull(cl));
    if (c.need_body > cfg.body_limit) {
      err = {413, strfmt("request body too large (%zu bytes; the limit is %zu)", c.need_body, cfg.body_limit)};
      return Parse::kError;
    }
    c.in.erase(0, hdr_len);
    c.header_done = true;
    const size_t mib = c.need_body >> 20;
    c.deadline = Clock::now() + std::chrono::milliseconds(cfg.body_timeout_ms) + std::chrono::seconds(mib);
    return Parse::kComplete;
  }

  // Decodes a chunked body from c.in; complete chunks move to c.req.body as they arrive (so
  // a large body is scanned once), kNeedMore until the last chunk and trailers are in.
  Parse parse_chunked(Conn& c, ParseError& err) {
    std::string& body = c.req.body;
    for (;;) {
      size_t i = 0;
      const size_t nl = c.in.find('\n', i);
      if (nl == std::string::npos) return Parse::kNeedMore;
      std::string line = c.in.substr(i, nl - i);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      const size_t semi = line.find(';');
      const std::string hex = trim(line.substr(0, semi));
      if (hex.empty() || hex.size() > 12 || !std::all_of(hex.begin(), hex.end(), [](char ch) { return std::isxdigit(static_cast<unsigned char>(ch)); })) {
        err = {400, "malformed chunk size"};
        return Parse::kError;
      }
      const size_t n = std::stoull(hex, nullptr, 16);
      i = nl + 1;
      if (n == 0) {
        // Trailers until an empty line.
        for (;;) {
          const size_t tl = c.in.find('\n', i);
          if (tl == std::string::npos) return Parse::kNeedMore;
          const bool empty = tl == i || (tl == i + 1 && c.in[i] == '\r');
          i = tl + 1;
          if (empty) break;
        }
        c.in.erase(0, i);
        return Parse::kComplete;
      }
      if (body.size() + n > cfg.body_limit) {
        err = {413, strfmt("request body too large (the limit is %zu bytes)", cfg.body_limit)};
        return Parse::kError;
      }
      if (c.in.size() < i + n + 1) return Parse::kNeedMore;
      body.append(c.in, i, n);
      i += n;
      if (c.in.compare(i, 2, "\r\n") == 0) {
        i += 2;
      } else if (c.in[i] == '\n') {
        i += 1;
      } else if (c.in.size() < i + 2) {
        body.resize(body.size() - n);  // not complete yet: taken again with its CRLF
        return Parse::kNeedMore;
      } else {
        err = {400, "chunk data not followed by CRLF"};
        return Parse::kError;
      }
      c.in.erase(0, i);
    }
  }

  Parse parse(Conn& c, ParseError& err) {
    if (!c.header_done) {
      // Leading empty lines between pipelined requests are allowed (RFC 9112 §2.2).
      size_t skip = 0;
      while (skip < c.in.size() && (c.in[skip] == '\r' || c.in[skip] == '\n')) ++skip;
      if (skip) c.in.erase(0, skip);
      if (c.in.empty()) return Parse::kNeedMore;
      const Parse p = parse_header(c, err);
      if (p != Parse::kComplete) return p;
    }
    if (c.chunked) return parse_chunked(c, err);
    if (c.in.size() < c.need_body) return Parse::kNeedMore;
    c.req.body = c.in.substr(0, c.need_body);
    c.in.erase(0, c.need_body);
    return Parse::kComplete;
  }

  // -- responses
  void write_simple_error(Conn& c, int status, const std::string& message) {
    HttpRequest& r = c.req;
    HttpResponse res;
    error(r, res, status, message);
    res.status = status;
    res.set_header("Connection", "close");
    std::string head = strfmt("HTTP/1.1 %d %s\r\n", status, reason_phrase(status));
    head += "Content-Type: " + res.content_type + "\r\n";
    for (const auto& [k, v] : res.headers) head += k + ": " + v + "\r\n";
    head += strfmt("Content-Length: %zu\r\n\r\n", res.body.size());
    head += res.body;
    // Best effort, non-blocking: a client that does not read its error gets nothing.
    (void)!::send(c.fd, head.data(), head.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  // Runs a complete request on a worker; returns whether the connection stays open.
  bool respond(Conn& c) {
    HttpRequest& req = c.req;
    HttpResponse res;
    req.client_gone = [fd = c.fd] { return peer_closed(fd); };
    handler(req, res);
    const bool http10 = req.version == "HTTP/1.0";
    const std::string conn_hdr = lower(req.header("connection"));
    bool keep = !http10 && conn_hdr.find("close") == std::string::npos && !stopping.load();
    if (http10 && conn_hdr.find("keep-alive") != std::string::npos && !res.provider) keep = !stopping.load();
    std::string head = strfmt("%s %d %s\r\n", http10 ? "HTTP/1.0" : "HTTP/1.1", res.status, reason_phrase(res.status));
    if (!res.has_header("Content-Type") && (res.provider || !res.body.empty() || res.status != 204))
      head += "Content-Type: " + res.content_type + "\r\n";
    for (const auto& [k, v] : res.headers) head += k + ": " + v + "\r\n";
    const bool head_only = req.method == "HEAD";
    if (!res.provider) {
      if (res.status != 204) head += strfmt("Content-Length: %zu\r\n", res.body.size());
      head += keep ? (http10 ? "Connection: keep-alive\r\n\r\n" : "\r\n") : "Connection: close\r\n\r\n";
      if (!head_only) head += res.body;
      const bool ok = write_all(c.fd, head.data(), head.size());
      if (res.on_finish) res.on_finish(ok);
      return ok && keep;
    }
    // Streaming. HTTP/1.1: chunked. HTTP/1.0 has no chunked coding: the body ends when the
    // connection closes.
    const bool chunked = !http10;
    if (chunked) {
      head += "Transfer-Encoding: chunked\r\n";
    } else {
      keep = false;
    }
    head += keep ? "\r\n" : "Connection: close\r\n\r\n";
    bool ok = write_all(c.fd, head.data(), head.size());
    bool done = false;
    BodySink sink;
    sink.write = [&](const char* p, size_t n) {
      if (!ok) return false;
      if (n == 0) return true;
      if (chunked) {
        std::string frame = strfmt("%zx\r\n", n);
        frame.append(p, n);
        frame += "\r\n";
        ok = write_all(c.fd, frame.data(), frame.size());
      } else {
        ok = write_all(c.fd, p, n);
      }
      return ok;
    };
    sink.is_writable = [&] { return ok && peer_alive(c.fd); };
    sink.done = [&] { done = true; };
    while (ok && !done) {
      if (!res.provider(sink)) {
        ok = false;
        break;
      }
    }
    if (ok && chunked) ok = write_all(c.fd, "0\r\n\r\n", 5);
    if (res.on_finish) res.on_finish(ok && done);
    return ok && done && keep;
  }

  void dispatch(std::unique_ptr<Conn> c) {
    Pool& pool = is_control(c->req) ? *control : *work;
    Conn* raw = c.release();
    auto task = [this, raw] {
      std::unique_ptr<Conn> conn(raw);
      const bool keep = respond(*conn);
      if (!keep || stopping.load()) return close_conn(std::move(conn));
      // Back to the event loop for the next request (which may already be buffered).
      conn->header_done = false;
      conn->in_request = !conn->in.empty();
      conn->sent_continue = false;
      conn->req = HttpRequest{};
      {
        std::lock_guard<std::mutex> l(back_mu);
        returned.push_back(std::move(conn));
      }
      const uint64_t one = 1;
      (void)!::write(wake_fd, &one, sizeof(one));
    };
    // A full pool with a backlog as long as itself: answer 503 now instead of queueing without
    // bound (each queued connection would wait behind streams that may run for minutes).
    if (!pool.post(task, pool.size() * 2 + 16)) {
      std::unique_ptr<Conn> conn(raw);
      write_simple_error(*conn, 503, "the server is busy (every connection worker is in use); retry shortly");
      close_conn(std::move(conn));
    }
  }

  // -- the event loop
  void watch(Conn& c) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = c.fd;
    epoll_ctl(epfd, EPOLL_CTL_ADD, c.fd, &ev);
  }

  void linger(Conn& c) {
    ::shutdown(c.fd, SHUT_WR);
    c.lingering = true;
    c.in_request = false;
    c.in.clear();
    c.deadline = Clock::now() + std::chrono::seconds(2);
  }

  // Tries to complete a request from what is buffered; dispatches, errors, or keeps waiting.
  void advance(int fd) {
    auto it = conns.find(fd);
    if (it == conns.end()) return;
    Conn& c = *it->second;
    if (c.lingering) {
      c.in.clear();
      return;
    }
    if (c.in.empty()) return;
    if (!c.in_request) {
      c.in_request = true;
      c.deadline = Clock::now() + std::chrono::milliseconds(cfg.header_timeout_ms);
    }
    ParseError err;
    const Parse p = parse(c, err);
    if (p == Parse::kNeedMore) {
      if (c.header_done && !c.sent_continue && lower(c.req.header("expect")) == "100-continue") {
        c.sent_continue = true;
        static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
        (void)!::send(c.fd, kContinue, sizeof(kContinue) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      return;
    }
    if (p == Parse::kError) {
      count(&Counters::bad_framing);
      LARDER_LOG_DEBUG("[http] %s: %d %s", c.ip.c_str(), err.status, err.message.c_str());
      write_simple_error(c, err.status, err.message);
      return linger(c);
    }
    std::unique_ptr<Conn> owned = std::move(it->second);
    conns.erase(it);
    epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
    dispatch(std::move(owned));
  }

  void on_readable(int fd) {
    auto it = conns.find(fd);
    if (it == conns.end()) return;
    Conn& c = *it->second;
    char buf[16384];
    for (;;) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        // Bound what a client may have buffered: header + body limit + framing slack.
        if (c.in.size() > cfg.header_limit + cfg.body_limit + (1u << 20)) break;
        if (static_cast<size_t>(n) < sizeof(buf)) break;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      // EOF or error: the client is gone (a half-sent request is dropped).
      std::unique_ptr<Conn> owned = std::move(it->second);
      conns.erase(it);
      epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
      return close_conn(std::move(owned));
    }
    advance(fd);
  }

  // Over a cap: the connection with the least to show for its time goes (the oldest among
  // those still waiting for a request), so slow or idle clients cannot lock others out.
  bool evict_one(const std::string* ip) {
    Conn* victim = nullptr;
    for (auto& [fd, c] : conns) {
      if (ip && c->ip != *ip) continue;
      if (!victim || c->seq < victim->seq) victim = c.get();
    }
    if (!victim) return false;
    const int fd = victim->fd;
    auto it = conns.find(fd);
    std::unique_ptr<Conn> owned = std::move(it->second);
    conns.erase(it);
    epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
    count(&Counters::evicted);
    close_conn(std::move(owned));
    return true;
  }

  void on_accept() {
    for (;;) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE) {
          // Out of descriptors: make room by dropping the oldest waiting connection.
          if (evict_one(nullptr)) continue;
        }
        return;
      }
      char host[INET6_ADDRSTRLEN] = "";
      if (ss.ss_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, host, sizeof(host));
      } else if (ss.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, host, sizeof(host));
      }
      const int one = 1;
      // Nagle would hold every small write (an SSE event, a response after the first on a
      // keep-alive connection) until the previous one is ACKed: 40 ms per event.
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->ip = host;
      c->opened = Clock::now();
      c->deadline = c->opened + std::chrono::milliseconds(cfg.header_timeout_ms);
      c->seq = next_seq++;
      int ip_count = 0;
      {
        std::lock_guard<std::mutex> l(ip_mu);
        ip_count = open_per_ip[c->ip];
      }
      if (ip_count >= cfg.max_connections_per_ip) evict_one(&c->ip);
      if (open_total.load() >= cfg.max_connections) evict_one(nullptr);
      {
        std::lock_guard<std::mutex> l(ip_mu);
        ip_count = open_per_ip[c->ip];
      }
      if (ip_count >= cfg.max_connections_per_ip || open_total.load() >= cfg.max_connections) {
        // Every connection of this client is busy with a request: refuse the new one.
        count(&Counters::refused);
        c->req.path = "/";
        write_simple_error(*c, 503, "too many connections");
        ::close(fd);
        continue;
      }
      open_total.fetch_add(1);
      {
        std::lock_guard<std::mutex> l(ip_mu);
        ++open_per_ip[c->ip];
      }
      count(&Counters::accepted);
      watch(*c);
      conns.emplace(fd, std::move(c));
    }
  }

  void take_returned() {
    std::vector<std::unique_ptr<Conn>> back;
    {
      std::lock_guard<std::mutex> l(back_mu);
      back.swap(returned);
    }
    for (auto& c : back) {
      const int fd = c->fd;
      c->deadline = Clock::now() + std::chrono::milliseconds(c->in.empty() ? cfg.idle_timeout_ms : cfg.header_timeout_ms);
      watch(*c);
      conns.emplace(fd, std::move(c));
      advance(fd);  // a pipelined request may be complete already
    }
  }

  void expire() {
    const auto now = Clock::now();
    std::vector<int> dead;
    for (auto& [fd, c] : conns)
      if (now >= c->deadline) dead.push_back(fd);
    for (int fd : dead) {
      auto it = conns.find(fd);
      Conn& c = *it->second;
      if (c.in_request && !c.lingering) {
        count(&Counters::timed_out);
        write_simple_error(c, 408, c.header_done ? "timed out reading the request body"
                                                 : "timed out reading the request header");
        linger(c);
        continue;
      }
      std::unique_ptr<Conn> owned = std::move(it->second);
      conns.erase(it);
      epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
      close_conn(std::move(owned));
    }
  }

  void loop() {
    epoll_event events[256];
    while (!stopping.load()) {
      const int n = epoll_wait(epfd, events, 256, 200);
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == listen_fd) {
          on_accept();
        } else if (fd == wake_fd) {
          uint64_t v;
          (void)!::read(wake_fd, &v, sizeof(v));
          take_returned();
        } else {
          on_readable(fd);
        }
      }
      expire();
    }
    for (auto& [fd, c] : conns) close_conn(std::move(c));
    conns.clear();
    loop_done.store(true);
  }
};

Transport::Transport(TransportConfig cfg, Handler handler, ErrorHandler error, Classifier is_control)
    : impl_(std::make_unique<Impl>()) {
  impl_->cfg = std::move(cfg);
  impl_->handler = std::move(handler);
  impl_->error = std::move(error);
  impl_->is_control = std::move(is_control);
  // Caps cannot exceed the descriptors this process may open (keep room for model files).
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    if (rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
      getrlimit(RLIMIT_NOFILE, &rl);
    }
    const int room = static_cast<int>(std::max<rlim_t>(rl.rlim_cur, 128) - 96);
    impl_->cfg.max_connections = std::max(16, std::min(impl_->cfg.max_connections, room));
  }
}

Transport::~Transport() {
  stop();
  if (impl_->listen_fd >= 0) ::close(impl_->listen_fd);
  if (impl_->epfd >= 0) ::close(impl_->epfd);
  if (impl_->wake_fd >= 0) ::close(impl_->wake_fd);
}

Status Transport::bind() {
  Impl& d = *impl_;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  const std::string port = std::to_string(d.cfg.port);
  if (int rc = getaddrinfo(d.cfg.host.c_str(), port.c_str(), &hints, &res); rc != 0)
    return io_error(strfmt("[serve] cannot resolve --host %s: %s", d.cfg.host.c_str(), gai_strerror(rc)));
  std::string why = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR only (a restart may rebind a port in TIME_WAIT); never SO_REUSEPORT, which
    // would let a second server bind the same port and split the traffic.
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      d.listen_fd = fd;
      break;
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  if (d.listen_fd < 0) {
    return io_error(strfmt("[serve] cannot listen on %s:%d (%s); pick another with --port", d.cfg.host.c_str(),
                           d.cfg.port, why.c_str()));
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(d.listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
  d.cfg.port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  d.epfd = epoll_create1(EPOLL_CLOEXEC);
  d.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = d.listen_fd;
  epoll_ctl(d.epfd, EPOLL_CTL_ADD, d.listen_fd, &ev);
  ev.data.fd = d.wake_fd;
  epoll_ctl(d.epfd, EPOLL_CTL_ADD, d.wake_fd, &ev);
  d.work = std::make_unique<Pool>(std::max(1, d.cfg.work_threads), "work");
  d.control = std::make_unique<Pool>(std::max(1, d.cfg.control_threads), "control");
  return Status::ok();
}

int Transport::port() const { return impl_->cfg.port; }

void Transport::serve() {
  if (impl_->epfd < 0) return;
  impl_->loop();
}

void Transport::stop() {
  Impl& d = *impl_;
  if (d.stopping.exchange(true)) return;
  if (d.wake_fd >= 0) {
    const uint64_t one = 1;
    (void)!::write(d.wake_fd, &one, sizeof(one));
  }
  // Workers finish what they are writing (the engine has drained by now) and exit.
  if (d.work) d.work->stop();
  if (d.control) d.control->stop();
  std::lock_guard<std::mutex> l(d.back_mu);
  for (auto& c : d.returned) d.close_conn(std::move(c));
  d.returned.clear();
}

Transport::Counters Transport::counters() const {
  std::lock_guard<std::mutex> l(impl_->counters_mu);
  return impl_->counters;
}

}  // namespace larder::server
