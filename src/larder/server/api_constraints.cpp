#include "larder/server/api_constraints.h"

#include "larder/runtime/tool_grammar.h"
#include "larder/server/api_fields.h"

namespace larder::server::constraints {

using namespace fields;

namespace {

thread_local const CompileAbandon* t_abandon = nullptr;

// The compile runs on the grammar engine's compile threads while this (HTTP worker) thread
// waits; a grammar error or a limit is the client's: 400 naming the field.
void set_constraint(const ServedModel& sm, ParsedRequest& pr, const runtime::ConstraintSpec& spec, const char* param,
                    const char* what) {
  if (pr.gen.constraint)
    bad(strfmt("%s cannot be combined with another output constraint (%s) in one request", param,
               pr.constraint_source.c_str()),
        param);
  if (!sm.m || !sm.m->grammar) bad("constrained decoding is not available for this model", param, {}, 500);
  runtime::CompileWait wait;
  const CompileAbandon* a = t_abandon;
  auto gone = [a] { return a && a->client_gone && a->client_gone(); };
  if (a) wait.abandon = [a, gone] { return gone() || (a->draining && a->draining()); };
  auto c = sm.m->grammar->compile(spec, wait);
  if (!c.is_ok()) {
    const Status& st = c.status();
    if (st.code() == StatusCode::kCancelled) {
      if (gone()) bad("the client disconnected while its grammar compiled", param, {}, 499);
      bad("the server is shutting down", param, {}, 503);
    }
    bad(strfmt("%s: %s", param, st.message().c_str()), param, {},
        st.code() == StatusCode::kResourceExhausted ? 503 : 400);
  }
  pr.gen.constraint = std::move(*c);
  pr.constraint_source = what;
}

void check_schema(const ordered_json& schema, const std::string& where, const char* param) {
  Status st = runtime::check_json_schema(schema);
  if (!st.is_ok()) bad(where + ": " + st.message(), param);
}

const ordered_json* find_tool(const ordered_json& tools, const std::string& name) {
  if (!tools.is_array()) return nullptr;
  for (const auto& t : tools)
    if (t.is_object() && t.contains("function") && t["function"].is_object() && t["function"].value("name", "") == name)
      return &t;
  return nullptr;
}

}  // namespace

AbandonScope::AbandonScope(CompileAbandon a) : a_(std::move(a)), prev_(t_abandon) { t_abandon = &a_; }
AbandonScope::~AbandonScope() { t_abandon = prev_; }

ToolChoice openai_tool_choice(const ordered_json& b, const ordered_json& tools) {
  ToolChoice c;
  c.parallel = boolean(b, "parallel_tool_calls").value_or(true);
  const ordered_json* tc = get(b, "tool_choice");
  if (!tc) return c;
  if (tc->is_string()) {
    const std::string s = tc->get<std::string>();
    if (s == "none") c.mode = ToolChoice::Mode::kNone;
    else if (s == "auto") c.mode = ToolChoice::Mode::kAuto;
    else if (s == "required") c.mode = ToolChoice::Mode::kRequired;
    else bad("tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice");
  } else if (tc->is_object()) {
    if (str_in(*tc, "type", "tool_choice", "tool_choice") != "function" || !tc->contains("function") ||
        !(*tc)["function"].is_object())
      bad("tool_choice object must be {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice");
    c.mode = ToolChoice::Mode::kNamed;
    c.name = str_in((*tc)["function"], "name", "tool_choice.function", "tool_choice");
  } else {
    bad("tool_choice must be a string or an object", "tool_choice");
  }
  if ((c.mode == ToolChoice::Mode::kRequired || c.mode == ToolChoice::Mode::kNamed) && (!tools.is_array() || tools.empty()))
    bad("tool_choice requires a tool call, but no tools were given", "tool_choice");
  if (c.mode == ToolChoice::Mode::kNamed && !find_tool(tools, c.name))
    bad(strfmt("tool_choice names the function '%s', which is not among the tools", c.name.c_str()), "tool_choice");
  return c;
}

ToolChoice anthropic_tool_choice(const ordered_json& b, const ordered_json& tools) {
  ToolChoice c;
  const ordered_json* tc = get(b, "tool_choice");
  if (!tc) return c;
  if (!tc->is_object()) bad("tool_choice must be an object", "tool_choice");
  const std::string type = str_in(*tc, "type", "tool_choice", "tool_choice");
  if (auto d = boolean(*tc, "disable_parallel_tool_use")) c.parallel = !*d;
  if (type == "auto") c.mode = ToolChoice::Mode::kAuto;
  else if (type == "none") c.mode = ToolChoice::Mode::kNone;
  else if (type == "any") c.mode = ToolChoice::Mode::kRequired;
  else if (type == "tool") {
    c.mode = ToolChoice::Mode::kNamed;
    c.name = str_in(*tc, "name", "tool_choice", "tool_choice");
    if (c.name.empty()) bad("tool_choice.name is required when tool_choice.type is tool", "tool_choice");
  } else {
    bad("tool_choice.type must be auto, any, tool or none", "tool_choice");
  }
  if ((c.mode == ToolChoice::Mode::kRequired || c.mode == ToolChoice::Mode::kNamed) && (!tools.is_array() || tools.empty()))
    bad("tool_choice requires a tool call, but no tools were given", "tool_choice");
  if (c.mode == ToolChoice::Mode::kNamed && !find_tool(tools, c.name))
    bad(strfmt("tool_choice names the tool '%s', which is not among the tools", c.name.c_str()), "tool_choice");
  return c;
}

void apply_tool_choice(const ServedModel& sm, const ordered_json& tools, const ToolChoice& choice, ParsedRequest& pr,
                       const char* param) {
  if (choice.mode == ToolChoice::Mode::kNone || !tools.is_array() || tools.empty()) return;
  runtime::ToolGrammarSpec spec;
  spec.forced = choice.mode != ToolChoice::Mode::kAuto;
  if (!spec.forced && pr.gen.constraint) return;  // response_format already shapes the whole answer
  spec.parallel = choice.parallel;
  // encode_with_template ran first: whether the model speaks harmony, and whether the rendered
  // prompt left a <think> block open, are known.
  if (pr.harmony) {
    spec.harmony = runtime::harmony_tokens(*sm.m->tokenizer);
    if (!spec.harmony) {  // its output is read as channels, so no other call form would be parsed
      if (!spec.forced) return;
      bad("this model's vocabulary lacks <|start|>, which a forced harmony tool call needs", param);
    }
  } else {
    spec.style = pr.tool_style;
    if (spec.style == runtime::ToolCallStyle::kNone) {
      if (!spec.forced) return;  // no trigger known for this family: auto stays free text
      spec.style = runtime::ToolCallStyle::kTagged;
      pr.tool_style = spec.style;
    }
    spec.think_open = pr.split_reasoning && pr.reasoning_start_inside;
  }
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
    const ordered_json& f = t["function"];
    const std::string name = f.value("name", "");
    if (name.empty()) continue;
    if (choice.mode == ToolChoice::Mode::kNamed && name != choice.name) continue;
    ordered_json params = f.contains("parameters") && !f["parameters"].is_null() ? f["parameters"]
                                                                                  : ordered_json{{"type", "object"}};
    check_schema(params, strfmt("tools[%zu] (%s) parameters", i, name.c_str()), param);
    spec.functions.push_back({name, std::move(params)});
  }
  const std::string tag = runtime::tool_call_structural_tag(spec);
  if (tag.empty()) return;
  set_constraint(sm, pr, {runtime::ConstraintSpec::Kind::kStructuralTag, tag}, param,
                 spec.forced ? "a forced tool call" : "tool-call arguments");
}

