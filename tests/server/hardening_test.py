"""Black-box probes of `larder serve` from issue 47: request parsing time (JSON with many keys,
huge logit_bias), size bounds on every route that renders or tokenizes, a queued client that
leaves, log injection, source paths in error bodies, control bytes in the request head, admin
query parameters, and malformed tools / keep_alive / messages. Raw sockets where a client library
would refuse to send the bytes. Each test failed on the server before its fix."""
import json
import os
import re
import socket
import sys
import threading
import time
import unittest

from server_harness import Server, ServerTestCase, chat_model, metric_sum, raw, tmp_root, user
import tiny_model



def status_of(resp):
    parts = resp.split(b"\r\n", 1)[0].split(b" ")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def headers_of(resp):
    head = resp.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]
    return [tuple(h.split(b":", 1)) for h in head if b":" in h]


def post_raw(port, path, body_bytes, extra=b"", timeout=30.0):
    return raw(port, b"POST " + path.encode() + b" HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               + extra + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body_bytes) + body_bytes, timeout)


TOOLS_TEMPLATE = (
    "{%- if tools %}{{ '<|start_header_id|>system<|end_header_id|>\n\n' }}{%- for t in tools %}{{ t | tojson }}"
    "{{ '\n' }}{%- endfor %}{{ '<|eot_id|>' }}{%- endif %}{%- for m in messages %}{{ '<|start_header_id|>' + "
    "m['role'] + '<|end_header_id|>\n\n' + m['content'] + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}")


def report(what, seconds):
    print(f"\n  [measured] {what}: {seconds:.3f} s", file=sys.stderr, flush=True)


class ParseAndBoundsTest(ServerTestCase):
    # A template that renders tools (tojson), as the tool-calling families' templates do.
    FLAGS = ("--chat-template", TOOLS_TEMPLATE)

    @classmethod
    def server_model(cls):
        return chat_model()["dir"]

    def timed_post(self, path, body, timeout=120):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        t0 = time.monotonic()
        r = self.server.post(path, data, {"Content-Type": "application/json"}, timeout=timeout)
        return r, time.monotonic() - t0

    # -- item 3: parsing in linear time -------------------------------------------------------
    def test_many_keys_parse_fast(self):
        filler = ", ".join(f'"k{i:06d}": {i}' for i in range(80_000))  # 1.1 MB of distinct keys
        body = ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, ' + filler + "}").encode()
        r, took = self.timed_post("/v1/chat/completions", body)
        report("80k keys, /v1/chat/completions", took)
        self.assertEqual(r.status, 200, r)
        self.assertLess(took, 3.0, "80k keys must parse in linear time (12 s before)")
        # The same in a nested object (chat_template_kwargs), and on a control route.
        body = ('{"content": "Hello", "extra": {' + filler + "}}").encode()
        r, took = self.timed_post("/tokenize", body)
        report("80k keys nested, /tokenize", took)
        self.assertEqual(r.status, 200, r)
        self.assertLess(took, 3.0)
        # What follows parsing is linear too: a message of 80k keys goes through the template.
        body = ('{"messages": [{"role": "user", "content": "hi", ' + filler + "}]}").encode()
        r, took = self.timed_post("/apply-template", body)
        report("80k keys in a message, /apply-template", took)
        self.assertEqual(r.status, 200, r)
        self.assertLess(took, 3.0)
        # Ollama options: unknown ones are ignored with a Warning header each, a few at most.
        body = ('{"model": "' + self.server.model_id() + '", "stream": false, "messages": [{"role": "user", '
                '"content": "hi"}], "options": {"num_predict": 1, ' + filler + "}}").encode()
        t0 = time.monotonic()
        resp = post_raw(self.server.port, "/api/chat", body, timeout=120)
        took = time.monotonic() - t0
        report("80k options, /api/chat", took)
        self.assertEqual(status_of(resp), 200, resp[:300])
        warnings = [v for k, v in headers_of(resp) if k.lower() == b"warning"]
        self.assertLessEqual(len(warnings), 9, f"{len(warnings)} Warning headers")
        self.assertIn(b"more unknown options ignored", warnings[-1])
        self.assertLess(took, 3.0)
        # Template variables have a natural bound: 80k of them are refused, fast.
        body = ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "chat_template_kwargs": {'
                + filler + "}}").encode()
        r, took = self.timed_post("/v1/chat/completions", body)
        report("80k chat_template_kwargs, /v1/chat/completions", took)
        self.assertOpenAIError(r, 400, field="chat_template_kwargs")
        self.assertLess(took, 3.0)

    def test_huge_logit_bias_refused_fast(self):
        body = ('{"prompt": "Once", "max_tokens": 1, "logit_bias": {'
                + ", ".join(f'"{i}": 1' for i in range(1_000_000)) + "}}").encode()
        r, took = self.timed_post("/v1/completions", body)
        report("1M-entry logit_bias, /v1/completions", took)
        self.assertOpenAIError(r, 400, field="logit_bias")
        self.assertIn("vocabulary", r.json()["error"]["message"])
        self.assertLess(took, 10.0, "a 1M-entry logit_bias was still running at 120 s")
        self.assertHealthy()

    def test_duplicate_keys_last_wins_and_order_kept(self):
        # nlohmann's semantics, kept by the linear parser: the last value of a repeated key wins,
        # in small objects and in large (hashed) ones alike.
        for n in (0, 40):
            filler = "".join(f'"f{i}": {i}, ' for i in range(n))
            body = ('{' + filler + '"content": "a", "with_pieces": false, "content": "Hello"}').encode()
            r = self.server.post("/tokenize", body, {"Content-Type": "application/json"})
            self.assertEqual(r.status, 200, r)
            want = self.server.post("/tokenize", {"content": "Hello"}).json()["tokens"]
            self.assertEqual(r.json()["tokens"], want, f"last value wins ({n} other keys)")
        # Key order reaches the template (tojson) as the client wrote it, past the hashing size.
        props = {f"p{40 - i:02d}": {"type": "string"} for i in range(40)}
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": props}}}]
        r = self.server.post("/apply-template", {"messages": user("hi"), "tools": tools})
        self.assertEqual(r.status, 200, r)
        prompt = r.json()["prompt"]
        where = [prompt.find(f'"{k}"') for k in props]
        self.assertTrue(all(w >= 0 for w in where), prompt[:400])
        self.assertEqual(where, sorted(where), "the properties keep the client's order")

    # -- item 4: the prompt byte bound on every route that renders or tokenizes ------------------
    def test_size_bound_on_every_route(self):
        big = "word " * 1_600_000  # 8 MB: far beyond 2048 tokens × the longest token
        many_tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "d" * 40,
                                                        "parameters": {"type": "object"}}} for i in range(100_000)]
        anth_tools = [{"name": f"tool_{i}", "description": "d" * 40, "input_schema": {"type": "object"}}
                      for i in range(100_000)]
        mid = self.server.model_id()
        cases = [
            ("/v1/messages/count_tokens", {"messages": user(big)}),
            ("/v1/messages/count_tokens", {"messages": user("hi"), "tools": anth_tools}),
            ("/apply-template", {"messages": user(big)}),
            ("/apply-template", {"messages": user("hi"), "tools": many_tools}),
            ("/v1/chat/completions", {"messages": user("hi"), "tools": many_tools, "max_tokens": 1}),
            ("/api/chat", {"model": mid, "messages": user("hi"), "tools": many_tools, "stream": False}),
            ("/tokenize", {"content": big}),
            ("/detokenize", {"tokens": [300] * 1_000_000}),
        ]
        for path, body in cases:
            with self.subTest(path=path, tools="tools" in body):
                r, took = self.timed_post(path, body)
                report(f"oversized request on {path}{' (100k tools)' if 'tools' in body else ''}", took)
                self.assertEqual(r.status, 400, r)
                # 13 MB of tools still parse and validate (linear); rendering them took 25-50 s.
                self.assertLess(took, 6.0 if "tools" in body else 3.0, f"{path}: refused before rendering or tokenizing")
        self.assertHealthy()
        r = self.server.post("/v1/messages/count_tokens", {"messages": user("Hello there")})
        self.assertEqual(r.status, 200, r)
        self.assertGreater(r.json()["input_tokens"], 2)

    # -- item 12: malformed fields are 400s naming the field -----------------------------------
    def test_malformed_tools_keep_alive_messages(self):
        mid = self.server.model_id()
        cases = [
            ("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 1, "tools": [5]}),
            ("/apply-template", {"messages": user("hi"), "tools": [5]}),
            ("/v1/messages", {"messages": user("hi"), "max_tokens": 1, "tools": [5]}),
            ("/v1/messages/count_tokens", {"messages": user("hi"), "tools": [5]}),
            ("/api/chat", {"model": mid, "messages": user("hi"), "stream": False, "tools": [5]}),
            ("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 1, "tools": [{"type": "function"}]}),
            ("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 1,
                                      "tools": [{"type": "function", "function": {"name": 5}}]}),
        ]
        for path, body in cases:
            with self.subTest(path=path, tools=body["tools"]):
                r = self.server.post(path, body)
                self.assertEqual(r.status, 400, r)
                self.assertIn("tools", r.body.decode())
        for ka in ("x", "5 minutes", "10", "m5"):
            with self.subTest(keep_alive=ka):
                r = self.server.post("/api/chat", {"model": mid, "messages": [], "keep_alive": ka})
                self.assertEqual(r.status, 400, r)
                self.assertIn("keep_alive", r.json()["error"])
        for ka in ("5m", "1h30m", "0", "-1s", "2.5s", 300, -1):
            r = self.server.post("/api/chat", {"model": mid, "messages": [], "keep_alive": ka})
            self.assertEqual(r.status, 200, f"keep_alive {ka!r}: {r}")
        for path, body in (("/api/chat", {"model": mid, "messages": ""}), ("/api/chat", {"model": mid, "messages": "hi"}),
                           ("/api/generate", {"model": mid, "prompt": []})):
            with self.subTest(path=path, body=body):
                r = self.server.post(path, body)
                self.assertEqual(r.status, 400, r)
        # Well-formed tools still work.
        ok = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        self.assertEqual(self.server.post("/apply-template", {"messages": user("hi"), "tools": ok}).status, 200)
        self.assertEqual(self.server.post("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 1,
                                                                   "tools": ok}).status, 200)

    # -- item 9: no build paths in error bodies -------------------------------------------------
    def test_error_bodies_carry_no_source_paths(self):
        circular = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
        bodies = [
            ("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 1, "response_format": {
                "type": "json_schema", "json_schema": {"name": "x", "schema": circular}}}),
            ("/v1/messages", {"messages": user("hi"), "max_tokens": 1, "tools": [{"name": "f", "input_schema": circular}],
                              "tool_choice": {"type": "any"}}),
            ("/api/chat", {"model": self.server.model_id(), "messages": user("hi"), "stream": False, "format": circular}),
        ]
        leak = re.compile(r"\.(cc|cpp|h|hpp):\d+|/\.cache/|\[\d\d:\d\d:\d\d\]")
        for path, body in bodies:
            with self.subTest(path=path):
                r = self.server.post(path, body)
                self.assertEqual(r.status, 400, r)
                text = r.body.decode()
                self.assertIsNone(leak.search(text), f"{path}: the error names build paths or source lines: {text}")
                self.assertIn("ircular", text, "the reason itself is kept")


