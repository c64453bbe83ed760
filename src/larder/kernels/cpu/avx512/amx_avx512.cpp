// amx_avx512.cpp — the AMX state of the prefill GEMM (gemm16_avx512.h): whether it is used, and
// the tile configurations each thread loads before its tile instructions.
//
// Tile state is per thread (TILECFG is part of the XSAVE state the kernel switches with the
// thread), so every pool thread that runs a GEMM chunk loads the configuration once; the
// process-wide permission for the tile data was asked for in cpu_features() (core/cpuid.cpp).
// The configuration is a static object, not a stack temporary, so the compiler cannot drop or
// reorder the stores that build it before ldtilecfg reads it.
#include <immintrin.h>

#include <atomic>
#include <cstdint>

#include "larder/core/cpuid.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"

namespace larder::kernels::cpu::avx512 {
namespace {

// ldtilecfg's 64-byte operand (palette 1: up to 8 tiles of ≤ 16 rows × ≤ 64 bytes).
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];  // bytes per row of tile i
  uint8_t rows[16];    // rows of tile i
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

// The tiles of gemm16_avx512.h's AMX path (see the table there) and of Bf16Amx
// (matmul_avx512.cpp, every tile 16 rows × 64 bytes).
constexpr TileConfig make_config(AmxTiles mode) {
  TileConfig c{};
  c.palette_id = 1;
  auto set = [&c](int t, int rows, int colsb) {
    c.rows[t] = static_cast<uint8_t>(rows);
    c.colsb[t] = static_cast<uint16_t>(colsb);
  };
  const bool bf16 = mode == AmxTiles::kBf16;
  for (int t : {0, 3, 6, 7}) set(t, 16, 64);  // C: 16 rows × 16 int32 / f32
  for (int t : {1, 4}) set(t, 16, bf16 ? 64 : 32);  // A: 16 weight rows (one 32-element block)
  for (int t : {2, 5}) set(t, bf16 ? 16 : 8, 64);   // B: 16 tokens × 4 bytes per 4 (int8) or 2 (bf16) elements
  return c;
}
const TileConfig kConfigs[2] = {make_config(AmxTiles::kBlocks), make_config(AmxTiles::kBf16)};

std::atomic<int> g_override{-1};  // -1: cpu_features().amx; 0 / 1: set_gemm_amx

}  // namespace

bool gemm_uses_amx() {
  const int o = g_override.load(std::memory_order_relaxed);
  return o < 0 ? cpu_features().amx : o == 1;
}

bool bf16_gemm_uses_amx() { return gemm_uses_amx() && cpu_features().amx_bf16; }

void set_gemm_amx(bool on) { g_override.store(on && cpu_features().amx ? 1 : 0, std::memory_order_relaxed); }

void amx_configure_thread(AmxTiles tiles) {
  thread_local int loaded = -1;
  const int i = static_cast<int>(tiles);
  if (loaded == i) return;
  _tile_loadconfig(&kConfigs[i]);
  loaded = i;
}

}  // namespace larder::kernels::cpu::avx512
