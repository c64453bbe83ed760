#include "larder/runtime/grammar.h"

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <iostream>
#include <limits>
#include <set>
#include <sstream>
#include <streambuf>
#include <thread>
#include <unordered_map>

#include <xgrammar/xgrammar.h>

#include "larder/core/log.h"

namespace larder::runtime {

struct ConstraintImpl {
  xgrammar::CompiledGrammar compiled;
};

namespace {

// The compile threads. A compile cannot be interrupted, so it never runs on the thread of the
// request that asked for it: that thread waits and may walk away (client gone, deadline), while
// the compile runs to its end here and its result is dropped. A few threads, so independent
// compiles run side by side (a trivial schema never waits behind a heavy one) but a flood of
// them cannot take every core; a bounded queue behind them.
class CompileThreads {
 public:
  CompileThreads(int threads, size_t queued) : queued_(queued) {
    for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { run(); });
  }
  // Joins: every compile is bounded by GrammarLimits, so this waits about a second at most.
  ~CompileThreads() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
      q_.clear();
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  // false: `queued` tasks already wait.
  bool post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_ || q_.size() >= queued_) return false;
      q_.push_back(std::move(fn));
    }
    cv_.notify_one();
    return true;
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !q_.empty(); });
        if (stop_) return;
        fn = std::move(q_.front());
        q_.pop_front();
      }
      fn();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  size_t queued_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

struct GrammarEngineImpl {
  // xgrammar caches what it compiled, warnings or not, so a refused spec would compile silently
  // the second time: refusals are remembered here (spec key → message), bounded.
  std::mutex refused_mu;
  std::unordered_map<std::string, std::string> refused;
  std::vector<std::string> vocab;
  std::optional<xgrammar::TokenizerInfo> info;
  std::optional<xgrammar::GrammarCompiler> compiler;
  std::unique_ptr<CompileThreads> threads;  // last member: joined before the compiler goes
};

struct MatcherImpl {
  xgrammar::GrammarMatcher m;
  int vocab = 0;
};

Constraint::Constraint(std::unique_ptr<ConstraintImpl> impl) : impl_(std::move(impl)) {}
Constraint::~Constraint() = default;

GrammarEngine::GrammarEngine(const tokenizer::Tokenizer& tok, int64_t model_vocab, GrammarTokens tokens,
                             int64_t cache_bytes, GrammarLimits limits)
    : tok_(tok),
      vocab_(model_vocab),
      eos_(std::move(tokens.eos)),
      control_(std::move(tokens.control)),
      cache_bytes_(cache_bytes),
      limits_(limits) {}
GrammarEngine::~GrammarEngine() = default;

namespace {
void install_cerr_router();
}  // namespace

void GrammarEngine::init() {
  std::call_once(once_, [this] {
    install_cerr_router();
    auto impl = std::make_unique<GrammarEngineImpl>();
    const int64_t n = std::min<int64_t>(vocab_, tok_.vocab_size());
    impl->vocab.resize(static_cast<size_t>(n));
    for (int32_t id = 0; id < n; ++id) {
      // Special/control tokens (and EOS, which xgrammar handles by id) are "": never text. A
      // named control token is kControlMark and its name, which a token element can require by
      // id (grammar.h).
      if (std::find(eos_.begin(), eos_.end(), id) != eos_.end()) continue;
      if (std::find(control_.begin(), control_.end(), id) != control_.end())
        impl->vocab[static_cast<size_t>(id)] = std::string(kControlMark) + tok_.id_to_token(id);
      else if (!tok_.is_special(id))
        impl->vocab[static_cast<size_t>(id)] = tok_.token_bytes(id);
    }
    std::vector<int32_t> stops;
    for (int32_t e : eos_)
      if (e >= 0 && e < vocab_) stops.push_back(e);
    impl->info.emplace(impl->vocab, xgrammar::VocabType::RAW, static_cast<int>(vocab_), stops, false);
    // One thread per compile: compiles already run side by side (limits.threads of them), and
    // the host has few cores that decoding needs too.
    impl->compiler.emplace(*impl->info, 1, true, cache_bytes_);
    impl->threads = std::make_unique<CompileThreads>(limits_.threads, static_cast<size_t>(std::max(0, limits_.queued)));
    impl_ = std::move(impl);
  });
}

