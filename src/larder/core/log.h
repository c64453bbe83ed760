// log.h — leveled logging to stderr. Level from LARDER_LOG (error|warn|info|debug), default info.
#pragma once

#include <string>
#include <string_view>

namespace larder {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// `s` made safe for one line of a log or a terminal: control bytes (CR, LF, ESC, NUL, DEL, the
// C1 range), backslashes, bytes that are not UTF-8, and any of `also` are written as escapes
// (\n, \r, \t, \\, \xHH, \u0085), so text from a client can neither forge a log line nor
// drive a terminal. Valid UTF-8 stays readable. log_message applies it to every message.
std::string log_escape(std::string_view s, std::string_view also = {});
// `v` as a Prometheus label value (text exposition format): backslash, double quote and newline
// escaped. Label values can come from clients and flags (routes, adapter names).
std::string prometheus_label_escape(std::string_view v);
// Reports a failure class once per process (best-effort subsystems: SSD tier, metrics, ...).
void log_warn_once(const std::string& key, const std::string& message);

}  // namespace larder

#define LARDER_LOG_ERROR(...) ::larder::log_message(::larder::LogLevel::kError, __VA_ARGS__)
#define LARDER_LOG_WARN(...) ::larder::log_message(::larder::LogLevel::kWarn, __VA_ARGS__)
#define LARDER_LOG_INFO(...) ::larder::log_message(::larder::LogLevel::kInfo, __VA_ARGS__)
#define LARDER_LOG_DEBUG(...)                                                      \
  do {                                                                             \
    if (::larder::log_level() >= ::larder::LogLevel::kDebug)                       \
      ::larder::log_message(::larder::LogLevel::kDebug, __VA_ARGS__);              \
  } while (0)
