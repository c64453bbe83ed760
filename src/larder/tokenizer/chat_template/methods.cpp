// methods.cpp — the Python str/dict/list methods templates call (s.split('x'), d.get('k', 1),
// d.items()), and printf-style "%" formatting. The sandbox exposes the non-mutating ones;
// mutating ones (list.append, dict.update, ...) are "unsafe" and raise when called.
#include <cstdio>
#include <set>

#include "larder/core/status.h"
#include "larder/tokenizer/chat_template/builtins_util.h"

namespace larder::chat_template {
namespace {

const std::set<std::string> kStrMethods = {
    "startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip", "replace", "upper", "lower",
    "title", "capitalize", "find", "rfind", "index", "rindex", "count", "join", "format", "isdigit",
    "isalpha", "isalnum", "isspace", "islower", "isupper", "isnumeric", "isdecimal", "splitlines", "zfill",
    "ljust", "rjust", "center", "partition", "rpartition", "removeprefix", "removesuffix", "swapcase",
    "casefold"};
const std::set<std::string> kDictMethods = {"keys", "values", "items", "get", "copy"};
const std::set<std::string> kDictUnsafe = {"clear", "pop", "popitem", "setdefault", "update"};
const std::set<std::string> kListMethods = {"index", "count", "copy"};
const std::set<std::string> kListUnsafe = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};

std::string need_str(const Value& v, const char* what) {
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_string()) runtime_error(std::string(what) + " must be str, not " + py_type_name(v));
  return v.as_string();
}

size_t cp_index(const std::string& s, size_t byte_pos) { return utf8_length(std::string_view(s).substr(0, byte_pos)); }

std::string pad(const std::string& s, int64_t width, const std::string& fill, int where /*0 left-justify,1 right,2 center*/) {
  int64_t len = static_cast<int64_t>(utf8_length(s));
  if (width <= len) return s;
  int64_t total = width - len;
  int64_t left = 0, right = 0;
  if (where == 0) right = total;
  else if (where == 1) left = total;
  else {
    // CPython's str.center puts the extra space on the right... except when width is odd-ish:
    left = total / 2 + (total & width & 1);
    right = total - left;
  }
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < right; ++i) out += fill;
  return out;
}

