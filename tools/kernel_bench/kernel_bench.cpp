// kernel_bench — per (kernel tier, weight format, shape, threads): median time, GB/s, GOP/s, next to
// this machine's measured read bandwidth (performance.md §4 rule 10, §5).
//
// Honesty rules built in:
// - The bandwidth ceiling is measured in the same process (streaming read of a 1 GiB buffer,
//   1 and N threads on the same pool the kernels use), before and after the kernel runs.
// - Decode weights are rotated over enough copies to stream 512 MiB, 16× the L3 (32 MiB here): a
//   single 2048×2048 Q4_0 matrix (2.3 MB) would otherwise be L3-resident and flatter the kernel,
//   and even a 128 MiB rotation left enough in L3 to read ~15 % above the 1 GiB probe.
// - Every number is the median of `--reps` timed calls after a warm-up pass; min and max are
//   printed so the spread is visible (the host is shared).
//
// - The attention case rotates its K/V caches the same way (a decode step reads every layer's
//   cache once, so a single 2 MiB cache that stays in L3 would flatter it); its GB/s counts each
//   visible K/V byte once, the least any kernel must read.
//
// Usage: kernel_bench [--reps N] [--threads 1,2] [--formats Q4_0,Q8_0,Q4_1,Q5_K,IQ4_XS,MXFP4,MLX_MXFP4,MLX_NVFP4,MLX_MXFP8,...,BF16,F16,F32,affine-q4-g64,...]
//                     [--tiers avx2,avx512,ref] [--no-prefill] [--no-decode] [--model-estimate]
//                     [--no-attention | --attention-only] [--attn-contexts 512,4096,16384] [--kv-dtype f16|f32|q8_0]
//                     [--attn-shape 32/8/64] [--attn-evict-mb N]
//                     [--step]  (only the decode step's matmul sequence: bench_step)
//                     [--moe] [--moe-shape E/k/rows/cols]  (only the grouped expert matmul: bench_moe)
//                     [--no-gated-delta | --gated-delta-only] [--gdn-shapes 16/16/128/128,16/32/128/128]
//                     (Hk/Hv/dk/dv: Gated DeltaNet layers, bench_gated_delta)
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "larder/core/cpuid.h"
#include "larder/core/dtype.h"
#include "larder/kernels/microscaling.h"
#include "larder/core/roofline.h"
#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/dispatch.h"
#include "larder/kernels/gguf_blocks.h"
#include "larder/kernels/moe.h"

using namespace larder;
using namespace larder::kernels;

namespace {

using Clock = std::chrono::steady_clock;

// CPU time of the calling thread: with 1 thread this excludes the time the scheduler gave our core
// to someone else (the dev host is shared), so it isolates the kernel's instruction throughput.
double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Stats {
  double median = 0, min = 0, max = 0;
};

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stats s;
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  return s;
}

void* big_alloc(size_t bytes) {
  void* p = std::aligned_alloc(2 << 20, (bytes + (2 << 20) - 1) / (2 << 20) * (2 << 20));
  madvise(p, bytes, MADV_HUGEPAGE);  // fewer TLB misses while streaming, like a THP-backed mmap
  return p;
}

// Where each GGUF block keeps its f16 scale fields (the rest is codes and packed integer scales).
std::vector<uint32_t> f16_fields(DType d) {
  switch (d) {
    case DType::kQ4_1: return {offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m)};
    case DType::kQ5_1: return {offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)};
    case DType::kQ4_K: return {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)};
    case DType::kQ5_K: return {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)};
    case DType::kQ2_K: return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
    case DType::kQ3_K: return {offsetof(BlockQ3_K, d)};
    case DType::kQ6_K: return {offsetof(BlockQ6_K, d)};
    default: return {0};  // Q8_0, Q4_0, Q5_0, IQ4_NL, IQ4_XS: d first
  }
}

void fill_weights(uint8_t* p, DType dt, int64_t rows, int64_t cols) {
  const uint64_t row_bytes = dtype_bytes(dt, cols);
  uint64_t s = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  const uint64_t total = row_bytes * rows;
  for (uint64_t i = 0; i + 8 <= total; i += 8) {
    uint64_t v = next();
    std::memcpy(p + i, &v, 8);
  }
  // Make every scale / float a normal, finite, small value (no denormal or NaN slow paths).
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = p + r * row_bytes;
    if (dt == DType::kMXFP4) {  // e8m0 scale bytes 2^-10 .. 2^-3
      for (int64_t b = 0; b < cols / 32; ++b) row[b * 17] = static_cast<uint8_t>(118 + next() % 8);
    } else if (is_mlx_microscaling(dt)) {  // codes only (scales: fill_format); no e4m3 NaN codes
      if (dt == DType::kMlxMXFP8)
        for (uint64_t i = 0; i < row_bytes; ++i)
          if ((row[i] & 0x7f) == 0x7f) row[i] ^= 1;
    } else if (dtype_is_block(dt)) {  // every f16 scale field of every block (gguf_blocks.h)
      const uint32_t bb = dtype_info(dt).block_bytes;
      for (int64_t b = 0; b < cols / static_cast<int64_t>(dtype_info(dt).block_elems); ++b) {
        for (uint32_t off : f16_fields(dt)) {
          const uint16_t h = static_cast<uint16_t>(0x1c00 | (next() & 0x3ff));
          std::memcpy(row + b * bb + off, &h, 2);
        }
      }
    } else if (dt == DType::kBF16 || dt == DType::kF16) {
      auto* h = reinterpret_cast<uint16_t*>(row);
      for (int64_t c = 0; c < cols; ++c)
        h[c] = static_cast<uint16_t>((dt == DType::kBF16 ? 0x3c00 : 0x2000) | (h[c] & 0x80ff));
    } else if (dt == DType::kF32) {
      auto* f = reinterpret_cast<uint32_t*>(row);
      for (int64_t c = 0; c < cols; ++c) f[c] = 0x3c000000u | (f[c] & 0x807fffffu);
    }
  }
}

// A benchmarked weight format: a DType, or MLX affine (bits, group size; bf16 scales/biases stored
// after the codes of each copy, as a real checkpoint's three tensors would be).
struct Format {
  DType dtype = DType::kUnknown;
  int bits = 0, group_size = 0;
  uint64_t bytes(int64_t rows, int64_t cols) const {
    if (const int g = mlx_microscaling_group(dtype)) return (dtype_bytes(dtype, cols) + cols / g) * rows;  // + U8 scales
    if (bits == 0) return dtype_bytes(dtype, cols) * rows;
    return static_cast<uint64_t>(rows) * cols * bits / 8 + 2 * static_cast<uint64_t>(rows) * (cols / group_size) * 2;
  }
};

WeightView make_view(const Format& f, uint8_t* p, int64_t rows, int64_t cols) {
  WeightView v;
  v.dtype = f.dtype;
  v.rows = rows;
  v.cols = cols;
  v.data = p;
  if (const int g = mlx_microscaling_group(f.dtype)) {
    v.scales = p + dtype_bytes(f.dtype, cols) * rows;
    v.scale_dtype = DType::kU8;
    v.group_size = g;
  }
  if (f.bits) {
    v.dtype = DType::kU32;
    v.bits = f.bits;
    v.group_size = f.group_size;
    v.scale_dtype = DType::kBF16;
    v.scales = p + static_cast<uint64_t>(rows) * cols * f.bits / 8;
    v.biases = v.scales + static_cast<uint64_t>(rows) * (cols / f.group_size) * 2;
  }
  return v;
}

