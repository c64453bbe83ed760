#include "larder/models/weights.h"

#include <cstring>

namespace larder::models {

WeightBinder::WeightBinder(const formats::ModelFiles& files, const TensorNames& names)
    : files_(files),
      names_(names),
      quant_(files.gguf ? Result<QuantizationConfig>(QuantizationConfig{})
                        : quantization_from_config(files.config, files.path + "/config.json")) {}

std::string WeightBinder::file_name(const std::string& hf_name) const {
  return files_.gguf ? names_.gguf(hf_name) : names_.hf_file(hf_name);
}

Result<const formats::TensorInfo*> WeightBinder::find(const std::string& hf_name) {
  const bool gguf = files_.gguf != nullptr;
  const std::string name = file_name(hf_name);
  const formats::TensorInfo* t = name.empty() ? nullptr : files_.tensors().find(name);
  if (!t) {
    if (gguf || name != hf_name)
      return not_found(strfmt("[model] %s: missing tensor '%s' (HF name '%s')", files_.path.c_str(), name.c_str(),
                              hf_name.c_str()));
    return not_found(strfmt("[model] %s: missing tensor '%s'", files_.path.c_str(), hf_name.c_str()));
  }
  bound_.insert(t->name);
  return t;
}

bool WeightBinder::has(const std::string& hf_name) const {
  const std::string name = file_name(hf_name);
  return !name.empty() && files_.tensors().find(name) != nullptr;
}

std::string WeightBinder::file_of(const formats::TensorInfo& t) const {
  return t.file ? *t.file : files_.path;
}

Result<std::optional<AffineParams>> WeightBinder::affine_params(const std::string& module, int64_t cols) const {
  if (files_.gguf) return std::optional<AffineParams>();
  if (!quant_.is_ok()) return quant_.status();
  const QuantizationConfig& q = quant_.value();
  const bool has_scales = files_.tensors().find(module + ".scales") != nullptr;
  if (!q.present) {
    if (has_scales)
      return invalid_argument(strfmt("[model] %s: tensor '%s.scales' exists but config.json has no 'quantization' "
                                     "block (bits, group_size) to read it with",
                                     files_.path.c_str(), module.c_str()));
    return std::optional<AffineParams>();
  }
  if (auto it = q.modules.find(module); it != q.modules.end()) return it->second;  // explicit entry decides
  if (!has_scales) return std::optional<AffineParams>();
  // No entry: like mlx-lm's loader (utils.infer_quant_config), take the parameters the tensors
  // were packed with — group = cols / scales columns, bits = code words · 32 / cols — when they
  // form a supported pair; otherwise the top-level ones (and validation names the mismatch).
  AffineParams p = q.global;
  const formats::TensorInfo* wt = files_.tensors().find(module + ".weight");
  const formats::TensorInfo* sc = files_.tensors().find(module + ".scales");
  // Stacked experts ([E, rows, ·]) are packed along their last axis like a matrix.
  const int r = wt ? wt->rank() : 0;
  if (wt && sc && (r == 2 || r == 3) && sc->rank() == r && sc->dim(r - 1) > 0 && cols > 0 &&
      cols % sc->dim(r - 1) == 0 && (wt->dim(r - 1) * 32) % cols == 0) {
    const int64_t g = cols / sc->dim(r - 1), bits = wt->dim(r - 1) * 32 / cols;
    const bool ok_bits = bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
    if (sc->dtype == DType::kU8) {
      // Only affine keeps its scales in a float dtype; each microscaling mode has one (bits,
      // group) pair (mlx-lm's infer_quant_config).
      for (QuantMode m : {QuantMode::kNvfp4, QuantMode::kMxfp4, QuantMode::kMxfp8})
        if (bits == quant_mode_default_bits(m) && g == quant_mode_default_group(m))
          p = AffineParams{static_cast<int>(bits), static_cast<int>(g), m};
    } else if (ok_bits && (g == 32 || g == 64 || g == 128)) {
      p = AffineParams{static_cast<int>(bits), static_cast<int>(g), QuantMode::kAffine};
    }
  }
  return std::optional<AffineParams>(p);
}

namespace {
DType mx_dtype(QuantMode m) {
  return m == QuantMode::kMxfp4 ? DType::kMlxMXFP4 : m == QuantMode::kNvfp4 ? DType::kMlxNVFP4 : DType::kMlxMXFP8;
}
}  // namespace

Result<const formats::TensorInfo*> WeightBinder::mx_scales(const std::string& module, const AffineParams& q,
                                                           const std::vector<int64_t>& lead, int64_t cols) {
  const std::string name = module + ".scales";
  const formats::TensorInfo* a = files_.tensors().find(name);
  if (!a)
    return not_found(strfmt("[model] %s: missing tensor '%s' (module '%s' is quantized with mode %s per config.json)",
                            files_.path.c_str(), name.c_str(), module.c_str(), quant_mode_name(q.mode)));
  bound_.insert(a->name);
  if (files_.tensors().find(module + ".global_scale"))
    return unsupported(strfmt("[model] %s: module '%s' has a '%s.global_scale' (mlx-lm's per-tensor nvfp4 scale), "
                              "which larder does not run",
                              files_.path.c_str(), module.c_str(), module.c_str()));
  std::vector<int64_t> want = lead;
  want.push_back(cols / q.group_size);
  bool ok = a->dtype == DType::kU8 && a->rank() == static_cast<int>(want.size());
  uint64_t count = 1;
  for (size_t i = 0; i < want.size(); ++i) {
    ok = ok && a->dim(static_cast<int>(i)) == want[i];
    count *= static_cast<uint64_t>(want[i]);
  }
  if (!ok || a->nbytes != count) {
    std::string w;
    for (int64_t d : want) w += (w.empty() ? "" : ", ") + std::to_string(d);
    return invalid_argument(strfmt("[model] %s: tensor '%s' is %s %s (%llu bytes), expected U8 [%s] (mode %s per config.json: one scale "
                                   "per %d of %lld columns)",
                                   file_of(*a).c_str(), name.c_str(), dtype_name(a->dtype), a->shape_str().c_str(),
                                   (unsigned long long)a->nbytes, w.c_str(), quant_mode_name(q.mode), q.group_size,
                                   (long long)cols));
  }
  return a;
}

Result<kernels::WeightView> WeightBinder::affine_matrix(const formats::TensorInfo& t, const std::string& module,
                                                        const AffineParams& q, int64_t rows, int64_t cols,
                                                        const char* why) {
  const std::string file = file_of(t);
  const char* f = file.c_str();
  const std::string params = q.mode == QuantMode::kAffine ? strfmt("bits %d, group_size %d", q.bits, q.group_size)
                                                          : strfmt("mode %s", quant_mode_name(q.mode));
  if (cols % q.group_size != 0)
    return invalid_argument(strfmt("[model] %s: module '%s' has %lld input features, not a multiple of its "
                                   "group_size %d (%s)",
                                   f, module.c_str(), (long long)cols, q.group_size, why));
  if (t.dtype != DType::kU32)
    return invalid_argument(strfmt("[model] %s: tensor '%s' has dtype %s, expected U32 packed codes (module "
                                   "quantized with %s per config.json)",
                                   f, t.name.c_str(), dtype_name(t.dtype), params.c_str()));
  const int64_t packed = cols * q.bits / 32;
  if (t.rank() != 2 || t.dim(0) != rows || t.dim(1) != packed)
    return invalid_argument(strfmt("[model] %s: tensor '%s' has shape %s, expected [%lld, %lld] (%s; packed %lld "
                                   "columns at %s)",
                                   f, t.name.c_str(), t.shape_str().c_str(), (long long)rows, (long long)packed, why,
                                   (long long)cols, params.c_str()));
  if (q.mode != QuantMode::kAffine) {
    const std::vector<int64_t> lead = {rows};
    LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* sc, mx_scales(module, q, lead, cols));
    kernels::WeightView w;
    w.dtype = mx_dtype(q.mode);
    w.rows = rows;
    w.cols = cols;
    w.data = t.data;
    w.scales = sc->data;
    w.scale_dtype = DType::kU8;
    w.group_size = q.group_size;
    if (t.nbytes != static_cast<uint64_t>(rows) * w.row_bytes())
      return corrupt(strfmt("[model] %s: tensor '%s' holds %llu bytes, expected %llu", f, t.name.c_str(),
                            (unsigned long long)t.nbytes, (unsigned long long)(static_cast<uint64_t>(rows) * w.row_bytes())));
    if (!kernels::weight_supported(w))
      return unsupported(strfmt("[model] %s: module '%s' (mode %s, %lld columns) has no kernel in the active table", f,
                                module.c_str(), quant_mode_name(q.mode), (long long)cols));
    dtypes_.insert(dtype_name(w.dtype));  // "MLX_MXFP4": the name kernels/batch_invariance.h uses
    n_params_ += rows * cols;
    return w;
  }
  const int64_t ng = cols / q.group_size;
  const formats::TensorInfo* sb[2] = {nullptr, nullptr};
  const char* kinds[2] = {"scales", "biases"};
  for (int i = 0; i < 2; ++i) {
    const std::string name = module + "." + kinds[i];
    const formats::TensorInfo* a = files_.tensors().find(name);
    if (!a)
      return not_found(strfmt("[model] %s: missing tensor '%s' (module '%s' is quantized with %s per config.json)",
                              files_.path.c_str(), name.c_str(), module.c_str(), params.c_str()));
    bound_.insert(a->name);
    const std::string af = file_of(*a);
    if (a->dtype != DType::kF32 && a->dtype != DType::kF16 && a->dtype != DType::kBF16)
      return unsupported(strfmt("[model] %s: tensor '%s' has dtype %s, expected BF16, F16 or F32", af.c_str(),
                                name.c_str(), dtype_name(a->dtype)));
    if (a->rank() != 2 || a->dim(0) != rows || a->dim(1) != ng)
      return invalid_argument(strfmt("[model] %s: tensor '%s' has shape %s, expected [%lld, %lld] (%lld columns / "
                                     "group_size %d)",
                                     af.c_str(), name.c_str(), a->shape_str().c_str(), (long long)rows, (long long)ng,
                                     (long long)cols, q.group_size));
    if (a->nbytes != dtype_bytes(a->dtype, static_cast<uint64_t>(rows * ng)))
      return corrupt(strfmt("[model] %s: tensor '%s' holds %llu bytes, expected %llu", af.c_str(), name.c_str(),
                            (unsigned long long)a->nbytes,
                            (unsigned long long)dtype_bytes(a->dtype, static_cast<uint64_t>(rows * ng))));
    sb[i] = a;
  }
  if (sb[0]->dtype != sb[1]->dtype)
    return invalid_argument(strfmt("[model] %s: tensors '%s' (%s) and '%s' (%s) must have the same dtype",
                                   files_.path.c_str(), sb[0]->name.c_str(), dtype_name(sb[0]->dtype),
                                   sb[1]->name.c_str(), dtype_name(sb[1]->dtype)));
  kernels::WeightView w;
  w.dtype = DType::kU32;
  w.rows = rows;
  w.cols = cols;
  w.data = t.data;
  w.scales = sb[0]->data;
  w.biases = sb[1]->data;
  w.scale_dtype = sb[0]->dtype;
  w.bits = q.bits;
  w.group_size = q.group_size;
  if (t.nbytes != static_cast<uint64_t>(rows) * w.row_bytes())
    return corrupt(strfmt("[model] %s: tensor '%s' holds %llu bytes, expected %llu", f, t.name.c_str(),
                          (unsigned long long)t.nbytes, (unsigned long long)(static_cast<uint64_t>(rows) * w.row_bytes())));
  if (!kernels::weight_supported(w))
    return unsupported(strfmt("[model] %s: module '%s' (affine, %s, %s scales) has no kernel in the active table",
                              f, module.c_str(), params.c_str(), dtype_name(w.scale_dtype)));
  dtypes_.insert(strfmt("affine-q%d-g%d", q.bits, q.group_size));
  n_params_ += rows * cols;
  return w;
}

