#!/usr/bin/env python3
"""Concurrency side by side: `larder serve --parallel N` vs `llama-server -np N` (issue 14 item 4).

    .venv/bin/python bench/concurrency_bench.py --model MODEL.gguf [--bin build/bin/larder]
        [--llama-server ~/.cache/larder-bench/llama.cpp-0.3.36/build/bin/llama-server]
        [--levels 1,4,8] [--rounds 3] [--prompt-tokens 128] [--gen-tokens 64] [--threads 2]
        [--ctx 1024] [--overhead-pairs 3] [--overhead-gen 64] [--lock /work/notes/cpu.lock]
        [--skip levels,overhead] [--json-out FILE]
        [--sampling '{"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "seed": 1}']

What it measures (stdlib only, loopback, streaming SSE):

1. Levels (default 1, 4, 8 concurrent clients). For each level both servers are started on the
   same GGUF with N slots (larder --parallel N --ctx C; llama-server -np N -c N*C, default
   settings otherwise: continuous batching, its default KV type and flash-attention choice),
   the same thread count, and each gets a warm-up request. Then, per round, every client sends
   ONE streaming request to the native llama-server endpoint POST /completion, which both
   servers speak: the prompt is the same list of token ids for both (built from text through
   larder's /tokenize, distinct per client and per round, so neither side's prefix cache can
   help), n_predict = --gen-tokens, temperature 0, EOS disabled (llama-server: ignore_eos;
   larder: logit_bias -100 on every EOS id, which the greedy pick can never choose), and
   return_tokens so every chunk carries its token ids. All clients start at one barrier.
   Rounds alternate the order (larder first in even rounds, llama-server first in odd ones).
   Per run:
   - aggregate decode tok/s: tokens received in the window where every stream is decoding
     ([last stream's first token, first stream's last token]) / window length; when that window
     is shorter than 0.3 s (one stream, or prefill spread wider than decode) the decode rate of
     all streams together: sum(tokens - 1) / (last token - first first-token).
   - end-to-end tok/s: all completion tokens / (first send -> last token), prefill included.
   - TTFT p50/p99 (request sent -> first token, client side), ITL p50/p99 (gap between token
     arrivals within a stream; a chunk carrying k tokens counts as k gaps of gap/k).
   - server CPU seconds (utime+stime from /proc) over the run.
   Reported per level: the median over rounds of each number, its min..max, and the ratio
   larder / llama-server of the medians (aggregate tok/s: higher is better; TTFT: lower).
2. Server overhead at one stream: `larder bench -p 8 -n G -r 1` decode (tg, direct engine) vs
   one streaming request of G tokens on an idle `larder serve --parallel 1`, alternated
   --overhead-pairs times; overhead = 1 - server decode / bench decode per pair, reported as the
   median over the pairs (and beside it the ratio of the two medians), server decode
   = (tokens - 1) / (last - first token arrival).

--sampling JSON: sampling fields merged into every request body, both servers (default: greedy,
temperature 0). Greedy hides what a real client pays per token: a sampler that ranks or
normalizes the whole vocabulary on the step's critical path. llama-server's own defaults are the
example above (its chain: top_k, top_p, min_p, then temperature; larder applies the same three
filters to the untempered distribution).

--lock FILE: every measured round (both servers, one level) and every overhead pair runs under
an exclusive flock on FILE, released between them (shared-machine protocol: builds hold it
shared). Machine facts (CPU, load, commit) are printed first and written to --json-out.
"""

from __future__ import annotations

import argparse
import fcntl
import http.client
import json
import os
import signal
import socket
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_bench as sb  # noqa: E402  (Server, machine facts, percentiles, prompt text)

REPO = os.path.dirname(HERE)
DEFAULT_LLAMA = os.path.expanduser("~/.cache/larder-bench/llama.cpp-0.3.36/build/bin/llama-server")


class Lock:
    """Exclusive flock on a file for the duration of a `with` block (no-op without a path)."""

    def __init__(self, path):
        self.path, self.fd, self.waited_s = path, None, 0.0

    def __enter__(self):
        if self.path:
            t0 = time.perf_counter()
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            self.waited_s = time.perf_counter() - t0
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


