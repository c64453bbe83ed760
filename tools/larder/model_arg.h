// model_arg.h — the MODEL argument, one way for every verb that loads a model: the positional,
// `-m/--model` (llama.cpp's spelling), `-hf REPO[:QUANT]` (a repo in the local Hugging Face
// cache), all resolved by runtime::locate_model; plus the llama.cpp flags accepted for habit
// that change nothing here (`-ngl/--n-gpu-layers`: larder runs on the CPU; `--jinja`: the
// model's Jinja template is always used); and `--no-mmap`, as llama.cpp's.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "larder/core/mmap_file.h"
#include "larder/runtime/model_locator.h"

namespace larder::cli {

struct ModelArg {
  std::string positional, model, hf;
  std::optional<int> n_gpu_layers;
  bool jinja = false;
  bool no_mmap = false;  // --no-mmap: read the weights into huge-page memory (MapMode::kCopy)
};

// How the weights of the model the flags name reach memory (--no-mmap: copied, else mapped).
inline MapMode map_mode(const ModelArg& a) { return a.no_mmap ? MapMode::kCopy : MapMode::kMap; }

// what: help text of the positional (e.g. "model: directory, .gguf file, folder of GGUFs or repo id").
void add_model_arg(CLI::App* cmd, ModelArg& a, const std::string& what);

// The one model the flags name (an error when none, or when two disagree); prints to stderr which
// GGUF was picked from a folder, and the note for -ngl.
Result<runtime::LocatedModel> resolve_model(const ModelArg& a, bool allow_default = false);

// The same for a plain path/repo argument (eval kl's candidate, quantize's source).
Result<runtime::LocatedModel> resolve_model(const std::string& spec);

// The help text shared by the MODEL positionals.
extern const char* const kModelHelp;

}  // namespace larder::cli
