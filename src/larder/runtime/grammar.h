// grammar.h — constrained decoding (issue 15): a token-level matcher over the model's vocabulary
// that masks every token which cannot continue a valid output (a JSON schema, any JSON object, a
// GBNF grammar, or a structural tag for tool calls).
//
// The engine underneath is xgrammar (Apache-2.0, built from its pinned PyPI sdist by
// scripts/build_xgrammar.sh). This file is the only place that includes it, so the rest of
// larder sees three types:
//   GrammarEngine      one per loaded model: the vocabulary exported to xgrammar (built lazily, on
//                      the first constrained request), the compiler with its cache of compiled
//                      grammars (bytes-capped) and a few compile threads of its own. compile() is
//                      called by the HTTP worker that parses the request, never the engine thread,
//                      so one client's huge schema never stalls other streams.
//   Constraint         a compiled grammar, immutable and shared by every sequence that uses it.
//   ConstraintMatcher  one per sequence: mask() before sampling, accept() after.
//
// The vocabulary is given to xgrammar as raw bytes per token (Tokenizer::token_bytes: byte-level
// BPE pieces decoded, SentencePiece `▁` as a space, byte-fallback `<0xNN>` as its byte), so both
// tokenizer families meet the grammar as the text they produce. Special/control tokens get "" —
// xgrammar never allows those — except the EOS ids, which it allows only where the grammar is
// complete, and the control tokens the engine is told a structural tag may require by id
// (GrammarTokens::control: harmony's header markers, runtime/tool_grammar.h). Those get
// kControlMark and their name: bytes no JSON, regex or GBNF character class accepts (0xFF is never
// UTF-8), so they are never text there — but xgrammar's free-text element (any_text with
// excludes, triggered_tags) does accept them, so a grammar over a vocabulary with control tokens
// keeps its free regions token-level (any_tokens, which excludes them by id).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "larder/core/status.h"
#include "larder/tokenizer/tokenizer.h"

namespace larder::runtime {

// What a special token's bytes start with in the vocabulary xgrammar sees (see above).
inline constexpr std::string_view kControlMark = "\xff";

struct ConstraintSpec {
  enum class Kind {
    kJsonSchema,     // text: a JSON schema (checked by check_json_schema first)
    kJsonValue,      // any JSON value (text unused)
    kGbnf,           // text: a GBNF / EBNF grammar, root rule `root`
    kStructuralTag,  // text: an xgrammar structural tag (tool calls)
  };
  Kind kind = Kind::kJsonSchema;
  std::string text;
  // kJsonSchema: no properties or items beyond those the schema names (OpenAI's strict: true).
  // Always valid against the schema; off for "any object" ({"type": "object"} would allow only {}).
  bool strict = true;
};

// Bounds on one compile (issue 47). xgrammar's compile cannot be interrupted, and its time and
// memory grow with the grammar (a 300 KB literal took 9-29 s, a 10 MB one 2 GB; an object with
// 4000 optional properties minutes): every input is measured before it is compiled, so whatever
// is accepted compiles in about a second on one core. The values come from the measurements in
// docs/server-api.md §4.5; SchemaStore's schemas (tests/server/schema_corpus.py) stay well inside.
struct GrammarLimits {
  size_t text_bytes = 128u << 10;      // the grammar / schema / structural-tag text
  size_t literal_bytes = 32u << 10;    // strings spelled out: GBNF literals, const/enum values,
                                       // property names, structural-tag begin/end (all together)
  size_t enum_values = 2048;           // enum values (all enums together)
  size_t schema_nodes = 1024;          // objects and arrays in a schema
  size_t properties = 256;             // properties of one object schema ...
  size_t total_properties = 512;       // ... and of all of them together
  size_t formats = 32;                 // `format` keywords (email, uri: a large regex each)
  int schema_depth = 128;              // JSON nesting of a schema (two levels per nested property)
  size_t pattern_bytes = 1024;         // one regex (pattern, patternProperties key)
  size_t regex_quantifiers = 32;       // optional/repeated parts (?, *, +, {m,n}) of one regex or
                                       // GBNF rule, a regex group's counted repetitions each again
  size_t quantifier_cost = 1024;       // the sum of q² over every regex / rule with q such parts
  int compile_ms = 10000;              // a request stops waiting for its compile after this (400)
  int threads = 2;                     // compiles run at once; more wait in a queue ...
  int queued = 32;                     // ... of this length (beyond: kResourceExhausted)
};

// The token ids a grammar treats other than as text.
struct GrammarTokens {
  std::vector<int32_t> eos;      // end generation: allowed only where the grammar is complete
  std::vector<int32_t> control;  // special tokens a structural tag's token element may require
};

// How a caller waits for its compile.
struct CompileWait {
  // Polled while waiting; true: stop waiting (the client left, the server drains). The compile
  // already started runs to its end on a compile thread and its result is dropped.
  std::function<bool()> abandon;
};

struct ConstraintImpl;
class Constraint {
 public:
  explicit Constraint(std::unique_ptr<ConstraintImpl> impl);
  ~Constraint();
  const ConstraintImpl& impl() const { return *impl_; }
  double compile_ms() const { return compile_ms_; }
  void set_compile_ms(double ms) { compile_ms_ = ms; }

