// imatrix.h — importance matrices in llama.cpp's formats: per weight matrix, the sum over
// calibration tokens of each input column's squared activation (Σ x_c²) and the token count.
// The quantizers weigh column c's error by sum_c / count (gguf_quants.h), as llama-quantize does.
//
// Files: llama-imatrix's GGUF format (general.type = "imatrix", imatrix.datasets [string],
// imatrix.chunk_count / imatrix.chunk_size u32, per matrix F32 tensors "<name>.in_sum2"
// [n_mat, n_cols] and "<name>.counts" [n_mat, 1]; n_mat > 1 only for stacked experts) is read and
// written; the legacy `.dat` (int32 entry count; per entry int32 name length, name, int32 ncall,
// int32 n, float[n] = mean·ncall; then int32 chunk count and the dataset name) is read.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "larder/core/status.h"
#include "larder/formats/model_files.h"
#include "larder/quant/sensitivity.h"

namespace larder::quant {

struct Imatrix {
  struct Entry {
    std::vector<double> sums;  // [n_mat · n_cols]
    std::vector<int64_t> counts;  // [n_mat]
  };
  std::map<std::string, Entry> entries;  // GGUF weight name ("blk.0.attn_q.weight")
  std::vector<std::string> datasets;
  int64_t chunk_count = 0, chunk_size = 0;

  // name → sums/count per column (count 0: ones), as llama-quantize hands them to the quantizers.
  std::map<std::string, std::vector<float>> importances() const;
};

Result<Imatrix> read_imatrix(const std::string& path);
Status write_imatrix(const std::string& path, const Imatrix& m);

// Runs the calibration samples through `files`' model and accumulates Σx² of the input of every
// block weight's matmul ("blk.*", as llama-imatrix collects by default) (the model's own forward; the kernel table's matmul entries are wrapped for
// the duration). Names are the GGUF names (HF sources mapped through the llama-family table).
Result<Imatrix> compute_imatrix(const formats::ModelFiles& files, const CalibrationSet& calib,
                                const std::function<void(size_t, size_t, const std::string&)>& progress);

}  // namespace larder::quant