std::string apply_response_format(const ServedModel& sm, const ordered_json& b, ParsedRequest& pr) {
  const ordered_json* rf = get(b, "response_format");
  if (!rf) return {};
  if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
    bad("response_format must be an object with a type", "response_format");
  const std::string type = (*rf)["type"].get<std::string>();
  if (type == "text") return {};
  runtime::ConstraintSpec spec;
  std::string instruction;
  const ordered_json* object_schema = type == "json_object" ? get(*rf, "schema") : nullptr;
  if (object_schema && !object_schema->is_null()) {
    // llama-server's json_object with a schema: the schema is enforced, as with json_schema.
    if (!object_schema->is_object() && !object_schema->is_boolean())
      bad("response_format.schema must be an object (a JSON schema)", "response_format");
    check_schema(*object_schema, "response_format.schema", "response_format");
    spec = {runtime::ConstraintSpec::Kind::kJsonSchema, object_schema->dump(), true};
    instruction =
        "Respond with a single valid JSON value that conforms to this JSON schema, and nothing else:\n" + object_schema->dump();
  } else if (type == "json_object") {
    // Any JSON object (not strict: a strict empty-object schema would only allow {}).
    spec = {runtime::ConstraintSpec::Kind::kJsonSchema, R"({"type": "object"})", false};
    instruction = "Respond with a single valid JSON object and nothing else.";
  } else if (type == "json_schema") {
    const ordered_json* js = get(*rf, "json_schema");
    if (!js || !js->is_object()) bad("response_format.json_schema must be an object with a schema", "response_format");
    const ordered_json* schema = get(*js, "schema");
    if (schema && !schema->is_object() && !schema->is_boolean())
      bad("response_format.json_schema.schema must be an object", "response_format");
    const ordered_json s = schema ? *schema : ordered_json{{"type", "object"}};
    check_schema(s, "response_format.json_schema.schema", "response_format");
    const bool strict = boolean(*js, "strict").value_or(true);
    spec = {runtime::ConstraintSpec::Kind::kJsonSchema, s.dump(), strict && schema != nullptr};
    instruction = "Respond with a single valid JSON value that conforms to this JSON schema, and nothing else:\n" + s.dump();
  } else {
    bad("response_format.type must be text, json_object or json_schema", "response_format");
  }
  set_constraint(sm, pr, spec, "response_format", ("response_format " + type).c_str());
  return instruction;
}

