#include "larder/core/roofline.h"

#include <immintrin.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "larder/core/threadpool.h"

namespace larder {

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

double measure_read_bandwidth(ThreadPool& pool, const uint8_t* buf, size_t bytes, int reps, double* cpu_gbs) {
  const int nt = pool.n_threads();
  const size_t slice = bytes / static_cast<size_t>(nt) / 128 * 128;
  std::vector<double> gbs, cgbs;
  std::vector<float> partial(static_cast<size_t>(nt) * 16);
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    const double c0 = thread_cpu_seconds();
    const auto t0 = Clock::now();
    pool.parallel_for(nt, [&](int64_t c, int) {
      const uint8_t* p = buf + static_cast<size_t>(c) * slice;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (size_t i = 0; i < slice; i += 128) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(reinterpret_cast<const float*>(p + i)));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(reinterpret_cast<const float*>(p + i + 32)));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(reinterpret_cast<const float*>(p + i + 64)));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(reinterpret_cast<const float*>(p + i + 96)));
      }
      partial[static_cast<size_t>(c) * 16] = _mm256_cvtss_f32(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    });
    const double dt = seconds_since(t0), dc = thread_cpu_seconds() - c0;
    const double moved = static_cast<double>(slice * static_cast<size_t>(nt));
    if (rep > 0) {
      gbs.push_back(moved / dt / 1e9);
      cgbs.push_back(moved / dc / 1e9);
    }
  }
  volatile float sink = partial[0];
  (void)sink;
  if (cpu_gbs) *cpu_gbs = median(cgbs);
  return median(gbs);
}

ReadProbe::ReadProbe(size_t bytes) {
  const size_t huge = size_t{2} << 20;
  const size_t alloc = (bytes + huge - 1) / huge * huge;
  buf_ = static_cast<uint8_t*>(std::aligned_alloc(huge, alloc));
  if (!buf_) return;
  bytes_ = bytes;
  madvise(buf_, alloc, MADV_HUGEPAGE);  // like a THP-backed weight mapping: fewer TLB misses
  std::memset(buf_, 1, alloc);
}

ReadProbe::~ReadProbe() { std::free(buf_); }

double ReadProbe::measure(ThreadPool& pool, int reps) const {
  return buf_ ? measure_read_bandwidth(pool, buf_, bytes_, reps) : 0.0;
}

double measure_read_bandwidth(ThreadPool& pool, size_t bytes, int reps) {
  return ReadProbe(bytes).measure(pool, reps);
}

double measure_f32_fma_peak(ThreadPool& pool) {
  const int nt = pool.n_threads();
  const int64_t iters = 20'000'000;
  std::vector<double> runs;
  std::vector<float> out(static_cast<size_t>(nt) * 16);
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    pool.parallel_for(nt, [&](int64_t c, int) {
      // 12 independent chains hide the 4-cycle FMA latency on 2 FMA pipes.
      __m256 a[12];
      for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(1.0f + 1e-7f * static_cast<float>(i));
      const __m256 m = _mm256_set1_ps(0.9999999f), k = _mm256_set1_ps(1e-7f);
      for (int64_t it = 0; it < iters / 12; ++it) {
        for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], m, k);
      }
      __m256 s = a[0];
      for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, a[i]);
      out[static_cast<size_t>(c) * 16] = _mm256_cvtss_f32(s);
    });
    const double dt = seconds_since(t0);
    runs.push_back(static_cast<double>(iters / 12 * 12) * 8 * 2 * nt / dt / 1e9);
  }
  volatile float sink = out[0];
  (void)sink;
  return *std::max_element(runs.begin(), runs.end());
}

double measure_int8_peak(ThreadPool& pool) {
  const int nt = pool.n_threads();
  const int64_t iters = 10'000'000;
  std::vector<double> runs;
  std::vector<int> out(static_cast<size_t>(nt) * 16);
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    pool.parallel_for(nt, [&](int64_t c, int) {
      __m256i acc[8];
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_set1_epi32(i);
      __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2);
      const __m256i ones = _mm256_set1_epi16(1);
      for (int64_t it = 0; it < iters / 8; ++it) {
        // An empty asm that "may change" the inputs: stops the compiler hoisting the constant
        // multiplies out of the loop (it emits no instruction).
        __asm__ volatile("" : "+x"(u), "+x"(s));
        for (int i = 0; i < 8; ++i) {
          acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones));
        }
      }
      __m256i t = acc[0];
      for (int i = 1; i < 8; ++i) t = _mm256_add_epi32(t, acc[i]);
      out[static_cast<size_t>(c) * 16] = _mm256_extract_epi32(t, 0);
    });
    const double dt = seconds_since(t0);
    runs.push_back(static_cast<double>(iters / 8 * 8) * 32 * 2 * nt / dt / 1e9);  // 32 MACs per step
  }
  volatile int sink = out[0];
  (void)sink;
  return *std::max_element(runs.begin(), runs.end());
}

Roofline measure_roofline(ThreadPool& pool) {
  Roofline r;
  r.read_gbs = measure_read_bandwidth(pool);
  r.f32_fma_gflops = measure_f32_fma_peak(pool);
  r.int8_gops = measure_int8_peak(pool);
  return r;
}

}  // namespace larder
