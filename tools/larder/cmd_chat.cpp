// larder chat MODEL [--system TEXT] [-n N] [--temp T] ... — a conversation in the terminal.
//
// Each line typed is a user turn; the answer streams to stdout. The whole conversation is
// rendered with the model's chat template every turn, and the Layer-0 KV store (RAM) keeps what
// the previous turn forwarded, so a turn only prefills what is new (its reuse is shown with
// --verbose). Ctrl-C stops the current answer (the partial answer stays in the conversation), not
// the session; at the prompt it discards the line. /clear starts over, /exit or Ctrl-D ends it.
// When standard input is not a terminal every line is a turn and no prompt is printed.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>

#include <unistd.h>

#include "generation_setup.h"
#include "interrupt.h"
#include "larder/memory/store/kv_store.h"
#include "larder/runtime/generate.h"
#include "larder/runtime/loaded_model.h"
#include "larder/runtime/page_in.h"
#include "larder/runtime/sequence.h"
#include "model_arg.h"
#include "verbs.h"

namespace larder::cli {

namespace {

struct ChatFlags {
  ModelArg model;
  std::string system;
  bool verbose = false;
  GenerationFlags gen;
  runtime::ChatTemplateFlags chat_template;
};

enum class LineResult { kLine, kEof, kInterrupted, kTooLong };

// Reads one line from fd 0 without stdio, so that a Ctrl-C during the read (EINTR: the handler
// has no SA_RESTART) is seen at once. A line is bounded by what the context can hold: past
// `max_bytes` without a newline (/dev/zero, an endless pipe) it is kTooLong and no more is read.
class LineReader {
 public:
  explicit LineReader(size_t max_bytes) : max_(max_bytes) {}
  LineResult next(std::string* line) {
    for (;;) {
      const size_t nl = buf_.find('\n');
      if (nl == std::string::npos ? buf_.size() > max_ : nl > max_) return LineResult::kTooLong;
      if (nl != std::string::npos) {
        *line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        if (!line->empty() && line->back() == '\r') line->pop_back();
        return LineResult::kLine;
      }
      if (eof_) {
        if (buf_.empty()) return LineResult::kEof;
        *line = std::move(buf_);
        buf_.clear();
        return LineResult::kLine;
      }
      char tmp[4096];
      const ssize_t n = ::read(STDIN_FILENO, tmp, std::min(sizeof tmp, max_ + 1 - buf_.size()));
      if (n < 0 && errno == EINTR) {
        if (interrupted()) {
          buf_.clear();  // the terminal dropped the typed line too
          return LineResult::kInterrupted;
        }
        continue;
      }
      if (n <= 0) {
        eof_ = true;
        continue;
      }
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }

 private:
  std::string buf_;
  bool eof_ = false;
  size_t max_;
};

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return {};
  return s.substr(a, s.find_last_not_of(" \t") - a + 1);
}

int run_chat(const ChatFlags& f) {
  install_interrupt_handler();
  runtime::LocatedModel located;
  auto spec = constraint_spec(f.gen);  // a bad schema or a missing file before the model loads
  if (!spec.is_ok()) return report(spec.status());
  if (Status st = check_lora_specs(f.gen.lora); !st.is_ok()) return report(st);
  auto loaded = load_for_generation(f.model, f.gen, f.chat_template, &located);
  if (!loaded.is_ok()) return report(loaded.status());
  runtime::LoadedModel& m = **loaded;
  // Sampling, stops and the grammar (compiled once) of every answer.
  auto options = generate_options(f.gen, m, *spec);
  if (!options.is_ok()) return report(options.status());
  // The draft model (--draft), when there is one, lives as long as the chat.
  auto spec_run = spec_for_generation(f.model, f.gen, m);
  if (!spec_run.is_ok()) return report(spec_run.status());
  options->spec = spec_run->options;
  if (!spec_run->note.empty()) std::fprintf(stderr, "larder: %s\n", spec_run->note.c_str());
  auto loras = load_run_loras(f.gen.lora, m);
  if (!loras.is_ok()) return report(loras.status());
  options->adapters = loras->request.forward;
  // gpt-oss (harmony): the channel markers are special tokens, kept as text for ChatAnswer to read.
  const bool harmony = runtime::speaks_harmony(m);
  options->special_text = harmony;
  const runtime::GenerateOptions base = std::move(*options);
  // A model without a template chats through the ChatML fallback (as serve and generate --chat
  // do); the warning says so before the first prompt.
  runtime::announce_chat_template(m);
  runtime::page_in_weights(m.files.tensors());  // a bar while a cold model file is read, not in the first answer
  auto opened = open_cli_store(f.gen, m);
  if (!opened.is_ok()) return report(opened.status());
  memory::KvStore& store = **opened;
  const std::string ns = loras->request.ns;
  const int64_t ctx = context_of(f.gen, m);
  const bool tty = isatty(STDIN_FILENO);
  if (tty) {
    std::fprintf(stderr,
                 "larder chat: %s (context %lld tokens). Ctrl-C stops an answer; /clear starts over; /exit or "
                 "Ctrl-D ends.\n",
                 located.id.c_str(), static_cast<long long>(ctx));
  }

  std::vector<runtime::ChatMessage> history;
  if (!f.system.empty()) history.push_back({"system", f.system});
  const size_t fixed = history.size();
  const TextLimit limit = text_limit_for_context(ctx);
  LineReader reader(static_cast<size_t>(limit.max_bytes));
  auto out = [](const std::string& s) {
    if (s.empty()) return;
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  };
  for (;;) {
    if (tty) out("> ");
    std::string line;
    const LineResult r = reader.next(&line);
    if (r == LineResult::kEof) {
      if (tty) out("\n");
      return 0;
    }
    if (r == LineResult::kTooLong) {
      return report(invalid_argument(strfmt("[chat] a message on standard input is longer than %llu bytes: %s; not "
                                            "read further",
                                            static_cast<unsigned long long>(limit.max_bytes), limit.why.c_str())));
    }
    if (r == LineResult::kInterrupted) {
      clear_interrupt();
      out("\n");
      std::fprintf(stderr, "(Ctrl-D or /exit ends the chat)\n");
      continue;
    }
    const std::string cmd = trim(line);
    if (cmd.empty()) continue;
    if (cmd == "/exit" || cmd == "/quit" || cmd == "/bye") return 0;
    if (cmd == "/clear") {
      history.resize(fixed);
      std::fprintf(stderr, "(conversation cleared)\n");
      continue;
    }
    if (cmd == "/help" || cmd == "/?") {
      std::fprintf(stderr, "/clear  start a new conversation\n/exit   end the chat (or Ctrl-D)\nCtrl-C  stop the answer\n");
      continue;
    }

    history.push_back({"user", line});
    auto ids = runtime::encode_chat(m, history, /*add_generation_prompt=*/true);
    if (!ids.is_ok()) {
      history.pop_back();
      std::fprintf(stderr, "larder: %s\n", ids.status().message().c_str());
      continue;
    }
    if (Status st = runtime::check_prompt(m, *ids); !st.is_ok()) {
      history.pop_back();
      std::fprintf(stderr, "larder: %s\n", st.message().c_str());
      continue;
    }
    const std::vector<int32_t>& prompt = *ids;
    if (static_cast<int64_t>(prompt.size()) >= ctx) {
      history.pop_back();
      std::fprintf(stderr, "larder: the conversation is %zu tokens and no longer fits the context of %lld; /clear "
                   "starts over\n", prompt.size(), static_cast<long long>(ctx));
      continue;
    }
    runtime::GenerateOptions go = base;
    go.max_new_tokens = budget_for(f.gen, static_cast<int64_t>(prompt.size()), ctx);

    // The one generation lifecycle (runtime/sequence.h): take, prefill, decode, put.
    runtime::Sequence seq = runtime::Sequence::start(*m.model, prompt, {&store, ns, ctx});
    ChatAnswer answer(harmony, out);
    go.on_text = [&](const std::string& piece) { answer.push(piece); };
    auto result = runtime::generate(*m.model, seq, go, [&](int32_t) { return !interrupted(); });
    const bool stopped = interrupted();
    clear_interrupt();
    answer.finish();
    out("\n");
    if (!result.is_ok()) {
      (void)seq.finish(/*failed=*/true);  // the turn already failed: its error is the one to report
      history.pop_back();
      std::fprintf(stderr, "larder: %s\n", result.status().message().c_str());
      continue;
    }
    if (stopped) std::fprintf(stderr, "[stopped]\n");
    history.push_back(answer.message());
    // Keep what was forwarded (prompt + answer but its last token) for the next turn's prefix.
    if (Status put = seq.finish(); !put.is_ok() && f.verbose) {
      std::fprintf(stderr, "larder: kv store: not kept: %s\n", put.message().c_str());
    }
    if (f.verbose) {
      const char* why = result->finish_reason == runtime::FinishReason::kStop ? "stop string"
                        : stopped      ? "interrupted (Ctrl-C)"
                                       : runtime::finish_reason_name(result->finish_reason);
      std::fprintf(stderr, "larder: reused %lld of %zu prompt tokens (%s) | %s\n",
                   static_cast<long long>(seq.cached_tokens()), prompt.size(), seq.cache_tier(),
                   stats_text(*result, why).c_str());
    }
  }
}

}  // namespace

VerbMain add_chat(CLI::App& app) {
  auto f = std::make_shared<ChatFlags>();
  CLI::App* cmd = app.add_subcommand("chat", "a conversation with a model in the terminal (streamed, multi-turn)");
  add_model_arg(cmd, f->model, "");
  cmd->add_option("--system,--system-prompt", f->system, "system message (kept by /clear)");
  cmd->add_flag("-v,--verbose", f->verbose, "after each answer: prompt tokens reused from the KV store, speed");
  add_generation_flags(cmd, f->gen);
  add_chat_template_flags(cmd, &f->chat_template);
  return [f]() { return run_chat(*f); };
}

}  // namespace larder::cli
