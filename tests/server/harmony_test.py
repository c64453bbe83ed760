"""gpt-oss's chat convention (OpenAI "harmony") through the server, on tiny_harmony.py's model: the
gpt-oss template and harmony's marker tokens over a tiny Qwen3 whose greedy output is a scripted
chain (`<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}`
then <|call|>; a logit_bias turns the channel into analysis or final).

  * the commentary message to=functions.get_weather comes back as a tool call (openai client,
    stream and not; anthropic tool_use; Ollama tool_calls), the analysis channel as
    reasoning_content / a thinking block / Ollama `thinking`, the final channel as content — and
    no marker or header text reaches any content or reasoning delta;
  * a forced call (tool_choice required / named) is written in harmony's own form — the grammar
    requires the header's marker tokens by id — and comes back as a call whose arguments validate,
    for a function the scripted chain never names;
  * tool_choice auto: the chain's own call is kept, its arguments constrained to the schema (an
    enum without the chain's "Oslo" makes the grammar pick a valid city);
  * generation stops at <|call|> (harmony's stop set: the tokenizer's EOS is Qwen's);
  * an assistant turn's reasoning_content reaches the template as `thinking` (/apply-template; the
    chat-template layer's normalisation, which already did this before harmony parsing landed).
"""
import json
import os
import sys
import unittest

import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tiny_harmony  # noqa: E402
from server_harness import SHARED, Server, tmp_root  # noqa: E402

QWEN_TOK = os.path.join(SHARED, "tokenizers/hf/qwen3/tokenizer.json")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Oslo?"}]
ARGS = {"city": "Oslo"}


def validate(test, value, schema):
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as e:
        test.fail(f"{value!r} does not validate: {e.message}")


