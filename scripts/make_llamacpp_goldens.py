#!/usr/bin/env python3
"""Regenerates the llama.cpp goldens in tests/goldens/ from llama.cpp's own tools, run on the real
models that scripts/fetch_models.sh fetches. CI never builds llama.cpp: these outputs are
committed, and this script is how they were made (and how to remake them).

  scripts/make_llamacpp_goldens.py tokenize   # llama-tokenize over tests/goldens/tokenize_corpus.json
  scripts/make_llamacpp_goldens.py ppl        # llama-perplexity, fixed text/ctx/chunks
  scripts/make_llamacpp_goldens.py ppl-f32    # the same runs of gemma3, exact f32 math (mlx-lm on
                                              # the dequantized GGUF: tests/ref/gguf_f32_reference.py)
  scripts/make_llamacpp_goldens.py greedy     # gemma3 greedy continuations, llama.cpp's top-5 per step
  scripts/make_llamacpp_goldens.py chat-steps # SmolLM2 greedy chat answers, llama.cpp's top-5 per step
  scripts/make_llamacpp_goldens.py exact      # adds the exact-f32 top-5 at each step to both (after them)
  scripts/make_llamacpp_goldens.py requant    # SmolLM2 requantized by llama-quantize, each format's ppl
  scripts/make_llamacpp_goldens.py moe-ppl    # llama-perplexity on the qwen3moe / qwen35moe / qwen3next
                                              # GGUF test fixtures (tests/ref/qwen3_moe_reference.py,
                                              # qwen3_next_reference.py), no download
  scripts/make_llamacpp_goldens.py larder-gguf  # llama-perplexity on GGUFs `larder quantize --format gguf`
                                              # writes from SmolLM2-135M-Instruct-hf (--larder to pick the binary)

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


class LlamaServer:
    """One llama-server process on a free loopback port (a context manager)."""

    def __init__(self, args, model, extra_flags):
        import socket
        with socket.socket() as sk:
            sk.bind(("127.0.0.1", 0))
            self.port = sk.getsockname()[1]
        self.cmd = [os.path.join(args.bin, "llama-server"), "-m", model, "--jinja", "-c", "2048", "-np", "1",
                    *extra_flags, "-t", str(args.threads), "--host", "127.0.0.1", "--port", str(self.port)]

    def __enter__(self):
        import time
        import urllib.request
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("llama-server did not become healthy")

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(30)

    def post(self, path, body):
        import urllib.request
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=1200) as r:
            return json.loads(r.read())


# ------------------------------------------------------------------------------- greedy (steps)
# Greedy continuations token by token with llama.cpp's own top-N log-probabilities at every step
# (n_probs: the softmax of the raw logits, before any sampler), so a test can tell a genuine
# near-tie — llama.cpp itself barely prefers its token — from a real disagreement.

GREEDY_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
    "The three most important things to know about photosynthesis are",
    "Question: What is 12 times 7?\nAnswer:",
    "Here is a list of fruits: apples, bananas,",
]
GREEDY_TOKENS = 48
GREEDY_PROBS = 5
# The llama-server configurations recorded: llama.cpp's default (f16 KV, flash attention auto)
# and its most precise CPU path (f32 KV, no flash attention).
GREEDY_CONFIGS = {"default": [], "f32_kv": ["-ctk", "f32", "-ctv", "f32", "-fa", "off"]}


def step_record(p, eog):
    return {"id": p["id"], "bytes": p["bytes"], "logprob": round(p["logprob"], 5),
            "top": [{"id": t["id"], "bytes": t["bytes"], "logprob": round(t["logprob"], 5),
                     **({"eog": True} if t["id"] in eog else {})} for t in p["top_logprobs"]]}


def eog_ids(model):
    """End-of-generation ids as llama.cpp treats them: the GGUF's eos/eot plus the chat-end
    tokens it recognises by text (<|im_end|>, <end_of_turn>, ...)."""
    from gguf import GGUFReader
    r = GGUFReader(model)

    def scalar(key):
        f = r.fields.get(key)
        return int(f.parts[f.data[0]][0]) if f else None
    toks = r.fields["tokenizer.ggml.tokens"]
    names = [bytes(toks.parts[i]).decode("utf-8", "replace") for i in toks.data]
    ids = {scalar(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")} - {None}
    ids |= {i for i, n in enumerate(names) if n in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>", "</s>")}
    return sorted(ids)


def greedy_steps(srv, body, eog):
    """POST /completion with n_probs; the completion's ids and one record per step. A request
    never reuses the previous one's cached prefix (cache_prompt false): each prompt is prefilled
    whole, as the test's cold larder server does."""
    r = srv.post("/completion", {**body, "temperature": 0, "n_probs": GREEDY_PROBS, "cache_prompt": False,
                                 "return_tokens": True, "seed": 1})
    steps = [step_record(p, eog) for p in r["completion_probabilities"]]
    if len(steps) != r["tokens_predicted"]:
        raise RuntimeError(f"{len(steps)} probability records for {r['tokens_predicted']} tokens")
    for st in steps:
        if st["top"][0]["id"] != st["id"]:
            raise RuntimeError(f"greedy token {st['id']} is not llama.cpp's own top-1 {st['top'][0]}")
    return r, steps


