"""The remote KV tier on Redis (issue 46 items 1 and 3), black-box: a real `redis-server`
started here (loopback unix socket in a temporary directory, no persistence) and two or more
`larder serve` replicas against it.

Evidence checked: replica B (another process, empty RAM, no SSD tier) serves replica A's long
prompt from Redis with output identical to a cold run; another model or namespace never hits;
a corrupted value is a miss with a reason; Redis killed mid-traffic → every request is still
answered (local prefill) and the replica reconnects when Redis returns; Redis stalled by
DEBUG SLEEP → timeouts, bounded latency, no stuck request; maxmemory + allkeys-lru evicting
under load → misses, never errors; a replica kept busy still publishes a new prompt within a
bounded time; redis:// over TCP with AUTH (URL or env) never shows the password. Skips (with the reason) when redis-server is not installed;
scripts/setup.sh installs it."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

from server_harness import Server, chat_model, free_port, metric_sum, tmp_root
import tiny_model
from server_harness import SHARED

REDIS = shutil.which("redis-server")
MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../.cache/models")
GEMMA = os.path.join(MODELS, "gemma-3-270m-q4_k_m.gguf")
REDIS_CLI = shutil.which("redis-cli")
CHUNK = 16
HDR = re.compile(r"tier=(\w+); *reused=(\d+); *reason=(\S+)")
TEXT = ("The committee met on a grey morning to review the harvest ledger, the state of the "
        "northern road, and the price of salt in the lower market. ")


class Redis:
    """One redis-server on a unix socket in a fresh temporary directory, no persistence."""

    def __init__(self, *extra, port=0, password=None):
        self.dir = tempfile.mkdtemp(prefix="redis_", dir=tmp_root())
        self.sock = os.path.join(self.dir, "redis.sock")
        self.extra = list(extra) + (["--requirepass", password] if password else [])
        self.port = port  # 0: the unix socket only
        self.password = password
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--unixsocket", self.sock, "--save", "",
             "--appendonly", "no", "--dir", self.dir,
             "--enable-debug-command", "yes", "--logfile", os.path.join(self.dir, "log"), *self.extra])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if os.path.exists(self.sock) and self.cli("PING").strip() == "PONG":
                return self
            time.sleep(0.02)
        raise AssertionError("redis-server did not start")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        try:
            os.unlink(self.sock)
        except OSError:
            pass

    def cli(self, *args, timeout=10):
        env = dict(os.environ, REDISCLI_AUTH=self.password) if self.password else None
        p = subprocess.run([REDIS_CLI, "-s", self.sock, "--raw", *map(str, args)], capture_output=True, timeout=timeout,
                           env=env)
        return p.stdout.decode("latin-1")

    def keys(self):
        return [k for k in self.cli("KEYS", "larder:kv:*").split("\n") if k]

    @property
    def url(self):
        return "redis+unix://" + self.sock


def completion(srv, prompt, n=8, **extra):
    r = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0, **extra})
    assert r.status == 200, f"{r} {srv.log()}"
    j = r.json()
    m = HDR.search(r.headers.get("x-larder-cache", ""))
    assert m, r.headers
    return {"text": j["choices"][0]["text"], "prompt_tokens": j["usage"]["prompt_tokens"],
            "cached": j["usage"]["prompt_tokens_details"]["cached_tokens"], "tier": m.group(1),
            "reused": int(m.group(2)), "reason": m.group(3)}


def remote_metric(srv, name, label=None):
    m = srv.metrics()
    return sum(v for lab, v in m.get(name, []) if label is None or label in lab)


def wait_for(cond, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@unittest.skipUnless(REDIS and REDIS_CLI, "redis-server / redis-cli not installed (apt-get install redis-server; "
                                          "scripts/setup.sh installs it)")
class RemoteTierTest(unittest.TestCase):
    def setUp(self):
        self.servers = []
        self.redis = []

    def tearDown(self):
        for s in self.servers:
            s.stop()
            s.kill()
        for r in self.redis:
            r.kill()

    def start_redis(self, *extra, **kw):
        r = Redis(*extra, **kw).start()
        self.redis.append(r)
        return r

    def replica(self, redis_url, *flags, model=None, timeout_ms=200, env=None):
        s = Server(model or chat_model()["dir"], "--kv-remote", redis_url, "--kv-remote-chunk-tokens", CHUNK,
                   "--kv-remote-timeout-ms", timeout_ms, *flags, env=env)
        self.servers.append(s)
        return s.start()

    def wait_written(self, srv, chunks):
        wait_for(lambda: remote_metric(srv, "larder_kv_remote_chunks_total", 'op="written"') +
                 remote_metric(srv, "larder_kv_remote_chunks_total", 'op="present"') >= chunks,
                 what=f"{chunks} chunks written to Redis:\n{srv.log()}")

    def test_replica_serves_anothers_prefix_identically_and_isolates_models_and_namespaces(self):
        redis = self.start_redis()
        a = self.replica(redis.url)
        prompt = TEXT * 4
        cold = completion(a, prompt)
        self.assertEqual(cold["cached"], 0)
        L = cold["prompt_tokens"]
        self.assertGreater(L, 4 * CHUNK)
        self.wait_written(a, L // CHUNK)  # the remote writer, right after the request

        b = self.replica(redis.url)
        got = completion(b, prompt)
        want = min(L // CHUNK * CHUNK, L - 1)  # whole chunks, never the last prompt token (§2.1)
        self.assertEqual(got["cached"], want, f"replica B reuses A's chunks: {got}\n{b.log()}")
        self.assertEqual(got["tier"], "remote", got)
        self.assertEqual(got["text"], cold["text"], "a remote hit must not change greedy output")
        self.assertGreaterEqual(remote_metric(b, "larder_kv_lookups_total", 'result="hit_remote"'), 1)
        self.assertGreater(remote_metric(b, "larder_kv_remote_bytes_total", 'op="read"'), 0)
        self.assertGreaterEqual(remote_metric(b, "larder_kv_remote_seconds_count", 'op="read"'), 1)
        self.assertEqual(remote_metric(b, "larder_kv_remote_connected"), 1)
        st = b.request("GET", "/stats").json()["kv_store"]["remote"]
        self.assertTrue(st["enabled"])
        self.assertEqual(st["chunk_tokens"], CHUNK)

        # Another namespace (cache_salt) on the same replica set: no hit from Redis.
        salted = completion(b, prompt, cache_salt="tenant-2")
        self.assertEqual(salted["cached"], 0, f"another namespace never hits: {salted}")
        self.assertEqual(salted["text"], cold["text"])

        # Another model (same tokenizer and shapes, other weights): keys differ, nothing hits.
        other_dir = os.path.join(tmp_root(), "tiny-chat-other")
        if not os.path.isdir(other_dir):
            tiny_model.make_chat_model(other_dir, SHARED, seed=7)
        c = self.replica(redis.url, model=other_dir)
        o = completion(c, prompt)
        self.assertEqual(o["cached"], 0, f"another model never hits: {o}")
        self.assertEqual(remote_metric(c, "larder_kv_remote_lookups_total", 'result="hit"'), 0)
        self.assertGreaterEqual(remote_metric(c, "larder_kv_remote_lookups_total", 'result="miss"'), 1)

    def test_busy_replica_publishes_while_it_decodes(self):
        # A replica under load is never idle: the SSD write-behind waits for an idle second, and
        # the remote tier used to wait with it, so a busy replica never shared its prompts. Here
        # A decodes without pause (a keeper sends back-to-back generations on another slot) while
        # a new prompt arrives; its chunks must reach Redis while A is still busy, and replica B
        # (another process) then serves that prompt from them with output equal to a cold run.
        redis = self.start_redis()
        b = self.replica(redis.url)
        a = self.replica(redis.url, "--parallel", "2")
        prompt = "Busy replica: " + TEXT * 4
        stop = threading.Event()
        kept, keep_errors = [], []

        def keeper():
            i = 0
            while not stop.is_set():
                try:
                    completion(a, f"Keep decoding {i % 7}.", n=48)  # shorter than a chunk to begin with
                    kept.append(time.monotonic())
                except Exception as e:  # noqa: BLE001 - asserted below
                    keep_errors.append(repr(e))
                    return
                i += 1

        t = threading.Thread(target=keeper)
        t.start()
        try:
            wait_for(lambda: len(kept) >= 2, timeout=60, what="the keeper's first generations")
            cold = completion(a, prompt)
            self.assertLess(cold["cached"], CHUNK, cold)  # (the keeper's prompts share its first token)
            L = cold["prompt_tokens"]
            want = min(L // CHUNK * CHUNK, L - 1)
            done_before = len(kept)

            def published():
                r = b.post("/v1/kv/lookup", {"prompt": prompt})
                assert r.status == 200, r
                return r.json()["remote_tokens"] == want

            # Generous for a loaded 2-core host; the write itself takes milliseconds.
            wait_for(published, timeout=20, what=f"A to publish {want} tokens while busy:\n{a.log()}")
            self.assertTrue(t.is_alive() and not keep_errors, keep_errors)
            wait_for(lambda: len(kept) > done_before + 1, timeout=60, what="the keeper still running after")
        finally:
            stop.set()
            t.join(timeout=120)
        self.assertEqual(keep_errors, [])
        self.assertGreaterEqual(remote_metric(a, "larder_kv_remote_queue_total", 'outcome="written"'), 1)
        self.assertEqual(remote_metric(a, "larder_kv_remote_queue_total", 'outcome="dropped"'), 0)

        got = completion(b, prompt)
        self.assertEqual(got["cached"], want, f"replica B reuses A's chunks: {got}\n{b.log()}")
        self.assertEqual(got["tier"], "remote", got)
        self.assertEqual(got["text"], cold["text"], "a remote hit must not change greedy output")
        # A cold run elsewhere (another namespace on B: no cache at all) agrees too.
        self.assertEqual(completion(b, prompt, cache_salt="cold-check")["text"], cold["text"])

    def test_auth_over_tcp_never_shows_the_password(self):
        # redis:// over TCP with AUTH: the password from the URL or from LARDER_KV_REMOTE_PASSWORD
        # (off the command line), never in the log, /stats or /metrics — not even a wrong one.
        pw, wrong = "Pw-" + os.urandom(6).hex(), "Wrong-" + os.urandom(6).hex()
        redis = self.start_redis(port=free_port(), password=pw)
        a = self.replica(f"redis://:{pw}@127.0.0.1:{redis.port}/0")
        prompt = "Authenticated: " + TEXT * 3
        cold = completion(a, prompt)
        self.wait_written(a, cold["prompt_tokens"] // CHUNK)
        b = self.replica(f"redis://127.0.0.1:{redis.port}", env={"LARDER_KV_REMOTE_PASSWORD": pw})
        got = completion(b, prompt)
        self.assertEqual(got["tier"], "remote", f"the env password authenticates: {got}\n{b.log()}")
        self.assertEqual(got["text"], cold["text"])
        c = self.replica(f"redis://:{wrong}@127.0.0.1:{redis.port}")
        refused = completion(c, prompt)
        self.assertEqual(refused["cached"], 0)
        self.assertEqual(refused["reason"], "remote_error", refused)
        self.assertEqual(refused["text"], cold["text"], "a refused AUTH is local prefill")
        for srv in (a, b, c):
            url = srv.request("GET", "/stats").json()["kv_store"]["remote"]["url"]
            self.assertIn(f"127.0.0.1:{redis.port}", url)
            seen = [url, srv.request("GET", "/metrics").body.decode("utf-8", "replace")]
            with open(srv.log_path, "rb") as f:
                seen.append(f.read().decode("utf-8", "replace"))
            for text in seen:
                self.assertNotIn(pw, text)
                self.assertNotIn(wrong, text)
        with open(c.log_path, "rb") as f:
            self.assertIn("refused", f.read().decode("utf-8", "replace"), "the log says why, without the password")

    def test_corrupted_value_is_a_miss_with_a_reason(self):
        redis = self.start_redis()
        a = self.replica(redis.url)
        prompt = TEXT * 3 + "Corrupt me."
        cold = completion(a, prompt)
        self.wait_written(a, cold["prompt_tokens"] // CHUNK)
        keys = redis.keys()
        self.assertGreater(len(keys), 0)
        for k in keys:  # one byte near the end of every value (inside the last KV tensor)
            n = int(redis.cli("STRLEN", k))
            old = redis.cli("GETRANGE", k, n - 5, n - 5)
            redis.cli("SETRANGE", k, n - 5, "Z" if old != "Z" else "Y")
        corrupted = {k: redis.cli("GET", k) for k in keys}
        b = self.replica(redis.url)
        got = completion(b, prompt)
        self.assertEqual(got["cached"], 0, got)
        self.assertEqual(got["reason"], "remote_corrupt", f"the miss names the tier and why: {got}")
        self.assertEqual(got["text"], cold["text"])
        self.assertGreaterEqual(remote_metric(b, "larder_kv_remote_errors_total", 'kind="corrupt"'), 1)
        self.assertGreaterEqual(remote_metric(b, "larder_kv_miss_total", 'reason="remote_corrupt"'), 1)
        self.assertTrue(b.alive())
        # The bad value was deleted; B's own prefill then wrote a good one under its key (B writes
        # at once, busy or idle), so it is no longer the corrupted bytes.
        self.wait_written(b, cold["prompt_tokens"] // CHUNK)
        now = {k: redis.cli("GET", k) for k in keys}
        self.assertLess(sum(1 for k in keys if now[k] == corrupted[k]), len(keys), "the bad value was deleted")

    def test_redis_killed_mid_traffic_then_back(self):
        redis = self.start_redis()
        a = self.replica(redis.url)
        b = self.replica(redis.url)
        prompts = [TEXT * 2 + f"Question {i}: what of the road?" for i in range(6)]
        expected = {p: completion(a, p)["text"] for p in prompts}
        completion(b, "Warm: " + TEXT * 2)  # B holds a live connection when Redis dies
        self.assertEqual(remote_metric(b, "larder_kv_remote_connected"), 1)
        results, errors = {}, []

        def ask(p):
            try:
                results[p] = completion(b, p)
            except Exception as e:  # noqa: BLE001 - recorded and asserted below
                errors.append(repr(e))

        threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
        for i, t in enumerate(threads):
            t.start()
            if i == 2:
                redis.kill()  # mid-traffic
        for t in threads:
            t.join(timeout=120)
        self.assertFalse(any(t.is_alive() for t in threads), "no request is stuck")
        self.assertEqual(errors, [])
        for p in prompts:
            self.assertEqual(results[p]["text"], expected[p], "answered by local prefill, same output")
        # Down: still answered, the miss says why.
        fresh = completion(b, "Away: " + TEXT * 2)
        self.assertIn(fresh["reason"], ("remote_error", "remote_down"), fresh)
        self.assertGreater(remote_metric(b, "larder_kv_remote_errors_total", 'kind="error"') +
                           remote_metric(b, "larder_kv_remote_errors_total", 'kind="down"'), 0)

        # Back (empty, same socket): A re-stores on its next turn, B reconnects and hits again.
        redis.start()
        p = "Back: " + TEXT * 3
        cold = completion(a, p)
        wait_for(lambda: len(redis.keys()) >= cold["prompt_tokens"] // CHUNK, what="A's chunks after the restart")
        time.sleep(2.1)  # past the longest reconnect backoff
        got = completion(b, p)
        self.assertEqual(got["tier"], "remote", f"B reconnected and hits: {got}\n{b.log()}")
        self.assertEqual(got["text"], cold["text"])
        self.assertGreaterEqual(remote_metric(b, "larder_kv_remote_reconnects_total"), 1)

    def test_stalled_redis_times_out_without_a_stuck_request(self):
        redis = self.start_redis()
        b = self.replica(redis.url, timeout_ms=100)
        completion(b, "warm up the connection " * 8)
        sleeper = threading.Thread(target=redis.cli, args=("DEBUG", "SLEEP", "3"), kwargs={"timeout": 20})
        sleeper.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        got = completion(b, "Stalled: " + TEXT * 3)
        took = time.monotonic() - t0
        sleeper.join()
        self.assertLess(took, 2.5, f"a stalled Redis costs its timeout, not the stall (took {took:.2f}s)")
        self.assertEqual(got["reason"], "remote_timeout", got)
        self.assertGreaterEqual(remote_metric(b, "larder_kv_remote_errors_total", 'kind="timeout"'), 1)
        # Requests during the backoff do not wait at all.
        t0 = time.monotonic()
        completion(b, "Right after: " + TEXT * 3)
        self.assertLess(time.monotonic() - t0, 2.5)
        self.assertTrue(b.alive())

    def test_maxmemory_lru_eviction_is_misses_not_errors(self):
        redis = self.start_redis("--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru")
        a = self.replica(redis.url)
        prompts = [f"Ledger {i}: " + TEXT * 3 for i in range(24)]
        cold = {}
        for i, p in enumerate(prompts):
            cold[p] = completion(a, p, n=2)
            # each written by the remote writer (right after its request), while /metrics is polled
            wait_for(lambda: remote_metric(a, "larder_kv_remote_writes_total", 'outcome="ok"') +
                     remote_metric(a, "larder_kv_remote_writes_total", 'outcome="failed"') >= i + 1,
                     what=f"write-behind of prompt {i}")
        wait_for(lambda: int(re.search(r"evicted_keys:(\d+)", redis.cli("INFO", "stats")).group(1)) > 0,
                 timeout=60, what="Redis evicting under maxmemory")
        wait_for(lambda: remote_metric(a, "larder_kv_remote_writes_total", 'outcome="ok"') >= len(prompts),
                 timeout=60, what="every write-behind done")
        self.assertEqual(remote_metric(a, "larder_kv_remote_writes_total", 'outcome="failed"'), 0,
                         "an evicting Redis accepts every write")
        b = self.replica(redis.url)
        reused = possible = 0
        for p in prompts:
            got = completion(b, p, n=2)
            self.assertEqual(got["text"], cold[p]["text"], "hit or miss, the same output")
            reused += got["cached"]
            possible += min(got["prompt_tokens"] // CHUNK * CHUNK, got["prompt_tokens"] - 1)
        self.assertLess(reused, possible, "evicted chunks are misses")
        self.assertGreater(reused, 0, "what is left still hits")
        self.assertEqual(remote_metric(b, "larder_kv_remote_errors_total", 'kind="error"'), 0)
        self.assertEqual(remote_metric(b, "larder_kv_remote_errors_total", 'kind="corrupt"'), 0)
        self.assertTrue(b.alive())

    def stopped(self, redis):
        """A hung Redis: the process is stopped (SIGSTOP), its sockets stay open and silent."""
        os.kill(redis.proc.pid, signal.SIGSTOP)
        self.addCleanup(lambda: redis.proc.poll() is None and os.kill(redis.proc.pid, signal.SIGCONT))

    def test_pending_remote_lookup_never_stalls_running_sequences(self):
        # The remote lookup used to run on the engine thread at admission: a Redis that did not
        # answer held every running sequence's decode for the whole --kv-remote-timeout-ms. Now
        # the request waits for its own lookup (on the lookup thread) while the others decode.
        redis = self.start_redis()
        b = self.replica(redis.url, "--parallel", "2", timeout_ms=3000)
        keep = "Keep decoding while Redis sleeps."
        completion(b, keep, n=24)  # later runs are RAM hits of len - 1: no remote lookup for them
        stop = threading.Event()
        kept, keep_errors = [], []

        def keeper():
            while not stop.is_set():
                try:
                    r = b.post("/v1/completions", {"prompt": keep, "max_tokens": 24, "temperature": 0}, timeout=60)
                    assert r.status == 200, r
                    kept.append(time.monotonic())
                except Exception as e:  # noqa: BLE001 - asserted below
                    keep_errors.append(repr(e))
                    return

        t = threading.Thread(target=keeper)
        t.start()
        try:
            wait_for(lambda: len(kept) >= 2, timeout=60, what="the keeper's first generations")
            self.stopped(redis)
            t0 = time.monotonic()
            r = b.post("/v1/completions", {"prompt": "Pending: " + TEXT * 3, "max_tokens": 4, "temperature": 0},
                       timeout=60)
            t1 = time.monotonic()
            os.kill(redis.proc.pid, signal.SIGCONT)
        finally:
            stop.set()
            t.join(timeout=120)
        self.assertEqual(keep_errors, [])
        self.assertEqual(r.status, 200, r)
        usage = r.json()["usage"]
        self.assertEqual(usage["larder"]["cache"]["reason"], "remote_timeout", usage)
        self.assertGreaterEqual(t1 - t0, 2.5, "the request waited for its lookup's timeout")
        during = [k for k in kept if t0 + 0.5 < k < t1 - 0.5]
        self.assertGreaterEqual(len(during), 3, f"the other slot kept generating while the lookup was pending: "
                                                f"{len(during)} generations in {t1 - t0 - 1:.1f}s\n{b.log()}")
        self.assertTrue(b.alive())

    def test_client_leaving_during_a_pending_lookup_frees_its_slot(self):
        redis = self.start_redis()
        b = self.replica(redis.url, "--parallel", "1", timeout_ms=4000)
        completion(b, "warm up the connection " * 8)
        before = remote_metric(b, "larder_cancelled_total", 'reason="client_disconnect"')
        self.stopped(redis)
        body = json.dumps({"prompt": "Abandoned: " + TEXT * 3, "max_tokens": 4, "temperature": 0}).encode()
        s = socket.create_connection(("127.0.0.1", b.port), timeout=10)
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{b.port}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(0.6)  # admitted, its lookup hangs on the stopped Redis
        self.assertEqual(b.request("GET", "/health").json()["running"], 1)
        left = time.monotonic()
        s.close()
        wait_for(lambda: remote_metric(b, "larder_cancelled_total", 'reason="client_disconnect"') > before,
                 timeout=20, what="the pending request cancelled")
        took = time.monotonic() - left
        health = b.request("GET", "/health").json()
        os.kill(redis.proc.pid, signal.SIGCONT)
        self.assertLess(took, 2.5, f"cancelled while its lookup (4 s timeout) was still pending: {took:.2f}s")
        self.assertEqual((health["running"], health["free_slots"]), (0, 1), health)
        # The slot serves the next request; once Redis answers again, with the same output as ever.
        time.sleep(2.1)  # past the reconnect backoff
        p = "After: " + TEXT * 3
        self.assertEqual(completion(b, p)["text"], completion(b, p, cache_salt="cold")["text"])

    def test_sigterm_while_a_lookup_is_pending_drains(self):
        redis = self.start_redis()
        b = self.replica(redis.url, timeout_ms=2000)
        p = "Draining: " + TEXT * 3
        completion(b, "warm up the connection " * 8)
        self.stopped(redis)
        got = {}

        def ask():
            r = b.post("/v1/completions", {"prompt": p, "max_tokens": 6, "temperature": 0}, timeout=60)
            got["status"], got["body"] = r.status, r.json()

        t = threading.Thread(target=ask)
        t.start()
        time.sleep(0.5)  # pending on the stopped Redis
        b.signal(signal.SIGTERM)
        t.join(timeout=60)
        self.assertFalse(t.is_alive(), "the pending request is answered during the drain")
        os.kill(redis.proc.pid, signal.SIGCONT)
        self.assertEqual(got["status"], 200, got)
        self.assertEqual(got["body"]["usage"]["larder"]["cache"]["reason"], "remote_timeout", got)
        self.assertEqual(b.proc.wait(timeout=60), 0, b.log())
        c = self.replica(redis.url)
        self.assertEqual(completion(c, p, n=6, cache_salt="cold")["text"], got["body"]["choices"][0]["text"])

    @unittest.skipUnless(os.path.exists(GEMMA), f"{GEMMA} is absent: run scripts/fetch_models.sh (or set LARDER_MODELS_DIR)")
    def test_sliding_window_model_shares_exact_boundary_checkpoints(self):
        # gemma-3-270m keeps a 512-token ring on most layers: its entries are exact-boundary
        # checkpoints, stored whole; replica B reuses A's prompt checkpoint (len - 1).
        redis = self.start_redis()
        flags = ("--ctx", "2048", "--parallel", "1")
        a = Server(GEMMA, "--kv-remote", redis.url, "--kv-remote-timeout-ms", 500, *flags, startup_timeout=180)
        self.servers.append(a)
        a.start()
        # Past the window, so the ring has wrapped: the full entry is untrimmable and the prompt
        # checkpoint (len - 1) is kept beside it and written too. (Before the ring wraps, the
        # trimmable full entry supersedes the checkpoint in RAM and only it reaches Redis: it then
        # serves prompts that extend it whole, e.g. the next turn.)
        msgs = [{"role": "system", "content": TEXT * 20}, {"role": "user", "content": "Summarise the ledger in a line."}]

        def turn(srv):
            r = srv.openai(timeout=600).chat.completions.create(model="gemma", messages=msgs, max_tokens=12,
                                                               temperature=0)
            u = r.usage.model_dump()
            return {"content": r.choices[0].message.content, "prompt": u["prompt_tokens"],
                    "cached": u["prompt_tokens_details"]["cached_tokens"], "tier": u["larder"]["cache"]["tier"],
                    "reason": u["larder"]["cache"]["reason"]}

        cold = turn(a)
        self.assertGreater(cold["prompt"], 560, "the prompt passes the 512-token window")
        wait_for(lambda: remote_metric(a, "larder_kv_remote_writes_total", 'outcome="ok"') >= 2, timeout=60,
                 what=f"A's checkpoints written:\n{a.log()}")
        self.assertEqual(remote_metric(a, "larder_kv_remote_writes_total", 'outcome="unsupported"'), 0)
        b = Server(GEMMA, "--kv-remote", redis.url, "--kv-remote-timeout-ms", 500, *flags, startup_timeout=180)
        self.servers.append(b)
        b.start()
        got = turn(b)
        self.assertEqual(got["cached"], got["prompt"] - 1, f"B reuses A's prompt checkpoint: {got}\n{b.log()}")
        self.assertEqual(got["tier"], "remote", got)
        self.assertEqual(got["content"], cold["content"], "a remote checkpoint hit must not change greedy output")


if __name__ == "__main__":
    unittest.main()
