// ToolCallParser: tool-call markup is taken out of streamed text at any piece boundary, content
// around it is kept, and markup that does not parse stays plain text.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "larder/runtime/tool_calls.h"

namespace larder::runtime {
namespace {

struct Result {
  std::string content;
  std::vector<ToolCall> calls;
};

Result run(ToolCallStyle style, const std::vector<std::string>& pieces) {
  ToolCallParser p(style);
  Result r;
  for (const auto& s : pieces) {
    r.content += p.push(s);
    for (auto& c : p.take_calls()) r.calls.push_back(c);
  }
  r.content += p.flush();
  for (auto& c : p.take_calls()) r.calls.push_back(c);
  return r;
}

const std::string kTagged =
    "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"
    "<tool_call>{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}</tool_call> done";

TEST(ToolCalls, TaggedCallsAreExtracted) {
  auto r = run(ToolCallStyle::kTagged, {kTagged});
  EXPECT_EQ(r.content, "Let me check. done");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments["city"], "Oslo");
  EXPECT_EQ(r.calls[1].name, "get_time");
  EXPECT_EQ(r.calls[1].arguments["tz"], "CET");  // double-encoded arguments are decoded
}

TEST(ToolCalls, TaggedEveryCutPoint) {
  const auto whole = run(ToolCallStyle::kTagged, {kTagged});
  for (size_t i = 0; i <= kTagged.size(); ++i) {
    auto r = run(ToolCallStyle::kTagged, {kTagged.substr(0, i), kTagged.substr(i)});
    EXPECT_EQ(r.content, whole.content) << i;
    ASSERT_EQ(r.calls.size(), 2u) << i;
    EXPECT_EQ(r.calls[0].arguments, whole.calls[0].arguments) << i;
  }
}

TEST(ToolCalls, UnparsableMarkupStaysText) {
  auto r = run(ToolCallStyle::kTagged, {"a <tool_call>not json</tool_call> b <tool_"});
  EXPECT_EQ(r.content, "a <tool_call>not json</tool_call> b <tool_");
  EXPECT_TRUE(r.calls.empty());
}

TEST(ToolCalls, UnterminatedCallAtEosStillCounts) {
  auto r = run(ToolCallStyle::kTagged, {"<tool_call>{\"name\": \"f\", \"arguments\": {}}"});
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "f");
  auto bad = run(ToolCallStyle::kTagged, {"<tool_call>{\"name\": "});
  EXPECT_EQ(bad.content, "<tool_call>{\"name\": ");
  EXPECT_TRUE(bad.calls.empty());
}

TEST(ToolCalls, BareJsonStyle) {
  auto r = run(ToolCallStyle::kBareJson, {" {\"name\": \"f\", \"param", "eters\": {\"a\": 1}}"});
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments["a"], 1);
  auto tagged = run(ToolCallStyle::kBareJson, {"<|python", "_tag|>{\"name\": \"g\", \"arguments\": {}}"});
  ASSERT_EQ(tagged.calls.size(), 1u);
  EXPECT_EQ(tagged.calls[0].name, "g");
  auto text = run(ToolCallStyle::kBareJson, {"Hello ", "{there}"});
  EXPECT_EQ(text.content, "Hello {there}");
  EXPECT_TRUE(text.calls.empty());
  auto broken = run(ToolCallStyle::kBareJson, {"{not json"});
  EXPECT_EQ(broken.content, "{not json");
  EXPECT_TRUE(broken.calls.empty());
}

TEST(ToolCalls, NoneStyleIsPassThrough) {
  auto r = run(ToolCallStyle::kNone, {kTagged});
  EXPECT_EQ(r.content, kTagged);
  EXPECT_TRUE(r.calls.empty());
}

}  // namespace
}  // namespace larder::runtime
