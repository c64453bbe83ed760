#include "larder/runtime/chat_template_choice.h"

#include <sys/stat.h>

#include "larder/core/mmap_file.h"

namespace larder::runtime {

namespace {

const BuiltinTemplate* find_builtin(const std::string& name) {
  for (const BuiltinTemplate& t : builtin_chat_templates()) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

std::string builtin_names() {
  std::string s;
  for (const BuiltinTemplate& t : builtin_chat_templates()) s += (s.empty() ? "" : ", ") + std::string(t.name);
  return s;
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

Result<ChosenTemplate> from_file(const std::string& path, const char* flag) {
  if (!is_regular_file(path)) {
    return not_found(strfmt("[chat] %s %s: no such file", flag, path.c_str()));
  }
  auto text = read_text_file(path);
  if (!text.is_ok()) return text.status();
  if (text->empty()) return invalid_argument(strfmt("[chat] %s %s: the file is empty", flag, path.c_str()));
  ChosenTemplate c;
  c.source = std::move(*text);
  c.origin = TemplateOrigin::kFile;
  c.detail = path;
  return c;
}

ChosenTemplate builtin(const BuiltinTemplate& t, TemplateOrigin origin) {
  ChosenTemplate c;
  c.source = t.source;
  c.origin = origin;
  c.detail = t.name;
  c.prepend_bos = true;
  return c;
}

}  // namespace

std::string ChosenTemplate::describe() const {
  switch (origin) {
    case TemplateOrigin::kModel: return "model (" + detail + ")";
    case TemplateOrigin::kFile: return "file " + detail;
    case TemplateOrigin::kBuiltin: return "built-in " + detail;
    case TemplateOrigin::kText: return "--chat-template text";
    case TemplateOrigin::kFallback: return detail + " (fallback)";
  }
  return detail;
}

std::string ChosenTemplate::header_value() const {
  switch (origin) {
    case TemplateOrigin::kModel: return "model";
    case TemplateOrigin::kFile: return "file";
    case TemplateOrigin::kText: return "text";
    default: return describe();
  }
}

Result<ChosenTemplate> choose_chat_template(const formats::ModelFiles& files, const ChatTemplateFlags& flags) {
  if (!flags.file.empty() && !flags.spec.empty()) {
    return invalid_argument("[chat] give --chat-template or --chat-template-file, not both");
  }
  if (!flags.file.empty()) return from_file(flags.file, "--chat-template-file");
  if (!flags.spec.empty()) {
    // A name first (as llama-server), then a file, then Jinja text: a template always holds a
    // '{{' or '{%', which no name and hardly any file path does.
    if (const BuiltinTemplate* t = find_builtin(flags.spec)) return builtin(*t, TemplateOrigin::kBuiltin);
    if (is_regular_file(flags.spec)) return from_file(flags.spec, "--chat-template");
    if (flags.spec.find("{{") != std::string::npos || flags.spec.find("{%") != std::string::npos) {
      ChosenTemplate c;
      c.source = flags.spec;
      c.origin = TemplateOrigin::kText;
      return c;
    }
    return invalid_argument(strfmt("[chat] --chat-template '%s' is not a built-in template (%s), an existing file, "
                                   "or Jinja text",
                                   flags.spec.c_str(), builtin_names().c_str()));
  }
  if (files.has_chat_template()) {
    ChosenTemplate c;
    c.source = files.chat_template;
    c.origin = TemplateOrigin::kModel;
    c.detail = files.chat_template_source;
    return c;
  }
  const BuiltinTemplate* chatml = find_builtin("chatml");
  LARDER_CHECK(chatml != nullptr, "chat_templates/chatml.jinja is compiled in");
  return builtin(*chatml, TemplateOrigin::kFallback);
}

}  // namespace larder::runtime
