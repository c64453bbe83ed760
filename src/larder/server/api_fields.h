// api_fields.h — what every API surface's request parser shares: typed field access with 400s
// that name the field, sampling parameters and their defaults, stops, context fitting, the
// prompt byte bound, chat template encoding, choices (n, prompt lists). Internal to server/:
// the surface parsers are api_chat.cpp, api_completions.cpp, api_messages.cpp.
#pragma once

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>

#include "larder/memory/store/identity.h"
#include "larder/runtime/adapters.h"
#include "larder/server/api.h"

namespace larder::server::fields {

[[noreturn]] inline void bad(std::string message, std::string param = {}, std::string code = {}, int status = 400) {
  throw ApiError{status, std::move(message), std::move(param), std::move(code)};
}

// The field's value, or nullptr when absent or null (null means "not given" for every optional
// field of these APIs).
inline const ordered_json* get(const ordered_json& o, const char* name) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

inline std::optional<double> number(const ordered_json& o, const char* name, double lo, double hi) {
  const ordered_json* v = get(o, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(strfmt("%s must be a number", name), name);
  const double d = v->get<double>();
  if (!std::isfinite(d)) bad(strfmt("%s must be a finite number", name), name);
  if (d < lo) bad(strfmt("%s must be at least %g", name, lo), name);
  if (d > hi) bad(strfmt("%s must be at most %g", name, hi), name);
  return d;
}

inline std::optional<int64_t> integer(const ordered_json& o, const char* name, int64_t lo, int64_t hi) {
  const ordered_json* v = get(o, name);
  if (!v) return std::nullopt;
  int64_t x = 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      bad(strfmt("%s must be at most %lld", name, (long long)hi), name);
    x = v->get<int64_t>();
  } else if (v->is_number_float() && std::isfinite(v->get<double>()) && std::floor(v->get<double>()) == v->get<double>() &&
             std::abs(v->get<double>()) < 9e15) {
    x = static_cast<int64_t>(v->get<double>());
  } else {
    bad(strfmt("%s must be of type int", name), name);
  }
  if (x < lo) bad(strfmt("%s must be at least %lld", name, (long long)lo), name);
  if (x > hi) bad(strfmt("%s must be at most %lld", name, (long long)hi), name);
  return x;
}

inline std::optional<bool> boolean(const ordered_json& o, const char* name) {
  const ordered_json* v = get(o, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(strfmt("%s must be of type bool", name), name);
  return v->get<bool>();
}

inline std::optional<std::string> string_field(const ordered_json& o, const char* name) {
  const ordered_json* v = get(o, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad(strfmt("%s must be a string", name), name);
  return v->get<std::string>();
}

// A string field of a nested object, with a 400 naming it when it has another type (nlohmann's
// value() would throw a type_error, which surfaced as a 500).
inline std::string str_in(const ordered_json& o, const char* key, const std::string& where, const char* param,
                   const std::string& dflt = {}) {
  if (!o.is_object()) return dflt;
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return dflt;
  if (!it->is_string()) bad(strfmt("%s.%s must be a string", where.c_str(), key), param);
  return it->get<std::string>();
}

// tools in the OpenAI shape (chat completions, /apply-template, Ollama /api/chat): an array of
// {"type": "function", "function": {"name", "description"?, "parameters"?}}. Null when absent.
// A malformed entry is a 400 naming it: `tools: [5]` reached the template and was answered 200.
inline ordered_json function_tools(const ordered_json& b) {
  const ordered_json* t = get(b, "tools");
  if (!t) return ordered_json();
  if (!t->is_array()) bad("tools must be an array", "tools");
  for (size_t i = 0; i < t->size(); ++i) {
    const ordered_json& tool = (*t)[i];
    const std::string where = strfmt("tools[%zu]", i);
    if (!tool.is_object()) bad(where + " must be an object", "tools");
    if (str_in(tool, "type", where, "tools", "function") != "function")
      bad(where + ".type must be \"function\"", "tools");
    const ordered_json* f = get(tool, "function");
    if (!f || !f->is_object()) bad(where + ".function must be an object", "tools");
    if (str_in(*f, "name", where + ".function", "tools").empty())
      bad(where + ".function.name must be a non-empty string", "tools");
    str_in(*f, "description", where + ".function", "tools");
    if (const ordered_json* p = get(*f, "parameters"); p && !p->is_object())
      bad(where + ".function.parameters must be an object (a JSON schema)", "tools");
  }
  return *t;
}

// chat_template_kwargs: an object of template variables. Each becomes a variable of the
// template, found by a scan of the variables: more than a few hundred only make rendering slow
// (quadratic), so more than kMaxTemplateKwargs is a 400.
constexpr size_t kMaxTemplateKwargs = 256;
inline ordered_json template_kwargs(const ordered_json& b) {
  const ordered_json* k = get(b, "chat_template_kwargs");
  if (!k) return ordered_json::object();
  if (!k->is_object()) bad("chat_template_kwargs must be an object", "chat_template_kwargs");
  if (k->size() > kMaxTemplateKwargs)
    bad(strfmt("chat_template_kwargs may hold at most %zu keys (it has %zu)", kMaxTemplateKwargs, k->size()),
        "chat_template_kwargs");
  return *k;
}

// A Go duration as Ollama's keep_alive takes it ("5m", "1h30m", "-1s", "0", "2.5s"; units ns, us,
// µs, ms, s, m, h): time.ParseDuration's grammar.
inline bool is_go_duration(const std::string& s) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  if (s.substr(i) == "0") return true;
  if (i == s.size()) return false;
  static const char* kUnits[] = {"ns", "us", "\xc2\xb5s", "\xce\xbcs", "ms", "s", "m", "h"};
  while (i < s.size()) {
    const size_t start = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    bool digits = i > start;
    if (i < s.size() && s[i] == '.') {
      const size_t frac = ++i;
      while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
      digits = digits || i > frac;
    }
    if (!digits) return false;
    size_t best = 0;
    for (const char* u : kUnits) {
      const size_t n = std::strlen(u);
      if (n > best && s.compare(i, n, u) == 0) best = n;
    }
    if (best == 0) return false;
    i += best;
  }
  return true;
}

inline uint64_t random_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
         static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

// Options every surface shares: meaning-changing options larder cannot honour are refused.
inline void refuse_unsupported(const ordered_json& b) {
  if (auto n = integer(b, "best_of", 1, 1'000'000); n && *n != 1) bad("best_of > 1 is not supported", "best_of");
  if (auto e = boolean(b, "echo"); e && *e) bad("echo is not supported", "echo");
  if (get(b, "suffix")) bad("suffix is not supported", "suffix");
}

// max_tokens, else llama-server's n_predict (-1: as many as the context allows).
inline std::optional<int64_t> max_tokens_field(const ordered_json& b, const char* name) {
  if (auto m = integer(b, name, 1, INT64_MAX)) return m;
  if (auto n = integer(b, "n_predict", -1, INT64_MAX)) {
    if (*n == 0) bad("n_predict must be -1 (no limit) or at least 1", "n_predict");
    return *n < 0 ? INT64_MAX : *n;
  }
  return std::nullopt;
}

inline std::vector<std::string> stops(const ordered_json& b, const char* name) {
  std::vector<std::string> out;
  const ordered_json* v = get(b, name);
  if (!v) return out;
  if (v->is_string()) {
    if (!v->get<std::string>().empty()) out.push_back(v->get<std::string>());
    return out;
  }
  if (!v->is_array()) bad(strfmt("%s must be a string or an array of strings", name), name);
  if (v->size() > 16) bad(strfmt("%s may hold at most 16 strings", name), name);
  for (const auto& s : *v) {
    if (!s.is_string()) bad(strfmt("%s must be a string or an array of strings", name), name);
    if (!s.get<std::string>().empty()) out.push_back(s.get<std::string>());
  }
  return out;
}

// logit_bias in the forms OpenAI and llama-server accept:
//   {"15043": 2.5}                 OpenAI: token id (as a string) → bias in [-100, 100]
//   {" the": -100, "15044": false} llama-server's /completion (text_keys): a key that is not an
//                                  integer stands for every token of its encoding; false bans.
//                                  The OpenAI routes keep OpenAI's rule (integer keys, 400).
//   [[15043, 2.5], [15044, false]] llama-server: [id, bias] pairs; false bans the token
//   [["Hello", -0.5]]              llama-server: every token of the string's encoding
// An id outside the vocabulary is an error (llama-server skips it silently; a typo should not
// pass unnoticed), as is a string with no tokens. Pair biases may exceed ±100 (llama-server
// clamps nothing); false is −∞.
inline void logit_bias(const ServedModel& sm, const ordered_json& lb, runtime::SamplingParams& p, bool text_keys) {
  const int64_t V = sm.m->model->info().vocab;
  auto set = [&](long long id, float x) {
    if (id < 0 || id >= V) bad(strfmt("logit_bias token id %lld is outside the vocabulary [0, %lld)", id, (long long)V), "logit_bias");
    p.logit_bias[static_cast<int32_t>(id)] = x;
  };
  auto set_text = [&](const std::string& text, float x) {
    const std::vector<int32_t> ids = sm.m->tokenizer->encode(text, /*add_special=*/false);
    if (ids.empty()) bad(strfmt("logit_bias string \"%s\" has no tokens", text.c_str()), "logit_bias");
    for (int32_t id : ids) set(id, x);
  };
  // More entries than the vocabulary has tokens cannot all be distinct ids: refused before any
  // is looked at (a 1M-entry logit_bias was a minute of work).
  if ((lb.is_object() || lb.is_array()) && lb.size() > static_cast<size_t>(V))
    bad(strfmt("logit_bias has %zu entries, more than the vocabulary's %lld tokens", lb.size(), (long long)V), "logit_bias");
  if (lb.is_object()) {
    for (const auto& [k, v] : lb.items()) {
      char* end = nullptr;
      errno = 0;
      const long long id = std::strtoll(k.c_str(), &end, 10);
      const bool is_id = !k.empty() && *end == '\0' && errno == 0;
      if (!text_keys && (!is_id || !v.is_number())) bad("logit_bias must be a dict of int to float", "logit_bias");
      float x = 0;
      if (v.is_boolean() && !v.get<bool>()) {
        x = -std::numeric_limits<float>::infinity();
      } else if (v.is_number()) {
        const double d = v.get<double>();
        if (!std::isfinite(d) || d < -100 || d > 100) bad("logit_bias values must be between -100 and 100", "logit_bias");
        x = static_cast<float>(d);
      } else {
        bad("logit_bias must be a dict of token id (or text) to a bias or false", "logit_bias");
      }
      if (is_id) set(id, x);
      else set_text(k, x);
    }
    return;
  }
  const char* form = "logit_bias must be a dict of int to float, or a list of [token id or string, bias or false] pairs";
  if (!lb.is_array()) bad(form, "logit_bias");
  for (const auto& pair : lb) {
    if (!pair.is_array() || pair.size() != 2) bad(form, "logit_bias");
    const ordered_json& v = pair[1];
    float x = 0;
    if (v.is_boolean() && !v.get<bool>()) {
      x = -std::numeric_limits<float>::infinity();
    } else if (v.is_number() && std::isfinite(v.get<double>())) {
      x = static_cast<float>(v.get<double>());
    } else {
      bad(form, "logit_bias");
    }
    if (pair[0].is_number_integer()) {
      set(pair[0].get<long long>(), x);
    } else if (pair[0].is_string()) {
      set_text(pair[0].get<std::string>(), x);
    } else {
      bad(form, "logit_bias");
    }
  }
}

// Sampling parameters: request field → server defaults (flags over generation_config.json) →
// built-ins (server-api.md §3). llama_server: the request is llama-server's /completion (its
// logit_bias forms).
inline runtime::SamplingParams sampling(const ServedModel& sm, const ordered_json& b, bool with_penalties,
                                        bool llama_server = false) {
  runtime::SamplingParams p;
  const ApiDefaults& d = sm.defaults;
  p.temperature = static_cast<float>(number(b, "temperature", 0, 5).value_or(d.temperature.value_or(0.7f)));
  p.top_p = static_cast<float>(number(b, "top_p", 0, 1).value_or(d.top_p.value_or(1.0f)));
  if (p.top_p == 0.0f) p.top_p = 1.0f;  // 0 = off (mlx_lm.server)
  p.top_k = static_cast<int>(integer(b, "top_k", 0, 1'000'000).value_or(d.top_k.value_or(0)));
  p.min_p = static_cast<float>(number(b, "min_p", 0, 1).value_or(d.min_p.value_or(0.0f)));
  // seed: any u64; -1 means "random" (llama-server's convention); absent: the server's --seed
  // (every such request samples with it, as llama-server does), else random.
  p.seed = d.seed ? *d.seed : random_seed();
  if (const ordered_json* sv = get(b, "seed")) {
    if (sv->is_number_unsigned()) {
      p.seed = sv->get<uint64_t>();
    } else if (sv->is_number_integer() && sv->get<int64_t>() == -1) {
      p.seed = random_seed();
    } else if (sv->is_number_integer()) {
      bad("seed must be at least 0 (or -1 for a random seed)", "seed");
    } else {
      bad("seed must be of type int", "seed");
    }
  }
  if (!with_penalties) return p;
  p.repetition_penalty = static_cast<float>(number(b, "repetition_penalty", 1e-6, 100).value_or(d.repetition_penalty.value_or(1.0f)));
  p.presence_penalty = static_cast<float>(number(b, "presence_penalty", -2, 2).value_or(0));
  p.frequency_penalty = static_cast<float>(number(b, "frequency_penalty", -2, 2).value_or(0));
  if (auto n = integer(b, "repetition_context_size", 0, 1 << 20)) p.repetition_context_size = static_cast<int>(*n);
  if (auto n = integer(b, "presence_context_size", 0, 1 << 20)) p.presence_context_size = static_cast<int>(*n);
  if (auto n = integer(b, "frequency_context_size", 0, 1 << 20)) p.frequency_context_size = static_cast<int>(*n);
  if (const ordered_json* lb = get(b, "logit_bias")) logit_bias(sm, *lb, p, llama_server);
  return p;
}

// The prompt must leave room for one generated token; max_tokens is a ceiling, clamped to what
// the context allows (server-api.md §3, §10).
inline void fit_context(const ServedModel& sm, GenRequest& gen, std::optional<int64_t> requested, Surface surface,
                 const char* param) {
  const int64_t P = static_cast<int64_t>(gen.prompt.size());
  if (P == 0) bad("the prompt is empty", param);
  // Every surface's prompt passes here once it is ids: the runtime's one embeddability check.
  if (Status st = runtime::check_prompt(*sm.m, gen.prompt); !st.is_ok()) bad(st.message(), param);
  if (P >= sm.ctx) {
    if (surface == Surface::kMessages) {
      bad(strfmt("prompt is too long: %lld tokens > %lld maximum", (long long)P, (long long)(sm.ctx - 1)), param,
          "context_length_exceeded");
    }
    bad(strfmt("This model's maximum context length is %lld tokens. However, your request has %lld prompt tokens. "
               "Please reduce the length of the messages or prompt.",
               (long long)sm.ctx, (long long)P),
        param, "context_length_exceeded");
  }
  const int64_t room = sm.ctx - P;
  gen.max_tokens = std::min(requested.value_or(room), room);
}

inline void fit_context(const ServedModel& sm, ParsedRequest& pr, std::optional<int64_t> requested, Surface surface,
                 const char* param) {
  fit_context(sm, pr.gen, requested, surface, param);
}

// n samples per prompt (and, on /v1/completions, one or more prompts): choice i = prompt × n +
// sample, each its own GenRequest with seed + i, decoded in the same batches; their common
// prompt prefix is prefilled once through the KV store.
inline void add_choices(ParsedRequest& pr, const std::vector<std::vector<int32_t>>& more_prompts, int n) {
  std::vector<std::vector<int32_t>> prompts = {pr.gen.prompt};
  prompts.insert(prompts.end(), more_prompts.begin(), more_prompts.end());
  const size_t total = prompts.size() * static_cast<size_t>(n);
  if (total > 64) bad(strfmt("at most 64 choices per request (%zu prompts x n=%d asked)", prompts.size(), n), "n");
  for (size_t i = 1; i < total; ++i) {
    GenRequest g = pr.gen;
    g.prompt = prompts[i / static_cast<size_t>(n)];
    g.sampling.seed = pr.gen.sampling.seed + i;
    pr.more.push_back(std::move(g));
  }
}

// A cheap bound before tokenizing: `bytes` of prompt text cannot fit when even the longest
// token could not pack them into the context. Tokenizing a 30 MB prompt only to refuse it took
// 15 s and 1.3 GB.
inline void check_prompt_bytes(const ServedModel& sm, size_t bytes, Surface surface, const char* param) {
  if (sm.max_token_bytes <= 0 || sm.ctx <= 0 || sm.ctx == INT64_MAX) return;
  const uint64_t cap = static_cast<uint64_t>(sm.ctx) * static_cast<uint64_t>(sm.max_token_bytes);
  if (bytes <= cap) return;
  if (surface == Surface::kMessages)
    bad(strfmt("prompt is too long: %zu bytes cannot fit in %lld tokens", bytes, (long long)sm.ctx), param,
        "context_length_exceeded");
  bad(strfmt("This model's maximum context length is %lld tokens. However, your prompt is %zu bytes, more than "
             "that context can hold. Please reduce the length of the messages or prompt.",
             (long long)sm.ctx, bytes),
      param, "context_length_exceeded");
}

inline size_t json_string_bytes(const ordered_json& j) {
  if (j.is_string()) return j.get_ref<const std::string&>().size();
  size_t n = 0;
  if (j.is_array() || j.is_object())
    for (const auto& v : j) n += json_string_bytes(v);
  return n;
}

// The prompt byte bound for a chat: the messages' text and, when the template renders tools at
// all, the tools' (their strings reach the prompt through tojson or field by field): 100k tools
// rendered and tokenized only to be refused took 7-10 s and 400 MB.
inline void check_chat_bytes(const ServedModel& sm, const ordered_json& msgs, const ordered_json& tools, Surface surface) {
  size_t bytes = json_string_bytes(msgs);
  if (tools.is_array() && !tools.empty() && sm.m && sm.m->template_choice.source.find("tools") != std::string::npos)
    bytes += json_string_bytes(tools);
  check_prompt_bytes(sm, bytes, surface, "messages");
}

// A list of token ids longer than the context holds no text this server could have produced or
// would accept (/detokenize: its text, up to the longest token's bytes per id, is never built).
inline void check_token_count(const ServedModel& sm, size_t n, const char* param) {
  if (sm.ctx <= 0 || sm.ctx == INT64_MAX || n <= static_cast<uint64_t>(sm.ctx)) return;
  bad(strfmt("%s holds %zu token ids, more than the context of %lld tokens", param, n, (long long)sm.ctx), param,
      "context_length_exceeded");
}

inline std::string text_of_content(const ordered_json& content, const char* where, bool allow_null) {
  if (content.is_null()) {
    if (!allow_null) bad(strfmt("%s.content must not be null", where), "messages");
    return {};
  }
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(strfmt("%s.content must be a string or an array of content parts", where), "messages");
  std::string text;
  for (const auto& part : content) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      bad(strfmt("%s.content parts must be objects with a type", where), "messages");
    const std::string type = part["type"].get<std::string>();
    if (type == "text" || type == "input_text") {
      if (!part.contains("text") || !part["text"].is_string()) bad(strfmt("%s text part needs a string text", where), "messages");
      text += part["text"].get<std::string>();
    } else if (type == "image_url" || type == "image" || type == "input_image") {
      bad("this model does not accept images (text-only model)", "messages");
    } else if (type == "input_audio" || type == "audio") {
      bad("audio input is not supported", "messages");
    } else {
      bad(strfmt("%s has an unknown content part type '%s'", where, type.c_str()), "messages");
    }
  }
  return text;
}

inline void encode_with_template(const ServedModel& sm, const ordered_json& msgs, const ordered_json& tools,
                          const ordered_json& extra, ParsedRequest& pr, bool continue_final = false) {
  pr.harmony = runtime::speaks_harmony(*sm.m);
  pr.gen.special_text = pr.harmony;
  runtime::ChatEncodeOptions o;
  o.continue_final_message = continue_final;
  o.tools = tools;
  o.extra = extra;
  std::string rendered;
  auto ids = runtime::encode_chat_json(*sm.m, msgs, o, &rendered);
  if (!ids.is_ok()) {
    std::string msg = ids.status().message();
    if (!sm.m->chat_template) msg = "this model has no chat template; use /v1/completions with a plain prompt";
    bad(msg, "messages");
  }
  pr.gen.prompt = std::move(*ids);
  const tokenizer::Tokenizer& tk = *sm.m->tokenizer;
  if (tk.token_to_id("<think>") && tk.token_to_id("</think>")) {
    pr.split_reasoning = true;
    const size_t open = rendered.rfind("<think>"), close = rendered.rfind("</think>");
    pr.reasoning_start_inside = open != std::string::npos && (close == std::string::npos || close < open);
  }
  // Only a model whose state cannot be cut back needs them (and the renders they cost).
  if (sm.m->model && sm.m->model->state_schema().needs_checkpoints())
    pr.gen.message_ends = runtime::chat_message_ends(*sm.m, msgs, o, rendered, pr.gen.prompt);
  // A template that writes BOS over a tokenizer that also adds one: keep one (server-api.md §4.2).
  const auto bos = sm.m->tokenizer->bos_id();
  if (bos && pr.gen.prompt.size() >= 2 && pr.gen.prompt[0] == *bos && pr.gen.prompt[1] == *bos) {
    pr.gen.prompt.erase(pr.gen.prompt.begin());
    for (int64_t& e : pr.gen.message_ends) --e;
  }
}

// How this model family writes tool calls, when the request offers tools (server-api.md §5.3).
inline runtime::ToolCallStyle tool_style_for(const ServedModel& sm, const ordered_json& tools) {
  if (!tools.is_array() || tools.empty()) return runtime::ToolCallStyle::kNone;
  const tokenizer::Tokenizer& tk = *sm.m->tokenizer;
  const std::string& tpl = sm.m->template_choice.source;  // the template in use (--chat-template or the model's)
  // Harmony writes its calls as channel messages (runtime/harmony.h), whatever else the vocabulary holds.
  if (runtime::speaks_harmony(*sm.m)) return runtime::ToolCallStyle::kNone;
  // Qwen3-Coder / Qwen3.5 templates teach <function=NAME><parameter=ARG> bodies inside the tags.
  if (tpl.find("<function=") != std::string::npos && tpl.find("<parameter=") != std::string::npos)
    return runtime::ToolCallStyle::kTaggedXml;
  if (tk.token_to_id("<tool_call>") || tpl.find("<tool_call>") != std::string::npos)
    return runtime::ToolCallStyle::kTagged;
  if (tk.token_to_id("<|python_tag|>") || tpl.find("<|python_tag|>") != std::string::npos ||
      tpl.find("\"parameters\": dictionary of argument") != std::string::npos)
    return runtime::ToolCallStyle::kBareJson;  // Llama 3.1+ JSON tool calling
  return runtime::ToolCallStyle::kNone;
}

// llama-server's adapter list `[{"id": i, "scale": s}, ...]` (a request's `lora`, the body of POST
// /lora-adapters): the scale of every served adapter — listed ones as given, the others 0, as
// llama-server does. 400 naming `field` for a list that is not one, an unknown id, a bad scale.
inline std::vector<float> lora_scales(const LoraTable* t, const ordered_json& list, const std::string& field) {
  const size_t n = t ? t->adapters().size() : 0;
  if (!list.is_array()) bad(field + " must be an array of {\"id\": int, \"scale\": number}", field);
  std::vector<float> scales(n, 0.0f);
  for (size_t i = 0; i < list.size(); ++i) {
    const ordered_json& e = list[i];
    const std::string at = strfmt("%s[%zu]", field.c_str(), i);
    if (!e.is_object()) bad(at + " must be an object {\"id\": int, \"scale\": number}", field);
    const ordered_json* id = get(e, "id");
    if (!id || !id->is_number_integer())
      bad(at + ".id must be an integer (an adapter id from GET /lora-adapters)", field);
    const int64_t k = id->get<int64_t>();
    if (k < 0 || static_cast<size_t>(k) >= n)
      bad(strfmt("%s.id: unknown adapter id %lld (this server has %zu: ids 0..%lld, see GET /lora-adapters)",
                 at.c_str(), static_cast<long long>(k), n, static_cast<long long>(n) - 1),
          field);
    const auto sc_it = e.find("scale");  // present but null is a bad scale, not the default
    const ordered_json* sc = sc_it == e.end() ? nullptr : &*sc_it;
    if (sc) {
      if (!sc->is_number() || !std::isfinite(sc->get<double>()) || std::abs(sc->get<double>()) > 1e4)
        bad(at + ".scale must be a finite number within [-10000, 10000]", field);
      scales[static_cast<size_t>(k)] = static_cast<float>(sc->get<double>());
    } else {
      scales[static_cast<size_t>(k)] = 1.0f;  // llama-server's default for a listed adapter
    }
  }
  return scales;
}

// The request's LoRA adapters and KV namespace (issue 45, server-api.md "LoRA adapters"): the
// per-request `lora` list when given; else the adapter `model` names (--lora NAME=…) at its
// scale; else the global scales (POST /lora-adapters; 0 until set: the base). The namespace is
// from the adapters' content and scales (runtime::lora_namespace) and the cache_salt. A server
// without adapters and a request without a list keep the one precomputed base namespace.
inline void apply_adapters(const ServedModel& sm, const ordered_json& b, GenRequest& g) {
  auto salt = string_field(b, "cache_salt");
  const LoraTable* t = sm.loras.get();
  const ordered_json* list = get(b, "lora");
  if (list && list->is_null()) list = nullptr;
  if ((!t || t->adapters().empty()) && !list) {
    g.ns = salt && !salt->empty() ? memory::namespace_id({}, *salt) : sm.ns_base;
    return;
  }
  // With adapters served, `model` means something: the served id (or none) is the base, a NAME
  // its adapter, and anything else a mistake — a misspelt NAME must not run the base silently.
  const ServedLora* picked = nullptr;
  if (auto name = string_field(b, "model"); name && !name->empty() && t && !t->adapters().empty()) {
    std::string n = *name;
    if (n.size() > 7 && n.compare(n.size() - 7, 7, ":latest") == 0) n.resize(n.size() - 7);  // Ollama's tag
    if (n != sm.id) {
      picked = t->by_name(n);
      if (!picked) {
        std::string names = "'" + sm.id + "'";
        for (const ServedLora& a : t->adapters()) names += ", '" + a.name + "'";
        bad(strfmt("model '%s' is neither the served model nor one of its --lora adapters (served: %s)",
                   name->c_str(), names.c_str()),
            "model", "model_not_found");
      }
    }
  }
  std::vector<float> scales;
  if (list) {
    scales = lora_scales(t, *list, "lora");
  } else {
    if (picked) {
      scales.assign(t->adapters().size(), 0.0f);
      scales[static_cast<size_t>(picked - t->adapters().data())] = picked->scale;
    } else {
      scales = t->global_scales();
    }
  }
  std::vector<models::LoraUse> uses;
  std::vector<std::shared_ptr<const models::BoundLora>> bound;
  for (size_t i = 0; i < scales.size() && t; ++i) {
    if (scales[i] == 0.0f) continue;
    uses.push_back({t->adapters()[i].bound->lora, scales[i]});
    bound.push_back(t->adapters()[i].bound);
  }
  auto r = runtime::lora_request(std::move(uses), bound, salt ? std::string_view(*salt) : std::string_view());
  if (!r.is_ok()) bad(r.status().message(), "lora");
  g.ns = std::move(r.value().ns);
  g.adapters = std::move(r.value().forward);
}

// The one of `names` a body gives (present and not null): none or several is a 400 naming them.
inline const char* one_of(const ordered_json& b, std::initializer_list<const char*> names) {
  const char* given = nullptr;
  std::string list;
  for (const char* n : names) {
    list += std::string(list.empty() ? "" : ", ") + n;
    if (!get(b, n)) continue;
    if (given) bad(strfmt("give only one of %s (this body has both %s and %s)", list.c_str(), given, n), n);
    given = n;
  }
  if (!given) {
    list.clear();
    for (const char* n : names) list += std::string(list.empty() ? "" : ", ") + n;
    bad(strfmt("the body needs one of %s", list.c_str()), *names.begin());
  }
  return given;
}

// A list of token ids: non-empty, every id an int in the vocabulary, no more than the context.
inline std::vector<int32_t> token_ids(const ServedModel& sm, const ordered_json& v, const char* param) {
  const int64_t V = sm.m->model->info().vocab;
  if (!v.is_array()) bad(strfmt("%s must be an array of token ids", param), param);
  if (v.empty()) bad(strfmt("%s must not be empty", param), param);
  check_token_count(sm, v.size(), param);
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const auto& t : v) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= V)
      bad(strfmt("%s must be ints in [0, %lld)", param, (long long)V), param);
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return ids;
}

// `model`, when given, names the served model: routes that answer about this server's state (its
// KV store) must not answer a question about another model with this one's numbers.
inline void served_model(const ServedModel& sm, const ordered_json& b) {
  const std::optional<std::string> name = string_field(b, "model");
  if (!name || *name == sm.id) return;
  if (sm.loras && sm.loras->by_name(*name)) return;  // a --lora NAME (apply_adapters picks it)
  bad(strfmt("model \"%s\" is not served here (this server serves \"%s\")", name->c_str(), sm.id.c_str()), "model",
      "model_not_found", 404);
}

inline ParsedRequest start(const ordered_json& b, const char* id_prefix, const char* route) {
  if (!b.is_object()) bad("the request body must be a JSON object");
  ParsedRequest pr;
  pr.response_id = random_id(id_prefix);
  pr.gen.id = pr.response_id;
  pr.gen.route = route;
  pr.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  pr.stream = boolean(b, "stream").value_or(false);
  return pr;
}

inline int64_t utf8_bytes_json(const std::string& s, ordered_json* out) {
  *out = ordered_json::array();
  for (unsigned char c : s) out->push_back(static_cast<int>(c));
  return static_cast<int64_t>(s.size());
}

}  // namespace larder::server::fields
