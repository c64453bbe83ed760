#!/usr/bin/env python3
"""Prompt-lookup speculation A/B (issue 44): decode tok/s of `larder generate --chat --temp 0`
with and without `--spec ngram`, on prompts whose answers repeat their input.

    .venv/bin/python bench/spec_ab.py MODEL [--rounds 5] [-n 128] [-t 2] [--draft-max 6]

The two variants alternate (reversed every other round) so a neighbour's load falls on both;
prints every run, then per prompt and variant the median decode tok/s, the acceptance and
whether the two outputs were identical."""
import argparse
import os
import re
import statistics
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS = {
    "list": "Repeat this list exactly, one item per line: apple, banana, cherry, date, elderberry, fig, grape, "
            "honeydew, kiwi, lemon, mango, nectarine, orange, papaya, quince, raspberry.",
    "code": "Rewrite this Python function with type hints, changing nothing else:\n\n"
            "def add_all(values, start):\n    total = start\n    for v in values:\n        total = total + v\n"
            "    return total\n\ndef mean(values):\n    if not values:\n        return 0\n"
            "    return add_all(values, 0) / len(values)\n",
    "free": "Write a short story about a lighthouse keeper.",
}


def run(binary, model, prompt, n, threads, extra):
    p = subprocess.run([binary, "generate", model, "--chat", "-p", prompt, "--temp", "0", "-n", str(n), "-t",
                        str(threads), *extra], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    tps = float(re.search(r"generated \d+ tokens in [\d.]+ s \(([\d.]+) tok/s\)", p.stderr).group(1))
    m = re.search(r"spec: drafted (\d+), accepted (\d+)", p.stderr)
    return tps, p.stdout, (int(m.group(1)), int(m.group(2))) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--bin", default=os.path.join(HERE, "../build/bin/larder"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--draft-max", type=int, default=6)
    a = ap.parse_args()
    variants = {"plain": [], "spec": ["--spec", "ngram", "--draft-max", str(a.draft_max)]}
    for name, prompt in PROMPTS.items():
        res = {v: [] for v in variants}
        outs = {v: set() for v in variants}
        spec = None
        for r in range(a.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for v in order:
                tps, out, s = run(a.bin, a.model, prompt, a.n, a.t, variants[v])
                res[v].append(tps)
                outs[v].add(out)
                spec = s or spec
                print(f"{name} round {r} {v}: {tps:.1f} tok/s" + (f" drafted/accepted {s}" if s else ""), flush=True)
        same = outs["plain"] == outs["spec"] and len(outs["plain"]) == 1
        mp, ms = statistics.median(res["plain"]), statistics.median(res["spec"])
        print(f"== {name}: plain {mp:.1f} tok/s, spec {ms:.1f} tok/s ({ms / mp:.2f}x), drafted/accepted {spec}, "
              f"identical output: {same}")


if __name__ == "__main__":
    main()
