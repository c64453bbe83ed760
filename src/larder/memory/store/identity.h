// identity.h — content-derived ids of the KV store (kv-store.md §9, §11.4, §11.7).
//
// Every id is a fixed function of content with fixed algorithms (XXH3, seed 0) and no
// per-process state, so the same inputs name the same files on any machine and after any
// restart (LMCache #1175: nondeterministic keys made its disk tier useless after restart).
// Names are never keys: an adapter re-mounted with changed weights under the same name gets a
// new namespace (llama.cpp #26207, vLLM #30931 cross-adapter contamination).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "larder/core/status.h"

namespace larder::memory {

// Bump when any recipe below changes: old directories then become foreign and are left alone.
inline constexpr uint32_t kIdentityRecipeVersion = 1;

// What a stored entry must match to seed a prefill (§9). The chat template is deliberately
// absent: tokens are the key, so a template change only shortens the matched prefix.
struct StoreIdentity {
  std::string weights_id;    // weights_fingerprint()
  std::string config_fp;     // every graph-shaping config.json field
  std::string kv_scheme;     // KV dtype, layer kinds and layout (the storage signature)
  std::string tokenizer_fp;  // tokenizer.json + special-token config
  std::string numerics_id;   // backend, ISA tier, kernel numerics version
  std::string model_label;   // human-readable only; not part of identity_id
};

// 32 lowercase hex digits of XXH3-128 over the recipe version and every identity field.
std::string identity_id(const StoreIdentity& id);

struct AdapterRef {
  std::string content_hash;  // models::LoraAdapter::content_hash() (runtime::lora_namespace fills these)
  double scale = 1.0;
};
// "base" when there is no adapter and no salt; else 32 hex digits (§11.4).
std::string namespace_id(const std::vector<AdapterRef>& adapters, std::string_view cache_salt = {});

// entry-id = XXH3-128(ns ‖ u32 LE tokens) as 32 hex digits (§11.7).
std::string entry_id(std::string_view ns, std::span<const int32_t> tokens);

// Content hash of a set of files, read in full (adapters: weights + config are small).
Result<std::string> content_hash(const std::vector<std::string>& paths);
// Weights id without reading multi-GB files (§11.4): per file its size, the first MiB (the
// safetensors/GGUF header) and 64 KiB samples at 16 evenly spaced offsets. Headers alone are
// not enough: a fine-tune shares its base's header, the samples tell them apart.
Result<std::string> weights_fingerprint(const std::vector<std::string>& paths);

// Hex helpers.
std::string hex64(uint64_t v);
std::string hex128(uint64_t high, uint64_t low);

}  // namespace larder::memory
