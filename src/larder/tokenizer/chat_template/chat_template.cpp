// chat_template.cpp — public API: parse/validate, render, and HF apply_chat_template's inputs.
#include "larder/tokenizer/chat_template/chat_template.h"

#include <cstdlib>
#include <cstring>

#include "larder/tokenizer/chat_template/ast.h"
#include "larder/tokenizer/chat_template/filters.h"
#include "larder/tokenizer/chat_template/interpreter.h"

namespace larder::chat_template {
namespace {

Status to_status(const TemplateError& e, const std::string& name, int fallback_line) {
  int line = e.line ? e.line : fallback_line;
  std::string where = name;
  // Syntax messages from the lexer/parser already start with "line:col: ".
  bool has_pos = e.kind == TemplateError::Kind::kSyntax || (e.kind == TemplateError::Kind::kUnsupported && e.line);
  std::string msg = has_pos ? strfmt("[chat_template] %s:%s", where.c_str(), e.message.c_str())
                            : strfmt("[chat_template] %s:%d: %s", where.c_str(), line, e.message.c_str());
  switch (e.kind) {
    case TemplateError::Kind::kUnsupported: return unsupported(msg);
    case TemplateError::Kind::kLimit: return Status(StatusCode::kResourceExhausted, msg);
    default: return invalid_argument(msg);
  }
}

// jinja2 looks filters and tests up when compiling, so an unknown name fails the whole
// template even inside a branch that never runs; reproduce that at parse time.
void validate(const Body& body);
void validate_node(const NodePtr& n) {
  if (!n) return;
  if (n->kind == NodeKind::kFilter) {
    if (!known_filters().count(n->str))
      throw_error(TemplateError::Kind::kSyntax, strfmt("%d: no filter named '%s'", n->line, n->str.c_str()), n->line);
    if (unsupported_filters().count(n->str))
      throw_error(TemplateError::Kind::kUnsupported,
                  strfmt("%d: filter '%s' is not supported by larder's chat-template engine", n->line, n->str.c_str()), n->line);
  }
  if (n->kind == NodeKind::kTest && !known_tests().count(n->str))
    throw_error(TemplateError::Kind::kSyntax, strfmt("%d: no test named '%s'", n->line, n->str.c_str()), n->line);
  for (const auto& a : n->args) validate_node(a);
  for (const auto& kv : n->kwargs) validate_node(kv.second);
  validate_node(n->dyn_args);
  validate_node(n->dyn_kwargs);
  validate_node(n->expr);
  validate_node(n->test);
  validate_node(n->target);
  validate(n->body);
  validate(n->else_body);
  for (const auto& br : n->branches) {
    validate_node(br.first);
    validate(br.second);
  }
}
void validate(const Body& body) {
  for (const auto& n : body) validate_node(n);
}

std::optional<std::tm> env_clock() {
  const char* s = std::getenv("LARDER_CHAT_TEMPLATE_NOW");
  if (!s || !*s) return std::nullopt;
  std::tm tm{};
  if (!strptime(s, "%Y-%m-%d %H:%M:%S", &tm)) return std::nullopt;
  tm.tm_isdst = -1;
  std::time_t t = timegm(&tm);  // normalizes and fills tm_wday / tm_yday
  gmtime_r(&t, &tm);
  return tm;
}

}  // namespace

Result<Template> Template::parse(std::string_view source, std::string name) {
  Template t;
  t.name_ = std::move(name);
  try {
    auto body = std::make_shared<Body>(parse_template(source, t.name_));
    validate(*body);
    t.program_ = body;
  } catch (const TemplateError& e) {
    return to_status(e, t.name_, 0);
  } catch (const std::exception& e) {  // e.g. bad_alloc: never let one escape the library
    return internal_error("[chat_template] " + t.name_ + ": " + e.what());
  }
  return t;
}

Result<std::string> Template::render(const nlohmann::ordered_json& context) const {
  return render(context, RenderOptions{});
}

Result<std::string> Template::render(const nlohmann::ordered_json& context, const RenderOptions& opts) const {
  if (!program_) return invalid_argument("[chat_template] " + name_ + ": template was not parsed");
  if (!context.is_object() && !context.is_null())
    return invalid_argument("[chat_template] " + name_ + ": render context must be a JSON object");
  auto body = std::static_pointer_cast<const Body>(program_);
  Interpreter in;
  in.name = name_;
  in.limits.max_output_bytes = opts.max_output_bytes;
  in.limits.max_call_depth = opts.max_call_depth;
  in.limits.max_steps = opts.max_steps;
  in.now = opts.now ? opts.now : env_clock();
  in.program = body;
  auto globals = std::make_shared<Frame>();
  Interpreter::install_globals(*globals);
  auto root = std::make_shared<Frame>(globals);
  if (context.is_object()) {
    for (auto it = context.begin(); it != context.end(); ++it) root->set(it.key(), Value::from_json(it.value()));
  }
  Result<std::string> result = invalid_argument("unset");
  try {
    result = in.render(*body, root);
  } catch (const TemplateError& e) {
    result = to_status(e, name_, in.cur_line);
  } catch (const std::exception& e) {
    result = internal_error(strfmt("[chat_template] %s:%d: %s", name_.c_str(), in.cur_line, e.what()));
  }
  // Macros close over frames that hold them; break those cycles so nothing leaks.
  for (auto& f : in.pinned) f->vars.clear();
  root->vars.clear();
  return result;
}

Result<std::string> render_chat(const Template& t, const nlohmann::ordered_json& messages, const ChatRenderOptions& opts) {
  using J = nlohmann::ordered_json;
  if (!messages.is_array()) return invalid_argument("[chat_template] messages must be an array");
  if (messages.empty())
    return invalid_argument("[chat_template] Cannot apply chat template to an empty conversation. Provide at least one message.");
  J msgs = J::array();
  static const char* kReasoning[] = {"reasoning_content", "thinking", "reasoning"};
  for (const auto& m : messages) {
    if (!m.is_object()) return invalid_argument("[chat_template] Chat messages should be dicts, got " + m.dump());
    // transformers drops keys whose value is None (OpenAI's content=None, tool_calls=None).
    // (Appended, not assigned: m's keys are distinct, and assigning scans the keys each time,
    // quadratic in a message of many keys.)
    J clean = J::object();
    for (auto it = m.begin(); it != m.end(); ++it)
      if (!it.value().is_null()) clean.get_ref<J::object_t&>().emplace_back(it.key(), it.value());
    // ... and copies a message's reasoning under "thinking" (first) and "reasoning_content".
    const J* reasoning = nullptr;
    for (const char* k : kReasoning) {
      if (clean.contains(k) && !clean[k].is_null()) {
        reasoning = &clean[k];
        break;
      }
    }
    if (reasoning) {
      // "thinking" first, the other keys in order, "reasoning_content" in its place or last.
      J r = *reasoning;
      J aliased = J::object();
      auto& a = aliased.get_ref<J::object_t&>();
      a.emplace_back("thinking", clean.contains("thinking") ? clean["thinking"] : r);
      bool has_rc = false;
      for (auto it = clean.begin(); it != clean.end(); ++it) {
        if (it.key() == "thinking") continue;
        has_rc = has_rc || it.key() == "reasoning_content";
        a.emplace_back(it.key(), it.key() == "reasoning_content" ? r : it.value());
      }
      if (!has_rc) a.emplace_back("reasoning_content", r);
      clean = std::move(aliased);
    }
    msgs.push_back(std::move(clean));
  }
  J ctx = J::object();
  ctx["messages"] = std::move(msgs);
  ctx["tools"] = opts.tools.is_null() ? J() : opts.tools;
  ctx["documents"] = J();
  ctx["add_generation_prompt"] = opts.add_generation_prompt;
  if (!opts.bos_token.empty()) ctx["bos_token"] = opts.bos_token;
  if (!opts.eos_token.empty()) ctx["eos_token"] = opts.eos_token;
  if (opts.extra.is_object()) {
    for (auto it = opts.extra.begin(); it != opts.extra.end(); ++it) {
      const std::string& k = it.key();
      if (k == "messages" || k == "tools" || k == "add_generation_prompt")
        return invalid_argument("[chat_template] extra template kwarg '" + k + "' conflicts with a named argument");
      ctx[k] = it.value();
    }
  } else if (!opts.extra.is_null()) {
    return invalid_argument("[chat_template] extra template kwargs must be a JSON object");
  }
  return t.render(ctx, opts.render);
}

}  // namespace larder::chat_template
