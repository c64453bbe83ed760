// batch_invariance.h — which matmul formats give a row the same bits whatever the row count of the
// call (issue 41): the facts tests/unit/kernels_fast/batch_invariance_test.cpp checks, kept here
// once so that the runtime can ask them (speculative decoding is exact only where the k + 1-row
// verify forward equals one-row decode: runtime/speculative.h). The test runs every format on
// every mode and fails when a listed gap closes or an unlisted one opens, so this list stays true.
//
// Modes: "ref" (the scalar reference: one row at a time, always invariant), "avx2", "avx512" (the
// default kernels of each tier), "avx512inv" (the AVX-512 tier with cpu::batch_invariant_decode(),
// LARDER_BATCH_INVARIANT=1). Formats: a dtype name ("Q4_K", "BF16", "MXFP4", "MLX_NVFP4") or MLX
// affine as "affineBgG" ("affine4g64"); a gap names a prefix ("affine4g": every group size,
// "affine": every width). The microscaling floats (kernels/microscaling.h): the AVX2 kernels compute
// each (row, token) as one chain over the blocks whatever the call's token count (invariant), mxfp8
// runs that f32 kernel on AVX-512 too; the AVX-512 fp4 ones decode on the AVX2 kernel (a gap) and,
// in avx512inv, on Gemv16, the prefill GEMM's arithmetic (invariant).
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace larder::kernels {

struct VarianceGap {
  const char* mode;
  const char* format;  // a prefix of the format name
  const char* why;
};

// Every (mode, format) whose matmul is not batch-invariant, with the reason.
std::span<const VarianceGap> batch_variance_gaps();

// Why `format`'s matmul is not batch-invariant in `mode`; nullptr when it is.
const char* batch_variance(std::string_view mode, std::string_view format);

// The mode the running kernels are in: the active table's tier, "avx512inv" when its decode runs
// the GEMM's arithmetic (cpu::batch_invariant_decode()).
std::string active_decode_mode();

// batch_variance(mode, format) == nullptr.
inline bool batch_invariant(std::string_view format, std::string_view mode) {
  return batch_variance(mode, format) == nullptr;
}

}  // namespace larder::kernels
