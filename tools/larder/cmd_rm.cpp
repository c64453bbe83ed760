// larder rm ORG/NAME...: remove models from the Hugging Face cache (the whole repo entry: blobs,
// snapshots, refs), refusing while a download of it is in progress.
#include <cstdio>

#include "larder/core/progress.h"
#include "larder/hub/hf_cache.h"
#include "larder/runtime/model_locator.h"
#include "verbs.h"

namespace larder::cli {

VerbMain add_rm(CLI::App& app) {
  auto repos = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand("rm", "remove models from the Hugging Face cache");
  cmd->add_option("repos", *repos, "ORG/NAME (the whole cached repository)")
      ->required();
  return [repos]() {
    const std::string hub = runtime::hf_hub_cache_dir();
    int rc = 0;
    for (std::string r : *repos) {
      if (r.find(':') != std::string::npos) {
        rc = report(invalid_argument(strfmt("[rm] %s: rm removes whole repositories; name it as ORG/NAME", r.c_str())));
        continue;
      }
      auto freed = hub::remove_cached_repo(hub, r);
      if (!freed) {
        rc = report(freed.status());
        continue;
      }
      std::printf("removed %s (%s freed)\n", r.c_str(), Progress::format_bytes(static_cast<double>(*freed)).c_str());
    }
    return rc;
  };
}

}  // namespace larder::cli
