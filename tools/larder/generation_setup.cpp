#include "generation_setup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

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
  // The ranges are the server's request fields' (server/api_fields.h); a penalty of 0 would divide by 0.
  cmd->add_option("--repeat-penalty", f.repeat_penalty, "repetition penalty (1 = off)")
      ->check(positive())
      ->check(in_range(0.0, 100.0));
  cmd->add_option("--presence-penalty", f.presence_penalty, "presence penalty")->check(in_range(-2.0, 2.0));
  cmd->add_option("--frequency-penalty", f.frequency_penalty, "frequency penalty")->check(in_range(-2.0, 2.0));
  cmd->add_option("--repeat-last-n", f.repeat_last_n,
                  "last N tokens the repeat, presence and frequency penalties look at (-1 = all, 0 = penalties "
                  "off; default 20)")
      ->check(in_range(-1, 1 << 20));
  cmd->add_option("-l,--logit-bias", f.logit_bias,
                  "add BIAS to token ID's logit, as ID+BIAS or ID-BIAS (ID-inf bans it); repeatable")
      ->allow_extra_args(false);
  cmd->add_option("-s,--seed", f.seed, "sampling seed (same seed, same tokens)");
  cmd->add_option("--grammar", f.grammar, "constrain the output to a GBNF grammar (root rule `root`)");
  cmd->add_option("--grammar-file", f.grammar_file, "read the GBNF grammar from FILE");
  cmd->add_option("-j,--json-schema", f.json_schema,
                  "constrain the output to JSON valid against this schema (JSON text, or @FILE)");
  cmd->add_option("--json-schema-file", f.json_schema_file, "read the JSON schema from FILE");
  // One value per occurrence (repeat the flag): a greedy list would swallow MODEL after it.
  cmd->add_option("--stop", f.stop, "stop string (repeatable); never printed")
      ->allow_extra_args(false);
  cmd->add_option("-t,--threads", f.threads, "compute threads (0 = physical cores)")->check(at_least(0));
  cmd->add_option("-c,--ctx,--ctx-size", f.ctx, "context length (0 = the model's)")->check(at_least(0));
  cmd->add_flag("--ignore-eos", f.ignore_eos, "keep generating past EOS tokens");
  cmd->add_option("--ssd-cache", f.ssd_cache, "directory of the persistent KV cache (reused across runs)");
  cmd->add_option("--ssd-cache-max", f.ssd_cache_max_gb, "SSD cache cap in GiB")->check(positive());
  cmd->add_option("--prompt-cache", f.prompt_cache_gb, "RAM KV cache cap in GiB")->check(at_least(0));
  add_kv_dtype_flags(cmd, f.kv);
  add_spec_flags(cmd, f.spec);
  add_lora_flag(cmd, f.lora);
}

namespace {

// The grammar and schema files are small texts: bounded like every text larder reads.
Result<std::string> read_small_file(const std::string& path, const char* flag) {
  if (path.empty()) return invalid_argument(strfmt("[generate] %s needs a file name", flag));  // "" would be stdin
  TextLimit limit;
  limit.max_bytes = runtime::GrammarLimits{}.text_bytes;
  limit.why = "larder compiles grammars and schemas of at most that size";
  auto r = read_text_input(path, limit, flag);
  if (!r.is_ok()) return r.status();
  return std::move(r->text);
}

// llama.cpp's -l/--logit-bias: TOKEN_ID followed by a signed bias ("15043+1", "15043-0.5",
// "15043-inf").
Status parse_logit_bias(const std::string& s, int64_t vocab, std::map<int32_t, float>* out) {
  const auto bad = [&](const char* why) {
    return invalid_argument(strfmt("[generate] --logit-bias '%s': %s (expected TOKEN_ID+BIAS or TOKEN_ID-BIAS, e.g. "
                                   "15043+1 or 15043-inf)", s.c_str(), why));
  };
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == 0) return bad("no token id");
  if (i == s.size() || (s[i] != '+' && s[i] != '-')) return bad("no signed bias after the token id");
  const long long id = std::strtoll(s.substr(0, i).c_str(), nullptr, 10);
  if (id >= vocab) return bad(strfmt("token id %lld is outside the vocabulary [0, %lld)", id, (long long)vocab).c_str());
  const std::string num = s.substr(i);
  char* end = nullptr;
  const double b = std::strtod(num.c_str(), &end);
  if (num.size() < 2 || !end || *end != '\0' || std::isnan(b) || b == INFINITY) return bad("the bias is not a number");
  (*out)[static_cast<int32_t>(id)] = static_cast<float>(b);
  return Status::ok();
}

}  // namespace

