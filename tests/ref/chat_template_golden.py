#!/usr/bin/env python3
"""Golden outputs for larder's chat-template engine, rendered by transformers itself.

Writes OUT/chat_template/golden.json (every real template x many chat contexts, rendered with
transformers.utils.chat_template_utils.render_jinja_template after the same message
normalization apply_chat_template does) and OUT/chat_template/engine.json (small hand-written
templates exercising one construct each, rendered by the same HF-configured jinja2 environment).
When jinja2 raises, the case records the error; raise_exception errors (plain TemplateError)
record the message, which larder must reproduce.

strftime_now is made deterministic by replacing the datetime class the renderer calls.
"""
import argparse
import copy
import datetime as _dt
import glob
import json
import os
import sys

import jinja2
from transformers.utils import chat_template_utils as ctu

FIXED_NOW = _dt.datetime(2025, 3, 7, 14, 5, 9)


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


ctu.datetime = _FixedDatetime  # strftime_now() calls datetime.now()


def _error_record(e):
    return {
        "ok": False,
        "error_type": type(e).__name__,
        "error": str(e),
        # raise_exception() raises a plain TemplateError; jinja2's own errors are subclasses.
        "raised": type(e) is jinja2.exceptions.TemplateError,
    }


def render_chat(source, messages, tools, add_generation_prompt, bos_token, eos_token, extra):
    """Exactly what tokenizer.apply_chat_template(..., tokenize=False) does with these inputs."""
    extra = dict(extra)
    documents = extra.pop("documents", None)
    conversation = ctu._normalize_chat_messages(copy.deepcopy(messages))
    special = {}
    if bos_token:
        special["bos_token"] = bos_token
    if eos_token:
        special["eos_token"] = eos_token
    template_kwargs = {**special, **extra}
    try:
        rendered, _ = ctu.render_jinja_template(
            conversations=[conversation],
            tools=copy.deepcopy(tools),
            documents=copy.deepcopy(documents),
            chat_template=source,
            add_generation_prompt=add_generation_prompt,
            **template_kwargs,
        )
        return {"ok": True, "output": rendered[0]}
    except Exception as e:  # noqa: BLE001 - every failure is a recorded expectation
        return _error_record(e)


# ----------------------------------------------------------------------------- tools

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"},
            },
            "required": ["location"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_web",
        "description": 'Search the web for "quoted" things & <tags>, it\'s fine',
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Query text"},
                "max_results": {"type": "integer", "description": "Max results", "default": 5, "minimum": 1, "maximum": 50},
                "temperature": {"type": "number", "description": "Sampling temperature", "default": 0.5},
                "filters": {
                    "type": "object",
                    "description": "Nested filters",
                    "properties": {
                        "site": {"type": "string", "description": "Restrict to site"},
                        "lang": {"type": "array", "items": {"type": "string"}, "description": "Languages"},
                    },
                    "required": ["site"],
                },
                "recency": {"type": ["string", "null"], "description": "Time window"},
                "safe": {"type": "boolean", "description": "Safe search", "nullable": True},
            },
            "required": ["query"],
        },
    },
}
NO_PARAMS = {
    "type": "function",
    "function": {"name": "get_time", "description": "Returns the current time.", "parameters": {"type": "object", "properties": {}}},
}
CODE_INTERPRETER = {"type": "code_interpreter"}

# ----------------------------------------------------------------------------- messages

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "What's the weather like in Paris today?"}
A1 = {"role": "assistant", "content": "It is sunny and 22 degrees."}
U2 = {"role": "user", "content": "And tomorrow?"}
UNICODE = {
    "role": "user",
    "content": "It's \"quoted\" \\ back\\slash\nnew line\ttab, émoji 🎉, 中文, ünïcödé \u00a0nbsp {{ not jinja }} {% raw %}",
}


def tool_call(name, args, as_string, call_id="call12345"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args) if as_string else args}}


def tool_calls_turn(calls, content=None):
    m = {"role": "assistant", "tool_calls": calls}
    m["content"] = content  # None is dropped by apply_chat_template, like the OpenAI API's null
    return m


def tool_result(content, call_id="call12345", name="get_current_weather"):
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


WEATHER_ARGS = {"location": "Paris, France", "unit": "celsius"}
SEARCH_ARGS = {"query": "larder \"engine\" é", "max_results": 3, "filters": {"site": "example.com", "lang": ["en", "fr"]}}

SCENARIOS = []


def scenario(name, messages, tools=None, extra=None, bos="<|begin_of_text|>", eos="<|eot_id|>"):
    SCENARIOS.append({"name": name, "messages": messages, "tools": tools, "extra": extra or {}, "bos_token": bos, "eos_token": eos})


scenario("user_only", [U1])
scenario("system_user", [SYS, U1])
scenario("multi_turn", [SYS, U1, A1, U2])
scenario("multi_turn_no_system", [U1, A1, U2])
scenario("assistant_last", [SYS, U1, A1])
scenario("unicode_quotes", [SYS, UNICODE])
scenario("unicode_assistant", [UNICODE, {"role": "assistant", "content": "Ça va? «guillemets» 'single' \"double\" \\n literal"}, U2])
scenario("empty_system", [{"role": "system", "content": ""}, U1])
scenario("whitespace_content", [{"role": "system", "content": "  padded system  \n"}, {"role": "user", "content": "\n  hi  \n"}])
scenario("no_special_tokens", [SYS, U1], bos="", eos="")
scenario("other_special_tokens", [U1, A1, U2], bos="<s>", eos="</s>")
scenario("tools_single", [U1], tools=[WEATHER])
scenario("tools_single_system", [SYS, U1], tools=[WEATHER])
scenario("tools_multi", [SYS, U1], tools=[WEATHER, SEARCH, NO_PARAMS])
scenario("tools_empty_list", [SYS, U1], tools=[])
scenario("tool_call_object_args", [SYS, U1, tool_calls_turn([tool_call("get_current_weather", WEATHER_ARGS, False)]),
                                   tool_result('{"temperature": 22, "condition": "sunny"}')], tools=[WEATHER])
