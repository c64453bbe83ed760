// cpuid.h — CPU features detected once at startup; kernels/cpu/dispatch picks a tier from them.
#pragma once

#include <string>

namespace larder {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool avx_vnni = false;
  // AMX-TILE + AMX-INT8 usable by this process: the CPU has them, the OS enables the tile state
  // (XCR0 bits 17, 18) and granted it to this process (arch_prctl ARCH_REQ_XCOMP_PERM; Linux
  // disables the 8 KiB tile data per process until asked, and a tile instruction without the
  // grant is SIGILL). The prefill GEMM then computes its block dot products on AMX
  // (gemm16_avx512.h). LARDER_AMX=0 turns it off (A/B runs); LARDER_ISA=avx2 hides it too.
  bool amx = false;
  bool amx_bf16 = false;  // also AMX-BF16 (the BF16 GEMM's TDPBF16PS)
  int physical_cores = 1;
  int logical_cpus = 1;
  bool amd = false;
  int family = 0;  // cpuid leaf 1, extended family folded in

  // Decode tiles measured per microarchitecture (kernels/cpu/common/matmul_driver.h: rows1).
  // Zen 4 and Zen 5 (AMD family 19h/1Ah with AVX-512) stream several decode kernels' weights
  // faster with fewer interleaved rows per tile (the "zen" tile set) than with the generic row
  // counts, which stay on Intel (Emerald Rapids: 93–103 % of the read probe with them).
  // LARDER_DECODE_TILES=zen|generic forces either choice (tests run both on any CPU; zen4 and
  // zen5 also pick the generation below).
  bool zen_decode_tiles = false;
  // With zen_decode_tiles: 4 (Zen 4, family 19h) or 5 (Zen 5, 1Ah). The two share the tile set
  // except where a kernel measured otherwise on one of them (matmul_driver.h rows1, kRows1Zen4).
  // LARDER_DECODE_TILES=zen4|zen5 forces the zen set as measured on that generation.
  int zen_generation = 0;
  // Whether decode tiles prefetch into L1 rather than L2: an L1D of >= 48 KiB (sysconf;
  // kernels/cpu/common/simd_avx2.h prefetch_rows). LARDER_DECODE_PREFETCH=l1|l2 overrides.
  bool decode_prefetch_l1 = false;

  // The whole AVX-512 tier larder compiles (F, BW, VL, DQ, VNNI, BF16).
  bool has_avx512_tier() const {
    return avx512f && avx512bw && avx512vl && avx512dq && avx512vnni && avx512bf16;
  }
  std::string describe() const;
  // What the kernels chose from these features, for logs and bench output.
  std::string decode_tiles() const {
    return zen_decode_tiles ? (zen_generation == 4 ? "zen4" : "zen5") : "generic";
  }
};

// Detected once (thread-safe); LARDER_ISA=avx2 forces the AVX2 tier for testing.
const CpuFeatures& cpu_features();

}  // namespace larder
