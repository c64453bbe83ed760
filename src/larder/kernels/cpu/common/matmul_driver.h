// matmul_driver.h — how a matmul is cut into tiles and spread over the pool (all formats, all tiers).
//
// A format supplies a micro-kernel `K::template tile<R, T>(r0, t0)` that computes the R×T block
// y[t0..t0+T, r0..r0+R] over the full reduction (cols), or `tile_rows<R, T, kPf>` when its
// weight stream takes simd::prefetch_rows' prefetch (run_tile picks the regime). The driver
// only decides tile order:
//
// - Decode (n <= 8): the job is bandwidth-bound, so every weight byte must come from DRAM exactly
//   once and be used for all n tokens. With several threads each streams one contiguous region
//   of rows (run_decode_regions); inside a region's sub-chunks each R-row
//   tile is streamed once per group of <= 4 tokens — for n <= 4 exactly once, for n = 5..8 the
//   second pass re-reads the R rows from L1 (R·row_bytes <= 2×17 KiB at cols = 8192, Q8_0).
// - Prefill (n > 8): compute-bound. Chunks are (row block × token block) tiles. The token block
//   is sized so its activations stay in L2 (Zen 3/4: 512 KiB/1 MiB per core; we budget 128 KiB)
//   while the row block's weights (<= ~36 KiB) are re-read from L1/L2 for each 4-token group;
//   each weight row is therefore decoded once per 4 tokens instead of once per token.
// - Chunk counts (prefill, and decode on one thread): ~16 per thread, so the atomic counter
//   balances a core that a neighbour's compile slows down (shared host; performance.md §5)
//   without claiming per tile. Decode regions balance by letting a finished thread take the
//   other regions' remaining sub-chunks.
//
// R (rows per tile) is K::kRows1 for single-token groups and K::kRowsN otherwise: a single token
// has only R independent accumulator chains, so it wants more rows; several tokens share the
// weight registers and the register file (16 ymm / 32 zmm) caps R·T.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "larder/core/cpuid.h"
#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/ops.h"

