#!/usr/bin/env python3
"""Constrained-decoding overhead (issue 15, "Overhead"), larder vs llama-server on the same GGUF.

    flock -x /work/notes/cpu.lock python3 bench/grammar_bench.py \
        --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf [--qwen-dir DIR] [--rounds 3] [--json-out F]

1. Decode tok/s with and without a JSON-schema constraint at batch 1 and batch 8 (`--parallel 8`
   / `-np 8`, 8 concurrent /completion requests), each server in turn, modes alternated per
   round (free, schema, free, schema, ...). Every request decodes exactly --gen tokens: free text
   has EOS suppressed by logit_bias; the schema (LONG_SCHEMA: an array of at least 64 small
   objects) cannot be finished within --gen tokens, so the grammar never lets EOS through either.
   Per-request decode tok/s is the server's own timings.predicted_per_second (both servers report
   it); the table gives the median over requests and rounds, and overhead = 1 - schema / free.
2. Mask time per token (p50/p99) and compile time per schema: tools/grammar_bench replays the
   answers of a schema-corpus run (tests/server/schema_corpus.py) through the exact calls the
   engine makes, on SmolLM2's 49k vocabulary and (with --qwen-dir) a Qwen3 151k vocabulary.
3. Compile time as a client sees it, both servers: time to the first token of a 1-token
   /completion with the schema minus the same without (median over the corpus schemas both accept).

Run it under the exclusive CPU lock; `uptime` load is recorded with every result.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests/server"))
import schema_corpus  # noqa: E402

LONG_SCHEMA = {"type": "array", "minItems": 64, "items": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                     "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                     "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}}
PROMPT = "<|im_start|>user\nList people as JSON.<|im_end|>\n<|im_start|>assistant\n"


def load():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, cmd, log):
        self.port = free_port()
        self.cmd = [c.replace("PORT", str(self.port)) for c in cmd]
        self.log = open(log, "wb")
        self.p = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"{self.cmd} exited; see {log}")
            try:
                if self.post("/health", None, method="GET")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.cmd} not healthy")

    def post(self, path, body, method="POST", timeout=600):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=json.dumps(body) if body is not None else None,
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            try:
                return r.status, json.loads(data)
            except ValueError:
                return r.status, data
        finally:
            c.close()

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
        self.log.close()


def decode_round(srv, batch, schema, gen, eos_ids, seed):
    body = {"prompt": PROMPT, "n_predict": gen, "temperature": 0.8, "seed": seed, "cache_prompt": False}
    if schema is None:
        body["logit_bias"] = {str(i): -100 for i in eos_ids}  # never EOS: exactly `gen` tokens
    else:
        body["json_schema"] = schema

    def one(i):
        st, r = srv.post("/completion", dict(body, seed=seed * 100 + i))
        if st != 200:
            raise RuntimeError(f"HTTP {st}: {str(r)[:300]}")
        if not isinstance(r, dict) or "timings" not in r:
            raise RuntimeError(f"no timings in {str(r)[:300]}")
        return r["timings"]["predicted_per_second"], r["timings"]["predicted_n"]
    with concurrent.futures.ThreadPoolExecutor(batch) as ex:
        return list(ex.map(one, range(batch)))


def ttft(srv, schema):
    body = {"prompt": PROMPT, "n_predict": 1, "temperature": 0, "cache_prompt": False}
    if schema is not None:
        body["json_schema"] = schema
    t0 = time.perf_counter()
    st, _ = srv.post("/completion", body)
    return st, time.perf_counter() - t0


def servers(a, logdir):
    larder = [a.bin, "serve", a.model, "--host", "127.0.0.1", "--port", "PORT", "--parallel", "8", "--ctx", "1024",
              "--threads", str(a.threads)]
    llama = [a.llama_server, "-m", a.model, "--host", "127.0.0.1", "--port", "PORT", "-np", "8", "-c", "8192",
             "-t", str(a.threads), "--no-webui"]
    return [("larder", larder, os.path.join(logdir, "larder.log")),
            ("llama-server", llama, os.path.join(logdir, "llama.log"))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--bin", default=os.path.join(REPO, "build/bin/larder"))
    ap.add_argument("--grammar-bench", default=os.path.join(REPO, "build/bin/grammar_bench"))
    ap.add_argument("--llama-server",
                    default=os.path.expanduser("~/.cache/larder-bench/llama.cpp-0.3.36/build/bin/llama-server"))
    ap.add_argument("--qwen-dir", help="a tests/server/tiny_qwen3.py checkpoint (151k vocabulary) for the mask timing")
    ap.add_argument("--corpus-json", help="a schema_corpus.py --json result (answers to replay); default: run the CI subset")
    ap.add_argument("--gen", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ttft-schemas", type=int, default=24)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: decode,mask,ttft")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "commit": subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True).stdout.strip(),
           "model": os.path.basename(a.model), "threads": a.threads, "load_before": load()}
    print(json.dumps(out), flush=True)
    logdir = tempfile.mkdtemp(prefix="grammar_bench_")
    eos_ids = [0, 2]  # SmolLM2: <|endoftext|>, <|im_end|>

    if a.corpus_json:
        results = json.load(open(a.corpus_json))["results"]
    else:
        results = None
    corpus = dict(schema_corpus.load())

    if "decode" not in skip:
        dec = {}
        for name, cmd, log in servers(a, logdir):
            srv = Proc(cmd, log)
            try:
                decode_round(srv, 1, None, 8, eos_ids, 0)  # warm-up
                for batch in (1, 8):
                    per = {"free": [], "schema": []}
                    for r in range(a.rounds):
                        for mode in ("free", "schema"):
                            rows = decode_round(srv, batch, LONG_SCHEMA if mode == "schema" else None, a.gen,
                                                eos_ids, r + 1)
                            assert all(n == a.gen for _, n in rows), rows
                            per[mode] += [tps for tps, _ in rows]
                    f, s = statistics.median(per["free"]), statistics.median(per["schema"])
                    dec[f"{name} batch {batch}"] = {"free_tps": round(f, 1), "schema_tps": round(s, 1),
                                                    "overhead_pct": round(100 * (1 - s / f), 1),
                                                    "free_spread": [round(min(per["free"]), 1), round(max(per["free"]), 1)],
                                                    "schema_spread": [round(min(per["schema"]), 1),
                                                                      round(max(per["schema"]), 1)],
                                                    "load": load()}
                    print(json.dumps({f"{name} batch {batch}": dec[f"{name} batch {batch}"]}), flush=True)
                if "ttft" not in skip and results is not None:
                    names = [r["name"] for r in results if r["outcome"] == "validated"][: a.ttft_schemas]
                    diffs, refused = [], 0
                    for n in names:
                        st0, t_free = ttft(srv, None)
                        st1, t_schema = ttft(srv, corpus[n])
                        if st1 != 200:
                            refused += 1
                            continue
                        diffs.append(1000 * (t_schema - t_free))
                    out[f"{name} schema ttft extra ms"] = {"n": len(diffs), "refused": refused,
                                                           "p50": round(statistics.median(diffs), 1),
                                                           "max": round(max(diffs), 1), "load": load()}
                    print(json.dumps({f"{name} schema ttft extra ms": out[f"{name} schema ttft extra ms"]}), flush=True)
            finally:
                srv.stop()
        out["decode"] = dec

    if "mask" not in skip and results is not None:
        cases = os.path.join(logdir, "cases.jsonl")
        with open(cases, "w") as f:
            for r in results:
                if r["outcome"] == "validated":
                    f.write(json.dumps({"schema": corpus[r["name"]], "text": r["text"]}) + "\n")
        for label, model in (("smollm2 49k", a.model), ("qwen3 151k", a.qwen_dir)):
            if not model:
                continue
            p = subprocess.run([a.grammar_bench, model, cases], capture_output=True, text=True)
            if p.returncode != 0:
                raise RuntimeError(p.stderr)
            out[f"mask {label}"] = json.loads(p.stdout) | {"load": load()}
            print(json.dumps({f"mask {label}": out[f"mask {label}"]}), flush=True)
    out["load_after"] = load()
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
