"""The 3-replica deployment of docs/deployment.md (issue 46 item 2), end to end with real
processes: scripts/cluster.sh starts redis-server, three `larder serve` replicas sharing it as
the remote KV tier, and HAProxy routing by session key with consistent hashing and /health
checks. Checked through the router: a session's turns land on one replica (and reuse its RAM);
a prompt prefilled on replica A is served on replica B from Redis (cached_tokens = its chunks,
output identical); a replica killed mid-run → the request in flight is answered by another
replica, and the session's next turn goes elsewhere and resumes from the shared tier — which the
victim filled while it was kept busy by another client. Skips,
saying so, only when haproxy or redis-server is not installed (scripts/setup.sh installs both)."""
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import unittest

from server_harness import BIN, chat_model, tmp_root

HERE = os.path.dirname(os.path.abspath(__file__))
CLUSTER = os.path.join(HERE, "../../scripts/cluster.sh")
HAPROXY = shutil.which("haproxy")
REDIS = shutil.which("redis-server")
CHUNK = 16
HDR = re.compile(r"tier=(\w+); *reused=(\d+); *reason=(\S+)")
SYSTEM = ("You are the harbour master's clerk. Keep the ledger of ships, cargo, tolls and the state of "
          "the quays; answer briefly and cite the ledger line. ") * 3


def free_base(n):
    """A port p with p..p+n-1 all free on loopback."""
    for _ in range(200):
        base = random.randint(20000, 60000 - n)
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise AssertionError("no run of free ports")


def wait_for(cond, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Http:
    def __init__(self, port):
        self.port = port

    def request(self, method, path, body=None, headers=None, timeout=120):
        h = {"Content-Type": "application/json", **(headers or {})}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body), headers=h)
            r = conn.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            conn.close()


@unittest.skipUnless(HAPROXY and REDIS, "haproxy / redis-server not installed (apt-get install haproxy "
                                        "redis-server; scripts/setup.sh installs both)")
