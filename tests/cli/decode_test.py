"""`larder generate` and `larder serve` run one decode step (runtime/decode_step.h; issue 41
item 3), so the CLI takes the server's sampling and structured-output options and answers as the
server does. On the real SmolLM2-135M-Instruct Q4_1 GGUF (skips when absent: scripts/fetch_models.sh
or LARDER_MODELS_DIR).

- structured output: `--grammar`, `--grammar-file`, `-j/--json-schema` (inline or @FILE) and
  `--json-schema-file` constrain the output — checked here by the grammar's own language and by
  the `jsonschema` package, not by larder — and bad input is a message before the model loads;
- sampling options the server has: `-l/--logit-bias`, `--repeat-last-n`;
- parity: for the same raw prompt, `generate --temp 0` prints exactly the text of `serve`'s greedy
  /v1/completions with the same number of tokens and the same finish reason, with and without a
  grammar, a schema, stop strings, penalties and a logit bias, cold and warm (CliServerParityTest
  says why those are compared apart). The decode step's picks themselves are compared on fixed
  logits in tests/unit/runtime/decode_step_test.cpp."""
import json
import os
import re
import shutil
import tempfile
import unittest

import jsonschema

import cli_models
from cli_models import run

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(HERE, "../../.cache/models")
SMOL = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
}
# A GBNF grammar whose language a regular expression states exactly.
LIST_GBNF = r'''root ::= item ("," " "? item){1,3} "."
item ::= "red" | "green" | "blue" | "yellow"'''
LIST_RE = re.compile(r"(red|green|blue|yellow)(, ?(red|green|blue|yellow)){1,3}\.")

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "List three colors:",
    "Q: What is 2 + 2?\nA:",
    "<|im_start|>user\nDescribe a person as JSON.<|im_end|>\n<|im_start|>assistant\n",
]


def generate(*args):
    code, out, err = run("generate", SMOL, *args, timeout=300)
    assert code == 0, f"generate {args}: exit {code}: {err}"
    assert out.endswith("\n"), out
    n = int(re.search(r"generated (\d+) tokens", err).group(1))
    stop = re.search(r"\| stop: (.*)$", err.strip(), re.M).group(1)
    return out[:-1], n, stop  # the final newline is the CLI's, not the model's


