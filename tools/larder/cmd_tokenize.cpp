// larder tokenize MODEL --text TEXT | -f FILE [--add-special]: token ids as one JSON array on stdout.
#include <cstdio>
#include <optional>

#include "generation_setup.h"
#include "larder/runtime/loaded_model.h"
#include "model_arg.h"
#include "verbs.h"

namespace larder::cli {

VerbMain add_tokenize(CLI::App& app) {
  struct Opts {
    ModelArg model;
    std::optional<std::string> text;
    std::string file;
    bool add_special = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("tokenize", "print the token ids of a text as a JSON array");
  add_model_arg(cmd, o->model, std::string(kModelHelp) + "; or a tokenizer-only directory");
  cmd->add_option("--text,-p,--prompt", o->text, "text to tokenize (special-token strings are recognized)");
  cmd->add_option("-f,--file", o->file, "read the text from this file");
  cmd->add_flag("--add-special", o->add_special, "add BOS/EOS as the tokenizer config says");
  return [o]() {
    runtime::LoadOptions lo;
    lo.weights = false;
    if (o->text.has_value() == !o->file.empty()) {
      return report(invalid_argument("[tokenize] give the text with --text TEXT or -f FILE (one of them)"));
    }
    if (!o->file.empty()) {
      // Bounded (generation_setup.h): -f /dev/zero ends in a message, not in an endless read.
      auto t = read_text_input(o->file, text_limit_for_context(0x7fffffffffffffffLL), "tokenize");
      if (!t.is_ok()) return report(t.status());
      o->text = std::move(t->text);
    }
    auto located = resolve_model(o->model);
    if (!located.is_ok()) return report(located.status());
    auto m = runtime::load_model(located->path, lo);
    if (!m.is_ok()) return report(m.status());
    std::vector<int32_t> ids = (*m)->tokenizer->encode(*o->text, o->add_special);
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ", ";
      out += std::to_string(ids[i]);
    }
    out += "]\n";
    std::fputs(out.c_str(), stdout);
    return 0;
  };
}

}  // namespace larder::cli