Result<kernels::WeightView> WeightBinder::matrix(const std::string& hf_name, int64_t rows, int64_t cols, const char* why) {
  LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* t, find(hf_name));
  // Affine parameters and the scales/biases tensors are keyed by the module's name in the file.
  const std::string fname = file_name(hf_name);
  const std::string suffix = ".weight";
  const bool has_suffix = fname.size() > suffix.size() &&
                          fname.compare(fname.size() - suffix.size(), suffix.size(), suffix) == 0;
  const std::string module = has_suffix ? fname.substr(0, fname.size() - suffix.size()) : fname;
  LARDER_ASSIGN_OR_RETURN(std::optional<AffineParams> q, affine_params(module, cols));
  if (q) return affine_matrix(*t, module, *q, rows, cols, why);
  if (t->dtype == DType::kU32 && !files_.gguf)
    return invalid_argument(strfmt("[model] %s: tensor '%s' is U32 (packed affine codes?) but config.json's "
                                   "quantization block leaves module '%s' unquantized",
                                   file_of(*t).c_str(), t->name.c_str(), module.c_str()));
  if (t->rank() != 2 || t->dim(0) != rows || t->dim(1) != cols) {
    return invalid_argument(strfmt("[model] %s: tensor '%s' has shape %s, expected [%lld, %lld] (%s)",
                                   file_of(*t).c_str(), t->name.c_str(), t->shape_str().c_str(), (long long)rows,
                                   (long long)cols, why));
  }
  kernels::WeightView w;
  w.dtype = t->dtype;
  w.rows = rows;
  w.cols = cols;
  w.data = t->data;
  if (!kernels::weight_supported(w)) {
    return unsupported(strfmt("[model] %s: tensor '%s' has dtype %s, which larder cannot execute as a matrix "
                              "(supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, "
                              "IQ4_XS, MXFP4, MLX affine U32 + scales/biases, MLX mxfp4/nvfp4/mxfp8 U32 + U8 scales)",
                              file_of(*t).c_str(), t->name.c_str(), dtype_name(t->dtype)));
  }
  if (t->nbytes != static_cast<uint64_t>(rows) * w.row_bytes()) {
    return corrupt(strfmt("[model] %s: tensor '%s' holds %llu bytes, expected %llu for %s %s", file_of(*t).c_str(),
                          t->name.c_str(), (unsigned long long)t->nbytes,
                          (unsigned long long)(static_cast<uint64_t>(rows) * w.row_bytes()), dtype_name(t->dtype),
                          t->shape_str().c_str()));
  }
  dtypes_.insert(dtype_name(t->dtype));
  n_params_ += rows * cols;
  return w;
}

