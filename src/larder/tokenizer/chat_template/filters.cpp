// filters.cpp — jinja2's builtin filters and tests (jinja2/filters.py, jinja2/tests.py) with
// autoescape off, plus Hugging Face's tojson (json.dumps without HTML escaping, keys in
// insertion order, ", " / ": " separators, indent kwarg).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "larder/core/status.h"
#include "larder/tokenizer/chat_template/builtins_util.h"
#include "larder/tokenizer/chat_template/filters.h"

namespace larder::chat_template {
namespace {

// soft_str: strings (Markup included) pass through, anything else becomes str(x).
Value soft_str(const Value& v) { return v.is_string() ? v : Value::string(v.str()); }

int64_t py_len(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined: return 0;
    case Value::Type::kString: return static_cast<int64_t>(utf8_length(v.as_string()));
    case Value::Type::kList:
      if (v.is_iterator()) runtime_error("object of type '" + py_type_name(v) + "' has no len()");
      return static_cast<int64_t>(v.as_list().size());
    case Value::Type::kDict: return static_cast<int64_t>(v.as_dict().items.size());
    case Value::Type::kLoop: return v.as_loop()->items ? static_cast<int64_t>(v.as_loop()->items->size()) : 0;
    default: runtime_error("object of type '" + py_type_name(v) + "' has no len()");
  }
}

// make_attrgetter: "a.b.0" looks up each part with environment.getitem (key first).
Value attr_path(Interpreter& in, const Value& item, const Value& attribute) {
  if (attribute.is_integral()) return in.get_item(item, attribute);
  std::string path = attribute.str();
  Value cur = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return isdigit(static_cast<unsigned char>(c)); });
    cur = in.get_item(cur, digits ? Value::integer(std::strtoll(part.c_str(), nullptr, 10)) : Value::string(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

Value ignore_case(const Value& v) { return v.is_string() ? Value::string(py_str_lower(v.as_string())) : v; }

std::string py_indent(const Value& sv, const Value& width, bool first, bool blank) {
  std::string ind = width.is_string() ? width.as_string() : std::string(static_cast<size_t>(std::max<int64_t>(0, to_index(width, "width"))), ' ');
  std::string s = sv.as_string() + "\n";  // jinja2 appends a newline so splitlines keeps a trailing empty line
  auto lines = py_splitlines(s, false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + ind;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t i = 1; i < lines.size(); ++i) {
        if (i > 1) rv += "\n";
        if (!lines[i].empty()) rv += ind;
        rv += lines[i];
      }
    }
  }
  if (first) rv = ind + rv;
  return rv;
}

// jinja2's do_title: words start after runs of -, whitespace, ( { [ <.
std::string jinja_title(const std::string& s) {
  auto cps = utf8_decode(s);
  std::string out;
  size_t i = 0;
  auto is_sep = [](uint32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c); };
  while (i < cps.size()) {
    size_t j = i;
    if (is_sep(cps[i])) {
      while (j < cps.size() && is_sep(cps[j])) ++j;
      out += utf8_encode(cps, i, j);
    } else {
      while (j < cps.size() && !is_sep(cps[j])) ++j;
      utf8_append(out, py_upper(cps[i]));
      for (size_t k = i + 1; k < j; ++k) utf8_append(out, py_lower(cps[k]));
    }
    i = j;
  }
  return out;
}

double py_round(double x, int64_t ndigits) {
  // CPython rounds the exact binary value half-to-even; printf's %.*f does the same.
  if (!std::isfinite(x)) return x;
  if (ndigits > 300) return x;
  if (ndigits < -300) return 0.0 * x;
  if (ndigits >= 0) {
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(ndigits), x);
    return std::strtod(buf, nullptr);
  }
  double p = std::pow(10.0, static_cast<double>(-ndigits));
  return std::nearbyint(x / p) * p;
}

std::vector<Value> sorted_values(Interpreter& in, List items, bool reverse, bool case_sensitive, const Value& attribute) {
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& it : items) {
    Value k = attribute.is_none() || attribute.is_undefined() ? it : attr_path(in, it, attribute);
    if (!case_sensitive) k = ignore_case(k);
    keyed.emplace_back(k, it);
  }
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    int c = py_compare(a.first, b.first);
    return reverse ? c == 1 : c == -1;
  });
  List out;
  for (auto& kv : keyed) out.push_back(kv.second);
  return out;
}

}  // namespace

