#!/usr/bin/env python3
"""Load generator and server benchmarks for `larder serve` (issue 5, "Benchmarks").

    python3 bench/serve_bench.py --model MODEL [--bin build/bin/larder] [--levels 1,4,16]
        [--prompt-tokens 48] [--gen-tokens 32] [--rounds 1] [--overhead-pairs 3] [--overhead-gen 64]
        [--starts 7] [--threads T] [--route auto|completions|chat] [--shared-prompts] [--json-out FILE]

Measures, against a live server on loopback (stdlib only: threads + http.client, streaming SSE):

1. Concurrency levels (default 1, 4, 16 clients; the server runs with --parallel equal to the
   client count). Every client sends `--rounds` streaming requests with a prompt of its own
   (distinct first words, so the KV store cannot share anything beyond BOS; --shared-prompts
   sends the same prompt to everyone instead), greedy, EOS suppressed by logit_bias so every
   request decodes exactly --gen-tokens tokens. Reported: aggregate decode tok/s in the window
   where every client is decoding (tokens received in [max first-token time, min last-token
   time]), end-to-end output tok/s (all completion tokens / wall time), p50/p99 TTFT (client side:
   request sent -> first content chunk) and p50/p99 inter-token latency (gaps between content
   chunks, first token excluded).
2. Server overhead at one client: `larder bench -p 8 -n N -r 1 --no-roofline --json` (direct
   engine decode, tg from an empty cache) alternated with one streaming request of N tokens on an
   idle --parallel 1 server, `--overhead-pairs` times; overhead = 1 - server decode / bench decode
   (medians). Server decode is measured client-side, (tokens - 1) / (last - first chunk), and also
   taken from usage.larder.timings.decode_tps.
3. Process start -> first /health 200 (median of --starts starts; the page cache is warm because
   the model was just used). /health is polled every 2 ms on fresh connections.

Everything printed is also written as JSON (--json-out). Machine facts (CPU, cores, load before
and after, commit, binary) are printed first.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# ---------------------------------------------------------------------------------------------
# helpers shared with kv_bench.py


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return f"<{e}>"


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu_pressure():
    try:
        with open("/proc/pressure/cpu") as f:
            return f.readline().strip()
    except OSError:
        return "n/a"


def machine_facts(binary, model):
    cpu = sh("lscpu | sed -n 's/^Model name:[ \\t]*//p' | head -1") or sh("grep -m1 'model name' /proc/cpuinfo")
    fam = sh("lscpu | sed -n 's/^CPU family:[ \\t]*//p' | head -1")
    mod = sh("lscpu | sed -n 's/^Model:[ \\t]*//p' | head -1")
    st = os.stat(binary)
    with open(binary, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "cpu": f"{cpu} (family {fam} model {mod})",
        "cores": os.cpu_count(),
        "mem_total_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "uptime": sh("uptime"),
        "loadavg": loadavg(),
        "cpu_pressure": cpu_pressure(),
        "commit": sh(f"git -C {REPO} rev-parse --short HEAD"),
        "binary": binary,
        "binary_mtime_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(st.st_mtime)),
        "binary_sha256": digest,
        "model": model,
        "model_bytes": model_bytes(model),
        "command": " ".join([sys.executable] + sys.argv),
    }


def model_bytes(model):
    if os.path.isdir(model):
        return sum(os.path.getsize(os.path.join(model, f)) for f in os.listdir(model)
                   if f.endswith((".safetensors", ".gguf")))
    return os.path.getsize(model)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values, q):
    """Nearest-rank-with-interpolation percentile (q in 0..100)."""
    if not values:
        return float("nan")
    v = sorted(values)
    if len(v) == 1:
        return v[0]
    k = (len(v) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def proc_rss(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def proc_rss_detail(pid):
    """(RssAnon, RssFile, RssShmem) in bytes."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                for k in ("RssAnon", "RssFile", "RssShmem", "VmRSS", "VmHWM"):
                    if line.startswith(k + ":"):
                        out[k] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def proc_cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None