def cmd_greedy(args):
    """gemma-3-270m: plain-text greedy continuations of GREEDY_PROMPTS (issue 13)."""
    model = os.path.join(models_dir(args), MODELS["gemma3"])
    eog = eog_ids(model)
    runs = {}
    for name, flags in GREEDY_CONFIGS.items():
        cases = []
        with LlamaServer(args, model, flags) as srv:
            for prompt in GREEDY_PROMPTS:
                r, steps = greedy_steps(srv, {"prompt": prompt, "n_predict": GREEDY_TOKENS}, eog)
                cases.append({"prompt": prompt, "prompt_tokens": r["tokens_evaluated"], "stop_type": r["stop_type"],
                              "content": r["content"], "steps": steps})
                print(name, repr(r["content"][:80]))
        runs[name] = cases
    write_json("greedy_gemma3.json", {
        "model": MODELS["gemma3"], "tool": f"llama-server ({LLAMACPP_VERSION})", "eog_ids": eog,
        "command": f"llama-server -m MODEL --jinja -c 2048 -np 1 [FLAGS]; POST /completion prompt, n_predict {GREEDY_TOKENS}, "
                   f"temperature 0, n_probs {GREEDY_PROBS}, cache_prompt false (BOS added as llama-server tokenizes)",
        "configs": {k: " ".join(v) or "(llama.cpp defaults: f16 KV, -fa auto)" for k, v in GREEDY_CONFIGS.items()},
        "runs": runs})


def cmd_chat_steps(args):
    """SmolLM2: greedy chat answers to CHAT_PROMPTS with llama.cpp's top-N at every step (issue 12).
    /v1/chat/completions gives the content; the same rendered prompt on /completion gives the ids
    and probabilities (checked to be the same answer)."""
    model = os.path.join(models_dir(args), MODELS["smollm2"])
    eog = eog_ids(model)
    runs = {}
    for name, flags in GREEDY_CONFIGS.items():
        cases = []
        with LlamaServer(args, model, flags) as srv:
            for msgs in CHAT_PROMPTS:
                chat = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": GREEDY_TOKENS, "temperature": 0,
                                                         "seed": 1, "cache_prompt": False})
                prompt = srv.post("/apply-template", {"messages": msgs})["prompt"]
                r, steps = greedy_steps(srv, {"prompt": prompt, "n_predict": GREEDY_TOKENS}, eog)
                content = chat["choices"][0]["message"]["content"]
                if r["content"] != content or chat["usage"]["prompt_tokens"] != r["tokens_evaluated"]:
                    raise RuntimeError(f"/completion on the rendered prompt differs from the chat answer: "
                                       f"{r['content']!r} vs {content!r}")
                cases.append({"messages": msgs, "prompt": prompt, "prompt_tokens": r["tokens_evaluated"],
                              "finish_reason": chat["choices"][0]["finish_reason"], "content": content, "steps": steps})
                print(name, repr(content[:80]))
        runs[name] = cases
    write_json("chat_steps_smollm2.json", {
        "model": MODELS["smollm2"], "tool": f"llama-server ({LLAMACPP_VERSION})", "eog_ids": eog,
        "command": f"llama-server -m MODEL --jinja -c 2048 -np 1 [FLAGS]; POST /v1/chat/completions max_tokens "
                   f"{GREEDY_TOKENS} temperature 0 (content, the GGUF's template), and POST /completion on its "
                   f"/apply-template rendering with n_probs {GREEDY_PROBS}, cache_prompt false (ids, top-N per step)",
        "configs": {k: " ".join(v) or "(llama.cpp defaults: f16 KV, -fa auto)" for k, v in GREEDY_CONFIGS.items()},
        "runs": runs})