Value str_method(Interpreter& in, const Value& self, const std::string& m, std::vector<Value>& args, Kwargs& kw) {
  const std::string& s = self.as_string();
  bool mk = self.is_markup();
  auto str_out = [&](std::string r) { return Value::string(std::move(r), mk); };
  if (m == "startswith" || m == "endswith") {
    ArgBinder a(m, args, kw, {"prefix", "start", "end"});
    if (!a.has(0)) runtime_error(m + "() takes at least 1 argument (0 given)");
    std::string sub = s;
    if (a.has(1) || a.has(2)) {
      Value sl = in.slice(self, a.get_or(1, Value::none()), a.get_or(2, Value::none()), Value::none());
      sub = sl.as_string();
    }
    auto test = [&](const std::string& p) {
      if (p.size() > sub.size()) return false;
      return m == "startswith" ? sub.compare(0, p.size(), p) == 0 : sub.compare(sub.size() - p.size(), p.size(), p) == 0;
    };
    const Value& p = a.get(0);
    if (p.is_tuple()) {
      for (const auto& e : p.as_list()) if (test(need_str(e, "tuple for startswith"))) return Value::boolean(true);
      return Value::boolean(false);
    }
    return Value::boolean(test(need_str(p, (m + " first arg").c_str())));
  }
  if (m == "split" || m == "rsplit") {
    ArgBinder a(m, args, kw, {"sep", "maxsplit"});
    int64_t maxsplit = a.has(1) ? to_index(a.get(1), "maxsplit") : -1;
    List out;
    for (auto& part : py_split(s, a.get_or(0, Value::none()), maxsplit, m == "rsplit")) out.push_back(str_out(part));
    return Value::list(std::move(out));
  }
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    ArgBinder a(m, args, kw, {"chars"});
    return str_out(py_strip(s, a.get_or(0, Value::none()), m != "rstrip", m != "lstrip"));
  }
  if (m == "replace") {
    ArgBinder a(m, args, kw, {"old", "new", "count"});
    if (!a.has(1)) runtime_error("replace expected at least 2 arguments");
    int64_t count = a.has(2) ? to_index(a.get(2), "count") : -1;
    std::string r = py_replace(s, need_str(a.get(0), "replace() argument 1"), need_str(a.get(1), "replace() argument 2"), count);
    check_size(in, r.size());
    return str_out(r);
  }
  if (m == "upper") return str_out(py_str_upper(s));
  if (m == "lower" || m == "casefold") return str_out(py_str_lower(s));
  if (m == "title") return str_out(py_str_title(s));
  if (m == "capitalize") return str_out(py_str_capitalize(s));
  if (m == "swapcase") {
    std::string out;
    for (uint32_t cp : utf8_decode(s)) {
      uint32_t l = py_lower(cp), u = py_upper(cp);
      utf8_append(out, l != cp ? l : u);
    }
    return str_out(out);
  }
  if (m == "find" || m == "rfind" || m == "index" || m == "rindex" || m == "count") {
    ArgBinder a(m, args, kw, {"sub", "start", "end"});
    if (!a.has(0)) runtime_error(m + "() takes at least 1 argument (0 given)");
    std::string sub = need_str(a.get(0), "must be str");
    if (a.has(1) || a.has(2)) {
      if (m != "count") {
        // Search within the slice, then shift the index back by the slice start.
        Value sl = in.slice(self, a.get_or(1, Value::none()), a.get_or(2, Value::none()), Value::none());
        std::vector<Value> sub_args{a.get(0)};
        Kwargs none;
        Value r = str_method(in, sl, m, sub_args, none);
        if (r.as_int() < 0) return r;
        int64_t n = static_cast<int64_t>(utf8_length(s));
        int64_t st = a.has(1) && !a.get(1).is_none() ? to_index(a.get(1), "slice indices") : 0;
        if (st < 0) st = std::max<int64_t>(0, st + n);
        return Value::integer(r.as_int() + st);
      }
    }
    if (m == "count") {
      if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_length(s)) + 1);
      int64_t c = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++c;
      return Value::integer(c);
    }
    size_t p = (m == "find" || m == "index") ? s.find(sub) : s.rfind(sub);
    if (p == std::string::npos) {
      if (m == "index" || m == "rindex") runtime_error("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(static_cast<int64_t>(cp_index(s, p)));
  }
  if (m == "join") {
    ArgBinder a(m, args, kw, {"iterable"});
    std::string out;
    bool first = true;
    for (const auto& e : in.iterate(a.get(0))) {
      if (!e.is_string()) runtime_error("sequence item: expected str instance, " + py_type_name(e) + " found");
      if (!first) out += s;
      first = false;
      out += e.as_string();
      check_size(in, out.size());
    }
    return str_out(out);
  }
  if (m == "isdigit" || m == "isnumeric" || m == "isdecimal" || m == "isalpha" || m == "isalnum" || m == "isspace") {
    auto cps = utf8_decode(s);
    if (cps.empty()) return Value::boolean(false);
    for (uint32_t cp : cps) {
      bool ok = m == "isalpha" ? py_isalpha(cp)
                : m == "isalnum" ? (py_isalpha(cp) || py_isdigit(cp))
                : m == "isspace" ? py_isspace(cp)
                                 : py_isdigit(cp);
      if (!ok) return Value::boolean(false);
    }
    return Value::boolean(true);
  }
  if (m == "islower" || m == "isupper") {
    bool cased = false;
    for (uint32_t cp : utf8_decode(s)) {
      bool up = py_lower(cp) != cp, low = py_upper(cp) != cp;
      if (m == "islower" && up) return Value::boolean(false);
      if (m == "isupper" && low) return Value::boolean(false);
      cased |= up || low;
    }
    return Value::boolean(cased);
  }
  if (m == "splitlines") {
    ArgBinder a(m, args, kw, {"keepends"});
    List out;
    for (auto& l : py_splitlines(s, a.get_or(0, Value::boolean(false)).truthy())) out.push_back(str_out(l));
    return Value::list(std::move(out));
  }
  if (m == "zfill") {
    ArgBinder a(m, args, kw, {"width"});
    int64_t w = to_index(a.get(0), "width");
    int64_t len = static_cast<int64_t>(utf8_length(s));
    if (w <= len) return str_out(s);
    check_size(in, static_cast<size_t>(w));
    size_t sign = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
    return str_out(s.substr(0, sign) + std::string(static_cast<size_t>(w - len), '0') + s.substr(sign));
  }
  if (m == "ljust" || m == "rjust" || m == "center") {
    ArgBinder a(m, args, kw, {"width", "fillchar"});
    int64_t w = to_index(a.get(0), "width");
    check_size(in, static_cast<size_t>(std::max<int64_t>(w, 0)));
    std::string fill = a.has(1) ? need_str(a.get(1), "fillchar") : " ";
    if (utf8_length(fill) != 1) runtime_error("The fill character must be exactly one character long");
    return str_out(pad(s, w, fill, m == "ljust" ? 0 : m == "rjust" ? 1 : 2));
  }
  if (m == "partition" || m == "rpartition") {
    ArgBinder a(m, args, kw, {"sep"});
    std::string sep = need_str(a.get(0), "sep");
    if (sep.empty()) runtime_error("empty separator");
    size_t p = m == "partition" ? s.find(sep) : s.rfind(sep);
    if (p == std::string::npos) {
      if (m == "partition") return Value::list({str_out(s), str_out(""), str_out("")}, true);
      return Value::list({str_out(""), str_out(""), str_out(s)}, true);
    }
    return Value::list({str_out(s.substr(0, p)), str_out(sep), str_out(s.substr(p + sep.size()))}, true);
  }
  if (m == "removeprefix" || m == "removesuffix") {
    ArgBinder a(m, args, kw, {"affix"});
    std::string x = need_str(a.get(0), "argument");
    if (m == "removeprefix") return str_out(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
    if (x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0) return str_out(s.substr(0, s.size() - x.size()));
    return str_out(s);
  }
  if (m == "format") {
    // str.format with automatic/explicit/named fields and !s/!r conversions; format specs
    // other than empty are not supported (no chat template we know uses them).
    std::string out;
    size_t auto_idx = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      char c = s[i];
      if (c == '{') {
        if (i + 1 < s.size() && s[i + 1] == '{') { out += '{'; ++i; continue; }
        size_t e = s.find('}', i);
        if (e == std::string::npos) runtime_error("Single '{' encountered in format string");
        std::string field = s.substr(i + 1, e - i - 1);
        char conv = 0;
        if (size_t bang = field.find('!'); bang != std::string::npos) {
          conv = bang + 1 < field.size() ? field[bang + 1] : 0;
          field = field.substr(0, bang);
        }
        if (field.find(':') != std::string::npos)
          throw_error(TemplateError::Kind::kUnsupported, "str.format() format specs are not supported");
        Value v;
        if (field.empty()) {
          if (auto_idx >= args.size()) runtime_error("Replacement index " + std::to_string(auto_idx) + " out of range for positional args tuple");
          v = args[auto_idx++];
        } else if (isdigit(static_cast<unsigned char>(field[0]))) {
          size_t k = std::strtoul(field.c_str(), nullptr, 10);
          if (k >= args.size()) runtime_error("Replacement index " + field + " out of range for positional args tuple");
          v = args[k];
        } else {
          bool found = false;
          for (auto& [kk, vv] : kw) if (kk == field) { v = vv; found = true; }
          if (!found) runtime_error("'" + field + "'");
        }
        out += conv == 'r' ? v.repr() : v.str();
        i = e;
      } else if (c == '}') {
        if (i + 1 < s.size() && s[i + 1] == '}') { out += '}'; ++i; continue; }
        runtime_error("Single '}' encountered in format string");
      } else {
        out += c;
      }
    }
    return str_out(out);
  }
  runtime_error("'str' object has no attribute '" + m + "'");
}

