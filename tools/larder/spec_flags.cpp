#include "spec_flags.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "larder/runtime/page_in.h"
#include "model_arg.h"
#include "validators.h"

namespace larder::cli {

void add_spec_flags(CLI::App* cmd, SpecFlags& f) {
  cmd->add_option("--spec,--spec-type", f.spec,
                  "speculative decoding: auto = prompt lookup where it is exact (every weight format batch-invariant "
                  "on these kernels; the default), ngram = draft from the prompt and the output so far (prompt "
                  "lookup), draft = with the --draft model, none = off")
      ->check(CLI::IsMember({"auto", "none", "ngram", "ngram-simple", "draft", "draft-simple"}));
  cmd->add_option("--draft,--model-draft,--spec-draft-model", f.draft,
                  "draft model for speculative decoding (llama.cpp's -md): a smaller model with the same tokenizer");
  cmd->add_option("--draft-max,--draft-n,--spec-draft-n-max", f.draft_max,
                  "tokens drafted at most per step (default 16 where speculation is exact at any row count, else "
                  "6); each step drafts the length the measured costs and the acceptance say pays, up to this")
      ->check(in_range(1, 63));
  cmd->add_option("--draft-min,--draft-n-min,--spec-draft-n-min", f.draft_min,
                  "drafts shorter than this are not verified (default 0)")
      ->check(in_range(0, 64));
}

Result<SpecSetup> spec_setup(const SpecFlags& f, const runtime::LoadedModel& target, const runtime::LoadOptions& load) {
  SpecSetup s;
  std::string kind = f.spec == "ngram-simple" ? "ngram" : f.spec == "draft-simple" ? "draft" : f.spec;
  if (!f.draft.empty()) {
    if (kind == "none" || kind == "ngram")
      return invalid_argument(strfmt("[spec] --draft '%s' drafts with a model, but --spec %s says otherwise: drop one "
                                     "of them (--spec draft, or no --spec, goes with --draft)",
                                     f.draft.c_str(), f.spec.c_str()));
    kind = "draft";
  } else if (kind == "draft") {
    return invalid_argument("[spec] --spec draft needs the draft model: --draft MODEL (llama.cpp's -md)");
  }
  if (f.draft_max > 0 && f.draft_min > f.draft_max)
    return invalid_argument(strfmt("[spec] --draft-min %d is above --draft-max %d", f.draft_min, f.draft_max));
  s.requested = kind != "auto";
  std::string why;
  const bool exact = runtime::speculation_exact(*target.model, &why);
  if (kind == "auto") {
    kind = exact ? "ngram" : "none";
    if (!exact) s.off_reason = why;
  }
  s.kind = kind;
  if (kind == "none") return s;
  s.options.draft_max = f.draft_max > 0 ? f.draft_max : exact ? 16 : 6;
  s.options.draft_min = std::min(f.draft_min, s.options.draft_max);
  s.options.cost = std::make_shared<runtime::SpecCost>();  // measured by the drafters' drivers
  if (const char* f = std::getenv("LARDER_SPEC_FORCE"); f && std::string(f) == "1") s.options.force = true;
  if (kind == "draft") {
    // llama.cpp's `--draft N` was the draft length; here --draft is the model (--draft-max N is the length).
    if (!f.draft.empty() && std::all_of(f.draft.begin(), f.draft.end(), [](unsigned char c) { return std::isdigit(c); }))
      return invalid_argument(strfmt("[spec] --draft takes the draft model, not a number ('%s'); the draft length is "
                                     "--draft-max N", f.draft.c_str()));
    auto where = resolve_model(f.draft);
    if (!where.is_ok()) return Status(where.status().code(), "[spec] --draft: " + where.status().message());
    auto loaded = runtime::load_model(where->path, load);
    if (!loaded.is_ok()) return Status(loaded.status().code(), "[spec] --draft: " + loaded.status().message());
    LARDER_RETURN_IF_ERROR(runtime::check_draft_vocab(target, **loaded));
    if (!runtime::speculation_possible((*loaded)->model->new_state(1)))
      return unsupported("[spec] --draft: the draft model has sliding-window or recurrent layers, which cannot take "
                         "a rejected draft back; choose a draft model with full attention only");
    runtime::page_in_weights((*loaded)->files.tensors());  // as the target's: not inside the first draft
    s.draft = std::move(*loaded);
    s.options.draft_model = s.draft->model.get();
    s.options.target_vocab = target.model->info().vocab;
    // Until the first draft is timed (runtime::SpecCost): decode streams the weights once a step,
    // so the draft's bytes over the target's is what a drafted token costs in target steps (an
    // overestimate where the embedding table is its own tensor: a token reads one row of it). A
    // quarter more than that kept the 0.5B/1.5B Qwen2.5-Coder pair from drafting at all.
    s.options.draft_cost = static_cast<double>(s.draft->files.tensors().total_bytes()) /
                           static_cast<double>(std::max<uint64_t>(target.files.tensors().total_bytes(), 1));
    s.note = strfmt("speculation: draft model %s (%s), up to %d tokens a step where the measured costs say it pays",
                    where->id.c_str(), s.draft->model->info().weight_dtypes.c_str(), s.options.draft_max);
  }
  if (s.requested && !exact)
    s.note += (s.note.empty() ? "" : "; ") + std::string("--spec: the output may differ from plain decoding: ") + why +
              " (LARDER_BATCH_INVARIANT=1 makes the AVX-512 integer formats invariant)";
  return s;
}

}  // namespace larder::cli
