#include "larder/server/api.h"

#include <chrono>
#include <cmath>
#include <random>

#include "larder/memory/store/identity.h"

namespace larder::server {

namespace {

[[noreturn]] void bad(std::string message, std::string param = {}, std::string code = {}, int status = 400) {
  throw ApiError{status, std::move(message), std::move(param), std::move(code)};
}

// The field's value, or nullptr when absent or null (null means "not given" for every optional
// field of these APIs).
const ordered_json* get(const ordered_json& o, const char* name) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> number(const ordered_json& o, const char* name, double lo, double hi) {
  const ordered_json* v = get(o, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(strfmt("%s must be a number", name), name);
  const double d = v->get<double>();
  if (!std::isfinite(d)) bad(strfmt("%s must be a finite number", name), name);
  if (d < lo) bad(strfmt("%s must be at least %g", name, lo), name);
  if (d > hi) bad(strfmt("%s must be at most %g", name, hi), name);
  return d;
}

std::optional<int64_t> integer(const ordered_json& o, const char* name, int64_t lo, int64_t hi) {
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

std::optional<bool> boolean(const ordered_json& o, const char* name) {
  const ordered_json* v = get(o, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(strfmt("%s must be of type bool", name), name);
  return v->get<bool>();
}

std::optional<std::string> string_field(const ordered_json& o, const char* name) {
  const ordered_json* v = get(o, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad(strfmt("%s must be a string", name), name);
  return v->get<std::string>();
}

// A string field of a nested object, with a 400 naming it when it has another type (nlohmann's
// value() would throw a type_error, which surfaced as a 500).
std::string str_in(const ordered_json& o, const char* key, const std::string& where, const char* param,
                   const std::string& dflt = {}) {
  if (!o.is_object()) return dflt;
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return dflt;
  if (!it->is_string()) bad(strfmt("%s.%s must be a string", where.c_str(), key), param);
  return it->get<std::string>();
}

uint64_t random_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
         static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

// Options every surface shares: meaning-changing options larder cannot honour are refused.
void refuse_unsupported(const ordered_json& b) {
  if (auto n = integer(b, "best_of", 1, 1'000'000); n && *n != 1) bad("best_of > 1 is not supported", "best_of");
  if (auto e = boolean(b, "echo"); e && *e) bad("echo is not supported", "echo");
  if (get(b, "suffix")) bad("suffix is not supported", "suffix");
  // Until constrained decoding exists, a grammar would be silently ignored: refuse it.
  if (get(b, "grammar")) bad("grammar is not supported (no constrained decoding yet); remove the field", "grammar");
}

// max_tokens, else llama-server's n_predict (-1: as many as the context allows).
std::optional<int64_t> max_tokens_field(const ordered_json& b, const char* name) {
  if (auto m = integer(b, name, 1, INT64_MAX)) return m;
  if (auto n = integer(b, "n_predict", -1, INT64_MAX)) {
    if (*n == 0) bad("n_predict must be -1 (no limit) or at least 1", "n_predict");
    return *n < 0 ? INT64_MAX : *n;
  }
  return std::nullopt;
}

std::vector<std::string> stops(const ordered_json& b, const char* name) {
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

// Sampling parameters: request field → server defaults (flags over generation_config.json) →
// built-ins (server-api.md §3).
runtime::SamplingParams sampling(const ServedModel& sm, const ordered_json& b, bool with_penalties) {
  runtime::SamplingParams p;
  const ApiDefaults& d = sm.defaults;
  p.temperature = static_cast<float>(number(b, "temperature", 0, 5).value_or(d.temperature.value_or(0.7f)));
  p.top_p = static_cast<float>(number(b, "top_p", 0, 1).value_or(d.top_p.value_or(1.0f)));
  if (p.top_p == 0.0f) p.top_p = 1.0f;  // 0 = off (mlx_lm.server)
  p.top_k = static_cast<int>(integer(b, "top_k", 0, 1'000'000).value_or(d.top_k.value_or(0)));
  p.min_p = static_cast<float>(number(b, "min_p", 0, 1).value_or(d.min_p.value_or(0.0f)));
  // seed: any u64; -1 means "random" (llama-server's convention); absent: not reproducible.
  p.seed = random_seed();
  if (const ordered_json* sv = get(b, "seed")) {
    if (sv->is_number_unsigned()) {
      p.seed = sv->get<uint64_t>();
    } else if (sv->is_number_integer() && sv->get<int64_t>() == -1) {
      // random
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
  if (const ordered_json* lb = get(b, "logit_bias")) {
    if (!lb->is_object()) bad("logit_bias must be a dict of int to float", "logit_bias");
    const int64_t V = sm.m->model->info().vocab;
    for (const auto& [k, v] : lb->items()) {
      char* end = nullptr;
      errno = 0;
      const long long id = std::strtoll(k.c_str(), &end, 10);
      if (k.empty() || *end != '\0' || errno != 0 || !v.is_number()) bad("logit_bias must be a dict of int to float", "logit_bias");
      if (id < 0 || id >= V) bad(strfmt("logit_bias token id %lld is outside the vocabulary [0, %lld)", id, (long long)V), "logit_bias");
      const double x = v.get<double>();
      if (!std::isfinite(x) || x < -100 || x > 100) bad("logit_bias values must be between -100 and 100", "logit_bias");
      p.logit_bias[static_cast<int32_t>(id)] = static_cast<float>(x);
    }
  }
  return p;
}

// The prompt must leave room for one generated token; max_tokens is a ceiling, clamped to what
// the context allows (server-api.md §3, §10).
void fit_context(const ServedModel& sm, GenRequest& gen, std::optional<int64_t> requested, Surface surface,
                 const char* param) {
  const int64_t P = static_cast<int64_t>(gen.prompt.size());
  if (P == 0) bad("the prompt is empty", param);
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

void fit_context(const ServedModel& sm, ParsedRequest& pr, std::optional<int64_t> requested, Surface surface,
                 const char* param) {
  fit_context(sm, pr.gen, requested, surface, param);
}

// n samples per prompt (and, on /v1/completions, one or more prompts): choice i = prompt × n +
// sample, each its own GenRequest with seed + i, decoded in the same batches; their common
// prompt prefix is prefilled once through the KV store.
void add_choices(ParsedRequest& pr, const std::vector<std::vector<int32_t>>& more_prompts, int n) {
  std::vector<std::vector<int32_t>> prompts = {pr.gen.prompt};
  prompts.insert(prompts.end(), more_prompts.begin(), more_prompts.end());
  const size_t total = prompts.size() * static_cast<size_t>(n);
  if (total > 64) bad(strfmt("at most 64 choices per request (%zu prompts x n=%d asked)", prompts.size(), n), "n");
  if (total > 1 && pr.stream) bad("streaming more than one choice (n > 1 or a list of prompts) is not supported yet; use stream: false", "n");
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
void check_prompt_bytes(const ServedModel& sm, size_t bytes, Surface surface, const char* param) {
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

size_t json_string_bytes(const ordered_json& j) {
  if (j.is_string()) return j.get_ref<const std::string&>().size();
  size_t n = 0;
  if (j.is_array() || j.is_object())
    for (const auto& v : j) n += json_string_bytes(v);
  return n;
}

std::string text_of_content(const ordered_json& content, const char* where, bool allow_null) {
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

void encode_with_template(const ServedModel& sm, const ordered_json& msgs, const ordered_json& tools,
                          const ordered_json& extra, ParsedRequest& pr) {
  runtime::ChatEncodeOptions o;
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
  // A template that writes BOS over a tokenizer that also adds one: keep one (server-api.md §4.2).
  const auto bos = sm.m->tokenizer->bos_id();
  if (bos && pr.gen.prompt.size() >= 2 && pr.gen.prompt[0] == *bos && pr.gen.prompt[1] == *bos)
    pr.gen.prompt.erase(pr.gen.prompt.begin());
}

// How this model family writes tool calls, when the request offers tools (server-api.md §5.3).
runtime::ToolCallStyle tool_style_for(const ServedModel& sm, const ordered_json& tools) {
  if (!tools.is_array() || tools.empty()) return runtime::ToolCallStyle::kNone;
  const tokenizer::Tokenizer& tk = *sm.m->tokenizer;
  if (tk.token_to_id("<tool_call>") || sm.m->files.chat_template.find("<tool_call>") != std::string::npos)
    return runtime::ToolCallStyle::kTagged;
  const std::string& tpl = sm.m->files.chat_template;
  if (tk.token_to_id("<|python_tag|>") || tpl.find("<|python_tag|>") != std::string::npos ||
      tpl.find("\"parameters\": dictionary of argument") != std::string::npos)
    return runtime::ToolCallStyle::kBareJson;  // Llama 3.1+ JSON tool calling
  return runtime::ToolCallStyle::kNone;
}

std::string namespace_for(const ServedModel& sm, const ordered_json& b) {
  auto salt = string_field(b, "cache_salt");
  return salt && !salt->empty() ? memory::namespace_id({}, *salt) : sm.ns_base;
}

ParsedRequest start(const ordered_json& b, const char* id_prefix, const char* route) {
  if (!b.is_object()) bad("the request body must be a JSON object");
  ParsedRequest pr;
  pr.response_id = random_id(id_prefix);
  pr.gen.id = pr.response_id;
  pr.gen.route = route;
  pr.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  pr.stream = boolean(b, "stream").value_or(false);
  return pr;
}

int64_t utf8_bytes_json(const std::string& s, ordered_json* out) {
  *out = ordered_json::array();
  for (unsigned char c : s) out->push_back(static_cast<int>(c));
  return static_cast<int64_t>(s.size());
}

}  // namespace

std::string random_id(const std::string& prefix) {
  static const char kAlphabet[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  thread_local std::mt19937_64 rng(random_seed());
  std::string s = prefix;
  for (int i = 0; i < 24; ++i) s += kAlphabet[rng() % 62];
  return s;
}

const char* openai_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 500: return "server_error";
    case 503: return "unavailable_error";
    default: return "invalid_request_error";
  }
}

ordered_json openai_error_body(const ApiError& e) {
  ordered_json err = {{"message", e.message}, {"type", openai_error_type(e.status)}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return {{"error", err}};
}

ordered_json anthropic_error_body(const ApiError& e) {
  const char* type = "invalid_request_error";
  switch (e.status) {
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 500: type = "api_error"; break;
    case 503: case 529: type = "overloaded_error"; break;
    default: break;
  }
  return {{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}};
}

ParsedRequest parse_chat(const ServedModel& sm, const ordered_json& b) {
  ParsedRequest pr = start(b, "chatcmpl-", "/v1/chat/completions");
  refuse_unsupported(b);
  const ordered_json* msgs = get(b, "messages");
  if (!msgs) bad("messages is required", "messages");
  if (!msgs->is_array()) bad("messages must be an array", "messages");
  if (msgs->empty()) bad("messages must not be empty", "messages");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ordered_json& m = (*msgs)[i];
    const std::string where = strfmt("messages[%zu]", i);
    if (!m.is_object()) bad(where + " must be an object", "messages");
    if (!m.contains("role") || !m["role"].is_string()) bad(where + ".role must be a string", "messages");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      bad(strfmt("%s.role '%s' is not one of system, developer, user, assistant, tool", where.c_str(), role.c_str()),
          "messages");
    }
    ordered_json msg = {{"role", role}};
    const bool has_calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
    if (!m.contains("content") && !(role == "assistant" && has_calls)) bad(where + ".content is required", "messages");
    msg["content"] = text_of_content(m.contains("content") ? m["content"] : ordered_json(), where.c_str(),
                                     role == "assistant");
    if (has_calls) {
      if (!m["tool_calls"].is_array()) bad(where + ".tool_calls must be an array", "messages");
      ordered_json calls = ordered_json::array();
      for (const auto& c : m["tool_calls"]) {
        if (!c.is_object()) bad(where + ".tool_calls entries must be objects", "messages");
        ordered_json call = c;
        if (c.contains("function") && c["function"].is_object() && c["function"].contains("arguments") &&
            c["function"]["arguments"].is_string()) {
          // Templates expect the arguments as an object (they tojson it themselves).
          auto parsed = ordered_json::parse(c["function"]["arguments"].get<std::string>(), nullptr, false);
          if (!parsed.is_discarded()) call["function"]["arguments"] = parsed;
        }
        calls.push_back(call);
      }
      msg["tool_calls"] = calls;
    }
    for (const char* k : {"name", "tool_call_id", "reasoning_content", "reasoning"}) {
      if (m.contains(k) && !m[k].is_null()) msg[k] = m[k];
    }
    out.push_back(std::move(msg));
  }
  // The conversation rules llama-server enforces (clients written against it rely on the 400).
  if (out.size() >= 2 && out[out.size() - 1]["role"] == "assistant" && out[out.size() - 2]["role"] == "assistant")
    bad("cannot have 2 or more assistant messages at the end of the list", "messages");
  {
    const bool agp = boolean(b, "add_generation_prompt").value_or(true);
    const bool cont = boolean(b, "continue_final_message").value_or(false);
    if (agp && cont && get(b, "add_generation_prompt"))
      bad("add_generation_prompt and continue_final_message cannot both be true", "continue_final_message");
    if (cont) bad("continue_final_message is not supported yet", "continue_final_message");
    if (!agp) bad("add_generation_prompt: false is not supported on this route (use /apply-template)", "add_generation_prompt");
  }
  ordered_json tools;
  if (const ordered_json* t = get(b, "tools")) {
    if (!t->is_array()) bad("tools must be an array", "tools");
    tools = *t;
  }
  if (const ordered_json* tc = get(b, "tool_choice")) {
    if (tc->is_string() && tc->get<std::string>() == "none") {
      tools = ordered_json();
    } else if ((tc->is_string() && tc->get<std::string>() == "required") || tc->is_object()) {
      // Passed to the template; forcing a call needs constrained decoding (not built yet).
      pr.warnings.push_back("tool_choice not enforced");
    }
  }
  ordered_json extra = ordered_json::object();
  if (const ordered_json* k = get(b, "chat_template_kwargs")) {
    if (!k->is_object()) bad("chat_template_kwargs must be an object", "chat_template_kwargs");
    extra = *k;
  }
  if (auto effort = string_field(b, "reasoning_effort"); effort && !extra.contains("enable_thinking"))
    extra["enable_thinking"] = *effort != "none";
  // response_format: without constrained decoding, say so and steer the model with an
  // instruction carrying the schema — never silently ignore it (server-api.md §4.1).
  if (const ordered_json* rf = get(b, "response_format")) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      bad("response_format must be an object with a type", "response_format");
    const std::string type = (*rf)["type"].get<std::string>();
    std::string instruction;
    if (type == "json_object") {
      instruction = "Respond with a single valid JSON object and nothing else.";
    } else if (type == "json_schema") {
      const ordered_json schema = rf->contains("json_schema") && (*rf)["json_schema"].is_object()
                                      ? (*rf)["json_schema"].value("schema", ordered_json::object())
                                      : ordered_json::object();
      instruction = "Respond with a single valid JSON value that conforms to this JSON schema, and nothing else:\n" +
                    schema.dump();
    } else if (type != "text") {
      bad("response_format.type must be text, json_object or json_schema", "response_format");
    }
    if (!instruction.empty()) {
      pr.warnings.push_back("grammar not enforced: no constrained decoding; schema given as a system instruction");
      if (!out.empty() && out[0]["role"] == "system") {
        out[0]["content"] = out[0]["content"].get<std::string>() + "\n\n" + instruction;
      } else {
        out.insert(out.begin(), ordered_json{{"role", "system"}, {"content", instruction}});
      }
    }
  }

  pr.tool_style = tool_style_for(sm, tools);
  pr.gen.sampling = sampling(sm, b, true);
  // Thinking-aware default temperature: with no explicit temperature and thinking turned off,
  // cap the default at 0.7 (server-api.md §3).
  if (!get(b, "temperature") && extra.contains("enable_thinking") && extra["enable_thinking"] == false)
    pr.gen.sampling.temperature = std::min(pr.gen.sampling.temperature, 0.7f);
  pr.gen.stops = stops(b, "stop");
  pr.logprobs = boolean(b, "logprobs").value_or(false);
  const auto top = integer(b, "top_logprobs", 0, 20);
  pr.top_logprobs = static_cast<int>(top.value_or(0));
  pr.gen.top_logprobs = pr.logprobs ? pr.top_logprobs : -1;
  if (const ordered_json* so = get(b, "stream_options")) {
    if (!so->is_object()) bad("stream_options must be an object", "stream_options");
    pr.include_usage = boolean(*so, "include_usage").value_or(false);
  }
  std::optional<int64_t> max = integer(b, "max_completion_tokens", 1, INT64_MAX);
  if (!max) max = max_tokens_field(b, "max_tokens");
  if (!max) max = sm.defaults.max_tokens;
  pr.gen.ns = namespace_for(sm, b);
  check_prompt_bytes(sm, json_string_bytes(out), Surface::kChat, "messages");
  encode_with_template(sm, out, tools, extra, pr);
  fit_context(sm, pr, max, Surface::kChat, "messages");
  add_choices(pr, {}, static_cast<int>(integer(b, "n", 1, 64).value_or(1)));
  return pr;
}

int64_t longest_token_bytes(const runtime::LoadedModel& m) {
  const int64_t V = m.model->info().vocab;
  int64_t longest = 0;
  for (int64_t id = 0; id < V; ++id)
    longest = std::max<int64_t>(longest, static_cast<int64_t>(m.tokenizer->decode({static_cast<int32_t>(id)}, false).size()));
  return longest;
}

std::string render_chat_prompt(const ServedModel& sm, const ordered_json& b) {
  if (!sm.m->chat_template) bad("this model has no chat template", "messages");
  runtime::ChatEncodeOptions o;
  if (const ordered_json* t = get(b, "tools")) {
    if (!t->is_array()) bad("tools must be an array", "tools");
    o.tools = *t;
  }
  o.extra = ordered_json::object();
  if (const ordered_json* k = get(b, "chat_template_kwargs")) {
    if (!k->is_object()) bad("chat_template_kwargs must be an object", "chat_template_kwargs");
    o.extra = *k;
  }
  if (auto agp = boolean(b, "add_generation_prompt")) o.add_generation_prompt = *agp;
  std::string rendered;
  auto ids = runtime::encode_chat_json(*sm.m, b["messages"], o, &rendered);
  if (!ids.is_ok()) bad(ids.status().message(), "messages");
  return rendered;
}

ParsedRequest parse_completion(const ServedModel& sm, const ordered_json& b) {
  ParsedRequest pr = start(b, "cmpl-", "/v1/completions");
  refuse_unsupported(b);
  const ordered_json* prompt = get(b, "prompt");
  if (!prompt) bad("prompt is required", "prompt");
  const int64_t V = sm.m->model->info().vocab;
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) prompt = &(*prompt)[0];
  // A list of prompts: strings, or lists of token ids. The first becomes pr.gen.
  std::vector<std::vector<int32_t>> more;
  if (prompt->is_array() && prompt->size() > 1 && ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    if (prompt->size() > 64) bad("at most 64 prompts per request", "prompt");
    std::vector<std::vector<int32_t>> all;
    for (const auto& p : *prompt) {
      std::vector<int32_t> ids;
      if (p.is_string()) {
        check_prompt_bytes(sm, p.get_ref<const std::string&>().size(), Surface::kCompletions, "prompt");
        ids = sm.m->tokenizer->encode(p.get<std::string>(), /*add_special=*/true);
      } else if (p.is_array()) {
        for (const auto& t : p) {
          if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= V)
            bad(strfmt("prompt token ids must be integers in [0, %lld)", (long long)V), "prompt");
          ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
        }
      } else {
        bad("a list of prompts must hold strings or arrays of token ids", "prompt");
      }
      all.push_back(std::move(ids));
    }
    pr.gen.prompt = all[0];
    more.assign(all.begin() + 1, all.end());
  } else if (prompt->is_string()) {
    check_prompt_bytes(sm, prompt->get_ref<const std::string&>().size(), Surface::kCompletions, "prompt");
    pr.gen.prompt = sm.m->tokenizer->encode(prompt->get<std::string>(), /*add_special=*/true);
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number()) {
    for (const auto& t : *prompt) {
      if (!t.is_number_integer()) bad("prompt token ids must be integers", "prompt");
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id >= V) bad(strfmt("prompt token id %lld is outside the vocabulary [0, %lld)", (long long)id, (long long)V), "prompt");
      pr.gen.prompt.push_back(static_cast<int32_t>(id));
    }
  } else if (prompt->is_array()) {
    bad("prompt must be a string, an array of token ids, or a list of those", "prompt");
  } else {
    bad("prompt must be a string or an array of token ids", "prompt");
  }
  pr.gen.sampling = sampling(sm, b, true);
  pr.gen.stops = stops(b, "stop");
  if (auto lp = integer(b, "logprobs", 0, 20)) {
    pr.logprobs = true;
    pr.top_logprobs = static_cast<int>(*lp);
    pr.gen.top_logprobs = pr.top_logprobs;
  }
  if (const ordered_json* so = get(b, "stream_options")) {
    if (!so->is_object()) bad("stream_options must be an object", "stream_options");
    pr.include_usage = boolean(*so, "include_usage").value_or(false);
  }
  std::optional<int64_t> max = max_tokens_field(b, "max_tokens");
  if (!max) max = sm.defaults.max_tokens.value_or(512);  // mlx_lm.server's completions default
  pr.gen.ns = namespace_for(sm, b);
  fit_context(sm, pr, max, Surface::kCompletions, "prompt");
  add_choices(pr, more, static_cast<int>(integer(b, "n", 1, 64).value_or(1)));
  for (GenRequest& g : pr.more) fit_context(sm, g, max, Surface::kCompletions, "prompt");
  return pr;
}

ParsedRequest parse_messages(const ServedModel& sm, const ordered_json& b) {
  ParsedRequest pr = start(b, "msg_", "/v1/messages");
  ordered_json out = ordered_json::array();
  if (const ordered_json* sys = get(b, "system")) {
    std::string text;
    if (sys->is_string()) {
      text = sys->get<std::string>();
    } else if (sys->is_array()) {
      for (const auto& blk : *sys) {
        if (!blk.is_object() || str_in(blk, "type", "system[]", "system") != "text" || !blk.contains("text") ||
            !blk["text"].is_string())
          bad("system must be a string or an array of text blocks", "system");
        if (!text.empty()) text += "\n";
        text += blk["text"].get<std::string>();
      }
    } else {
      bad("system must be a string or an array of text blocks", "system");
    }
    if (!text.empty()) out.push_back({{"role", "system"}, {"content", text}});
  }
  const ordered_json* msgs = get(b, "messages");
  if (!msgs) bad("messages: field required", "messages");
  if (!msgs->is_array()) bad("messages must be an array", "messages");
  if (msgs->empty()) bad("messages must not be empty", "messages");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ordered_json& m = (*msgs)[i];
    const std::string where = strfmt("messages.%zu", i);
    if (!m.is_object()) bad(where + " must be an object", "messages");
    if (!m.contains("role") || !m["role"].is_string()) bad(where + ".role must be a string", "messages");
    const std::string role = m["role"].get<std::string>();
    if (role != "user" && role != "assistant") bad(strfmt("%s.role '%s' must be user or assistant", where.c_str(), role.c_str()), "messages");
    if (!m.contains("content")) bad(where + ".content: field required", "messages");
    const ordered_json& c = m["content"];
    if (c.is_string()) {
      out.push_back({{"role", role}, {"content", c.get<std::string>()}});
      continue;
    }
    if (!c.is_array()) bad(where + ".content must be a string or an array of content blocks", "messages");
    std::string text;
    ordered_json calls = ordered_json::array();
    for (const auto& blk : c) {
      if (!blk.is_object() || !blk.contains("type") || !blk["type"].is_string())
        bad(where + ".content blocks must be objects with a type", "messages");
      const std::string type = blk["type"].get<std::string>();
      if (type == "text") {
        if (!blk.contains("text") || !blk["text"].is_string()) bad(where + " text block needs a string text", "messages");
        text += blk["text"].get<std::string>();
      } else if (type == "image" || type == "document") {
        bad("this model does not accept images (text-only model)", "messages");
      } else if (type == "thinking" || type == "redacted_thinking") {
        // dropped on re-ingest
      } else if (type == "tool_use") {
        const ordered_json input = blk.contains("input") && !blk["input"].is_null() ? blk["input"] : ordered_json::object();
        if (!input.is_object()) bad(where + " tool_use.input must be an object", "messages");
        calls.push_back({{"id", str_in(blk, "id", where + ".tool_use", "messages")}, {"type", "function"},
                         {"function", {{"name", str_in(blk, "name", where + ".tool_use", "messages")}, {"arguments", input}}}});
      } else if (type == "tool_result") {
        std::string rt;
        if (blk.contains("content")) {
          const ordered_json& rc = blk["content"];
          rt = rc.is_string() ? rc.get<std::string>() : text_of_content(rc, where.c_str(), true);
        }
        out.push_back({{"role", "tool"}, {"tool_call_id", str_in(blk, "tool_use_id", where + ".tool_result", "messages")},
                       {"content", rt}});
      } else {
        bad(strfmt("%s has an unknown content block type '%s'", where.c_str(), type.c_str()), "messages");
      }
    }
    if (!text.empty() || !calls.empty()) {
      ordered_json msg = {{"role", role}, {"content", text}};
      if (!calls.empty()) msg["tool_calls"] = calls;
      out.push_back(msg);
    }
  }
  ordered_json tools;
  if (const ordered_json* t = get(b, "tools")) {
    if (!t->is_array()) bad("tools must be an array", "tools");
    tools = ordered_json::array();
    for (const auto& tool : *t) {
      if (!tool.is_object() || !tool.contains("name")) continue;  // server tools (web search, ...) dropped
      if (!tool["name"].is_string()) bad("tools[].name must be a string", "tools");
      const ordered_json schema = tool.contains("input_schema") && !tool["input_schema"].is_null() ? tool["input_schema"]
                                                                                                : ordered_json::object();
      if (!schema.is_object()) bad("tools[].input_schema must be an object", "tools");
      tools.push_back({{"type", "function"},
                       {"function", {{"name", tool["name"]}, {"description", str_in(tool, "description", "tools[]", "tools")},
                                     {"parameters", schema}}}});
    }
  }
  if (const ordered_json* tc = get(b, "tool_choice")) {
    if (!tc->is_object()) bad("tool_choice must be an object", "tool_choice");
    if (str_in(*tc, "type", "tool_choice", "tool_choice") == "none") tools = ordered_json();
  }
  ordered_json extra = ordered_json::object();
  if (const ordered_json* th = get(b, "thinking")) {
    if (!th->is_object()) bad("thinking must be an object", "thinking");
    const std::string type = str_in(*th, "type", "thinking", "thinking");
    extra["enable_thinking"] = type == "enabled";
    pr.thinking_requested = type == "enabled";
  }

  pr.tool_style = tool_style_for(sm, tools);
  runtime::SamplingParams sp = sampling(sm, b, false);
  pr.gen.sampling = sp;
  pr.gen.stops = stops(b, "stop_sequences");
  std::optional<int64_t> max = integer(b, "max_tokens", 1, INT64_MAX);
  if (!max) max = sm.defaults.max_tokens;
  pr.gen.ns = namespace_for(sm, b);
  check_prompt_bytes(sm, json_string_bytes(out), Surface::kMessages, "messages");
  encode_with_template(sm, out, tools, extra, pr);
  fit_context(sm, pr, max, Surface::kMessages, "messages");
  return pr;
}

// ---- responses --------------------------------------------------------------------------------

ResponseWriter::ResponseWriter(const ServedModel& sm, const ParsedRequest& pr, Surface surface)
    : sm_(sm), pr_(pr), surface_(surface) {
  if (pr.split_reasoning && surface != Surface::kCompletions) splitter_.emplace(pr.reasoning_start_inside);
  if (pr.tool_style != runtime::ToolCallStyle::kNone && surface != Surface::kCompletions) tool_parser_.emplace(pr.tool_style);
}

ResponseWriter::Pieces ResponseWriter::process(const std::string& text, bool final) {
  Pieces o;
  if (splitter_) {
    runtime::ReasoningSplitter::Out r = splitter_->push(text);
    if (final) {
      auto f = splitter_->flush();
      r.content += f.content;
      r.reasoning += f.reasoning;
    }
    o.content = std::move(r.content);
    // Anthropic returns reasoning only when the request enabled thinking (server-api.md §8.2).
    if (surface_ != Surface::kMessages || pr_.thinking_requested) o.reasoning = std::move(r.reasoning);
  } else {
    o.content = text;
  }
  if (tool_parser_) {
    std::string c = tool_parser_->push(o.content);
    if (final) c += tool_parser_->flush();
    o.content = std::move(c);
    o.calls = tool_parser_->take_calls();
    for (const auto& call : o.calls) {
      calls_.push_back(call);
      call_ids_.push_back(random_id(surface_ == Surface::kMessages ? "toolu_" : "call_"));
    }
  }
  return o;
}

ordered_json ResponseWriter::tool_calls_json() const {
  ordered_json a = ordered_json::array();
  for (size_t i = 0; i < calls_.size(); ++i) {
    a.push_back({{"id", call_ids_[i]}, {"type", "function"},
                 {"function", {{"name", calls_[i].name}, {"arguments", calls_[i].arguments.dump()}}}});
  }
  return a;
}

std::string ResponseWriter::finish_reason() const {
  if (!calls_.empty() && outcome_.finish != Finish::kLength) return surface_ == Surface::kMessages ? "tool_use" : "tool_calls";
  switch (outcome_.finish) {
    case Finish::kLength: return surface_ == Surface::kMessages ? "max_tokens" : "length";
    case Finish::kStop:
      if (surface_ == Surface::kMessages) return outcome_.matched_stop.empty() ? "end_turn" : "stop_sequence";
      return "stop";
    default: return surface_ == Surface::kMessages ? "end_turn" : "stop";
  }
}

ordered_json ResponseWriter::usage_json() const {
  const Outcome& o = outcome_;
  ordered_json ext = {{"cache", {{"tier", o.cache_tier}, {"reason", o.cache_reason}}},
                      {"timings",
                       {{"queue_ms", o.queue_ms}, {"prefill_ms", o.prefill_ms}, {"ttft_ms", o.ttft_ms},
                        {"decode_ms", o.decode_ms},
                        {"prefill_tps", o.prefill_ms > 0 ? (o.prompt_tokens - o.cached_tokens) / (o.prefill_ms / 1e3) : 0.0},
                        {"decode_tps", o.decode_ms > 0 && o.completion_tokens > 1
                                           ? (o.completion_tokens - 1) / (o.decode_ms / 1e3) : 0.0}}}};
  if (surface_ == Surface::kMessages) {
    return {{"input_tokens", o.prompt_tokens - o.cached_tokens},
            {"output_tokens", o.completion_tokens},
            {"cache_read_input_tokens", o.cached_tokens},
            {"cache_creation_input_tokens", 0}};
  }
  return {{"prompt_tokens", o.prompt_tokens},
          {"completion_tokens", o.completion_tokens},
          {"total_tokens", o.prompt_tokens + o.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", o.cached_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", 0}}},
          {"larder", ext}};
}

namespace {
int64_t utf8_chars(const std::string& s) {  // characters started in s (continuation bytes skipped)
  int64_t n = 0;
  for (unsigned char c : s) n += (c >> 6) != 2;
  return n;
}
}  // namespace

// Token strings are the exact pieces the output text is made of (leading spaces kept), so they
// join back into it; `bytes` carries the raw bytes, which matter for a token that holds only
// part of a UTF-8 character (its `token` string then shows U+FFFD). text_offset counts
// characters from the start of the completion.
ordered_json ResponseWriter::logprobs_json(const std::vector<TokenInfo>& toks) const {
  const tokenizer::Tokenizer& tk = *sm_.m->tokenizer;
  auto piece = [&](int32_t id) { return tk.token_bytes(id); };
  // Invalid UTF-8 is replaced by U+FFFD when the JSON is written (error_handler_t::replace).
  auto shown = [](const std::string& p) { return p; };
  if (surface_ == Surface::kCompletions) {  // legacy shape
    ordered_json tokens = ordered_json::array(), lps = ordered_json::array(), tops = ordered_json::array(),
                 offs = ordered_json::array();
    for (const TokenInfo& t : toks) {
      const std::string p = piece(t.id);
      tokens.push_back(shown(p));
      lps.push_back(t.lp.logprob);
      ordered_json top = ordered_json::object();
      for (const auto& [id, lp] : t.lp.top) top[shown(piece(id))] = lp;
      tops.push_back(top);
      offs.push_back(lp_offset_);
      lp_offset_ += utf8_chars(p);
    }
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
  }
  ordered_json content = ordered_json::array();
  for (const TokenInfo& t : toks) {
    const std::string s = piece(t.id);
    ordered_json bytes;
    utf8_bytes_json(s, &bytes);
    ordered_json top = ordered_json::array();
    for (const auto& [id, lp] : t.lp.top) {
      const std::string ts = piece(id);
      ordered_json tb;
      utf8_bytes_json(ts, &tb);
      top.push_back({{"token", shown(ts)}, {"logprob", lp}, {"bytes", tb}, {"id", id}});
    }
    content.push_back({{"token", shown(s)}, {"logprob", t.lp.logprob}, {"bytes", bytes}, {"id", t.id}, {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

ordered_json ResponseWriter::chunk(ordered_json choice) const {
  ordered_json c = {{"id", pr_.response_id},
                    {"object", surface_ == Surface::kChat ? "chat.completion.chunk" : "text_completion"},
                    {"created", pr_.created},
                    {"model", sm_.id},
                    {"system_fingerprint", sm_.fingerprint}};
  choice["index"] = index_;
  c["choices"] = ordered_json::array({choice});
  if (pr_.include_usage) c["usage"] = nullptr;
  return c;
}

namespace {
std::string sse(const ordered_json& j) { return "data: " + j.dump(-1, ' ', false, ordered_json::error_handler_t::replace) + "\n\n"; }
std::string sse_event(const char* type, const ordered_json& j) {
  return std::string("event: ") + type + "\n" + sse(j);
}
}  // namespace

std::string ResponseWriter::stream_open() {
  if (opened_) return {};
  opened_ = true;
  if (surface_ == Surface::kChat) {
    ordered_json choice = {{"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    return sse(chunk(choice));
  }
  if (surface_ == Surface::kMessages) {
    ordered_json usage = {{"input_tokens", outcome_.prompt_tokens - outcome_.cached_tokens},
                          {"output_tokens", 0},
                          {"cache_read_input_tokens", outcome_.cached_tokens},
                          {"cache_creation_input_tokens", 0}};
    ordered_json msg = {{"id", pr_.response_id}, {"type", "message"}, {"role", "assistant"}, {"model", sm_.id},
                        {"content", ordered_json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                        {"usage", usage}};
    return sse_event("message_start", {{"type", "message_start"}, {"message", msg}});
  }
  return {};  // completions: no opening chunk
}

// Content blocks open lazily, in the order the model produces them (a thinking block, then the
// text block); switching type closes the open one.
std::string ResponseWriter::anthropic_block(const char* type) {
  if (block_type_ == type && block_type_ != "tool_use") return {};
  std::string out;
  if (block_index_ >= 0) out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", block_index_}});
  ++block_index_;
  block_type_ = type;
  ordered_json block = block_type_ == "thinking" ? ordered_json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                                 : ordered_json{{"type", "text"}, {"text", ""}};
  return out + sse_event("content_block_start", {{"type", "content_block_start"}, {"index", block_index_}, {"content_block", block}});
}

std::string ResponseWriter::stream_frames(const Event& e) {
  std::string out;
  if (e.admitted) {
    outcome_.prompt_tokens = e.outcome.prompt_tokens;
    outcome_.cached_tokens = e.outcome.cached_tokens;
    return stream_open();
  }
  out += stream_open();
  const size_t calls_before = calls_.size();
  const Pieces parts = surface_ == Surface::kCompletions ? Pieces{e.text, {}, {}} : process(e.text, e.done);
  const bool has_text = !parts.content.empty() || !parts.reasoning.empty();
  if (has_text || (!e.tokens.empty() && pr_.logprobs && surface_ != Surface::kMessages)) {
    if (surface_ == Surface::kChat) {
      ordered_json delta = ordered_json::object();
      if (!parts.reasoning.empty()) delta["reasoning_content"] = parts.reasoning;
      if (!parts.content.empty()) delta["content"] = parts.content;
      ordered_json choice = {{"delta", delta}, {"logprobs", pr_.logprobs ? logprobs_json(e.tokens) : ordered_json()},
                             {"finish_reason", nullptr}};
      out += sse(chunk(choice));
    } else if (surface_ == Surface::kCompletions) {
      ordered_json choice = {{"text", parts.content}, {"logprobs", pr_.logprobs ? logprobs_json(e.tokens) : ordered_json()},
                             {"finish_reason", nullptr}};
      out += sse(chunk(choice));
    } else {
      if (!parts.reasoning.empty()) {
        out += anthropic_block("thinking");
        out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", block_index_},
                                                 {"delta", {{"type", "thinking_delta"}, {"thinking", parts.reasoning}}}});
      }
      if (!parts.content.empty()) {
        out += anthropic_block("text");
        out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", block_index_},
                                                 {"delta", {{"type", "text_delta"}, {"text", parts.content}}}});
      }
    }
  }
  // Completed tool calls: OpenAI sends a header delta (id, name) then the arguments, matched by
  // index; Anthropic a tool_use block with its input as one input_json_delta.
  for (size_t i = calls_before; i < calls_.size(); ++i) {
    const std::string args = calls_[i].arguments.dump();
    if (surface_ == Surface::kChat) {
      const int idx = static_cast<int>(i);
      ordered_json head = {{"tool_calls", ordered_json::array({{{"index", idx}, {"id", call_ids_[i]}, {"type", "function"},
                                                                 {"function", {{"name", calls_[i].name}, {"arguments", ""}}}}})}};
      out += sse(chunk({{"delta", head}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
      ordered_json argd = {{"tool_calls", ordered_json::array({{{"index", idx}, {"function", {{"arguments", args}}}}})}};
      out += sse(chunk({{"delta", argd}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
    } else if (surface_ == Surface::kMessages) {
      if (block_index_ >= 0) out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", block_index_}});
      ++block_index_;
      block_type_ = "tool_use";
      out += sse_event("content_block_start",
                       {{"type", "content_block_start"}, {"index", block_index_},
                        {"content_block", {{"type", "tool_use"}, {"id", call_ids_[i]}, {"name", calls_[i].name},
                                           {"input", ordered_json::object()}}}});
      out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", block_index_},
                                               {"delta", {{"type", "input_json_delta"}, {"partial_json", args}}}});
    }
  }
  if (!e.done) return out;
  outcome_ = e.outcome;
  if (outcome_.finish == Finish::kError || outcome_.finish == Finish::kCancelled) {
    const std::string msg = outcome_.error.empty() ? "generation was cancelled" : outcome_.error;
    if (surface_ == Surface::kMessages) {
      return out + sse_event("error", {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", msg}}}});
    }
    return out + sse({{"error", {{"message", msg}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}}) +
           "data: [DONE]\n\n";
  }
  if (surface_ == Surface::kMessages) {
    if (block_index_ < 0) out += anthropic_block("text");  // a message always has a content block
    out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", block_index_}});
    ordered_json stop_seq = outcome_.matched_stop.empty() ? ordered_json() : ordered_json(outcome_.matched_stop);
    out += sse_event("message_delta", {{"type", "message_delta"},
                                       {"delta", {{"stop_reason", finish_reason()}, {"stop_sequence", stop_seq}}},
                                       {"usage", {{"output_tokens", outcome_.completion_tokens}}}});
    out += sse_event("message_stop", {{"type", "message_stop"}});
    return out;
  }
  ordered_json choice = surface_ == Surface::kChat
                            ? ordered_json{{"delta", ordered_json::object()}, {"logprobs", nullptr}, {"finish_reason", finish_reason()}}
                            : ordered_json{{"text", ""}, {"logprobs", nullptr}, {"finish_reason", finish_reason()}};
  ordered_json last = chunk(choice);
  if (pr_.include_usage) {
    out += sse(last);
    ordered_json u = {{"id", pr_.response_id}, {"object", last["object"]}, {"created", pr_.created},
                      {"model", sm_.id}, {"system_fingerprint", sm_.fingerprint},
                      {"choices", ordered_json::array()}, {"usage", usage_json()}};
    out += sse(u);
  } else {
    last["usage"] = usage_json();  // mlx-bun behaviour: usage on the final chunk
    out += sse(last);
  }
  return out + "data: [DONE]\n\n";
}

void ResponseWriter::add(const Event& e) {
  if (e.admitted) {
    outcome_.prompt_tokens = e.outcome.prompt_tokens;
    outcome_.cached_tokens = e.outcome.cached_tokens;
    return;
  }
  if (surface_ == Surface::kCompletions) {
    text_ += e.text;
  } else {
    const Pieces parts = process(e.text, e.done);
    text_ += parts.content;
    reasoning_ += parts.reasoning;
  }
  tokens_.insert(tokens_.end(), e.tokens.begin(), e.tokens.end());
  if (e.done) outcome_ = e.outcome;
}

ordered_json ResponseWriter::body() const {
  if (surface_ == Surface::kMessages) {
    ordered_json stop_seq = outcome_.matched_stop.empty() ? ordered_json() : ordered_json(outcome_.matched_stop);
    ordered_json content = ordered_json::array();
    if (!reasoning_.empty()) content.push_back({{"type", "thinking"}, {"thinking", reasoning_}, {"signature", ""}});
    if (!text_.empty() || calls_.empty()) content.push_back({{"type", "text"}, {"text", text_}});
    for (size_t i = 0; i < calls_.size(); ++i)
      content.push_back({{"type", "tool_use"}, {"id", call_ids_[i]}, {"name", calls_[i].name}, {"input", calls_[i].arguments}});
    return {{"id", pr_.response_id}, {"type", "message"}, {"role", "assistant"}, {"model", sm_.id},
            {"content", content}, {"stop_reason", finish_reason()}, {"stop_sequence", stop_seq}, {"usage", usage_json()}};
  }
  ordered_json lp = pr_.logprobs ? logprobs_json(tokens_) : ordered_json();
  ordered_json choice;
  if (surface_ == Surface::kChat) {
    ordered_json msg = {{"role", "assistant"}, {"content", text_}, {"refusal", nullptr}};
    if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
    if (!calls_.empty()) {
      msg["tool_calls"] = tool_calls_json();
      if (text_.empty()) msg["content"] = nullptr;  // OpenAI: null content when there are only calls
    }
    choice = {{"index", index_}, {"message", msg}, {"logprobs", lp}, {"finish_reason", finish_reason()}};
  } else {
    choice = {{"index", index_}, {"text", text_}, {"logprobs", lp}, {"finish_reason", finish_reason()}};
  }
  return {{"id", pr_.response_id},
          {"object", surface_ == Surface::kChat ? "chat.completion" : "text_completion"},
          {"created", pr_.created},
          {"model", sm_.id},
          {"system_fingerprint", sm_.fingerprint},
          {"choices", ordered_json::array({choice})},
          {"usage", usage_json()}};
}

}  // namespace larder::server
