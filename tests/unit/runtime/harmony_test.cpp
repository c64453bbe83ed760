// HarmonyParser (gpt-oss output): channels to reasoning / content / tool calls, whole and streamed
// at every cut point (markers split across pieces never leak to either side).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "larder/runtime/harmony.h"

namespace larder::runtime {
namespace {

struct All {
  std::string content, reasoning;
  std::vector<ToolCall> calls;
};

All run(const std::vector<std::string>& pieces) {
  HarmonyParser p;
  All all;
  auto add = [&](HarmonyParser::Out o) {
    all.content += o.content;
    all.reasoning += o.reasoning;
    for (auto& c : o.calls) all.calls.push_back(std::move(c));
  };
  for (const auto& s : pieces) add(p.push(s));
  add(p.flush());
  return all;
}

// What generation releases: the prompt ended with <|start|>assistant, <|return|>/<|call|> are EOS
// ids (never in the text).
const std::string kAnswer =
    "<|channel|>analysis<|message|>User asks 2+3. <|not a marker|> Easy.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is 5 <| and | done.";
const std::string kCall =
    "<|channel|>analysis<|message|>Need the weather tool.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    "{\"city\": \"Oslo\", \"unit\": \"celsius\"}";

TEST(HarmonyParser, AnalysisIsReasoningFinalIsContent) {
  auto o = run({kAnswer});
  EXPECT_EQ(o.reasoning, "User asks 2+3. <|not a marker|> Easy.");
  EXPECT_EQ(o.content, "It is 5 <| and | done.");
  EXPECT_TRUE(o.calls.empty());
}

TEST(HarmonyParser, CommentaryToFunctionIsAToolCall) {
  auto o = run({kCall});
  EXPECT_EQ(o.reasoning, "Need the weather tool.");
  EXPECT_EQ(o.content, "");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].name, "get_weather");
  EXPECT_EQ(o.calls[0].arguments, (nlohmann::ordered_json{{"city", "Oslo"}, {"unit", "celsius"}}));
}

TEST(HarmonyParser, RecipientBeforeChannelAndSeveralCalls) {
  // The template's own form (recipient in the role part), a preamble, two calls ended by <|call|>
  // in the text (as when the client's stop set does not hold <|call|>), then more analysis.
  auto o = run({"<|channel|>commentary<|message|>Checking two things.<|end|>"
                "<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{\"a\": 2, \"b\": 3}<|call|>"
                "<|start|>assistant<|channel|>commentary to=functions.get_time<|message|><|call|>"
                "<|start|>assistant<|channel|>analysis<|message|>more"});
  EXPECT_EQ(o.content, "Checking two things.");
  EXPECT_EQ(o.reasoning, "more");
  ASSERT_EQ(o.calls.size(), 2u);
  EXPECT_EQ(o.calls[0].name, "add");
  EXPECT_EQ(o.calls[0].arguments, (nlohmann::ordered_json{{"a", 2}, {"b", 3}}));
  EXPECT_EQ(o.calls[1].name, "get_time");
  EXPECT_EQ(o.calls[1].arguments, nlohmann::ordered_json::object());
}

TEST(HarmonyParser, BodyThatIsNotJsonStaysAString) {
  auto o = run({"<|channel|>commentary to=browser.search <|constrain|>json<|message|>{oops"});
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].name, "browser.search");  // only the functions. namespace is stripped
  EXPECT_EQ(o.calls[0].arguments, "{oops");
}

TEST(HarmonyParser, PlainTextWithoutHeaderIsContent) {
  EXPECT_EQ(run({"Just ", "an answer."}).content, "Just an answer.");
  const std::string longer(300, 'x');  // past the header bound: released before the end
  HarmonyParser p;
  EXPECT_EQ(p.push(longer).content, longer);
  // An unfinished header at the end of the stream is not the answer.
  auto o = run({"<|channel|>analysis<|message|>r<|end|><|start|>assistant<|channel|>fin"});
  EXPECT_EQ(o.reasoning, "r");
  EXPECT_EQ(o.content, "");
}

