#include "larder/runtime/grammar.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <limits>
#include <set>
#include <sstream>
#include <unordered_map>

#include <xgrammar/xgrammar.h>

#include "larder/core/log.h"

namespace larder::runtime {

struct ConstraintImpl {
  xgrammar::CompiledGrammar compiled;
};

struct GrammarEngineImpl {
  // xgrammar caches what it compiled, warnings or not, so a refused spec would compile silently
  // the second time: refusals are remembered here (spec key → message), bounded.
  std::mutex refused_mu;
  std::unordered_map<std::string, std::string> refused;
  std::vector<std::string> vocab;
  std::optional<xgrammar::TokenizerInfo> info;
  std::optional<xgrammar::GrammarCompiler> compiler;
};

struct MatcherImpl {
  xgrammar::GrammarMatcher m;
  int vocab = 0;
};

Constraint::Constraint(std::unique_ptr<ConstraintImpl> impl) : impl_(std::move(impl)) {}
Constraint::~Constraint() = default;

GrammarEngine::GrammarEngine(const tokenizer::Tokenizer& tok, int64_t model_vocab, std::vector<int32_t> eos_ids,
                             int64_t cache_bytes)
    : tok_(tok), vocab_(model_vocab), eos_(std::move(eos_ids)), cache_bytes_(cache_bytes) {}
GrammarEngine::~GrammarEngine() = default;

void GrammarEngine::init() {
  std::call_once(once_, [this] {
    auto impl = std::make_unique<GrammarEngineImpl>();
    const int64_t n = std::min<int64_t>(vocab_, tok_.vocab_size());
    impl->vocab.resize(static_cast<size_t>(n));
    for (int32_t id = 0; id < n; ++id) {
      // Special/control tokens (and EOS, which xgrammar handles by id) are "": never text.
      if (tok_.is_special(id) || std::find(eos_.begin(), eos_.end(), id) != eos_.end()) continue;
      impl->vocab[static_cast<size_t>(id)] = tok_.token_bytes(id);
    }
    std::vector<int32_t> stops;
    for (int32_t e : eos_)
      if (e >= 0 && e < vocab_) stops.push_back(e);
    impl->info.emplace(impl->vocab, xgrammar::VocabType::RAW, static_cast<int>(vocab_), stops, false);
    // Two threads: the host has few cores, and compiles run beside decoding.
    impl->compiler.emplace(*impl->info, 2, true, cache_bytes_);
    impl_ = std::move(impl);
  });
}

const std::vector<std::string>& GrammarEngine::vocabulary() {
  init();
  return impl_->vocab;
}

namespace {

// xgrammar reports a schema keyword it ignores (uniqueItems, allOf with several schemas, oneOf it
// cannot prove disjoint, minLength beside a pattern, ...) only as a warning on std::cerr. Those
// warnings are exactly the "silently ignored" cases, so a conversion runs with std::cerr captured
// and any warning turns into a refusal. std::cerr is process-wide: one capture at a time (larder
// itself logs through stdio, not std::cerr).
std::mutex g_cerr_mu;

template <typename F>
auto with_captured_cerr(std::string* captured, F&& f) {
  std::lock_guard<std::mutex> l(g_cerr_mu);
  std::ostringstream buf;
  std::streambuf* old = std::cerr.rdbuf(buf.rdbuf());
  struct Restore {
    std::streambuf* old;
    ~Restore() { std::cerr.rdbuf(old); }
  } restore{old};
  auto r = f();
  *captured = buf.str();
  return r;
}

// The message of an xgrammar warning line ("[time] file:line: message").
std::string first_warning(const std::string& captured) {
  std::string line = captured.substr(0, captured.find('\n'));
  const size_t colon = line.find(": ");
  if (line.rfind('[', 0) == 0 && colon != std::string::npos) line = line.substr(colon + 2);
  return line;
}

// Where a regex occurs in a schema: "pattern at /x" or "patternProperties at /y" ("" if nowhere).
std::string find_regex(const nlohmann::ordered_json& s, const std::string& re, const std::string& at) {
  if (s.is_array()) {
    for (size_t i = 0; i < s.size(); ++i) {
      std::string r = find_regex(s[i], re, strfmt("%s/%zu", at.c_str(), i));
      if (!r.empty()) return r;
    }
  }
  if (!s.is_object()) return {};
  if (s.contains("pattern") && s["pattern"].is_string() && s["pattern"].get<std::string>() == re)
    return "'pattern' at " + (at.empty() ? std::string("/") : at);
  if (s.contains("patternProperties") && s["patternProperties"].is_object() && s["patternProperties"].contains(re))
    return "'patternProperties' at " + (at.empty() ? std::string("/") : at);
  for (const auto& [k, v] : s.items()) {
    std::string r = find_regex(v, re, at + "/" + k);
    if (!r.empty()) return r;
  }
  return {};
}

// xgrammar's regex warnings ("... is ignored in regex: RE") name the regex, not the keyword:
// the refusal names the keyword holding it, like every other refusal.
std::string name_regex_keyword(const std::string& schema_text, const std::string& msg) {
  // The two shapes: "... is ignored in regex: RE" and "... in the middle of regex is ignored: RE".
  if (msg.find("regex") == std::string::npos) return msg;
  size_t p = msg.find("in regex: ");
  size_t skip = 10;
  if (p == std::string::npos) {
    p = msg.find("is ignored: ");
    skip = 12;
  }
  if (p == std::string::npos) return "JSON schema keyword 'pattern': " + msg;
  const std::string re = msg.substr(p + skip);
  const auto schema = nlohmann::ordered_json::parse(schema_text, nullptr, false);
  std::string where = schema.is_discarded() ? std::string() : find_regex(schema, re, "");
  if (where.empty()) where = "'pattern'";
  return "JSON schema keyword " + where + ": " + msg;
}

}  // namespace

Result<std::shared_ptr<const Constraint>> GrammarEngine::compile(const ConstraintSpec& spec) {
  init();
  const auto t0 = std::chrono::steady_clock::now();
  const std::string key = strfmt("%d/%d/", static_cast<int>(spec.kind), spec.strict ? 1 : 0) + spec.text;
  {
    std::lock_guard<std::mutex> l(impl_->refused_mu);
    auto it = impl_->refused.find(key);
    if (it != impl_->refused.end()) return Status(StatusCode::kInvalidArgument, it->second);
  }
  try {
    std::string warn;
    xgrammar::CompiledGrammar cg = [&]() -> xgrammar::CompiledGrammar {
      switch (spec.kind) {
        case ConstraintSpec::Kind::kJsonValue:
          return impl_->compiler->CompileBuiltinJSONGrammar();
        case ConstraintSpec::Kind::kGbnf: {
          xgrammar::Grammar g = with_captured_cerr(&warn, [&] { return xgrammar::Grammar::FromEBNF(spec.text); });
          return impl_->compiler->CompileGrammar(g);
        }
        case ConstraintSpec::Kind::kStructuralTag:
          return with_captured_cerr(&warn, [&] { return impl_->compiler->CompileStructuralTag(spec.text); });
        case ConstraintSpec::Kind::kJsonSchema:
        default:
          // Compact JSON (", " and ": ", no free whitespace): a small model given free
          // whitespace can spend its whole budget on newlines.
          return with_captured_cerr(&warn, [&] {
            return impl_->compiler->CompileJSONSchema(spec.text, false, std::nullopt, std::nullopt, spec.strict);
          });
      }
    }();
    if (!warn.empty()) {
      std::string msg = "[grammar] cannot be enforced exactly: " + first_warning(warn);
      if (spec.kind == ConstraintSpec::Kind::kJsonSchema) msg = name_regex_keyword(spec.text, msg);
      std::lock_guard<std::mutex> l(impl_->refused_mu);
      if (impl_->refused.size() >= 4096) impl_->refused.clear();
      impl_->refused.emplace(key, msg);
      return Status(StatusCode::kInvalidArgument, msg);
    }
    auto c = std::make_shared<Constraint>(std::make_unique<ConstraintImpl>(ConstraintImpl{std::move(cg)}));
    c->set_compile_ms(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    return std::shared_ptr<const Constraint>(std::move(c));
  } catch (const std::exception& e) {
    std::string what = e.what();
    while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
    return Status(StatusCode::kInvalidArgument, "[grammar] " + what);
  }
}

ConstraintMatcher::ConstraintMatcher(std::shared_ptr<const Constraint> c) {
  const xgrammar::CompiledGrammar& cg = c->impl().compiled;
  impl_ = std::make_unique<MatcherImpl>(MatcherImpl{xgrammar::GrammarMatcher(cg), cg.GetTokenizerInfo().GetVocabSize()});
  bitmask_.assign(static_cast<size_t>(xgrammar::GetBitmaskSize(impl_->vocab)), 0);
}
ConstraintMatcher::~ConstraintMatcher() = default;
ConstraintMatcher::ConstraintMatcher(ConstraintMatcher&&) noexcept = default;

namespace {
DLTensor bitmask_tensor(std::vector<int32_t>& bits, int64_t* shape) {
  DLTensor t{};
  t.data = bits.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = xgrammar::GetBitmaskDLType();
  shape[0] = static_cast<int64_t>(bits.size());
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  return t;
}
}  // namespace

void ConstraintMatcher::mask(float* logits, int64_t vocab) {
  int64_t shape[1];
  DLTensor t = bitmask_tensor(bitmask_, shape);
  if (!impl_->m.FillNextTokenBitmask(&t)) return;  // everything allowed
  const float neg = -std::numeric_limits<float>::infinity();
  const int64_t n = std::min<int64_t>(vocab, impl_->vocab);
  // Per 32-token word: all allowed is skipped, all forbidden is a plain fill (the common case in
  // a JSON grammar: after `{` only a quote may follow), only mixed words go bit by bit. On a
  // 151k vocabulary this is the difference between ~150k branches and ~5k.
  for (int64_t w = 0; w * 32 < n; ++w) {
    const uint32_t bits = static_cast<uint32_t>(bitmask_[static_cast<size_t>(w)]);
    if (bits == 0xffffffffu) continue;
    const int64_t end = std::min<int64_t>(n, w * 32 + 32);
    float* row = logits + w * 32;
    if (bits == 0) {
      std::fill(row, logits + end, neg);
      continue;
    }
    for (uint32_t off = ~bits; off != 0; off &= off - 1) {
      const int64_t id = w * 32 + __builtin_ctz(off);
      if (id < end) logits[id] = neg;
    }
  }
  for (int64_t id = n; id < vocab; ++id) logits[id] = neg;  // rows beyond the grammar's vocabulary
}

std::vector<int32_t> ConstraintMatcher::allowed(int64_t vocab) {
  std::vector<float> l(static_cast<size_t>(vocab), 0.0f);
  mask(l.data(), vocab);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < vocab; ++i)
    if (std::isfinite(l[static_cast<size_t>(i)])) out.push_back(static_cast<int32_t>(i));
  return out;
}

bool ConstraintMatcher::accept(int32_t id) {
  if (id < 0 || id >= impl_->vocab) return false;
  return impl_->m.AcceptToken(id);
}
bool ConstraintMatcher::can_end() const { return impl_->m.IsCompleted(); }
bool ConstraintMatcher::terminated() const { return impl_->m.IsTerminated(); }
void ConstraintMatcher::rollback(int n) { impl_->m.Rollback(n); }

// ------------------------------------------------------------------ JSON Schema keyword check

namespace {

// Keywords that never constrain a value: the spec's annotations, identifiers (draft-04's `id` as
// a string), and the editor annotations real-world schemas carry (SchemaStore's schemas are
// written for VS Code's JSON language service: markdownDescription, defaultSnippets, ...).
bool is_annotation(const std::string& k, const nlohmann::ordered_json& v) {
  static const std::set<std::string> kAnn = {
      "title",         "description",        "default",         "examples",          "deprecated",
      "readOnly",      "writeOnly",          "$comment",        "$schema",           "$id",
      "$anchor",       "example",            "markdownDescription", "deprecationMessage", "errorMessage",
      "enumDescriptions", "markdownEnumDescriptions", "defaultSnippets", "doNotSuggest", "suggestSortText",
      "allowComments", "allowTrailingCommas", "enumItemLabels"};
  if (k == "id") return v.is_string();
  return kAnn.count(k) || k.rfind("x-", 0) == 0;
}

// Keywords whose subschemas must be checked too, and how they hold them.
Status walk(const nlohmann::ordered_json& s, const std::string& at);

Status walk_map(const nlohmann::ordered_json& m, const std::string& at, const char* kw) {
  if (!m.is_object()) return Status(StatusCode::kInvalidArgument, strfmt("%s at %s must be an object", kw, at.empty() ? "/" : at.c_str()));
  for (const auto& [k, v] : m.items()) {
    Status st = walk(v, at + "/" + kw + "/" + k);
    if (!st.is_ok()) return st;
  }
  return Status::ok();
}

Status walk_list(const nlohmann::ordered_json& a, const std::string& at, const char* kw) {
  if (!a.is_array()) return Status(StatusCode::kInvalidArgument, strfmt("%s at %s must be an array", kw, at.empty() ? "/" : at.c_str()));
  for (size_t i = 0; i < a.size(); ++i) {
    Status st = walk(a[i], strfmt("%s/%s/%zu", at.c_str(), kw, i));
    if (!st.is_ok()) return st;
  }
  return Status::ok();
}

Status refuse(const std::string& kw, const std::string& at, const std::string& why) {
  return Status(StatusCode::kInvalidArgument,
                strfmt("JSON schema keyword '%s' at %s %s", kw.c_str(), at.empty() ? "/" : at.c_str(), why.c_str()));
}

Status walk(const nlohmann::ordered_json& s, const std::string& at) {
  if (s.is_boolean()) return Status::ok();
  if (!s.is_object()) return Status(StatusCode::kInvalidArgument, strfmt("the schema at %s must be an object or a boolean", at.empty() ? "/" : at.c_str()));
  // Enforced keywords (xgrammar's JSON-schema converter honours them).
  static const std::set<std::string> kEnforced = {
      "type",          "properties",       "required",         "additionalProperties", "items",
      "prefixItems",   "enum",             "const",            "minItems",             "maxItems",
      "anyOf",         "oneOf",            "allOf",            "$ref",                 "$defs",
      "definitions",   "pattern",          "format",           "minLength",            "maxLength",
      "minimum",       "maximum",          "exclusiveMinimum", "exclusiveMaximum",     "minProperties",
      "maxProperties", "patternProperties", "propertyNames",   "multipleOf"};
  static const std::set<std::string> kFormats = {"date-time", "date", "time", "duration", "email", "hostname",
                                                 "ipv4",      "ipv6", "uuid", "uri",      "uri-reference"};
  // xgrammar picks one of these and ignores the siblings; allowed siblings are listed.
  static const char* kExclusive[] = {"const", "enum", "anyOf", "oneOf", "allOf", "$ref"};
  for (const auto& [k, v] : s.items()) {
    if (is_annotation(k, v)) continue;
    if (!kEnforced.count(k)) {
      if (k == "unevaluatedProperties" || k == "unevaluatedItems") {
        if (v.is_boolean() && !v.get<bool>()) continue;  // strict mode already means false
      }
      return refuse(k, at, "is not supported by constrained decoding (it would not be enforced)");
    }
  }
  std::string exclusive;
  for (const char* k : kExclusive) {
    if (!s.contains(k)) continue;
    if (!exclusive.empty()) return refuse(k, at, "cannot be combined with '" + exclusive + "' in one schema");
    exclusive = k;
  }
  if (!exclusive.empty()) {
    for (const auto& [k, v] : s.items()) {
      if (is_annotation(k, v) || k == exclusive || k == "$defs" || k == "definitions") continue;
      if (k == "type" && (exclusive == "const" || exclusive == "enum")) continue;  // values carry their type
      return refuse(k, at, "beside '" + exclusive + "' is not supported (it would not be enforced)");
    }
  }
  if (s.contains("allOf") && (!s["allOf"].is_array() || s["allOf"].size() != 1))
    return refuse("allOf", at, "with more than one schema is not supported");
  if (s.contains("format")) {
    if (!s["format"].is_string()) return refuse("format", at, "must be a string");
    const std::string f = s["format"].get<std::string>();
    if (!kFormats.count(f)) return refuse("format", at, "'" + f + "' is not a supported format");
  }
  if ((s.contains("pattern") || s.contains("format")) && (s.contains("minLength") || s.contains("maxLength")))
    return refuse(s.contains("minLength") ? "minLength" : "maxLength", at,
                  std::string("beside '") + (s.contains("pattern") ? "pattern" : "format") + "' is not supported");
  if (s.contains("multipleOf")) {
    const auto& t = s.contains("type") ? s["type"] : nlohmann::ordered_json();
    if (!(t.is_string() && t.get<std::string>() == "integer") || !s["multipleOf"].is_number_integer())
      return refuse("multipleOf", at, "is supported only as an integer on type integer");
  }
  if (s.contains("type")) {
    const auto& t = s["type"];
    static const std::set<std::string> kTypes = {"string", "number", "integer", "boolean", "object", "array", "null"};
    auto ok = [&](const nlohmann::ordered_json& x) { return x.is_string() && kTypes.count(x.get<std::string>()); };
    bool good = ok(t);
    if (t.is_array()) {
      good = !t.empty();
      for (const auto& x : t) good = good && ok(x);
    }
    if (!good) return refuse("type", at, "must be one of string, number, integer, boolean, object, array, null (or a list of them)");
  }
  if (s.contains("$ref")) {
    if (!s["$ref"].is_string()) return refuse("$ref", at, "must be a string");
    const std::string r = s["$ref"].get<std::string>();
    if (r != "#" && r.rfind("#/", 0) != 0) return refuse("$ref", at, "'" + r + "' is not a local reference (#/...)");
  }
  for (const char* kw : {"properties", "$defs", "definitions", "patternProperties"})
    if (s.contains(kw)) {
      Status st = walk_map(s[kw], at, kw);
      if (!st.is_ok()) return st;
    }
  for (const char* kw : {"anyOf", "oneOf", "allOf", "prefixItems"})
    if (s.contains(kw)) {
      Status st = walk_list(s[kw], at, kw);
      if (!st.is_ok()) return st;
    }
  // Draft-04's boolean exclusiveMinimum/exclusiveMaximum and draft-03's boolean `required` mean
  // something else than the numbers/arrays of today's drafts: refused, not misread.
  for (const char* kw : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
    if (s.contains(kw) && !s[kw].is_number())
      return refuse(kw, at, "must be a number (the draft-04 boolean form is not supported)");
  for (const char* kw : {"minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties"})
    if (s.contains(kw) && !(s[kw].is_number_integer() || s[kw].is_number_unsigned()))
      return refuse(kw, at, "must be a non-negative integer");
  if (s.contains("required") && !s["required"].is_array())
    return refuse("required", at, "must be an array of property names (the draft-03 boolean form is not supported)");
  // xgrammar writes only the properties it knows: a required name missing from `properties` would
  // never be written (the answer would fail `required`), and a property whose schema is `false`
  // is rejected by its converter. Both refused here, by name.
  if (s.contains("required") && s["required"].is_array()) {
    for (const auto& r : s["required"]) {
      if (!r.is_string()) return refuse("required", at, "must list property names (strings)");
      const std::string name = r.get<std::string>();
      if (!s.contains("properties") || !s["properties"].is_object() || !s["properties"].contains(name))
        return refuse("required", at, "names '" + name + "', which is not among the properties (it would never be written)");
    }
  }
  if (s.contains("properties") && s["properties"].is_object())
    for (const auto& [k, v] : s["properties"].items())
      if (v.is_boolean() && !v.get<bool>())
        return refuse("properties", at, "gives '" + k + "' the schema false (leave the property out instead)");
  if (s.contains("items") && s["items"].is_array())
    return refuse("items", at, "as an array of schemas (the draft-04 tuple form) is not supported; use prefixItems");
  for (const char* kw : {"items", "additionalProperties", "propertyNames"})
    if (s.contains(kw)) {
      Status st = walk(s[kw], at + "/" + kw);
      if (!st.is_ok()) return st;
    }
  return Status::ok();
}

}  // namespace

Status check_json_schema(const nlohmann::ordered_json& schema) { return walk(schema, ""); }

}  // namespace larder::runtime
