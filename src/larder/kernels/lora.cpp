#include "larder/kernels/lora.h"

#include <cstring>

#include "larder/core/status.h"
#include "larder/kernels/dispatch.h"

namespace larder::kernels {

namespace {

size_t elem_bytes(DType d) { return d == DType::kF32 ? 4 : 2; }

float load_elem(DType d, const void* p, int64_t i) {
  const auto* b = static_cast<const uint8_t*>(p);
  if (d == DType::kF32) {
    float v;
    std::memcpy(&v, b + i * 4, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, b + i * 2, 2);
  return d == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
}

}  // namespace

float LoraFactors::a_at(int64_t k, int64_t j) const { return load_elem(dtype, a, k * in + j); }

float LoraFactors::b_at(int64_t o, int64_t k) const {
  return load_elem(dtype, bp, ((o / kLoraPanel) * rank + k) * kLoraPanel + o % kLoraPanel);
}

void pack_lora_b(DType dtype, const void* b, bool rank_major, int64_t rank, int64_t out, void* dst) {
  LARDER_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16, "[kernels] LoRA factors in %s",
               dtype_name(dtype));
  const size_t e = elem_bytes(dtype);
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(b);
  std::memset(d, 0, static_cast<size_t>(lora_panel_elems(rank, out)) * e);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t k = 0; k < rank; ++k) {
      const int64_t from = rank_major ? k * out + o : o * rank + k;
      const int64_t to = ((o / kLoraPanel) * rank + k) * kLoraPanel + o % kLoraPanel;
      std::memcpy(d + to * e, s + from * e, e);
    }
}

void lora_delta(const LoraFactors& f, const float* const* xs, int64_t nx, float* t, float* const* us) {
  if (nx > 0 && f.rank > 0) active_table().lora_delta(f, xs, nx, t, us);
}

OwnedLoraFactors own_lora_factors(DType dtype, const void* a, const void* b, int64_t rank, int64_t in, int64_t out) {
  const size_t e = elem_bytes(dtype);
  OwnedLoraFactors o;
  o.a.resize(static_cast<size_t>(rank * in) * e);
  std::memcpy(o.a.data(), a, o.a.size());
  o.bp.resize(static_cast<size_t>(lora_panel_elems(rank, out)) * e);
  pack_lora_b(dtype, b, /*rank_major=*/false, rank, out, o.bp.data());
  o.view = {dtype, o.a.data(), o.bp.data(), rank, in, out};
  return o;
}

}  // namespace larder::kernels