scenario("tool_call_string_args", [SYS, U1, tool_calls_turn([tool_call("get_current_weather", WEATHER_ARGS, True)]),
                                   tool_result('{"temperature": 22, "condition": "sunny"}')], tools=[WEATHER])
scenario("tool_call_then_answer", [U1, tool_calls_turn([tool_call("get_current_weather", WEATHER_ARGS, True)]),
                                   tool_result("22 degrees and sunny"), {"role": "assistant", "content": "It is 22 degrees and sunny."}, U2],
         tools=[WEATHER])
scenario("tool_calls_parallel", [SYS, {"role": "user", "content": "Weather in Paris and search the web."},
                                 tool_calls_turn([tool_call("get_current_weather", WEATHER_ARGS, True, "call00001"),
                                                  tool_call("search_web", SEARCH_ARGS, True, "call00002")]),
                                 tool_result("sunny", "call00001"), tool_result("3 results", "call00002", "search_web")],
         tools=[WEATHER, SEARCH])
scenario("tool_calls_parallel_objects", [{"role": "user", "content": "Weather in Paris and search the web."},
                                         tool_calls_turn([tool_call("get_current_weather", WEATHER_ARGS, False, "call00001"),
                                                          tool_call("search_web", SEARCH_ARGS, False, "call00002")]),
                                         tool_result("sunny", "call00001"), tool_result("3 results", "call00002", "search_web")],
         tools=[WEATHER, SEARCH])
scenario("tool_call_with_content", [U1, tool_calls_turn([tool_call("get_current_weather", WEATHER_ARGS, False)], "Let me check that."),
                                    tool_result("sunny")], tools=[WEATHER])
scenario("tool_call_without_tools", [U1, tool_calls_turn([tool_call("get_current_weather", WEATHER_ARGS, True)]), tool_result("sunny")])
scenario("tool_result_dict_content", [U1, tool_calls_turn([tool_call("get_current_weather", WEATHER_ARGS, False)]),
                                      {"role": "tool", "tool_call_id": "call12345", "content": {"temperature": 22.5, "unit": "celsius", "ok": True, "none": None}}],
         tools=[WEATHER])
