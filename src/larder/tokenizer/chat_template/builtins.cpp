// builtins.cpp — Python operators, attribute/item access as jinja2's ImmutableSandboxedEnvironment
// does it, str/dict/list methods, and the globals Hugging Face installs.
//
// Attribute rules reproduced (jinja2 sandbox getattr/getitem):
//  * x.name tries the Python attribute first, then x["name"]: d.items is dict.items (a method),
//    not d["items"]; x["name"] tries the key first, then the attribute;
//  * a missing attribute or key gives Undefined (prints ""), but any attribute, item or
//    arithmetic on Undefined raises; attributes of None are Undefined too;
//  * methods that mutate lists/dicts are "unsafe": calling them raises a SecurityError.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "larder/core/status.h"
#include "larder/tokenizer/chat_template/builtins_util.h"
#include "larder/tokenizer/chat_template/interpreter.h"

namespace larder::chat_template {

std::string py_type_name(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined: return "Undefined";
    case Value::Type::kNone: return "NoneType";
    case Value::Type::kBool: return "bool";
    case Value::Type::kInt: return "int";
    case Value::Type::kFloat: return "float";
    case Value::Type::kString: return v.is_markup() ? "Markup" : "str";
    case Value::Type::kList: {
      std::string tn = v.type_repr();  // "generator object" -> "generator"
      return tn.substr(0, tn.size() - 7);
    }
    case Value::Type::kDict: return "dict";
    case Value::Type::kNamespace: return "Namespace";
    case Value::Type::kLoop: return "LoopContext";
    case Value::Type::kCallable: return v.as_callable()->is_macro ? "Macro" : "builtin_function_or_method";
  }
  return "object";
}

Value make_builtin(std::string name, std::function<Value(Interpreter&, std::vector<Value>&, Kwargs&)> fn) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->fn = std::move(fn);
  return Value::callable(std::move(c));
}

// ------------------------------------------------------------------ argument binding

ArgBinder::ArgBinder(const std::string& fname, std::vector<Value>& args, Kwargs& kw,
                     std::initializer_list<const char*> names, size_t skip)
    : vals(names.size()), given(names.size(), false) {
  std::vector<const char*> n(names);
  if (args.size() > n.size())
    runtime_error(strfmt("%s() takes at most %zu arguments (%zu given)", fname.c_str(), n.size() + skip, args.size() + skip));
  for (size_t i = 0; i < args.size(); ++i) {
    vals[i] = args[i];
    given[i] = true;
  }
  for (auto& [k, v] : kw) {
    bool found = false;
    for (size_t i = 0; i < n.size(); ++i) {
      if (k == n[i]) {
        if (given[i]) runtime_error(fname + "() got multiple values for argument '" + k + "'");
        vals[i] = v;
        given[i] = true;
        found = true;
        break;
      }
    }
    if (!found) runtime_error(fname + "() got an unexpected keyword argument '" + k + "'");
  }
}

// ------------------------------------------------------------------ helpers

int64_t to_index(const Value& v, const char* what) {
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_integral()) runtime_error(std::string(what) + " must be integers, not " + py_type_name(v));
  return v.as_int();
}

// Sizes are also charged to the step budget, so repeating large operations cannot run for long
// without tripping the limit either.
static void charge(const Interpreter& in, size_t units) {
  auto& mut = const_cast<Interpreter&>(in);
  mut.steps += units;
  if (mut.steps > mut.limits.max_steps) throw_error(TemplateError::Kind::kLimit, "template evaluation step limit exceeded");
}

void check_size(const Interpreter& in, size_t n) {
  charge(in, n / 64);
  if (n > in.limits.max_string_bytes) throw_error(TemplateError::Kind::kLimit, strfmt("string longer than %zu bytes", in.limits.max_string_bytes));
}
void check_items(const Interpreter& in, size_t n) {
  charge(in, 1);
  if (n > in.limits.max_items) throw_error(TemplateError::Kind::kLimit, strfmt("sequence longer than %zu items", in.limits.max_items));
}

