#include "larder/runtime/tool_calls.h"

#include <algorithm>

namespace larder::runtime {

using nlohmann::ordered_json;

namespace {
constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>", kPythonTag = "<|python_tag|>";

size_t partial_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

std::string_view trim(std::string_view s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string_view::npos) return {};
  const size_t b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}
}  // namespace

const ordered_json* ToolCallParser::param_schema(const std::string& fn, const std::string& param) const {
  if (!tools_.is_array()) return nullptr;
  for (const ordered_json& t : tools_) {
    const ordered_json* f = t.is_object() && t.contains("function") ? &t["function"] : &t;
    if (!f->is_object() || f->value("name", "") != fn || !f->contains("parameters")) continue;
    const ordered_json& ps = (*f)["parameters"];
    if (!ps.is_object() || !ps.contains("properties") || !ps["properties"].is_object()) return nullptr;
    const ordered_json& props = ps["properties"];
    return props.contains(param) && props[param].is_object() ? &props[param] : nullptr;
  }
  return nullptr;
}

// <function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n...</function>: the newline after each
// opening tag and before each closing one belongs to the markup, not to the value.
bool ToolCallParser::parse_xml_call(std::string_view t, std::vector<ToolCall>* out) const {
  constexpr std::string_view kFn = "<function=", kFnEnd = "</function>", kParam = "<parameter=",
                             kParamEnd = "</parameter>";
  if (t.substr(0, kFn.size()) != kFn) return false;
  const size_t name_end = t.find('>');
  if (name_end == std::string_view::npos) return false;
  ToolCall c;
  c.name = std::string(trim(t.substr(kFn.size(), name_end - kFn.size())));
  if (c.name.empty()) return false;
  c.arguments = ordered_json::object();
  std::string_view rest = t.substr(name_end + 1);
  for (;;) {
    rest = trim(rest);
    if (rest.empty() || rest == kFnEnd) break;  // EOS before </function> still ends the call
    if (rest.substr(0, kParam.size()) != kParam) return false;
    const size_t pn_end = rest.find('>');
    if (pn_end == std::string_view::npos) return false;
    const std::string param(trim(rest.substr(kParam.size(), pn_end - kParam.size())));
    if (param.empty()) return false;
    rest = rest.substr(pn_end + 1);
    const size_t v_end = rest.find(kParamEnd);
    if (v_end == std::string_view::npos) return false;
    std::string_view v = rest.substr(0, v_end);
    if (!v.empty() && v.front() == '\n') v.remove_prefix(1);
    if (!v.empty() && v.back() == '\n') v.remove_suffix(1);
    // A free string keeps its text (code, with its blank lines). Anything else is the trimmed
    // text: blanks around an enum word or a number are layout (the grammar allows one there),
    // and what parses as JSON (42, true, {...}) is that value.
    const ordered_json* ps = param_schema(c.name, param);
    const bool fixed = ps && (ps->contains("enum") || ps->contains("const"));
    ordered_json value = std::string(v);
    if (fixed || !ps || ps->value("type", ordered_json()) != "string") {
      const std::string_view tv = trim(v);
      ordered_json j = ordered_json::parse(tv, nullptr, /*allow_exceptions=*/false);
      value = j.is_discarded() ? ordered_json(std::string(tv)) : std::move(j);
      // Fixed values: the JSON reading only when it is one of them (an enum of "1", "true" is text).
      if (fixed && !value.is_string()) {
        const bool listed = ps->contains("enum") && (*ps)["enum"].is_array()
                                ? std::find((*ps)["enum"].begin(), (*ps)["enum"].end(), value) != (*ps)["enum"].end()
                                : ps->contains("const") && (*ps)["const"] == value;
        if (!listed) value = std::string(tv);
      }
    }
    c.arguments[param] = std::move(value);
    rest = rest.substr(v_end + kParamEnd.size());
  }
  out->push_back(std::move(c));
  return true;
}

