// rotate_tool — runs quant::rotate_checkpoint for tests/quant/rotate_test.py (the mlx-lm check),
// until `larder quantize --rotate` exposes the fold on the CLI.
//   rotate_tool SRC DST [--seed N] [--no-r1] [--no-r2] [--dtype f32|bf16|f16]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "larder/quant/rotate.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: rotate_tool SRC DST [--seed N] [--no-r1] [--no-r2] [--dtype f32|bf16|f16]\n");
    return 2;
  }
  larder::quant::RotateOptions o;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seed" && i + 1 < argc) {
      o.seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--no-r1") {
      o.r1 = false;
    } else if (a == "--no-r2") {
      o.r2 = false;
    } else if (a == "--dtype" && i + 1 < argc) {
      const std::string d = argv[++i];
      o.out_dtype = d == "f32" ? larder::DType::kF32 : d == "bf16" ? larder::DType::kBF16 : larder::DType::kF16;
    } else {
      std::fprintf(stderr, "rotate_tool: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  auto r = larder::quant::rotate_checkpoint(argv[1], argv[2], o);
  if (!r.is_ok()) {
    std::fprintf(stderr, "%s\n", r.status().message().c_str());
    return 1;
  }
  std::printf("r1 %s r2 %s untied %d\n", r.value().r1_construction.c_str(), r.value().r2_construction.c_str(),
              r.value().untied ? 1 : 0);
  return 0;
}
