// larder ls [PATH...]: the models on this machine — the Hugging Face cache (whoever downloaded
// them) and GGUF files / model directories under PATHs — with what larder knows about them.
#include <cstdio>

#include "larder/core/progress.h"
#include "larder/hub/local_models.h"
#include "larder/runtime/model_locator.h"
#include "verbs.h"

namespace larder::cli {

VerbMain add_ls(CLI::App& app) {
  auto paths = std::make_shared<std::vector<std::string>>();
  auto paths_only = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("ls", "list local models: the Hugging Face cache and GGUF files / model dirs under PATHs");
  cmd->add_option("paths", *paths, "extra .gguf files, model directories, or directories holding them");
  cmd->add_flag("--paths", *paths_only, "also print the path larder loads for each model");
  return [paths, paths_only]() {
    const std::string hub = runtime::hf_hub_cache_dir();
    const auto models = hub::list_local_models(hub, *paths);
    if (models.empty()) {
      std::fprintf(stderr, "no models in %s%s; get one with `larder pull ORG/NAME`\n", hub.c_str(),
                   paths->empty() ? "" : " or the given paths");
      return 0;
    }
    size_t w = 5;
    for (const auto& m : models) w = std::max(w, m.name.size());
    std::printf("%-*s  %-10s  %-16s  %10s  %s\n", static_cast<int>(w), "MODEL", "ARCH", "QUANT", "SIZE", "RUNS");
    for (const auto& m : models) {
      std::string runs = m.runnable ? "yes" : "no: " + m.why_not;
      if (runs.size() > 160) runs = runs.substr(0, 157) + "...";
      std::printf("%-*s  %-10s  %-16s  %10s  %s\n", static_cast<int>(w), m.name.c_str(),
                  m.architecture.empty() ? "?" : m.architecture.c_str(), m.quant.empty() ? "?" : m.quant.c_str(),
                  Progress::format_bytes(static_cast<double>(m.size_bytes)).c_str(), runs.c_str());
      if (*paths_only) std::printf("%*s  %s\n", static_cast<int>(w), "", m.path.c_str());
    }
    return 0;
  };
}

}  // namespace larder::cli
