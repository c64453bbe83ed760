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

Result run(ToolCallStyle style, const std::vector<std::string>& pieces, nlohmann::ordered_json tools = nullptr) {
  ToolCallParser p(style, std::move(tools));
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

// Qwen3-Coder / Qwen3.5 markup (issue 40 item 3): <function=NAME> with one <parameter=ARG> block
// per argument, values raw. A string-typed parameter stays text ("10001" is not 10001), others are
// JSON when they parse; the markup's own newlines are not part of a value.
const std::string kXml =
    "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
    "<parameter=zip>\n10001\n</parameter>\n<parameter=days>\n 3 \n</parameter>\n<parameter=opts>\n"
    "{\"unit\": \"c\", \"hourly\": true}\n</parameter>\n<parameter=note>\n line one\nline two \n</parameter>\n<parameter=unit>\ncelsius \n</parameter>\n<parameter=level>\n 2\n</parameter>\n"
    "<parameter=code>\n007\n</parameter>\n"
    "</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>";

nlohmann::ordered_json xml_tools() {
  return nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters":
      {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"},
       "days": {"type": "integer"}, "opts": {"type": "object"}, "note": {"type": "string"},
       "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "level": {"enum": [1, 2, 3]},
       "code": {"enum": ["007", "1"]}}}}}])");
}

TEST(ToolCalls, XmlCallsAreExtracted) {
  auto r = run(ToolCallStyle::kTaggedXml, {kXml}, xml_tools());
  EXPECT_EQ(r.content, "Checking.\n\n");  // text around and between calls stays content
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments["city"], "New York");
  EXPECT_EQ(r.calls[0].arguments["zip"], "10001");
  EXPECT_EQ(r.calls[0].arguments["days"], 3);
  EXPECT_EQ(r.calls[0].arguments["opts"], nlohmann::ordered_json::parse(R"({"unit": "c", "hourly": true})"));
  EXPECT_EQ(r.calls[0].arguments["note"], " line one\nline two ");  // a string keeps its blanks
  EXPECT_EQ(r.calls[0].arguments["unit"], "celsius");                // an enum word is trimmed
  EXPECT_EQ(r.calls[0].arguments["level"], 2);                       // a listed number is a number
  EXPECT_EQ(r.calls[0].arguments["code"], "007");
  EXPECT_EQ(r.calls[1].name, "now");
  EXPECT_EQ(r.calls[1].arguments, nlohmann::ordered_json::object());
  for (size_t i = 0; i <= kXml.size(); ++i) {
    auto c = run(ToolCallStyle::kTaggedXml, {kXml.substr(0, i), kXml.substr(i)}, xml_tools());
    EXPECT_EQ(c.content, r.content) << i;
    ASSERT_EQ(c.calls.size(), 2u) << i;
    EXPECT_EQ(c.calls[0].arguments, r.calls[0].arguments) << i;
  }
  // Without the tools' schema a value is JSON wherever it parses.
  auto untyped = run(ToolCallStyle::kTaggedXml, {kXml});
  ASSERT_EQ(untyped.calls.size(), 2u);
  EXPECT_EQ(untyped.calls[0].arguments["zip"], 10001);
  // JSON bodies still parse under the XML style, and XML bodies under the JSON one.
  EXPECT_EQ(run(ToolCallStyle::kTaggedXml, {kTagged}).calls.size(), 2u);
  EXPECT_EQ(run(ToolCallStyle::kTagged, {kXml}).calls.size(), 2u);
}

TEST(ToolCalls, MalformedXmlStaysText) {
  for (const std::string bad : {"<tool_call><function=>x</function></tool_call>",
                                "<tool_call><function=f><parameter=a>1</function></tool_call>",
                                "<tool_call><function=f>stray text</function></tool_call>"}) {
    auto r = run(ToolCallStyle::kTaggedXml, {bad});
    EXPECT_EQ(r.content, bad);
    EXPECT_TRUE(r.calls.empty()) << bad;
  }
  // Generation ended before </function>: the parameters seen are the call.
  auto eos = run(ToolCallStyle::kTaggedXml, {"<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n"});
  ASSERT_EQ(eos.calls.size(), 1u);
  EXPECT_EQ(eos.calls[0].arguments["a"], 1);
}

}  // namespace
}  // namespace larder::runtime