namespace {
// Rows [r0, r0 + rows) of a bound matrix (every format stores whole rows; MLX scales/biases per row).
kernels::WeightView row_part(kernels::WeightView w, int64_t r0, int64_t rows) {
  w.data += static_cast<uint64_t>(r0) * w.row_bytes();
  const uint64_t sb = w.scale_row_bytes();
  if (w.scales) w.scales += static_cast<uint64_t>(r0) * sb;
  if (w.biases) w.biases += static_cast<uint64_t>(r0) * sb;
  w.rows = rows;
  return w;
}
}  // namespace

Result<std::vector<kernels::WeightView>> WeightBinder::experts(const ExpertsSpec& spec, const char* why) {
  const int64_t E = spec.n_experts, rows = spec.rows, cols = spec.cols, P = spec.parts;
  if (E <= 0 || rows <= 0 || cols <= 0 || P <= 0 || spec.part < 0 || spec.part >= P)
    return invalid_argument(strfmt("[model] %s: '%s': %lld experts of [%lld, %lld], part %d of %d (%s)",
                                   files_.path.c_str(), spec.stacked.c_str(), (long long)E, (long long)rows,
                                   (long long)cols, spec.part, spec.parts, why));
  const int64_t all_rows = P * rows, r0 = spec.part * rows;  // of one expert's slab
  std::vector<kernels::WeightView> out;
  if (!has(spec.stacked) && !spec.per_expert.empty()) {
    // One tensor per expert: each a matrix of its own, wherever the file put it (no copy).
    const size_t at = spec.per_expert.find("{i}");
    if (at == std::string::npos)
      return invalid_argument(strfmt("[model] per-expert name '%s' has no {i}", spec.per_expert.c_str()));
    for (int64_t e = 0; e < E; ++e) {
      std::string name = spec.per_expert;
      name.replace(at, 3, std::to_string(e));
      LARDER_ASSIGN_OR_RETURN(kernels::WeightView w, matrix(name, all_rows, cols, why));
      if (e > 0 && (w.dtype != out[0].dtype || w.bits != out[0].bits || w.group_size != out[0].group_size ||
                    w.scale_dtype != out[0].scale_dtype))
        return invalid_argument(strfmt("[model] %s: tensor '%s' is stored as %s, expert 0 as %s: the experts of one "
                                       "matrix must share a format (%s)",
                                       files_.path.c_str(), file_name(name).c_str(), dtype_name(w.dtype),
                                       dtype_name(out[0].dtype), why));
      out.push_back(row_part(w, r0, rows));
    }
    if (P > 1) n_params_ -= E * (P - 1) * rows * cols;  // matrix() counted every part; this binds one
    return out;
  }
  LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* t, find(spec.stacked));
  const std::string file = file_of(*t);
  const char* f = file.c_str();
  const std::string fname = file_name(spec.stacked);
  const std::string suffix = ".weight";
  const bool has_suffix = fname.size() > suffix.size() &&
                          fname.compare(fname.size() - suffix.size(), suffix.size(), suffix) == 0;
  const std::string module = has_suffix ? fname.substr(0, fname.size() - suffix.size()) : fname;
  LARDER_ASSIGN_OR_RETURN(std::optional<AffineParams> q, affine_params(module, cols));
  const std::string parts = P > 1 ? strfmt(", %lld parts", (long long)P) : std::string();
  kernels::WeightView w;  // expert 0's whole slab [P·rows, cols]
  w.rows = all_rows;
  w.cols = cols;
  if (q) {
    if (cols % q->group_size != 0)
      return invalid_argument(strfmt("[model] %s: module '%s' has %lld input features, not a multiple of its "
                                     "group_size %d (%s)",
                                     f, module.c_str(), (long long)cols, q->group_size, why));
    if (t->dtype != DType::kU32)
      return invalid_argument(strfmt("[model] %s: tensor '%s' has dtype %s, expected U32 packed codes (module "
                                     "quantized with bits %d, group_size %d per config.json)",
                                     f, t->name.c_str(), dtype_name(t->dtype), q->bits, q->group_size));
    const int64_t packed = cols * q->bits / 32, ng = cols / q->group_size;
    if (t->rank() != 3 || t->dim(0) != E || t->dim(1) != all_rows || t->dim(2) != packed)
      return invalid_argument(strfmt("[model] %s: tensor '%s' has shape %s, expected [%lld, %lld, %lld] (%s: %lld "
                                     "experts%s, %lld columns packed at bits %d)",
                                     f, t->name.c_str(), t->shape_str().c_str(), (long long)E, (long long)all_rows,
                                     (long long)packed, why, (long long)E, parts.c_str(), (long long)cols, q->bits));
    if (q->mode != QuantMode::kAffine) {
      const std::vector<int64_t> lead = {E, all_rows};
      LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* sc, mx_scales(module, *q, lead, cols));
      w.dtype = mx_dtype(q->mode);
      w.group_size = q->group_size;
      w.scale_dtype = DType::kU8;
      w.scales = sc->data;
    }
    const formats::TensorInfo* sb[2] = {nullptr, nullptr};
    const char* kinds[2] = {"scales", "biases"};
    for (int i = 0; i < 2 && q->mode == QuantMode::kAffine; ++i) {
      const std::string name = module + "." + kinds[i];
      const formats::TensorInfo* a = files_.tensors().find(name);
      if (!a)
        return not_found(strfmt("[model] %s: missing tensor '%s' (module '%s' is quantized per config.json)",
                                files_.path.c_str(), name.c_str(), module.c_str()));
      bound_.insert(a->name);
      if (a->dtype != DType::kF32 && a->dtype != DType::kF16 && a->dtype != DType::kBF16)
        return unsupported(strfmt("[model] %s: tensor '%s' has dtype %s, expected BF16, F16 or F32",
                                  file_of(*a).c_str(), name.c_str(), dtype_name(a->dtype)));
      if (a->rank() != 3 || a->dim(0) != E || a->dim(1) != all_rows || a->dim(2) != ng ||
          a->nbytes != dtype_bytes(a->dtype, static_cast<uint64_t>(E * all_rows * ng)))
        return invalid_argument(strfmt("[model] %s: tensor '%s' has shape %s (%llu bytes), expected [%lld, %lld, "
                                       "%lld] (%lld columns / group_size %d)",
                                       file_of(*a).c_str(), name.c_str(), a->shape_str().c_str(),
                                       (unsigned long long)a->nbytes, (long long)E, (long long)all_rows,
                                       (long long)ng, (long long)cols, q->group_size));
      sb[i] = a;
    }
    if (q->mode == QuantMode::kAffine) {
      if (sb[0]->dtype != sb[1]->dtype)
        return invalid_argument(strfmt("[model] %s: tensors '%s' (%s) and '%s' (%s) must have the same dtype",
                                       files_.path.c_str(), sb[0]->name.c_str(), dtype_name(sb[0]->dtype),
                                       sb[1]->name.c_str(), dtype_name(sb[1]->dtype)));
      w.dtype = DType::kU32;
      w.bits = q->bits;
      w.group_size = q->group_size;
      w.scale_dtype = sb[0]->dtype;
      w.scales = sb[0]->data;
      w.biases = sb[1]->data;
    }
  } else {
    if (t->dtype == DType::kU32 && !files_.gguf)
      return invalid_argument(strfmt("[model] %s: tensor '%s' is U32 (packed affine codes?) but config.json's "
                                     "quantization block leaves module '%s' unquantized",
                                     f, t->name.c_str(), module.c_str()));
    if (t->rank() != 3 || t->dim(0) != E || t->dim(1) != all_rows || t->dim(2) != cols)
      return invalid_argument(strfmt("[model] %s: tensor '%s' has shape %s, expected [%lld, %lld, %lld] (%s: %lld "
                                     "experts%s of [%lld, %lld])",
                                     f, t->name.c_str(), t->shape_str().c_str(), (long long)E, (long long)all_rows,
                                     (long long)cols, why, (long long)E, parts.c_str(), (long long)rows,
                                     (long long)cols));
    w.dtype = t->dtype;
  }
  w.data = t->data;
  if (!kernels::weight_supported(w))
    return unsupported(strfmt("[model] %s: tensor '%s' (%s) has no matmul kernel in the active table", f,
                              t->name.c_str(), q ? strfmt("affine, bits %d, group_size %d", q->bits, q->group_size).c_str()
                                                 : dtype_name(t->dtype)));
  if (t->nbytes != static_cast<uint64_t>(E * all_rows) * w.row_bytes())
    return corrupt(strfmt("[model] %s: tensor '%s' holds %llu bytes, expected %llu for %lld experts of [%lld, %lld]",
                          f, t->name.c_str(), (unsigned long long)t->nbytes,
                          (unsigned long long)(static_cast<uint64_t>(E * all_rows) * w.row_bytes()), (long long)E,
                          (long long)all_rows, (long long)cols));
  // Expert e's slab starts e·P·rows rows in, its part r0 rows further (codes, scales and biases alike).
  for (int64_t e = 0; e < E; ++e) out.push_back(row_part(w, e * all_rows + r0, rows));
  dtypes_.insert(!q                                ? std::string(dtype_name(t->dtype))
                 : q->mode == QuantMode::kAffine ? strfmt("affine-q%d-g%d", q->bits, q->group_size)
                                                 : std::string(dtype_name(w.dtype)));
  n_params_ += E * rows * cols;
  return out;
}

