#include "larder/hub/digest.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "larder/core/status.h"

namespace larder::hub {

struct Digest::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Digest::Digest(Kind kind, uint64_t size) : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  LARDER_CHECK(impl_->ctx != nullptr);
  LARDER_CHECK(EVP_DigestInit_ex(impl_->ctx, kind == Kind::kSha256 ? EVP_sha256() : EVP_sha1(), nullptr) == 1);
  if (kind == Kind::kGitBlobSha1) {
    const std::string head = "blob " + std::to_string(size);
    update(head.c_str(), head.size() + 1);  // with the terminating NUL
  }
}

Digest::~Digest() { EVP_MD_CTX_free(impl_->ctx); }

void Digest::update(const void* data, size_t n) { EVP_DigestUpdate(impl_->ctx, data, n); }

std::string Digest::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(impl_->ctx, md, &len);
  static const char* h = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < len; ++i) {
    s += h[md[i] >> 4];
    s += h[md[i] & 15];
  }
  return s;
}

Status digest_file_prefix(const std::string& path, uint64_t n, Digest& d) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return io_error(strfmt("[pull] %s: %s", path.c_str(), std::strerror(errno)));
  std::vector<char> buf(1 << 20);
  uint64_t left = n;
  while (left > 0) {
    const size_t want = left < buf.size() ? static_cast<size_t>(left) : buf.size();
    const size_t got = std::fread(buf.data(), 1, want, f);
    if (got == 0) break;
    d.update(buf.data(), got);
    left -= got;
  }
  std::fclose(f);
  if (left) return io_error(strfmt("[pull] %s: shorter than the %llu bytes expected", path.c_str(),
                                   static_cast<unsigned long long>(n)));
  return Status::ok();
}

}  // namespace larder::hub
