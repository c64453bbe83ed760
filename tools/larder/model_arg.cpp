#include "model_arg.h"

#include <cstdio>

namespace larder::cli {

const char* const kModelHelp =
    "a .gguf file, a Hugging Face model directory, a folder of GGUF files, or a repo id in the local "
    "Hugging Face cache; DIR:QUANT or ORG/NAME:QUANT picks one GGUF by quantization (e.g. :Q4_K_M)";

void add_model_arg(CLI::App* cmd, ModelArg& a, const std::string& what) {
  cmd->add_option("model", a.positional, what.empty() ? kModelHelp : what);
  cmd->add_option("-m,--model", a.model, "the model, as a flag (llama.cpp's -m)");
  cmd->add_option("--hf,--hf-repo", a.hf,
                  "ORG/NAME[:QUANT]: a repo in the local Hugging Face cache (llama.cpp's -hf; fetch it first with "
                  "`larder pull`)");
  cmd->add_option("--n-gpu-layers,--gpu-layers", a.n_gpu_layers,
                  "accepted for llama.cpp habit (-ngl); larder runs on the CPU, so it changes nothing");
  cmd->add_flag("--jinja", a.jinja, "accepted for llama.cpp habit; the model's Jinja chat template is always used");
  cmd->add_flag("--no-mmap", a.no_mmap,
                "read the weights into private huge-page memory instead of mapping the file (llama.cpp's --no-mmap): "
                "the whole file is read at start and kept as a private copy, and decode streams it through 2 MiB "
                "pages even when the file's page cache holds 4 KiB pages (a freshly downloaded or converted file)");
}

namespace {

Result<runtime::LocatedModel> note(Result<runtime::LocatedModel> r) {
  if (r.is_ok() && !r->note.empty()) std::fprintf(stderr, "larder: %s\n", r->note.c_str());
  return r;
}

}  // namespace

Result<runtime::LocatedModel> resolve_model(const ModelArg& a, bool allow_default) {
  const int given = !a.positional.empty() + !a.model.empty() + !a.hf.empty();
  if (given > 1) {
    return invalid_argument(strfmt("[model] the model is given %d times (%s%s%s); give one", given,
                                   a.positional.empty() ? "" : ("MODEL " + a.positional + " ").c_str(),
                                   a.model.empty() ? "" : ("-m " + a.model + " ").c_str(),
                                   a.hf.empty() ? "" : ("-hf " + a.hf).c_str()));
  }
  if (a.n_gpu_layers) {
    std::fprintf(stderr, "larder: note: -ngl/--n-gpu-layers is ignored: larder runs on the CPU\n");
  }
  if (!a.hf.empty()) {
    runtime::LocateOptions o;
    o.hub_only = true;
    return note(runtime::locate_model(a.hf, o));
  }
  const std::string& spec = a.model.empty() ? a.positional : a.model;
  if (spec.empty() && !allow_default) {
    return invalid_argument("[model] no model given: pass MODEL (a .gguf file, a directory or a repo id), -m MODEL "
                            "or -hf ORG/NAME[:QUANT]");
  }
  runtime::LocateOptions o;
  o.allow_default = allow_default;
  return note(runtime::locate_model(spec, o));
}

Result<runtime::LocatedModel> resolve_model(const std::string& spec) { return note(runtime::locate_model(spec)); }

}  // namespace larder::cli
