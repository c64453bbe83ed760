// pull.h — `larder pull REPO[:FILE|QUANT] [--revision R]`: fetch a model from the Hugging Face
// Hub into the shared hub cache (hf_cache.h), the way huggingface_hub does it:
//
//   GET  {endpoint}/api/models/{repo}/revision/{rev}?blobs=true   commit sha + file list
//   HEAD {endpoint}/{repo}/resolve/{commit}/{file}                 X-Linked-Etag / ETag, X-Linked-Size,
//                                                                 X-Repo-Commit (relative redirects followed)
//   GET  same URL, redirects followed (CDN), Range: bytes=N-      the content, resumed
//
// Each blob is written as blobs/<etag>.incomplete under the blob's lock, resumed from where it
// stopped, hashed while written (sha256 for LFS files, git blob sha1 for small ones) and renamed
// to blobs/<etag> only when size and hash match; only then is the snapshot symlink made, so
// nothing half-written ever looks complete. refs/<revision> is written last.
//
// Environment: HF_ENDPOINT (default https://huggingface.co), HF_TOKEN (else $HF_HOME/token),
// HF_HUB_CACHE / HF_HOME, HF_HUB_OFFLINE (refuses).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "larder/core/status.h"

namespace larder::hub {

struct PullOptions {
  std::string spec;             // REPO, REPO:FILE or REPO:QUANT (e.g. Q4_K_M)
  std::string revision = "main";
  bool list_only = false;       // print the repo's files / quantizations, download nothing
  bool interactive = false;     // may ask on the terminal which quantization to take
  int max_attempts = 5;         // per file, for dropped connections (each resumes)
};

struct PullResult {
  std::string repo_id;
  std::string commit;
  std::string snapshot_dir;
  std::string model_path;  // the snapshot dir (HF checkpoint) or the first .gguf in it
  std::vector<std::string> files;
  uint64_t downloaded_bytes = 0;  // fetched this run
  uint64_t reused_bytes = 0;      // already complete in the cache
};

Result<PullResult> pull_model(const PullOptions& opts);

// The GGUF quantization named in a file name ("Q4_K_M", "IQ4_XS", "BF16"), or "".
std::string gguf_quant_of(const std::string& filename);

}  // namespace larder::hub
