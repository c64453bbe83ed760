#!/usr/bin/env python3
"""Oracle for the GGUF block decoders: gguf-py's own quantize/dequantize (gguf.quants).

Writes <out>/kernels/<fmt>_<rows>x<cols>.{bin,f32} for fmt in q8_0, q4_0: `.bin` the quantized
blocks exactly as a GGUF stores them, `.f32` gguf.quants.dequantize of those blocks, plus
index.json listing the cases. The data mixes gaussian rows, rows with outliers, an all-zero row
and a row of one repeated value (scale edge cases).
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
