"""Black-box tests of what an operator sees (issue 17 items 2, 9, 10, 11): --queue-max 0, one
timestamped log line per request (4xx included, --log-format json), the drain message, and
GET / and GET /v1 naming the model and the routes; plus the prompt byte bound."""
import json
import re
import socket
import threading
import time
import unittest

from server_harness import STORIES, Server, chat_model

TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def chat_body(text, max_tokens, **kw):
    return {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0, **kw}


def hold_slot(server, tokens=1800):
    """Starts a long streaming chat on a raw socket and returns it once tokens flow."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    data = json.dumps(chat_body("Keep the slot busy.", tokens, stream=True)).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(data) + data)
    buf = b""
    while buf.count(b"data:") < 3:
        b = s.recv(4096)
        if not b:
            break
        buf += b
    return s


class QueueMaxZeroTest(unittest.TestCase):
    def test_no_queue(self):
        s = Server(chat_model()["dir"], "--parallel", "1", "--queue-max", "0").start()
        try:
            for _ in range(3):  # idle server: admitted (it answered 429 to everything before)
                r = s.post("/v1/chat/completions", chat_body("hi", 2))
                self.assertEqual(r.status, 200, r)
            sock = hold_slot(s)
            try:
                r = s.post("/v1/chat/completions", chat_body("No room.", 2), timeout=30)
                self.assertEqual(r.status, 429, r)
                self.assertIn("queue-max 0", r.json()["error"]["message"])
            finally:
                sock.close()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the slot frees once the disconnect is noticed
                r = s.post("/v1/chat/completions", chat_body("hi", 2))
                if r.status == 200:
                    break
                time.sleep(0.2)
            self.assertEqual(r.status, 200, r)
            self.assertIn(" 429 ", s.log(), "the 429 is logged")
        finally:
            s.stop()


class RequestLogTest(unittest.TestCase):
    KEY = "sk-log-test"

    def test_text_lines_for_every_status(self):
        s = Server(STORIES, "--api-key", self.KEY).start()
        try:
            auth = {"Authorization": "Bearer " + self.KEY}
            self.assertEqual(s.post("/v1/completions", {"prompt": "x", "max_tokens": 1}).status, 401)
            self.assertEqual(s.request("GET", "/nope", headers=auth).status, 404)
            self.assertEqual(s.post("/v1/completions", {"prompt": "x", "max_tokens": "many"}, auth).status, 400)
            r = s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 3}, auth)
            self.assertEqual(r.status, 200)
            time.sleep(0.3)
            lines = [l for l in s.log().splitlines() if TS.search(l)]
            def find(pattern):
                hits = [l for l in lines if re.search(pattern, l)]
                self.assertTrue(hits, f"no log line matching {pattern!r} in:\n" + "\n".join(lines))
                return hits[0]
            line = find(r"POST /v1/completions 401 ")
            self.assertIn("missing API key", line, "failures carry their error message")
            find(r"GET /nope 404 ")
            self.assertIn("max_tokens", find(r"POST /v1/completions 400 "))
            ok = find(r"POST /v1/completions 200 ")
            for field in ("prompt=5", "cached=", "completion=3", "ms"):
                self.assertIn(field, ok)
        finally:
            s.stop()

    def test_json_lines(self):
        s = Server(STORIES, "--log-format", "json").start()
        try:
            s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 2})
            s.request("GET", "/missing")
            time.sleep(0.3)
            objs = []
            for l in s.log().splitlines():
                if l.startswith("{"):
                    objs.append(json.loads(l))
            by_status = {o["status"]: o for o in objs}
            self.assertIn(200, by_status, objs)
            self.assertIn(404, by_status, objs)
            ok = by_status[200]
            self.assertTrue(TS.fullmatch(ok["ts"]), ok)
            self.assertEqual((ok["method"], ok["path"]), ("POST", "/v1/completions"))
            self.assertEqual((ok["prompt_tokens"], ok["completion_tokens"]), (5, 2))
            self.assertIn("ms", ok)
            self.assertIn("error", by_status[404])
        finally:
            s.stop()


class MemoryPressureTest(unittest.TestCase):
    """Issue 16 item 3: below --min-free-memory the KV store gives its RAM back — entries are
    written to the SSD tier and dropped from RAM — and the next request is served from SSD.
    LARDER_MEMORY_LIMIT pins what available_memory() reports, so the host's load cannot decide."""

    def test_pressure_demotes_ram_entries_to_ssd(self):
        import os
        import tempfile
        from server_harness import STORIES_PROMPT
        import shutil
        ssd = tempfile.mkdtemp(prefix="larder_pressure_")
        ssd2 = tempfile.mkdtemp(prefix="larder_pressure_")
        self.addCleanup(shutil.rmtree, ssd, ignore_errors=True)
        self.addCleanup(shutil.rmtree, ssd2, ignore_errors=True)
        body = {"prompt": STORIES_PROMPT, "max_tokens": 8, "temperature": 0}
        env = {**os.environ, "LARDER_MEMORY_LIMIT": "1G"}
        s = Server(STORIES, "--ssd-cache", ssd, "--min-free-memory", "2G", env=env).start()
        try:
            first = s.post("/v1/completions", body).json()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                st = s.request("GET", "/stats").json()["kv_store"]
                if st["ram"]["entries"] == 0 and st["ssd"]["entries"] >= 1:
                    break
                time.sleep(0.2)
            self.assertEqual(st["ram"]["entries"], 0, st)
            self.assertGreaterEqual(st["ram"]["demotions"], 1, st)
            self.assertGreaterEqual(st["ssd"]["entries"], 1, st)
            r = s.post("/v1/completions", body)
            self.assertIn("tier=ssd", r.headers.get("x-larder-cache", ""))
            self.assertEqual(r.json()["choices"][0]["text"], first["choices"][0]["text"])
            self.assertIn("memory pressure", s.log())
        finally:
            self.assertEqual(s.stop(), 0)
        # Above the mark nothing moves: the entry stays in RAM.
        s = Server(STORIES, "--ssd-cache", ssd2, "--min-free-memory", "512M", env=env).start()
        try:
            s.post("/v1/completions", body)
            time.sleep(1.5)
            self.assertEqual(s.request("GET", "/stats").json()["kv_store"]["ram"]["entries"], 1)
        finally:
            s.stop()