List Interpreter::iterate(const Value& v) {
  if (v.is_list()) charge(*this, v.as_list().size() / 8);
  if (v.is_string()) charge(*this, v.as_string().size() / 8);
  switch (v.type()) {
    case Value::Type::kUndefined: return {};  // jinja2's Undefined iterates as empty
    case Value::Type::kList: return v.as_list();
    case Value::Type::kDict: {
      List keys;
      for (const auto& kv : v.as_dict().items) keys.push_back(kv.first);
      return keys;
    }
    case Value::Type::kString: {
      List chars;
      std::string s;
      for (uint32_t cp : utf8_decode(v.as_string())) {
        s.clear();
        utf8_append(s, cp);
        chars.push_back(Value::string(s, v.is_markup()));
      }
      return chars;
    }
    case Value::Type::kLoop: return v.as_loop()->items ? *v.as_loop()->items : List{};
    default: runtime_error("'" + py_type_name(v) + "' object is not iterable");
  }
}

// ------------------------------------------------------------------ operators

static Value int_result(__int128 r) {
  if (r > INT64_MAX || r < INT64_MIN) runtime_error("integer overflow (arbitrary-precision ints are not supported)");
  return Value::integer(static_cast<int64_t>(r));
}

static int64_t floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

static std::string binop_type_error(const std::string& op, const Value& a, const Value& b) {
  return "unsupported operand type(s) for " + op + ": '" + py_type_name(a) + "' and '" + py_type_name(b) + "'";
}

Value Interpreter::binary(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (op == "+") {
    if (a.is_number() && b.is_number()) {
      if (a.is_float() || b.is_float()) return Value::floating(a.as_double() + b.as_double());
      return int_result(static_cast<__int128>(a.as_int()) + b.as_int());
    }
    if (a.is_string() && b.is_string()) {
      // markupsafe: Markup + str escapes the plain side (and str + Markup likewise).
      bool markup = a.is_markup() || b.is_markup();
      std::string l = (markup && !a.is_markup()) ? html_escape(a.as_string()) : a.as_string();
      std::string r = (markup && !b.is_markup()) ? html_escape(b.as_string()) : b.as_string();
      check_size(*this, l.size() + r.size());
      return Value::string(l + r, markup);
    }
    if (a.is_list_or_tuple() && b.is_list_or_tuple() && a.is_tuple() == b.is_tuple()) {
      List l = a.as_list();
      check_items(*this, l.size() + b.as_list().size());
      l.insert(l.end(), b.as_list().begin(), b.as_list().end());
      return Value::list(std::move(l), a.is_tuple());
    }
    if (a.is_string() && !a.is_markup()) runtime_error("can only concatenate str (not \"" + py_type_name(b) + "\") to str");
    if (a.is_list() && a.seq_kind() == SeqKind::kList)
      runtime_error("can only concatenate list (not \"" + py_type_name(b) + "\") to list");
    runtime_error(binop_type_error("+", a, b));
  }
  if (op == "*") {
    auto repeat = [&](const Value& seq, int64_t n) -> Value {
      if (n < 0) n = 0;
      if (seq.is_string()) {
        check_size(*this, seq.as_string().size() * static_cast<size_t>(n));
        std::string s;
        for (int64_t i = 0; i < n; ++i) s += seq.as_string();
        return Value::string(std::move(s), seq.is_markup());
      }
      check_items(*this, seq.as_list().size() * static_cast<size_t>(n));
      List l;
      for (int64_t i = 0; i < n; ++i) l.insert(l.end(), seq.as_list().begin(), seq.as_list().end());
      return Value::list(std::move(l), seq.is_tuple());
    };
    if ((a.is_string() || a.is_list_or_tuple()) && b.is_integral()) return repeat(a, b.as_int());
    if ((b.is_string() || b.is_list_or_tuple()) && a.is_integral()) return repeat(b, a.as_int());
    if (a.is_number() && b.is_number()) {
      if (a.is_float() || b.is_float()) return Value::floating(a.as_double() * b.as_double());
      return int_result(static_cast<__int128>(a.as_int()) * b.as_int());
    }
    if (a.is_string() && b.is_string()) runtime_error("can't multiply sequence by non-int of type 'str'");
    runtime_error(binop_type_error("*", a, b));
  }
  if (op == "%" && a.is_string()) return Value::string(percent_format(*this, a.as_string(), b));
  if (!a.is_number() || !b.is_number()) {
    std::string pyop = op;
    runtime_error(binop_type_error(pyop, a, b));
  }
  bool fl = a.is_float() || b.is_float();
  if (op == "-") {
    if (fl) return Value::floating(a.as_double() - b.as_double());
    return int_result(static_cast<__int128>(a.as_int()) - b.as_int());
  }
  if (op == "/") {
    if (b.as_double() == 0) runtime_error(fl ? "float division by zero" : "division by zero");
    return Value::floating(a.as_double() / b.as_double());
  }
  if (op == "//") {
    if (fl) {
      if (b.as_double() == 0) runtime_error("float floor division by zero");
      return Value::floating(std::floor(a.as_double() / b.as_double()));
    }
    if (b.as_int() == 0) runtime_error("integer division or modulo by zero");
    if (a.as_int() == INT64_MIN && b.as_int() == -1) runtime_error("integer overflow");
    return Value::integer(floordiv(a.as_int(), b.as_int()));
  }
  if (op == "%") {
    if (fl) {
      double x = a.as_double(), y = b.as_double();
      if (y == 0) runtime_error("float modulo");
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::floating(m);
    }
    if (b.as_int() == 0) runtime_error("integer division or modulo by zero");
    if (b.as_int() == -1) return Value::integer(0);
    return Value::integer(a.as_int() - floordiv(a.as_int(), b.as_int()) * b.as_int());
  }
  if (op == "**") {
    if (!fl && b.as_int() >= 0) {
      __int128 r = 1, base = a.as_int();
      for (int64_t e = b.as_int(); e > 0; --e) {
        r *= base;
        if (r > INT64_MAX || r < INT64_MIN) runtime_error("integer overflow (arbitrary-precision ints are not supported)");
        if (r == 0 || r == 1) break;
      }
      return Value::integer(static_cast<int64_t>(r));
    }
    if (a.as_double() == 0 && b.as_double() < 0) runtime_error("0.0 cannot be raised to a negative power");
    return Value::floating(std::pow(a.as_double(), b.as_double()));
  }
  runtime_error("unknown operator " + op);
}

