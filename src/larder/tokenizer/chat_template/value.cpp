// value.cpp — Python semantics of template values: str()/repr(), ==, truthiness, json.dumps.
#include "larder/tokenizer/chat_template/value.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace larder::chat_template {

void throw_error(TemplateError::Kind kind, std::string message, int line) {
  throw TemplateError{kind, std::move(message), line};
}

// ---------------------------------------------------------------- UTF-8 and Unicode properties

std::vector<uint32_t> utf8_decode(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    uint32_t cp;
    size_t n;
    if (c < 0x80) { cp = c; n = 1; }
    else if ((c >> 5) == 6) { cp = c & 0x1f; n = 2; }
    else if ((c >> 4) == 14) { cp = c & 0x0f; n = 3; }
    else if ((c >> 3) == 30) { cp = c & 0x07; n = 4; }
    else { out.push_back(0xfffd); ++i; continue; }  // invalid lead byte
    if (i + n > s.size()) { out.push_back(0xfffd); ++i; continue; }
    bool ok = true;
    for (size_t k = 1; k < n; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 2) { ok = false; break; }
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (!ok) { out.push_back(0xfffd); ++i; continue; }
    out.push_back(cp);
    i += n;
  }
  return out;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end && i < cps.size(); ++i) utf8_append(out, cps[i]);
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

// str.isspace(): the characters Python's str.strip()/split() treat as whitespace.
bool py_isspace(uint32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f) || cp == 0x85) return true;
  if (cp < 0xa0) return false;
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  if (cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP) return true;
  return false;
}

// str.isprintable() per character, which decides what repr() escapes: everything except
// categories Cc Cf Cs Co Cn Zl Zp and Zs other than the ASCII space.
bool py_isprintable(uint32_t cp) {
  if (cp == ' ') return true;
  if (cp < 0x20 || cp == 0x7f) return false;
  if (cp < 0x7f) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

uint32_t py_lower(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
  return static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)));
}
uint32_t py_upper(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') ? cp - 32 : cp;
  return static_cast<uint32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp)));
}
bool py_isalpha(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}
bool py_isdigit(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp)) == UTF8PROC_CATEGORY_ND;
}
bool py_is_cased_upper(uint32_t cp) { return py_lower(cp) != cp || (cp < 0x80 ? (cp >= 'A' && cp <= 'Z') : utf8proc_category(static_cast<utf8proc_int32_t>(cp)) == UTF8PROC_CATEGORY_LU); }
bool py_is_cased_lower(uint32_t cp) { return py_upper(cp) != cp || (cp < 0x80 ? (cp >= 'a' && cp <= 'z') : utf8proc_category(static_cast<utf8proc_int32_t>(cp)) == UTF8PROC_CATEGORY_LL); }

// ---------------------------------------------------------------- numbers

// Python's repr(float): the shortest digit string that round-trips, printed in positional
// notation when the decimal exponent is in [-4, 16), else as d.ddde+XX.
std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf: [-]d.ddde[+-]XX
  std::string s(buf);
  bool neg = s[0] == '-';
  if (neg) s.erase(0, 1);
  size_t e = s.find('e');
  std::string mant = s.substr(0, e);
  int exp10 = std::atoi(s.c_str() + e + 1);
  std::string digits;
  for (char c : mant) if (c != '.') digits += c;
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  std::string out = neg ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits + std::string(decpt - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  }
  return out;
}

// ---------------------------------------------------------------- construction

Value Value::from_json(const nlohmann::ordered_json& j) {
  using J = nlohmann::ordered_json;
  switch (j.type()) {
    case J::value_t::null: return none();
    case J::value_t::boolean: return boolean(j.get<bool>());
    case J::value_t::number_integer: return integer(j.get<int64_t>());
    case J::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return floating(static_cast<double>(u));
      return integer(static_cast<int64_t>(u));
    }
    case J::value_t::number_float: return floating(j.get<double>());
    case J::value_t::string: return string(j.get<std::string>());
    case J::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json(e));
      return list(std::move(l));
    }
    case J::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(string(it.key()), from_json(it.value()));
      return dict(std::move(d));
    }
    default: return undefined();
  }
}

