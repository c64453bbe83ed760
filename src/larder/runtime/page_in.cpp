#include "larder/runtime/page_in.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "larder/core/log.h"
#include "larder/core/progress.h"
#include "larder/core/threadpool.h"

namespace larder::runtime {

PageInStats page_in_weights(const formats::TensorSet& tensors) {
  PageInStats st;
  if (const char* off = std::getenv("LARDER_PAGE_IN"); off && std::strcmp(off, "0") == 0) return st;
  uint64_t min_cold = 64ull << 20;
  if (const char* m = std::getenv("LARDER_PAGE_IN_MIN"); m && *m) min_cold = std::strtoull(m, nullptr, 10);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  struct Cold {
    const MappedFile* file;
    std::vector<unsigned char> resident;
  };
  std::vector<Cold> files;
  for (const auto& f : tensors.files()) {
    if (!f || f->size() == 0) continue;
    // A file cached in small folios (written, not read, since it entered the cache) is evicted
    // here so the pass below reads it back in 2 MiB folios (MappedFile::regroup_page_cache).
    if (f->regroup_page_cache() == MappedFile::PageCacheCheck::kEvicted) {
      ++st.regrouped;
      LARDER_LOG_INFO("[load] %s: much of its page cache is in 4 KiB pieces (pages cached by a write, e.g. a "
                      "fresh download); reading it again so the weights map with 2 MiB pages",
                      std::filesystem::path(f->path()).filename().c_str());
    }
    st.mapped_bytes += f->size();
    Cold c{f.get(), std::vector<unsigned char>((f->size() + page - 1) / page)};
    if (mincore(const_cast<uint8_t*>(f->data()), f->size(), c.resident.data()) != 0) continue;
    for (unsigned char r : c.resident) st.cold_bytes += (r & 1) ? 0 : page;
    files.push_back(std::move(c));
  }
  if (st.cold_bytes == 0 || (st.cold_bytes < min_cold && st.regrouped == 0)) return st;
  const std::string label =
      files.size() == 1 ? "loading " + std::filesystem::path(files[0].file->path()).filename().string() : "loading weights";
  Progress progress(label, st.cold_bytes);
  // 16 MiB chunks over the pool's threads: each touch of a cold page in this MADV_HUGEPAGE
  // mapping reads its 2 MiB folio (and the next one asynchronously), so several threads keep
  // several reads in flight. No MADV_WILLNEED ahead of the touches: it reads through the page
  // cache's own readahead in small folios, which then map with 4 KiB pages (half of a 1B Q4_0
  // file did).
  constexpr size_t kChunk = 16u << 20;
  std::vector<std::pair<const Cold*, size_t>> chunks;
  for (const Cold& c : files)
    for (size_t off = 0; off < c.file->size(); off += kChunk) chunks.emplace_back(&c, off);
  std::atomic<uint64_t> done{0};
  default_pool().parallel_for(static_cast<int64_t>(chunks.size()), [&](int64_t i, int) {
    const auto [c, off] = chunks[static_cast<size_t>(i)];
    const size_t end = std::min(off + kChunk, c->file->size());
    volatile uint8_t sink = 0;
    uint64_t n = 0;
    // Each 2 MiB span is unmapped again once read: the page cache keeps it and a forward maps
    // what it reads, so the page-in does not put the whole file (e.g. all of the embedding
    // table, which decode reads a row of) into the process's RSS or its high-water mark.
    constexpr size_t kSpan = 2u << 20;
    for (size_t s = off; s < end; s += kSpan) {
      const size_t s_end = std::min(s + kSpan, end);
      bool touched = false;
      for (size_t p = s / page; p * page < s_end; ++p) {
        if (c->resident[p] & 1) continue;
        sink = sink + c->file->data()[p * page];
        n += page;
        touched = true;
      }
      if (touched) c->file->release_pages(s, s_end - s);
    }
    progress.update(std::min(done.fetch_add(n) + n, st.cold_bytes));
  });
  progress.finish();
  st.paged_in = true;
  return st;
}

}  // namespace larder::runtime