const std::vector<std::string>& GrammarEngine::vocabulary() {
  init();
  return impl_->vocab;
}

namespace {

// xgrammar reports a schema keyword it ignores (uniqueItems, allOf with several schemas, oneOf it
// cannot prove disjoint, minLength beside a pattern, ...) only as a warning on std::cerr, written
// by the thread that converts the schema. Those warnings are exactly the "silently ignored" cases,
// so a conversion runs with that thread's std::cerr output captured and any warning turns into a
// refusal. std::cerr is process-wide and compiles run concurrently: its buffer is replaced once
// by a router that sends a capturing thread's writes to that thread's buffer and everything else
// to the original stream (larder itself logs through stdio, not std::cerr).
class CerrRouter : public std::streambuf {
 public:
  explicit CerrRouter(std::streambuf* orig) : orig_(orig) {}
  static thread_local std::string* capture;

 protected:
  int overflow(int c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    const char ch = static_cast<char>(c);
    return xsputn(&ch, 1) == 1 ? c : traits_type::eof();
  }
  std::streamsize xsputn(const char* p, std::streamsize n) override {
    if (capture) {
      capture->append(p, static_cast<size_t>(n));
      return n;
    }
    std::lock_guard<std::mutex> l(mu_);
    return orig_->sputn(p, n);
  }
  int sync() override {
    if (capture) return 0;
    std::lock_guard<std::mutex> l(mu_);
    return orig_->pubsync();
  }