Result<std::optional<runtime::ConstraintSpec>> constraint_spec(const GenerationFlags& f) {
  const int given = f.grammar.has_value() + f.grammar_file.has_value() + f.json_schema.has_value() +
                    f.json_schema_file.has_value();
  if (given > 1)
    return invalid_argument("[generate] give one output constraint: --grammar, --grammar-file, --json-schema or "
                            "--json-schema-file");
  if (given == 0) return std::optional<runtime::ConstraintSpec>();
  runtime::ConstraintSpec spec;
  if (f.grammar || f.grammar_file) {
    spec.kind = runtime::ConstraintSpec::Kind::kGbnf;
    if (f.grammar) {
      spec.text = *f.grammar;
    } else {
      LARDER_ASSIGN_OR_RETURN(spec.text, read_small_file(*f.grammar_file, "--grammar-file"));
    }
    if (spec.text.find_first_not_of(" \t\r\n") == std::string::npos)
      return invalid_argument("[generate] the grammar is empty");
    return std::optional<runtime::ConstraintSpec>(std::move(spec));
  }
  std::string text;
  std::string where = "--json-schema";
  if (f.json_schema && !f.json_schema->starts_with("@")) {
    text = *f.json_schema;
  } else {
    const std::string path = f.json_schema ? f.json_schema->substr(1) : *f.json_schema_file;
    where = "'" + path + "'";
    LARDER_ASSIGN_OR_RETURN(text, read_small_file(path, f.json_schema ? "--json-schema" : "--json-schema-file"));
  }
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(strfmt("[generate] %s is not JSON: %s", where.c_str(), e.what()));
  }
  if (!schema.is_object() && !schema.is_boolean())
    return invalid_argument(strfmt("[generate] %s must be a JSON schema (an object)", where.c_str()));
  if (Status st = runtime::check_json_schema(schema); !st.is_ok())
    return invalid_argument(strfmt("[generate] %s: %s", where.c_str(), st.message().c_str()));
  // As the server's json_schema field: strict (no properties beyond those the schema names).
  spec.kind = runtime::ConstraintSpec::Kind::kJsonSchema;
  spec.text = schema.dump();
  spec.strict = true;
  return std::optional<runtime::ConstraintSpec>(std::move(spec));
}

void add_lora_flag(CLI::App* cmd, std::vector<std::string>& specs) {
  cmd->add_option("--lora", specs,
                  "LoRA adapter PATH[:SCALE] (a PEFT or mlx-lm adapter directory, or a GGUF LoRA file; SCALE "
                  "multiplies its own, default 1); repeatable")
      ->allow_extra_args(false);
}

Status check_lora_specs(const std::vector<std::string>& specs) {
  for (const std::string& s : specs) LARDER_RETURN_IF_ERROR(models::parse_lora_spec(s, /*named=*/false).status());
  return Status::ok();
}

Result<RunLoras> load_run_loras(const std::vector<std::string>& specs, const runtime::LoadedModel& m) {
  RunLoras r;
  std::vector<models::LoraUse> uses;
  for (const std::string& s : specs) {
    LARDER_ASSIGN_OR_RETURN(models::LoraSpec spec, models::parse_lora_spec(s, /*named=*/false));
    std::vector<std::string> warnings;
    auto b = runtime::load_lora(m, spec.path, &warnings);
    if (!b.is_ok()) return Status(b.status().code(), "--lora " + s + ": " + b.status().message());
    for (const std::string& w : warnings) std::fprintf(stderr, "larder: --lora %s: %s\n", s.c_str(), w.c_str());
    r.bound.push_back(b.value());
    uses.push_back({b.value()->lora, spec.scale});
  }
  LARDER_ASSIGN_OR_RETURN(r.request, runtime::lora_request(std::move(uses), r.bound));
  return r;
}