void fill_affine(uint8_t* p, const Format& f, int64_t rows, int64_t cols) {
  const uint64_t codes = static_cast<uint64_t>(rows) * cols * f.bits / 8;
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (uint64_t i = 0; i < codes; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = static_cast<uint8_t>(s >> 56);
  }
  auto* h = reinterpret_cast<uint16_t*>(p + codes);
  const uint64_t n = 2 * static_cast<uint64_t>(rows) * (cols / f.group_size);
  for (uint64_t i = 0; i < n; ++i) h[i] = f32_to_bf16((i & 1 ? -0.01f : 0.002f) * static_cast<float>(1 + i % 7));
}

struct Shape {
  const char* name;
  int64_t rows, cols;
  int per_layer;  // matrices of this shape per layer (model estimate); 0 = LM head
};

// Llama-3.2-1B-like shapes (performance.md §3): hidden 2048, 8 KV heads × 64, FFN 8192, vocab 32000.
const Shape kDefaultShapes[] = {
    {"q/o 2048x2048", 2048, 2048, 2},
    {"k/v 512x2048", 512, 2048, 2},
    {"gate/up 8192x2048", 8192, 2048, 2},
    {"down 2048x8192", 2048, 8192, 1},
    {"lm_head 32000x2048", 32000, 2048, 0},
};
constexpr int kLayers = 16;

std::vector<std::string> split(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(sep, i);
    if (j == std::string::npos) j = s.size();
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

Format parse_format(const std::string& s) {
  Format f;
  for (int i = 0; i < static_cast<int>(DType::kUnknown); ++i) {
    const DType d = static_cast<DType>(i);
    const bool ok = (dtype_is_block(d) && d != DType::kQ8_K) || d == DType::kBF16 || d == DType::kF16 || d == DType::kF32 ||
                    is_mlx_microscaling(d);
    if (ok && s == dtype_name(d)) f.dtype = d;
  }
  if (f.dtype != DType::kUnknown) return f;
  if (std::sscanf(s.c_str(), "affine-q%d-g%d", &f.bits, &f.group_size) == 2 && f.bits >= 2 && f.bits <= 8 &&
      f.group_size % 32 == 0 && f.group_size > 0)
    return f;
  std::fprintf(stderr, "unknown format %s (a GGUF block format such as Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K, "
               "IQ4_XS; BF16, F16, F32, affine-q<bits>-g<group>)\n", s.c_str());
  std::exit(2);
}

// Random weights of any format (GGUF blocks, float, or MLX affine) for a rows × cols matrix at p.
void fill_format(uint8_t* p, const Format& f, int64_t rows, int64_t cols) {
  if (f.bits) fill_affine(p, f, rows, cols);
  else fill_weights(p, f.dtype, rows, cols);
  if (const int g = mlx_microscaling_group(f.dtype)) {  // scales 2^-10 .. 2^-3 (nvfp4: e4m3 ~2^-4 .. 2^-1)
    uint8_t* sc = p + dtype_bytes(f.dtype, cols) * rows;
    for (int64_t i = 0; i < rows * (cols / g); ++i)
      sc[i] = static_cast<uint8_t>(f.dtype == DType::kMlxNVFP4 ? 0x18 + i % 24 : 118 + i % 8);
  }
}

// Deterministic activations in [-1, 1).
template <class Vec>
void fill_acts(Vec& x) {
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 1000) / 500.0f - 1.0f;
}

MatmulFn tier_fn(const std::string& tier, const Format& f) {
  if (f.bits) return tier == "ref" ? ref_table().matmul_affine[f.bits] : cpu::fast_matmul_affine(tier.c_str(), f.bits);
  if (tier == "ref") return ref_table().matmul[static_cast<int>(f.dtype)];
  return cpu::fast_matmul(tier.c_str(), f.dtype);
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "?";
}


// Attention at Llama-3.2-1B's shape (32 query heads, 8 KV heads, head_dim 64): decode (n rows at
// the end of each context) and one prefill chunk ending at 4096. The tier's entry is its own
// kernel (the reference's, attention_avx2.cpp's or attention_avx512.cpp's).
// Reads every cache line of `buf` on all pool threads: what a decode step's matmuls do to the
// caches and TLBs between two layers' attention calls (--attn-evict-mb).
void stream_through(const std::vector<float>& buf) {
  static std::atomic<float> sink;
  default_pool().parallel_for(default_pool().n_threads(), [&](int64_t t, int) {
    const size_t n = buf.size(), per = (n + default_pool().n_threads() - 1) / default_pool().n_threads();
    float a = 0, b = 0;  // one float per 64-byte line, two chains
    for (size_t k = t * per; k + 16 < std::min(n, (t + 1) * per); k += 32) {
      a += buf[k];
      b += buf[k + 16];
    }
    sink.store(a + b, std::memory_order_relaxed);
  });
}

// Shape of the attention case: query heads / KV heads / head_dim (--attn-shape; Llama 3.2 1B's by
// default).
struct AttnShape {
  int heads = 32, kv_heads = 8, head_dim = 64;
};

