// ResponseWriter: engine events → OpenAI / Anthropic bodies and SSE frames, for the parts the
// black-box tests cannot reach with a random-weight model: tool-call markup becomes tool_calls /
// tool_use (streamed and not), <think> output becomes reasoning_content / a thinking block.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "larder/server/response_writer.h"
#include "writer_test_util.h"

namespace larder::server {
namespace {

using nlohmann::ordered_json;

using writer_fixture::events;
using writer_fixture::Fixture;

// Parses "event: x\ndata: {...}\n\n" / "data: {...}\n\n" frames.
std::vector<std::pair<std::string, ordered_json>> frames(const std::string& sse) {
  std::vector<std::pair<std::string, ordered_json>> out;
  size_t at = 0;
  while (at < sse.size()) {
    const size_t end = sse.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "unterminated frame";
    if (end == std::string::npos) break;
    std::string block = sse.substr(at, end - at);
    at = end + 2;
    std::string event;
    if (block.rfind("event: ", 0) == 0) {
      const size_t nl = block.find('\n');
      event = block.substr(7, nl - 7);
      block = block.substr(nl + 1);
    }
    EXPECT_EQ(block.rfind("data: ", 0), 0u) << block;
    const std::string data = block.substr(6);
    out.emplace_back(event, data == "[DONE]" ? ordered_json("[DONE]") : ordered_json::parse(data));
  }
  return out;
}

const std::vector<std::string> kToolPieces = {"Sure.", "<tool_", "call>{\"name\": \"get_weather\", ",
                                              "\"arguments\": {\"city\": \"Oslo\"}}</tool_call>"};

TEST(ResponseWriter, ChatToolCallNonStream) {
  Fixture f;
  f.pr.tool_style = runtime::ToolCallStyle::kTagged;
  auto w = make_response_writer(f.sm, f.pr, Surface::kChat);
  for (const Event& e : events(kToolPieces)) w->add(e);
  const ordered_json b = w->body();
  const ordered_json& msg = b["choices"][0]["message"];
  EXPECT_EQ(msg["content"], "Sure.");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(ordered_json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>())["city"], "Oslo");
  EXPECT_EQ(msg["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(b["choices"][0]["finish_reason"], "tool_calls");
}

TEST(ResponseWriter, ChatToolCallStream) {
  Fixture f;
  f.pr.tool_style = runtime::ToolCallStyle::kTagged;
  f.pr.stream = true;
  auto w = make_response_writer(f.sm, f.pr, Surface::kChat);
  std::string sse;
  for (const Event& e : events(kToolPieces)) sse += w->stream_frames(e);
  auto fr = frames(sse);
  std::string content, name, args;
  int finishes = 0;
  for (const auto& [ev, j] : fr) {
    EXPECT_EQ(ev, "") << "no named events on OpenAI routes";
    if (j == "[DONE]") continue;
    const ordered_json& ch = j["choices"][0];
    const ordered_json& d = ch["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    EXPECT_EQ(content.find('<'), std::string::npos) << "markup leaked into content";
    if (d.contains("tool_calls")) {
      EXPECT_EQ(d["tool_calls"][0]["index"], 0);
      if (d["tool_calls"][0].contains("id")) name += d["tool_calls"][0]["function"]["name"].get<std::string>();
      args += d["tool_calls"][0]["function"]["arguments"].get<std::string>();
    }
    if (!ch["finish_reason"].is_null()) {
      ++finishes;
      EXPECT_EQ(ch["finish_reason"], "tool_calls");
    }
  }
  EXPECT_EQ(fr.back().second, "[DONE]");
  EXPECT_EQ(content, "Sure.");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(ordered_json::parse(args)["city"], "Oslo");
  EXPECT_EQ(finishes, 1);
}

TEST(ResponseWriter, AnthropicToolUseStreamAndBody) {
  Fixture f;
  f.pr.tool_style = runtime::ToolCallStyle::kTagged;
  f.pr.response_id = "msg_test";
  auto w = make_response_writer(f.sm, f.pr, Surface::kMessages);
  auto nw = make_response_writer(f.sm, f.pr, Surface::kMessages);
  std::string sse;
  for (const Event& e : events(kToolPieces)) {
    sse += w->stream_frames(e);
    nw->add(e);
  }
  std::vector<std::string> order;
  for (const auto& [ev, j] : frames(sse)) {
    EXPECT_EQ(ev, j["type"].get<std::string>()) << "event name equals data.type";
    order.push_back(ev);
    if (ev == "content_block_start" && j["content_block"]["type"] == "tool_use") {
      EXPECT_EQ(j["content_block"]["name"], "get_weather");
      EXPECT_EQ(j["index"], 1);
    }
    if (ev == "content_block_delta" && j["delta"]["type"] == "input_json_delta") {
      EXPECT_EQ(ordered_json::parse(j["delta"]["partial_json"].get<std::string>())["city"], "Oslo");
    }
    if (ev == "message_delta") {
      EXPECT_EQ(j["delta"]["stop_reason"], "tool_use");
    }
  }
  const std::vector<std::string> want = {"message_start",       "content_block_start", "content_block_delta",
                                         "content_block_stop",  "content_block_start", "content_block_delta",
                                         "content_block_stop",  "message_delta",       "message_stop"};
  EXPECT_EQ(order, want);
  const ordered_json b = nw->body();
  ASSERT_EQ(b["content"].size(), 2u);
  EXPECT_EQ(b["content"][0]["text"], "Sure.");
  EXPECT_EQ(b["content"][1]["type"], "tool_use");
  EXPECT_EQ(b["content"][1]["input"]["city"], "Oslo");
  EXPECT_EQ(b["content"][1]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(b["stop_reason"], "tool_use");
}

TEST(ResponseWriter, NoToolsOfferedMeansPlainText) {
  Fixture f;  // tool_style kNone
  auto w = make_response_writer(f.sm, f.pr, Surface::kChat);
  for (const Event& e : events(kToolPieces)) w->add(e);
  const ordered_json b = w->body();
  EXPECT_FALSE(b["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(b["choices"][0]["message"]["content"],
            "Sure.<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>");
  EXPECT_EQ(b["choices"][0]["finish_reason"], "stop");
}

TEST(ResponseWriter, ReasoningSplitChatAndAnthropic) {
  Fixture f;
  f.pr.split_reasoning = true;
  const std::vector<std::string> pieces = {"<thi", "nk>\nweighing it</th", "ink>\n\nThe answer."};
  auto chat = make_response_writer(f.sm, f.pr, Surface::kChat);
  for (const Event& e : events(pieces)) chat->add(e);
  const ordered_json cb = chat->body();
  EXPECT_EQ(cb["choices"][0]["message"]["reasoning_content"], "\nweighing it");
  EXPECT_EQ(cb["choices"][0]["message"]["content"], "The answer.");

  auto stream = make_response_writer(f.sm, f.pr, Surface::kChat);
  std::string sse, reasoning, content;
  for (const Event& e : events(pieces)) sse += stream->stream_frames(e);
  for (const auto& [ev, j] : frames(sse)) {
    if (j == "[DONE]") continue;
    const ordered_json& d = j["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "\nweighing it");
  EXPECT_EQ(content, "The answer.");

  auto hidden = make_response_writer(f.sm, f.pr, Surface::kMessages);  // thinking not requested: omitted
  for (const Event& e : events(pieces)) hidden->add(e);
  const ordered_json hb = hidden->body();
  ASSERT_EQ(hb["content"].size(), 1u);
  EXPECT_EQ(hb["content"][0]["text"], "The answer.");
  f.pr.thinking_requested = true;
  auto shown = make_response_writer(f.sm, f.pr, Surface::kMessages);
  for (const Event& e : events(pieces)) shown->add(e);
  const ordered_json sb = shown->body();
  ASSERT_EQ(sb["content"].size(), 2u);
  EXPECT_EQ(sb["content"][0]["type"], "thinking");
  EXPECT_EQ(sb["content"][0]["thinking"], "\nweighing it");
}

// gpt-oss (harmony): the analysis channel is the reasoning, final the content, a commentary message
// to=functions.NAME a tool call, on every surface through the one pipeline; markers cut across
// pieces never reach a delta.
const std::vector<std::string> kHarmonyPieces = {
    "<|chan", "nel|>analysis<|mess", "age|>Weather needs a tool.<|e", "nd|><|start|>assist",
    "ant<|channel|>commentary to=functions.get_weather <|const", "rain|>json<|message|>{\"city\": ",
    "\"Oslo\"}"};
const std::vector<std::string> kHarmonyAnswer = {"<|channel|>analysis<|message|>Two plus three.<|end|><|st",
                                                 "art|>assistant<|channel|>fi", "nal<|message|>It is 5", "."};

TEST(ResponseWriter, HarmonyChatStreamAndBody) {
  Fixture f;
  f.pr.harmony = true;
  auto w = make_response_writer(f.sm, f.pr, Surface::kChat);
  for (const Event& e : events(kHarmonyPieces)) w->add(e);
  const ordered_json b = w->body();
  const ordered_json& msg = b["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], "Weather needs a tool.");
  EXPECT_TRUE(msg["content"].is_null() || msg["content"] == "") << msg.dump();
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(ordered_json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            (ordered_json{{"city", "Oslo"}}));
  EXPECT_EQ(b["choices"][0]["finish_reason"], "tool_calls");

  f.pr.stream = true;
  for (const auto* pieces : {&kHarmonyPieces, &kHarmonyAnswer}) {
    auto s = make_response_writer(f.sm, f.pr, Surface::kChat);
    std::string sse, reasoning, content, name;
    for (const Event& e : events(*pieces)) sse += s->stream_frames(e);
    for (const auto& [ev, j] : frames(sse)) {
      if (j == "[DONE]") continue;
      const ordered_json& d = j["choices"][0]["delta"];
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
      if (d.contains("tool_calls") && d["tool_calls"][0].contains("id"))
        name += d["tool_calls"][0]["function"]["name"].get<std::string>();
      for (const std::string& t : {reasoning, content}) EXPECT_EQ(t.find("<|"), std::string::npos) << t;
    }
    if (pieces == &kHarmonyPieces) {
      EXPECT_EQ(reasoning, "Weather needs a tool.");
      EXPECT_EQ(content, "");
      EXPECT_EQ(name, "get_weather");
    } else {
      EXPECT_EQ(reasoning, "Two plus three.");
      EXPECT_EQ(content, "It is 5.");
      EXPECT_EQ(name, "");
    }
  }
}

TEST(ResponseWriter, HarmonyAnthropicThinkingAndToolUse) {
  Fixture f;
  f.pr.harmony = true;
  f.pr.response_id = "msg_test";
  f.pr.thinking_requested = true;
  auto w = make_response_writer(f.sm, f.pr, Surface::kMessages);
  for (const Event& e : events(kHarmonyPieces)) w->add(e);
  const ordered_json b = w->body();
  ASSERT_EQ(b["content"].size(), 2u) << b.dump();
  EXPECT_EQ(b["content"][0]["type"], "thinking");
  EXPECT_EQ(b["content"][0]["thinking"], "Weather needs a tool.");
  EXPECT_EQ(b["content"][1]["type"], "tool_use");
  EXPECT_EQ(b["content"][1]["name"], "get_weather");
  EXPECT_EQ(b["content"][1]["input"], (ordered_json{{"city", "Oslo"}}));
  EXPECT_EQ(b["stop_reason"], "tool_use");
}

}  // namespace
}  // namespace larder::server
