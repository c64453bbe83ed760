// validators.h — numeric flag checks with messages a person can read. CLI11's own Range and
// NonNegativeNumber print "Value -5 not in range 0.000000 to 1797693…" (DBL_MAX, 309 digits).
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <string>

#include "larder/core/status.h"

namespace larder::cli {

namespace detail {
inline bool to_number(const std::string& s, double* v) {
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return !s.empty() && end && *end == '\0' && !std::isnan(*v);
}
}  // namespace detail

// lo <= value <= hi.
inline CLI::Validator in_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        double v = 0;
        if (!detail::to_number(s, &v)) return strfmt("expected a number, got '%s'", s.c_str());
        if (v < lo || v > hi) return strfmt("must be between %g and %g (got %s)", lo, hi, s.c_str());
        return {};
      },
      strfmt("%g..%g", lo, hi));
}

// value >= lo.
inline CLI::Validator at_least(double lo) {
  return CLI::Validator(
      [lo](std::string& s) -> std::string {
        double v = 0;
        if (!detail::to_number(s, &v)) return strfmt("expected a number, got '%s'", s.c_str());
        if (v < lo) return strfmt("must be at least %g (got %s)", lo, s.c_str());
        return {};
      },
      "");
}

// value > 0.
inline CLI::Validator positive() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double v = 0;
        if (!detail::to_number(s, &v)) return strfmt("expected a number, got '%s'", s.c_str());
        if (!(v > 0)) return strfmt("must be greater than 0 (got %s)", s.c_str());
        return {};
      },
      "");
}

// A token budget: -1 (no budget: until the context is full) or at least 1.
inline CLI::Validator max_tokens_check() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double v = 0;
        if (!detail::to_number(s, &v)) return strfmt("expected a number, got '%s'", s.c_str());
        if (v != -1 && v < 1) return strfmt("must be -1 (until the context is full) or at least 1 (got %s)", s.c_str());
        return {};
      },
      "");
}

}  // namespace larder::cli
