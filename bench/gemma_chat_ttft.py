#!/usr/bin/env python3
"""TTFT per turn of a 10-turn chat on a sliding-window model, larder vs llama-server (issue 13
item 4, "measure the same chat on llama-server and larder side by side").

    python3 bench/gemma_chat_ttft.py [--model .cache/models/gemma-3-270m-q4_k_m.gguf]
        [--bin build/bin/larder] [--llama-server ~/.cache/larder-bench/llama.cpp-0.3.36/build/bin/llama-server]
        [--turns 10] [--max-tokens 32] [--threads 2] [--configs larder-on,larder-off,llama,llama-swa-full]
        [--json-out FILE]

The chat is the one of tests/server/gemma_chat_reuse_test.py: ~140-token user turns, greedy
answers of --max-tokens fed back as they came (each engine its own answers, as a real client
would), so the context passes gemma-3's 512-token window three times. Each turn is one streaming
/v1/chat/completions request; TTFT = request sent → first chunk with content (client side, stdlib
http.client on loopback). Reuse per turn: larder's usage.prompt_tokens_details.cached_tokens
(stream_options.include_usage), llama-server's timings.cache_n of the final chunk.

Configurations: larder store on (RAM tier), larder store off (--prompt-cache 0), llama-server as
shipped (prompt cache on, one slot, its default SWA cache and context checkpoints), llama-server
--swa-full (a full-size KV for the sliding layers: reuse like a plain model, at full-context
memory). Both engines get the same thread count and context (4096), one slot.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TOPICS = ["lighthouses", "bread baking", "the moon", "trains", "volcanoes", "bees", "chess", "rivers",
          "glass", "clocks", "maps", "kites"]


def user_message(topic):
    return f"Tell me about {topic}. " + " ".join(
        f"Please include detail number {k} about {topic} and explain why it matters to people who care about {topic}."
        for k in range(5))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(port, proc, timeout=180):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server did not become healthy")


def stream_turn(port, messages, max_tokens):
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    ttft, text, usage, timings = None, [], None, None
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        j = json.loads(data)
        for ch in j.get("choices") or []:
            piece = (ch.get("delta") or {}).get("content")
            if piece:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(piece)
        if j.get("usage"):
            usage = j["usage"]
        if j.get("timings"):
            timings = j["timings"]
    c.close()
    cached = None
    if usage and (usage.get("prompt_tokens_details") or {}).get("cached_tokens") is not None:
        cached = usage["prompt_tokens_details"]["cached_tokens"]
    if timings and timings.get("cache_n") is not None:
        cached = timings["cache_n"]
    return {"ttft_ms": round(ttft * 1e3, 1) if ttft else None, "content": "".join(text),
            "prompt_tokens": (usage or {}).get("prompt_tokens") or (timings or {}).get("prompt_n", 0) + (cached or 0),
            "cached_tokens": cached}


def run_config(name, args):
    port = free_port()
    if name.startswith("larder"):
        cmd = [args.bin, "serve", args.model, "--host", "127.0.0.1", "--port", str(port), "--ctx", "4096",
               "--parallel", "1", "--threads", str(args.threads)]
        if name == "larder-off":
            cmd += ["--prompt-cache", "0"]
    else:
        cmd = [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port), "-c", "4096",
               "-np", "1", "-t", str(args.threads), "-tb", str(args.threads), "--jinja"]
        if name == "llama-swa-full":
            cmd += ["--swa-full"]
    log = tempfile.NamedTemporaryFile(prefix=f"gemma_ttft_{name}_", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_health(port, proc)
        messages, turns = [], []
        for i in range(args.turns):
            messages.append({"role": "user", "content": user_message(TOPICS[i % len(TOPICS)])})
            t = stream_turn(port, messages, args.max_tokens)
            turns.append({k: t[k] for k in ("ttft_ms", "prompt_tokens", "cached_tokens")})
            print(f"{name:15s} turn {i + 1:2d}: prompt {t['prompt_tokens']:5} cached {t['cached_tokens']!s:>5} "
                  f"TTFT {t['ttft_ms']:8.1f} ms", flush=True)
            messages.append({"role": "assistant", "content": t["content"]})
        return turns
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(REPO, ".cache/models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--bin", default=os.path.join(REPO, "build/bin/larder"))
    ap.add_argument("--llama-server",
                    default=os.path.expanduser("~/.cache/larder-bench/llama.cpp-0.3.36/build/bin/llama-server"))
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default="larder-on,larder-off,llama,llama-swa-full")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    with open("/proc/loadavg") as f:
        load0 = f.read().split()[:3]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"cpu: {cpu}, {os.cpu_count()} cpus, load {' '.join(load0)}, {platform.platform()}")
    results = {}
    for name in args.configs.split(","):
        results[name] = run_config(name, args)
    with open("/proc/loadavg") as f:
        print("load after:", " ".join(f.read().split()[:3]))
    names = list(results)
    print("\n| turn | prompt | " + " | ".join(f"{n} TTFT ms (cached)" for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    for i in range(args.turns):
        row = [str(i + 1), str(results[names[0]][i]["prompt_tokens"])]
        for n in names:
            t = results[n][i]
            row.append(f"{t['ttft_ms']} ({t['cached_tokens']})")
        print("| " + " | ".join(row) + " |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"cpu": cpu, "load_before": load0, "results": results}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
