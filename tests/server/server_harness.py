"""Shared harness for the black-box tests of `larder serve`: starts the server as a real
subprocess on a free loopback port, waits for /health, and offers raw HTTP, SSE parsing and the
official openai / anthropic clients. Written from ../shared/design/server-api.md, not from the
implementation."""
import atexit
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("LARDER_BIN") or os.path.join(HERE, "../../build/bin/larder")
SHARED = os.environ.get("LARDER_SHARED_DIR") or os.path.join(HERE, "../../../shared")
STORIES = os.path.join(SHARED, "models/stories260K/stories260K.gguf")
STORIES_PROMPT = "Once upon a time"
STORIES_PROMPT_IDS = [1, 403, 407, 261, 378]  # published with the model (shared/README.md)
CHAT_MODEL_NAME = "tiny-chat-llama"

sys.path.insert(0, HERE)
import tiny_model  # noqa: E402

_chat_model = None
_chat_model_lock = threading.Lock()
_tmp_root = None


def tmp_root():
    global _tmp_root
    if _tmp_root is None:
        _tmp_root = tempfile.mkdtemp(prefix="larder_server_test_")
        atexit.register(shutil.rmtree, _tmp_root, True)
    return _tmp_root


def chat_model():
    """The random-weight Llama with the Llama 3 chat template, made once per process."""
    global _chat_model
    with _chat_model_lock:
        if _chat_model is None:
            _chat_model = tiny_model.make_chat_model(os.path.join(tmp_root(), CHAT_MODEL_NAME), SHARED)
        return _chat_model


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(*args, timeout=120):
    p = subprocess.run([BIN, *args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def generate(model, prompt, n, chat=False, system=None, ctx=None):
    """`larder generate` greedy continuation (stdout minus its one trailing newline)."""
    args = ["generate", model, "--prompt", prompt, "-n", str(n), "--temp", "0"]
    if chat:
        args.append("--chat")
    if system is not None:
        args += ["--system", system]
    if ctx:
        args += ["--ctx", str(ctx)]
    code, out, err = run_cli(*args)
    if code != 0:
        raise AssertionError(f"larder generate failed ({code}): {err}")
    assert out.endswith("\n"), f"larder generate output should end with one newline: {out!r}"
    return out[:-1]


def user(text):
    return [{"role": "user", "content": text}]


def raw(port, data, timeout=5.0, read_until_close=True):
    """Sends bytes on a fresh connection and returns everything received until the server closes
    the connection (or the timeout)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            out += chunk
            if not read_until_close and b"\r\n\r\n" in out:
                break
        return out
    finally:
        s.close()


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # dict, lower-case names
        self.body = body

    def json(self):
        return json.loads(self.body.decode("utf-8"))

    def __repr__(self):
        return f"<{self.status} {self.body[:600]!r}>"


class Server:
    """One `larder serve` process. Use start()/stop(); stop() returns the exit code."""

    def __init__(self, model, *flags, env=None, startup_timeout=60):
        self.model = model
        self.flags = [str(f) for f in flags]
        self.env = dict(os.environ, **(env or {}))
        self.startup_timeout = startup_timeout
        self.proc = None
        self.port = None
        self.log_path = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self):
        last = None
        for attempt in range(3):
            self.port = free_port()
            fd, self.log_path = tempfile.mkstemp(prefix="larder_serve_", suffix=".log", dir=tmp_root())
            log = os.fdopen(fd, "wb")
            cmd = [BIN, "serve", *([self.model] if self.model else []), "--host", "127.0.0.1", "--port",
                   str(self.port), *self.flags]
            self.cmd = cmd
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)
            log.close()
            try:
                self._wait_healthy()
                return self
            except PortTaken as e:  # somebody grabbed the port between probe and bind
                last = e
                continue
        raise AssertionError(f"server could not bind a port: {last}")

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")[-6000:]
        except OSError:
            return ""

    def _wait_healthy(self):
        self.pre_ready = []  # (status, body) of /health answers seen before the first 200
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                log = self.log()
                if "address already in use" in log.lower() or "port" in log.lower() and "in use" in log.lower():
                    raise PortTaken(log)
                raise AssertionError(f"`{' '.join(self.cmd)}` exited with {rc} before /health was 200; output:\n{log}")
            try:
                r = self.request("GET", "/health", timeout=2)
                if r.status == 200:
                    return
                self.pre_ready.append((r.status, r.body[:200]))
            except OSError:
                pass
            time.sleep(0.02)
        log = self.log()
        self.kill()
        raise AssertionError(f"/health not 200 within {self.startup_timeout}s for `{' '.join(self.cmd)}`; output:\n{log}")

    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def stop(self, timeout=30):
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    # -- HTTP --------------------------------------------------------------------------------
    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"

    def request(self, method, path, body=None, headers=None, timeout=120):
        """Raw request; body may be bytes, str or a JSON-able object. Returns Response."""
        h = {}
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
            h["Content-Type"] = "application/json"
        if isinstance(body, str):
            body = body.encode("utf-8")
        h.update(headers or {})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            data = r.read()
            return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, data)
        finally:
            conn.close()

    def post(self, path, body, headers=None, timeout=120):
        return self.request("POST", path, body, headers, timeout)

    def stream(self, path, body, headers=None, timeout=120):
        """POST and read an SSE response to the end. Returns (Response, events)."""
        r = self.post(path, body, headers, timeout)
        events = parse_sse(r.body) if r.status == 200 else None
        return r, events

    def openai(self, api_key="sk-no-key", **kw):
        import openai
        return openai.OpenAI(base_url=self.base + "/v1", api_key=api_key, max_retries=0,
                             timeout=kw.pop("timeout", 120), **kw)

    def anthropic(self, api_key="sk-ant-no-key", **kw):
        import anthropic
        return anthropic.Anthropic(base_url=self.base, api_key=api_key, max_retries=0,
                                   timeout=kw.pop("timeout", 120), **kw)

    def metrics(self, headers=None):
        r = self.request("GET", "/metrics", headers=headers)
        assert r.status == 200, f"/metrics: expected 200, got {r}"
        return parse_prometheus(r.body.decode("utf-8"))

    def model_id(self):
        r = self.request("GET", "/v1/models")
        assert r.status == 200, f"/v1/models: expected 200, got {r}"
        return r.json()["data"][0]["id"]


class PortTaken(Exception):
    pass


# -- SSE ---------------------------------------------------------------------------------------
class SseEvent:
    def __init__(self):
        self.event = None
        self.data_lines = []
        self.comments = []
        self.other = []

    @property
    def data(self):
        return "\n".join(self.data_lines) if self.data_lines else None

    def __repr__(self):
        return f"SseEvent(event={self.event!r}, data={self.data!r})"


def parse_sse(raw):
    """Parses an event stream into events (comment-only blocks are kept, with no data).
    Raises AssertionError on anything that is not valid SSE framing."""
    text = raw.decode("utf-8")
    text = text.replace("\r\n", "\n")
    assert text == "" or text.endswith("\n\n"), f"stream must end at an event boundary (\\n\\n): tail {text[-200:]!r}"
    events = []
    for block in text.split("\n\n"):
        if block == "":
            continue
        ev = SseEvent()
        for line in block.split("\n"):
            if line.startswith(":"):
                ev.comments.append(line)
            elif line.startswith("data:"):
                ev.data_lines.append(line[5:][1:] if line[5:].startswith(" ") else line[5:])
            elif line.startswith("event:"):
                ev.event = line[6:].strip()
            else:
                ev.other.append(line)
        events.append(ev)
    return events


def openai_chunks(test, events):
    """Checks the OpenAI framing rules (§5.1) and returns the parsed JSON chunks (no [DONE])."""
    data_events = [e for e in events if e.data_lines]
    test.assertTrue(data_events, "stream has no data events")
    for e in events:
        test.assertIsNone(e.event, f"OpenAI streams must never carry `event:` lines; got {e}")
        test.assertEqual(e.other, [], f"unexpected non-SSE lines in stream: {e.other}")
        test.assertLessEqual(len(e.data_lines), 1, f"each event must be exactly one data line: {e}")
    test.assertEqual(data_events[-1].data, "[DONE]", "the stream must end with `data: [DONE]`")
    chunks = []
    for e in data_events[:-1]:
        test.assertNotEqual(e.data.strip(), "", "empty data: line (openai-python json.loads fails on it)")
        test.assertNotEqual(e.data, "[DONE]", "[DONE] must be the last event, exactly once")
        try:
            chunks.append(json.loads(e.data))
        except ValueError:
            test.fail(f"every data: payload except the terminator must be JSON; got {e.data!r}")
        test.assertNotIn("\n", e.data, "data payload must be one line")
    return chunks


def anthropic_events(test, events):
    """Checks the Anthropic framing (§8.3): named events whose data JSON has the same `type`.
    Returns [(name, obj)] without pings."""
    out = []
    for e in events:
        if not e.data_lines:
            test.assertTrue(e.comments, f"empty SSE block: {e}")
            continue
        test.assertIsNotNone(e.event, f"Anthropic streams need `event:` lines; got {e}")
        test.assertNotEqual(e.data, "[DONE]", "Anthropic streams have no [DONE]")
        obj = json.loads(e.data)
        test.assertEqual(obj.get("type"), e.event, f"event name and data type differ: {e}")
        if e.event != "ping":
            out.append((e.event, obj))
    return out


# -- Prometheus --------------------------------------------------------------------------------
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|Inf|NaN|inf|nan))(\s+-?[0-9]+)?$')


def parse_prometheus(text):
    """{name: [(labels_str, value)]}; raises AssertionError on a malformed line."""
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        assert m, f"not a Prometheus sample line: {line!r}"
        out.setdefault(m.group(1), []).append((m.group(2) or "", float(m.group(3))))
    return out


def metric_sum(metrics, name):
    return sum(v for _, v in metrics.get(name, []))


# -- base test case ----------------------------------------------------------------------------
class ServerTestCase(unittest.TestCase):
    """Starts one server per class from MODEL / FLAGS (override server_model() for the chat model)."""
    FLAGS = ()
    ENV = None
    server = None

    @classmethod
    def server_model(cls):
        return STORIES

    @classmethod
    def setUpClass(cls):
        cls.server = Server(cls.server_model(), *cls.FLAGS, env=cls.ENV).start()

    @classmethod
    def tearDownClass(cls):
        if cls.server is not None:
            cls.server.stop()
            cls.server.kill()

    def tearDown(self):
        self.assertTrue(self.server.alive(), f"the server died during the test; output:\n{self.server.log()}")

    # -- assertion helpers
    def assertOpenAIError(self, r, status, field=None, code=None, type_=None):
        self.assertEqual(r.status, status, f"expected HTTP {status}, got {r}")
        try:
            obj = r.json()
        except ValueError:
            self.fail(f"error body must be JSON; got {r}")
        self.assertIsInstance(obj.get("error"), dict, f"OpenAI error body needs an `error` object; got {obj}")
        err = obj["error"]
        self.assertIsInstance(err.get("message"), str, f"error.message must be a string: {obj}")
        self.assertTrue(err["message"], f"error.message must not be empty: {obj}")
        self.assertIsInstance(err.get("type"), str, f"error.type must be a string: {obj}")
        self.assertIn("param", err, f"error must carry `param` (field or null): {obj}")
        self.assertIn("code", err, f"error must carry `code` (string or null): {obj}")
        if field is not None:
            named = (err.get("param") or "") + " " + err["message"]
            self.assertIn(field, named, f"error should name the field {field!r} in param or message: {obj}")
        if code is not None:
            self.assertEqual(err.get("code"), code, f"expected error.code {code!r}: {obj}")
        if type_ is not None:
            self.assertEqual(err["type"], type_, f"expected error.type {type_!r}: {obj}")
        return err

    def assertAnthropicError(self, r, status, type_, field=None):
        self.assertEqual(r.status, status, f"expected HTTP {status}, got {r}")
        try:
            obj = r.json()
        except ValueError:
            self.fail(f"error body must be JSON; got {r}")
        self.assertEqual(obj.get("type"), "error", f"Anthropic error body is {{type: error, error: {{type, message}}}}; got {obj}")
        self.assertIsInstance(obj.get("error"), dict, f"Anthropic error needs an `error` object: {obj}")
        self.assertEqual(obj["error"].get("type"), type_, f"expected error.type {type_!r}: {obj}")
        self.assertIsInstance(obj["error"].get("message"), str, f"error.message must be a string: {obj}")
        if field is not None:
            self.assertIn(field, obj["error"]["message"], f"error message should name {field!r}: {obj}")
        return obj["error"]

    def assertHealthy(self):
        r = self.server.request("GET", "/health", timeout=10)
        self.assertEqual(r.status, 200, f"/health should be 200 after the previous requests; got {r}")
