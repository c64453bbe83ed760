// fuzz_safetensors — the safetensors reader (formats/safetensors.cpp: the u64 header length, the
// JSON header, dtypes, shapes, data_offsets, overlaps, __metadata__). Read with MapMode::kCopy so
// the tensor bytes are on the heap, where AddressSanitizer sees a range that leaves the file.
#include <map>

#include "fuzz_util.h"
#include "larder/formats/safetensors.h"

using namespace larder;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool init = (fuzz::quiet(), true);
  (void)init;
  const std::string& path = fuzz::write_scratch("safetensors", data, size);
  formats::TensorSet set;
  std::map<std::string, std::string> meta;
  if (!formats::read_safetensors(path, &set, &meta, MapMode::kCopy).is_ok()) return 0;
  size_t sum = meta.size();
  for (const auto& t : set.tensors()) {
    fuzz::check_tensor(t);
    (void)t.numel();
    if (t.nbytes > 0) sum += t.data[0] + t.data[t.nbytes - 1];
  }
  volatile size_t sink = sum;
  (void)sink;
  return 0;
}
