// golden_test.cpp — every real chat template x many chat contexts, byte for byte against
// transformers' renderer (tests/ref/chat_template_golden.py writes golden.json).
#include <gtest/gtest.h>

#include <iostream>
#include <map>

#include "larder/tokenizer/chat_template/chat_template.h"
#include "test_util.h"

namespace larder::chat_template {
namespace {

using testing::data_path;
using testing::describe_diff;
using J = nlohmann::ordered_json;

TEST(ChatTemplateGolden, RealTemplatesByteIdenticalToTransformers) {
  std::string text = testing::read_file(data_path("golden.json"));
  ASSERT_FALSE(text.empty()) << "missing " << data_path("golden.json") << " (fixture_chat_template_golden)";
  J golden = J::parse(text);
  std::tm now = testing::parse_fixed_now(golden["fixed_now"].get<std::string>());

  std::map<std::string, Template> parsed;
  for (auto it = golden["templates"].begin(); it != golden["templates"].end(); ++it) {
    auto t = Template::parse(it.value().get<std::string>(), it.key());
    ASSERT_TRUE(t.is_ok()) << it.key() << ": " << t.status().to_string();
    parsed.emplace(it.key(), std::move(t).value());
  }
  ASSERT_GE(parsed.size(), 21u);

  struct Tally { int total = 0, identical = 0, errors_matched = 0; };
  std::map<std::string, Tally> per_template;
  int failures = 0;
  for (const auto& c : golden["cases"]) {
    const std::string tname = c["template"].get<std::string>();
    const std::string label = tname + " / " + c["scenario"].get<std::string>() +
                              (c["add_generation_prompt"].get<bool>() ? " / agp" : " / no-agp");
    ChatRenderOptions o;
    o.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    o.tools = c["tools"];
    o.bos_token = c["bos_token"].get<std::string>();
    o.eos_token = c["eos_token"].get<std::string>();
    o.extra = c["extra"];
    o.render.now = now;
    auto r = render_chat(parsed.at(tname), c["messages"], o);
    Tally& tally = per_template[tname];
    ++tally.total;
    bool ok = false;
    std::string why;
    if (c["ok"].get<bool>()) {
      const std::string want = c["output"].get<std::string>();
      if (!r.is_ok()) why = "jinja2 rendered, larder failed: " + r.status().to_string();
      else if (*r != want) why = describe_diff(want, *r);
      else { ok = true; ++tally.identical; }
    } else {
      const std::string err = c["error"].get<std::string>();
      if (r.is_ok()) {
        why = "jinja2 raised " + c["error_type"].get<std::string>() + " (" + err + "), larder rendered";
      } else if (c["raised"].get<bool>() && r.status().message().find(err) == std::string::npos) {
        why = "raise_exception message differs: jinja2 '" + err + "', larder '" + r.status().message() + "'";
      } else {
        ok = true;
        ++tally.errors_matched;
      }
    }
    if (!ok) {
      ++failures;
      ADD_FAILURE() << label << ": " << why;
    }
  }
  int total = 0, identical = 0, errs = 0;
  for (const auto& [name, t] : per_template) {
    std::cout << "  " << name << ": " << t.identical << " byte-identical + " << t.errors_matched
              << " matching errors / " << t.total << "\n";
    total += t.total;
    identical += t.identical;
    errs += t.errors_matched;
  }
  std::cout << "chat_template golden: " << parsed.size() << " templates, " << total << " cases: " << identical
            << " byte-identical renders, " << errs << " matching errors, " << failures << " failures\n";
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace larder::chat_template