 private:
  std::unique_ptr<ConstraintImpl> impl_;
  double compile_ms_ = 0;
};

struct GrammarEngineImpl;
class GrammarEngine {
 public:
  // `model_vocab`: the logits row length (may exceed the tokenizer's vocabulary: padding rows are
  // never allowed). `eos_ids`: the tokens that end generation.
  GrammarEngine(const tokenizer::Tokenizer& tok, int64_t model_vocab, std::vector<int32_t> eos_ids,
                int64_t cache_bytes = 256ll << 20, GrammarLimits limits = {})
      : GrammarEngine(tok, model_vocab, GrammarTokens{std::move(eos_ids), {}}, cache_bytes, limits) {}
  GrammarEngine(const tokenizer::Tokenizer& tok, int64_t model_vocab, GrammarTokens tokens,
                int64_t cache_bytes = 256ll << 20, GrammarLimits limits = {});
  ~GrammarEngine();
  GrammarEngine(const GrammarEngine&) = delete;
  GrammarEngine& operator=(const GrammarEngine&) = delete;

  // Thread-safe; independent compiles run concurrently (up to limits.threads), on the engine's
  // compile threads, while the caller waits. Errors: invalid_argument with the grammar's problem
  // (a GBNF syntax error, a schema xgrammar cannot represent, a schema keyword it would ignore,
  // a limit exceeded — named with its value, a compile longer than limits.compile_ms);
  // resource_exhausted when limits.queued compiles already wait; cancelled when wait.abandon said so.
  Result<std::shared_ptr<const Constraint>> compile(const ConstraintSpec& spec, const CompileWait& wait = {});

  const GrammarLimits& limits() const { return limits_; }

  // The raw bytes xgrammar sees for each token id (tests).
  const std::vector<std::string>& vocabulary();

 private:
  void init();
  const tokenizer::Tokenizer& tok_;
  int64_t vocab_;
  std::vector<int32_t> eos_, control_;
  int64_t cache_bytes_;
  GrammarLimits limits_;
  std::once_flag once_;
  std::unique_ptr<GrammarEngineImpl> impl_;
};

struct MatcherImpl;
class ConstraintMatcher {
 public:
  explicit ConstraintMatcher(std::shared_ptr<const Constraint> c);
  ~ConstraintMatcher();
  ConstraintMatcher(ConstraintMatcher&&) noexcept;

  // Sets logits[id] = -inf for every id the grammar forbids next. `vocab` is the row length.
  void mask(float* logits, int64_t vocab);
  // The allowed ids next (tests, debugging).
  std::vector<int32_t> allowed(int64_t vocab);
  // Advances over a sampled token; false when the grammar forbids it (the matcher is unchanged).
  bool accept(int32_t id);
  // The grammar may end here (an EOS would be accepted).
  bool can_end() const;
  // An EOS was accepted: nothing more may follow.
  bool terminated() const;
  // Undoes the last n accepted tokens (speculation, hold-back that turns out to be rejected).
  void rollback(int n);

 private:
  std::unique_ptr<MatcherImpl> impl_;
  std::vector<int32_t> bitmask_;
};

// JSON Schema keywords larder cannot enforce are refused, never silently ignored: the error
// names the keyword and where it is (e.g. "uniqueItems at /properties/tags"). Annotations
// (title, description, examples, ...) and `x-` extensions are accepted and have no effect.
Status check_json_schema(const nlohmann::ordered_json& schema);

// The size checks compile() makes before compiling (GrammarLimits): invalid_argument naming the
// limit and the value found.
Status check_grammar_limits(const ConstraintSpec& spec, const GrammarLimits& limits);

}  // namespace larder::runtime
