// OllamaWriter: engine events → Ollama's /api/chat and /api/generate objects, for what the live
// SmolLM2 test (tests/server/ollama_test.py) cannot reach: tool-call markup becomes
// message.tool_calls with the arguments as an object, <think> output becomes `thinking`, an error
// ends a stream with an {"error"} line; every stream line is one JSON object.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "larder/server/api_ollama.h"
#include "writer_test_util.h"

namespace larder::server {
namespace {

using nlohmann::ordered_json;

using writer_fixture::events;
using writer_fixture::Fixture;

std::vector<ordered_json> stream_lines(OllamaWriter& w, const std::vector<Event>& ev) {
  std::string all;
  for (const Event& e : ev) all += w.stream_frames(e);
  std::vector<ordered_json> out;
  std::istringstream in(all);
  for (std::string line; std::getline(in, line);) {
    EXPECT_FALSE(line.empty()) << "a blank line in an NDJSON stream: " << all;
    out.push_back(ordered_json::parse(line));
  }
  EXPECT_TRUE(all.empty() || all.back() == '\n');
  return out;
}

const std::vector<std::string> kCall = {"Let me check.", "<tool_call>{\"name\": \"get_weather\", ",
                                        "\"arguments\": {\"city\": \"Oslo\"}}</tool_call>"};

TEST(OllamaWriter, ChatToolCallNonStream) {
  Fixture f;
  f.pr.tool_style = runtime::ToolCallStyle::kTagged;
  OllamaWriter w(f.sm, f.pr, OllamaKind::kChat);
  for (const Event& e : events(kCall)) w.add(e);
  const ordered_json b = w.body();
  EXPECT_EQ(b["model"], "test-model");
  EXPECT_EQ(b["message"]["role"], "assistant");
  EXPECT_EQ(b["message"]["content"], "Let me check.");
  ASSERT_EQ(b["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(b["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(b["message"]["tool_calls"][0]["function"]["arguments"], ordered_json({{"city", "Oslo"}}));
  EXPECT_EQ(b["done"], true);
  EXPECT_EQ(b["done_reason"], "stop");
  EXPECT_EQ(b["prompt_eval_count"], 6);  // 10 prompt tokens, 4 from the KV store
  EXPECT_EQ(b["eval_count"], 7);
  EXPECT_EQ(b["prompt_eval_duration"], 2'500'000);  // nanoseconds
  EXPECT_EQ(b["eval_duration"], 10'000'000);
}

TEST(OllamaWriter, ChatToolCallStream) {
  Fixture f;
  f.pr.tool_style = runtime::ToolCallStyle::kTagged;
  OllamaWriter w(f.sm, f.pr, OllamaKind::kChat);
  const auto lines = stream_lines(w, events(kCall));
  ASSERT_GE(lines.size(), 3u);
  std::string content;
  int calls = 0;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["done"], false);
    content += lines[i]["message"]["content"].get<std::string>();
    if (lines[i]["message"].contains("tool_calls")) {
      ++calls;
      EXPECT_EQ(lines[i]["message"]["tool_calls"][0]["function"]["arguments"]["city"], "Oslo");
    }
  }
  EXPECT_EQ(content, "Let me check.");  // the markup itself is never released as text
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(lines.back()["done"], true);
  EXPECT_EQ(lines.back()["message"]["content"], "");
  EXPECT_TRUE(lines.back().contains("total_duration"));
}

TEST(OllamaWriter, GenerateThinkingAndLength) {
  Fixture f;
  f.pr.split_reasoning = true;
  OllamaWriter w(f.sm, f.pr, OllamaKind::kGenerate);
  for (const Event& e : events({"<think>Hm", "m.</think>", "Four."}, Finish::kLength)) w.add(e);
  const ordered_json b = w.body();
  EXPECT_EQ(b["response"], "Four.");
  EXPECT_EQ(b["thinking"], "Hmm.");
  EXPECT_EQ(b["done_reason"], "length");
  EXPECT_FALSE(b.contains("message"));
}

TEST(OllamaWriter, ErrorEndsTheStreamWithAnErrorLine) {
  Fixture f;
  OllamaWriter w(f.sm, f.pr, OllamaKind::kGenerate);
  const auto lines = stream_lines(w, events({"partial"}, Finish::kError));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["response"], "partial");
  EXPECT_EQ(lines[1], ordered_json({{"error", "forward failed"}}));
  OllamaWriter w2(f.sm, f.pr, OllamaKind::kGenerate);
  for (const Event& e : events({"partial"}, Finish::kError)) w2.add(e);
  EXPECT_EQ(w2.body(), ordered_json({{"error", "forward failed"}}));
}

TEST(OllamaWriter, HarmonyThinkingContentAndToolCall) {
  Fixture f;
  f.pr.harmony = true;
  OllamaWriter w(f.sm, f.pr, OllamaKind::kChat);
  for (const Event& e : events({"<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary",
                                " to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}"}))
    w.add(e);
  const ordered_json b = w.body();
  EXPECT_EQ(b["message"]["thinking"], "Think.");
  EXPECT_EQ(b["message"]["content"], "");
  ASSERT_EQ(b["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(b["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(b["message"]["tool_calls"][0]["function"]["arguments"], ordered_json({{"city", "Oslo"}}));
}

}  // namespace
}  // namespace larder::server
