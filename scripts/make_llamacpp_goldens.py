#!/usr/bin/env python3
"""Regenerates the llama.cpp goldens in tests/goldens/ from llama.cpp's own tools, run on the real
models that scripts/fetch_models.sh fetches. CI never builds llama.cpp: these outputs are
committed, and this script is how they were made (and how to remake them).

  scripts/make_llamacpp_goldens.py tokenize   # llama-tokenize over tests/goldens/tokenize_corpus.json
  scripts/make_llamacpp_goldens.py ppl        # llama-perplexity, fixed text/ctx/chunks
  scripts/make_llamacpp_goldens.py ppl-f32    # the same runs of gemma3, exact f32 math (mlx-lm on
                                              # the dequantized GGUF: tests/ref/gguf_f32_reference.py)
  scripts/make_llamacpp_goldens.py chat       # llama-server greedy chat answers (temperature 0)
  scripts/make_llamacpp_goldens.py requant    # SmolLM2 requantized by llama-quantize, each format's ppl

The tools come from the llama-cpp-python 0.3.36 sdist built by bench/llamacpp_compare.sh into
~/.cache/larder-bench/llama.cpp-0.3.36/build/bin (--bin to change). Every golden records the
tool version and the exact command arguments.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
GOLDENS = os.path.join(ROOT, "tests", "goldens")
LLAMACPP_VERSION = "llama-cpp-python 0.3.36 sdist"
MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}


def models_dir(args):
    return args.models or os.environ.get("LARDER_MODELS_DIR") or os.path.join(ROOT, ".cache", "models")


def write_json(name, obj):
    path = os.path.join(GOLDENS, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(path, ROOT)}")


# ------------------------------------------------------------------------------------ tokenize

def llama_tokenize(bin_dir, model, text, bos):
    cmd = [os.path.join(bin_dir, "llama-tokenize"), "-m", model, "--stdin", "--no-escape", "--ids",
           "--log-disable"]  # special-token strings are parsed by default, as larder tokenize does
    if not bos:
        cmd.append("--no-bos")
    p = subprocess.run(cmd, input=text.encode("utf-8"), capture_output=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"llama-tokenize failed on {text!r}: {p.stderr.decode(errors='replace')[-2000:]}")
    out = p.stdout.decode().strip().splitlines()[-1]
    return json.loads(out)


def cmd_tokenize(args):
    with open(os.path.join(GOLDENS, "tokenize_corpus.json"), encoding="utf-8") as f:
        corpus = json.load(f)["texts"]
    for key, fname in MODELS.items():
        model = os.path.join(models_dir(args), fname)
        cases = []
        for i, text in enumerate(corpus):
            # Every text without BOS; the first few also as the model adds specials (BOS when the
            # GGUF says add_bos_token) — larder tokenize with and without --add-special.
            cases.append({"text": text, "add_special": False, "ids": llama_tokenize(args.bin, model, text, False)})
            if i < 4:
                cases.append({"text": text, "add_special": True, "ids": llama_tokenize(args.bin, model, text, True)})
        write_json(f"tokenize_{key}.json", {
            "model": fname, "tool": f"llama-tokenize ({LLAMACPP_VERSION})",
            "command": "llama-tokenize -m MODEL --stdin --no-escape --ids --log-disable [--no-bos]",
            "cases": cases})


# ----------------------------------------------------------------------------------------- ppl

PPL_TEXT = "corpora/tinyshakespeare.txt"  # under ../shared; the whole file, first CHUNKS chunks
# (model, ctx, chunks): small contexts and few chunks keep larder's CTest run short on 2 cores.
PPL_RUNS = [("smollm2", 1024, 4), ("gemma3", 1024, 4), ("gemma3", 4096, 1)]


def llama_perplexity(bin_dir, model, text, ctx, chunks, threads):
    cmd = [os.path.join(bin_dir, "llama-perplexity"), "-m", model, "-f", text, "-c", str(ctx), "-b", str(ctx),
           "--chunks", str(chunks), "-t", str(threads)]
    p = subprocess.run(cmd, capture_output=True, timeout=3600)
    log = (p.stdout + p.stderr).decode("utf-8", "replace")
    if p.returncode != 0:
        raise RuntimeError(f"llama-perplexity failed: {log[-3000:]}")
    import re
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    if not m:
        raise RuntimeError(f"no final estimate in llama-perplexity output: {log[-3000:]}")
    return {"ppl": float(m.group(1)), "ppl_err": float(m.group(2)),
            "command": " ".join(["llama-perplexity", "-m", "MODEL", "-f", "SHARED/" + PPL_TEXT] + cmd[5:])}


def cmd_ppl(args):
    text = os.path.join(args.shared, PPL_TEXT)
    runs = []
    for key, ctx, chunks in PPL_RUNS:
        model = os.path.join(models_dir(args), MODELS[key])
        r = llama_perplexity(args.bin, model, text, ctx, chunks, args.threads)
        print(f"{key} ctx {ctx} chunks {chunks}: PPL {r['ppl']} +/- {r['ppl_err']}")
        runs.append({"model": MODELS[key], "text": PPL_TEXT, "ctx": ctx, "chunks": chunks, **r})
    write_json("ppl_llamacpp.json", {"tool": f"llama-perplexity ({LLAMACPP_VERSION})", "runs": runs})


def cmd_ppl_f32(args):
    """The exact value of each gemma3 PPL_RUN: the GGUF dequantized to f32 by gguf-py, mlx-lm's
    gemma3_text in f32, on llama-tokenize's ids (the text with BOS, as llama-perplexity tokenizes
    it) with llama-perplexity's chunking. llama.cpp and larder both quantize activations to int8;
    this says how far each is from the model's own value."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
    import gguf_f32_reference as ref
    import mlx.core as mx
    mx.set_default_device(mx.cpu)
    text = os.path.join(args.shared, PPL_TEXT)
    with open(text, encoding="utf-8") as f:
        body = f.read()
    model_file = os.path.join(models_dir(args), MODELS["gemma3"])
    tokens = llama_tokenize(args.bin, model_file, body, True)
    cfg, weights = ref.load_gguf_f32(model_file)
    ref.numpy_matmuls()
    model = ref.mlx_model(cfg, weights)
    del weights
    import math
    runs = []
    for key, ctx, chunks in PPL_RUNS:
        if key != "gemma3":
            continue
        r = ref.perplexity(model, tokens, ctx, chunks, cfg["bos_token_id"], math.sqrt(cfg["hidden_size"]))
        print(f"{key} ctx {ctx} chunks {chunks}: exact f32 PPL {r['ppl']:.4f}")
        runs.append({"model": MODELS[key], "text": PPL_TEXT, "ctx": ctx, "chunks": chunks,
                     "ppl": round(r["ppl"], 4), "ppl_err": round(r["ppl_err"], 5), "n_scored": r["n_scored"]})
    write_json("ppl_f32_reference.json", {
        "tool": "tests/ref/gguf_f32_reference.py: gguf-py dequantization + mlx-lm gemma3_text, f32 on the CPU",
        "tokens": f"llama-tokenize ({LLAMACPP_VERSION}) of the whole text with BOS",
        "chunking": "llama-perplexity's: chunks of ctx, first token -> BOS, positions ctx/2 .. ctx-2 scored",
        "embed_scale": "f32 sqrtf(hidden), as llama.cpp runs the GGUF", "runs": runs})