scenario("typed_content", [{"role": "system", "content": [{"type": "text", "text": "Typed system."}]},
                           {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": "this please."}]}])
scenario("typed_content_user_only", [{"role": "user", "content": [{"type": "text", "text": "Hello typed"}]}])
scenario("reasoning_content", [U1, {"role": "assistant", "content": "It's sunny.", "reasoning_content": "The user wants weather. I recall Paris."}, U2])
scenario("reasoning_last_turn", [U1, {"role": "assistant", "content": "It's sunny.", "reasoning_content": "Think about Paris."}])
scenario("reasoning_alias_thinking", [U1, {"role": "assistant", "content": "Fine.", "thinking": "hmm"}, U2])
scenario("think_tags_in_content", [U1, {"role": "assistant", "content": "<think>\nReasoning here.\n</think>\n\nThe answer."}, U2])
scenario("think_tags_last", [U1, {"role": "assistant", "content": "<think>\nReasoning here.\n</think>\n\nThe answer."}])
scenario("enable_thinking_false", [SYS, U1], extra={"enable_thinking": False})
scenario("enable_thinking_true", [SYS, U1], extra={"enable_thinking": True})
scenario("enable_thinking_false_multi", [U1, A1, U2], extra={"enable_thinking": False})
scenario("roles_not_alternating", [U1, U2])
scenario("system_only", [SYS])
scenario("assistant_first", [A1, U1])
scenario("unknown_role", [{"role": "narrator", "content": "Once upon a time"}, U1])
scenario("mistral_ids", [U1, tool_calls_turn([tool_call("get_current_weather", WEATHER_ARGS, False, "abcDEF123")]),
                         tool_result("sunny", "abcDEF123"), {"role": "assistant", "content": "Sunny."}, U2], tools=[WEATHER])
scenario("builtin_tools", [SYS, {"role": "user", "content": "Search for larder"},
                           tool_calls_turn([tool_call("brave_search", {"query": "larder engine"}, False)]),
                           {"role": "ipython", "content": "results..."}],
         extra={"builtin_tools": ["brave_search", "wolfram_alpha", "code_interpreter"]})
# gpt-oss (harmony) template kwargs and fields: reasoning_effort, model_identity, builtin_tools
# browser/python, an assistant tool-call turn with `thinking` (kept while no final answer follows).
scenario("harmony_kwargs", [SYS, U1], tools=[WEATHER, SEARCH, NO_PARAMS],
         extra={"reasoning_effort": "high", "model_identity": "You are larder's test model.", "builtin_tools": ["browser", "python"]})
scenario("harmony_tool_call_thinking", [U1, {"role": "assistant", "thinking": "I should call the weather tool.",
                                            "tool_calls": [tool_call("get_current_weather", WEATHER_ARGS, False)]},
                                        tool_result('{"temperature": 22}')], tools=[WEATHER], extra={"reasoning_effort": "low"})
scenario("harmony_thinking_last", [U1, {"role": "assistant", "content": "Sunny.", "thinking": "Paris in March."}])
scenario("tools_not_in_user_message", [SYS, U1], tools=[WEATHER], extra={"tools_in_user_message": False})
scenario("custom_date", [SYS, U1], extra={"date_string": "01 Jan 2030"})
scenario("firefunction_extras", [SYS, U1, tool_calls_turn([tool_call("get_current_weather", WEATHER_ARGS, True)]),
                                 tool_result("sunny")],
         tools=[WEATHER], extra={"functions": json.dumps([WEATHER["function"]], indent=2), "datetime": "2025-03-07"})
scenario("documents", [SYS, U1], extra={"documents": [{"title": "Paris", "text": "Paris weather is mild."},
                                                      {"title": "Lyon", "text": "Lyon \"quotes\""}]})
scenario("citations", [U1], tools=[WEATHER], extra={"enable_citations": True})
scenario("code_interpreter_tool", [U1], tools=[CODE_INTERPRETER, WEATHER])
scenario("long_conversation", [SYS] + [m for i in range(6) for m in (
    {"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": f"Answer {i}."})] + [U2])
scenario("name_field", [{"role": "user", "content": "Hi", "name": "alice"}, {"role": "assistant", "content": "Hello alice", "name": "bot"}, U2])
scenario("tool_response_user_wrapped", [U1, {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}])


def collect_templates(shared):
    out = []
    for path in sorted(glob.glob(os.path.join(shared, "chat-templates", "*.jinja"))):
        with open(path, encoding="utf-8") as f:
            out.append((os.path.basename(path)[: -len(".jinja")], f.read()))
    # Templates committed with the tests (each notes its source in tests/ref/templates/README.md).
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
    for path in sorted(glob.glob(os.path.join(here, "*.jinja"))):
        with open(path, encoding="utf-8") as f:
            out.append((os.path.basename(path)[: -len(".jinja")], f.read()))
    for cfg in sorted(glob.glob(os.path.join(shared, "tokenizers", "hf", "*", "tokenizer_config.json"))):
        with open(cfg, encoding="utf-8") as f:
            data = json.load(f)
        tmpl = data.get("chat_template")
        model = os.path.basename(os.path.dirname(cfg))
        if isinstance(tmpl, str):
            out.append((f"hf-{model}", tmpl))
        elif isinstance(tmpl, list):
            for entry in tmpl:
                out.append((f"hf-{model}-{entry['name']}", entry["template"]))
    return out


# ----------------------------------------------------------------------------- engine cases

ENGINE = []


def case(case_name, template, **context):
    ENGINE.append({"name": case_name, "template": template, "context": context})


# literals, printing, numbers
case("print_types", "{{ 1 }}|{{ 1.0 }}|{{ 2.5e-7 }}|{{ 1e16 }}|{{ 1e15 }}|{{ -0.0 }}|{{ none }}|{{ None }}|{{ true }}|{{ False }}|{{ 'a' }}")
case("print_containers", "{{ [1, 'a', none, true, 1.5, {'k': \"it's\"}] }}|{{ (1,) }}|{{ (1, 'b') }}|{{ {} }}|{{ [] }}|{{ d }}", d={"a": [1, {"b": None}], "c": "x\ny"})
case("print_repr_escapes", "{{ [s] }}", s="q'uote \"dq\" back\\slash\n\t\r \x01 \x7f é \u00a0 \u200b \U0001F389")
case("print_repr_double_quotes", "{{ [a, b, c] }}", a="it's", b='say "hi"', c="both ' and \"")
case("print_undefined", "[{{ missing }}][{{ d.missing }}][{{ d['missing'] }}][{{ l[10] }}][{{ s[99] }}]", d={}, l=[1], s="abc")
case("float_repr", "{{ 0.1 + 0.2 }}|{{ 1/3 }}|{{ 10/2 }}|{{ 2**0.5 }}|{{ 1e-5 }}|{{ 123456789.123 }}|{{ 1.5e300 * 1 }}|{{ 3.0 * 2 }}")
case("int_ops", "{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 2 ** -1 }}|{{ 7 / 2 }}|{{ -2 ** 2 }}|{{ true + 1 }}|{{ 5 - 7 }}")
case("float_ops", "{{ 7.5 // 2 }}|{{ -7.5 % 2 }}|{{ 1.5 * 2 }}|{{ 0.5 + 1 }}")
case("string_ops", "{{ 'ab' * 3 }}|{{ 3 * 'x' }}|{{ 'a' + 'b' }}|{{ 'x' ~ 1 ~ none ~ missing ~ [1] }}|{{ [1] + [2] }}|{{ [0] * 3 }}")
case("json_scalars_from_context", "{{ i }}|{{ f }}|{{ b }}|{{ n }}|{{ big }}|{{ f2 }}", i=3, f=2.0, b=False, n=None, big=12345678901234, f2=0.30000000000000004)
case("string_literals", "{{ 'a\\nb' }}|{{ \"tab\\tq\\\"\" }}|{{ 'uni \\u00e9 \\x41 \\U0001F600' }}|{{ 'adj' 'acent' }}|{{ 'keep \\d' }}")
# truthiness, tests, precedence
case("truthiness", "{% for v in vals %}{{ 'T' if v else 'F' }}{% endfor %}|{{ 'T' if missing else 'F' }}", vals=["", "a", [], [0], {}, {"a": 1}, 0, 1, 0.0, None, False, True])
case("tests_basic", "{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ n is none }}{{ x is none }}{{ s is string }}{{ x is string }}{{ x is number }}{{ f is number }}{{ b is number }}{{ d is mapping }}{{ l is mapping }}{{ l is iterable }}{{ s is iterable }}{{ x is iterable }}{{ y is iterable }}{{ d is iterable }}",
     x=1, n=None, s="str", f=1.5, b=True, d={}, l=[])
case("tests_more", "{{ b is true }}{{ b is false }}{{ x is true }}{{ x is integer }}{{ f is integer }}{{ f is float }}{{ b is boolean }}{{ x is odd }}{{ x is even }}{{ 9 is divisibleby 3 }}{{ x is eq 1 }}{{ x is equalto 1 }}{{ x is ne 2 }}{{ x is lt 2 }}{{ x is gt 0 }}{{ 'a' is in 'abc' }}{{ s is lower }}{{ s is upper }}{{ l is sequence }}",
     b=True, x=1, f=1.0, s="abc", l=[1])
case("tests_sameas", "{{ n is sameas none }}{{ b is sameas true }}{{ x is sameas false }}", n=None, b=True, x=0)
case("precedence_not_is", "{{ not x is defined }}|{{ not y is defined }}|{{ not x is none }}|{{ x is not none }}|{{ not 1 == 2 }}|{{ not (1 == 2) and false }}", x=1)
case("precedence_filters", "{{ 2 * 3 | string }}|{{ -x | abs }}|{{ l | length - 1 }}|{{ 'a' ~ l | length }}|{{ 1 + 2 * 3 - 4 / 2 }}|{{ (1 + 2) * 3 }}", x=5, l=[1, 2, 3])
case("precedence_ternary", "{{ 'a' if x else 'b' }}|{{ 'a' if not x else 'b' }}|{{ 'y' if x > 0 and x < 10 else 'n' }}|[{{ 'only' if false }}]|{{ 1 if false else 2 if true else 3 }}", x=3)
case("and_or_values", "{{ x or 'default' }}|{{ y or 'default' }}|{{ x and 'yes' }}|{{ y and 'yes' }}|{{ none or [] }}|{{ 0 or '' or 'last' }}", x="val", y="")
case("comparisons", "{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ 1 == 1.0 }}{{ 1 == true }}{{ 'a' != 'b' }}{{ [1] == [1] }}{{ {'a': 1} == {'a': 1} }}{{ none == none }}{{ missing == missing }}{{ 2 >= 2 }}{{ 1.5 <= 1 }}")
case("in_operator", "{{ 'a' in 'cat' }}{{ 'z' not in 'cat' }}{{ 1 in [1, 2] }}{{ 'k' in d }}{{ 'v' in d }}{{ 3 not in [1] }}{{ 'x' in missing }}{{ (1, 2) in [(1, 2)] }}", d={"k": "v"})
# attributes, items, methods
case("getattr_vs_getitem", "{{ d.items is defined }}|{{ d['items'] }}|{{ d.type }}|{{ d['type'] }}|{{ d.get('type') }}|{{ d.get('nope', 'dflt') }}|{{ d.get('nope') }}|{{ d.values is defined }}",
     d={"items": {"type": "string"}, "type": "array"})
case("none_attr", "[{{ n.attr }}][{{ n['k'] }}]", n=None)
case("dict_methods", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.keys() | list }}|{{ d.values() | list }}|{% for k in d %}{{ k }}{% endfor %}", d={"b": 1, "a": [2], "c": {"x": None}})
case("list_index_negative", "{{ l[0] }}{{ l[-1] }}{{ l[-2] }}|{{ l.index(3) }}|{{ l.count(2) }}|{{ t[1] }}|{{ l.0 }}", l=[1, 2, 3], t=("a", "b"))
case("slicing", "{{ l[1:] }}|{{ l[:2] }}|{{ l[::-1] }}|{{ l[::2] }}|{{ l[-2:] }}|{{ l[1:-1] }}|{{ l[5:] }}|{{ s[::-1] }}|{{ s[1:3] }}|{{ s[-3:] }}|{{ u[1:] }}|{{ u[::-1] }}|{{ u[0] }}",
     l=[1, 2, 3, 4], s="hello", u="éa🎉b")
case("string_methods", "{{ s.upper() }}|{{ s.lower() }}|{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.title() }}|{{ s.capitalize() }}|{{ s.startswith('  He') }}|{{ s.strip().endswith('d!') }}|{{ s.replace('l', 'L') }}|{{ s.replace('l', '', 1) }}|{{ s.find('o') }}|{{ s.count('l') }}|{{ s.strip().split(' ') }}|{{ s.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}",
     s="  Hello World!  ")
case("string_methods_2", "{{ s.strip('xy') }}|{{ s.lstrip('x') }}|{{ s.rstrip('y') }}|{{ 'abc'.startswith(('x', 'a')) }}|{{ '1234'.isdigit() }}|{{ 'ab'.isalpha() }}|{{ ' '.isspace() }}|{{ 'x'.center(5, '*') }}|{{ '42'.zfill(5) }}|{{ 'a-b-c'.partition('-') }}|{{ '{} and {}'.format('x', 1) }}|{{ '{0}{name}'.format('p', name='n') }}|{{ 'l1\\nl2\\r\\nl3'.splitlines() }}|{{ 'ÉCOLE'.lower() }}|{{ 'straße'.upper() }}",
     s="xxhixyy")
case("think_split", "{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}", c="<think>\nreason\n</think>\n\nanswer")
case("percent_format", "{{ '%s-%d' % ('a', 3) }}|{{ '%05.2f' % 3.14159 }}|{{ '%x' % 255 }}|{{ '%s' % none }}|{{ 'v=%(a)s' % {'a': 1} }}|{{ '%-4s|' % 'ab' }}|{{ '100%%' % () }}")
# filters
case("filter_tojson", "{{ d | tojson }}|{{ l | tojson }}|{{ s | tojson }}|{{ n | tojson }}|{{ f | tojson }}|{{ 'a' | tojson }}",
     d={"b": 1, "a": [1, 2.5, None, True, "é\u2028\n\x01<>&'"], "c": {}}, l=[], s="quote\"back\\slash", n=None, f=1.0)
case("filter_tojson_indent", "{{ d | tojson(indent=2) }}\n{{ d | tojson(indent=4) }}\n{{ [] | tojson(indent=2) }}\n{{ d | tojson(indent='\\t') }}", d={"a": [1, {"c": []}], "b": {}, "z": {"y": "x"}})
case("filter_tojson_kwargs", "{{ d | tojson(sort_keys=true) }}|{{ d | tojson(separators=(',', ':')) }}|{{ d | tojson(ensure_ascii=true) }}", d={"b": "é🎉", "a": 1})
case("filter_trim", "[{{ s | trim }}][{{ s | trim('x ') }}][{{ 5 | trim }}][{{ u | trim }}][{{ missing | trim }}]", s="  x pad x  ", u="\u3000\u00a0wide\u2003\n")
case("filter_length", "{{ s | length }}{{ l | length }}{{ d | length }}{{ missing | length }}{{ u | length }}|{{ l | count }}", s="abc", l=[1, 2], d={"a": 1}, u="é🎉")
case("filter_items", "{% for k, v in d | items %}{{ k }}:{{ v }},{% endfor %}|{{ missing | items | list }}", d={"x": 1, "y": [2]})
case("filter_join", "{{ l | join(', ') }}|{{ l | join }}|{{ d | join('-') }}|{{ objs | join(',', attribute='n') }}", l=["a", 1, None], d={"k1": 1, "k2": 2}, objs=[{"n": "x"}, {"n": "y"}])
case("filter_default", "{{ missing | default('dflt') }}|{{ '' | default('dflt') }}|{{ '' | default('dflt', true) }}|{{ none | default('dflt') }}|{{ none | d('x', boolean=true) }}|{{ x | default('no') }}", x="yes")
case("filter_case", "{{ s | upper }}|{{ s | lower }}|{{ s | title }}|{{ s | capitalize }}|{{ 'hello-world (foo) [bar]' | title }}|{{ \"it's o'neil\" | title }}", s="hELLo wOrld")
case("filter_string", "{{ 1 | string }}|{{ [1, 'a'] | string }}|{{ d | string }}|{{ none | string }}|{{ (d | string) | replace(\"'\", '\"') }}", d={"a": "b", "n": None, "t": True})
case("filter_replace", "{{ s | replace('a', 'o') }}|{{ s | replace('a', 'o', 1) }}|{{ s | replace('', '-') }}|{{ 12321 | replace('2', 'x') }}", s="banana")
case("filter_list", "{{ 'abc' | list }}|{{ d | list }}|{{ l | list }}|{{ missing | list }}", d={"x": 1, "y": 2}, l=(1, 2))
case("filter_first_last", "{{ l | first }}|{{ l | last }}|{{ 'abc' | first }}|{{ 'abc' | last }}|[{{ [] | first }}]|{{ d | first }}", l=[1, 2, 3], d={"k": 1})
case("filter_select_reject", "{{ l | select | list }}|{{ l | reject | list }}|{{ nums | select('odd') | list }}|{{ nums | reject('even') | list }}|{{ nums | select('gt', 2) | list }}|{{ strs | reject('equalto', 'b') | list }}|{{ strs | select('in', ['a', 'c']) | list }}",
     l=[0, 1, "", "x", None, [], [1]], nums=[1, 2, 3, 4], strs=["a", "b", "c"])
case("filter_selectattr", "{{ ms | selectattr('role', 'equalto', 'user') | list | length }}|{% for m in ms | selectattr('role', 'eq', 'user') %}{{ m.content }}{% endfor %}|{{ ms | rejectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }}|{{ ms | selectattr('tool') | list | length }}|{{ ms | selectattr('tool', 'defined') | list }}",
     ms=[{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1", "tool": True, "meta": {"x": 1}}, {"role": "user", "content": "u2"}])
case("filter_selectattr_dotted", "{{ ms | selectattr('meta.x', 'equalto', 1) | map(attribute='meta.y.0') | list }}", ms=[{"meta": {"x": 1, "y": ["a"]}}, {"meta": {"x": 2, "y": ["b"]}}])
case("filter_map", "{{ l | map('upper') | list }}|{{ ds | map(attribute='n') | list }}|{{ ds | map(attribute='m', default='z') | list }}|{{ l | map('replace', 'a', 'b') | join }}|{{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}",
     l=["a", "ba"], ds=[{"n": 1}, {"n": 2, "m": "q"}], tools=[{"function": {"name": "f1"}}, {"function": {"name": "f2"}}])
case("filter_unique", "{{ l | unique | list }}|{{ l | unique(case_sensitive=true) | list }}|{{ ds | unique(attribute='k') | list }}", l=["a", "A", "b", "a", 1, 1.0], ds=[{"k": 1}, {"k": 2}, {"k": 1}])
case("filter_indent", "[{{ s | indent }}]\n[{{ s | indent(2) }}]\n[{{ s | indent(2, true) }}]\n[{{ s | indent(2, first=true, blank=true) }}]\n[{{ 'x' | indent(first=true) }}]\n[{{ s | indent('> ') }}]\n[{{ e | indent(4, first=true) }}]",
     s="line1\nline2\n\nline4\n", e="")
case("filter_int_float", "{{ '42' | int }}|{{ '3.9' | int }}|{{ 'x' | int }}|{{ 'x' | int(7) }}|{{ 3.99 | int }}|{{ -3.99 | int }}|{{ true | int }}|{{ '0x1A' | int(0, 16) }}|{{ '3' | int + 1 }}|{{ '2.5' | float }}|{{ 2 | float }}|{{ 'bad' | float }}|{{ none | int }}|{{ ' 12 ' | int }}|{{ '1_000' | int }}")
case("filter_round_abs", "{{ 2.5 | round }}|{{ 3.5 | round }}|{{ 2.675 | round(2) }}|{{ 1.234 | round(1, 'floor') }}|{{ 1.234 | round(1, 'ceil') }}|{{ 5 | round }}|{{ -3 | abs }}|{{ -2.5 | abs }}|{{ 0.5 | round }}|{{ 1.5 | round }}")
case("filter_sort", "{{ l | sort }}|{{ l | sort(reverse=true) }}|{{ s | sort }}|{{ s | sort(case_sensitive=true) }}|{{ ds | sort(attribute='n') | map(attribute='n') | list }}|{{ d | dictsort }}|{{ d | dictsort(by='value') }}",
     l=[3, 1, 2], s=["b", "A", "a", "C"], ds=[{"n": 2}, {"n": 1}], d={"b": 2, "a": 3, "c": 1})
case("filter_minmax_sum", "{{ l | min }}|{{ l | max }}|{{ l | sum }}|{{ ds | sum(attribute='v') }}|{{ s | max }}|{{ s | min(case_sensitive=true) }}|{{ ds | max(attribute='v') }}", l=[3, 1, 2], ds=[{"v": 1}, {"v": 2.5}], s=["b", "A", "c"])
case("filter_reverse", "{{ 'abc' | reverse }}|{{ l | reverse | list }}|{% for x in l | reverse %}{{ x }}{% endfor %}", l=[1, 2, 3])
case("filter_misc", "{{ 'x' | center(7) }}|{{ 'one two  three' | wordcount }}|{{ long | truncate(20) }}|{{ long | truncate(20, true) }}|{{ long | truncate(20, false, '..', 0) }}|{{ l | batch(2) | list }}|{{ l | batch(2, 'f') | list }}|{{ l | slice(2) | list }}|{{ '%s=%s' | format('a', 1) }}|{{ d | attr('x') }}",
     long="The quick brown fox jumps over the lazy dog", l=[1, 2, 3], d={"x": 1})
case("filter_escape_safe", "{{ '<a href=\"x\">&</a>' | e }}|{{ '<b>' | escape }}|{{ '<b>' | safe }}|{{ ('<i>' | safe) + '<&>' }}|{{ '<x>' + ('y' | safe) }}|{{ ('a' | safe) ~ '<' }}|{{ (('a' | safe) + '<') | length }}|{{ ['m' | safe] }}")
case("filter_chain_block", "{% filter upper %}hello {{ name }}{% endfilter %}|{% filter trim | replace('a', 'b') %}  banana  {% endfilter %}", name="bob")
# statements
case("for_loop_vars", "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}", l=["a", "b", "c"])
case("for_prev_next", "{% for x in l %}[{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }}]{% endfor %}", l=[1, 2, 3])
case("for_cycle_changed", "{% for x in l %}{{ loop.cycle('odd', 'even') }}{% if loop.changed(x) %}*{% endif %}{% endfor %}", l=[1, 1, 2, 2, 3])
case("for_else", "{% for x in l %}{{ x }}{% else %}empty{% endfor %}|{% for x in [] %}x{% else %}none{% endfor %}|{% for x in missing %}x{% else %}undef{% endfor %}", l=[1])
case("for_filter", "{% for x in l if x is odd %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}", l=[1, 2, 3, 4, 5])
case("for_unpack", "{% for a, b in pairs %}{{ a }}-{{ b }};{% endfor %}|{% for (a, b) in [('x', 1)] %}{{ a }}{{ b }}{% endfor %}|{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}", pairs=[[1, 2], [3, 4]], d={"a": 1})
case("for_string_dict", "{% for c in 'héllo' %}{{ c }}.{% endfor %}|{% for k in d %}{{ k }}{% endfor %}", d={"z": 1, "a": 2})
case("for_nested_loop", "{% for a in [1, 2] %}{% for b in ['x', 'y'] %}{{ loop.index }}{{ a }}{{ b }}{{ loop.depth }} {% endfor %}{{ loop.index }}|{% endfor %}")
case("for_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}{{ x }}{% endfor %}")
case("range", "{{ range(3) | list }}|{{ range(1, 4) | list }}|{{ range(10, 0, -3) | list }}|{% for i in range(2) %}{{ i }}{% endfor %}")
case("set_scoping_loop", "{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{ x }},{% endfor %}{{ x }}")
case("set_scoping_if", "{% set x = 5 %}{% for i in range(3) %}{% if i == 1 %}{% set x = 9 %}{% endif %}{{ x }},{% endfor %}{{ x }}|{% if true %}{% set y = 1 %}{% endif %}{{ y }}")
case("set_scoping_iteration", "{% for i in range(3) %}[{{ y }}]{% set y = i %}{% endfor %}[{{ y }}]")
case("set_loop_var_rebind", "{% for t in ts %}{% if t.function is defined %}{% set t = t.function %}{% endif %}{{ t.name }};{% endfor %}", ts=[{"function": {"name": "a"}}, {"name": "b"}])
case("namespace", "{% set ns = namespace(count=0, found=false, items=[]) %}{% for i in range(4) %}{% set ns.count = ns.count + i %}{% if i == 2 %}{% set ns.found = true %}{% endif %}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.count }} {{ ns.found }} {{ ns.items }} {{ ns.missing }}")
case("namespace_empty_then_set", "{% set ns = namespace() %}{% set ns.index = 0 %}{% for m in l %}{% set ns.index = ns.index + 1 %}{% endfor %}{{ ns.index }}|{{ ns }}", l=[1, 2])
case("namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}")
case("set_tuple_and_block", "{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set blk %}  inner {{ a }} {% endset %}[{{ blk }}]|{% set t2 | upper %}shout{% endset %}{{ t2 }}")
case("set_top_level_rebinding", "{% set messages = messages[1:] %}{{ messages | length }}|{% set messages = messages + ['z'] %}{{ messages }}", messages=["a", "b", "c"])
case("macro_basic", "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Bob') }}|{{ greet('Ann', 'Hi') }}|{{ greet(greeting='Yo', name='Cy') }}|{{ greet() }}")
case("macro_varargs_kwargs", "{% macro m(a, b=2) %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, 3, 4, c=5) }}")
case("macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n }}*{{ fact(n - 1) }}{% endif %}{% endmacro %}{{ fact(5) }}")
case("macro_return_concat", "{% macro t(x) %}{{ x | upper }}{% endmacro %}{{ 'List[' + t('a') + ']' }}|{{ t('b') ~ '!' }}|{{ t('c') | length }}")
case("macro_sees_globals_at_call", "{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}|{% for x in [7] %}{{ m() }}{% endfor %}")
case("macro_namespace_mutation", "{% set ns = namespace(v=0) %}{% macro bump() %}{% set ns.v = ns.v + 1 %}{% endmacro %}{{ bump() }}{{ bump() }}{{ ns.v }}")
case("macro_call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ 1 + 1 }}{% endcall %}|{% macro each(l) %}{% for x in l %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(item) each([1, 2]) %}[{{ item }}]{% endcall %}")
case("macro_param_named_namespace", "{% macro gen(fs, namespace='functions') %}namespace {{ namespace }} { {{ fs | length }} }{% endmacro %}{{ gen([1]) }}|{{ gen([], 'x') }}")
case("macro_forward_reference", "{% macro a(n) %}{% if n > 0 %}a{{ b(n - 1) }}{% endif %}{% endmacro %}{% macro b(n) %}b{{ a(n) }}{% endmacro %}{{ a(3) }}")
case("with_block", "{% with a = 1, b = 'x' %}{{ a }}{{ b }}{% endwith %}[{{ a }}]")
case("raw_block", "{% raw %}{{ not rendered }} {% if %}{% endraw %}|x")
case("comments", "a{# comment #}b{#- strip -#}  c\n{# line comment #}\nd")
case("dict_literal_and_get", "{% set m = {'string': 'str', 'number': 'float', 1: 'one'} %}{{ m['string'] }}{{ m[1] }}{{ m.get('number') }}{{ m[true] }}[{{ m['nope'] }}][{{ m[missing_key] }}]|{{ m }}")
case("undefined_key_lookup", "{% set m = {'a': 1} %}{{ m[d.type] is defined }}|{{ d.type is iterable }}|{% for t in d.type %}x{% endfor %}|{{ (d | items | list)[0] }}", d={"items": {"type": "string"}})
case("strftime_now", "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S %A %B %j') }}|{{ strftime_now('%y%I%p%M') }}")
case("raise_exception", "{% if x > 1 %}{{ raise_exception('x too big: ' ~ x) }}{% endif %}ok", x=2)
case("raise_exception_not_hit", "{% if x > 1 %}{{ raise_exception('x too big') }}{% endif %}ok", x=1)
case("error_undefined_attr", "{{ missing.attr }}")
case("error_add_str_int", "{{ 'a' + 1 }}")
case("error_undefined_add", "{{ 'a' + missing }}")
case("error_iterate_none", "{% for x in n %}{% endfor %}", n=None)
case("error_tojson_undefined", "{{ missing | tojson }}")
case("error_unsafe_append", "{% set l = [1] %}{{ l.append(2) }}")
case("error_namespace_underscore", "{% set ns = namespace(_x=1) %}")
case("error_set_attr_non_namespace", "{% set d = {} %}{% set d.x = 1 %}")
case("generator_semantics", "{{ 'T' if [] | select else 'F' }}|{{ l | map('string') | list }}|{{ (l | select) is sequence }}|{{ (l | select) is iterable }}|{{ d.items() }}|{{ d.keys() }}|{{ d.values() }}|{{ range(2, 5) }}|{{ d.items() | length }}|{{ l | reverse | list }}|{{ (l | select | list) == l }}", l=[1, 2], d={"a": 1})
case("error_generator_length", "{{ l | select | length }}", l=[1])
case("error_generator_tojson", "{{ l | map('string') | tojson }}", l=[1])
case("error_dict_items_tojson", "{{ d.items() | tojson }}", d={"a": 1})
case("macro_default_uses_param", "{% macro m(a, b=a ~ '!') %}{{ b }}{% endmacro %}{{ m('x') }}|{{ m('x', 'y') }}")
case("call_dynamic_args", "{% macro m(a, b) %}{{ a }}{{ b }}{% endmacro %}{{ m(*[1, 2]) }}|{{ m(**{'a': 3, 'b': 4}) }}|{{ m(5, b=6) }}")
case("no_html_escaping", "{{ '<&>\"' }}|{{ ['<a>' | safe, '<b>'] | join(',') }}|{{ x }}", x="<script>&amp;</script>")
case("loop_in_macro_with_outer_loop", "{% macro row(items) %}{% for i in items %}{{ loop.index }}{% endfor %}{% endmacro %}{% for r in [[1, 2], [3]] %}{{ loop.index }}:{{ row(r) }};{% endfor %}")
case("set_in_with_and_call_scopes", "{% set x = 1 %}{% with %}{% set x = 2 %}{{ x }}{% endwith %}{{ x }}|{% macro m() %}{{ caller() }}{% endmacro %}{% call m() %}{% set x = 3 %}{{ x }}{% endcall %}{{ x }}")
case("string_comparisons_unicode", "{{ 'é' > 'z' }}{{ 'a' < 'B' }}{{ ['b'] | max }}{{ 'Zeta' | lower < 'alpha' }}")
case("integer_division_and_float_printing", "{{ 1e3 }}|{{ 100 / 3 }}|{{ (0.1 * 3) }}|{{ 2 ** 62 }}|{{ -5 // 2 }}|{{ 5 % -3 }}|{{ 1.0 / 8 }}|{{ 123456789012345678 }}|{{ 1e22 }}|{{ 1.5e-10 }}")
case("dict_global", "{{ dict(a=1, b='x') }}|{{ dict([('k', 'v')]) }}")
case("generation_tag", "a{% generation %}gen {{ 1 }}{% endgeneration %}b")
# whitespace control (trim_blocks / lstrip_blocks / -)
case("ws_trim_lstrip", "a\n  {% if true %}\n  x\n  {% endif %}\n  {{ 1 }} {% if 1 %}y{% endif %}\n\t{# c #}\nz\n")
case("ws_dash_modifiers", "a  \n  {%- if true -%}  \n  b  \n  {%- endif %}\nc {{- 'd' -}} \n e\n{{ 'f' }}\n")
case("ws_plus_modifiers", "a\n  {%+ if true %}x{% endif +%}\ny\n  {% if true +%}\nz{% endif %}")
case("ws_not_line_start", "{{ 1 }}  {% if true %}x{% endif %}|{% if true %}  {% if true %}y{% endif %}{% endif %}")
case("ws_crlf_source", "line1\r\n{% if true %}\r\nline2\r\n{% endif %}\r\nend\r\n")
case("ws_trailing_newlines", "x\n\n")
case("ws_variable_no_trim", "{{ 'a' }}\n{{ 'b' }}\n")
case("ws_lstrip_tabs_and_comment", "start\n\t  {% set x = 1 %}\n    {#- c #}\nend")
case("ws_dash_eats_newlines", "{% for i in [1, 2] -%}\n\n  {{ i }}\n{%- endfor %}")


def render_engine_case(c):
    try:
        tmpl = ctu._compile_jinja_template(c["template"])
        return {"ok": True, "output": tmpl.render(**copy.deepcopy(c["context"]))}
    except Exception as e:  # noqa: BLE001
        return _error_record(e)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared", required=True)
    args = ap.parse_args()
    out_dir = os.path.join(args.out, "chat_template")
    os.makedirs(out_dir, exist_ok=True)

    templates = collect_templates(args.shared)
    if len(templates) < 17:
        print(f"expected the shared chat templates, found {len(templates)}", file=sys.stderr)
        return 1
    cases = []
    for tname, source in templates:
        for sc in SCENARIOS:
            for agp in (True, False):
                rec = {
                    "template": tname,
                    "scenario": sc["name"],
                    "add_generation_prompt": agp,
                    "messages": sc["messages"],
                    "tools": sc["tools"],
                    "bos_token": sc["bos_token"],
                    "eos_token": sc["eos_token"],
                    "extra": sc["extra"],
                }
                rec.update(render_chat(source, sc["messages"], sc["tools"], agp, sc["bos_token"], sc["eos_token"], sc["extra"]))
                cases.append(rec)
    golden = {
        "fixed_now": FIXED_NOW.strftime("%Y-%m-%d %H:%M:%S"),
        "templates": {name: src for name, src in templates},
        "cases": cases,
    }
    with open(os.path.join(out_dir, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)

    engine = [dict(c, **render_engine_case(c)) for c in ENGINE]
    with open(os.path.join(out_dir, "engine.json"), "w", encoding="utf-8") as f:
        json.dump({"fixed_now": FIXED_NOW.strftime("%Y-%m-%d %H:%M:%S"), "cases": engine}, f, ensure_ascii=False, indent=1)
    ok = sum(1 for c in cases if c["ok"])
    print(f"chat_template_golden: {len(templates)} templates, {len(SCENARIOS)} scenarios, {len(cases)} cases "
          f"({ok} rendered, {len(cases) - ok} errors); {len(engine)} engine cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
