#!/usr/bin/env python3
"""Quantization quality on the real trained stories260K (issue 6 evidence; docs/quantization-report.md).

    .venv/bin/python bench/quant_quality.py [--bin build/bin/larder] [--work DIR] [--group 64]
        [--ctx 256] [--chunks 60] [--json-out FILE]

1. Converts /work/shared/models/stories260K/stories260K.gguf to an f32 HF directory
   (scripts/stories260k_to_hf.py) — the source of every variant.
2. Evaluation texts, both disjoint from the calibration text (larder's built-in corpus):
   (a) in-domain: stories sampled from the f32 model itself (temperature 1, seeds 1..N, from BOS);
   (b) out-of-domain: the first 200 kB of tinyshakespeare.
3. Variants, all at group size --group: uniform 2/3/4-bit; mixed precision at 3.0 / 3.5 / 4.0
   nominal bits over the block linears, with calibration-KL sensitivity (measured once, then
   --reuse-sensitivity) and with the weight-error proxy, boundary protection off (--protect-blocks 0:
   with 5 blocks, the default x100 on the first and last is 40 % of the network) and, for contrast,
   on; --rotate for uniform 3/4-bit and mixed 3.0.
   embed_tokens / lm_head stay at --bits (3 for targets < 4, else 4) in every variant, so uniform
   b and mixed target b differ only in how the block linears' bits are spread.
4. `larder eval kl BASE VARIANT` on both texts: mean KL, p99, top-1 agreement, PPL ratio, sanity.
5. Rank agreement of the proxy with calibration KL: Spearman rho per width over the probed modules.
Prints a markdown report (and --json-out).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")


def sh(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return p


def spearman(a, b):
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/bin/larder"))
    ap.add_argument("--work", default="/tmp/larder-quant-quality")
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=60)
    ap.add_argument("--stories", type=int, default=150)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    base = os.path.join(a.work, "f32")
    sh([sys.executable, os.path.join(ROOT, "scripts/stories260k_to_hf.py"), base])

    indomain = os.path.join(a.work, "stories.txt")
    with open(indomain, "w") as f:
        for s in range(1, a.stories + 1):
            out = sh([a.bin, "generate", base, "-p", "", "-n", "400", "--temp", "1", "--seed", str(s)]).stdout
            f.write(out.strip() + "\n\n")
    shakes = os.path.join(a.work, "shakespeare.txt")
    with open(os.path.join(SHARED, "corpora/tinyshakespeare.txt"), encoding="utf-8") as f:
        text = f.read()[:200000]
    with open(shakes, "w") as f:
        f.write(text)

    g = str(a.group)
    variants = []  # (name, nominal target, args)
    for b in (2, 3, 4):
        variants.append((f"uniform {b}-bit", b, ["--bits", str(b)]))
    for t in (3.0, 3.5, 4.0):
        bits = "4" if t >= 4 else "3"
        mixed = ["--bits", bits, "--target-bpw", str(t)]
        variants.append((f"mixed {t} (KL)", t, mixed + ["--protect-blocks", "0"]))
        variants.append((f"mixed {t} (KL, boundary x100)", t, mixed))
        variants.append((f"mixed {t} (proxy)", t, mixed + ["--protect-blocks", "0", "--sensitivity", "proxy"]))
    for b in (3, 4):
        variants.append((f"rotated uniform {b}-bit", b, ["--bits", str(b), "--rotate"]))
    variants.append(("rotated mixed 3.0 (KL)", 3.0, ["--bits", "3", "--target-bpw", "3.0", "--rotate", "--protect-blocks", "0"]))

    sens_file = None
    rows = []
    for name, target, args in variants:
        d = os.path.join(a.work, name.replace(" ", "_").replace("(", "").replace(")", ""))
        extra = []
        if "--target-bpw" in args and "--sensitivity" not in args and "--rotate" not in args and sens_file:
            extra = ["--reuse-sensitivity", sens_file]
        t0 = time.time()
        q = sh([a.bin, "quantize", base, d, "--group-size", g, *args, *extra])
        secs = time.time() - t0
        if "--target-bpw" in args and "--sensitivity" not in args and "--rotate" not in args and not sens_file:
            sens_file = os.path.join(d, "sensitivity.json")
        nominal = [l for l in q.stderr.replace("\r", "\n").splitlines() if "nominal" in l and "stored" in l]
        r = {"name": name, "target": target, "quantize_seconds": secs, "bpw_line": nominal[-1] if nominal else ""}
        sj = os.path.join(d, "sensitivity.json")
        if os.path.exists(sj):
            with open(sj) as f:
                r["block_bpw"] = json.load(f)["allocation"]["achieved_bpw"]
        else:
            r["block_bpw"] = float(target)
        for label, txt in (("stories", indomain), ("shakespeare", shakes)):
            e = json.loads(sh([a.bin, "eval", "kl", base, d, "--text", txt, "--ctx", str(a.ctx), "--chunks",
                               str(a.chunks), "--json"] + ([] if label == "stories" else ["--no-sanity"])).stdout)
            r[label] = e
        rows.append(r)
        print(f"{name}: KL {r['stories']['kl']['mean']:.4f} / {r['shakespeare']['kl']['mean']:.4f}", file=sys.stderr)

    # Proxy vs KL rank agreement, from the tables the runs wrote.
    def table(path):
        with open(path) as f:
            rep = json.load(f)
        return {l["name"]: l["kl"] for l in rep["layers"]}
    kl_t = table(sens_file)
    proxy_dir = os.path.join(a.work, "mixed_3.0_proxy")
    px_t = table(os.path.join(proxy_dir, "sensitivity.json"))
    names = sorted(kl_t)
    rho = {}
    for b in ("2", "3", "4", "6", "8"):
        rho[b] = spearman([kl_t[n][b] for n in names], [px_t[n][b] for n in names])

    print(f"# Quantization quality on stories260K (group {a.group}, eval ctx {a.ctx}, {a.chunks} chunks max)\n")
    print("| variant | block-linear bpw | all quantized modules bpw | in-domain KL mean | p99 | top-1 | ln PPL ratio | "
          "Shakespeare KL mean | top-1 | sanity prefix / short / collapsed |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s, k = r["stories"], r["shakespeare"]
        bpw = r["bpw_line"].split("nominal")[1].split(",")[0].strip() if "nominal" in r["bpw_line"] else "?"
        san = s.get("sanity", {})
        print(f"| {r['name']} | {r['block_bpw']:.3f} | {bpw} | {s['kl']['mean']:.4f} ± {s['kl']['mean_se']:.4f} | {s['kl']['p99']:.3f} | "
              f"{100 * s['top1']:.1f}% | {s['ln_ppl_ratio']:.4f} | {k['kl']['mean']:.4f} | {100 * k['top1']:.1f}% | "
              f"{san.get('mean_identical_prefix', 0):.1f} / {san.get('cand_short', 0)} / {san.get('collapsed', 0)} |")
    print("\nSpearman rank correlation, weight-error proxy vs calibration KL over the probed modules: " +
          ", ".join(f"{b}-bit {v:.2f}" for b, v in rho.items()))
    print(f"\nin-domain tokens scored: {rows[0]['stories']['n_tokens']}, Shakespeare: {rows[0]['shakespeare']['n_tokens']}")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"rows": rows, "spearman": rho}, f, indent=1)


if __name__ == "__main__":
    main()
