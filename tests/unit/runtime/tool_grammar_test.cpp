// Tool-call structural tags (runtime/tool_grammar.h) walked token by token over a real vocabulary:
// Qwen3's tokenizer with harmony's marker tokens added as special tokens (as tests/server/
// tiny_harmony.py makes gpt-oss's convention over it). What must hold: a special token is never
// text (not in a JSON string, not in free text before a trigger, not in a think block) yet a
// harmony header requires its markers by id; a forced harmony call is exactly one call message
// (after optional analysis messages) with arguments valid against the schema; auto leaves
// harmony messages free but constrains a message addressed to a function; a forced call after
// an open <think> lets the reasoning close first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "larder/runtime/grammar.h"
#include "larder/runtime/tool_grammar.h"
#include "larder/tokenizer/tokenizer.h"

namespace larder::runtime {
namespace {

using nlohmann::ordered_json;

const std::string kQwenTok = std::string(LARDER_SHARED_DIR) + "/tokenizers/hf/qwen3/tokenizer.json";
const char* kMarkers[] = {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"};

struct HarmonyVocab {
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::unique_ptr<GrammarEngine> engine, plain;
  std::vector<int32_t> eos;
  int64_t V = 0;
  HarmonyTokens h;
  std::string error;  // the tokenizer is there but did not load
  int32_t id(const char* t) const { return *tok->token_to_id(t); }
};

// Built once: the tokenizer file is 11 MB.
HarmonyVocab* vocab() {
  static HarmonyVocab* v = [] {
    auto* out = new HarmonyVocab;
    std::ifstream in(kQwenTok);
    if (!in) return out;
    // nlohmann::json, not ordered_json: an ordered map finds each of the vocabulary's 151k keys by
    // a linear search (quadratic parse, ~10 s); key order means nothing to the tokenizer.
    nlohmann::json j = nlohmann::json::parse(in);
    int32_t next = 0;
    for (const auto& t : j["added_tokens"]) next = std::max(next, t["id"].get<int32_t>() + 1);
    for (const char* m : kMarkers)
      j["added_tokens"].push_back({{"id", next++}, {"content", m}, {"single_word", false}, {"lstrip", false},
                                   {"rstrip", false}, {"normalized", false}, {"special", true}});
    // One file per process: ctest runs these tests as processes side by side.
    const std::string path = "/tmp/larder-tool-grammar-test-" + std::to_string(getpid()) + ".json";
    std::ofstream(path) << j.dump();
    auto t = tokenizer::Tokenizer::from_hf_file(path);
    std::remove(path.c_str());
    if (!t.is_ok()) {
      out->error = t.status().message();
      return out;
    }
    out->tok = std::move(*t);
    out->V = out->tok->vocab_size();
    // harmony's stop set, as loaded_model.cpp derives it
    out->eos = {*out->tok->token_to_id("<|return|>"), *out->tok->token_to_id("<|call|>"),
                *out->tok->token_to_id("<|im_end|>")};
    out->h = *harmony_tokens(*out->tok);
    // as loaded_model.cpp builds a harmony model's engine: the header markers are named
    out->engine = std::make_unique<GrammarEngine>(
        *out->tok, out->V, GrammarTokens{out->eos, {out->h.start, out->h.end, out->h.channel, out->h.message, out->h.constrain}});
    // and the same vocabulary without them, as any other model's
    out->plain = std::make_unique<GrammarEngine>(*out->tok, out->V, out->eos);
    return out;
  }();
  return v;
}

const ordered_json kWeather = ordered_json::parse(
    R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false})");
const ordered_json kUnit = ordered_json::parse(
    R"({"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"]})");

class ToolGrammar : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::ifstream(kQwenTok)) GTEST_SKIP() << kQwenTok << " absent";
    v = vocab();
    ASSERT_TRUE(v->tok) << v->error;
  }
  ConstraintMatcher matcher(const ToolGrammarSpec& s) {
    const std::string tag = tool_call_structural_tag(s);
    EXPECT_FALSE(tag.empty());
    auto c = v->engine->compile({ConstraintSpec::Kind::kStructuralTag, tag});
    EXPECT_TRUE(c.is_ok()) << c.status().message() << "\n" << tag;
    return ConstraintMatcher(*c);
  }
  std::set<int32_t> allowed(ConstraintMatcher& m) {
    auto a = m.allowed(v->V);
    return {a.begin(), a.end()};
  }
  // Feeds the tokenizer's encoding of `text` (plain text, no markers); false at the first refusal.
  bool text(ConstraintMatcher& m, const std::string& t) {
    for (int32_t id : v->tok->encode(t, false))
      if (!m.accept(id)) return false;
    return true;
  }
  bool text(ConstraintMatcher&& m, const std::string& t) { return text(m, t); }
  bool eos_allowed(ConstraintMatcher& m) {
    auto a = allowed(m);
    return std::any_of(v->eos.begin(), v->eos.end(), [&](int32_t e) { return a.count(e) > 0; });
  }
  std::vector<int32_t> specials() {
    std::vector<int32_t> out;
    for (int32_t id = 0; id < v->tok->vocab_size(); ++id)
      if (v->tok->is_special(id) && std::find(v->eos.begin(), v->eos.end(), id) == v->eos.end()) out.push_back(id);
    return out;
  }
  HarmonyVocab* v = nullptr;
};

