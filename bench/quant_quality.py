#!/usr/bin/env python3
"""Quantization quality on real trained models (issues 6 and 12; docs/quantization-report.md).

    .venv/bin/python bench/quant_quality.py --model smollm2 [--bin build/bin/larder] [--work DIR]
        [--ctx 256] [--chunks 16] [--calib-samples 1] [--calib-length 128] [--json-out FILE]
    .venv/bin/python bench/quant_quality.py --model stories260k [--group 64] [--ctx 256] [--chunks 60] ...

--model smollm2 (the report's model; SmolLM2-135M-Instruct, 30 blocks, 211 quantizable modules):
1. scripts/gguf_to_hf.py turns .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch_models.sh)
   into a bf16 HF directory — the source of every variant (its weights are the Q4_1 release's
   values rounded to bf16; the variants are judged against that source, not against the
   unreleased original).
2. Evaluation texts, both disjoint from the calibration text (larder's built-in corpus):
   (a) prose: tinyshakespeare from 100 kB on; (b) technical English + markdown + code: this
   repository's README.md and docs/*.md.
3. Variants at group 64: uniform 3/4-bit; mixed precision at 3.0 / 4.0 nominal bits over the block
   linears from one calibration-KL sensitivity table (--candidate-bits 2,3,4,6, --calib-samples x
   --calib-length tokens: cut from the defaults 8 x 256 to stay affordable on 2 cores), with the
   default boundary protection (first/last block x100: 2 of 30 blocks here). No --rotate rows
   (rotation is measured separately: docs/quantization-report.md, finding 3).
4. `larder eval kl SOURCE VARIANT` on both texts.

--model stories260k: the issue-6 protocol (the earlier version of the report):

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
MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(ROOT, ".cache", "models")
SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def sh(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return p


def spearman(a, b):
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def variant_dir(work, name):
    return os.path.join(work, name.replace(" ", "_").replace("(", "").replace(")", ""))


def smollm2(a):
    """The 135M report: see the module docstring."""
    os.makedirs(a.work, exist_ok=True)
    base = os.path.join(a.work, "smollm2-hf-bf16")
    t0 = time.time()
    sh([sys.executable, os.path.join(ROOT, "scripts/gguf_to_hf.py"), base, "--gguf", os.path.join(MODELS, SMOL_GGUF),
        "--dtype", "bf16", "--if-stale"])
    print(f"source: {base} ({time.time() - t0:.0f} s)", file=sys.stderr)
    texts = {}
    with open(os.path.join(SHARED, "corpora/tinyshakespeare.txt"), encoding="utf-8") as f:
        texts["shakespeare"] = f.read()[100000:300000]
    docs = [os.path.join(ROOT, "README.md")] + sorted(
        os.path.join(ROOT, "docs", n) for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md")
        and n != "quantization-report.md")  # the report quotes numbers this run produces
    texts["docs"] = "\n\n".join(open(d, encoding="utf-8").read() for d in docs)
    paths = {}
    for k, v in texts.items():
        paths[k] = os.path.join(a.work, k + ".txt")
        with open(paths[k], "w", encoding="utf-8") as f:
            f.write(v)

    calib = ["--candidate-bits", "2,3,4,6", "--calibration-samples", str(a.calib_samples),
             "--calibration-length", str(a.calib_length)]
    variants = [("uniform 3-bit", ["--bits", "3"]), ("uniform 4-bit", ["--bits", "4"]),
                ("mixed 3.0 (KL)", ["--bits", "3", "--target-bpw", "3.0"] + calib),
                ("mixed 4.0 (KL)", ["--bits", "4", "--target-bpw", "4.0"] + calib)]
    # No --rotate rows: rotation is measured separately (docs/quantization-report.md, finding 3).
    rows, sens = [], None
    for name, args in variants:
        d = variant_dir(a.work, name)
        extra = ["--reuse-sensitivity", sens] if sens and "--target-bpw" in args else []
        shutil.rmtree(d, ignore_errors=True)
        t0 = time.time()
        q = sh([a.bin, "quantize", base, d, "--group-size", "64", *args, *extra])
        r = {"name": name, "args": args + extra, "quantize_seconds": time.time() - t0}
        nominal = [l for l in q.stderr.replace("\r", "\n").splitlines() if "nominal" in l and "stored" in l]
        r["bpw_line"] = nominal[-1] if nominal else ""
        sj = os.path.join(d, "sensitivity.json")
        if os.path.exists(sj):
            with open(sj) as f:
                rep = json.load(f)
            r["block_bpw"] = rep["allocation"]["achieved_bpw"]
            if not sens:
                sens = sj
                r["sensitivity_seconds"] = rep.get("seconds")
        for label, txt in paths.items():
            t0 = time.time()
            e = json.loads(sh([a.bin, "eval", "kl", base, d, "--text", txt, "--ctx", str(a.ctx), "--chunks",
                               str(a.chunks), "--json"] + ([] if label == "docs" else ["--no-sanity"])).stdout)
            e["seconds"] = time.time() - t0
            r[label] = e
        rows.append(r)
        print(f"{name}: KL {r['shakespeare']['kl']['mean']:.4f} / {r['docs']['kl']['mean']:.4f} "
              f"({r['quantize_seconds']:.0f} s quantize)", file=sys.stderr)
        if a.json_out:  # partial results survive an interrupted run
            with open(a.json_out, "w") as f:
                json.dump({"rows": rows}, f, indent=1)

    print(f"# Quantization quality on SmolLM2-135M-Instruct (group 64, eval ctx {a.ctx}, {a.chunks} chunks per text)\n")
    print("| variant | block-linear bpw | all quantized bpw | Shakespeare KL mean | p99 | top-1 | ln PPL ratio | "
          "docs KL mean | p99 | top-1 | ln PPL ratio | sanity prefix / short / collapsed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s, k = r["shakespeare"], r["docs"]
        bpw = r["bpw_line"].split("nominal")[1].split(",")[0].strip() if "nominal" in r["bpw_line"] else "?"
        san = k.get("sanity") or {}
        print(f"| {r['name']} | {r.get('block_bpw', float('nan')):.3f} | {bpw} | {s['kl']['mean']:.4f} ± {s['kl']['mean_se']:.4f} | "
              f"{s['kl']['p99']:.3f} | {100 * s['top1']:.1f}% | {s['ln_ppl_ratio']:.4f} | "
              f"{k['kl']['mean']:.4f} ± {k['kl']['mean_se']:.4f} | {k['kl']['p99']:.3f} | {100 * k['top1']:.1f}% | "
              f"{k['ln_ppl_ratio']:.4f} | {san.get('mean_identical_prefix', 0):.1f} / {san.get('cand_short', 0)} / "
              f"{san.get('collapsed', 0)} |")
    print(f"\nscored tokens: Shakespeare {rows[0]['shakespeare']['n_tokens']}, docs {rows[0]['docs']['n_tokens']}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["smollm2", "stories260k"], default="smollm2")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/bin/larder"))
    ap.add_argument("--work", default="/tmp/larder-quant-quality")
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--chunks", type=int)
    ap.add_argument("--stories", type=int, default=150)
    ap.add_argument("--calib-samples", type=int, default=1)
    ap.add_argument("--calib-length", type=int, default=128)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    if a.model == "smollm2":
        a.chunks = a.chunks or 16
        return smollm2(a)
    a.chunks = a.chunks or 60
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
