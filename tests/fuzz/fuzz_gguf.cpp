// fuzz_gguf — the GGUF reader (formats/gguf.cpp: header, metadata key/values, tensor infos, data
// ranges) and the GGUF vocabulary reader on top of it (Tokenizer::from_gguf). The file is read
// with MapMode::kCopy, so every tensor's bytes live on the heap where AddressSanitizer sees a
// range that reaches past the file.
#include "fuzz_util.h"
#include "larder/formats/gguf.h"
#include "larder/tokenizer/tokenizer.h"

using namespace larder;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool init = (fuzz::quiet(), true);
  (void)init;
  const std::string& path = fuzz::write_scratch("gguf", data, size);
  auto f = formats::GgufFile::open(path, MapMode::kCopy);
  if (!f.is_ok()) return 0;
  const formats::GgufFile& g = **f;
  size_t sum = 0;
  for (const auto& [key, v] : g.metadata()) sum += key.size() + v.array_size() + v.s.size();
  (void)g.architecture();
  (void)g.get_int("general.alignment");
  (void)g.get_float("llama.rope.freq_base");
  (void)g.get_string("tokenizer.ggml.model");
  for (const auto& t : g.tensors().tensors()) {
    fuzz::check_tensor(t);
    (void)t.numel();
    (void)t.shape_str();
    if (t.nbytes > 0) sum += t.data[0] + t.data[t.nbytes - 1];  // the claimed range must be readable
  }
  auto tok = tokenizer::Tokenizer::from_gguf(g);
  if (tok.is_ok()) {
    const auto ids = (*tok)->encode("Hello world, <s> 123 héllo", true);
    sum += (*tok)->decode(ids).size();
    for (int32_t id = 0; id < std::min<int32_t>((*tok)->vocab_size(), 64); ++id) sum += (*tok)->token_bytes(id).size();
  }
  volatile size_t sink = sum;
  (void)sink;
  return 0;
}