Result<std::vector<kernels::WeightView>> WeightBinder::mxfp4_block_experts(const std::string& module, int n_experts,
                                                                          int64_t rows, int64_t cols, const char* why) {
  const int64_t E = n_experts;
  const std::string bname = module + "_blocks", sname = module + "_scales";
  if (E <= 0 || rows <= 0 || cols <= 0 || cols % 32 != 0)
    return invalid_argument(strfmt("[model] %s: '%s': %lld experts of [%lld, %lld]: MXFP4 blocks need a positive "
                                   "multiple of 32 columns (%s)",
                                   files_.path.c_str(), bname.c_str(), (long long)E, (long long)rows, (long long)cols,
                                   why));
  if (!quant_.is_ok()) return quant_.status();
  const QuantizationConfig& qc = quant_.value();
  const auto entry = qc.modules.find(module);
  const bool mxfp4 = qc.present && (entry != qc.modules.end() ? entry->second && entry->second->mode == QuantMode::kMxfp4
                                                             : qc.global.mode == QuantMode::kMxfp4);
  if (!mxfp4)
    return invalid_argument(strfmt("[model] %s: tensor '%s' holds MXFP4 blocks but config.json does not quantize "
                                   "module '%s' as mxfp4 (OpenAI's checkpoints say quantization_config: "
                                   "{\"quant_method\": \"mxfp4\"})",
                                   files_.path.c_str(), bname.c_str(), module.c_str()));
  LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* bt, find(bname));
  LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* st, find(sname));
  const int64_t nb = cols / 32;
  if (bt->dtype != DType::kU8 || bt->rank() != 4 || bt->dim(0) != E || bt->dim(1) != rows || bt->dim(2) != nb ||
      bt->dim(3) != 16 || bt->nbytes != static_cast<uint64_t>(E * rows * nb * 16))
    return invalid_argument(strfmt("[model] %s: tensor '%s' is %s %s (%llu bytes), expected U8 [%lld, %lld, %lld, 16] "
                                   "(%s: %lld experts, %lld columns in MXFP4 blocks of 32 packed two per byte)",
                                   file_of(*bt).c_str(), bt->name.c_str(), dtype_name(bt->dtype),
                                   bt->shape_str().c_str(), (unsigned long long)bt->nbytes, (long long)E,
                                   (long long)rows, (long long)nb, why, (long long)E, (long long)cols));
  if (st->dtype != DType::kU8 || st->rank() != 3 || st->dim(0) != E || st->dim(1) != rows || st->dim(2) != nb ||
      st->nbytes != static_cast<uint64_t>(E * rows * nb))
    return invalid_argument(strfmt("[model] %s: tensor '%s' is %s %s (%llu bytes), expected U8 [%lld, %lld, %lld] "
                                   "(%s: one e8m0 scale per block of 32 of %lld columns)",
                                   file_of(*st).c_str(), st->name.c_str(), dtype_name(st->dtype),
                                   st->shape_str().c_str(), (unsigned long long)st->nbytes, (long long)E,
                                   (long long)rows, (long long)nb, why, (long long)cols));
  kernels::WeightView w;  // every expert's rows; expert e is a row_part
  w.dtype = DType::kMlxMXFP4;
  w.rows = E * rows;
  w.cols = cols;
  w.data = bt->data;
  w.scales = st->data;
  w.scale_dtype = DType::kU8;
  w.group_size = 32;
  if (!kernels::weight_supported(w))
    return unsupported(strfmt("[model] %s: tensor '%s' (MXFP4 blocks, %lld columns) has no kernel in the active table",
                              file_of(*bt).c_str(), bt->name.c_str(), (long long)cols));
  std::vector<kernels::WeightView> out;
  for (int64_t e = 0; e < E; ++e) out.push_back(row_part(w, e * rows, rows));
  dtypes_.insert(dtype_name(w.dtype));
  n_params_ += E * rows * cols;
  return out;
}