ToolGrammarSpec harmony_spec(const HarmonyVocab& v, bool forced) {
  ToolGrammarSpec s;
  s.harmony = v.h;
  s.forced = forced;
  s.functions = {{"get_weather", kWeather}, {"set_unit", kUnit}};
  return s;
}

TEST_F(ToolGrammar, ControlTokensAreNeverText) {
  const auto& voc = v->engine->vocabulary();
  EXPECT_EQ(voc[v->h.channel], std::string(kControlMark) + "<|channel|>");
  EXPECT_EQ(voc[v->id("<|im_start|>")], "") << "a special token not named stays out of reach";
  EXPECT_EQ(v->plain->vocabulary()[v->h.channel], "");
  const std::vector<int32_t> sp = specials();
  ASSERT_GE(sp.size(), 6u);  // <|im_start|>, <|endoftext|>, ... and harmony's header markers
  auto none_special = [&](ConstraintMatcher& m, const char* where) {
    auto a = allowed(m);
    for (int32_t id : sp) EXPECT_FALSE(a.count(id)) << v->tok->id_to_token(id) << " allowed " << where;
  };
  // Inside a JSON string, on the harmony engine (response_format on gpt-oss).
  auto js = v->engine->compile({ConstraintSpec::Kind::kJsonSchema, kWeather.dump()});
  ASSERT_TRUE(js.is_ok());
  ConstraintMatcher m1(*js);
  ASSERT_TRUE(text(m1, "{\"city\": \"Os"));
  none_special(m1, "in a JSON string");
  // In harmony's free message bodies: any_tokens excludes the header markers by id.
  ConstraintMatcher m2 = matcher(harmony_spec(*v, false));
  ASSERT_TRUE(m2.accept(v->h.channel));
  ASSERT_TRUE(text(m2, "final"));
  ASSERT_TRUE(m2.accept(v->h.message));
  ASSERT_TRUE(text(m2, "Let me see"));
  auto a = allowed(m2);
  for (int32_t id : sp) {
    if (id != v->h.end) EXPECT_FALSE(a.count(id)) << v->tok->id_to_token(id) << " allowed in a free body";
  }
  EXPECT_TRUE(a.count(v->h.end));
  // Free text before a trigger (tool_choice auto, tagged family) and inside an open think block,
  // on a plain engine: xgrammar's free text would take a named control token, an unnamed is "".
  auto plain_matcher = [&](const ToolGrammarSpec& s) {
    auto c = v->plain->compile({ConstraintSpec::Kind::kStructuralTag, tool_call_structural_tag(s)});
    EXPECT_TRUE(c.is_ok());
    return ConstraintMatcher(*c);
  };
  ToolGrammarSpec tagged;
  tagged.style = ToolCallStyle::kTagged;
  tagged.functions = {{"get_weather", kWeather}};
  ConstraintMatcher m3 = plain_matcher(tagged);
  ASSERT_TRUE(text(m3, "Let me see"));
  none_special(m3, "in free text");
  tagged.forced = true;
  tagged.think_open = true;
  ConstraintMatcher m4 = plain_matcher(tagged);
  ASSERT_TRUE(text(m4, "Hmm"));
  none_special(m4, "in a think block");
}

