#include "generation_setup.h"

#include "larder/core/threadpool.h"
#include "larder/runtime/kv_identity.h"
#include "validators.h"

namespace larder::cli {

void add_generation_flags(CLI::App* cmd, GenerationFlags& f) {
  cmd->add_option("-n,--n-predict,--max-tokens", f.n,
                  "tokens to generate at most; -1 = until the context is full (stops earlier at EOS or --stop)")
      ->check(max_tokens_check());
  cmd->add_option("--temp,--temperature", f.temp, "sampling temperature (0 = greedy; default: generation_config, else greedy)")
      ->check(in_range(0.0, 100.0));
  cmd->add_option("--top-p", f.top_p, "nucleus sampling mass")->check(in_range(0.0, 1.0));
  cmd->add_option("--top-k", f.top_k, "keep the k most likely tokens (0 = off)")->check(at_least(0));
  cmd->add_option("--min-p", f.min_p, "drop tokens below min_p x p(max)")->check(in_range(0.0, 1.0));
  cmd->add_option("--repeat-penalty", f.repeat_penalty, "repetition penalty (1 = off)")->check(in_range(0.0, 100.0));
  cmd->add_option("--presence-penalty", f.presence_penalty, "presence penalty")->check(in_range(-2.0, 2.0));
  cmd->add_option("--frequency-penalty", f.frequency_penalty, "frequency penalty")->check(in_range(-2.0, 2.0));
  cmd->add_option("-s,--seed", f.seed, "sampling seed (same seed, same tokens)");
  cmd->add_option("--stop", f.stop, "stop string (repeatable); never printed");
  cmd->add_option("-t,--threads", f.threads, "compute threads (0 = physical cores)")->check(at_least(0));
  cmd->add_option("-c,--ctx,--ctx-size", f.ctx, "context length (0 = the model's)")->check(at_least(0));
  cmd->add_flag("--ignore-eos", f.ignore_eos, "keep generating past EOS tokens");
  cmd->add_option("--ssd-cache", f.ssd_cache, "directory of the persistent KV cache (reused across runs)");
  cmd->add_option("--ssd-cache-max", f.ssd_cache_max_gb, "SSD cache cap in GiB")->check(positive());
  cmd->add_option("--prompt-cache", f.prompt_cache_gb, "RAM KV cache cap in GiB")->check(at_least(0));
  add_kv_dtype_flags(cmd, f.kv);
}

runtime::GenerateOptions generate_options(const GenerationFlags& f, const runtime::LoadedModel& m) {
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
  if (!f.ignore_eos) go.eos_ids = m.defaults.eos_ids;
  return go;
}

int64_t context_of(const GenerationFlags& f, const runtime::LoadedModel& m) {
  const int64_t model_ctx = m.model->info().max_context;
  return f.ctx > 0 ? std::min<int64_t>(f.ctx, model_ctx) : model_ctx;
}

int64_t budget_for(const GenerationFlags& f, int64_t prompt_tokens, int64_t ctx) {
  const int64_t room = ctx - prompt_tokens;
  return f.n < 0 ? room : std::min(f.n, room);
}

Result<std::unique_ptr<memory::KvStore>> open_cli_store(const GenerationFlags& f, const runtime::LoadedModel& m) {
  memory::KvStoreConfig cfg;
  cfg.ram_cap_bytes = static_cast<size_t>(f.prompt_cache_gb * (1ull << 30));
  cfg.ssd_dir = f.ssd_cache;
  cfg.ssd_cap_bytes = static_cast<uint64_t>(f.ssd_cache_max_gb * (1ull << 30));
  LARDER_ASSIGN_OR_RETURN(cfg.identity, runtime::kv_store_identity(m));
  cfg.signature = runtime::kv_state_signature(m);
  cfg.background_scan = false;  // the first take of this run needs the index
  return memory::KvStore::open(std::move(cfg));
}

std::string stats_text(const runtime::GenerateStats& s, const char* stop) {
  return strfmt("prompt %lld tokens in %.3f s (%.1f tok/s) | generated %lld tokens in %.3f s (%.1f tok/s) | stop: %s",
                static_cast<long long>(s.prompt_tokens), s.prefill_seconds,
                s.prefill_seconds > 0 ? s.prompt_tokens / s.prefill_seconds : 0.0,
                static_cast<long long>(s.generated_tokens), s.decode_seconds,
                s.decode_seconds > 0 ? s.generated_tokens / s.decode_seconds : 0.0, stop);
}

Result<std::unique_ptr<runtime::LoadedModel>> load_for_generation(const ModelArg& model, const GenerationFlags& f,
                                                                  const runtime::ChatTemplateFlags& chat_template,
                                                                  runtime::LocatedModel* located) {
  LARDER_ASSIGN_OR_RETURN(runtime::LocatedModel where, resolve_model(model));
  if (f.threads > 0) default_pool().set_threads(f.threads);
  runtime::LoadOptions lo;
  lo.chat_template = chat_template;
  lo.map_mode = map_mode(model);
  LARDER_ASSIGN_OR_RETURN(lo.kv_dtype, kv_dtype_of(f.kv));
  auto loaded = runtime::load_model(where.path, lo);
  if (located) *located = std::move(where);
  return loaded;
}

}  // namespace larder::cli