class LlamaServer(sb.Server):
    """llama-server with the same start/stop/health handling as sb.Server."""

    def __init__(self, binary, model, parallel, ctx, threads, log_dir):
        super().__init__(binary, model, [], log_dir, nice=0, name=f"llama-np{parallel}")
        self.parallel, self.ctx, self.threads = parallel, ctx, threads

    def start(self, timeout=180):
        self.port = sb.free_port()
        self.log_path = os.path.join(self.log_dir, f"{self.name}-{self.port}.log")
        cmd = [self.binary, "-m", self.model, "--host", "127.0.0.1", "--port", str(self.port),
               "-np", str(self.parallel), "-c", str(self.parallel * self.ctx), "--no-webui"]
        if self.threads:
            cmd += ["-t", str(self.threads), "-tb", str(self.threads)]
        self.cmd = cmd
        log = open(self.log_path, "wb")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        while time.perf_counter() < t0 + timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}: {self.log_tail()}")
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
            time.sleep(0.01)
        self.kill()
        raise RuntimeError(f"llama-server /health not 200 within {timeout}s: {self.log_tail()}")


def gguf_eos_ids(path):
    """EOS (and EOT) token ids from the GGUF metadata, via gguf-py."""
    import gguf  # noqa: PLC0415

    r = gguf.GGUFReader(path)
    ids = set()
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        f = r.fields.get(key)
        if f is not None:
            ids.add(int(f.parts[f.data[0]][0]))
    return sorted(ids)


SAMPLING = {}  # --sampling: merged into every request body


def completion_body(side, prompt_ids, gen, eos_ids):
    body = {"prompt": prompt_ids, "n_predict": gen, "temperature": 0, "stream": True, "cache_prompt": True}
    body.update(SAMPLING)
    if side == "llama":
        body["ignore_eos"] = True
        body["return_tokens"] = True
    else:
        body["logit_bias"] = {str(e): -100 for e in eos_ids}
    return body


