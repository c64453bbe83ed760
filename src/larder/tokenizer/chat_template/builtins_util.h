// builtins_util.h — helpers shared by builtins.cpp, methods.cpp and filters.cpp.
#pragma once

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "larder/tokenizer/chat_template/interpreter.h"
#include "larder/tokenizer/chat_template/value.h"

namespace larder::chat_template {

// Binds positional + keyword arguments to a Python-style parameter list.
struct ArgBinder {
  std::vector<Value> vals;
  std::vector<bool> given;
  ArgBinder(const std::string& fname, std::vector<Value>& args, Kwargs& kw, std::initializer_list<const char*> names,
            size_t skip = 1);
  bool has(size_t i) const { return i < given.size() && given[i]; }
  const Value& get(size_t i) const { return vals[i]; }
  Value get_or(size_t i, Value def) const { return has(i) ? vals[i] : def; }
};

Value make_builtin(std::string name, std::function<Value(Interpreter&, std::vector<Value>&, Kwargs&)> fn);
int64_t to_index(const Value& v, const char* what);
void check_size(const Interpreter& in, size_t n);   // string bytes
void check_items(const Interpreter& in, size_t n);  // list items
int py_compare(const Value& a, const Value& b);  // -1/0/1 (2 = unordered NaN); TypeError across types

// methods.cpp
bool is_method(const Value& obj, const std::string& name);
bool is_unsafe_method(const Value& obj, const std::string& name);
Value bind_method(const Value& obj, const std::string& name);
std::string percent_format(Interpreter& in, const std::string& fmt, const Value& args);  // "%s" % x
// Python str helpers
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);
std::vector<std::string> py_split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right);
std::vector<std::string> py_splitlines(const std::string& s, bool keepends);
std::string py_replace(const std::string& s, const std::string& old, const std::string& rep, int64_t count);
std::string py_str_lower(const std::string& s);
std::string py_str_upper(const std::string& s);
std::string py_str_title(const std::string& s);
std::string py_str_capitalize(const std::string& s);

}  // namespace larder::chat_template
