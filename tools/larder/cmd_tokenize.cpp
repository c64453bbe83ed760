// larder tokenize MODEL --text TEXT [--add-special]: token ids as one JSON array on stdout.
#include <cstdio>

#include "larder/runtime/loaded_model.h"
#include "verbs.h"

namespace larder::cli {

VerbMain add_tokenize(CLI::App& app) {
  struct Opts {
    std::string model, text;
    bool add_special = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("tokenize", "print the token ids of a text as a JSON array");
  cmd->add_option("model", o->model, "model directory, tokenizer-only directory, or .gguf file")->required();
  cmd->add_option("--text", o->text, "text to tokenize (special-token strings are recognized)")->required();
  cmd->add_flag("--add-special", o->add_special, "add BOS/EOS as the tokenizer config says");
  return [o]() {
    runtime::LoadOptions lo;
    lo.weights = false;
    auto m = runtime::load_model(o->model, lo);
    if (!m.is_ok()) return report(m.status());
    std::vector<int32_t> ids = (*m)->tokenizer->encode(o->text, o->add_special);
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
