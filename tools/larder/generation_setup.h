// generation_setup.h — what `larder generate` and `larder chat` share: the sampling, length and
// structured-output flags (llama.cpp's spellings as aliases; the options a server request has),
// the options they make for runtime::generate, the Layer-0 KV store of a CLI run, and the
// statistics line.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "larder/memory/store/kv_store.h"
#include "larder/runtime/adapters.h"
#include "larder/runtime/generate.h"
#include "larder/runtime/chat_template_choice.h"
#include "larder/runtime/harmony.h"
#include "larder/runtime/loaded_model.h"
#include "kv_dtype_flag.h"
#include "model_arg.h"
#include "spec_flags.h"

namespace larder::cli {

struct GenerationFlags {
  std::optional<float> temp, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
  std::optional<int> top_k;
  // llama.cpp's --repeat-last-n: the history window of all three penalties (-1: the whole
  // history, 0: penalties off); unset: the sampler's window (runtime::SamplingParams).
  std::optional<int> repeat_last_n;
  std::vector<std::string> logit_bias;  // "ID+BIAS" / "ID-BIAS" / "ID-inf", llama.cpp's -l
  uint64_t seed = 0;
  // Structured output (at most one): GBNF text or file, a JSON schema inline or @FILE or file.
  std::optional<std::string> grammar, grammar_file, json_schema, json_schema_file;
  int64_t n = runtime::kDefaultMaxTokens;  // -1: until the context is full
  int64_t ctx = 0;                         // 0: the model's
  int threads = 0;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  std::string ssd_cache;
  double ssd_cache_max_gb = 32;
  double prompt_cache_gb = 4;
  KvDtypeFlags kv;  // --kv-dtype, -ctk/-ctv
  SpecFlags spec;  // speculative decoding (spec_flags.h)
  std::vector<std::string> lora;  // --lora PATH[:SCALE], repeatable (LoRA adapters, issue 45)
};

void add_generation_flags(CLI::App* cmd, GenerationFlags& f);

// The model of a run: MODEL resolved (model_arg.h), --threads applied, loaded with the chat
// template the flags choose (the model's own when none). `located`, when given, receives what
// MODEL resolved to (its id names the model to the user).
Result<std::unique_ptr<runtime::LoadedModel>> load_for_generation(const ModelArg& model, const GenerationFlags& f,
                                                                  const runtime::ChatTemplateFlags& chat_template,
                                                                  runtime::LocatedModel* located = nullptr);

// The speculation of a run (spec_flags.h): the draft model, when there is one, loaded as the
// target is (kv dtype, map mode).
Result<SpecSetup> spec_for_generation(const ModelArg& model, const GenerationFlags& f, const runtime::LoadedModel& m);

// `--lora PATH[:SCALE]` (repeatable), on generate, chat and eval.
void add_lora_flag(CLI::App* cmd, std::vector<std::string>& specs);

// The --lora adapters of a run: each spec parsed, the adapter loaded, validated against the model
// (warnings printed) and bound to it; `request` is the forward's list (GenerateOptions::adapters)
// and the KV namespace (SequenceOptions::ns) — no adapters: the base's. `bound` keeps them alive.
struct RunLoras {
  std::vector<std::shared_ptr<const models::BoundLora>> bound;
  runtime::LoraRequest request;
};
Result<RunLoras> load_run_loras(const std::vector<std::string>& specs, const runtime::LoadedModel& m);
// The specs parsed (before the model loads, so a malformed one is reported first).
Status check_lora_specs(const std::vector<std::string>& specs);

// The structured-output flags as a grammar to compile, read and checked before the model loads
// (a missing file or a bad schema is reported first): nullopt without one. Errors: two of them
// given, an unreadable file, a JSON schema that does not parse or that check_json_schema refuses.
Result<std::optional<runtime::ConstraintSpec>> constraint_spec(const GenerationFlags& f);

// Sampling from the model's generation_config, overridden by the flags; EOS ids unless
// --ignore-eos; stop strings and the text of the model's tokenizer; the grammar of `spec`,
// compiled by the model's grammar engine (the server's). Errors: a logit bias that does not
// parse or names an id outside the vocabulary, a grammar that does not compile.
Result<runtime::GenerateOptions> generate_options(const GenerationFlags& f, const runtime::LoadedModel& m,
                                                  const std::optional<runtime::ConstraintSpec>& spec);

// The context a run uses: --ctx capped at the model's.
int64_t context_of(const GenerationFlags& f, const runtime::LoadedModel& m);

// The token budget for a prompt: -n capped at the room the context leaves (-1: all of it).
int64_t budget_for(const GenerationFlags& f, int64_t prompt_tokens, int64_t ctx);

// The KV store of one CLI run (RAM, plus the SSD tier with --ssd-cache).
Result<std::unique_ptr<memory::KvStore>> open_cli_store(const GenerationFlags& f, const runtime::LoadedModel& m);

// ---- text input (prompts, eval texts) -----------------------------------------------------
// What a verb reads from a file or standard input is bounded before it is read: /dev/zero or an
// endless pipe must end in a message, not fill memory. The bound is what the context can hold,
// at kMaxBytesPerToken bytes a token — generous: real text averages 3-5 bytes a token; only runs
// of whitespace (tokens of up to 512 spaces in some vocabularies) come near it — or, where no
// context bounds the text (`eval` over all chunks, `tokenize`), kMaxTextBytes.
inline constexpr uint64_t kMaxBytesPerToken = 64;
inline constexpr uint64_t kMaxTextBytes = 128ull << 20;

// The byte bound of a text that must fit `ctx_tokens` tokens, and its reason for messages.
struct TextLimit {
  uint64_t max_bytes = kMaxTextBytes;
  std::string why;  // e.g. "more than a context of 512 tokens can hold (at most 64 bytes a token)"
};
TextLimit text_limit_for_context(int64_t ctx_tokens);

struct TextRead {
  std::string text;
  bool truncated = false;  // only with allow_truncate: the first max_bytes bytes, more followed
};
// Reads `path` ("" = standard input) up to limit.max_bytes. One byte more is an error naming the
// source and the limit — "[tag] <source> is longer than N bytes: <why>; not read further" — and the
// rest is never read; with allow_truncate the first max_bytes are returned instead. A Ctrl-C
// during a blocked read returns kCancelled.
Result<TextRead> read_text_input(const std::string& path, const TextLimit& limit, const char* tag,
                                 bool allow_truncate = false);
// How read_text_input names its source in messages: "'FILE'" or "standard input".
std::string text_source_name(const std::string& path);

// ---- a chat answer ------------------------------------------------------------------------
// What `larder chat` and `generate --chat` show of an answer as it streams, and what the
// conversation keeps of it. Most models' text is both as it comes (a Qwen3 <think> block
// included, shown inline; its template drops it from later turns). A harmony model's output
// (gpt-oss: runtime::speaks_harmony; decode with GenerateOptions::special_text) is channel
// messages in special tokens, read by the server's HarmonyParser: the analysis channel is shown
// as a <think> block is, the final channel is the answer, and the turn keeps them as `thinking`
// and content (what gpt-oss's template renders: never marker text, which it refuses). A tool
// call (the CLI offers no tools) is named on stderr.
class ChatAnswer {
 public:
  using Sink = std::function<void(const std::string&)>;
  ChatAnswer(bool harmony, Sink out);
  void push(const std::string& piece);
  void finish();  // the answer ended (or was stopped): held text is shown, an open <think> closed
  runtime::ChatMessage message() const { return {"assistant", content_, reasoning_}; }

 private:
  void show(runtime::HarmonyParser::Out o);
  std::optional<runtime::HarmonyParser> harmony_;
  Sink out_;
  bool in_think_ = false;
  std::string content_, reasoning_;
};

// "prompt N tokens in S s (R tok/s) | generated ... | stop: X" (no "larder: " prefix, no newline).
std::string stats_text(const runtime::GenerateStats& s, const char* stop);

}  // namespace larder::cli
