// larder info MODEL: architecture, sizes, dtypes, vocabulary, context, the chat template's origin.
#include <cstdio>
#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "larder/runtime/fit.h"
#include "larder/runtime/loaded_model.h"
#include "kv_dtype_flag.h"
#include "larder/memory/kv_cache.h"
#include "model_arg.h"
#include "validators.h"
#include "verbs.h"

namespace larder::cli {

VerbMain add_info(CLI::App& app) {
  auto model = std::make_shared<ModelArg>();
  struct FitFlags {
    int64_t ctx = 0, parallel = 1;
    double prompt_cache_gb = 0;
    bool json = false;
    KvDtypeFlags kv;
  };
  auto ff = std::make_shared<FitFlags>();
  auto tpl = std::make_shared<runtime::ChatTemplateFlags>();
  CLI::App* cmd = app.add_subcommand("info", "describe a model: architecture, sizes, dtypes, vocab, context, memory estimate");
  add_model_arg(cmd, *model, "");
  cmd->add_option("-c,--ctx,--ctx-size", ff->ctx,
                  "context tokens per sequence for the memory estimate (0 = 4096, capped at the model's)")
      ->check(at_least(0));
  cmd->add_option("--parallel,--np", ff->parallel, "sequences held at once for the memory estimate")->check(positive());
  cmd->add_option("--prompt-cache", ff->prompt_cache_gb, "RAM KV cache cap in GiB to include")->check(at_least(0));
  cmd->add_flag("--json", ff->json, "print the memory estimate as JSON only");
  add_kv_dtype_flags(cmd, ff->kv);
  add_chat_template_flags(cmd, tpl.get());
  return [model, ff, tpl]() {
    auto located = resolve_model(*model);
    if (!located.is_ok()) return report(located.status());
    runtime::LoadOptions lo;
    lo.chat_template = *tpl;
    lo.map_mode = map_mode(*model);
    auto kv_dtype = kv_dtype_of(ff->kv);
    if (!kv_dtype.is_ok()) return report(kv_dtype.status());
    lo.kv_dtype = *kv_dtype;
    auto lm = runtime::load_model(located->path, lo);
    if (!lm.is_ok()) return report(lm.status());
    const auto& m = **lm;
    const auto& i = m.model->info();
    runtime::FitRequest fr;
    fr.ctx = std::min<int64_t>(ff->ctx > 0 ? ff->ctx : 4096, i.max_context);
    fr.parallel = ff->parallel;
    fr.kv_store_ram_cap = static_cast<uint64_t>(ff->prompt_cache_gb * (1ull << 30));
    const auto est = runtime::estimate_fit(*m.model, m.files.tensors().total_bytes(), fr);
    const auto avail = runtime::available_memory();
    if (ff->json) {
      const auto v = runtime::check_fit(est, fr, avail);
      nlohmann::json j = {{"ctx", fr.ctx},          {"parallel", fr.parallel},     {"weights", est.weights},
                          {"expert_bytes", est.expert_bytes}, {"weights_per_token", est.weights_per_token},
                          {"kv", est.kv},           {"kv_per_token", est.kv_per_token}, {"kv_fixed", est.kv_fixed}, {"kv_dtype", memory::kv_dtype_tag(est.kv_dtype)}, {"scratch", est.scratch},
                          {"runtime", est.runtime}, {"total", est.total()},        {"prompt_cache", est.kv_store_cap},
                          {"available", avail.bytes}, {"available_source", avail.source},
                          {"fits", v.status.is_ok()}, {"message", v.status.message()}};
      std::printf("%s\n", j.dump(2).c_str());
      return 0;
    }
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
    if (i.n_experts > 0) {
      int64_t routed = 0, expert_ffn = 0;
      for (const auto& l : m.model->layers())
        if (l.ffn == models::FfnKind::kRoutedExperts) ++routed, expert_ffn = l.experts.ffn;
      std::printf("experts:        %lld per layer, %lld per token, ffn %lld (%lld of %lld layers routed)\n",
                  static_cast<long long>(i.n_experts), static_cast<long long>(i.n_experts_used),
                  static_cast<long long>(expert_ffn), static_cast<long long>(routed), static_cast<long long>(i.n_layers));
    }
    std::printf("vocab:          %lld (tokenizer %d)\n", static_cast<long long>(i.vocab), m.tokenizer->vocab_size());
    std::printf("context:        %lld\n", static_cast<long long>(i.max_context));
    std::printf("rope theta:     %g\n", i.rope_theta);
    std::printf("tied embedding: %s\n", i.tied_embeddings ? "yes" : "no");
    std::printf("tensors:        %zu, %.2f MiB\n", m.files.tensors().size(), m.files.tensors().total_bytes() / 1048576.0);
    for (const auto& [dt, b] : bytes_by_dtype) std::printf("  %-6s        %.2f MiB\n", dt.c_str(), b / 1048576.0);
    std::printf("chat template:  %s\n", m.template_choice.describe().c_str());
    std::string eos;
    for (int32_t id : m.defaults.eos_ids) eos += (eos.empty() ? "" : ", ") + std::to_string(id);
    std::printf("eos ids:        [%s]\n", eos.c_str());
    std::printf("load time:      %.1f ms\n", m.load_seconds * 1e3);
    std::printf("%s", runtime::describe_fit(est, fr, avail).c_str());
    return 0;
  };
}

}  // namespace larder::cli
