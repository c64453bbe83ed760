// remote_url.h — the address of the remote KV tier (`larder serve --kv-remote URL`).
//
//   redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]        HOST: a name, IPv4, or [IPv6]
//   redis+unix://[[USER]:PASSWORD@]/ABSOLUTE/SOCKET[?db=DB]
//
// The URL comes from the command line or a config file: it is parsed strictly (anything not in
// the grammar is an error naming the part) and the password never leaves this struct except
// for the AUTH command — `redacted()` is what logs, errors and /stats show. A password may also
// come from the environment (LARDER_KV_REMOTE_PASSWORD), so it need not be on a command line
// that `ps` shows. USER and PASSWORD may be percent-encoded (a password with '@' or ':').
#pragma once

#include <cstdint>
#include <string>

#include "larder/core/status.h"

namespace larder::memory {

struct RemoteUrl {
  bool unix_socket = false;
  std::string host;        // TCP: host name or address (IPv6 without brackets)
  int port = 6379;         // TCP only
  std::string path;        // unix socket path
  int db = 0;              // SELECT db (0 = default, not sent)
  std::string user;        // ACL user (Redis 6+); empty = the default user
  std::string password;    // empty = no AUTH
  // The URL with the password replaced by "***" (never the secret itself).
  std::string redacted() const;
};

// Parses `url`; invalid_argument naming the offending part (the message never contains the
// password). `env_password`, when non-empty, supplies the password if the URL has none.
Result<RemoteUrl> parse_remote_url(const std::string& url, const std::string& env_password = {});

}  // namespace larder::memory
