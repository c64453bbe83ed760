// kv_dtype_flag.h — the KV cache type flags of every verb that runs a model (serve, generate,
// chat, bench, eval): --kv-dtype f32|f16|q8_0 (default f16, llama.cpp's default cache type),
// and llama.cpp's -ctk/--cache-type-k, -ctv/--cache-type-v as aliases. larder keeps K and V in
// one dtype, so -ctk and -ctv must agree (with each other and with --kv-dtype when both given).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "larder/core/dtype.h"
#include "larder/core/status.h"

namespace larder::cli {

struct KvDtypeFlags {
  std::string kv;        // --kv-dtype
  std::string ctk, ctv;  // --cache-type-k / --cache-type-v (llama.cpp)
};

void add_kv_dtype_flags(CLI::App* cmd, KvDtypeFlags& f);

// The dtype the flags ask for (f16 when none is given); invalid_argument naming the flags when
// they are unknown or disagree.
Result<DType> kv_dtype_of(const KvDtypeFlags& f);

}  // namespace larder::cli
