// loaded_model.h — everything needed to serve one model, loaded once: the mapped files, the
// weights bound to an architecture, the tokenizer, the chat template and the generation
// defaults from generation_config.json. Shared by the CLI verbs and the server.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "larder/core/status.h"
#include "larder/formats/model_files.h"
#include "larder/models/model.h"
#include "larder/runtime/chat_template_choice.h"
#include "larder/runtime/generate.h"
#include "larder/runtime/grammar.h"
#include "larder/runtime/sampler.h"
#include "larder/tokenizer/chat_template/chat_template.h"
#include "larder/tokenizer/tokenizer.h"

namespace larder::runtime {

struct LoadOptions {
  bool weights = true;  // false: tokenizer + template only (`larder tokenize`)
  ChatTemplateFlags chat_template;  // --chat-template / --chat-template-file (chat_template_choice.h)
  // Dtype of the KV rows (Model::set_kv_dtype): f32 here, the exact default of the library and
  // its tests; the CLI verbs and the server default to f16 (--kv-dtype).
  DType kv_dtype = DType::kF32;
  // kCopy: weights read into private huge-page memory instead of mapped (`--no-mmap`; MapMode).
  MapMode map_mode = MapMode::kMap;
};

// Defaults a request starts from (generation_config.json, then the tokenizer), before flags or
// request fields override them.
struct GenerationDefaults {
  SamplingParams sampling;            // greedy unless generation_config says do_sample
  std::vector<int32_t> eos_ids;       // config eos_token_id ∪ generation_config ∪ tokenizer eos
  int64_t max_new_tokens = kDefaultMaxTokens;
};

struct LoadedModel {
  formats::ModelFiles files;
  std::unique_ptr<models::Model> model;           // null when loaded without weights
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::optional<chat_template::Template> chat_template;  // the chosen one (always set after load_model)
  ChosenTemplate template_choice;                        // its text and where it came from
  GenerationDefaults defaults;
  // Constrained decoding over this model's vocabulary (null when loaded without weights).
  std::shared_ptr<GrammarEngine> grammar;
  double load_seconds = 0;
};

Result<std::unique_ptr<LoadedModel>> load_model(const std::string& path, const LoadOptions& opts = {});

// The one check that a prompt's ids can be embedded (every route and verb calls it after its
// prompt became ids): a tokenizer may hold added tokens past the model's vocabulary (Gemma's
// <image_soft_token>), and text or raw ids can name them. The error names the id, its token and
// its position. Without weights loaded the tokenizer's size bounds the ids.
Status check_prompt(const LoadedModel& m, std::span<const int32_t> prompt);

// Logs the chat template when it is not the model's own: a warning for the ChatML fallback
// (serve at startup, generate --chat), an info line for a chosen one.
void announce_chat_template(const LoadedModel& m);

// The template in use speaks OpenAI's harmony format (gpt-oss): it writes <|channel|> headers and
// the vocabulary has the marker tokens the output is parsed by (runtime/harmony.h). Such a model's
// chat output is decoded with its special tokens as text (DecodeOptions::special_text) and read
// with HarmonyParser — by serve's routes and by `larder chat` / `generate --chat` alike.
bool speaks_harmony(const LoadedModel& m);

struct ChatMessage {
  std::string role;
  std::string content;
  std::string thinking = {};  // an assistant turn's reasoning (the template's `thinking` field); empty: none
};

// Renders messages with the model's own template and tokenizes the result the way HF
// `apply_chat_template(tokenize=True)` does: the template writes the special tokens, encoding
// adds none.
Result<std::vector<int32_t>> encode_chat(const LoadedModel& m, const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt, std::string* rendered = nullptr);

// The same for messages already in the HF/OpenAI JSON shape (content strings or parts, tool
// calls, reasoning fields), with tools and extra template kwargs (chat_template_kwargs).
struct ChatEncodeOptions {
  bool add_generation_prompt = true;
  // The last message is an assistant message to continue (Anthropic's prefill, llama-server's
  // prefill_assistant, vLLM's continue_final_message): the messages before it are rendered with
  // the generation prompt and its text is appended as is, so the answer carries on from it.
  bool continue_final_message = false;
  nlohmann::ordered_json tools;  // null = none
  nlohmann::ordered_json extra;  // object of extra template variables, or null
};
Result<std::vector<int32_t>> encode_chat_json(const LoadedModel& m, const nlohmann::ordered_json& messages,
                                              const ChatEncodeOptions& opts, std::string* rendered = nullptr);

// Where the last `max_ends` messages of a chat end in its prompt ids (the template's turn ends,
// the last message's included: it ends where the generation prompt starts),
// ascending, for the KV store's boundary checkpoints (runtime::SequenceOptions::message_ends).
// `rendered` and `ids` are encode_chat_json's result for the same messages and options. A message
// counts only where the chat cut after it renders (without the generation prompt) to a prefix of
// `rendered` that ends on a token boundary of `ids`: a template that renders an earlier message
// differently once more follow (Qwen3's reasoning of the latest answer) offers no boundary there.
// Costs one render per message tried; never fails (what cannot be found is left out).
std::vector<int64_t> chat_message_ends(const LoadedModel& m, const nlohmann::ordered_json& messages,
                                       const ChatEncodeOptions& opts, const std::string& rendered,
                                       std::span<const int32_t> ids, size_t max_ends = 8);

}  // namespace larder::runtime
