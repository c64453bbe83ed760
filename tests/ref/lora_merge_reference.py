#!/usr/bin/env python3
"""Independent merge of PEFT LoRA adapters into an HF safetensors checkpoint (issue 45 item 4's
oracle for `larder quantize --lora`), in numpy, sharing nothing with larder's C++ merge.

merge_peft(src_dir, [(adapter_dir, scale), ...], dst_dir) writes dst_dir: every adapted
projection's weight W (f32/bf16/f16) replaced by f32(W + Σ s·(B·A)) — B·A and the sums in float64,
one rounding to f32 — where s is the request scale times PEFT's own factor as an f32 product
(lora_alpha / r, or lora_alpha / √r with use_rslora; the factor itself rounded to f32 first:
what the run-time path multiplies by). Adapters are applied in the order given (the C++ side sorts
them by content hash; the tests use one adapter or check the order does not matter within the
f64 sum). Every other tensor is copied byte for byte in its stored dtype; config.json and the
tokenizer files are copied. rank_pattern/alpha_pattern are not handled here (refused).
"""
import json
import math
import os
import shutil
import struct

import numpy as np

_NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I32": np.int32, "I64": np.int64, "U32": np.uint32}


def read_safetensors(path):
    """{name: (dtype_str, shape, raw bytes)} in file order."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        out[name] = (h["dtype"], h["shape"], data[a:b])
    return out


def to_f64(dtype, shape, raw):
    if dtype == "BF16":
        u = np.frombuffer(raw, np.uint16).astype(np.uint32) << 16
        return u.view(np.float32).astype(np.float64).reshape(shape)
    return np.frombuffer(raw, _NP[dtype]).astype(np.float64).reshape(shape)


def write_safetensors(path, tensors):
    """{name: (dtype_str, shape, raw bytes)}"""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dt, shape, b = tensors[name]
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def peft_factor(cfg):
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        raise ValueError("rank/alpha patterns are not handled by this reference")
    r, alpha = cfg["r"], cfg["lora_alpha"]
    return np.float32(alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r)


def merge_peft(src_dir, adapters, dst_dir):
    tensors = {}
    for fn in sorted(os.listdir(src_dir)):
        if fn.endswith(".safetensors"):
            tensors.update(read_safetensors(os.path.join(src_dir, fn)))
    acc = {}
    for adir, scale in adapters:
        with open(os.path.join(adir, "adapter_config.json")) as f:
            s = np.float32(np.float32(scale) * peft_factor(json.load(f)))
        lt = read_safetensors(os.path.join(adir, "adapter_model.safetensors"))
        for key in lt:
            if not key.endswith(".lora_A.weight"):
                continue
            module = key[:-len(".lora_A.weight")]
            name = module.removeprefix("base_model.model.") + ".weight"
            A = to_f64(*lt[key])
            B = to_f64(*lt[module + ".lora_B.weight"])
            if name not in acc:
                acc[name] = to_f64(*tensors[name])
            acc[name] = acc[name] + np.float64(s) * (B @ A)
    for name, w in acc.items():
        tensors[name] = ("F32", list(w.shape), w.astype(np.float32).tobytes())
    os.makedirs(dst_dir)
    write_safetensors(os.path.join(dst_dir, "model.safetensors"), tensors)
    for fn in os.listdir(src_dir):
        if fn.endswith(".json") and not fn.endswith(".safetensors.index.json") or fn.endswith(".jinja"):
            shutil.copy(os.path.join(src_dir, fn), dst_dir)
    return sorted(acc)
