"""Memory admission of `larder serve` (issue 16 item 3): with --kv-budget, a request whose KV
(prompt + max_tokens tokens x the model's bytes per token) does not fit beside the running
requests' is held first in line until they finish; past --admit-wait it is refused 503 with
Retry-After and a message saying what fits; one larger than the whole budget is refused at once;
a burst beyond the queue gets 429; the server stays up. On the real SmolLM2 Q4_1 GGUF (skips when
absent: scripts/fetch_models.sh), so a long answer takes seconds, with EOS banned (logit_bias) so
every answer is exactly max_tokens long."""
import concurrent.futures as cf
import json
import os
import socket
import threading
import time
import unittest

from server_harness import HERE, Server, metric_sum

MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(HERE, "../../.cache/models")
SMOL = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
PROMPT = "Once upon a time"
NO_EOS = {"0": -100, "1": -100, "2": -100}  # <|endoftext|>, <|im_start|>, <|im_end|>


class AdmissionTest(unittest.TestCase):
    def start(self, admit_wait):
        if not os.path.exists(SMOL):
            self.skipTest(f"{SMOL} is absent: run scripts/fetch_models.sh (or set LARDER_MODELS_DIR)")
        s = Server(SMOL, "--ctx", "2048", "--parallel", "4", "--queue-max", "2", "--prompt-cache", "0",
                   "--kv-budget", "32M", "--admit-wait", str(admit_wait)).start()
        self.addCleanup(s.kill)
        st = s.request("GET", "/stats").json()["server"]
        self.assertEqual(st["kv_budget_bytes"], 32 << 20)
        # SmolLM2-135M: 30 layers x (K, V) x 3 KV heads x 64 x 2 bytes (f16, serve's default KV dtype):
        # --kv-budget counts bytes of the stored dtype (32M = the 1456 tokens 64M held in f32)
        self.assertEqual(st["kv_bytes_per_token"], 30 * 2 * 3 * 64 * 2)
        cap = st["kv_budget_bytes"] // st["kv_bytes_per_token"]
        return s, cap

    def complete(self, s, max_tokens, prompt=PROMPT, timeout=300):
        t0 = time.monotonic()
        r = s.post("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                       "logit_bias": NO_EOS}, timeout=timeout)
        return r, time.monotonic() - t0

    def plan(self, s, cap, seconds):
        """(long_tokens, big_prompt): a request of long_tokens runs about `seconds` on this machine
        (measured), and big_prompt (prompt + 4 tokens) cannot fit beside it, though it fits alone."""
        r, _ = self.complete(s, 16)
        tps = r.json()["usage"]["larder"]["timings"]["decode_tps"]
        long_tokens = max(32, min(int(tps * seconds), cap - 400))
        free = cap - (long_tokens + 4)  # tokens left beside the long request (its prompt is 4 tokens)
        words = s.post("/tokenize", {"content": " hello" * 10}).json()["tokens"]
        self.assertEqual(len(words), 10)  # one token per word
        big_prompt = " hello" * (free + 20)
        self.assertLess(free + 30, cap)
        return long_tokens, big_prompt

    def start_long(self, s, max_tokens):
        """A long request on a thread; returns (thread, result holder) once it is running."""
        out = {}
        t = threading.Thread(target=lambda: out.update(zip(("r", "secs"), self.complete(s, max_tokens))))
        t.start()
        deadline = time.monotonic() + 30
        while s.request("GET", "/stats").json()["server"]["active"] < 1:
            self.assertLess(time.monotonic(), deadline, "the long request never started")
            time.sleep(0.02)
        return t, out

    def test_larger_than_budget_is_refused_at_once(self):
        s, cap = self.start(admit_wait=30)
        r, secs = self.complete(s, cap + 10)
        self.assertEqual(r.status, 503, r)
        self.assertLess(secs, 5)
        self.assertIn("retry-after", r.headers)
        msg = r.json()["error"]["message"]
        self.assertIn(f"at most {cap} tokens", msg)
        self.assertIn("--kv-budget", msg)
        # Ollama's route answers in its own shape
        r = s.post("/api/generate", {"model": s.model_id(), "prompt": PROMPT, "raw": True, "stream": False,
                                     "options": {"num_predict": cap + 10}})
        self.assertEqual(r.status, 503, r)
        self.assertIn("at most", r.json()["error"])
        r, _ = self.complete(s, 8)
        self.assertEqual(r.status, 200)

    def test_held_then_refused_and_burst(self):
        s, cap = self.start(admit_wait=1.5)
        long_tokens, big = self.plan(s, cap, seconds=10)
        t, out = self.start_long(s, long_tokens)
        # fits beside the long one: admitted at once, done long before it
        r, secs = self.complete(s, 8)
        self.assertEqual(r.status, 200, r)
        self.assertTrue(t.is_alive(), "the long request should still run (make it longer)")
        # does not fit: held for --admit-wait, then 503 with Retry-After and what fits
        r, secs = self.complete(s, 4, prompt=big)
        self.assertTrue(t.is_alive(), "the long request ended before the refusal (make it longer)")
        self.assertEqual(r.status, 503, r)
        self.assertGreaterEqual(secs, 1.4)
        self.assertGreaterEqual(int(r.headers["retry-after"]), 1)
        msg = r.json()["error"]["message"]
        self.assertIn("not admitted within 1.5 s", msg)
        self.assertIn("what fits now is", msg)
        # a burst: the queue (--queue-max 2 beyond the free slots) fills, the rest is 429; the
        # queued ones time out 503; nothing else, and the server stays up
        with cf.ThreadPoolExecutor(8) as ex:
            results = list(ex.map(lambda _: self.complete(s, 4, prompt=big)[0], range(8)))
        statuses = sorted(x.status for x in results)
        self.assertTrue(set(statuses) <= {429, 503}, statuses)
        self.assertIn(429, statuses)
        self.assertIn(503, statuses)
        self.assertTrue(all("retry-after" in x.headers for x in results))
        self.assertEqual(s.request("GET", "/health").status, 200)
        t.join(300)
        self.assertEqual(out["r"].status, 200, out["r"])
        self.assertEqual(out["r"].json()["usage"]["completion_tokens"], long_tokens)
        self.assertEqual(s.request("GET", "/stats").json()["server"]["kv_reserved_bytes"], 0)

    def test_held_then_admitted(self):
        s, cap = self.start(admit_wait=120)
        long_tokens, big = self.plan(s, cap, seconds=3)
        t, out = self.start_long(s, long_tokens)
        r, secs = self.complete(s, 4, prompt=big)  # waits for the long one's memory, then runs
        t.join(300)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(out["r"].status, 200)
        self.assertEqual(r.json()["usage"]["completion_tokens"], 4)
        # it was admitted only when the long request had finished and freed its KV
        queue_ms = r.json()["usage"]["larder"]["timings"]["queue_ms"]
        self.assertGreater(queue_ms, 500)
        self.assertGreater(secs, out["secs"] * 0.5)

    def test_held_client_that_leaves_gives_its_place_back_at_once(self):
        """Two requests held for memory behind a long one; their clients leave. Their queue places
        must be free at once (issue 47 item 5), not when the long request's memory frees."""
        s, cap = self.start(admit_wait=120)
        long_tokens, big = self.plan(s, cap, seconds=8)
        t, out = self.start_long(s, long_tokens)
        body = json.dumps({"prompt": big, "max_tokens": 4, "temperature": 0, "logit_bias": NO_EOS}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        socks = []
        for _ in range(2):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            c.sendall(head + body)
            socks.append(c)
        deadline = time.monotonic() + 10
        while metric_sum(s.metrics(), "larder_queue_depth") < 2:
            self.assertLess(time.monotonic(), deadline, "the big requests were never queued")
            time.sleep(0.02)
        for c in socks:
            c.close()
        t0 = time.monotonic()
        while metric_sum(s.metrics(), "larder_queue_depth") > 0:
            self.assertLess(time.monotonic() - t0, 2.0, "held requests whose clients left still wait")
            time.sleep(0.02)
        self.assertEqual(s.request("GET", "/stats").json()["server"]["active"], 1, "the long request still runs")
        t.join(300)
        self.assertEqual(out["r"].status, 200)
        # Both were dropped as disconnected, neither admitted for nobody.
        cancelled = [v for labels, v in s.metrics().get("larder_cancelled_total", [])
                     if 'reason="client_disconnect"' in (labels or "")]
        self.assertEqual(sum(cancelled), 2)


if __name__ == "__main__":
    unittest.main()
