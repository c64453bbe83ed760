// kv_rows.cpp — the KV row formats (ops.h): which dtypes hold KV rows, and the scalar
// converters every tier stores and the reference attention reads through.
#include <cmath>
#include <cstring>

#include "larder/core/status.h"
#include "larder/kernels/dispatch.h"
#include "larder/kernels/gguf_blocks.h"
#include "larder/kernels/ops.h"

namespace larder::kernels {

bool kv_dtype_supported(DType dt) { return dt == DType::kF32 || dt == DType::kF16 || dt == DType::kQ8_0; }

const char* kv_dtype_unsupported_reason(DType dt, int head_dim) {
  if (!kv_dtype_supported(dt)) return "KV rows are f32, f16 or q8_0";
  if (dt == DType::kQ8_0 && head_dim % 32 != 0)
    return "q8_0 KV needs head_dim to be a multiple of 32 (each head's row is whole 32-element blocks)";
  return "";
}

void kv_encode(DType dt, const float* src, int64_t n, void* dst) {
  switch (dt) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      // The tier's converter (F16C: 8 per instruction; the scalar loop was 1 % of pp512).
      active_table().to_f16(src, n, static_cast<uint16_t*>(dst));
      return;
    }
    case DType::kQ8_0: {
      // ggml's quantize_row_q8_0 rule: d = amax / 127 (stored as f16), q = round(x / d) with the
      // f32 d, so a file or a comparison against llama.cpp sees the same codes.
      auto* b = static_cast<BlockQ8_0*>(dst);
      for (int64_t i0 = 0; i0 < n; i0 += 32, ++b) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(src[i0 + j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b->d = f32_to_f16(d);
        for (int j = 0; j < 32; ++j) b->qs[j] = static_cast<int8_t>(std::lround(src[i0 + j] * id));
      }
      return;
    }
    default:
      LARDER_CHECK(false, "kv_encode: %s is not a KV dtype", dtype_name(dt));
  }
}

void kv_decode(DType dt, const void* src, int64_t n, float* dst) {
  switch (dt) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
      return;
    }
    case DType::kQ8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t i0 = 0; i0 < n; i0 += 32, ++b) {
        const float d = f16_to_f32(b->d);
        for (int j = 0; j < 32; ++j) dst[i0 + j] = static_cast<float>(b->qs[j]) * d;
      }
      return;
    }
    default:
      LARDER_CHECK(false, "kv_decode: %s is not a KV dtype", dtype_name(dt));
  }
}

}  // namespace larder::kernels
