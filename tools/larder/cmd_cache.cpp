// larder cache ls|inspect|verify|clear DIR — offline inspection of an SSD KV cache directory
// (no model is loaded; headers are read with the same validating reader the server uses).
#include <cstdio>

#include "larder/memory/store/cache_admin.h"
#include "verbs.h"

namespace larder::cli {

VerbMain add_cache(CLI::App& app) {
  struct Opts {
    std::string path;
    std::string identity;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("cache", "inspect or clear an SSD KV cache directory");
  cmd->require_subcommand(1);
  CLI::App* ls = cmd->add_subcommand("ls", "list cached prefixes (headers only)");
  CLI::App* inspect = cmd->add_subcommand("inspect", "print one cache file's header as JSON");
  CLI::App* verify = cmd->add_subcommand("verify", "verify every checksum of a file or directory");
  CLI::App* clear = cmd->add_subcommand(
      "clear", "remove the cache's LKV1 files (a folder that is not a larder cache is refused; links are never followed)");
  for (CLI::App* sub : {ls, inspect, verify, clear}) sub->add_option("path", o->path, "cache directory or file")->required();
  ls->add_flag("--json", o->json, "one JSON object per file");
  clear->add_option("--identity", o->identity, "only this model identity's files");
  return [o, ls, inspect, verify, clear]() {
    if (ls->parsed()) {
      auto files = memory::cache_ls(o->path);
      if (!files.is_ok()) return report(files.status());
      if (!o->json) std::printf("%-10s %10s %12s  %-8s %s\n", "ns", "tokens", "bytes", "status", "file");
      for (const auto& f : *files) {
        if (o->json) {
          nlohmann::json j = {{"path", f.path},       {"identity", f.identity_id}, {"model", f.model_label},
                              {"ns", f.ns},           {"tokens", f.n_tokens},      {"bytes", f.file_bytes},
                              {"label", f.label},     {"trimmable", f.trimmable},  {"temp", f.temp},
                              {"status", f.status.is_ok() ? "ok" : f.status.message()}};
          std::printf("%s\n", j.dump().c_str());
        } else {
          std::printf("%-10.10s %10lld %12llu  %-8s %s\n", f.ns.c_str(), static_cast<long long>(f.n_tokens),
                      static_cast<unsigned long long>(f.file_bytes),
                      f.temp ? "partial" : (f.status.is_ok() ? "ok" : "bad"), f.path.c_str());
        }
      }
      return 0;
    }
    if (inspect->parsed()) {
      auto j = memory::cache_inspect(o->path);
      if (!j.is_ok()) return report(j.status());
      std::printf("%s\n", j->dump(2).c_str());
      return 0;
    }
    if (verify->parsed()) {
      auto reports = memory::cache_verify(o->path);
      if (!reports.is_ok()) return report(reports.status());
      int bad = 0;
      for (const auto& r : *reports) {
        if (!r.status.is_ok()) ++bad;
        std::printf("%-4s %s  (%.1f MiB in %.1f ms)%s%s\n", r.status.is_ok() ? "ok" : "BAD", r.path.c_str(),
                    r.bytes / 1048576.0, r.seconds * 1e3, r.status.is_ok() ? "" : ": ",
                    r.status.is_ok() ? "" : r.status.message().c_str());
      }
      return bad ? 1 : 0;
    }
    if (clear->parsed()) {
      auto r = memory::cache_clear(o->path, o->identity.empty() ? std::nullopt : std::optional<std::string>(o->identity));
      if (!r.is_ok()) return report(r.status());
      std::printf("removed %zu files (%.1f MiB) and %zu empty cache folders\n", r->files_removed,
                  r->bytes_removed / 1048576.0, r->dirs_removed);
      if (!r->kept.empty()) std::printf("kept %zu entries that are not this cache's own files:\n", r->kept.size());
      for (const auto& k : r->kept) std::printf("  %s\n", k.c_str());
      for (const auto& e : r->errors) std::fprintf(stderr, "larder: %s\n", e.c_str());
      return r->errors.empty() ? 0 : 1;
    }
    return 2;
  };
}

}  // namespace larder::cli
