// larder generate MODEL --prompt TEXT [-n N] [--temp T] [--top-p P] [--top-k K] [--seed S]
//                 [--chat] [--system TEXT] ...
// The continuation only goes to stdout, streamed as produced (whole UTF-8 characters, nothing
// of a stop string); load/prefill/decode statistics go to stderr.
#include <cstdio>
#include <optional>

#include "larder/core/cpuid.h"
#include "larder/core/threadpool.h"
#include "larder/memory/store/kv_store.h"
#include "larder/runtime/generate.h"
#include "larder/runtime/kv_identity.h"
#include "larder/runtime/fit.h"
#include "larder/runtime/page_in.h"
#include "larder/runtime/loaded_model.h"
#include "larder/runtime/text_stream.h"
#include "larder/tokenizer/tokenizer.h"
#include "verbs.h"

namespace larder::cli {

namespace {

struct GenerateFlags {
  std::string model, prompt, system;
  bool chat = false;
  int64_t n = 256;
  std::optional<float> temp, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
  std::optional<int> top_k;
  uint64_t seed = 0;
  int threads = 0;
  int64_t ctx = 0;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool show_prompt = false;
  std::string ssd_cache;
  double ssd_cache_max_gb = 32;
  double prompt_cache_gb = 4;
};

// The Layer-0 KV store for one CLI run: with --ssd-cache, a second run of the same prompt
// starts from the prefix the first one left on disk.
Result<std::unique_ptr<memory::KvStore>> open_store(const GenerateFlags& f, const runtime::LoadedModel& m) {
  memory::KvStoreConfig cfg;
  cfg.ram_cap_bytes = static_cast<size_t>(f.prompt_cache_gb * (1ull << 30));
  cfg.ssd_dir = f.ssd_cache;
  cfg.ssd_cap_bytes = static_cast<uint64_t>(f.ssd_cache_max_gb * (1ull << 30));
  LARDER_ASSIGN_OR_RETURN(cfg.identity, runtime::kv_store_identity(m));
  cfg.signature = runtime::kv_state_signature(m);
  cfg.background_scan = false;  // the one take of this run needs the index
  return memory::KvStore::open(std::move(cfg));
}

int run_generate(const GenerateFlags& f) {
  if (f.threads > 0) default_pool().set_threads(f.threads);
  auto loaded = runtime::load_model(f.model);
  if (!loaded.is_ok()) return report(loaded.status());
  runtime::LoadedModel& m = **loaded;
  const auto& info = m.model->info();

  std::vector<int32_t> prompt;
  if (f.chat) {
    std::vector<runtime::ChatMessage> msgs;
    if (!f.system.empty()) msgs.push_back({"system", f.system});
    msgs.push_back({"user", f.prompt});
    auto ids = runtime::encode_chat(m, msgs, /*add_generation_prompt=*/true);
    if (!ids.is_ok()) return report(ids.status());
    prompt = std::move(*ids);
  } else {
    if (!f.system.empty()) return report(invalid_argument("[generate] --system needs --chat"));
    prompt = m.tokenizer->encode(f.prompt, /*add_special=*/true);
  }
  if (prompt.empty()) {
    return report(invalid_argument("[generate] the prompt is empty and the tokenizer adds no BOS token"));
  }

  const int64_t ctx = f.ctx > 0 ? std::min<int64_t>(f.ctx, info.max_context) : info.max_context;
  if (static_cast<int64_t>(prompt.size()) >= ctx) {
    return report(invalid_argument(strfmt("[generate] the prompt is %zu tokens but the context is %lld tokens "
                                          "(use a shorter prompt or a larger --ctx, up to %lld)",
                                          prompt.size(), static_cast<long long>(ctx),
                                          static_cast<long long>(info.max_context))));
  }
  int64_t n = f.n;
  if (static_cast<int64_t>(prompt.size()) + n > ctx) {
    n = ctx - static_cast<int64_t>(prompt.size());
    std::fprintf(stderr, "larder: generating at most %lld tokens: the context of %lld is full after that\n",
                 static_cast<long long>(n), static_cast<long long>(ctx));
  }

  {  // The KV grows on demand, so a run needs room for its own tokens only.
    runtime::FitRequest fr;
    fr.ctx = std::min<int64_t>(ctx, static_cast<int64_t>(prompt.size()) + n);
    const auto fit = runtime::check_model_fit(info, m.files.tensors().total_bytes(), fr);
    if (!fit.status.is_ok()) return report(fit.status);
  }
  runtime::page_in_weights(m.files.tensors());  // a bar while a cold model file is read

  runtime::GenerateOptions go;
  go.sampling = m.defaults.sampling;
  if (f.temp) go.sampling.temperature = *f.temp;
  if (f.top_p) go.sampling.top_p = *f.top_p;
  if (f.top_k) go.sampling.top_k = *f.top_k;
  if (f.min_p) go.sampling.min_p = *f.min_p;
  if (f.repeat_penalty) go.sampling.repetition_penalty = *f.repeat_penalty;
  if (f.presence_penalty) go.sampling.presence_penalty = *f.presence_penalty;
  if (f.frequency_penalty) go.sampling.frequency_penalty = *f.frequency_penalty;
  go.sampling.seed = f.seed;
  go.max_new_tokens = n;
  if (!f.ignore_eos) go.eos_ids = m.defaults.eos_ids;

  std::unique_ptr<memory::KvStore> store;
  const std::string ns = memory::namespace_id({});
  memory::SequenceState state(m.model->kv_layout(), ctx);
  if (!f.ssd_cache.empty()) {
    auto opened = open_store(f, m);
    if (!opened.is_ok()) return report(opened.status());
    store = std::move(*opened);
    memory::TakeResult taken = store->take(prompt, ns);
    if (taken.hit) state = std::move(*taken.hit).into_state(m.model->kv_layout(), ctx);
    std::fprintf(stderr, "larder: kv store: reused %lld of %zu prompt tokens from %s (%s)\n",
                 static_cast<long long>(taken.report.reused_tokens), prompt.size(),
                 memory::tier_name(taken.report.tier), taken.report.reason.c_str());
  }
  memory::KvCache& cache = state.kv;
  runtime::TextStream text(*m.tokenizer, f.stop);
  auto emit = [](const std::string& s) {
    if (s.empty()) return;
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  };
  if (f.show_prompt) emit(m.tokenizer->decode(prompt, /*skip_special=*/true));
  auto result = runtime::generate(*m.model, cache, prompt, go, [&](int32_t token) {
    emit(text.push(token));
    return !text.stopped();
  });
  emit(text.finish());
  const bool stopped_by_string = text.stopped();
  emit("\n");
  if (!result.is_ok()) return report(result.status());
  if (store) {
    // Everything forwarded (the cache holds prompt + generated tokens but the last sampled one).
    std::vector<int32_t> forwarded = prompt;
    forwarded.insert(forwarded.end(), result->tokens.begin(), result->tokens.end());
    forwarded.resize(static_cast<size_t>(cache.length()));
    Status put = store->put(forwarded, std::move(state), ns);
    if (!put.is_ok()) std::fprintf(stderr, "larder: kv store: not kept: %s\n", put.message().c_str());
    memory::FlushReport fr = store->flush();
    if (!fr.durable) {
      std::fprintf(stderr, "larder: kv store: %zu entr%s could not be written to %s\n", fr.failed,
                   fr.failed == 1 ? "y" : "ies", f.ssd_cache.c_str());
    }
  }
  const runtime::GenerateStats& s = *result;
  std::fprintf(stderr,
               "larder: %s, %lld threads (%s)\n"
               "larder: load %.1f ms | prompt %lld tokens in %.3f s (%.1f tok/s) | generated %lld tokens in %.3f s "
               "(%.1f tok/s) | stop: %s\n",
               info.architecture.c_str(), static_cast<long long>(default_pool().n_threads()), cpu_features().describe().c_str(),
               m.load_seconds * 1e3, static_cast<long long>(s.prompt_tokens), s.prefill_seconds,
               s.prefill_seconds > 0 ? s.prompt_tokens / s.prefill_seconds : 0.0,
               static_cast<long long>(s.generated_tokens), s.decode_seconds,
               s.decode_seconds > 0 ? s.generated_tokens / s.decode_seconds : 0.0,
               stopped_by_string ? "stop string" : runtime::finish_reason_name(s.finish_reason));
  return 0;
}

}  // namespace

VerbMain add_generate(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  CLI::App* cmd = app.add_subcommand("generate", "generate a continuation of a prompt (streamed to stdout)");
  cmd->add_option("model", f->model, "model directory or .gguf file")->required();
  cmd->add_option("-p,--prompt", f->prompt, "prompt text (empty: start from BOS)");
  cmd->add_option("-n,--max-tokens", f->n, "maximum tokens to generate")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--chat", f->chat, "wrap the prompt as a user message with the model's chat template");
  cmd->add_option("--system", f->system, "system message (with --chat)");
  cmd->add_option("--temp,--temperature", f->temp, "sampling temperature (0 = greedy)")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-p", f->top_p, "nucleus sampling mass")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--top-k", f->top_k, "keep the k most likely tokens (0 = off)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--min-p", f->min_p, "drop tokens below min_p x p(max)")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--repeat-penalty", f->repeat_penalty, "repetition penalty (1 = off)")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--presence-penalty", f->presence_penalty, "presence penalty")->check(CLI::Range(-2.0, 2.0));
  cmd->add_option("--frequency-penalty", f->frequency_penalty, "frequency penalty")->check(CLI::Range(-2.0, 2.0));
  cmd->add_option("--seed", f->seed, "sampling seed (same seed, same tokens)");
  cmd->add_option("--stop", f->stop, "stop string (repeatable); never printed");
  cmd->add_option("-t,--threads", f->threads, "compute threads (default: physical cores)")->check(CLI::PositiveNumber);
  cmd->add_option("-c,--ctx", f->ctx, "context length (default: the model's)")->check(CLI::PositiveNumber);
  cmd->add_flag("--ignore-eos", f->ignore_eos, "keep generating past EOS tokens");
  cmd->add_flag("--show-prompt", f->show_prompt, "print the prompt before the continuation");
  cmd->add_option("--ssd-cache", f->ssd_cache, "directory of the persistent KV cache (reused across runs)");
  cmd->add_option("--ssd-cache-max", f->ssd_cache_max_gb, "SSD cache cap in GiB")->check(CLI::PositiveNumber);
  cmd->add_option("--prompt-cache", f->prompt_cache_gb, "RAM KV cache cap in GiB")->check(CLI::NonNegativeNumber);
  return [f]() { return run_generate(*f); };
}

}  // namespace larder::cli
