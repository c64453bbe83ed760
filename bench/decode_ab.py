#!/usr/bin/env python3
"""Decode A/B on a host whose memory a neighbour loads on and off.

    .venv/bin/python bench/decode_ab.py --model MODEL [--rounds 10] [-n 32] [-t 2] [-r 3]
        [--idle 50] [--loaded 42] NAME=[BIN=path,][ARGS=flags,][ENV=value,...] NAME=...

Each variant is a `larder bench MODEL -p 0 -n N -t T -r R --json` run with its own binary (BIN=,
default build/bin/larder), environment (e.g. LARDER_ISA=avx2, LARDER_DECODE_TILES=generic) and
extra `larder bench` flags (ARGS=, split at spaces: "nommap=ARGS=--no-mmap").
The variants alternate, in reverse order every other round. `larder bench` reports each decode
run as a % of the read probe and the probes taken before and after it; a run counts as
**idle** when both of its probes are >= --idle GB/s, **loaded** when both are < --loaded, and as
neither when the neighbour switched during it. Decode at the bandwidth limit and decode that is
not differ most on the idle host, and there are only short idle windows on a shared one, so
medians are given per class with their run counts: compare a variant's idle median with
another's only when both have several idle runs.

Prints one line per run (tok/s and every run's % of the probe with its class and probe range),
then per variant: idle / loaded / mixed medians (count, range).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def parse_variant(spec, default_bin):
    name, _, rest = spec.partition("=")
    env, binary, args = dict(os.environ), default_bin, []
    for kv in filter(None, rest.split(",")):
        k, _, v = kv.partition("=")
        if k == "BIN":
            binary = v
        elif k == "ARGS":
            args += v.split()
        else:
            env[k] = v
    return name, binary, env, args


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--bin", default="build/bin/larder", help="binary of variants without BIN=")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("-n", type=int, default=32, help="decode tokens per run")
    ap.add_argument("-t", type=int, default=2, help="threads")
    ap.add_argument("-r", type=int, default=3, help="runs per larder bench call")
    ap.add_argument("--idle", type=float, default=50.0, help="GB/s: both probes at least this = idle")
    ap.add_argument("--loaded", type=float, default=42.0, help="GB/s: both probes below this = loaded")
    ap.add_argument("variants", nargs="+", metavar="NAME=[BIN=path,][ARGS=flags,][ENV=value,...]")
    a = ap.parse_args()
    variants = [parse_variant(v, a.bin) for v in a.variants]
    runs = {name: {"idle": [], "loaded": [], "mixed": []} for name, _, _, _ in variants}
    for rd in range(a.rounds):
        for name, binary, env, args in variants if rd % 2 == 0 else variants[::-1]:
            cmd = [binary, "bench", a.model, "-p", "0", "-n", str(a.n), "-t", str(a.t), "-r", str(a.r), "--json"] + args
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode != 0 or "{" not in p.stdout:
                sys.exit(f"{name}: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
            tg = json.loads(p.stdout[p.stdout.index("{"):])["tg"]
            probes = tg["probe_gbs_beside_runs"]
            cells = []
            for i, pct in enumerate(tg["pct_bandwidth_runs"]):
                lo, hi = sorted((probes[i], probes[i + 1]))
                cls = "idle" if lo >= a.idle else "loaded" if hi < a.loaded else "mixed"
                runs[name][cls].append(pct)
                cells.append(f"{pct:.1f}%({cls[0]},{lo:.0f}-{hi:.0f})")
            print(f"round {rd} {name:12s} tg {tg['tok_s']:.2f} " + " ".join(cells), flush=True)

    def med(xs):
        return f"{statistics.median(xs):.1f}% (n={len(xs)}, {min(xs):.1f}-{max(xs):.1f})" if xs else "-"

    for name, r in runs.items():
        print(f"{name:12s} idle {med(r['idle'])} | loaded {med(r['loaded'])} | mixed {med(r['mixed'])}")


if __name__ == "__main__":
    main()