void bench_attention(const std::string& tier, const std::vector<int>& threads, const std::vector<double>& bw,
                     const std::vector<int64_t>& contexts, const std::vector<int64_t>& decode_ns, bool do_decode,
                     bool do_prefill, int reps, bool hot, double bw_cpu1, DType kv_dtype, const AttnShape& shape,
                     int evict_mb) {
  // Streamed before each timed call when evict_mb > 0 (stream_through).
  const std::vector<float> evict(static_cast<size_t>(evict_mb) << 18, 1.0f);
  const AttentionFn fn = tier == "ref"      ? ref_table().attention
                         : tier == "avx2"   ? cpu::avx2::attention
                         : tier == "avx512" ? (cpu_features().has_avx512_tier() ? cpu::avx512::attention : nullptr)
                                            : nullptr;
  if (!fn) {
    std::printf("\n%s: no attention kernel\n", tier.c_str());
    return;
  }
  AttentionParams p;
  p.n_heads = shape.heads;
  p.n_kv_heads = shape.kv_heads;
  p.head_dim = shape.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  const int64_t kv_row = static_cast<int64_t>(p.n_kv_heads) * p.head_dim;
  const int64_t q_row = static_cast<int64_t>(p.n_heads) * p.head_dim;
  struct Run {
    int64_t ctx, n;  // n query rows at positions [ctx - n, ctx)
  };
  std::vector<Run> runs;
  if (do_decode)
    for (int64_t c : contexts)
      for (int64_t n : decode_ns) runs.push_back({c, n});
  if (do_prefill) runs.push_back({4096, 256});
  // Decode is bound by reading the cache (GB/s against the read bandwidth), a prefill chunk by
  // arithmetic (GFLOP/s against the FMA peak): both ceilings are printed for every row.
  std::vector<double> fma(threads.size());
  for (size_t ti = 0; ti < threads.size(); ++ti) {
    default_pool().set_threads(threads[ti]);
    fma[ti] = measure_f32_fma_peak(default_pool());
  }
  std::printf("\n## %s attention (heads %d/%d, head_dim %d, %s K/V; n rows at the end of the context%s)\n",
              tier.c_str(), shape.heads, shape.kv_heads, shape.head_dim,
              kv_dtype == DType::kF16 ? "f16" : kv_dtype == DType::kQ8_0 ? "q8_0" : "f32",
              evict_mb > 0 ? ("; " + std::to_string(evict_mb) + " MiB streamed before each call").c_str() : "");
  for (size_t ti = 0; ti < threads.size(); ++ti)
    std::printf("f32 FMA peak, %d thread(s): %.1f GFLOP/s\n", threads[ti], fma[ti]);
  std::printf("| context | n | threads | median µs [min..max] | GB/s (K/V) | %% of read BW | GFLOP/s | %% of FMA peak | 1-thread CPU µs / GFLOP/s / %% of CPU-time BW |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const Run& run : runs) {
    const int64_t q_pos0 = run.ctx - run.n;
    // Visible (key, row) pairs under the causal mask, and the K/V bytes every kernel must read.
    double pairs = 0;
    for (int64_t t = 0; t < run.n; ++t) pairs += static_cast<double>(q_pos0 + t + 1);
    const double flops = 4.0 * pairs * p.n_heads * p.head_dim;  // q·k and w·v, 2 FLOP per FMA each
    const uint64_t row_bytes = static_cast<uint64_t>(kernels::kv_bytes(kv_dtype, kv_row));
    const uint64_t kv_bytes = 2 * static_cast<uint64_t>(run.ctx) * row_bytes;
    if (tier == "ref" && flops > 4e9) continue;  // the double-precision oracle is ~1 GFLOP/s
    // >= 512 MiB per rotation, as the decode weights (see there): a step streams the weights too.
    const int copies = hot ? 1 : static_cast<int>(std::max<uint64_t>(1, (uint64_t{512} << 20) / kv_bytes + 1));
    // Uniform values in [-1, 1), stored in the cache's row format.
    auto* kv = static_cast<uint8_t*>(big_alloc(kv_bytes * copies));
    const uint64_t rows = 2 * static_cast<uint64_t>(run.ctx) * copies;
    std::vector<float> row(kv_row);
    uint32_t h = 0x12345678u;
    for (uint64_t r = 0; r < rows; ++r) {
      for (float& x : row) {
        h = h * 1664525u + 1013904223u;
        x = static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
      }
      kv_encode(kv_dtype, row.data(), kv_row, kv + r * row_bytes);
    }
    std::vector<KvSpanView> spans(copies);
    for (int c = 0; c < copies; ++c) {
      uint8_t* k = kv + c * kv_bytes;
      spans[c] = {k, k + run.ctx * row_bytes, 0, run.ctx, kv_dtype};
    }
    std::vector<float> q(run.n * q_row), out(run.n * q_row);
    fill_acts(q);
    const bool prefill = run.n > 16;
    for (size_t ti = 0; ti < threads.size(); ++ti) {
      default_pool().set_threads(threads[ti]);
      // Prefill calls take ~0.1-1 s: one warm-up call and few reps.
      const int warm = prefill ? 1 : copies;
      for (int w = 0; w < warm; ++w) fn(q.data(), run.n, q_pos0, &spans[w % copies], 1, p, out.data());
      const int r = prefill ? std::max(1, reps / 4) : reps * std::max(1, copies / 2);
      std::vector<double> ts, cpu;
      for (int i = 0, c = 0; i < r; ++i, c = (c + 1) % copies) {
        if (!evict.empty()) stream_through(evict);
        const double c0 = thread_cpu_seconds();
        auto t0 = Clock::now();
        fn(q.data(), run.n, q_pos0, &spans[c], 1, p, out.data());
        ts.push_back(seconds_since(t0));
        cpu.push_back(thread_cpu_seconds() - c0);
      }
      const Stats s = stats(ts), sc = stats(cpu);
      const double gbs = kv_bytes / s.median / 1e9;
      std::printf("| %lld | %lld | %d | %.1f [%.1f..%.1f] | %.1f | %.0f%% | %.1f | %.0f%% | %s |\n",
                  static_cast<long long>(run.ctx), static_cast<long long>(run.n), threads[ti], s.median * 1e6,
                  s.min * 1e6, s.max * 1e6, gbs, 100.0 * gbs / bw[ti], flops / s.median / 1e9,
                  100.0 * flops / s.median / 1e9 / fma[ti],
                  threads[ti] == 1 ? (std::to_string(static_cast<int>(sc.median * 1e6)) + " / " +
                                      std::to_string(flops / sc.median / 1e9).substr(0, 5) + " / " +
                                      std::to_string(static_cast<int>(100 * kv_bytes / sc.median / 1e9 / bw_cpu1)) + "%")
                                         .c_str()
                                   : "-");
      std::fflush(stdout);
    }
    std::free(kv);
  }
}

// Gated DeltaNet ops (kernels/gated_delta.h) per linear-attention layer of Qwen3.5 shapes (H_k key
// heads, H_v value heads, d_k = d_v = 128, conv kernel 4; --gdn-shapes): decode (n rows, one call
// per token) and a prefill chunk. The delta rule is arithmetic (GFLOP/s against the FMA peak:
// 3 FMA + 1 multiply per state element and token = 7 FLOP) and, at decode, a stream of its f32
// state (read and written once per call: GB/s against the read bandwidth); its states rotate over
// >= 512 MiB like the decode weights (between two visits of a layer, a decode step streams every
// other layer's weights and states through the caches), unless --hot. The other ops stream their
// activations (GB/s of bytes read + written; cache-resident at decode, as in a model).
// Activations as a model holds them: 64-byte aligned rows (a zmm load never splits a cache line;
// std::vector's 16-byte alignment made every AVX-512 access of the conv split one).
template <class T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U>
  Aligned64(const Aligned64<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const Aligned64<U>&) const { return true; }
};
using FVec = std::vector<float, Aligned64<float>>;

struct GdnShape {
  const char* name;
  int hk, hv, dk, dv;
};

std::vector<GdnShape> parse_gdn_shapes(const std::string& s) {
  std::vector<GdnShape> out;
  for (const std::string& f : split(s)) {
    GdnShape g{nullptr, 0, 0, 0, 0};
    if (std::sscanf(f.c_str(), "%d/%d/%d/%d", &g.hk, &g.hv, &g.dk, &g.dv) != 4 || g.hk <= 0 || g.hv <= 0 || g.dk <= 0 ||
        g.dv <= 0 || g.hv % g.hk != 0) {
      std::fprintf(stderr, "kernel_bench: --gdn-shapes takes Hk/Hv/dk/dv,... with Hv a multiple of Hk, e.g. 16/32/128/128\n");
      std::exit(2);
    }
    g.name = strdup(f.c_str());
    out.push_back(g);
  }
  return out;
}

