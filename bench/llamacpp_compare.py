#!/usr/bin/env python3
"""Alternating larder / llama.cpp timing driver; run it through bench/llamacpp_compare.sh.

    bench/llamacpp_compare.py --from-raw RUN/raw.jsonl   # tables again, also from an interrupted run

Each round runs, for every model and thread count, the engines one after the other on the same
work (pp<P> and tg<N>, each engine's own warm-up then one timed repeat):

    larder gguf-Q4_0, llama.cpp Q4_0, larder mlx-q4g64, larder gguf-Q8_0, llama.cpp Q8_0,
    larder mlx-q8g64, larder hf-bf16, llama.cpp BF16

(only the requested cases; a llama.cpp run serves both cases of its quantization in that round).
With -d DEPTH both engines run their tests after DEPTH tokens of context (llama-bench -d; each
engine prefills the context untimed, once per run), at their default KV cache type (f16 for
both), and the decode rows show the KV bytes a step reads beside the weights; -p 0 skips pp (a
deep context is minutes of prefill per engine and run). --lock FILE takes `flock -x FILE` around
each engine run (not the whole round), so builds of others can run between them; --gate FILE is
held while waiting for it, so that new shared holders queue behind the run.
The order is reversed on every other round so neither engine always runs first. Reported: medians
over rounds, spread (min..max over rounds), and larder/llama.cpp ratios of the medians plus the
range of the per-round ratios (each round's larder run against the llama.cpp run next to it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_models  # noqa: E402

# case -> (larder format, llama.cpp format)
CASES = {
    "gguf-Q4_0": ("gguf-Q4_0", "gguf-Q4_0"),
    "mlx-q4g64": ("mlx-q4g64", "gguf-Q4_0"),
    "gguf-Q8_0": ("gguf-Q8_0", "gguf-Q8_0"),
    "mlx-q8g64": ("mlx-q8g64", "gguf-Q8_0"),
    "bf16": ("hf-bf16", "gguf-BF16"),
    # --models entries that are .gguf paths (real models): that same file in both engines
    "file": ("file", "file"),
}
# The GGUF types llama.cpp's own llama-quantize makes from the BF16 GGUF (llamacpp_compare.sh), the
# same file run by both engines: the mixes people download (Q4_K_M = Q4_K + Q6_K, Q3_K_M, Q5_K_M, Q2_K
# with its Q3_K/Q4_K tensors), the single-type formats of issue 12, and F16 (the unquantized
# half-precision file llama.cpp's converter writes by default).
QUANTIZED = ["Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "F16"]
for _q in QUANTIZED:
    CASES[f"gguf-{_q}"] = (f"gguf-{_q}", f"gguf-{_q}")
ORDER = (["gguf-Q4_0", "mlx-q4g64", "gguf-Q4_K_M", "gguf-Q8_0", "mlx-q8g64", "bf16"]
         + [f"gguf-{q}" for q in QUANTIZED if q != "Q4_K_M"] + ["file"])


def is_file_model(model: str) -> bool:
    return model.endswith(".gguf")


class Busy:
    """--busy N: N busy-loop processes (`nice -n 0`, not pinned: the scheduler places them like any
    other load) kept running while the engines run, so a core is taken from under both."""

    def __init__(self, n: int):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def log(msg: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S', time.gmtime())}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def machine() -> dict:
    info: dict = {"kernel": platform.release()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        kv = dict(re.findall(r"^([^:]+):\s*(.*)$", out, re.M))
        flags = kv.get("Flags", "").split()
        info["cpu"] = kv.get("Model name", "?")
        info["cpus"] = kv.get("CPU(s)", "?")
        info["threads_per_core"] = kv.get("Thread(s) per core", "?")
        info["l3"] = kv.get("L3 cache", "?")
        info["hypervisor"] = kv.get("Hypervisor vendor", "")
        keep = ["avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                "avx_vnni", "amx_int8"]
        info["flags"] = " ".join(f for f in keep if f in flags) or "?"
        info["flags_missing"] = " ".join(f for f in keep if f not in flags)
    except OSError:
        pass
    try:
        mem = Path("/proc/meminfo").read_text().split("\n")[0].split()[1]
        info["mem_gb"] = round(int(mem) / 1e6, 1)
    except OSError:
        pass
    return info


def run_json(cmd: list[str], timeout: int) -> tuple[object | None, str, float]:
    t = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timeout", time.time() - t
    dt = time.time() - t
    if r.returncode != 0:
        return None, f"rc={r.returncode}: {(r.stderr or r.stdout)[-1500:]}", dt
    try:
        return json.loads(r.stdout), "", dt
    except ValueError:
        return None, f"bad json: {r.stdout[-500:]}", dt


def larder_run(args, path: Path, threads: int, roofline: bool) -> dict:
    cmd = args.prefix + [args.larder, "bench", str(path), "-p", str(args.p), "-n", str(args.n), "-t", str(threads), "-r", "1", "--json"]
    if args.d:
        cmd += ["-d", str(args.d)]
    if not roofline:
        cmd.append("--no-roofline")
    if args.profile:
        cmd.append("--profile")
    j, err, dt = run_json(cmd, args.timeout)
    rec = {"engine": "larder", "cmd": " ".join(cmd), "wall_s": round(dt, 1)}
    if j is None:
        rec["error"] = err
        return rec
    roof = j.get("roofline") or {}
    if args.p > 0:
        rec["pp"] = j["pp"]["tok_s"]
    rec.update(tg=j["tg"]["tok_s"], read_gbs=roof.get("read_gbs") if roofline else None,
               kv_read_gbs=j["tg"].get("kv_read_gbs"), kv_dtype=j.get("kv_dtype"),
               int8_gops=roof.get("int8_gops") if roofline else None,
               weights=j.get("weights"), kernels=j.get("kernels"), weight_bytes_per_token=j.get("weight_bytes_per_token"),
               tg_gbs=j["tg"].get("gbs"), pp_gops=j["pp"].get("gops"), raw=j)
    if args.p == 0:
        rec.pop("pp", None)
    return rec


def llama_run(args, path: Path, threads: int, roofline: bool = False) -> dict:
    cmd = args.prefix + [args.llama_bench, "-m", str(path), "-p", str(args.p), "-n", str(args.n), "-t", str(threads), "-r", "1",
           "-o", "json"]
    if args.d:
        cmd += ["-d", str(args.d)]
    j, err, dt = run_json(cmd, args.timeout)
    rec = {"engine": "llama.cpp", "cmd": " ".join(cmd), "wall_s": round(dt, 1)}
    if j is None:
        rec["error"] = err
        return rec
    for t in j:
        if t.get("n_prompt", 0) > 0 and t.get("n_gen", 0) == 0:
            rec["pp"] = t["avg_ts"]
        elif t.get("n_gen", 0) > 0 and t.get("n_prompt", 0) == 0:
            rec["tg"] = t["avg_ts"]
    if j:
        t = j[0]
        rec.update(build_commit=t.get("build_commit"), build_number=t.get("build_number"), type_k=t.get("type_k"),
                   flash_attn=t.get("flash_attn"), n_batch=t.get("n_batch"), n_ubatch=t.get("n_ubatch"),
                   use_mmap=t.get("use_mmap"), backends=t.get("backends"), cpu_info=t.get("cpu_info"),
                   model_type=t.get("model_type"), model_size=t.get("model_size"))
    rec["raw"] = j
    return rec


def fmt_stat(xs: list[float]) -> str:
    if not xs:
        return "—"
    if len(xs) == 1:
        return f"{xs[0]:.1f}"
    return f"{statistics.median(xs):.1f} [{min(xs):.1f}–{max(xs):.1f}]"


def table(results: dict, meta: dict, models: list[str], threads: list[int], cases: list[str], p: int, n: int,
          rounds: int, version: str, d: int = 0) -> tuple[list[str], list[dict]]:
    lines = []
    at = f" @ d{d}" if d else ""
    lines.append(f"larder {meta['larder_commit']} ({meta.get('larder')}) vs llama-bench from the llama-cpp-python "
                 f"sdist ({version}); {rounds} rounds, alternating; pp{p} / tg{n}{at}; tok/s median [min–max over rounds]")
    lines.append("")
    lines.append("| model | threads | larder weights | llama.cpp weights | test | larder tok/s | llama.cpp tok/s | ratio (medians) | per-round ratios | decode weight GB/s = % of measured read BW |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    bw: dict[int, list[float]] = {}
    for (model, t, eng, fmt), recs in results.items():
        if eng == "larder":
            bw.setdefault(t, []).extend(x["read_gbs"] for x in recs if x.get("read_gbs"))
    summary = []
    for model in models:
        for t in threads:
            bw_t = statistics.median(bw[t]) if bw.get(t) else None
            for c in cases:
                lf, gf = CASES[c]
                L = results.get((model, t, "larder", lf), [])
                G = results.get((model, t, "llama.cpp", gf), [])
                for test in [x for x, k in (("pp", p), ("tg", n)) if k > 0]:
                    lx = [x[test] for x in L if test in x]
                    gx = [x[test] for x in G if test in x]
                    ratio = statistics.median(lx) / statistics.median(gx) if lx and gx else None
                    pr = [a[test] / b[test] for a in L for b in G
                          if a["round"] == b["round"] and test in a and test in b]
                    extra = ""
                    kv = [x["kv_read_gbs"] for x in L if x.get("kv_read_gbs")]
                    if test == "tg" and lx and bw_t:
                        wb = next((x["weight_bytes_per_token"] for x in L if x.get("weight_bytes_per_token")), None)
                        # llama.cpp reads the GGUF's bytes: larder's count for that same file, when it ran it
                        gwb = next((x["weight_bytes_per_token"] for x in results.get((model, t, "larder", gf), [])
                                    if x.get("weight_bytes_per_token")), None)
                        if wb:
                            gbs = statistics.median(lx) * wb / 1e9
                            extra = f"{gbs:.1f} GB/s = {100 * gbs / bw_t:.0f} %"
                        if gwb and gx:
                            g = statistics.median(gx) * gwb / 1e9
                            extra += f" (llama.cpp {g:.1f} GB/s = {100 * g / bw_t:.0f} %)"
                        if kv:
                            kvd = next((x.get("kv_dtype") for x in L if x.get("kv_dtype")), "?")
                            extra += f"; + KV ({kvd}) read {statistics.median(kv):.1f} GB/s by larder"
                    if not lx and not gx:
                        continue
                    name = {"pp": f"pp{p}", "tg": f"tg{n}"}[test] + at
                    lines.append(f"| {Path(model).name} | {t} | {lf} | {gf} | {name} | {fmt_stat(lx)} | {fmt_stat(gx)} | "
                                 f"{'%.2f×' % ratio if ratio else '—'} | "
                                 f"{('%.2f–%.2f' % (min(pr), max(pr))) if pr else '—'} | {extra} |")
                    summary.append(dict(model=model, threads=t, case=c, test=name, larder=lx, llamacpp=gx, ratio=ratio,
                                        per_round=pr))
    lines.append("")
    for t in threads:
        if bw.get(t):
            lines.append(f"larder roofline read bandwidth, {t} thread(s): median {statistics.median(bw[t]):.1f} GB/s "
                         f"[{min(bw[t]):.1f}–{max(bw[t]):.1f}] over {len(bw[t])} larder runs")
    lines.append(f"load average: start {meta['load_start']}; end {meta['load_end']}; {meta['minutes']} min"
                 + (f"; {meta['busy']} busy-loop process(es) running during every run" if meta.get("busy") else ""))
    return lines, summary


def from_raw(path: Path) -> int:
    """Tables from a raw.jsonl, also a partial one (an interrupted run)."""
    meta: dict = {}
    results: dict = {}
    for line in open(path):
        d = json.loads(line)
        if "meta" in d:
            meta = d["meta"]
        elif "meta_end" in d:
            meta = d["meta_end"]
        elif "engine" in d:
            results.setdefault((d["model"], d["threads"], d["engine"], d["format"]), []).append(d)
    if not meta:
        print(f"{path}: no meta line", file=sys.stderr)
        return 1
    argv = meta.get("argv", [])

    def opt(name: str, default: str) -> str:
        return argv[argv.index(name) + 1] if name in argv else default

    recs = [x for v in results.values() for x in v]
    models = list(dict.fromkeys(x["model"] for x in recs))
    threads = list(dict.fromkeys(x["threads"] for x in recs))
    fmts = {x["format"] for x in recs if x["engine"] == "larder"}
    cases = [c for c in ORDER if CASES[c][0] in fmts]
    rounds = 1 + max((x["round"] for x in recs), default=0)
    meta.setdefault("load_end", "?")
    meta.setdefault("minutes", "?")
    lines, _ = table(results, meta, models, threads, cases, int(opt("-p", "512")), int(opt("-n", "128")), rounds,
                     opt("--llama-cpp-version", "?"), int(opt("-d", "0")))
    if "meta_end" not in open(path).read():
        lines.insert(1, f"(partial run: {len(recs)} engine runs recorded; the last round may be incomplete)")
    print("\n".join(lines))
    return 0


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--from-raw":
        return from_raw(Path(sys.argv[2]))

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--larder", required=True)
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--llama-cpp-version", default="?")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1 2")
    ap.add_argument("--models", default="llama1b")
    ap.add_argument("--cases", default=" ".join(ORDER))
    ap.add_argument("--out", required=True)
    ap.add_argument("--models-dir", default=os.path.expanduser("~/.cache/larder-bench/models"))
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-d", type=int, default=0, help="tokens of context before each test (llama-bench -d)")
    ap.add_argument("--lock", default="", help="flock -x this file around each engine run")
    ap.add_argument("--gate", default="", help="with --lock: hold flock -x on this file while waiting for the lock, "
                                               "so new shared holders queue behind the run (flock has no writer preference)")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--wait-load", type=float, default=0.0,
                    help="before each run, wait (up to --wait-max s) until the 1-min load average is below this")
    ap.add_argument("--wait-max", type=float, default=60.0)
    ap.add_argument("--nice", type=int, default=0, help="run both engines under `nice -n N` (0: not niced)")
    ap.add_argument("--busy", type=int, default=0, help="keep N busy-loop processes running during every run")
    ap.add_argument("--profile", action="store_true", help="larder bench --profile (per-op table kept in raw.jsonl)")
    args = ap.parse_args()

    args.prefix = ((["flock", "-x", args.gate] if args.gate and args.lock else []) + (["flock", "-x", args.lock] if args.lock else [])
                   + (["nice", "-n", str(args.nice)] if args.nice else []))
    threads = [int(t) for t in args.threads.replace(",", " ").split()]
    models = args.models.replace(",", " ").split()
    cases = [c for c in ORDER if c in args.cases.replace(",", " ").split()]
    if any(is_file_model(m) for m in models):
        cases = ["file"]
    bad = set(args.cases.replace(",", " ").split()) - set(CASES)
    if bad:
        ap.error(f"unknown cases {sorted(bad)}; have {ORDER}")
    root = Path(args.models_dir)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = open(out / "raw.jsonl", "a")

    commit = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "status", "--porcelain", "--", "src",
                            "tools"], capture_output=True, text=True).stdout.strip()
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "larder": args.larder,
            "larder_commit": commit + (" (src/tools modified in worktree)" if dirty else ""),
            "llama_bench": args.llama_bench, "llama_cpp_python": args.llama_cpp_version, "machine": machine(),
            "argv": sys.argv, "load_start": Path("/proc/loadavg").read_text().strip(), "busy": args.busy}
    raw.write(json.dumps({"meta": meta}) + "\n")
    log(f"machine: {meta['machine']}")

    # one round's sequence of (model, threads, engine, format)
    seq: list[tuple[str, int, str, str]] = []
    for model in models:
        for t in threads:
            done_llama: set[str] = set()
            for c in cases:
                lf, gf = CASES[c]
                seq.append((model, t, "larder", lf))
                if gf not in done_llama:
                    seq.append((model, t, "llama.cpp", gf))
                    done_llama.add(gf)
    results: dict[tuple[str, int, str, str], list[dict]] = {}
    t_start = time.time()
    probed: set[tuple[int, int]] = set()
    for r in range(args.rounds):
        order = seq if r % 2 == 0 else list(reversed(seq))
        for model, t, eng, fmt in order:
            path = Path(model) if is_file_model(model) else make_models.target_of(root, model, fmt)
            if args.wait_load > 0:
                w0 = time.time()
                while loadavg() >= args.wait_load and time.time() - w0 < args.wait_max:
                    time.sleep(5)
            load = Path("/proc/loadavg").read_text().split()[:3]
            # larder's roofline probe (~5-20 s) runs once per round and thread count: its first larder run
            probe = eng == "larder" and (r, t) not in probed
            if probe:
                probed.add((r, t))
            busy = Busy(args.busy) if args.busy else None
            try:
                rec = (larder_run if eng == "larder" else llama_run)(args, path, t, probe)
            finally:
                if busy:
                    busy.close()
            rec.update(round=r, model=model, threads=t, format=fmt, load=load,
                       time=time.strftime("%H:%M:%S", time.gmtime()))
            raw.write(json.dumps(rec) + "\n")
            raw.flush()
            results.setdefault((model, t, eng, fmt), []).append(rec)
            if "error" in rec:
                log(f"round {r + 1} {model} t{t} {eng} {fmt}: ERROR {rec['error'][:300]}")
            else:
                log(f"round {r + 1} {model} t{t} {eng:9s} {fmt:10s} pp {rec.get('pp', 0):7.1f} tg {rec.get('tg', 0):6.1f}"
                    f" ({rec['wall_s']:.0f} s, load {load[0]})" + (f" read {rec['read_gbs']:.1f} GB/s" if rec.get("read_gbs") else ""))
    meta["load_end"] = Path("/proc/loadavg").read_text().strip()
    meta["minutes"] = round((time.time() - t_start) / 60, 1)

    lines, summary = table(results, meta, models, threads, cases, args.p, args.n, args.rounds, args.llama_cpp_version,
                           args.d)
    text = "\n".join(lines)
    print(text)
    (out / "summary.md").write_text(text + "\n")
    raw.write(json.dumps({"meta_end": meta, "summary": summary}) + "\n")
    raw.close()
    log(f"raw: {out / 'raw.jsonl'}")
    errors = [x for v in results.values() for x in v if "error" in x]
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
