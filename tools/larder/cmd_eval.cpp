// larder eval ppl MODEL --text FILE [--ctx 512] [--chunks N] [-t T] [--json]
// larder eval kl BASE CANDIDATE --text FILE [--ctx 512] [--chunks N] [-t T] [--json] [--no-sanity]
// Quality measurement for quantized models (design/quantization.md §10): the text is tokenized
// with the (base) model's tokenizer as one stream, BOS first when the tokenizer adds one (as
// llama-perplexity tokenizes), cut into non-overlapping chunks (first token → BOS), and the
// second half of each chunk is scored. Running estimates go to stderr as llama-perplexity prints them, the
// summary (or one JSON object) to stdout.
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "larder/core/mmap_file.h"
#include "larder/core/threadpool.h"
#include "larder/runtime/eval.h"
#include "larder/runtime/page_in.h"
#include "larder/runtime/loaded_model.h"
#include "larder/tokenizer/tokenizer.h"
#include "larder/core/progress.h"
#include "generation_setup.h"
#include "kv_dtype_flag.h"
#include "model_arg.h"
#include "validators.h"
#include "verbs.h"

namespace larder::cli {

namespace {

struct EvalFlags {
  std::string model, candidate, text;
  ModelArg model_arg;  // eval ppl's MODEL
  int64_t ctx = 512, chunks = 0;
  int threads = 0;
  bool json = false, no_sanity = false;
  KvDtypeFlags kv;
  std::vector<std::string> lora;  // ppl: the model's adapters; kl: the candidate's
};

// Both models of an eval load with the KV dtype of the flags (f16 by default, as llama.cpp's
// llama-perplexity does).
Result<std::unique_ptr<runtime::LoadedModel>> load_for_eval(const std::string& path, const EvalFlags& f) {
  LARDER_ASSIGN_OR_RETURN(DType dt, kv_dtype_of(f.kv));
  runtime::LoadOptions lo;
  lo.kv_dtype = dt;
  lo.map_mode = map_mode(f.model_arg);
  return runtime::load_model(path, lo);
}

// The evaluation text, bounded before it is read (/dev/zero must end in a message): with
// --chunks N only N chunks of --ctx tokens are scored, so no more than they can hold is read (the
// rest of a longer text is never used); without, at most kMaxTextBytes.
Result<std::string> read_text(const EvalFlags& f) {
  const std::string& path = f.text;
  TextLimit limit;
  const bool bounded = f.chunks > 0 && f.ctx > 0 && f.chunks <= static_cast<int64_t>(kMaxTextBytes) / f.ctx;
  if (bounded) {
    limit = text_limit_for_context(f.chunks * f.ctx);
  } else {
    limit.why = strfmt("larder reads at most %llu MiB of text (--chunks N reads only the beginning N chunks need)",
                       static_cast<unsigned long long>(kMaxTextBytes >> 20));
  }
  auto r = read_text_input(path, limit, "eval", /*allow_truncate=*/bounded);
  if (!r) return r.status();
  if (r->truncated) {
    std::fprintf(stderr, "larder: reading the first %llu bytes of '%s': %lld chunks of %lld tokens need no more\n",
                 static_cast<unsigned long long>(limit.max_bytes), path.c_str(), static_cast<long long>(f.chunks),
                 static_cast<long long>(f.ctx));
  }
  std::string s = std::move(r->text);
  if (s.find_first_not_of(" \t\r\n") == std::string::npos) {
    return invalid_argument(strfmt("[eval] text file '%s' is empty", path.c_str()));
  }
  return s;
}

Status check_ctx(const EvalFlags& f, const runtime::LoadedModel& m, const std::string& path) {
  if (f.ctx < 2) {
    return invalid_argument(strfmt("[eval] --ctx %lld is too small: scoring needs at least 2 tokens per chunk",
                                   static_cast<long long>(f.ctx)));
  }
  const int64_t max_ctx = m.model->info().max_context;
  if (max_ctx > 0 && f.ctx > max_ctx) {
    return invalid_argument(strfmt("[eval] --ctx %lld exceeds the context of %s (%lld tokens)",
                                   static_cast<long long>(f.ctx), path.c_str(), static_cast<long long>(max_ctx)));
  }
  return Status::ok();
}

struct Prepared {
  std::vector<std::vector<int32_t>> chunks;
  int64_t stream_tokens = 0;
  std::optional<int32_t> bos;
};

Result<Prepared> prepare(const EvalFlags& f, const runtime::LoadedModel& m) {
  LARDER_ASSIGN_OR_RETURN(std::string text, read_text(f));
  Prepared p;
  runtime::EvalStream stream = runtime::make_eval_stream(*m.tokenizer, text);
  p.stream_tokens = static_cast<int64_t>(stream.ids.size());
  p.bos = stream.bos;
  auto chunks = runtime::make_eval_chunks(stream.ids, f.ctx, f.chunks, p.bos);
  if (!chunks.is_ok()) {
    return Status(chunks.status().code(), chunks.status().message() + " (text '" + f.text + "')");
  }
  p.chunks = std::move(*chunks);
  return p;
}

// On a terminal a bar with the running value; otherwise llama-perplexity's running line
// "[1]12.3456,[2]11.9876,..." on stderr.
runtime::EvalProgressFn progress_line(bool kl) {
  if (Progress::style_for(stderr) == Progress::Style::kBar) {
    auto bar = std::make_shared<ProgressSteps>(kl ? "eval kl" : "eval ppl");
    return [kl, bar](const runtime::EvalProgress& p) {
      bar->step(static_cast<size_t>(p.chunk), static_cast<size_t>(p.n_chunks),
                strfmt("%s %.4f", kl ? "KL" : "PPL", kl ? p.kl_mean : p.ppl));
      if (p.chunk == p.n_chunks) bar->finish();
    };
  }
  return [kl](const runtime::EvalProgress& p) {
    std::fprintf(stderr, "[%lld]%.4f%s", static_cast<long long>(p.chunk), kl ? p.kl_mean : p.ppl,
                 p.chunk == p.n_chunks ? "\n" : ",");
    std::fflush(stderr);
  };
}

int run_ppl(const EvalFlags& f) {
  if (f.threads > 0) default_pool().set_threads(f.threads);
  auto loaded = load_for_eval(f.model, f);
  if (!loaded.is_ok()) return report(loaded.status());
  runtime::LoadedModel& m = **loaded;
  auto loras = load_run_loras(f.lora, m);
  if (!loras.is_ok()) return report(loras.status());
  if (Status st = check_ctx(f, m, f.model); !st.is_ok()) return report(st);
  runtime::page_in_weights(m.files.tensors());
  auto prep = prepare(f, m);
  if (!prep.is_ok()) return report(prep.status());
  std::fprintf(stderr, "larder: perplexity of %s over %zu chunks of %lld tokens (%lld in the text, BOS %s)\n",
               f.model.c_str(), prep->chunks.size(), static_cast<long long>(f.ctx),
               static_cast<long long>(prep->stream_tokens), prep->bos ? "overwritten" : "not added");
  auto r = runtime::eval_perplexity(*m.model, prep->chunks, progress_line(false), loras->request.forward);
  if (!r.is_ok()) return report(r.status());
  if (f.json) {
    nlohmann::ordered_json j = {{"model", f.model}, {"text", f.text}, {"ctx", f.ctx},
                                {"chunks", r->n_chunks}, {"text_tokens", prep->stream_tokens},
                                {"bos", prep->bos ? nlohmann::ordered_json(*prep->bos) : nlohmann::ordered_json()},
                                {"n_tokens", r->n_tokens}, {"ppl", r->ppl}, {"ppl_err", r->ppl_err},
                                {"mean_nll", r->mean_nll}, {"nll_se", r->nll_se}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("PPL = %.4f +/- %.4f  (%lld tokens scored in %lld chunks of %lld, mean NLL %.6f)\n", r->ppl, r->ppl_err,
              static_cast<long long>(r->n_tokens), static_cast<long long>(r->n_chunks), static_cast<long long>(f.ctx),
              r->mean_nll);
  return 0;
}

nlohmann::ordered_json sanity_json(const runtime::SanityResult& s) {
  nlohmann::ordered_json prompts = nlohmann::ordered_json::array();
  for (const auto& p : s.prompts) {
    prompts.push_back({{"prompt", p.prompt}, {"identical_prefix", p.identical_prefix},
                       {"base_tokens", p.base_tokens.size()}, {"cand_tokens", p.cand_tokens.size()},
                       {"collapsed", p.collapsed}, {"base_text", p.base_text}, {"cand_text", p.cand_text}});
  }
  return {{"max_new_tokens", s.max_new_tokens}, {"mean_identical_prefix", s.mean_identical_prefix},
          {"base_short", s.base_short}, {"cand_short", s.cand_short}, {"collapsed", s.collapsed},
          {"prompts", prompts}};
}

int run_kl(const EvalFlags& f) {
  if (f.threads > 0) default_pool().set_threads(f.threads);
  auto base_l = load_for_eval(f.model, f);
  if (!base_l.is_ok()) return report(base_l.status());
  auto cand_l = load_for_eval(f.candidate, f);
  if (!cand_l.is_ok()) return report(cand_l.status());
  runtime::LoadedModel& base = **base_l;
  runtime::LoadedModel& cand = **cand_l;
  auto loras = load_run_loras(f.lora, cand);
  if (!loras.is_ok()) return report(loras.status());
  const int64_t vb = base.model->info().vocab, vc = cand.model->info().vocab;
  if (vb != vc) {
    return report(incompatible(strfmt("[eval] vocabulary sizes differ: base %s has %lld, candidate %s has %lld",
                                      f.model.c_str(), static_cast<long long>(vb), f.candidate.c_str(),
                                      static_cast<long long>(vc))));
  }
  if (Status st = check_ctx(f, base, f.model); !st.is_ok()) return report(st);
  if (Status st = check_ctx(f, cand, f.candidate); !st.is_ok()) return report(st);
  runtime::page_in_weights(base.files.tensors());
  runtime::page_in_weights(cand.files.tensors());
  auto prep = prepare(f, base);
  if (!prep.is_ok()) return report(prep.status());
  std::fprintf(stderr, "larder: KL(%s || %s) over %zu chunks of %lld tokens (%lld in the text, BOS %s)\n",
               f.model.c_str(), f.candidate.c_str(), prep->chunks.size(), static_cast<long long>(f.ctx),
               static_cast<long long>(prep->stream_tokens), prep->bos ? "overwritten" : "not added");
  auto r = runtime::eval_kl(*base.model, *cand.model, prep->chunks, progress_line(true), loras->request.forward);
  if (!r.is_ok()) return report(r.status());
  std::optional<runtime::SanityResult> sanity;
  if (!f.no_sanity && !f.lora.empty()) {
    std::fprintf(stderr, "larder: the greedy sanity check runs without adapters: skipped with --lora\n");
  } else if (!f.no_sanity) {
    auto s = runtime::eval_sanity(base, cand);
    if (!s.is_ok()) return report(s.status());
    sanity = std::move(*s);
  }
  if (f.json) {
    nlohmann::ordered_json j = {
        {"base", f.model}, {"candidate", f.candidate}, {"text", f.text}, {"ctx", f.ctx},
        {"chunks", r->n_chunks}, {"text_tokens", prep->stream_tokens},
        {"bos", prep->bos ? nlohmann::ordered_json(*prep->bos) : nlohmann::ordered_json()},
        {"n_tokens", r->n_tokens},
        {"kl", {{"mean", r->mean}, {"mean_se", r->mean_se}, {"median", r->median}, {"p90", r->p90},
                {"p99", r->p99}, {"p999", r->p999}, {"max", r->max}}},
        {"top1", r->top1}, {"top1_err", r->top1_err},
        {"ln_ppl_ratio", r->ln_ppl_ratio}, {"mean_dp", r->mean_dp}, {"rms_dp", r->rms_dp},
        {"base_ppl", r->base.ppl}, {"base_ppl_err", r->base.ppl_err},
        {"cand_ppl", r->cand.ppl}, {"cand_ppl_err", r->cand.ppl_err},
        {"sanity", sanity ? sanity_json(*sanity) : nlohmann::ordered_json()}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("scored %lld tokens in %lld chunks of %lld\n", static_cast<long long>(r->n_tokens),
              static_cast<long long>(r->n_chunks), static_cast<long long>(f.ctx));
  std::printf("PPL base      = %.4f +/- %.4f\n", r->base.ppl, r->base.ppl_err);
  std::printf("PPL candidate = %.4f +/- %.4f   ln(PPL_cand/PPL_base) = %.6f\n", r->cand.ppl, r->cand.ppl_err,
              r->ln_ppl_ratio);
  std::printf("KL mean       = %.6f +/- %.6f\n", r->mean, r->mean_se);
  std::printf("KL median     = %.6f   p90 %.6f   p99 %.6f   p99.9 %.6f   max %.6f\n", r->median, r->p90, r->p99,
              r->p999, r->max);
  std::printf("same top-1    = %.3f%% +/- %.3f%%\n", 100 * r->top1, 100 * r->top1_err);
  std::printf("dp correct    = mean %+.5f%%   rms %.5f%%\n", 100 * r->mean_dp, 100 * r->rms_dp);
  if (sanity) {
    std::printf("greedy sanity (%zu prompts, <= %lld tokens): mean identical prefix %.1f, short (<8) base %lld / "
                "candidate %lld, collapsed %lld\n",
                sanity->prompts.size(), static_cast<long long>(sanity->max_new_tokens), sanity->mean_identical_prefix,
                static_cast<long long>(sanity->base_short), static_cast<long long>(sanity->cand_short),
                static_cast<long long>(sanity->collapsed));
    for (const auto& p : sanity->prompts) {
      std::printf("  %-40s prefix %2lld/%zu%s\n", ("\"" + p.prompt.substr(0, p.prompt.find('\n')) + "\"").c_str(),
                  static_cast<long long>(p.identical_prefix), p.base_tokens.size(), p.collapsed ? "  COLLAPSED" : "");
    }
  }
  return 0;
}

void common_options(CLI::App* cmd, EvalFlags& f) {
  cmd->add_option("-f,--file,--text", f.text, "evaluation text file (tokenized as one stream)")->required();
  cmd->add_option("-c,--ctx,--ctx-size", f.ctx, "tokens per chunk (the second half of each is scored)");
  cmd->add_option("--chunks", f.chunks, "evaluate at most this many chunks (default: all)")->check(at_least(0));
  cmd->add_option("-t,--threads", f.threads, "compute threads (default: physical cores)")->check(positive());
  cmd->add_flag("--json", f.json, "machine-readable output");
  add_kv_dtype_flags(cmd, f.kv);
  add_lora_flag(cmd, f.lora);
}

}  // namespace

VerbMain add_eval(CLI::App& app) {
  auto f = std::make_shared<EvalFlags>();
  CLI::App* cmd = app.add_subcommand("eval", "quality measurement: perplexity, KL divergence against a base model");
  cmd->require_subcommand(1);
  CLI::App* ppl = cmd->add_subcommand("ppl", "perplexity of a model on a text (llama.cpp convention)");
  add_model_arg(ppl, f->model_arg, "");
  common_options(ppl, *f);
  CLI::App* kl = cmd->add_subcommand("kl", "KL(base || candidate), top-1 agreement and a greedy sanity check");
  kl->add_option("base", f->model, "reference model (a .gguf file, a directory, a folder of GGUFs or a repo id)")->required();
  kl->add_option("candidate", f->candidate, "candidate (e.g. quantized) model")->required();
  common_options(kl, *f);
  kl->add_flag("--no-sanity", f->no_sanity, "skip the greedy generation sanity check");
  return [f, ppl, kl]() {
    if (Status st = check_lora_specs(f->lora); !st.is_ok()) return report(st);
    if (ppl->parsed()) {
      auto m = resolve_model(f->model_arg);
      if (!m.is_ok()) return report(m.status());
      f->model = m->path;
      return run_ppl(*f);
    }
    if (kl->parsed()) {
      auto base = resolve_model(f->model);
      if (!base.is_ok()) return report(base.status());
      auto cand = resolve_model(f->candidate);
      if (!cand.is_ok()) return report(cand.status());
      f->model = base->path;
      f->candidate = cand->path;
      return run_kl(*f);
    }
    return 2;
  };
}

}  // namespace larder::cli
