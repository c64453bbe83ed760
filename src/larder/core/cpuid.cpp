#include "larder/core/cpuid.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>

namespace larder {
namespace {

// Physical cores = distinct (physical id, core id) pairs in /proc/cpuinfo. Hyperthreads share
// one core's FMA units, so the default thread count is cores, not logical CPUs.
int count_physical_cores() {
  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<int, int>> cores;
  int phys = 0, core = -1;
  std::string line;
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    int value = std::atoi(line.c_str() + colon + 1);
    if (key == "physical id") phys = value;
    if (key == "core id") {
      core = value;
      cores.insert({phys, core});
    }
  }
  int n = static_cast<int>(cores.size());
  if (n <= 0) n = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  return n > 0 ? n : 1;
}

// AMX-TILE and AMX-INT8 (cpuid leaf 7 EDX bits 24, 25; *bf16 = bit 22, AMX-BF16), the tile state enabled by the OS (XCR0
// bits 17 TILECFG, 18 TILEDATA), and this process's permission to use the tile data, asked for
// once here (Linux ≥ 5.16: ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; the grant is per process
// and covers every thread, the pool's included).
bool amx_usable(bool* bf16) {
  unsigned a, b, c, d;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
  if (a < 7) return false;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  if (!((d >> 24) & 1u) || !((d >> 25) & 1u)) return false;
  *bf16 = (d >> 22) & 1u;  // AMX-BF16
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
  if (!((c >> 27) & 1u)) return false;  // OSXSAVE: xgetbv is available
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if (((lo >> 17) & 3u) != 3u) return false;
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return ::syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

CpuFeatures detect() {
  CpuFeatures f;
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.f16c = true;  // no __builtin for f16c in GCC 12; checked via cpuid leaf 1 below
  unsigned a, b, c, d;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
  f.f16c = (c >> 29) & 1u;
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
  // leaf 7 sub-leaf 1: EAX bit 5 = AVX512_BF16, bit 4 = AVX-VNNI
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
  f.avx512bf16 = (a >> 5) & 1u;
  f.avx_vnni = (a >> 4) & 1u;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
  f.amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "Auth" "enti" "cAMD"
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
  const int base_family = static_cast<int>((a >> 8) & 0xfu);
  f.family = base_family == 0xf ? base_family + static_cast<int>((a >> 20) & 0xffu) : base_family;
  f.logical_cpus = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  f.physical_cores = count_physical_cores();
  const char* force = std::getenv("LARDER_ISA");
  if (force && std::strcmp(force, "avx2") == 0) {
    f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512vnni = f.avx512bf16 = false;
  }
  const char* amx_env = std::getenv("LARDER_AMX");
  if (f.avx512f && !(amx_env && std::strcmp(amx_env, "0") == 0)) {
    bool bf16 = false;
    f.amx = amx_usable(&bf16);
    f.amx_bf16 = f.amx && bf16;
  }
  // Zen 4 (family 19h) and Zen 5 (1Ah). Zen 3 is family 19h too, without AVX-512 (and without
  // the AVX-512 kernels the choice is for).
  f.zen_decode_tiles = f.amd && (f.family == 0x19 || f.family == 0x1a) && f.avx512f;
  const char* tiles_env = std::getenv("LARDER_DECODE_TILES");
  const std::string tiles = tiles_env ? tiles_env : "";
  if (tiles == "generic") f.zen_decode_tiles = false;
  if (tiles == "zen" || tiles == "zen4" || tiles == "zen5") f.zen_decode_tiles = true;
  // The generation: forced, else this CPU's (a zen set forced on another CPU takes Zen 5's).
  f.zen_generation = !f.zen_decode_tiles            ? 0
                     : tiles == "zen4"              ? 4
                     : tiles == "zen5"              ? 5
                     : f.amd && f.family == 0x19    ? 4
                                                    : 5;
  f.decode_prefetch_l1 = ::sysconf(_SC_LEVEL1_DCACHE_SIZE) >= 48 * 1024;
  if (const char* p = std::getenv("LARDER_DECODE_PREFETCH")) {
    if (std::strcmp(p, "l1") == 0) f.decode_prefetch_l1 = true;
    if (std::strcmp(p, "l2") == 0) f.decode_prefetch_l1 = false;
  }
  return f;
}

}  // namespace

std::string CpuFeatures::describe() const {
  std::ostringstream s;
  s << (avx2 ? "avx2 " : "") << (fma ? "fma " : "") << (f16c ? "f16c " : "")
    << (avx512f ? "avx512f " : "") << (avx512bw ? "avx512bw " : "") << (avx512vl ? "avx512vl " : "")
    << (avx512vnni ? "avx512vnni " : "") << (avx512bf16 ? "avx512bf16 " : "")
    << (avx_vnni ? "avx-vnni " : "") << (amx ? "amx-int8 " : "") << (amx_bf16 ? "amx-bf16 " : "") << "cores=" << physical_cores << " cpus=" << logical_cpus
    << " decode-tiles=" << decode_tiles() << " prefetch=" << (decode_prefetch_l1 ? "l1" : "l2");
  return s.str();
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

}  // namespace larder