namespace larder::kernels::cpu {

// One R×T tile. For a kernel written as tile_rows<R, T, kPf> (and holding row_bytes) the
// prefetch policy of simd::prefetch_rows is chosen here, once per tile: with the choice made
// inside the step the short-row loops ran 20 % slower on Zen 4.
// Whether decode tiles prefetch into L1 (simd_avx2.h prefetch_rows: cores with >= 48 KiB of L1D).
inline const bool g_prefetch_l1 = cpu_features().decode_prefetch_l1;

template <int R, int T, class K>
__attribute__((always_inline)) inline void run_tile(const K& k, int64_t r0, int64_t t0) {
  if constexpr (requires { k.template tile_rows<R, T, 0>(r0, t0); }) {
    const bool lng = simd::long_rows(R, k.row_bytes);
    if (g_prefetch_l1) {
      if (lng) k.template tile_rows<R, T, simd::kPfLong | simd::kPfL1>(r0, t0);
      else k.template tile_rows<R, T, simd::kPfL1>(r0, t0);
    } else {
      if (lng) k.template tile_rows<R, T, simd::kPfLong>(r0, t0);
      else k.template tile_rows<R, T, 0>(r0, t0);
    }
  } else {
    k.template tile<R, T>(r0, t0);
  }
}

template <class K, int R>
inline void run_tokens(const K& k, int64_t r0, int64_t t0, int64_t nt) {
  for (; nt >= 4; nt -= 4, t0 += 4) run_tile<R, 4>(k, r0, t0);
  switch (nt) {
    case 3: run_tile<R, 3>(k, r0, t0); break;
    case 2: run_tile<R, 2>(k, r0, t0); break;
    case 1: run_tile<R, 1>(k, r0, t0); break;
    default: break;
  }
}

// Rows per single-token tile: K::kRows1, or K::kRows1Zen (1 or 2) on Zen 4 and Zen 5 for the
// kernels that declare one. Those kernels streamed their weights from DRAM faster there with
// fewer rows interleaved per tile. Zen 4 (1B decode, 2 threads, larder bench alternating
// LARDER_DECODE_TILES generic/zen, medians of 5): Q8_0 17.5 → 22.6 tok/s, MLX q4 37.5 → 47.2,
// Q5_K_M 24.6 → 33.1, Q6_K 22.0 → 30.5, Q4_K_M 37.4 → 39.0, IQ4_XS 44.6 → 49.5; Q4_0, IQ4_NL and
// Q2_K/Q3_K measured no better with fewer rows. Zen 5 (session 20, 6 alternating pairs): Q8_0
// 52 → 60 tok/s, Q4_K_M +1–6 %, MLX q4 66 → 79 while a neighbour loaded the host's memory and
// equal (~100) when it did not; Q4_0 (session 22) 71.0 → 72.9 tok/s under load — on Zen 4 Q4_0
// keeps its four rows (kRows1Zen4: faster with the host's memory idle, session 30). The counts in
// kRows1 were first measured on an earlier Zen 5 host with half this one's bandwidth (MLX q4 with
// 8 rows: 101–103 % of its read probe) and stay on Intel. Same arithmetic either way: one output
// per row.
template <class K>
constexpr int zen_rows1() {
  if constexpr (requires { K::kRows1Zen; }) {
    return K::kRows1Zen;
  } else {
    return K::kRows1;
  }
}

// With zen decode tiles, a tile of long rows (simd::long_rows: the down projection, 4.6–6.7
// KiB per row at 8192 columns) takes one row where it would take two. Each row of a tile is its
// own stream from DRAM, and one row per tile turns the region into one linear stream that the
// short-row sweep prefetches; two interleaved 4.6 KiB streams per core did not keep up. Zen 5
// (session 24, 1B decode tg64, 2 threads, one binary alternating, both orders): Q4_0 +2–8 % in
// 12 of 14 pairs, Q4_K_M +4–9 % in 11 of 11, Q5_K_M +4–7 %, Q6_K +5–7 %; 1 thread: Q4_0 level,
// Q6_K +3–6 %. The sweep prefetch over a tile of two long rows instead was not faster. Zen 4
// shares the rule unmeasured (its earlier data only ever favoured fewer rows per tile).
// Zen 4 only (cpu_features().zen_generation == 4): K::kRows1Zen4 where a kernel declares one,
// else the zen set's count.
template <class K>
constexpr int zen4_rows1() {
  if constexpr (requires { K::kRows1Zen4; }) {
    return K::kRows1Zen4;
  } else {
    return zen_rows1<K>();
  }
}

template <class K>
inline int rows1(const K& k) {
  static_assert(zen_rows1<K>() == K::kRows1 || zen_rows1<K>() == 1 || zen_rows1<K>() == 2);
  static_assert(zen4_rows1<K>() == K::kRows1 || zen4_rows1<K>() == 1 || zen4_rows1<K>() == 2);
  static const int r = !cpu_features().zen_decode_tiles       ? K::kRows1
                       : cpu_features().zen_generation == 4 ? zen4_rows1<K>()
                                                            : zen_rows1<K>();
  if constexpr (requires { k.row_bytes; }) {
    if (r == 2 && cpu_features().zen_decode_tiles && simd::long_rows(2, k.row_bytes)) return 1;
  }
  return r;
}

template <class K>
inline void run_block(const K& k, int64_t r_begin, int64_t r_end, int64_t t_begin, int64_t t_end) {
  const int64_t nt = t_end - t_begin;
  int64_t r = r_begin;
  const int r1 = nt == 1 ? rows1<K>(k) : 0;
  if (nt == 1 && r1 == K::kRows1) {
    for (; r + K::kRows1 <= r_end; r += K::kRows1) run_tile<K::kRows1, 1>(k, r, t_begin);
  } else if (nt == 1 && r1 == 2) {
    for (; r + 2 <= r_end; r += 2) run_tile<2, 1>(k, r, t_begin);
  } else if (nt == 1) {
    for (; r < r_end; ++r) run_tile<1, 1>(k, r, t_begin);
  } else {
    for (; r + K::kRowsN <= r_end; r += K::kRowsN) run_tokens<K, K::kRowsN>(k, r, t_begin, nt);
  }
  for (; r < r_end; ++r) run_tokens<K, 1>(k, r, t_begin, nt);
}

// Decode (n <= 8) over several threads: each thread streams one contiguous region of rows, in
// sub-chunks taken in order from the region's own counter, and only then helps the other
// regions (same counters, so a slowed core's rows are still shared out). Interleaving small
// chunks of one matrix between the cores instead (chunk i to whoever is free) restarts every
// core's hardware prefetch stream at each chunk; measured on the 2-core Zen 5 (1B Q4_0 / MLX q4
// decode, alternating runs), contiguous regions were faster in 8 of 8 pairs (see bench/RESULTS.md).
//
// A sub-chunk is at most 1/8 of a region and at most half of what the region has left, down to
// 8 rows: a thread that finishes first then waits at the join for at most a small last piece,
// not a whole eighth. With fixed eighths the caller waited 6–8 µs per gate/up call on the
// 2-core Zen 5 (`LARDER_PROFILE` join wait; 1B Q4_0 decode); halving brought it to ~1 µs and
// decode +1–2 % (1B tg64: Q4_0 10 of 10 alternating pairs, Q4_K_M 14 of 16).
template <class K>
inline void run_decode_regions(const K& k, int64_t rows, int64_t n, int threads) {
  constexpr int kSub = 8;                          // sub-chunks per region, at most
  constexpr int kMaxThreads = 256;
  const int regions = std::min(threads, kMaxThreads);
  const int64_t region_rows = ((rows + regions - 1) / regions + 7) / 8 * 8;
  const int64_t sub_rows = std::max<int64_t>(8, (region_rows / kSub + 7) / 8 * 8);
  std::atomic<int64_t> next[kMaxThreads];  // per region: rows handed out
  for (int i = 0; i < regions; ++i) next[i].store(0, std::memory_order_relaxed);
  default_pool().parallel_for(regions, [&](int64_t home, int) {
    for (int i = 0; i < regions; ++i) {
      const int64_t reg = (home + i) % regions;
      const int64_t r_begin = reg * region_rows, len = std::min(rows, r_begin + region_rows) - r_begin;
      int64_t h = next[reg].load(std::memory_order_relaxed);
      while (h < len) {
        const int64_t half = (len - h + 15) / 16 * 8;  // half of what is left, in whole 8-row blocks
        const int64_t size = std::min(len - h, std::max<int64_t>(8, std::min(sub_rows, half)));
        if (!next[reg].compare_exchange_weak(h, h + size, std::memory_order_relaxed)) continue;
        run_block(k, r_begin + h, r_begin + h + size, 0, n);
        h = next[reg].load(std::memory_order_relaxed);
      }
    }
  });
}

// rows: output features; n: tokens; act_bytes_per_token: bytes of prepared activations per token
// (sizes the prefill token block for L2).
template <class K>
inline void run_matmul_tiles(const K& k, int64_t rows, int64_t n, int64_t act_bytes_per_token) {
  ThreadPool& pool = default_pool();
  const int threads = pool.n_threads();
  if (n <= 8 && threads > 1) {
    run_decode_regions(k, rows, n, threads);
    return;
  }
  int64_t tb = n;  // tokens per chunk
  if (n > 8) {
    tb = std::max<int64_t>(8, (128 * 1024) / std::max<int64_t>(act_bytes_per_token, 1)) / 4 * 4;
    tb = std::min(tb, n);
  }
  const int64_t n_tb = (n + tb - 1) / tb;
  // Row block: a multiple of 8 (every R divides it), ~16 chunks per thread in total.
  const int64_t want_chunks = 16 * static_cast<int64_t>(threads);
  int64_t rb = (rows * n_tb + want_chunks - 1) / want_chunks;
  rb = std::max<int64_t>(8, (rb + 7) / 8 * 8);
  if (n > 8) rb = std::min<int64_t>(rb, 64);
  const int64_t n_rb = (rows + rb - 1) / rb;
  pool.parallel_for(n_rb * n_tb, [&](int64_t c, int) {
    const int64_t ib = c % n_rb, it = c / n_rb;
    const int64_t r0 = ib * rb, r1 = std::min(rows, r0 + rb);
    const int64_t t0 = it * tb, t1 = std::min(n, t0 + tb);
    run_block(k, r0, r1, t0, t1);
  });
}

// Several matrices over the same activations as one matmul (q/k/v, gate/up: kernels::matmul_multi).
// Their rows are concatenated — part i owns rows [off[i], off[i+1]) — so run_matmul_tiles cuts one
// job out of them: one pool dispatch and one join instead of one per matrix, and the decode
// regions run across the matrix boundaries (each part is a K sharing the caller's prepared
// activations, with its own weights, row count and output). A tile that would straddle two parts
// runs row by row.
template <class K, int kMaxParts = 4>
struct MultiKernel {
  static constexpr int kRows1 = K::kRows1;
  static constexpr int kRowsN = K::kRowsN;
  static constexpr int kRows1Zen = zen_rows1<K>();
  static constexpr int kRows1Zen4 = zen4_rows1<K>();
  K part[kMaxParts];
  int64_t off[kMaxParts + 1] = {};
  int count = 0;