Value dict_method(Interpreter& in, const Value& self, const std::string& m, std::vector<Value>& args, Kwargs& kw) {
  const Dict& d = self.as_dict();
  if (m == "keys" || m == "values" || m == "items") {
    ArgBinder a(m, args, kw, {});
    List out;
    for (const auto& [k, v] : d.items) {
      if (m == "keys") out.push_back(k);
      else if (m == "values") out.push_back(v);
      else out.push_back(Value::list({k, v}, true));
    }
    return Value::sequence(std::move(out), m == "keys" ? SeqKind::kDictKeys : m == "values" ? SeqKind::kDictValues : SeqKind::kDictItems);
  }
  if (m == "get") {
    ArgBinder a(m, args, kw, {"key", "default"});
    if (!a.has(0)) runtime_error("get expected at least 1 argument, got 0");
    if (!a.get(0).hashable()) runtime_error("unhashable type: '" + py_type_name(a.get(0)) + "'");
    if (const Value* v = d.find(a.get(0))) return *v;
    return a.get_or(1, Value::none());
  }
  if (m == "copy") return Value::dict(d);
  (void)in;
  runtime_error("'dict' object has no attribute '" + m + "'");
}

Value list_method(Interpreter& in, const Value& self, const std::string& m, std::vector<Value>& args, Kwargs& kw) {
  const List& l = self.as_list();
  if (m == "index") {
    ArgBinder a(m, args, kw, {"value"});
    for (size_t i = 0; i < l.size(); ++i) if (l[i].equals(a.get(0))) return Value::integer(static_cast<int64_t>(i));
    runtime_error(a.get(0).repr() + " is not in list");
  }
  if (m == "count") {
    ArgBinder a(m, args, kw, {"value"});
    int64_t c = 0;
    for (const auto& e : l) c += e.equals(a.get(0));
    return Value::integer(c);
  }
  if (m == "copy") return self;
  (void)in;
  runtime_error("'list' object has no attribute '" + m + "'");
}

}  // namespace

