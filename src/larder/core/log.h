// log.h — leveled logging to stderr. Level from LARDER_LOG (error|warn|info|debug), default info.
#pragma once

#include <string>

namespace larder {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
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
