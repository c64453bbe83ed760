// fuzz_lkv — the LKV1 cache-file reader of the SSD tier (memory/store/lkv_format.cpp; byte layout
// in docs/kv-store-format.md): the 48-byte prefix, the JSON header, the token section, the tensor
// table and the restore of every layer state (read_lkv, verified in full) — what the startup
// scan, a restore and `larder cache inspect/verify` run on files found on disk.
//
// Every part of a file is checksummed (XXH3), so a mutated file mostly stops at the first
// checksum. Input byte 0 therefore picks how the rest becomes a file:
//   0  as is (the checksum checks themselves);
//   1  as is, with the prefix and header checksums (bytes 32..47) recomputed: reaches the JSON;
//   2  structured: header JSON, a NUL, then the data section. The harness lays the file out as
//      the writer does (prefix, header, zero padding to the next 4096, data) and recomputes every
//      checksum, the "xxh3" of each {"off", "bytes", "xxh3"} object included — so mutations reach
//      the header's meaning and the restore of the tensors.
// The seeds (make_seeds.py) are real files written by `larder generate --ssd-cache`, in all modes.
#include <xxhash.h>

#include <cstring>

#include "fuzz_util.h"
#include "larder/memory/store/lkv_format.h"

using namespace larder;
using nlohmann::json;

namespace {

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof(b), "%016llx", static_cast<unsigned long long>(v));
  return b;
}

void fix_prefix(std::string& f, uint32_t header_len) {
  memory::LkvPrefix p;
  std::memcpy(&p, f.data(), sizeof(p));
  const size_t hl = std::min<size_t>(header_len, f.size() - sizeof(p));
  p.header_xxh3 = XXH3_64bits(f.data() + sizeof(p), hl);
  p.prefix_xxh3 = XXH3_64bits(&p, 40);
  std::memcpy(f.data(), &p, sizeof(p));
}

// Every {"off", "bytes", "xxh3"} object: the checksum of that range of `f` (16 hex digits either
// way, so the header keeps its length).
void fix_ranges(json& j, const std::string& f, bool compute) {
  if (j.is_object()) {
    if (j.contains("xxh3") && j.contains("off") && j.contains("bytes") && j["off"].is_number_unsigned() &&
        j["bytes"].is_number_unsigned()) {
      const uint64_t off = j["off"].get<uint64_t>(), n = j["bytes"].get<uint64_t>();
      j["xxh3"] = compute && off <= f.size() && n <= f.size() - off ? hex64(XXH3_64bits(f.data() + off, n))
                                                                   : std::string(16, '0');
    }
    for (auto& [k, v] : j.items()) fix_ranges(v, f, compute);
  } else if (j.is_array()) {
    for (auto& v : j) fix_ranges(v, f, compute);
  }
}

std::string structured(const uint8_t* data, size_t size) {
  const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t hlen = nul ? static_cast<size_t>(nul - data) : size;
  const std::string payload = nul ? std::string(reinterpret_cast<const char*>(nul + 1), size - hlen - 1) : "";
  json h = json::parse(data, data + hlen, nullptr, false);
  std::string text(reinterpret_cast<const char*>(data), hlen);
  if (!h.is_discarded()) {
    fix_ranges(h, {}, false);
    text = h.dump();
  }
  const uint64_t data_off = (sizeof(memory::LkvPrefix) + text.size() + memory::kLkvAlign - 1) / memory::kLkvAlign * memory::kLkvAlign;
  std::string f(data_off, '\0');
  f += payload;
  memory::LkvPrefix p{};
  std::memcpy(p.magic, memory::kLkvMagic, sizeof(p.magic));
  p.version = memory::kLkvVersion;
  p.header_len = static_cast<uint32_t>(text.size());
  p.data_offset = data_off;
  p.file_size = f.size();
  std::memcpy(f.data(), &p, sizeof(p));
  if (!h.is_discarded()) {
    fix_ranges(h, f, true);
    text = h.dump();
  }
  std::memcpy(f.data() + sizeof(p), text.data(), text.size());
  fix_prefix(f, p.header_len);
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool init = (fuzz::quiet(), true);
  (void)init;
  if (size < 1) return 0;
  std::string file;
  switch (data[0] % 3) {
    case 0: file.assign(reinterpret_cast<const char*>(data + 1), size - 1); break;
    case 1:
      file.assign(reinterpret_cast<const char*>(data + 1), size - 1);
      if (file.size() >= sizeof(memory::LkvPrefix)) {
        uint32_t hl;
        std::memcpy(&hl, file.data() + 12, sizeof(hl));
        fix_prefix(file, hl);
      }
      break;
    default: file = structured(data + 1, size - 1); break;
  }
  const std::string& path = fuzz::write_scratch("lkv", reinterpret_cast<const uint8_t*>(file.data()), file.size());
  memory::LkvKey key;
  auto info = memory::read_lkv_info(path, nullptr, &key);
  size_t sum = key.tokens.size();
  if (info.is_ok()) sum += info->tokens.size() + info->ns.size() + info->header.dump().size();
  (void)memory::verify_lkv(path);
  const auto mode = (size & 1) ? memory::RestoreMode::kMmap : memory::RestoreMode::kCopy;
  auto entry = memory::read_lkv(path, nullptr, memory::VerifyPolicy::kFull, mode);
  if (entry.is_ok()) sum += (*entry)->tokens.size();
  volatile size_t sink = sum;
  (void)sink;
  return 0;
}
