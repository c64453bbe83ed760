#!/usr/bin/env python3
"""Speculative decoding on the three workloads of issue 44, through `larder bench --spec`:

  rewrite  rewrite a ~300-line source file (src/larder/runtime/sampler.cpp) with one small change
  quote    answer a question about a ~2k-token document (docs/kv-store-format.md, cut) by quoting it
  chat     free-form chat (a short story)

    .venv/bin/python bench/spec_workloads.py TARGET [--draft DRAFT] [--spec draft|ngram] [-n 128] [-r 3] [-t 2]

Each workload is one `larder bench TARGET --spec ... --spec-prompt FILE -n N -r R --json`: greedy
decode of N tokens with and without speculation in alternating rounds (the order reversed every
other round), medians, the speedup as the median of per-round ratios, the acceptance, and whether
the outputs were the same tokens. Extra arguments after `--` go to larder (e.g. --draft-max 8)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")


def prompts():
    src = open(os.path.join(ROOT, "src/larder/runtime/sampler.cpp")).read()
    doc_words = open(os.path.join(ROOT, "docs/kv-store-format.md")).read().split(" ")
    doc = " ".join(doc_words[:1100])  # ~2k tokens (Qwen2.5)
    return {
        "rewrite": "Rewrite this C++ file with the namespace `larder::runtime` renamed to `larder::rt`. Change "
                   "nothing else and print the whole file.\n\n```cpp\n" + src + "```\n",
        "quote": "Here is a document.\n\n" + doc + "\n\nQuote, word for word, what the document says about the "
                 "directory layout and which files the cache owns.",
        "chat": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("--draft", default="")
    ap.add_argument("--spec", default="")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/bin/larder"))
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated workloads")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    spec = a.spec or ("draft" if a.draft else "ngram")
    with tempfile.TemporaryDirectory(prefix="larder-spec-") as tmp:
        for name, text in prompts().items():
            if a.only and name not in a.only.split(","):
                continue
            path = os.path.join(tmp, name + ".txt")
            with open(path, "w") as f:
                f.write(text)
            cmd = [a.bin, "bench", a.target, "--spec", spec, *(["--draft", a.draft] if a.draft else []),
                   "--spec-prompt", path, "-n", str(a.n), "-r", str(a.r), "-t", str(a.t), "--json", *a.extra]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode not in (0, 1) or not p.stdout.strip():
                print(f"{name}: failed ({p.returncode}): {p.stderr.strip()}", file=sys.stderr)
                continue
            j = json.loads(p.stdout.strip().splitlines()[-1])
            print(f"{name}: {json.dumps(j)}", flush=True)


if __name__ == "__main__":
    main()
