// larder generate MODEL [-p TEXT | -f FILE | < stdin] [-n N] [--temp T] [--top-p P] [--top-k K]
//                 [--seed S] [--grammar GBNF | --json-schema SCHEMA] [--chat] [--system TEXT] ...
// The continuation only goes to stdout, streamed as produced (whole UTF-8 characters, nothing
// of a stop string); load/prefill/decode statistics go to stderr — also after Ctrl-C, which stops
// the generation (exit 130).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include <unistd.h>

#include "generation_setup.h"
#include "interrupt.h"
#include "larder/core/cpuid.h"
#include "larder/core/mmap_file.h"
#include "larder/core/threadpool.h"
#include "larder/memory/store/kv_store.h"
#include "larder/runtime/generate.h"
#include "larder/runtime/kv_identity.h"
#include "larder/runtime/fit.h"
#include "larder/runtime/page_in.h"
#include "larder/runtime/sequence.h"
#include "larder/runtime/loaded_model.h"
#include "larder/tokenizer/tokenizer.h"
#include "model_arg.h"
#include "validators.h"
#include "verbs.h"

namespace larder::cli {

namespace {

struct GenerateFlags {
  ModelArg model;
  std::optional<std::string> prompt;
  std::string file, system;
  bool chat = false;
  bool show_prompt = false;
  GenerationFlags gen;
  runtime::ChatTemplateFlags chat_template;
};

// llama.cpp's rule for prompt files: one trailing newline is the file's, not the prompt's.
std::string drop_final_newline(std::string s) {
  if (!s.empty() && s.back() == '\n') s.pop_back();
  if (!s.empty() && s.back() == '\r') s.pop_back();
  return s;
}

// Where the prompt comes from: --prompt, else -f FILE, else standard input when it is not a
// terminal (a pipe or a file: `echo "Tell me a joke" | larder generate M --chat`), else none.
// Chosen before the model loads (flag errors come first); read after, when the context that
// bounds it is known.
struct PromptSource {
  enum class Kind { kNone, kLiteral, kFile, kStdin } kind = Kind::kNone;
  std::string file;  // kFile
};

Result<PromptSource> prompt_source(const GenerateFlags& f) {
  if (f.prompt && !f.file.empty()) return invalid_argument("[generate] give the prompt once: --prompt or -f, not both");
  if (f.prompt) return PromptSource{PromptSource::Kind::kLiteral, ""};
  if (!f.file.empty()) {
    // A missing file is reported before the model loads.
    if (::access(f.file.c_str(), R_OK) != 0) {
      return errno == ENOENT ? not_found(strfmt("[generate] %s: file not found", f.file.c_str()))
                             : io_error(strfmt("[generate] %s: cannot open: %s", f.file.c_str(), std::strerror(errno)));
    }
    return PromptSource{PromptSource::Kind::kFile, f.file};
  }
  if (!isatty(STDIN_FILENO)) return PromptSource{PromptSource::Kind::kStdin, ""};
  return PromptSource{};
}

// The prompt text; a file or standard input is read only as far as a context of `ctx` tokens
// can hold (/dev/zero ends in a message, not in an endless read).
Result<std::string> prompt_text(const GenerateFlags& f, const PromptSource& src, int64_t ctx) {
  if (src.kind == PromptSource::Kind::kLiteral) return *f.prompt;
  if (src.kind == PromptSource::Kind::kNone) return std::string();
  LARDER_ASSIGN_OR_RETURN(TextRead r, read_text_input(src.kind == PromptSource::Kind::kFile ? src.file : "",
                                                      text_limit_for_context(ctx), "generate"));
  return drop_final_newline(std::move(r.text));
}

int run_generate(const GenerateFlags& f) {
  install_interrupt_handler();
  auto source = prompt_source(f);
  if (!source.is_ok()) return report(source.status());
  if (f.chat && source->kind == PromptSource::Kind::kNone) {
    return report(invalid_argument("[generate] --chat needs a message: --prompt TEXT, -f FILE, or text on standard "
                                   "input (for a conversation: larder chat MODEL)"));
  }
  auto spec = constraint_spec(f.gen);  // a bad schema or a missing file before the model loads
  if (!spec.is_ok()) return report(spec.status());
  if (Status st = check_lora_specs(f.gen.lora); !st.is_ok()) return report(st);
  auto loaded = load_for_generation(f.model, f.gen, f.chat_template);
  if (!loaded.is_ok()) return report(loaded.status());
  runtime::LoadedModel& m = **loaded;
  const auto& info = m.model->info();
  if (interrupted()) return 130;
  const int64_t ctx = context_of(f.gen, m);
  auto text_in = prompt_text(f, *source, ctx);
  if (!text_in.is_ok()) return text_in.status().code() == StatusCode::kCancelled ? 130 : report(text_in.status());
  const std::string& user_text = *text_in;

  std::vector<int32_t> prompt;
  if (f.chat) {
    runtime::announce_chat_template(m);
    std::vector<runtime::ChatMessage> msgs;
    if (!f.system.empty()) msgs.push_back({"system", f.system});
    msgs.push_back({"user", user_text});
    auto ids = runtime::encode_chat(m, msgs, /*add_generation_prompt=*/true);
    if (!ids.is_ok()) return report(ids.status());
    prompt = std::move(*ids);
  } else {
    if (!f.system.empty()) return report(invalid_argument("[generate] --system needs --chat"));
    if (!f.chat_template.spec.empty() || !f.chat_template.file.empty())
      return report(invalid_argument("[generate] --chat-template/--chat-template-file need --chat"));
    prompt = m.tokenizer->encode(user_text, /*add_special=*/true);
  }
  if (prompt.empty()) {
    return report(invalid_argument("[generate] the prompt is empty and the tokenizer adds no BOS token"));
  }
  if (Status st = runtime::check_prompt(m, prompt); !st.is_ok()) return report(st);

  if (static_cast<int64_t>(prompt.size()) >= ctx) {
    return report(invalid_argument(strfmt("[generate] the prompt is %zu tokens but the context is %lld tokens "
                                          "(use a shorter prompt or a larger --ctx, up to %lld)",
                                          prompt.size(), static_cast<long long>(ctx),
                                          static_cast<long long>(info.max_context))));
  }
  const int64_t n = budget_for(f.gen, static_cast<int64_t>(prompt.size()), ctx);
  if (f.gen.n >= 0 && n < f.gen.n) {
    std::fprintf(stderr, "larder: generating at most %lld tokens: the context of %lld is full after that\n",
                 static_cast<long long>(n), static_cast<long long>(ctx));
  }

  {  // The KV grows on demand, so a run needs room for its own tokens only.
    runtime::FitRequest fr;
    fr.ctx = std::min<int64_t>(ctx, static_cast<int64_t>(prompt.size()) + n);
    const auto fit = runtime::check_model_fit(*m.model, m.files.tensors().total_bytes(), fr);
    if (!fit.status.is_ok()) return report(fit.status);
  }
  runtime::page_in_weights(m.files.tensors());  // a bar while a cold model file is read

  auto options = generate_options(f.gen, m, *spec);
  if (!options.is_ok()) return report(options.status());
  runtime::GenerateOptions& go = *options;
  go.max_new_tokens = n;
  auto spec_run = spec_for_generation(f.model, f.gen, m);
  if (!spec_run.is_ok()) return report(spec_run.status());
  go.spec = spec_run->options;
  if (!spec_run->note.empty()) std::fprintf(stderr, "larder: %s\n", spec_run->note.c_str());
  auto loras = load_run_loras(f.gen.lora, m);
  if (!loras.is_ok()) return report(loras.status());
  go.adapters = loras->request.forward;

  std::unique_ptr<memory::KvStore> store;
  if (!f.gen.ssd_cache.empty()) {
    auto opened = open_cli_store(f.gen, m);
    if (!opened.is_ok()) return report(opened.status());
    store = std::move(*opened);
  }
  // The one generation lifecycle (runtime/sequence.h): take, prefill, decode, put.
  runtime::Sequence seq = runtime::Sequence::start(*m.model, prompt, {store.get(), loras->request.ns, ctx});
  if (store) {
    std::fprintf(stderr, "larder: kv store: reused %lld of %zu prompt tokens from %s (%s)\n",
                 static_cast<long long>(seq.cached_tokens()), prompt.size(), seq.cache_tier(),
                 seq.cache_reason().c_str());
  }
  if (spec_run->requested && !runtime::speculation_possible(seq.state())) {
    std::fprintf(stderr, "larder: --spec: off for this model (its sliding-window or recurrent layers cannot take a "
                         "rejected draft back)\n");
  }
  auto emit = [](const std::string& s) {
    if (s.empty()) return;
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  };
  if (f.show_prompt) emit(m.tokenizer->decode(prompt, /*skip_special=*/true));
  // A chat answer as `larder chat` shows it (gpt-oss's harmony channels read, not printed raw).
  const bool harmony = f.chat && runtime::speaks_harmony(m);
  go.special_text = harmony;
  ChatAnswer answer(harmony, emit);
  go.on_text = [&](const std::string& piece) { answer.push(piece); };
  auto result = runtime::generate(*m.model, seq, go, [&](int32_t) { return !interrupted(); });
  const bool stopped_by_user = interrupted();
  answer.finish();
  emit("\n");
  if (!result.is_ok()) return report(result.status());
  if (store) {
    Status put = seq.finish();
    if (!put.is_ok()) std::fprintf(stderr, "larder: kv store: not kept: %s\n", put.message().c_str());
    memory::FlushReport fr = store->flush();
    if (!fr.durable) {
      std::fprintf(stderr, "larder: kv store: %zu entr%s could not be written to %s\n", fr.failed,
                   fr.failed == 1 ? "y" : "ies", f.gen.ssd_cache.c_str());
    }
  }
  const runtime::GenerateStats& s = *result;
  const char* stop = s.finish_reason == runtime::FinishReason::kStop ? "stop string"
                     : stopped_by_user                              ? "interrupted (Ctrl-C)"
                                                                    : runtime::finish_reason_name(s.finish_reason);
  std::fprintf(stderr, "larder: %s, %lld threads (%s)\nlarder: load %.1f ms | %s\n", info.architecture.c_str(),
               static_cast<long long>(default_pool().n_threads()), cpu_features().describe().c_str(),
               m.load_seconds * 1e3, stats_text(s, stop).c_str());
  return stopped_by_user ? 130 : 0;
}

}  // namespace

VerbMain add_generate(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  CLI::App* cmd = app.add_subcommand("generate", "generate a continuation of a prompt (streamed to stdout)");
  add_model_arg(cmd, f->model, "");
  cmd->add_option("-p,--prompt", f->prompt,
                  "prompt text (default: -f FILE, else standard input when it is not a terminal, else empty: start "
                  "from BOS)");
  cmd->add_option("-f,--file", f->file, "read the prompt from this file (one final newline dropped)");
  cmd->add_flag("--chat", f->chat, "wrap the prompt as a user message with the model's chat template");
  cmd->add_option("--system,--system-prompt", f->system, "system message (with --chat)");
  add_chat_template_flags(cmd, &f->chat_template);
  add_generation_flags(cmd, f->gen);
  cmd->add_flag("--show-prompt", f->show_prompt, "print the prompt before the continuation");
  return [f]() { return run_generate(*f); };
}

}  // namespace larder::cli