bool ToolCallParser::parse_call(const std::string& body, std::vector<ToolCall>* out) const {
  std::string_view t = trim(body);
  if (style_ != ToolCallStyle::kBareJson && t.substr(0, 10) == "<function=") return parse_xml_call(t, out);
  if (t.substr(0, kPythonTag.size()) == kPythonTag) t = trim(t.substr(kPythonTag.size()));
  ordered_json j = ordered_json::parse(t, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return false;
  std::vector<ordered_json> items;
  if (j.is_array()) {
    items.assign(j.begin(), j.end());
  } else {
    items.push_back(j);
  }
  std::vector<ToolCall> calls;
  for (const ordered_json& it : items) {
    if (!it.is_object() || !it.contains("name") || !it["name"].is_string()) return false;
    ToolCall c;
    c.name = it["name"].get<std::string>();
    const char* key = it.contains("arguments") ? "arguments" : it.contains("parameters") ? "parameters" : nullptr;
    c.arguments = key ? it[key] : ordered_json::object();
    if (c.arguments.is_string()) {  // some models double-encode the arguments
      ordered_json inner = ordered_json::parse(c.arguments.get<std::string>(), nullptr, false);
      if (!inner.is_discarded()) c.arguments = inner;
    }
    calls.push_back(std::move(c));
  }
  if (calls.empty()) return false;
  out->insert(out->end(), calls.begin(), calls.end());
  return true;
}

std::string ToolCallParser::push(std::string_view text) {
  if (style_ == ToolCallStyle::kNone) return std::string(text);
  pending_.append(text);
  std::string out;
  if (style_ == ToolCallStyle::kBareJson) {
    if (!decided_) {
      const std::string_view t = trim(pending_);
      if (t.empty()) return {};
      // Undecided until the first non-blank character (or the python tag) is known.
      if (kPythonTag.substr(0, std::min(t.size(), kPythonTag.size())) == t.substr(0, std::min(t.size(), kPythonTag.size())) &&
          t.size() < kPythonTag.size())
        return {};
      decided_ = true;
      json_mode_ = t[0] == '{' || t[0] == '[' || t.substr(0, kPythonTag.size()) == kPythonTag;
    }
    if (json_mode_) return {};
    out.swap(pending_);
    return out;
  }
  for (;;) {
    if (!inside_) {
      const size_t at = pending_.find(kOpen);
      if (at == std::string::npos) break;
      out.append(pending_, 0, at);
      pending_.erase(0, at + kOpen.size());
      inside_ = true;
    } else {
      const size_t at = pending_.find(kClose);
      if (at == std::string::npos) return out;  // hold the whole body until it closes
      const std::string body = pending_.substr(0, at);
      pending_.erase(0, at + kClose.size());
      inside_ = false;
      const size_t before = ready_.size();
      if (!parse_call(body, &ready_)) {
        out += std::string(kOpen) + body + std::string(kClose);  // not a call after all: plain text
      }
      total_ += ready_.size() - before;
    }
  }
  const size_t hold = partial_suffix(pending_, kOpen);
  out.append(pending_, 0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string ToolCallParser::flush() {
  if (style_ == ToolCallStyle::kNone) return {};
  std::string out;
  if (style_ == ToolCallStyle::kBareJson) {
    const size_t before = ready_.size();
    if (json_mode_ && parse_call(pending_, &ready_)) {
      total_ += ready_.size() - before;
    } else {
      out = pending_;
    }
  } else if (inside_) {
    // Generation ended inside the markup (EOS before the closing tag): a complete JSON body
    // still counts as a call.
    const size_t before = ready_.size();
    if (parse_call(pending_, &ready_)) {
      total_ += ready_.size() - before;
    } else {
      out = std::string(kOpen) + pending_;
    }
  } else {
    out = pending_;
  }
  pending_.clear();
  inside_ = false;
  return out;
}

std::vector<ToolCall> ToolCallParser::take_calls() {
  std::vector<ToolCall> r;
  r.swap(ready_);
  return r;
}

}  // namespace larder::runtime
