// lkv_format.h — the LKV1 file format of the SSD tier (kv-store.md §7.2–§7.4, §11.1).
// Byte layout and field list: docs/kv-store-format.md.
//
// A file holds one self-contained entry: a fixed 48-byte prefix, a JSON header padded to the
// data offset, a token section, then every tensor at a multiple of `align` (4096) so a restore
// can alias it through mmap with no copy. Checksums are XXH3-64, written as 16 lowercase hex
// digits, so the header length is fixed before any tensor is hashed (the header is written
// last, at offset 0, with the real checksums in place of same-width placeholders).
//
// Writers publish by temp file + fdatasync + rename + directory fsync; published files are
// never modified in place, so a mapping of one can never see its bytes change (no SIGBUS from
// our own truncation).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "larder/core/status.h"
#include "larder/memory/store/entry.h"
#include "larder/memory/store/identity.h"

namespace larder::memory {

inline constexpr char kLkvMagic[8] = {'L', 'A', 'R', 'D', 'K', 'V', '1', '\n'};
inline constexpr uint32_t kLkvVersion = 1;
inline constexpr uint64_t kLkvAlign = 4096;
// Upper bound on a header: a corrupt length field must not make us allocate gigabytes.
inline constexpr uint32_t kLkvMaxHeader = 64u << 20;

// Bytes 0..47, little-endian.
struct LkvPrefix {
  char magic[8];
  uint32_t version;
  uint32_t header_len;   // JSON bytes (excluding padding)
  uint64_t data_offset;  // multiple of align; first byte of the token section
  uint64_t file_size;    // declared total size: truncation check without reading tensors
  uint64_t header_xxh3;  // XXH3-64 of the JSON header bytes
  uint64_t prefix_xxh3;  // XXH3-64 of bytes 0..39
};
static_assert(sizeof(LkvPrefix) == 48, "LKV1 prefix is 48 bytes");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "LKV1 is little-endian on disk");

// The I/O the writer uses, injectable for fault tests (EIO, ENOSPC, short writes). Every call
// returns 0 / a byte count, or -errno.
class IoLayer {
 public:
  virtual ~IoLayer() = default;
  virtual int open(const char* path, int flags, mode_t mode);
  virtual ssize_t pwrite(int fd, const void* buf, size_t n, off_t off);
  virtual int ftruncate(int fd, off_t size);
  virtual int fdatasync(int fd);
  virtual int close(int fd);
  virtual int rename(const char* from, const char* to);
  virtual int fsync_dir(const char* dir);
  virtual int unlink(const char* path);
};
IoLayer& posix_io();

// Why a write failed; one warning per class per process (§7.3 step 6).
enum class WriteFailure { kNone, kOpen, kWrite, kNoSpace, kSync, kRename, kDrift };
const char* write_failure_name(WriteFailure f);

// Writes `e` as `final_path` via `final_path + ".tmp"` (§7.3). On failure the temp file is
// removed and *failure names the class.
Status write_lkv(const std::string& final_path, const Entry& e, const StoreIdentity& identity,
                 IoLayer& io, WriteFailure* failure = nullptr);

// Parsed prefix + header + token list (no tensor bytes touched): what the startup scan and
// `cache ls` need (§7.5).
struct LkvInfo {
  LkvPrefix prefix{};
  nlohmann::json header;
  std::vector<TokenId> tokens;
  std::string ns;
  std::string identity_id;  // recomputed from the header identity
  uint64_t file_bytes = 0;       // st_size
  uint64_t allocated_bytes = 0;  // st_blocks * 512 (what the SSD cap counts, §11.5)
  int64_t mtime_ns = 0;
};
// The key of a file (namespace and token list), known once its token section has verified.
struct LkvKey {
  std::string ns;
  std::vector<TokenId> tokens;
};
// corrupt: bad magic/checksum/size/JSON; incompatible: version or (when expected != null)
// identity mismatch; io_error: unreadable. `key`, when given, receives the file's key whenever
// its token section verified — also for a file refused for its size, so that a miss can name
// the file the startup scan removed instead of reading as a plain divergence.
Result<LkvInfo> read_lkv_info(const std::string& path, const StoreIdentity* expected, LkvKey* key = nullptr);
// The same for the entry `name` of the directory `dirfd` (`path` names it in messages); with
// follow = false a symbolic link is never opened (the scan: nothing outside the cache is read).
Result<LkvInfo> read_lkv_info_at(int dirfd, const std::string& name, const std::string& path,
                                 const StoreIdentity* expected, LkvKey* key, bool follow);

enum class VerifyPolicy { kFull, kSampled, kOff };
enum class RestoreMode { kMmap, kCopy };

// Restores the whole entry (§7.4). kMmap: plain-KV rows and attachments alias a read-only
// MAP_PRIVATE mapping (pages fault in lazily); ring and recurrent states are copied (small,
// mutated in place). kCopy: everything is read into heap memory. kSampled verifies the token
// section, every non-KV tensor and every 8th KV tensor (rotating start); kFull verifies all.
Result<std::shared_ptr<const Entry>> read_lkv(const std::string& path, const StoreIdentity* expected,
                                              VerifyPolicy verify, RestoreMode mode);

// In-memory LKV1, the values of the remote tier (memory/store/remote_tier.h): the exact bytes
// write_lkv would publish, and a reader with every check of read_lkv (copy mode: nothing the
// result holds aliases `bytes`). `what` names the value in error messages.
Result<std::string> encode_lkv(const Entry& e, const StoreIdentity& identity);
Result<std::shared_ptr<const Entry>> decode_lkv(std::string_view bytes, const StoreIdentity* expected,
                                                VerifyPolicy verify, const std::string& what);

// Verifies every checksum of a file (offline `cache verify`; identity not checked).
Status verify_lkv(const std::string& path);

}  // namespace larder::memory
