#!/usr/bin/env python3
"""Batched LoRA throughput (issue 45 evidence): one batch of N streams over 4 adapters vs the base
alone at the same batch size, on one `larder serve` process.

    .venv/bin/python bench/lora_bench.py [--model .cache/models/SmolLM2-135M-Instruct-hf]
        [--bin build/bin/larder] [--streams 8] [--adapters 4] [--rank 16] [--gen 64] [--rounds 5]
        [--threads 0] [--adapter-dtype f32|bf16] [--json-out FILE]

Adapters: random PEFT LoRA directories (rank --rank, lora_alpha 2·rank, every attention and MLP
projection of every layer: q/k/v/o, gate/up/down) written under /tmp in SmolLM2-135M's shapes
(hidden 576, 9 heads × 64, 3 KV heads, intermediate 1536, 30 layers); the model is its HF
checkpoint (a PEFT adapter does not fit llama.cpp's row order, so not the Q4_1 GGUF). One server
serves all of them (--lora aK=DIR) with --parallel N. --adapter-dtype bf16 stores the factors as
BF16 (as PEFT saves an adapter trained on a bf16 model without autocast, and many Hub adapters
ship), which larder reads in that dtype: half the adapter bytes per decode step.

A round sends N concurrent non-streaming /v1/completions (temperature 0, --gen tokens, EOS masked
by logit_bias so every stream decodes the same count, a distinct cache_salt per round so no
prefix is reused) and times it from the first send to the last answer: throughput = N·gen / wall.
"base" rounds send every stream to the base model; "lora" rounds spread the streams over the
adapters round-robin (stream i → adapter i mod K). The two kinds alternate (base first in even
rounds, lora first in odd ones) so a load change on the shared host hits both alike; reported:
each round's pair ratio lora/base and the median of those ratios (the host is loaded: ratios
only, never absolute numbers across runs). Beside the wall-clock rate, tokens per CPU-second of
the server process (utime + stime from /proc over the round): on a host shared with other
builds the wall clock mostly measures the neighbours, the CPU time what the server did.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# SmolLM2-135M (LlamaForCausalLM): module → (out, in)
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS = 576, 9, 3, 64, 1536, 30
SHAPES = {"self_attn.q_proj": (HEADS * HEAD_DIM, HIDDEN), "self_attn.k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
          "self_attn.v_proj": (KV_HEADS * HEAD_DIM, HIDDEN), "self_attn.o_proj": (HIDDEN, HEADS * HEAD_DIM),
          "mlp.gate_proj": (INTER, HIDDEN), "mlp.up_proj": (INTER, HIDDEN), "mlp.down_proj": (HIDDEN, INTER)}
PROMPTS = ["The weather today is", "One two three four", "My favourite colour is", "Once upon a time",
           "In the beginning", "Numbers: 1, 2, 3,", "The cat sat on", "A list of words:"]


def save_bf16(tensors, path):
    """safetensors with every tensor as BF16 (round to nearest even; numpy has no bfloat16)."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors.items():
        u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
        b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def write_peft(out, seed, rank, dtype="f32"):
    from safetensors.numpy import save_file
    rng = np.random.default_rng(seed)
    os.makedirs(out, exist_ok=True)
    t = {}
    for layer in range(LAYERS):
        for m, (o, i) in SHAPES.items():
            key = f"base_model.model.model.layers.{layer}.{m}"
            t[key + ".lora_A.weight"] = (rng.standard_normal((rank, i)) * i ** -0.5 * 0.1).astype(np.float32)
            t[key + ".lora_B.weight"] = (rng.standard_normal((o, rank)) * rank ** -0.5 * 0.1).astype(np.float32)
    if dtype == "bf16":
        save_bf16(t, os.path.join(out, "adapter_model.safetensors"))
    else:
        save_file(t, os.path.join(out, "adapter_model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                   "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}, f)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.loads(r.read())


def cpu_seconds(pid):
    """utime + stime of the server process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_round(port, models, gen, salt):
    def one(i):
        r = post(port, "/v1/completions", {"model": models[i], "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": gen,
                                           "temperature": 0, "cache_salt": salt,
                                           "logit_bias": {"0": -100, "2": -100}})
        return r["usage"]["completion_tokens"]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(models)) as ex:
        toks = list(ex.map(one, range(len(models))))
    wall = time.perf_counter() - t0
    assert all(t == gen for t in toks), toks
    return sum(toks) / wall


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, ".cache/models/SmolLM2-135M-Instruct-hf"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/bin/larder"))
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--adapter-dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--json-out")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="lora-bench-", dir="/tmp")
    srv = None
    try:
        flags = []
        for k in range(a.adapters):
            flags += ["--lora", f"a{k}={write_peft(os.path.join(tmp, f'a{k}'), 100 + k, a.rank, a.adapter_dtype)}"]
        port = free_port()
        cmd = [a.bin, "serve", a.model, "--host", "127.0.0.1", "--port", str(port), "--parallel", str(a.streams),
               "--ctx", "512", *(["--threads", str(a.threads)] if a.threads else []), *flags]
        log = open(os.path.join(tmp, "serve.log"), "wb")
        srv = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        for _ in range(600):
            try:
                base_id = get(port, "/v1/models")["data"][0]["id"]
                break
            except OSError:
                if srv.poll() is not None:
                    sys.exit(open(os.path.join(tmp, "serve.log")).read())
                time.sleep(0.1)
        base = [base_id] * a.streams
        lora = [f"a{i % a.adapters}" for i in range(a.streams)]
        run_round(port, lora, 8, "warm-l")  # page in weights and adapters
        run_round(port, base, 8, "warm-b")
        rows = []
        for r in range(a.rounds):
            order = [("base", base), ("lora", lora)] if r % 2 == 0 else [("lora", lora), ("base", base)]
            got, cpu = {}, {}
            for name, models in order:
                c0 = cpu_seconds(srv.pid)
                got[name] = run_round(port, models, a.gen, f"r{r}-{name}")
                cpu[name] = a.streams * a.gen / (cpu_seconds(srv.pid) - c0)  # tokens per CPU-second
            rows.append({"round": r, "base_tps": got["base"], "lora_tps": got["lora"],
                         "ratio": got["lora"] / got["base"], "base_tpcs": cpu["base"], "lora_tpcs": cpu["lora"],
                         "cpu_ratio": cpu["lora"] / cpu["base"]})
            print(f"round {r}: base {got['base']:.1f} tok/s, {a.adapters} adapters {got['lora']:.1f} tok/s, "
                  f"ratio {got['lora'] / got['base']:.3f}; per CPU-second: base {cpu['base']:.1f}, "
                  f"adapters {cpu['lora']:.1f}, ratio {cpu['lora'] / cpu['base']:.3f}", flush=True)
        med = statistics.median(x["ratio"] for x in rows)
        cmed = statistics.median(x["cpu_ratio"] for x in rows)
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        print(f"median ratio lora/base: wall {med:.3f}, per CPU-second {cmed:.3f} (streams {a.streams}, adapters {a.adapters}, rank {a.rank}, "
              f"gen {a.gen}, adapters {a.adapter_dtype}; CPU {cpu_name()}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}; commit {commit})")
        if a.json_out:
            with open(a.json_out, "w") as f:
                json.dump({"rounds": rows, "median_ratio": med, "median_cpu_ratio": cmed, "streams": a.streams, "adapters": a.adapters,
                           "rank": a.rank, "gen": a.gen, "adapter_dtype": a.adapter_dtype, "cpu": cpu_name(), "commit": commit}, f, indent=1)
    finally:
        if srv and srv.poll() is None:
            srv.terminate()
            srv.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