TEST_F(ToolGrammar, HarmonyForcedCallIsOneCallMessage) {
  ConstraintMatcher m = matcher(harmony_spec(*v, true));
  // The prompt ends with <|start|>assistant: a header opens, by its marker token or the recipient.
  auto first = allowed(m);
  EXPECT_TRUE(first.count(v->h.channel));
  EXPECT_FALSE(first.count(v->h.start));
  EXPECT_FALSE(first.count(v->h.message));
  EXPECT_FALSE(eos_allowed(m));
  EXPECT_FALSE(first.count(v->tok->encode("Hello", false)[0])) << "no plain answer";
  ASSERT_TRUE(m.accept(v->h.channel));
  EXPECT_FALSE(text(m, "final")) << "a forced call has no final message";
  ConstraintMatcher c = matcher(harmony_spec(*v, true));
  ASSERT_TRUE(c.accept(v->h.channel));
  ASSERT_TRUE(text(c, "commentary to=functions.set_unit "));
  ASSERT_TRUE(c.accept(v->h.constrain));
  ASSERT_TRUE(text(c, "json"));
  EXPECT_FALSE(eos_allowed(c));
  ASSERT_TRUE(c.accept(v->h.message));
  EXPECT_FALSE(text(matcher(harmony_spec(*v, true)), "commentary")) << "text before the channel marker";
  // The arguments: only the schema's values.
  ASSERT_TRUE(text(c, "{\"unit\": \""));
  EXPECT_FALSE(allowed(c).count(v->h.end));
  ASSERT_TRUE(text(c, "celsius\"}"));
  EXPECT_TRUE(c.can_end());
  EXPECT_TRUE(allowed(c).count(v->id("<|call|>")));
  EXPECT_FALSE(allowed(c).count(v->h.end)) << "the call ends the turn";
}

TEST_F(ToolGrammar, HarmonyForcedRefusesBadArguments) {
  ConstraintMatcher c = matcher(harmony_spec(*v, true));
  ASSERT_TRUE(c.accept(v->h.channel));
  ASSERT_TRUE(text(c, "commentary to=functions.set_unit "));
  ASSERT_TRUE(c.accept(v->h.constrain));
  ASSERT_TRUE(text(c, "json"));
  ASSERT_TRUE(c.accept(v->h.message));
  ASSERT_TRUE(text(c, "{\"unit\": \""));
  EXPECT_FALSE(text(c, "kelvin"));
  ConstraintMatcher u = matcher(harmony_spec(*v, true));
  ASSERT_TRUE(u.accept(v->h.channel));
  EXPECT_FALSE(text(u, "commentary to=functions.get_time ")) << "only a given function";
}

TEST_F(ToolGrammar, HarmonyForcedAfterAnalysisAndRecipientFirst) {
  ConstraintMatcher m = matcher(harmony_spec(*v, true));
  ASSERT_TRUE(m.accept(v->h.channel));
  ASSERT_TRUE(text(m, "analysis"));
  ASSERT_TRUE(m.accept(v->h.message));
  ASSERT_TRUE(text(m, "The user wants the weather {\"a\": 1} in Oslo."));
  EXPECT_FALSE(eos_allowed(m)) << "reasoning alone is no call";
  EXPECT_FALSE(allowed(m).count(v->h.channel));
  ASSERT_TRUE(m.accept(v->h.end));
  ASSERT_TRUE(m.accept(v->h.start));
  ASSERT_TRUE(text(m, "assistant"));
  // The recipient before the channel, as the template renders past calls.
  ASSERT_TRUE(text(m, " to=functions.get_weather"));
  ASSERT_TRUE(m.accept(v->h.channel));
  ASSERT_TRUE(text(m, "commentary json"));
  ASSERT_TRUE(m.accept(v->h.message));
  ASSERT_TRUE(text(m, "{\"city\": \"Oslo\"}"));
  EXPECT_TRUE(m.can_end());
}

