// fuzz_util.h — what the libFuzzer targets of this folder share.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "larder/core/log.h"
#include "larder/formats/tensor.h"

namespace larder::fuzz {

// The readers under test take a path: each input is written to one scratch file per process
// (under $TMPDIR, /tmp by default) and read back from there.
inline const std::string& scratch_path(const char* target) {
  struct Scratch {
    std::string path;
    ~Scratch() { ::unlink(path.c_str()); }
  };
  static const Scratch s{[&] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/larder-fuzz-" + target + "-" + std::to_string(::getpid());
  }()};
  return s.path;
}

inline const std::string& write_scratch(const char* target, const uint8_t* data, size_t size) {
  const std::string& path = scratch_path(target);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::perror(path.c_str());
    std::abort();
  }
  size_t done = 0;
  while (done < size) {
    const ssize_t w = ::write(fd, data + done, size - done);
    if (w <= 0) std::abort();
    done += static_cast<size_t>(w);
  }
  ::close(fd);
  return path;
}

// Findings are crashes and sanitizer reports; the targets' own error logging is noise.
inline void quiet() { set_log_level(LogLevel::kError); }

// What a reader promises about every tensor it accepts: the shape's element count, computed
// without overflow, is a whole number of blocks, and `nbytes` is exactly their size — so code
// that walks the shape never leaves the bytes. Aborts (a finding) otherwise.
inline void check_tensor(const formats::TensorInfo& t) {
  unsigned __int128 n = 1;
  for (int64_t d : t.shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<unsigned __int128>(d), &n)) {
      std::fprintf(stderr, "tensor '%s': shape %s overflows\n", t.name.c_str(), t.shape_str().c_str());
      std::abort();
    }
  }
  const DTypeInfo& di = dtype_info(t.dtype);
  if (n % di.block_elems != 0 || n / di.block_elems * di.block_bytes != t.nbytes) {
    std::fprintf(stderr, "tensor '%s': %s %s claims %llu bytes\n", t.name.c_str(), di.name, t.shape_str().c_str(),
                 static_cast<unsigned long long>(t.nbytes));
    std::abort();
  }
}

inline std::string shared_dir() {
  const char* env = std::getenv("LARDER_SHARED_DIR");
  return env && *env ? env : LARDER_SHARED_DIR;
}

}  // namespace larder::fuzz
