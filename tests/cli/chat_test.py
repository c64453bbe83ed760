"""Standard input and the terminal (issue 17, items 6 and 10): `generate` reads its prompt from a
pipe, `larder chat` holds a multi-turn conversation in a pseudo-terminal (streaming, the KV store
reused across turns, /clear, Ctrl-C stops the answer and not the session), and Ctrl-C in
`generate` still prints the statistics line. The model is stories260K with a chat template and a
long context added (cli_models.story_chat_model): ~1000 tok/s on one core."""
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

from cli_models import BIN, STORIES, run, story_chat_model

OPENING = ", there was a little girl named Lily."


class Pty:
    """`larder ARGS` on a pseudo-terminal: its stdin is a terminal, Ctrl-C is the byte 0x03."""

    def __init__(self, *args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execv(BIN, [BIN, *args])
        self.buf = b""

    def read_until(self, pattern, timeout=60):
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern.encode() if isinstance(pattern, str) else pattern)
        while True:
            m = rx.search(self.buf)
            if m:
                before, self.buf = self.buf[:m.end()], self.buf[m.end():]
                return before.decode("utf-8", "replace")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {pattern!r} within {timeout} s; got: {self.buf[-2000:]!r}")
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"the process ended before {pattern!r}; got: {self.buf[-2000:]!r}")
                self.buf += chunk

    def send(self, data):
        os.write(self.fd, data.encode() if isinstance(data, str) else data)

    def wait(self, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:  # keep draining so the child never blocks on a full terminal
                if select.select([self.fd], [], [], 0.1)[0]:
                    self.buf += os.read(self.fd, 65536)
            except OSError:
                time.sleep(0.05)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError("the process did not exit")

    def close(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(self.fd)


PROMPT = r"(?:^|\n)> "


class ChatTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="larder_chat_")
        cls.model = story_chat_model(cls.tmp, context=4096)
        cls.long_model = story_chat_model(cls.tmp, context=32768)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    # item 6: standard input ------------------------------------------------------------------
    def test_generate_chat_reads_the_message_from_stdin(self):
        args = ["generate", self.model, "--chat", "-n", "24", "--temp", "0"]
        code, piped, err = run(*args, input="Lily likes the sun.\n")
        self.assertEqual(code, 0, err)
        code, given, err = run(*args, "-p", "Lily likes the sun.")
        self.assertEqual(code, 0, err)
        code, empty, err = run(*args, "-p", "")
        self.assertEqual(code, 0, err)
        self.assertEqual(piped, given, "the piped message (one final newline dropped) is the user message")
        self.assertNotEqual(piped, empty, "stdin must not be ignored (that answers an empty message)")

    def test_generate_reads_the_prompt_from_stdin(self):
        code, out, err = run("generate", STORIES, "-n", "12", "--temp", "0", input="Once upon a time\n")
        self.assertEqual(code, 0, err)
        self.assertTrue(out.startswith(OPENING), out)
        # An explicit --prompt wins over stdin.
        code, out, err = run("generate", STORIES, "-p", "Once upon a time", "-n", "12", "--temp", "0",
                             input="Lily went to the park\n")
        self.assertTrue(out.startswith(OPENING), out)

    def test_chat_without_a_terminal_answers_each_line(self):
        code, out, err = run("chat", self.model, "-n", "16", "--temp", "0", "-v", input="Hello\nTell me more\n")
        self.assertEqual(code, 0, err)
        self.assertEqual(len(re.findall(r"reused \d+ of \d+ prompt tokens", err)), 2, err)
        self.assertNotIn("> ", out, "no prompt when stdin is not a terminal")

    # item 6: larder chat in a terminal -------------------------------------------------------
    def test_chat_in_a_terminal(self):
        t = Pty("chat", self.model, "-n", "16", "--temp", "0", "-v")
        try:
            t.read_until(PROMPT)
            t.send("Lily went to the park.\n")
            first = t.read_until(r"reused (\d+) of (\d+) prompt tokens[^\n]*\n")
            m = re.search(r"reused (\d+) of (\d+) prompt tokens", first)
            self.assertEqual(m.group(1), "0", "the first turn starts cold")
            answer1 = first.split("Lily went to the park.", 1)[-1]
            self.assertRegex(answer1, r"[a-z]{3,}", f"an answer was streamed: {first!r}")
            t.read_until(PROMPT)
            t.send("She saw a dog.\n")
            second = t.read_until(r"reused (\d+) of (\d+) prompt tokens[^\n]*\n")
            m2 = re.search(r"reused (\d+) of (\d+) prompt tokens", second)
            reused, total = int(m2.group(1)), int(m2.group(2))
            first_total = int(m.group(2))
            self.assertGreater(total, first_total, "the second turn's prompt holds the whole conversation")
            self.assertGreaterEqual(reused, first_total, "the KV store kept the first turn: its prompt is not "
                                                         "prefilled again")
            t.read_until(PROMPT)
            t.send("/clear\n")
            t.read_until(r"conversation cleared")
            t.read_until(PROMPT)
            t.send("She saw a dog.\n")
            third = t.read_until(r"reused (\d+) of (\d+) prompt tokens[^\n]*\n")
            m3 = re.search(r"reused (\d+) of (\d+) prompt tokens", third)
            self.assertLess(int(m3.group(2)), total, "after /clear the conversation starts over")
            t.read_until(PROMPT)
            t.send(b"\x04")  # Ctrl-D ends the chat
            self.assertEqual(t.wait(), 0)
        finally:
            t.close()

    def test_ctrl_c_stops_the_answer_not_the_session(self):
        # An answer that would run for tens of seconds: the whole 32k context, EOS ignored.
        t = Pty("chat", self.long_model, "-n", "-1", "--ignore-eos", "--temp", "0", "-v")
        try:
            t.read_until(PROMPT)
            t.send("Lily went to the park.\n")
            t.read_until(r"(?:\S+\s+){40}", timeout=60)  # the answer is streaming
            start = time.monotonic()
            t.send(b"\x03")
            stats = t.read_until(r"reused \d+ of \d+ prompt tokens[^\n]*\n", timeout=20)
            self.assertLess(time.monotonic() - start, 15, "Ctrl-C stops the answer at once")
            self.assertIn("[stopped]", stats)
            self.assertIn("interrupted", stats)
            t.read_until(PROMPT, timeout=10)  # the session goes on
            t.send("/exit\n")
            self.assertEqual(t.wait(), 0)
        finally:
            t.close()

    def test_chat_on_a_model_without_template_uses_chatml(self):
        # Like serve and generate --chat: the ChatML fallback, announced before the first prompt.
        code, out, err = run("chat", STORIES, "-n", "4", input="hi\n")
        self.assertEqual(code, 0, err)
        self.assertIn("has no chat template", err)
        self.assertIn("ChatML", err)
        # --chat-template picks another one (and the fallback warning is gone).
        code, out, err = run("chat", STORIES, "-n", "4", "--chat-template", "llama3", input="hi\n")
        self.assertEqual(code, 0, err)
        self.assertNotIn("has no chat template", err)
        self.assertIn("llama3", err)
        code, out, err = run("chat", STORIES, "--chat-template", "no-such-template", input="hi\n")
        self.assertNotEqual(code, 0)
        self.assertIn("no-such-template", err)

    # item 10 (part): Ctrl-C in generate --------------------------------------------------------
    def test_ctrl_c_in_generate_prints_the_stats(self):
        p = subprocess.Popen([BIN, "generate", self.long_model, "-p", "Once upon a time", "-n", "30000", "--ignore-eos"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            got = b""
            deadline = time.monotonic() + 60
            while len(got) < 400 and time.monotonic() < deadline:
                if select.select([p.stdout], [], [], 1)[0]:
                    got += os.read(p.stdout.fileno(), 4096)
            self.assertGreaterEqual(len(got), 400, "generation should be streaming")
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=20)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        err = err.decode("utf-8", "replace")
        self.assertEqual(p.returncode, 130, err)
        self.assertRegex(err, r"generated \d+ tokens in [0-9.]+ s \([0-9.]+ tok/s\)")
        self.assertIn("interrupted", err)


if __name__ == "__main__":
    unittest.main()