bool is_method(const Value& obj, const std::string& name) {
  if (obj.is_string()) return kStrMethods.count(name) > 0;
  if (obj.is_dict()) return kDictMethods.count(name) > 0;
  if (obj.is_tuple()) return name == "index" || name == "count";
  if (obj.is_list()) return obj.seq_kind() == SeqKind::kList && kListMethods.count(name) > 0;
  return false;
}

bool is_unsafe_method(const Value& obj, const std::string& name) {
  if (obj.is_dict()) return kDictUnsafe.count(name) > 0;
  if (obj.is_list() && obj.seq_kind() == SeqKind::kList) return kListUnsafe.count(name) > 0;
  return false;
}

Value bind_method(const Value& obj, const std::string& name) {
  Value self = obj;
  return make_builtin(name + " of " + py_type_name(obj) + " object", [self, name](Interpreter& in, std::vector<Value>& args, Kwargs& kw) -> Value {
    if (self.is_string()) return str_method(in, self, name, args, kw);
    if (self.is_dict()) return dict_method(in, self, name, args, kw);
    return list_method(in, self, name, args, kw);
  });
}

// ------------------------------------------------------------------ Python string helpers

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  auto cps = utf8_decode(s);
  std::vector<uint32_t> set;
  bool ws = chars.is_none() || chars.is_undefined();
  if (!ws) set = utf8_decode(need_str(chars, "strip arg"));
  auto strip_it = [&](uint32_t cp) {
    if (ws) return py_isspace(cp);
    return std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) while (b < e && strip_it(cps[b])) ++b;
  if (right) while (e > b && strip_it(cps[e - 1])) --e;
  return utf8_encode(cps, b, e);
}

