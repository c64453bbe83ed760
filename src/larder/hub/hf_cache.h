// hf_cache.h — the Hugging Face hub cache layout, as huggingface_hub writes and reads it, so a
// model fetched by `larder pull` is a cache hit for huggingface_hub, transformers and mlx-lm,
// and what they fetched is listed by `larder ls`:
//
//   $HF_HUB_CACHE/models--ORG--NAME/
//     blobs/<etag>                 file contents, named by the Hub's etag (sha256 for LFS
//                                  files, git blob sha1 otherwise); <etag>.incomplete while
//                                  downloading
//     snapshots/<commit>/<path>    relative symlinks into blobs/
//     refs/<revision>              the commit a branch or tag pointed at when fetched
//   $HF_HUB_CACHE/.locks/models--ORG--NAME/<etag>.lock   flock()ed while a blob is written
//                                  (huggingface_hub's filelock uses the same files)
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "larder/core/status.h"

namespace larder::hub {

// "org/name" with the characters the Hub allows; a clear error otherwise.
Status validate_repo_id(const std::string& repo_id);
// "org/name" -> "models--org--name".
std::string repo_folder_name(const std::string& repo_id);
// "models--org--name" -> "org/name" ("" if not a model folder).
std::string repo_id_from_folder(const std::string& folder);

struct CachedSnapshot {
  std::string commit;
  std::string dir;
  std::vector<std::string> files;  // relative paths, symlinks whose blob exists
  std::vector<std::string> broken;  // symlinks whose blob is missing
};

struct CachedRepo {
  std::string repo_id;
  std::string dir;
  std::map<std::string, std::string> refs;  // revision -> commit
  std::vector<CachedSnapshot> snapshots;
  uint64_t blob_bytes = 0;        // complete blobs on disk
  uint64_t incomplete_bytes = 0;  // *.incomplete (resumable downloads)
};

// Every models--* folder of the cache (none if the cache does not exist).
std::vector<CachedRepo> scan_cache(const std::string& hub_dir);

// Writes refs/<revision> = commit atomically (temp file + rename); no-op if equal.
Status write_ref(const std::string& repo_dir, const std::string& revision, const std::string& commit);

// snapshots/<commit>/<file> -> ../../blobs/<etag> (one more ../ per directory level of file).
Status link_snapshot_file(const std::string& repo_dir, const std::string& commit, const std::string& file,
                          const std::string& etag);

// Removes one cached repo folder (and its lock folder) after checking it is a models--* folder
// directly inside hub_dir and no download holds one of its locks. Returns bytes freed.
Result<uint64_t> remove_cached_repo(const std::string& hub_dir, const std::string& repo_id);

}  // namespace larder::hub