Result<std::vector<float>> WeightBinder::small_f32(const std::string& hf_name, std::vector<int64_t> shape,
                                                   const char* why) {
  LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* t, find(hf_name));
  std::vector<int64_t> have, want;
  for (int i = 0; i < t->rank(); ++i)
    if (t->dim(i) != 1) have.push_back(t->dim(i));
  int64_t len = 1;
  std::string want_str;
  for (int64_t d : shape) {
    len *= d;
    want_str += (want_str.empty() ? "" : ", ") + std::to_string(d);
    if (d != 1) want.push_back(d);
  }
  if (have != want) {
    return invalid_argument(strfmt("[model] %s: tensor '%s' has shape %s, expected [%s] (%s)", file_of(*t).c_str(),
                                   t->name.c_str(), t->shape_str().c_str(), want_str.c_str(), why));
  }
  return to_f32(*t, len);
}

Result<Projection> WeightBinder::projection(const ProjectionSpec& spec) {
  LARDER_ASSIGN_OR_RETURN(const kernels::WeightView w, matrix(spec.module + ".weight", spec.out, spec.in, spec.why));
  Projection p = projection_over(spec.module, w);
  if (spec.bias) {
    LARDER_ASSIGN_OR_RETURN(p.bias_, vector(spec.module + ".bias", spec.out, spec.bias_why));
  }
  return p;
}

