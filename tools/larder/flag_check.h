// flag_check.h — the command line before CLI11 sees it.
//
// 1. llama.cpp's single-dash long flags (`-hf`, `-ngl`, `-np`, `-sys`, ...) become larder's long
//    names: CLI11 would read `-hf` as `-h -f` and print the help. Any other single-dash word of
//    letters is read as `--word` (an unknown flag then, named as typed).
// 2. A flag the verb does not have is refused with one clear line: the larder equivalent for
//    llama.cpp-only flags (a hint table), else "did you mean --x?" by edit distance, else the
//    verb that has it. An unknown verb gets the nearest verb.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

namespace larder::cli {

// args: argv[1..] (rewritten in place). Returns an exit code when the line is refused (the
// message is printed), nullopt to go on parsing `args`.
std::optional<int> check_flags(CLI::App& app, std::vector<std::string>& args);

// Levenshtein distance (tests and suggestions).
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace larder::cli