  uint64_t row_bytes = 0;  // the longest part's, where K has rows in bytes (rows1's long-row rule)

  void add(const K& k, int64_t rows) {
    if constexpr (requires { k.row_bytes; }) row_bytes = std::max<uint64_t>(row_bytes, k.row_bytes);
    part[count] = k;
    off[count + 1] = off[count] + rows;
    ++count;
  }
  int64_t rows() const { return off[count]; }

  template <int R, int T>
  void tile(int64_t r0, int64_t t0) const {
    int i = 0;
    while (r0 >= off[i + 1]) ++i;
    if (r0 + R <= off[i + 1]) {
      run_tile<R, T>(part[i], r0 - off[i], t0);
      return;
    }
    for (int r = 0; r < R; ++r) {
      while (r0 + r >= off[i + 1]) ++i;
      run_tile<1, T>(part[i], r0 + r - off[i], t0);
    }
  }
};

// Fused decode (kernels::matmul_multi) of weights in one format: `first` is weight 0's kernel,
// holding the activations it prepared, and every weight runs a copy of it with its own rows and
// output as one job (K: members w, row_bytes, rows, y; and scales, biases for MLX affine).
template <class K>
inline void run_multi_decode(const K& first, const WeightView* ws, float* const* ys, int count, int64_t n,
                             int64_t act_bytes_per_token) {
  MultiKernel<K> mk;
  for (int i = 0; i < count; ++i) {
    K k = first;
    k.w = ws[i].data;
    k.row_bytes = ws[i].row_bytes();
    if constexpr (requires { k.scales; }) {
      k.scales = ws[i].scales;
      k.biases = ws[i].biases;
    }
    k.rows = ws[i].rows;
    k.y = ys[i];
    mk.add(k, ws[i].rows);
  }
  run_matmul_tiles(mk, mk.rows(), n, act_bytes_per_token);
}

// Decode kernels that read x quantized per super-block as it is (act_quant.h QuantizedActsK, no
// permutation): K is the aggregate {w, row_bytes, rows, nsb, acts, y}. One weight, or (matmul_multi)
// a group sharing one quantization.
template <class K>
K super_decode_kernel(const WeightView& w, const float* x, int64_t n, float* y) {
  return K{w.data, w.row_bytes(), w.rows, w.cols / 256, quantize_acts_k_scratch(x, n, w.cols), y};
}
template <class K>
void super_decode(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  run_matmul_tiles(super_decode_kernel<K>(w, x, n, y), w.rows, n, w.cols);
}
template <class K>
void super_decode_multi(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  run_multi_decode(super_decode_kernel<K>(ws[0], x, n, ys[0]), ws, ys, count, n, ws[0].cols);
}
// kernels::matmul_multi for such a format whose prefill (n >= 8) runs one kMatmul per weight.
template <class K, void (*kMatmul)(const WeightView&, const float*, int64_t, float*)>
void super_matmul_multi(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n < 8) return super_decode_multi<K>(ws, ys, count, x, n);
  for (int i = 0; i < count; ++i) kMatmul(ws[i], x, n, ys[i]);
}

