#include "larder/models/weights.h"

#include <cstring>

namespace larder::models {

namespace {

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

}  // namespace

std::string gguf_tensor_name(const std::string& hf) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  if (!starts_with(hf, "model.layers.")) return "";
  const size_t a = std::strlen("model.layers.");
  const size_t dot = hf.find('.', a);
  if (dot == std::string::npos) return "";
  const std::string layer = hf.substr(a, dot - a);
  const std::string rest = hf.substr(dot + 1);
  static const std::pair<const char*, const char*> kMap[] = {
      {"self_attn.q_proj.", "attn_q."},       {"self_attn.k_proj.", "attn_k."},
      {"self_attn.v_proj.", "attn_v."},       {"self_attn.o_proj.", "attn_output."},
      {"self_attn.q_norm.", "attn_q_norm."},  {"self_attn.k_norm.", "attn_k_norm."},
      {"input_layernorm.", "attn_norm."},     {"post_attention_layernorm.", "ffn_norm."},
      {"mlp.gate_proj.", "ffn_gate."},        {"mlp.up_proj.", "ffn_up."},
      {"mlp.down_proj.", "ffn_down."},
  };
  for (const auto& [from, to] : kMap) {
    if (starts_with(rest, from)) return "blk." + layer + "." + to + rest.substr(std::strlen(from));
  }
  return "";
}

WeightBinder::WeightBinder(const formats::ModelFiles& files) : files_(files) {}

Result<const formats::TensorInfo*> WeightBinder::find(const std::string& hf_name) {
  const bool gguf = files_.gguf != nullptr;
  const std::string name = gguf ? gguf_tensor_name(hf_name) : hf_name;
  const formats::TensorInfo* t = name.empty() ? nullptr : files_.tensors().find(name);
  if (!t) {
    if (gguf)
      return not_found(strfmt("[model] %s: missing tensor '%s' (HF name '%s')", files_.path.c_str(), name.c_str(),
                              hf_name.c_str()));
    return not_found(strfmt("[model] %s: missing tensor '%s'", files_.path.c_str(), hf_name.c_str()));
  }
  bound_.insert(t->name);
  return t;
}

bool WeightBinder::has(const std::string& hf_name) const {
  const std::string name = files_.gguf ? gguf_tensor_name(hf_name) : hf_name;
  return !name.empty() && files_.tensors().find(name) != nullptr;
}

std::string WeightBinder::file_of(const formats::TensorInfo& t) const {
  return t.file ? *t.file : files_.path;
}

Result<kernels::WeightView> WeightBinder::matrix(const std::string& hf_name, int64_t rows, int64_t cols, const char* why) {
  LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* t, find(hf_name));
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
                              "(supported: F32, F16, BF16, Q8_0, Q4_0)",
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

Result<std::vector<float>> WeightBinder::vector(const std::string& hf_name, int64_t len, const char* why) {
  LARDER_ASSIGN_OR_RETURN(const formats::TensorInfo* t, find(hf_name));
  if (t->rank() != 1 || t->dim(0) != len) {
    return invalid_argument(strfmt("[model] %s: tensor '%s' has shape %s, expected [%lld] (%s)", file_of(*t).c_str(),
                                   t->name.c_str(), t->shape_str().c_str(), (long long)len, why));
  }
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

std::string WeightBinder::weight_dtypes() const {
  std::string s;
  for (const auto& d : dtypes_) s += (s.empty() ? "" : "+") + d;
  return s;
}

}  // namespace larder::models
