// error_test.cpp — malformed and unsupported templates fail with a Status naming the template
// line; raise_exception surfaces its message; resource limits stop runaway templates.
#include <gtest/gtest.h>

#include "larder/tokenizer/chat_template/chat_template.h"

namespace larder::chat_template {
namespace {

using J = nlohmann::ordered_json;

Status parse_error(const std::string& src) {
  auto t = Template::parse(src, "t.jinja");
  return t.is_ok() ? Status::ok() : t.status();
}

Status render_error(const std::string& src, const J& ctx = J::object(), RenderOptions o = {}) {
  auto t = Template::parse(src, "t.jinja");
  if (!t.is_ok()) return t.status();
  auto r = t->render(ctx, o);
  return r.is_ok() ? Status::ok() : r.status();
}

void expect_contains(const Status& s, const std::string& what) {
  EXPECT_NE(s.message().find(what), std::string::npos) << "message: " << s.to_string() << "\nexpected to contain: " << what;
}

TEST(ChatTemplateErrors, UnknownFilterNamesLine) {
  Status s = parse_error("line one\n{% if false %}{{ x | no_such_filter }}{% endif %}");
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  expect_contains(s, "t.jinja:2:");
  expect_contains(s, "no filter named 'no_such_filter'");
}

TEST(ChatTemplateErrors, UnknownTestNamesLine) {
  Status s = parse_error("\n\n{{ x is frobnicated }}");
  ASSERT_FALSE(s.is_ok());
  expect_contains(s, "t.jinja:3:");
  expect_contains(s, "no test named 'frobnicated'");
}

TEST(ChatTemplateErrors, UnknownTagNamesLine) {
  Status s = parse_error("a\nb\n  {% frobnicate x %}");
  ASSERT_FALSE(s.is_ok());
  expect_contains(s, "t.jinja:3:");
  expect_contains(s, "unknown tag 'frobnicate'");
  // "do" is an extension HF does not enable, so it is unknown there too.
  expect_contains(parse_error("{% do x.append(1) %}"), "unknown tag 'do'");
}

TEST(ChatTemplateErrors, UnclosedBlockNamesOpeningLine) {
  Status s = parse_error("x\n{% for m in messages %}\n{% if m %}{{ m }}\n{% endfor %}");
  ASSERT_FALSE(s.is_ok());
  expect_contains(s, "t.jinja:4:");  // the endfor that closes nothing open
  Status s2 = parse_error("x\n{% for m in messages %}\n{{ m }}");
  ASSERT_FALSE(s2.is_ok());
  expect_contains(s2, "'for' opened at line 2 is not closed");
  expect_contains(parse_error("{{ x "), "expected '}}'");
  expect_contains(parse_error("{# never closed"), "missing end of comment");
  expect_contains(parse_error("{{ 'abc }}"), "unexpected end of string");
  expect_contains(parse_error("{% if %}{% endif %}"), "expected an expression");
  expect_contains(parse_error("{{ (1 + }}"), "unexpected end of print statement");
}

TEST(ChatTemplateErrors, UnsupportedConstructsNameLine) {
  Status inc = parse_error("ok\n{% include 'other.jinja' %}");
  ASSERT_FALSE(inc.is_ok());
  EXPECT_EQ(inc.code(), StatusCode::kUnsupported);
  expect_contains(inc, "t.jinja:2:");
  expect_contains(inc, "tag 'include' is not supported");
  Status ext = parse_error("{% extends 'base' %}");
  EXPECT_EQ(ext.code(), StatusCode::kUnsupported);
  Status rec = parse_error("\n{% for x in l recursive %}{{ loop(x) }}{% endfor %}");
  EXPECT_EQ(rec.code(), StatusCode::kUnsupported);
  expect_contains(rec, "t.jinja:2:");
  expect_contains(rec, "recursive for loops");
  Status pp = parse_error("\n\n{{ x | pprint }}");
  EXPECT_EQ(pp.code(), StatusCode::kUnsupported);
  expect_contains(pp, "t.jinja:3");
  expect_contains(pp, "filter 'pprint' is not supported");
  Status fmt = render_error("\n{{ '{:>8}'.format('x') }}");
  EXPECT_EQ(fmt.code(), StatusCode::kUnsupported);
  expect_contains(fmt, "t.jinja:2:");
}

TEST(ChatTemplateErrors, RaiseExceptionIsInvalidArgumentWithMessage) {
  Status s = render_error("{% for m in messages %}\n{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% endfor %}",
                          J{{"messages", J::array({J{{"role", "system"}, {"content", "x"}}})}});
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  expect_contains(s, "t.jinja:2: System role not supported");
}

TEST(ChatTemplateErrors, RuntimeErrorsNameLine) {
  Status s = render_error("a\nb\n{{ messages[0].content.foo }}", J{{"messages", J::array()}});
  ASSERT_FALSE(s.is_ok());
  expect_contains(s, "t.jinja:3:");
  expect_contains(s, "has no element 0");
  Status t = render_error("\n{{ 'a' + 1 }}");
  expect_contains(t, "t.jinja:2: can only concatenate str (not \"int\") to str");
  Status u = render_error("{{ missing + 1 }}");
  expect_contains(u, "'missing' is undefined");
}

TEST(ChatTemplateErrors, LimitsStopRunawayTemplates) {
  RenderOptions budget;
  budget.max_steps = 200000;
  Status rec = render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(rec.code(), StatusCode::kResourceExhausted) << rec.to_string();
  RenderOptions small;
  small.max_output_bytes = 1000;
  Status out = render_error("{% for i in range(100000) %}xxxxxxxxxx{% endfor %}", J::object(), small);
  EXPECT_EQ(out.code(), StatusCode::kResourceExhausted) << out.to_string();
  Status big = render_error("{{ range(100000000) | length }}", J::object(), budget);
  EXPECT_EQ(big.code(), StatusCode::kResourceExhausted) << big.to_string();
  Status str = render_error("{% set s = 'x' * 1000000 %}{% set s = s * 1000 %}");
  EXPECT_EQ(str.code(), StatusCode::kResourceExhausted) << str.to_string();
  Status steps = render_error("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", J::object(), budget);
  EXPECT_EQ(steps.code(), StatusCode::kResourceExhausted) << steps.to_string();
  Status sorts = render_error("{% set l = range(20000) | list %}{% for a in l %}{{ l | sort | length }}{% endfor %}", J::object(), budget);
  EXPECT_EQ(sorts.code(), StatusCode::kResourceExhausted) << sorts.to_string();
}

TEST(ChatTemplateErrors, DeepNestingIsAnErrorNotACrash) {
  std::string deep = "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  EXPECT_FALSE(parse_error(deep).is_ok());
  std::string chain = "{{ x";
  for (int i = 0; i < 100000; ++i) chain += ".a";
  chain += " }}";
  EXPECT_FALSE(parse_error(chain).is_ok());
  std::string sum = "{{ 1";
  for (int i = 0; i < 100000; ++i) sum += " + 1";
  sum += " }}";
  EXPECT_FALSE(parse_error(sum).is_ok());
  std::string blocks;
  for (int i = 0; i < 50000; ++i) blocks += "{% if true %}";
  EXPECT_FALSE(parse_error(blocks).is_ok());
  std::string nots = "{{ " ;
  for (int i = 0; i < 100000; ++i) nots += "not ";
  nots += "x }}";
  EXPECT_FALSE(parse_error(nots).is_ok());
  EXPECT_EQ(parse_error("{{ x[1:2, 3] }}").code(), StatusCode::kUnsupported);
  Status nest = render_error("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}");
  EXPECT_EQ(nest.code(), StatusCode::kResourceExhausted) << nest.to_string();
  // Moderate nesting real templates use still works.
  auto ok = Template::parse("{{ ((((1 + 2) * 3) - 4) | string) ~ d.a.b.c|default('d')|upper }}");
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  auto r = ok->render(J{{"d", J{{"a", J{{"b", J::object()}}}}}});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(*r, "5D");
}

TEST(ChatTemplateApi, RenderChatNormalizesLikeTransformers) {
  auto t = Template::parse("{% for m in messages %}{{ m }}\n{% endfor %}{{ tools }}|{{ documents }}|{{ add_generation_prompt }}|{{ bos_token is defined }}|{{ flag }}");
  ASSERT_TRUE(t.is_ok());
  ChatRenderOptions o;
  o.extra = J{{"flag", 7}};
  J msgs = J::array({J{{"role", "user"}, {"content", "hi"}, {"tool_calls", nullptr}},
                     J{{"role", "assistant"}, {"content", "a"}, {"reasoning_content", "r"}}});
  auto r = render_chat(*t, msgs, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(*r,
            "{'role': 'user', 'content': 'hi'}\n"
            "{'thinking': 'r', 'role': 'assistant', 'content': 'a', 'reasoning_content': 'r'}\n"
            "None|None|True|False|7");
  EXPECT_FALSE(render_chat(*t, J::array(), o).is_ok());
  ChatRenderOptions bad;
  bad.extra = J{{"messages", 1}};
  EXPECT_FALSE(render_chat(*t, msgs, bad).is_ok());
}

TEST(ChatTemplateApi, StrftimeNowUsesInjectedClock) {
  auto t = Template::parse("{{ strftime_now('%d %b %Y %H:%M') }}");
  ASSERT_TRUE(t.is_ok());
  RenderOptions o;
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 5;
  tm.tm_hour = 9;
  tm.tm_min = 3;
  o.now = tm;
  EXPECT_EQ(*t->render(J::object(), o), "05 Jul 2024 09:03");
}

}  // namespace
}  // namespace larder::chat_template
