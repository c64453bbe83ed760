// chat_template.h — renders a model's own Jinja chat template, byte-identical to Python jinja2
// configured the way Hugging Face transformers configures it (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loopcontrols, HF's tojson/raise_exception/strftime_now globals).
//
//   LARDER_ASSIGN_OR_RETURN(auto t, chat_template::Template::parse(src, "qwen2.5"));
//   ChatRenderOptions o; o.add_generation_prompt = true;
//   LARDER_ASSIGN_OR_RETURN(std::string prompt, chat_template::render_chat(t, messages, o));
//
// Supported: if/elif/else, for (loop.*, else, filters "for x in l if c", unpacking, break/
// continue), set (incl. ns.attr and {% set %}...{% endset %}), macro/call/caller, filter blocks,
// with, raw, HF's {% generation %}; all jinja2 operators, tests and string/dict/list methods
// templates use; jinja2's builtin filters except those listed below; namespace(), dict(),
// range(), raise_exception(), strftime_now().
// Not supported (clear kUnsupported error naming the line): include/extends/import/from/block,
// recursive loops, multi-dimensional slices, filters pprint/groupby/striptags/urlize/urlencode/
// wordwrap/xmlattr/filesizeformat/random, str.format() format specs. Known approximations:
// ints are 64-bit (overflow is an error), generators are re-iterable, Unicode case mapping is
// simple except for "ß".upper(), repr() of generators/macros uses a fixed address.
//
// Errors: syntax errors and unsupported constructs fail parse() naming line:col; at render time
// raise_exception(msg) and runtime errors (undefined attribute access, type errors) return
// invalid_argument "[chat_template] NAME:LINE: msg"; resource limits return resource_exhausted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "larder/core/status.h"

namespace larder::chat_template {

struct Node;

struct RenderOptions {
  // Clock for strftime_now(). Unset: the LARDER_CHAT_TEMPLATE_NOW environment variable
  // ("YYYY-MM-DD HH:MM:SS") if set, else the local time, as datetime.now() gives.
  std::optional<std::tm> now;
  size_t max_output_bytes = 64u << 20;
  int max_call_depth = 200;  // macro recursion
  uint64_t max_steps = 20'000'000;  // evaluation budget (statements, expressions, loop turns, bytes/64)
};

class Template {
 public:
  // Syntax errors name line:col; constructs outside the supported subset are kUnsupported.
  static Result<Template> parse(std::string_view source, std::string name = "chat_template");
  // context: the template's variables (an object). Values are JSON, so None is null.
  Result<std::string> render(const nlohmann::ordered_json& context) const;
  Result<std::string> render(const nlohmann::ordered_json& context, const RenderOptions& opts) const;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::shared_ptr<const void> program_;  // parsed body (std::vector<NodePtr>)
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  nlohmann::ordered_json tools;  // null = absent (the template sees tools = None, as in HF)
  std::string bos_token, eos_token;  // empty = the tokenizer has none (the variable is undefined)
  nlohmann::ordered_json extra;  // extra template kwargs, e.g. {"enable_thinking": false}; "documents" too
  RenderOptions render;
};

// HF apply_chat_template(messages, tools=..., add_generation_prompt=..., tokenize=False, **extra):
// keys whose value is null are dropped from each message, reasoning fields are aliased
// (reasoning_content/thinking/reasoning, as transformers does), then the template is rendered
// with messages, tools, documents, add_generation_prompt, bos_token, eos_token and extra.
Result<std::string> render_chat(const Template& t, const nlohmann::ordered_json& messages, const ChatRenderOptions& opts);

}  // namespace larder::chat_template