 private:
  std::streambuf* orig_;
  std::mutex mu_;
};
thread_local std::string* CerrRouter::capture = nullptr;

void install_cerr_router() {
  static std::once_flag once;
  // Never uninstalled (nor freed): std::cerr outlives every engine.
  std::call_once(once, [] { std::cerr.rdbuf(new CerrRouter(std::cerr.rdbuf())); });
}

template <typename F>
auto with_captured_cerr(std::string* captured, F&& f) {
  std::string buf;
  CerrRouter::capture = &buf;
  struct Restore {
    ~Restore() { CerrRouter::capture = nullptr; }
  } restore;
  auto r = f();
  *captured = std::move(buf);
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

namespace {

// An xgrammar error without its "[hh:mm:ss] /path/file.cc:123: " prefix and trailing newline: the
// client gets the problem, not where in xgrammar's sources it was noticed.
std::string xgrammar_message(std::string what) {
  if (!what.empty() && what[0] == '[') {
    const size_t close = what.find("] ");
    const size_t colon = close == std::string::npos ? close : what.find(": ", close + 2);
    if (colon != std::string::npos) what = what.substr(colon + 2);
  }
  if (what.rfind("Warning: ", 0) == 0) what = what.substr(9);
  while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
  return what;
}

// The compile itself, on a compile thread.
Result<std::shared_ptr<Constraint>> compile_now(GrammarEngineImpl& impl, const ConstraintSpec& spec,
                                                const std::string& key) {
  try {
    std::string warn;
    xgrammar::CompiledGrammar cg = [&]() -> xgrammar::CompiledGrammar {
      switch (spec.kind) {
        case ConstraintSpec::Kind::kJsonValue:
          return impl.compiler->CompileBuiltinJSONGrammar();
        case ConstraintSpec::Kind::kGbnf: {
          xgrammar::Grammar g = with_captured_cerr(&warn, [&] { return xgrammar::Grammar::FromEBNF(spec.text); });
          return impl.compiler->CompileGrammar(g);
        }
        case ConstraintSpec::Kind::kStructuralTag:
          return with_captured_cerr(&warn, [&] { return impl.compiler->CompileStructuralTag(spec.text); });
        case ConstraintSpec::Kind::kJsonSchema:
        default:
          // Compact JSON (", " and ": ", no free whitespace): a small model given free
          // whitespace can spend its whole budget on newlines.
          return with_captured_cerr(&warn, [&] {
            return impl.compiler->CompileJSONSchema(spec.text, false, std::nullopt, std::nullopt, spec.strict);
          });
      }
    }();
    if (!warn.empty()) {
      std::string msg = "[grammar] cannot be enforced exactly: " + first_warning(warn);
      if (spec.kind == ConstraintSpec::Kind::kJsonSchema) msg = name_regex_keyword(spec.text, msg);
      std::lock_guard<std::mutex> l(impl.refused_mu);
      if (impl.refused.size() >= 4096) impl.refused.clear();
      impl.refused.emplace(key, msg);
      return Status(StatusCode::kInvalidArgument, msg);
    }
    return std::make_shared<Constraint>(std::make_unique<ConstraintImpl>(ConstraintImpl{std::move(cg)}));
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kInvalidArgument, "[grammar] the grammar is too large to compile (out of memory)");
  } catch (const std::exception& e) {
    return Status(StatusCode::kInvalidArgument, "[grammar] " + xgrammar_message(e.what()));
  }
}

// One compile handed to the compile threads; shared by the waiting caller and the thread, so a
// caller that walks away leaves the thread a place to drop its result.
struct CompileJob {
  std::mutex mu;
  std::condition_variable cv;
  bool started = false, done = false;
  bool abandoned = false;  // nobody waits: not started yet → skipped
  std::optional<Result<std::shared_ptr<Constraint>>> result;
};

}  // namespace

Result<std::shared_ptr<const Constraint>> GrammarEngine::compile(const ConstraintSpec& spec, const CompileWait& wait) {
  using Clock = std::chrono::steady_clock;
  init();
  const auto t0 = Clock::now();
  const std::string key = strfmt("%d/%d/", static_cast<int>(spec.kind), spec.strict ? 1 : 0) + spec.text;
  {
    std::lock_guard<std::mutex> l(impl_->refused_mu);
    auto it = impl_->refused.find(key);
    if (it != impl_->refused.end()) return Status(StatusCode::kInvalidArgument, it->second);
  }
  if (Status st = check_grammar_limits(spec, limits_); !st.is_ok()) return st;
  const Status abandoned(StatusCode::kCancelled,
                         "[grammar] the compile was abandoned (the client left or the server is stopping)");
  // A caller already gone never takes a compile thread.
  if (wait.abandon && wait.abandon()) return abandoned;
  auto job = std::make_shared<CompileJob>();
  GrammarEngineImpl* impl = impl_.get();  // outlives the threads (GrammarEngineImpl::threads)
  const bool posted = impl_->threads->post([impl, job, spec, key] {
    {
      std::lock_guard<std::mutex> l(job->mu);
      if (job->abandoned) return;
      job->started = true;
    }
    auto r = compile_now(*impl, spec, key);
    std::lock_guard<std::mutex> l(job->mu);
    job->result.emplace(std::move(r));
    job->done = true;
    job->cv.notify_all();
  });
  if (!posted)
    return Status(StatusCode::kResourceExhausted,
                  strfmt("[grammar] %d grammar compiles are already waiting (the limit); retry shortly", limits_.queued));
  const auto deadline = t0 + std::chrono::milliseconds(limits_.compile_ms);
  std::unique_lock<std::mutex> l(job->mu);
  while (!job->done) {
    if (wait.abandon) {
      l.unlock();
      const bool gone = wait.abandon();
      l.lock();
      if (gone) {  // even if the result arrived meanwhile: nobody is there to use it
        job->abandoned = true;
        return abandoned;
      }
      if (job->done) break;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      job->abandoned = true;
      if (!job->started)
        return Status(StatusCode::kResourceExhausted,
                      strfmt("[grammar] the grammar compilers are busy (no compile started within %d ms); retry shortly",
                             limits_.compile_ms));
      return Status(StatusCode::kInvalidArgument,
                    strfmt("[grammar] the grammar did not compile within %d ms (the compile time limit); make it smaller",
                           limits_.compile_ms));
    }
    job->cv.wait_for(l, std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(20)));
  }
  auto r = std::move(*job->result);
  if (!r.is_ok()) return r.status();
  (*r)->set_compile_ms(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  return std::shared_ptr<const Constraint>(std::move(*r));
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

// ------------------------------------------------------------------ compile limits (issue 47)

namespace {

Status over(const std::string& what, size_t found, size_t limit, const char* unit) {
  return Status(StatusCode::kInvalidArgument,
                strfmt("[grammar] %s: %zu%s, over the limit of %zu%s (larger grammars take too long to compile)",
                       what.c_str(), found, unit, limit, unit));
}

std::string where(const std::string& at) { return at.empty() ? std::string("/") : at; }

// What a grammar asks of the compiler, counted while walking it.
struct Tally {
  const GrammarLimits& lim;
  size_t literal = 0, enums = 0, nodes = 0, properties = 0, formats = 0;
  double parts_cost = 0;  // the sum of q² over regexes / GBNF rules with q optional or repeated parts
  // One regex or GBNF rule with q optional or repeated parts. Its compile time grows about as
  // q^2.7 ([a-z]? 32 times: 0.55 s as a pattern, 1.1 s as a GBNF rule, 151k vocabulary), and
  // adds up over regexes and rules.
  Status add_parts(double q, const std::string& what) {
    if (q > static_cast<double>(lim.regex_quantifiers))
      return over(what + " has too many optional or repeated parts (?, *, +, {m,n})",
                  static_cast<size_t>(q), lim.regex_quantifiers, "");
    parts_cost += q * q;
    if (parts_cost > static_cast<double>(lim.quantifier_cost))
      return over("the optional or repeated parts of all regexes / rules (q² summed over each with q of them)",
                  static_cast<size_t>(parts_cost), lim.quantifier_cost, "");
    return Status::ok();
  }
  Status add_literal(size_t n) {
    literal += n;
    if (literal > lim.literal_bytes)
      return over("the literal strings (const and enum values, property names, GBNF strings) together", literal,
                  lim.literal_bytes, " bytes");
    return Status::ok();
  }
};

// A regex's cost to xgrammar is its optional and repeated parts, each repetition of a group
// counted again ("([a-z]{2,5}\.){1,100}" is 100 of them; "(([a-z]{1,3}){1,100}){1,100}" ran for
// minutes). Classes and escapes are skipped; a counted repetition of one character or class is one.
Status check_regex(const std::string& re, const std::string& what, Tally& t) {
  const GrammarLimits& lim = t.lim;
  if (re.size() > lim.pattern_bytes) return over(what, re.size(), lim.pattern_bytes, " bytes");
  // Per open group: the quantifiers counted inside it so far.
  std::vector<double> groups{0};
  double last_group = -1;  // the count of the group that just closed (-1: the last atom was no group)
  for (size_t i = 0; i < re.size(); ++i) {
    const char c = re[i];
    double atom = -1;
    if (c == '\\') {
      ++i;
    } else if (c == '[') {
      for (++i; i < re.size() && re[i] != ']'; ++i)
        if (re[i] == '\\') ++i;
    } else if (c == '(') {
      groups.push_back(0);
      continue;
    } else if (c == ')' && groups.size() > 1) {
      atom = groups.back();
      groups.pop_back();
      groups.back() += atom;
    } else if (c == '?' || c == '*' || c == '+') {
      if (i > 0 && re[i - 1] == '(') continue;  // (?: (?= ...
      groups.back() += 1;
    } else if (c == '{') {
      const size_t close = re.find('}', i);
      unsigned long hi = 0;
      bool counted = close != std::string::npos;
      for (size_t j = i + 1; counted && j < close; ++j) {
        if (std::isdigit(static_cast<unsigned char>(re[j]))) continue;
        if (re[j] != ',') counted = false;
      }
      if (counted) {
        const std::string body = re.substr(i + 1, close - i - 1);
        const size_t comma = body.find(',');
        const std::string a = body.substr(0, comma), b = comma == std::string::npos ? a : body.substr(comma + 1);
        hi = std::strtoul((b.empty() ? a : b).c_str(), nullptr, 10);
        // The repeated group's quantifiers count once per repetition, plus this one.
        groups.back() += 1 + (last_group > 0 ? last_group * static_cast<double>(std::max(1ul, hi) - 1) : 0);
        i = close;
      }
    }
    last_group = atom;
    double total = 0;
    for (double g : groups) total += g;
    if (total > static_cast<double>(lim.regex_quantifiers)) return t.add_parts(total, what);  // early: never overflows
  }
  double total = 0;
  for (double g : groups) total += g;
  return t.add_parts(total, what);
}

Status tally_schema(const nlohmann::ordered_json& s, const std::string& at, int depth, Tally& t) {
  if (!s.is_object() && !s.is_array()) return Status::ok();
  if (++t.nodes > t.lim.schema_nodes) return over("the schema's objects and arrays", t.nodes, t.lim.schema_nodes, "");
  if (depth > t.lim.schema_depth)
    return over("the schema's nesting at " + where(at), static_cast<size_t>(depth), static_cast<size_t>(t.lim.schema_depth), " levels");
  if (s.is_array()) {
    for (size_t i = 0; i < s.size(); ++i) {
      Status st = tally_schema(s[i], strfmt("%s/%zu", at.c_str(), i), depth + 1, t);
      if (!st.is_ok()) return st;
    }
    return Status::ok();
  }
  for (const auto& [k, v] : s.items()) {
    const std::string here = at + "/" + k;
    if (k == "const") {
      if (Status st = t.add_literal(v.dump().size()); !st.is_ok()) return st;
      continue;  // a value, not a schema
    }
    if (k == "enum") {
      if (v.is_array()) {
        t.enums += v.size();
        if (t.enums > t.lim.enum_values) return over("the schema's enum values together", t.enums, t.lim.enum_values, "");
        for (const auto& e : v)
          if (Status st = t.add_literal(e.dump().size()); !st.is_ok()) return st;
      }
      continue;
    }
    if (k == "default" || k == "examples" || k == "example") continue;  // annotations: never compiled
    if (k == "properties" && v.is_object()) {
      if (v.size() > t.lim.properties) return over("'properties' at " + where(at), v.size(), t.lim.properties, " properties");
      t.properties += v.size();
      if (t.properties > t.lim.total_properties)
        return over("the properties of all the schema's objects together", t.properties, t.lim.total_properties, "");
      for (const auto& [name, sub] : v.items())
        if (Status st = t.add_literal(name.size() + 2); !st.is_ok()) return st;
    }
    if (k == "format" && v.is_string() && ++t.formats > t.lim.formats)
      return over("the schema's 'format' keywords together", t.formats, t.lim.formats, "");
    if (k == "pattern" && v.is_string()) {
      if (Status st = check_regex(v.get<std::string>(), "'pattern' at " + where(at), t); !st.is_ok()) return st;
      continue;
    }
    if (k == "patternProperties" && v.is_object())
      for (const auto& [re, sub] : v.items())
        if (Status st = check_regex(re, "'patternProperties' at " + where(at), t); !st.is_ok()) return st;
    if (Status st = tally_schema(v, here, depth + 1, t); !st.is_ok()) return st;
  }
  return Status::ok();
}

// A structural tag: its fixed strings are literals, its json_schema contents schemas.
Status tally_tag(const nlohmann::ordered_json& v, int depth, Tally& t) {
  if (depth > t.lim.schema_depth)
    return over("the structural tag's nesting", static_cast<size_t>(depth), static_cast<size_t>(t.lim.schema_depth), " levels");
  if (v.is_array()) {
    for (const auto& e : v)
      if (Status st = tally_tag(e, depth + 1, t); !st.is_ok()) return st;
  }
  if (!v.is_object()) return Status::ok();
  for (const auto& [k, c] : v.items()) {
    if (k == "json_schema") {
      if (Status st = tally_schema(c, "", 1, t); !st.is_ok()) return st;
    } else if (c.is_string()) {
      if (k == "pattern" || k == "regex") {
        if (Status st = check_regex(c.get<std::string>(), "the structural tag's " + k, t); !st.is_ok()) return st;
      } else if (k != "type") {
        if (Status st = t.add_literal(c.get<std::string>().size()); !st.is_ok()) return st;
      }
    } else if (Status st = tally_tag(c, depth + 1, t); !st.is_ok()) {
      return st;
    }
  }
  return Status::ok();
}

// A GBNF grammar: the bytes of its quoted strings and the optional/repeated parts of each rule
// (character classes and comments skipped).
Status tally_gbnf(const std::string& g, Tally& t) {
  size_t lit = 0;
  double parts = 0;
  std::string rule = "the grammar";
  auto end_rule = [&]() { return t.add_parts(parts, rule); };
  for (size_t i = 0; i < g.size(); ++i) {
    const char c = g[i];
    if (c == '#') {
      while (i < g.size() && g[i] != '\n') ++i;
    } else if (c == '[') {
      for (++i; i < g.size() && g[i] != ']'; ++i)
        if (g[i] == '\\') ++i;
    } else if (c == '"') {
      for (++i; i < g.size() && g[i] != '"'; ++i) {
        if (g[i] == '\\') ++i;
        ++lit;
      }
    } else if (c == '?' || c == '*' || c == '+' || c == '{') {
      parts += 1;
      if (c == '{')
        while (i < g.size() && g[i] != '}') ++i;
    } else if (g.compare(i, 3, "::=") == 0) {
      if (Status st = end_rule(); !st.is_ok()) return st;
      parts = 0;
      // The rule's name: the word before "::=".
      size_t e = i;
      while (e > 0 && g[e - 1] == ' ') --e;
      size_t b = e;
      while (b > 0 && !std::isspace(static_cast<unsigned char>(g[b - 1]))) --b;
      rule = "the grammar's rule '" + g.substr(b, std::min<size_t>(e - b, 64)) + "'";
      i += 2;
    }
  }
  if (Status st = end_rule(); !st.is_ok()) return st;
  return t.add_literal(lit);
}

}  // namespace

Status check_grammar_limits(const ConstraintSpec& spec, const GrammarLimits& lim) {
  static const char* kText[] = {"the JSON schema", "", "the grammar", "the structural tag"};
  if (spec.kind == ConstraintSpec::Kind::kJsonValue) return Status::ok();
  const char* what = kText[static_cast<int>(spec.kind)];
  if (spec.text.size() > lim.text_bytes) return over(what, spec.text.size(), lim.text_bytes, " bytes");
  Tally t{lim};
  if (spec.kind == ConstraintSpec::Kind::kGbnf) return tally_gbnf(spec.text, t);
  // Invalid JSON is left to the compiler, which says where it is.
  const auto j = nlohmann::ordered_json::parse(spec.text, nullptr, false);
  if (j.is_discarded()) return Status::ok();
  return spec.kind == ConstraintSpec::Kind::kJsonSchema ? tally_schema(j, "", 1, t) : tally_tag(j, 1, t);
}

}  // namespace larder::runtime