const std::set<std::string>& known_filters() {
  static const std::set<std::string> k = {
      "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape", "filesizeformat",
      "first", "float", "forceescape", "format", "groupby", "indent", "int", "items", "join", "last", "length", "list",
      "lower", "map", "max", "min", "pprint", "random", "reject", "rejectattr", "replace", "reverse", "round", "safe",
      "select", "selectattr", "slice", "sort", "string", "striptags", "sum", "title", "tojson", "trim", "truncate",
      "unique", "upper", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr"};
  return k;
}
const std::set<std::string>& unsupported_filters() {
  static const std::set<std::string> k = {"filesizeformat", "groupby", "pprint", "random", "striptags",
                                          "urlencode", "urlize", "wordwrap", "xmlattr"};
  return k;
}
const std::set<std::string>& known_tests() {
  static const std::set<std::string> k = {
      "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false", "filter", "float",
      "ge", "greaterthan", "gt", "in", "integer", "iterable", "le", "lessthan", "lower", "lt", "mapping", "ne", "none",
      "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined", "upper", "==", "!=", "<", "<=", ">", ">="};
  return k;
}

bool Interpreter::apply_test(const std::string& t, const Value& v, std::vector<Value>& args, Kwargs& kw) {
  auto arg = [&](size_t i) -> const Value& {
    if (i < args.size()) return args[i];
    if (i < args.size() + kw.size()) return kw[i - args.size()].second;
    runtime_error("test '" + t + "' is missing an argument");
  };
  if (t == "defined") return !v.is_undefined();
  if (t == "undefined") return v.is_undefined();
  if (t == "none") return v.is_none();
  if (t == "boolean") return v.is_bool();
  if (t == "true") return v.is_bool() && v.as_bool();
  if (t == "false") return v.is_bool() && !v.as_bool();
  if (t == "integer") return v.is_int();
  if (t == "float") return v.is_float();
  if (t == "number") return v.is_number();
  if (t == "string") return v.is_string();
  if (t == "mapping") return v.is_dict();
  if (t == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict() || v.is_loop();
  if (t == "sequence") return v.is_undefined() || v.is_string() || (v.is_list() && !v.is_iterator()) || v.is_dict();
  if (t == "callable") return v.is_callable();
  if (t == "escaped") return v.is_markup();
  if (t == "odd" || t == "even") {
    if (v.is_undefined()) fail_undefined(v);
    if (!v.is_integral()) runtime_error("not all arguments converted during string formatting");
    int64_t r = ((v.as_int() % 2) + 2) % 2;
    return t == "odd" ? r == 1 : r == 0;
  }
  if (t == "divisibleby") {
    Value r = binary("%", v, arg(0));
    return r.equals(Value::integer(0));
  }
  if (t == "eq" || t == "equalto" || t == "==") return v.equals(arg(0));
  if (t == "ne" || t == "!=") return !v.equals(arg(0));
  if (t == "lt" || t == "lessthan" || t == "<") return compare("<", v, arg(0));
  if (t == "le" || t == "<=") return compare("<=", v, arg(0));
  if (t == "gt" || t == "greaterthan" || t == ">") return compare(">", v, arg(0));
  if (t == "ge" || t == ">=") return compare(">=", v, arg(0));
  if (t == "in") return contains(arg(0), v);
  if (t == "sameas") {
    const Value& o = arg(0);
    // Python identity: singletons and small values compare equal, containers by object.
    if (v.type() != o.type()) return false;
    if (v.is_list() || v.is_dict()) return false;
    return v.equals(o);
  }
  if (t == "lower" || t == "upper") {
    std::vector<Value> none;
    Kwargs nk;
    Value s = soft_str(v);
    return bind_method(s, t == "lower" ? "islower" : "isupper").as_callable()->fn(*this, none, nk).truthy();
  }
  if (t == "filter") return v.is_string() && known_filters().count(v.as_string()) && !unsupported_filters().count(v.as_string());
  if (t == "test") return v.is_string() && known_tests().count(v.as_string());
  runtime_error("No test named '" + t + "'.");
}

// select/reject/selectattr/rejectattr (jinja2 select_or_reject).
static Value select_or_reject(Interpreter& in, const Value& seq, std::vector<Value>& args, Kwargs& kw, bool select,
                              bool by_attr) {
  // jinja2 yields nothing for a falsy input ("if value:"), so None | selectattr(...) is empty.
  if (!seq.truthy()) return Value::sequence({}, SeqKind::kGenerator);
  size_t p = 0;
  Value attribute;
  if (by_attr) {
    if (args.empty()) runtime_error("Missing parameter for attribute name");
    attribute = args[0];
    p = 1;
  }
  std::string test_name;
  std::vector<Value> targs;
  if (p < args.size()) {
    test_name = args[p].str();
    targs.assign(args.begin() + static_cast<long>(p) + 1, args.end());
  }
  List out;
  for (const auto& item : in.iterate(seq)) {
    Value x = by_attr ? attr_path(in, item, attribute) : item;
    bool r;
    if (test_name.empty()) {
      r = x.truthy();
    } else {
      std::vector<Value> a = targs;
      Kwargs k = kw;
      r = in.apply_test(test_name, x, a, k);
    }
    if (r == select) out.push_back(item);
  }
  return Value::sequence(std::move(out), SeqKind::kGenerator);
}

Value Interpreter::apply_filter(const std::string& f, const Value& v, std::vector<Value>& args, Kwargs& kw) {
  if (f == "tojson") {
    ArgBinder a("tojson", args, kw, {"ensure_ascii", "indent", "separators", "sort_keys"});
    JsonOptions o;
    o.ensure_ascii = a.get_or(0, Value::boolean(false)).truthy();
    if (a.has(1) && !a.get(1).is_none()) {
      const Value& ind = a.get(1);
      o.has_indent = true;
      if (ind.is_string()) o.indent = ind.as_string();
      else o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, to_index(ind, "indent"))), ' ');
    }
    if (a.has(2) && !a.get(2).is_none()) {
      const Value& sep = a.get(2);
      if (!sep.is_list() || sep.as_list().size() != 2 || !sep.as_list()[0].is_string() || !sep.as_list()[1].is_string())
        runtime_error("separators must be a (item_separator, key_separator) pair of strings");
      o.has_separators = true;
      o.item_sep = sep.as_list()[0].as_string();
      o.key_sep = sep.as_list()[1].as_string();
    }
    o.sort_keys = a.get_or(3, Value::boolean(false)).truthy();
    std::string s = to_json(v, o);
    check_size(*this, s.size());
    return Value::string(std::move(s));
  }
  if (f == "length" || f == "count") return Value::integer(py_len(v));
  if (f == "trim") {
    ArgBinder a(f, args, kw, {"chars"});
    Value s = soft_str(v);
    return Value::string(py_strip(s.as_string(), a.get_or(0, Value::none()), true, true), s.is_markup());
  }
  if (f == "string") return soft_str(v);
  if (f == "safe") return v.is_string() ? Value::string(v.as_string(), true) : Value::string(v.str(), true);
  if (f == "e" || f == "escape" || f == "forceescape") {
    if (v.is_markup() && f != "forceescape") return v;
    return Value::string(html_escape(v.str()), true);
  }
  if (f == "lower" || f == "upper") {
    Value s = soft_str(v);
    return Value::string(f == "lower" ? py_str_lower(s.as_string()) : py_str_upper(s.as_string()), s.is_markup());
  }
  if (f == "capitalize") {
    Value s = soft_str(v);
    return Value::string(py_str_capitalize(s.as_string()), s.is_markup());
  }
  if (f == "title") {
    Value s = soft_str(v);
    return Value::string(jinja_title(s.as_string()), s.is_markup());
  }
  if (f == "items") {
    if (v.is_undefined()) return Value::sequence({}, SeqKind::kGenerator);
    if (!v.is_dict()) runtime_error("Can only get item pairs from a mapping.");
    List out;
    for (const auto& [k, val] : v.as_dict().items) out.push_back(Value::list({k, val}, true));
    return Value::sequence(std::move(out), SeqKind::kGenerator);
  }
  if (f == "list") return Value::list(iterate(v));
  if (f == "join") {
    ArgBinder a(f, args, kw, {"d", "attribute"});
    std::string d = a.get_or(0, Value::string("")).str();
    std::string out;
    bool first = true;
    for (const auto& e : iterate(v)) {
      if (!first) out += d;
      first = false;
      out += (a.has(1) && !a.get(1).is_none() ? attr_path(*this, e, a.get(1)) : e).str();
      check_size(*this, out.size());
    }
    return Value::string(std::move(out));
  }
  if (f == "indent") {
    ArgBinder a(f, args, kw, {"width", "first", "blank"});
    Value s = soft_str(v);
    return Value::string(py_indent(s, a.get_or(0, Value::integer(4)), a.get_or(1, Value::boolean(false)).truthy(),
                                   a.get_or(2, Value::boolean(false)).truthy()),
                         s.is_markup());
  }
  if (f == "replace") {
    ArgBinder a(f, args, kw, {"old", "new", "count"});
    if (!a.has(1)) runtime_error("do_replace() missing required arguments");
    int64_t count = a.has(2) && !a.get(2).is_none() ? to_index(a.get(2), "count") : -1;
    std::string r = py_replace(v.str(), a.get(0).str(), a.get(1).str(), count);
    check_size(*this, r.size());
    return Value::string(std::move(r));
  }
  if (f == "default" || f == "d") {
    ArgBinder a(f, args, kw, {"default_value", "boolean"});
    bool boolean = a.get_or(1, Value::boolean(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return a.get_or(0, Value::string(""));
    return v;
  }
  if (f == "first") {
    List l = iterate(v);
    if (l.empty()) return Value::undefined("No first item, sequence was empty.");
    return l.front();
  }
  if (f == "last") {
    if (v.is_undefined()) fail_undefined(v);  // reversed(Undefined) is a TypeError
    if (v.is_iterator()) runtime_error("'" + py_type_name(v) + "' object is not reversible");
    List l = iterate(v);
    if (l.empty()) return Value::undefined("No last item, sequence was empty.");
    return l.back();
  }
  if (f == "reverse") {
    if (v.is_string()) {
      auto cps = utf8_decode(v.as_string());
      std::reverse(cps.begin(), cps.end());
      return Value::string(utf8_encode(cps, 0, cps.size()), v.is_markup());
    }
    // reversed() gives an iterator for sequences and dicts; generators fall back to a list.
    List l = iterate(v);
    std::reverse(l.begin(), l.end());
    if (v.is_iterator()) return Value::list(std::move(l));
    if (!v.is_list() && !v.is_dict()) runtime_error("argument must be iterable");
    return Value::sequence(std::move(l), SeqKind::kReverseIter);
  }
  if (f == "unique") {
    ArgBinder a(f, args, kw, {"case_sensitive", "attribute"});
    bool cs = a.get_or(0, Value::boolean(false)).truthy();
    List out, seen;
    for (const auto& e : iterate(v)) {
      Value key = a.has(1) && !a.get(1).is_none() ? attr_path(*this, e, a.get(1)) : e;
      if (!cs) key = ignore_case(key);
      if (!key.hashable()) runtime_error("unhashable type: '" + py_type_name(key) + "'");
      bool dup = false;
      for (const auto& s : seen) if (s.equals(key)) { dup = true; break; }
      if (!dup) {
        seen.push_back(key);
        out.push_back(e);
      }
    }
    return Value::sequence(std::move(out), SeqKind::kGenerator);
  }
  if (f == "select" || f == "reject") return select_or_reject(*this, v, args, kw, f == "select", false);
  if (f == "selectattr" || f == "rejectattr") return select_or_reject(*this, v, args, kw, f == "selectattr", true);
  if (f == "map") {
    if (!v.truthy()) return Value::sequence({}, SeqKind::kGenerator);  // "if value:" as jinja2
    List out;
    Value attribute, def;
    bool has_attr = false, has_def = false;
    for (auto& [k, val] : kw) {
      if (k == "attribute") { attribute = val; has_attr = true; }
      else if (k == "default") { def = val; has_def = true; }
    }
    if (has_attr) {
      for (const auto& e : iterate(v)) {
        Value r = attr_path(*this, e, attribute);
        if (has_def && r.is_undefined()) r = def;
        out.push_back(r);
      }
      return Value::sequence(std::move(out), SeqKind::kGenerator);
    }
    if (args.empty()) runtime_error("map requires a filter argument");
    std::string fname = args[0].str();
    if (!known_filters().count(fname)) runtime_error("No filter named '" + fname + "'.");
    std::vector<Value> fargs(args.begin() + 1, args.end());
    for (const auto& e : iterate(v)) {
      std::vector<Value> a2 = fargs;
      Kwargs k2 = kw;
      out.push_back(apply_filter(fname, e, a2, k2));
    }
    return Value::sequence(std::move(out), SeqKind::kGenerator);
  }
  if (f == "int") {
    ArgBinder a(f, args, kw, {"default", "base"});
    Value def = a.get_or(0, Value::integer(0));
    int base = a.has(1) ? static_cast<int>(to_index(a.get(1), "base")) : 10;
    if (v.is_integral()) return Value::integer(v.as_int());
    if (v.is_float()) {
      if (!std::isfinite(v.as_double())) {
        if (std::isnan(v.as_double())) return def;
        runtime_error("cannot convert float infinity to integer");
      }
      return Value::integer(static_cast<int64_t>(v.as_double()));
    }
    if (v.is_string()) {
      std::string s = py_strip(v.as_string(), Value::none(), true, true);
      std::string digits;
      for (char c : s) if (c != '_') digits += c;
      if (!digits.empty()) {
        char* end = nullptr;
        errno = 0;
        long long n = std::strtoll(digits.c_str(), &end, base);
        if (end && *end == 0 && errno == 0) return Value::integer(n);
        double d = std::strtod(s.c_str(), &end);
        if (end && *end == 0 && std::isfinite(d)) return Value::integer(static_cast<int64_t>(d));
      }
      return def;
    }
    return def;
  }
  if (f == "float") {
    ArgBinder a(f, args, kw, {"default"});
    Value def = a.get_or(0, Value::floating(0.0));
    if (v.is_number()) return Value::floating(v.as_double());
    if (v.is_string()) {
      std::string s = py_strip(v.as_string(), Value::none(), true, true);
      char* end = nullptr;
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == 0) return Value::floating(d);
    }
    return def;
  }
  if (f == "abs") {
    if (v.is_undefined()) fail_undefined(v);
    if (v.is_float()) return Value::floating(std::fabs(v.as_double()));
    if (v.is_integral()) return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
    runtime_error("bad operand type for abs(): '" + py_type_name(v) + "'");
  }
  if (f == "round") {
    ArgBinder a(f, args, kw, {"precision", "method"});
    int64_t prec = a.has(0) ? to_index(a.get(0), "precision") : 0;
    std::string method = a.get_or(1, Value::string("common")).str();
    if (v.is_undefined()) fail_undefined(v);
    if (!v.is_number()) runtime_error("type " + py_type_name(v) + " doesn't define __round__ method");
    if (method == "common") {
      if (v.is_integral() && prec >= 0) return Value::integer(v.as_int());
      return Value::floating(py_round(v.as_double(), prec));
    }
    if (method != "ceil" && method != "floor") runtime_error("method must be common, ceil or floor");
    double p = std::pow(10.0, static_cast<double>(prec));
    double x = v.as_double() * p;
    return Value::floating((method == "ceil" ? std::ceil(x) : std::floor(x)) / p);
  }
  if (f == "sum") {
    ArgBinder a(f, args, kw, {"attribute", "start"});
    Value total = a.get_or(1, Value::integer(0));
    for (const auto& e : iterate(v)) total = binary("+", total, a.has(0) && !a.get(0).is_none() ? attr_path(*this, e, a.get(0)) : e);
    return total;
  }
  if (f == "min" || f == "max") {
    ArgBinder a(f, args, kw, {"case_sensitive", "attribute"});
    List l = iterate(v);
    if (l.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    List s = sorted_values(*this, l, f == "max", a.get_or(0, Value::boolean(false)).truthy(), a.get_or(1, Value::none()));
    return s.front();
  }
  if (f == "sort") {
    ArgBinder a(f, args, kw, {"reverse", "case_sensitive", "attribute"});
    return Value::list(sorted_values(*this, iterate(v), a.get_or(0, Value::boolean(false)).truthy(),
                                     a.get_or(1, Value::boolean(false)).truthy(), a.get_or(2, Value::none())));
  }
  if (f == "dictsort") {
    ArgBinder a(f, args, kw, {"case_sensitive", "by", "reverse"});
    if (!v.is_dict()) runtime_error("You can only sort by either \"key\" or \"value\"");
    bool cs = a.get_or(0, Value::boolean(false)).truthy();
    std::string by = a.get_or(1, Value::string("key")).str();
    bool rev = a.get_or(2, Value::boolean(false)).truthy();
    List pairs;
    for (const auto& [k, val] : v.as_dict().items) pairs.push_back(Value::list({k, val}, true));
    return Value::list(sorted_values(*this, pairs, rev, cs, Value::integer(by == "value" ? 1 : 0)));
  }
  if (f == "batch" || f == "slice") {
    ArgBinder a(f, args, kw, {f == "batch" ? "linecount" : "slices", "fill_with"});
    int64_t n = to_index(a.get(0), "count");
    if (n <= 0) runtime_error("count must be positive");
    List items = iterate(v);
    List out;
    if (f == "batch") {
      List cur;
      for (auto& e : items) {
        cur.push_back(e);
        if (static_cast<int64_t>(cur.size()) == n) { out.push_back(Value::list(cur)); cur.clear(); }
      }
      if (!cur.empty()) {
        if (a.has(1) && !a.get(1).is_none()) while (static_cast<int64_t>(cur.size()) < n) cur.push_back(a.get(1));
        out.push_back(Value::list(cur));
      }
    } else {
      size_t len = items.size();
      size_t per = len / static_cast<size_t>(n), extra = len % static_cast<size_t>(n);
      size_t offset = 0;
      for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
        size_t start = offset + i * per;
        if (i < extra) offset += 1;
        size_t end = offset + (i + 1) * per;
        List part(items.begin() + static_cast<long>(std::min(start, len)), items.begin() + static_cast<long>(std::min(end, len)));
        if (a.has(1) && !a.get(1).is_none() && i >= extra && extra) part.push_back(a.get(1));
        out.push_back(Value::list(part));
      }
    }
    return Value::sequence(std::move(out), SeqKind::kGenerator);
  }
  if (f == "center") {
    ArgBinder a(f, args, kw, {"width"});
    std::vector<Value> ca{a.get_or(0, Value::integer(80))};
    Kwargs none;
    return bind_method(Value::string(v.str()), "center").as_callable()->fn(*this, ca, none);
  }
  if (f == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    for (uint32_t cp : utf8_decode(v.str())) {
      bool w = py_isalpha(cp) || py_isdigit(cp) || cp == '_';
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value::integer(n);
  }
  if (f == "truncate") {
    ArgBinder a(f, args, kw, {"length", "killwords", "end", "leeway"});
    int64_t length = a.has(0) ? to_index(a.get(0), "length") : 255;
    bool killwords = a.get_or(1, Value::boolean(false)).truthy();
    std::string end = a.get_or(2, Value::string("...")).str();
    int64_t leeway = a.has(3) && !a.get(3).is_none() ? to_index(a.get(3), "leeway") : 5;
    auto cps = utf8_decode(v.str());
    int64_t n = static_cast<int64_t>(cps.size());
    int64_t endlen = static_cast<int64_t>(utf8_length(end));
    if (length < endlen) runtime_error("expected length >= " + std::to_string(endlen) + ", got " + std::to_string(length));
    if (n <= length + leeway) return Value::string(v.str());
    std::string head = utf8_encode(cps, 0, static_cast<size_t>(length - endlen));
    if (killwords) return Value::string(head + end);
    size_t sp = head.rfind(' ');
    if (sp != std::string::npos) head = head.substr(0, sp);
    return Value::string(head + end);
  }
  if (f == "attr") {
    // do_attr uses Python getattr only: unlike x.name it never falls back to x["name"].
    ArgBinder a(f, args, kw, {"name"});
    std::string name = a.get(0).str();
    if (v.is_dict() && !is_method(v, name) && !is_unsafe_method(v, name)) return Value::undefined("'dict object' has no attribute '" + name + "'");
    return get_attr(v, name);
  }
  if (f == "format") {
    Value fmt = soft_str(v);
    Value argv;
    if (!kw.empty()) {
      Dict d;
      for (auto& [k, val] : kw) d.set(Value::string(k), val);
      argv = Value::dict(std::move(d));
    } else {
      argv = Value::list(args, true);
    }
    return Value::string(percent_format(*this, fmt.as_string(), argv));
  }
  if (unsupported_filters().count(f))
    throw_error(TemplateError::Kind::kUnsupported, "filter '" + f + "' is not supported by larder's chat-template engine");
  runtime_error("No filter named '" + f + "'.");
}

}  // namespace larder::chat_template
