// api_ollama.cpp — Ollama's native API: request parsers for /api/chat and /api/generate (over the
// shared field validation of api_fields.h), the NDJSON/object writer, and the model listings.
// Field names and shapes follow Ollama's docs/api.md; what larder cannot honour is refused with a
// 400 naming the field, never silently ignored (docs/server-api.md "Ollama API").
#include "larder/server/api_ollama.h"

#include <sys/stat.h>

#include <cstring>
#include <ctime>

#include "larder/server/api_constraints.h"
#include "larder/server/api_fields.h"

namespace larder::server {

using namespace fields;

namespace {

// The Ollama API level these routes follow (GET /api/version); larder's own version travels
// beside it. Tools compare this number to decide which Ollama features to use.
constexpr const char* kOllamaApiLevel = "0.12.0";
constexpr const char* kLarderVersion = "0.1.0";

std::string rfc3339(std::time_t t, long micros) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return strfmt("%s.%06ldZ", buf, micros);
}

std::string file_mtime(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return rfc3339(0, 0);
  return rfc3339(st.st_mtim.tv_sec, st.st_mtim.tv_nsec / 1000);
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

uint64_t weight_bytes(const ServedModel& sm) { return sm.m->files.tensors().total_bytes(); }

// Ollama's digest is a content hash it already has; hashing gigabytes per listing is not worth it,
// so this one names the file (path, size, mtime) — stable while the file is unchanged.
std::string digest(const ServedModel& sm) {
  const std::string key = sm.m->files.path + "|" + std::to_string(weight_bytes(sm)) + "|" + file_mtime(sm.m->files.path);
  return memory::entry_id(key, {});
}

std::string parameter_size(int64_t n) {
  if (n >= 1'000'000'000) return strfmt("%.1fB", n / 1e9);
  if (n >= 1'000'000) return strfmt("%.2fM", n / 1e6);
  return strfmt("%.2fK", n / 1e3);
}

ordered_json details(const ServedModel& sm) {
  const auto& info = sm.m->model->info();
  return {{"parent_model", ""},
          {"format", ends_with(sm.m->files.path, ".gguf") ? "gguf" : "safetensors"},
          {"family", info.architecture},
          {"families", ordered_json::array({info.architecture})},
          {"parameter_size", parameter_size(info.n_params)},
          {"quantization_level", info.weight_dtypes}};
}

// Ollama model names carry a tag; "NAME:latest" is the same model as "NAME".
void check_model(const ServedModel& sm, const ordered_json& b) {
  std::optional<std::string> name = string_field(b, "model");
  if (!name || name->empty()) name = string_field(b, "name");  // /api/show's older field
  if (!name || name->empty()) bad("model is required", "model");
  if (*name == sm.id || *name == sm.id + ":latest") return;
  if (sm.loras)  // a served adapter's NAME (--lora NAME=PATH) is a model too
    for (const ServedLora& a : sm.loras->adapters())
      if (*name == a.name || *name == a.name + ":latest") return;
  bad(strfmt("model \"%s\" not found: this server serves \"%s\" (larder serve runs one model; fetch others with "
             "`larder pull` and serve them)",
             name->c_str(), sm.id.c_str()),
      "model", {}, 404);
}

void refuse_common(const ordered_json& b) {
  if (const ordered_json* k = get(b, "keep_alive");
      k && !(k->is_number() || (k->is_string() && is_go_duration(k->get_ref<const std::string&>()))))
    bad("keep_alive must be a duration string (\"5m\", \"1h30m\", \"0\") or a number of seconds", "keep_alive");
}

void refuse_images(const ordered_json& o, const std::string& where) {
  const ordered_json* im = get(o, "images");
  if (!im) return;
  if (!im->is_array()) bad(where + "images must be an array", "images");
  if (!im->empty()) bad(where + "images: this model does not accept images (text-only model)", "images");
}

// options → the OpenAI-style fields the shared parsers read; errors say "options.<name>".
struct Options {
  std::optional<int64_t> max_tokens;
  std::optional<int64_t> num_ctx;
};

Options apply_options(const ServedModel& sm, const ordered_json& b, ParsedRequest& pr) {
  Options out;
  ordered_json t = ordered_json::object();
  const ordered_json* o = get(b, "options");
  if (o && !o->is_object()) bad("options must be an object", "options");
  static const char* kSame[] = {"temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty", "stop"};
  // Load-time and context-shift knobs: meaningful to Ollama's runner, not to a loaded larder
  // server (threads, batch and mapping are serve flags); accepted and ignored.
  static const char* kIgnored[] = {"numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
                                   "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread", "num_keep",
                                   "penalize_newline"};
  constexpr size_t kMaxWarned = 8;
  size_t unknown = 0;
  try {
    if (o) {
      for (const auto& [k, v] : o->items()) {
        bool known = false;
        for (const char* s : kSame) known = known || k == s;
        if (known) {
          t[k] = v;
          continue;
        }
        for (const char* s : kIgnored) known = known || k == s;
        if (known) continue;
        if (k == "repeat_penalty") {
          t["repetition_penalty"] = v;
        } else if (k == "repeat_last_n") {
          const auto n = integer(*o, "repeat_last_n", -1, 1 << 20);
          if (n && *n == -1) t["repetition_context_size"] = sm.ctx;
          else if (n) t["repetition_context_size"] = *n;
        } else if (k == "num_predict") {
          const auto n = integer(*o, "num_predict", -2, INT64_MAX);
          if (n && *n == 0) bad("num_predict must be -1 (no limit), -2 (fill the context) or at least 1", "num_predict");
          if (n) out.max_tokens = *n < 0 ? INT64_MAX : *n;
        } else if (k == "num_ctx") {
          out.num_ctx = integer(*o, "num_ctx", 1, INT64_MAX);
          if (out.num_ctx && *out.num_ctx > sm.ctx)
            bad(strfmt("num_ctx %lld is larger than this server's context of %lld tokens per sequence (set by larder "
                       "serve --ctx); use at most %lld",
                       (long long)*out.num_ctx, (long long)sm.ctx, (long long)sm.ctx),
                "num_ctx");
        } else if (k == "mirostat") {
          if (integer(*o, "mirostat", 0, 2).value_or(0) != 0) bad("mirostat sampling is not supported; use 0", "mirostat");
        } else if (k == "mirostat_tau" || k == "mirostat_eta") {
          number(*o, k.c_str(), -1e9, 1e9);
        } else if (k == "typical_p" || k == "tfs_z") {
          if (auto x = number(*o, k.c_str(), 0, 1e9); x && *x != 1.0)
            bad(k + " sampling is not supported; use 1.0 (off)", k);
        } else if (++unknown <= kMaxWarned) {
          pr.warnings.push_back("unknown option '" + k + "' ignored");
        }
      }
      // One header per unknown option, a few at most: 80k of them were 80k Warning headers.
      if (unknown > kMaxWarned) pr.warnings.push_back(strfmt("%zu more unknown options ignored", unknown - kMaxWarned));
      if (auto n = integer(*o, "repeat_last_n", -1, 1 << 20); n && *n == 0) t["repetition_penalty"] = 1.0;
    }
    pr.gen.sampling = sampling(sm, t, true);
    pr.gen.stops = stops(t, "stop");
  } catch (ApiError& e) {
    if (e.status == 400 && !e.param.empty()) {
      e.message = "options." + e.message;
      e.param = "options." + e.param;
    }
    throw;
  }
  return out;
}

void apply_logprobs(const ordered_json& b, ParsedRequest& pr) {
  pr.logprobs = boolean(b, "logprobs").value_or(false);
  pr.top_logprobs = static_cast<int>(integer(b, "top_logprobs", 0, 20).value_or(0));
  pr.gen.top_logprobs = pr.logprobs ? pr.top_logprobs : -1;
}

ordered_json think_kwargs(const ordered_json& b) {
  ordered_json extra = ordered_json::object();
  if (const ordered_json* t = get(b, "think")) {
    if (t->is_boolean()) extra["enable_thinking"] = t->get<bool>();
    else if (t->is_string()) {  // "low"/"medium"/"high": also gpt-oss's reasoning_effort, as Ollama passes it
      extra["enable_thinking"] = !t->get<std::string>().empty();
      if (!t->get<std::string>().empty()) extra["reasoning_effort"] = *t;
    }
    else bad("think must be a boolean or one of \"low\", \"medium\", \"high\"", "think");
  }
  return extra;
}

// The context this request may use: the server's, or a smaller options.num_ctx.
void fit(const ServedModel& sm, ParsedRequest& pr, const Options& opt, const char* param) {
  ServedModel local = sm;
  if (opt.num_ctx) local.ctx = *opt.num_ctx;
  std::optional<int64_t> max = opt.max_tokens;
  if (!max) max = sm.defaults.max_tokens;
  fit_context(local, pr, max, Surface::kChat, param);
}

ParsedRequest start_ollama(const ServedModel& sm, const ordered_json& b, const char* route) {
  ParsedRequest pr = start(b, "ollama-", route);
  check_model(sm, b);
  refuse_common(b);
  constraints::apply_ollama_format(sm, b, pr);  // "json" or a schema: constrained decoding (issue 15)
  pr.stream = boolean(b, "stream").value_or(true);  // Ollama streams unless told not to
  apply_adapters(sm, b, pr.gen);
  return pr;
}

const char* done_reason(const Outcome& o) { return o.finish == Finish::kLength ? "length" : "stop"; }

int64_t ns(double ms) { return static_cast<int64_t>(ms * 1e6); }

}  // namespace

std::string rfc3339_now() {
  const auto now = std::chrono::system_clock::now();
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  return rfc3339(static_cast<std::time_t>(us / 1'000'000), static_cast<long>(us % 1'000'000));
}

ParsedRequest parse_ollama_chat(const ServedModel& sm, const ordered_json& b) {
  if (!b.is_object()) bad("the request body must be a JSON object");
  ParsedRequest pr = start_ollama(sm, b, "/api/chat");
  const ordered_json* msgs = get(b, "messages");
  if (!msgs) bad("messages is required", "messages");
  if (!msgs->is_array()) bad("messages must be an array", "messages");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ordered_json& m = (*msgs)[i];
    const std::string where = strfmt("messages[%zu]", i);
    if (!m.is_object()) bad(where + " must be an object", "messages");
    const std::string role = str_in(m, "role", where, "messages");
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      bad(strfmt("%s.role '%s' is not one of system, user, assistant, tool", where.c_str(), role.c_str()), "messages");
    refuse_images(m, where + ".");
    ordered_json msg = {{"role", role}, {"content", str_in(m, "content", where, "messages")}};
    if (const ordered_json* calls = get(m, "tool_calls")) {
      if (!calls->is_array()) bad(where + ".tool_calls must be an array", "messages");
      ordered_json tc = ordered_json::array();
      for (const auto& c : *calls) {
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
          bad(where + ".tool_calls entries must be objects with a function", "messages");
        ordered_json fn = {{"name", str_in(c["function"], "name", where + ".tool_calls[].function", "messages")},
                           {"arguments", c["function"].value("arguments", ordered_json::object())}};
        if (fn["arguments"].is_string()) {  // templates tojson the arguments themselves: give them the object
          ordered_json parsed;
          if (!parse_json_linear(fn["arguments"].get_ref<const std::string&>(), kMaxJsonDepth, &parsed))
            fn["arguments"] = std::move(parsed);
        }
        ordered_json call = {{"type", "function"}, {"function", fn}};
        if (c.contains("id") && c["id"].is_string()) call["id"] = c["id"];
        tc.push_back(std::move(call));
      }
      msg["tool_calls"] = tc;
    }
    if (auto name = str_in(m, "tool_name", where, "messages"); !name.empty()) msg["name"] = name;
    if (auto th = str_in(m, "thinking", where, "messages"); !th.empty()) msg["reasoning_content"] = th;
    out.push_back(std::move(msg));
  }
  if (out.empty()) bad("messages must not be empty", "messages");
  const ordered_json tools = function_tools(b);
  const Options opt = apply_options(sm, b, pr);
  apply_logprobs(b, pr);
  pr.tool_style = tool_style_for(sm, tools);
  pr.tools = tools;
  check_chat_bytes(sm, out, tools, Surface::kChat);
  encode_with_template(sm, out, tools, think_kwargs(b), pr);
  fit(sm, pr, opt, "messages");
  return pr;
}

ParsedRequest parse_ollama_generate(const ServedModel& sm, const ordered_json& b) {
  if (!b.is_object()) bad("the request body must be a JSON object");
  ParsedRequest pr = start_ollama(sm, b, "/api/generate");
  refuse_images(b, "");
  if (auto s = string_field(b, "suffix"); s && !s->empty())
    bad("suffix (fill-in-the-middle) is not supported", "suffix");
  if (auto t = string_field(b, "template"); t && !t->empty())
    bad("template is not supported: larder renders the model's chat template (or larder serve --chat-template); "
        "send raw: true with a prompt you rendered yourself",
        "template");
  if (const ordered_json* c = get(b, "context"); c && !(c->is_array() && c->empty()))
    bad("context (the deprecated token history of /api/generate) is not supported; use /api/chat with messages, or "
        "raw: true with the whole conversation as the prompt",
        "context");
  const std::string prompt = string_field(b, "prompt").value_or("");
  const std::string system = string_field(b, "system").value_or("");
  const bool raw = boolean(b, "raw").value_or(false);
  const Options opt = apply_options(sm, b, pr);
  apply_logprobs(b, pr);
  check_prompt_bytes(sm, prompt.size() + system.size(), Surface::kCompletions, "prompt");
  if (raw) {
    if (!system.empty()) bad("system is not applied with raw: true (the prompt is sent as it is); put it in the prompt", "system");
    pr.gen.prompt = sm.m->tokenizer->encode(prompt, /*add_special=*/true);
  } else {
    ordered_json msgs = ordered_json::array();
    if (!system.empty()) msgs.push_back({{"role", "system"}, {"content", system}});
    msgs.push_back({{"role", "user"}, {"content", prompt}});
    encode_with_template(sm, msgs, ordered_json(), think_kwargs(b), pr);
  }
  fit(sm, pr, opt, "prompt");
  return pr;
}

std::optional<ordered_json> ollama_load_only(const ServedModel& sm, const ordered_json& b, OllamaKind kind) {
  if (!b.is_object()) return std::nullopt;
  const ordered_json* v = get(b, kind == OllamaKind::kGenerate ? "prompt" : "messages");  // absent or null
  // Only an absent, empty prompt string or empty messages array means "load": `messages: ""`
  // passed for one and was answered 200.
  if (kind == OllamaKind::kChat && v && !v->is_array()) bad("messages must be an array", "messages");
  if (kind == OllamaKind::kGenerate && v && !v->is_string()) bad("prompt must be a string", "prompt");
  const bool empty = !v || (v->is_string() && v->get_ref<const std::string&>().empty()) || (v->is_array() && v->empty());
  if (!empty) return std::nullopt;
  check_model(sm, b);
  refuse_common(b);
  const ordered_json* k = get(b, "keep_alive");
  const bool unload = k && ((k->is_number() && k->get<double>() == 0) || (k->is_string() && (k->get<std::string>() == "0" ||
                                                                                               k->get<std::string>() == "0s")));
  ordered_json j = {{"model", sm.id}, {"created_at", rfc3339_now()}};
  if (kind == OllamaKind::kChat) j["message"] = {{"role", "assistant"}, {"content", ""}};
  else j["response"] = "";
  j["done"] = true;
  j["done_reason"] = unload ? "unload" : "load";  // larder keeps the model for the server's life either way
  return j;
}

// ---- responses --------------------------------------------------------------------------------

OllamaWriter::OllamaWriter(const ServedModel& sm, const ParsedRequest& pr, OllamaKind kind)
    : ResponseWriter(sm, pr, /*text_pipeline=*/true, "call_"), kind_(kind) {}

ordered_json OllamaWriter::head() const { return {{"model", sm_.id}, {"created_at", rfc3339_now()}}; }

ordered_json OllamaWriter::message(const std::string& content, const std::string& thinking,
                                   const std::vector<runtime::ToolCall>& calls) const {
  ordered_json m = {{"role", "assistant"}, {"content", content}};
  if (!thinking.empty()) m["thinking"] = thinking;
  if (!calls.empty()) {
    ordered_json a = ordered_json::array();
    for (const auto& c : calls) a.push_back({{"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    m["tool_calls"] = a;
  }
  return m;
}

void OllamaWriter::finish_fields(ordered_json& j) const {
  const Outcome& o = outcome_;
  j["done"] = true;
  j["done_reason"] = done_reason(o);
  j["total_duration"] = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - pr_.gen.arrived).count();
  j["load_duration"] = ns(o.queue_ms);  // the model is loaded already; the wait for a slot is this request's "load"
  j["prompt_eval_count"] = o.prompt_tokens - o.cached_tokens;  // evaluated now; the rest came from the KV store
  j["prompt_eval_duration"] = ns(o.prefill_ms);
  j["eval_count"] = o.completion_tokens;
  j["eval_duration"] = ns(o.decode_ms);
}

namespace {
ordered_json logprobs_of(const tokenizer::Tokenizer& tk, const std::vector<TokenInfo>& toks) {
  ordered_json a = ordered_json::array();
  for (const TokenInfo& t : toks) {
    ordered_json top = ordered_json::array();
    for (const auto& [id, lp] : t.lp.top) top.push_back({{"token", tk.token_bytes(id)}, {"logprob", lp}});
    a.push_back({{"token", tk.token_bytes(t.id)}, {"logprob", t.lp.logprob}, {"top_logprobs", top}});
  }
  return a;
}
std::string line(const ordered_json& j) { return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace) + "\n"; }
}  // namespace

std::string OllamaWriter::delta_frames(const Pieces& p, const std::vector<TokenInfo>& tokens) {
  if (p.content.empty() && p.reasoning.empty() && !(pr_.logprobs && !tokens.empty())) return {};
  ordered_json j = head();
  if (kind_ == OllamaKind::kChat) {
    j["message"] = message(p.content, p.reasoning, {});
  } else {
    j["response"] = p.content;
    if (!p.reasoning.empty()) j["thinking"] = p.reasoning;
  }
  j["done"] = false;
  if (pr_.logprobs) j["logprobs"] = logprobs_of(*sm_.m->tokenizer, tokens);
  return line(j);
}

std::string OllamaWriter::tool_call_frames(size_t i) {
  ordered_json j = head();
  j["message"] = message("", "", {calls_[i]});
  j["done"] = false;
  return line(j);
}

std::string OllamaWriter::finish_frames() {
  ordered_json j = head();
  if (kind_ == OllamaKind::kChat) j["message"] = {{"role", "assistant"}, {"content", ""}};
  else j["response"] = "";
  finish_fields(j);
  return line(j);
}

std::string OllamaWriter::error_frames(const std::string& message) { return line({{"error", message}}); }

ordered_json OllamaWriter::body() const {
  if (outcome_.finish == Finish::kError || outcome_.finish == Finish::kCancelled)
    return {{"error", outcome_.error.empty() ? "generation failed" : outcome_.error}};
  ordered_json j = head();
  if (kind_ == OllamaKind::kChat) {
    j["message"] = message(text_, reasoning_, calls_);
  } else {
    j["response"] = text_;
    if (!reasoning_.empty()) j["thinking"] = reasoning_;
  }
  finish_fields(j);
  if (pr_.logprobs) j["logprobs"] = logprobs_of(*sm_.m->tokenizer, tokens_);
  return j;
}

// ---- listings ---------------------------------------------------------------------------------

ordered_json ollama_tags(const ServedModel& sm) {
  ordered_json models = ordered_json::array({{{"name", sm.id},
                                               {"model", sm.id},
                                               {"modified_at", file_mtime(sm.m->files.path)},
                                               {"size", weight_bytes(sm)},
                                               {"digest", digest(sm)},
                                               {"details", details(sm)}}});
  if (sm.loras)  // each --lora NAME: the base with that adapter (Ollama's ADAPTER), picked by name
    for (const ServedLora& a : sm.loras->adapters()) {
      ordered_json d = details(sm);
      d["parent_model"] = sm.id;
      models.push_back({{"name", a.name},
                        {"model", a.name},
                        {"modified_at", file_mtime(sm.m->files.path)},
                        {"size", weight_bytes(sm)},
                        {"digest", a.bound->lora->content_hash()},
                        {"details", d}});
    }
  return {{"models", models}};
}

ordered_json ollama_ps(const ServedModel& sm) {
  return {{"models", ordered_json::array({{{"name", sm.id},
                                            {"model", sm.id},
                                            {"size", weight_bytes(sm)},
                                            {"digest", digest(sm)},
                                            {"details", details(sm)},
                                            // loaded until the server stops: keep_alive has no say
                                            {"expires_at", "9999-12-31T23:59:59Z"},
                                            {"size_vram", 0},
                                            {"context_length", sm.ctx}}})}};
}

ordered_json ollama_show(const ServedModel& sm, const ordered_json& b) {
  if (!b.is_object()) bad("the request body must be a JSON object");
  check_model(sm, b);
  const auto& info = sm.m->model->info();
  const std::string& a = info.architecture;
  ordered_json mi = {{"general.architecture", a},
                     {"general.parameter_count", info.n_params},
                     {a + ".context_length", info.max_context},
                     {a + ".embedding_length", info.hidden},
                     {a + ".block_count", info.n_layers},
                     {a + ".feed_forward_length", info.ffn},
                     {a + ".attention.head_count", info.n_heads},
                     {a + ".attention.head_count_kv", info.n_kv_heads},
                     {a + ".vocab_size", info.vocab}};
  std::string params = strfmt("num_ctx %lld\n", (long long)sm.ctx);
  const ApiDefaults& d = sm.defaults;
  if (d.temperature) params += strfmt("temperature %g\n", *d.temperature);
  if (d.top_p) params += strfmt("top_p %g\n", *d.top_p);
  if (d.top_k) params += strfmt("top_k %d\n", *d.top_k);
  if (d.min_p) params += strfmt("min_p %g\n", *d.min_p);
  if (d.repetition_penalty) params += strfmt("repeat_penalty %g\n", *d.repetition_penalty);
  ordered_json caps = ordered_json::array({"completion"});
  const bool harmony = runtime::speaks_harmony(*sm.m);
  if (harmony || tool_style_for(sm, ordered_json::array({ordered_json::object()})) != runtime::ToolCallStyle::kNone)
    caps.push_back("tools");
  if (harmony || (sm.m->tokenizer->token_to_id("<think>") && sm.m->tokenizer->token_to_id("</think>")))
    caps.push_back("thinking");
  return {{"license", ""},
          {"modelfile", "# served by larder; Modelfiles are not used\nFROM " + sm.m->files.path + "\n"},
          {"parameters", params},
          {"template", sm.m->template_choice.source},
          {"details", details(sm)},
          {"model_info", mi},
          {"capabilities", caps},
          {"modified_at", file_mtime(sm.m->files.path)}};
}

ordered_json ollama_version() { return {{"version", kOllamaApiLevel}, {"larder", kLarderVersion}}; }

}  // namespace larder::server
