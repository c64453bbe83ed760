#!/usr/bin/env python3
"""Oracle for the microscaling float formats (kernels/microscaling.h): mlx's own `mx.quantize` /
`mx.dequantize` (modes mxfp4, nvfp4, mxfp8, on mlx's CPU) and gguf-py's MXFP4 blocks
(gguf.quants.dequantize / quantize, ggml type 39).

Writes <out>/microscaling/<stem>.* and index.json. MLX cases (format MLX_MXFP4 / MLX_NVFP4 /
MLX_MXFP8): `.w` the f32 source matrix (kind "q": mlx quantized it; kind "raw": no source, random
codes and scales), `.codes` the code bytes as the U32 tensor stores them, `.scales` the U8 scales,
`.f32` mx.dequantize(..., dtype=float32) of those bytes. GGUF cases (format MXFP4): `.bin` the
blocks, `.f32` gguf-py's decoding; kind "raw" random nibbles with e8m0 bytes over a wide range,
kind "q" gguf-py's quantizer on gaussian data. Sizes cover odd numbers of 32-blocks.
"""
import argparse
import json
import os
import sys

import numpy as np
import mlx.core as mx
import gguf

MLX = {"MLX_MXFP4": ("mxfp4", 32, 4), "MLX_NVFP4": ("nvfp4", 16, 4), "MLX_MXFP8": ("mxfp8", 32, 8)}
SHAPES = [(1, 32), (3, 96), (5, 256), (7, 352)]


def data(rows, cols, rng):
    # Row magnitudes over many octaves; an outlier, a zero row, a constant row, signed zeros.
    a = (rng.standard_normal((rows, cols)) * np.exp(rng.standard_normal((rows, 1)) * 3)).astype(np.float32)
    if rows > 1:
        a[1, rng.integers(0, cols)] = 40.0
    if rows > 2:
        a[2] = 0.0
        a[2, :cols:3] = -0.0
    if rows > 3:
        a[3] = -1.25
    return a


def no_nan_e4m3(b):
    b = b.copy()
    b[(b & 0x7F) == 0x7F] ^= 1
    return b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared")
    a = ap.parse_args()
    d = os.path.join(a.out, "microscaling")
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(4404)
    cases = []
    for fmt, (mode, gs, bits) in MLX.items():
        for rows, cols in SHAPES:
            for kind in ("q", "raw"):
                stem = f"{fmt.lower()}_{rows}x{cols}_{kind}"
                if kind == "q":
                    w = data(rows, cols, rng)
                    wq, sc = mx.quantize(mx.array(w), mode=mode)
                    w.tofile(os.path.join(d, stem + ".w"))
                else:
                    codes = rng.integers(0, 256, (rows, cols * bits // 8), dtype=np.uint8)
                    if bits == 8:
                        codes = no_nan_e4m3(codes)
                    if mode == "nvfp4":
                        sc = no_nan_e4m3(rng.integers(0, 256, (rows, cols // gs), dtype=np.uint8))
                    else:
                        sc = rng.integers(100, 150, (rows, cols // gs), dtype=np.uint8)
                    wq, sc = mx.array(codes.view(np.uint32)), mx.array(sc)
                deq = np.array(mx.dequantize(wq, sc, mode=mode, dtype=mx.float32))
                assert deq.shape == (rows, cols)
                np.array(wq).view(np.uint8).tofile(os.path.join(d, stem + ".codes"))
                np.array(sc).astype(np.uint8).tofile(os.path.join(d, stem + ".scales"))
                deq.astype(np.float32).tofile(os.path.join(d, stem + ".f32"))
                cases.append({"format": fmt, "rows": rows, "cols": cols, "stem": stem, "kind": kind})
    qt = gguf.GGMLQuantizationType.MXFP4
    assert gguf.GGML_QUANT_SIZES[qt] == (32, 17)
    for rows, cols in SHAPES:
        for kind in ("q", "raw"):
            stem = f"mxfp4_{rows}x{cols}_{kind}"
            if kind == "q":
                q = gguf.quants.quantize(data(rows, cols, rng), qt)
            else:
                q = rng.integers(0, 256, (rows, cols // 32, 17), dtype=np.uint8)
                q[:, :, 0] = rng.integers(90, 160, (rows, cols // 32))
                q = q.reshape(rows, -1)
            deq = gguf.quants.dequantize(q, qt).reshape(rows, cols).astype(np.float32)
            assert np.all(np.isfinite(deq))
            np.ascontiguousarray(q).tofile(os.path.join(d, stem + ".bin"))
            deq.tofile(os.path.join(d, stem + ".f32"))
            cases.append({"format": "MXFP4", "rows": rows, "cols": cols, "stem": stem, "kind": kind})
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump(cases, f)
    print(f"microscaling_reference: {len(cases)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
