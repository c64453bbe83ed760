// fuzz_test.cpp — mutated real templates (deleted, duplicated and injected fragments) must
// give output or an error Status, never a crash, hang or runaway memory.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <random>

#include "larder/tokenizer/chat_template/chat_template.h"
#include "test_util.h"

namespace larder::chat_template {
namespace {

using J = nlohmann::ordered_json;

std::vector<std::string> real_templates() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(std::string(LARDER_SHARED_DIR) + "/chat-templates")) {
    if (e.path().extension() == ".jinja") out.push_back(testing::read_file(e.path().string()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

J sample_messages() {
  return J::parse(R"([
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "abcDEF123", "type": "function",
      "function": {"name": "f", "arguments": {"a": 1}}}]},
    {"role": "tool", "tool_call_id": "abcDEF123", "content": "ok"},
    {"role": "user", "content": [{"type": "text", "text": "typed"}]}
  ])");
}

TEST(ChatTemplateFuzz, MutatedRealTemplatesNeverCrash) {
  auto templates = real_templates();
  ASSERT_GE(templates.size(), 17u);
  static const char* kFragments[] = {"{%", "%}", "{{", "}}", "{#", "#}", "-", "+", "(", ")", "[", "]", "{", "}",
                                     "'", "\"", "|", ".", ",", ":", "~", "*", "**", " if ", " else ", " for ",
                                     " in ", "endfor", "endif", "endmacro", "loop", "caller()", "namespace(",
                                     "|tojson", "|items", "[::-1]", "raise_exception(", "\\", "\n", "\xff",
                                     "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "range(99999999)", "*999999"};
  std::mt19937 rng(12345);
  ChatRenderOptions o;
  o.tools = J::parse(R"([{"type": "function", "function": {"name": "f", "description": "d",
                        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}])");
  o.bos_token = "<s>";
  o.eos_token = "</s>";
  o.render.max_output_bytes = 1 << 20;
  J msgs = sample_messages();
  int parsed = 0, rendered = 0, runs = 0;
  auto start = std::chrono::steady_clock::now();
  for (const auto& base : templates) {
    for (int iter = 0; iter < 150; ++iter) {
      std::string s = base;
      int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits && !s.empty(); ++e) {
        size_t pos = rng() % s.size();
        switch (rng() % 3) {
          case 0: s.erase(pos, 1 + rng() % 12); break;
          case 1: s.insert(pos, s.substr(rng() % s.size(), 1 + rng() % 40)); break;
          default: s.insert(pos, kFragments[rng() % (sizeof kFragments / sizeof *kFragments)]); break;
        }
      }
      ++runs;
      auto t = Template::parse(s, "fuzz");
      if (!t.is_ok()) {
        EXPECT_FALSE(t.status().message().empty());
        continue;
      }
      ++parsed;
      o.add_generation_prompt = iter % 2 == 0;
      auto r = render_chat(*t, msgs, o);
      if (r.is_ok()) ++rendered;
      else EXPECT_FALSE(r.status().message().empty());
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "chat_template fuzz: " << runs << " mutated templates, " << parsed << " parsed, " << rendered
            << " rendered, " << secs << " s\n";
  EXPECT_GT(parsed, 0);
}

}  // namespace
}  // namespace larder::chat_template
