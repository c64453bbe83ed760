// register.cpp — puts the fast tiers into a KernelTable. Compiled with the baseline (AVX2) flags:
// it may reference the AVX-512 functions but calls nothing from that tier itself.
#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "larder/core/cpuid.h"
#include "larder/core/dtype.h"
#include "larder/core/log.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/probe_weights.h"
#include "larder/kernels/gguf_blocks.h"
#include "larder/kernels/microscaling.h"

namespace larder::kernels::cpu {

namespace {
void set(KernelTable& t, DType d, MatmulFn f) {
  if (f) t.matmul[static_cast<int>(d)] = f;
}
constexpr DType kFormats[] = {DType::kQ8_0, DType::kQ4_0,  DType::kQ4_1,   DType::kQ5_0, DType::kQ5_1,
                              DType::kIQ4_NL, DType::kQ2_K, DType::kQ3_K,   DType::kQ4_K, DType::kQ5_K,
                              DType::kQ6_K, DType::kIQ4_XS, DType::kBF16, DType::kF16,    DType::kF32,
                              DType::kMXFP4, DType::kMlxMXFP4, DType::kMlxNVFP4, DType::kMlxMXFP8};

bool is_int8_act(DType d) { return dtype_is_block(d); }

// Where a block keeps its f16 scale fields (everything else is codes and packed integer scales,
// for which any byte is valid).
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

}  // namespace

std::vector<uint8_t> self_check_weights(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  uint32_t s = seed;
  auto next = [&s]() {
    s = s * 1664525u + 1013904223u;
    return s >> 8;
  };
  const uint64_t bytes = dtype_bytes(dtype, static_cast<uint64_t>(rows * cols));
  std::vector<uint8_t> w(bytes);
  if (dtype == DType::kBF16) {
    for (uint64_t i = 0; i + 1 < bytes; i += 2) {
      uint16_t h = f32_to_bf16((static_cast<float>(next() % 2001) - 1000.f) / 1000.f);
      std::memcpy(&w[i], &h, 2);
    }
    return w;
  }
  const DTypeInfo& di = dtype_info(dtype);
  const std::vector<uint32_t> f16_at = f16_fields(dtype);
  for (uint64_t b = 0; b < bytes; b += di.block_bytes) {
    for (uint32_t k = 0; k < di.block_bytes; ++k) w[b + k] = static_cast<uint8_t>(next());
    if (dtype == DType::kMXFP4) {  // e8m0 scale 2^-10 .. 2^-3
      w[b] = static_cast<uint8_t>(118 + next() % 8);
      continue;
    }
    if (dtype == DType::kMlxMXFP8 && (w[b] & 0x7f) == 0x7f) w[b] ^= 1;  // no NaN codes (mlx writes none)
    if (is_mlx_microscaling(dtype)) continue;
    for (uint32_t off : f16_at) {
      uint16_t d = f32_to_f16(0.005f + static_cast<float>(next() % 100) / 10000.f);
      std::memcpy(&w[b + off], &d, 2);
    }
  }
  return w;
}

ProbeWeights probe_weights(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  ProbeWeights p;
  p.data = self_check_weights(dtype, rows, cols, seed);
  p.view.dtype = dtype;
  p.view.rows = rows;
  p.view.cols = cols;
  p.view.data = p.data.data();
  if (const int g = mlx_microscaling_group(dtype)) {
    p.scales.resize(static_cast<size_t>(rows * (cols / g)));
    uint32_t s = seed ^ 0x9e3779b9u;
    for (auto& b : p.scales) {
      s = s * 1664525u + 1013904223u;
      const uint32_t r = s >> 24;
      // e8m0 2^-10 .. 2^-3; nvfp4's e4m3 scales 2^-4 .. ~2^-1 (0x18..0x37)
      b = static_cast<uint8_t>(dtype == DType::kMlxNVFP4 ? 0x18 + r % 32 : 117 + r % 8);
    }
    p.view.scales = p.scales.data();
    p.view.scale_dtype = DType::kU8;
    p.view.group_size = g;
  }
  return p;
}

AffineProbe affine_probe_weights(int bits, int64_t rows, int64_t cols, int64_t gs, DType sdt) {
  AffineProbe w;
  w.rows = rows;
  w.cols = cols;
  w.bits = bits;
  w.group_size = static_cast<int>(gs);
  w.scale_dtype = sdt;
  w.codes.resize(static_cast<size_t>(rows * cols * bits / 8));
  uint32_t state = 777u + static_cast<uint32_t>(bits) + static_cast<uint32_t>(gs);
  for (auto& c : w.codes) {
    state = state * 1664525u + 1013904223u;
    c = static_cast<uint8_t>(state >> 24);
  }
  const int64_t ng = cols / gs;
  const size_t esz = sdt == DType::kF32 ? 4 : 2;
  w.scales.resize(static_cast<size_t>(rows * ng) * esz);
  w.biases.resize(w.scales.size());
  auto put = [&](uint8_t* p, float f) {
    if (sdt == DType::kF32) {
      std::memcpy(p, &f, 4);
    } else {
      const uint16_t h = sdt == DType::kF16 ? f32_to_f16(f) : f32_to_bf16(f);
      std::memcpy(p, &h, 2);
    }
  };
  for (size_t i = 0; i < static_cast<size_t>(rows * ng); ++i) {
    const float s = 0.005f + 0.001f * static_cast<float>(i % 11);
    put(&w.scales[i * esz], s);
    put(&w.biases[i * esz], -s * static_cast<float>(1 << (bits - 1)) + 0.002f * static_cast<float>(i % 5));
  }
  return w;
}

WeightView AffineProbe::view() const {
  WeightView v;
  v.dtype = DType::kU32;
  v.rows = rows;
  v.cols = cols;
  v.bits = bits;
  v.group_size = group_size;
  v.scale_dtype = scale_dtype;
  v.data = codes.data();
  v.scales = scales.data();
  v.biases = biases.data();
  return v;
}

namespace {
// The AVX-512 tier cannot be exercised by CI on machines without it, so before the tier serves
// anything, each of its matmuls must agree with the (tested) AVX2 kernel on a small problem with
// ragged sizes. The AVX-512 BF16 path rounds activations to bf16 (relative error 2^-9 per
// element), so honest differences stay near 2^-8 of the output scale; the check allows 2^-6.
// A lane or layout bug is off by the order of the output itself. On disagreement the AVX2
// kernel stays for that format and a warning says so: a wrong fast path must never serve garbage.
bool agree_at(const WeightView& v, MatmulFn fast, MatmulFn trusted, int64_t n) {
  const int64_t rows = v.rows, cols = v.cols;
  std::vector<float> x(static_cast<size_t>(n * cols)), y_fast(static_cast<size_t>(n * rows)), y_trusted(y_fast.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(n));
  fast(v, x.data(), n, y_fast.data());
  trusted(v, x.data(), n, y_trusted.data());
  double scale = 1e-3;
  for (float y : y_trusted) scale = std::max(scale, std::fabs(static_cast<double>(y)));
  for (size_t i = 0; i < y_fast.size(); ++i) {
    if (!(std::fabs(static_cast<double>(y_fast[i]) - y_trusted[i]) <= scale / 64)) return false;
  }
  return true;
}

bool agree_on(const WeightView& v, MatmulFn fast, MatmulFn trusted) {
  // Token counts: single-token and 2/3/4-token decode tiles, the 8-token GEMM switch-over, one
  // and two 16-token GEMM groups with ragged tails.
  for (int64_t n : {1, 2, 3, 4, 6, 9, 17, 33})
    if (!agree_at(v, fast, trusted, n)) return false;
  // The AMX prefill paths (from 64 tokens and 32 rows; 37 rows × 70 tokens = a 32-row chunk, two
  // group pairs and a lone group). CI cannot run them either, so they are checked the same way;
  // a disagreement turns AMX off for the process and keeps the AVX-512 kernels.
  if (!avx512::gemm_uses_amx() || agree_at(v, fast, trusted, 70)) return true;
  LARDER_LOG_WARN("[kernels] the AMX prefill path disagrees with the AVX2 kernel on %s weights: AMX is off",
                  dtype_info(v.dtype).name);
  avx512::set_gemm_amx(false);
  return agree_at(v, fast, trusted, 70);  // the same size on the vpdpbusd path
}

bool agrees_impl(DType dtype, MatmulFn fast, MatmulFn trusted) {
  // Ragged rows; columns a few blocks of the format (10 blocks of 32, or 2 super-blocks of 256;
  // 11 blocks for the unpacker-driven 32-element formats: an odd block count per row).
  const bool odd = dtype == DType::kQ4_1 || dtype == DType::kQ5_0 || dtype == DType::kQ5_1 || dtype == DType::kIQ4_NL;
  const int64_t rows = 37, cols = dtype_info(dtype).block_elems == 256 ? 512 : odd ? 352 : 320;
  const ProbeWeights w = probe_weights(dtype, rows, cols, 12345u + static_cast<uint32_t>(dtype));
  return agree_on(w.view, fast, trusted);
}

// MLX affine, in each scale dtype and group size the kernels branch on.
bool affine_agrees_one(int bits, int64_t gs, DType sdt, MatmulFn fast, MatmulFn trusted) {
  const AffineProbe w = affine_probe_weights(bits, 37, 384, gs, sdt);
  return agree_on(w.view(), fast, trusted);
}

bool affine_agrees_impl(int bits, MatmulFn fast, MatmulFn trusted) {
  const struct {
    int64_t gs;
    DType sdt;
  } variants[] = {{64, DType::kBF16}, {128, DType::kF16}, {32, DType::kF32}};
  for (const auto& vr : variants) {
    if (!affine_agrees_one(bits, vr.gs, vr.sdt, fast, trusted)) return false;
  }
  return true;
}
}  // namespace

bool fast_matmul_agrees(DType dtype, MatmulFn fast, MatmulFn trusted) { return agrees_impl(dtype, fast, trusted); }
bool fast_matmul_affine_agrees(int bits, MatmulFn fast, MatmulFn trusted) {
  return affine_agrees_impl(bits, fast, trusted);
}

namespace {
std::atomic<int> g_batch_invariant{-1};  // -1: not read from the environment yet
}  // namespace

bool batch_invariant_decode() {
  int v = g_batch_invariant.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("LARDER_BATCH_INVARIANT");
    v = e && std::strcmp(e, "1") == 0 ? 1 : 0;
    g_batch_invariant.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

void set_batch_invariant_decode(bool on) { g_batch_invariant.store(on ? 1 : 0, std::memory_order_relaxed); }

MatmulFn fast_matmul(const char* tier, DType dtype) {
  if (std::strcmp(tier, "avx2") == 0) {
    switch (dtype) {
      case DType::kQ8_0: return avx2::matmul_q8_0;
      case DType::kQ4_0: return avx2::matmul_q4_0;
      case DType::kQ4_K: return avx2::matmul_q4_k;
      case DType::kQ6_K: return avx2::matmul_q6_k;
      case DType::kQ4_1: return avx2::matmul_q4_1;
      case DType::kQ5_0: return avx2::matmul_q5_0;
      case DType::kQ5_1: return avx2::matmul_q5_1;
      case DType::kIQ4_NL: return avx2::matmul_iq4_nl;
      case DType::kQ2_K: return avx2::matmul_q2_k;
      case DType::kQ3_K: return avx2::matmul_q3_k;
      case DType::kQ5_K: return avx2::matmul_q5_k;
      case DType::kIQ4_XS: return avx2::matmul_iq4_xs;
      case DType::kBF16: return avx2::matmul_bf16;
      case DType::kF16: return avx2::matmul_f16;
      case DType::kF32: return avx2::matmul_f32;
      case DType::kMXFP4: return avx2::matmul_mxfp4;
      case DType::kMlxMXFP4: return avx2::matmul_mlx_mxfp4;
      case DType::kMlxNVFP4: return avx2::matmul_mlx_nvfp4;
      case DType::kMlxMXFP8: return avx2::matmul_mlx_mxfp8;
      default: return nullptr;
    }
  }
  if (std::strcmp(tier, "avx512") == 0) {
    switch (dtype) {
      case DType::kQ8_0: return avx512::matmul_q8_0;
      case DType::kQ4_0: return avx512::matmul_q4_0;
      case DType::kQ4_K: return avx512::matmul_q4_k;
      case DType::kQ6_K: return avx512::matmul_q6_k;
      case DType::kQ4_1: return avx512::matmul_q4_1;
      case DType::kQ5_0: return avx512::matmul_q5_0;
      case DType::kQ5_1: return avx512::matmul_q5_1;
      case DType::kIQ4_NL: return avx512::matmul_iq4_nl;
      case DType::kQ2_K: return avx512::matmul_q2_k;
      case DType::kQ3_K: return avx512::matmul_q3_k;
      case DType::kQ5_K: return avx512::matmul_q5_k;
      case DType::kIQ4_XS: return avx512::matmul_iq4_xs;
      case DType::kBF16: return avx512::matmul_bf16;
      case DType::kF16: return avx512::matmul_f16;
      case DType::kMXFP4: return avx512::matmul_mxfp4;
      case DType::kMlxMXFP4: return avx512::matmul_mlx_mxfp4;
      case DType::kMlxNVFP4: return avx512::matmul_mlx_nvfp4;
      case DType::kMlxMXFP8: return avx2::matmul_mlx_mxfp8;  // no int8 form (matmul_mx_avx512.cpp)
      default: return nullptr;
    }
  }
  return nullptr;
}

MatmulMultiFn fast_matmul_multi(const char* tier, DType dtype) {
  if (std::strcmp(tier, "avx2") == 0) {
    switch (dtype) {
      case DType::kQ8_0: return avx2::matmul_multi_q8_0;
      case DType::kQ4_0: return avx2::matmul_multi_q4_0;
      case DType::kQ4_K: return avx2::matmul_multi_q4_k;
      case DType::kQ5_K: return avx2::matmul_multi_q5_k;
      case DType::kIQ4_XS: return avx2::matmul_multi_iq4_xs;
      case DType::kIQ4_NL: return avx2::matmul_multi_iq4_nl;
      case DType::kQ2_K: return avx2::matmul_multi_q2_k;
      case DType::kQ3_K: return avx2::matmul_multi_q3_k;
      default: return nullptr;
    }
  }
  if (std::strcmp(tier, "avx512") == 0) {
    switch (dtype) {
      case DType::kQ8_0: return avx512::matmul_multi_q8_0;
      case DType::kQ4_0: return avx512::matmul_multi_q4_0;
      case DType::kQ5_0: return avx512::matmul_multi_q5_0;
      case DType::kQ4_1: return avx512::matmul_multi_q4_1;
      case DType::kQ5_1: return avx512::matmul_multi_q5_1;
      case DType::kQ4_K: return avx512::matmul_multi_q4_k;
      case DType::kQ5_K: return avx512::matmul_multi_q5_k;
      case DType::kQ6_K: return avx512::matmul_multi_q6_k;
      case DType::kBF16: return avx512::matmul_multi_bf16;
      case DType::kF16: return avx512::matmul_multi_f16;
      case DType::kIQ4_NL: return avx512::matmul_multi_iq4_nl;
      case DType::kIQ4_XS: return avx512::matmul_multi_iq4_xs;
      case DType::kQ3_K: return avx512::matmul_multi_q3_k;
      case DType::kQ2_K: return avx512::matmul_multi_q2_k;
      case DType::kMXFP4: case DType::kMlxMXFP4: case DType::kMlxNVFP4: return avx512::matmul_multi_mx;
      default: return nullptr;
    }
  }
  return nullptr;
}

MatmulFn fast_matmul_affine(const char* tier, int bits) {
  const bool valid = bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
  if (valid && std::strcmp(tier, "avx2") == 0) return avx2::matmul_affine;
  if (valid && std::strcmp(tier, "avx512") == 0) return avx512::matmul_affine;
  return nullptr;
}

double active_int8_peak(ThreadPool& pool) {
  // The VNNI ceiling only when the integer kernels in use are the tier's (not after a failed
  // self-check or LARDER_QUANT_ACT=0); AMX's when the GEMM's block sums run there.
  if (active_table().matmul[static_cast<int>(DType::kQ4_0)] != avx512::matmul_q4_0) return 0.0;
  return avx512::gemm_uses_amx() ? avx512::amx_int8_peak(pool) : avx512::int8_dot_peak(pool);
}
double active_bf16_peak(ThreadPool& pool) {
  if (active_table().matmul[static_cast<int>(DType::kBF16)] != avx512::matmul_bf16) return 0.0;
  return avx512::bf16_gemm_uses_amx() ? avx512::amx_bf16_peak(pool) : avx512::bf16_dot_peak(pool);
}

void register_fast_kernels(KernelTable& t) {
  const CpuFeatures& f = cpu_features();
  if (!(f.avx2 && f.fma && f.f16c)) return;
  // LARDER_ISA=ref keeps the scalar reference everywhere (debugging a numerical difference).
  const char* isa = std::getenv("LARDER_ISA");
  if (isa && std::strcmp(isa, "ref") == 0) return;
  // The GGUF integer-format kernels quantize activations to int8 (like llama.cpp), so their results differ
  // from the exact-dequantization reference by ~1 % of Σ|w·x| (bound: tests/unit/kernels_fast;
  // model-level: tests/unit/models ArchParity runs both tables). LARDER_QUANT_ACT=0 keeps the
  // reference for those formats (debugging a numerical difference).
  const char* qa = std::getenv("LARDER_QUANT_ACT");
  const bool int8_act = !(qa && std::strcmp(qa, "0") == 0);
  for (DType d : kFormats) {
    if (!is_int8_act(d) || int8_act) {
      set(t, d, fast_matmul("avx2", d));
      t.matmul_multi[static_cast<int>(d)] = fast_matmul_multi("avx2", d);
    }
  }
  // MLX affine: int8 activations too (same opt-out).
  if (int8_act) {
    for (int bits : {2, 3, 4, 5, 6, 8}) {
      t.matmul_affine[bits] = fast_matmul_affine("avx2", bits);
      t.matmul_multi_affine[bits] = avx2::matmul_multi_affine;
    }
  }
  t.attention = avx2::attention;
  t.rmsnorm = avx2::rmsnorm;
  t.rope = avx2::rope;
  t.silu_mul = avx2::silu_mul;
  t.gelu_tanh_mul = avx2::gelu_tanh_mul;
  t.add = avx2::add;
  t.to_f16 = avx2::to_f16;
  t.argmax = avx2::argmax;
  t.sum_exp = avx2::sum_exp;
  t.select_at_least = avx2::select_at_least;
  t.causal_conv1d = avx2::causal_conv1d;  // (tests/unit/kernels_fast/gated_delta_fast_test.cpp)
  t.l2norm_heads = avx2::l2norm_heads;
  t.gated_delta_recurrent = avx2::gated_delta_recurrent;
  t.rmsnorm_gated = avx2::rmsnorm_gated;
  t.lora_delta = avx2::lora_delta;  // bit-equal to the reference (tests/unit/kernels_fast/lora_fast_test.cpp)
  t.name = "avx2";
  // Which tier decodes what (issue 14's machine matrix; bench/RESULTS.md "Decode vs llama.cpp on
  // Zen 4"). The choice is per format, not per CPU model: a format takes the AVX-512 kernel only
  // where the tier has one of its own and it was measured at least as fast as AVX2 on the CPU
  // where AVX-512 is weakest — Zen 4, which executes every zmm op as two 256-bit halves. There
  // (kernel_bench --hot, 1 thread, 8192x2048, n = 1, CPU µs, AVX2 → AVX-512): Q4_0 632 → 372
  // (Q4_0Quad), Q4_K 788 → 565, Q6_K 1735 → 869, Q8_0 135 → 123 (2048x2048); so no Zen 4
  // exception is needed, and Zen 5 (full-width zmm) only gains more. Q4_K and Q5_K decode as
  // integer super-block sums (decode_q4k_q5k_avx512.cpp; session 15, same bench, medians of 3
  // alternating runs, gate/up): Q4_K 516 → 344, Q5_K 1733 → 571; their AVX2 kernels of the same
  // design: Q4_K 530 → 475, Q5_K 1688 → 551 (so AVX-512 stays the faster tier). Q3_K and Q2_K
  // too (decode_q2k_q3k_q6k_avx512.cpp; medians of 3 alternating runs on a loaded host, gate/up |
  // down): Q3_K 1605 | 1689 → 570 | 565, Q2_K 2347 | 1898 → 393 | 372 (AVX2: Q3_K 1572, Q2_K
  // 1785; session 18 gave the AVX2 tier the same design, decode_q2k_q3k_avx2.cpp: hot, 1 thread,
  // Q2_K 426 vs AVX-512 325 µs, Q3_K 536 vs 453). Q6_K keeps its float-per-64 kernel for now: the super-block one (same file, 847 → 749
  // µs, noisy) flips a gemma-3-270m greedy choice that the exact model makes by 0.33 nats
  // (tests/goldens greedy_test; ffn_down's activations have outliers that a 256-wide activation
  // scale coarsens). Q4_1, Q5_0 and Q5_1 decode on AVX-512 (matmul_avx512.cpp LowBitQuad; session
  // 18, same bench): Q4_1 685 → 422, Q5_0 1049 → 501, Q5_1 938 → 597 (a zmm unpacker kernel had
  // measured slower than AVX2; the word-permute design of Q4_0Quad did not).
  // A CPU with the AVX2 tier only (Zen 3) runs the AVX2 column.
  // IQ4_NL and IQ4_XS decode on AVX-512 (decode_iq4_avx512.cpp; session 15, same bench on a loaded
  // host, medians of 3 alternating runs, gate/up / down): IQ4_NL 920 / 1002 → 424 / 450 µs (AVX2
  // ~1000 / ~1000), IQ4_XS 1143 / 1239 → 389 / 415 µs (AVX2 ~1080 / ~1240 before its own
  // super-block kernel, decode_iq4_avx2.cpp: 1626 / 1693 → 561 / 720 in a later run, still slower).
  if (f.has_avx512_tier()) {
    const KernelTable before = t;
    for (DType d : kFormats) {
      if (is_int8_act(d) && !int8_act) continue;
      MatmulFn fast = fast_matmul("avx512", d);
      if (!fast) continue;
      MatmulFn trusted = before.matmul[static_cast<int>(d)];
      if (trusted && fast_matmul_agrees(d, fast, trusted)) {
        set(t, d, fast);
        // The fused path runs the same tiles (tests/unit/kernels_fast check it against matmul);
        // a format whose tier kernel failed keeps the AVX2 fused path with its AVX2 matmul.
        if (MatmulMultiFn m = fast_matmul_multi("avx512", d)) t.matmul_multi[static_cast<int>(d)] = m;
      } else {
        LARDER_LOG_WARN("[kernels] AVX-512 %s matmul failed its startup self-check; using the AVX2 kernel",
                        dtype_name(d));
      }
    }
    if (int8_act) {
      for (int bits : {2, 3, 4, 5, 6, 8}) {
        MatmulFn fast = fast_matmul_affine("avx512", bits);
        if (fast && fast_matmul_affine_agrees(bits, fast, before.matmul_affine[bits])) {
          t.matmul_affine[bits] = fast;
          // The fused path runs the same tiles (tests/unit/kernels_fast/matmul_multi_test.cpp).
          t.matmul_multi_affine[bits] = avx512::matmul_multi_affine;
        } else {
          LARDER_LOG_WARN("[kernels] AVX-512 affine %d-bit matmul failed its startup self-check; using the AVX2 kernel",
                          bits);
        }
      }
    }
    t.gelu_tanh_mul = avx512::gelu_tanh_mul;  // tested against the reference (tests/unit/kernels_fast)
    t.argmax = avx512::argmax;                // (tests/unit/kernels_fast/logits_fast_test.cpp)
    t.sum_exp = avx512::sum_exp;
    t.attention = avx512::attention;  // (tests/unit/kernels_fast/attention_fast_test.cpp)
    t.causal_conv1d = avx512::causal_conv1d;  // (tests/unit/kernels_fast/gated_delta_fast_test.cpp)
    t.l2norm_heads = avx512::l2norm_heads;
    t.gated_delta_gates = avx512::gated_delta_gates;
    t.gated_delta_recurrent = avx512::gated_delta_recurrent;
    t.rmsnorm_gated = avx512::rmsnorm_gated;
    t.lora_delta = avx512::lora_delta;
    t.name = "avx512";
  }
}

}  // namespace larder::kernels::cpu