// K-sliced token-lane GEMMs (as the AVX-512 gemm16). A kernel supplies
//   struct Tile;                                            // pointers into one tile's unpacked rows
//   int64_t slice_align() const;                            // slices cut at multiples of this many blocks
//   size_t tile_bytes(int R) const;                         // one R-row tile's unpacked rows
//   template <int R> Tile unpack(int64_t r0, uint8_t* buf) const;   // buf: tile_bytes(R), 64-aligned
//   template <int R, bool kFirst, bool kLast>
//   void tile(const Tile&, int64_t r0, int64_t g, int64_t b0, int64_t b1, float* part) const;
// tile: rows r0..r0+R × token group g over the 32-blocks [b0, b1), its R×8 sums begun and ended
// by gemm_sums_start/gemm_sums_finish. Chunks are up to 16 rows × a run of token groups; a chunk
// unpacks its rows once, whole, then walks K in slices: per slice every tile runs over every
// group, so the slice of the chunk's activations (≤ kGemmActBudget) stays in L2 across the tiles
// and a tile's unpacked slice stays in L1 across the groups. Where a whole row of activations
// for 16 groups fits the budget (K ≤ 2048) there is one slice of 16 groups, as before slicing
// (measured faster there than 64 groups in 4 slices). At K = 8192 a chunk held 4 groups (32
// tokens), so every row was unpacked 16 times for a 512-token prompt; in slices of 16 blocks ×
// 64 groups, once. The partial sums pass through f32 memory between slices and are summed in the
// same block order as one pass: the result is bit-identical to it. Every AVX2 token-lane GEMM
// runs here. Before, each chunk held whole-K activations for as many groups as fit (4 at
// K = 8192); kernel_bench n = 512, 2 threads, alternating rounds, ms, the K = 8192 shape
// (2048x8192): Q5_K 46.1–50.1 → 31.3–33.7, Q3_K 52.6–53.0 → 37.6–40.1, Q6_K 57 → 38–40, Q4_0
// 31.8–33.8 → 28.3–28.7, Q8_0 56.0–56.5 → 46.2–47.1, Q4_K 32.2–34.6 → 29.9–30.1; K = 2048 level
// (once gemm_sums_start/finish unrolled their loops: before, the tiles' sums were also kept on
// the stack and stored at every block, which cost the K = 2048 shapes 3–6 % in session 26).
constexpr int64_t kGemmActBudget = 256 * 1024;   // Zen 3: half of its 512 KiB L2
constexpr int64_t kGemmCodesBudget = 128 * 1024;  // a chunk's unpacked rows, beside the slice
constexpr int64_t kGemmWholeGroups = 16;          // groups of whole-K activations worth one slice
constexpr int64_t kGemmMaxGroups = 64;            // 512 tokens: a pp512 unpacks every row once