void bench_gated_delta(const std::string& tier, const std::vector<int>& threads, const std::vector<double>& bw,
                       const std::vector<GdnShape>& shapes, const std::vector<int64_t>& decode_ns, int64_t prefill_n,
                       bool do_decode, bool do_prefill, int reps, bool hot) {
  const bool has512 = cpu_features().has_avx512_tier();
  struct Fns {
    CausalConv1dFn conv;
    L2NormHeadsFn l2norm;
    GatedDeltaGatesFn gates;
    GatedDeltaFn recurrent, chunked;
    RmsNormGatedFn norm;
  } f{};
  const KernelTable& r = ref_table();
  if (tier == "ref") {
    f = {r.causal_conv1d, r.l2norm_heads, r.gated_delta_gates, r.gated_delta_recurrent, r.gated_delta_chunked,
         r.rmsnorm_gated};
  } else if (tier == "avx2") {
    f = {cpu::avx2::causal_conv1d, cpu::avx2::l2norm_heads, r.gated_delta_gates, cpu::avx2::gated_delta_recurrent,
         nullptr, cpu::avx2::rmsnorm_gated};
  } else if (tier == "avx512" && has512) {
    f = {cpu::avx512::causal_conv1d, cpu::avx512::l2norm_heads, cpu::avx512::gated_delta_gates,
         cpu::avx512::gated_delta_recurrent, nullptr, cpu::avx512::rmsnorm_gated};
  } else {
    std::printf("\n%s: no gated-delta kernels\n", tier.c_str());
    return;
  }
  std::vector<double> fma(threads.size());
  for (size_t ti = 0; ti < threads.size(); ++ti) {
    default_pool().set_threads(threads[ti]);
    // The tier's own FMA width: the ymm probe would read a zmm kernel as up to 200 %.
    fma[ti] = tier == "avx512" ? cpu::avx512::f32_fma_peak(default_pool()) : measure_f32_fma_peak(default_pool());
  }
  std::printf("\n## %s gated delta (per layer; states %s)\n", tier.c_str(), hot ? "hot (one copy)" : "rotated over >= 512 MiB");
  for (size_t ti = 0; ti < threads.size(); ++ti)
    std::printf("f32 FMA peak (%s), %d thread(s): %.1f GFLOP/s\n", tier == "avx512" ? "zmm" : "ymm", threads[ti], fma[ti]);
  std::printf("| Hk/Hv/dk/dv | op | n | threads | median µs [min..max] | GB/s | %% of read BW | GFLOP/s | %% of FMA peak | 1-thread CPU µs |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (const GdnShape& sh : shapes) {
    const int K = 4;
    const int64_t key_dim = static_cast<int64_t>(sh.hk) * sh.dk, val_dim = static_cast<int64_t>(sh.hv) * sh.dv;
    const int64_t C = 2 * key_dim + val_dim;  // the conv's channels: q | k | v
    const int64_t state_floats = val_dim * sh.dk;
    const uint64_t state_bytes = static_cast<uint64_t>(state_floats) * 4;
    const int copies = hot ? 1 : static_cast<int>(std::max<uint64_t>(1, (uint64_t{512} << 20) / state_bytes + 1));
    std::vector<int64_t> ns;
    if (do_decode) ns = decode_ns;
    if (do_prefill) ns.push_back(prefill_n);
    if (ns.empty()) return;
    const int64_t max_n = *std::max_element(ns.begin(), ns.end());
    FVec x(max_n * C), qkv(max_n * C), ab(2 * max_n * sh.hv), lg(max_n * sh.hv), beta(max_n * sh.hv),
        y(max_n * val_dim), z(max_n * val_dim), out(max_n * val_dim), w(C * K), conv_state((K - 1) * C, 0.0f),
        a_log(sh.hv, -0.5f), dt(sh.hv, 0.1f), nw(sh.dv, 1.0f);
    fill_acts(x);
    fill_acts(ab);
    fill_acts(z);
    fill_acts(w);
    // Real inputs for the delta rule: the conv, q/k normalised, gates in range.
    ref_table().causal_conv1d(x.data(), max_n, {C, K, w.data(), nullptr, true}, conv_state.data(), qkv.data());
    ref_table().l2norm_heads(qkv.data(), max_n, {sh.hk, sh.dk, C, 1e-6f, 1.0f / std::sqrt(static_cast<float>(sh.dk))});
    ref_table().l2norm_heads(qkv.data() + key_dim, max_n, {sh.hk, sh.dk, C, 1e-6f, 1.0f});
    ref_table().gated_delta_gates(ab.data(), ab.data() + max_n * sh.hv, max_n, {sh.hv, a_log.data(), dt.data()},
                                  lg.data(), beta.data());
    auto* states = static_cast<float*>(big_alloc(state_bytes * copies));
    for (int64_t i = 0; i < state_floats * copies; ++i) states[i] = 0.01f * static_cast<float>(i % 97) - 0.48f;
    const GatedDeltaShape gs{sh.hk, sh.hv, sh.dk, sh.dv};
    for (int64_t n : ns) {
      GatedDeltaInputs in;
      in.q = qkv.data();
      in.k = qkv.data() + key_dim;
      in.v = qkv.data() + 2 * key_dim;
      in.qkv_stride = C;
      in.log_g = lg.data();
      in.beta = beta.data();
      in.n = n;
      const double rec_flops = 7.0 * static_cast<double>(state_floats) * n;
      struct Op {
        const char* name;
        double bytes, flops;
        std::function<void(int)> run;  // (copy)
      };
      FVec cst((K - 1) * C, 0.0f), xn(n * C), lg2(n * sh.hv), beta2(n * sh.hv);
      std::vector<Op> ops;
      if (f.conv)
        ops.push_back({"conv1d+silu", 8.0 * n * C + 4.0 * K * C, 2.0 * K * C * n, [&](int) {
                         std::copy(conv_state.begin(), conv_state.end(), cst.begin());
                         f.conv(x.data(), n, {C, K, w.data(), nullptr, true}, cst.data(), xn.data());
                       }});
      if (f.l2norm)
        ops.push_back({"l2norm q,k", 16.0 * n * key_dim, 0, [&](int) {
                         f.l2norm(xn.data(), n, {sh.hk, sh.dk, C, 1e-6f, 0.088f});
                         f.l2norm(xn.data() + key_dim, n, {sh.hk, sh.dk, C, 1e-6f, 1.0f});
                       }});
      if (f.gates)
        ops.push_back({"gates", 16.0 * n * sh.hv, 0, [&](int) {
                         f.gates(ab.data(), ab.data() + n * sh.hv, n, {sh.hv, a_log.data(), dt.data()}, lg2.data(), beta2.data());
                       }});
      if (f.recurrent)
        ops.push_back({"delta recurrent", 2.0 * state_bytes + 4.0 * n * (2 * key_dim + 2 * val_dim), rec_flops,
                       [&](int c) { f.recurrent(in, gs, states + c * state_floats, y.data()); }});
      if (f.chunked)
        ops.push_back({"delta chunked", 2.0 * state_bytes + 4.0 * n * (2 * key_dim + 2 * val_dim), rec_flops,
                       [&](int c) { f.chunked(in, gs, states + c * state_floats, y.data()); }});
      if (f.norm)
        ops.push_back({"rmsnorm_gated", 12.0 * n * val_dim, 0, [&](int) {
                         f.norm(y.data(), z.data(), nw.data(), n * sh.hv, sh.dv, 1e-6f, out.data());
                       }});
      for (const Op& op : ops) {
        // The double-precision oracle runs ~1 GFLOP/s: skip its long calls.
        if (tier == "ref" && op.flops > 2e9) continue;
        for (size_t ti = 0; ti < threads.size(); ++ti) {
          default_pool().set_threads(threads[ti]);
          const bool state_op = op.flops == rec_flops;
          const int rot = state_op ? copies : 1;
          const int warm = std::min(rot, 64);
          for (int i = 0; i < warm; ++i) op.run(i % rot);
          const int calls = (n > 64 ? std::max(3, reps / 2) : reps) * (state_op && n <= 64 ? std::max(1, rot / 8) : 1);
          std::vector<double> ts, cpu;
          for (int i = 0, c = 0; i < calls; ++i, c = (c + 1) % rot) {
            const double c0 = thread_cpu_seconds();
            const auto t0 = Clock::now();
            op.run(c);
            ts.push_back(seconds_since(t0));
            cpu.push_back(thread_cpu_seconds() - c0);
          }
          const Stats st = stats(ts), sc = stats(cpu);
          const double gbs = op.bytes / st.median / 1e9, gf = op.flops / st.median / 1e9;
          std::printf("| %s | %s | %lld | %d | %.1f [%.1f..%.1f] | %.1f | %.0f%% | %s | %s | %s |\n", sh.name, op.name,
                      static_cast<long long>(n), threads[ti], st.median * 1e6, st.min * 1e6, st.max * 1e6, gbs,
                      100.0 * gbs / bw[ti], op.flops ? std::to_string(gf).substr(0, 5).c_str() : "-",
                      op.flops ? (std::to_string(static_cast<int>(100.0 * gf / fma[ti])) + "%").c_str() : "-",
                      threads[ti] == 1 ? std::to_string(sc.median * 1e6).substr(0, 7).c_str() : "-");
          std::fflush(stdout);
        }
      }
    }
    std::free(states);
  }
}