# ------------------------------------------------------------------------------- exact (f32)
# The arbiter where two int8-activation engines part: the model's own distribution in exact f32
# arithmetic (weights dequantized by gguf-py, mlx-lm's model code on the CPU, f32 everywhere),
# teacher-forced along llama.cpp's greedy path. At the first step where larder and llama.cpp
# choose differently they share the whole prefix, so this says which choice the model makes.
EXACT_TOP = 5


def exact_gemma3(args):
    sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
    import math
    import gguf_f32_reference as ref
    import mlx.core as mx
    import numpy as np
    mx.set_default_device(mx.cpu)
    cfg, weights = ref.load_gguf_f32(os.path.join(models_dir(args), MODELS["gemma3"]))
    ref.numpy_matmuls()
    model = ref.mlx_model(cfg, weights)
    del weights
    bf16_scale = float(mx.array(cfg["hidden_size"] ** 0.5, mx.bfloat16).astype(mx.float32).item())
    scale = np.float32(math.sqrt(cfg["hidden_size"])) / np.float32(bf16_scale)  # llama.cpp's f32 sqrtf(hidden)

    def logits(ids):
        toks = mx.array(ids, dtype=mx.int32)[None]
        emb = model.model.embed_tokens(toks) * mx.array(scale)
        h = model.model(toks, input_embeddings=emb)[0]
        return np.array(model.model.embed_tokens.as_linear(h))
    return logits


def exact_smollm2(args):
    import tempfile
    sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
    import gguf_f32_reference as ref
    import mlx.core as mx
    import numpy as np
    from mlx_lm.utils import load
    mx.set_default_device(mx.cpu)
    out = os.path.join(tempfile.mkdtemp(prefix="smollm2_f32_"), "hf")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gguf_to_hf.py"), out, "--gguf",
                    os.path.join(models_dir(args), MODELS["smollm2"]), "--dtype", "f32"], check=True)
    ref.numpy_matmuls()
    model, _ = load(out)

    def logits(ids):
        return np.array(model(mx.array(ids, dtype=mx.int32)[None])[0].astype(mx.float32))
    return logits


def add_exact(args, golden_name, key, logits_fn, prompt_of):
    import numpy as np
    path = os.path.join(GOLDENS, golden_name)
    with open(path, encoding="utf-8") as f:
        golden = json.load(f)
    model = os.path.join(models_dir(args), MODELS[key])
    logits = logits_fn(args)
    for case in golden["runs"]["default"]:
        prompt_ids = llama_tokenize(args.bin, model, prompt_of(case), True)
        if len(prompt_ids) != case["prompt_tokens"]:
            raise RuntimeError(f"llama-tokenize gives {len(prompt_ids)} prompt tokens, llama-server {case['prompt_tokens']}")
        ids = prompt_ids + [st["id"] for st in case["steps"]]
        lg = logits(ids).astype(np.float64)
        lp = lg - lg.max(-1, keepdims=True)
        lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
        case["prompt_ids"] = prompt_ids
        for k, st in enumerate(case["steps"]):
            row = lp[len(prompt_ids) - 1 + k]
            st["exact"] = [{"id": int(j), "logprob": round(float(row[j]), 5)} for j in np.argsort(-row)[:EXACT_TOP]]
        print(repr(prompt_of(case)[-40:]), "exact top-1 = llama.cpp's at",
              sum(st["exact"][0]["id"] == st["id"] for st in case["steps"]), "of", len(case["steps"]), "steps")
    golden["exact"] = ("top-5 log-probabilities of the model in exact f32 arithmetic (gguf-py dequantization, mlx-lm "
                       "on the CPU: tests/ref/gguf_f32_reference.py for gemma3, scripts/gguf_to_hf.py --dtype f32 + "
                       "mlx_lm.load for SmolLM2) at each step of the default run, teacher-forced on llama.cpp's path; "
                       "prompt_ids from llama-tokenize")
    write_json(golden_name, golden)


