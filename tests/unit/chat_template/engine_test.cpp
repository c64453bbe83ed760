// engine_test.cpp — one construct per small template (filters, tests, loop variables, macros,
// namespace, slicing, whitespace control, precedence, ...), each checked against the output
// jinja2 (configured as transformers configures it) produced in tests/ref/chat_template_golden.py.
#include <gtest/gtest.h>

#include <iostream>

#include "larder/tokenizer/chat_template/chat_template.h"
#include "test_util.h"

namespace larder::chat_template {
namespace {

using testing::data_path;
using J = nlohmann::ordered_json;

TEST(ChatTemplateEngine, ConstructsMatchJinja2) {
  std::string text = testing::read_file(data_path("engine.json"));
  ASSERT_FALSE(text.empty()) << "missing " << data_path("engine.json") << " (fixture_chat_template_golden)";
  J data = J::parse(text);
  RenderOptions ro;
  ro.now = testing::parse_fixed_now(data["fixed_now"].get<std::string>());
  int n = 0, passed = 0;
  for (const auto& c : data["cases"]) {
    ++n;
    const std::string name = c["name"].get<std::string>();
    auto t = Template::parse(c["template"].get<std::string>(), name);
    Result<std::string> r = t.is_ok() ? t->render(c["context"], ro) : Result<std::string>(t.status());
    if (c["ok"].get<bool>()) {
      const std::string want = c["output"].get<std::string>();
      if (!r.is_ok()) {
        ADD_FAILURE() << name << ": jinja2 rendered, larder failed: " << r.status().to_string();
        continue;
      }
      if (*r != want) {
        ADD_FAILURE() << name << ": " << testing::describe_diff(want, *r);
        continue;
      }
    } else {
      const std::string err = c["error"].get<std::string>();
      if (r.is_ok()) {
        ADD_FAILURE() << name << ": jinja2 raised " << c["error_type"].get<std::string>() << " (" << err
                      << "), larder rendered '" << *r << "'";
        continue;
      }
      if (c["raised"].get<bool>() && r.status().message().find(err) == std::string::npos) {
        ADD_FAILURE() << name << ": message '" << r.status().message() << "' lacks '" << err << "'";
        continue;
      }
    }
    ++passed;
  }
  std::cout << "chat_template engine: " << passed << "/" << n << " construct cases match jinja2\n";
  EXPECT_EQ(passed, n);
}

}  // namespace
}  // namespace larder::chat_template
