// Constrained decoding (runtime/grammar.h) against hand-written grammars, over three real
// vocabularies: stories260K (llama2-style SentencePiece with byte fallback, always present),
// SmolLM2 (byte-level BPE) and gemma-3 (SentencePiece, 262k, byte fallback) when fetched.
// The expected allowed sets are computed here by brute force over the token bytes, not by xgrammar.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "larder/runtime/grammar.h"
#include "larder/tokenizer/tokenizer.h"

namespace larder::runtime {
namespace {

const std::string kStories = std::string(LARDER_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
const std::string kSmol = std::string(LARDER_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
const std::string kGemma = std::string(LARDER_MODELS_DIR) + "/gemma-3-270m-q4_k_m.gguf";

bool exists(const std::string& p) { return std::ifstream(p).good(); }

struct Vocab {
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::unique_ptr<GrammarEngine> engine;
  int64_t V = 0;
  std::vector<int32_t> eos;
};

Vocab load(const std::string& path) {
  Vocab v;
  auto t = tokenizer::Tokenizer::from_path(path);
  EXPECT_TRUE(t.is_ok()) << t.status().message();
  v.tok = std::move(*t);
  v.V = v.tok->vocab_size() + 7;  // padding rows past the tokenizer, as some models have
  v.eos = v.tok->eos_ids();
  v.engine = std::make_unique<GrammarEngine>(*v.tok, v.V, v.eos);
  return v;
}

std::shared_ptr<const Constraint> compile(Vocab& v, ConstraintSpec::Kind k, const std::string& text) {
  auto c = v.engine->compile({k, text});
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  return c.is_ok() ? *c : nullptr;
}

// Tokens whose bytes are a non-empty prefix of one of `words` (what a grammar `root ::= w1 | w2`
// must allow first), by brute force.
std::set<int32_t> prefix_tokens(const Vocab& v, const std::vector<std::string>& words, const std::string& done) {
  std::set<int32_t> out;
  const auto& voc = v.engine->vocabulary();
  for (int32_t id = 0; id < static_cast<int32_t>(voc.size()); ++id) {
    const std::string& b = voc[id];
    if (b.empty()) continue;
    for (const auto& w : words)
      if (w.size() >= done.size() + b.size() && w.compare(0, done.size(), done) == 0 &&
          w.compare(done.size(), b.size(), b) == 0)
        out.insert(id);
  }
  return out;
}

void check_alternatives(const std::string& path) {
  Vocab v = load(path);
  const std::vector<std::string> words = {"yes", "no", "maybe so"};
  auto c = compile(v, ConstraintSpec::Kind::kGbnf, R"(root ::= "yes" | "no" | "maybe so")");
  ASSERT_TRUE(c);
  ConstraintMatcher m(c);
  auto allowed = m.allowed(v.V);
  std::set<int32_t> got(allowed.begin(), allowed.end());
  EXPECT_EQ(got, prefix_tokens(v, words, "")) << path;
  for (int32_t e : v.eos) EXPECT_FALSE(got.count(e)) << "EOS before the grammar is complete";
  EXPECT_FALSE(m.can_end());
  // Walk "maybe so" by longest-match tokens of the vocabulary (the tokenizer's own encoding may
  // add a SentencePiece prefix space).
  std::vector<int32_t> ids;
  {
    const auto& voc = v.engine->vocabulary();
    const std::string text = "maybe so";
    for (size_t at = 0; at < text.size();) {
      int32_t best = -1;
      for (int32_t id = 0; id < static_cast<int32_t>(voc.size()); ++id)
        if (!voc[id].empty() && text.compare(at, voc[id].size(), voc[id]) == 0 &&
            (best < 0 || voc[id].size() > voc[best].size()))
          best = id;
      ASSERT_GE(best, 0) << "no token continues '" << text.substr(at) << "'";
      ids.push_back(best);
      at += voc[best].size();
    }
  }
  std::string done;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string piece = v.engine->vocabulary()[ids[i]];
    auto a = m.allowed(v.V);
    EXPECT_EQ(std::set<int32_t>(a.begin(), a.end()), prefix_tokens(v, words, done)) << "after '" << done << "'";
    ASSERT_TRUE(m.accept(ids[i])) << "token " << ids[i] << " '" << piece << "'";
    done += piece;
  }
  EXPECT_EQ(done, "maybe so");
  EXPECT_TRUE(m.can_end());
  auto end = m.allowed(v.V);
  EXPECT_EQ(std::set<int32_t>(end.begin(), end.end()), std::set<int32_t>(v.eos.begin(), v.eos.end()))
      << "a complete grammar allows only EOS";
  // A token outside the grammar is refused and leaves the matcher where it was.
  const int32_t x = v.tok->encode("x", false).back();
  EXPECT_FALSE(m.accept(x));
  EXPECT_TRUE(m.can_end());
  // Rollback: back to the start, the first mask again.
  m.rollback(static_cast<int>(ids.size()));
  auto again = m.allowed(v.V);
  EXPECT_EQ(std::set<int32_t>(again.begin(), again.end()), prefix_tokens(v, words, ""));
  ASSERT_FALSE(v.eos.empty());
  EXPECT_TRUE(m.accept(ids[0]));
}

TEST(Grammar, AlternativesStories) { check_alternatives(kStories); }
TEST(Grammar, AlternativesSmolLM2) {
  if (!exists(kSmol)) GTEST_SKIP() << kSmol << " absent (scripts/fetch_models.sh)";
  check_alternatives(kSmol);
}
TEST(Grammar, AlternativesGemma) {
  if (!exists(kGemma)) GTEST_SKIP() << kGemma << " absent (scripts/fetch_models.sh)";
  check_alternatives(kGemma);
}

// The vocabulary xgrammar sees: each token's bytes as it continues a text; special tokens empty.
TEST(Grammar, VocabularyBytes) {
  Vocab s = load(kStories);
  const auto& voc = s.engine->vocabulary();
  // llama2 SentencePiece: "▁" is a space, <0x0A> is the newline byte.
  auto nl = s.tok->token_to_id("<0x0A>");
  ASSERT_TRUE(nl);
  EXPECT_EQ(voc[*nl], "\n");
  auto once = s.tok->token_to_id("\xE2\x96\x81Once");
  ASSERT_TRUE(once);
  EXPECT_EQ(voc[*once], " Once");
  for (int32_t e : s.eos) EXPECT_EQ(voc[e], "");
  if (exists(kSmol)) {
    Vocab m = load(kSmol);
    const auto& mv = m.engine->vocabulary();
    auto the = m.tok->token_to_id("\xC4\xA0the");  // byte-level BPE: Ġ is the space byte
    ASSERT_TRUE(the);
    EXPECT_EQ(mv[*the], " the");
    auto im_start = m.tok->token_to_id("<|im_start|>");
    ASSERT_TRUE(im_start);
    EXPECT_EQ(mv[*im_start], "") << "a control token is never text";
  }
}

// A random walk through a JSON schema's grammar: whatever allowed token is taken, the result
// parses and satisfies the schema (checked here by hand).
TEST(Grammar, JsonSchemaRandomWalks) {
  Vocab v = load(exists(kSmol) ? kSmol : kStories);
  const std::string schema = R"({"type": "object", "properties": {
      "n": {"type": "integer", "minimum": 1, "maximum": 9},
      "tag": {"enum": ["red", "green"]},
      "ok": {"type": "boolean"}},
    "required": ["n", "tag", "ok"], "additionalProperties": false})";
  auto c = compile(v, ConstraintSpec::Kind::kJsonSchema, schema);
  ASSERT_TRUE(c);
  std::mt19937 rng(7);
  for (int walk = 0; walk < 20; ++walk) {
    ConstraintMatcher m(c);
    std::string text;
    bool ended = false;
    for (int step = 0; step < 400 && !ended; ++step) {
      auto a = m.allowed(v.V);
      ASSERT_FALSE(a.empty());
      // Prefer short tokens half the time so walks explore, and end as soon as EOS is allowed.
      int32_t pick = a[std::uniform_int_distribution<size_t>(0, a.size() - 1)(rng)];
      for (int32_t id : a)
        if (std::find(v.eos.begin(), v.eos.end(), id) != v.eos.end()) pick = id;
      if (std::find(v.eos.begin(), v.eos.end(), pick) != v.eos.end()) {
        EXPECT_TRUE(m.can_end());
        ended = true;
        break;
      }
      ASSERT_TRUE(m.accept(pick));
      text += v.engine->vocabulary()[pick];
    }
    ASSERT_TRUE(ended) << text;
    auto j = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    ASSERT_TRUE(j.is_object()) << text;
    EXPECT_EQ(j.size(), 3u) << text;
    ASSERT_TRUE(j["n"].is_number_integer()) << text;
    EXPECT_GE(j["n"].get<int>(), 1);
    EXPECT_LE(j["n"].get<int>(), 9);
    EXPECT_TRUE(j["tag"] == "red" || j["tag"] == "green") << text;
    EXPECT_TRUE(j["ok"].is_boolean()) << text;
  }
}