# ---------------------------------------------------------------------------------------- chat

CHAT_PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "Explain in one sentence what a CPU does."}],
    [{"role": "system", "content": "You are a terse assistant. Answer in a few words."},
     {"role": "user", "content": "Name three primary colors."}],
    [{"role": "user", "content": "Hi! How are you today?"},
     {"role": "assistant", "content": "I'm doing well, thank you! How can I help you?"},
     {"role": "user", "content": "Tell me a fun fact about octopuses."}],
]
CHAT_TOKENS = 32


def llama_server_chat(args, extra_flags):
    """Greedy answers of llama-server for CHAT_PROMPTS (plus its rendering and prompt size)."""
    import socket
    import time
    import urllib.request
    model = os.path.join(models_dir(args), MODELS["smollm2"])
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    cmd = [os.path.join(args.bin, "llama-server"), "-m", model, "--jinja", "-c", "2048", "-np", "1",
           *extra_flags, "-t", str(args.threads), "--host", "127.0.0.1", "--port", str(port)]
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def post(path, body):
        req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        cases = []
        for msgs in CHAT_PROMPTS:
            body = {"messages": msgs, "max_tokens": CHAT_TOKENS, "temperature": 0, "seed": 1}
            r = post("/v1/chat/completions", body)
            cases.append({"messages": msgs, "max_tokens": CHAT_TOKENS, "content": r["choices"][0]["message"]["content"],
                          "completion_tokens": r["usage"]["completion_tokens"],
                          "prompt_tokens": r["usage"]["prompt_tokens"],
                          "prompt": post("/apply-template", {"messages": msgs})["prompt"]})
            print(repr(cases[-1]["content"]))
    finally:
        srv.terminate()
        srv.wait(30)
    return cases


