// fuzz_chat_template — the Jinja engine (tokenizer/chat_template: lexer, parser, interpreter,
// filters, methods) on template text from the input, rendered the way the server renders a chat
// (render_chat) over a fixed conversation with tool calls and tools. The seed corpus is the real
// templates of ../../shared/chat-templates. Resource limits are the engine's own (RenderOptions),
// lowered so that one input stays fast; hitting them is an error Status, not a finding.
#include "fuzz_util.h"
#include "larder/tokenizer/chat_template/chat_template.h"

using namespace larder;
using J = nlohmann::ordered_json;

namespace {

const J& messages() {
  static const J m = J::parse(R"([
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "What is the weather in Oslo?"},
    {"role": "assistant", "content": null, "reasoning_content": "Look it up.", "tool_calls": [{"id": "call_1",
      "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny, 21 C"},
    {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]}
  ])");
  return m;
}

const J& tools() {
  static const J t = J::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Current weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool init = (fuzz::quiet(), true);
  (void)init;
  const std::string_view src(reinterpret_cast<const char*>(data), size);
  auto t = chat_template::Template::parse(src, "fuzz");
  if (!t.is_ok()) return 0;
  chat_template::ChatRenderOptions o;
  o.add_generation_prompt = (size & 1) == 0;
  if (size & 2) o.tools = tools();
  o.bos_token = "<s>";
  o.eos_token = "</s>";
  o.extra = J{{"enable_thinking", (size & 4) != 0}};
  std::tm now{};
  now.tm_year = 126;
  now.tm_mday = 7;
  o.render.now = now;
  o.render.max_output_bytes = 1u << 20;
  o.render.max_steps = 200'000;
  o.render.max_call_depth = 64;
  auto out = chat_template::render_chat(*t, messages(), o);
  volatile size_t sink = out.is_ok() ? out->size() : 0;
  (void)sink;
  return 0;
}
