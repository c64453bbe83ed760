#!/usr/bin/env python3
"""8 agents sharing a 2k-token system prompt over 3 replicas behind the router (issue 46,
docs/deployment.md): prefill tokens computed and TTFT, with and without the shared Redis tier.

    python3 bench/cluster_bench.py [--model DIR] [--agents 8] [--turns 3] [--replicas 3]
        [--lines 62] [--gen 16] [--threads 1] [--balance-factor 0] [--kill] [--busy] [--json-out FILE]

Each configuration starts its own cluster with scripts/cluster.sh (the baseline with
--no-remote), then runs the same schedule through the router (stdlib only: threads +
http.client, streaming SSE):
  1. agent 0's first turn alone — the system prompt is prefilled once, on agent 0's replica;
     the run waits until that replica's /v1/kv/lookup sees all of its whole chunks in Redis
     (the baseline waits 2 s);
  2. all agents concurrently, each its own X-Session-Id, `--turns` turns (agent 0 from its
     second), every turn a new user message on the growing conversation, greedy, --gen tokens.
With --kill (shared tier only), after every agent's second turn the replica holding most agents
is SIGKILLed; their third turns go to other replicas through the router.
With --busy, every replica also runs a background load for the whole run (one client per
replica, straight to its port, back-to-back short generations; not counted), so no replica is
ever idle — the normal state under load. Step 1 then waits at most --publish-wait seconds for
the prefix to reach Redis (a replica that publishes only when idle never does).

Reported per configuration: total prompt tokens, tokens reused (by tier, from x-larder-cache)
and computed (prompt - reused), sessions per replica, and client-side TTFT (request sent ->
first content chunk) p50/p99 over all requests. Token counts are exact; times depend on the
host's load.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")
HDR = re.compile(r"tier=(\w+); *reused=(\d+)")

LEDGER = ("Ledger line {i}: the ship {ship} moored at quay {quay} carrying {cargo}; toll {toll} silver, "
          "paid to clerk {clerk}. ")
SHIPS = ["Heron", "Marlin", "Osprey", "Gannet", "Petrel", "Tern", "Curlew", "Plover"]
CARGO = ["salt", "timber", "wool", "iron", "wine", "grain", "tin", "hides"]


def system_prompt(n_lines):
    head = ("You are the harbour master's clerk. Answer each question from the ledger below, briefly, "
            "citing the ledger line.\n")
    return head + "".join(LEDGER.format(i=i, ship=SHIPS[i % 8], quay=i % 13, cargo=CARGO[(i * 3) % 8],
                                        toll=10 + (i * 7) % 90, clerk=SHIPS[(i * 5) % 8]) for i in range(n_lines))


def post_json(port, path, body, headers=None, timeout=300):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def stream_chat(port, session, messages, gen):
    """One streaming chat turn through the router: TTFT, text, usage, tier, replica."""
    body = {"messages": messages, "max_tokens": gen, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", json.dumps(body),
              {"Content-Type": "application/json", "X-Session-Id": session})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{session}: {r.status} {r.read()[:300]!r}")
    m = HDR.search(r.getheader("x-larder-cache", ""))
    replica = r.getheader("x-larder-replica")
    ttft, text, usage = None, "", None
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        j = json.loads(line[6:])
        if j.get("usage"):
            usage = j["usage"]
        for ch in j.get("choices", []):
            piece = ch.get("delta", {}).get("content")
            if piece:
                if ttft is None:
                    ttft = time.monotonic() - t0
                text += piece
    c.close()
    if ttft is None:
        ttft = time.monotonic() - t0
    return {"session": session, "replica": replica, "ttft": ttft, "text": text,
            "prompt_tokens": usage["prompt_tokens"], "cached": usage["prompt_tokens_details"]["cached_tokens"],
            # The header is absent when the request queued past 250 ms; usage.larder.cache has it.
            "tier": ((usage.get("larder") or {}).get("cache") or {}).get("tier") or (m.group(1) if m else "?"),
            "reason": ((usage.get("larder") or {}).get("cache") or {}).get("reason", "?")}


def metric(port, name, label):
    st, data = get(port, "/metrics")
    return sum(float(l.rsplit(" ", 1)[1]) for l in data.decode().splitlines()
               if l.startswith(name) and label in l)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))]


def run(args, remote, kill):
    d = tempfile.mkdtemp(prefix="route-cluster-bench-")
    env = dict(os.environ, LARDER_CLUSTER_DIR=d)
    if args.bin:
        env["LARDER_BIN"] = args.bin
    cmd = ["bash", CLUSTER, "start", "--model", args.model, "--replicas", str(args.replicas), "--port", str(args.port)]
    if not remote:
        cmd.append("--no-remote")
    cmd += ["--balance-factor", str(args.balance_factor), "--", "--threads", str(args.threads), "--parallel",
            str(args.parallel)] + (["--kv-remote-timeout-ms", str(args.remote_timeout_ms)] if remote else [])
    subprocess.run(cmd, env=env, check=True, timeout=600)
    try:
        with open(os.path.join(d, "pids")) as f:
            pids = [int(x) for x in f.read().split()]
        replica_pids = {f"replica{i + 1}": pids[(1 if remote else 0) + i] for i in range(args.replicas)}
        replica_ports = {f"replica{i + 1}": args.port + 1 + i for i in range(args.replicas)}
        system = system_prompt(args.lines)
        convs = {a: [{"role": "system", "content": system}] for a in range(args.agents)}
        results, lock = [], threading.Lock()

        def turn(a, t):
            convs[a].append({"role": "user", "content": f"Agent {a}, question {t + 1}: which ship paid toll on line "
                                                         f"{(a * 11 + t * 5) % args.lines}?"})
            r = stream_chat(args.port, f"agent-{a}", convs[a], args.gen)
            convs[a].append({"role": "assistant", "content": r["text"]})
            r.update(agent=a, turn=t)
            with lock:
                results.append(r)
            return r

        stop_busy = threading.Event()
        busy_done = []

        def keep_busy(port, i):
            # Back-to-back short generations on one slot: the replica always has a running row.
            n = 0
            while not stop_busy.is_set():
                try:
                    post_json(port, "/v1/completions", {"prompt": f"Background {i}.{n % 5}: count the quays.",
                                                       "max_tokens": 24, "temperature": 0})
                except (OSError, http.client.HTTPException):
                    if stop_busy.is_set():
                        return
                    time.sleep(0.05)  # the killed replica: its keeper idles until the end
                n += 1
            busy_done.append(n)

        keepers = []
        if args.busy:
            keepers = [threading.Thread(target=keep_busy, args=(p, i)) for i, p in enumerate(replica_ports.values())]
            for k in keepers:
                k.start()
            time.sleep(1.0)
        t_start = time.monotonic()
        first = turn(0, 0)
        first_end = time.monotonic()
        # Wait for the prefix to reach Redis (before session 38 only after 1 s of idle time).
        published_after = None
        if remote:
            # Until the replica's own /v1/kv/lookup sees all of agent 0's whole chunks in Redis.
            port0 = replica_ports[first["replica"]]
            chunk = json.loads(get(port0, "/stats")[1])["kv_store"]["remote"]["chunk_tokens"]
            P = first["prompt_tokens"]
            want = min(P // chunk * chunk, P - 1)
            asked = convs[0][:-1]  # turn 1's prompt: the conversation before its answer
            deadline = time.monotonic() + (args.publish_wait if args.busy else 60)
            while time.monotonic() < deadline:
                st, data = post_json(port0, "/v1/kv/lookup", {"messages": asked})
                if st == 200 and json.loads(data)["remote_tokens"] >= want:
                    published_after = round(time.monotonic() - first_end, 2)
                    break
                time.sleep(0.1)
        else:
            time.sleep(2.0)
        killed = None

        def agent(a):
            for t in range(1 if a == 0 else 0, args.turns):
                if kill and t == 2:
                    barrier.wait()
                turn(a, t)

        kill_at = {}

        def do_kill():
            # Every agent has finished turn 2: kill the replica holding most sessions.
            counts = {}
            for r in results:
                if r["turn"] == 1:
                    counts[r["replica"]] = counts.get(r["replica"], 0) + 1
            victim = max(counts, key=counts.get)
            os.kill(replica_pids[victim], signal.SIGKILL)
            kill_at.update(victim=victim, sessions=counts[victim])

        barrier = threading.Barrier(args.agents, action=do_kill if kill else None)
        threads = [threading.Thread(target=agent, args=(a,)) for a in range(args.agents)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.monotonic() - t_start
        killed = kill_at.get("victim")
        stop_busy.set()
        for k in keepers:
            k.join(timeout=600)
    finally:
        stop_busy.set()
        subprocess.run(["bash", CLUSTER, "stop"], env=env, timeout=300)
    prompt = sum(r["prompt_tokens"] for r in results)
    reused = sum(r["cached"] for r in results)
    by_tier = {}
    for r in results:
        by_tier[r["tier"]] = by_tier.get(r["tier"], 0) + r["cached"]
    reasons = {}
    for r in results:
        key = re.sub(r":\d+$", "", r["reason"])
        reasons[key] = reasons.get(key, 0) + 1
    placement = {}
    for r in results:
        placement.setdefault(r["replica"], set()).add(r["agent"])
    ttfts = [r["ttft"] for r in results]
    out = {
        "config": ("shared Redis tier" if remote else "no remote tier") + (", replica killed after turn 2" if kill else ""),
        "requests": len(results), "prompt_tokens": prompt, "reused_tokens": reused, "computed_tokens": prompt - reused,
        "reused_by_tier": by_tier, "cache_reasons": reasons, "sessions_per_replica": {k: sorted(v) for k, v in sorted(placement.items())},
        "ttft_p50_s": round(pct(ttfts, 50), 3), "ttft_p99_s": round(pct(ttfts, 99), 3),
        "ttft_max_s": round(max(ttfts), 3), "wall_s": round(wall, 1),
        "first_prompt_tokens": results[0]["prompt_tokens"],
    }
    if args.busy:
        out["busy_background_requests"] = sum(busy_done)
        if remote:
            out["first_prefix_in_redis"] = (f"~{published_after} s after agent 0's first turn" if published_after is not None
                                            else f"not within {args.publish_wait} s")
    if kill:
        moved = [r for r in results if r["turn"] == 2 and any(x["agent"] == r["agent"] and x["turn"] == 1 and
                                                               x["replica"] == killed for x in results)]
        out["killed"] = {"replica": killed, "sessions": len(moved),
                         "their_next_turn": [{"agent": r["agent"], "to": r["replica"], "tier": r["tier"],
                                              "reused": r["cached"], "prompt": r["prompt_tokens"]} for r in moved]}
    return out, results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, ".cache/models/SmolLM2-135M-Instruct-hf"))
    ap.add_argument("--bin", default=None)
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--lines", type=int, default=62, help="ledger lines of the system prompt (62 ≈ 2k SmolLM2 tokens)")
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--port", type=int, default=18800)
    ap.add_argument("--balance-factor", type=int, default=0,
                    help="the router's hash-balance-factor (default 0: plain consistent hashing, so placement and "
                         "the token counts do not depend on timing; cluster.sh's default is 150)")
    ap.add_argument("--remote-timeout-ms", type=int, default=2000,
                    help="--kv-remote-timeout-ms of the replicas (larder's default 100 ms is short for a host this "
                         "loaded: a lookup that times out prefills locally)")
    ap.add_argument("--kill", action="store_true", help="also a shared-tier run with a replica killed after turn 2")
    ap.add_argument("--busy", action="store_true",
                    help="keep every replica busy for the whole run with a background load (not counted)")
    ap.add_argument("--publish-wait", type=float, default=10.0,
                    help="with --busy: seconds to wait for agent 0's prefix to reach Redis before the others start")
    ap.add_argument("--only", choices=["remote", "local"], default=None)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    print(f"host: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; model {args.model}", flush=True)
    runs = []
    configs = [(False, False), (True, False)] if args.only is None else [(args.only == "remote", False)]
    if args.kill:
        configs.append((True, True))
    for remote, kill in configs:
        out, _ = run(args, remote, kill)
        out["load_after"] = round(os.getloadavg()[0], 1)
        print(json.dumps(out), flush=True)
        runs.append(out)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