// --step: the matmuls of one decode step in the model's order — per layer q/k/v (one 3072-row
// matrix, as matmul_multi runs them), o, gate/up (one 16384-row matrix), down; then the LM head —
// each matrix in its own allocation, as the layers of a model file are. The per-shape rotation
// above runs one shape back to back; a step switches matrix and shape at every call, and on the
// 2-core Zen 5 it streamed 8–10 % slower than the rotations of the same shapes (session 24).
void bench_step(const std::string& tier, const std::string& fmt_name, const Format& fmt, const MatmulFn fn, const std::vector<int>& threads,
                const std::vector<double>& bw, int reps) {
  struct StepShape {
    const char* name;
    int64_t rows, cols;
  };
  const StepShape kLayer[] = {{"q/k/v 3072x2048", 3072, 2048}, {"o 2048x2048", 2048, 2048},
                              {"gate/up 16384x2048", 16384, 2048}, {"down 2048x8192", 2048, 8192}};
  const StepShape kHead = {"lm_head 32000x2048", 32000, 2048};
  std::vector<WeightView> views;
  std::vector<int> kind;  // index into kLayer, 4 = the head
  std::vector<void*> bufs;
  uint64_t step_bytes = 0, kind_bytes[5] = {};  // per step
  auto add = [&](const StepShape& sh, int k) {
    const uint64_t b = fmt.bytes(sh.rows, sh.cols);
    auto* w = static_cast<uint8_t*>(big_alloc(b));
    fill_format(w, fmt, sh.rows, sh.cols);
    bufs.push_back(w);
    views.push_back(make_view(fmt, w, sh.rows, sh.cols));
    kind.push_back(k);
    kind_bytes[k] += b;
    step_bytes += b;
  };
  for (int l = 0; l < kLayers; ++l)
    for (int k = 0; k < 4; ++k) add(kLayer[k], k);
  add(kHead, 4);
  std::vector<float> x(8192), y(32000);
  fill_acts(x);
  std::printf("\n## %s %s: decode step (%d layers, %.1f MB of weights per step, n = 1)\n", tier.c_str(),
              fmt_name.c_str(), kLayers, step_bytes / 1e6);
  std::printf("| threads | step median ms [min..max] | GB/s | %% of read BW | per shape: mean GB/s |\n|---|---|---|---|---|\n");
  ThreadPool& pool = default_pool();
  for (size_t ti = 0; ti < threads.size(); ++ti) {
    pool.set_threads(threads[ti]);
    double per[5] = {};  // seconds per kind over the timed steps
    std::vector<double> steps;
    for (int st = -1; st < reps; ++st) {  // step -1 warms up
      const auto t0 = Clock::now();
      for (size_t i = 0; i < views.size(); ++i) {
        const auto a = Clock::now();
        fn(views[i], x.data(), 1, y.data());
        if (st >= 0) per[kind[i]] += seconds_since(a);
      }
      if (st >= 0) steps.push_back(seconds_since(t0));
    }
    const Stats s = stats(steps);
    std::printf("| %d | %.3f [%.3f..%.3f] | %.1f | %.0f%% |", threads[ti], s.median * 1e3, s.min * 1e3, s.max * 1e3,
                step_bytes / s.median / 1e9, 100.0 * step_bytes / s.median / 1e9 / bw[ti]);
    for (int k = 0; k < 5; ++k)
      std::printf(" %s %.1f%s", k < 4 ? kLayer[k].name : kHead.name, static_cast<double>(kind_bytes[k]) * reps / per[k] / 1e9,
                  k < 4 ? ";" : " |\n");
    std::fflush(stdout);
  }
  for (void* b : bufs) std::free(b);
}

// --moe: kernels::matmul_experts (one routed-expert matrix of a MoE layer; default Qwen3-30B-A3B's
// gate/up: 128 experts of 768 x 2048, 8 per token) on the active table, against the way without
// it: one kernels::matmul per selected expert (a fork/join each). Each call draws new routes, and
// the layers rotate over >= 512 MiB of experts, so the selected experts come from DRAM as in a
// real step. GB/s counts the bytes of the distinct experts the call selected — what decode must
// read — so it is comparable with the read bandwidth; prefill reports GOP/s.
struct MoeShape {
  int experts = 128, k = 8;
  int64_t rows = 768, cols = 2048;
};

