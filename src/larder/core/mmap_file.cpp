#include "larder/core/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "larder/core/log.h"

namespace larder {

namespace {

// Maps the whole file read-only at a 2 MiB-aligned address and asks for huge pages. The page
// cache keeps large files in large folios; a 2 MiB-aligned mapping (file offset 0 at a 2 MiB
// boundary) lets the kernel map them with PMD entries, so streaming a weight matrix touches one
// TLB entry per 2 MiB instead of one per 4 KiB. Whether the kernel can do it depends on how the
// file entered the page cache: pages read through this mapping (MADV_HUGEPAGE readahead) come in
// 2 MiB folios; pages cached earlier in small folios stay 4 KiB-mapped. Measured (bench/RESULTS.md,
// MLX q4 1B, 1 thread, after dropping caches): FilePmdMapped 594 MB, decode 51–55 → 56–57 tok/s.
// Falls back to a plain mapping when the reservation fails; the advice is best effort.
// LARDER_MMAP_HUGE=0 maps plainly (A/B measurements).
void* map_aligned(int fd, size_t size) {
  constexpr size_t kHuge = size_t{2} << 20;
  static const bool off = [] {
    const char* e = std::getenv("LARDER_MMAP_HUGE");
    return e && std::strcmp(e, "0") == 0;
  }();
  if (off || size < kHuge) return ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  void* res = ::mmap(nullptr, size + kHuge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (res == MAP_FAILED) return ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const uintptr_t base = reinterpret_cast<uintptr_t>(res);
  const uintptr_t aligned = (base + kHuge - 1) & ~(kHuge - 1);
  void* p = ::mmap(reinterpret_cast<void*>(aligned), size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    // A failed MAP_FIXED may have unmapped part of the reservation already, and another thread may
    // have mapped into the hole since; leave the (PROT_NONE, unreserved) range alone rather than
    // risk unmapping someone else's memory.
    return ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  }
  // Release the parts of the reservation outside the file mapping.
  if (aligned > base) ::munmap(res, aligned - base);
  const uintptr_t end = aligned + ((size + 4095) & ~size_t{4095});
  if (base + size + kHuge > end) ::munmap(reinterpret_cast<void*>(end), base + size + kHuge - end);
  ::madvise(p, size, MADV_HUGEPAGE);
  return p;
}

// Reads `size` bytes of fd into anonymous memory at a 2 MiB boundary, advised into huge pages
// before the first write so the kernel backs it with 2 MiB pages as the read fills it. Returns
// the reservation (region, bytes) and the data pointer, or an error naming the file.
Status copy_aligned(int fd, size_t size, const std::string& path, void** region, size_t* region_bytes,
                    uint8_t** data) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = (size + kHuge - 1) / kHuge * kHuge + kHuge;
  void* res = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (res == MAP_FAILED) {
    return Status(StatusCode::kOutOfMemory,
                  strfmt("[mmap] %s: cannot allocate %zu MiB to read the file into (--no-mmap): %s", path.c_str(),
                         bytes >> 20, std::strerror(errno)));
  }
  auto* p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(res) + kHuge - 1) & ~(kHuge - 1));
  ::madvise(p, bytes - kHuge, MADV_HUGEPAGE);
  size_t done = 0;
  while (done < size) {
    const ssize_t r = ::pread(fd, p + done, std::min<size_t>(size - done, size_t{64} << 20), static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int e = errno;
      ::munmap(res, bytes);
      if (r == 0) {
        return io_error(
            strfmt("[mmap] %s: file ended at byte %zu of %zu while reading it", path.c_str(), done, size));
      }
      return io_error(strfmt("[mmap] %s: read failed at byte %zu: %s", path.c_str(), done, std::strerror(e)));
    }
    done += static_cast<size_t>(r);
  }
  // Read-only from here on, like a mapping: a stray write faults instead of changing weights.
  ::mprotect(res, bytes, PROT_READ);
  *region = res;
  *region_bytes = bytes;
  *data = p;
  return Status::ok();
}

}  // namespace

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path, MapMode mode) {
  // O_NONBLOCK: opening a FIFO (or a device) would otherwise block until a writer appears; it
  // is refused below as not a regular file instead. It changes nothing for regular files.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) return not_found(strfmt("[mmap] %s: file not found", path.c_str()));
    return io_error(strfmt("[mmap] %s: cannot open: %s", path.c_str(), std::strerror(e)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return io_error(strfmt("[mmap] %s: fstat failed: %s", path.c_str(), std::strerror(e)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(strfmt("[mmap] %s: not a regular file", path.c_str()));
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->mode_ = mode;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0 && mode == MapMode::kCopy) {
    const Status st = copy_aligned(fd, f->size_, path, &f->region_, &f->region_bytes_, &f->data_);
    if (!st.is_ok()) {
      ::close(fd);
      return st;
    }
  } else if (f->size_ > 0) {
    void* p = map_aligned(fd, f->size_);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return io_error(strfmt("[mmap] %s: mmap of %zu bytes failed: %s", path.c_str(), f->size_,
                             std::strerror(e)));
    }
    f->data_ = static_cast<uint8_t*>(p);
    f->region_ = p;
    f->region_bytes_ = f->size_;
  }
  if (f->mode_ == MapMode::kMap && f->data_) {
    f->fd_ = fd;  // for regroup_page_cache; the mapping alone would keep the file alive
  } else {
    ::close(fd);
  }
  return f;
}

MappedFile::~MappedFile() {
  if (region_) ::munmap(region_, region_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

void MappedFile::advise_willneed(size_t offset, size_t length) const {
  if (!data_ || offset >= size_) return;
  long page = ::sysconf(_SC_PAGESIZE);
  size_t start = offset & ~static_cast<size_t>(page - 1);
  size_t end = std::min(size_, offset + length);
  ::madvise(data_ + start, end - start, MADV_WILLNEED);
}

void MappedFile::release_pages(size_t offset, size_t length) const {
  if (mode_ != MapMode::kMap || !data_ || offset >= size_) return;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t start = offset & ~(page - 1);
  ::madvise(data_ + start, std::min(size_, offset + length) - start, MADV_DONTNEED);
}

MappedFile::Residency MappedFile::residency() const {
  Residency r;
  if (!region_) return r;
  std::FILE* fp = std::fopen("/proc/self/smaps", "r");
  if (!fp) return r;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(region_), hi = lo + region_bytes_;
  bool inside = false, line_start = true;
  char line[512];
  while (std::fgets(line, sizeof line, fp)) {
    // The rest of a line longer than the buffer (a header's long path) is not a line of its own.
    const bool starts = line_start;
    line_start = std::strchr(line, '\n') != nullptr;
    if (!starts) continue;
    unsigned long long a = 0, b = 0, kb = 0;
    char key[64];
    // A mapping's header ("start-end perms ...") starts its block of fields.
    // (No field name is hex digits followed by '-'.)
    if (std::sscanf(line, "%llx-%llx ", &a, &b) == 2) {
      inside = a < hi && b > lo;
      continue;
    }
    if (!inside || std::sscanf(line, "%63[^:]: %llu kB", key, &kb) != 2) continue;
    if (std::strcmp(key, "Rss") == 0) r.resident += kb * 1024;
    if (std::strcmp(key, "FilePmdMapped") == 0 || std::strcmp(key, "AnonHugePages") == 0) r.huge += kb * 1024;
  }
  std::fclose(fp);
  return r;
}

namespace {

bool thp_off() {
  std::FILE* fp = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (!fp) return true;
  char line[128] = {};
  const bool ok = std::fgets(line, sizeof line, fp) != nullptr;
  std::fclose(fp);
  return !ok || std::strstr(line, "[never]") != nullptr;
}

}  // namespace

MappedFile::PageCacheCheck MappedFile::regroup_page_cache() {
  constexpr size_t kHuge = size_t{2} << 20;
  if (mode_ != MapMode::kMap || fd_ < 0 || size_ < 4 * kHuge ||
      reinterpret_cast<uintptr_t>(data_) % kHuge != 0 || thp_off()) {
    return PageCacheCheck::kSkipped;
  }
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t spans = size_ / kHuge;  // whole 2 MiB spans (the file's tail is never PMD-mapped)
  // The fully resident spans (a partly cached file: only they can be in small folios that stay),
  // then up to 8 of them spread over the file.
  std::vector<unsigned char> in(spans * (kHuge / page));
  if (::mincore(data_, spans * kHuge, in.data()) != 0) return PageCacheCheck::kSkipped;
  std::vector<size_t> resident;
  for (size_t s = 0; s < spans; ++s) {
    const auto* b = in.data() + s * (kHuge / page);
    if (std::all_of(b, b + kHuge / page, [](unsigned char c) { return (c & 1) != 0; })) resident.push_back(s);
  }
  if (resident.empty()) return PageCacheCheck::kSkipped;  // a cold file is read in 2 MiB folios anyway
  constexpr size_t kSample = 8;
  std::vector<size_t> sample;
  const size_t k = std::min(kSample, resident.size());
  for (size_t i = 0; i < k; ++i) sample.push_back(resident[(2 * i + 1) * resident.size() / (2 * k)]);
  // How many of `spans` are cached in 2 MiB folios: each is unmapped from this process (its
  // pages stay cached) and touched (one byte maps its folio), and the PMD-mapped total grows by
  // 2 MiB per such span; two reads of /proc/self/smaps for all of them. They are unmapped again
  // after: the check leaves nothing mapped (the process's RSS stays).
  volatile uint8_t sink = 0;
  auto huge_spans = [&](const std::vector<size_t>& spans) -> size_t {
    for (size_t s : spans) ::madvise(data_ + s * kHuge, kHuge, MADV_DONTNEED);
    const uint64_t before = residency().huge;
    for (size_t s : spans) sink = sink + data_[s * kHuge];
    const uint64_t after = residency().huge;
    for (size_t s : spans) ::madvise(data_ + s * kHuge, kHuge, MADV_DONTNEED);
    return std::min<size_t>(spans.size(), after > before ? (after - before) / kHuge : 0);
  };
  const size_t small = sample.size() - huge_spans(sample);
  LARDER_LOG_DEBUG("[mmap] %s: %zu of %zu sampled 2 MiB spans map with 4 KiB pages", path_.c_str(), small,
                   sample.size());
  // A quarter of the file in 4 KiB pages is worth one re-read (about 0.2 s per GB from a fast disk).
  if (4 * small < sample.size()) return PageCacheCheck::kLarge;
  // Dirty pages (a write not yet on disk) are not evicted by POSIX_FADV_DONTNEED: write them first.
  ::fdatasync(fd_);
  // One span out and back in (unmapped above, so the eviction takes it): does this filesystem
  // give this mapping 2 MiB folios on a read? Any sampled span answers that.
  const size_t probe = sample.front();
  ::posix_fadvise(fd_, static_cast<off_t>(probe * kHuge), static_cast<off_t>(kHuge), POSIX_FADV_DONTNEED);
  if (huge_spans({probe}) == 0) return PageCacheCheck::kUnsupported;
  ::madvise(data_, size_, MADV_DONTNEED);
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
  return PageCacheCheck::kEvicted;
}

Result<std::string> read_text_file(const std::string& path, uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return not_found(strfmt("[io] %s: file not found", path.c_str()));
    return io_error(strfmt("[io] %s: cannot open: %s", path.c_str(), std::strerror(errno)));
  }
  std::string out;
  std::vector<char> buf(1 << 16);
  for (;;) {
    const uint64_t room = max_bytes + 1 - out.size();  // one byte past the cap tells "longer"
    const ssize_t r = ::read(fd, buf.data(), static_cast<size_t>(std::min<uint64_t>(buf.size(), room)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int e = errno;
      ::close(fd);
      return io_error(strfmt("[io] %s: read failed: %s", path.c_str(), std::strerror(e)));
    }
    if (r == 0) break;
    out.append(buf.data(), static_cast<size_t>(r));
    if (out.size() > max_bytes) {
      ::close(fd);
      return invalid_argument(strfmt("[io] %s: longer than %llu bytes, not read further (not a text file larder reads?)",
                                     path.c_str(), static_cast<unsigned long long>(max_bytes)));
    }
  }
  ::close(fd);
  return out;
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace larder