def cmd_chat(args):
    # The reference: f32 KV cache, no flash attention (llama.cpp's most precise CPU path). The
    # default f16 KV run is kept beside it: where the two disagree, llama.cpp's own precision
    # choice flips a greedy near-tie, which bounds how exactly any other engine can agree.
    cases = llama_server_chat(args, ["-ctk", "f32", "-ctv", "f32", "-fa", "off"])
    default = llama_server_chat(args, [])
    for c, d in zip(cases, default):
        c["content_f16_kv"] = d["content"]
    write_json("chat_smollm2.json", {
        "model": MODELS["smollm2"], "tool": f"llama-server ({LLAMACPP_VERSION})",
        "command": "llama-server -m MODEL --jinja -c 2048 -np 1 -ctk f32 -ctv f32 -fa off (content) and with the "
                   f"default f16 KV cache (content_f16_kv); POST /v1/chat/completions temperature 0, max_tokens {CHAT_TOKENS} "
                   "(the GGUF's own chat template)",
        "cases": cases})


# ------------------------------------------------------------------------------------- requant

REQUANT_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K_M", "Q5_K_M", "Q3_K_M", "Q2_K", "IQ4_NL", "IQ4_XS"]
REQUANT_CTX, REQUANT_CHUNKS = 1024, 4


def requant_dir(args):
    return os.path.join(models_dir(args), "requant")


def cmd_requant(args):
    """SmolLM2 Q4_1 -> F32 (llama-quantize --allow-requantize: the release dequantized) -> each
    type by llama-quantize, and llama-perplexity on each. The files stay out of git (in
    MODELS/requant/); the test skips a format whose file is absent."""
    src = os.path.join(models_dir(args), MODELS["smollm2"])
    out = requant_dir(args)
    os.makedirs(out, exist_ok=True)
    quant = os.path.join(args.bin, "llama-quantize")
    f32 = os.path.join(out, "SmolLM2-135M-Instruct.F32.gguf")
    if not os.path.exists(f32):
        subprocess.run([quant, "--allow-requantize", src, f32, "F32", str(args.threads)], check=True,
                       capture_output=True)
    text = os.path.join(args.shared, PPL_TEXT)
    runs = []
    for t in REQUANT_TYPES:
        dst = os.path.join(out, f"SmolLM2-135M-Instruct.{t}.gguf")
        if not os.path.exists(dst):
            p = subprocess.run([quant, f32, dst, t, str(args.threads)], capture_output=True)
            if p.returncode != 0:
                raise RuntimeError(f"llama-quantize {t} failed: {p.stderr.decode(errors='replace')[-2000:]}")
        r = llama_perplexity(args.bin, dst, text, REQUANT_CTX, REQUANT_CHUNKS, args.threads)
        print(f"{t}: PPL {r['ppl']} +/- {r['ppl_err']}")
        runs.append({"model": os.path.basename(dst), "type": t, "text": PPL_TEXT, "ctx": REQUANT_CTX,
                     "chunks": REQUANT_CHUNKS, **r})
    write_json("ppl_smollm2_requant_llamacpp.json", {
        "tool": f"llama-quantize + llama-perplexity ({LLAMACPP_VERSION})",
        "made_by": "llama-quantize --allow-requantize SmolLM2-135M-Instruct.Q4_1.gguf F32; then llama-quantize F32 TYPE "
                   "(no imatrix); files in LARDER_MODELS_DIR/requant, not in git",
        "runs": runs})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["tokenize", "ppl", "ppl-f32", "chat", "requant"])
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bin", default=os.path.expanduser("~/.cache/larder-bench/llama.cpp-0.3.36/build/bin"))
    ap.add_argument("--models", help="folder of the fetched models (default: LARDER_MODELS_DIR or .cache/models)")
    args = ap.parse_args()
    os.makedirs(GOLDENS, exist_ok=True)
    {"tokenize": cmd_tokenize, "ppl": cmd_ppl, "ppl-f32": cmd_ppl_f32, "chat": cmd_chat,
     "requant": cmd_requant}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
