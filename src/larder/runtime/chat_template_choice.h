// chat_template_choice.h — which chat template a loaded model renders chats with, and why.
//
// In order: `--chat-template-file FILE`, `--chat-template NAME|FILE|TEXT` (llama-server's two
// flags), the model's own template (chat_template.jinja, chat_template.json,
// tokenizer_config.json, GGUF tokenizer.chat_template), and for a model that has none the
// built-in ChatML template as a fallback — what llama-server does too. The fallback is announced
// (log line at load, `X-Larder-Chat-Template: chatml (fallback)` on every chat response, `larder
// info`) because it is a guess: a base model or a family with another format answers worse with
// it than with its own.
#pragma once

#include <string>
#include <vector>

#include "larder/core/status.h"
#include "larder/formats/model_files.h"

namespace larder::runtime {

struct BuiltinTemplate {
  const char* name;
  const char* source;
};
// chat_templates/*.jinja, compiled in (chatml, gemma, llama3, phi3, zephyr), sorted by name.
const std::vector<BuiltinTemplate>& builtin_chat_templates();

struct ChatTemplateFlags {
  std::string spec;  // --chat-template: a built-in name, a file path, or the Jinja text itself
  std::string file;  // --chat-template-file
};

enum class TemplateOrigin { kModel, kFile, kBuiltin, kText, kFallback };

struct ChosenTemplate {
  std::string source;   // the Jinja text
  TemplateOrigin origin = TemplateOrigin::kModel;
  std::string detail;   // model: where in the model; file: the path; built-in: the name
  // Templates larder supplies (built-in names and the fallback) never write BOS themselves: like
  // llama-server, the tokenizer's BOS goes in front when the tokenizer adds one. A model's own
  // template or a user's writes every special token it wants (HF apply_chat_template).
  bool prepend_bos = false;

  // For logs and `larder info`: "model (GGUF tokenizer.chat_template)", "file /x.jinja",
  // "built-in llama3", "--chat-template text", "chatml (fallback)".
  std::string describe() const;
  // For the X-Larder-Chat-Template response header: as describe() but without file paths.
  std::string header_value() const;
};

// Resolves the flags against the model's files. Errors name the flag and the value: an unknown
// name that is not a file either, an unreadable file, both flags at once.
Result<ChosenTemplate> choose_chat_template(const formats::ModelFiles& files, const ChatTemplateFlags& flags);

}  // namespace larder::runtime