// A sliced tile's R×8 sums: zero for the first slice, else where the previous one left them.
template <int R, bool kFirst>
__attribute__((always_inline)) inline void gemm_sums_start(__m256 (&acc)[R], const float* part) {
  LARDER_UNROLL  // unrolled before GCC decides whether acc can live in registers (else it is kept on the stack)
  for (int r = 0; r < R; ++r) acc[r] = kFirst ? _mm256_setzero_ps() : _mm256_loadu_ps(part + 8 * r);
}

// After a slice: back to part, or after the last one to y (token t of group g, row r0 + r).
template <int R, bool kLast>
__attribute__((always_inline)) inline void gemm_sums_finish(const __m256 (&acc)[R], float* part, float* y, int64_t rows,
                                                            int64_t n, int64_t r0, int64_t g) {
  if constexpr (!kLast) {
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(part + 8 * r, acc[r]);
    return;
  }
  const int64_t t0 = 8 * g, nt = std::min<int64_t>(8, n - t0);
  LARDER_UNROLL
  for (int r = 0; r < R; ++r) {
    alignas(32) float out[8];
    _mm256_store_ps(out, acc[r]);
    for (int64_t t = 0; t < nt; ++t) y[(t0 + t) * rows + r0 + r] = out[t];
  }
}

// One sliced tile call, out of line: inlined into the chunk loop, GCC spilled the tiles' int16
// chains to the stack at every block's end (a Q4_0 GEMM in this form, 8192x2048, 1 thread: 15 %
// slower).
template <int R, bool kFirst, bool kLast, class G>
[[gnu::noinline]] void gemm_slice_tile(const G& k, const typename G::Tile& tl, int64_t r, int64_t g, int64_t b0,
                                       int64_t b1, float* part) {
  k.template tile<R, kFirst, kLast>(tl, r, g, b0, b1, part);
}

