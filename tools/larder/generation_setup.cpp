#include "generation_setup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "interrupt.h"
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

TextLimit text_limit_for_context(int64_t ctx_tokens) {
  TextLimit l;
  const uint64_t ctx = static_cast<uint64_t>(std::max<int64_t>(ctx_tokens, 1));
  l.max_bytes = ctx > kMaxTextBytes / kMaxBytesPerToken ? kMaxTextBytes : ctx * kMaxBytesPerToken;
  l.why = strfmt("more than a context of %llu tokens can hold (at most %llu bytes a token)",
                 static_cast<unsigned long long>(ctx), static_cast<unsigned long long>(kMaxBytesPerToken));
  if (l.max_bytes == kMaxTextBytes) l.why = strfmt("larder reads at most %llu MiB of text",
                                                   static_cast<unsigned long long>(kMaxTextBytes >> 20));
  return l;
}

std::string text_source_name(const std::string& path) { return path.empty() ? "standard input" : "'" + path + "'"; }

Result<TextRead> read_text_input(const std::string& path, const TextLimit& limit, const char* tag, bool allow_truncate) {
  const std::string src = text_source_name(path);
  int fd = STDIN_FILENO;
  if (!path.empty()) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int e = errno;
      if (e == ENOENT) return not_found(strfmt("[%s] %s: cannot open: no such file", tag, path.c_str()));
      return io_error(strfmt("[%s] %s: cannot open: %s", tag, path.c_str(), std::strerror(e)));
    }
  }
  struct Closer {
    int fd;
    ~Closer() {
      if (fd != STDIN_FILENO) ::close(fd);
    }
  } closer{fd};
  auto too_long = [&] {
    return invalid_argument(strfmt("[%s] %s is longer than %llu bytes: %s; not read further", tag, src.c_str(),
                                   static_cast<unsigned long long>(limit.max_bytes), limit.why.c_str()));
  };
  struct stat st {};
  if (::fstat(fd, &st) == 0) {
    if (S_ISDIR(st.st_mode)) return invalid_argument(strfmt("[%s] %s is a directory", tag, src.c_str()));
    // A regular file says its size: too long is known before reading a byte.
    if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > limit.max_bytes && !allow_truncate) return too_long();
  }
  TextRead out;
  std::string& text = out.text;
  char buf[1 << 16];
  for (;;) {
    // Never more than one byte past the limit: that byte is the proof that more follows.
    const size_t want = static_cast<size_t>(std::min<uint64_t>(sizeof buf, limit.max_bytes + 1 - text.size()));
    const ssize_t n = ::read(fd, buf, want);
    if (n < 0 && errno == EINTR) {
      if (interrupted()) return Status(StatusCode::kCancelled, strfmt("[%s] interrupted while reading %s", tag, src.c_str()));
      continue;
    }
    if (n < 0) return io_error(strfmt("[%s] %s: read failed: %s", tag, src.c_str(), std::strerror(errno)));
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > limit.max_bytes) {
      if (!allow_truncate) return too_long();
      text.resize(limit.max_bytes);
      out.truncated = true;
      break;
    }
  }
  return out;
}

}  // namespace larder::cli
