// parallel_split.h — the pool split of the elementwise-style kernels (one pass over rows or
// elements, no reduction across them): small work stays on the calling thread.
#pragma once

#include <algorithm>
#include <cstdint>

#include "larder/core/threadpool.h"

namespace larder::kernels::cpu {

// Below this much work (elements, or multiply-adds) a fork/join costs more than it saves.
inline constexpr int64_t kMinParallelWork = 32 * 1024;

// Splits [0, n) into chunks of at least `grain` items (each `work_per_item` units of work) and
// runs fn(begin, end) over the pool; one call on this thread when the work is small. Chunks are a
// function of n and the pool size only, and each item is computed whole by one thread.
template <class F>
void parallel_split(int64_t n, int64_t grain, int64_t work_per_item, F&& fn) {
  ThreadPool& pool = default_pool();
  if (n <= 0) return;
  if (n * work_per_item < kMinParallelWork || pool.n_threads() <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t chunks = std::min<int64_t>(4 * pool.n_threads(), std::max<int64_t>(1, n / grain));
  pool.parallel_for(chunks, [&](int64_t c, int) { fn(n * c / chunks, n * (c + 1) / chunks); });
}

}  // namespace larder::kernels::cpu