void bench_moe(const std::string& fmt_name, const Format& fmt, const MoeShape& ms, const std::vector<int>& threads,
               const std::vector<double>& bw, const std::vector<int64_t>& decode_ns, int64_t prefill_n, bool do_prefill,
               int reps) {
  const uint64_t ebytes = fmt.bytes(ms.rows, ms.cols);
  const uint64_t layer_bytes = ebytes * static_cast<uint64_t>(ms.experts);
  const int layers = static_cast<int>(std::max<uint64_t>(1, (uint64_t{512} << 20) / layer_bytes + 1));
  std::vector<std::vector<WeightView>> views(static_cast<size_t>(layers));
  std::vector<void*> bufs;
  for (auto& lv : views) {
    auto* buf = static_cast<uint8_t*>(big_alloc(layer_bytes));
    bufs.push_back(buf);
    for (int e = 0; e < ms.experts; ++e) {
      fill_format(buf + e * ebytes, fmt, ms.rows, ms.cols);
      lv.push_back(make_view(fmt, buf + e * ebytes, ms.rows, ms.cols));
    }
  }
  std::printf("\n## %s %s: matmul_experts, %d experts of %lldx%lld, k = %d (%.2f MB per expert, %d layers rotated)\n",
              active_table().name, fmt_name.c_str(), ms.experts, (long long)ms.rows, (long long)ms.cols, ms.k,
              ebytes / 1e6, layers);
  std::printf("| n | threads | grouped µs [min..max] | GB/s (selected experts) | %% of read BW | GOP/s | "
              "per-expert matmuls µs | speedup |\n|---|---|---|---|---|---|---|---|\n");
  uint64_t rng = 0x2545f4914f6cdd1dull;
  auto next = [&] {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };
  std::vector<int64_t> ns = decode_ns;
  if (do_prefill) ns.push_back(prefill_n);
  for (size_t ti = 0; ti < threads.size(); ++ti) {
    default_pool().set_threads(threads[ti]);
    for (int64_t n : ns) {
      const int r = n > 8 ? std::max(3, reps / 2) : reps * 4;
      const int routes = 64;  // route sets drawn before timing
      std::vector<std::vector<int32_t>> ids(routes);
      for (auto& v : ids) {
        for (int64_t t = 0; t < n; ++t) {
          std::vector<int32_t> all(static_cast<size_t>(ms.experts));
          for (int e = 0; e < ms.experts; ++e) all[static_cast<size_t>(e)] = e;
          for (int j = 0; j < ms.k; ++j) std::swap(all[static_cast<size_t>(j)], all[j + next() % (ms.experts - j)]);
          v.insert(v.end(), all.begin(), all.begin() + ms.k);
        }
      }
      std::vector<float> x(static_cast<size_t>(n * ms.cols)), y(static_cast<size_t>(n * ms.k * ms.rows));
      std::vector<float> xg(x.size() * ms.k), yg(y.size());
      fill_acts(x);
      std::vector<double> tg, tp, gb;
      for (int i = -2; i < r; ++i) {  // two warm-up calls
        const auto& id = ids[static_cast<size_t>((i + 2) % routes)];
        const auto& lv = views[static_cast<size_t>((i + 2) % layers)];
        const ExpertsView ev{lv.data(), ms.experts};
        auto t0 = Clock::now();
        matmul_experts(ev, x.data(), false, n, id.data(), ms.k, y.data());
        const double g = seconds_since(t0);
        // The way without it: each selected expert's rows gathered and run as one matmul.
        std::vector<std::vector<int64_t>> by(static_cast<size_t>(ms.experts));
        for (size_t p = 0; p < id.size(); ++p) by[static_cast<size_t>(id[p])].push_back(static_cast<int64_t>(p));
        const auto& lv2 = views[static_cast<size_t>((i + 3) % layers)];
        t0 = Clock::now();
        for (int e = 0; e < ms.experts; ++e) {
          const auto& ps = by[static_cast<size_t>(e)];
          if (ps.empty()) continue;
          for (size_t q = 0; q < ps.size(); ++q)
            std::memcpy(&xg[q * ms.cols], &x[static_cast<size_t>(ps[q] / ms.k * ms.cols)], ms.cols * 4);
          matmul(lv2[static_cast<size_t>(e)], xg.data(), static_cast<int64_t>(ps.size()), yg.data());
        }
        const double p = seconds_since(t0);
        if (i < 0) continue;
        int distinct = 0;
        for (const auto& ps : by) distinct += !ps.empty();
        tg.push_back(g);
        tp.push_back(p);
        gb.push_back(static_cast<double>(distinct) * ebytes / g / 1e9);
      }
      const Stats s = stats(tg), sp = stats(tp), sb = stats(gb);
      const double gops = 2.0 * n * ms.k * ms.rows * ms.cols / s.median / 1e9;
      std::printf("| %lld | %d | %.1f [%.1f..%.1f] | %.1f | %.0f%% | %.1f | %.1f | %.2fx |\n", (long long)n, threads[ti],
                  s.median * 1e6, s.min * 1e6, s.max * 1e6, sb.median, 100.0 * sb.median / bw[ti], gops,
                  sp.median * 1e6, sp.median / s.median);
      std::fflush(stdout);
    }
  }
  // gate and up of a layer (two rotated layers' matrices stand in for them): matmul_experts_multi
  // (one pool job) against two matmul_experts calls.
  if (layers >= 2) {
    std::printf("\n| gate+up, n | threads | matmul_experts_multi µs [min..max] | GB/s | two matmul_experts µs | speedup |\n"
                "|---|---|---|---|---|---|\n");
    for (size_t ti = 0; ti < threads.size(); ++ti) {
      default_pool().set_threads(threads[ti]);
      for (int64_t n : decode_ns) {
        std::vector<float> x(static_cast<size_t>(n * ms.cols)), ya(static_cast<size_t>(n * ms.k * ms.rows)), yb(ya.size());
        fill_acts(x);
        std::vector<double> tm, t2, gb;
        for (int i = -2; i < reps * 4; ++i) {
          std::vector<int32_t> id;
          for (int64_t t = 0; t < n; ++t) {
            std::vector<int32_t> all(static_cast<size_t>(ms.experts));
            for (int e = 0; e < ms.experts; ++e) all[static_cast<size_t>(e)] = e;
            for (int j = 0; j < ms.k; ++j) std::swap(all[static_cast<size_t>(j)], all[j + next() % (ms.experts - j)]);
            id.insert(id.end(), all.begin(), all.begin() + ms.k);
          }
          int distinct = 0;
          {
            std::vector<bool> seen(static_cast<size_t>(ms.experts));
            for (int32_t e : id) distinct += !seen[static_cast<size_t>(e)], seen[static_cast<size_t>(e)] = true;
          }
          const int l = (i + 2) % layers;
          const ExpertsView gu[2] = {{views[static_cast<size_t>(l)].data(), ms.experts},
                                     {views[static_cast<size_t>((l + 1) % layers)].data(), ms.experts}};
          float* ys[2] = {ya.data(), yb.data()};
          auto t0 = Clock::now();
          matmul_experts_multi(gu, ys, 2, x.data(), false, n, id.data(), ms.k);
          const double m = seconds_since(t0);
          const int l2 = (i + 4) % layers;  // other matrices for the comparison (no cache reuse)
          const ExpertsView gu2[2] = {{views[static_cast<size_t>(l2)].data(), ms.experts},
                                      {views[static_cast<size_t>((l2 + 1) % layers)].data(), ms.experts}};
          t0 = Clock::now();
          matmul_experts(gu2[0], x.data(), false, n, id.data(), ms.k, ya.data());
          matmul_experts(gu2[1], x.data(), false, n, id.data(), ms.k, yb.data());
          const double two = seconds_since(t0);
          if (i < 0) continue;
          tm.push_back(m);
          t2.push_back(two);
          gb.push_back(2.0 * distinct * ebytes / m / 1e9);
        }
        const Stats s = stats(tm), s2 = stats(t2), sb = stats(gb);
        std::printf("| %lld | %d | %.1f [%.1f..%.1f] | %.1f | %.1f | %.2fx |\n", (long long)n, threads[ti], s.median * 1e6,
                    s.min * 1e6, s.max * 1e6, sb.median, s2.median * 1e6, s2.median / s.median);
        std::fflush(stdout);
      }
    }
  }
  for (void* b : bufs) std::free(b);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 11;
  std::vector<int> threads = {1, 2};
  std::vector<std::string> formats = {"Q4_0", "Q8_0", "BF16", "F16", "F32"};
  std::vector<std::string> tiers = {cpu_features().has_avx512_tier() ? "avx512" : "avx2"};
  bool do_prefill = true, do_decode = true, hot = false, skip_bw = false;
  bool do_attention = true, only_attention = false;
  bool step_only = false;  // --step: only the decode step's matmul sequence (bench_step)
  bool moe_only = false;   // --moe: only the grouped expert matmul (bench_moe)
  MoeShape moe_shape;
  std::vector<int64_t> attn_contexts = {512, 4096, 16384};
  std::vector<Shape> shapes(std::begin(kDefaultShapes), std::end(kDefaultShapes));
  std::vector<std::string> shape_names;
  int64_t prefill_n = 512;
  std::vector<int64_t> decode_ns = {1};
  DType kv_dtype = DType::kF16;  // the KV cache's default (--kv-dtype)
  AttnShape attn_shape;
  int attn_evict_mb = 0;
  bool do_gdn = true, only_gdn = false;  // --no-gated-delta, --gated-delta-only
  std::vector<GdnShape> gdn_shapes = parse_gdn_shapes("16/16/128/128,16/32/128/128");  // Qwen3.5 2B, 9B
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--reps") reps = std::atoi(val().c_str());
    else if (a == "--threads") { threads.clear(); for (auto& s : split(val())) threads.push_back(std::atoi(s.c_str())); }
    else if (a == "--formats") formats = split(val());
    else if (a == "--tiers") tiers = split(val());
    else if (a == "--decode-n") { decode_ns.clear(); for (auto& s : split(val())) decode_ns.push_back(std::atoll(s.c_str())); }
    else if (a == "--prefill-n") prefill_n = std::atoll(val().c_str());
    else if (a == "--no-prefill") do_prefill = false;
    else if (a == "--no-decode") do_decode = false;
    else if (a == "--hot") hot = true;  // one copy: cache-resident, measures instruction throughput
    else if (a == "--no-bw") skip_bw = true;
    else if (a == "--attn-shape") {  // H/KV/HD
      const auto f = split(val(), '/');
      if (f.size() != 3) { std::fprintf(stderr, "kernel_bench: --attn-shape takes heads/kv_heads/head_dim, e.g. 32/8/64\n"); return 2; }
      attn_shape = {std::atoi(f[0].c_str()), std::atoi(f[1].c_str()), std::atoi(f[2].c_str())};
      if (attn_shape.kv_heads <= 0 || attn_shape.head_dim <= 0 || attn_shape.heads % attn_shape.kv_heads != 0) {
        std::fprintf(stderr, "kernel_bench: --attn-shape needs heads a multiple of kv_heads, all positive\n");
        return 2;
      }
    }
    else if (a == "--attn-evict-mb") attn_evict_mb = std::atoi(val().c_str());
    else if (a == "--kv-dtype") {
      const std::string v = val();
      if (v == "f32") kv_dtype = DType::kF32;
      else if (v == "f16") kv_dtype = DType::kF16;
      else if (v == "q8_0") kv_dtype = DType::kQ8_0;
      else { std::fprintf(stderr, "kernel_bench: --kv-dtype takes f32, f16 or q8_0, not '%s'\n", v.c_str()); return 2; }
    }
    else if (a == "--step") step_only = true;
    else if (a == "--moe") moe_only = true;
    else if (a == "--moe-shape") {  // E/k/rows/cols
      const auto f = split(val(), '/');
      if (f.size() != 4) { std::fprintf(stderr, "kernel_bench: --moe-shape takes experts/k/rows/cols, e.g. 128/8/768/2048\n"); return 2; }
      moe_shape = {std::atoi(f[0].c_str()), std::atoi(f[1].c_str()), std::atoll(f[2].c_str()), std::atoll(f[3].c_str())};
      if (moe_shape.k <= 0 || moe_shape.k > moe_shape.experts || moe_shape.rows <= 0 || moe_shape.cols <= 0) {
        std::fprintf(stderr, "kernel_bench: --moe-shape needs 0 < k <= experts and positive rows, cols\n");
        return 2;
      }
    }
    else if (a == "--no-gated-delta") do_gdn = false;
    else if (a == "--gated-delta-only") only_gdn = true;
    else if (a == "--gdn-shapes") gdn_shapes = parse_gdn_shapes(val());
    else if (a == "--no-attention") do_attention = false;
    else if (a == "--attention-only") only_attention = true;
    else if (a == "--attn-contexts") { attn_contexts.clear(); for (auto& s : split(val())) attn_contexts.push_back(std::atoll(s.c_str())); }
    else if (a == "--shapes") {  // RxC,RxC,...
      shapes.clear();
      shape_names = split(val());
      for (auto& s : shape_names) {
        Shape sh{s.c_str(), 0, 0, 1};
        std::sscanf(s.c_str(), "%ldx%ld", &sh.rows, &sh.cols);
        shapes.push_back(sh);
      }
    }
    else { std::fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
  }

  ThreadPool& pool = default_pool();
  std::printf("# kernel_bench\ncpu: %s | %s\n", cpu_model().c_str(), cpu_features().describe().c_str());
  std::printf("reps %d (median of timed calls after a warm-up pass; [min..max] shown)\n", reps);

  const size_t bw_bytes = size_t{1} << 30;
  auto* bw_buf = static_cast<uint8_t*>(big_alloc(bw_bytes));
  if (!skip_bw) std::memset(bw_buf, 1, bw_bytes);
  std::vector<double> bw_before(threads.size()), bw_after(threads.size());
  double bw_cpu1 = 1;  // 1-thread read bandwidth per second of this thread's CPU time
  for (size_t i = 0; i < threads.size(); ++i) {
    pool.set_threads(threads[i]);
    double cpu_gbs = 0;
    bw_before[i] = skip_bw ? 1 : measure_read_bandwidth(pool, bw_buf, bw_bytes, 5, &cpu_gbs);
    if (threads[i] == 1 && !skip_bw) bw_cpu1 = cpu_gbs;
    std::printf("read bandwidth, %d thread(s): %.1f GB/s wall%s (median of 5 x 1 GiB)\n", threads[i], bw_before[i],
                threads[i] == 1 ? (", " + std::to_string(cpu_gbs).substr(0, 5) + " GB/s per CPU-second").c_str() : "");
  }

  struct ModelAcc {
    double decode_s = 0, prefill_s = 0;
    double decode_cpu = 0, prefill_cpu = 0;  // 1-thread runs: thread CPU time
    bool decode_full = true, prefill_full = true;
  };

  if (moe_only) {
    for (const std::string& fs : formats) {
      const Format fmt = parse_format(fs);
      if (fmt.bits && moe_shape.cols % fmt.group_size != 0) continue;
      bench_moe(fs, fmt, moe_shape, threads, bw_before, decode_ns, prefill_n, do_prefill, reps);
    }
    return 0;
  }
  if (step_only) {
    for (const std::string& tier : tiers)
      for (const std::string& fs : formats) {
        const Format fmt = parse_format(fs);
        if (const MatmulFn fn = tier_fn(tier, fmt)) bench_step(tier, fs, fmt, fn, threads, bw_before, reps);
        else std::printf("\n%s: no %s kernel\n", tier.c_str(), fs.c_str());
      }
    return 0;
  }
  if (only_attention || only_gdn) formats.clear();
  if (only_gdn) do_attention = false;
  for (const std::string& tier : tiers) {
    for (const std::string& fs : formats) {
      const Format fmt = parse_format(fs);
      const MatmulFn fn = tier_fn(tier, fmt);
      if (!fn) {
        std::printf("\n%s: no %s kernel\n", tier.c_str(), fs.c_str());
        continue;
      }
      std::vector<ModelAcc> model(threads.size() * decode_ns.size() + threads.size());
      std::printf("\n## %s %s\n", tier.c_str(), fs.c_str());
      std::printf("| shape | n | threads | median µs [min..max] | GB/s (weights) | %% of read BW | GOP/s | 1-thread CPU µs / GOP/s / %% of CPU-time BW |\n");
      std::printf("|---|---|---|---|---|---|---|---|\n");
      for (const Shape& sh : shapes) {
        if (fmt.bits && sh.cols % fmt.group_size != 0) continue;
        const uint64_t wbytes = fmt.bytes(sh.rows, sh.cols);
        // Copies so that one rotation streams >= 512 MiB (16x this L3; a 1B model streams ~600 MB
        // per token). At 128 MiB the L3 still held part of a rotation: the same Q4_0 decode shapes
        // read 107-110 % of the 1 GiB probe against 92-97 % at 512 MiB (bench/RESULTS.md, session 28).
        const int copies =
            hot ? 1 : static_cast<int>(std::max<uint64_t>(1, (uint64_t{512} << 20) / wbytes + 1));
        auto* wbuf = static_cast<uint8_t*>(big_alloc(wbytes * copies));
        for (int c = 0; c < copies; ++c) {
          fill_format(wbuf + c * wbytes, fmt, sh.rows, sh.cols);
        }
        std::vector<WeightView> views(copies);
        for (int c = 0; c < copies; ++c) views[c] = make_view(fmt, wbuf + c * wbytes, sh.rows, sh.cols);
        const int64_t max_n = std::max<int64_t>(prefill_n, *std::max_element(decode_ns.begin(), decode_ns.end()));
        std::vector<float> x(max_n * sh.cols), y(max_n * sh.rows);
        fill_acts(x);

        std::vector<int64_t> ns;
        if (do_decode) ns = decode_ns;
        const bool prefill_shape = sh.per_layer > 0;  // the LM head runs on the last position only
        if (do_prefill && prefill_shape) ns.push_back(prefill_n);
        for (size_t ti = 0; ti < threads.size(); ++ti) {
          pool.set_threads(threads[ti]);
          for (size_t ni = 0; ni < ns.size(); ++ni) {
            const int64_t n = ns[ni];
            const bool is_prefill = n == prefill_n && do_prefill && prefill_shape && ni == ns.size() - 1;
            // Prefill calls are long (ms); fewer reps keep the run short.
            const int r = is_prefill ? std::max(3, reps / 2) : reps;
            const double ref_cost = static_cast<double>(sh.rows) * sh.cols * n;
            if (tier == "ref" && ref_cost > 2.5e8) continue;  // the scalar oracle is ~1 GMAC/s
            std::vector<double> ts, cpu;
            int c = 0;
            for (int w = 0; w < copies; ++w) fn(views[w], x.data(), n, y.data());  // warm-up pass
            for (int i = 0; i < r * (is_prefill ? 1 : std::max(1, copies / 2)); ++i) {
              const double c0 = thread_cpu_seconds();
              auto t0 = Clock::now();
              fn(views[c], x.data(), n, y.data());
              ts.push_back(seconds_since(t0));
              cpu.push_back(thread_cpu_seconds() - c0);
              c = (c + 1) % copies;
            }
            Stats s = stats(ts);
            const Stats sc = stats(cpu);
            const double gbs = wbytes / s.median / 1e9;
            const double gops = 2.0 * sh.rows * sh.cols * n / s.median / 1e9;
            const double cpu_gops = 2.0 * sh.rows * sh.cols * n / sc.median / 1e9;
            const double cpu_gbs = wbytes / sc.median / 1e9;
            std::printf("| %s | %lld | %d | %.1f [%.1f..%.1f] | %.1f | %.0f%% | %.1f | %s |\n", sh.name,
                        static_cast<long long>(n), threads[ti], s.median * 1e6, s.min * 1e6, s.max * 1e6, gbs,
                        100.0 * gbs / bw_before[ti], gops,
                        threads[ti] == 1 ? (std::to_string(static_cast<int>(sc.median * 1e6)) + " / " +
                                            std::to_string(static_cast<int>(cpu_gops)) + " / " +
                                            std::to_string(static_cast<int>(100 * cpu_gbs / bw_cpu1)) + "%")
                                               .c_str()
                                         : "-");
            std::fflush(stdout);
            const int cnt = sh.per_layer ? sh.per_layer * kLayers : 1;
            if (is_prefill) {
              model[threads.size() * decode_ns.size() + ti].prefill_s += cnt * s.median;
              model[threads.size() * decode_ns.size() + ti].prefill_cpu += cnt * sc.median;
            } else {
              model[ti * decode_ns.size() + ni].decode_s += cnt * s.median;
              model[ti * decode_ns.size() + ni].decode_cpu += cnt * sc.median;
            }
          }
        }
        std::free(wbuf);
      }
      // Matmul-only model estimate: 16 layers of the shapes above + LM head (decode); prefill
      // excludes the LM head (last position only) and attention (small below ~2k tokens).
      for (size_t ti = 0; ti < threads.size(); ++ti) {
        for (size_t ni = 0; ni < decode_ns.size() && do_decode; ++ni) {
          const double sdec = model[ti * decode_ns.size() + ni].decode_s;
          const double cdec = model[ti * decode_ns.size() + ni].decode_cpu;
          if (sdec > 0)
            std::printf("model estimate (matmuls only), %d thread(s), decode n=%lld: %.2f ms/step -> %.1f steps/s wall%s\n",
                        threads[ti], static_cast<long long>(decode_ns[ni]), sdec * 1e3, 1.0 / sdec,
                        threads[ti] == 1 ? (", " + std::to_string(cdec * 1e3).substr(0, 6) + " ms CPU -> " +
                                            std::to_string(1.0 / cdec).substr(0, 5) + " steps per CPU-second")
                                               .c_str()
                                         : "");
        }
        const double spre = model[threads.size() * decode_ns.size() + ti].prefill_s;
        const double cpre = model[threads.size() * decode_ns.size() + ti].prefill_cpu;
        if (do_prefill && spre > 0)
          std::printf("model estimate (matmuls only), %d thread(s), prefill n=%lld: %.0f ms -> %.1f tok/s wall%s\n",
                      threads[ti], static_cast<long long>(prefill_n), spre * 1e3, prefill_n / spre,
                      threads[ti] == 1 ? (", " + std::to_string(cpre * 1e3).substr(0, 7) + " ms CPU -> " +
                                          std::to_string(prefill_n / cpre).substr(0, 5) + " tok per CPU-second")
                                             .c_str()
                                       : "");
      }
    }
  }

  if ((do_gdn && !only_attention) || only_gdn)
    for (const std::string& tier : tiers)
      bench_gated_delta(tier, threads, bw_before, gdn_shapes, decode_ns, prefill_n, do_decode, do_prefill, reps, hot);

  if (do_attention || only_attention)
    for (const std::string& tier : tiers)
      bench_attention(tier, threads, bw_before, attn_contexts, decode_ns, do_decode, do_prefill, reps, hot, bw_cpu1,
                      kv_dtype, attn_shape, attn_evict_mb);

  for (size_t i = 0; i < threads.size(); ++i) {
    pool.set_threads(threads[i]);
    if (skip_bw) break;
    bw_after[i] = measure_read_bandwidth(pool, bw_buf, bw_bytes, 5);
    std::printf("read bandwidth after, %d thread(s): %.1f GB/s (before %.1f)\n", threads[i], bw_after[i], bw_before[i]);
  }
  // Pool overhead: an empty job on all threads.
  for (int t : threads) {
    pool.set_threads(t);
    std::vector<double> ts;
    for (int i = 0; i < 2000; ++i) {
      auto t0 = Clock::now();
      pool.parallel_for(t, [](int64_t, int) {});
      ts.push_back(seconds_since(t0));
    }
    Stats s = stats(ts);
    std::printf("empty parallel_for, %d thread(s): median %.2f µs [min %.2f, max %.1f]\n", t, s.median * 1e6,
                s.min * 1e6, s.max * 1e6);
  }
  std::free(bw_buf);
  return 0;
}