// ---------------------------------------------------------------- Dict

static uint16_t checked_depth(size_t d) {
  if (d > Value::kMaxNesting) throw_error(TemplateError::Kind::kLimit, "values nested too deeply");
  return static_cast<uint16_t>(d);
}

uint16_t Value::nesting_of(const List& items) {
  size_t d = 0;
  for (const auto& e : items) d = std::max<size_t>(d, e.depth_);
  return checked_depth(d + 1);
}

Value Value::dict(Dict d) {
  Value v;
  v.t_ = Type::kDict;
  size_t depth = 0;
  for (const auto& kv : d.items) depth = std::max<size_t>(depth, std::max(kv.first.depth_, kv.second.depth_));
  v.depth_ = checked_depth(depth + 1);
  v.d_map_ = std::make_shared<Dict>(std::move(d));
  return v;
}

void Value::note_child_depth(uint16_t d) const {
  depth_ = std::max<uint16_t>(depth_, checked_depth(static_cast<size_t>(d) + 1));
}

bool Value::hashable() const {
  switch (t_) {
    case Type::kList: {
      if (kind_ != SeqKind::kTuple) return kind_ == SeqKind::kGenerator || kind_ == SeqKind::kReverseIter || kind_ == SeqKind::kRange;
      for (const auto& e : *l_) if (!e.hashable()) return false;
      return true;
    }
    case Type::kDict: case Type::kNamespace: case Type::kLoop: return false;
    default: return true;
  }
}

const Value* Dict::find(const Value& key) const {
  for (const auto& kv : items) if (kv.first.equals(key)) return &kv.second;
  return nullptr;
}
Value* Dict::find(const Value& key) {
  for (auto& kv : items) if (kv.first.equals(key)) return &kv.second;
  return nullptr;
}
void Dict::set(const Value& key, Value v) {
  if (Value* p = find(key)) { *p = std::move(v); return; }
  items.emplace_back(key, std::move(v));
}

// ---------------------------------------------------------------- semantics

bool Value::truthy() const {
  switch (t_) {
    case Type::kUndefined: case Type::kNone: return false;
    case Type::kBool: case Type::kInt: return i_ != 0;
    case Type::kFloat: return d_ != 0;
    case Type::kString: return !s_->empty();
    case Type::kList: return (kind_ == SeqKind::kGenerator || kind_ == SeqKind::kReverseIter) || !l_->empty();
    case Type::kDict: return !d_map_->items.empty();
    default: return true;
  }
}

static std::string repr_string(const std::string& s) {
  // Python picks single quotes unless the text has ' and no ".
  bool has_sq = s.find('\'') != std::string::npos, has_dq = s.find('"') != std::string::npos;
  char q = (has_sq && !has_dq) ? '"' : '\'';
  std::string out(1, q);
  for (uint32_t cp : utf8_decode(s)) {
    if (cp == static_cast<uint32_t>(q) || cp == '\\') { out += '\\'; out += static_cast<char>(cp); }
    else if (cp == '\t') out += "\\t";
    else if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (py_isprintable(cp)) utf8_append(out, cp);
    else {
      char b[16];
      if (cp < 0x100) std::snprintf(b, sizeof b, "\\x%02x", cp);
      else if (cp < 0x10000) std::snprintf(b, sizeof b, "\\u%04x", cp);
      else std::snprintf(b, sizeof b, "\\U%08x", cp);
      out += b;
    }
  }
  out += q;
  return out;
}

std::string Value::str() const {
  switch (t_) {
    case Type::kUndefined: return "";
    case Type::kNone: return "None";
    case Type::kBool: return i_ ? "True" : "False";
    case Type::kInt: return std::to_string(i_);
    case Type::kFloat: return python_float_repr(d_);
    case Type::kString: return *s_;
    default: return repr();
  }
}