class Server:
    """One `larder serve` subprocess (nice +5). start() returns seconds from spawn to /health 200."""

    def __init__(self, binary, model, flags, log_dir, nice=5, name="serve"):
        self.binary, self.model, self.flags = binary, model, [str(f) for f in flags]
        self.log_dir, self.nice, self.name = log_dir, nice, name
        self.proc = None
        self.port = None
        self.startup_s = None

    def start(self, timeout=180):
        self.port = free_port()
        self.log_path = os.path.join(self.log_dir, f"{self.name}-{self.port}.log")
        cmd = ["nice", "-n", str(self.nice), self.binary, "serve", self.model, "--host", "127.0.0.1",
               "--port", str(self.port), *self.flags]
        self.cmd = cmd
        log = open(self.log_path, "wb")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = t0 + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/health")
                r = c.getresponse()
                r.read()
                c.close()
                if r.status == 200:
                    self.startup_s = time.perf_counter() - t0
                    return self.startup_s
            except OSError:
                pass
            time.sleep(0.002)
        self.kill()
        raise RuntimeError(f"/health not 200 within {timeout}s: {self.log_tail()}")

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def log_tail(self, n=4000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")[-n:]
        except OSError:
            return ""

    def get_json(self, path, timeout=30):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return json.loads(r.read())
        finally:
            c.close()

    def post_json(self, path, body, timeout=600):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            c.close()

    def tokenize(self, text, add_special=True):
        st, _, data = self.post_json("/tokenize", {"content": text, "add_special": add_special})
        assert st == 200, data
        return json.loads(data)["tokens"]

    def stop(self, timeout=180):
        """SIGTERM (drain + KV flush); returns (exit code, seconds to exit)."""
        if self.proc is None or self.proc.poll() is not None:
            return (self.proc.returncode if self.proc else None), 0.0
        t0 = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = None
        return rc, time.perf_counter() - t0

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


class RssSampler(threading.Thread):
    """Samples VmRSS (and RssAnon/RssFile) of a pid every `period` seconds."""

    def __init__(self, pid, period=0.25):
        super().__init__(daemon=True)
        self.pid, self.period = pid, period
        self.samples = []  # (t, detail dict)
        self._halt = threading.Event()

    def run(self):
        while not self._halt.is_set():
            d = proc_rss_detail(self.pid)
            if d:
                self.samples.append((time.perf_counter(), d))
            self._halt.wait(self.period)

    def stop(self):
        self._halt.set()
        self.join(timeout=5)

    def peak(self, key="VmRSS"):
        return max((d.get(key, 0) for _, d in self.samples), default=0)


def stream_request(port, path, body, timeout=1800):
    """POSTs a streaming request and times every content chunk. Returns a dict."""
    body = dict(body, stream=True)
    payload = json.dumps(body)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    out = {"times": [], "text": [], "usage": None, "error": None}
    t0 = time.perf_counter()
    out["t_send"] = t0
    try:
        c.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        out["status"] = r.status
        out["cache_header"] = r.getheader("x-larder-cache", "")
        if r.status != 200:
            out["error"] = r.read().decode("utf-8", "replace")[:500]
            return out
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            now = time.perf_counter()
            obj = json.loads(data)
            if "error" in obj:
                out["error"] = obj["error"]
                continue
            if obj.get("usage"):
                out["usage"] = obj["usage"]
            for ch in obj.get("choices") or []:
                piece = ch.get("text")
                if piece is None:
                    piece = (ch.get("delta") or {}).get("content")
                if piece:
                    out["times"].append(now)
                    out["text"].append(piece)
    except Exception as e:  # noqa: BLE001
        out["error"] = repr(e)
    finally:
        out["t_end"] = time.perf_counter()
        c.close()
    out["text"] = "".join(out["text"])
    out["ttft_s"] = out["times"][0] - t0 if out["times"] else None
    return out


WORDS = ("time year people way day man thing woman life child world school state family student group "
         "country problem hand part place case week company system program question work government number "
         "night point home water room mother area money story fact month lot right study book eye job word "
         "business issue side kind head house service friend father power hour game line end member law car "
         "city community name president team minute idea kid body information back parent face others level "
         "office door health person art war history party result change morning reason research girl guy "
         "moment air teacher force education river mountain garden winter summer lamp harbor storm letter "
         "ship bridge market village road forest island engine signal window bread apple stone silver").split()


def words_text(seed, n_words):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def text_of_tokens(server, seed, n_tokens, prefix=""):
    """Plain text whose tokenization (with BOS) is close to n_tokens (±2), deterministic in seed."""
    n_words = max(1, int(n_tokens / 1.25))
    for _ in range(6):
        t = prefix + words_text(seed, n_words)
        k = len(server.tokenize(t))
        if abs(k - n_tokens) <= 2:
            return t
        n_words = max(1, int(n_words * n_tokens / max(k, 1)))
    return t


def detect_route(server, route):
    """'chat' when asked or when the model renders a chat template, else 'completions'."""
    if route != "auto":
        return route
    st, _, data = server.post_json("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                             "max_tokens": 1, "temperature": 0})
    return "chat" if st == 200 else "completions"


def gen_body(route, prompt, max_tokens, eos_ids=(2,)):
    body = {"max_tokens": max_tokens, "temperature": 0, "logit_bias": {str(e): -100 for e in eos_ids}}
    if route == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def route_path(route):
    return "/v1/chat/completions" if route == "chat" else "/v1/completions"


def fmt(x, nd=1):
    return "n/a" if x is None or x != x else f"{x:.{nd}f}"


# ---------------------------------------------------------------------------------------------
# benchmarks


def run_level(args, clients, log_dir):
    srv = Server(args.bin, args.model, ["--parallel", clients, "--ctx", args.ctx, *args.extra_flags()], log_dir,
                 name=f"level{clients}")
    srv.start()
    try:
        route = detect_route(srv, args.route)
        prompts = []
        for i in range(clients):
            for r in range(args.rounds):
                if args.shared_prompts:
                    prompts.append(text_of_tokens(srv, 1000, args.prompt_tokens))
                else:
                    # distinct from the first word on: the store can share at most BOS (+ a word by chance)
                    prompts.append(text_of_tokens(srv, 1000 + 100 * i + r, args.prompt_tokens))
        sampler = RssSampler(srv.pid)
        sampler.start()
        cpu0 = proc_cpu_seconds(srv.pid)
        results = [[] for _ in range(clients)]
        barrier = threading.Barrier(clients)

        def worker(i):
            barrier.wait()
            if args.stagger_ms:
                time.sleep(i * args.stagger_ms / 1000.0)
            for r in range(args.rounds):
                body = gen_body(route, prompts[i * args.rounds + r], args.gen_tokens)
                results[i].append(stream_request(srv.port, route_path(route), body))

        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        cpu1 = proc_cpu_seconds(srv.pid)
        sampler.stop()
        flat = [x for rs in results for x in rs]
        errors = [x["error"] for x in flat if x.get("error")]
        ok = [x for x in flat if not x.get("error")]
        ttft = [x["ttft_s"] for x in ok if x["ttft_s"] is not None]
        itl = [b - a for x in ok for a, b in zip(x["times"], x["times"][1:])]
        comp = sum((x["usage"] or {}).get("completion_tokens", len(x["times"])) for x in flat)
        chunks = sum(len(x["times"]) for x in flat)
        cached = sum(((x["usage"] or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0) for x in flat)
        ptoks = sum((x["usage"] or {}).get("prompt_tokens", 0) for x in flat)
        # steady window per round: every client decoding
        steady = []
        for r in range(args.rounds):
            rows = [results[i][r] for i in range(clients) if len(results[i]) > r and len(results[i][r]["times"]) > 1]
            if len(rows) != clients:
                continue
            lo = max(x["times"][0] for x in rows)
            hi = min(x["times"][-1] for x in rows)
            if hi - lo < 0.5:
                continue
            n = sum(sum(1 for t in x["times"] if lo < t <= hi) for x in rows)
            steady.append(n / (hi - lo))
        srv_ttft = [x["usage"]["larder"]["timings"]["ttft_ms"] / 1000 for x in flat
                    if x["usage"] and "larder" in x["usage"]]
        srv_queue = [x["usage"]["larder"]["timings"]["queue_ms"] / 1000 for x in flat
                     if x["usage"] and "larder" in x["usage"]]
        per_request = [{"client": i, "round": r, "status": x.get("status"), "error": x.get("error"),
                        "t_send": x["t_send"] - t0, "t_end": x["t_end"] - t0, "ttft_s": x["ttft_s"],
                        "chunks": len(x["times"]), "cache": x.get("cache_header")}
                       for i, rs in enumerate(results) for r, x in enumerate(rs)]
        res = {
            "per_request": per_request, "stagger_ms": args.stagger_ms,
            "clients": clients, "parallel": clients, "route": route, "requests": len(flat), "errors": errors[:5],
            "prompt_tokens_total": ptoks, "cached_tokens_total": cached, "completion_tokens_total": comp,
            "content_chunks_total": chunks, "wall_s": wall,
            "e2e_output_tok_s": comp / wall if wall > 0 else None,
            "steady_decode_tok_s": statistics.median(steady) if steady else None,
            "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99), "ttft_max_s": max(ttft) if ttft else None,
            "server_ttft_p50_s": pct(srv_ttft, 50), "server_queue_p50_s": pct(srv_queue, 50),
            "itl_p50_ms": pct(itl, 50) * 1000, "itl_p99_ms": pct(itl, 99) * 1000,
            "itl_max_ms": max(itl) * 1000 if itl else None,
            "server_cpu_s": (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None,
            "rss_peak_bytes": sampler.peak(), "rss_anon_peak_bytes": sampler.peak("RssAnon"),
        }
        return res
    finally:
        srv.stop()


def bench_direct(args, gen):
    cmd = ["nice", "-n", "5", args.bin, "bench", args.model, "-p", "8", "-n", str(gen), "-r", "1",
           "--no-roofline", "--json"]
    if args.threads:
        cmd += ["-t", str(args.threads)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"larder bench failed: {p.stderr[-2000:]}")
    j = json.loads(p.stdout[p.stdout.index("{"):])
    return j["tg"]["tok_s"], j


def run_overhead(args, log_dir):
    srv = Server(args.bin, args.model, ["--parallel", 1, "--ctx", args.ctx, *args.extra_flags()], log_dir,
                 name="overhead")
    srv.start()
    pairs = []
    try:
        route = detect_route(srv, args.route)
        # warm-up request (faults in the weights for the server's own pages)
        stream_request(srv.port, route_path(route), gen_body(route, "warm up", 4))
        time.sleep(1.0)
        c0 = proc_cpu_seconds(srv.pid)
        time.sleep(3.0)
        idle_cpu = (proc_cpu_seconds(srv.pid) - c0) / 3.0
        for k in range(args.overhead_pairs):
            order = ("bench", "server") if k % 2 == 0 else ("server", "bench")
            row = {"order": "/".join(order)}
            for what in order:
                if what == "bench":
                    row["bench_tok_s"], _ = bench_direct(args, args.overhead_gen)
                else:
                    prompt = f"Pair {k}: " + words_text(77 + k, 3)
                    x = stream_request(srv.port, route_path(route), gen_body(route, prompt, args.overhead_gen))
                    if x.get("error") or len(x["times"]) < 2:
                        raise RuntimeError(f"overhead request failed: {x.get('error')}")
                    n = len(x["times"])
                    row["server_client_tok_s"] = (n - 1) / (x["times"][-1] - x["times"][0])
                    row["server_reported_tok_s"] = x["usage"]["larder"]["timings"].get("decode_tps")
                    row["server_completion_tokens"] = x["usage"]["completion_tokens"]
                    row["server_chunks"] = n
                    row["server_prompt_tokens"] = x["usage"]["prompt_tokens"]
            row["overhead_pct"] = 100 * (1 - row["server_client_tok_s"] / row["bench_tok_s"])
            pairs.append(row)
            print(f"  pair {k} ({row['order']}): bench {row['bench_tok_s']:.2f} tok/s, server client-side "
                  f"{row['server_client_tok_s']:.2f} (reported {fmt(row['server_reported_tok_s'], 2)}) -> "
                  f"overhead {row['overhead_pct']:+.1f} %", flush=True)
    finally:
        srv.stop()
    b = statistics.median(r["bench_tok_s"] for r in pairs)
    s = statistics.median(r["server_client_tok_s"] for r in pairs)
    rep = [r["server_reported_tok_s"] for r in pairs if r["server_reported_tok_s"]]
    return {
        "pairs": pairs, "bench_median_tok_s": b, "server_client_median_tok_s": s,
        "server_reported_median_tok_s": statistics.median(rep) if rep else None,
        "overhead_median_pct": 100 * (1 - s / b),
        "overhead_pair_pcts": [r["overhead_pct"] for r in pairs],
        "idle_server_cpu_fraction": idle_cpu,
    }


def run_startup(args, log_dir):
    times, load_ms = [], []
    for k in range(args.starts):
        srv = Server(args.bin, args.model, ["--parallel", 1, "--ctx", args.ctx, *args.extra_flags()], log_dir,
                     name=f"start{k}")
        t = srv.start()
        times.append(t)
        log = srv.log_tail()
        rc, stop_s = srv.stop()
        import re
        m = re.search(r"load (\d+) ms", log)
        if m:
            load_ms.append(int(m.group(1)))
        print(f"  start {k}: /health 200 after {t * 1000:.0f} ms (server says load {m.group(1) if m else '?'} ms; "
              f"SIGTERM exit {rc} in {stop_s * 1000:.0f} ms)", flush=True)
    return {"startup_s": times, "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "server_load_ms": load_ms}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "build/bin/larder"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--prompt-tokens", type=int, default=48)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--overhead-pairs", type=int, default=3)
    ap.add_argument("--overhead-gen", type=int, default=64)
    ap.add_argument("--starts", type=int, default=7)
    ap.add_argument("--route", default="auto", choices=["auto", "completions", "chat"])
    ap.add_argument("--shared-prompts", action="store_true", help="every client sends the same prompt")
    ap.add_argument("--stagger-ms", type=float, default=0.0,
                    help="client i waits i*stagger before connecting (0 = all at once)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: levels,overhead,startup")
    ap.add_argument("--server-flags", default="", help="extra `larder serve` flags for every server, e.g. '--step-tokens 64'")
    ap.add_argument("--json-out")
    ap.add_argument("--log-dir")
    args = ap.parse_args()
    args.extra_flags = lambda: (["--threads", str(args.threads)] if args.threads else []) + args.server_flags.split()
    skip = set(filter(None, args.skip.split(",")))
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="serve_bench_")
    os.makedirs(log_dir, exist_ok=True)

    facts = machine_facts(args.bin, args.model)
    print("== machine")
    for k, v in facts.items():
        print(f"  {k}: {v}")
    print(f"  server logs: {log_dir}", flush=True)
    out = {"facts": facts, "args": {k: v for k, v in vars(args).items() if k != "extra_flags"}}

    if "startup" not in skip:
        # first a warm-up start+request so the page cache holds the weights
        print("== process start -> /health 200", flush=True)
        out["startup"] = run_startup(args, log_dir)
        s = out["startup"]
        print(f"  median {s['median_s'] * 1000:.0f} ms [min {s['min_s'] * 1000:.0f} .. max {s['max_s'] * 1000:.0f}]"
              f" (goal <= 300 ms)", flush=True)

    if "overhead" not in skip:
        print(f"== server overhead at one client: larder bench tg{args.overhead_gen} vs one streaming request", flush=True)
        out["overhead"] = run_overhead(args, log_dir)
        o = out["overhead"]
        print(f"  medians: bench {o['bench_median_tok_s']:.2f} tok/s, server {o['server_client_median_tok_s']:.2f} "
              f"(reported {fmt(o['server_reported_median_tok_s'], 2)}) -> overhead {o['overhead_median_pct']:+.1f} % "
              f"(goal <= 2 %); idle server CPU {100 * o['idle_server_cpu_fraction']:.1f} % of a core", flush=True)

    if "levels" not in skip:
        out["levels"] = []
        print("== concurrency levels", flush=True)
        for c in [int(x) for x in args.levels.split(",") if x]:
            res = run_level(args, c, log_dir)
            out["levels"].append(res)
            print(f"  {c:>2} clients (--parallel {c}, {res['route']}): steady decode "
                  f"{fmt(res['steady_decode_tok_s'], 2)} tok/s, e2e output {fmt(res['e2e_output_tok_s'], 2)} tok/s, "
                  f"TTFT p50 {fmt(res['ttft_p50_s'], 2)} s p99 {fmt(res['ttft_p99_s'], 2)} s, "
                  f"ITL p50 {fmt(res['itl_p50_ms'], 0)} ms p99 {fmt(res['itl_p99_ms'], 0)} ms; "
                  f"{res['requests']} req, prompt {res['prompt_tokens_total']} tok (cached {res['cached_tokens_total']}), "
                  f"completion {res['completion_tokens_total']} tok in {res['content_chunks_total']} chunks, "
                  f"wall {res['wall_s']:.1f} s, server CPU {fmt(res['server_cpu_s'], 1)} s, "
                  f"RSS peak {res['rss_peak_bytes'] / 2**20:.0f} MiB; stagger {args.stagger_ms:g} ms; "
                  f"failed requests {len([r for r in res['per_request'] if r['error']])}: {res['errors']}", flush=True)

    out["facts"]["loadavg_after"] = loadavg()
    out["facts"]["cpu_pressure_after"] = cpu_pressure()
    print(f"== load before {facts['loadavg']} / after {out['facts']['loadavg_after']}; "
          f"cpu pressure after: {out['facts']['cpu_pressure_after']}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1)
        print(f"  json: {args.json_out}")


if __name__ == "__main__":
    main()