Projection WeightBinder::projection_over(const std::string& name, const kernels::WeightView& w) {
  projections_.push_back({name, w.rows, w.cols});
  return Projection::over(name, static_cast<int>(projections_.size()) - 1, w);
}

Result<std::vector<float>> WeightBinder::vector(const std::string& hf_name, int64_t len, const char* why) {
  LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* t, find(hf_name));
  if (t->rank() != 1 || t->dim(0) != len) {
    return invalid_argument(strfmt("[model] %s: tensor '%s' has shape %s, expected [%lld] (%s)", file_of(*t).c_str(),
                                   t->name.c_str(), t->shape_str().c_str(), (long long)len, why));
  }
  return to_f32(*t, len);
}

Result<std::vector<float>> WeightBinder::to_f32(const formats::TensorInfo& tensor, int64_t len) {
  const formats::TensorInfo* t = &tensor;
  std::vector<float> out(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) {
    uint16_t h = 0;
    switch (t->dtype) {
      case DType::kF32: std::memcpy(&out[i], t->data + 4 * i, 4); break;
      case DType::kF16: std::memcpy(&h, t->data + 2 * i, 2); out[i] = f16_to_f32(h); break;
      case DType::kBF16: std::memcpy(&h, t->data + 2 * i, 2); out[i] = bf16_to_f32(h); break;
      default:
        return unsupported(strfmt("[model] %s: tensor '%s' has dtype %s; 1-D parameters must be F32, F16 or BF16",
                                  file_of(*t).c_str(), t->name.c_str(), dtype_name(t->dtype)));
    }
  }
  n_params_ += len;
  return out;
}

std::vector<std::string> WeightBinder::unbound() const {
  std::vector<std::string> out;
  for (const auto& t : files_.tensors().tensors())
    if (!bound_.count(t.name)) out.push_back(t.name);
  return out;
}

void WeightBinder::ignore_prefix(const std::string& file_prefix) {
  for (const auto& t : files_.tensors().tensors())
    if (t.name.compare(0, file_prefix.size(), file_prefix) == 0) bound_.insert(t.name);
}

std::string WeightBinder::weight_dtypes() const {
  std::string s;
  for (const auto& d : dtypes_) s += (s.empty() ? "" : "+") + d;
  return s;
}

}  // namespace larder::models
