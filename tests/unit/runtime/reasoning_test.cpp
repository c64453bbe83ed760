// ReasoningSplitter: tags split across every possible piece boundary never leak to either side,
// and the joined sides equal a one-shot split.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "larder/runtime/reasoning.h"

namespace larder::runtime {
namespace {

ReasoningSplitter::Out run(const std::vector<std::string>& pieces, bool inside = false) {
  ReasoningSplitter s(inside);
  ReasoningSplitter::Out all;
  for (const auto& p : pieces) {
    auto o = s.push(p);
    all.content += o.content;
    all.reasoning += o.reasoning;
  }
  auto o = s.flush();
  all.content += o.content;
  all.reasoning += o.reasoning;
  return all;
}

TEST(ReasoningSplitter, SplitsThinkBlock) {
  auto o = run({"<think>\nLet me think.\n</think>\n\nThe answer is 4."});
  EXPECT_EQ(o.reasoning, "\nLet me think.\n");
  EXPECT_EQ(o.content, "The answer is 4.");
}

TEST(ReasoningSplitter, EveryCutPointGivesTheSameSplit) {
  const std::string text = "<think>a < b and </ not a tag</think>\n\nx <thin y";
  const auto whole = run({text});
  EXPECT_EQ(whole.reasoning, "a < b and </ not a tag");
  EXPECT_EQ(whole.content, "x <thin y");  // an unfinished tag at the end is plain text
  for (size_t i = 0; i <= text.size(); ++i) {
    for (size_t j = i; j <= text.size(); ++j) {
      auto o = run({text.substr(0, i), text.substr(i, j - i), text.substr(j)});
      EXPECT_EQ(o.reasoning, whole.reasoning) << i << "," << j;
      EXPECT_EQ(o.content, whole.content) << i << "," << j;
    }
  }
}

TEST(ReasoningSplitter, CharByCharNeverLeaksATag) {
  const std::string text = "<think>r1</think>c1<think>r2</think>c2";
  ReasoningSplitter s;
  std::string content, reasoning;
  for (char c : text) {
    auto o = s.push(std::string(1, c));
    content += o.content;
    reasoning += o.reasoning;
    EXPECT_EQ(content.find('<'), std::string::npos) << content;
    EXPECT_EQ(reasoning.find('<'), std::string::npos) << reasoning;
  }
  auto o = s.flush();
  EXPECT_EQ(content + o.content, "c1c2");
  EXPECT_EQ(reasoning + o.reasoning, "r1r2");
}

TEST(ReasoningSplitter, PromptEndedInsideThink) {
  auto o = run({"still thinking", "</think>", "done"}, /*inside=*/true);
  EXPECT_EQ(o.reasoning, "still thinking");
  EXPECT_EQ(o.content, "done");
}

TEST(ReasoningSplitter, NoTagsIsAllContent) {
  auto o = run({"plain ", "text with <b>html</b>"});
  EXPECT_EQ(o.content, "plain text with <b>html</b>");
  EXPECT_EQ(o.reasoning, "");
}

}  // namespace
}  // namespace larder::runtime
