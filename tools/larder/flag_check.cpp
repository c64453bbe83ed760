#include "flag_check.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>

#include "larder/core/status.h"

namespace larder::cli {

namespace {

// llama.cpp's single-dash long flags → the long name they are read as here (larder's own name
// where it has the flag, llama.cpp's long name otherwise, so that the hint table below answers).
const std::map<std::string, std::string>& single_dash_table() {
  static const std::map<std::string, std::string> t = {
      {"-hf", "--hf"},                 {"-hfr", "--hf-repo"},        {"-hff", "--hf-file"},
      {"-ngl", "--n-gpu-layers"},      {"-np", "--parallel"},        {"-sys", "--system"},
      {"-cnv", "--conversation"},      {"-no-cnv", "--no-conversation"}, {"-fa", "--flash-attn"},
      {"-ctk", "--cache-type-k"},      {"-ctv", "--cache-type-v"},   {"-tb", "--threads-batch"},
      {"-ub", "--ubatch-size"},        {"-cb", "--cont-batching"},   {"-nocb", "--no-cont-batching"},
      {"-nkvo", "--no-kv-offload"},    {"-ts", "--tensor-split"},    {"-sm", "--split-mode"},
      {"-mg", "--main-gpu"},           {"-dev", "--device"},         {"-ot", "--override-tensor"},
      {"-lv", "--verbosity"},          {"-mu", "--model-url"},       {"-to", "--timeout"},
      {"-st", "--single-turn"},        {"-sp", "--special"},         {"-mli", "--multiline-input"},
      {"-dt", "--defrag-thold"},       {"-ins", "--instruct"},       {"-cml", "--chatml"},
      {"-hft", "--hf-token"},          {"-kvu", "--kv-unified"},     {"-fit", "--fit"},
      {"-jf", "--json-schema-file"},   {"-md", "--model-draft"},
  };
  return t;
}

// Flags llama.cpp has and larder does not: what to do instead.
const std::map<std::string, std::string>& hint_table() {
  static const std::string cpu = "larder runs on the CPU: drop it";
  static const std::string chat = "for a conversation in the terminal use `larder chat MODEL`";
  static const std::string sampler =
      "this sampler is not implemented; larder samples with --temp, --top-k, --top-p, --min-p, --repeat-penalty, "
      "--presence-penalty, --frequency-penalty, --repeat-last-n, --logit-bias, --seed";
  // Flags `generate` and `chat` have and `serve` takes per request instead.
  static const std::string per_request_grammar =
      "`larder serve` takes the output constraint per request (the `grammar` and `json_schema` fields, "
      "response_format); --grammar, --grammar-file, --json-schema and --json-schema-file are flags of "
      "`larder generate` and `larder chat`";
  static const std::string rope = "larder reads the RoPE settings from the model's own config: drop it";
  static const std::string log = "set LARDER_LOG=debug (or warn, error) in the environment instead";
  static const std::string batch = "prefill is chunked by `larder serve --step-tokens N`";
  static const std::map<std::string, std::string> t = {
      {"--hf-file", "pick the file with -hf ORG/NAME:FILE.gguf (or ORG/NAME:QUANT)"},
      {"--hf-token", "`larder pull` reads the token from HF_TOKEN in the environment"},
      {"--model-url", "download the file and pass its path (`larder pull ORG/NAME[:QUANT]` fetches from the Hugging Face Hub)"},
      {"--conversation", chat},
      {"--interactive", chat},
      {"--interactive-first", chat},
      {"--instruct", chat},
      {"--chatml", chat},
      {"--multiline-input", chat},
      {"--single-turn", "use `larder generate --chat` for one answer"},
      {"--no-conversation", "`larder generate` is never interactive: drop it"},
      {"--flash-attn", "larder has no flash-attention switch (its attention kernels are always used): drop it"},
      {"--cache-type-k", "the KV cache type is set by --kv-dtype on serve, generate, chat, bench and eval"},
      {"--cache-type-v", "the KV cache type is set by --kv-dtype on serve, generate, chat, bench and eval"},
      {"--threads-batch", "larder uses one thread count for prefill and decode: -t/--threads"},
      {"--batch-size", batch},
      {"--ubatch-size", batch},
      {"--cont-batching", "continuous batching is always on in `larder serve` (--parallel N sequences)"},
      {"--no-cont-batching", "continuous batching is always on in `larder serve`; --parallel 1 serves one at a time"},
      {"--mlock", "larder maps the model file (mmap) and leaves paging to the kernel: drop it"},
      {"--no-kv-offload", cpu},
      {"--tensor-split", cpu},
      {"--split-mode", cpu},
      {"--main-gpu", cpu},
      {"--device", cpu},
      {"--override-tensor", cpu},
      {"--list-devices", cpu},
      {"--kv-unified", "the KV store is always shared by every sequence in larder: drop it"},
      {"--fit", cpu},
      {"--system-prompt", "use --system TEXT (with `larder generate --chat` or `larder chat`)"},
      {"--reverse-prompt", "use --stop STRING"},
      {"--in-prefix", chat},
      {"--in-suffix", chat},
      {"--grammar", per_request_grammar},
      {"--grammar-file", per_request_grammar},
      {"--json-schema", per_request_grammar},
      {"--json-schema-file", per_request_grammar},
      {"--logit-bias", "`larder serve` takes logit_bias per request; -l/--logit-bias is a flag of `larder generate` "
                       "and `larder chat`"},
      {"--lora", "LoRA adapters are not supported"},
      {"--lora-scaled", "LoRA adapters are not supported"},
      {"--control-vector", "control vectors are not supported"},
      {"--rope-scaling", rope},
      {"--rope-scale", rope},
      {"--rope-freq-base", rope},
      {"--rope-freq-scale", rope},
      {"--yarn-orig-ctx", rope},
      {"--verbose", log},
      {"--verbosity", log},
      {"--log-verbosity", log},
      {"--log-disable", log},
      {"--log-file", "larder logs to stderr; redirect it (2> FILE)"},
      {"--metrics", "`larder serve` always answers GET /metrics (Prometheus text): drop it"},
      {"--slots", "`larder serve` reports its sequences and KV store at GET /stats: drop it"},
      {"--slot-save-path", "use --ssd-cache DIR (the persistent KV cache)"},
      {"--cache-reuse", "prefix reuse is automatic in larder (the KV store); --prompt-cache sets its RAM in GiB"},
      {"--embedding", "embeddings are not supported"},
      {"--embeddings", "embeddings are not supported"},
      {"--reranking", "reranking is not supported"},
      {"--mirostat", sampler},
      {"--mirostat-lr", sampler},
      {"--mirostat-ent", sampler},
      {"--typical", sampler},
      {"--dynatemp-range", sampler},
      {"--xtc-probability", sampler},
      {"--dry-multiplier", sampler},
      {"--repeat-last-n", "`larder serve` takes the penalties' windows per request (repetition_context_size, "
                          "presence_context_size, frequency_context_size; 20 by default); --repeat-last-n is a flag "
                          "of `larder generate` and `larder chat`"},
      {"--numa", "larder needs no NUMA setting: drop it"},
      {"--no-warmup", "larder does not warm up: drop it"},
      {"--warmup", "larder does not warm up: drop it"},
      {"--special", "larder prints generated text without special tokens; no switch"},
      {"--escape", "larder takes the prompt as given: drop it"},
      {"--no-escape", "larder takes the prompt as given: drop it"},
      {"--color", "drop it"},
      {"--no-display-prompt", "larder prints only the continuation by default (--show-prompt to echo the prompt)"},
      {"--display-prompt", "use --show-prompt"},
      {"--reasoning-format", "larder separates reasoning by the model's template; no switch"},
      {"--reasoning-budget", "not supported"},
      {"--defrag-thold", "larder's KV cache needs no defragmentation: drop it"},
      {"--timeout", "no such setting in larder"},
      {"--path", "larder serves no static files"},
      {"--predict", "use -n/--n-predict (the same as --max-tokens)"},
      {"--keep", "larder does not shift the context; no such setting"},
      {"--ctx-shift", "larder does not shift the context; requests stop at the context end"},
      {"--context-shift", "larder does not shift the context; requests stop at the context end"},
  };
  return t;
}

bool is_number(const std::string& s) {
  if (s.size() < 2 || s[0] != '-') return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end && *end == '\0';
}

bool letters_only(const std::string& s) {  // "-hf", "-no-cnv": letters and inner dashes
  if (s.size() < 3 || s[0] != '-' || s[1] == '-') return false;
  for (size_t i = 1; i < s.size(); ++i)
    if (!std::isalpha(static_cast<unsigned char>(s[i])) && s[i] != '-') return false;
  return true;
}

CLI::App* find_subcommand(CLI::App* app, const std::string& name) {
  for (CLI::App* s : app->get_subcommands([](CLI::App*) { return true; }))
    if (s->get_name() == name) return s;
  return nullptr;
}

// Every name the options of `app` answer to ("--temp", "-t", ...).
std::vector<std::string> flag_names(CLI::App* app) {
  std::vector<std::string> out;
  for (const CLI::Option* o : app->get_options()) {
    for (const std::string& l : o->get_lnames()) out.push_back("--" + l);
    for (const std::string& s : o->get_snames()) out.push_back("-" + s);
  }
  return out;
}

const CLI::Option* known(CLI::App* app, const std::string& flag) {
  for (const CLI::Option* o : app->get_options()) {
    if (o->nonpositional() && o->check_name(flag)) return o;
  }
  return nullptr;
}

std::string verb_path(CLI::App* app) {
  std::string s;
  for (CLI::App* a = app; a && a->get_parent(); a = a->get_parent()) s = a->get_name() + (s.empty() ? "" : " ") + s;
  return s;
}

std::string nearest(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  size_t best_d = SIZE_MAX;
  const std::string w = word.substr(word.find_first_not_of('-'));
  for (const std::string& n : names) {
    const std::string b = n.substr(n.find_first_not_of('-'));
    if (b.size() < 2) continue;
    size_t d = edit_distance(w, b);
    // A unique prefix of a long name counts as near ("--max-tok" → "--max-tokens").
    if (w.size() >= 3 && b.rfind(w, 0) == 0) d = std::min<size_t>(d, 1);
    if (d < best_d) best_d = d, best = n;
  }
  const size_t limit = std::max<size_t>(1, std::min<size_t>(3, w.size() / 3));
  return best_d <= limit ? best : std::string();
}

int refuse(CLI::App& root, CLI::App* app, const std::string& typed, const std::string& flag) {
  const std::string where = "larder " + verb_path(app);
  std::string msg = strfmt("%s: unknown flag %s", where.c_str(), typed.c_str());
  auto h = hint_table().find(flag);
  std::string suggestion = nearest(flag, flag_names(app));
  std::string elsewhere;
  for (CLI::App* v : root.get_subcommands([](CLI::App*) { return true; })) {
    if (v == app) continue;
    if (known(v, flag)) elsewhere += (elsewhere.empty() ? "" : ", ") + ("larder " + v->get_name());
  }
  if (h != hint_table().end()) {
    msg += " (a llama.cpp flag): " + h->second;
  } else if (!suggestion.empty()) {
    msg += "; did you mean " + suggestion + "?";
  } else if (!elsewhere.empty()) {
    msg += " (it is a flag of " + elsewhere + ")";
  }
  msg += strfmt("\nRun '%s --help' for the flags it takes.\n", where.c_str());
  std::fputs(msg.c_str(), stderr);
  return 2;
}

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment: insertions, deletions, substitutions and adjacent transpositions.
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::optional<int> check_flags(CLI::App& root, std::vector<std::string>& args) {
  CLI::App* app = &root;
  bool positional_seen = false;  // in the current (sub)command
  for (size_t i = 0; i < args.size(); ++i) {
    std::string& tok = args[i];
    if (tok == "--") break;
    if (tok.size() < 2 || tok[0] != '-' || is_number(tok)) {
      // A word: a subcommand of the current command, or a positional.
      if (CLI::App* sub = find_subcommand(app, tok); sub && !positional_seen) {
        app = sub;
        continue;
      }
      if (app == &root) {
        std::vector<std::string> verbs;
        for (CLI::App* v : root.get_subcommands([](CLI::App*) { return true; })) verbs.push_back(v->get_name());
        std::string near;
        size_t best = SIZE_MAX;
        for (const std::string& v : verbs) {
          const size_t d = edit_distance(tok, v);
          if (d < best) best = d, near = v;
        }
        std::string msg = strfmt("larder: unknown command '%s'", tok.c_str());
        if (best <= 2) msg += strfmt("; did you mean '%s'?", near.c_str());
        std::fprintf(stderr, "%s\nRun 'larder --help' for the commands.\n", msg.c_str());
        return 2;
      }
      positional_seen = true;
      continue;
    }
    const std::string typed = tok;
    if (letters_only(tok)) {
      auto r = single_dash_table().find(tok);
      tok = r != single_dash_table().end() ? r->second : "-" + tok;
    }
    std::string flag = tok;
    const size_t eq = flag.find('=');
    const bool has_value = eq != std::string::npos && flag.rfind("--", 0) == 0;
    if (has_value) flag = flag.substr(0, eq);
    if (flag.size() > 2 && flag[1] != '-') flag = flag.substr(0, 2);  // "-n128" → "-n"
    const CLI::Option* o = known(app, flag);
    if (!o) return refuse(root, app, has_value ? typed.substr(0, typed.find('=')) : typed, flag);
    if (o->get_expected_max() > 0 && !has_value && flag == tok) ++i;  // its value follows
  }
  return std::nullopt;
}

}  // namespace larder::cli