class QueueDisconnectTest(unittest.TestCase):
    """--queue-max 2: two queued clients leave; the next request must get their place at once,
    not a 429 until the running request ends (18 s in the issue)."""

    def test_left_clients_free_their_queue_places(self):
        # Wider than the usual tiny model, so that one long answer holds the only slot for seconds.
        slow = tiny_model.make_chat_model(os.path.join(tmp_root(), "slow-chat"), os.environ.get(
            "LARDER_SHARED_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../shared"),
            hidden=384, intermediate=1024, heads=6, kv_heads=2)
        s = Server(slow["dir"], "--parallel", "1", "--queue-max", "2").start()
        socks = []

        def send_chat(max_tokens, stream):
            k = socket.create_connection(("127.0.0.1", s.port), timeout=30)
            data = json.dumps({"messages": user("Go on."), "max_tokens": max_tokens, "temperature": 0,
                               "stream": stream}).encode()
            k.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(data) + data)
            socks.append(k)
            return k

        def status_line(k):
            buf = b""
            while b"\r\n" not in buf:
                chunk = k.recv(4096)
                if not chunk:
                    break
                buf += chunk
            return status_of(buf)

        try:
            hold = send_chat(2000, True)
            self.assertEqual(status_line(hold), 200)
            t_hold = time.monotonic()
            queued = [send_chat(4, False) for _ in range(2)]
            deadline = time.monotonic() + 20
            while metric_sum(s.metrics(), "larder_queue_depth") < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            self.assertEqual(metric_sum(s.metrics(), "larder_queue_depth"), 2)
            third = send_chat(4, False)
            self.assertEqual(status_line(third), 429, "the queue is full")
            for k in queued:
                k.close()
            time.sleep(1.0)  # the server notices a vanished client within ~0.5 s
            fresh = send_chat(4, False)
            st = status_line(fresh)
            report("slot held for (at the probe)", time.monotonic() - t_hold)
            self.assertEqual(st, 200, f"the queued clients left: their places are free; server log:\n{s.log()[-1500:]}")
            self.assertEqual(metric_sum(s.metrics(), "larder_queue_depth"), 1, "only the fresh request waits")
        finally:
            for k in socks:
                k.close()
            s.stop()


