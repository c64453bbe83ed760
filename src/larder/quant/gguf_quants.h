// gguf_quants.h — quantizers for the GGUF block formats larder runs (the decoders are
// kernels/ref/kquant.cpp and quant32.cpp; layouts kernels/gguf_blocks.h).
//
// The search for each block's scales follows the method ggml's reference quantizers use
// (ggml-quants.c, read and re-implemented here, not copied): a weighted least-squares fit over
// a small sweep of candidate scales per sub-block, then the sub-block scales themselves
// quantized to 4/6/8 bits against one f16 super-scale, then every element re-rounded against the
// stored scales. Without an importance matrix each format takes ggml's `_ref` path (what
// `llama-quantize` does without --imatrix); with one, the K-quants, IQ4_NL/XS and Q6_K take
// the importance-weighted path where each element's weight is imatrix[col]·sqrt(σ² + x²).
// Bit-for-bit agreement with llama-quantize is tested in tests/quant/gguf_export_test.py.
// The 32-element legacy formats (Q4_0/Q4_1/Q5_0/Q5_1) have importance-weighted paths too (σ²
// over the whole row, not the block); Q8_0, F16 and BF16 ignore the imatrix, as ggml does.
#pragma once

#include <cstdint>
#include <string>

#include "larder/core/dtype.h"
#include "larder/core/status.h"

namespace larder::quant {

// Can `t` be written by quantize_gguf_rows (F32, F16, BF16 and the GGUF block types above)?
bool gguf_quantizer_exists(DType t);

// The GGUF name of a type as llama.cpp spells it ("Q4_K", "IQ4_XS", "F16") and back
// (kUnknown for a name larder cannot write).
DType gguf_type_from_name(const std::string& name);

// Quantizes `rows` rows of `cols` f32 values (row-major) into `out` (rows · dtype_bytes(t, cols)
// bytes). `imatrix` is null or `cols` non-negative importances (one per input column, as
// llama-imatrix writes them); cols must be a multiple of the format's block size.
Status quantize_gguf_rows(DType t, const float* x, int64_t rows, int64_t cols, const float* imatrix, uint8_t* out);

}  // namespace larder::quant