class ClusterTest(unittest.TestCase):
    def setUp(self):
        self.dir = os.path.join(tmp_root(), f"cluster-{self._testMethodName[5:12]}")  # a short unix socket path
        self.port = free_base(4)
        env = dict(os.environ, LARDER_BIN=BIN, LARDER_CLUSTER_DIR=self.dir)
        # --balance-factor 0: plain consistent hashing, so a key's replica is a function of the key
        # alone (bounded loads move keys with the momentary connection counts — by design, and not
        # what these tests check).
        p = subprocess.run(["bash", CLUSTER, "start", "--model", chat_model()["dir"], "--replicas", "3", "--port",
                            str(self.port), "--balance-factor", "0", "--", "--kv-remote-chunk-tokens", str(CHUNK),
                            "--kv-remote-timeout-ms", "500", "--parallel", "2"],
                           env=env, capture_output=True, timeout=300)
        self.env = env
        if p.returncode != 0:
            self.stop()
            self.fail(f"cluster.sh start failed ({p.returncode}):\n{p.stdout.decode()}\n{p.stderr.decode()}")
        with open(os.path.join(self.dir, "cluster.env")) as f:
            self.cfg = dict(line.strip().split("=", 1) for line in f if "=" in line and not line.startswith("#"))
        with open(os.path.join(self.dir, "pids")) as f:
            pids = [int(x) for x in f.read().split()]
        self.replica_pids = {f"replica{i + 1}": pids[1 + i] for i in range(3)}  # redis, replicas, haproxy
        self.router = Http(self.port)
        self.replicas = {f"replica{i + 1}": Http(self.port + 1 + i) for i in range(3)}

    def stop(self):
        subprocess.run(["bash", CLUSTER, "stop"], env=dict(os.environ, LARDER_BIN=BIN, LARDER_CLUSTER_DIR=self.dir),
                       capture_output=True, timeout=120)

    def tearDown(self):
        self.stop()
        self.assertFalse(os.path.exists(self.dir), "cluster.sh stop removes its directory")

    def logs(self):
        out = []
        for name in ("haproxy.log", "replica1.log", "replica2.log", "replica3.log"):
            try:
                with open(os.path.join(self.dir, name), "rb") as f:
                    out.append(f"--- {name}\n" + f.read().decode("utf-8", "replace")[-2500:])
            except OSError:
                pass
        return "\n".join(out)

    def chat(self, session, messages, n=6, timeout=120):
        st, h, data = self.router.request("POST", "/v1/chat/completions",
                                          {"messages": messages, "max_tokens": n, "temperature": 0},
                                          {"X-Session-Id": session}, timeout=timeout)
        self.assertEqual(st, 200, f"{data[:300]!r}\n{self.logs()}")
        j = json.loads(data)
        m = HDR.search(h.get("x-larder-cache", ""))
        self.assertTrue(m, h)
        return {"replica": h.get("x-larder-replica"), "text": j["choices"][0]["message"]["content"],
                "message": j["choices"][0]["message"], "prompt_tokens": j["usage"]["prompt_tokens"],
                "cached": j["usage"]["prompt_tokens_details"]["cached_tokens"], "tier": m.group(1)}

    def replica_of(self, session):
        """Where the router sends `session`, asked with a lookup (computes nothing)."""
        st, h, data = self.router.request("POST", "/v1/kv/lookup", {"prompt": "x"}, {"X-Session-Id": session})
        self.assertEqual(st, 200, data)
        return h["x-larder-replica"]

    def remote_chunks_written(self, name):
        st, _, data = self.replicas[name].request("GET", "/metrics")
        total = 0
        for line in data.decode().splitlines():
            if line.startswith("larder_kv_remote_chunks_total") and ('op="written"' in line or 'op="present"' in line):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def test_session_turns_stay_on_one_replica_and_reuse_its_ram(self):
        placed = {}
        for s in range(8):
            session = f"agent-{s}"
            msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Agent {s}: ship one?"}]
            seen = []
            for turn in range(3):
                r = self.chat(session, msgs)
                seen.append(r["replica"])
                if turn > 0:
                    self.assertGreater(r["cached"], r["prompt_tokens"] // 2,
                                       f"{session} turn {turn}: the replica holding its turns reuses them: {r}")
                msgs = msgs + [r["message"], {"role": "user", "content": f"And turn {turn + 2}?"}]
            self.assertEqual(len(set(seen)), 1, f"{session}'s turns moved: {seen}")
            placed[session] = seen[0]
        self.assertGreaterEqual(len(set(placed.values())), 2, f"8 sessions all on one replica: {placed}")

    def test_prefix_prefilled_on_one_replica_is_served_on_another_from_redis(self):
        by_replica = {}
        for i in range(64):
            by_replica.setdefault(self.replica_of(f"user-{i}"), f"user-{i}")
            if len(by_replica) == 3:
                break
        self.assertGreaterEqual(len(by_replica), 2, by_replica)
        (ra, sa), (rb, sb) = list(by_replica.items())[:2]
        msgs = [{"role": "system", "content": SYSTEM * 2}, {"role": "user", "content": "Which ship came first?"}]
        cold = self.chat(sa, msgs)
        self.assertEqual(cold["replica"], ra)
        self.assertEqual(cold["cached"], 0)
        L = cold["prompt_tokens"]
        wait_for(lambda: self.remote_chunks_written(ra) >= L // CHUNK, what=f"{ra}'s chunks in Redis\n{self.logs()}")
        # B's own lookup, asked directly, already sees them in the shared tier.
        st, _, data = self.replicas[rb].request("POST", "/v1/kv/lookup", {"messages": msgs})
        self.assertEqual(json.loads(data)["remote_tokens"], min(L // CHUNK * CHUNK, L - 1), data)
        warm = self.chat(sb, msgs)
        self.assertEqual(warm["replica"], rb)
        self.assertEqual(warm["tier"], "remote", warm)
        self.assertEqual(warm["cached"], min(L // CHUNK * CHUNK, L - 1), warm)
        self.assertEqual(warm["text"], cold["text"], "a prefix from Redis must not change greedy output")

    def test_killed_replica_its_session_moves_and_resumes_from_the_shared_tier(self):
        session = "agent-kill"
        victim = self.replica_of(session)
        # The victim is busy all along (another client's generations back to back on its other
        # slot, as under load): it must publish the session's turns to Redis anyway — a replica
        # that wrote only when idle left nothing for the session to resume from.
        stop, kept = threading.Event(), []

        def keeper():
            while not stop.is_set():
                try:
                    self.replicas[victim].request("POST", "/v1/completions",
                                                  {"prompt": f"Background {len(kept)}", "max_tokens": 32,
                                                   "temperature": 0}, timeout=120)
                    kept.append(1)
                except OSError:
                    return

        busy = threading.Thread(target=keeper)
        busy.start()
        try:
            msgs = [{"role": "system", "content": SYSTEM * 2}, {"role": "user", "content": "First question?"}]
            r1 = self.chat(session, msgs)
            self.assertEqual(r1["replica"], victim)
            msgs = msgs + [r1["message"], {"role": "user", "content": "Second question?"}]
            r2 = self.chat(session, msgs)
            self.assertEqual(r2["replica"], victim)
            self.assertGreater(r2["cached"], 0)
            other = next(n for n in self.replicas if n != victim)
            P2 = r2["prompt_tokens"]

            def published():  # another replica sees turn 2's prompt in the shared tier
                st, _, data = self.replicas[other].request("POST", "/v1/kv/lookup", {"messages": msgs})
                return st == 200 and json.loads(data)["remote_tokens"] >= min(P2 // CHUNK * CHUNK, P2 - 1)

            wait_for(published, what=f"{victim}'s turn 2 in Redis while it is busy\n{self.logs()}")
            self.assertTrue(busy.is_alive())
        finally:
            stop.set()
            busy.join(timeout=120)
        self.assertGreater(len(kept), 0)
        msgs = msgs + [r2["message"], {"role": "user", "content": "Third question?"}]
        # A long request of the session is running on the victim when it is killed (SIGKILL: no
        # drain, no flush). larder has answered its status line already, so the router cannot
        # resend it: the client sees the response cut short, at once — never a hang.
        result = {}

        def long_turn():
            try:
                st, h, data = self.router.request(
                    "POST", "/v1/chat/completions",
                    {"messages": msgs, "max_tokens": 1500, "temperature": 0, "ignore_eos": True},
                    {"X-Session-Id": session}, timeout=300)
                result.update(status=st, replica=h.get("x-larder-replica"), body=data[:300])
            except Exception as e:  # noqa: BLE001 - the cut response is the expected outcome
                result.update(error=repr(e))

        t = threading.Thread(target=long_turn)
        t.start()
        wait_for(lambda: json.loads(self.replicas[victim].request("GET", "/health")[2])["running"] >= 1,
                 what="the long turn running on the victim")
        os.kill(self.replica_pids[victim], signal.SIGKILL)
        t.join(30)
        self.assertFalse(t.is_alive(), "the request in flight on the killed replica must end, not hang")
        self.assertTrue("error" in result or result.get("replica") != victim, result)
        # The session's next request (the client's retry of that turn): another replica, which
        # resumes the session from the shared tier — its context up to turn 2 comes from Redis.
        r3 = self.chat(session, msgs)
        self.assertNotEqual(r3["replica"], victim, r3)
        self.assertEqual(r3["tier"], "remote", r3)
        self.assertGreaterEqual(r3["cached"], r2["prompt_tokens"] // CHUNK * CHUNK, r3)
        # Its next turn stays on the new replica (its key now maps there) and reuses its RAM.
        r4 = self.chat(session, msgs + [r3["message"], {"role": "user", "content": "Fourth?"}])
        self.assertEqual(r4["replica"], r3["replica"], "the session stays on its new replica")
        self.assertGreater(r4["cached"], r3["prompt_tokens"] // 2, r4)

        def marked_down():
            with open(os.path.join(self.dir, "haproxy.log"), errors="replace") as f:
                return re.search(rf"{victim} is DOWN", f.read()) is not None

        wait_for(marked_down, timeout=10, what=f"haproxy's health check to mark {victim} DOWN\n{self.logs()}")


if __name__ == "__main__":
    unittest.main()