std::vector<std::string> py_split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> out;
  if (sep.is_none() || sep.is_undefined()) {
    // Whitespace split: runs of whitespace separate, leading/trailing whitespace ignored.
    auto cps = utf8_decode(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && py_isspace(cps[i])) ++i;
      if (i >= cps.size()) break;
      size_t j = i;
      while (j < cps.size() && !py_isspace(cps[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) >= words.size()) {
      for (auto& [b, e] : words) out.push_back(utf8_encode(cps, b, e));
      return out;
    }
    if (!from_right) {
      for (int64_t k = 0; k < maxsplit; ++k) out.push_back(utf8_encode(cps, words[k].first, words[k].second));
      size_t e = cps.size();
      while (e > 0 && py_isspace(cps[e - 1])) --e;
      out.push_back(utf8_encode(cps, words[maxsplit].first, e));
    } else {
      size_t n = words.size();
      size_t b = 0;
      while (b < cps.size() && py_isspace(cps[b])) ++b;
      out.push_back(utf8_encode(cps, b, words[n - maxsplit - 1].second));
      for (size_t k = n - maxsplit; k < n; ++k) out.push_back(utf8_encode(cps, words[k].first, words[k].second));
    }
    return out;
  }
  std::string d = need_str(sep, "must be str or None");
  if (d.empty()) runtime_error("empty separator");
  if (!from_right) {
    size_t start = 0;
    int64_t n = 0;
    while (maxsplit < 0 || n < maxsplit) {
      size_t p = s.find(d, start);
      if (p == std::string::npos) break;
      out.push_back(s.substr(start, p - start));
      start = p + d.size();
      ++n;
    }
    out.push_back(s.substr(start));
    return out;
  }
  std::vector<std::string> rev;
  size_t end = s.size();
  int64_t n = 0;
  while (maxsplit < 0 || n < maxsplit) {
    if (end < d.size()) break;
    size_t p = s.rfind(d, end - d.size());
    if (p == std::string::npos) break;
    rev.push_back(s.substr(p + d.size(), end - p - d.size()));
    end = p;
    ++n;
  }
  rev.push_back(s.substr(0, end));
  return std::vector<std::string>(rev.rbegin(), rev.rend());
}

std::vector<std::string> py_splitlines(const std::string& s, bool keepends) {
  // str.splitlines boundaries: \n \r \r\n \v \f \x1c \x1d \x1e \x85 \u2028 \u2029
  std::vector<std::string> out;
  auto cps = utf8_decode(s);
  size_t start = 0, i = 0;
  while (i < cps.size()) {
    uint32_t c = cps[i];
    bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
               c == 0x2028 || c == 0x2029;
    if (!brk) { ++i; continue; }
    size_t eol = i + ((c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ? 2 : 1);
    out.push_back(utf8_encode(cps, start, keepends ? eol : i));
    start = i = eol;
  }
  if (start < cps.size()) out.push_back(utf8_encode(cps, start, cps.size()));
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& rep, int64_t count) {
  std::string out;
  if (old.empty()) {
    // "" matches before every code point and at the end.
    auto cps = utf8_decode(s);
    int64_t n = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n < count) { out += rep; ++n; }
      if (i < cps.size()) utf8_append(out, cps[i]);
    }
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t p = s.find(old, start);
    if (p == std::string::npos) break;
    out.append(s, start, p - start);
    out += rep;
    start = p + old.size();
    ++n;
  }
  out.append(s, start, std::string::npos);
  return out;
}

std::string py_str_lower(const std::string& s) {
  std::string out;
  for (uint32_t cp : utf8_decode(s)) utf8_append(out, py_lower(cp));
  return out;
}
std::string py_str_upper(const std::string& s) {
  // Python uses full case mappings; the one that matters in practice is German sharp s.
  std::string out;
  for (uint32_t cp : utf8_decode(s)) {
    if (cp == 0xdf) out += "SS";
    else utf8_append(out, py_upper(cp));
  }
  return out;
}
static bool is_cased(uint32_t cp) { return py_lower(cp) != cp || py_upper(cp) != cp; }
std::string py_str_title(const std::string& s) {
  // str.title(): a cased character after a cased one is lowered, otherwise uppered.
  std::string out;
  bool prev_cased = false;
  for (uint32_t cp : utf8_decode(s)) {
    if (is_cased(cp)) {
      utf8_append(out, prev_cased ? py_lower(cp) : py_upper(cp));
      prev_cased = true;
    } else {
      utf8_append(out, cp);
      prev_cased = false;
    }
  }
  return out;
}
std::string py_str_capitalize(const std::string& s) {
  std::string out;
  bool first = true;
  for (uint32_t cp : utf8_decode(s)) {
    utf8_append(out, first ? py_upper(cp) : py_lower(cp));
    first = false;
  }
  return out;
}