def stream_completion(port, body, timeout=1800):
    """POST /completion with stream; returns send time, per-chunk (time, n_tokens), error."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    out = {"chunks": [], "error": None}
    out["t_send"] = time.perf_counter()
    try:
        c.request("POST", "/completion", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            out["error"] = f"HTTP {r.status}: {r.read().decode('utf-8', 'replace')[:300]}"
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
            k = len(obj.get("tokens") or [])
            if k:
                out["chunks"].append((now, k))
            if obj.get("stop"):
                break
    except Exception as e:  # noqa: BLE001
        out["error"] = repr(e)
    finally:
        out["t_end"] = time.perf_counter()
        c.close()
    return out


def stream_completion_socket(port, body, timeout=1800):
    """stream_completion over a bare socket: the same result, at a fraction of http.client's CPU per
    event (its chunked-body readline costs ~35 us per token in this process, on the same two cores
    as the server being measured). De-chunks the body, parses each SSE event's JSON once."""
    out = {"chunks": [], "error": None}
    payload = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    out["t_send"] = time.perf_counter()
    try:
        s.sendall(b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
        raw, head = b"", None
        body_buf, events = b"", b""
        chunked = False
        done = False
        while not done:
            d = s.recv(1 << 20)
            if not d:
                break
            now = time.perf_counter()
            if head is None:
                raw += d
                if b"\r\n\r\n" not in raw:
                    continue
                head, d = raw.split(b"\r\n\r\n", 1)
                status = int(head.split(b" ", 2)[1])
                if status != 200:
                    out["error"] = f"HTTP {status}: {head[:300]!r}"
                    return out
                chunked = b"transfer-encoding: chunked" in head.lower()
            if chunked:
                body_buf += d
                while True:  # whole chunks only
                    nl = body_buf.find(b"\r\n")
                    if nl < 0:
                        break
                    size = int(body_buf[:nl].split(b";")[0], 16)
                    if len(body_buf) < nl + 2 + size + 2:
                        break
                    events += body_buf[nl + 2:nl + 2 + size]
                    body_buf = body_buf[nl + 2 + size + 2:]
                    if size == 0:
                        done = True
            else:
                events += d
            k = 0
            while b"\n\n" in events:
                ev, events = events.split(b"\n\n", 1)
                if not ev.startswith(b"data:"):
                    continue
                data = ev[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                obj = json.loads(data)
                if "error" in obj:
                    out["error"] = obj["error"]
                k += len(obj.get("tokens") or [])
                if obj.get("stop"):
                    done = True
            if k:
                out["chunks"].append((now, k))
    except Exception as e:  # noqa: BLE001
        out["error"] = repr(e)
    finally:
        out["t_end"] = time.perf_counter()
        s.close()
    return out


def run_clients(server, side, prompts, gen, eos_ids):
    n = len(prompts)
    results = [None] * n
    barrier = threading.Barrier(n)

    def worker(i):
        barrier.wait()
        results[i] = stream_completion(server.port, completion_body(side, prompts[i], gen, eos_ids))

    cpu0 = sb.proc_cpu_seconds(server.pid)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu1 = sb.proc_cpu_seconds(server.pid)
    return summarize(results, gen, cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None)


def summarize(results, gen, cpu_s):
    errors = [r["error"] for r in results if r["error"]]
    ok = [r for r in results if not r["error"] and r["chunks"]]
    tokens = [sum(k for _, k in r["chunks"]) for r in ok]
    ttft = [r["chunks"][0][0] - r["t_send"] for r in ok]
    itl = []
    for r in ok:
        for (a, _), (b, k) in zip(r["chunks"], r["chunks"][1:]):
            itl += [(b - a) / k] * k
    firsts = [r["chunks"][0][0] for r in ok]
    lasts = [r["chunks"][-1][0] for r in ok]
    agg, how = None, None
    if ok:
        lo, hi = max(firsts), min(lasts)
        if len(ok) > 1 and hi - lo >= 0.3:
            n = sum(k for r in ok for t, k in r["chunks"] if lo < t <= hi)
            agg, how = n / (hi - lo), "window"
        elif max(lasts) > min(firsts):
            agg, how = sum(t - 1 for t in tokens) / (max(lasts) - min(firsts)), "span"
    t0 = min(r["t_send"] for r in results)
    return {
        "streams": len(results), "ok": len(ok), "errors": errors[:3], "tokens": tokens,
        "short_streams": sum(1 for t in tokens if t != gen),
        "agg_tok_s": agg, "agg_how": how,
        "e2e_tok_s": sum(tokens) / (max(lasts) - t0) if ok else None,
        "ttft_p50_s": sb.pct(ttft, 50), "ttft_p99_s": sb.pct(ttft, 99),
        "itl_p50_ms": sb.pct(itl, 50) * 1000, "itl_p99_ms": sb.pct(itl, 99) * 1000,
        "first_token_spread_s": (max(firsts) - min(firsts)) if ok else None,
        "window_s": (min(lasts) - max(firsts)) if ok else None,
        "server_cpu_s": cpu_s,
    }


def make_prompts(larder_srv, n_tokens, seeds):
    """Token-id prompts of exactly n_tokens (larder's tokenizer, with BOS), one per seed."""
    out = []
    for seed in seeds:
        text = sb.text_of_tokens(larder_srv, seed, n_tokens + 8)
        ids = larder_srv.tokenize(text)
        if len(ids) < n_tokens:
            raise RuntimeError(f"prompt text for seed {seed} has only {len(ids)} tokens")
        out.append(ids[:n_tokens])
    return out


KEYS = ("agg_tok_s", "e2e_tok_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_ms", "itl_p99_ms", "server_cpu_s")


def med_spread(rows, key):
    v = [r[key] for r in rows if r.get(key) is not None and r[key] == r[key]]
    if not v:
        return None, None, None
    return statistics.median(v), min(v), max(v)


def run_level(args, n, log_dir, eos_ids):
    larder = sb.Server(args.bin, args.model, ["--parallel", n, "--ctx", args.ctx, "--threads", args.threads,
                                              *args.larder_flags.split()], log_dir, nice=0, name=f"larder-p{n}")
    llama = LlamaServer(args.llama_server, args.model, n, args.ctx, args.threads, log_dir)
    rows = {"larder": [], "llama": []}
    try:
        larder.start()
        llama.start()
        seeds = [[5000 + 1000 * n + 100 * r + i for i in range(n)] for r in range(args.rounds + 1)]
        prompts = [make_prompts(larder, args.prompt_tokens, s) for s in seeds]
        servers = {"larder": larder, "llama": llama}
        with Lock(args.lock):  # warm-up: page in the weights, first-request allocations
            for side, srv in servers.items():
                run_clients(srv, side, prompts[args.rounds][:1], 8, eos_ids)
        for r in range(args.rounds):
            order = ("larder", "llama") if r % 2 == 0 else ("llama", "larder")
            with Lock(args.lock) as lk:
                load = sb.loadavg()
                for side in order:
                    res = run_clients(servers[side], side, prompts[r], args.gen_tokens, eos_ids)
                    res.update(round=r, order="/".join(order), loadavg=load, lock_wait_s=lk.waited_s)
                    rows[side].append(res)
                    print(f"  np={n} round {r} {side:>6}: agg {sb.fmt(res['agg_tok_s'], 2)} tok/s ({res['agg_how']}), "
                          f"e2e {sb.fmt(res['e2e_tok_s'], 2)}, TTFT p50/p99 {sb.fmt(res['ttft_p50_s'], 3)}/"
                          f"{sb.fmt(res['ttft_p99_s'], 3)} s, ITL p50/p99 {sb.fmt(res['itl_p50_ms'], 1)}/"
                          f"{sb.fmt(res['itl_p99_ms'], 1)} ms, cpu {sb.fmt(res['server_cpu_s'], 1)} s, "
                          f"tokens {sorted(set(res['tokens']))}, errors {res['errors']}; load {load}", flush=True)
    finally:
        larder.stop()
        llama.stop()
    summary = {"streams": n, "larder_cmd": " ".join(larder.cmd), "llama_cmd": " ".join(llama.cmd)}
    for side in rows:
        for k in KEYS:
            summary[f"{side}_{k}"] = med_spread(rows[side], k)
    for k in KEYS:
        a, b = summary[f"larder_{k}"][0], summary[f"llama_{k}"][0]
        summary[f"ratio_{k}"] = a / b if a is not None and b else None
    return {"summary": summary, "rounds": rows}


def bench_direct(args, gen):
    cmd = [args.bin, "bench", args.model, "-p", "8", "-n", str(gen), "-r", "1", "--no-roofline", "--json",
           "-t", str(args.threads)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"larder bench failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout[p.stdout.index("{"):])["tg"]["tok_s"]


def run_overhead(args, log_dir, eos_ids):
    srv = sb.Server(args.bin, args.model, ["--parallel", 1, "--ctx", args.ctx, "--threads", args.threads,
                                           *args.larder_flags.split()], log_dir, nice=0, name="overhead")
    srv.start()
    pairs = []
    try:
        prompts = make_prompts(srv, 8, [900 + k for k in range(args.overhead_pairs + 1)])
        run_clients(srv, "larder", prompts[-1:], 8, eos_ids)  # warm-up
        for k in range(args.overhead_pairs):
            order = ("bench", "server") if k % 2 == 0 else ("server", "bench")
            row = {"order": "/".join(order)}
            with Lock(args.lock):
                row["loadavg"] = sb.loadavg()
                for what in order:
                    if what == "bench":
                        row["bench_tok_s"] = bench_direct(args, args.overhead_gen)
                    else:
                        client = stream_completion_socket if args.overhead_client == "socket" else stream_completion
                        r0 = resource.getrusage(resource.RUSAGE_SELF)
                        x = client(srv.port, completion_body("larder", prompts[k], args.overhead_gen, eos_ids))
                        r1 = resource.getrusage(resource.RUSAGE_SELF)
                        if x["error"] or len(x["chunks"]) < 2:
                            raise RuntimeError(f"overhead request failed: {x['error']}")
                        ntok = sum(kk for _, kk in x["chunks"])
                        row["server_tok_s"] = (ntok - x["chunks"][0][1]) / (x["chunks"][-1][0] - x["chunks"][0][0])
                        row["client_cpu_us_per_token"] = 1e6 * (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / ntok
                        row["writes"] = len(x["chunks"])
            row["overhead_pct"] = 100 * (1 - row["server_tok_s"] / row["bench_tok_s"])
            pairs.append(row)
            print(f"  pair {k} ({row['order']}): bench {row['bench_tok_s']:.2f} tok/s, server {row['server_tok_s']:.2f}"
                  f" -> overhead {row['overhead_pct']:+.1f} %; client {row['client_cpu_us_per_token']:.0f} us CPU per "
                  f"token, {row['writes']} reads; load {row['loadavg']}", flush=True)
    finally:
        srv.stop()
    b = statistics.median(r["bench_tok_s"] for r in pairs)
    s = statistics.median(r["server_tok_s"] for r in pairs)
    # The median of the pairs' own overheads is the headline: each pair runs its two sides back to
    # back, so a neighbour that loads the host for a while moves both; the ratio of the two medians
    # compares runs from different pairs and follows the neighbour (session 24: pairs +0.8–4.9 %
    # with one outlier at +21.7 %, medians' ratio +11.0 %).
    return {"pairs": pairs, "bench_median_tok_s": b, "server_median_tok_s": s, "overhead_median_pct": 100 * (1 - s / b),
            "overhead_pair_pcts": [r["overhead_pct"] for r in pairs],
            "overhead_pair_median_pct": statistics.median(r["overhead_pct"] for r in pairs)}


def print_table(levels):
    def cell(s, side, k, nd):
        m, lo, hi = s[f"{side}_{k}"]
        return "n/a" if m is None else f"{m:.{nd}f} [{lo:.{nd}f}..{hi:.{nd}f}]"

    print("| streams | side | agg decode tok/s | e2e tok/s | TTFT p50 s | TTFT p99 s | ITL p50 ms | ITL p99 ms | CPU s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for lv in levels:
        s = lv["summary"]
        for side, name in (("larder", "larder"), ("llama", "llama-server")):
            print(f"| {s['streams']} | {name} | {cell(s, side, 'agg_tok_s', 1)} | {cell(s, side, 'e2e_tok_s', 1)} | "
                  f"{cell(s, side, 'ttft_p50_s', 3)} | {cell(s, side, 'ttft_p99_s', 3)} | {cell(s, side, 'itl_p50_ms', 1)} | "
                  f"{cell(s, side, 'itl_p99_ms', 1)} | {cell(s, side, 'server_cpu_s', 1)} |")
        print(f"| {s['streams']} | **larder/llama** | **{sb.fmt(s['ratio_agg_tok_s'], 2)}x** | {sb.fmt(s['ratio_e2e_tok_s'], 2)}x | "
              f"{sb.fmt(s['ratio_ttft_p50_s'], 2)}x | {sb.fmt(s['ratio_ttft_p99_s'], 2)}x | {sb.fmt(s['ratio_itl_p50_ms'], 2)}x | "
              f"{sb.fmt(s['ratio_itl_p99_ms'], 2)}x | {sb.fmt(s['ratio_server_cpu_s'], 2)}x |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "build/bin/larder"))
    ap.add_argument("--llama-server", default=DEFAULT_LLAMA,
                    help="default: built by bench/llamacpp_compare.sh --build-only --server when missing")
    ap.add_argument("--model", required=True, help="a GGUF file both servers load")
    ap.add_argument("--levels", default="1,4,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024, help="context per sequence/slot")
    ap.add_argument("--overhead-pairs", type=int, default=3)
    ap.add_argument("--overhead-gen", type=int, default=64)
    ap.add_argument("--overhead-client", choices=("socket", "stdlib"), default="socket",
                    help="the overhead stream's reader: a bare socket (default; its CPU per token is printed) or "
                         "http.client, whose CPU per token on the same cores counts against the server")
    ap.add_argument("--sampling", default="", help="JSON object of sampling fields for every request (default greedy)")
    ap.add_argument("--larder-flags", default="", help="extra `larder serve` flags, e.g. '--step-tokens 128'")
    ap.add_argument("--lock", default="", help="flock -x this file around each measured round")
    ap.add_argument("--skip", default="", help="comma list: levels,overhead")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    # A timeout's SIGTERM unwinds through the finally blocks, so no server is left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    skip = set(filter(None, args.skip.split(",")))
    if args.sampling:
        SAMPLING.update(json.loads(args.sampling))
    if args.llama_server == DEFAULT_LLAMA and not os.path.exists(DEFAULT_LLAMA):
        # The peer is built from the llama-cpp-python sdist like llama-bench (a few minutes, once).
        subprocess.run([os.path.join(HERE, "llamacpp_compare.sh"), "--build-only", "--server"], check=True)
    log_dir = tempfile.mkdtemp(prefix="concurrency_bench_")
    eos_ids = gguf_eos_ids(args.model)

    facts = sb.machine_facts(args.bin, args.model)
    facts["llama_server"] = args.llama_server
    facts["eos_ids"] = eos_ids
    facts["sampling"] = SAMPLING or "greedy (temperature 0)"
    print("== machine")
    for k, v in facts.items():
        print(f"  {k}: {v}")
    print(f"  server logs: {log_dir}", flush=True)
    out = {"facts": facts, "args": vars(args)}

    if "overhead" not in skip:
        print(f"== server overhead at one stream: larder bench tg{args.overhead_gen} vs one streaming request", flush=True)
        o = out["overhead"] = run_overhead(args, log_dir, eos_ids)
        save(args, out)
        print(f"  overhead: median of the pairs {o['overhead_pair_median_pct']:+.1f} % (goal <= 2 %); medians: bench "
              f"{o['bench_median_tok_s']:.2f} tok/s, server {o['server_median_tok_s']:.2f} -> {o['overhead_median_pct']:+.1f} %",
              flush=True)

    if "levels" not in skip:
        print(f"== levels: prompt {args.prompt_tokens} tokens, {args.gen_tokens} generated, {args.rounds} rounds", flush=True)
        out["levels"] = []
        for n in [int(x) for x in args.levels.split(",") if x]:
            out["levels"].append(run_level(args, n, log_dir, eos_ids))
            print_table(out["levels"][-1:])
            save(args, out)
        print_table(out["levels"])

    out["facts"]["loadavg_after"] = sb.loadavg()
    print(f"== load before {facts['loadavg']} / after {out['facts']['loadavg_after']}")
    save(args, out)
    if args.json_out:
        print(f"  json: {args.json_out}")


def save(args, out):
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
