// interpreter.h — evaluates a parsed template against a context, with jinja2's scoping:
//  * the template's top level is one frame: {% set %} there is visible everywhere after it,
//    macros included (they look names up when called, not when defined);
//  * each for-loop iteration gets a fresh frame under the enclosing one, so a {% set %} in a loop
//    body is gone at the next iteration and after the loop (namespace() carries values out);
//  * if/elif/else share their enclosing frame; macros, call blocks, with, set/filter blocks get
//    their own.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "larder/tokenizer/chat_template/ast.h"
#include "larder/tokenizer/chat_template/value.h"

namespace larder::chat_template {

struct Frame {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Frame> parent;
  explicit Frame(std::shared_ptr<Frame> p = nullptr) : parent(std::move(p)) {}
  const Value* lookup(const std::string& name) const;
  void set(const std::string& name, Value v);
};
using FramePtr = std::shared_ptr<Frame>;

struct Limits {
  size_t max_output_bytes = 64u << 20;
  int max_call_depth = 200;  // macro recursion (Python's recursion limit stops jinja2 earlier)
  uint64_t max_steps = 20'000'000;  // real templates need well under 1M
  size_t max_string_bytes = 64u << 20;  // any single string value
  size_t max_items = 1'000'000;         // any single list (range(), list * n, ...)
};

struct Interpreter {
  std::string name;
  Limits limits;
  std::optional<std::tm> now;  // strftime_now clock; empty = local time now
  std::string* out = nullptr;
  int call_depth = 0;
  uint64_t steps = 0;
  int cur_line = 0;
  std::shared_ptr<const Body> program;  // keeps AST nodes alive for macros
  // Frames macros close over. Macros hold them weakly (a frame holds its macros, so strong
  // references would be cycles); the interpreter keeps them alive for the render.
  std::vector<FramePtr> pinned;

  enum class Flow { kNormal, kBreak, kContinue };

  std::string render(const Body& body, FramePtr root);
  Flow exec(const Body& body, const FramePtr& f);
  Flow exec_stmt(const Node& n, const FramePtr& f);
  Value eval(const Node& n, const FramePtr& f);

  void emit(const std::string& s);
  std::string capture(const Body& body, const FramePtr& f);

  // builtins.cpp
  static void install_globals(Frame& g);
  Value get_attr(const Value& obj, const std::string& attr);
  Value get_item(const Value& obj, const Value& key);
  Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
  Value call(const Value& callee, std::vector<Value>& args, Kwargs& kwargs);
  Value apply_filter(const std::string& fname, const Value& v, std::vector<Value>& args, Kwargs& kwargs);
  bool apply_test(const std::string& tname, const Value& v, std::vector<Value>& args, Kwargs& kwargs);
  Value binary(const std::string& op, const Value& a, const Value& b);
  bool compare(const std::string& op, const Value& a, const Value& b);
  bool contains(const Value& container, const Value& item);
  List iterate(const Value& v);  // Python iter() of a value as a list
  Value make_macro(const Node& def, const FramePtr& closure);
  Value make_caller(const Node& block, const FramePtr& closure);
};

[[noreturn]] void fail_undefined(const Value& u);
std::string py_type_name(const Value& v);  // "str", "int", "NoneType" (TypeError messages)

}  // namespace larder::chat_template
