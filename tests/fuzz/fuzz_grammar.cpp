// fuzz_grammar — constrained-decoding compilation (runtime/grammar.cpp over xgrammar) the way a
// request reaches it: input byte 0 picks the kind — a JSON schema (parsed, then
// check_json_schema, then compiled, as api_constraints.cpp does), a GBNF grammar, an xgrammar
// structural tag (tool calls) — and the rest is its text. A compiled grammar then drives a
// matcher for a few steps over the vocabulary of stories260K (512 tokens: compiles stay cheap).
// Inputs are bounded by scripts/fuzz.sh's -max_len: a grammar's compile time grows with its size.
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "fuzz_util.h"
#include "larder/runtime/grammar.h"
#include "larder/runtime/loaded_model.h"
#include "larder/server/http_server.h"
#include "larder/server/transport.h"

using namespace larder;

namespace {

struct Setup {
  std::unique_ptr<runtime::LoadedModel> model;
  std::unique_ptr<runtime::GrammarEngine> engine;
};

Setup load() {
  fuzz::quiet();
  runtime::LoadOptions lo;
  lo.weights = false;
  auto m = runtime::load_model(fuzz::shared_dir() + "/models/stories260K/stories260K.gguf", lo);
  if (!m.is_ok()) {
    std::fprintf(stderr, "fuzz_grammar: %s\n", m.status().to_string().c_str());
    std::abort();
  }
  Setup s;
  s.model = std::move(*m);
  const auto& tok = *s.model->tokenizer;
  s.engine = std::make_unique<runtime::GrammarEngine>(tok, tok.vocab_size(), tok.eos_ids(), 8ll << 20);
  return s;
}

}  // namespace

Setup s;

// Loading runs before libFuzzer's per-input timer starts.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  s = load();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  runtime::ConstraintSpec spec;
  switch (data[0] % 4) {
    case 0: spec.kind = runtime::ConstraintSpec::Kind::kJsonSchema; spec.strict = true; break;
    case 1: spec.kind = runtime::ConstraintSpec::Kind::kJsonSchema; spec.strict = false; break;
    case 2: spec.kind = runtime::ConstraintSpec::Kind::kGbnf; break;
    default: spec.kind = runtime::ConstraintSpec::Kind::kStructuralTag; break;
  }
  spec.text.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  if (spec.kind == runtime::ConstraintSpec::Kind::kJsonSchema) {
    // The server refuses bodies nested deeper than kMaxJsonDepth before parsing them.
    if (server::json_nesting_depth(spec.text, server::kMaxJsonDepth) > server::kMaxJsonDepth) return 0;
    const auto schema = nlohmann::ordered_json::parse(spec.text, nullptr, false);
    if (schema.is_discarded() || !runtime::check_json_schema(schema).is_ok()) return 0;
  }
  auto c = s.engine->compile(spec);
  if (!c.is_ok()) return 0;
  const int64_t vocab = s.model->tokenizer->vocab_size();
  runtime::ConstraintMatcher m(*c);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (int step = 0; step < 8 && !m.terminated(); ++step) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    m.mask(logits.data(), vocab);
    const auto allowed = m.allowed(vocab);
    for (int32_t id : allowed)
      if (id < 0 || id >= vocab || std::isinf(logits[static_cast<size_t>(id)])) std::abort();  // mask and allowed agree
    if (allowed.empty()) break;
    const int32_t pick = allowed[(size + static_cast<size_t>(step)) % allowed.size()];
    if (!m.accept(pick)) std::abort();  // an allowed token is accepted
  }
  return 0;
}