// One tile's rows over whole K: unpacked, then run over groups [g0, g1). A function of its own
// (not inlined into the chunk loop) for the same reason.
template <int R, class G>
[[gnu::noinline]] void gemm_whole_tile(const G& k, int64_t r, int64_t g0, int64_t g1, int64_t nb, uint8_t* buf) {
  const typename G::Tile tl = k.template unpack<R>(r, buf);
  for (int64_t g = g0; g < g1; ++g) k.template tile<R, true, true>(tl, r, g, 0, nb, nullptr);
}

template <class G>
inline void run_gemm_sliced(const G& k, int64_t rows, int64_t groups, int64_t nb) {
  const int64_t align = k.slice_align();
  const int64_t whole = kGemmActBudget / (nb * 256);
  const bool sliced = whole < std::min(groups, kGemmWholeGroups);
  const int64_t gb = sliced ? std::min(groups, kGemmMaxGroups) : std::min(groups, whole);
  const int64_t kc = sliced ? std::clamp<int64_t>(kGemmActBudget / (gb * 256) / align * align, align, nb) : nb;
  const int64_t n_gb = (groups + gb - 1) / gb;
  const int64_t tile4 = static_cast<int64_t>(k.tile_bytes(4));
  const int64_t rb = std::clamp<int64_t>(kGemmCodesBudget / std::max<int64_t>(tile4 / 4, 1) / 4 * 4, 4, 16);
  const int64_t n_rb = (rows + rb - 1) / rb;
  default_pool().parallel_for(n_rb * n_gb, [&](int64_t c, int) {
    const int64_t ib = c % n_rb, ig = c / n_rb;
    const int64_t r0 = ib * rb, r1 = std::min(rows, r0 + rb), nr = r1 - r0;
    const int64_t g0 = ig * gb, g1 = std::min(groups, g0 + gb);
    const int64_t n_tiles = (nr + 3) / 4;
    // Tiles of 4 rows, then one of the remaining 1-3.
    auto each_tile = [&](auto&& fn) {
      int64_t i = 0, r = r0;
      for (; r + 4 <= r1; r += 4, ++i) fn.template operator()<4>(i, r);
      switch (r1 - r) {
        case 3: fn.template operator()<3>(i, r); break;
        case 2: fn.template operator()<2>(i, r); break;
        case 1: fn.template operator()<1>(i, r); break;
        default: break;
      }
    };
    if (!sliced) {  // one tile's rows at a time, unpacked and run over every group of the chunk
      auto* buf = static_cast<uint8_t*>(thread_scratch(static_cast<size_t>(tile4), 4));
      each_tile([&]<int R>(int64_t, int64_t r) { gemm_whole_tile<R>(k, r, g0, g1, nb, buf); });
      return;
    }
    const size_t part_bytes = static_cast<size_t>((g1 - g0) * nr * 8) * sizeof(float);
    auto* buf = static_cast<uint8_t*>(thread_scratch(static_cast<size_t>(n_tiles * tile4) + part_bytes, 4));
    auto* part = reinterpret_cast<float*>(buf + n_tiles * tile4);
    typename G::Tile tl[16 / 4];
    each_tile([&]<int R>(int64_t i, int64_t r) { tl[i] = k.template unpack<R>(r, buf + i * tile4); });
    for (int64_t b0 = 0; b0 < nb; b0 += kc) {
      const int64_t b1 = std::min(nb, b0 + kc);
      each_tile([&]<int R>(int64_t i, int64_t r) {
        for (int64_t g = g0; g < g1; ++g) {
          float* p = part + ((g - g0) * nr + (r - r0)) * 8;
          if (b0 == 0) gemm_slice_tile<R, true, false>(k, tl[i], r, g, b0, b1, p);
          else if (b1 < nb) gemm_slice_tile<R, false, false>(k, tl[i], r, g, b0, b1, p);
          else gemm_slice_tile<R, false, true>(k, tl[i], r, g, b0, b1, p);
        }
      });
    }
  });
}

}  // namespace larder::kernels::cpu