class LogInjectionTest(unittest.TestCase):
    def test_client_bytes_cannot_forge_log_lines(self):
        s = Server(chat_model()["dir"]).start()
        try:
            p = s.port
            raw(p, b"GET /x%0d%0alarder:%202026-01-01T00:00:00.000Z%20GET%20/forged%20200%201ms%1b[31m HTTP/1.1\r\n"
                   b"Host: localhost\r\nConnection: close\r\n\r\n")
            r = s.post("/api/chat", {"model": "m\r\nlarder: FORGED-MODEL-LINE\x1b[2J", "messages": user("hi")})
            self.assertEqual(r.status, 404, r)
            r = s.post("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 1},
                       {"x-request-id": "ok-id"})
            time.sleep(0.3)
            with open(s.log_path, "rb") as f:
                log = f.read()
            lines = log.split(b"\n")
            self.assertFalse([ln for ln in lines if ln.startswith(b"larder: 2026-01-01")], log[-2000:])
            self.assertFalse([ln for ln in lines if b"FORGED-MODEL-LINE" in ln and not ln.startswith(b"larder: 20")],
                             log[-2000:])
            self.assertNotIn(b"\x1b", log, "no terminal escape reaches the log")
            self.assertNotIn(b"\r", log)
            self.assertIn(b"/x\\r\\nlarder:", log, "the path is logged, escaped")
        finally:
            s.stop()


