// verbs.h — each CLI verb registers its subcommand and options; main() runs the chosen one.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "larder/core/status.h"
#include "larder/runtime/chat_template_choice.h"

namespace larder::cli {

using VerbMain = std::function<int()>;

VerbMain add_generate(CLI::App& app);
VerbMain add_tokenize(CLI::App& app);
VerbMain add_info(CLI::App& app);
VerbMain add_cache(CLI::App& app);
VerbMain add_serve(CLI::App& app);
VerbMain add_bench(CLI::App& app);
VerbMain add_quantize(CLI::App& app);
VerbMain add_eval(CLI::App& app);
VerbMain add_pull(CLI::App& app);
VerbMain add_ls(CLI::App& app);
VerbMain add_rm(CLI::App& app);
VerbMain add_chat(CLI::App& app);

// Prints "larder: <message>" to stderr and returns the exit code for `st`.
int report(const Status& st);

// --chat-template NAME|FILE|TEXT and --chat-template-file FILE (llama-server's flags) on `cmd`.
void add_chat_template_flags(CLI::App* cmd, runtime::ChatTemplateFlags* flags);

}  // namespace larder::cli