// Python ordering (<, <=, >, >=); a TypeError across unrelated types, as in Python 3.
static int py_order(const Value& a, const Value& b, const std::string& op) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_double(), y = b.as_double();
      if (std::isnan(x) || std::isnan(y)) return 2;  // unordered: every comparison false
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    return a.as_int() < b.as_int() ? -1 : (a.as_int() > b.as_int() ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());  // UTF-8 byte order == code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list_or_tuple() && b.is_list_or_tuple() && a.is_tuple() == b.is_tuple()) {
    const List &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!x[i].equals(y[i])) return py_order(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  runtime_error("'" + op + "' not supported between instances of '" + py_type_name(a) + "' and '" + py_type_name(b) + "'");
}

int py_compare(const Value& a, const Value& b) { return py_order(a, b, "<"); }

bool Interpreter::contains(const Value& container, const Value& item) {
  switch (container.type()) {
    case Value::Type::kUndefined: return false;
    case Value::Type::kString:
      if (!item.is_string()) runtime_error("'in <string>' requires string as left operand, not " + py_type_name(item));
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Type::kList:
      for (const auto& e : container.as_list()) if (e.equals(item)) return true;
      return false;
    case Value::Type::kDict:
      if (!item.hashable()) runtime_error("unhashable type: '" + py_type_name(item) + "'");
      return container.as_dict().find(item) != nullptr;
    case Value::Type::kLoop:
      for (const auto& e : iterate(container)) if (e.equals(item)) return true;
      return false;
    default:
      runtime_error("argument of type '" + py_type_name(container) + "' is not iterable");
  }
}

bool Interpreter::compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return a.equals(b);
  if (op == "!=") return !a.equals(b);
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  int c = py_order(a, b, op);
  if (c == 2) return false;
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  if (op == ">=") return c >= 0;
  runtime_error("unknown comparison " + op);
}

