// api.cpp — what the API surfaces share that is not a response writer: error bodies, ids, the
// longest token. Each surface's request parser and response writer live in its own file
// (api_chat.cpp, api_completions.cpp, api_messages.cpp; llama-server's native shapes in
// api_native.cpp, Ollama's in api_ollama.cpp); the writers' common part in response_writer.cpp.
#include "larder/server/api.h"

#include <cctype>
#include <cstring>
#include <unordered_map>

#include "larder/server/api_fields.h"

namespace larder::server {

using namespace fields;

namespace {

// nlohmann's SAX interface, building an ordered_json as its DOM parser does, except that each
// open object of more than kScan keys finds its keys through a hash map (smaller ones scan, which
// is cheaper than hashing).
class LinearBuilder {
 public:
  using number_integer_t = ordered_json::number_integer_t;
  using number_unsigned_t = ordered_json::number_unsigned_t;
  using number_float_t = ordered_json::number_float_t;
  using string_t = ordered_json::string_t;
  using binary_t = ordered_json::binary_t;

  LinearBuilder(ordered_json* root, int max_depth) : root_(root), max_depth_(max_depth) {}

  bool null() { return put(nullptr) != nullptr; }
  bool boolean(bool v) { return put(v) != nullptr; }
  bool number_integer(number_integer_t v) { return put(v) != nullptr; }
  bool number_unsigned(number_unsigned_t v) { return put(v) != nullptr; }
  bool number_float(number_float_t v, const string_t&) { return put(v) != nullptr; }
  bool string(string_t& v) { return put(std::move(v)) != nullptr; }
  bool binary(binary_t&) { return false; }  // not in JSON text
  bool start_object(std::size_t) { return open(ordered_json::object()); }
  bool start_array(std::size_t) { return open(ordered_json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(string_t& k) {
    Open& o = stack_.back();
    auto& obj = o.node->get_ref<ordered_json::object_t&>();
    o.existing = kNone;
    if (!o.index.empty()) {
      if (auto it = o.index.find(k); it != o.index.end()) o.existing = it->second;
    } else {
      for (size_t i = 0; i < obj.size(); ++i)
        if (entry(obj, i).first == k) o.existing = i;
    }
    o.key = std::move(k);
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    if (error_.empty()) error_ = e.what();
    return false;
  }

  const std::string& error() const { return error_; }
  bool too_deep() const { return too_deep_; }

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);
  static constexpr size_t kScan = 16;
  // The i-th member (ordered_map's operator[] takes a key).
  static ordered_json::object_t::value_type& entry(ordered_json::object_t& obj, size_t i) {
    return *(obj.begin() + static_cast<std::ptrdiff_t>(i));
  }

  struct Open {
    ordered_json* node;
    std::string key;                                // the object's pending key
    size_t existing = kNone;                        // its index when it is a duplicate
    std::unordered_map<std::string, size_t> index;  // key → index, once the object is large
  };

  // Stores a value where the parse is (the root, the open array's end, the open object's
  // pending key) and returns it.
  template <class V>
  ordered_json* put(V&& v) {
    if (stack_.empty()) {
      *root_ = ordered_json(std::forward<V>(v));
      return root_;
    }
    Open& o = stack_.back();
    if (o.node->is_array()) {
      auto& arr = o.node->get_ref<ordered_json::array_t&>();
      arr.emplace_back(std::forward<V>(v));
      return &arr.back();
    }
    auto& obj = o.node->get_ref<ordered_json::object_t&>();
    if (o.existing != kNone) {  // a duplicate key: the last value wins, in the first one's place
      entry(obj, o.existing).second = ordered_json(std::forward<V>(v));
      return &entry(obj, o.existing).second;
    }
    obj.emplace_back(o.key, ordered_json(std::forward<V>(v)));
    if (!o.index.empty()) {
      o.index.emplace(std::move(o.key), obj.size() - 1);
    } else if (obj.size() > kScan) {
      o.index.reserve(obj.size() * 2);
      for (size_t i = 0; i < obj.size(); ++i) o.index.emplace(entry(obj, i).first, i);
    }
    return &obj.back().second;
  }

  bool open(ordered_json v) {
    if (static_cast<int>(stack_.size()) >= max_depth_) {
      too_deep_ = true;
      return false;
    }
    ordered_json* node = put(std::move(v));
    stack_.push_back(Open{node, {}, kNone, {}});
    return true;
  }

  bool close() {
    stack_.pop_back();
    return true;
  }

  ordered_json* root_;
  int max_depth_;
  std::vector<Open> stack_;
  std::string error_;
  bool too_deep_ = false;
};

}  // namespace

std::optional<std::string> parse_json_linear(std::string_view text, int max_depth, ordered_json* out) {
  *out = ordered_json();
  LinearBuilder b(out, max_depth);
  const bool ok = ordered_json::sax_parse(text.begin(), text.end(), &b, nlohmann::detail::input_format_t::json,
                                          /*strict=*/true, /*ignore_comments=*/false);
  if (ok) return std::nullopt;
  *out = ordered_json();
  if (b.too_deep()) return strfmt("the JSON nests deeper than %d levels", max_depth);
  return b.error().empty() ? std::string("invalid JSON") : b.error();
}


std::string random_id(const std::string& prefix) {
  static const char kAlphabet[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  thread_local std::mt19937_64 rng(random_seed());
  std::string s = prefix;
  for (int i = 0; i < 24; ++i) s += kAlphabet[rng() % 62];
  return s;
}

const char* openai_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 500: return "server_error";
    case 503: return "unavailable_error";
    default: return "invalid_request_error";
  }
}

std::string public_error_message(std::string m) {
  static const char* kSuffixes[] = {".cc:", ".cpp:", ".cxx:", ".c:", ".h:", ".hpp:", ".hh:", ".inl:"};
  for (;;) {
    // The first "file.cc:LINE" in what is left.
    size_t at = std::string::npos, len = 0;
    for (const char* sfx : kSuffixes) {
      const size_t n = std::strlen(sfx);
      for (size_t p = m.find(sfx); p != std::string::npos && p < at; p = m.find(sfx, p + 1)) {
        if (p + n < m.size() && std::isdigit(static_cast<unsigned char>(m[p + n]))) {
          at = p;
          len = n;
          break;
        }
      }
    }
    if (at == std::string::npos) return m;
    size_t start = at;  // back to the start of the path
    while (start > 0 && !std::isspace(static_cast<unsigned char>(m[start - 1])) && !std::strchr("'\"([", m[start - 1])) --start;
    size_t end = at + len;
    while (end < m.size() && std::isdigit(static_cast<unsigned char>(m[end]))) ++end;
    if (m.compare(end, 2, ": ") == 0) end += 2;
    // xgrammar's "[HH:MM:SS] " in front of it.
    if (start >= 11 && m[start - 1] == ' ' && m[start - 2] == ']' && m[start - 11] == '[') start -= 11;
    m.erase(start, end - start);
  }
}

ordered_json openai_error_body(const ApiError& e) {
  ordered_json err = {{"message", public_error_message(e.message)}, {"type", openai_error_type(e.status)}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return {{"error", err}};
}

ordered_json anthropic_error_body(const ApiError& e) {
  const char* type = "invalid_request_error";
  switch (e.status) {
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 500: type = "api_error"; break;
    case 503: case 529: type = "overloaded_error"; break;
    default: break;
  }
  return {{"type", "error"}, {"error", {{"type", type}, {"message", public_error_message(e.message)}}}};
}

int64_t longest_token_bytes(const runtime::LoadedModel& m) {
  const int64_t V = m.model->info().vocab;
  int64_t longest = 0;
  for (int64_t id = 0; id < V; ++id)
    longest = std::max<int64_t>(longest, static_cast<int64_t>(m.tokenizer->decode({static_cast<int32_t>(id)}, false).size()));
  return longest;
}

}  // namespace larder::server