std::string Value::repr() const {
  // A namespace can contain itself (set ns.me = ns); Python prints such cycles as "...".
  static thread_local int depth = 0;
  if (depth > 100) return "...";
  struct Guard { Guard() { ++depth; } ~Guard() { --depth; } } guard;
  switch (t_) {
    case Type::kString: return markup_ ? "Markup(" + repr_string(*s_) + ")" : repr_string(*s_);
    case Type::kList: {
      // Generators print their (address-bearing) object repr in Python; the address can't be
      // reproduced, so the form is kept and the address is a fixed placeholder.
      if (kind_ == SeqKind::kGenerator) return "<generator object at 0x0>";
      if (kind_ == SeqKind::kReverseIter) return "<list_reverseiterator object at 0x0>";
      if (kind_ == SeqKind::kRange) return s_ ? *s_ : "range(0, 0)";
      bool tuple = kind_ == SeqKind::kTuple;
      std::string out = tuple ? "(" : "[";
      for (size_t i = 0; i < l_->size(); ++i) {
        if (i) out += ", ";
        out += (*l_)[i].repr();
      }
      if (tuple && l_->size() == 1) out += ",";
      out += tuple ? ")" : "]";
      if (kind_ == SeqKind::kDictItems) return "dict_items(" + out + ")";
      if (kind_ == SeqKind::kDictKeys) return "dict_keys(" + out + ")";
      if (kind_ == SeqKind::kDictValues) return "dict_values(" + out + ")";
      return out;
    }
    case Type::kDict: case Type::kNamespace: {
      std::string out = t_ == Type::kNamespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : d_map_->items) {
        if (!first) out += ", ";
        first = false;
        out += k.repr() + ": " + v.repr();
      }
      out += t_ == Type::kNamespace ? "}>" : "}";
      return out;
    }
    case Type::kCallable: return c_->is_macro ? "<Macro '" + c_->name + "'>" : "<built-in method " + c_->name + ">";
    case Type::kLoop: {
      return "<LoopContext " + std::to_string(loop_->index0 + 1) + "/" + std::to_string(loop_->items ? loop_->items->size() : 0) + ">";
    }
    case Type::kUndefined: return "Undefined";
    default: return str();
  }
}

std::string Value::type_repr() const {
  switch (t_) {
    case Type::kUndefined: return "Undefined";
    case Type::kNone: return "None";
    case Type::kBool: return "bool object";
    case Type::kInt: return "int object";
    case Type::kFloat: return "float object";
    case Type::kString: return markup_ ? "markupsafe.Markup object" : "str object";
    case Type::kList: {
      switch (kind_) {
        case SeqKind::kTuple: return "tuple object";
        case SeqKind::kGenerator: return "generator object";
        case SeqKind::kReverseIter: return "list_reverseiterator object";
        case SeqKind::kDictItems: return "dict_items object";
        case SeqKind::kDictKeys: return "dict_keys object";
        case SeqKind::kDictValues: return "dict_values object";
        case SeqKind::kRange: return "range object";
        default: return "list object";
      }
    }
    case Type::kDict: return "dict object";
    case Type::kNamespace: return "jinja2.utils.Namespace object";
    case Type::kLoop: return "jinja2.runtime.LoopContext object";
    case Type::kCallable: return c_->is_macro ? "jinja2.runtime.Macro object" : "builtin_function_or_method object";
  }
  return "object";
}

bool Value::equals(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (is_float() || o.is_float()) return as_double() == o.as_double();
    return i_ == o.i_;
  }
  if (t_ != o.t_) return false;
  switch (t_) {
    case Type::kUndefined: case Type::kNone: return true;
    case Type::kString: return *s_ == *o.s_;
    case Type::kList: {
      if (kind_ != o.kind_ || l_->size() != o.l_->size()) return false;
      if (kind_ == SeqKind::kGenerator || kind_ == SeqKind::kReverseIter) return l_ == o.l_;  // identity
      for (size_t i = 0; i < l_->size(); ++i) if (!(*l_)[i].equals((*o.l_)[i])) return false;
      return true;
    }
    case Type::kDict: {
      if (d_map_->items.size() != o.d_map_->items.size()) return false;
      for (const auto& [k, v] : d_map_->items) {
        const Value* ov = o.d_map_->find(k);
        if (!ov || !v.equals(*ov)) return false;
      }
      return true;
    }
    case Type::kNamespace: return d_map_ == o.d_map_;
    case Type::kCallable: return c_ == o.c_;
    case Type::kLoop: return loop_ == o.loop_;
    default: return false;
  }
}