// Found by tests/fuzz/fuzz_output: a header marker followed by more than the header bound of
// text without <|message|> fell back to content with the marker still first, which reopened the
// header at once — push() never returned. Now the whole text is content, as any too-long header.
TEST(HarmonyParser, HeaderMarkerThenLongTextWithoutMessageEnds) {
  for (const std::string marker : {"<|start|>", "<|channel|>"}) {
    const std::string text = marker + "assistant" + std::string(300, 'x');
    EXPECT_EXIT(
        {
          alarm(10);  // the hang fails the test instead of stalling the suite
          const All o = run({text});
          std::exit(o.content == text && o.reasoning.empty() && o.calls.empty() ? 0 : 1);
        },
        testing::ExitedWithCode(0), ".*")
        << marker;
  }
}

// Whether a header was too long depended on where the text was cut: a <|message|> starting
// within the bound but still incomplete when the held text passed it made the header plain
// content, while in one piece it was a header (and one starting past the bound was a header only
// when it came in the same piece). The header here is padded in front, so the too-long case is
// content up to its <|channel|>, which then opens a header of its own.
TEST(HarmonyParser, HeaderBoundDoesNotDependOnCutPoints) {
  for (size_t pad : {240, 245, 250, 256, 258, 262, 300}) {
    const std::string spaces(pad - 19, ' ');
    const std::string text = spaces + "<|channel|>analysis<|message|>think<|end|>" +
                             "<|start|>assistant<|channel|>final<|message|>answer";
    const All whole = run({text});
    EXPECT_EQ(whole.reasoning, "think") << pad;
    EXPECT_EQ(whole.content, pad <= 256 ? "answer" : spaces + "answer") << pad;  // <|message|> starts at pad
    for (size_t i = 0; i <= text.size(); ++i) {
      const All o = run({text.substr(0, i), text.substr(i)});
      ASSERT_EQ(o.content, whole.content) << "pad " << pad << " cut at " << i;
      ASSERT_EQ(o.reasoning, whole.reasoning) << "pad " << pad << " cut at " << i;
    }
  }
}

TEST(HarmonyParser, EveryCutPointGivesTheSameSplit) {
  for (const std::string& text : {kAnswer, kCall}) {
    const All whole = run({text});
    for (size_t i = 0; i <= text.size(); ++i) {
      for (size_t j = i; j <= text.size(); j += 3) {
        const All o = run({text.substr(0, i), text.substr(i, j - i), text.substr(j)});
        ASSERT_EQ(o.content, whole.content) << "cut at " << i << "," << j;
        ASSERT_EQ(o.reasoning, whole.reasoning) << "cut at " << i << "," << j;
        ASSERT_EQ(o.calls.size(), whole.calls.size()) << "cut at " << i << "," << j;
        for (size_t k = 0; k < o.calls.size(); ++k) {
          ASSERT_EQ(o.calls[k].name, whole.calls[k].name);
          ASSERT_EQ(o.calls[k].arguments, whole.calls[k].arguments);
        }
      }
    }
  }
}

TEST(HarmonyParser, StreamedPiecesNeverShowAMarker) {
  // One byte at a time: no released piece of either side holds any part of a header or marker.
  HarmonyParser p;
  std::string content, reasoning;
  for (char c : kAnswer) {
    auto o = p.push(std::string(1, c));
    content += o.content;
    reasoning += o.reasoning;
    for (const std::string& s : {content, reasoning}) {
      ASSERT_EQ(s.find("<|channel"), std::string::npos) << s;
      ASSERT_EQ(s.find("<|end"), std::string::npos) << s;
      ASSERT_EQ(s.find("assistant"), std::string::npos) << s;
      ASSERT_EQ(s.find("final"), std::string::npos) << s;
    }
  }
  EXPECT_EQ(reasoning, "User asks 2+3. <|not a marker|> Easy.");
  EXPECT_EQ(content + p.flush().content, "It is 5 <| and | done.");
}

}  // namespace
}  // namespace larder::runtime