class IndexAndBoundsTest(unittest.TestCase):
    def test_index_and_prompt_bound(self):
        s = Server(STORIES, "--ctx", "256").start()
        try:
            for path in ("/", "/v1"):
                r = s.request("GET", path)
                self.assertEqual(r.status, 200, r)
                j = r.json()
                self.assertEqual(j["model"], "stories260K")
                paths = {(x["method"], x["path"]) for x in j["routes"]}
                self.assertIn(("POST", "/v1/chat/completions"), paths)
                self.assertIn(("GET", "/health"), paths)
            # 30 MB prompt: refused by its size before tokenizing (it took 15 s and 1.3 GB).
            big = "Once upon a time " * (30_000_000 // 17)
            rss0 = s.request("GET", "/stats").json()["server"]["resident_bytes"]
            t0 = time.monotonic()
            r = s.post("/v1/completions", {"prompt": big, "max_tokens": 1}, timeout=60)
            took = time.monotonic() - t0
            self.assertEqual(r.status, 400, r)
            self.assertEqual(r.json()["error"]["code"], "context_length_exceeded")
            # Tokenizing it whole took 15 s and +1.3 GB; refused by size it is the body's parse only.
            self.assertLess(took, 10, f"refused in {took:.1f} s")
            rss1 = s.request("GET", "/stats").json()["server"]["resident_bytes"]
            self.assertLess(rss1 - rss0, 400 << 20, f"resident memory grew {(rss1 - rss0) >> 20} MiB")
            r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": big}], "max_tokens": 1}, timeout=60)
            self.assertEqual(r.status, 400, r)
            self.assertEqual(s.request("GET", "/health").status, 200)
        finally:
            s.stop()


class DrainMessageTest(unittest.TestCase):
    def test_second_signal_sends_error_event(self):
        import signal
        s = Server(chat_model()["dir"], "--parallel", "1", env={"LARDER_SHUTDOWN_TIMEOUT_MS": "60000"}).start()
        sock = hold_slot(s)
        try:
            s.signal(signal.SIGINT)
            time.sleep(0.5)
            self.assertIn("LARDER_SHUTDOWN_TIMEOUT_MS=60000", s.log())
            s.signal(signal.SIGINT)
            buf = b""
            sock.settimeout(10)
            try:
                while True:
                    b = sock.recv(65536)
                    if not b:
                        break
                    buf += b
            except OSError:
                pass
            self.assertIn(b'"error"', buf[-2000:], "the stream ends with an error event, not a cut body")
            self.assertTrue(buf.endswith(b"0\r\n\r\n"), f"the chunked body is terminated: {buf[-200:]!r}")
            s.proc.wait(timeout=10)
        finally:
            sock.close()
            s.kill()


if __name__ == "__main__":
    unittest.main()
