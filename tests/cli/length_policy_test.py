"""One default length policy (issue 17, item 7; README "Generation length"): when neither the
request nor the command line names a limit, chat completions, completions and `generate` all stop
after runtime::kDefaultMaxTokens = 2048 tokens (or earlier at EOS, a stop string, the context end);
`serve --max-tokens N` / `generate -n N` change it, -1 lifts it (until the context is full), and a
request's own max_tokens always wins. Before, chat completions had no limit (a request ran 4,058
tokens), /v1/completions stopped at 512 and generate at 256.

The model is stories260K with a 4096-token context and a chat template (cli_models), EOS banned
by logit_bias (or --ignore-eos), so every generation runs until the limit under test."""
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

from cli_models import BIN, run, story_chat_model

DEFAULT = 2048
NO_EOS = {"logit_bias": {"2": -100}, "temperature": 0}  # stories260K: EOS is id 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    def __init__(self, model, *flags):
        self.port = free_port()
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([BIN, "serve", model, "--port", str(self.port), *flags],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited: {self.output()}")
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"serve not healthy: {self.output()}")

    def output(self):
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def post(self, path, body):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            assert r.status == 200, f"{path}: {r.status} {data[:500]!r}"
            return json.loads(data)
        finally:
            c.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

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
