#include "kv_dtype_flag.h"

#include "larder/memory/kv_cache.h"

namespace larder::cli {

void add_kv_dtype_flags(CLI::App* cmd, KvDtypeFlags& f) {
  cmd->add_option("--kv-dtype", f.kv,
                  "KV cache type: f16 (default; half the memory and bandwidth of f32), f32 (exact), q8_0")
      ->check(CLI::IsMember({"f32", "f16", "q8_0"}))
      ->default_str("f16");  // shown, not set: -ctk/-ctv alone must not be checked against it
  cmd->add_option("--cache-type-k,--ctk", f.ctk, "llama.cpp's K cache type (same as --kv-dtype; K and V must agree)");
  cmd->add_option("--cache-type-v,--ctv", f.ctv, "llama.cpp's V cache type (same as --kv-dtype; K and V must agree)");
}

Result<DType> kv_dtype_of(const KvDtypeFlags& f) {
  std::string want = f.kv;
  for (const auto& [flag, v] : {std::pair<const char*, const std::string&>{"--cache-type-k", f.ctk},
                                std::pair<const char*, const std::string&>{"--cache-type-v", f.ctv}}) {
    if (v.empty()) continue;
    if (!memory::parse_kv_dtype(v).is_ok())
      return invalid_argument(strfmt("[cli] %s %s: larder's KV cache types are f32, f16 and q8_0", flag, v.c_str()));
    if (!want.empty() && v != want)
      return invalid_argument(strfmt("[cli] %s %s disagrees with %s: larder stores K and V in one type; give the "
                                     "same type to both (or use --kv-dtype)",
                                     flag, v.c_str(), want.c_str()));
    want = v;
  }
  return memory::parse_kv_dtype(want.empty() ? "f16" : want);
}

}  // namespace larder::cli
