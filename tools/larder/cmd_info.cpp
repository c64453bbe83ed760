// larder info MODEL: architecture, sizes, dtypes, vocabulary, context, template presence.
#include <cstdio>
#include <map>

#include "larder/runtime/loaded_model.h"
#include "verbs.h"

namespace larder::cli {

VerbMain add_info(CLI::App& app) {
  auto model = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("info", "describe a model: architecture, sizes, dtypes, vocab, context");
  cmd->add_option("model", *model, "model directory or .gguf file")->required();
  return [model]() {
    auto lm = runtime::load_model(*model);
    if (!lm.is_ok()) return report(lm.status());
    const auto& m = **lm;
    const auto& i = m.model->info();
    std::map<std::string, uint64_t> bytes_by_dtype;
    for (const auto& t : m.files.tensors().tensors()) bytes_by_dtype[dtype_name(t.dtype)] += t.nbytes;
    std::printf("model:          %s (%s)\n", m.files.path.c_str(),
                m.files.source == formats::ModelSource::kGguf ? "GGUF" : "Hugging Face directory");
    std::printf("architecture:   %s\n", i.architecture.c_str());
    std::printf("parameters:     %lld (%.2f M)\n", static_cast<long long>(i.n_params), i.n_params / 1e6);
    std::printf("layers:         %lld\n", static_cast<long long>(i.n_layers));
    std::printf("hidden:         %lld\n", static_cast<long long>(i.hidden));
    std::printf("heads:          %lld (kv %lld, head_dim %lld)\n", static_cast<long long>(i.n_heads),
                static_cast<long long>(i.n_kv_heads), static_cast<long long>(i.head_dim));
    std::printf("ffn:            %lld\n", static_cast<long long>(i.ffn));
    std::printf("vocab:          %lld (tokenizer %d)\n", static_cast<long long>(i.vocab), m.tokenizer->vocab_size());
    std::printf("context:        %lld\n", static_cast<long long>(i.max_context));
    std::printf("rope theta:     %g\n", i.rope_theta);
    std::printf("tied embedding: %s\n", i.tied_embeddings ? "yes" : "no");
    std::printf("tensors:        %zu, %.2f MiB\n", m.files.tensors().size(), m.files.tensors().total_bytes() / 1048576.0);
    for (const auto& [dt, b] : bytes_by_dtype) std::printf("  %-6s        %.2f MiB\n", dt.c_str(), b / 1048576.0);
    std::printf("chat template:  %s\n", m.chat_template ? "present" : "none");
    std::string eos;
    for (int32_t id : m.defaults.eos_ids) eos += (eos.empty() ? "" : ", ") + std::to_string(id);
    std::printf("eos ids:        [%s]\n", eos.c_str());
    std::printf("load time:      %.1f ms\n", m.load_seconds * 1e3);
    return 0;
  };
}

}  // namespace larder::cli
