"""Black-box probes of `larder serve` as an attacker or a careless client would send them
(issue 17, "Reliability and security" and "The transport"): deep JSON, cross-site requests,
Host checks, slow and idle connections, request smuggling, pipelining, HTTP/1.0, Nagle delay.
Each test fails on the server before the fix (a crash, a hang, a wrong answer)."""
import json
import os
import socket
import subprocess
import time
import unittest

from server_harness import BIN, STORIES, Server, ServerTestCase, chat_model, free_port, raw, user



def status_of(resp):
    line = resp.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def deep(depth, leaf=1):
    return "[" * depth + json.dumps(leaf) + "]" * depth


class DeepJsonTest(ServerTestCase):
    @classmethod
    def server_model(cls):
        return chat_model()["dir"]

    def check_400(self, path, body_text):
        r = self.server.post(path, body_text, {"Content-Type": "application/json"}, timeout=60)
        self.assertEqual(r.status, 400, f"{path}: deep JSON must be refused with 400; got {r}")
        self.assertIn("128", r.body.decode("utf-8", "replace"), f"the error names the limit: {r}")
        self.assertHealthy()

    def test_deep_nesting_everywhere(self):
        d = 100_000
        msgs = json.dumps(user("hi"))
        schema = '{"type": "json_schema", "json_schema": {"name": "x", "schema": ' + deep(d) + "}}"
        self.check_400("/v1/chat/completions", '{"messages": ' + msgs + ', "max_tokens": 2, "response_format": ' + schema + "}")
        tools = '[{"type": "function", "function": {"name": "f", "parameters": ' + deep(d) + "}}]"
        self.check_400("/v1/chat/completions", '{"messages": ' + msgs + ', "max_tokens": 2, "tools": ' + tools + "}")
        self.check_400("/v1/chat/completions",
                       '{"messages": [{"role": "user", "content": "hi", "name": ' + deep(d) + '}], "max_tokens": 2}')
        tool_use = ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": '
                    '"tool_use", "id": "t", "name": "f", "input": {"a": ' + deep(d) + '}}]}], "max_tokens": 2}')
        self.check_400("/v1/messages", tool_use)
        self.check_400("/v1/messages/count_tokens",
                       '{"messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "f", "input_schema": ' + deep(d) + "}]}")
        self.check_400("/tokenize", '{"content": "x", "extra": ' + deep(d) + "}")

    def test_moderate_nesting_still_works(self):
        schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "object"}}}}
        r = self.server.post("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 2,
                                                      "response_format": {"type": "json_schema",
                                                                          "json_schema": {"name": "x", "schema": schema}}})
        self.assertEqual(r.status, 200, r)


