// parse_json_linear (server/api.h): the request-body parser must build exactly what nlohmann's
// own parser builds (values, key order, duplicate keys: last value at the first position) while
// taking time linear in the keys, refuse nesting past its limit, and report invalid JSON.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <iterator>
#include <random>
#include <string>

#include "larder/server/api.h"

namespace larder::server {
namespace {

ordered_json reference(const std::string& text) { return ordered_json::parse(text); }

void expect_same(const std::string& text) {
  ordered_json got;
  ASSERT_FALSE(parse_json_linear(text, 128, &got)) << text.substr(0, 200);
  const ordered_json want = reference(text);
  EXPECT_EQ(got, want) << text.substr(0, 200);
  EXPECT_EQ(got.dump(), want.dump()) << "key order differs: " << text.substr(0, 200);
}

TEST(ParseJsonLinear, SameAsNlohmannOnSmallDocuments) {
  for (const char* t : {"null", "true", "0", "-7", "18446744073709551615", "1.5e300", "\"s\\u00e9\\n\"", "[]", "{}",
                        "[1, [2, [3, {}]], {\"a\": []}]", "{\"b\": 1, \"a\": 2, \"c\": {\"z\": 0, \"y\": [1]}}",
                        "  {\"a\" : 1 }  "})
    expect_same(t);
}

TEST(ParseJsonLinear, DuplicateKeysLastWinsAtFirstPosition) {
  expect_same("{\"a\": 1, \"b\": 2, \"a\": 3}");
  expect_same("{\"a\": {\"x\": 1}, \"b\": 2, \"a\": [5]}");
  // Past the size where keys are hashed.
  std::string big = "{";
  for (int i = 0; i < 100; ++i) big += "\"k" + std::to_string(i) + "\": " + std::to_string(i) + ", ";
  big += "\"k3\": \"again\", \"k99\": {\"n\": 1}, \"k3\": [3]}";
  expect_same(big);
  ordered_json got;
  ASSERT_FALSE(parse_json_linear(big, 128, &got));
  EXPECT_EQ(got.size(), 100u);
  EXPECT_EQ(std::next(got.begin(), 3).key(), "k3");
  EXPECT_EQ(got["k3"], ordered_json::array({3}));
}

TEST(ParseJsonLinear, SameAsNlohmannOnRandomDocuments) {
  std::mt19937 rng(47);
  // Random objects with keys from a small pool (many duplicates), nested a few levels.
  std::function<std::string(int)> gen = [&](int depth) -> std::string {
    const int kind = depth > 3 ? static_cast<int>(rng() % 3) : static_cast<int>(rng() % 5);
    if (kind == 0) return std::to_string(static_cast<int>(rng() % 1000) - 500);
    if (kind == 1) return "\"v" + std::to_string(rng() % 50) + "\"";
    if (kind == 2) return rng() % 2 ? "true" : "null";
    std::string s = kind == 3 ? "[" : "{";
    const int n = static_cast<int>(rng() % (rng() % 4 == 0 ? 60 : 6));
    for (int i = 0; i < n; ++i) {
      if (i) s += ",";
      if (kind == 4) s += "\"k" + std::to_string(rng() % 40) + "\":";
      s += gen(depth + 1);
    }
    return s + (kind == 3 ? "]" : "}");
  };
  for (int i = 0; i < 500; ++i) expect_same(gen(0));
}

TEST(ParseJsonLinear, ManyKeysInLinearTime) {
  std::string text = "{";
  for (int i = 0; i < 200000; ++i) text += (i ? ",\"" : "\"") + std::to_string(i) + "\":" + std::to_string(i);
  text += "}";
  const auto t0 = std::chrono::steady_clock::now();
  ordered_json got;
  ASSERT_FALSE(parse_json_linear(text, 128, &got));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(got.size(), 200000u);
  EXPECT_EQ(got["199999"], 199999);
  EXPECT_LT(s, 2.0) << "200k keys: nlohmann's own parser needs minutes";
}

TEST(ParseJsonLinear, DepthLimitAndErrors) {
  ordered_json out;
  EXPECT_FALSE(parse_json_linear(std::string(128, '[') + std::string(128, ']'), 128, &out));
  auto e = parse_json_linear(std::string(129, '[') + std::string(129, ']'), 128, &out);
  ASSERT_TRUE(e);
  EXPECT_NE(e->find("128"), std::string::npos) << *e;
  EXPECT_TRUE(out.is_null());
  e = parse_json_linear(std::string(1000000, '['), 128, &out);
  ASSERT_TRUE(e);
  for (const char* bad : {"", "{", "{\"a\" 1}", "[1,]", "{\"a\": 1} x", "\"\\ud800\"", "nul", "\"\xff\""}) {
    EXPECT_TRUE(parse_json_linear(bad, 128, &out)) << bad;
    EXPECT_TRUE(out.is_null());
  }
}

}  // namespace
}  // namespace larder::server
