// interpreter.cpp — statements and expressions (operators live in builtins.cpp).
#include "larder/tokenizer/chat_template/interpreter.h"

#include "larder/core/status.h"

namespace larder::chat_template {

const Value* Frame::lookup(const std::string& name) const {
  for (const Frame* f = this; f; f = f->parent.get()) {
    for (auto it = f->vars.rbegin(); it != f->vars.rend(); ++it)
      if (it->first == name) return &it->second;
  }
  return nullptr;
}

void Frame::set(const std::string& name, Value v) {
  for (auto& kv : vars) {
    if (kv.first == name) {
      kv.second = std::move(v);
      return;
    }
  }
  vars.emplace_back(name, std::move(v));
}

void fail_undefined(const Value& u) {
  throw_error(TemplateError::Kind::kRuntime, u.undefined_message());
}

void Interpreter::emit(const std::string& s) {
  if (out->size() + s.size() > limits.max_output_bytes)
    throw_error(TemplateError::Kind::kLimit, strfmt("output exceeds %zu bytes", limits.max_output_bytes));
  out->append(s);
}

std::string Interpreter::capture(const Body& body, const FramePtr& f) {
  std::string buf;
  std::string* saved = out;
  out = &buf;
  try {
    exec(body, f);
  } catch (...) {
    out = saved;
    throw;
  }
  out = saved;
  return buf;
}

std::string Interpreter::render(const Body& body, FramePtr root) {
  std::string result;
  out = &result;
  exec(body, root);
  return result;
}

Interpreter::Flow Interpreter::exec(const Body& body, const FramePtr& f) {
  for (const auto& n : body) {
    Flow fl = exec_stmt(*n, f);
    if (fl != Flow::kNormal) return fl;
  }
  return Flow::kNormal;
}

// Binds loop/set targets, unpacking like Python's "a, b = value".
static void assign_targets(Interpreter& in, Frame& f, const std::vector<std::string>& names, const Value& v) {
  if (names.size() == 1) {
    f.set(names[0], v);
    return;
  }
  List items = in.iterate(v);
  if (items.size() < names.size())
    runtime_error(strfmt("not enough values to unpack (expected %zu, got %zu)", names.size(), items.size()));
  if (items.size() > names.size()) runtime_error(strfmt("too many values to unpack (expected %zu)", names.size()));
  for (size_t i = 0; i < names.size(); ++i) f.set(names[i], items[i]);
}

Interpreter::Flow Interpreter::exec_stmt(const Node& n, const FramePtr& f) {
  cur_line = n.line;
  if (++steps > limits.max_steps) throw_error(TemplateError::Kind::kLimit, "template evaluation step limit exceeded");
  switch (n.kind) {
    case NodeKind::kData:
      emit(n.str);
      return Flow::kNormal;
    case NodeKind::kPrint: {
      Value v = eval(*n.expr, f);
      emit(v.str());
      return Flow::kNormal;
    }
    case NodeKind::kIf: {
      for (const auto& [cond, body] : n.branches) {
        cur_line = cond->line;
        if (eval(*cond, f).truthy()) return exec(body, f);
      }
      return exec(n.else_body, f);
    }
    case NodeKind::kFor: {
      Value seq = eval(*n.expr, f);
      List all = iterate(seq);
      List items;
      if (n.test) {
        // The loop filter sees the loop target but not "loop" (jinja2 evaluates it first).
        for (const auto& item : all) {
          auto tf = std::make_shared<Frame>(f);
          assign_targets(*this, *tf, n.names, item);
          if (eval(*n.test, tf).truthy()) items.push_back(item);
        }
      } else {
        items = std::move(all);
      }
      if (items.empty()) return exec(n.else_body, f);
      auto state = std::make_shared<LoopState>();
      state->items = std::make_shared<const List>(std::move(items));
      // loop.depth counts recursive-loop levels only; nested plain loops all have depth 1.
      Value loop_value = Value::loop(state);
      const List& list = *state->items;
      for (size_t i = 0; i < list.size(); ++i) {
        if (++steps > limits.max_steps) throw_error(TemplateError::Kind::kLimit, "template evaluation step limit exceeded");
        state->index0 = static_cast<int64_t>(i);
        auto iter_frame = std::make_shared<Frame>(f);
        assign_targets(*this, *iter_frame, n.names, list[i]);
        iter_frame->set("loop", loop_value);
        Flow fl = exec(n.body, iter_frame);
        if (fl == Flow::kBreak) break;
      }
      return Flow::kNormal;
    }
    case NodeKind::kSet: {
      Value v = eval(*n.expr, f);
      if (!n.str.empty()) {
        const Value* ns = f->lookup(n.names[0]);
        if (!ns || !ns->is_namespace()) runtime_error("Cannot assign attribute on non-namespace object");
        if (!n.str.empty() && n.str[0] == '_')
          runtime_error("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + n.str +
                        "'. Please rename the attribute.");
        ns->note_child_depth(v.depth());
        ns->mutable_dict().set(Value::string(n.str), v);
        return Flow::kNormal;
      }
      assign_targets(*this, *f, n.names, v);
      return Flow::kNormal;
    }
    case NodeKind::kSetBlock: {
      auto inner = std::make_shared<Frame>(f);
      Value v = Value::string(capture(n.body, inner));
      for (const auto& flt : n.args) {
        std::vector<Value> args;
        Kwargs kw;
        for (const auto& a : flt->args) args.push_back(eval(*a, f));
        for (const auto& [k, e] : flt->kwargs) kw.emplace_back(k, eval(*e, f));
        v = apply_filter(flt->str, v, args, kw);
      }
      f->set(n.names[0], v);
      return Flow::kNormal;
    }
    case NodeKind::kFilterBlock: {
      auto inner = std::make_shared<Frame>(f);
      Value v = Value::string(capture(n.body, inner));
      for (const auto& flt : n.args) {
        std::vector<Value> args;
        Kwargs kw;
        for (const auto& a : flt->args) args.push_back(eval(*a, f));
        for (const auto& [k, e] : flt->kwargs) kw.emplace_back(k, eval(*e, f));
        v = apply_filter(flt->str, v, args, kw);
      }
      emit(v.str());
      return Flow::kNormal;
    }
    case NodeKind::kMacro:
      f->set(n.str, make_macro(n, f));
      return Flow::kNormal;
    case NodeKind::kCallBlock: {
      const Node& call_node = *n.expr;
      Value callee = eval(*call_node.expr, f);
      std::vector<Value> args;
      Kwargs kw;
      for (const auto& a : call_node.args) args.push_back(eval(*a, f));
      for (const auto& [k, e] : call_node.kwargs) kw.emplace_back(k, eval(*e, f));
      kw.emplace_back("caller", make_caller(n, f));
      cur_line = n.line;
      emit(call(callee, args, kw).str());
      return Flow::kNormal;
    }
    case NodeKind::kWith: {
      auto inner = std::make_shared<Frame>(f);
      for (const auto& [k, e] : n.kwargs) inner->set(k, eval(*e, f));
      return exec(n.body, inner);
    }
    case NodeKind::kGeneration:
      return exec(n.body, f);
    case NodeKind::kBreak:
      return Flow::kBreak;
    case NodeKind::kContinue:
      return Flow::kContinue;
    default:
      runtime_error("internal: expression used as statement");
  }
}

// Macro calls follow jinja2.runtime.Macro: positional then keyword binding, missing arguments
// fall back to defaults (evaluated in the macro frame) or Undefined, extras go to varargs/kwargs
// only when the body mentions them.
namespace {

// Renders a macro or caller body one call level deeper; the depth is restored on every exit
// (errors propagate as exceptions inside the interpreter), the current line only on success,
// as before.
Value call_body(Interpreter& in, const Body& body, const FramePtr& frame) {
  struct DepthGuard {
    int& depth;
    explicit DepthGuard(int& d) : depth(d) { ++depth; }
    ~DepthGuard() { --depth; }
  } guard(in.call_depth);
  const int saved_line = in.cur_line;
  std::string s = in.capture(body, frame);
  in.cur_line = saved_line;
  return Value::string(std::move(s));
}

}  // namespace

Value Interpreter::make_macro(const Node& def, const FramePtr& closure) {
  auto c = std::make_shared<Callable>();
  c->name = def.str;
  c->is_macro = true;
  const Node* d = &def;
  pinned.push_back(closure);
  std::weak_ptr<Frame> weak = closure;
  c->fn = [d, weak](Interpreter& in, std::vector<Value>& args, Kwargs& kwargs) -> Value {
    if (in.call_depth >= in.limits.max_call_depth)
      throw_error(TemplateError::Kind::kLimit, "maximum macro recursion depth exceeded");
    auto closure = weak.lock();
    if (!closure) runtime_error("macro '" + d->str + "' called after its template finished rendering");
    auto frame = std::make_shared<Frame>(closure);
    const auto& params = d->kwargs;
    std::vector<bool> bound(params.size(), false);
    List varargs;
    for (size_t i = 0; i < args.size(); ++i) {
      if (i < params.size()) {
        frame->set(params[i].first, args[i]);
        bound[i] = true;
      } else if (d->uses_varargs) {
        varargs.push_back(args[i]);
      } else {
        runtime_error(strfmt("macro '%s' takes not more than %zu argument(s)", d->str.c_str(), params.size()));
      }
    }
    Dict extra;
    Value caller;
    for (auto& [k, v] : kwargs) {
      bool matched = false;
      for (size_t i = 0; i < params.size(); ++i) {
        if (params[i].first == k) {
          if (bound[i]) runtime_error("macro '" + d->str + "' got multiple values for argument '" + k + "'");
          frame->set(k, v);
          bound[i] = true;
          matched = true;
          break;
        }
      }
      if (matched) continue;
      if (k == "caller") {
        caller = v;
      } else if (d->uses_kwargs) {
        extra.set(Value::string(k), v);
      } else {
        runtime_error("macro '" + d->str + "' takes no keyword argument '" + k + "'");
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (bound[i]) continue;
      if (params[i].second) frame->set(params[i].first, in.eval(*params[i].second, frame));
      else frame->set(params[i].first, Value::undefined("parameter '" + params[i].first + "' was not provided"));
    }
    frame->set("varargs", Value::list(std::move(varargs), true));
    frame->set("kwargs", Value::dict(std::move(extra)));
    if (!caller.is_undefined()) frame->set("caller", caller);
    return call_body(in, d->body, frame);
  };
  return Value::callable(std::move(c));
}

Value Interpreter::make_caller(const Node& block, const FramePtr& closure) {
  auto c = std::make_shared<Callable>();
  c->name = "caller";
  c->is_macro = true;
  const Node* d = &block;
  pinned.push_back(closure);
  std::weak_ptr<Frame> weak = closure;
  c->fn = [d, weak](Interpreter& in, std::vector<Value>& args, Kwargs& kwargs) -> Value {
    if (in.call_depth >= in.limits.max_call_depth)
      throw_error(TemplateError::Kind::kLimit, "maximum macro recursion depth exceeded");
    auto closure = weak.lock();
    if (!closure) runtime_error("caller() used after its template finished rendering");
    auto frame = std::make_shared<Frame>(closure);
    const auto& params = d->kwargs;
    for (size_t i = 0; i < params.size(); ++i) {
      if (i < args.size()) frame->set(params[i].first, args[i]);
      else if (params[i].second) frame->set(params[i].first, in.eval(*params[i].second, frame));
      else frame->set(params[i].first, Value::undefined("parameter '" + params[i].first + "' was not provided"));
    }
    for (auto& [k, v] : kwargs) frame->set(k, v);
    return call_body(in, d->body, frame);
  };
  return Value::callable(std::move(c));
}

static void collect_call_args(Interpreter& in, const Node& n, const FramePtr& f, std::vector<Value>& args, Kwargs& kw) {
  for (const auto& a : n.args) args.push_back(in.eval(*a, f));
  for (const auto& [k, e] : n.kwargs) kw.emplace_back(k, in.eval(*e, f));
  if (n.dyn_args) {
    for (auto& v : in.iterate(in.eval(*n.dyn_args, f))) args.push_back(v);
  }
  if (n.dyn_kwargs) {
    Value d = in.eval(*n.dyn_kwargs, f);
    if (!d.is_dict()) runtime_error("argument after ** must be a mapping, not " + py_type_name(d));
    for (const auto& [k, v] : d.as_dict().items) {
      if (!k.is_string()) runtime_error("keywords must be strings");
      kw.emplace_back(k.as_string(), v);
    }
  }
}

Value Interpreter::eval(const Node& n, const FramePtr& f) {
  if (++steps > limits.max_steps) throw_error(TemplateError::Kind::kLimit, "template evaluation step limit exceeded");
  cur_line = n.line;
  switch (n.kind) {
    case NodeKind::kConst:
      return n.value;
    case NodeKind::kName: {
      const Value* v = f->lookup(n.str);
      if (!v) return Value::undefined("'" + n.str + "' is undefined");
      return *v;
    }
    case NodeKind::kGetAttr: {
      Value obj = eval(*n.expr, f);
      cur_line = n.line;
      return get_attr(obj, n.str);
    }
    case NodeKind::kGetItem: {
      Value obj = eval(*n.expr, f);
      Value key = eval(*n.args[0], f);
      cur_line = n.line;
      return get_item(obj, key);
    }
    case NodeKind::kSlice: {
      Value obj = eval(*n.expr, f);
      Value parts[3];
      for (int i = 0; i < 3; ++i) parts[i] = n.args[i] ? eval(*n.args[i], f) : Value::none();
      cur_line = n.line;
      return slice(obj, parts[0], parts[1], parts[2]);
    }
    case NodeKind::kCall: {
      Value callee = eval(*n.expr, f);
      std::vector<Value> args;
      Kwargs kw;
      collect_call_args(*this, n, f, args, kw);
      cur_line = n.line;
      return call(callee, args, kw);
    }
    case NodeKind::kFilter: {
      Value v = n.expr ? eval(*n.expr, f) : Value::undefined();
      std::vector<Value> args;
      Kwargs kw;
      collect_call_args(*this, n, f, args, kw);
      cur_line = n.line;
      return apply_filter(n.str, v, args, kw);
    }
    case NodeKind::kTest: {
      Value v = eval(*n.expr, f);
      std::vector<Value> args;
      Kwargs kw;
      collect_call_args(*this, n, f, args, kw);
      cur_line = n.line;
      bool r = apply_test(n.str, v, args, kw);
      return Value::boolean(n.negated ? !r : r);
    }
    case NodeKind::kNeg:
    case NodeKind::kPos: {
      Value v = eval(*n.args[0], f);
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_number()) runtime_error(std::string("bad operand type for unary ") + (n.kind == NodeKind::kNeg ? "-" : "+") + ": '" + py_type_name(v) + "'");
      if (n.kind == NodeKind::kPos) return v.is_bool() ? Value::integer(v.as_int()) : v;
      if (v.is_float()) return Value::floating(-v.as_double());
      if (v.as_int() == INT64_MIN) runtime_error("integer overflow");
      return Value::integer(-v.as_int());
    }
    case NodeKind::kNot:
      return Value::boolean(!eval(*n.args[0], f).truthy());
    case NodeKind::kAnd: {
      Value l = eval(*n.args[0], f);
      if (!l.truthy()) return l;
      return eval(*n.args[1], f);
    }
    case NodeKind::kOr: {
      Value l = eval(*n.args[0], f);
      if (l.truthy()) return l;
      return eval(*n.args[1], f);
    }
    case NodeKind::kBinary: {
      Value a = eval(*n.args[0], f);
      Value b = eval(*n.args[1], f);
      cur_line = n.line;
      return binary(n.str, a, b);
    }
    case NodeKind::kCompare: {
      Value left = eval(*n.args[0], f);
      for (size_t i = 0; i < n.ops.size(); ++i) {
        Value right = eval(*n.args[i + 1], f);
        cur_line = n.line;
        if (!compare(n.ops[i], left, right)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case NodeKind::kCondExpr: {
      if (eval(*n.test, f).truthy()) return eval(*n.args[0], f);
      if (n.args[1]) return eval(*n.args[1], f);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
    }
    case NodeKind::kList:
    case NodeKind::kTuple: {
      List items;
      for (const auto& a : n.args) items.push_back(eval(*a, f));
      return Value::list(std::move(items), n.kind == NodeKind::kTuple);
    }
    case NodeKind::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < n.args.size(); i += 2) {
        Value k = eval(*n.args[i], f);
        if (!k.hashable()) runtime_error("unhashable type: '" + py_type_name(k) + "'");
        d.set(k, eval(*n.args[i + 1], f));
      }
      return Value::dict(std::move(d));
    }
    case NodeKind::kConcat: {
      // "~" joins str() of each operand; Undefined prints as "" here rather than raising.
      std::string s;
      for (const auto& a : n.args) {
        s += eval(*a, f).str();
        if (s.size() > limits.max_string_bytes) throw_error(TemplateError::Kind::kLimit, "string too long");
      }
      return Value::string(std::move(s));
    }
    default:
      runtime_error("internal: statement used as expression");
  }
}

}  // namespace larder::chat_template