// ------------------------------------------------------------------ printf-style formatting

std::string percent_format(Interpreter& in, const std::string& fmt, const Value& argv) {
  List args;
  const Dict* mapping = nullptr;
  if (argv.is_tuple()) args = argv.as_list();
  else if (argv.is_dict()) mapping = &argv.as_dict();
  else args.push_back(argv);
  size_t ai = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') { out += fmt[i]; continue; }
    ++i;
    if (i >= fmt.size()) runtime_error("incomplete format");
    Value v;
    bool have_v = false;
    if (fmt[i] == '(') {
      size_t e = fmt.find(')', i);
      if (e == std::string::npos || !mapping) runtime_error("format requires a mapping");
      const Value* p = mapping->find(Value::string(fmt.substr(i + 1, e - i - 1)));
      if (!p) runtime_error("'" + fmt.substr(i + 1, e - i - 1) + "'");
      v = *p;
      have_v = true;
      i = e + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::strchr("-+ #0", fmt[i])) flags += fmt[i++];
    std::string width, prec;
    while (i < fmt.size() && isdigit(static_cast<unsigned char>(fmt[i]))) width += fmt[i++];
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      prec = ".";
      while (i < fmt.size() && isdigit(static_cast<unsigned char>(fmt[i]))) prec += fmt[i++];
    }
    if (i >= fmt.size()) runtime_error("incomplete format");
    char conv = fmt[i];
    if (conv == '%') { out += '%'; continue; }
    if (!have_v) {
      if (mapping && args.empty()) { v = argv; }
      else {
        if (ai >= args.size()) runtime_error("not enough arguments for format string");
        v = args[ai++];
      }
    }
    char buf[512];
    std::string spec = "%" + flags + width + prec;
    if (conv == 's' || conv == 'r' || conv == 'a') {
      std::string sv = conv == 's' ? v.str() : v.repr();
      if (prec.size() > 1) {
        auto cps = utf8_decode(sv);
        sv = utf8_encode(cps, 0, std::strtoul(prec.c_str() + 1, nullptr, 10));
      }
      int64_t w = width.empty() ? 0 : std::strtoll(width.c_str(), nullptr, 10);
      check_size(in, static_cast<size_t>(w));
      int64_t len = static_cast<int64_t>(utf8_length(sv));
      if (len < w) {
        if (flags.find('-') != std::string::npos) sv += std::string(w - len, ' ');
        else sv = std::string(w - len, ' ') + sv;
      }
      out += sv;
    } else if (std::strchr("diouxXc", conv)) {
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_number()) runtime_error(std::string("%") + conv + " format: a real number is required, not " + py_type_name(v));
      long long n = v.is_float() ? static_cast<long long>(v.as_double()) : v.as_int();
      if (conv == 'c') { utf8_append(out, static_cast<uint32_t>(n)); continue; }
      char c = conv == 'i' || conv == 'u' ? 'd' : conv;
      std::snprintf(buf, sizeof buf, (spec + "ll" + c).c_str(), n);
      out += buf;
    } else if (std::strchr("eEfFgG", conv)) {
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_number()) runtime_error("must be real number, not " + py_type_name(v));
      std::snprintf(buf, sizeof buf, (spec + conv).c_str(), v.as_double());
      out += buf;
    } else {
      runtime_error(strfmt("unsupported format character '%c'", conv));
    }
  }
  if (!mapping && ai < args.size()) runtime_error("not all arguments converted during string formatting");
  return out;
}

}  // namespace larder::chat_template