TEST(Grammar, BadGrammarsAreErrors) {
  Vocab v = load(kStories);
  auto g = v.engine->compile({ConstraintSpec::Kind::kGbnf, "root ::= undefined_rule"});
  ASSERT_FALSE(g.is_ok());
  EXPECT_NE(g.status().message().find("undefined_rule"), std::string::npos) << g.status().message();
  // oneOf whose branches overlap cannot be enforced exactly: xgrammar's warning becomes a refusal.
  auto o = v.engine->compile({ConstraintSpec::Kind::kJsonSchema,
                              R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})"});
  ASSERT_FALSE(o.is_ok());
  EXPECT_NE(o.status().message().find("oneOf"), std::string::npos) << o.status().message();
  // xgrammar caches the compiled result anyway: the second request must be refused too.
  auto o2 = v.engine->compile({ConstraintSpec::Kind::kJsonSchema,
                               R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})"});
  EXPECT_FALSE(o2.is_ok());
}

TEST(Grammar, SchemaKeywordCheck) {
  using J = nlohmann::ordered_json;
  EXPECT_TRUE(check_json_schema(J::parse(R"({"type": "object", "title": "t", "x-extra": 1,
      "properties": {"a": {"type": "string", "pattern": "^[a-z]+$"}, "b": {"$ref": "#/$defs/B"}},
      "$defs": {"B": {"type": "array", "items": {"type": "integer"}, "minItems": 1}}})"))
                  .is_ok());
  auto msg = [](const char* s) { return check_json_schema(J::parse(s)).message(); };
  EXPECT_NE(msg(R"({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": true}}})")
                .find("'uniqueItems' at /properties/tags"),
            std::string::npos);
  EXPECT_NE(msg(R"({"not": {"type": "string"}})").find("'not'"), std::string::npos);
  EXPECT_NE(msg(R"({"if": {}, "then": {}})").find("'if'"), std::string::npos);
  EXPECT_NE(msg(R"({"type": "string", "format": "ipv5"})").find("ipv5"), std::string::npos);
  EXPECT_NE(msg(R"({"type": "string", "pattern": "a+", "maxLength": 3})").find("'maxLength'"), std::string::npos);
  EXPECT_NE(msg(R"({"anyOf": [{"type": "string"}], "minLength": 2})").find("'minLength'"), std::string::npos);
  EXPECT_NE(msg(R"({"allOf": [{"type": "string"}, {"minLength": 2}]})").find("'allOf'"), std::string::npos);
  EXPECT_NE(msg(R"({"$ref": "http://example.com/s.json"})").find("'$ref'"), std::string::npos);
  EXPECT_NE(msg(R"({"type": "number", "multipleOf": 0.5})").find("'multipleOf'"), std::string::npos);
  // Real-world (SchemaStore) shapes: draft-04 `id` and editor annotations are accepted; draft-04
  // tuple `items`, boolean exclusiveMinimum and draft-03 boolean `required` are refused by name.
  EXPECT_TRUE(check_json_schema(J::parse(R"({"id": "http://x/s.json", "type": "object",
      "markdownDescription": "m", "defaultSnippets": [{"body": {}}], "properties": {
      "id": {"type": "string", "deprecationMessage": "d", "enumDescriptions": []}}})"))
                  .is_ok());
  EXPECT_NE(msg(R"({"type": "object", "id": {"type": "string"}})").find("'id'"), std::string::npos);
  EXPECT_NE(msg(R"({"type": "array", "items": [{"type": "string"}]})").find("'items'"), std::string::npos);
  EXPECT_NE(msg(R"({"type": "number", "minimum": 0, "exclusiveMinimum": true})").find("'exclusiveMinimum'"),
            std::string::npos);
  EXPECT_NE(msg(R"({"type": "object", "properties": {"a": {"type": "string", "required": true}}})")
                .find("'required' at /properties/a"),
            std::string::npos);
  EXPECT_NE(msg(R"({"type": "array", "minItems": 1.5})").find("'minItems'"), std::string::npos);
  // A required name missing from properties would never be written; a false property schema.
  EXPECT_NE(msg(R"({"type": "object", "properties": {"upsteam": {}}, "required": ["upstream"]})")
                .find("'required' at / names 'upstream'"),
            std::string::npos);
  EXPECT_NE(msg(R"({"type": "object", "properties": {"a": {}, "b": false}})").find("'properties' at / gives 'b'"),
            std::string::npos);
}

// xgrammar's regex warnings become refusals that name the keyword holding the regex.
TEST(Grammar, RegexWarningsNameTheKeyword) {
  Vocab v = load(kStories);
  auto p = v.engine->compile({ConstraintSpec::Kind::kJsonSchema,
                              R"({"type": "object", "properties": {"d": {"type": "string", "pattern": "^in$|^out$"}}})"});
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("'pattern' at /properties/d"), std::string::npos) << p.status().message();
  auto q = v.engine->compile({ConstraintSpec::Kind::kJsonSchema,
                              R"({"type": "object", "patternProperties": {"^(?!@@)[a-z]+$": {"type": "integer"}}})"});
  ASSERT_FALSE(q.is_ok());
  EXPECT_NE(q.status().message().find("'patternProperties' at /"), std::string::npos) << q.status().message();
}