Result<runtime::GenerateOptions> generate_options(const GenerationFlags& f, const runtime::LoadedModel& m,
                                                  const std::optional<runtime::ConstraintSpec>& spec) {
  runtime::GenerateOptions go;
  go.sampling = m.defaults.sampling;
  if (f.temp) go.sampling.temperature = *f.temp;
  if (f.top_p) go.sampling.top_p = *f.top_p;
  if (f.top_k) go.sampling.top_k = *f.top_k;
  if (f.min_p) go.sampling.min_p = *f.min_p;
  if (f.repeat_penalty) go.sampling.repetition_penalty = *f.repeat_penalty;
  if (f.presence_penalty) go.sampling.presence_penalty = *f.presence_penalty;
  if (f.frequency_penalty) go.sampling.frequency_penalty = *f.frequency_penalty;
  if (f.repeat_last_n) {
    if (*f.repeat_last_n == 0) {  // llama.cpp: 0 turns the penalties off
      go.sampling.repetition_penalty = 1.0f;
      go.sampling.presence_penalty = go.sampling.frequency_penalty = 0.0f;
    } else {
      const int window = *f.repeat_last_n < 0 ? 0 : *f.repeat_last_n;  // the sampler's 0: the whole history
      go.sampling.repetition_context_size = go.sampling.presence_context_size = go.sampling.frequency_context_size =
          window;
    }
  }
  for (const std::string& b : f.logit_bias)
    LARDER_RETURN_IF_ERROR(parse_logit_bias(b, m.model->info().vocab, &go.sampling.logit_bias));
  go.sampling.seed = f.seed;
  if (!f.ignore_eos) go.eos_ids = m.defaults.eos_ids;
  go.stops = f.stop;
  go.tokenizer = m.tokenizer.get();
  if (spec) {
    if (!m.grammar) return unsupported("[generate] constrained decoding is not available for this model");
    auto c = m.grammar->compile(*spec);
    if (!c.is_ok()) {
      const char* flag = spec->kind == runtime::ConstraintSpec::Kind::kGbnf ? "--grammar" : "--json-schema";
      return invalid_argument(strfmt("[generate] %s: %s", flag, c.status().message().c_str()));
    }
    go.constraint = std::move(*c);
  }
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

ChatAnswer::ChatAnswer(bool harmony, Sink out) : out_(std::move(out)) {
  if (harmony) harmony_.emplace();
}

void ChatAnswer::push(const std::string& piece) {
  if (harmony_) return show(harmony_->push(piece));
  content_ += piece;
  out_(piece);
}

void ChatAnswer::finish() {
  if (harmony_) show(harmony_->flush());
  if (in_think_) out_("\n</think>");
  in_think_ = false;
}

void ChatAnswer::show(runtime::HarmonyParser::Out o) {
  if (!o.reasoning.empty()) {
    if (!in_think_) out_("<think>\n");
    in_think_ = true;
    reasoning_ += o.reasoning;
    out_(o.reasoning);
  }
  if (!o.content.empty()) {
    if (in_think_) out_("\n</think>\n\n");
    in_think_ = false;
    content_ += o.content;
    out_(o.content);
  }
  for (const auto& c : o.calls) {
    std::fprintf(stderr, "larder: the model called the tool %s with %s (no tools are offered here)\n", c.name.c_str(),
                 c.arguments.dump().c_str());
  }
}

std::string stats_text(const runtime::GenerateStats& s, const char* stop) {
  return strfmt("prompt %lld tokens in %.3f s (%.1f tok/s) | generated %lld tokens in %.3f s (%.1f tok/s) | stop: %s",
                static_cast<long long>(s.prompt_tokens), s.prefill_seconds,
                s.prefill_seconds > 0 ? s.prompt_tokens / s.prefill_seconds : 0.0,
                static_cast<long long>(s.generated_tokens), s.decode_seconds,
                s.decode_seconds > 0 ? s.generated_tokens / s.decode_seconds : 0.0, stop) +
         (s.drafted_tokens > 0 ? strfmt(" | spec: drafted %lld, accepted %lld (%.1f%%), %lld decode forwards",
                                        static_cast<long long>(s.drafted_tokens),
                                        static_cast<long long>(s.accepted_tokens),
                                        100.0 * s.accepted_tokens / s.drafted_tokens,
                                        static_cast<long long>(s.decode_forwards))
                               : std::string());
}

Result<SpecSetup> spec_for_generation(const ModelArg& model, const GenerationFlags& f, const runtime::LoadedModel& m) {
  runtime::LoadOptions lo;
  lo.map_mode = map_mode(model);
  LARDER_ASSIGN_OR_RETURN(lo.kv_dtype, kv_dtype_of(f.kv));
  return spec_setup(f.spec, m, lo);
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
