"""What a router asks a replica (issue 46 item 2), black-box over real HTTP: GET /health with the
load (running, queued, free slots; llama-server's status codes and fields kept) and
POST /v1/kv/lookup — how many leading tokens of a prompt (text, chat messages or token ids) the
replica holds in RAM, on SSD and in the shared Redis tier, without computing anything: no
prefill, no hit or miss counted, Redis's LRU clock of the chunks untouched. Bad bodies are 400s
naming the field. The Redis part starts a real redis-server (skipped, saying so, when absent)."""
import os
import socket
import threading
import time
import unittest

from server_harness import Server, chat_model, tmp_root
from kv_remote_test import CHUNK, REDIS, REDIS_CLI, TEXT, Redis, completion, wait_for, remote_metric


def lookup(srv, body, status=200):
    r = srv.post("/v1/kv/lookup", body)
    assert r.status == status, f"/v1/kv/lookup {body!r}: expected {status}, got {r}\n{srv.log()}"
    return r.json()


def chat(srv, messages, n=4, **extra):
    r = srv.post("/v1/chat/completions", {"messages": messages, "max_tokens": n, "temperature": 0, **extra})
    assert r.status == 200, f"{r} {srv.log()}"
    return r.json()


def held_request(port, body):
    """Sends a streaming completion and keeps the connection open (the request stays running or
    queued) until the returned socket is closed."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    data = body.encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


class HealthLoadTest(unittest.TestCase):
    def test_health_reports_running_queued_and_free_slots(self):
        srv = Server(chat_model()["dir"], "--parallel", "1", "--ctx", "8192").start()
        held = []
        try:
            h = srv.request("GET", "/health")
            self.assertEqual(h.status, 200)
            j = h.json()
            self.assertEqual(j["status"], "ok")  # llama-server's field and value, unchanged
            self.assertEqual((j["running"], j["queued"], j["free_slots"], j["parallel"]), (0, 0, 1, 1), j)
            self.assertEqual((j["slots_idle"], j["slots_processing"]), (1, 0), j)
            # Two long generations on one slot: one runs, one waits.
            body = '{"prompt": "Once upon a time", "max_tokens": 8000, "ignore_eos": true, "stream": true}'
            held = [held_request(srv.port, body), held_request(srv.port, body)]
            seen = []

            def busy():
                seen.append(srv.request("GET", "/health").json())
                return seen[-1]["running"] == 1 and seen[-1]["queued"] == 1

            wait_for(busy, timeout=30, what=f"/health to show 1 running, 1 queued (last: {seen[-1:]})")
            self.assertEqual(seen[-1]["free_slots"], 0, seen[-1])
            self.assertEqual(seen[-1]["slots_processing"], 1, seen[-1])
            for s in held:
                s.close()
            wait_for(lambda: srv.request("GET", "/health").json()["running"] == 0, timeout=60,
                     what="the cancelled generations to leave their slot")
            # Draining: 503 with the same fields (a router stops sending new work).
            srv.signal()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    d = srv.request("GET", "/health", timeout=2)
                except OSError:
                    break
                if d.status == 503:
                    self.assertEqual(d.json()["status"], "draining")
                    self.assertIn("running", d.json())
                    break
                time.sleep(0.01)
        finally:
            for s in held:
                s.close()
            srv.stop()
            srv.kill()


class KvLookupTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ssd = os.path.join(tmp_root(), "lookup-ssd")
        cls.srv = Server(chat_model()["dir"], "--ssd-cache", cls.ssd).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        cls.srv.kill()

    def test_forms_agree_with_what_generation_reuses(self):
        srv = self.srv
        msgs = [{"role": "system", "content": TEXT * 3}, {"role": "user", "content": "What of the salt?"}]
        before = lookup(srv, {"model": srv.model_id(), "messages": msgs})
        self.assertEqual(before["object"], "kv.lookup")
        self.assertEqual(before["form"], "messages")
        self.assertEqual(before["cached_tokens"], 0, before)
        self.assertIsNone(before["remote_tokens"], "no remote tier on this replica")
        self.assertEqual(before["ssd_tokens"], 0)
        first = chat(srv, msgs)
        self.assertEqual(before["prompt_tokens"], first["usage"]["prompt_tokens"],
                         "the lookup tokenizes messages exactly as the chat route does")
        # The next turn: the lookup says how much the chat request will reuse — and it does.
        turn2 = msgs + [first["choices"][0]["message"], {"role": "user", "content": "And the road?"}]
        got = lookup(srv, {"messages": turn2})
        self.assertGreater(got["ram_tokens"], before["prompt_tokens"] // 2, got)
        self.assertEqual(got["cached_tokens"], got["ram_tokens"])
        second = chat(srv, turn2)
        self.assertEqual(second["usage"]["prompt_tokens_details"]["cached_tokens"], got["ram_tokens"],
                         f"lookup {got} vs what the request reused {second['usage']}")
        # prompt text and token ids: the same prompt, the same answer.
        text = TEXT * 2 + "Tokens."
        ids = srv.post("/tokenize", {"content": text, "add_special": True}).json()["tokens"]
        r = srv.post("/v1/completions", {"prompt": text, "max_tokens": 2, "temperature": 0})
        self.assertEqual(r.status, 200)
        a = lookup(srv, {"prompt": text + " More."})
        b = lookup(srv, {"tokens": ids + [ids[-1]]})
        self.assertEqual(a["form"], "prompt")
        self.assertEqual(b["form"], "tokens")
        self.assertEqual(b["ram_tokens"], len(ids), b)
        self.assertGreaterEqual(a["ram_tokens"], len(ids) - 2, a)
        # cache_salt is a namespace, as on the generation routes.
        self.assertEqual(lookup(srv, {"tokens": ids + [5], "cache_salt": "other"})["cached_tokens"], 0)

    def test_lookup_computes_nothing_and_counts_nothing(self):
        srv = self.srv
        prompt = TEXT * 2 + "Counted?"
        srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 2, "temperature": 0})
        m0 = srv.metrics()
        for _ in range(5):
            lookup(srv, {"prompt": prompt + " again"})
            lookup(srv, {"prompt": "Never seen " + prompt})
        m1 = srv.metrics()
        for name in ("larder_kv_lookups_total", "larder_kv_reused_tokens_total", "larder_prompt_tokens_total",
                     "larder_kv_miss_total"):
            self.assertEqual(sum(v for _, v in m0.get(name, [])), sum(v for _, v in m1.get(name, [])),
                             f"{name} moved by lookups")

    def test_ssd_tier_is_reported_after_a_restart(self):
        srv = Server(chat_model()["dir"], "--ssd-cache", os.path.join(tmp_root(), "lookup-ssd2")).start()
        prompt = TEXT * 3 + "On disk."
        try:
            c = completion(srv, prompt, n=2)
            self.assertEqual(srv.post("/admin/kv/flush", {}).status, 200)
        finally:
            srv.stop()
        srv2 = Server(chat_model()["dir"], "--ssd-cache", os.path.join(tmp_root(), "lookup-ssd2")).start()
        try:
            wait_for(lambda: not lookup(srv2, {"prompt": prompt})["ssd_scanning"], what="the SSD scan")
            got = lookup(srv2, {"prompt": prompt + " And more."})
            self.assertEqual(got["ram_tokens"], 0, got)
            self.assertGreaterEqual(got["ssd_tokens"], c["prompt_tokens"] - 1, got)
            self.assertEqual(got["cached_tokens"], got["ssd_tokens"])
            # Still on SSD only: the lookup restored nothing into RAM.
            self.assertEqual(lookup(srv2, {"prompt": prompt + " And more."})["ram_tokens"], 0)
        finally:
            srv2.stop()
            srv2.kill()

    def test_bad_bodies_are_400s_naming_the_field(self):
        srv = self.srv
        cases = [
            ("[1, 2]", None, "JSON object"),
            ({}, "prompt", "one of prompt, messages, tokens"),
            ({"prompt": "a", "tokens": [1]}, "tokens", "only one of"),
            ({"tokens": []}, "tokens", "must not be empty"),
            ({"tokens": "12"}, "tokens", "array of token ids"),
            ({"tokens": [1, -3]}, "tokens", "ints in [0,"),
            ({"tokens": [1, 10 ** 9]}, "tokens", "ints in [0,"),
            ({"tokens": [1.5]}, "tokens", "ints in [0,"),
            ({"tokens": [1] * 100000}, "tokens", "more than the context"),
            ({"messages": "hi"}, "messages", "must be an array"),
            ({"messages": [{"role": "wizard", "content": "x"}]}, "messages", "role"),
            ({"prompt": ["a", "b"]}, "prompt", "not a list of prompts"),
            ({"prompt": 5}, "prompt", "prompt must be"),
            ({"prompt": "x", "n": 3}, "n", "n must be 1"),
            ({"prompt": "x", "model": 7}, "model", "must be a string"),
            ({"prompt": "x", "cache_salt": 1}, "cache_salt", "must be a string"),
        ]
        for body, param, text in cases:
            r = srv.post("/v1/kv/lookup", body, headers={"Content-Type": "application/json"})
            self.assertEqual(r.status, 400, f"{body!r}: {r}")
            err = r.json()["error"]
            self.assertIn(text, err["message"], f"{body!r}: {err}")
            if param:
                self.assertEqual(err.get("param"), param, f"{body!r}: {err}")
        r = srv.post("/v1/kv/lookup", {"prompt": "x", "model": "some-other-model"})
        self.assertEqual(r.status, 404, r)
        self.assertEqual(r.json()["error"]["code"], "model_not_found")
        r = srv.request("GET", "/v1/kv/lookup")
        self.assertEqual(r.status, 405, r)
        self.assertTrue(srv.alive())


@unittest.skipUnless(REDIS and REDIS_CLI, "redis-server / redis-cli not installed (apt-get install redis-server; "
                                          "scripts/setup.sh installs it)")
class KvLookupRemoteTest(unittest.TestCase):
    def test_remote_tokens_from_another_replica_without_touching_redis_lru(self):
        redis = Redis().start()
        servers = []
        try:
            def replica():
                s = Server(chat_model()["dir"], "--kv-remote", redis.url, "--kv-remote-chunk-tokens", CHUNK,
                           "--kv-remote-timeout-ms", 500).start()
                servers.append(s)
                return s

            a, b = replica(), replica()
            prompt = TEXT * 4
            self.assertEqual(lookup(b, {"prompt": prompt})["remote_tokens"], 0)
            cold = completion(a, prompt)
            L = cold["prompt_tokens"]
            wait_for(lambda: remote_metric(a, "larder_kv_remote_chunks_total", 'op="written"') >= L // CHUNK,
                     what="A's chunks in Redis")
            time.sleep(2.2)  # the chunks' idle time grows past 2 s
            reads0 = remote_metric(b, "larder_kv_remote_bytes_total", 'op="read"')
            got = lookup(b, {"prompt": prompt})
            self.assertEqual(got["ram_tokens"], 0)
            self.assertIsNone(got["ssd_tokens"])
            self.assertEqual(got["remote_tokens"], min(L // CHUNK * CHUNK, L - 1), got)
            self.assertEqual(got["cached_tokens"], got["remote_tokens"])
            self.assertIsNone(got["remote_error"])
            self.assertEqual(remote_metric(b, "larder_kv_remote_bytes_total", 'op="read"'), reads0,
                             "a lookup fetches no value")
            idle = [int(redis.cli("OBJECT", "IDLETIME", k).strip() or 0) for k in redis.keys()
                    if not k.startswith("larder:kv:1:i:")]
            self.assertTrue(idle and min(idle) >= 2, f"EXISTS must not touch the LRU clock: idle times {idle}")
            # The lookup's answer is what the request then reuses.
            served = completion(b, prompt)
            self.assertEqual(served["cached"], got["remote_tokens"], served)
            self.assertEqual(served["text"], cold["text"])
            # Redis gone: the lookup still answers, naming the failure, with the local tiers.
            redis.kill()
            down = lookup(b, {"prompt": prompt + " x"})
            self.assertIsNone(down["remote_tokens"])
            self.assertIn(down["remote_error"], ("remote_error", "remote_timeout", "remote_down"))
            self.assertGreater(down["ram_tokens"], 0)
        finally:
            for s in servers:
                s.stop()
                s.kill()
            redis.kill()


if __name__ == "__main__":
    unittest.main()