TEST_F(ToolGrammar, HarmonyAutoIsFreeButConstrainsCalls) {
  // A final answer, after reasoning, ends freely.
  ConstraintMatcher m = matcher(harmony_spec(*v, false));
  ASSERT_TRUE(m.accept(v->h.channel));
  ASSERT_TRUE(text(m, "analysis"));
  ASSERT_TRUE(m.accept(v->h.message));
  ASSERT_TRUE(text(m, "thinking"));
  ASSERT_TRUE(m.accept(v->h.end));
  ASSERT_TRUE(m.accept(v->h.start));
  ASSERT_TRUE(text(m, "assistant"));
  ASSERT_TRUE(m.accept(v->h.channel));
  ASSERT_TRUE(text(m, "final"));
  ASSERT_TRUE(m.accept(v->h.message));
  ASSERT_TRUE(text(m, "It is 4 C {\"city\": 1}"));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(allowed(m).count(v->id("<|return|>")));
  // A message addressed to a function: its arguments follow the schema.
  ConstraintMatcher c = matcher(harmony_spec(*v, false));
  ASSERT_TRUE(c.accept(v->h.channel));
  ASSERT_TRUE(text(c, "commentary to=functions.get_weather "));
  ASSERT_TRUE(c.accept(v->h.constrain));
  ASSERT_TRUE(text(c, "json"));
  ASSERT_TRUE(c.accept(v->h.message));
  EXPECT_FALSE(eos_allowed(c));
  EXPECT_FALSE(text(c, "{\"town\""));
  ConstraintMatcher u = matcher(harmony_spec(*v, false));
  ASSERT_TRUE(u.accept(v->h.channel));
  EXPECT_FALSE(text(u, "commentary to=functions.get_time ")) << "an unknown function";
}

TEST_F(ToolGrammar, ForcedCallAfterOpenThink) {
  ToolGrammarSpec s;
  s.style = ToolCallStyle::kTaggedXml;
  s.forced = true;
  s.parallel = false;
  s.think_open = true;
  s.functions = {{"set_unit", kUnit}};
  ConstraintMatcher m = matcher(s);
  ASSERT_TRUE(text(m, "The user wants <tool_call> units."));
  EXPECT_FALSE(eos_allowed(m));
  ASSERT_TRUE(text(m, "</think>\n\n"));
  EXPECT_FALSE(text(matcher(s), "</think>\n\nSure")) << "after the reasoning, only the call";
  ASSERT_TRUE(text(m, "<tool_call>\n<function=set_unit>\n<parameter=unit>\ncelsius\n</parameter>\n"));
  ASSERT_TRUE(text(m, "</function>\n</tool_call>"));
  EXPECT_TRUE(m.can_end());
  // Without think_open the call is the whole answer, as before.
  s.think_open = false;
  EXPECT_FALSE(text(matcher(s), "Hmm"));
}

TEST(ToolGrammarSpec, NothingToConstrain) {  // no vocabulary needed
  ToolGrammarSpec s;
  s.style = ToolCallStyle::kBareJson;
  s.functions = {{"get_weather", kWeather}};
  EXPECT_EQ(tool_call_structural_tag(s), "") << "auto on a bare-JSON family has no trigger";
  s.functions.clear();
  s.forced = true;
  EXPECT_EQ(tool_call_structural_tag(s), "");
}

}  // namespace
}  // namespace larder::runtime
