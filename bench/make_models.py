#!/usr/bin/env python3
"""Random-weight Llama-shaped benchmark checkpoints of real shapes, in every format larder runs.

    .venv/bin/python bench/make_models.py [--models llama1b,llama05b] [--formats ...] [--out DIR] [--check LARDER]

Output (default ~/.cache/larder-bench/models, never the repository):

    <out>/<model>/hf-bf16/          config.json, model.safetensors (bf16), tokenizer.json, tokenizer_config.json
    <out>/<model>/mlx-q4g64/        MLX affine 4-bit, group 64 (mx.quantize of the same bf16 weights)
    <out>/<model>/mlx-q8g64/        MLX affine 8-bit, group 64
    <out>/<model>/<model>-Q4_0.gguf GGUF Q4_0 (gguf.quants), Llama 2 32k SPM vocabulary
    <out>/<model>/<model>-Q8_0.gguf GGUF Q8_0
    <out>/<model>/<model>-BF16.gguf GGUF BF16 (for llama.cpp's bf16 path)

The bf16 safetensors file is the source of every other format: all of them hold the same weights
(up to their own quantization). Weight values are N(0, 0.02) -- values do not change speed. Norm
weights are 1. All 2-D weights, the token embedding and the untied LM head included, are stored in
the format's type (mlx-lm quantizes nn.Embedding and lm_head too; convert_hf_to_gguf --outtype
q8_0 does the same for GGUF); 1-D norms stay bf16 (MLX) / f32 (GGUF). GGUF Q/K rows are permuted
the way convert_hf_to_gguf.py's LlamaModel.permute does.

An output is skipped when its marker (.larder-bench.json beside it) records the same shape spec,
format and generator version. Tokenizer files are copied at generation time from
../shared/tokenizers/hf/llama2 (HF dirs) and the tokenizer.ggml.* keys from
../shared/models/llama-2-tiny-random/llama-2-tiny-random.gguf (GGUF). Both are 32000-token SPM
vocabularies but not the same one ("Once upon a time" -> [1, 5713, 3714, 264, 727] with the HF files,
[1, 9038, 2501, 263, 931] with the GGUF keys): text generated from the HF and GGUF copies differs even
though the weights are the same. Benchmarks feed token ids and do not care.

Takes ~4 min for both models on the busy 2-core dev machine (the bf16 RNG pass dominates); ~11 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

GEN_VERSION = 1
REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
TOK_DIR = SHARED / "tokenizers" / "hf" / "llama2"
TOK_GGUF = SHARED / "models" / "llama-2-tiny-random" / "llama-2-tiny-random.gguf"

MODELS = {
    # Llama-3.2-1B-like (performance.md §3): 1.104 B parameters.
    "llama1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=32000,
                    max_pos=8192, rope_theta=500000.0, tied=False),
    # Qwen2.5-0.5B dimensions (hidden 896, 24 layers, 14 heads / 2 KV heads, head_dim 64, FFN 4864) as a
    # Llama (no QKV bias) with the 32k Llama 2 vocabulary, untied: 0.415 B parameters.
    "llama05b": dict(hidden=896, layers=24, heads=14, kv_heads=2, ffn=4864, vocab=32000,
                     max_pos=32768, rope_theta=1000000.0, tied=False),
}
ALL_FORMATS = ["hf-bf16", "mlx-q4g64", "mlx-q8g64", "gguf-Q4_0", "gguf-Q8_0", "gguf-BF16"]
STD = 0.02


def log(msg: str) -> None:
    print(f"[make_models {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def tensor_specs(s: dict) -> list[tuple[str, tuple[int, ...]]]:
    """HF names and shapes ([out, in] for linear weights), in file order."""
    h, f, v = s["hidden"], s["ffn"], s["vocab"]
    hd = h // s["heads"]
    kv = s["kv_heads"] * hd
    out = [("model.embed_tokens.weight", (v, h))]
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (f, h)),
            (p + "mlp.up_proj.weight", (f, h)),
            (p + "mlp.down_proj.weight", (h, f)),
        ]
    out.append(("model.norm.weight", (h,)))
    if not s["tied"]:
        out.append(("lm_head.weight", (v, h)))
    return out


def marker_ok(marker: Path, spec: dict, fmt: str, target: Path) -> bool:
    try:
        m = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return m.get("spec") == spec and m.get("format") == fmt and m.get("version") == GEN_VERSION and target.exists()


def write_marker(marker: Path, spec: dict, fmt: str, seconds: float) -> None:
    marker.write_text(json.dumps({"spec": spec, "format": fmt, "version": GEN_VERSION,
                                  "seconds": round(seconds, 1), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                                 indent=1) + "\n")


def hf_config(s: dict, quant: dict | None = None) -> dict:
    c = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": s["hidden"],
        "intermediate_size": s["ffn"],
        "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "head_dim": s["hidden"] // s["heads"],
        "hidden_act": "silu",
        "max_position_embeddings": s["max_pos"],
        "rms_norm_eps": 1e-5,
        "rope_theta": s["rope_theta"],
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": s["tied"],
        "vocab_size": s["vocab"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }
    if quant:
        c["quantization"] = dict(quant)
        c["quantization_config"] = dict(quant)
    return c


def copy_tokenizer(d: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOK_DIR / name, d / name)
    (d / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}) + "\n")


def f32_to_bf16(a: np.ndarray) -> np.ndarray:
    u = a.view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


# ----------------------------------------------------------------------------------------------
# hf-bf16: the source of truth


def make_hf(model: str, s: dict, d: Path, seed: int) -> None:
    specs = tensor_specs(s)
    header: dict = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, shape in specs:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "model.safetensors.tmp"
    rng = np.random.default_rng(seed)
    with open(tmp, "wb") as fp:
        fp.write(struct.pack("<Q", len(hb)))
        fp.write(hb)
        for name, shape in specs:
            if len(shape) == 1:
                a = np.full(shape, 0x3F80, dtype=np.uint16)  # bf16 1.0
            else:
                # row chunks keep the f32 temporary small (the 32000x2048 embedding is 262 MB in f32)
                a = np.empty(shape, dtype=np.uint16)
                step = max(1, (1 << 23) // shape[1])
                for r in range(0, shape[0], step):
                    x = rng.standard_normal((min(step, shape[0] - r), shape[1]), dtype=np.float32)
                    x *= STD
                    a[r:r + step] = f32_to_bf16(x)
            fp.write(a.tobytes())
    os.replace(tmp, d / "model.safetensors")
    (d / "config.json").write_text(json.dumps(hf_config(s), indent=2) + "\n")
    copy_tokenizer(d)


class Bf16Source:
    """Read-only view of the hf-bf16 safetensors file (np.memmap, uint16 bit patterns)."""

    def __init__(self, path: Path):
        with open(path, "rb") as fp:
            (n,) = struct.unpack("<Q", fp.read(8))
            self.header = json.loads(fp.read(n))
        self.mm = np.memmap(path, dtype=np.uint8, mode="r")
        self.base = 8 + n

    def names(self) -> list[str]:
        return [k for k in self.header if k != "__metadata__"]

    def get(self, name: str) -> np.ndarray:
        h = self.header[name]
        a, b = h["data_offsets"]
        assert h["dtype"] == "BF16"
        return self.mm[self.base + a:self.base + b].view(np.uint16).reshape(h["shape"])


def bf16_to_f32(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)


# ----------------------------------------------------------------------------------------------
# MLX affine (mx.quantize on the CPU device)


def make_mlx(s: dict, src: Bf16Source, d: Path, bits: int, group: int) -> None:
    import mlx.core as mx

    mx.set_default_device(mx.cpu)
    d.mkdir(parents=True, exist_ok=True)
    out: dict = {}
    for name in src.names():
        w = mx.array(np.ascontiguousarray(src.get(name))).view(mx.bfloat16)
        if w.ndim == 2 and w.shape[1] % group == 0:
            q, sc, bi = mx.quantize(w, group_size=group, bits=bits)
            mx.eval(q, sc, bi)
            base = name[: -len(".weight")]
            out[base + ".weight"] = q
            out[base + ".scales"] = sc
            out[base + ".biases"] = bi
        else:
            out[name] = w
    tmp = d / "model.tmp.safetensors"
    mx.save_safetensors(str(tmp), out, metadata={"format": "mlx"})
    os.replace(tmp, d / "model.safetensors")
    (d / "config.json").write_text(
        json.dumps(hf_config(s, {"group_size": group, "bits": bits, "mode": "affine"}), indent=2) + "\n")
    copy_tokenizer(d)


# ----------------------------------------------------------------------------------------------
# GGUF


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)
    m = {"self_attn.q_proj.": "attn_q.", "self_attn.k_proj.": "attn_k.", "self_attn.v_proj.": "attn_v.",
         "self_attn.o_proj.": "attn_output.", "input_layernorm.": "attn_norm.",
         "post_attention_layernorm.": "ffn_norm.", "mlp.gate_proj.": "ffn_gate.", "mlp.up_proj.": "ffn_up.",
         "mlp.down_proj.": "ffn_down."}
    for k, v in m.items():
        if rest.startswith(k):
            return f"blk.{layer}.{v}{rest[len(k):]}"
    raise KeyError(hf)


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # convert_hf_to_gguf.py LlamaModel.permute: HF half-split RoPE pairs -> interleaved pairs
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def make_gguf(model: str, s: dict, src: Bf16Source, path: Path, qtype_name: str) -> None:
    import gguf
    from gguf import quants

    Q = gguf.GGMLQuantizationType
    qtype = Q[qtype_name]
    ftype = {"Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
             "BF16": gguf.LlamaFileType.MOSTLY_BF16}[qtype_name]

    def convert(name: str) -> tuple[str, np.ndarray, Q]:
        a = src.get(name)
        gn = gguf_name(name)
        if a.ndim == 1:
            return gn, bf16_to_f32(a), Q.F32
        if ".attn_q." in gn:
            a = llama_permute(a, s["heads"])
        elif ".attn_k." in gn:
            a = llama_permute(a, s["kv_heads"])
        if qtype == Q.BF16:
            return gn, np.ascontiguousarray(a), Q.BF16
        return gn, quants.quantize(bf16_to_f32(a), qtype), qtype

    tok = gguf.GGUFReader(str(TOK_GGUF))
    tmp = path.with_suffix(".gguf.tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(f"larder-bench {model} random {qtype_name}")
    w.add_context_length(s["max_pos"])
    w.add_embedding_length(s["hidden"])
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(s["ffn"])
    w.add_rope_dimension_count(s["hidden"] // s["heads"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(s["rope_theta"])
    w.add_vocab_size(s["vocab"])
    w.add_file_type(ftype)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, field in tok.fields.items():
        if not key.startswith("tokenizer.ggml."):
            continue
        vt = field.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            et = field.types[1]
            if et == gguf.GGUFValueType.STRING:
                vals = [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
            else:
                vals = [field.parts[i].tolist()[0] for i in field.data]
            w.add_key_value(key, vals, vt, sub_type=et)
        elif vt == gguf.GGUFValueType.STRING:
            w.add_key_value(key, bytes(field.parts[field.data[0]]).decode(), vt)
        else:
            w.add_key_value(key, field.parts[field.data[0]].tolist()[0], vt)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    # tensor infos first (shapes/sizes are known without quantizing), then stream the data
    names = src.names()
    for name in names:
        shape = tuple(src.header[name]["shape"])
        if len(shape) == 1:
            w.add_tensor_info(gguf_name(name), shape, np.dtype(np.float32), shape[0] * 4, raw_dtype=Q.F32)
            continue
        bs, ts = gguf.GGML_QUANT_SIZES[qtype]
        nbytes = shape[0] * shape[1] // bs * ts
        byte_shape = (shape[0], shape[1] // bs * ts)
        if qtype == Q.BF16:
            w.add_tensor_info(gguf_name(name), shape, np.dtype(np.uint16), nbytes, raw_dtype=Q.BF16)
        else:
            w.add_tensor_info(gguf_name(name), byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name in names:
        _, data, _ = convert(name)
        w.write_tensor_data(data)
    w.close()
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------


def target_of(root: Path, model: str, fmt: str) -> Path:
    if fmt.startswith("gguf-"):
        return root / model / f"{model}-{fmt[5:]}.gguf"
    return root / model / fmt


def marker_of(target: Path) -> Path:
    if target.suffix == ".gguf":
        return target.with_name("." + target.name + ".larder-bench.json")
    return target / ".larder-bench.json"


def check(larder: str, target: Path) -> bool:
    ok = True
    for cmd in ([larder, "info", str(target)],
                [larder, "generate", str(target), "--prompt", "Once upon a time", "-n", "4", "--seed", "1"]):
        t = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        status = "ok" if r.returncode == 0 else f"FAILED rc={r.returncode}"
        log(f"  {' '.join(cmd[1:2])} {target.name}: {status} ({time.time() - t:.1f} s)")
        if r.returncode != 0:
            ok = False
            sys.stderr.write(r.stdout[-2000:] + r.stderr[-2000:])
        elif cmd[1] == "generate":
            log(f"    -> {r.stdout.strip()[:80]!r} | {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.expanduser("~/.cache/larder-bench/models"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--formats", default=",".join(ALL_FORMATS))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--force", action="store_true", help="regenerate even when the marker matches")
    ap.add_argument("--check", metavar="LARDER", help="run `LARDER info` and `LARDER generate -n 4` on each output")
    ap.add_argument("--print-paths", action="store_true", help="print MODEL FORMAT PATH lines and exit")
    args = ap.parse_args()
    root = Path(args.out)
    models = [m for m in args.models.split(",") if m]
    formats = [f for f in args.formats.split(",") if f]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m} (have {', '.join(MODELS)})")
    for f in formats:
        if f not in ALL_FORMATS:
            ap.error(f"unknown format {f} (have {', '.join(ALL_FORMATS)})")
    if args.print_paths:
        for m in models:
            for f in formats:
                print(m, f, target_of(root, m, f))
        return 0

    ok = True
    for model in models:
        s = MODELS[model]
        spec = dict(s, seed=args.seed, std=STD)
        hf = target_of(root, model, "hf-bf16")

        def stale(f: str) -> bool:
            t = target_of(root, model, f)
            return args.force and f in formats or not marker_ok(marker_of(t), spec, f, t)

        # every format derives from hf-bf16: when it is (re)made, all requested formats are remade
        need = [f for f in formats if stale(f)]
        if need and stale("hf-bf16"):
            need = ["hf-bf16"] + [f for f in formats if f != "hf-bf16"]
        for fmt in ALL_FORMATS:
            if fmt not in need:
                continue
            tgt = target_of(root, model, fmt)
            t0 = time.time()
            log(f"{model} {fmt} -> {tgt}")
            if fmt == "hf-bf16":
                if hf.exists():
                    shutil.rmtree(hf)
                make_hf(model, s, hf, args.seed)
            else:
                src = Bf16Source(hf / "model.safetensors")
                if fmt.startswith("mlx-"):
                    if tgt.exists():
                        shutil.rmtree(tgt)
                    bits = int(fmt[5])
                    make_mlx(s, src, tgt, bits, 64)
                else:
                    tgt.parent.mkdir(parents=True, exist_ok=True)
                    make_gguf(model, s, src, tgt, fmt[5:])
            dt = time.time() - t0
            write_marker(marker_of(tgt), spec, fmt, dt)
            size = sum(p.stat().st_size for p in (tgt.rglob("*") if tgt.is_dir() else [tgt]) if p.is_file())
            log(f"  done in {dt:.1f} s, {size / 1e6:.1f} MB")
        if args.check:
            for fmt in formats:
                ok &= check(args.check, target_of(root, model, fmt))
    for model in models:
        for fmt in formats:
            print(model, fmt, target_of(root, model, fmt))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
