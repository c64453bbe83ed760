// value.h — the runtime value of the chat-template interpreter.
//
// Jinja templates run on Python objects, and what a template prints depends on Python's rules
// for them: None vs Undefined, int vs float printing, str() of containers, truthiness of empty
// containers, dict insertion order. Value models exactly the kinds of objects a chat template
// can meet: the JSON types it receives (messages, tools), tuples (dict.items(), literals),
// Markup (the result of |safe, which escapes what is added to it), callables (macros, builtins,
// bound methods like dict.items), jinja2's Namespace and loop objects.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace larder::chat_template {

// Every failure inside the engine is thrown as a TemplateError and turned into a Status at the
// public boundary (chat_template.cpp); nothing throws across the library boundary.
struct TemplateError {
  enum class Kind { kSyntax, kRuntime, kRaised, kUnsupported, kLimit };
  Kind kind;
  std::string message;
  int line = 0;  // 1-based template line, 0 when unknown
};
[[noreturn]] void throw_error(TemplateError::Kind kind, std::string message, int line = 0);
[[noreturn]] inline void runtime_error(std::string message) {
  throw_error(TemplateError::Kind::kRuntime, std::move(message));
}

class Value;
using List = std::vector<Value>;
// Insertion-ordered mapping with Python key semantics (1, 1.0 and True are the same key).
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  Value* find(const Value& key);
  void set(const Value& key, Value v);
};

struct Interpreter;
// A callable: macro, builtin function, bound method, caller(). args are positional values,
// kwargs keep their call order.
using Kwargs = std::vector<std::pair<std::string, Value>>;
struct Callable {
  std::string name;
  std::function<Value(Interpreter&, std::vector<Value>&, Kwargs&)> fn;
  bool is_macro = false;
  bool unsafe = false;  // ImmutableSandbox: attribute exists but calling it is a SecurityError
  std::string unsafe_message;
};

struct LoopState {
  std::shared_ptr<const List> items;  // the (filtered) sequence being iterated
  int64_t index0 = 0;
  int depth0 = 0;
  std::vector<Value> last_changed;
  bool has_changed = false;
};

// Python sequence/iterator classes a list-like value can be. jinja2's map/select/reject/
// selectattr/rejectattr/unique/items/batch filters return generators: always truthy, no len(),
// not indexable and not JSON serializable (so "tools | map(...) | tojson" raises, as in HF).
enum class SeqKind : uint8_t { kList, kTuple, kGenerator, kReverseIter, kDictItems, kDictKeys, kDictValues, kRange };

