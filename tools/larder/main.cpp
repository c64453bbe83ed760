// larder — command-line entry point. Each verb lives in its own cmd_<verb>.cpp.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "flag_check.h"
#include "verbs.h"

namespace larder::cli {

int report(const Status& st) {
  std::fprintf(stderr, "larder: %s\n", st.message().c_str());
  switch (st.code()) {
    case StatusCode::kInvalidArgument: return 2;
    case StatusCode::kNotFound: return 3;
    default: return 1;
  }
}

void add_chat_template_flags(CLI::App* cmd, runtime::ChatTemplateFlags* flags) {
  std::string names;
  for (const auto& t : runtime::builtin_chat_templates()) names += (names.empty() ? "" : ", ") + std::string(t.name);
  cmd->add_option("--chat-template", flags->spec,
                  "chat template instead of the model's: a built-in name (" + names +
                      "), a file, or the Jinja text; without one, a model lacking a template chats with ChatML");
  cmd->add_option("--chat-template-file", flags->file, "chat template file (Jinja) instead of the model's");
}

}  // namespace larder::cli

int main(int argc, char** argv) {
  CLI::App app{"larder — LLM inference engine and server for Linux CPUs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "larder 0.1.0");
  // Every option's help shows its default (inherited by the verbs added below).
  app.option_defaults()->always_capture_default();
  std::map<std::string, larder::cli::VerbMain> verbs;
  verbs["generate"] = larder::cli::add_generate(app);
  verbs["chat"] = larder::cli::add_chat(app);
  verbs["tokenize"] = larder::cli::add_tokenize(app);
  verbs["info"] = larder::cli::add_info(app);
  verbs["cache"] = larder::cli::add_cache(app);
  verbs["serve"] = larder::cli::add_serve(app);
  verbs["bench"] = larder::cli::add_bench(app);
  verbs["quantize"] = larder::cli::add_quantize(app);
  verbs["eval"] = larder::cli::add_eval(app);
  verbs["pull"] = larder::cli::add_pull(app);
  verbs["ls"] = larder::cli::add_ls(app);
  verbs["rm"] = larder::cli::add_rm(app);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (auto refused = larder::cli::check_flags(app, args)) return *refused;
  std::vector<char*> rewritten{argv[0]};
  for (std::string& a : args) rewritten.push_back(a.data());
  try {
    app.parse(static_cast<int>(rewritten.size()), rewritten.data());
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;  // --help and --version exit 0; every refused command line 2
  }
  for (auto* sub : app.get_subcommands()) {
    auto it = verbs.find(sub->get_name());
    if (it != verbs.end()) return it->second();
  }
  return 2;
}
