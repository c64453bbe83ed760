#!/usr/bin/env python3
"""Oracle for larder's MLX affine quantizer: mx.quantize on the MLX CPU backend.

Writes <out>/quant/cases.json and, per case, <name>.in (the source matrix in its dtype, raw
little-endian), <name>.q (uint32 words), <name>.s and <name>.b (scales / biases in the source
dtype). Cases: every dtype (bf16, f16, f32) x bits (2,3,4,5,6,8) x group size (32,64,128) on a
matrix whose rows are adversarial (constant +c / -c / 0, one outlier, tiny and huge magnitudes,
all-positive, all-negative, |min| == |max|, integer ramps that land on rounding ties, mixed
subnormals) followed by gaussian rows; plus a larger gaussian matrix per dtype.
"""
import argparse
import json
import os

import numpy as np
import mlx.core as mx

DTYPES = {"bf16": mx.bfloat16, "f16": mx.float16, "f32": mx.float32}


def adversarial(rng, cols, dt):
    huge = 1.0e4 if dt == "f16" else 1.0e30  # |x| <= 6e4: finite in f16
    rows = [
        np.full(cols, 0.5), np.full(cols, -0.5), np.zeros(cols), np.full(cols, 3.0e-3),
        np.r_[rng.normal(0, 0.02, cols - 1), 40.0],  # outlier
        rng.normal(0, 1e-6, cols),  # tiny (range below eps * n for some groups)
        rng.normal(0, 1e-9, cols),
        np.clip(rng.normal(0, 1, cols), -6, 6) * huge,
        np.abs(rng.normal(0, 1, cols)) + 0.25,  # all positive
        -np.abs(rng.normal(0, 1, cols)) - 0.25,  # all negative
        np.tile(np.r_[-1.0, 1.0, np.zeros(14)], cols // 16),  # |lo| == |hi|
        (np.arange(cols) % 16) - 7.0,  # integer ramp: exact codes / ties
        ((np.arange(cols) % 32) - 15.5) / 8.0,  # half-step ramp: rint ties
        np.where(np.arange(cols) % 2 == 0, 1e-40, -3e-39) if dt != "f16" else np.full(cols, 6e-8),
        np.r_[np.full(cols // 2, 2.0), np.full(cols - cols // 2, -2.0 - 1e-3)],
    ]
    return np.stack(rows)


def write(path, arr):
    with open(path, "wb") as f:
        f.write(np.ascontiguousarray(arr).tobytes())


def raw(a):
    """An mx array's bytes as numpy (bf16 via uint16 view)."""
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16))
    return np.array(a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared", default="")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    out = os.path.join(args.out, "quant")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(1234)
    cases = []

    def case(name, mat, dt, bits, g):
        a = mx.array(mat.astype(np.float32)).astype(DTYPES[dt])
        wq, s, b = mx.quantize(a, group_size=g, bits=bits, mode="affine")
        mx.eval(wq, s, b)
        write(os.path.join(out, name + ".in"), raw(a))
        write(os.path.join(out, name + ".q"), np.array(wq))
        write(os.path.join(out, name + ".s"), raw(s))
        write(os.path.join(out, name + ".b"), raw(b))
        cases.append({"name": name, "dtype": dt, "bits": bits, "group_size": g,
                      "rows": int(mat.shape[0]), "cols": int(mat.shape[1])})

    cols = 256
    for dt in DTYPES:
        for bits in (2, 3, 4, 5, 6, 8):
            for g in (32, 64, 128):
                mat = np.concatenate([adversarial(rng, cols, dt), rng.normal(0, 0.05, (9, cols))])
                case(f"adv_{dt}_b{bits}_g{g}", mat, dt, bits, g)
        for bits in (3, 4, 8):
            case(f"big_{dt}_b{bits}", rng.standard_t(4, (96, 1024)) * 0.03, dt, bits, 64)
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump({"mlx": mx.__version__, "cases": cases}, f, indent=1)
    print(f"quant_reference: {len(cases)} cases from mlx {mx.__version__} (CPU)")


if __name__ == "__main__":
    main()
