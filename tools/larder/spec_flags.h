// spec_flags.h — the speculative-decoding flags of `generate`, `chat`, `serve` and `bench`
// (runtime/speculative.h), with llama.cpp's spellings as aliases, and what they resolve to once
// the target model is loaded: the drafter options, the draft model (loaded and checked against
// the target's vocabulary) and the line that tells the user what runs.
//
// `--spec auto` (the default) is prompt lookup where it is exact — every weight format of the
// model batch-invariant on the running kernels (runtime::speculation_exact) — and off elsewhere;
// per sequence it also needs a state that trims back (no rings or recurrent layers). An explicit
// `--spec ngram` or `--draft MODEL` runs whatever the kernels, with a warning when the output may
// then differ from plain decoding.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "larder/runtime/loaded_model.h"
#include "larder/runtime/speculative.h"

namespace larder::cli {

struct SpecFlags {
  std::string spec = "auto";  // auto | none | ngram | draft (ngram-simple, draft-simple: llama.cpp's)
  std::string draft;          // --draft / -md / --model-draft / --spec-draft-model: the draft model
  // 0: 16 where every format is batch-invariant on the running kernels (speculation_exact: any
  // row count gives one-row decode's logits), else 6 — k + 1 = 7 rows per verify, the most whose
  // logits equal one-row decode on GGUF integer formats without LARDER_BATCH_INVARIANT=1 (the
  // multi-row GEMM path starts at 8 rows; bench/RESULTS.md). The cost model picks the length
  // under it each step.
  int draft_max = 0;
  int draft_min = 0;
};

void add_spec_flags(CLI::App* cmd, SpecFlags& f);

struct SpecSetup {
  runtime::SpecOptions options;                   // draft_max 0: off
  std::unique_ptr<runtime::LoadedModel> draft;    // with --draft; options.draft_model points into it
  bool requested = false;                         // asked for by flag (not --spec auto)
  std::string kind;                               // "none", "ngram", "draft"
  std::string note;        // for stderr / the log: what runs, or why it may differ ("" = nothing to say)
  std::string off_reason;  // --spec auto resolved to none: why (for --verbose logs and bench)
};

// Resolves the flags against the loaded target: loads and checks the draft model (`load` as the
// target's: kv dtype, map mode), applies the auto rule. Errors: --spec draft without --draft,
// --draft with --spec none or ngram, a draft model that does not load or whose vocabulary is not
// the target's.
Result<SpecSetup> spec_setup(const SpecFlags& f, const runtime::LoadedModel& target, const runtime::LoadOptions& load);

}  // namespace larder::cli
