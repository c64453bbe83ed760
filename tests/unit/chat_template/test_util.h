// test_util.h — shared helpers for the chat-template tests.
#pragma once

#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace larder::chat_template::testing {

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::string data_path(const std::string& name) {
  return std::string(LARDER_TEST_DATA_DIR) + "/chat_template/" + name;
}

inline std::tm parse_fixed_now(const std::string& s) {
  std::tm tm{};
  strptime(s.c_str(), "%Y-%m-%d %H:%M:%S", &tm);
  std::time_t t = timegm(&tm);
  gmtime_r(&t, &tm);
  return tm;
}

inline std::string escape_snippet(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\x%02x", c); out += b; }
    else out += static_cast<char>(c);
  }
  return out;
}

// Where two renderings first differ, as "byte N (line L, col C)" with both sides around it.
inline std::string describe_diff(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  int line = 1, col = 1;
  for (size_t k = 0; k < i; ++k) {
    if (want[k] == '\n') { ++line; col = 1; } else { ++col; }
  }
  size_t from = i > 60 ? i - 60 : 0;
  std::ostringstream os;
  os << "first difference at byte " << i << " (line " << line << ", col " << col << "); lengths jinja2=" << want.size()
     << " larder=" << got.size() << "\n  jinja2: ..." << escape_snippet(want.substr(from, i - from)) << "[[" 
     << escape_snippet(want.substr(i, 60)) << "]]\n  larder: ..." << escape_snippet(got.substr(from, i - from)) << "[["
     << escape_snippet(got.substr(i, 60)) << "]]";
  return os.str();
}

}  // namespace larder::chat_template::testing
