// model_locator.h — the one model resolver every `larder` verb uses: what MODEL may name.
//
//   path/to/model.gguf          a GGUF file
//   path/to/hf-dir              a Hugging Face directory (config.json + safetensors)
//   path/to/folder              a folder of .gguf files: the only one, or the one QUANT picks
//   org/name                    a repo id already in the local Hugging Face cache (the layout
//                               huggingface_hub writes: $HF_HUB_CACHE, default $HF_HOME/hub, default
//                               ~/.cache/huggingface/hub; models--ORG--NAME/{refs/main, snapshots/REV/})
//   org/name:Q4_K_M, dir:Q8_0   pick one GGUF of several by its quantization (or its file name)
//   "" (serve only)             the most recently used model in that cache
//
// Nothing is downloaded here (that is `larder pull`). FIFOs, devices and sockets are
// refused before anything opens them (opening a FIFO blocks until a writer appears).
#pragma once

#include <string>
#include <vector>

#include "larder/core/status.h"

namespace larder::runtime {

struct LocatedModel {
  std::string path;  // directory or .gguf file to load
  std::string id;    // the id to serve it as: the repo id for cache entries, else the file/dir name
  std::string note;  // when a GGUF was picked out of a folder: which one and why (for stderr)
};

struct LocateOptions {
  bool hub_only = false;       // `-hf REPO[:QUANT]`: a repo id in the local cache, never a path
  bool allow_default = false;  // "" = the most recently used model in the cache (serve)
};

// The hub cache folder the environment selects.
std::string hf_hub_cache_dir();

Result<LocatedModel> locate_model(const std::string& spec, const LocateOptions& opts = {});

// The GGUF files directly inside `dir` that are language models (vision projectors `mmproj*`
// are not), sorted by name. Exposed for tests and messages.
std::vector<std::string> gguf_files_in(const std::string& dir);

}  // namespace larder::runtime
