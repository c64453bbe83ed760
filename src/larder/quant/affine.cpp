// affine.cpp — see affine.h. The arithmetic order matters for byte parity: every step is a single
// f32 operation (division, not multiplication by a reciprocal), rounding with rint (half to even
// in the default rounding mode), and min/max reductions that skip NaN like std::min/std::max
// with the accumulator first.
#include "larder/quant/affine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "larder/quant/parallel_rows.h"

namespace larder::quant {

Status check_affine_params(int bits, int group_size, int64_t cols) {
  if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8)
    return invalid_argument(strfmt("[quant] bits must be one of 2, 3, 4, 5, 6, 8 (got %d)", bits));
  if (group_size != 32 && group_size != 64 && group_size != 128)
    return invalid_argument(strfmt("[quant] group size must be 32, 64 or 128 (got %d)", group_size));
  if (cols <= 0 || cols % group_size != 0)
    return invalid_argument(strfmt("[quant] last dimension %lld is not a multiple of the group size %d",
                                   static_cast<long long>(cols), group_size));
  return Status::ok();
}

float load_float(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, static_cast<const uint8_t*>(p) + i * 4, 4);
      return f;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, static_cast<const uint8_t*>(p) + i * 2, 2);
      return f16_to_f32(h);
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, static_cast<const uint8_t*>(p) + i * 2, 2);
      return bf16_to_f32(h);
    }
    default:
      return std::numeric_limits<float>::quiet_NaN();
  }
}

void store_float(void* p, DType dtype, int64_t i, float v) {
  uint8_t* b = static_cast<uint8_t*>(p);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(b + i * 4, &v, 4);
      break;
    case DType::kF16: {
      uint16_t h = f32_to_f16(v);
      std::memcpy(b + i * 2, &h, 2);
      break;
    }
    case DType::kBF16: {
      uint16_t h = f32_to_bf16(v);
      std::memcpy(b + i * 2, &h, 2);
      break;
    }
    default:
      break;
  }
}

namespace {

// Appends `bits` low bits of `code` to a little-endian bit stream.
struct BitWriter {
  uint8_t* out;
  uint64_t acc = 0;
  int nacc = 0;
  void put(uint32_t code, int bits) {
    acc |= static_cast<uint64_t>(code) << nacc;
    nacc += bits;
    while (nacc >= 8) {
      *out++ = static_cast<uint8_t>(acc & 0xffu);
      acc >>= 8;
      nacc -= 8;
    }
  }
};

}  // namespace

Status quantize_affine(const void* src, DType dtype, int64_t rows, int64_t cols, int bits,
                       int group_size, uint32_t* packed, void* scales, void* biases) {
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16)
    return invalid_argument(strfmt("[quant] cannot quantize dtype %s (want F32, F16 or BF16)", dtype_name(dtype)));
  if (Status st = check_affine_params(bits, group_size, cols); !st) return st;
  const float n_bins = static_cast<float>((1 << bits) - 1);
  const float eps = 1e-7f;
  const int64_t groups_per_row = cols / group_size;
  const int64_t bytes_per_row = cols * bits / 8;
  std::vector<float> w(static_cast<size_t>(group_size));
  for (int64_t r = 0; r < rows; ++r) {
    BitWriter bw{reinterpret_cast<uint8_t*>(packed) + r * bytes_per_row};
    for (int64_t g = 0; g < groups_per_row; ++g) {
      const int64_t base = r * cols + g * group_size;
      for (int j = 0; j < group_size; ++j) w[static_cast<size_t>(j)] = load_float(src, dtype, base + j);
      float hi = -std::numeric_limits<float>::infinity();
      float lo = std::numeric_limits<float>::infinity();
      for (int j = 0; j < group_size; ++j) {
        const float x = w[static_cast<size_t>(j)];
        hi = (hi < x) ? x : hi;  // std::max(hi, x)
        lo = (x < lo) ? x : lo;  // std::min(lo, x)
      }
      const bool lo_edge = std::fabs(lo) > std::fabs(hi);
      const float range = hi - lo;
      const float step = range / n_bins;
      float scale = (step < eps) ? eps : step;  // std::max(step, eps)
      if (!lo_edge) scale = -scale;
      const float edge = lo_edge ? lo : hi;
      const float q0 = std::rint(edge / scale);
      float bias = 0.0f;
      if (q0 != 0.0f) {
        scale = edge / q0;
        bias = edge;
      }
      for (int j = 0; j < group_size; ++j) {
        float q = std::rint((w[static_cast<size_t>(j)] - bias) / scale);
        q = (q < 0.0f) ? 0.0f : q;         // std::max(q, 0)
        q = (n_bins < q) ? n_bins : q;     // std::min(q, n)
        bw.put(static_cast<uint32_t>(static_cast<uint64_t>(q)), bits);
      }
      const int64_t gi = r * groups_per_row + g;
      store_float(scales, dtype, gi, scale);
      store_float(biases, dtype, gi, bias);
    }
  }
  return Status::ok();
}

Status dequantize_affine(const uint32_t* packed, const void* scales, const void* biases, DType dtype,
                         int64_t rows, int64_t cols, int bits, int group_size, float* out) {
  if (Status st = check_affine_params(bits, group_size, cols); !st) return st;
  const int64_t groups_per_row = cols / group_size;
  const int64_t bytes_per_row = cols * bits / 8;
  const uint32_t mask = (1u << bits) - 1u;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(packed) + r * bytes_per_row;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t bit = c * bits;
      uint32_t v = 0;
      std::memcpy(&v, p + bit / 8, (bit % 8 + bits + 7) / 8);
      const uint32_t q = (v >> (bit % 8)) & mask;
      const int64_t gi = r * groups_per_row + c / group_size;
      out[r * cols + c] = load_float(scales, dtype, gi) * static_cast<float>(q) + load_float(biases, dtype, gi);
    }
  }
  return Status::ok();
}

Status fake_quantize_affine(const void* src, DType dtype, int64_t rows, int64_t cols, int bits, int group_size,
                            int threads, float* out) {
  if (Status st = check_affine_params(bits, group_size, cols); !st) return st;
  const size_t esz = dtype == DType::kF32 ? 4 : 2;
  std::vector<Status> sts(static_cast<size_t>(resolve_threads(threads)));
  parallel_rows(rows, threads, 16, [&](int part, int64_t r0, int64_t r1) {
    constexpr int64_t kChunk = 64;  // rows per quantize/dequantize round trip (bounded scratch)
    std::vector<uint32_t> q(static_cast<size_t>(kChunk * affine_words_per_row(cols, bits)));
    std::vector<uint8_t> s(static_cast<size_t>(kChunk * (cols / group_size)) * esz), b(s.size());
    for (int64_t r = r0; r < r1; r += kChunk) {
      const int64_t n = std::min(kChunk, r1 - r);
      Status st = quantize_affine(static_cast<const uint8_t*>(src) + static_cast<size_t>(r * cols) * esz, dtype, n, cols,
                                  bits, group_size, q.data(), s.data(), b.data());
      if (st) st = dequantize_affine(q.data(), s.data(), b.data(), dtype, n, cols, bits, group_size, out + r * cols);
      if (!st) {
        sts[static_cast<size_t>(part)] = st;
        return;
      }
    }
  });
  for (const Status& st : sts)
    if (!st) return st;
  return Status::ok();
}

}  // namespace larder::quant
