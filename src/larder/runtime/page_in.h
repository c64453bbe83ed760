// page_in.h — read a model's weights into memory before the first forward when much of them is
// not in the page cache, with a progress bar. The weights are mmap'd and paged in on demand, so
// a cold multi-GB file would otherwise show as a silent first prompt of tens of seconds.
// mincore() says what is already resident; only the cold pages are touched, through the
// mapping, so they enter the page cache as the kernels will map them (2 MiB folios), and are
// unmapped again (the process's RSS keeps only what a forward maps). LARDER_PAGE_IN=0 skips it;
// LARDER_PAGE_IN_MIN (bytes) changes the 64 MiB of cold data below which nothing is shown.
// A file whose page cache holds small folios is first evicted (MappedFile::regroup_page_cache)
// and then read here like a cold one, so its weights map with 2 MiB pages.
#pragma once

#include <cstdint>

#include "larder/formats/tensor.h"

namespace larder::runtime {

struct PageInStats {
  uint64_t mapped_bytes = 0;
  uint64_t cold_bytes = 0;  // not resident before (0 when the check is off)
  bool paged_in = false;    // cold_bytes were read, with progress
  int regrouped = 0;        // files evicted to be read back in 2 MiB folios (regroup_page_cache)
};

PageInStats page_in_weights(const formats::TensorSet& tensors);

}  // namespace larder::runtime
