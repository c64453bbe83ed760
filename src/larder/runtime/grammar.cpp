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
      const std::string msg = "[grammar] cannot be enforced exactly: " + first_warning(warn);
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
  for (int64_t w = 0; w * 32 < n; ++w) {
    const uint32_t bits = static_cast<uint32_t>(bitmask_[static_cast<size_t>(w)]);
    if (bits == 0xffffffffu) continue;
    const int64_t end = std::min<int64_t>(n, w * 32 + 32);
    for (int64_t id = w * 32; id < end; ++id)
      if (!((bits >> (id - w * 32)) & 1u)) logits[id] = neg;
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

bool is_annotation(const std::string& k) {
  static const std::set<std::string> kAnn = {"title",   "description", "default",  "examples", "deprecated",
                                             "readOnly", "writeOnly",  "$comment", "$schema",  "$id",
                                             "$anchor", "example"};
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
    if (is_annotation(k)) continue;
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
      if (is_annotation(k) || k == exclusive || k == "$defs" || k == "definitions") continue;
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
