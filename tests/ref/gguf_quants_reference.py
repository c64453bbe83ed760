#!/usr/bin/env python3
"""Oracle for the GGUF block formats Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, IQ4_XS: gguf-py's numpy
dequantizer (gguf.quants.dequantize, gguf==0.19.0).

Writes <out>/gguf_quants/<fmt>_<rows>x<cols>_<kind>.{bin,f32} and index.json: `.bin` the blocks as
a GGUF stores them, `.f32` gguf-py's decoding of those bytes. kind `raw`: uniformly random bytes
(every bit pattern of codes, high bits and packed sub-block scales) with finite f16 scales in the
d/m/dmin fields; kind `q`: gaussian data quantized by gguf-py's own quantizer, for the formats it
can quantize (Q4_1, Q5_0, Q5_1), with an outlier, an all-zero, a constant and an all-positive row.
The decoder under test is larder's scalar reference (kernels/ref/quant32.cpp, kquant.cpp); the
oracle is always gguf-py's decoding of the same bytes.
"""
import argparse
import json
import os
import sys

import numpy as np
import gguf

# format -> (block elements, block bytes, offsets of its f16 scale fields, [offsets of f16 fields
# that must be >= 0 to look like real data: mins are subtracted as non-negative values])
FORMATS = {
    "Q4_1": (32, 20, [0], [2]),
    "Q5_0": (32, 22, [0], []),
    "Q5_1": (32, 24, [0], [2]),
    "IQ4_NL": (32, 18, [0], []),
    "Q2_K": (256, 84, [80], [82]),
    "Q3_K": (256, 110, [108], []),
    "IQ4_XS": (256, 136, [0], []),
}
QUANTIZABLE = ("Q4_1", "Q5_0", "Q5_1")


def _f16(a):
    return np.asarray(a, dtype=np.float32).astype(np.float16)


def qtype(fmt):
    return getattr(gguf.GGMLQuantizationType, fmt)


def dequantize(q, fmt, shape):
    return gguf.quants.dequantize(q, qtype(fmt)).reshape(shape).astype(np.float32)


def raw_blocks(rows, cols, fmt, rng):
    be, bb, scale_at, min_at = FORMATS[fmt]
    nb = rows * cols // be
    b = rng.integers(0, 256, (nb, bb), dtype=np.uint8)
    for off in scale_at:
        b[:, off:off + 2] = _f16(rng.uniform(-0.05, 0.05, nb)).view(np.uint8).reshape(nb, 2)
    for off in min_at:
        b[:, off:off + 2] = _f16(rng.uniform(-0.05, 0.05, nb)).view(np.uint8).reshape(nb, 2)
    return b.reshape(rows, -1)


def data(rows, cols, rng):
    a = rng.standard_normal((rows, cols)).astype(np.float32)
    if rows > 1:
        a[1, rng.integers(0, cols)] = 40.0
    if rows > 2:
        a[2] = 0.0
    if rows > 3:
        a[3] = -1.25
    if rows > 4:
        a[4] = np.abs(a[4])
    return a


SHAPES = [(1, 256), (5, 512), (7, 768), (3, 256)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared")
    a = ap.parse_args()
    d = os.path.join(a.out, "gguf_quants")
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(1212)
    cases = []
    for fmt, (be, bb, _, _) in FORMATS.items():
        assert gguf.GGML_QUANT_SIZES[qtype(fmt)] == (be, bb), fmt
        for rows, cols in SHAPES:
            for kind in ("q", "raw"):
                if kind == "q":
                    if fmt not in QUANTIZABLE:
                        continue
                    w = data(rows, cols, rng)
                    q = gguf.quants.quantize(w, qtype(fmt))
                    deq = dequantize(q, fmt, (rows, cols))
                    err = np.abs(deq - w).max(axis=1) / np.maximum(np.abs(w).max(axis=1), 1e-6)
                    assert np.all(err < 0.2), (fmt, rows, cols, err)
                else:
                    q = raw_blocks(rows, cols, fmt, rng)
                    deq = dequantize(q, fmt, (rows, cols))
                assert q.shape == (rows, cols // be * bb), (fmt, q.shape)
                assert np.all(np.isfinite(deq))
                stem = f"{fmt.lower()}_{rows}x{cols}_{kind}"
                np.ascontiguousarray(q).tofile(os.path.join(d, stem + ".bin"))
                deq.tofile(os.path.join(d, stem + ".f32"))
                cases.append({"format": fmt, "rows": rows, "cols": cols, "stem": stem})
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump(cases, f)
    print(f"gguf_quants_reference: {len(cases)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
