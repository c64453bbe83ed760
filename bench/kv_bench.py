#!/usr/bin/env python3
"""Layer-0 KV store benchmarks through a live `larder serve` (issue 4, "Benchmarks").

    python3 bench/kv_bench.py --model MODEL [--bin build/bin/larder] [--parts a,b,c]
        [--ctx 8192] [--cap-gib 0.5] [--turns 10] [--first-tokens 384] [--turn-tokens 384]
        [--reply-tokens 16] [--off-turns 10] [--delta-refs 3] [--sys-tokens 2048] [--shared 8]
        [--off-shared 8] [--user-tokens 64] [--probe-clients 4] [--probe-tokens 256] [--json-out FILE]

(a) Growing chat: `--turns` turns, the first prompt ~--first-tokens, each later prompt = the previous
    prompt + the model's reply (--reply-tokens, greedy, EOS suppressed) + a new user message of
    ~--turn-tokens (the "new tokens" of the turn). Store on (RAM cap --cap-gib, SSD tier on) vs store
    off (`--prompt-cache 0`, no SSD), TTFT per turn. Store off is measured at the turns in --off-turns
    only (a cold prefill of every turn would cost the sum of all prompt lengths). The goal ratio per
    turn is TTFT(store on) / TTFT(cold prompt of the turn's new-token count), the reference measured
    --delta-refs times on the store-off server with fresh text of the mean new-token count and
    scaled linearly to each turn's count (prefill time is ~linear at these lengths).
(c) The last (~4k-token) prompt of (a): RAM hit on the same server (exact repeat: len-1 reused), then
    SIGTERM (the store flushes to --ssd-cache), restart, SSD hit (files still in the page cache),
    a RAM hit after the restore, then SIGTERM, POSIX_FADV_DONTNEED on the cache files only (drops
    their pages, no global drop_caches on a shared host), restart, SSD hit from disk; vs the cold
    prefill of the same prompt on the store-off server.
(b) `--shared` sequential requests sharing a --sys-tokens system text plus a distinct --user-tokens
    question: prefill tokens computed = sum(prompt_tokens - cached_tokens) and total wall time, store
    on vs off. Off runs the first --off-shared requests (set it below --shared to save time; the
    total is then extrapolated and marked so). Then a probe: --probe-clients requests sharing a
    --probe-tokens prefix sent concurrently to a fresh store-on server (--parallel = clients):
    is the shared part computed once when the requests arrive together?
(d) VmRSS / RssAnon / RssFile of every server sampled every 0.25 s, and /stats after each request,
    against mapped weights + --cap-gib + live KV (parallel x ctx x KV bytes per token).

The random-weight models have no chat template, so by default the prompts are plain text on
/v1/completions (--route chat uses /v1/chat/completions with a growing messages list instead).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_bench import (REPO, RssSampler, Server, cpu_pressure, fmt, loadavg, machine_facts,  # noqa: E402
                         pct, stream_request, text_of_tokens, words_text)

EOS = (2,)


def kv_bytes_per_token(model_info):
    return model_info["layers"] * model_info["kv_heads"] * model_info["head_dim"] * 2 * 4  # K+V, f32


def model_shape(binary, model):
    import subprocess
    out = subprocess.run([binary, "info", model], capture_output=True, text=True, timeout=120).stdout
    info = {}
    for line in out.splitlines():
        k, _, v = line.partition(":")
        k, v = k.strip(), v.strip()
        if k == "layers":
            info["layers"] = int(v)
        elif k == "heads":  # "32 (kv 8, head_dim 64)"
            info["heads"] = int(v.split()[0])
            info["kv_heads"] = int(v.split("kv ")[1].split(",")[0])
            info["head_dim"] = int(v.split("head_dim ")[1].rstrip(")"))
        elif k == "chat template":
            info["chat_template"] = v
    return info


class Tracked:
    """A server plus its RSS sampler and /stats snapshots."""

    def __init__(self, args, flags, name, log_dir):
        self.srv = Server(args.bin, args.model, flags, log_dir, name=name)
        self.name = name
        self.flags = flags
        self.stats = []

    def start(self):
        t = self.srv.start()
        self.sampler = RssSampler(self.srv.pid)
        self.sampler.start()
        return t

    def snap(self):
        try:
            s = self.srv.get_json("/stats")
            self.stats.append(s)
            return s
        except Exception:  # noqa: BLE001
            return None

    def stop(self):
        self.snap()
        rc, dt = self.srv.stop()
        self.sampler.stop()
        return rc, dt

    def memory(self):
        ram = [s["kv_store"]["ram"]["bytes"] for s in self.stats if s]
        mapped = [s["kv_store"]["ram"].get("mapped_bytes", 0) for s in self.stats if s]
        res = [s["server"]["resident_bytes"] for s in self.stats if s]
        return {"server": self.name, "flags": " ".join(map(str, self.flags)),
                "vmrss_peak": self.sampler.peak("VmRSS"), "rss_anon_peak": self.sampler.peak("RssAnon"),
                "rss_file_peak": self.sampler.peak("RssFile"), "vmhwm": self.sampler.peak("VmHWM"),
                "stats_resident_peak": max(res, default=0), "kv_ram_bytes_peak": max(ram, default=0),
                "kv_mapped_bytes_peak": max(mapped, default=0), "samples": len(self.sampler.samples)}


def body_for(route, prompt_or_messages, max_tokens):
    b = {"max_tokens": max_tokens, "temperature": 0, "logit_bias": {str(e): -100 for e in EOS}}
    if route == "chat":
        b["messages"] = prompt_or_messages
    else:
        b["prompt"] = prompt_or_messages
    return b


def path_for(route):
    return "/v1/chat/completions" if route == "chat" else "/v1/completions"


def one(t, route, prompt, max_tokens, label=""):
    x = stream_request(t.srv.port, path_for(route), body_for(route, prompt, max_tokens))
    if x.get("error") or not x.get("usage"):
        raise RuntimeError(f"{label}: request failed: {x.get('status')} {x.get('error')}\n{t.srv.log_tail(1500)}")
    u = x["usage"]
    tm = (u.get("larder") or {}).get("timings", {})
    t.snap()
    return {
        "label": label, "prompt_tokens": u["prompt_tokens"],
        "cached_tokens": (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        "new_tokens": u["prompt_tokens"] - (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        "completion_tokens": u["completion_tokens"], "ttft_s": x["ttft_s"],
        "server_ttft_s": tm.get("ttft_ms", 0) / 1000, "server_prefill_s": tm.get("prefill_ms", 0) / 1000,
        "server_queue_s": tm.get("queue_ms", 0) / 1000, "total_s": x["t_end"] - x["t_send"],
        "cache": x.get("cache_header", ""), "tier": ((u.get("larder") or {}).get("cache") or {}).get("tier"),
        "reason": ((u.get("larder") or {}).get("cache") or {}).get("reason"), "text": x["text"],
    }


def show(r):
    print(f"    {r['label']:<22} prompt {r['prompt_tokens']:>5} cached {r['cached_tokens']:>5} new {r['new_tokens']:>5} | "
          f"TTFT {r['ttft_s']:7.2f} s (server {r['server_ttft_s']:7.2f}, prefill {r['server_prefill_s']:7.2f}) | "
          f"total {r['total_s']:6.2f} s | {r['cache']}", flush=True)


def fadvise_dontneed(d):
    n = 0
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            try:
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    n += 1
                finally:
                    os.close(fd)
            except OSError:
                pass
    return n


def dir_bytes(d):
    tot = 0
    for root, _, files in os.walk(d):
        for f in files:
            try:
                tot += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return tot


def part_a_c(args, route, log_dir, out, servers):
    cap = ["--prompt-cache", args.cap_gib]
    ssd = os.path.join(args.work_dir, "ssd")
    shutil.rmtree(ssd, ignore_errors=True)
    os.makedirs(ssd)
    on = Tracked(args, ["--ctx", args.ctx, "--parallel", 1, *cap, "--ssd-cache", ssd, *args.thr], "a-on", log_dir)
    on.start()
    servers.append(on)
    print(f"== (a) growing chat, store on ({' '.join(map(str, on.flags))})", flush=True)
    turns = []
    prompts = []
    if route == "chat":
        conv = [{"role": "user", "content": text_of_tokens(on.srv, 11, args.first_tokens)}]
    else:
        conv = "User: " + text_of_tokens(on.srv, 11, args.first_tokens) + "\nAssistant:"
    for k in range(1, args.turns + 1):
        prompt = json.loads(json.dumps(conv)) if route == "chat" else conv
        prompts.append(prompt)
        r = one(on, route, prompt, args.reply_tokens, f"turn {k}")
        r["turn"] = k
        turns.append(r)
        show(r)
        user = text_of_tokens(on.srv, 100 + k, args.turn_tokens)
        if route == "chat":
            conv = conv + [{"role": "assistant", "content": r["text"]}, {"role": "user", "content": user}]
        else:
            conv = conv + r["text"] + "\nUser: " + user + "\nAssistant:"
    last = prompts[-1]
    print("== (c) the last prompt of (a): RAM hit, SSD hit after restart, cold", flush=True)
    c = {}
    c["ram_hit"] = one(on, route, last, args.reply_tokens, "RAM hit (same server)")
    show(c["ram_hit"])
    rc, dt = on.stop()
    c["shutdown_1"] = {"rc": rc, "seconds": dt, "ssd_bytes": dir_bytes(ssd)}
    print(f"    SIGTERM: exit {rc} in {dt:.2f} s; SSD dir {dir_bytes(ssd) / 2**20:.1f} MiB", flush=True)
    on2 = Tracked(args, on.flags, "c-restart-warm", log_dir)
    c["restart_warm_health_s"] = on2.start()
    servers.append(on2)
    c["ssd_hit_warm"] = one(on2, route, last, args.reply_tokens, "SSD hit (page cache)")
    show(c["ssd_hit_warm"])
    c["ram_after_restore"] = one(on2, route, last, args.reply_tokens, "RAM hit after restore")
    show(c["ram_after_restore"])
    rc, dt = on2.stop()
    c["shutdown_2"] = {"rc": rc, "seconds": dt}
    n = fadvise_dontneed(ssd)
    on3 = Tracked(args, on.flags, "c-restart-cold", log_dir)
    c["restart_cold_health_s"] = on3.start()
    servers.append(on3)
    c["ssd_hit_disk"] = one(on3, route, last, args.reply_tokens, f"SSD hit (fadvised {n})")
    show(c["ssd_hit_disk"])
    rc, dt = on3.stop()
    c["shutdown_3"] = {"rc": rc, "seconds": dt}

    off = Tracked(args, ["--ctx", args.ctx, "--parallel", 1, "--prompt-cache", 0, *args.thr], "off", log_dir)
    off.start()
    servers.append(off)
    print(f"== store off ({' '.join(map(str, off.flags))}): cold prefills", flush=True)
    c["cold"] = one(off, route, last, args.reply_tokens, f"cold turn {args.turns}")
    show(c["cold"])
    off_turns = {args.turns: c["cold"]}
    for k in sorted(set(int(x) for x in args.off_turns.split(",") if x) - {args.turns}):
        r = one(off, route, prompts[k - 1], args.reply_tokens, f"cold turn {k}")
        show(r)
        off_turns[k] = r
    # reference: cold prompts of the mean new-token count of turns 2..N (fresh text)
    deltas = [t["new_tokens"] for t in turns[1:]]
    dmean = round(statistics.mean(deltas)) if deltas else args.turn_tokens
    refs = []
    for j in range(args.delta_refs):
        p = text_of_tokens(off.srv, 5000 + j, dmean)
        if route == "chat":
            p = [{"role": "user", "content": p}]
        r = one(off, route, p, args.reply_tokens, f"cold ref #{j} (~{dmean})")
        show(r)
        refs.append(r)
    out["servers_off"] = off
    ref_ttft = statistics.median(r["ttft_s"] for r in refs)
    ref_tok = statistics.median(r["prompt_tokens"] for r in refs)
    for t in turns:
        ref_k = ref_ttft * t["new_tokens"] / ref_tok
        t["ref_ttft_s"] = ref_k
        t["ratio_vs_new_alone"] = t["ttft_s"] / ref_k if t["cached_tokens"] > 0 else None
        if t["turn"] in off_turns:
            t["off_ttft_s"] = off_turns[t["turn"]]["ttft_s"]
            t["off_cached"] = off_turns[t["turn"]]["cached_tokens"]
    out["a"] = {"turns": turns, "refs": refs, "ref_ttft_median_s": ref_ttft, "ref_tokens": ref_tok,
                "ref_ttft_spread_s": [min(r["ttft_s"] for r in refs), max(r["ttft_s"] for r in refs)],
                "off_turns": {k: v for k, v in off_turns.items()}}
    cold = c["cold"]["ttft_s"]
    c["speedup_ssd_warm"] = cold / c["ssd_hit_warm"]["ttft_s"]
    c["speedup_ssd_disk"] = cold / c["ssd_hit_disk"]["ttft_s"]
    c["speedup_ram"] = cold / c["ram_hit"]["ttft_s"]
    out["c"] = c
    print("  (a) per turn: TTFT on / ref(new tokens alone) [goal <= 1.2]; off where measured", flush=True)
    for t in turns:
        print(f"    turn {t['turn']:>2}: prompt {t['prompt_tokens']:>5} new {t['new_tokens']:>4} TTFT on {t['ttft_s']:6.2f} s"
              f" ref {t['ref_ttft_s']:6.2f} s ratio {fmt(t['ratio_vs_new_alone'], 2)}"
              + (f" | off {t['off_ttft_s']:6.2f} s" if 'off_ttft_s' in t else ""), flush=True)
    print(f"  (c) cold {cold:.2f} s; RAM hit {c['ram_hit']['ttft_s']:.3f} s ({c['speedup_ram']:.0f}x); "
          f"SSD hit warm {c['ssd_hit_warm']['ttft_s']:.3f} s ({c['speedup_ssd_warm']:.0f}x); SSD hit from disk "
          f"{c['ssd_hit_disk']['ttft_s']:.3f} s ({c['speedup_ssd_disk']:.0f}x) [goal >= 20x]", flush=True)
    return off


def part_b(args, route, log_dir, out, servers, off):
    print(f"== (b) {args.shared} requests sharing a ~{args.sys_tokens}-token system text", flush=True)
    on = Tracked(args, ["--ctx", args.ctx, "--parallel", 1, "--prompt-cache", args.cap_gib, *args.thr], "b-on", log_dir)
    on.start()
    servers.append(on)
    system = "System: " + text_of_tokens(on.srv, 7, args.sys_tokens)
    qs = [text_of_tokens(on.srv, 900 + j, args.user_tokens) for j in range(args.shared)]

    def prompt(j):
        if route == "chat":
            return [{"role": "system", "content": system}, {"role": "user", "content": qs[j]}]
        return system + "\nUser: " + qs[j] + "\nAssistant:"

    res = {}
    for name, t, n in (("on", on, args.shared), ("off", off, args.off_shared)):
        rows = []
        t0 = time.perf_counter()
        for j in range(n):
            r = one(t, route, prompt(j), args.shared_reply, f"{name} req {j}")
            show(r)
            rows.append(r)
        wall = time.perf_counter() - t0
        computed = sum(r["new_tokens"] for r in rows)
        res[name] = {"rows": rows, "requests": n, "wall_s": wall, "prefill_tokens_computed": computed,
                     "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
                     "prefill_s_sum": sum(r["server_prefill_s"] for r in rows)}
        if n < args.shared:
            res[name]["extrapolated_wall_s"] = wall / n * args.shared
            res[name]["extrapolated_prefill_tokens"] = computed / n * args.shared
    on.stop()
    out["b"] = res
    for name in ("on", "off"):
        r = res[name]
        ex = (f" (measured {r['requests']} of {args.shared}; x{args.shared / r['requests']:.0f} -> "
              f"{r['extrapolated_prefill_tokens']:.0f} tok, {r['extrapolated_wall_s']:.0f} s)") if "extrapolated_wall_s" in r else ""
        print(f"  (b) store {name}: prefill tokens computed {r['prefill_tokens_computed']} of {r['prompt_tokens']} prompt tokens, "
              f"wall {r['wall_s']:.1f} s{ex}", flush=True)

    if args.probe_clients > 0:
        print(f"== (b') {args.probe_clients} concurrent requests sharing a ~{args.probe_tokens}-token prefix", flush=True)
        pr = Tracked(args, ["--ctx", args.ctx, "--parallel", args.probe_clients, "--prompt-cache", args.cap_gib, *args.thr],
                     "b-probe", log_dir)
        pr.start()
        servers.append(pr)
        pre = "System: " + text_of_tokens(pr.srv, 8, args.probe_tokens)
        ps = [pre + "\nUser: " + text_of_tokens(pr.srv, 950 + j, 16) + "\nAssistant:" for j in range(args.probe_clients)]
        if route == "chat":
            ps = [[{"role": "system", "content": pre}, {"role": "user", "content": text_of_tokens(pr.srv, 950 + j, 16)}]
                  for j in range(args.probe_clients)]
        rows = [None] * args.probe_clients
        bar = threading.Barrier(args.probe_clients)

        def w(j):
            bar.wait()
            rows[j] = one(pr, route, ps[j], 4, f"concurrent {j}")

        t0 = time.perf_counter()
        th = [threading.Thread(target=w, args=(j,)) for j in range(args.probe_clients)]
        for x in th:
            x.start()
        for x in th:
            x.join()
        wall = time.perf_counter() - t0
        for r in rows:
            if r:
                show(r)
        after = one(pr, route, ps[0][:-1] + [{"role": "user", "content": "again"}] if route == "chat"
                    else pre + "\nUser: again\nAssistant:", 4, "after (sequential)")
        show(after)
        pr.stop()
        out["b_probe"] = {"rows": rows, "wall_s": wall, "after": after,
                          "prefill_tokens_computed": sum(r["new_tokens"] for r in rows if r)}
        print(f"  (b') concurrent: prefill tokens computed {out['b_probe']['prefill_tokens_computed']} for "
              f"{args.probe_clients} x ~{args.probe_tokens + 20} tokens; wall {wall:.1f} s; a later request reused "
              f"{after['cached_tokens']}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "build/bin/larder"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--parts", default="a,b,c", help="a and c run together")
    ap.add_argument("--route", default="auto", choices=["auto", "completions", "chat"])
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--cap-gib", type=float, default=0.5, help="--prompt-cache of the store-on servers")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--first-tokens", type=int, default=384)
    ap.add_argument("--turn-tokens", type=int, default=384)
    ap.add_argument("--reply-tokens", type=int, default=16)
    ap.add_argument("--off-turns", default="10")
    ap.add_argument("--delta-refs", type=int, default=3)
    ap.add_argument("--sys-tokens", type=int, default=2048)
    ap.add_argument("--shared", type=int, default=8)
    ap.add_argument("--off-shared", type=int, default=8)
    ap.add_argument("--user-tokens", type=int, default=64)
    ap.add_argument("--shared-reply", type=int, default=8)
    ap.add_argument("--probe-clients", type=int, default=4)
    ap.add_argument("--probe-tokens", type=int, default=256)
    ap.add_argument("--work-dir")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    args.thr = ["--threads", args.threads] if args.threads else []
    args.work_dir = args.work_dir or tempfile.mkdtemp(prefix="kv_bench_")
    log_dir = os.path.join(args.work_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    parts = set(args.parts.split(","))

    facts = machine_facts(args.bin, args.model)
    shape = model_shape(args.bin, args.model)
    facts["kv_bytes_per_token"] = kv_bytes_per_token(shape)
    print("== machine")
    for k, v in facts.items():
        print(f"  {k}: {v}")
    print(f"  model shape: {shape}; work dir {args.work_dir}", flush=True)
    route = args.route
    if route == "auto":
        route = "chat" if shape.get("chat_template", "none") not in ("none", "") else "completions"
    print(f"  route: {route} ({'model has a chat template' if route == 'chat' else 'no chat template: plain text on /v1/completions'})")
    out = {"facts": facts, "shape": shape, "route": route,
           "args": {k: v for k, v in vars(args).items() if k != "thr"}}
    servers = []
    off = None
    t_start = time.perf_counter()
    try:
        if "a" in parts or "c" in parts:
            off = part_a_c(args, route, log_dir, out, servers)
        if "b" in parts:
            if off is None:
                off = Tracked(args, ["--ctx", args.ctx, "--parallel", 1, "--prompt-cache", 0, *args.thr], "off", log_dir)
                off.start()
                servers.append(off)
            part_b(args, route, log_dir, out, servers, off)
    finally:
        for t in servers:
            if t.srv.proc and t.srv.proc.poll() is None:
                t.stop()
        out.pop("servers_off", None)
        # (d) memory
        weights = facts["model_bytes"]
        kvt = facts["kv_bytes_per_token"]
        cap = int(args.cap_gib * 2**30)
        out["d"] = []
        print("== (d) resident memory per server (peak of 0.25 s samples)")
        for t in servers:
            m = t.memory()
            par = int(t.flags[t.flags.index("--parallel") + 1])
            store_cap = cap if "--prompt-cache" in t.flags and float(t.flags[t.flags.index("--prompt-cache") + 1]) > 0 else 0
            live = par * int(args.ctx) * kvt
            base = t.sampler.samples[0][1].get("VmRSS", 0) if t.sampler.samples else 0
            m["bound_bytes"] = base + weights + store_cap + live
            m["bound_terms"] = {"rss_at_ready": base, "weights": weights, "prompt_cache_cap": store_cap,
                                "live_kv_parallel_x_ctx": live}
            m["under_bound"] = m["vmrss_peak"] <= m["bound_bytes"]
            out["d"].append(m)
            print(f"  {m['server']:<16} VmRSS peak {m['vmrss_peak'] / 2**20:7.0f} MiB (anon {m['rss_anon_peak'] / 2**20:6.0f}, "
                  f"file {m['rss_file_peak'] / 2**20:6.0f}); /stats resident peak {m['stats_resident_peak'] / 2**20:6.0f} MiB; "
                  f"kv ram peak {m['kv_ram_bytes_peak'] / 2**20:6.0f} MiB, mapped {m['kv_mapped_bytes_peak'] / 2**20:5.0f} MiB | "
                  f"bound {m['bound_bytes'] / 2**20:6.0f} MiB = RSS at ready {base / 2**20:.0f} + weights {weights / 2**20:.0f} + cap {store_cap / 2**20:.0f} + "
                  f"live {live / 2**20:.0f} -> {'under' if m['under_bound'] else 'OVER'}", flush=True)
        out["facts"]["loadavg_after"] = loadavg()
        out["facts"]["cpu_pressure_after"] = cpu_pressure()
        out["wall_s"] = time.perf_counter() - t_start
        print(f"== load before {facts['loadavg']} / after {out['facts']['loadavg_after']}; cpu pressure after: "
              f"{out['facts']['cpu_pressure_after']}; wall {out['wall_s']:.0f} s")
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(out, f, indent=1, default=str)
            print(f"  json: {args.json_out}")


if __name__ == "__main__":
    main()