@unittest.skipUnless(os.path.exists(QWEN_TOK), f"{QWEN_TOK} absent")
class Harmony(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.info = tiny_harmony.make_harmony_model(os.path.join(tmp_root(), "tiny-harmony"), SHARED)
        cls.server = Server(cls.info["dir"], "--ctx", "4096", startup_timeout=120).start()
        cls.client = cls.server.openai()
        cls.chain_tokens = len(cls.info["chain"]) - 2  # the output: after `assistant`, before <|call|>

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def bias(self, which):
        return {str(self.info[which + "_id"]): 2 * tiny_harmony.BRANCH_GAP}

    def test_tool_call_openai(self):
        r = self.client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], temperature=0, max_tokens=64)
        ch = r.choices[0]
        self.assertEqual(ch.finish_reason, "tool_calls")
        self.assertFalse(ch.message.content)
        self.assertEqual(len(ch.message.tool_calls), 1)
        self.assertEqual(ch.message.tool_calls[0].function.name, "get_weather")
        self.assertEqual(json.loads(ch.message.tool_calls[0].function.arguments), ARGS)
        # <|call|> ended it: no token after the chain (Qwen's EOS would never come).
        self.assertEqual(r.usage.completion_tokens, self.chain_tokens)

        text, calls = "", {}
        for c in self.client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], temperature=0,
                                                     max_tokens=64, stream=True):
            if not c.choices:
                continue
            d = c.choices[0].delta
            text += d.content or ""
            self.assertNotIn("<|", text)
            for tc in d.tool_calls or []:
                e = calls.setdefault(tc.index, {"name": "", "args": ""})
                e["name"] += tc.function.name or ""
                e["args"] += tc.function.arguments or ""
            if c.choices[0].finish_reason:
                self.assertEqual(c.choices[0].finish_reason, "tool_calls")
        self.assertEqual(text, "")
        self.assertEqual(list(calls), [0])
        self.assertEqual(calls[0]["name"], "get_weather")
        self.assertEqual(json.loads(calls[0]["args"]), ARGS)

    def test_analysis_is_reasoning_and_final_is_content(self):
        for which, field in (("analysis", "reasoning_content"), ("final", "content")):
            r = self.client.chat.completions.create(model="m", messages=ASK, temperature=0, max_tokens=64,
                                                    logit_bias=self.bias(which))
            msg = r.choices[0].message.model_dump()
            self.assertEqual(msg.get(field), tiny_harmony.ARGS_TEXT, (which, msg))
            other = "content" if field == "reasoning_content" else "reasoning_content"
            self.assertFalse(msg.get(other), (which, msg))
            self.assertFalse(msg.get("tool_calls"))
            self.assertEqual(r.choices[0].finish_reason, "stop")
            got = {"content": "", "reasoning_content": ""}
            for c in self.client.chat.completions.create(model="m", messages=ASK, temperature=0, max_tokens=64,
                                                         logit_bias=self.bias(which), stream=True):
                if not c.choices:
                    continue
                d = c.choices[0].delta.model_dump()
                for k in got:
                    got[k] += d.get(k) or ""
                    self.assertNotIn("<|", got[k])
                    self.assertNotIn(which, got[k])  # the channel name is header, never text
            self.assertEqual(got[field], tiny_harmony.ARGS_TEXT)
            self.assertEqual(got[other], "")

    def test_anthropic_and_ollama(self):
        a = self.server.anthropic()
        m = a.messages.create(model="m", max_tokens=64, messages=ASK, extra_body={"temperature": 0},
                              tools=[{"name": "get_weather", "description": "weather",
                                      "input_schema": WEATHER["function"]["parameters"]}])
        self.assertEqual(m.stop_reason, "tool_use")
        uses = [b for b in m.content if b.type == "tool_use"]
        self.assertEqual([(u.name, u.input) for u in uses], [("get_weather", ARGS)])
        r = self.server.post("/api/chat", {"model": self.server.model_id(), "messages": ASK, "tools": [WEATHER],
                                           "stream": False, "options": {"temperature": 0, "num_predict": 64}})
        self.assertEqual(r.status, 200, r.body)
        msg = r.json()["message"]
        self.assertEqual(msg["tool_calls"][0]["function"]["name"], "get_weather")
        self.assertEqual(msg["tool_calls"][0]["function"]["arguments"], ARGS)
        self.assertEqual(msg["content"], "")
        show = self.server.post("/api/show", {"model": self.server.model_id()}).json()
        self.assertIn("tools", show["capabilities"])
        self.assertIn("thinking", show["capabilities"])

    def test_forced_call_is_written_in_harmony(self):
        # The chain writes get_weather; the grammar writes set_unit's header, by marker tokens.
        unit = {"type": "function", "function": {"name": "set_unit", "description": "unit", "parameters": {
            "type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"],
            "additionalProperties": False}}}
        for choice in ("required", {"type": "function", "function": {"name": "set_unit"}}):
            with self.subTest(choice=choice):
                r = self.client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, unit] if choice != "required" else [unit],
                                                        tool_choice=choice, temperature=0, max_tokens=256, logprobs=True)
                ch = r.choices[0]
                self.assertEqual(ch.finish_reason, "tool_calls", ch.message)
                self.assertFalse(ch.message.content)
                self.assertEqual([c.function.name for c in ch.message.tool_calls], ["set_unit"])
                validate(self, json.loads(ch.message.tool_calls[0].function.arguments), unit["function"]["parameters"])
                tokens = [t.token for t in ch.logprobs.content]
                for marker in ("<|channel|>", "<|constrain|>", "<|message|>"):
                    self.assertIn(marker, tokens)  # harmony's header, not the Hermes <tool_call> form
                self.assertNotIn("<tool_call>", "".join(tokens))
        # The anthropic route forces it the same way.
        m = self.server.anthropic().messages.create(
            model="m", max_tokens=256, messages=ASK, extra_body={"temperature": 0}, tool_choice={"type": "any"},
            tools=[{"name": "set_unit", "description": "unit", "input_schema": unit["function"]["parameters"]}])
        self.assertEqual(m.stop_reason, "tool_use")
        uses = [b for b in m.content if b.type == "tool_use"]
        self.assertEqual([u.name for u in uses], ["set_unit"])
        validate(self, uses[0].input, unit["function"]["parameters"])

    def test_auto_call_arguments_are_constrained(self):
        # The chain's call says "Oslo", which this schema refuses: the grammar picks a listed city.
        paris = {"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": {
            "type": "object", "properties": {"city": {"enum": ["Paris", "Lima"]}}, "required": ["city"],
            "additionalProperties": False}}}
        r = self.client.chat.completions.create(model="m", messages=ASK, tools=[paris], temperature=0, max_tokens=64)
        ch = r.choices[0]
        self.assertEqual(ch.finish_reason, "tool_calls", ch)
        self.assertEqual(ch.message.tool_calls[0].function.name, "get_weather")
        validate(self, json.loads(ch.message.tool_calls[0].function.arguments), paris["function"]["parameters"])
        # Free channels stay free: the final message is the chain's text, ended by <|return|>.
        r = self.client.chat.completions.create(model="m", messages=ASK, tools=[paris], temperature=0, max_tokens=64,
                                                logit_bias=self.bias("final"))
        self.assertEqual(r.choices[0].message.content, tiny_harmony.ARGS_TEXT)
        self.assertFalse(r.choices[0].message.tool_calls)

    def test_reasoning_content_renders_as_thinking(self):
        history = ASK + [{"role": "assistant", "content": "", "reasoning_content": "I should call the tool.",
                          "tool_calls": [{"id": "c1", "type": "function",
                                          "function": {"name": "get_weather", "arguments": ARGS}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": "4 C, rain"}]
        r = self.server.post("/apply-template", {"messages": history, "tools": [WEATHER]})
        self.assertEqual(r.status, 200, r.body)
        p = r.json()["prompt"]
        self.assertIn("<|start|>assistant<|channel|>analysis<|message|>I should call the tool.<|end|>"
                      "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
                      '{"city": "Oslo"}<|call|>', p)
        self.assertIn("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>", p)
        self.assertTrue(p.endswith("<|start|>assistant"), p[-80:])


if __name__ == "__main__":
    unittest.main()
