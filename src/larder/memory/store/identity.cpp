#include "larder/memory/store/identity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include <xxhash.h>

namespace larder::memory {

namespace {

struct StateDeleter {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};
using Xxh128 = std::unique_ptr<XXH3_state_t, StateDeleter>;

Xxh128 new_state() {
  Xxh128 s(XXH3_createState());
  XXH3_128bits_reset(s.get());
  return s;
}

// Length-prefixed fields so ("ab","c") and ("a","bc") hash differently.
void add_field(XXH3_state_t* s, std::string_view f) {
  const uint64_t n = f.size();
  XXH3_128bits_update(s, &n, sizeof n);
  XXH3_128bits_update(s, f.data(), f.size());
}

std::string digest(XXH3_state_t* s) {
  XXH128_hash_t h = XXH3_128bits_digest(s);
  return hex128(h.high64, h.low64);
}

}  // namespace

std::string hex64(uint64_t v) { return strfmt("%016llx", static_cast<unsigned long long>(v)); }
std::string hex128(uint64_t high, uint64_t low) { return hex64(high) + hex64(low); }

std::string identity_id(const StoreIdentity& id) {
  Xxh128 s = new_state();
  const uint32_t v = kIdentityRecipeVersion;
  XXH3_128bits_update(s.get(), &v, sizeof v);
  add_field(s.get(), id.weights_id);
  add_field(s.get(), id.config_fp);
  add_field(s.get(), id.kv_scheme);
  add_field(s.get(), id.tokenizer_fp);
  add_field(s.get(), id.numerics_id);
  return digest(s.get());
}

std::string namespace_id(const std::vector<AdapterRef>& adapters, std::string_view cache_salt) {
  if (adapters.empty() && cache_salt.empty()) return "base";
  Xxh128 s = new_state();
  const uint32_t v = kIdentityRecipeVersion;
  XXH3_128bits_update(s.get(), &v, sizeof v);
  for (const AdapterRef& a : adapters) {  // application order matters: it is not sorted
    add_field(s.get(), "adapter");
    add_field(s.get(), a.content_hash);
    XXH3_128bits_update(s.get(), &a.scale, sizeof a.scale);
  }
  if (!cache_salt.empty()) {
    add_field(s.get(), "salt");
    add_field(s.get(), cache_salt);
  }
  return digest(s.get());
}

std::string entry_id(std::string_view ns, std::span<const int32_t> tokens) {
  Xxh128 s = new_state();
  add_field(s.get(), ns);
  // u32 LE ids; x86-64 and aarch64 Linux are little-endian.
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "LKV1 ids assume a little-endian host");
  XXH3_128bits_update(s.get(), tokens.data(), tokens.size() * sizeof(int32_t));
  return digest(s.get());
}

namespace {

Status hash_file(XXH3_state_t* s, const std::string& path, bool sampled) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error(strfmt("[kv-identity] %s: cannot open: %s", path.c_str(), std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return io_error(strfmt("[kv-identity] %s: fstat failed", path.c_str()));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  XXH3_128bits_update(s, &size, sizeof size);
  std::vector<uint8_t> buf(1 << 20);
  auto read_at = [&](uint64_t off, size_t len) -> Status {
    size_t done = 0;
    while (done < len) {
      ssize_t r = ::pread(fd, buf.data(), std::min(len - done, buf.size()), static_cast<off_t>(off + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return io_error(strfmt("[kv-identity] %s: read failed", path.c_str()));
      XXH3_128bits_update(s, buf.data(), static_cast<size_t>(r));
      done += static_cast<size_t>(r);
    }
    return Status::ok();
  };
  Status st_read;
  if (!sampled) {
    st_read = read_at(0, size);
  } else {
    st_read = read_at(0, std::min<uint64_t>(size, 1 << 20));
    constexpr uint64_t kSample = 64 << 10;
    for (int i = 0; i < 16 && st_read.is_ok() && size > kSample; ++i) {
      const uint64_t off = (size - kSample) * static_cast<uint64_t>(i) / 15;
      st_read = read_at(off, kSample);
    }
  }
  ::close(fd);
  return st_read;
}

Result<std::string> hash_files(const std::vector<std::string>& paths, bool sampled) {
  Xxh128 s = new_state();
  for (const std::string& p : paths) LARDER_RETURN_IF_ERROR(hash_file(s.get(), p, sampled));
  return digest(s.get());
}

}  // namespace

Result<std::string> content_hash(const std::vector<std::string>& paths) { return hash_files(paths, false); }
Result<std::string> weights_fingerprint(const std::vector<std::string>& paths) { return hash_files(paths, true); }

}  // namespace larder::memory
