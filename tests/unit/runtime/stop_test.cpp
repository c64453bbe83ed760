#include <gtest/gtest.h>

#include "larder/runtime/stop.h"

namespace larder::runtime {
namespace {

// Feeds pieces, returns everything emitted (push outputs + flush).
std::string run(StopMatcher& m, const std::vector<std::string>& pieces, bool flush = true) {
  std::string out;
  for (const auto& p : pieces) out += m.push(p);
  if (flush) out += m.flush();
  return out;
}

TEST(StopMatcher, NoStopsPassesThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.push("hello "), "hello ");
  EXPECT_EQ(m.push("world"), "world");
  EXPECT_FALSE(m.matched());
}

TEST(StopMatcher, MatchInsideOnePiece) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("abc END def"), "abc ");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.matched_string(), "END");
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, MatchAcrossPiecesHoldsBackPrefix) {
  StopMatcher m({"</s>"});
  EXPECT_EQ(m.push("hi <"), "hi ");  // "<" might start the stop string
  EXPECT_EQ(m.push("/"), "");
  EXPECT_EQ(m.push("s"), "");
  EXPECT_EQ(m.push(">tail"), "");
  EXPECT_TRUE(m.matched());
}

TEST(StopMatcher, FalseStartIsReleased) {
  StopMatcher m({"</s>"});
  EXPECT_EQ(m.push("a </"), "a ");
  EXPECT_EQ(m.push("b>"), "</b>");
  EXPECT_FALSE(m.matched());
  EXPECT_EQ(m.push("x<"), "x");
  EXPECT_EQ(m.flush(), "<");  // end of stream releases the held text
}

TEST(StopMatcher, EarliestOfSeveral) {
  StopMatcher m({"world", "lo w", "xyz"});
  EXPECT_EQ(run(m, {"hel", "lo wor", "ld"}), "hel");
  EXPECT_EQ(m.matched_string(), "lo w");
}

TEST(StopMatcher, SamePositionPrefersLonger) {
  StopMatcher m({"ab", "abc"});
  EXPECT_EQ(m.push("xabcd"), "x");
  EXPECT_EQ(m.matched_string(), "abc");
}

TEST(StopMatcher, StopAtStartAndRepeatedPrefix) {
  StopMatcher a({"###"});
  EXPECT_EQ(run(a, {"###"}), "");
  EXPECT_TRUE(a.matched());
  StopMatcher b({"aab"});
  EXPECT_EQ(run(b, {"a", "a", "a", "b"}), "a");  // "aaab": the match starts at index 1
  EXPECT_TRUE(b.matched());
}

TEST(StopMatcher, Utf8StopString) {
  StopMatcher m({"—end"});
  EXPECT_EQ(run(m, {"naïve ", "\xE2\x80", "\x94", "en", "d!"}), "naïve ");
  EXPECT_TRUE(m.matched());
}

TEST(StopMatcher, EmptyStopStringsIgnored) {
  StopMatcher m({"", "q"});
  EXPECT_EQ(m.push("abc"), "abc");
  EXPECT_EQ(m.push("xqy"), "x");
}

}  // namespace
}  // namespace larder::runtime
