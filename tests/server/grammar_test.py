"""Constrained decoding (issue 15) through the official openai and anthropic clients against
`larder serve` with the real SmolLM2-135M-Instruct (scripts/fetch_models.sh; skips when absent).

The oracle is the `jsonschema` package (pinned in requirements-dev.txt): every constrained output
must parse and validate against its schema (grammar_schemas.json, written for these tests), a
schema keyword larder cannot enforce must be refused with a 400 naming it, and a forced tool call
must always be a call to an offered tool with arguments valid against its parameters."""
import concurrent.futures
import json
import os
import re
import sys
import unittest

import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from server_harness import Server, openai_chunks, anthropic_events  # noqa: E402

MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(HERE, "../../.cache/models")
SMOLLM2 = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
CORPUS = json.load(open(os.path.join(HERE, "grammar_schemas.json")))
PARALLEL = 8

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                   "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def validate(test, value, schema, what):
    try:
        jsonschema.validate(value, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    except jsonschema.ValidationError as e:
        test.fail(f"{what}: output {value!r} does not validate: {e.message}")


@unittest.skipUnless(os.path.exists(SMOLLM2), f"{SMOLLM2} absent (scripts/fetch_models.sh)")
class GrammarTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(SMOLLM2, "--parallel", str(PARALLEL), "--ctx", "2048", startup_timeout=120)
        cls.server.start()
        cls.client = cls.server.openai()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def chat_schema(self, i, schema, **kw):
        r = self.client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Give one example value."}], max_tokens=200,
            temperature=0.7, seed=i, response_format={"type": "json_schema",
                                                     "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}},
            **kw)
        return r.choices[0]

    def test_schema_corpus(self):
        """Every schema of the corpus, 8 at a time (each request its own grammar in one batch)."""
        schemas = CORPUS["valid"]
        with concurrent.futures.ThreadPoolExecutor(PARALLEL) as ex:
            results = list(ex.map(lambda a: self.chat_schema(*a), enumerate(schemas)))
        # A grammar cannot make a 135M model stop: an unbounded string or a recursive schema can
        # run into max_tokens (finish_reason length, an incomplete value). Every answer that
        # ended by itself must validate, and nearly all must end by themselves.
        cut = []
        for i, (schema, choice) in enumerate(zip(schemas, results)):
            with self.subTest(i=i, schema=json.dumps(schema)[:120]):
                if choice.finish_reason == "length":
                    cut.append(i)
                    continue
                self.assertEqual(choice.finish_reason, "stop")
                try:
                    value = json.loads(choice.message.content)
                except ValueError:
                    self.fail(f"not JSON: {choice.message.content!r}")
                validate(self, value, schema, f"schema {i}")
        self.assertLessEqual(len(cut), len(schemas) // 10, f"schemas whose answers ran out of tokens: {cut}")

    def test_batched_equals_alone(self):
        """A constrained sequence's tokens do not depend on its batch neighbours (greedy)."""
        picks = [CORPUS["valid"][k] for k in (0, 2, 20, 27, 32, 34, 38, 41)]
        def one(i):
            return self.client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Example?"}], max_tokens=120, temperature=0,
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": picks[i]}}
            ).choices[0].message.content
        alone = [one(i) for i in range(len(picks))]
        with concurrent.futures.ThreadPoolExecutor(PARALLEL) as ex:
            together = list(ex.map(one, range(len(picks))))
        for i in range(len(picks)):
            for text in (alone[i], together[i]):
                validate(self, json.loads(text), picks[i], f"schema {i}")
        # Batching changes matmul summation order (docs/ARCHITECTURE.md), so a greedy near-tie may
        # go the other way; the masks themselves are per sequence. Nearly all must be identical.
        same = sum(a == b for a, b in zip(alone, together))
        self.assertGreaterEqual(same, len(picks) - 2, list(zip(alone, together)))

    def test_json_object(self):
        for stream in (False, True):
            r = self.client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Describe a cat."}], max_tokens=200, temperature=0,
                response_format={"type": "json_object"}, stream=stream)
            text = "".join(c.choices[0].delta.content or "" for c in r) if stream else r.choices[0].message.content
            self.assertIsInstance(json.loads(text), dict, text)

    def test_unconstrained_differs(self):
        """The constraint is what makes the output JSON: the same request without it is prose."""
        r = self.client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Give one example value."}], max_tokens=30, temperature=0)
        with self.assertRaises(ValueError):
            json.loads(r.choices[0].message.content)

    def test_unsupported_keywords_refused_by_name(self):
        import openai
        for schema, keyword in CORPUS["refused"]:
            with self.subTest(keyword=keyword):
                with self.assertRaises(openai.BadRequestError) as cm:
                    self.chat_schema(0, schema)
                self.assertIn(keyword, cm.exception.message)
                self.assertEqual(cm.exception.body.get("param"), "response_format")
        # The same on tool parameters and on llama-server's json_schema field.
        bad_tool = {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}}}
        r = self.server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                                      "tools": [bad_tool], "tool_choice": "required"})
        self.assertEqual(r.status, 400, r)
        self.assertIn("uniqueItems", r.json()["error"]["message"])
        self.assertIn("/properties/xs", r.json()["error"]["message"])
        r = self.server.post("/completion", {"prompt": "x", "n_predict": 4, "json_schema": {"not": {}}})
        self.assertEqual(r.status, 400, r)
        self.assertIn("'not'", r.json()["error"]["message"])

    def check_calls(self, calls, allowed, parallel=True):
        self.assertTrue(calls, "a forced tool call must produce a call")
        if not parallel:
            self.assertEqual(len(calls), 1)
        for c in calls:
            self.assertIn(c.function.name, allowed)
            validate(self, json.loads(c.function.arguments), SCHEMAS[c.function.name], c.function.name)

    def test_forced_tool_calls_openai(self):
        prompts = ["What's the weather in Paris?", "Add 2 and 3.", "Tell me a joke."]
        cases = [("required", ["get_weather", "add"]),
                 ({"type": "function", "function": {"name": "add"}}, ["add"]),
                 ({"type": "function", "function": {"name": "get_weather"}}, ["get_weather"])]
        for choice, allowed in cases:
            for i, p in enumerate(prompts):
                for stream in (False, True):
                    with self.subTest(choice=choice, prompt=p, stream=stream):
                        # With parallel calls allowed, a model that does not know the markup may keep
                        # writing calls until max_tokens; every completed call must still be valid.
                        parallel = i % 2 == 0
                        finishes = ("tool_calls", "length") if parallel else ("tool_calls",)
                        kw = dict(model="m", messages=[{"role": "user", "content": p}], tools=TOOLS, tool_choice=choice,
                                  max_tokens=100, temperature=0.8, seed=i, parallel_tool_calls=parallel)
                        if not stream:
                            r = self.client.chat.completions.create(**kw)
                            self.assertIn(r.choices[0].finish_reason, finishes, r)
                            self.check_calls(r.choices[0].message.tool_calls, allowed, parallel=parallel)
                        else:
                            calls = {}
                            finish = None
                            for ch in self.client.chat.completions.create(stream=True, **kw):
                                if not ch.choices:
                                    continue
                                finish = ch.choices[0].finish_reason or finish
                                for tc in ch.choices[0].delta.tool_calls or []:
                                    c = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                                    c["name"] += tc.function.name or ""
                                    c["arguments"] += tc.function.arguments or ""
                            self.assertIn(finish, finishes)
                            self.assertTrue(calls)
                            if not parallel:
                                self.assertEqual(len(calls), 1)
                            for c in calls.values():
                                self.assertIn(c["name"], allowed)
                                validate(self, json.loads(c["arguments"]), SCHEMAS[c["name"]], c["name"])

    def test_tool_choice_auto_and_none(self):
        # none: no call even when asked for one; auto: free text or a valid call.
        r = self.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather in Rome?"}],
                                                tools=TOOLS, tool_choice="none", max_tokens=30, temperature=0)
        self.assertFalse(r.choices[0].message.tool_calls)
        r = self.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather in Rome?"}],
                                                tools=TOOLS, tool_choice="auto", max_tokens=60, temperature=0)
        for c in r.choices[0].message.tool_calls or []:
            validate(self, json.loads(c.function.arguments), SCHEMAS[c.function.name], c.function.name)

    def test_forced_tool_calls_anthropic(self):
        a = self.server.anthropic()
        tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                  "input_schema": t["function"]["parameters"]} for t in TOOLS]
        for choice, allowed in [({"type": "any"}, {"get_weather", "add"}),
                                ({"type": "tool", "name": "add", "disable_parallel_tool_use": True}, {"add"})]:
            for stream in (False, True):
                with self.subTest(choice=choice, stream=stream):
                    # Greedy (this client version has no temperature argument): deterministic.
                    kw = dict(model="m", max_tokens=150, tools=tools, tool_choice=choice, extra_body={"temperature": 0},
                              messages=[{"role": "user", "content": "Weather in Oslo, please."}])
                    if stream:
                        with a.messages.stream(**kw) as s:
                            m = s.get_final_message()
                    else:
                        m = a.messages.create(**kw)
                    uses = [b for b in m.content if b.type == "tool_use"]
                    self.assertTrue(uses, m)
                    if choice.get("disable_parallel_tool_use"):
                        self.assertEqual(m.stop_reason, "tool_use")
                        self.assertEqual(len(uses), 1)
                    else:  # parallel calls: may write calls until max_tokens (see the OpenAI test)
                        self.assertIn(m.stop_reason, ("tool_use", "max_tokens"))
                    for u in uses:
                        self.assertIn(u.name, allowed)
                        validate(self, u.input, SCHEMAS[u.name], u.name)

    def test_llama_server_fields(self):
        r = self.server.post("/completion", {"prompt": "The answer is", "n_predict": 8, "temperature": 0,
                                             "grammar": 'root ::= " " ("yes" | "no") "."'})
        self.assertEqual(r.status, 200, r)
        self.assertRegex(r.json()["content"], r"^ (yes|no)\.$")
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        r = self.server.post("/completion", {"prompt": "JSON:", "n_predict": 40, "temperature": 0, "json_schema": schema})
        self.assertEqual(r.status, 200, r)
        validate(self, json.loads(r.json()["content"]), schema, "/completion json_schema")
        r = self.server.post("/v1/completions", {"prompt": "x", "max_tokens": 4, "grammar": "root ::= undefined_rule"})
        self.assertEqual(r.status, 400, r)
        self.assertIn("undefined_rule", r.json()["error"]["message"])
        # Two constraints at once: refused, not one silently dropped.
        r = self.server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                                      "response_format": {"type": "json_object"},
                                                      "grammar": 'root ::= "a"'})
        self.assertEqual(r.status, 400, r)


if __name__ == "__main__":
    unittest.main()
