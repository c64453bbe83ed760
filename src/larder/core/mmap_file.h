// mmap_file.h — read-only file mappings with RAII ownership.
//
// Weights are never copied at load: tensors are views into these mappings, so opening a model
// costs a few syscalls whatever its size, and the weights stay shared with the page cache
// (several processes serving one model share one copy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "larder/core/status.h"

namespace larder {

// How a file's bytes reach memory. kMap (the default) maps the file: instant, and shared with the
// page cache and other processes. kCopy reads it into private anonymous memory in 2 MiB huge pages
// (`--no-mmap`, as llama.cpp's): a full read at open and a private copy, but the weights then
// stream through huge pages whatever state the page cache is in. A file whose cached pages were
// written (a fresh download or conversion) stays in 4 KiB folios and maps with 4 KiB pages; its
// decode measured 5–9 % slower than from the copy (bench/RESULTS.md, session 23).
enum class MapMode { kMap, kCopy };

class MappedFile {
 public:
  // Maps (or copies, MapMode::kCopy) the whole file, read-only. An empty file maps to size 0 with a
  // null data pointer.
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path, MapMode mode = MapMode::kMap);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  std::string_view view() const { return {reinterpret_cast<const char*>(data_), size_}; }
  // Hint the kernel to read a range ahead (e.g. before a full pass over the weights).
  void advise_willneed(size_t offset, size_t length) const;
  // Drops this process's page table entries for a range of a mapping (MADV_DONTNEED): the page
  // cache keeps the data and the next read maps it again (a minor fault). A pass that only
  // fills the cache uses it so the process's RSS does not count the whole file. No-op on a copy.
  void release_pages(size_t offset, size_t length) const;

  // How much of the file is resident now, and how much of that the kernel maps with 2 MiB pages
  // (/proc/self/smaps: FilePmdMapped for a mapping, AnonHugePages for a copy). Zeros where smaps
  // cannot be read.
  struct Residency {
    uint64_t resident = 0, huge = 0;
  };
  Residency residency() const;
  MapMode mode() const { return mode_; }

  // A file cached by a write (a fresh download or conversion) sits in the page cache in small
  // folios, which map with 4 KiB pages whatever the mapping asks for; the same pages read back
  // through this mapping (MADV_HUGEPAGE readahead) come in 2 MiB folios where the filesystem
  // supports large folios. 1B Q4_0 decode on Zen 5, 2 threads: 91 tok/s from a written file's
  // cache, 113 once re-read (bench/RESULTS.md, session 27). This samples up to 8 of the file's
  // fully resident 2 MiB spans and, where a quarter or more map with 4 KiB pages, evicts the file's cached pages so
  // the next pass over them (runtime::page_in_weights) reads them back in 2 MiB folios. Only a
  // mapping (kMap) of at least 8 MiB at a 2 MiB boundary with THP not off is checked; pages
  // other processes map stay cached (posix_fadvise DONTNEED skips them); nothing is evicted
  // unless one span evicted and read back maps with a 2 MiB page. The sampled spans are
  // unmapped again (the process's RSS does not keep them).
  enum class PageCacheCheck {
    kSkipped,      // not a candidate (copy, small file, unaligned, THP off) or no resident span
    kLarge,        // over 3/4 of the sampled resident spans already map with 2 MiB pages
    kUnsupported,  // small folios, and a span read back came in small folios again
    kEvicted,      // small folios; the file's cached pages were evicted to be read back
  };
  PageCacheCheck regroup_page_cache();

 private:
  MappedFile() = default;
  std::string path_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  // What the destructor unmaps: the mapping, or for a copy its whole reservation.
  void* region_ = nullptr;
  size_t region_bytes_ = 0;
  MapMode mode_ = MapMode::kMap;
  int fd_ = -1;  // kMap: kept open for regroup_page_cache's posix_fadvise (the same inode)
};

// Reads a whole (small) file, e.g. config.json. Errors name the path. A file (or a device or FIFO
// a path leads to) longer than max_bytes is an error, and no more than max_bytes + 1 bytes are
// read: the largest real text files are tokenizer.json files of tens of MB.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{512} << 20;
Result<std::string> read_text_file(const std::string& path, uint64_t max_bytes = kMaxTextFileBytes);
bool file_exists(const std::string& path);
bool is_directory(const std::string& path);

}  // namespace larder