// ------------------------------------------------------------------ attributes and items

static Value unsafe_attr(const Value& obj, const std::string& name) {
  return Value::undefined("access to attribute '" + name + "' of '" + py_type_name(obj) + "' object is unsafe.");
}

static Value missing_attr(const Value& obj, const std::string& name) {
  return Value::undefined("'" + obj.type_repr() + "' has no attribute '" + name + "'");
}

static Value loop_attr(Interpreter& in, const Value& loopv, const std::string& name) {
  const LoopState& l = *loopv.as_loop();
  int64_t n = l.items ? static_cast<int64_t>(l.items->size()) : 0;
  int64_t i = l.index0;
  if (name == "index0") return Value::integer(i);
  if (name == "index") return Value::integer(i + 1);
  if (name == "revindex") return Value::integer(n - i);
  if (name == "revindex0") return Value::integer(n - i - 1);
  if (name == "first") return Value::boolean(i == 0);
  if (name == "last") return Value::boolean(i == n - 1);
  if (name == "length") return Value::integer(n);
  if (name == "depth0") return Value::integer(l.depth0);
  if (name == "depth") return Value::integer(l.depth0 + 1);
  if (name == "previtem") return i > 0 ? (*l.items)[i - 1] : Value::undefined("there is no previous item");
  if (name == "nextitem") return i + 1 < n ? (*l.items)[i + 1] : Value::undefined("there is no next item");
  if (name == "cycle") {
    auto st = loopv.as_loop();
    return make_builtin("cycle", [st](Interpreter&, std::vector<Value>& args, Kwargs&) -> Value {
      if (args.empty()) runtime_error("no items for cycling given");
      return args[static_cast<size_t>(st->index0) % args.size()];
    });
  }
  if (name == "changed") {
    auto st = loopv.as_loop();
    return make_builtin("changed", [st](Interpreter&, std::vector<Value>& args, Kwargs&) -> Value {
      bool same = st->has_changed && args.size() == st->last_changed.size();
      for (size_t k = 0; same && k < args.size(); ++k) same = args[k].equals(st->last_changed[k]);
      if (same) return Value::boolean(false);
      st->has_changed = true;
      st->last_changed = args;
      return Value::boolean(true);
    });
  }
  (void)in;
  return missing_attr(loopv, name);
}

Value Interpreter::get_attr(const Value& obj, const std::string& attr) {
  switch (obj.type()) {
    case Value::Type::kUndefined:
      fail_undefined(obj);
    case Value::Type::kDict: {
      if (is_method(obj, attr)) return bind_method(obj, attr);
      if (is_unsafe_method(obj, attr)) return unsafe_attr(obj, attr);
      if (const Value* v = obj.as_dict().find(Value::string(attr))) return *v;
      return missing_attr(obj, attr);
    }
    case Value::Type::kNamespace: {
      if (const Value* v = obj.as_dict().find(Value::string(attr))) return *v;
      return missing_attr(obj, attr);
    }
    case Value::Type::kLoop:
      return loop_attr(*this, obj, attr);
    case Value::Type::kString:
    case Value::Type::kList:
      if (is_method(obj, attr)) return bind_method(obj, attr);
      if (is_unsafe_method(obj, attr)) return unsafe_attr(obj, attr);
      return missing_attr(obj, attr);
    default:
      return missing_attr(obj, attr);
  }
}