def cmd_exact(args):
    if os.path.exists(os.path.join(GOLDENS, "greedy_gemma3.json")) and args.which in ("all", "gemma3"):
        add_exact(args, "greedy_gemma3.json", "gemma3", exact_gemma3, lambda c: c["prompt"])
    if os.path.exists(os.path.join(GOLDENS, "chat_steps_smollm2.json")) and args.which in ("all", "smollm2"):
        add_exact(args, "chat_steps_smollm2.json", "smollm2", exact_smollm2, lambda c: c["prompt"])


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


# (ctx, chunks, KV dtype) over the fixture's 512-token text: f16 KV is both tools' default; f32 on
# a second run takes the KV rounding out of the comparison.
MOE_PPL_RUNS = [(128, 4, "f16"), (64, 8, "f32")]


# (fixture script, case, GGUF architecture)
MOE_PPL_CASES = [("qwen3_moe_reference.py", "qwen3_moe_q8_0", "qwen3moe"),
                 ("qwen3_moe_reference.py", "qwen3_5_moe_ppl_q8_0", "qwen35moe"),
                 ("qwen3_next_reference.py", "qwen3_next_ppl_q8_0", "qwen3next")]


def cmd_moe_ppl(args):
    """The fixtures are regenerated into a temporary folder by their own script (deterministic:
    fixed seeds, gguf-py's quantizer); the golden records each GGUF's sha256, which the test checks
    first."""
    import hashlib
    import re
    import tempfile
    with tempfile.TemporaryDirectory(prefix="moe-ppl-") as tmp:
        for script in dict.fromkeys(s for s, _, _ in MOE_PPL_CASES):
            subprocess.run([sys.executable, os.path.join(ROOT, "tests", "ref", script), "--out", tmp],
                           check=True, capture_output=True)
        models = []
        for script, case, arch in MOE_PPL_CASES:
            d = os.path.join(tmp, "models", case)
            model, text = os.path.join(d, "model.gguf"), os.path.join(d, "ppl_text.txt")
            with open(model, "rb") as f:
                sha = hashlib.sha256(f.read()).hexdigest()
            runs = []
            for ctx, chunks, kv in MOE_PPL_RUNS:
                cmd = [os.path.join(args.bin, "llama-perplexity"), "-m", model, "-f", text, "-c", str(ctx), "-b",
                       str(ctx), "--chunks", str(chunks), "-t", str(args.threads), "-fa", "off", "-ctk", kv, "-ctv", kv]
                # llama.cpp's asynchronous log thread sometimes loses its last lines (the final
                # estimate) at exit, exit status 0 (seen 2 runs in 6 on this file): run again.
                log_path = os.path.join(tmp, f"ppl-{case}-{ctx}-{kv}.log")
                for _ in range(8):
                    with open(log_path, "wb") as lf:
                        p = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT, timeout=600)
                    with open(log_path, encoding="utf-8", errors="replace") as lf:
                        log = lf.read()
                    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
                    if p.returncode != 0 or m:
                        break
                if p.returncode != 0 or not m:
                    raise RuntimeError(f"llama-perplexity failed (exit {p.returncode}): {log[-3000:]}")
                print(f"{arch} ctx {ctx} chunks {chunks} kv {kv}: PPL {m.group(1)} +/- {m.group(2)}")
                runs.append({"ctx": ctx, "chunks": chunks, "kv": kv, "ppl": float(m.group(1)),
                             "ppl_err": float(m.group(2)),
                             "command": " ".join(["llama-perplexity", "-m", f"{case}/model.gguf", "-f",
                                                  f"{case}/ppl_text.txt"] + cmd[5:])})
            models.append({"case": case, "architecture": arch, "fixture": f"tests/ref/{script}", "gguf_sha256": sha,
                           "runs": runs})
    write_json("ppl_moe_llamacpp.json", {
        "tool": f"llama-perplexity ({LLAMACPP_VERSION})",
        "fixtures": "tests/ref/qwen3_moe_reference.py, qwen3_next_reference.py (GGUF Q8_0 experts, synthetic SPM "
                    "vocabulary: tests/ref/gguf_ref.py)",
        "models": models})

