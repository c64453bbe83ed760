#include "larder/formats/tensor.h"

namespace larder::formats {

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

const TensorInfo* TensorSet::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

uint64_t TensorSet::total_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors_) n += t.nbytes;
  return n;
}

Status TensorSet::add(TensorInfo t) {
  if (index_.count(t.name)) {
    return corrupt(strfmt("[tensors] %s: duplicate tensor name '%s'", t.file ? t.file->c_str() : "?",
                          t.name.c_str()));
  }
  index_.emplace(t.name, tensors_.size());
  tensors_.push_back(std::move(t));
  return Status::ok();
}

const std::string* TensorSet::intern_path(const std::string& path) {
  paths_.push_back(std::make_unique<std::string>(path));
  return paths_.back().get();
}

}  // namespace larder::formats
