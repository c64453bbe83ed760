// larder pull REPO[:FILE|QUANT] [--revision R] [--list]: download a model from the Hugging Face
// Hub into the shared hub cache (src/larder/hub/pull.h).
#include <unistd.h>

#include <csignal>
#include <cstdio>

#include "larder/core/progress.h"
#include "larder/hub/pull.h"
#include "verbs.h"

namespace larder::cli {

VerbMain add_pull(CLI::App& app) {
  auto opts = std::make_shared<hub::PullOptions>();
  CLI::App* cmd = app.add_subcommand(
      "pull", "download a model from the Hugging Face Hub into the local Hugging Face cache (HF_HUB_CACHE)");
  cmd->add_option("repo", opts->spec,
                  "ORG/NAME, ORG/NAME:QUANT (a GGUF quantization such as Q4_K_M) or ORG/NAME:FILE")
      ->required();
  cmd->add_option("--revision", opts->revision, "branch, tag or commit (default main)");
  cmd->add_flag("--list", opts->list_only, "list the repository's files and GGUF quantizations, download nothing");
  return [opts]() {
    // A file-size limit (ulimit -f) must be a clean "disk full" error, not a SIGXFSZ kill.
    std::signal(SIGXFSZ, SIG_IGN);
    opts->interactive = isatty(0) && isatty(2);
    auto r = hub::pull_model(*opts);
    if (!r) return report(r.status());
    if (opts->list_only) return 0;
    std::fprintf(stderr, "%s @ %s: %zu file(s), %s downloaded, %s already cached\n", r->repo_id.c_str(),
                 r->commit.substr(0, 12).c_str(), r->files.size(),
                 Progress::format_bytes(static_cast<double>(r->downloaded_bytes)).c_str(),
                 Progress::format_bytes(static_cast<double>(r->reused_bytes)).c_str());
    std::printf("%s\n", r->model_path.c_str());
    return 0;
  };
}

}  // namespace larder::cli