LARDER_GGUF_SRC = "SmolLM2-135M-Instruct-hf"
LARDER_GGUF_TYPES = ["Q4_K_M", "Q8_0"]


def cmd_larder_gguf(args):
    """larder's own GGUF output, judged by llama.cpp: `larder quantize SRC OUT --format gguf --type T`
    from the HF checkpoint, then llama-perplexity on OUT (PPL_TEXT, ctx 1024, 4 chunks). The file's
    sha256 is recorded: the test rebuilds the GGUF, checks it is the same file, and runs
    `larder eval ppl` on it within 1 % of llama.cpp's value. Files go to MODELS/larder-gguf/."""
    import hashlib
    src = os.path.join(models_dir(args), LARDER_GGUF_SRC)
    out = os.path.join(models_dir(args), "larder-gguf")
    os.makedirs(out, exist_ok=True)
    text = os.path.join(args.shared, PPL_TEXT)
    runs = []
    for t in LARDER_GGUF_TYPES:
        dst = os.path.join(out, f"SmolLM2-135M-Instruct.larder.{t}.gguf")
        if os.path.exists(dst):
            os.remove(dst)
        subprocess.run([args.larder, "quantize", src, dst, "--format", "gguf", "--type", t], check=True,
                       capture_output=True)
        with open(dst, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        r = llama_perplexity(args.bin, dst, text, 1024, 4, args.threads)
        print(f"{t}: PPL {r['ppl']} +/- {r['ppl_err']} ({sha[:12]})")
        runs.append({"model": os.path.basename(dst), "type": t, "sha256": sha, "text": PPL_TEXT, "ctx": 1024,
                     "chunks": 4, **r})
    write_json("ppl_larder_gguf_llamacpp.json", {
        "tool": f"llama-perplexity ({LLAMACPP_VERSION})",
        "made_by": f"larder quantize {LARDER_GGUF_SRC} OUT --format gguf --type TYPE (no imatrix); "
                   "files in LARDER_MODELS_DIR/larder-gguf, not in git",
        "source": LARDER_GGUF_SRC, "runs": runs})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["tokenize", "ppl", "ppl-f32", "greedy", "chat-steps", "exact", "requant",
                                         "moe-ppl", "larder-gguf"])
    ap.add_argument("which", nargs="?", default="all", choices=["all", "gemma3", "smollm2"], help="exact: which golden")
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bin", default=os.path.expanduser("~/.cache/larder-bench/llama.cpp-0.3.36/build/bin"))
    ap.add_argument("--larder", default=os.path.join(ROOT, "build", "bin", "larder"), help="larder-gguf: the binary")
    ap.add_argument("--models", help="folder of the fetched models (default: LARDER_MODELS_DIR or .cache/models)")
    args = ap.parse_args()
    os.makedirs(GOLDENS, exist_ok=True)
    {"tokenize": cmd_tokenize, "ppl": cmd_ppl, "ppl-f32": cmd_ppl_f32,
     "greedy": cmd_greedy, "chat-steps": cmd_chat_steps, "exact": cmd_exact, "requant": cmd_requant,
     "moe-ppl": cmd_moe_ppl, "larder-gguf": cmd_larder_gguf}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
