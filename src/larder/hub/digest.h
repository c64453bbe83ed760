// digest.h — the two hashes the Hub names files by: sha256 of the content for LFS files (their
// etag), and git's blob id, sha1("blob <size>\0" + content), for files stored in git itself.
// OpenSSL's libcrypto does the hashing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "larder/core/status.h"

namespace larder::hub {

class Digest {
 public:
  enum class Kind { kSha256, kGitBlobSha1 };
  // kGitBlobSha1 needs the content size up front (it is hashed before the content).
  Digest(Kind kind, uint64_t size = 0);
  ~Digest();
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;
  void update(const void* data, size_t n);
  std::string hex();  // finishes the digest

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Hashes the first `n` bytes of a file into `d` (resuming a partial download).
Status digest_file_prefix(const std::string& path, uint64_t n, Digest& d);

}  // namespace larder::hub
