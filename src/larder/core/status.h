// status.h — the one error type that crosses module boundaries.
//
// Library code never throws across a layer boundary and never calls exit(): it returns a
// Status or a Result<T>. Messages start with the component in brackets and carry the facts a
// user needs to act, e.g.
//   [safetensors] model.safetensors: tensor 'lm_head.weight' byte range 120..4216 exceeds data size 4096
// Only tools/ and server/ turn a Status into an exit code or an HTTP status.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace larder {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kUnsupported,
  kOutOfMemory,
  kIoError,
  kCorrupt,
  kIncompatible,
  kCancelled,
  kResourceExhausted,
  kUnavailable,
  kInternal,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid_argument: [component] message"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// printf-style formatting into std::string (GCC 12 has no <format>).
std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
inline Status incompatible(std::string m) { return {StatusCode::kIncompatible, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Result<T>: a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {            // NOLINT
    if (std::get<Status>(v_).is_ok()) v_ = Status(StatusCode::kInternal, "Result built from ok Status");
  }
  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOkStatus;
    return is_ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace larder

// Propagate a non-ok Status / Result from the current function.
#define LARDER_RETURN_IF_ERROR(expr)                \
  do {                                              \
    ::larder::Status _st = (expr);                  \
    if (!_st.is_ok()) return _st;                   \
  } while (0)

#define LARDER_CONCAT_INNER(a, b) a##b
#define LARDER_CONCAT(a, b) LARDER_CONCAT_INNER(a, b)
// LARDER_ASSIGN_OR_RETURN(auto x, make_x());
#define LARDER_ASSIGN_OR_RETURN(lhs, expr) \
  LARDER_ASSIGN_OR_RETURN_IMPL(LARDER_CONCAT(_res_, __LINE__), lhs, expr)
#define LARDER_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.is_ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

// Broken invariants (programmer errors) abort with a message: aborting beats serving garbage.
#define LARDER_CHECK(cond, ...)                                                              \
  do {                                                                                       \
    if (__builtin_expect(!(cond), 0)) {                                                      \
      std::fprintf(stderr, "larder: check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, "" __VA_ARGS__);                                                  \
      std::fputc('\n', stderr);                                                              \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)
#ifdef NDEBUG
#define LARDER_DCHECK(cond, ...) \
  do {                           \
  } while (0)
#else
#define LARDER_DCHECK(cond, ...) LARDER_CHECK(cond, __VA_ARGS__)
#endif