// ---------------------------------------------------------------- json.dumps

static void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (uint32_t cp : utf8_decode(s)) {
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char b[16];
        if (cp < 0x20 || (ensure_ascii && cp > 0x7e)) {
          if (cp >= 0x10000) {
            uint32_t v = cp - 0x10000;
            std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
          } else {
            std::snprintf(b, sizeof b, "\\u%04x", cp);
          }
          out += b;
        } else {
          utf8_append(out, cp);
        }
      }
    }
  }
  out += '"';
}

static std::string json_float(double d) {
  // json.dumps writes float.__repr__, and Infinity/NaN for the non-finite values.
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return python_float_repr(d);
}

static std::string json_key(const Value& k) {
  // json.dumps coerces these key types to strings; anything else is a TypeError.
  switch (k.type()) {
    case Value::Type::kString: return k.as_string();
    case Value::Type::kInt: return std::to_string(k.as_int());
    case Value::Type::kFloat: return json_float(k.as_double());
    case Value::Type::kBool: return k.as_bool() ? "true" : "false";
    case Value::Type::kNone: return "null";
    default: runtime_error("keys must be str, int, float, bool or None, not " + k.type_repr());
  }
}

static void json_dump(std::string& out, const Value& v, const JsonOptions& o, int level) {
  if (level > 200) runtime_error("maximum recursion depth exceeded in tojson");
  const std::string item_sep = o.has_separators ? o.item_sep : (o.has_indent ? "," : ", ");
  const std::string key_sep = o.has_separators ? o.key_sep : ": ";
  auto newline = [&](int lvl) {
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += o.indent;
  };
  switch (v.type()) {
    case Value::Type::kNone: out += "null"; return;
    case Value::Type::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Type::kInt: out += std::to_string(v.as_int()); return;
    case Value::Type::kFloat: out += json_float(v.as_double()); return;
    case Value::Type::kString: json_string(out, v.as_string(), o.ensure_ascii); return;
    case Value::Type::kList: {
      if (!v.is_list_or_tuple()) {
        std::string tn = v.type_repr();
        runtime_error("Object of type " + tn.substr(0, tn.size() - 7) + " is not JSON serializable");
      }
      const List& l = v.as_list();
      if (l.empty()) { out += "[]"; return; }
      out += '[';
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) out += item_sep;
        if (o.has_indent) newline(level + 1);
        json_dump(out, l[i], o, level + 1);
      }
      if (o.has_indent) newline(level);
      out += ']';
      return;
    }
    case Value::Type::kDict: {
      const Dict& d = v.as_dict();
      if (d.items.empty()) { out += "{}"; return; }
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [k, val] : d.items) entries.emplace_back(json_key(k), &val);
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out += '{';
      bool first = true;
      for (const auto& [k, val] : entries) {
        if (!first) out += item_sep;
        first = false;
        if (o.has_indent) newline(level + 1);
        json_string(out, k, o.ensure_ascii);
        out += key_sep;
        json_dump(out, *val, o, level + 1);
      }
      if (o.has_indent) newline(level);
      out += '}';
      return;
    }
    case Value::Type::kUndefined:
      runtime_error("Object of type Undefined is not JSON serializable");
    default:
      {
        std::string tn = v.type_repr();
        if (tn.size() > 7 && tn.compare(tn.size() - 7, 7, " object") == 0) tn.resize(tn.size() - 7);
        runtime_error("Object of type " + tn + " is not JSON serializable");
      }
  }
}

std::string to_json(const Value& v, const JsonOptions& opts) {
  std::string out;
  json_dump(out, v, opts, 0);
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '\'': out += "&#39;"; break;
      case '"': out += "&#34;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace larder::chat_template
