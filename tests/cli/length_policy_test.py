"""One default length policy (issue 17, item 7; README "Generation length"): when neither the
request nor the command line names a limit, chat completions, completions and `generate` all stop
after runtime::kDefaultMaxTokens = 2048 tokens (or earlier at EOS, a stop string, the context end);
`serve --max-tokens N` / `generate -n N` change it, -1 lifts it (until the context is full), and a
request's own max_tokens always wins. Before, chat completions had no limit (a request ran 4,058
tokens), /v1/completions stopped at 512 and generate at 256.

The model is stories260K with a 4096-token context and a chat template (cli_models), EOS banned
by logit_bias (or --ignore-eos), so every generation runs until the limit under test."""
import json
import os
import re
import shutil
import tempfile
import unittest

import cli_models
from cli_models import run, story_chat_model

DEFAULT = 2048
NO_EOS = {"logit_bias": {"2": -100}, "temperature": 0}  # stories260K: EOS is id 2


class Serve(cli_models.Serve):
    def lengths(self, **extra):
        """(completion tokens, finish reason) of /v1/completions and /v1/chat/completions."""
        c = self.post("/v1/completions", {"prompt": "Once upon a time", **NO_EOS, **extra})
        ch = self.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Lily"}], **NO_EOS, **extra})
        return ((c["usage"]["completion_tokens"], c["choices"][0]["finish_reason"], c["usage"]["prompt_tokens"]),
                (ch["usage"]["completion_tokens"], ch["choices"][0]["finish_reason"], ch["usage"]["prompt_tokens"]))


class LengthPolicyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="larder_len_")
        cls.model = story_chat_model(cls.tmp, context=4096)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_server_default_is_the_same_for_every_route(self):
        s = Serve(self.model)
        try:
            (c, cf, _), (ch, chf, _) = s.lengths()
            self.assertEqual((c, cf), (DEFAULT, "length"), "/v1/completions without max_tokens")
            self.assertEqual((ch, chf), (DEFAULT, "length"), "/v1/chat/completions without max_tokens")
            (c, _, _), (ch, _, _) = s.lengths(max_tokens=7)
            self.assertEqual((c, ch), (7, 7), "the request's max_tokens wins")
        finally:
            s.stop()

    def test_server_flag_sets_and_lifts_the_default(self):
        s = Serve(self.model, "--max-tokens", "9")
        try:
            (c, _, _), (ch, _, _) = s.lengths()
            self.assertEqual((c, ch), (9, 9))
        finally:
            s.stop()
        s = Serve(self.model, "-n", "-1", "--ctx", "300")
        try:
            (c, cf, cp), (ch, chf, chp) = s.lengths()
            self.assertEqual((c, cf), (300 - cp, "length"), "-1: until the context is full")
            self.assertEqual((ch, chf), (300 - chp, "length"))
        finally:
            s.stop()

    def test_generate_default_and_minus_one(self):
        code, out, err = run("generate", self.model, "-p", "Once upon a time", "--ignore-eos", "--temp", "0")
        self.assertEqual(code, 0, err)
        self.assertRegex(err, rf"generated {DEFAULT} tokens")
        code, out, err = run("generate", self.model, "-p", "Once upon a time", "--ignore-eos", "-n", "-1", "-c", "300")
        self.assertEqual(code, 0, err)
        prompt = int(re.search(r"prompt (\d+) tokens", err).group(1))
        self.assertRegex(err, rf"generated {300 - prompt} tokens")

    def test_help_documents_the_policy(self):
        for verb in ("serve", "generate", "chat"):
            code, out, err = run(verb, "--help")
            line = re.search(r"--max-tokens[^\n]*\n[^\n]*", out).group(0)
            self.assertIn(f"={DEFAULT}", line, verb)
            self.assertIn("-1", line, verb)
        with open(os.path.join(os.environ["LARDER_SOURCE_DIR"], "README.md")) as f:
            readme = f.read()
        self.assertIn("Generation length", readme)
        self.assertIn(str(DEFAULT), readme)


if __name__ == "__main__":
    unittest.main()