@unittest.skipUnless(os.path.exists(SMOL), f"{SMOL} is absent: run scripts/fetch_models.sh (or set LARDER_MODELS_DIR)")
class StructuredOutputTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="larder_decode_")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_json_schema_output_is_valid_against_the_schema(self):
        schema_file = self.write("person.json", json.dumps(PERSON))
        prompts = ["A JSON object describing a person:", "Here is a person as JSON:", "Bob is 42 and has a dog."]
        for prompt in prompts:
            for flags in (["--json-schema", json.dumps(PERSON)], ["-j", "@" + schema_file],
                          ["--json-schema-file", schema_file], ["-jf", schema_file]):
                text, n, stop = generate("-p", prompt, "--temp", "0", "-n", "200", *flags)
                self.assertEqual(stop, "eos", f"{prompt!r} {flags[0]}: the schema's end ends the output: {text!r}")
                jsonschema.validate(json.loads(text), PERSON)
        # Sampled too: every draw stays inside the schema.
        for seed in range(3):
            text, _, _ = generate("-p", prompts[0], "--temp", "1.0", "-s", str(seed), "-n", "200", "-j", json.dumps(PERSON))
            jsonschema.validate(json.loads(text), PERSON)

    def test_grammar_output_is_in_the_grammar(self):
        gbnf_file = self.write("list.gbnf", LIST_GBNF)
        for prompt in ["List some colors:", "My favourite colors are", "Colors of the rainbow:"]:
            for flags in (["--grammar", LIST_GBNF], ["--grammar-file", gbnf_file]):
                text, _, stop = generate("-p", prompt, "--temp", "0", "-n", "100", *flags)
                self.assertRegex(text, r"\A" + LIST_RE.pattern + r"\Z", f"{prompt!r} {flags[0]}")
                self.assertEqual(stop, "eos")
        for seed in range(3):
            text, _, _ = generate("-p", "Colors:", "--temp", "1.5", "-s", str(seed), "-n", "100", "--grammar", LIST_GBNF)
            self.assertRegex(text, r"\A" + LIST_RE.pattern + r"\Z")

    def test_grammar_with_ignore_eos_ends_at_the_grammars_end(self):
        # Nothing may follow a complete grammar: --ignore-eos does not make it run on.
        text, n, stop = generate("-p", "Yes or no?", "--temp", "0", "--ignore-eos", "-n", "50",
                                 "--grammar", 'root ::= "yes" | "no"')
        self.assertIn(text, ("yes", "no"))
        self.assertEqual(stop, "eos")

    def test_chat_takes_the_same_flags(self):
        code, out, err = run("chat", SMOL, "--temp", "0", "-n", "40", "--grammar", 'root ::= "yes" | "no"',
                             input="Is the sky blue?\n", timeout=120)
        self.assertEqual(code, 0, err)
        self.assertIn(out.strip(), ("yes", "no"))

    def test_bad_constraints_are_clear_errors(self):
        cases = [
            (["--grammar", 'root ::= "a"', "-j", "{}"], "give one output constraint"),
            (["--grammar", 'root ::= "a" |'], "--grammar: [grammar]"),
            (["--grammar", "   "], "the grammar is empty"),
            (["-j", "{not json"], "--json-schema is not JSON"),
            (["-j", '{"type": "object", "uniqueItems": true}'], "uniqueItems"),
            (["-j", "@" + os.path.join(self.tmp, "missing.json")], "missing.json"),
            (["--grammar-file", os.path.join(self.tmp, "missing.gbnf")], "missing.gbnf"),
            (["-j", "@"], "--json-schema needs a file name"),
            (["-l", "15043"], "--logit-bias '15043'"),
            (["-l", "99999999+1"], "outside the vocabulary"),
            (["--repeat-penalty", "0"], "greater than 0"),
        ]
        for flags, message in cases:
            code, out, err = run("generate", SMOL, "-p", "x", "-n", "4", *flags)
            self.assertNotEqual(code, 0, flags)
            self.assertIn(message, err, flags)
            self.assertEqual(out, "", flags)

    def test_logit_bias_and_repeat_last_n(self):
        base, _, _ = generate("-p", "The capital of France is", "--temp", "0", "-n", "8")
        self.assertTrue(base.startswith(" Paris"), base)
        code, ids, err = run("tokenize", SMOL, "-p", " Paris")
        self.assertEqual(code, 0, err)
        paris = json.loads(ids)[0]
        banned, _, _ = generate("-p", "The capital of France is", "--temp", "0", "-n", "8", "-l", f"{paris}-inf")
        self.assertFalse(banned.startswith(" Paris"), banned)
        # The server's repetition_context_size over the same prompt: the same tokens.
        s = cli_models.Serve(SMOL, "--parallel", "1")
        try:
            for n in ("3", "-1"):
                text, count, _ = generate("-p", "the the the the the", "--temp", "0", "-n", "16",
                                          "--repeat-penalty", "1.8", "--repeat-last-n", n)
                r = s.post("/v1/completions", {"prompt": "the the the the the", "temperature": 0, "max_tokens": 16,
                                               "repetition_penalty": 1.8,
                                               "repetition_context_size": 0 if n == "-1" else int(n)})
                self.assertEqual(text, r["choices"][0]["text"], n)
        finally:
            s.stop()