Value Interpreter::get_item(const Value& obj, const Value& key) {
  switch (obj.type()) {
    case Value::Type::kUndefined:
      fail_undefined(obj);
    case Value::Type::kDict: {
      if (key.hashable()) {
        if (const Value* v = obj.as_dict().find(key)) return *v;
      }
      if (key.is_string()) return get_attr(obj, key.as_string());
      return Value::undefined("dict object has no element " + key.repr());
    }
    case Value::Type::kList: {
      bool indexable = obj.is_list_or_tuple() || obj.seq_kind() == SeqKind::kRange;
      if (key.is_integral() && indexable) {
        int64_t n = static_cast<int64_t>(obj.as_list().size());
        int64_t i = key.as_int();
        if (i < 0) i += n;
        if (i >= 0 && i < n) return obj.as_list()[static_cast<size_t>(i)];
        return Value::undefined(py_type_name(obj) + " object has no element " + key.repr());
      }
      if (key.is_string()) return get_attr(obj, key.as_string());
      return Value::undefined(py_type_name(obj) + " object has no element " + key.repr());
    }
    case Value::Type::kString: {
      if (key.is_integral()) {
        auto cps = utf8_decode(obj.as_string());
        int64_t n = static_cast<int64_t>(cps.size());
        int64_t i = key.as_int();
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value::string(utf8_encode(cps, i, i + 1), obj.is_markup());
        return Value::undefined("str object has no element " + key.repr());
      }
      if (key.is_string()) return get_attr(obj, key.as_string());
      return Value::undefined("str object has no element " + key.repr());
    }
    case Value::Type::kNamespace:
    case Value::Type::kLoop:
      if (key.is_string()) return get_attr(obj, key.as_string());
      return Value::undefined(obj.type_repr() + " has no element " + key.repr());
    default:
      if (key.is_string()) return get_attr(obj, key.as_string());
      return Value::undefined(obj.type_repr() + " has no element " + key.repr());
  }
}

// Python's slice.indices(): clamps start/stop for the given length and step sign.
static void slice_indices(int64_t len, const Value& start, const Value& stop, const Value& step, int64_t& b, int64_t& e,
                          int64_t& st) {
  st = step.is_none() ? 1 : to_index(step, "slice indices");
  if (st == 0) runtime_error("slice step cannot be zero");
  auto adjust = [&](const Value& v, int64_t def_pos, int64_t def_neg) -> int64_t {
    if (v.is_none()) return st > 0 ? def_pos : def_neg;
    int64_t x = to_index(v, "slice indices");
    if (x < 0) {
      x += len;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= len) {
      x = st < 0 ? len - 1 : len;
    }
    return x;
  };
  b = adjust(start, 0, len - 1);
  e = adjust(stop, len, -1);
}

Value Interpreter::slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) fail_undefined(obj);
  auto pick = [&](int64_t len, auto&& take) {
    int64_t b, e, st;
    slice_indices(len, start, stop, step, b, e, st);
    if (st > 0) for (int64_t i = b; i < e; i += st) take(i);
    else for (int64_t i = b; i > e; i += st) take(i);
  };
  if (obj.is_list_or_tuple() || (obj.is_list() && obj.seq_kind() == SeqKind::kRange)) {
    List out;
    const List& l = obj.as_list();
    pick(static_cast<int64_t>(l.size()), [&](int64_t i) { out.push_back(l[static_cast<size_t>(i)]); });
    return Value::list(std::move(out), obj.is_tuple());
  }
  if (obj.is_string()) {
    auto cps = utf8_decode(obj.as_string());
    std::string out;
    pick(static_cast<int64_t>(cps.size()), [&](int64_t i) { utf8_append(out, cps[static_cast<size_t>(i)]); });
    return Value::string(std::move(out), obj.is_markup());
  }
  // obj[a:b] on anything else is a TypeError, which jinja2's getitem turns into Undefined.
  return Value::undefined(obj.type_repr() + " has no element slice");
}

Value Interpreter::call(const Value& callee, std::vector<Value>& args, Kwargs& kwargs) {
  if (callee.is_undefined()) fail_undefined(callee);
  if (!callee.is_callable()) runtime_error("'" + py_type_name(callee) + "' object is not callable");
  return callee.as_callable()->fn(*this, args, kwargs);
}

// ------------------------------------------------------------------ globals

static std::string strftime_py(const std::string& fmt, const std::tm& tm) {
  // datetime.strftime on a naive datetime: %f is microseconds (0 here), %z/%Z are empty;
  // everything else is the C library's strftime in the C locale, as CPython uses.
  std::string f;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] == '%' && i + 1 < fmt.size()) {
      char c = fmt[i + 1];
      if (c == 'f') { f += "000000"; ++i; continue; }
      if (c == 'z' || c == 'Z') { ++i; continue; }
      f += fmt[i];
      f += c;
      ++i;
      continue;
    }
    f += fmt[i];
  }
  if (f.empty()) return "";
  std::vector<char> buf(f.size() * 8 + 256);
  size_t n = std::strftime(buf.data(), buf.size(), f.c_str(), &tm);
  return std::string(buf.data(), n);
}

