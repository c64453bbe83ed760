#!/usr/bin/env python3
"""Oracle for the GGUF block decoders: gguf-py's own quantize/dequantize (gguf.quants), and for
the MLX affine format: mlx's own mx.quantize / mx.dequantize / mx.quantized_matmul (CPU).

Writes <out>/kernels/<fmt>_<rows>x<cols>.{bin,f32} for fmt in q8_0, q4_0: `.bin` the quantized
blocks exactly as a GGUF stores them, `.f32` gguf.quants.dequantize of those blocks, plus
index.json listing the cases. The data mixes gaussian rows, rows with outliers, an all-zero row
and a row of one repeated value (scale edge cases).

Affine (every bits in 2,3,4,5,6,8 x group size 32,64,128; scales stored in bf16, f16 or f32 by
turn): <out>/kernels/affine/<stem>.{codes,scales,biases,deq,x,y} and affine.json. `.codes` is
mx.quantize's uint32 tensor [rows, cols*bits/32] as stored, `.scales`/`.biases` its
[rows, cols/g] parameters in the stored dtype (raw bytes), `.deq` mx.dequantize with the
parameters upcast to f32 (so the only rounding is mlx's own f32 scale*q + bias), `.x` f32
activations [n, cols] and `.y` mx.quantized_matmul(x, codes, scales, biases, transpose=True) in
f32 [n, rows].
"""
import argparse
import json
import os
import sys

import numpy as np
import gguf

SHAPES = [(1, 32), (3, 64), (7, 96), (5, 160), (2, 256), (17, 32)]


def data(rows, cols, rng):
    a = rng.standard_normal((rows, cols)).astype(np.float32)
    if rows > 1:
        a[1, rng.integers(0, cols)] = 40.0  # an outlier sets the block scale
    if rows > 2:
        a[2] = 0.0
    if rows > 3:
        a[3] = -1.25
    return a


AFFINE_BITS = (2, 3, 4, 5, 6, 8)
AFFINE_GROUPS = (32, 64, 128)
AFFINE_SCALE_DTYPES = ("bf16", "f16", "f32")


def write_affine(d, rng):
    import mlx.core as mx
    mx.set_default_device(mx.cpu)
    os.makedirs(d, exist_ok=True)
    mx_dt = {"bf16": mx.bfloat16, "f16": mx.float16, "f32": mx.float32}
    cases = []
    i = 0
    for bits in AFFINE_BITS:
        for g in AFFINE_GROUPS:
            sdt = AFFINE_SCALE_DTYPES[i % 3]
            rows, cols, n = (5, 384, 3) if i % 2 else (7, 256, 2)
            i += 1
            w = data(rows, cols, rng)
            if rows > 4:
                w[4] = np.abs(w[4])  # all-positive groups: the edge is the max
            wq = mx.array(w).astype(mx_dt[sdt])
            q, sc, bi = mx.quantize(wq, group_size=g, bits=bits)
            assert q.dtype == mx.uint32 and q.shape == (rows, cols * bits // 32), (q.dtype, q.shape)
            assert sc.dtype == mx_dt[sdt] and sc.shape == (rows, cols // g), (sc.dtype, sc.shape)
            s32, b32 = sc.astype(mx.float32), bi.astype(mx.float32)
            deq = mx.dequantize(q, s32, b32, group_size=g, bits=bits)
            x = mx.array(rng.standard_normal((n, cols)).astype(np.float32))
            y = mx.quantized_matmul(x, q, s32, b32, transpose=True, group_size=g, bits=bits)
            stem = f"affine_b{bits}_g{g}_{sdt}_{rows}x{cols}"
            raw = lambda a: np.array(a.view(mx.uint16) if a.dtype in (mx.bfloat16, mx.float16) else a)
            raw(q).tofile(os.path.join(d, stem + ".codes"))
            raw(sc).tofile(os.path.join(d, stem + ".scales"))
            raw(bi).tofile(os.path.join(d, stem + ".biases"))
            np.array(deq, dtype=np.float32).tofile(os.path.join(d, stem + ".deq"))
            np.array(x, dtype=np.float32).tofile(os.path.join(d, stem + ".x"))
            np.array(y, dtype=np.float32).tofile(os.path.join(d, stem + ".y"))
            cases.append({"bits": bits, "group_size": g, "scale_dtype": sdt.upper(), "rows": rows, "cols": cols,
                          "n": n, "stem": stem})
    with open(os.path.join(d, "affine.json"), "w") as f:
        json.dump(cases, f)
    return len(cases)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared")
    a = ap.parse_args()
    d = os.path.join(a.out, "kernels")
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(42)
    cases = []
    for fmt in ("Q8_0", "Q4_0"):
        qt = getattr(gguf.GGMLQuantizationType, fmt)
        for rows, cols in SHAPES:
            w = data(rows, cols, rng)
            q = gguf.quants.quantize(w, qt)
            deq = gguf.quants.dequantize(q, qt).reshape(rows, cols).astype(np.float32)
            stem = f"{fmt.lower()}_{rows}x{cols}"
            q.tofile(os.path.join(d, stem + ".bin"))
            deq.tofile(os.path.join(d, stem + ".f32"))
            cases.append({"format": fmt, "rows": rows, "cols": cols, "stem": stem})
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump(cases, f)
    print(f"kernels_reference: {len(cases)} cases")
    n_affine = write_affine(os.path.join(d, "affine"), np.random.default_rng(43))
    print(f"kernels_reference: {n_affine} affine cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