class RequestHeadTest(ServerTestCase):
    @classmethod
    def server_model(cls):
        return chat_model()["dir"]

    def test_control_bytes_in_names_and_methods_refused(self):
        p = self.server.port
        cases = {
            "NUL in a header name": b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-A\x00B: 1\r\n\r\n",
            "NUL alone as a header name": b"GET /health HTTP/1.1\r\nHost: localhost\r\n\x00: 1\r\n\r\n",
            "NUL in the method": b"GE\x00T /health HTTP/1.1\r\nHost: localhost\r\n\r\n",
            "empty method": b" /health HTTP/1.1\r\nHost: localhost\r\n\r\n",
            "NUL in a header value": b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-A: a\x00b\r\n\r\n",
            "control byte in the target": b"GET /hea\x01lth HTTP/1.1\r\nHost: localhost\r\n\r\n",
        }
        for name, data in cases.items():
            with self.subTest(name):
                self.assertEqual(status_of(raw(p, data)), 400, name)
        self.assertHealthy()

    def test_request_id_echoed_only_when_safe(self):
        body = json.dumps({"prompt": "Once", "max_tokens": 1}).encode()
        for rid in (b"a\x0bb", b"\xff\xfe", b"x" * 300, b"two words"):
            with self.subTest(rid=rid):
                resp = post_raw(self.server.port, "/v1/completions", body, b"x-request-id: " + rid + b"\r\n")
                self.assertEqual(status_of(resp), 200, resp[:300])
                got = [v.strip() for k, v in headers_of(resp) if k.lower() == b"x-request-id"]
                self.assertEqual(len(got), 1, resp[:400])
                self.assertNotEqual(got[0], rid.strip())
                self.assertRegex(got[0].decode("ascii"), r"^[\x21-\x7e]{1,128}$")
        resp = post_raw(self.server.port, "/v1/completions", body, b"x-request-id: req-123_ok.7\r\n")
        self.assertIn((b"x-request-id", b" req-123_ok.7"), headers_of(resp))

    # -- item 11: admin query parameters --------------------------------------------------------
    def test_admin_query_parameters(self):
        for q in ("?tier=SSD", "?tier=disk", "?tier=", "?teir=ssd", "?tier=ram&tier=ssd", "?tier=ram&x=1"):
            with self.subTest(q=q):
                r = self.server.post("/admin/kv/clear" + q, {})
                self.assertOpenAIError(r, 400)
        r = self.server.post("/admin/kv/flush?force=1", {})
        self.assertOpenAIError(r, 400, field="force")
        for q in ("", "?tier=ram", "?tier=ssd"):
            r = self.server.post("/admin/kv/clear" + q, {})
            self.assertEqual(r.status, 200, f"{q}: {r}")
            self.assertEqual(r.json()["cleared"], "ram+ssd" if q.endswith("ssd") else "ram")


if __name__ == "__main__":
    unittest.main()