void Interpreter::install_globals(Frame& g) {
  g.set("raise_exception", make_builtin("raise_exception", [](Interpreter&, std::vector<Value>& args, Kwargs& kw) -> Value {
    std::string msg = !args.empty() ? args[0].str() : (!kw.empty() ? kw[0].second.str() : std::string());
    throw_error(TemplateError::Kind::kRaised, msg);
  }));
  g.set("strftime_now", make_builtin("strftime_now", [](Interpreter& in, std::vector<Value>& args, Kwargs& kw) -> Value {
    ArgBinder a("strftime_now", args, kw, {"format"});
    if (!a.has(0) || !a.get(0).is_string()) runtime_error("strftime_now() argument 'format' must be str");
    std::tm tm{};
    if (in.now) {
      tm = *in.now;
    } else {
      std::time_t t = std::time(nullptr);
      localtime_r(&t, &tm);
    }
    return Value::string(strftime_py(a.get(0).as_string(), tm));
  }));
  g.set("range", make_builtin("range", [](Interpreter& in, std::vector<Value>& args, Kwargs& kw) -> Value {
    if (!kw.empty()) runtime_error("range() takes no keyword arguments");
    if (args.empty() || args.size() > 3) runtime_error("range expected at most 3 arguments");
    int64_t start = 0, stop, step = 1;
    if (args.size() == 1) {
      stop = to_index(args[0], "range() arguments");
    } else {
      start = to_index(args[0], "range() arguments");
      stop = to_index(args[1], "range() arguments");
      if (args.size() == 3) step = to_index(args[2], "range() arguments");
    }
    if (step == 0) runtime_error("range() arg 3 must not be zero");
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      out.push_back(Value::integer(i));
      check_items(in, out.size());
    }
    std::string repr = args.size() == 1 ? strfmt("range(0, %lld)", static_cast<long long>(stop))
                       : step == 1 ? strfmt("range(%lld, %lld)", static_cast<long long>(start), static_cast<long long>(stop))
                                   : strfmt("range(%lld, %lld, %lld)", static_cast<long long>(start), static_cast<long long>(stop), static_cast<long long>(step));
    return Value::range(std::move(out), std::move(repr));
  }));
  auto make_mapping = [](const char* fname, std::vector<Value>& args, Kwargs& kw) -> Dict {
    Dict d;
    if (args.size() > 1) runtime_error(std::string(fname) + " expected at most 1 argument");
    if (!args.empty()) {
      const Value& src = args[0];
      if (src.is_dict() || src.is_namespace()) {
        for (const auto& kv : src.as_dict().items) d.set(kv.first, kv.second);
      } else if (src.is_list()) {
        for (const auto& pair : src.as_list()) {
          if (!pair.is_list_or_tuple() || pair.as_list().size() != 2)
            runtime_error("dictionary update sequence element has wrong length; 2 is required");
          d.set(pair.as_list()[0], pair.as_list()[1]);
        }
      } else if (!src.is_undefined()) {
        runtime_error("'" + py_type_name(src) + "' object is not iterable");
      }
    }
    for (auto& [k, v] : kw) d.set(Value::string(k), v);
    return d;
  };
  g.set("namespace", make_builtin("namespace", [make_mapping](Interpreter&, std::vector<Value>& args, Kwargs& kw) -> Value {
    Dict d = make_mapping("namespace", args, kw);
    for (const auto& kv : d.items) {
      if (kv.first.is_string() && !kv.first.as_string().empty() && kv.first.as_string()[0] == '_')
        runtime_error("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" +
                      kv.first.as_string() + "'. Please rename the attribute.");
    }
    return Value::namespace_(std::move(d));
  }));
  g.set("dict", make_builtin("dict", [make_mapping](Interpreter&, std::vector<Value>& args, Kwargs& kw) -> Value {
    return Value::dict(make_mapping("dict", args, kw));
  }));
}

}  // namespace larder::chat_template
