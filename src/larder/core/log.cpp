#include "larder/core/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

namespace larder {
namespace {

LogLevel initial_level() {
  const char* env = std::getenv("LARDER_LOG");
  if (!env) return LogLevel::kInfo;
  if (!std::strcmp(env, "error")) return LogLevel::kError;
  if (!std::strcmp(env, "warn")) return LogLevel::kWarn;
  if (!std::strcmp(env, "debug")) return LogLevel::kDebug;
  return LogLevel::kInfo;
}

std::atomic<int>& level_ref() {
  static std::atomic<int> level{static_cast<int>(initial_level())};
  return level;
}

}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(level_ref().load(std::memory_order_relaxed)); }
void set_log_level(LogLevel level) { level_ref().store(static_cast<int>(level)); }

void log_message(LogLevel level, const char* fmt, ...) {
  if (level > log_level()) return;
  static const char* kNames[] = {"error", "warn", "info", "debug"};
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "larder %s: %s\n", kNames[static_cast<int>(level)], buf);
}

void log_warn_once(const std::string& key, const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> seen;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!seen.insert(key).second) return;
  }
  log_message(LogLevel::kWarn, "%s", message.c_str());
}

}  // namespace larder
