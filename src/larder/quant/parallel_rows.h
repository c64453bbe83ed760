// parallel_rows.h — the quantization toolkit's one way to split a matrix's rows over threads.
//
// Rows are independent in every quantizer/fold step, so contiguous row ranges on plain
// std::threads keep outputs bit-identical for any thread count. (Not the kernels' pool: offline
// jobs run one tensor at a time and want exactly `threads` workers for its duration.)
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace larder::quant {

// 0 → hardware concurrency.
inline int resolve_threads(int threads) {
  return threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// fn(part, r0, r1) for contiguous ranges covering [0, rows), at most `threads` parts (0: all
// cores) of at least `min_rows` rows each; part 0 runs on the caller. Returns the part count.
template <class F>
int parallel_rows(int64_t rows, int threads, int64_t min_rows, F&& fn) {
  const int nt = static_cast<int>(std::min<int64_t>(resolve_threads(threads), std::max<int64_t>(1, rows / std::max<int64_t>(1, min_rows))));
  if (nt <= 1) {
    fn(0, int64_t{0}, rows);
    return 1;
  }
  std::vector<std::thread> th;
  for (int i = 1; i < nt; ++i) th.emplace_back([&, i] { fn(i, rows * i / nt, rows * (i + 1) / nt); });
  fn(0, int64_t{0}, rows / nt);
  for (auto& t : th) t.join();
  return nt;
}

}  // namespace larder::quant
