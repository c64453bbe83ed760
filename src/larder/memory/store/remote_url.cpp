#include "larder/memory/store/remote_url.h"

#include <cctype>

namespace larder::memory {

namespace {

constexpr size_t kMaxUrl = 4096;

Status bad(const std::string& what) { return invalid_argument("[kv-remote] invalid URL: " + what); }

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decoding of the userinfo parts. Control characters are refused (they could not be
// typed into redis-cli either, and a NUL would cut the AUTH argument).
Result<std::string> pct_decode(const std::string& s, const char* part) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '%') {
      const int hi = i + 1 < s.size() ? hexval(s[i + 1]) : -1;
      const int lo = i + 2 < s.size() ? hexval(s[i + 2]) : -1;
      if (hi < 0 || lo < 0) return bad(std::string("bad percent escape in the ") + part);
      c = static_cast<char>(hi * 16 + lo);
      i += 2;
    }
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return bad(std::string("control character in the ") + part);
    out.push_back(c);
  }
  return out;
}

// Strict decimal in [lo, hi]: digits only, no sign, no spaces, at most 10 digits.
bool parse_int(const std::string& s, long lo, long hi, int* out) {
  if (s.empty() || s.size() > 10) return false;
  long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

bool host_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_'; }

}  // namespace

std::string RemoteUrl::redacted() const {
  std::string auth;
  if (!user.empty() || !password.empty()) auth = user + (password.empty() ? "" : ":***") + "@";
  if (unix_socket) return "redis+unix://" + auth + path + (db ? "?db=" + std::to_string(db) : "");
  const bool v6 = host.find(':') != std::string::npos;
  return "redis://" + auth + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port) +
         (db ? "/" + std::to_string(db) : "");
}

Result<RemoteUrl> parse_remote_url(const std::string& url, const std::string& env_password) {
  if (url.size() > kMaxUrl) return bad("longer than 4096 bytes");
  for (char c : url) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) return bad("contains a space or control character");
  }
  RemoteUrl u;
  std::string rest;
  if (url.rfind("redis://", 0) == 0) {
    rest = url.substr(8);
  } else if (url.rfind("redis+unix://", 0) == 0) {
    u.unix_socket = true;
    rest = url.substr(13);
  } else {
    return bad("the scheme must be redis:// or redis+unix://");
  }
  if (rest.find('#') != std::string::npos) return bad("a fragment (#) is not allowed");
  // userinfo: everything before the last '@' that precedes the path ('@' in a password must be
  // percent-encoded, but a raw one before the host is still unambiguous up to the last '@').
  const size_t slash = u.unix_socket ? rest.find('/') : rest.find_first_of("/?");
  const size_t at = rest.rfind('@', slash == std::string::npos ? std::string::npos : slash);
  if (at != std::string::npos && (slash == std::string::npos || at < slash)) {
    const std::string info = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = info.find(':');
    if (colon == std::string::npos) {
      // "redis://secret@host" is redis-cli's form for a password alone.
      LARDER_ASSIGN_OR_RETURN(u.password, pct_decode(info, "password"));
    } else {
      LARDER_ASSIGN_OR_RETURN(u.user, pct_decode(info.substr(0, colon), "user"));
      LARDER_ASSIGN_OR_RETURN(u.password, pct_decode(info.substr(colon + 1), "password"));
    }
    if (u.password.empty() && u.user.empty()) return bad("empty user information before '@'");
  }
  if (u.unix_socket) {
    std::string query;
    const size_t q = rest.find('?');
    if (q != std::string::npos) {
      query = rest.substr(q + 1);
      rest = rest.substr(0, q);
    }
    if (rest.empty() || rest[0] != '/') return bad("redis+unix:// needs an absolute socket path");
    if (rest.size() > 107) return bad("the socket path is longer than 107 bytes");
    if (rest.find("%") != std::string::npos) return bad("percent escapes are not allowed in the socket path");
    u.path = rest;
    if (!query.empty()) {
      if (query.rfind("db=", 0) != 0 || !parse_int(query.substr(3), 0, 1 << 20, &u.db))
        return bad("the only query parameter is db=N (N a number 0..1048576)");
    }
  } else {
    if (rest.find('?') != std::string::npos) return bad("query parameters are not allowed in redis:// (use /DB)");
    std::string hostport = rest, dbs;
    const size_t s = rest.find('/');
    if (s != std::string::npos) {
      hostport = rest.substr(0, s);
      dbs = rest.substr(s + 1);
      if (!dbs.empty() && !parse_int(dbs, 0, 1 << 20, &u.db)) return bad("the database must be a number 0..1048576");
    }
    std::string portstr;
    bool has_port = false;
    if (!hostport.empty() && hostport[0] == '[') {
      const size_t close = hostport.find(']');
      if (close == std::string::npos) return bad("unclosed '[' in the IPv6 host");
      u.host = hostport.substr(1, close - 1);
      for (char c : u.host) {
        if (!std::isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') return bad("bad IPv6 address");
      }
      if (u.host.empty()) return bad("empty IPv6 address");
      const std::string after = hostport.substr(close + 1);
      if (!after.empty()) {
        if (after[0] != ':') return bad("unexpected text after the IPv6 address");
        portstr = after.substr(1);
        has_port = true;
      }
    } else {
      const size_t c = hostport.find(':');
      u.host = hostport.substr(0, c);
      if (c != std::string::npos) {
        portstr = hostport.substr(c + 1);
        has_port = true;
      }
      if (u.host.empty()) return bad("missing host");
      if (u.host.size() > 253) return bad("the host name is longer than 253 bytes");
      for (char ch : u.host) {
        if (!host_char(ch)) return bad("bad character in the host name");
      }
    }
    if (has_port && !parse_int(portstr, 1, 65535, &u.port)) return bad("the port must be a number 1..65535");
  }
  if (u.password.empty() && !env_password.empty()) u.password = env_password;
  return u;
}

}  // namespace larder::memory