void apply_ollama_format(const ServedModel& sm, const ordered_json& b, ParsedRequest& pr) {
  const ordered_json* f = get(b, "format");
  if (!f || (f->is_string() && f->get<std::string>().empty())) return;
  if (f->is_string()) {
    if (f->get<std::string>() != "json") bad("format must be \"json\" or a JSON schema object", "format");
    set_constraint(sm, pr, {runtime::ConstraintSpec::Kind::kJsonSchema, R"({"type": "object"})", false}, "format",
                   "format json");
    return;
  }
  if (!f->is_object()) bad("format must be \"json\" or a JSON schema object", "format");
  check_schema(*f, "format", "format");
  set_constraint(sm, pr, {runtime::ConstraintSpec::Kind::kJsonSchema, f->dump(), true}, "format", "format schema");
}

void apply_native_fields(const ServedModel& sm, const ordered_json& b, ParsedRequest& pr) {
  if (const ordered_json* g = get(b, "grammar")) {
    if (!g->is_string()) bad("grammar must be a string (GBNF)", "grammar");
    if (!g->get<std::string>().empty())
      set_constraint(sm, pr, {runtime::ConstraintSpec::Kind::kGbnf, g->get<std::string>()}, "grammar", "grammar");
  }
  if (const ordered_json* js = get(b, "json_schema")) {
    if (!js->is_object() && !js->is_boolean()) bad("json_schema must be an object (a JSON schema)", "json_schema");
    check_schema(*js, "json_schema", "json_schema");
    set_constraint(sm, pr, {runtime::ConstraintSpec::Kind::kJsonSchema, js->dump(), true}, "json_schema", "json_schema");
  }
}

}  // namespace larder::server::constraints
