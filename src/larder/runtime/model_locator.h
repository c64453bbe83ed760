// model_locator.h — what `larder serve MODEL` may name: a model directory, a .gguf file, or a
// Hugging Face repo id already in the local Hugging Face cache (the layout huggingface_hub writes:
// $HF_HOME/hub/models--ORG--NAME/{refs/main, snapshots/REV/...}; HF_HOME defaults to
// ~/.cache/huggingface, HF_HUB_CACHE overrides the hub folder). Nothing is downloaded here.
#pragma once

#include <string>

#include "larder/core/status.h"

namespace larder::runtime {

struct LocatedModel {
  std::string path;  // directory or .gguf file to load
  std::string id;    // the id to serve it as: the repo id for cache entries, else the file/dir name
};

// The hub cache folder the environment selects.
std::string hf_hub_cache_dir();

// spec: a path, an "org/name" repo id in the cache, or "" for the most recently used model there.
Result<LocatedModel> locate_model(const std::string& spec);

}  // namespace larder::runtime
