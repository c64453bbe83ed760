// cache_admin.h — offline operations on an SSD cache directory, for `larder cache
// ls|inspect|verify|clear DIR` (the CLI wires these; no model needs to be loaded).
//
// They read headers with the same validating reader the server uses and never modify a file
// except `cache_clear`, which removes only the cache's own files (cache_dir.h: a valid LKV1
// prefix, never through a link) — everything else stays and is reported. Every verb refuses a
// folder that is not a larder cache (no marker and not the cache's layout) before reading it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "larder/core/status.h"

namespace larder::memory {

struct CacheFileInfo {
  std::string path;
  std::string identity_dir;  // the <identity-id> directory the file lives in
  std::string identity_id;   // recomputed from the header (differs from identity_dir = misplaced)
  std::string model_label;
  std::string ns;
  int64_t n_tokens = 0;
  uint64_t file_bytes = 0, allocated_bytes = 0;
  int64_t created_ms = 0;
  std::string label;
  bool trimmable = false;
  bool temp = false;    // an interrupted write (*.lkv.tmp)
  Status status;        // header-level validity (tensor checksums: cache_verify)
};

// Every LKV1 file under DIR (all identities), headers only.
Result<std::vector<CacheFileInfo>> cache_ls(const std::string& dir);
// The full header of one file plus its prefix fields, as JSON.
Result<nlohmann::json> cache_inspect(const std::string& path);

struct VerifyReport {
  std::string path;
  Status status;      // ok, or why the file would be a miss
  double seconds = 0; // time to verify every checksum
  uint64_t bytes = 0;
};
// Verifies every checksum of one file, or of every .lkv under a directory.
Result<std::vector<VerifyReport>> cache_verify(const std::string& dir_or_file);

struct ClearReport {
  size_t files_removed = 0;
  uint64_t bytes_removed = 0;  // allocated bytes
  size_t dirs_removed = 0;     // namespace and identity folders left empty
  std::vector<std::string> kept;    // "PATH: why" of everything left that is not the cache's own
  std::vector<std::string> errors;  // removals that failed
};
// Removes the cache's own files under DIR (only those of `identity_id` when given), then its
// namespace and identity folders that are left empty. Refuses (invalid_argument, nothing
// removed) a folder that is not a larder cache.
Result<ClearReport> cache_clear(const std::string& dir, const std::optional<std::string>& identity_id = std::nullopt);

}  // namespace larder::memory