class Value {
 public:
  enum class Type : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable, kNamespace, kLoop };

  Value() = default;  // Undefined
  static Value undefined(std::string hint = {}) {
    Value v;
    if (!hint.empty()) v.s_ = std::make_shared<const std::string>(std::move(hint));
    return v;
  }
  static Value none() { Value v; v.t_ = Type::kNone; return v; }
  static Value boolean(bool b) { Value v; v.t_ = Type::kBool; v.i_ = b; return v; }
  static Value integer(int64_t i) { Value v; v.t_ = Type::kInt; v.i_ = i; return v; }
  static Value floating(double d) { Value v; v.t_ = Type::kFloat; v.d_ = d; return v; }
  static Value string(std::string s, bool markup = false) {
    Value v; v.t_ = Type::kString; v.markup_ = markup;
    v.s_ = std::make_shared<const std::string>(std::move(s));
    return v;
  }
  static Value list(List items, bool tuple = false) {
    return sequence(std::move(items), tuple ? SeqKind::kTuple : SeqKind::kList);
  }
  // range() objects remember their arguments for repr ("range(0, 3)").
  static Value range(List items, std::string repr) {
    Value v = sequence(std::move(items), SeqKind::kRange);
    v.s_ = std::make_shared<const std::string>(std::move(repr));
    return v;
  }
  static Value sequence(List items, SeqKind kind) {
    Value v; v.t_ = Type::kList; v.kind_ = kind;
    v.depth_ = nesting_of(items);
    v.l_ = std::make_shared<const List>(std::move(items));
    return v;
  }
  static Value dict(Dict d);
  static Value namespace_(Dict d) { Value v = dict(std::move(d)); v.t_ = Type::kNamespace; return v; }
  // Containers built at run time may nest at most this deep (a loop doing "ns.x = [ns.x]"
  // would otherwise build a chain whose destruction recurses past any stack).
  static constexpr uint16_t kMaxNesting = 512;
  uint16_t depth() const { return depth_; }
  // Namespace attribute assignment: the namespace is at least one level above what it holds.
  void note_child_depth(uint16_t d) const;
  static Value callable(std::shared_ptr<Callable> c) { Value v; v.t_ = Type::kCallable; v.c_ = std::move(c); return v; }
  static Value loop(std::shared_ptr<LoopState> l) { Value v; v.t_ = Type::kLoop; v.loop_ = std::move(l); return v; }
  static Value from_json(const nlohmann::ordered_json& j);

  Type type() const { return t_; }
  bool is_undefined() const { return t_ == Type::kUndefined; }
  bool is_none() const { return t_ == Type::kNone; }
  bool is_bool() const { return t_ == Type::kBool; }
  bool is_int() const { return t_ == Type::kInt; }
  bool is_float() const { return t_ == Type::kFloat; }
  // Python bool is an int subclass: True + 1 == 2, True == 1.
  bool is_integral() const { return t_ == Type::kInt || t_ == Type::kBool; }
  bool is_number() const { return is_integral() || t_ == Type::kFloat; }
  bool is_string() const { return t_ == Type::kString; }
  bool is_markup() const { return t_ == Type::kString && markup_; }
  bool is_list() const { return t_ == Type::kList; }  // any SeqKind: iterable via as_list()
  bool is_tuple() const { return t_ == Type::kList && kind_ == SeqKind::kTuple; }
  // A real Python list or tuple (indexable, has len, JSON serializable).
  bool is_list_or_tuple() const { return t_ == Type::kList && (kind_ == SeqKind::kList || kind_ == SeqKind::kTuple); }
  bool is_iterator() const { return t_ == Type::kList && (kind_ == SeqKind::kGenerator || kind_ == SeqKind::kReverseIter); }
  SeqKind seq_kind() const { return kind_; }

  bool is_dict() const { return t_ == Type::kDict; }
  bool is_namespace() const { return t_ == Type::kNamespace; }
  bool is_callable() const { return t_ == Type::kCallable; }
  bool is_loop() const { return t_ == Type::kLoop; }

  bool as_bool() const { return i_ != 0; }
  int64_t as_int() const { return i_; }  // int or bool
  double as_double() const { return t_ == Type::kFloat ? d_ : static_cast<double>(i_); }
  const std::string& as_string() const { return *s_; }
  const List& as_list() const { return *l_; }
  const Dict& as_dict() const { return *d_map_; }
  Dict& mutable_dict() const { return *d_map_; }  // namespaces only
  const std::shared_ptr<Callable>& as_callable() const { return c_; }
  const std::shared_ptr<LoopState>& as_loop() const { return loop_; }
  // Message jinja2 gives when this Undefined is used ("'x' is undefined").
  std::string undefined_message() const { return s_ ? *s_ : std::string("undefined value"); }

  // Python truthiness: "", [], {}, 0, 0.0, None, False and Undefined are false.
  bool truthy() const;
  // Python str(): what {{ x }}, |string and ~ produce.
  std::string str() const;
  // Python repr(): how str() of a list/dict shows its elements.
  std::string repr() const;
  // jinja2.utils.object_type_repr, used in undefined messages ("dict object", "None").
  std::string type_repr() const;
  // Python == (deep, 1 == 1.0 == True, Undefined == Undefined).
  bool equals(const Value& o) const;
  bool hashable() const;

 private:
  Type t_ = Type::kUndefined;
  bool markup_ = false;
  SeqKind kind_ = SeqKind::kList;
  mutable uint16_t depth_ = 0;  // container nesting (0 for scalars)
  static uint16_t nesting_of(const List& items);
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<const List> l_;
  std::shared_ptr<Dict> d_map_;
  std::shared_ptr<Callable> c_;
  std::shared_ptr<LoopState> loop_;
};

// Python float repr (shortest round-trip digits; "1e-05", "1e+16", "1.0", "inf", "nan").
std::string python_float_repr(double d);
// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as HF's tojson filter calls it.
struct JsonOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;  // used when has_indent
  bool has_separators = false;
  std::string item_sep, key_sep;
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonOptions& opts);
// markupsafe.escape: & < > ' " as HTML entities.
std::string html_escape(std::string_view s);

// UTF-8 helpers: Python strings index by code point.
std::vector<uint32_t> utf8_decode(std::string_view s);
void utf8_append(std::string& out, uint32_t cp);
std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end);
size_t utf8_length(std::string_view s);
bool py_isspace(uint32_t cp);
bool py_isprintable(uint32_t cp);
uint32_t py_lower(uint32_t cp);
uint32_t py_upper(uint32_t cp);
bool py_isalpha(uint32_t cp);
bool py_isdigit(uint32_t cp);
bool py_is_cased_upper(uint32_t cp);
bool py_is_cased_lower(uint32_t cp);

}  // namespace larder::chat_template
