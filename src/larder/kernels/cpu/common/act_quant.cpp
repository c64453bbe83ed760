#include "larder/kernels/cpu/common/act_quant.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "larder/core/dtype.h"
#include "larder/kernels/cpu/common/simd_avx2.h"

namespace larder::kernels::cpu {

namespace {
size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
}  // namespace

size_t quantized_acts_bytes(int64_t n, int64_t cols) {
  const size_t nb = static_cast<size_t>(cols / 32);
  const size_t n_pad = round_up(static_cast<size_t>(n), 8);
  // + 64: kernels may load 8 scales/sums starting at any 4-token group (reads past n_pad at the end).
  return round_up(static_cast<size_t>(n) * nb * 32, 64) + 2 * round_up(nb * n_pad * sizeof(float), 64) + 64;
}

QuantizedActs quantized_acts_view(void* scratch, int64_t n, int64_t cols) {
  QuantizedActs a;
  a.n = n;
  a.nb = cols / 32;
  a.n_pad = static_cast<int64_t>(round_up(static_cast<size_t>(n), 8));
  auto* base = static_cast<uint8_t*>(scratch);
  a.qs = reinterpret_cast<int8_t*>(base);
  a.d = reinterpret_cast<float*>(base + round_up(static_cast<size_t>(n * a.nb * 32), 64));
  a.bsum = a.d + round_up(static_cast<size_t>(a.nb * a.n_pad), 16);
  return a;
}

void quantize_acts_ref(const float* x, int64_t n, int64_t cols, bool offset128, QuantizedActs& out) {
  const int64_t nb = cols / 32;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + t * cols + b * 32;
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      int8_t* q = out.qs + (t * nb + b) * 32;
      int sum = 0;
      for (int j = 0; j < 32; ++j) {
        const int v = static_cast<int>(std::nearbyint(xb[j] * id));
        sum += v;
        q[j] = offset128 ? static_cast<int8_t>(static_cast<uint8_t>(v + 128)) : static_cast<int8_t>(v);
      }
      out.d[b * out.n_pad + t] = d;
      out.bsum[b * out.n_pad + t] = d * static_cast<float>(sum);
    }
  }
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t t = n; t < out.n_pad; ++t) out.d[b * out.n_pad + t] = out.bsum[b * out.n_pad + t] = 0.0f;
  }
}

size_t quantized_acts_k_bytes(int64_t n, int64_t cols) {
  const size_t nn = static_cast<size_t>(n), c = static_cast<size_t>(cols);
  return round_up(nn * c, 64) + round_up(nn * (c / 256) * sizeof(float), 64) +
         round_up(nn * (c / 16) * sizeof(int16_t), 64) + 64;
}

QuantizedActsK quantized_acts_k_view(void* scratch, int64_t n, int64_t cols) {
  QuantizedActsK a;
  a.n = n;
  a.nsb = cols / 256;
  const size_t nn = static_cast<size_t>(n), c = static_cast<size_t>(cols);
  auto* base = static_cast<uint8_t*>(scratch);
  a.qs = reinterpret_cast<int8_t*>(base);
  a.d = reinterpret_cast<float*>(base + round_up(nn * c, 64));
  a.bsum = reinterpret_cast<int16_t*>(base + round_up(nn * c, 64) + round_up(nn * (c / 256) * sizeof(float), 64));
  return a;
}

void quantize_acts_k_ref(const float* x, int64_t n, int64_t cols, QuantizedActsK& out) {
  const int64_t nsb = cols / 256;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const float* xb = x + t * cols + sb * 256;
      float amax = 0;
      for (int j = 0; j < 256; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      int8_t* q = out.qs + t * cols + sb * 256;
      int16_t* s16 = out.bsum + t * (cols / 16) + sb * 16;
      for (int g = 0; g < 16; ++g) {
        int sum = 0;
        for (int j = 16 * g; j < 16 * g + 16; ++j) {
          const int v = static_cast<int>(std::nearbyint(xb[j] * id));
          sum += v;
          q[j] = static_cast<int8_t>(v);
        }
        s16[g] = static_cast<int16_t>(sum);
      }
      out.d[t * nsb + sb] = d;
    }
  }
}

}  // namespace larder::kernels::cpu

namespace larder::kernels::cpu::simd {
const float* f16_table() {
  static const float* table = [] {
    auto* t = static_cast<float*>(std::aligned_alloc(64, 65536 * sizeof(float)));
    for (uint32_t i = 0; i < 65536; ++i) t[i] = f16_to_f32(static_cast<uint16_t>(i));
    return t;
  }();
  return table;
}
}  // namespace larder::kernels::cpu::simd

namespace larder::kernels::cpu {

void build_act8(const QuantizedActs& a, int64_t n, uint8_t* act8) {
  const int64_t groups = a.n_pad / 8, nb = a.nb;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < nb; ++b) {
      uint32_t* out = reinterpret_cast<uint32_t*>(act8 + (g * nb + b) * 256);
      for (int t = 0; t < 8; ++t) {
        const int64_t tok = 8 * g + t;
        if (tok < n) {
          const uint8_t* src = reinterpret_cast<const uint8_t*>(a.token_blocks(tok) + b * 32);
          for (int k4 = 0; k4 < 8; ++k4) std::memcpy(out + k4 * 8 + t, src + 4 * k4, 4);
        } else {
          for (int k4 = 0; k4 < 8; ++k4) out[k4 * 8 + t] = 0;
        }
      }
    }
  }
}

void* thread_scratch(size_t bytes, int slot) {
  struct Buf {
    void* p = nullptr;
    size_t cap = 0;
    ~Buf() { std::free(p); }
  };
  thread_local Buf bufs[kScratchSlots];
  Buf& b = bufs[slot];
  if (bytes > b.cap) {
    std::free(b.p);
    b.cap = round_up(bytes + bytes / 4, 4096);
    b.p = std::aligned_alloc(64, b.cap);
  }
  return b.p;
}

}  // namespace larder::kernels::cpu