class BrowserPolicyTest(ServerTestCase):
    """Default settings: no cross-origin request is answered, simple (non-JSON) POSTs are
    refused so a browser always needs a preflight, admin routes never answer a browser."""

    def test_simple_post_refused(self):
        for path in ("/admin/kv/clear", "/v1/completions", "/v1/chat/completions", "/v1/messages"):
            for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
                r = self.server.post(path, b'{"prompt": "x", "max_tokens": 1}', {"Content-Type": ctype})
                self.assertEqual(r.status, 415, f"{path} with {ctype}: {r}")
        r = self.server.post("/v1/completions", b'{"prompt": "x", "max_tokens": 1}',
                             {"Content-Type": "application/json; charset=utf-8"})
        self.assertEqual(r.status, 200, r)

    def test_foreign_origin_refused(self):
        r = self.server.post("/v1/completions", {"prompt": "x", "max_tokens": 1}, {"Origin": "https://evil.example"})
        self.assertEqual(r.status, 403, r)
        self.assertNotIn("access-control-allow-origin", r.headers)
        r = self.server.request("OPTIONS", "/v1/completions", headers={"Origin": "https://evil.example",
                                                                        "Access-Control-Request-Method": "POST"})
        self.assertNotIn("access-control-allow-origin", r.headers, r)
        r = self.server.post("/admin/kv/clear", {}, {"Origin": "null"})
        self.assertEqual(r.status, 403, r)
        r = self.server.post("/admin/kv/clear", {})
        self.assertEqual(r.status, 200, f"admin routes still answer non-browser clients: {r}")

    def test_admin_refuses_any_origin_even_listed(self):
        s = Server(STORIES, "--cors", "*").start()
        try:
            r = s.post("/admin/kv/clear", {}, {"Origin": "http://localhost:3000"})
            self.assertEqual(r.status, 403, r)
            r = s.post("/admin/kv/flush", {}, {"Origin": "http://localhost:3000"})
            self.assertEqual(r.status, 403, r)
        finally:
            s.stop()

    def test_host_header_rules(self):
        p = self.server.port
        ok = raw(p, b"GET /health HTTP/1.1\r\nHost: LOCALHOST:%d\r\nConnection: close\r\n\r\n" % p)
        self.assertEqual(status_of(ok), 200, f"host names are case-insensitive: {ok[:200]!r}")
        two = raw(p, b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
        self.assertEqual(status_of(two), 400, f"two Host headers: {two[:200]!r}")
        evil = raw(p, b"GET /v1/models HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
        self.assertEqual(status_of(evil), 403, evil[:200])
        none = raw(p, b"GET /v1/models HTTP/1.1\r\nConnection: close\r\n\r\n")
        self.assertEqual(status_of(none), 400, f"HTTP/1.1 without Host: {none[:200]!r}")


class CorsPatternsTest(unittest.TestCase):
    def test_star_answers_literal_star_never_null(self):
        s = Server(STORIES, "--cors", "*").start()
        try:
            r = s.post("/v1/completions", {"prompt": "x", "max_tokens": 1}, {"Origin": "https://a.example"})
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.headers.get("access-control-allow-origin"), "*")
            self.assertNotEqual(r.headers.get("access-control-allow-credentials"), "true")
            r = s.post("/v1/completions", {"prompt": "x", "max_tokens": 1}, {"Origin": "null"})
            self.assertEqual(r.status, 403, f"Origin: null (sandboxed pages, file://) is never allowed: {r}")
        finally:
            s.stop()

    def test_patterns_match_only_what_they_say(self):
        s = Server(STORIES, "--cors", "https://*.example.com,http://app.test:*,localhost").start()
        try:
            cases = {"https://a.example.com": True, "https://x.y.example.com": True, "https://example.com.evil.net": False,
                     "https://evilexample.com": False, "http://a.example.com": False, "http://app.test:8000": True,
                     "http://app.test.evil.com:80": False, "http://localhost:5173": True, "http://127.0.0.1:3000": True,
                     "http://[::1]:8000": True, "http://localhost.evil.com": False}
            for origin, allowed in cases.items():
                r = s.request("OPTIONS", "/v1/chat/completions", headers={
                    "Origin": origin, "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "content-type, authorization"})
                if allowed:
                    self.assertEqual(r.status, 200, f"preflight answers 200 (llama-server clients expect it): {origin} {r}")
                    self.assertEqual(r.headers.get("access-control-allow-origin"), origin, origin)
                else:
                    self.assertNotIn("access-control-allow-origin", r.headers, origin)
        finally:
            s.stop()

    def test_prefix_pattern_refused_at_startup(self):
        p = subprocess.run([BIN, "serve", STORIES, "--port", str(free_port()), "--cors", "https://app.example*"],
                           capture_output=True, timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--cors", p.stderr.decode())


class AllowedHostsTest(unittest.TestCase):
    def test_allowed_hosts(self):
        s = Server(STORIES, "--allowed-hosts", "myhost.lan").start()
        try:
            p = s.port
            self.assertEqual(status_of(raw(p, b"GET /health HTTP/1.1\r\nHost: MyHost.LAN:%d\r\nConnection: close\r\n\r\n" % p)), 200)
            self.assertEqual(status_of(raw(p, b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")), 200)
            self.assertEqual(status_of(raw(p, b"GET /v1/models HTTP/1.1\r\nHost: other.lan\r\nConnection: close\r\n\r\n")), 403)
        finally:
            s.stop()


class TransportTest(ServerTestCase):
    FLAGS = ("--read-timeout", "2", "--max-connections-per-ip", "400")

    def health_ms(self):
        t0 = time.monotonic()
        r = self.server.request("GET", "/health", timeout=5)
        self.assertEqual(r.status, 200, r)
        return (time.monotonic() - t0) * 1e3

    def test_hundreds_of_slow_clients(self):
        conns = []
        try:
            for _ in range(300):
                s = socket.create_connection(("127.0.0.1", self.server.port), timeout=5)
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n")
                conns.append(s)
            t_end = time.monotonic() + 3.5
            worst = 0
            while time.monotonic() < t_end:  # each slow client sends one more header line per second
                for s in conns:
                    try:
                        s.sendall(b"X-Slow: 1\r\n")
                    except OSError:
                        pass
                worst = max(worst, self.health_ms())
                r = self.server.post("/v1/completions", {"prompt": "Once", "max_tokens": 2}, timeout=5)
                self.assertEqual(r.status, 200, r)
                time.sleep(0.5)
            self.assertLess(worst, 1000, "/health must answer promptly while 300 clients trickle headers")
            # The header deadline (--read-timeout 2) has passed: the slow clients were answered 408 and closed.
            closed = 0
            for s in conns:
                s.settimeout(2)
                try:
                    data = s.recv(4096)
                    closed += data == b"" or data.startswith(b"HTTP/1.1 408")
                except OSError:
                    closed += 1
            self.assertGreater(closed, 290, f"slow clients must be cut at the header deadline; {closed} of 300 were")
        finally:
            for s in conns:
                s.close()

    def test_idle_connections_and_lying_content_length(self):
        idle = [socket.create_connection(("127.0.0.1", self.server.port), timeout=5) for _ in range(350)]
        try:
            self.assertLess(self.health_ms(), 1000)
            t0 = time.monotonic()
            resp = raw(self.server.port, b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                                         b"application/json\r\nContent-Length: 1000\r\n\r\n{\"prompt\"", timeout=15)
            took = time.monotonic() - t0
            self.assertEqual(status_of(resp), 408, resp[:200])
            self.assertLess(took, 10, "a body that never arrives is cut at the body deadline")
            self.assertLess(self.health_ms(), 1000)
        finally:
            for s in idle:
                s.close()

    def test_per_ip_cap_evicts_oldest_idle(self):
        s = Server(STORIES, "--max-connections-per-ip", "20").start()
        socks = []
        try:
            socks = [socket.create_connection(("127.0.0.1", s.port), timeout=5) for _ in range(60)]
            r = s.request("GET", "/health", timeout=5)
            self.assertEqual(r.status, 200, "a new request still gets through: the oldest idle connection made room")
            evicted = 0
            for k in socks[:30]:
                k.settimeout(1)
                try:
                    evicted += k.recv(10) == b""
                except OSError:
                    evicted += 1
            self.assertGreaterEqual(evicted, 30, "the oldest connections beyond the cap were closed")
        finally:
            for k in socks:
                k.close()
            s.stop()

    def test_smuggling_forms_refused(self):
        p = self.server.port
        body = b'{"prompt": "Once", "max_tokens": 1}'
        base = b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        cases = {
            "two different Content-Length": base + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(body), len(body) + 5) + body,
            "+N Content-Length": base + b"Content-Length: +%d\r\n\r\n" % len(body) + body,
            "CL and TE": base + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(body) + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n",
            "TE not chunked": base + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            "space before colon": base + b"Content-Length : %d\r\n\r\n" % len(body) + body,
            "obs-fold": base + b"X-A: 1\r\n  continued\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
        }
        for name, data in cases.items():
            with self.subTest(name):
                self.assertEqual(status_of(raw(p, data)), 400, name)
        ok = raw(p, base + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
        self.assertEqual(status_of(ok), 200, f"a plain chunked body is fine: {ok[:300]!r}")

    def test_pipelined_requests_all_answered(self):
        p = self.server.port
        reqs = b"".join(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n" for _ in range(3)) + \
            b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        out = raw(p, reqs, timeout=5)
        self.assertEqual(out.count(b"HTTP/1.1 200 OK"), 4, out)
        self.assertTrue(out.rstrip().endswith(b"}"), "the last answer is the models list")
        self.assertIn(b'"object":"list"', out)

    def test_http10_gets_no_chunked(self):
        p = self.server.port
        body = b'{"prompt": "Once upon a time", "max_tokens": 4, "stream": true}'
        out = raw(p, b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        head, _, rest = out.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.0 200"), head)
        self.assertNotIn(b"transfer-encoding", head.lower())
        self.assertTrue(rest.startswith(b"data: "), rest[:100])
        self.assertIn(b"data: [DONE]", rest)

    def test_keep_alive_has_no_nagle_delay(self):
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=10)
        try:
            times = []
            for i in range(12):
                t0 = time.monotonic()
                c.request("POST", "/v1/completions", body=json.dumps({"prompt": "Once", "max_tokens": 1}),
                          headers={"Content-Type": "application/json"})
                r = c.getresponse()
                r.read()
                self.assertEqual(r.status, 200)
                times.append((time.monotonic() - t0) * 1e3)
            later = sorted(times[1:])
            self.assertLess(later[len(later) // 2], 30, f"median reused-connection latency (ms): {times}")
        finally:
            c.close()


if __name__ == "__main__":
    unittest.main()


class SsdFifoTest(unittest.TestCase):
    """A FIFO named *.lkv in the SSD cache directory blocked the startup scan forever: every
    request then reported ssd_scanning, /admin/kv/flush, /metrics and /stats hung, SIGTERM did
    not stop the server and `larder cache verify` hung."""

    def test_fifo_in_cache_dir(self):
        import glob
        import tempfile
        from server_harness import tmp_root
        cache = tempfile.mkdtemp(dir=tmp_root())
        s = Server(STORIES, "--ssd-cache", cache).start()
        try:
            r = s.post("/v1/completions", {"prompt": "Once upon a time there was", "max_tokens": 4, "temperature": 0})
            self.assertEqual(r.status, 200, r)
            self.assertEqual(s.post("/admin/kv/flush", {}).status, 200)
        finally:
            self.assertEqual(s.stop(), 0)
        files = glob.glob(os.path.join(cache, "**", "*.lkv"), recursive=True)
        self.assertTrue(files, "the flush wrote an .lkv file")
        os.mkfifo(os.path.join(os.path.dirname(files[0]), "f" * 32 + ".lkv"))
        os.unlink(files[0])
        os.mkfifo(files[0])  # and one with a valid entry name

        p = subprocess.run([BIN, "cache", "verify", cache], capture_output=True, timeout=30)
        self.assertIsNotNone(p.returncode, "cache verify finishes")

        s = Server(STORIES, "--ssd-cache", cache).start()
        try:
            # The scan runs beside startup; a FIFO must not stall it (it did: ssd_scanning forever).
            # Wait for it as /stats reports it, bounded, rather than race it on a loaded host.
            deadline = time.monotonic() + 15
            while not s.request("GET", "/stats").json()["kv_store"]["ssd"]["ready"]:
                self.assertLess(time.monotonic(), deadline, "the SSD scan never finished: a FIFO stalled it")
                time.sleep(0.05)
            t0 = time.monotonic()
            r = s.post("/v1/completions", {"prompt": "Once upon a time there was", "max_tokens": 4, "temperature": 0},
                       timeout=20)
            self.assertEqual(r.status, 200, r)
            self.assertNotIn("scanning", r.json()["usage"]["larder"]["cache"]["reason"])
            r = s.post("/admin/kv/flush", {}, timeout=20)
            self.assertIn(r.status, (200, 503), r)
            for path in ("/metrics", "/stats"):
                self.assertEqual(s.request("GET", path, timeout=20).status, 200, path)
            stats = s.request("GET", "/stats", timeout=20).json()
            self.assertGreaterEqual(stats["kv_store"]["ssd"]["corrupt"], 2,
                                    f"files removed by the scan are counted as corrupt: {stats['kv_store']}")
            self.assertLess(time.monotonic() - t0, 30)
        finally:
            self.assertEqual(s.stop(timeout=30), 0, "SIGTERM stops the server")
        self.assertFalse([f for f in glob.glob(os.path.join(cache, "**", "*.lkv"), recursive=True)
                          if not os.path.isfile(f)], "the FIFOs were removed as unusable")
