#include "larder/runtime/page_in.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "larder/core/progress.h"

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
    st.mapped_bytes += f->size();
    Cold c{f.get(), std::vector<unsigned char>((f->size() + page - 1) / page)};
    if (mincore(const_cast<uint8_t*>(f->data()), f->size(), c.resident.data()) != 0) continue;
    for (unsigned char r : c.resident) st.cold_bytes += (r & 1) ? 0 : page;
    files.push_back(std::move(c));
  }
  if (st.cold_bytes == 0 || st.cold_bytes < min_cold) return st;
  const std::string label =
      files.size() == 1 ? "loading " + std::filesystem::path(files[0].file->path()).filename().string() : "loading weights";
  Progress progress(label, st.cold_bytes);
  uint64_t done = 0;
  constexpr size_t kChunk = 16u << 20;
  volatile uint8_t sink = 0;
  for (const Cold& c : files) {
    const size_t size = c.file->size();
    for (size_t off = 0; off < size; off += kChunk) {
      const size_t len = std::min(kChunk, size - off);
      if (off + len < size) c.file->advise_willneed(off + len, std::min(kChunk, size - off - len));
      for (size_t p = off / page; p * page < off + len; ++p) {
        if (c.resident[p] & 1) continue;
        sink = sink + c.file->data()[p * page];
        done += page;
      }
      progress.update(std::min(done, st.cold_bytes));
    }
  }
  progress.finish();
  st.paged_in = true;
  return st;
}

}  // namespace larder::runtime