@unittest.skipUnless(os.path.exists(SMOL), f"{SMOL} is absent: run scripts/fetch_models.sh (or set LARDER_MODELS_DIR)")
class CliServerParityTest(unittest.TestCase):
    """`generate --temp 0` == serve's greedy /v1/completions for the same raw prompt (BOS as the
    tokenizer adds it, no template): same text, same token count, same finish reason.

    Where the prompt's KV comes from matters today, and is compared like for like: a cold run
    forwards the whole prompt in one prefill (the GEMM path) on both sides — the server's requests
    carry a fresh cache_salt, so its KV store cannot serve them; a warm run takes all but the last
    prompt token from the KV store and forwards that token alone (the one-row GEMV path) — the CLI
    with --ssd-cache, the server on a repeated request. The two paths round differently (Q4_1
    with int8 activations: on "Q: What is 2 + 2?\nA:" with repetition_penalty 1.3 and
    frequency_penalty 0.3 the third token's top-2 logprobs are -1.356/-1.414 cold and
    -1.526/-1.244 warm, so greedy picks " to" cold and " lies" warm). cold == warm is
    test_cold_equals_warm, which holds only once the kernels are batch-invariant: it runs when
    LARDER_EXPECT_BATCH_INVARIANT=1 and says why it does not otherwise."""

    @classmethod
    def setUpClass(cls):
        cls.serve = cli_models.Serve(SMOL, "--parallel", "1", "--ctx", "2048")
        cls.tmp = tempfile.mkdtemp(prefix="larder_parity_")
        cls.salt = 0

    @classmethod
    def tearDownClass(cls):
        cls.serve.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def server(self, prompt, body_extra, max_tokens, salt=None):
        if salt is None:  # a namespace of its own: nothing cached, the whole prompt is prefilled
            CliServerParityTest.salt += 1
            salt = f"cold-{self.salt}"
        r = self.serve.post("/v1/completions", {"prompt": prompt, "temperature": 0, "max_tokens": max_tokens,
                                                "cache_salt": salt, **body_extra})
        c = r["choices"][0]
        return c["text"], r["usage"]["completion_tokens"], c["finish_reason"], r["usage"]["prompt_tokens_details"]["cached_tokens"]

    def cli(self, prompt, cli_flags, max_tokens):
        text, n, stop = generate("-p", prompt, "--temp", "0", "-n", str(max_tokens), *cli_flags)
        return text, n, {"eos": "stop", "stop string": "stop"}.get(stop, stop)

    def check(self, body_extra, cli_flags, max_tokens=48):
        for prompt in PROMPTS:
            with self.subTest(prompt=prompt, constraint=cli_flags[:1]):
                text, n, finish, _ = self.server(prompt, body_extra, max_tokens)
                self.assertEqual(self.cli(prompt, cli_flags, max_tokens), (text, n, finish))

    def test_unconstrained(self):
        self.check({}, [])

    def test_with_a_grammar(self):
        self.check({"grammar": LIST_GBNF}, ["--grammar", LIST_GBNF])

    def test_with_a_json_schema(self):
        self.check({"json_schema": PERSON}, ["--json-schema", json.dumps(PERSON)], max_tokens=120)

    def test_with_stop_strings_and_penalties(self):
        body = {"stop": ["\n\n", "."], "repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.3,
                "logit_bias": {"13": -3.5}}
        flags = ["--stop", "\n\n", "--stop", ".", "--repeat-penalty", "1.3", "--presence-penalty", "0.5",
                 "--frequency-penalty", "0.3", "-l", "13-3.5"]
        self.check(body, flags)

    def test_warm_cli_equals_warm_server(self):
        # Both reuse all but the last prompt token from their KV store and forward that one alone.
        body = {"repetition_penalty": 1.3, "frequency_penalty": 0.3}
        flags = ["--repeat-penalty", "1.3", "--frequency-penalty", "0.3"]
        for i, prompt in enumerate(PROMPTS):
            with self.subTest(prompt=prompt):
                ssd = os.path.join(self.tmp, f"ssd{i}")
                salt = f"warm-{i}"
                self.server(prompt, body, 32, salt)
                text, n, finish, cached = self.server(prompt, body, 32, salt)
                self.cli(prompt, flags + ["--ssd-cache", ssd], 32)
                code, out, err = run("generate", SMOL, "-p", prompt, "--temp", "0", "-n", "32", "--ssd-cache", ssd,
                                     *flags, timeout=300)
                self.assertEqual(code, 0, err)
                reused = int(re.search(r"reused (\d+) of (\d+) prompt tokens", err).group(1))
                self.assertEqual(reused, cached, "both forward the same last prompt tokens alone")
                self.assertGreater(cached, 0)
                self.assertEqual(out[:-1], text)
                self.assertEqual(int(re.search(r"generated (\d+) tokens", err).group(1)), n)

    def test_cold_equals_warm(self):
        """Expected to hold only once the kernels are batch-invariant (a prompt token's logits the
        same whether it is the last row of a prefill or forwarded alone): see the class docstring."""
        if os.environ.get("LARDER_EXPECT_BATCH_INVARIANT") != "1":
            self.skipTest("cold (one prefill) vs warm (last prompt token alone) differ until the kernels are "
                          "batch-invariant; set LARDER_EXPECT_BATCH_INVARIANT=1 to check")
        body = {"repetition_penalty": 1.3, "frequency_penalty": 0.3}
        flags = ["--repeat-penalty", "1.3", "--frequency-penalty", "0.3"]
        for i, prompt in enumerate(PROMPTS):
            with self.subTest(prompt=prompt):
                salt = f"invariant-{i}"
                self.server(prompt, body, 32, salt)
                text, n, finish, cached = self.server(prompt, body, 32, salt)
                self.assertGreater(cached, 0)
                self.assertEqual(self.cli(prompt, flags, 32), (text, n, finish))


if __name__ == "__main__":
    unittest.main()