// Compile limits (issue 47): each is named with the value found, real shapes pass.
TEST(Grammar, CompileLimits) {
  GrammarLimits lim;
  auto msg = [&](ConstraintSpec::Kind k, const std::string& text) { return check_grammar_limits({k, text}, lim).message(); };
  using K = ConstraintSpec::Kind;
  const std::string big(200000, 'a');
  EXPECT_NE(msg(K::kGbnf, "root ::= \"" + big + "\"").find("the grammar: 200011 bytes, over the limit of 131072"),
            std::string::npos);
  EXPECT_NE(msg(K::kJsonSchema, R"({"const": ")" + std::string(40000, 'a') + "\"}").find("literal strings"),
            std::string::npos);
  std::string e = R"({"enum": [)";
  for (int i = 0; i < 3000; ++i) e += (i ? ",\"" : "\"") + std::to_string(i) + "\"";
  EXPECT_NE(msg(K::kJsonSchema, e + "]}").find("enum values together: 3000, over the limit of 2048"), std::string::npos);
  std::string rep;
  for (int i = 0; i < 40; ++i) rep += "[a-z]?";
  EXPECT_NE(msg(K::kJsonSchema, R"({"properties": {"x": {"type": "string", "pattern": ")" + rep + "\"}}}")
                .find("'pattern' at /properties/x has too many optional or repeated parts"),
            std::string::npos);
  // Properties add up over objects; so do formats.
  std::string objs = R"({"type": "object", "properties": {)";
  for (int o = 0; o < 3; ++o) {
    objs += (o ? ",\"o" : "\"o") + std::to_string(o) + R"(": {"type": "object", "properties": {)";
    for (int i = 0; i < 200; ++i) objs += (i ? ",\"p" : "\"p") + std::to_string(i) + R"(": {"type": "integer"})";
    objs += "}}";
  }
  EXPECT_NE(msg(K::kJsonSchema, objs + "}}").find("properties of all the schema's objects together: 603, over the limit of 512"),
            std::string::npos)
      << msg(K::kJsonSchema, objs + "}}");
  std::string fmts = R"({"type": "object", "properties": {)";
  for (int i = 0; i < 40; ++i) fmts += (i ? ",\"e" : "\"e") + std::to_string(i) + R"(": {"type": "string", "format": "email"})";
  EXPECT_NE(msg(K::kJsonSchema, fmts + "}}").find("'format' keywords together: 33, over the limit of 32"), std::string::npos);
  // A repeated group counts its parts once per repetition.
  EXPECT_NE(msg(K::kJsonSchema, R"({"type": "string", "pattern": "([a-z]{2,5}\\.){1,40}"})").find("'pattern' at /"),
            std::string::npos);
  EXPECT_TRUE(check_grammar_limits({K::kJsonSchema, R"({"type": "string", "pattern": "([a-z]{2,5}\\.){1,10}"})"}, lim).is_ok());
  std::string opt;
  for (int i = 0; i < 40; ++i) opt += "[a-z]? ";
  EXPECT_NE(msg(K::kGbnf, "root ::= a\na ::= " + opt).find("rule 'a' has too many"), std::string::npos);
  // Optional parts, escaped or in classes, are not parts; a long regular pattern passes.
  EXPECT_TRUE(check_grammar_limits({K::kGbnf, R"(root ::= "a?b*c+" [?*+]{0,3} "\"?")"}, lim).is_ok());
  const char* semver =
      R"({"type": "string", "pattern": "^(0|[1-9]\\d*)\\.(0|[1-9]\\d*)\\.(0|[1-9]\\d*)(?:-((?:0|[1-9]\\d*|\\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\\.(?:0|[1-9]\\d*|\\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\\+([0-9a-zA-Z-]+(?:\\.[0-9a-zA-Z-]+)*))?$"})";
  EXPECT_TRUE(check_grammar_limits({K::kJsonSchema, semver}, lim).is_ok()) << msg(K::kJsonSchema, semver);
  // A structural tag's schemas count like any schema.
  EXPECT_NE(msg(K::kStructuralTag, R"({"type": "structural_tag", "format": {"type": "tag", "begin": "<a>", "end": "</a>",
      "content": {"type": "json_schema", "json_schema": {"type": "string", "pattern": ")" + rep + "\"}}}}")
                .find("'pattern' at /"),
            std::string::npos);
}

// Compiles run concurrently on the engine's threads: an abandoned wait returns at once, a
// warning of one compile never turns up in another's result.
TEST(Grammar, CompilesAreConcurrentAndAbandonable) {
  Vocab v = load(kStories);
  std::atomic<bool> stop{false};
  std::thread warner([&] {
    // Refused schemas (xgrammar warns): their warnings must stay theirs.
    for (int i = 0; !stop.load(); ++i) {
      auto r = v.engine->compile({ConstraintSpec::Kind::kJsonSchema,
                                  R"({"type": "string", "pattern": "^a)" + std::to_string(i) + R"($|^b$"})"});
      EXPECT_FALSE(r.is_ok());
    }
  });
  for (int i = 0; i < 50; ++i) {
    auto c = v.engine->compile({ConstraintSpec::Kind::kJsonSchema,
                                R"({"type": "object", "properties": {"k)" + std::to_string(i) + R"(": {"type": "integer"}}})"});
    EXPECT_TRUE(c.is_ok()) << c.status().message();
  }
  stop = true;
  warner.join();
  // An abandoned wait ends with kCancelled at once.
  const auto t0 = std::chrono::steady_clock::now();
  auto a = v.engine->compile({ConstraintSpec::Kind::kGbnf, R"(root ::= "abandoned" [a-z]*)"}, {[] { return true; }});
  ASSERT_FALSE(a.is_ok());
  EXPECT_EQ(a.status().code(), StatusCode::kCancelled);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
}

}  // namespace
}  // namespace larder::runtime
