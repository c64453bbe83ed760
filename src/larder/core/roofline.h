// roofline.h — this machine's ceilings, measured in-process (performance.md §1, §5): the
// streaming read bandwidth that bounds decode, and the multiply-add throughput that bounds
// prefill. Benchmarks print their numbers as a fraction of these, measured in the same run, so
// a result is never compared with a ceiling taken on another day or another host.
#pragma once

#include <cstddef>
#include <cstdint>

namespace larder {

class ThreadPool;

struct Roofline {
  double read_gbs = 0;        // median streaming read, GB/s (1e9 B/s), all pool threads
  double f32_fma_gflops = 0;  // FP32 FMA (ymm, independent chains), GFLOP/s (1 FMA = 2 FLOP)
  double int8_gops = 0;       // u8×s8 multiply-adds as the AVX2 int8 kernels issue them
                              // (vpmaddubsw + vpmaddwd + vpaddd per 32 MACs), GOP/s (1 MAC = 2 OP)
};

// Streaming read of a `bytes` buffer (one contiguous stream per thread), median of `reps`.
double measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t{1} << 30, int reps = 5);
// The same over a caller's buffer (reused across measurements). cpu_gbs, if given, receives the
// bandwidth per second of the calling thread's CPU time (robust to being descheduled on a
// shared host).
double measure_read_bandwidth(ThreadPool& pool, const uint8_t* buf, size_t bytes, int reps, double* cpu_gbs = nullptr);

// A streaming-read probe that keeps its buffer (THP-backed, touched once), so it can be measured
// again beside each timed run: on a shared host whose neighbour loads memory on and off within
// minutes, a ceiling taken once at the start put the same decode speed at 80 % of it in one run
// and 130 % in the next (bench/RESULTS.md, session 28).
class ReadProbe {
 public:
  explicit ReadProbe(size_t bytes = size_t{1} << 30);
  ~ReadProbe();
  ReadProbe(const ReadProbe&) = delete;
  ReadProbe& operator=(const ReadProbe&) = delete;
  bool ok() const { return buf_ != nullptr; }
  // Median GB/s of `reps` reads of the buffer (after one warm-up read); 0 if the allocation failed.
  double measure(ThreadPool& pool, int reps = 5) const;

 private:
  uint8_t* buf_ = nullptr;
  size_t bytes_ = 0;
};

double measure_f32_fma_peak(ThreadPool& pool);
double measure_int8_peak(ThreadPool& pool);
Roofline measure_roofline(ThreadPool& pool);

}  // namespace larder
